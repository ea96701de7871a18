"""Reduce lanes of the chosen element formats (fp32, bf16, fp16, int32) × SUM, MAX, MIN, selected at run time.

:class:`ReduceLanes` is the schedule engine's arithmetic (:mod:`wirereduce.hdl.core.sumunit`): one
set of lanes per datapath width, whose format and operation come from the collective's header
``dtype`` byte (:mod:`wirereduce.formats`: format in bits 0-3, operation in bits 4-7), so one
bitstream serves every format. Per 32-bit payload word it holds, for each format it is built with
(``formats``, default all four; ``EngineConfig.formats`` for the engine's),

* one binary32 :class:`~wirereduce.hdl.arith.fp32.FloatAdder` (8, 23),
* two bf16 adders (8, 7) and two fp16 adders (5, 10), one per 16-bit half (element ``2i`` in bits
  0-15, ``2i + 1`` in bits 16-31),
* a 32-bit two's-complement adder (int32 SUM wraps modulo 2^32),
* a comparator that gives IEEE 754-2019 §9.6 ``maximum``/``minimum`` of the word's element(s) in
  the selected format (a NaN operand gives the format's canonical quiet NaN; −0 < +0), or the
  signed maximum/minimum of int32,

all with the same latency, the adders' (:attr:`ReduceLanes.latency`: 6 enabled edges, or 7 with
``deep``), so the pipeline around them does not depend on the format. Every result is registered;
the word's output is the OR of the results gated by the (registered, one-hot) format select: one
LUT level after the registers.

Two depths (``deep``; the same bits either way): the six-stage lanes of the 64-bit datapath (≤ 9
LUT levels between registers at 156.25 MHz on xc7; yosys estimate 8) and the seven-stage lanes of
the 512-bit datapath (≤ 5 LUT levels at 322.27 MHz on xcup, docs/architecture.md "Timing budgets";
estimate 5, against 8 for the six-stage lanes at 512 bit). The deep lanes are built of deep
:class:`~wirereduce.hdl.arith.fp32.FloatAdder` s, and their MAX/MIN registers the raw comparisons
(the NaN test, the signs, ``|a| < |b|``, ``|a| > |b|``; int32 ``a < b`` and ``a > b``), picks
the operand in the next cycle and registers each format's result before the select by format
(at 16 lanes the pick, the NaN select and the format select were 6 levels).
At both depths MAX/MIN registers its operands before it compares
them (the decisions are made from registered operands, then registered with them once more), so
no compare sits right behind the lanes' inputs, which in a summation unit's chain are the adder
before's output select. :func:`wirereduce.config.deep_lanes` decides the depth from the datapath
width.

An unknown ``dtype`` byte (0, an unknown format or operation, or a format the lanes are not built
with: all of them bytes the engine refuses at CONTROL) computes fp32 SUM, which is why fp32 is
always built.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, EnableInserter, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.arith.fp32 import FloatAdder, _check_deep, latency
from wirereduce.hdl.params import reject, rejecting

from wirereduce.formats import FORMATS, Op, check_formats

__all__ = ["ReduceLanes"]


def _minmax(a, b, exp_bits: int, frac_bits: int, is_max, deep: bool = False):
    """IEEE 754-2019 maximum (``is_max``) / minimum of two floats of the given format, in two parts:
    returns ``(flags, result)``: the decision ``flags`` from ``a`` and ``b`` (to be registered) and
    ``result(*flags, x, y)``, which gives the canonical quiet NaN when an operand was a NaN, else
    ``y`` (``b``) when the decision picks ``b``, else ``x`` (``a``), so the decision can be registered
    before the select. The flags are ``(nan, pick_b)``, or with ``deep`` the raw comparisons
    ``(nan, sign_a, sign_b, |a| < |b|, |a| > |b|)``, which ``result`` combines into ``pick_b`` (one LUT
    level in the select's cycle instead of two after the comparators).

    A NaN operand gives the canonical quiet NaN; otherwise the larger / smaller, with −0 < +0
    (sign-magnitude order: a negative is below every positive, zeros included)."""
    w = 1 + exp_bits + frac_bits
    exp_all = (1 << exp_bits) - 1
    nan_a = (a[frac_bits:w - 1] == exp_all) & (a[:frac_bits] != 0)
    nan_b = (b[frac_bits:w - 1] == exp_all) & (b[:frac_bits] != 0)
    sa, sb = a[w - 1], b[w - 1]
    mag_lt = a[:w - 1] < b[:w - 1]
    mag_gt = a[:w - 1] > b[:w - 1]
    canon = exp_all << frac_bits | 1 << (frac_bits - 1)

    def pick(sa, sb, mag_lt, mag_gt, a_ne_b):
        # a < b: a negative and b positive; both positive and |a| < |b|; both negative and |a| > |b|
        a_lt_b = (sa & ~sb) | (~sa & ~sb & mag_lt) | (sa & sb & mag_gt)
        return Mux(is_max, a_lt_b, ~a_lt_b & a_ne_b)

    if deep:
        def result(nan, sa, sb, lt, gt, x, y):
            return Mux(nan, canon, Mux(pick(sa, sb, lt, gt, lt | gt | (sa ^ sb)), y, x))
        return (nan_a | nan_b, sa, sb, mag_lt, mag_gt), result
    return (nan_a | nan_b, pick(sa, sb, mag_lt, mag_gt, a != b)), \
        lambda nan, pick_b, x, y: Mux(nan, canon, Mux(pick_b, y, x))


class ReduceLanes(wiring.Component):
    """Reduce lanes for a ``32·lanes``-bit datapath, the given formats and every operation (module docstring).

    Parameters
    ----------
    lanes : int
        32-bit payload words per beat, at least 1.
    formats : tuple of str
        The formats built (names of :data:`wirereduce.formats.FORMATS`, ``"fp32"`` among them;
        :func:`~wirereduce.formats.check_formats`); default all four. Every mode of these formats
        gives the same bits as with all four; a mode of another format computes fp32 SUM.
    deep : bool
        The seven-stage lanes (≤ 5 LUT levels at 322.27 MHz on xcup: the 512-bit datapath's,
        module docstring); default False (six stages).

    Attributes
    ----------
    LATENCY : int
        Enabled clock edges from ``a``/``b`` to ``s`` of the default depth (6, every format and
        operation); class constant.
    latency : int
        This instance's: 6, or 7 with ``deep``.
    deep : bool
        As given.
    formats : tuple of str
        The formats built, in :data:`~wirereduce.formats.FORMATS` order.
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
        ``lanes`` not an int ≥ 1; bad ``formats``; ``deep`` not a bool (TypeError).
    """

    LATENCY = FloatAdder.LATENCY

    def __init__(self, lanes: int, formats: tuple[str, ...] = tuple(FORMATS), deep: bool = False):
        if isinstance(lanes, bool) or not isinstance(lanes, int):
            reject(self, TypeError(f"lanes must be an int, not {lanes!r}"))
        if lanes < 1:
            reject(self, ValueError(f"lanes must be at least 1, not {lanes}"))
        with rejecting(self):
            self.formats = check_formats(formats)
        self.lanes = lanes
        self.deep = _check_deep(self, deep)
        self.latency = latency(deep)
        super().__init__({"a": In(32 * lanes), "b": In(32 * lanes), "mode": In(8), "en": In(1),
                          "s": Out(32 * lanes)})

    def elaborate(self, platform):
        m = Module()      # the lanes, under the clock enable
        out = Module()    # the selects (clocked every cycle) and the output OR
        L = self.latency
        built = [FORMATS[n] for n in self.formats]
        others = [f for f in built if f.name != "fp32"]   # fp32's comparator is the default one
        fmt, op = self.mode[:4], self.mode[4:]
        # One-hot selects, registered (the mode is static while operands are in flight): a built
        # format's SUM (fp32 SUM also for an unknown mode), or the comparator.
        is_max = Signal()
        known_op = (op == int(Op.SUM)) | (op == int(Op.MAX)) | (op == int(Op.MIN))
        known = known_op & Cat(*(fmt == int(f.code) for f in built)).any()
        summing = ~known | (op == int(Op.SUM))
        sel_sum = {f.name: Signal(name=f"sel_{f.name}", init=f.name == "fp32") for f in built}
        sel_cmp = Signal()
        cmp_fmt = Signal(4)
        out.d.sync += [is_max.eq(op == int(Op.MAX)), sel_cmp.eq(~summing), cmp_fmt.eq(fmt)]
        out.d.sync += [sel_sum[f.name].eq(summing & Mux(known, fmt == int(f.code), f.name == "fp32")) for f in built]

        def delayed(v, name, n=L - 1):
            """``v`` (registered once already) after ``n`` more registers (L − 1: the adders' latency)."""
            for k in range(n):
                nxt = Signal(32, name=f"{name}_d{k}")
                m.d.sync += nxt.eq(v)
                v = nxt
            return v

        def decided(flags, name):
            """Registers of the MAX/MIN decisions ``flags`` (one stage before the select)."""
            regs = [Signal(name=f"{name}_{k}") for k in range(len(flags))]
            m.d.sync += [r.eq(v) for r, v in zip(regs, flags)]
            return regs

        adders, words = [], []
        for j in range(self.lanes):
            word = slice(32 * j, 32 * j + 32)
            a, b = self.a[word], self.b[word]
            # MAX/MIN in three registered stages: the operands, then each format's decisions (NaN,
            # which operand) from the registered operands with them once more, then the selected
            # format's result (timing: no compare right behind the lanes' inputs, which in a
            # summation unit's chain are the adder before's output select).
            a_r, b_r = Signal(32, name=f"cmp_ar{j}"), Signal(32, name=f"cmp_br{j}")
            m.d.sync += [a_r.eq(a), b_r.eq(b)]
            a_q, b_q = Signal(32, name=f"cmp_a{j}"), Signal(32, name=f"cmp_b{j}")
            m.d.sync += [a_q.eq(a_r), b_q.eq(b_r)]
            sums, cmps = {}, {}   # per format: its SUM (latency L), its MAX/MIN (after two registers)
            for f in built:
                elements = [slice(f.bits * h, f.bits * (h + 1)) for h in range(f.per_word)]
                if f.is_float:    # one adder per element: element 2i in bits 0-15, 2i + 1 in bits 16-31
                    fas = []
                    for h, el in enumerate(elements):
                        fa = m.submodules[f"{f.name}_{j}" + (f"_{h}" if f.per_word > 1 else "")] = \
                            FloatAdder(f.exp_bits, f.frac_bits, self.deep)
                        m.d.comb += [fa.a.eq(a[el]), fa.b.eq(b[el])]
                        fas.append(fa)
                    adders += fas
                    sums[f.name] = Cat(*(fa.s for fa in fas))
                    parts = []
                    for h, el in enumerate(elements):
                        flags, result = _minmax(a_r[el], b_r[el], f.exp_bits, f.frac_bits, is_max, self.deep)
                        parts.append(result(*decided(flags, f"{f.name}_{j}_{h}_cmp"), a_q[el], b_q[el]))
                    cmps[f.name] = Cat(*parts)
                else:             # int32: one registered stage, then a delay to the adders' latency
                    isum = Signal(32, name=f"int_sum{j}")
                    m.d.sync += isum.eq((a + b)[:32])
                    sums[f.name] = delayed(isum, f"int_sum{j}")
                    a_lt_b = a_r.as_signed() < b_r.as_signed()
                    if self.deep:     # both comparisons (carry chains) registered, picked in the select's cycle
                        lt, gt = decided([a_lt_b, b_r.as_signed() < a_r.as_signed()], f"int_{j}_cmp")
                        pick = Mux(is_max, lt, gt)     # MIN takes b iff a > b (the same as ~lt & (a != b))
                    else:
                        pick, = decided([Mux(is_max, a_lt_b, ~a_lt_b & (a_r != b_r))], f"int_{j}_cmp")
                    cmps[f.name] = Mux(pick, b_q, a_q)
            if self.deep:
                # deep: each format's MAX/MIN result is registered before the format select (timing: the
                # pick, the NaN select and the select by format were 6 LUT levels at 512 bit on xcup)
                for name, v in list(cmps.items()):
                    r = Signal(32, name=f"{name}_cmp_res{j}")
                    m.d.sync += r.eq(v)
                    cmps[name] = r
            # The comparator of the selected format: a third (deep: fourth) registered stage, then the
            # delay to the adders' latency.
            cmp = Signal(32, name=f"cmp{j}")
            with m.Switch(cmp_fmt):
                for f in others:
                    with m.Case(int(f.code)):
                        m.d.sync += cmp.eq(cmps[f.name])
                with m.Default():
                    m.d.sync += cmp.eq(cmps["fp32"])
            words.append((sums, delayed(cmp, f"cmp{j}", L - (4 if self.deep else 3))))

        # Everything above registers only on enabled edges (a stall freezes the lanes).
        out.submodules.lanes = EnableInserter(self.en)(m)
        for j, (sums, cmp) in enumerate(words):
            gate = lambda sel, v: Mux(sel, v, Const(0, 32))  # noqa: E731
            result = gate(sel_cmp, cmp)
            for name, v in sums.items():
                result = result | gate(sel_sum[name], v)
            out.d.comb += self.s[32 * j:32 * j + 32].eq(result)
        out.d.comb += [fa.en.eq(self.en) for fa in adders]
        return out
