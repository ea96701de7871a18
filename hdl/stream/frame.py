"""Frame-level stream plumbing: the beat layout, the header gate, fork and frame arbiter.

Every port of a node carries frames as a :mod:`amaranth.lib.stream` of :func:`beat_layout`
beats. Byte ``k`` of a frame is ``data[8*(k % B) : 8*(k % B) + 8]`` of beat ``k // B``
(``B = width // 8`` bytes a beat), as on an AXI4-Stream bus; ``keep`` marks valid bytes and is
all ones except on the last beat of a frame. ``bad``, meaningful on the last beat only, says the
frame turned out bad after its first beats had already been passed on (a cut-through Ethernet
receiver found its FCS wrong, :class:`~wirereduce.hdl.eth.port.EthPort10G`): every stage carries
it to the frame's last beat out, and an Ethernet transmitter then sends the frame with a stomped
FCS so that the next hop drops it (like the ``tuser`` error bit of an AXI4-Stream MAC).
"""

from __future__ import annotations

import operator
from functools import reduce

from amaranth import Cat, Const, Elaboratable, Module, Mux, Signal, Value
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.params import reject, rejecting

from wirereduce.config import check_width
from wirereduce.protocol import HEADER_BYTES, header_layout

__all__ = ["beat_layout", "tagged_layout", "gated_layout", "check_width", "header_beats", "expect_layout",
           "decode_expect", "decode_expect_count", "count_beats",
           "FrameStream", "FrameInterface", "FrameGate", "Fork", "FrameArbiter"]


def expect_layout(width: int) -> data.StructLayout:
    """A frame's expected length, decoded for :class:`FrameGate`'s length check
    (``FrameGate(expect_decoded=True)``; :func:`decode_expect` makes it from a length in bytes).

    Fields: ``last`` (16 bits) the index of the expected last beat; ``keep`` (``width // 8`` bits) that
    beat's ``keep`` (a thermometer code, at least one byte); ``tail`` its byte count (1 … ``width // 8``);
    ``one``: the frame is one beat (``last`` = 0; only where one beat holds a header, ≥ 128 bit);
    ``two``: ``last`` = 1.
    """
    nb = check_width(width) // 8
    return data.StructLayout({"last": 16, "keep": nb, "tail": range(nb + 1), "one": 1, "two": 1})


def decode_expect(m: Module, expect_bytes, width: int, name: str = "expect"):
    """``expect_bytes`` (a value of at least 16: the frame's length in bytes) decoded into a new signal of
    :func:`expect_layout`, by combinational logic added to ``m``; returned."""
    nb = check_width(width) // 8
    shift = (nb - 1).bit_length()
    out = Signal(expect_layout(width), name=name)
    m.d.comb += [out.last.eq((expect_bytes - 1) >> shift), out.tail.eq(expect_bytes - (out.last << shift))]
    m.d.comb += [out.keep.eq(Cat(*(out.tail > k for k in range(nb)))), out.two.eq(out.last == 1)]
    if header_beats(width) == 1:
        m.d.comb += out.one.eq(out.last == 0)
    return out


def decode_expect_count(m: Module, count, width: int, name: str = "expect"):
    """The expected length of a frame of ``count`` 4-byte elements after the 16-byte header
    (``16 + 4·count`` bytes, the length every data frame's header implies: docs/protocol.md) decoded
    into a new signal of :func:`expect_layout`, by combinational logic added to ``m``; returned. The same
    values as :func:`decode_expect` of ``16 + 4·count``, worked out from ``count`` directly (timing:
    one incrementer, ``last = (count + 3) >> (s − 2)`` with ``2^s`` bytes a beat, and the last beat's
    byte count and ``keep`` from ``count``'s low ``s − 2`` bits, instead of an adder, a subtracter and
    a compare in a row; the engine's header checks and summation units).

    Derivation: the last byte is byte ``4·count + 15``; its beat is ``(4·count + 15) >> s``, which is
    ``(count + 3) >> (s − 2)`` because the dropped ``3/4`` never carries into the next whole number;
    and the last beat holds ``((4·count + 15) mod 2^s) + 1`` bytes, which depends on ``count mod
    2^(s − 2)`` only.
    """
    nb = check_width(width) // 8
    s = (nb - 1).bit_length()
    lb = _count_shift(width)                # count's bits that fix the last beat's byte count
    out = Signal(expect_layout(width), name=name)
    count = Value.cast(count)
    m.d.comb += out.last.eq((count + 3) >> lb)
    low = count[:lb]
    tails = [(4 * v + 15) % nb + 1 for v in range(1 << lb)]
    # (flat expressions of ``low``, no ``Switch``: a process whose other assignments are constants
    # never runs in an event-driven simulator such as Icarus, whose ``always @*`` waits for a change)
    m.d.comb += out.tail.eq((Cat(Const(0, 2), low) + 15)[:s] + 1)
    m.d.comb += out.keep.eq(Cat(*(Cat(*(low == v for v in range(1 << lb) if tails[v] > k)).any()
                                  for k in range(nb))))
    # last = 0 while count + 3 < 2^lb; last = 1 while 2^lb ≤ count + 3 < 2^(lb + 1)
    one_below, two_below = (1 << lb) - 3, (1 << (lb + 1)) - 3
    m.d.comb += out.two.eq((count >= max(one_below, 0)) & (count < two_below))
    if header_beats(width) == 1:
        m.d.comb += out.one.eq(count < one_below if one_below > 0 else 0)
    return out


