"""The decisions of the node's three input gates: which frame passes, waits or is dropped.

Each input goes through a :class:`~wirereduce.hdl.stream.frame.FrameGate`. While it holds a
frame's header, the functions here check it (:func:`check_header`, the drop rules of
``docs/protocol.md``) and either drop the frame whole, counting why in the
:class:`~wirereduce.hdl.core.status.EventCounters`, accept it, or let it wait:

- host input (:func:`host_input`): CONTROL and STATS_REQUEST are answered with a STATS frame
  (CONTROL first starts a collective), HOST_PUSH waits for its buffer slot;
- cw input (:func:`reduce_input`): REDUCE frames, not at rank 0; each waits for the local chunk
  it is added to;
- ccw input (:func:`broadcast_input`): BROADCAST frames, not at rank N-1.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from wirereduce.hdl.stream.frame import decode_expect

from wirereduce.protocol import HEADER_BYTES, VERSION, Codec, Flag, Opcode

__all__ = ["check_header", "host_input", "reduce_input", "broadcast_input"]


def check_header(m: Module, gate, run, events, opcode_ok, expect_seq, count_bad, wait, *,
                 opcode: Opcode, flags_allowed: int, codec_built: bool, lost_ok, lost_wait,
                 apply=None, late_count_bad=None, late_opcode=None, late_seq=None, raw_head=False,
                 also_drop=None, also_accept=None):
    """The checks every input makes of the header waiting in ``gate``, in order (docs/protocol.md
    "Drop rules"): runt, version, ``opcode_ok``, collective (``run``), ``flags``
    (``flags_allowed``), ``dtype`` (the collective's), ``codec``/``eb_k`` (the collective's, and
    only INCEPTIONN_V1 where the node has the codec, ``codec_built``), ``seq`` (``expect_seq``,
    below ``run.chunks``) and ``count_bad`` (skipped for a LOST placeholder, whose count must be
    0); a frame that fails one is dropped and counted in ``events``, one that passes them is
    accepted unless ``wait``, with the length its header implies for the gate's length check
    (16 + 4·count bytes; 16 for a LOST placeholder, which is marked ``bad`` on its way through).

    A frame dropped here whose last beat turns out ``bad`` was a frame of this port's, spoilt
    on the cable: the gate emits a LOST placeholder of ``opcode`` for ``expect_seq`` in its place
    (when ``lost_ok``, once not ``lost_wait``), so that this node and every node after it stay in
    step and the collective loses that one chunk only. Returns the strobe of the accepted (or
    placeholder) frame's first beat leaving the gate.

    ``apply`` (registered verdict, for timing; the schedule engine's gates): the checks are worked
    out from the header into a register every cycle and the gate acts on the registered outcome
    only while ``apply`` is high, which the caller raises only when the header (and everything the
    checks read) has not changed since the cycle before, and only while ``gate.head_valid`` is high
    (a register the caller keeps: ``head_valid`` is then left out of the decision, for timing);
    ``expect_bytes`` and ``mark_bad`` are registered likewise. ``late_count_bad`` is then one more
    count check made at that time (after the registered ones, counted as ``drop_count``; the engine
    gives a register). ``late_opcode`` and ``late_seq`` (registers too) only name its counter: the
    drop is ``late_count_bad``'s, which must include them, and it counts as ``drop_opcode`` with
    ``late_opcode`` (the engine: a frame its table says cannot arrive on that port), else as
    ``drop_seq`` with ``late_seq`` (the engine: a result it has no partial sum out for); ``wait`` stays
    combinational. ``raw_head`` (with ``apply``): the registered
    checks read the header FIFO's head in every state (``gate.head_raw``/``head_raw_short``, no select
    by the gate's state in front of them; timing), for a caller whose ``apply`` also implies that
    ``head_valid`` was high the cycle before, when those are the same as ``head``/``head_short``; the
    caller's ``count_bad`` must read it too. ``also_drop``/``also_accept`` (with ``apply``): the caller's own
    verdict on a head these checks do not judge (the engine's host commands; ``apply`` low then), OR-ed
    into the gate's ``drop``/``accept`` (timing: one flat OR, not a select between two sets of drivers);
    ``gate.expect_bytes``/``expect`` and ``mark_bad`` stay the checks' registered ones, which the caller's
    accepted frames must share."""
    if raw_head and apply is None:
        raise ValueError("raw_head needs apply")
    if apply is None and (also_drop is not None or also_accept is not None):
        raise ValueError("also_drop and also_accept need apply")
    h = gate.head_raw if raw_head else gate.head
    head_short = gate.head_raw_short if raw_head else gate.head_short
    lost = (h.flags & Flag.LOST) != 0
    expect_bytes = Mux(lost, HEADER_BYTES, HEADER_BYTES + 4 * h.count)
    decoded = hasattr(gate, "expect")   # FrameGate(expect_decoded=True)
    if decoded:
        expect_bytes = decode_expect(m, expect_bytes, len(gate.i.payload.data))
    if apply is not None:   # registered, as the verdict below: the header has not changed when applied
        eb_q = Signal(expect_bytes.shape() if decoded else 16, name=f"{gate.__class__.__name__.lower()}_expect")
        lost_q = Signal()
        m.d.sync += [eb_q.eq(expect_bytes), lost_q.eq(lost)]
        expect_bytes, lost_mark = eb_q, lost_q
    else:
        lost_mark = lost
    m.d.comb += [
        (gate.expect if decoded else gate.expect_bytes).eq(expect_bytes),
        gate.mark_bad.eq(lost_mark),
        gate.lost_hdr.version.eq(VERSION), gate.lost_hdr.opcode.eq(opcode),
        gate.lost_hdr.dtype.eq(run.dtype), gate.lost_hdr.codec.eq(run.codec), gate.lost_hdr.eb_k.eq(run.eb_k),
        gate.lost_hdr.src.eq(run.rank), gate.lost_hdr.flags.eq(Flag.LOST),
        gate.lost_hdr.collective.eq(run.collective), gate.lost_hdr.seq.eq(expect_seq),
        gate.lost_ok.eq(run.active & (expect_seq < run.chunks) & lost_ok),
        gate.lost_wait.eq(lost_wait),
        events.flag("drop_length").eq(gate.length_error),
        events.flag("drop_oversize").eq(gate.oversize),
    ]
    codec_bad = (h.codec != run.codec) | (h.eb_k != run.eb_k)
    if not codec_built:
        codec_bad = codec_bad | (h.codec != Codec.NONE)
    # The checks in order (docs/protocol.md "Drop rules"): the first that fails names the counter.
    reasons = [
        ("drop_short", head_short),
        ("drop_version", h.version != VERSION),
        ("drop_opcode", ~opcode_ok),
        ("drop_collective", ~run.active | (h.collective != run.collective)),
        ("drop_flags", (h.flags & (~int(flags_allowed) & 0xFF)) != 0),
        ("drop_dtype", h.dtype != run.dtype),
        ("drop_codec", codec_bad),
        ("drop_seq", (h.seq != expect_seq) | (h.seq >= run.chunks)),
        ("drop_count", Mux(lost, h.count != 0, count_bad)),
    ]
    if apply is not None:
        # Each check's outcome is registered as it is (no priority chain in front of the registers);
        # the verdict is then a flat OR of registers and the first failing check (for the counters)
        # is worked out from them.
        fail_q = Signal(len(reasons), name=f"{gate.__class__.__name__.lower()}_fail")
        m.d.sync += fail_q.eq(Cat(*(cond for _, cond in reasons)))
        # Whether any check failed, registered on its own (the same value as ``fail_q.any()``), so the
        # verdict the gate's FIFO reads hang off is one register, not an OR of nine.
        bad_q = Signal(name=f"{gate.__class__.__name__.lower()}_bad")
        m.d.sync += bad_q.eq(Cat(*(cond for _, cond in reasons)).any())
        before = Const(0, 1)
        why_q = []
        for k in range(len(reasons)):
            why_q.append(fail_q[k] & ~before)
            before = before | fail_q[k]
        late = Const(0, 1) if late_count_bad is None else late_count_bad
        late_sq = Const(0, 1) if late_seq is None else late_seq
        on = apply   # implies head_valid (above)
        more_drop = Const(0, 1) if also_drop is None else also_drop
        more_accept = Const(0, 1) if also_accept is None else also_accept
        m.d.comb += [gate.drop.eq((on & (bad_q | late)) | more_drop), gate.drop_track.eq(on & (bad_q | late)),
                     gate.accept.eq((on & ~bad_q & ~late & ~wait) | more_accept)]
        late_op = Const(0, 1) if late_opcode is None else late_opcode
        for k, (flag, _) in enumerate(reasons):
            if flag == "drop_count":
                hit = why_q[k] | (late & ~bad_q & ~late_op & ~late_sq)
            elif flag == "drop_opcode":
                hit = why_q[k] | (late & ~bad_q & late_op)
            elif flag == "drop_seq":
                hit = why_q[k] | (late & ~bad_q & ~late_op & late_sq)
            else:
                hit = why_q[k]
            m.d.comb += events.flag(flag).eq(on & hit)
        return gate.o.valid & gate.o.ready & gate.o.payload.first
    with m.If(gate.head_valid):
        for k, (flag, cond) in enumerate(reasons):
            with (m.Elif if k else m.If)(cond):
                m.d.comb += [gate.drop.eq(1), gate.drop_track.eq(1), events.flag(flag).eq(1)]
        with m.Elif(~wait):
            m.d.comb += gate.accept.eq(1)
    return gate.o.valid & gate.o.ready & gate.o.payload.first


def _count_too_big(h, max_elements: int):
    return (h.count == 0) | (h.count > max_elements)


def host_input(m: Module, gate, status, run, slots, events, max_elements: int, codec_built: bool = False,
               quiet=1):
    """The host input. CONTROL and STATS_REQUEST are consumed here and answered with one STATS
    frame from ``status`` once it is free, which echoes their ``count`` (the request tag,
    ``run.tag``); a CONTROL frame first starts a collective (``run.start``) and empties the local
    buffer (``slots``), unless ``run.refusal`` refuses it (a collective still running and no
    ABORT flag, or an invalid field): then nothing changes but ``control_refused``. HOST_PUSH
    frames are checked and counted; at ranks > 0 one waits until its buffer slot is free.

    A CONTROL frame waits until the node is ``quiet`` (no frame part-way through a gate or the
    reduce pipeline): the rank it sets steers the node's routes, which must not change under a
    frame on its way through (found by the fuzz suite: a CONTROL taken as the last chunk's
    broadcast was passing cut the result it was delivering)."""
    hh = gate.head
    host_ctl = hh.opcode == Opcode.CONTROL
    host_stats = hh.opcode == Opcode.STATS_REQUEST
    with m.If(gate.head_valid & ~gate.head_short & (hh.version == VERSION)
              & (host_ctl | host_stats)):
        with m.If(~status.busy & (host_stats | quiet)):
            m.d.comb += [gate.drop.eq(1), status.trigger.eq(1)]
            m.d.sync += run.tag.eq(hh.count)
            with m.If(host_ctl):
                # A collective still running without ABORT, or invalid fields: refused, not
                # applied, counted; the STATS answer shows the unchanged configuration.
                with m.If(run.refusal(hh)):
                    m.d.comb += events.flag("control_refused").eq(1)
                with m.Else():
                    m.d.sync += run.start(hh) + [slots.valid.eq(0)]
    with m.Else():
        push_slot_busy = slots.holds(slots.of(hh.seq)) & ~run.is_first
        check_header(m, gate, run, events, hh.opcode == Opcode.HOST_PUSH, run.push_seq,
                     _count_too_big(hh, max_elements), push_slot_busy,
                     opcode=Opcode.HOST_PUSH, flags_allowed=0, codec_built=codec_built,
                     lost_ok=1, lost_wait=slots.holds(slots.of(run.push_seq)) & ~run.is_first)
    with m.If(gate.o.valid & gate.o.ready & gate.o.payload.first):
        m.d.sync += run.push_seq.eq(run.push_seq + 1)
        m.d.comb += events.flag("push_frames").eq(1)


def reduce_input(m: Module, gate, run, slots, events, max_elements: int, codec_built: bool = False):
    """The cw input: REDUCE frames (none at rank 0), each waiting until the local chunk of its
    ``seq`` is in the buffer, whose element count it must match (unless the local chunk was
    lost: its slot is marked bad and the sum leaves marked bad whatever the count)."""
    ch = gate.head
    cw_slot = slots.of(ch.seq)
    cw_slot_ready = slots.holds(cw_slot)
    count_bad = _count_too_big(ch, max_elements) | (
        cw_slot_ready & ~slots.is_bad(cw_slot) & (slots.count[cw_slot] != ch.count))
    cw_taken = check_header(
        m, gate, run, events, (ch.opcode == Opcode.REDUCE) & ~run.is_first, run.reduce_seq,
        count_bad, ~cw_slot_ready,
        opcode=Opcode.REDUCE, flags_allowed=Flag.LOST, codec_built=codec_built,
        lost_ok=~run.is_first, lost_wait=~slots.holds(slots.of(run.reduce_seq)))
    with m.If(cw_taken):
        m.d.sync += run.reduce_seq.eq(run.reduce_seq + 1)
        m.d.comb += events.flag("reduce_frames").eq(1)


def broadcast_input(m: Module, gate, run, events, max_elements: int, codec_built: bool = False):
    """The ccw input: BROADCAST frames (none at rank N-1), never waiting here."""
    bh = gate.head
    bc_taken = check_header(
        m, gate, run, events, (bh.opcode == Opcode.BROADCAST) & ~run.is_last, run.bcast_seq,
        _count_too_big(bh, max_elements), Const(0, 1),
        opcode=Opcode.BROADCAST, flags_allowed=Flag.LOST, codec_built=codec_built,
        lost_ok=~run.is_last, lost_wait=0)
    with m.If(bc_taken):
        m.d.sync += run.bcast_seq.eq(run.bcast_seq + 1)
        m.d.comb += events.flag("broadcast_frames").eq(1)
