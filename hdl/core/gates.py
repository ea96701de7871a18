"""The header check of the engine's input gates: which frame passes, waits or is dropped.

Each input of the schedule engine (:mod:`wirereduce.hdl.core.engine`) goes through a
:class:`~wirereduce.hdl.stream.frame.FrameGate`. While it holds a frame's header,
:func:`check_header` checks it (the drop rules of ``docs/protocol.md``) and either drops the frame
whole, counting why in the :class:`~wirereduce.hdl.core.status.EventCounters`, accepts it, or lets
it wait.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from wirereduce.hdl.stream.frame import decode_expect, decode_expect_count

from wirereduce.protocol import CODEC_FORWARDED as FORWARDED
from wirereduce.protocol import HEADER_BYTES, VERSION, Codec, Flag, Opcode

__all__ = ["check_header"]


def check_header(m: Module, gate, run, events, opcode_ok, expect_seq, count_bad, wait, *,
                 opcode: Opcode, flags_allowed: int, codec_built: bool, lost_ok, lost_wait,
                 apply=None, late_count_bad=None, late_opcode=None, late_seq=None, raw_head=False,
                 also_drop=None, also_accept=None, forwarded: bool = False):
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
    accepted frames must share.

    ``forwarded`` (the engine's network gates on a codec engine): a BROADCAST whose ``codec`` is
    :data:`~wirereduce.protocol.CODEC_FORWARDED` (a compressed BROADCAST its ``CodecIn`` passed on
    unchanged, its length already checked against its tags, docs/codec.md "Forwarded broadcasts")
    passes the codec check of a compressed collective (INCEPTIONN_V1, the same ``eb_k``), and its
    length is checked only against the MTU (``gate.expect_open``)."""
    if raw_head and apply is None:
        raise ValueError("raw_head needs apply")
    if apply is None and (also_drop is not None or also_accept is not None):
        raise ValueError("also_drop and also_accept need apply")
    h = gate.head_raw if raw_head else gate.head
    head_short = gate.head_raw_short if raw_head else gate.head_short
    lost = (h.flags & Flag.LOST) != 0
    expect_bytes = Mux(lost, HEADER_BYTES, HEADER_BYTES + 4 * h.count)
    if forwarded:
        fwd_any = h.codec == FORWARDED
        fwd_ok = fwd_any & (h.opcode == Opcode.BROADCAST) & (run.codec == Codec.INCEPTIONN_V1)
        expect_bytes = Mux(fwd_any, gate.max_bytes, expect_bytes)
    else:
        fwd_any = fwd_ok = Const(0, 1)
    decoded = hasattr(gate, "expect")   # FrameGate(expect_decoded=True)
    if decoded:
        # decoded from the count (a LOST placeholder's 16 bytes: count 0), and the MTU's decoding of a
        # constant, which Yosys folds (timing: decode_expect_count, no adder and subtracters in a row
        # behind the header; decode_expect's flat assignments, no process for an event-driven simulator
        # to skip)
        w = len(gate.i.payload.data)
        expect_bytes = decode_expect_count(m, Mux(lost, 0, h.count), w).as_value()
        if forwarded:
            mtu = decode_expect(m, Const(gate.max_bytes, 16), w, name="expect_mtu").as_value()
            expect_bytes = Mux(fwd_any, mtu, expect_bytes)
    if apply is not None:   # registered, as the verdict below: the header has not changed when applied
        eb_q = Signal(expect_bytes.shape() if decoded else 16, name=f"{gate.__class__.__name__.lower()}_expect")
        lost_q = Signal()
        open_q = Signal(name=f"{gate.__class__.__name__.lower()}_open")
        m.d.sync += [eb_q.eq(expect_bytes), lost_q.eq(lost), open_q.eq(fwd_any)]
        expect_bytes, lost_mark, open_mark = eb_q, lost_q, open_q
    else:
        lost_mark, open_mark = lost, fwd_any
    m.d.comb += [
        (gate.expect if decoded else gate.expect_bytes).eq(expect_bytes),
        gate.mark_bad.eq(lost_mark),
        gate.expect_open.eq(open_mark),
        gate.lost_hdr.version.eq(VERSION), gate.lost_hdr.opcode.eq(opcode),
        gate.lost_hdr.dtype.eq(run.dtype), gate.lost_hdr.codec.eq(run.codec), gate.lost_hdr.eb_k.eq(run.eb_k),
        gate.lost_hdr.src.eq(run.rank), gate.lost_hdr.flags.eq(Flag.LOST),
        gate.lost_hdr.collective.eq(run.collective), gate.lost_hdr.seq.eq(expect_seq),
        gate.lost_ok.eq(run.active & (expect_seq < run.chunks) & lost_ok),
        gate.lost_wait.eq(lost_wait),
        events.flag("drop_length").eq(gate.length_error),
        events.flag("drop_oversize").eq(gate.oversize),
    ]
    codec_bad = ((h.codec != run.codec) & ~fwd_ok) | (h.eb_k != run.eb_k)
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
