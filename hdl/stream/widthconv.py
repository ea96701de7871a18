"""Frame-stream width converters by an integer ratio, one clock domain, full rate.

:class:`StreamDownsizer` splits a wide beat into up to ``ratio`` narrow beats (those with valid
bytes); :class:`StreamUpsizer` packs narrow beats into wide ones, a frame's last wide beat carrying
only the bytes it has (``keep``). Both keep a frame's bytes, ``keep`` and ``bad`` exactly. Amaranth
0.5's ``amaranth.lib.stream`` has no width converter, so they are written here.

Used at the edges of an engine whose datapath is wider than its links: the PCIe host link's
256-bit DMA streams (:class:`~wirereduce.hdl.xilinx.pcie.XdmaHostGlue`) and the 64-bit 10G
Ethernet ports of the VC709 PCIe top's 256-bit engine (:mod:`wirereduce.boards.vc709_engine_top`).
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.params import rejecting
from wirereduce.hdl.stream.frame import FrameStream, beat_layout

from wirereduce.config import check_width

__all__ = ["StreamDownsizer", "StreamUpsizer", "check_ratio"]


def check_ratio(wide: int, narrow: int) -> int:
    """``wide // narrow`` for two datapath widths in bits.

    Raises
    ------
    TypeError, ValueError
        On a bad width (:func:`wirereduce.config.check_width`) or ``wide < narrow``.
    """
    check_width(wide)
    check_width(narrow)
    if wide < narrow:
        raise ValueError(f"the wide side ({wide} bit) must be at least as wide as the narrow side ({narrow} bit)")
    return wide // narrow


class _WidthConverter(wiring.Component):
    """``i`` of ``i_width`` bits, ``o`` of ``o_width``; ``ratio`` = ``wide // narrow``."""

    def __init__(self, wide: int, narrow: int, i_width: int, o_width: int):
        with rejecting(self):
            self.ratio = check_ratio(wide, narrow)
        self.wide, self.narrow = wide, narrow
        super().__init__({"i": In(FrameStream(i_width)), "o": Out(FrameStream(o_width))})


class StreamDownsizer(_WidthConverter):
    """Splits each ``wide``-bit beat into ``wide // narrow`` sub-beats, first the low bytes.

    Sub-beat ``k`` of a beat carries bytes ``k*n … k*n + n - 1`` (``n = narrow // 8``) with their
    ``keep``. A sub-beat leaves if it is the first one or some of its bytes are valid; the one
    after which no later sub-beat of the beat has a valid byte is the beat's final one, and it is
    ``last`` if the beat was. So a frame of ``L`` bytes (contiguous ``keep``) leaves as
    ``ceil(L / n)`` beats whatever its wide beats, and ``bad`` goes to its last sub-beat. One sub-beat
    a cycle; ``i.ready`` is high in the cycle the final sub-beat is taken. The output is
    combinational from the input beat (no added latency).

    Parameters
    ----------
    wide, narrow : int
        Widths in bits (:func:`wirereduce.config.check_width`), ``wide >= narrow``.

    Attributes
    ----------
    i : In(FrameStream(wide))
    o : Out(FrameStream(narrow))

    Raises
    ------
    TypeError, ValueError
        On a bad width, or ``wide < narrow``.
    """

    def __init__(self, wide: int, narrow: int):
        super().__init__(wide, narrow, wide, narrow)

    def elaborate(self, platform):
        m = Module()
        r, w, nb = self.ratio, self.narrow, self.narrow // 8
        i, o = self.i.payload, self.o.payload
        if r == 1:
            wiring.connect(m, wiring.flipped(self.i), wiring.flipped(self.o))
            return m
        k = Signal(range(r))
        sub_keep = [i.keep[j * nb:(j + 1) * nb] for j in range(r)]
        # more[j]: some sub-beat after j has a valid byte
        more = [Cat(*sub_keep[j + 1:]).any() if j < r - 1 else Const(0, 1) for j in range(r)]
        final = Signal()
        with m.Switch(k):
            for j in range(r):
                with m.Case(j):
                    m.d.comb += [o.data.eq(i.data[j * w:(j + 1) * w]), o.keep.eq(sub_keep[j]), final.eq(~more[j])]
        m.d.comb += [
            o.last.eq(i.last & final),
            o.bad.eq(i.bad & final),
            self.o.valid.eq(self.i.valid),
            self.i.ready.eq(self.o.ready & final),
        ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += k.eq(0)
            with m.If(~final):
                m.d.sync += k.eq(k + 1)
        return m


class StreamUpsizer(_WidthConverter):
    """Packs ``wide // narrow`` beats of ``narrow`` bits into one ``wide`` beat, the first in the low bytes.

    A wide beat leaves when it is full or the frame's last narrow beat arrived; the positions a
    short last beat does not fill have ``keep`` 0, so the bytes and ``keep`` of a frame are kept
    exactly (contiguous ``keep`` in, contiguous out). ``bad`` on the last narrow beat goes to the
    last wide beat. Full rate: ``i.ready`` is ``o.ready`` or the beat is not the one completing a
    wide beat; the output is registered (one cycle after the completing narrow beat).

    Parameters
    ----------
    wide, narrow : int
        Widths in bits (:func:`wirereduce.config.check_width`), ``wide >= narrow``.

    Attributes
    ----------
    i : In(FrameStream(narrow))
    o : Out(FrameStream(wide))

    Raises
    ------
    TypeError, ValueError
        On a bad width, or ``wide < narrow``.
    """

    def __init__(self, wide: int, narrow: int):
        super().__init__(wide, narrow, narrow, wide)

    def elaborate(self, platform):
        m = Module()
        r, w, nb = self.ratio, self.narrow, self.narrow // 8
        i = self.i.payload
        if r == 1:
            wiring.connect(m, wiring.flipped(self.i), wiring.flipped(self.o))
            return m
        k = Signal(range(r))
        acc_data = Signal(self.wide)
        acc_keep = Signal(self.wide // 8)
        out = Signal(beat_layout(self.wide))
        out_valid = Signal()
        completes = Signal()
        m.d.comb += [
            completes.eq(i.last | (k == r - 1)),
            self.i.ready.eq(~completes | ~out_valid | self.o.ready),
            self.o.valid.eq(out_valid),
            self.o.payload.eq(out),
        ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += out_valid.eq(0)
        # the wide beat with this narrow beat put in at position k
        new_data = Signal(self.wide)
        new_keep = Signal(self.wide // 8)
        m.d.comb += [new_data.eq(acc_data), new_keep.eq(acc_keep)]
        with m.Switch(k):
            for j in range(r):
                with m.Case(j):
                    m.d.comb += [new_data[j * w:(j + 1) * w].eq(i.data), new_keep[j * nb:(j + 1) * nb].eq(i.keep)]
        with m.If(self.i.valid & self.i.ready):
            with m.If(completes):
                m.d.sync += [out.data.eq(new_data), out.keep.eq(new_keep), out.last.eq(i.last),
                             out.bad.eq(i.bad & i.last), out_valid.eq(1),
                             k.eq(0), acc_data.eq(0), acc_keep.eq(0)]
            with m.Else():
                m.d.sync += [acc_data.eq(new_data), acc_keep.eq(new_keep), k.eq(k + 1)]
        return m
