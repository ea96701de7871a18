"""The codec at a node's ports: decompress what arrives, compress what leaves (docs/codec.md).

A node with ``NodeConfig(codec=True)`` puts a :class:`CodecIn` behind each of its inputs
(``host_rx``, ``cw_in``, ``ccw_in``) and a :class:`CodecOut` in front of each of its outputs
(``host_tx``, ``cw_out``, ``ccw_out``). Inside, the node sees only fp32 payloads, so the reduce
pipeline, the buffer and the header checks are the same for compressed and uncompressed
collectives. The header's ``codec`` and ``eb_k`` fields travel with the frame: a frame that
arrives compressed with ``eb_k = k`` leaves compressed with the same ``k`` (on a REDUCE hop
after its local values were added), so every hop decompresses, adds and recompresses, as
INCEPTIONN (Li et al., MICRO 2018) and docs/codec.md ask, and one collective can use another bound than
the next. Frames with ``codec = NONE`` (and CONTROL, STATS, runts, frames of another version)
pass both stages unchanged.

Which frames are transformed:

* :class:`CodecIn`: ``codec = INCEPTIONN_V1`` and opcode REDUCE, BROADCAST or HOST_PUSH;
* :class:`CodecOut`: ``codec = INCEPTIONN_V1`` and opcode REDUCE, BROADCAST or HOST_RESULT.

A compressed payload whose length does not match its tags (truncated, too long, non-zero tag
padding; :class:`~wirereduce.hdl.codec.Decompressor`) is caught by :class:`CodecIn` in one of two
ways. With ``cut_through=True`` (the schedule engine) its values leave as they are decoded and the
frame's last beat is marked ``bad``: the engine may sum it, but everything made of it leaves marked
and no host takes a value of it, as for an uncompressed frame whose length disagrees with its
header (docs/protocol.md "Length check", "Bad input loses nothing"). Without it (the default),
the decoded values wait in a commit buffer until the payload's last byte has been checked and a
malformed frame is dropped whole. Either way ``dropped`` pulses once per malformed frame (the
engine counts it in ``drop_length``).

A forwarding :class:`CodecIn` (``forward=True``, the schedule engine's network inputs) does not
decode a compressed BROADCAST: it passes it on as it arrives, ``codec`` set to
:data:`~wirereduce.protocol.CODEC_FORWARDED`, its length checked beside it by a
:class:`~wirereduce.hdl.codec.lencheck.CompressedLengthCheck`, and :class:`CodecOut` sends such a
frame on unchanged (``codec`` INCEPTIONN_V1 again) instead of compressing it: a broadcast hop
then costs a few cycles instead of a compressed frame time (docs/codec.md "Forwarded broadcasts").

Latency: a transformed frame is stored whole once in the compressor (its tags come first), and,
without ``cut_through``, once more in the decompressor's commit buffer: a compressing hop is then
store-and-forward twice, about two frame times of the *uncompressed* payload at the node's width.
Uncompressed frames pass each stage in about 5 cycles at 64 bit (the
:class:`~wirereduce.hdl.stream.frame.FrameGate`'s 2, the registered route decision's 1, the bypass
FIFO's 2): on a schedule engine a 2-term reduce hop takes 26 cycles
with the codec stages against 16 without (:func:`~wirereduce.sim.bench.latency.engine_hop_latency`
with ``codec=True``).
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.codec.compressor import Compressor, Decompressor
from wirereduce.hdl.codec.lencheck import CompressedLengthCheck
from wirereduce.hdl.params import rejecting
from wirereduce.hdl.stream.frame import FrameGate, FrameStream, beat_layout, gated_layout
from wirereduce.hdl.stream.realign import Realigner

from wirereduce.codec import max_elements_compressed
from wirereduce.config import check_width
from wirereduce.protocol import CODEC_FORWARDED, HEADER_BYTES, VERSION, Codec, Flag, Opcode, header_layout

__all__ = ["hdr_beat_layout", "StripHeader", "InsertHeader", "CodecIn", "CodecOut", "codec_port_stages"]


def hdr_beat_layout(width: int) -> data.StructLayout:
    """A payload beat with its frame's header alongside: ``data``, ``keep``, ``last``, ``bad``, ``hdr``.

    ``hdr`` is the 16-byte wirereduce header (:func:`wirereduce.protocol.header_layout`), the
    same on every beat of a frame; ``bad`` is the frame's mark on its last beat, as in
    :func:`~wirereduce.hdl.stream.frame.beat_layout` (:class:`StripHeader` and
    :class:`InsertHeader` carry it through).
    """
    check_width(width)
    return data.StructLayout({"data": width, "keep": width // 8, "last": 1, "bad": 1, "hdr": header_layout()})


class StripHeader(wiring.Component):
    """Removes the 16-byte wirereduce header from each frame; the payload starts at byte 0.

    A :class:`~wirereduce.hdl.stream.realign.Realigner` (strip 16 bytes) with the frame's header
    on its side channel: a frame that ends with its header (no payload) gives one empty beat
    (``keep`` = 0, ``last`` = 1), so every input frame gives exactly one output frame. At 64 and
    128 bit the header is whole beats, which are skipped; at ≥ 256 bit every output beat is bytes
    16 … of one beat and bytes 0 … 15 of the next, with one extra beat when the last input beat
    holds more than 16 bytes.

    Parameters
    ----------
    width : int
        Datapath width in bits.
    index_bits : int
        Width of the input's ``index`` field (that of the :class:`FrameGate` in front).

    Attributes
    ----------
    i : In(stream.Signature(gated_layout(width, index_bits)))
        Whole frames, header included, as a :class:`~wirereduce.hdl.stream.frame.FrameGate` passes them.
    o : Out(stream.Signature(hdr_beat_layout(width)))
        Their payloads, each beat with the frame's header.
    """

    def __init__(self, width: int, index_bits: int):
        with rejecting(self):
            self._width = check_width(width)
        super().__init__({
            "i": In(stream.Signature(gated_layout(width, index_bits))),
            "o": Out(stream.Signature(hdr_beat_layout(width))),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.realign = ra = Realigner(self._width, strip=HEADER_BYTES, side=header_layout())
        i, o = self.i.payload, ra.o.payload
        m.d.comb += [
            ra.i.payload.data.eq(i.data), ra.i.payload.keep.eq(i.keep), ra.i.payload.last.eq(i.last),
            ra.i.payload.bad.eq(i.bad),
            ra.i.payload.side.eq(i.hdr), ra.i.valid.eq(self.i.valid), self.i.ready.eq(ra.i.ready),
            self.o.payload.data.eq(o.data), self.o.payload.keep.eq(o.keep), self.o.payload.last.eq(o.last),
            self.o.payload.bad.eq(o.bad),
            self.o.payload.hdr.eq(o.side), self.o.valid.eq(ra.o.valid), ra.o.ready.eq(self.o.ready),
        ]
        return m


class InsertHeader(wiring.Component):
    """Puts each frame's 16-byte header (its ``hdr``) in front of its payload.

    The inverse of :class:`StripHeader`, a :class:`~wirereduce.hdl.stream.realign.Realigner`
    (insert 16 bytes) whose ``head`` is the ``hdr`` of the frame's first beat: an empty payload
    (one beat, ``keep`` = 0) gives a header-only frame.

    Attributes
    ----------
    i : In(stream.Signature(hdr_beat_layout(width)))
        Payloads starting at byte 0, each beat with its frame's header.
    o : Out(FrameStream(width))
        Whole frames.
    """

    def __init__(self, width: int):
        with rejecting(self):
            self._width = check_width(width)
        super().__init__({
            "i": In(stream.Signature(hdr_beat_layout(width))),
            "o": Out(FrameStream(width)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.realign = ra = Realigner(self._width, insert=HEADER_BYTES)
        i = self.i.payload
        m.d.comb += [
            ra.head.eq(i.hdr),
            ra.i.payload.data.eq(i.data), ra.i.payload.keep.eq(i.keep), ra.i.payload.last.eq(i.last),
            ra.i.payload.bad.eq(i.bad), ra.i.valid.eq(self.i.valid), self.i.ready.eq(ra.i.ready),
        ]
        wiring.connect(m, ra.o, wiring.flipped(self.o))
        return m


#: Frames a :class:`CodecIn`'s commit buffer holds. One is enough: raising it to 2, together with
#: :data:`COMPRESSOR_BANKS` = 4, was measured on the compressed bench (4 MiB, k = 8, 10, 12; 512-bit
#: core behind 10G links) and changed the time by under 0.2 %, so the codec stages' buffering is
#: not what holds a compressed ring below its link bound (docs/codec.md "Performance").
COMMIT_FRAMES = 1
#: Banks of a :class:`CodecOut`'s :class:`~wirereduce.hdl.codec.compressor.Compressor`: 2
#: (ping-pong); 4 gave no speed-up (see :data:`COMMIT_FRAMES`).
COMPRESSOR_BANKS = 2
#: Depth of the stages' per-frame FIFOs (routes, headers, ``bad`` marks, verdicts): more frames
#: than the commit buffer and the compressor's banks hold with the ones entering and leaving;
#: raise it with them (8 for 2 commit frames and 4 banks).
FRAME_FIFO_DEPTH = 4

_DATA_OPS_IN = (Opcode.REDUCE, Opcode.BROADCAST, Opcode.HOST_PUSH)
_DATA_OPS_OUT = (Opcode.REDUCE, Opcode.BROADCAST, Opcode.HOST_RESULT)


def _is_compressed(head, short, opcodes, codecs=(Codec.INCEPTIONN_V1,)):
    """The frame is transformed: complete header, version 1, ``codec`` one of ``codecs``
    (INCEPTIONN_V1), one of ``opcodes``, and not a ``flags & LOST`` placeholder (header only: it
    passes as it is)."""
    op_ok = 0
    for op in opcodes:
        op_ok = op_ok | (head.opcode == op)
    codec_ok = 0
    for c in codecs:
        codec_ok = codec_ok | (head.codec == c)
    return ~short & (head.version == VERSION) & codec_ok & op_ok & ((head.flags & Flag.LOST) == 0)


def _is_forwarded(head, short):
    """A compressed BROADCAST that a forwarding :class:`CodecIn` passes on unchanged: as
    :func:`_is_compressed`, with :data:`~wirereduce.protocol.CODEC_FORWARDED` taken as INCEPTIONN_V1."""
    return _is_compressed(head, short, (Opcode.BROADCAST,), (Codec.INCEPTIONN_V1, CODEC_FORWARDED))


#: Bit offset of the header's ``codec`` field in a frame's first beat (byte 3).
_CODEC_BIT = 24
#: Beats a forwarding :class:`CodecIn`'s straight path for compressed BROADCASTs holds.
FORWARD_FIFO_DEPTH = 16


def _with_codec(data, value):
    """``data`` (a frame's first beat) with the header's ``codec`` byte replaced by ``value``."""
    return Cat(data[:_CODEC_BIT], Const(value, 8), data[_CODEC_BIT + 8:])


class _CodecStage(wiring.Component):
    """Shared frame routing of :class:`CodecIn` and :class:`CodecOut`.

    A :class:`FrameGate` reads each header; compressed frames go through
    ``StripHeader → transform → InsertHeader``, the others straight on; a one-bit-per-frame
    FIFO of the routes puts the two paths back in the input's frame order.
    """

    _opcodes: tuple = ()
    #: The transform drives ``bad`` on its output's last beat itself (the cut-through CodecIn: the
    #: decompressor's verdict is known only then); otherwise the merge takes each frame's arrival
    #: mark from a FIFO round the transform (``tbad``).
    _bad_inband: bool = False
    #: Compressed BROADCASTs take a third path, straight on with ``codec`` set to
    #: :data:`~wirereduce.protocol.CODEC_FORWARDED`, their length checked beside it (``CodecIn``).
    _forward: bool = False
    #: A frame on the straight path whose ``codec`` is CODEC_FORWARDED leaves with INCEPTIONN_V1
    #: (``CodecOut``: a forwarded BROADCAST leaves as it arrived).
    _restore_forwarded: bool = False

    def __init__(self, width: int, max_elements: int, max_beats: int):
        with rejecting(self):
            self._width = check_width(width)
            if not isinstance(max_elements, int) or not 1 <= max_elements <= 65535:
                raise ValueError(f"max_elements must be 1 … 65535, not {max_elements!r}")
            if not isinstance(max_beats, int) or max_beats < 1:
                raise ValueError(f"max_beats must be a positive int, not {max_beats!r}")
        self._max_elements = max_elements
        self._max_beats = max_beats
        beat = FrameStream(width)
        super().__init__({"i": In(beat), "o": Out(beat), "dropped": Out(1)})

    def _arrival_marks(self, m, name):
        """A FIFO (submodule ``name``) of each transformed frame's arrival mark (``bad`` on its last
        beat), one bit per frame in order, written a cycle after the frame's last beat enters the
        transform (``_t_end`` / ``_t_bad``); the caller reads it."""
        q = m.submodules[name] = fifo.SyncFIFOBuffered(width=1, depth=FRAME_FIFO_DEPTH)
        m.d.comb += [q.w_en.eq(self._t_end), q.w_data.eq(self._t_bad)]
        return q

    def _transform(self, m, src, dst):
        """Connect the payload transform from ``src`` (hdr beats) to ``dst`` (hdr beats).

        Returns ``None``, or a FIFO whose read side holds one bit per transformed frame in
        order: 1 if the frame comes out on ``dst``, 0 if the transform discarded it.
        """
        raise NotImplementedError

    @staticmethod
    def _feed(m, src, codec):
        """Drive ``codec`` (a Compressor or Decompressor) from ``src`` (hdr beats): its payload
        beats, ``k`` from the header; each frame's header is queued as its first beat goes in.
        Returns the header FIFO, whose read side the transform pops as the frame leaves."""
        m.submodules.hdrq = hdrq = fifo.SyncFIFOBuffered(width=len(src.payload.hdr.as_value()), depth=FRAME_FIFO_DEPTH)
        in_frame = Signal()
        first = ~in_frame
        m.d.comb += [
            codec.i.payload.data.eq(src.payload.data),
            codec.i.payload.keep.eq(src.payload.keep),
            codec.i.payload.last.eq(src.payload.last),
            codec.k.eq(src.payload.hdr.eb_k),
            codec.i.valid.eq(src.valid & (~first | hdrq.w_rdy)),
            src.ready.eq(codec.i.ready & (~first | hdrq.w_rdy)),
            hdrq.w_data.eq(src.payload.hdr),
            hdrq.w_en.eq(src.valid & src.ready & first),
        ]
        with m.If(src.valid & src.ready):
            m.d.sync += in_frame.eq(~src.payload.last)
        return hdrq

    def elaborate(self, platform):
        m = Module()
        w = self._width
        # No placeholders: this gate never drops a frame (timing: no INJECT state in front of its output).
        m.submodules.gate = gate = FrameGate(w, self._max_beats, placeholders=False)
        wiring.connect(m, wiring.flipped(self.i), gate.i)
        index_bits = len(gate.o.payload.index)

        # one entry per frame: bit 0 the transform, bit 1 (forwarding CodecIn) the forward path
        m.submodules.routes = routes = fifo.SyncFIFOBuffered(width=2 if self._forward else 1, depth=FRAME_FIFO_DEPTH)
        # The route of the frame at the gate's head is decided into a register from the header
        # FIFO's head in every state (``head_raw``), and the frame is offered once that register
        # holds its header's (``seen``: the header was at the head the cycle before and was not read
        # at that edge), so neither the offer nor the route hangs off the header FIFO's read data
        # (timing: those were the codec engine's 12-level paths, header FIFO → decision → accept →
        # the gate's beat FIFO). A frame's header is decided while the frame before it passes, so
        # frames of two beats or more still pass back to back; a frame right behind a one-beat frame
        # (at 512 bit) waits one cycle.
        g = gate.o
        decision = Signal()
        fdecision = Signal()
        seen = Signal()
        m.d.sync += [
            decision.eq(_is_compressed(gate.head_raw, gate.head_raw_short, self._opcodes)),
            seen.eq(gate.head_raw_valid & ~gate.head_read),
        ]
        sdecision = Signal()   # either (a register of its own, timing: no OR behind the two)
        if self._forward:
            fwd_now = _is_forwarded(gate.head_raw, gate.head_raw_short)
            m.d.sync += [fdecision.eq(fwd_now),
                         sdecision.eq(_is_compressed(gate.head_raw, gate.head_raw_short, self._opcodes) | fwd_now)]
        m.d.comb += gate.accept.eq(seen & routes.w_rdy)
        route = Signal()
        route_reg = Signal()
        froute = Signal()
        froute_reg = Signal()
        into = Signal()        # into the StripHeader: decoded or forwarded
        into_reg = Signal()
        # The gate only passes frames here (no drop, no length check: START and PASS alone), so its
        # output's first beat is the one after a last beat: a register of our own, not a decode of
        # the gate's state, in front of the route and the gate's ready (timing, issue 16).
        g_mid = Signal()
        g_first = ~g_mid
        with m.If(g.valid & g.ready):
            m.d.sync += g_mid.eq(~g.payload.last)
        m.d.comb += route.eq(Mux(g_first, decision, route_reg))
        if self._forward:
            m.d.comb += [froute.eq(Mux(g_first, fdecision, froute_reg)), into.eq(Mux(g_first, sdecision, into_reg))]
        with m.If(g.valid & g.ready & g_first):
            m.d.sync += [route_reg.eq(decision), froute_reg.eq(fdecision), into_reg.eq(sdecision)]
            m.d.comb += [routes.w_en.eq(1), routes.w_data.eq(Cat(decision, fdecision))]

        # Transform path.
        m.submodules.strip = strip = StripHeader(w, index_bits)
        m.submodules.insert = insert = InsertHeader(w)
        # Straight path: a small FIFO, so that its beats can enter before their route reaches
        # the head of the route FIFO (the merge reads the route only once it is queued).
        blay = beat_layout(w)
        # ``CodecOut``: a whole frame (forwarded BROADCASTs take this path, at the link's pace, and the
        # compressor's banks no longer hold them: with 4 beats a forwarded frame behind a compressed one
        # held the engine's port until that one had left, so its unit's next REDUCE waited too).
        bypass_depth = self._max_beats + 4 if self._restore_forwarded else 4
        m.submodules.bypass = bq = fifo.SyncFIFOBuffered(width=blay.size, depth=bypass_depth)
        g_beat = Signal(blay)
        g_data = g.payload.data
        if self._restore_forwarded:
            # a forwarded BROADCAST leaves with the codec it arrived with
            fwd_hdr = g.payload.first & (g.payload.data[_CODEC_BIT:_CODEC_BIT + 8] == CODEC_FORWARDED)
            g_data = Mux(fwd_hdr, _with_codec(g.payload.data, Codec.INCEPTIONN_V1), g.payload.data)
        m.d.comb += [
            g_beat.data.eq(g_data), g_beat.keep.eq(g.payload.keep), g_beat.last.eq(g.payload.last),
            g_beat.bad.eq(g.payload.bad),
            strip.i.payload.eq(g.payload),
        ]
        if self._forward:
            # Forward path: the frame's beats go straight on (``codec`` marked CODEC_FORWARDED) through
            # ``fq`` and, at the same time, through the StripHeader to the length check
            # (``_transform``), whose verdict marks the last beat.
            # The beats reach ``fq`` through a delay line of ``lag`` registers (no stall: ``fq_room`` counts
            # them), as long as the StripHeader and the check take to give the frame's verdict: its last beat
            # is then in ``fq`` no earlier than its verdict, so the merge never waits for one. Waiting there
            # instead put a bubble of that length behind every forwarded frame, which a link at full rate
            # never made up (the 64-bit biring 6-17 % slower).
            lag = self._forward_lag
            depth = FORWARD_FIFO_DEPTH + lag
            m.submodules.fwd = fq = fifo.SyncFIFOBuffered(width=blay.size, depth=depth)
            # Room for a beat, registered (timing: the gate's ready, which the route FIFO's write and the
            # gate's own FIFO read hang off, through no FIFO level; 10 levels with ``fq.w_rdy`` there): at
            # least three entries free at the edge before besides the delay line's. Every frame into the
            # StripHeader waits for it, decoded ones too (one AND less; ``fq`` only ever waits for the merge,
            # which takes frames in order).
            fq_room = Signal(init=1)
            m.d.sync += fq_room.eq(fq.level <= depth - 3 - lag)
            f_beat = Signal(blay)
            line_v = [Signal(name=f"fwd_line{j}_valid") for j in range(lag)]
            line_d = [Signal(blay, name=f"fwd_line{j}") for j in range(lag)]
            m.d.sync += [line_v[0].eq(g.valid & froute & strip.i.ready & fq_room), line_d[0].eq(f_beat)]
            for j in range(1, lag):
                m.d.sync += [line_v[j].eq(line_v[j - 1]), line_d[j].eq(line_d[j - 1])]
            m.d.comb += [
                f_beat.data.eq(Mux(g.payload.first, _with_codec(g.payload.data, CODEC_FORWARDED), g.payload.data)),
                f_beat.keep.eq(g.payload.keep), f_beat.last.eq(g.payload.last), f_beat.bad.eq(g.payload.bad),
                fq.w_data.eq(line_d[-1]),
                fq.w_en.eq(line_v[-1]),
                strip.i.valid.eq(g.valid & into & fq_room),
                bq.w_data.eq(g_beat),
                bq.w_en.eq(g.valid & ~into),
                g.ready.eq(Mux(into, strip.i.ready & fq_room, bq.w_rdy)),
            ]
        else:
            m.d.comb += [
                strip.i.valid.eq(g.valid & route),
                bq.w_data.eq(g_beat),
                bq.w_en.eq(g.valid & ~route),
                g.ready.eq(Mux(route, strip.i.ready, bq.w_rdy)),
            ]
        bypass = FrameStream(w).create()
        m.d.comb += [
            bypass.payload.eq(bq.r_data),
            bypass.valid.eq(bq.r_rdy),
            bq.r_en.eq(bypass.ready),
        ]
        # ``bad`` of each transformed frame (on its last beat, docs/protocol.md): the transform
        # path has no ``bad``, so it goes round it, one entry per frame, to the frame's last
        # output beat (``_t_end`` / ``_t_bad`` also for a transform that needs it). The entry is
        # written a cycle after the frame's last beat enters the transform (registered: timing,
        # issue 16, the gate's state and the transform's ready stay out of the FIFO's level update);
        # it is read only once the frame has come out of the transform (a compressor or
        # decompressor: several cycles at least), and ``CodecIn`` waits for it anyway.
        t_end = Signal()
        t_bad = Signal()
        m.d.sync += [t_end.eq(g.valid & g.ready & route & g.payload.last), t_bad.eq(g.payload.bad)]
        self._t_end = t_end
        self._t_bad = t_bad
        out = stream.Signature(hdr_beat_layout(w)).create()
        verdicts = self._transform(m, strip.o, out)
        wiring.connect(m, out, insert.i)
        if not self._bad_inband:
            tbad = self._arrival_marks(m, "tbad")
            t_bad = tbad.r_data[0] & insert.o.payload.last
        else:
            t_bad = insert.o.payload.bad

        # Merge in frame order. ``verdicts`` (when the transform can discard frames) holds one
        # entry per transformed frame, in order: 1 = it comes out of ``insert``, 0 = discarded,
        # so its route entry is popped without output.
        sel = routes.r_data[0]
        o = self.o
        if verdicts is None:
            t_ok, t_skip = routes.r_rdy & sel, 0
        else:
            t_ok = routes.r_rdy & sel & verdicts.r_rdy & verdicts.r_data[0]
            t_skip = routes.r_rdy & sel & verdicts.r_rdy & ~verdicts.r_data[0]
        t_done = Signal()
        t_valid = Mux(sel, t_ok & insert.o.valid, routes.r_rdy & bypass.valid)
        t_payload = Mux(sel, insert.o.payload.as_value(), bypass.payload.as_value())
        t_bad_o = Mux(sel, t_bad, bypass.payload.bad)
        if self._forward:
            # a forwarded frame's last beat waits for its length verdict (``self._fverd``, in order)
            fsel = routes.r_data[1]
            fv = self._fverd
            fb = data.View(blay, fq.r_data)
            f_ok = routes.r_rdy & fsel & fq.r_rdy & (~fb.last | fv.r_rdy)
            m.d.comb += [
                o.valid.eq(Mux(fsel, f_ok, t_valid)),
                o.payload.eq(Mux(fsel, fq.r_data, t_payload)),
                o.payload.bad.eq(Mux(fsel, fb.bad | (fb.last & fv.r_data[0]), t_bad_o)),
                fq.r_en.eq(f_ok & o.ready),
                fv.r_en.eq(f_ok & o.ready & fb.last),
                insert.o.ready.eq(t_ok & o.ready),
                bypass.ready.eq(routes.r_rdy & ~sel & ~fsel & o.ready),
            ]
        else:
            m.d.comb += [
                o.valid.eq(t_valid),
                o.payload.eq(t_payload),
                o.payload.bad.eq(t_bad_o),
                insert.o.ready.eq(t_ok & o.ready),
                bypass.ready.eq(routes.r_rdy & ~sel & o.ready),
            ]
        m.d.comb += [
            t_done.eq(t_skip | (t_ok & insert.o.valid & o.ready & insert.o.payload.last)),
            routes.r_en.eq(t_skip | (o.valid & o.ready & o.payload.last)),
        ]
        if verdicts is not None:
            m.d.comb += verdicts.r_en.eq(t_done)
        if not self._bad_inband:
            m.d.comb += tbad.r_en.eq(t_done)
        return m


class CodecIn(_CodecStage):
    """Decompresses compressed data frames as they enter a node; malformed ones are dropped whole
    (commit buffer) or, cut-through, marked ``bad`` on their last beat.

    Parameters
    ----------
    width : int
        Datapath width in bits.
    max_elements : int
        Most fp32 values in one frame (``NodeConfig.max_elements``).
    max_beats : int
        Beats of the longest frame on the input (``NodeConfig.max_beats``).
    placeholders : bool
        What becomes of a compressed frame marked ``bad`` on its last beat (spoilt on a
        cut-through cable, docs/protocol.md): True (the ring node) makes it a LOST placeholder
        (its header with ``flags | LOST``, no payload, marked bad); False (the schedule engine,
        which sums bad-marked frames and marks every frame they turn into bad, but takes no
        placeholders) passes its decoded values on, still marked bad on the last beat, as an
        uncompressed frame marked bad would arrive; if its payload does not decode it is dropped
        whole and counted in ``dropped`` like any malformed frame.
    cut_through : bool
        False (default): a compressed frame's decoded values wait in a commit buffer (one frame)
        until the decompressor's verdict on its last byte; a malformed frame is dropped whole.
        True (the schedule engine; needs ``placeholders=False``): no commit buffer; the values
        leave as the decompressor emits them (its first output beat once the tag block is in,
        docs/codec.md "Latency"), every frame comes out ``count`` values long, and a malformed
        one (or one marked ``bad`` on arrival) leaves with ``bad`` on its last beat. Saves a
        frame time of the uncompressed payload per compressing hop and the commit buffer's
        memory.
    forward : bool
        False (default): every compressed data frame is decompressed. True (the schedule engine's
        network inputs; needs ``cut_through``): a compressed BROADCAST is passed on as it arrives,
        its header's ``codec`` set to :data:`~wirereduce.protocol.CODEC_FORWARDED` (so the engine's
        gates check its length against the MTU only, and its ``CodecOut`` sends it on unchanged
        instead of compressing it again), while a :class:`CompressedLengthCheck` checks its length
        against its tags beside it; the forwarded beats go through a delay line of the check's
        latency + 3 cycles, so the verdict is known when the last beat leaves, marked ``bad`` if the
        frame is malformed and counted in ``dropped``. A broadcast hop then costs a few cycles
        instead of a compressed frame time: ``quantize`` is idempotent, so the bytes are those a
        decode and re-encode would give (docs/codec.md "Forwarded broadcasts").
    max_compressed : int, optional
        Most values a compressed frame may carry (default ``max_elements``); the schedule engine
        gives :func:`wirereduce.codec.max_elements_compressed` of its MTU (349 at 1500, 2112 at
        9000), what the driver's chunks hold, so that whatever the values, the frame a node
        compresses from such a chunk fits the MTU. A compressed frame with more (and at most
        ``max_elements``) is malformed: marked ``bad`` / dropped and counted in ``dropped``, as
        one whose length does not match its tags (``drop_length`` at the engine).

    Attributes
    ----------
    i : In(FrameStream(width))
        Frames as they arrive, compressed or not.
    o : Out(FrameStream(width))
        The same frames in the same order with every compressed payload replaced by its fp32
        values (header unchanged: ``codec``/``eb_k`` still say how the frame is to leave).
    dropped : Out(1)
        Pulses once per malformed compressed frame (dropped, or with ``cut_through`` marked bad;
        there not for a ``count`` of 0 or above ``max_elements``, which the engine's gates drop
        and count in ``drop_count``).

    Raises
    ------
    ValueError
        On a bad width, ``max_elements`` outside 1 … 65535, ``max_beats`` < 1,
        ``placeholders`` with ``cut_through``, or ``forward`` without ``cut_through``.
    """

    _opcodes = _DATA_OPS_IN

    def __init__(self, width: int, max_elements: int, max_beats: int, placeholders: bool = True,
                 cut_through: bool = False, forward: bool = False, max_compressed: int | None = None):
        with rejecting(self):
            if max_compressed is not None and (not isinstance(max_compressed, int) or isinstance(max_compressed, bool)
                                               or not 1 <= max_compressed <= max_elements):
                raise ValueError(f"max_compressed must be 1 … max_elements ({max_elements}), not {max_compressed!r}")
            if placeholders and cut_through:
                raise ValueError("a cut-through CodecIn has no commit buffer to turn a marked frame into "
                                 "a placeholder: give placeholders=False with cut_through=True")
            if forward and not cut_through:
                raise ValueError("forward=True marks a malformed forwarded frame bad on its last beat, as "
                                 "the cut-through CodecIn does: give cut_through=True with it")
        self._placeholders = bool(placeholders)
        self._cut_through = bool(cut_through)
        self._bad_inband = self._cut_through
        self._forward = bool(forward)
        if self._forward:
            self._opcodes = tuple(op for op in _DATA_OPS_IN if op != Opcode.BROADCAST)
        super().__init__(width, max_elements, max_beats)
        self._max_compressed = max_elements if max_compressed is None else max_compressed
        if self._forward:
            # the delay line of the forward path: the check's latency, the StripHeader's cycle and the
            # verdict FIFO's two (docs/codec.md "Forwarded broadcasts")
            self._forward_lag = CompressedLengthCheck.latency_of(self._width) + 3

    def _transform(self, m, src, dst):
        w = self._width
        # A small FIFO in front of the decompressor (timing, issue 16): its ready, a chain through the
        # decompressor's input stage and the header FIFO, then stops at the FIFO's registered level
        # instead of running on through StripHeader into the gate's ready and the route FIFO (the
        # 10-level paths of the codec engine with lookahead-3 units); a cycle or two of latency.
        m.submodules.dec_in = q = fifo.SyncFIFOBuffered(width=len(src.payload.as_value()), depth=4)
        fed = stream.Signature(hdr_beat_layout(w)).create()
        m.d.comb += [
            q.w_data.eq(src.payload.as_value()), src.ready.eq(q.w_rdy),
            fed.payload.eq(q.r_data), fed.valid.eq(q.r_rdy), q.r_en.eq(fed.ready),
        ]
        if self._forward:
            # Forwarded BROADCASTs (the only BROADCASTs here) go to the length check, not the
            # decompressor; they wait for room in ``dec_in`` like the others (``src.ready`` the same
            # for both), so the check sees them in frame order behind the decoded frames.
            is_fwd = src.payload.hdr.opcode == Opcode.BROADCAST
            m.submodules.lencheck = chk = CompressedLengthCheck(w, self._max_compressed)
            m.submodules.fverd = fverd = fifo.SyncFIFOBuffered(width=1,
                                                               depth=FORWARD_FIFO_DEPTH + self._forward_lag + 1)
            self._fverd = fverd
            m.d.comb += [
                q.w_en.eq(src.valid & ~is_fwd),
                chk.beat.eq(src.payload), chk.strobe.eq(src.valid & q.w_rdy & is_fwd),
                fverd.w_en.eq(chk.done), fverd.w_data.eq(chk.error),
            ]
            # Counted in ``drop_length`` like a frame that does not decode, unless its ``count`` is one the
            # engine's gates drop it for (0 or above ``max_elements``): that of its last beat, delayed to
            # the verdict.
            hdr = src.payload.hdr
            ok_now = chk.strobe & src.payload.last & (hdr.count != 0) & (hdr.count <= self._max_elements)
            ok_line = [Signal(name=f"fwd_count_ok{j}") for j in range(chk.latency)]
            m.d.sync += ok_line[0].eq(ok_now)
            for j in range(1, chk.latency):
                m.d.sync += ok_line[j].eq(ok_line[j - 1])
            self._fwd_dropped = chk.done & chk.error & ok_line[-1]
        else:
            m.d.comb += q.w_en.eq(src.valid)
        src = fed
        m.submodules.dec = dec = Decompressor(w, self._max_compressed)
        m.d.comb += dec.n.eq(src.payload.hdr.count)
        hdrq = self._feed(m, src, dec)
        if self._cut_through:
            return self._cut_through_out(m, dec, hdrq, dst)

        # Commit buffer: the decoded values of a frame wait until its verdict (the
        # decompressor's error flag on the last beat) is known; bad frames are discarded.
        blay = beat_layout(w)
        depth = COMMIT_FRAMES * -(-4 * self._max_elements // (w // 8)) + 4
        m.submodules.beats = beats = fifo.SyncFIFOBuffered(width=blay.size, depth=depth)
        m.submodules.verdicts = verdicts = fifo.SyncFIFOBuffered(width=2 + len(hdrq.r_data), depth=FRAME_FIFO_DEPTH)
        # The frame's ``bad`` (a cut-through port upstream found it spoilt), in frame order.
        ibad = self._arrival_marks(m, "ibad")
        d = dec.o.payload
        last = d.last
        m.d.comb += [
            beats.w_data.eq(d.as_value()),
            beats.w_en.eq(dec.o.valid & dec.o.ready),
            dec.o.ready.eq(beats.w_rdy & (~last | (verdicts.w_rdy & hdrq.r_rdy & ibad.r_rdy))),
            # good: it leaves (with placeholders, a frame marked bad leaves as one); marked: it was
            # marked bad (without placeholders it leaves decoded, its last beat marked by the merge).
            verdicts.w_data.eq(Cat(~dec.error | (ibad.r_data[0] & self._placeholders), ibad.r_data[0],
                                   hdrq.r_data)),
            ibad.r_en.eq(dec.o.valid & dec.o.ready & last),
            verdicts.w_en.eq(dec.o.valid & dec.o.ready & last),
            hdrq.r_en.eq(dec.o.valid & dec.o.ready & last),
        ]
        stored = data.View(blay, beats.r_data)
        good = verdicts.r_data[0]
        marked = verdicts.r_data[1]
        lost = marked if self._placeholders else Const(0, 1)   # leaves as a placeholder
        hdr = Signal(header_layout())
        m.d.comb += [hdr.eq(verdicts.r_data[2:]), hdr.flags.eq(verdicts.r_data[2:].bit_select(56, 8) | Flag.LOST)]
        emit_lost = Signal()   # a lost frame's beats are discarded; its placeholder leaves now
        # One entry per frame for the merge, written with the frame's first beat: 1 = it will
        # come out of the InsertHeader, 0 = it is discarded here.
        m.submodules.skips = skips = fifo.SyncFIFOBuffered(width=1, depth=FRAME_FIFO_DEPTH)
        announced = Signal()  # the frame at the head has its entry in ``skips``
        ann_now = Signal()
        can = Signal()
        m.d.comb += [
            ann_now.eq(~announced & verdicts.r_rdy & beats.r_rdy & skips.w_rdy),
            can.eq(verdicts.r_rdy & beats.r_rdy & (announced | ann_now)),
        ]
        pop = Signal()
        with m.If(emit_lost):
            # The placeholder of a frame marked bad: its header with ``flags | LOST``, no payload
            # (one empty beat), marked bad by the merge (``tbad``). No value of it goes on.
            m.d.comb += [
                dst.payload.keep.eq(0), dst.payload.last.eq(1), dst.payload.hdr.eq(hdr),
                dst.valid.eq(verdicts.r_rdy), verdicts.r_en.eq(verdicts.r_rdy & dst.ready),
            ]
            with m.If(verdicts.r_rdy & dst.ready):
                m.d.sync += [emit_lost.eq(0), announced.eq(0)]
        with m.Else():
            m.d.comb += [
                dst.payload.data.eq(stored.data),
                dst.payload.keep.eq(stored.keep),
                dst.payload.last.eq(stored.last),
                dst.payload.hdr.eq(verdicts.r_data[2:]),
                dst.valid.eq(can & good & ~lost),
                pop.eq(can & Mux(good & ~lost, dst.ready, 1)),
                beats.r_en.eq(pop), verdicts.r_en.eq(pop & stored.last & ~lost),
            ]
            with m.If(pop & stored.last & lost):
                m.d.sync += [emit_lost.eq(1), announced.eq(1)]
            with m.Elif(pop & stored.last):
                m.d.sync += announced.eq(0)
            with m.Elif(ann_now):
                m.d.sync += announced.eq(1)
        m.d.comb += [skips.w_en.eq(ann_now), skips.w_data.eq(good)]
        # Once per frame dropped as malformed, before its route is retired. A frame marked bad
        # leaves as a placeholder (its link counted it), or without placeholders decoded, or, its
        # payload not decoding, is dropped and counted here like any malformed frame (every frame
        # a node drops is counted at that node).
        m.d.comb += self.dropped.eq(ann_now & ~good)
        return skips

    def _cut_through_out(self, m, dec, hdrq, dst):
        """The decoded values leave as the decompressor emits them; the frame's ``bad`` (marked
        on arrival, or the decompressor's ``error``: its length does not match its tags) goes on its
        last beat, in band to the merge. Every transformed frame comes out (no verdicts)."""
        # The arrival mark, one entry per frame, written as the frame's last beat enters (several
        # cycles before the decompressor's last output beat, which waits for it anyway).
        ibad = self._arrival_marks(m, "ibad")
        d = dec.o.payload
        can = hdrq.r_rdy & (~d.last | ibad.r_rdy)
        fire_last = Signal()
        m.d.comb += [
            dst.payload.data.eq(d.data), dst.payload.keep.eq(d.keep), dst.payload.last.eq(d.last),
            dst.payload.bad.eq(d.last & (ibad.r_data[0] | dec.error)),
            dst.payload.hdr.eq(hdrq.r_data),
            dst.valid.eq(dec.o.valid & can),
            dec.o.ready.eq(dst.ready & can),
            fire_last.eq(dec.o.valid & dec.o.ready & d.last),
            hdrq.r_en.eq(fire_last), ibad.r_en.eq(fire_last),
        ]
        # Counted once per malformed frame (``drop_length``), unless its ``count`` is one the engine's
        # gates drop it for anyway (0 or above ``max_elements``: ``drop_count`` there).
        hdr = data.View(header_layout(), hdrq.r_data)
        count_ok = (hdr.count != 0) & (hdr.count <= self._max_elements)
        dropped = Signal()
        m.d.sync += dropped.eq(fire_last & dec.error & count_ok)
        if self._forward:
            # both paths may find a malformed frame in the same cycle: one pulse now, the other owed
            owe = Signal(2)
            total = dropped + self._fwd_dropped + owe
            m.d.comb += self.dropped.eq(total != 0)
            m.d.sync += owe.eq(total - (total != 0))
        else:
            m.d.comb += self.dropped.eq(dropped)
        return None


class CodecOut(_CodecStage):
    """Compresses data frames whose header asks for it (``codec = INCEPTIONN_V1``, ``eb_k``) as
    they leave a node.

    Parameters and attributes as :class:`CodecIn`, except that ``o`` carries each such frame's
    payload compressed with its header's ``eb_k`` (exactly
    :func:`wirereduce.sim.codec.encode`), and ``dropped`` never pulses (the node only sends
    well-formed frames). A frame whose ``codec`` is :data:`~wirereduce.protocol.CODEC_FORWARDED`
    (a compressed BROADCAST a forwarding :class:`CodecIn` passed on) leaves as it is, its ``codec``
    set back to INCEPTIONN_V1; the straight path holds a whole frame (``max_beats``), so such a frame
    waiting behind a compressed one does not hold up the port in front of it.
    """

    _opcodes = _DATA_OPS_OUT
    _restore_forwarded = True

    def _transform(self, m, src, dst):
        w = self._width
        m.submodules.comp = comp = Compressor(w, self._max_elements, COMPRESSOR_BANKS)
        hdrq = self._feed(m, src, comp)
        m.d.comb += [
            dst.payload.data.eq(comp.o.payload.data),
            dst.payload.keep.eq(comp.o.payload.keep),
            dst.payload.last.eq(comp.o.payload.last),
            dst.payload.hdr.eq(hdrq.r_data),
            dst.valid.eq(comp.o.valid & hdrq.r_rdy),
            comp.o.ready.eq(dst.ready & hdrq.r_rdy),
            hdrq.r_en.eq(dst.valid & dst.ready & dst.payload.last),
        ]


def codec_port_stages(m, component, config, inputs, outputs, placeholders: bool = True, cut_through: bool = False,
                      forward=()):
    """A component's ports as its logic sees them: straight, or (``config.codec``) through a
    :class:`CodecIn` behind each of ``inputs`` and a :class:`CodecOut` in front of each of
    ``outputs`` (submodules ``codec_{name}``), as the ring node and the schedule engine put them.

    Parameters
    ----------
    m : Module
    component : wiring.Component
        With an ``In(FrameStream)`` member for every name of ``inputs`` and an ``Out(FrameStream)``
        for every name of ``outputs``.
    config : NodeConfig
        ``width``, ``max_elements``, ``max_beats`` and ``codec``.
    inputs, outputs : sequence of str
    placeholders : bool
        :class:`CodecIn`'s: True for the ring node (a compressed frame marked bad becomes a LOST
        placeholder), False for the schedule engine (it passes decoded, still marked bad).
    cut_through : bool
        :class:`CodecIn`'s (needs ``placeholders=False``): True for the schedule engine, whose
        gates and units take a frame marked ``bad`` on its last beat and discard what it makes.
    forward : collection of str
        The inputs whose :class:`CodecIn` forwards compressed BROADCASTs unchanged (``forward=True``;
        the schedule engine's network inputs, with ``cut_through``).

    Returns
    -------
    ins, outs : dict
        By port name: the inputs as sources, the outputs as sinks of the component's logic.
    dropped : list of Signal
        Each ``CodecIn``'s ``dropped`` (a malformed compressed frame dropped whole); empty without
        the codec. The caller counts them (``drop_length``).
    """
    if not config.codec:
        return ({n: wiring.flipped(getattr(component, n)) for n in inputs},
                {n: wiring.flipped(getattr(component, n)) for n in outputs}, [])
    w = config.width
    beat = FrameStream(w)
    ins, outs, dropped = {}, {}, []
    for name in inputs:
        stage = m.submodules[f"codec_{name}"] = CodecIn(w, config.max_elements, config.max_beats, placeholders,
                                                        cut_through, forward=name in forward,
                                                        max_compressed=max_elements_compressed(config.mtu))
        wiring.connect(m, wiring.flipped(getattr(component, name)), stage.i)
        dropped.append(stage.dropped)
        ins[name] = beat.create()
        wiring.connect(m, stage.o, wiring.flipped(ins[name]))
    for name in outputs:
        stage = m.submodules[f"codec_{name}"] = CodecOut(w, config.max_elements, config.max_beats)
        wiring.connect(m, stage.o, wiring.flipped(getattr(component, name)))
        inner = beat.create()
        wiring.connect(m, inner, stage.i)
        outs[name] = wiring.flipped(inner)
    return ins, outs, dropped
