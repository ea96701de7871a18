"""The byte realigner: strips or inserts a fixed number of bytes at the start of every frame.

Every "header off, header on" job of the design is one :class:`Realigner`: the 14-byte Ethernet
II header at 64 bit (:class:`~wirereduce.hdl.eth.port.EthFramer`,
:class:`~wirereduce.hdl.eth.port.EthDeframer`) and at 512 bit
(:class:`~wirereduce.hdl.xilinx.cmac.EthPrepend`, and a bare strip in
:class:`~wirereduce.hdl.xilinx.cmac.CmacRxGlue`), and the 16-byte wirereduce header around the
codec (:class:`~wirereduce.hdl.codec.port.StripHeader`, :class:`~wirereduce.hdl.codec.port.InsertHeader`).
Those keep only their own concern (the header's contents, the padding, the EtherType check, the
``enable`` of a frame start); the byte shifting is here, once.

With ``B = width // 8`` bytes a beat and ``n = q·B + r`` bytes to strip or insert, output byte
``t`` of a frame is input byte ``t + n`` (strip) or, for ``t ≥ n``, input byte ``t − n``
(insert; bytes ``0 … n−1`` are ``head``). Whole beats (``q``) are skipped or sent from ``head``;
the ``r`` remaining bytes are a shift: each output beat is the top bytes of the previous input
beat followed by the bottom bytes of the current one, so one register of a beat's top bytes is
all the state a frame needs.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Shape, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.params import rejecting
from wirereduce.hdl.stream.frame import FrameStream, beat_layout, check_width

__all__ = ["realign_layout", "Realigner"]


def realign_layout(width: int, side=None) -> data.StructLayout:
    """The beats of a :class:`Realigner`: :func:`beat_layout` (``data``, ``keep``, ``last``, ``bad``),
    plus a ``side`` field of shape ``side`` when it is not ``None``."""
    if side is None:
        return beat_layout(width)
    return data.StructLayout({**dict(beat_layout(width).members), "side": side})


class Realigner(wiring.Component):
    """Strips the first ``strip`` bytes of every frame, or puts ``insert`` bytes from ``head`` in
    front of it, on a stream of any width, one beat a cycle.

    Streams
    -------
    Input frames follow the rules of :mod:`wirereduce.hdl.stream.frame`: ``keep`` all ones except
    on the last beat, where the valid bytes are contiguous from byte 0 and may be none (an empty
    last beat). Output frames follow them too; bytes of ``data`` outside ``keep`` are unspecified.
    Every input frame gives exactly one output frame:

    - strip: a frame of ``strip`` bytes or fewer gives one empty beat (``keep`` = 0, ``last``);
    - insert: an empty frame (one beat, ``keep`` = 0) gives ``head`` alone.

    An empty last beat of an input frame leaves as an empty last beat when ``n`` is a multiple of
    the beat (the beats pass unshifted); otherwise the output's last beat holds the frame's last
    bytes. ``bad`` of the input's last beat goes out on the output's last beat; ``bad`` on other
    input beats is ignored and on other output beats is 0.

    Timing
    ------
    With ``n = q·B + r`` (``B = width // 8``):

    - strip: the first ``q`` beats, then (``r > 0``) one more, are taken without output (unless
      the frame ends there); every later beat gives one output beat in the same cycle (``o``
      follows ``i`` combinationally). A frame whose last beat holds more than ``r`` bytes ends
      with one extra output beat; during it the next frame's first beat is taken too, unless that
      beat is the whole next frame. So frames arriving back to back are taken one beat a cycle.
    - insert: ``q`` beats of ``head`` go out while the frame's first beat waits at ``i``
      (``o.valid`` is ``i.valid``), then one output beat for every input beat, in the same cycle.
      A frame whose last beat holds more than ``B − r`` bytes ends with one extra output beat,
      during which the input waits. The output has no bubble while the input has none.

    ``head`` is read while the frame's first beat waits at ``i``, up to the cycle it is taken:
    drive it from that beat's payload (``side``), or a constant.

    Side channel
    ------------
    With ``side`` not ``None`` the beats have a ``side`` field (:func:`realign_layout`) that
    travels with them: each output beat carries the ``side`` of the input beat taken in its cycle,
    or, for a frame's extra last beat, of the frame's last beat (for head beats: of the waiting
    first beat). A field that is the same on all beats of a frame (a header) arrives unchanged;
    a flag raised from some beat on reaches every output beat made from that beat on.

    Parameters
    ----------
    width : int
        Datapath width in bits (see :func:`~wirereduce.hdl.stream.frame.check_width`).
    strip, insert : int
        Bytes to remove from, or to put in front of, every frame; exactly one of them, ≥ 1.
    side : ShapeLike or None
        Shape of the side channel, or ``None`` for none.

    Attributes
    ----------
    i : In(FrameStream(width)), or In(stream.Signature(realign_layout(width, side)))
    o : Out(FrameStream(width)), or Out(stream.Signature(realign_layout(width, side)))
    head : In(8 * insert) — insert only
        The bytes to insert, byte ``k`` in ``head[8k : 8k+8]``.

    Raises
    ------
    TypeError, ValueError
        On a bad ``width``, or unless exactly one of ``strip`` and ``insert`` is an int ≥ 1.
    """

    def __init__(self, width: int, *, strip: int = 0, insert: int = 0, side=None):
        with rejecting(self):
            check_width(width)
            for name, v in (("strip", strip), ("insert", insert)):
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise TypeError(f"{name} must be an int number of bytes, not {v!r}")
            if (strip > 0) == (insert > 0):
                raise ValueError(f"give exactly one of strip and insert as a number of bytes ≥ 1, not "
                                 f"strip={strip!r}, insert={insert!r}")
            if side is not None:
                Shape.cast(side)
        self.width = width
        self.strip = strip
        self.insert = insert
        self.side = side
        beat = FrameStream(width) if side is None else stream.Signature(realign_layout(width, side))
        members = {"i": In(beat), "o": Out(beat)}
        if insert:
            members["head"] = In(8 * insert)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        nb = self.width // 8
        n = self.strip or self.insert
        q, r = divmod(n, nb)
        i, o = self.i, self.o
        cur = i.payload
        side = self.side is not None

        def out(data, keep, last, bad, side_value=None):
            m.d.comb += [o.payload.data.eq(data), o.payload.keep.eq(keep), o.payload.last.eq(last),
                         o.payload.bad.eq(bad)]
            if side:
                m.d.comb += o.payload.side.eq(cur.side if side_value is None else side_value)

        # Shift by ``s`` bytes: an output beat is bytes s … B-1 of the previous input beat (their
        # B - s bytes held in ``prev``), then bytes 0 … s-1 of the current one.
        s = r if self.strip else (nb - r) % nb
        cnt = Signal(range(q + 1))                  # whole beats skipped / head beats sent
        have = Signal()                             # prev holds a beat of the current frame
        flush = Signal()                            # prev is the frame's extra last beat
        prev_data = Signal(8 * (nb - s))
        prev_keep = Signal(nb - s)
        prev_bad = Signal()
        prev_side = Signal(self.side) if side else None
        i_take = i.valid & i.ready
        o_take = o.valid & o.ready

        def hold():
            m.d.sync += [prev_data.eq(cur.data[8 * s:]), prev_keep.eq(cur.keep[s:]), prev_bad.eq(cur.bad)]
            if side:
                m.d.sync += prev_side.eq(cur.side)

        def pad(value, nbytes, unit=8):
            """``value`` (the top bytes of a beat) moved to the bottom of a whole beat."""
            return Cat(value, Const(0, unit * nbytes))

        # The cases, most urgent first (one at least: n ≥ 1); data_beat is the steady state.
        cases = []

        def flush_beat():
            # The frame's extra last beat: the bytes of its last beat that did not fit.
            out(pad(prev_data, s), pad(prev_keep, s, 1), 1, prev_bad, prev_side)
            m.d.comb += o.valid.eq(1)
            with m.If(o_take):
                m.d.sync += flush.eq(0)
            if self.strip:
                # The next frame's first beat gives no output unless it is the whole frame: take it now.
                m.d.comb += i.ready.eq(o.ready & ~cur.last)
                with m.If(i_take):
                    if q:
                        m.d.sync += cnt.eq(1)
                    else:
                        hold()
                        m.d.sync += have.eq(1)

        def skip_beat():
            # Strip: a whole beat to skip; a frame that ends here gives an empty beat.
            out(cur.data, 0, 1, cur.bad)
            m.d.comb += [o.valid.eq(i.valid & cur.last), i.ready.eq(~cur.last | o.ready)]
            with m.If(i_take):
                m.d.sync += cnt.eq(Mux(cur.last, 0, cnt + 1))

        def load_beat():
            # Strip: the first beat with bytes to keep only loads prev, unless the frame ends here.
            out(pad(cur.data[8 * s:], s), pad(cur.keep[s:], s, 1), 1, cur.bad)
            m.d.comb += [o.valid.eq(i.valid & cur.last), i.ready.eq(~cur.last | o.ready)]
            with m.If(i_take):
                if q:
                    with m.If(cur.last):
                        m.d.sync += cnt.eq(0)
                with m.If(~cur.last):
                    hold()
                    m.d.sync += have.eq(1)

        def head_beat():
            # Insert: a whole beat of head, sent while the frame's first beat waits. With r = 0 an
            # empty frame is taken with the last head beat, which then ends the frame. A last beat's
            # bytes are contiguous from byte 0, so it is empty iff its keep[0] is 0 (timing: one bit,
            # not a compare of the whole keep, in front of the output's last and the input's ready).
            beats = [self.head[8 * nb * k:8 * nb * (k + 1)] for k in range(q)]
            fold = Signal()
            if not r:
                m.d.comb += fold.eq((cnt == q - 1) & cur.last & ~cur.keep[0])
            out(beats[0] if q == 1 else Array(beats)[cnt], (1 << nb) - 1, fold, fold & cur.bad)
            m.d.comb += [o.valid.eq(i.valid), i.ready.eq(o.ready & fold)]
            with m.If(o_take):
                m.d.sync += cnt.eq(Mux(fold, 0, cnt + 1))

        def data_beat():
            # One output beat for the input beat taken now.
            if s:
                if self.strip:
                    p_data, p_keep = prev_data, prev_keep
                else:
                    # At a frame's first beat the "previous beat" is the head's last r bytes.
                    p_data = Mux(have, prev_data, self.head[8 * nb * q:])
                    p_keep = Mux(have, prev_keep, (1 << r) - 1)
                last = cur.last & ~cur.keep[s]      # the last beat's bytes beyond s need one more beat
                out(Cat(p_data, cur.data[:8 * s]), Cat(p_keep, cur.keep[:s]), last, cur.bad & last)
            else:
                out(cur.data, cur.keep, cur.last, cur.bad & cur.last)
            m.d.comb += [o.valid.eq(i.valid), i.ready.eq(o.ready)]
            with m.If(i_take):
                with m.If(cur.last):
                    if q:
                        m.d.sync += cnt.eq(0)
                    if s:
                        m.d.sync += [have.eq(0), flush.eq(cur.keep[s])]
                if s:
                    hold()
                    with m.If(~cur.last):
                        m.d.sync += have.eq(1)

        if s:
            cases.append((flush, flush_beat))
        if q:
            cases.append((cnt < q, skip_beat if self.strip else head_beat))
        if s and self.strip:
            cases.append((~have, load_beat))
        for k, (cond, body) in enumerate(cases):
            with (m.If if k == 0 else m.Elif)(cond):
                body()
        with m.Else():
            data_beat()
        return m