def _count_shift(width: int) -> int:
    """``s − 2`` for ``2^s`` bytes a beat: a count's low bits that fix a data frame's last beat."""
    return (check_width(width) // 8 - 1).bit_length() - 2


def count_beats(count, width: int) -> Value:
    """The beats of a data frame of ``count`` elements (``16 + 4·count`` bytes) on a ``width``-bit
    stream, as a value: ``(count + 3 + 2^(s − 2)) >> (s − 2)`` with ``2^s`` bytes a beat, one adder
    (:func:`decode_expect_count`'s ``last`` + 1, derived there)."""
    lb = _count_shift(width)
    return (Value.cast(count) + (3 + (1 << lb))) >> lb


def header_beats(width: int) -> int:
    """Beats a ``width``-bit stream needs to carry the 16-byte header (2 at 64 bit, 1 at ≥128)."""
    return -(-HEADER_BYTES // (width // 8))


def beat_layout(width: int) -> data.StructLayout:
    """One beat of a ``width``-bit frame stream: ``data`` (width), ``keep`` (width/8), ``last`` (1),
    ``bad`` (1, on the last beat: the frame is known bad, see the module docstring)."""
    check_width(width)
    return data.StructLayout({"data": width, "keep": width // 8, "last": 1, "bad": 1})


class FrameStream(wiring.Signature):
    """Signature of a frame stream: :func:`beat_layout` beats with ``valid``/``ready`` handshake.

    The members are those of ``stream.Signature(beat_layout(width))`` (``payload``, ``valid``,
    ``ready``), so a :class:`FrameStream` port connects (:func:`amaranth.lib.wiring.connect`) to
    any :class:`amaranth.lib.stream.Signature` port of the same beat layout. It is a class of its
    own because :class:`amaranth.lib.stream.Signature` is final in Amaranth 0.5; a named signature
    says what a port carries (frames, with the ``keep``/``last``/``bad`` rules of this module's
    docstring) and checks its width once.

    A beat is taken in a cycle in which both ``valid`` and ``ready`` are high; ``valid`` must not
    depend on ``ready``, and once high it stays high with the same payload until the beat is taken.

    Parameters
    ----------
    width : int
        Datapath width in bits (see :func:`check_width`).

    Members
    -------
    payload : Out(beat_layout(width))
    valid : Out(1)
    ready : In(1)

    Raises
    ------
    TypeError, ValueError
        If ``width`` fails :func:`check_width`.
    """

    def __init__(self, width: int):
        self._width = check_width(width)
        super().__init__({"payload": Out(beat_layout(width)), "valid": Out(1), "ready": In(1)})

    @property
    def width(self) -> int:
        """Datapath width in bits."""
        return self._width

    def __eq__(self, other):
        return type(other) is FrameStream and other.width == self.width

    def __hash__(self):
        return hash((FrameStream, self._width))

    def __repr__(self):
        return f"FrameStream({self._width})"

    def create(self, *, path=None, src_loc_at=0):
        return FrameInterface(self, path=path, src_loc_at=1 + src_loc_at)


class FrameInterface(wiring.PureInterface):
    """The interface object of a :class:`FrameStream`: ``payload``, ``valid``, ``ready`` and the
    ``p`` shortcut for ``payload``, as on an :class:`amaranth.lib.stream.Interface`."""

    @property
    def p(self):
        return self.payload


def tagged_layout(width: int) -> data.StructLayout:
    """A beat plus ``first`` (1 on the first beat of a frame), for stages that rewrite the header."""
    check_width(width)
    return data.StructLayout({"data": width, "keep": width // 8, "last": 1, "bad": 1, "first": 1})


def gated_layout(width: int, index_bits: int) -> data.StructLayout:
    """A beat that passed a :class:`FrameGate`: the beat plus its frame's header and beat index."""
    return data.StructLayout({
        "data": width, "keep": width // 8, "last": 1, "bad": 1,
        "first": 1, "index": index_bits, "hdr": header_layout(),
    })


class _Fifo(Elaboratable):
    """A :class:`amaranth.lib.fifo.SyncFIFO` (first word falls through, ``r_data`` read from the
    storage combinationally) whose ``r_rdy`` and ``w_rdy`` are registers, updated from the reads and
    writes (timing: no level compare in front of the decisions that read the FIFO)."""

    def __init__(self, width: int, depth: int):
        self.width, self.depth = width, depth
        self.w_data, self.w_en = Signal(width, name="w_data"), Signal(name="w_en")
        self.w_rdy = Signal(init=1, name="w_rdy")
        self.r_data, self.r_en, self.r_rdy = Signal(width, name="r_data"), Signal(name="r_en"), Signal(name="r_rdy")

    def elaborate(self, platform):
        m = Module()
        depth = self.depth
        do_read = self.r_rdy & self.r_en
        do_write = self.w_rdy & self.w_en
        storage = m.submodules.storage = memory.Memory(shape=self.width, depth=depth, init=[])
        w_port = storage.write_port()
        r_port = storage.read_port(domain="comb")
        produce = Signal(range(depth))
        consume = Signal(range(depth))
        m.d.comb += [w_port.addr.eq(produce), w_port.data.eq(self.w_data), w_port.en.eq(do_write),
                     r_port.addr.eq(consume), self.r_data.eq(r_port.data)]
        with m.If(do_write):
            m.d.sync += produce.eq(Mux(produce == depth - 1, 0, produce + 1))
        with m.If(do_read):
            m.d.sync += consume.eq(Mux(consume == depth - 1, 0, consume + 1))
        # The level one-hot (``held[k]``: k entries), so each bit's next value and the ready flags are
        # one LUT on the read and write strobes (timing: no ±1 adder and compare behind ``r_en``, which
        # the gates' decisions drive).
        # Each bit is written out from the levels next to it, with whether a write or a read can
        # happen at that level (not full, not empty) known from the level itself, so it is a function
        # of ``w_en``, ``r_en`` and three bits (one LUT) rather than of the ready registers as well.
        held = Signal(depth + 1, init=1, name="held")
        nxt = []
        for k in range(depth + 1):
            terms = []
            for j in (k - 1, k, k + 1):
                if not 0 <= j <= depth:
                    continue
                wr = self.w_en if j < depth else Const(0, 1)
                rd = self.r_en if j > 0 else Const(0, 1)
                step = {k - 1: wr & ~rd, k: ~(wr ^ rd), k + 1: rd & ~wr}[j]
                terms.append(held[j] & step)
            nxt.append(reduce(operator.or_, terms))
        m.d.sync += [held.eq(Cat(*nxt)), self.r_rdy.eq(~nxt[0]), self.w_rdy.eq(~nxt[depth])]
        return m


class FrameGate(wiring.Component):
    """Holds each frame until its header is complete, then passes or drops the whole frame.

    The decision is the parent's: while ``head_valid`` is high, ``head`` is the header of the
    frame waiting at the output (``head_short`` if the frame ended before its header was
    complete) and the parent raises ``accept`` or ``drop`` (combinationally, in the same
    cycle) or neither (the frame waits). A dropped frame is consumed without any beat reaching
    ``o``, so nothing downstream ever sees part of it: docs/protocol.md "Bad input loses nothing".

    The header is parsed as beats arrive and queued, so frames pass back to back at one beat
    per cycle. The first beat of a frame accepted on ``i`` at one clock edge is valid on ``o``
    for the edge ``header_beats(width)`` cycles later (2 at 64 bit, 1 at ≥ 128 bit), if the
    parent accepts it at once; ``tests/test_wirespeed.py`` and
    :func:`wirereduce.sim.bench.latency.hop_latency` measure it.

    **Length check** (``check_length=True``; docs/protocol.md "Drop rules"). With ``accept`` the
    parent gives ``expect_bytes``, the length in bytes the header says the frame has (16 + 4·count
    for a data frame; at least the 16 header bytes). The frame passes cut-through, and the gate
    compares as the beats leave:

    - a frame that ends short of ``expect_bytes``, or whose last beat's ``keep`` is not exactly
      the expected bytes, leaves with ``bad`` on its last beat, and ``length_error`` pulses;
    - a frame still going at its expected last byte (too long), or with a gap in a non-last
      beat's ``keep``, is cut off there: that beat leaves as the last one, marked ``bad``, and
      the rest is dropped; when it ends, ``oversize`` pulses if it was longer than ``max_bytes``
      (the MTU), else ``length_error``. No beat past ``expect_bytes`` ever leaves, so a frame can
      never be written past its buffer slot.

    Whether the beat leaving is the expected last one is decided a beat ahead, into a register (the
    index compare is off the output's path; docs/architecture.md "Timing budgets"). The first beat
    can only be the expected last where one beat holds a whole header (≥ 128 bit); at 64 bit the
    header's 16 bytes take two.

    ``mark_bad`` (sampled with ``accept``) marks the frame's last beat ``bad`` with no count (a
    LOST placeholder arriving from the ring).

    **Lost-frame placeholders** (``track``): a frame the parent drops with ``drop_track`` high
    (a header check failed on a port where frames arrive in order) whose last beat turns out
    ``bad`` was one of ours, spoilt on the cable (a cut-through Ethernet receiver found its FCS
    wrong): the chunk it carried is gone. The gate then emits a placeholder in its place: the
    header ``lost_hdr`` from the parent (whole header beats, ``keep`` of 16 bytes, the last beat
    marked ``bad``) once ``lost_ok`` and not ``lost_wait``; if ``lost_ok`` is low (no frame is
    expected on this port) the placeholder is abandoned. ``lost`` pulses when one leaves.

    Parameters
    ----------
    width : int
        Datapath width in bits (see :func:`check_width`).
    max_beats : int
        Longest frame in beats; sets the width of ``o.payload.index``.
    check_length : bool
        Check each accepted frame's length against ``expect_bytes`` (above).
    max_bytes : int, optional
        The MTU in bytes, for telling ``oversize`` from ``length_error``; default
        ``max_beats * width // 8``.
    placeholders : bool
        Build the lost-frame placeholders (default). ``False`` for a parent that never drops
        with ``drop_track`` or never lets a placeholder go (``lost_ok`` always low): no INJECT
        state, so the output's payload and ``valid`` are not selected by it (timing; the codec
        stages' gates, the schedule engine's gates).
    expect_decoded : bool
        The parent gives the expected length decoded (``expect``, :func:`expect_layout`; made with
        :func:`decode_expect`, typically into a register) instead of ``expect_bytes``: no
        subtraction, shift or thermometer decode between the parent's register and the check
        (timing; the schedule engine's network gates, docs/architecture.md "Timing budgets").
    verdict_holds_head : bool
        The parent raises ``accept`` and ``drop`` only while a header waits in START and it saw that
        header the cycle before (a registered verdict: the schedule engine's gates, whose ``apply``
        implies ``head_valid`` a cycle earlier, and the head leaves only through ``accept`` or ``drop``):
        the header FIFO's ``r_rdy`` is then left out of ``o.valid``, the FIFO reads and the state's next
        values, which the verdict already implies (timing: the 512-bit engine's reduce buffers' slot
        flags hung off it). Default ``False``: the gate checks ``r_rdy`` itself.

    Attributes
    ----------
    i : In(FrameStream(width))
    o : Out(stream.Signature(gated_layout(width, ...)))
        Beats of accepted frames with ``first``, ``index`` and the frame's ``hdr``.
    head : Out(header_layout()); head_valid, head_short : Out(1)
    head_raw : Out(header_layout()); head_raw_short : Out(1)
        The header FIFO's head in every state, not only in START (``head`` and ``head_short`` are
        0 outside it): the same values as ``head``/``head_short`` whenever ``head_valid`` is high,
        meaningless otherwise. For checks registered from it and applied only after a cycle with
        ``head_valid`` (timing: no select by the state in front of them; the engine's host gate).
    head_raw_valid, head_read : Out(1)
        The header FIFO holds a header (``head_raw`` is one), in every state; ``head_read``: it is
        read (the frame's first beat leaves or the frame is dropped) at this clock edge. A header
        that was at the head with ``head_read`` low is still there the cycle after, so a decision
        registered from ``head_raw`` is ready by the time the gate reaches START, even right after
        a frame of two beats or more (the codec stages).
    accept, drop : In(1)
    expect_bytes : In(16); mark_bad : In(1)
        With ``accept``: the frame's length by its header, and whether to mark it bad anyway.
    expect : In(expect_layout(width))
        Instead of ``expect_bytes`` with ``expect_decoded``: the same length, decoded.
    expect_open : In(1)
        With ``accept``: the expected length is only a bound (the schedule engine's forwarded
        compressed BROADCAST, whose length its ``CodecIn`` has checked against its tags): a frame
        that ends before it is not a length error; one that runs past it is cut off as any other.
    length_error, oversize : Out(1)
        One-cycle pulses, at most one per frame (the parent counts them).
    drop_track : In(1)
        With ``drop``: a ``bad`` verdict at the end of this frame means a frame of ours was lost.
    lost_hdr : In(header_layout()); lost_ok, lost_wait : In(1); lost : Out(1)
        The placeholder to emit for a lost frame, and when (above).
    busy : Out(1)
        A frame is part-way through the output (passed, dropped or cut off) or a placeholder is
        being sent: high from its first beat until its last.
    """

    def __init__(self, width: int, max_beats: int, check_length: bool = False, max_bytes: int | None = None,
                 placeholders: bool = True, expect_decoded: bool = False, verdict_holds_head: bool = False):
        with rejecting(self):
            self._width = check_width(width)
            if not isinstance(max_beats, int) or max_beats < header_beats(width):
                raise ValueError(f"max_beats must be an int ≥ {header_beats(width)}, not {max_beats!r}")
        self._hb = header_beats(width)
        self._max_beats = max_beats
        self._index_bits = max(1, (max_beats - 1).bit_length())
        self._check_length = bool(check_length)
        self._placeholders = bool(placeholders)
        self._expect_decoded = bool(expect_decoded)
        self._verdict_holds_head = bool(verdict_holds_head)
        self._max_bytes = max_bytes if max_bytes is not None else max_beats * (width // 8)
        #: The longest frame in bytes (``max_bytes``).
        self.max_bytes = self._max_bytes
        super().__init__({
            "i": In(FrameStream(width)),
            "o": Out(stream.Signature(gated_layout(width, self._index_bits))),
            "head": Out(header_layout()),
            "head_valid": Out(1),
            "head_short": Out(1),
            "head_raw": Out(header_layout()),
            "head_raw_short": Out(1),
            "head_raw_valid": Out(1),
            "head_read": Out(1),
            "accept": In(1),
            "drop": In(1),
            **({"expect": In(expect_layout(width))} if expect_decoded else {"expect_bytes": In(16)}),
            "mark_bad": In(1),
            "expect_open": In(1),
            "length_error": Out(1),
            "oversize": Out(1),
            "drop_track": In(1),
            "lost_hdr": In(header_layout()),
            "lost_ok": In(1),
            "lost_wait": In(1),
            "lost": Out(1),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        w, hb = self._width, self._hb
        nb = w // 8
        blay = beat_layout(w)
        hlay = header_layout()
        hwidth = hlay.size

        # Beats wait here until their header is decided; deep enough to hold a whole header
        # plus slack so the input never stalls on a frame-start decision that is already made.
        # (Both FIFOs with registered ready flags: ``_Fifo``.)
        # Each beat is stored with its ``keep`` summarised for the length check (all bytes kept; a
        # thermometer code, lanes 0 … n − 1 kept; that n), worked out as it is written (timing: the
        # check at the output compares a few bits, not the whole ``keep``; docs/architecture.md
        # "Timing budgets").
        kc_bits = (nb).bit_length()
        m.submodules.beats = beats = _Fifo(width=blay.size + 2 + kc_bits, depth=hb + 4)
        # One entry per frame: the header bits and a flag for frames shorter than a header.
        m.submodules.hdrs = hdrs = _Fifo(width=hwidth + 1, depth=4)

        # Input side: count beats and collect the header bits.
        in_idx = Signal(range(hb + 1))
        hdr_bits = Signal(hb * w)
        in_beat = self.i.payload
        cur_bits = Signal(hb * w)
        m.d.comb += cur_bits.eq(hdr_bits)
        with m.Switch(in_idx):
            for k in range(hb):
                with m.Case(k):
                    m.d.comb += cur_bits[k * w:(k + 1) * w].eq(in_beat.data)
        in_hdr_done = Signal()  # this beat completes the header, or ends a runt frame
        m.d.comb += in_hdr_done.eq((in_idx == hb - 1) | (in_beat.last & (in_idx < hb)))
        # A frame is short when it ends before the header's last byte (byte 15) arrived.
        last_hdr_byte = HEADER_BYTES - (hb - 1) * nb - 1
        in_short = Signal()
        m.d.comb += in_short.eq((in_idx < hb - 1) | ~in_beat.keep[last_hdr_byte])
        ik = in_beat.keep
        i_full = ik.all()
        # thermometer: no kept lane above a dropped one
        i_thermo = Cat(*(~ik[k + 1] | ik[k] for k in range(nb - 1))).all() if nb > 1 else Const(1)
        # n for a thermometer code: one more than its top kept lane (0 for none)
        edge = [ik[k] & (~ik[k + 1] if k + 1 < nb else 1) for k in range(nb)]
        i_count = Signal(kc_bits)
        m.d.comb += i_count.eq(Cat(*(Cat(*(edge[k] for k in range(nb) if (k + 1) >> j & 1)).any()
                                     for j in range(kc_bits))))
        m.d.comb += [
            self.i.ready.eq(beats.w_rdy & hdrs.w_rdy),
            beats.w_data.eq(Cat(in_beat.as_value(), i_full, i_thermo, i_count)),
            beats.w_en.eq(self.i.valid & self.i.ready),
            hdrs.w_data.eq(Cat(cur_bits[:hwidth], in_short)),
            hdrs.w_en.eq(self.i.valid & self.i.ready & in_hdr_done),
        ]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += hdr_bits.eq(cur_bits)
            with m.If(in_beat.last):
                m.d.sync += in_idx.eq(0)
            with m.Elif(in_idx < hb):
                m.d.sync += in_idx.eq(in_idx + 1)

        # Output side.
        out_beat = data.View(blay, beats.r_data[:blay.size])
        o_full, o_thermo = beats.r_data[blay.size], beats.r_data[blay.size + 1]
        o_count = beats.r_data[blay.size + 2:]
        head = data.View(hlay, hdrs.r_data[:hwidth])
        cur_hdr = Signal(hlay)
        out_idx = Signal(self._index_bits)
        o = self.o.payload
        m.d.comb += [
            self.head_raw.eq(head), self.head_raw_short.eq(hdrs.r_data[hwidth]),
            self.head_raw_valid.eq(hdrs.r_rdy),
        ]

        # Length check: the expected last beat and its keep, from expect_bytes (given with accept).
        full_keep = (1 << nb) - 1
        # exp_prev: the index of the beat before the expected last one; at_end_q: the beat now
        # leaving (in PASS) is the expected last one, decided as the beat before it left.
        exp_prev, exp_keep, exp_tail, exp_mark = Signal(16), Signal(nb), Signal(range(nb + 1)), Signal()
        exp_open = Signal()
        at_end_q = Signal()
        cur_at_end, cur_keep, cur_tail = Signal(), Signal(nb), Signal(range(nb + 1))
        cur_open = Signal()
        exp = self.expect if self._expect_decoded else decode_expect(m, self.expect_bytes, w, name="accept_expect")
        accept_last, accept_keep = exp.last, exp.keep
        # The first beat is the expected last one only if one beat holds the whole header
        # (expect_bytes ≥ HEADER_BYTES, so at 64 bit the last beat is at least the second).
        first_at_end = exp.one if hb == 1 else Const(0)
        # Placeholder state.
        track = Signal()
        lost_hdr = Signal(hlay)
        inj_idx = Signal(range(hb + 1))
        # Cut-off frames: beats counted (saturating) to tell oversize from a length error.
        trunc_beats = Signal(range(self._max_bytes // nb + 3))
        trunc_max = (self._max_bytes // nb + 2)

        def beat_check():
            """Return (cut, err): cut this frame after the beat now leaving; mark it bad (length)."""
            if not self._check_length:
                return None
            at_end = cur_at_end
            # keep == cur_keep (a thermometer code of cur_tail lanes), from the summary stored with the beat
            last_ok = at_end & o_thermo & (o_count == cur_tail)
            cut = ~out_beat.last & (at_end | ~o_full)
            # ``expect_open``: the expected length is only a bound, a frame ending before it is no error
            # (one ending in the bound's beat with bytes past it is: those bytes are cut, ``o.keep``)
            err = out_beat.last & Mux(cur_open, at_end & (o_count > cur_tail), ~last_ok)
            return cut, err   # (and never a byte past the expected length: ``o.keep`` below)

        # The state in one-hot registers, the only state register (timing: the FIFO reads below hang off
        # one register each, not a decode of a state register); their next values are written out
        # together below ("The transitions"). ``st_flush`` (TRUNC or DROP) is kept as its own register
        # rather than an OR of ``st_trunc`` and ``st_drop``, for the beat FIFO's read enable.
        st_start, st_pass, st_flush = Signal(init=1, name="st_start"), Signal(name="st_pass"), Signal(name="st_flush")
        st_inject = Signal(name="st_inject")
        inj_valid, inj_last = Signal(), Signal()   # INJECT's output valid and last (below)

        # The length check of the beat now leaving, flat on the one-hot state (timing: ``last`` and ``bad``
        # load the engine's buffers' flags, and a select by the state register put them levels deep): in
        # START the head frame's first beat against the expectation given with ``accept``, in PASS a later
        # beat against the registered one; in the other states nothing leaves that it applies to.
        m.d.comb += [
            cur_at_end.eq(Mux(st_start, first_at_end, at_end_q)),
            cur_keep.eq(Mux(st_start, accept_keep, exp_keep)),
            cur_tail.eq(Mux(st_start, exp.tail, exp_tail)),
            cur_open.eq(Mux(st_start, self.expect_open, exp_open)),
        ]
        chk = beat_check()   # (without the length check nothing is cut or marked: constant 0)
        cut, err = chk if chk is not None else (Const(0, 1), Const(0, 1))
        mark = Mux(st_start, self.mark_bad, exp_mark)

        # No FSM register besides them (timing: the state register's decode was the start of the
        # 512-bit engine's deepest paths): each state's block below is entered on its own one-hot
        # register, and sets that state's data registers and pulses; the states' next values are
        # written out together after them.
        st_trunc, st_drop = Signal(name="st_trunc"), Signal(name="st_drop")

        # The handshakes each state acts on, flat on its register (with the states one-hot, the same as
        # ``o.valid & o.ready`` in that state).
        # (``verdict_holds_head``: the parent's ``accept`` and ``drop`` imply a header waits)
        head_in = Const(1, 1) if self._verdict_holds_head else hdrs.r_rdy
        s_take = st_start & head_in & self.accept & self.o.ready    # the head frame's first beat leaves
        s_drop = st_start & head_in & self.drop & ~(self.accept & self.o.ready)   # the head frame is dropped
        p_take = st_pass & beats.r_rdy & self.o.ready                  # a later beat leaves
        t_end = st_trunc & beats.r_rdy & out_beat.last                 # a cut-off frame's rest is read out
        d_end = st_drop & beats.r_rdy & out_beat.last                  # a dropped frame is read out

        m.d.comb += self.busy.eq(~st_start)
        with m.If(st_start):
            # In START the beat FIFO's head is the first beat of the frame whose header is at the
            # header FIFO's head (the frames before it were read to their last beat), written no
            # later than the header was: a header waiting means its first beat is there (timing:
            # one FIFO level less in front of the decision and the reads).
            m.d.comb += [
                self.head.eq(head),
                self.head_short.eq(hdrs.r_data[hwidth]),
                self.head_valid.eq(hdrs.r_rdy),
            ]
            with m.If(s_take):
                m.d.sync += [cur_hdr.eq(head), out_idx.eq(1), exp_prev.eq(accept_last - 1),
                             at_end_q.eq(exp.two),
                             exp_keep.eq(accept_keep), exp_tail.eq(exp.tail), exp_mark.eq(self.mark_bad),
                             exp_open.eq(self.expect_open)]
                with m.If(cut):
                    m.d.sync += trunc_beats.eq(1)
                with m.If(err):
                    m.d.comb += self.length_error.eq(1)
            with m.Elif(s_drop):
                m.d.sync += track.eq(self.drop_track)
        with m.If(p_take):
            m.d.sync += [out_idx.eq(out_idx + 1), at_end_q.eq(out_idx == exp_prev)]
            with m.If(cut):
                m.d.sync += trunc_beats.eq(out_idx + 1)
            with m.If(err):
                m.d.comb += self.length_error.eq(1)
        with m.If(st_trunc):
            # The rest of a cut-off frame: dropped; its length tells oversize from a length error.
            with m.If(beats.r_rdy):
                with m.If(trunc_beats < trunc_max):
                    m.d.sync += trunc_beats.eq(trunc_beats + 1)
                with m.If(out_beat.last):
                    # Bytes in all: trunc_beats·nb + (the last lane with keep) + 1 > max_bytes, worked
                    # out without the sum (timing): more beats than max_bytes // nb before this one,
                    # or exactly that many and a kept lane at or past max_bytes % nb.
                    full, rest = divmod(self._max_bytes, nb)
                    over = (trunc_beats > full) | ((trunc_beats == full) & out_beat.keep[rest:].any())
                    with m.If(over):
                        m.d.comb += self.oversize.eq(1)
                    with m.Else():
                        m.d.comb += self.length_error.eq(1)
        if self._placeholders:  # else no INJECT state at all (``placeholders=False``)
            with m.If(st_inject):
                # A placeholder for the frame just lost: lost_hdr's header beats, the last marked bad
                # (its output, flat on ``st_inject``, below).
                with m.If((inj_idx == 0) & ~self.lost_ok):
                    m.d.sync += inj_idx.eq(0)
                with m.Elif(self.o.valid & self.o.ready):
                    with m.If(inj_idx == 0):
                        m.d.sync += lost_hdr.eq(self.lost_hdr)
                        m.d.comb += self.lost.eq(1)
                    with m.If(inj_idx == hb - 1):
                        m.d.sync += inj_idx.eq(0)
                    with m.Else():
                        m.d.sync += inj_idx.eq(inj_idx + 1)
        # The transitions: every state register's next value as one flat expression of the handshakes
        # above (timing: written as transitions in each state's block, the blocks' priority
        # became a chain of selects that the synthesiser cannot flatten, not knowing the states are
        # one-hot; the first state's handshake, behind the parent's ``accept``, went through all of it:
        # the VC709 engine's tenth level). START: the head frame's first beat leaves (a frame cut there
        # goes to TRUNC, a longer one to PASS) or the frame is dropped (DROP while beats are left, INJECT
        # for a placeholder); PASS: a cut beat → TRUNC, the last beat → START; TRUNC and DROP: the last
        # beat read out → START (DROP: INJECT for a placeholder); INJECT: abandoned, or its last header
        # beat taken → START.
        moved = s_take | p_take
        if self._placeholders:
            lost_s, lost_d = self.drop_track & out_beat.bad, track & out_beat.bad
            inj_end = st_inject & (((inj_idx == 0) & ~self.lost_ok)
                                   | (inj_valid & self.o.ready & (inj_idx == hb - 1)))
            inject_d = (s_drop & out_beat.last & lost_s) | (d_end & lost_d) | (st_inject & ~inj_end)
        else:
            lost_s = lost_d = inj_end = inject_d = Const(0, 1)
        trunc_d = (moved & cut) | (st_trunc & ~t_end)
        pass_d = (moved & ~cut & ~out_beat.last) | (st_pass & ~p_take)
        drop_d = (s_drop & ~out_beat.last) | (st_drop & ~d_end)
        start_d = ((st_start & ~(s_take & (cut | ~out_beat.last)) & ~(s_drop & (~out_beat.last | lost_s)))
                   | (p_take & ~cut & out_beat.last) | t_end | (d_end & ~lost_d) | inj_end)
        m.d.sync += [st_start.eq(start_d), st_pass.eq(pass_d), st_trunc.eq(trunc_d), st_drop.eq(drop_d),
                     st_flush.eq(trunc_d | drop_d), st_inject.eq(inject_d)]
        # The FIFO reads as flat expressions on the state (timing: not assigned in several states
        # behind the decisions and the length check): in START the head frame's header and first beat
        # leave when it is accepted and taken or dropped (``accept`` and ``drop`` both read it; the
        # header FIFO's ``r_rdy`` is ``head_valid``); in PASS a beat leaves when taken; in TRUNC and
        # DROP every beat there is leaves; in INJECT nothing is read.
        in_start, in_pass, in_flush = st_start, st_pass, st_flush
        # ``o.valid`` likewise (timing: the engine's buffers' write enables hang off it, and a select by
        # the state register put it levels deep): in START the head frame's first beat once accepted,
        # in PASS a beat there is, in INJECT a placeholder beat (``inj_valid``).
        m.d.comb += self.o.valid.eq((st_start & head_in & self.accept) | (st_pass & beats.r_rdy)
                                    | (st_inject & inj_valid))
        # ``last`` and ``bad`` likewise: a frame cut at the expected length ends there marked bad, one
        # that fails the check or was marked (``mark_bad``) has its last beat marked; a placeholder's last
        # header beat is its last, marked bad.
        m.d.comb += [
            o.last.eq(Mux(st_inject, inj_last, out_beat.last | cut)),
            o.bad.eq(Mux(st_inject, inj_last, out_beat.bad | cut | err | (out_beat.last & mark))),
        ]
        # The rest of the output likewise (timing: the engine's buffers decode their slot from
        # ``hdr.seq`` and ``first`` into their flags' enables): in START the head frame's first beat
        # and header, in PASS a later beat of the frame with its registered header, in INJECT a
        # placeholder's header beats (``lost_hdr``'s, sampled as its first beat leaves).
        kept = Mux(cur_at_end, out_beat.keep & cur_keep, out_beat.keep) if chk is not None else out_beat.keep
        o_data, o_keep, o_first = out_beat.data, kept, st_start
        o_index = Mux(st_start, 0, out_idx)
        o_hdr = Mux(st_start, head.as_value(), cur_hdr.as_value())
        if self._placeholders:
            ph_hdr = Mux(inj_idx == 0, self.lost_hdr.as_value(), lost_hdr.as_value())
            hdr_beats = Cat(ph_hdr, Const(0, hb * w - hwidth))
            m.d.comb += [
                inj_last.eq(inj_idx == hb - 1),
                # lost_ok/lost_wait decide the start only: the parent's sequence number moves
                # on as the first beat leaves, and a started placeholder always finishes.
                inj_valid.eq((inj_idx != 0) | (self.lost_ok & ~self.lost_wait)),
            ]
            o_data = Mux(st_inject, hdr_beats.word_select(inj_idx, w), o_data)
            inj_keep = Mux(inj_idx == hb - 1, (1 << (HEADER_BYTES - (hb - 1) * nb)) - 1, full_keep)
            o_keep = Mux(st_inject, inj_keep, o_keep)
            o_first = o_first | (st_inject & (inj_idx == 0))
            o_index = Mux(st_inject, inj_idx, o_index)
            o_hdr = Mux(st_inject, ph_hdr, o_hdr)
        m.d.comb += [o.data.eq(o_data), o.keep.eq(o_keep), o.first.eq(o_first), o.index.eq(o_index), o.hdr.eq(o_hdr)]
        head_read = Signal()
        m.d.comb += [
            head_read.eq(in_start & head_in & ((self.accept & self.o.ready) | self.drop)),
            hdrs.r_en.eq(head_read), self.head_read.eq(head_read),
            beats.r_en.eq(head_read | (beats.r_rdy & ((in_pass & self.o.ready) | in_flush))),
        ]
        return m


class Fork(wiring.Component):
    """Copies one stream to two outputs; each output can be switched off with ``en_a``/``en_b``.

    A beat leaves the input once every enabled output has taken it; the outputs may take it in
    different cycles (per-output done flags), so ``valid`` never depends on ``ready``.
    """

    def __init__(self, shape):
        super().__init__({
            "i": In(stream.Signature(shape)),
            "a": Out(stream.Signature(shape)),
            "b": Out(stream.Signature(shape)),
            "en_a": In(1),
            "en_b": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        done_a = Signal()
        done_b = Signal()
        m.d.comb += [
            self.a.payload.eq(self.i.payload),
            self.b.payload.eq(self.i.payload),
            self.a.valid.eq(self.i.valid & self.en_a & ~done_a),
            self.b.valid.eq(self.i.valid & self.en_b & ~done_b),
        ]
        ok_a = ~self.en_a | done_a | self.a.ready
        ok_b = ~self.en_b | done_b | self.b.ready
        m.d.comb += self.i.ready.eq(ok_a & ok_b)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [done_a.eq(0), done_b.eq(0)]
        with m.Else():
            with m.If(self.a.valid & self.a.ready):
                m.d.sync += done_a.eq(1)
            with m.If(self.b.valid & self.b.ready):
                m.d.sync += done_b.eq(1)
        return m


class FrameArbiter(wiring.Component):
    """Merges frame streams into one, a whole frame at a time; lower input index wins ties.

    Parameters
    ----------
    shape : ShapeLike
        Beat shape; must have a ``last`` field.
    n : int
        Number of inputs (``i0`` … ``i{n-1}``).
    registered : bool
        Pick the next frame's input from the ``valid`` flags of the cycle before (a register),
        not of this cycle (timing: no path from an input's ``valid`` through the choice to another
        input's ``ready``; the schedule engine's host output). A frame then starts a cycle after
        its input became valid on an idle arbiter, and a bubble follows a frame whose input has
        no next frame; back-to-back frames of waiting inputs still leave without a gap.
    """

    def __init__(self, shape, n: int, registered: bool = False):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            reject(self, ValueError(f"an arbiter needs at least one input, not {n!r}"))
        self._n = n
        self._registered = bool(registered)
        members = {f"i{k}": In(stream.Signature(shape)) for k in range(n)}
        members["o"] = Out(stream.Signature(shape))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        n = self._n
        ins = [getattr(self, f"i{k}") for k in range(n)]
        # One-hot (timing: each input's ``ready`` is a few gates on its own bits, not a compare of a
        # binary select built from a priority encoder): ``pick`` the lowest valid input, ``owner``
        # the input whose frame is under way while ``locked``.
        owner = Signal(n, name="owner")
        locked = Signal()
        pick = Signal(n, name="pick")
        for k in range(n):
            earlier = Cat(*(ins[j].valid for j in range(k))).any() if k else Const(0, 1)
            m.d.comb += pick[k].eq(ins[k].valid & ~earlier)
        if self._registered:
            pick_q = Signal(n, name="pick_q")
            m.d.sync += pick_q.eq(pick)
            pick = pick_q
        sel = Signal(n, name="sel")
        m.d.comb += sel.eq(Mux(locked, owner, pick))
        payload = Const(0, len(self.o.payload.as_value()))
        valid = Const(0, 1)
        for k, i in enumerate(ins):
            payload = payload | Mux(sel[k], i.payload.as_value(), 0)
            valid = valid | (sel[k] & i.valid)
            m.d.comb += i.ready.eq(self.o.ready & sel[k])
        m.d.comb += [self.o.valid.eq(valid), self.o.payload.eq(payload)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += [owner.eq(sel), locked.eq(~self.o.payload.last)]
        return m
