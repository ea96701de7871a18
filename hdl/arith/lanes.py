"""Reduce lanes of every element format and operation, selected at run time: fp32, bf16, fp16, int32 × SUM, MAX, MIN.

:class:`ReduceLanes` is the schedule engine's arithmetic (:mod:`wirereduce.hdl.core.sumunit`): one
set of lanes per datapath width, whose format and operation come from the collective's header
``dtype`` byte (:mod:`wirereduce.formats`: format in bits 0-3, operation in bits 4-7), so one
bitstream serves every format. Per 32-bit payload word it holds

* one binary32 :class:`~wirereduce.hdl.arith.fp32.FloatAdder` (8, 23),
* two bf16 adders (8, 7) and two fp16 adders (5, 10), one per 16-bit half (element ``2i`` in bits
  0-15, ``2i + 1`` in bits 16-31),
* a 32-bit two's-complement adder (int32 SUM wraps modulo 2^32),
* a comparator that gives IEEE 754-2019 §9.6 ``maximum``/``minimum`` of the word's element(s) in
  the selected format (a NaN operand gives the format's canonical quiet NaN; −0 < +0), or the
  signed maximum/minimum of int32,

all with the same latency, :attr:`ReduceLanes.LATENCY` = 6 enabled edges (the adders'), so the
pipeline around them does not depend on the format. Every result is registered; the word's output
is the OR of the results gated by the (registered, one-hot) format select: one LUT level after the
registers.

An unknown ``dtype`` byte (0, or one the engine refuses at CONTROL) computes fp32 SUM.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, EnableInserter, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.arith.fp32 import FloatAdder
from wirereduce.hdl.params import reject

from wirereduce.formats import FORMATS, Op

__all__ = ["ReduceLanes"]

_FP32, _BF16, _FP16, _INT32 = (int(FORMATS[n].code) for n in ("fp32", "bf16", "fp16", "int32"))


def _minmax(a, b, exp_bits: int, frac_bits: int, is_max):
    """IEEE 754-2019 maximum (``is_max``) / minimum of two floats of the given format, as a Value.

    A NaN operand gives the canonical quiet NaN; otherwise the larger / smaller, with −0 < +0
    (sign-magnitude order: a negative is below every positive, zeros included)."""
    w = 1 + exp_bits + frac_bits
    exp_all = (1 << exp_bits) - 1
    nan_a = (a[frac_bits:w - 1] == exp_all) & (a[:frac_bits] != 0)
    nan_b = (b[frac_bits:w - 1] == exp_all) & (b[:frac_bits] != 0)
    sa, sb = a[w - 1], b[w - 1]
    mag_lt = a[:w - 1] < b[:w - 1]
    mag_gt = a[:w - 1] > b[:w - 1]
    # a < b: a negative and b positive; both positive and |a| < |b|; both negative and |a| > |b|
    a_lt_b = (sa & ~sb) | (~sa & ~sb & mag_lt) | (sa & sb & mag_gt)
    pick_b = Mux(is_max, a_lt_b, ~a_lt_b & (a != b))
    canon = exp_all << frac_bits | 1 << (frac_bits - 1)
    return Mux(nan_a | nan_b, canon, Mux(pick_b, b, a))


class ReduceLanes(wiring.Component):
    """Reduce lanes for a ``32·lanes``-bit datapath, every format and operation (module docstring).

    Parameters
    ----------
    lanes : int
        32-bit payload words per beat, at least 1.

    Attributes
    ----------
    LATENCY : int
        Enabled clock edges from ``a``/``b`` to ``s`` (6, every format and operation).
    a, b : Signal(32 · lanes), in
        Operands, word ``i`` in bits ``[32i, 32i + 32)``; ``a`` is the running result (the left
        operand of the schedule's order), ``b`` the next term.
    mode : Signal(8), in
        The collective's header ``dtype`` byte; sampled every enabled edge, expected to be constant
        while operands are in flight (the engine changes it only at CONTROL, when idle).
    en : Signal(1), in
        Clock enable of every register.
    s : Signal(32 · lanes), out
        Results, registered (plus one LUT level of select).

    Raises
    ------
    TypeError, ValueError
        ``lanes`` not an int ≥ 1.
    """

    LATENCY = FloatAdder.LATENCY

    def __init__(self, lanes: int):
        if isinstance(lanes, bool) or not isinstance(lanes, int):
            reject(self, TypeError(f"lanes must be an int, not {lanes!r}"))
        if lanes < 1:
            reject(self, ValueError(f"lanes must be at least 1, not {lanes}"))
        self.lanes = lanes
        super().__init__({"a": In(32 * lanes), "b": In(32 * lanes), "mode": In(8), "en": In(1),
                          "s": Out(32 * lanes)})

    def elaborate(self, platform):
        m = Module()      # the lanes, under the clock enable
        out = Module()    # the selects (clocked every cycle) and the output OR
        L = self.LATENCY
        fmt, op = self.mode[:4], self.mode[4:]
        # One-hot selects, registered (the mode is static while operands are in flight).
        is_max = Signal()
        sel_bf, sel_hf, sel_int, sel_cmp = Signal(), Signal(), Signal(), Signal()
        sel_fp = Signal(init=1)
        known_op = (op == int(Op.SUM)) | (op == int(Op.MAX)) | (op == int(Op.MIN))
        known = known_op & ((fmt == _FP32) | (fmt == _BF16) | (fmt == _FP16) | (fmt == _INT32))
        summing = ~known | (op == int(Op.SUM))
        fp_default = ~known | (fmt == _FP32)
        out.d.sync += [
            is_max.eq(op == int(Op.MAX)),
            sel_fp.eq(summing & fp_default),
            sel_bf.eq(summing & known & (fmt == _BF16)),
            sel_hf.eq(summing & known & (fmt == _FP16)),
            sel_int.eq(summing & known & (fmt == _INT32)),
            sel_cmp.eq(~summing),
        ]
        cmp_fmt = Signal(4)
        out.d.sync += cmp_fmt.eq(fmt)

        lanes = []
        for j in range(self.lanes):
            word = slice(32 * j, 32 * j + 32)
            a, b = self.a[word], self.b[word]
            fp = m.submodules[f"fp32_{j}"] = FloatAdder(8, 23)
            bfs = [FloatAdder(8, 7) for _ in range(2)]
            hfs = [FloatAdder(5, 10) for _ in range(2)]
            for h in range(2):
                m.submodules[f"bf16_{j}_{h}"] = bfs[h]
                m.submodules[f"fp16_{j}_{h}"] = hfs[h]
            m.d.comb += [fp.a.eq(a), fp.b.eq(b)]
            for h in range(2):
                half = slice(16 * h, 16 * h + 16)
                m.d.comb += [bfs[h].a.eq(a[half]), bfs[h].b.eq(b[half]),
                             hfs[h].a.eq(a[half]), hfs[h].b.eq(b[half])]

            # int32 SUM and the comparator: one registered stage, then a delay to the adders' latency.
            isum = Signal(32, name=f"int_sum{j}")
            m.d.sync += isum.eq((a + b)[:32])
            c32 = _minmax(a, b, 8, 23, is_max)
            cbf = Cat(*(_minmax(a[16 * h:16 * h + 16], b[16 * h:16 * h + 16], 8, 7, is_max) for h in range(2)))
            chf = Cat(*(_minmax(a[16 * h:16 * h + 16], b[16 * h:16 * h + 16], 5, 10, is_max) for h in range(2)))
            a_lt_b = a.as_signed() < b.as_signed()
            cint = Mux(Mux(is_max, a_lt_b, ~a_lt_b & (a != b)), b, a)
            cmp = Signal(32, name=f"cmp{j}")
            with m.Switch(cmp_fmt):
                with m.Case(_BF16):
                    m.d.sync += cmp.eq(cbf)
                with m.Case(_FP16):
                    m.d.sync += cmp.eq(chf)
                with m.Case(_INT32):
                    m.d.sync += cmp.eq(cint)
                with m.Default():
                    m.d.sync += cmp.eq(c32)
            for k in range(L - 1):
                nxt_sum, nxt_cmp = Signal(32, name=f"int_sum{j}_d{k}"), Signal(32, name=f"cmp{j}_d{k}")
                m.d.sync += [nxt_sum.eq(isum), nxt_cmp.eq(cmp)]
                isum, cmp = nxt_sum, nxt_cmp
            lanes.append((fp, bfs, hfs, isum, cmp))

        # Everything above registers only on enabled edges (a stall freezes the lanes).
        out.submodules.lanes = EnableInserter(self.en)(m)
        for j, (fp, bfs, hfs, isum, cmp) in enumerate(lanes):
            gate = lambda sel, v: Mux(sel, v, Const(0, 32))  # noqa: E731
            out.d.comb += self.s[32 * j:32 * j + 32].eq(
                gate(sel_fp, fp.s) | gate(sel_bf, Cat(bfs[0].s, bfs[1].s)) | gate(sel_hf, Cat(hfs[0].s, hfs[1].s))
                | gate(sel_int, isum) | gate(sel_cmp, cmp))
        for sub in [fp for fp, *_ in lanes] + [x for _, b, h, *_ in lanes for x in b + h]:
            out.d.comb += sub.en.eq(self.en)
        return out
