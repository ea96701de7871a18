"""Fully pipelined IEEE 754 binary32 adder, and a lane array of it.

The adder is the arithmetic core of the reduce pipeline: every element of a REDUCE frame is
added to the matching element of the local partial sum. It is bit exact against
``numpy.float32`` addition (and so against any IEEE 754-2008 implementation running in the
default rounding mode):

* rounding is roundTiesToEven (IEEE 754-2008 §4.3.1);
* subnormal inputs and results are kept, never flushed to zero;
* an exact zero sum of operands of opposite sign is +0, and ``(-0) + (-0)`` is -0
  (IEEE 754-2008 §6.3);
* a finite sum too large to represent rounds to ±Inf (IEEE 754-2008 §7.4, roundTiesToEven);
* ``Inf + Inf`` of one sign is that Inf, ``Inf + (-Inf)`` and any NaN operand give NaN
  (IEEE 754-2008 §7.2, §6.2). The NaN produced is always the canonical quiet NaN
  :data:`CANONICAL_NAN`; its payload and sign are not propagated.

Pipeline
--------
One result per clock (initiation interval 1), in one of two depths (``deep``, fixed at
construction; the same bits either way).

The default, :attr:`FP32Adder.LATENCY` = 6 enabled clock edges from operands to sum, for the 64-bit
datapath: ≤ 9 LUT levels between registers at 156.25 MHz on 7-series (docs/architecture.md "Timing
budgets"; yosys estimate, carry chains and MUXF counted as wiring: 7 levels for binary32, 8 in the
multi-format lanes):

====  =========================  ====================================================================
 #    stage                      work
====  =========================  ====================================================================
 1    unpack / compare / swap    split fields, classify Inf/NaN, compare magnitudes, order the
                                 operands so the first is the larger, exponent difference
 2    align                      shift the smaller significand right by the exponent difference,
                                 collect the bits shifted out into a sticky bit
 3    add                        add or subtract the significands (27-bit + carry)
 4    leading-zero count         count leading zeros of the 28-bit sum, resolve the sign of zero
 5    normalise                  shift left by the leading-zero count, clamped by the exponent so
                                 that tiny results come out subnormal (both shifts side by side,
                                 picked by whether the sum's top e + 1 bits are all zero, tested
                                 in stage 4 against a mask decoded from e in stage 3); compute
                                 the exponent field
 6    round / pack               roundTiesToEven increment, overflow to Inf, special values, pack
====  =========================  ====================================================================

``deep=True``, :attr:`FloatAdder.DEEP_LATENCY` = 7 enabled clock edges, for the 512-bit datapath:
≤ 5 LUT levels between registers at 322.27 MHz on UltraScale+ (docs/architecture.md "Timing
budgets"; yosys estimate: 4 levels for binary32, 5 in the multi-format 512-bit lanes, where the
six-stage split measures 8 in its normalise stage and 7 in its align stage). Stage 1 and the last
are the six-stage pipeline's; in between, the align and the leading-zero count + normalise are split
in halves, and the add gets a stage of its own:

====  =========================  ====================================================================
 #    stage                      work
====  =========================  ====================================================================
 1    unpack / compare / swap    as above
 2    align, low bits            shift by d mod 4 (d = exponent difference), which drops only the
                                 three zero G/R/S bits; per block of four bits, whether it holds a
                                 one; ``far`` = d ≥ 2^SHB (every bit shifted out)
 3    align, high bits           shift by 4·(d // 4), zero when far; sticky bit = OR of the blocks
                                 shifted out; the stop mask of the exponent (below)
 4    add                        one adder: big + (small XOR sub) + sub; per group of four bits of
                                 sum | mask, whether it holds a one and its leading zeros (0 … 3)
 5    coarse normalise           c = leading all-zero groups (a balanced counter over the group
                                 flags); shift left by 4c; f = the first non-zero group's leading
                                 zeros (flat AND-OR); sign of an exact zero
 6    fine normalise             shift left by f; the bit that lands on the hidden position is the
                                 result's hidden bit; exponent field e + 1 − (4c + f) when it is 1,
                                 else 0 (subnormal or zero)
 7    round / pack               as above
====  =========================  ====================================================================

The stop mask replaces the six-stage pipeline's clamp of the normalising shift (a compare and a
select before the shifter): a one at bit ``SUMW − 1 − e`` of the sum (``e`` the larger operand's
effective exponent), decoded from the exponent two stages early. The leading zeros of
``sum | mask`` are ``min(lz(sum), e)``: the shift that normalises a result in the normal range, or
that leaves a result below it subnormal (shift by ``e`` only, hidden bit 0).

Significand format inside the pipeline (27 bits before the add, 28 after)::

    bit 27   26   25 ......... 3    2    1    0
        C    H    fraction(23)    G    R    S

``H`` is the hidden bit (1 for normal numbers, 0 for subnormals), ``G``/``R`` are the guard and
round bits and ``S`` the sticky bit: the OR of every bit shifted out during alignment. ``C`` is the
carry out of an effective addition. Three extra low bits are enough for correct rounding: an
effective subtraction that cancels more than one leading bit only happens when the exponents
differ by at most one, and then the alignment shift lost nothing.
"""

import operator
from functools import reduce

from amaranth.hdl import Cat, Const, EnableInserter, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.params import reject

__all__ = ["CANONICAL_NAN", "FloatAdder", "FP32Adder", "AdderLanes", "latency"]

#: The NaN every invalid or NaN-input addition produces: positive, quiet, zero payload.
CANONICAL_NAN = 0x7FC0_0000

_EXTRA = 3          # guard, round, sticky below the significand


def _trailing_zeros(v: Value) -> tuple[Value, Value]:
    """(``v != 0``, the number of trailing zeros of a nonzero ``v``; 0 when ``v`` is 0). The lowest
    set bit is isolated as ``v & -v`` (a carry chain) and its one-hot position encoded by ORs, where
    a priority chain or a tree of selects is many LUT levels deep."""
    n = len(v)
    low_expr = (v & (~v + 1))[:n]
    bits = max(1, (n - 1).bit_length())
    tz = Cat(*(reduce(operator.or_, (low_expr[i] for i in range(n) if i >> k & 1), Const(0, 1))
               for k in range(bits)))
    return v.any(), tz


def latency(deep: bool = False) -> int:
    """Enabled clock edges from operands to sum of :class:`FloatAdder` (and of the lanes built of it) of the
    given depth: 6 (``deep=False``), 7 (``deep=True``)."""
    return FloatAdder.DEEP_LATENCY if deep else FloatAdder.LATENCY


def _check_deep(owner, deep) -> bool:
    if not isinstance(deep, bool):
        reject(owner, TypeError(f"deep must be True or False, not {deep!r}"))
    return deep


def _leading_zeros(value):
    """Build a balanced leading-zero counter for ``value`` (width a power of two).

    A priority chain over 28 bits would be 28 muxes deep. Splitting in halves recursively gives
    ``log2(width)`` levels of 2:1 multiplexers: if the upper half is all zero, the count is half
    the width plus the count of the lower half, otherwise it is the count of the upper half.

    Parameters
    ----------
    value : Value
        Bits to count; its width must be a power of two and it must not be all zero (the caller
        pads it with a one below the bits of interest).

    Returns
    -------
    Value
        The number of leading zeros, ``log2(width)`` bits wide.
    """
    width = len(value)
    assert width >= 2 and width & (width - 1) == 0
    if width == 2:
        # Never all zero, so the count is just "the top bit is zero".
        return ~value[1]
    half = width // 2
    hi, lo = value[half:], value[:half]
    hi_zero = hi == 0
    # With the padding, a zero upper half means the lower half holds the first one.
    return Cat(Mux(hi_zero, _leading_zeros(lo), _leading_zeros(hi)), hi_zero)


class FloatAdder(wiring.Component):
    """Fully pipelined IEEE 754 binary floating-point adder, ``s = a + b``, of any format.

    The arithmetic and pipeline of the module docstring (there for binary32) for a format of
    ``exp_bits`` exponent and ``frac_bits`` stored fraction bits: bf16 is (8, 7), IEEE binary16
    (fp16) is (5, 10), binary32 (8, 23). Correctly rounded, roundTiesToEven (IEEE 754-2019
    §4.3.1), subnormals kept, zero signs per §6.3, overflow to ±Inf per §7.4; any NaN operand or
    ``Inf + (-Inf)`` gives the canonical quiet NaN (positive, top fraction bit set, no payload:
    :attr:`canonical_nan`). Latency :attr:`latency` enabled edges for every format: 6
    (:attr:`LATENCY`), or 7 with ``deep`` (:attr:`DEEP_LATENCY`).

    Parameters
    ----------
    exp_bits : int
        Exponent field bits, 2 … 11.
    frac_bits : int
        Stored fraction bits, 2 … 52.
    deep : bool
        False (default): the six-stage pipeline (the 64-bit datapath's: ≤ 9 LUT levels at 156.25 MHz
        on xc7). True: the seven-stage one (the 512-bit datapath's: ≤ 5 LUT levels between registers
        at 322.27 MHz on xcup, docs/architecture.md "Timing budgets"). The same bits either way.

    Attributes
    ----------
    LATENCY, DEEP_LATENCY : int
        Enabled clock edges from operands to sum of the two depths (6, 7); class constants.
    latency : int
        This instance's: :attr:`LATENCY` or, with ``deep``, :attr:`DEEP_LATENCY`.
    deep : bool
        As given.
    a, b : Signal(1 + exp_bits + frac_bits), in
        Operands (bit patterns).
    en : Signal(1), in
        Clock enable of every pipeline register.
    s : Signal(1 + exp_bits + frac_bits), out
        Sum, registered; resets to +0.

    Raises
    ------
    ValueError
        ``exp_bits`` or ``frac_bits`` out of range.
    TypeError
        ``deep`` not a bool.
    """

    LATENCY = 6
    DEEP_LATENCY = 7

    def __init__(self, exp_bits: int = 8, frac_bits: int = 23, deep: bool = False):
        for name, v, lo, hi in (("exp_bits", exp_bits, 2, 11), ("frac_bits", frac_bits, 2, 52)):
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                reject(self, ValueError(f"{name} must be an int in {lo} … {hi}, not {v!r}"))
        self.exp_bits, self.frac_bits = exp_bits, frac_bits
        self.deep = _check_deep(self, deep)
        self.latency = latency(deep)
        self.width = 1 + exp_bits + frac_bits
        super().__init__({"a": In(self.width), "b": In(self.width), "en": In(1), "s": Out(self.width)})

    @property
    def canonical_nan(self) -> int:
        """The NaN this adder produces: exponent all ones, top fraction bit set, sign 0."""
        return ((1 << self.exp_bits) - 1) << self.frac_bits | 1 << (self.frac_bits - 1)

    def _stage1(self, m):
        """Stage 1 (both depths): unpack, classify, compare magnitudes, swap, exponent difference.
        Returns its registers by name (``sign``, ``exp``, ``big``, ``small``, ``diff``, ``sub``,
        ``zero_sign``, ``special``, ``invalid``, ``inf_sign``)."""
        E, F = self.exp_bits, self.frac_bits
        W = self.width
        EXP_MAX = (1 << E) - 1
        a, b = self.a, self.b
        a_sign, b_sign = a[W - 1], b[W - 1]
        a_exp, b_exp = a[F:W - 1], b[F:W - 1]
        a_frac, b_frac = a[:F], b[:F]

        a_nan = (a_exp == EXP_MAX) & (a_frac != 0)
        b_nan = (b_exp == EXP_MAX) & (b_frac != 0)
        a_inf = (a_exp == EXP_MAX) & (a_frac == 0)
        b_inf = (b_exp == EXP_MAX) & (b_frac == 0)

        # Any Inf or NaN operand decides the result alone; the finite datapath below then
        # computes garbage that stage 6 replaces. The result is NaN (invalid) or else an Inf
        # with the sign of the Inf operand (Inf + Inf of one sign: either), so three bits
        # travel down the pipeline instead of a 32-bit value.
        special = (a_exp == EXP_MAX) | (b_exp == EXP_MAX)
        invalid = a_nan | b_nan | (a_inf & b_inf & (a_sign != b_sign))
        inf_sign = Mux(a_inf, a_sign, b_sign)

        # A subnormal has exponent field 0 but the scale of exponent 1, and no hidden bit.
        a_eexp = Mux(a_exp == 0, 1, a_exp)
        b_eexp = Mux(b_exp == 0, 1, b_exp)
        a_sig = Cat(a_frac, a_exp != 0)
        b_sig = Cat(b_frac, b_exp != 0)

        # For non-NaN values the magnitude bits (exponent above fraction) order like the
        # magnitudes themselves, subnormals included, so one unsigned compare picks the larger
        # operand. Ordering the operands makes an effective subtraction never go negative.
        a_ge_b = a[:W - 1] >= b[:W - 1]
        # Both differences are computed in parallel with the compare and the right (non-negative)
        # one is selected, instead of subtracting after the swap: that keeps the compare and the
        # subtract carry chains side by side rather than in series.
        diff_ab = (a_eexp - b_eexp)[:E]
        diff_ba = (b_eexp - a_eexp)[:E]

        s1_sign = Signal(name="s1_sign")            # sign of the larger operand
        s1_exp = Signal(E, name="s1_exp")           # effective exponent of the larger operand
        s1_big = Signal(F + 1, name="s1_big")          # significand of the larger operand
        s1_small = Signal(F + 1, name="s1_small")      # significand of the smaller operand
        s1_diff = Signal(E, name="s1_diff")         # exponent difference, >= 0
        s1_sub = Signal(name="s1_sub")              # effective subtraction (signs differ)
        s1_zero_sign = Signal(name="s1_zero_sign")  # sign if the sum is exactly zero
        s1_special = Signal(name="s1_special")      # an operand is Inf or NaN
        s1_invalid = Signal(name="s1_invalid")      # ... and the result is NaN
        s1_inf_sign = Signal(name="s1_inf_sign")    # ... else it is Inf of this sign
        m.d.sync += [
            s1_sign.eq(Mux(a_ge_b, a_sign, b_sign)),
            s1_exp.eq(Mux(a_ge_b, a_eexp, b_eexp)),
            s1_big.eq(Mux(a_ge_b, a_sig, b_sig)),
            s1_small.eq(Mux(a_ge_b, b_sig, a_sig)),
            s1_diff.eq(Mux(a_ge_b, diff_ab, diff_ba)),
            s1_sub.eq(a_sign ^ b_sign),
            # §6.3: x + (-x) is +0 in roundTiesToEven, and -0 + -0 is -0. With equal signs the
            # sum can only be zero if both operands are zeros of that sign, so AND covers both.
            s1_zero_sign.eq(a_sign & b_sign),
            s1_special.eq(special),
            s1_invalid.eq(invalid),
            s1_inf_sign.eq(inf_sign),
        ]

        regs = {"sign": s1_sign, "exp": s1_exp, "big": s1_big, "small": s1_small, "diff": s1_diff, "sub": s1_sub,
                "zero_sign": s1_zero_sign, "special": s1_special, "invalid": s1_invalid, "inf_sign": s1_inf_sign}
        if not self.deep:
            # The smaller significand's trailing zeros and whether it is nonzero, for stage 2's sticky
            # bit (timing: a compare with the shift there instead of an OR over the shifted-out bits).
            # Counted for both operands beside the magnitude compare and selected with the swap.
            a_nz, a_tz = _trailing_zeros(a_sig)
            b_nz, b_tz = _trailing_zeros(b_sig)
            s1_small_nz = Signal(name="s1_small_nz")
            s1_small_tz = Signal(len(a_tz), name="s1_small_tz")
            m.d.sync += [s1_small_nz.eq(Mux(a_ge_b, b_nz, a_nz)), s1_small_tz.eq(Mux(a_ge_b, b_tz, a_tz))]
            regs.update(small_nz=s1_small_nz, small_tz=s1_small_tz)
        return regs

    def elaborate(self, platform):
        m = Module()
        E, F = self.exp_bits, self.frac_bits
        SIG = F + 1 + _EXTRA                      # aligned significand: hidden + fraction + G/R/S
        SUMW = SIG + 1                            # with the carry
        LZW = 1 << (SUMW - 1).bit_length()        # leading-zero counter width (power of two) ...
        if LZW == SUMW:
            LZW *= 2                              # ... with room for at least one padding bit
        LZB = (LZW - 1).bit_length()              # bits of the count
        SHB = SIG.bit_length()                    # bits of the clamped alignment shift

        # ------------------------------------------------------------------------------------
        # Stage 1: unpack, classify, compare magnitudes, swap, exponent difference.
        # ------------------------------------------------------------------------------------
        s1 = self._stage1(m)
        if self.deep:
            self._elaborate_deep(m, s1)
            # Every register updates only on edges with en = 1 (a stall freezes the pipe).
            return EnableInserter(self.en)(m)
        s1_sign, s1_exp, s1_big, s1_small, s1_diff = (s1[k] for k in ("sign", "exp", "big", "small", "diff"))
        s1_sub, s1_zero_sign, s1_special, s1_invalid, s1_inf_sign = (
            s1[k] for k in ("sub", "zero_sign", "special", "invalid", "inf_sign"))

        # ------------------------------------------------------------------------------------
        # Stage 2: align the smaller significand, folding shifted-out bits into the sticky bit.
        # ------------------------------------------------------------------------------------
        # A shift of SIG or more moves every bit into the sticky bit. So does a shift by d mod 2^SHB
        # for any d from SIG to 2^SHB - 1 (2^SHB > SIG), so the shifter takes the difference's low SHB
        # bits as they are and only a difference of 2^SHB or more (``far``: its high bits) is told
        # apart, with no clamp (compare and select) in front of the shifter (timing).
        shift = Signal(SHB, name="s2_align_shift")
        m.d.comb += shift.eq(s1_diff[:SHB])
        far = s1_diff[SHB:].any() if E > SHB else Const(0, 1)
        small_ext = Cat(Const(0, _EXTRA), s1_small)                 # 27 bits, G/R/S zero
        aligned = Mux(far, 0, (small_ext >> shift)[:SIG])
        # Bit i of small_ext is lost iff i < shift (or ``far``): some bit is lost iff the smaller
        # significand is nonzero and its lowest set bit, at _EXTRA + its trailing zeros in small_ext,
        # is below the shift (timing: a compare of two registered counts, counted in stage 1, where an
        # AND-OR over the shifted-out bits was the stage's deepest logic).
        sticky = s1["small_nz"] & (far | (s1["small_tz"] + _EXTRA < shift))

        s2_big = Signal(SIG, name="s2_big")
        s2_small = Signal(SIG, name="s2_small")
        m.d.sync += [
            s2_big.eq(Cat(Const(0, _EXTRA), s1_big)),
            s2_small.eq(Cat(aligned[0] | sticky, aligned[1:])),
        ]

        # ------------------------------------------------------------------------------------
        # Stage 3: add or subtract significands. The larger operand is first, so the
        # difference is never negative and no two's-complement fix-up is needed.
        # ------------------------------------------------------------------------------------
        s2_sub = Signal(name="s2_sub")
        s3_sum = Signal(SUMW, name="s3_sum")
        m.d.sync += s3_sum.eq(Mux(s2_sub, s2_big - s2_small, s2_big + s2_small)[:SUMW])

        # ------------------------------------------------------------------------------------
        # Stage 4: leading-zero count of the sum; sign of an exact zero.
        # ------------------------------------------------------------------------------------
        # Pad the 28-bit sum to 32 bits with 0b1000 below it: the counter then never sees all
        # zeros, and a zero sum counts as 28 leading zeros.
        lz = _leading_zeros(Cat(Const(1 << (LZW - SUMW - 1), LZW - SUMW), s3_sum))
        s3_sign = Signal(name="s3_sign")
        s3_zero_sign = Signal(name="s3_zero_sign")
        s4_sum = Signal(SUMW, name="s4_sum")
        s4_lz = Signal(LZB, name="s4_lz")
        s4_sign = Signal(name="s4_sign")
        # Reset as if the sum were zero, so the pipeline fills with +0 rather than junk.
        s4_zero = Signal(name="s4_zero", init=1)
        sum_zero = s3_sum == 0
        m.d.sync += [
            s4_sum.eq(s3_sum),
            s4_lz.eq(lz),
            s4_zero.eq(sum_zero),
            s4_sign.eq(Mux(sum_zero, s3_zero_sign, s3_sign)),
        ]

        # ------------------------------------------------------------------------------------
        # Stage 5: normalise. The sum's bit 27 has effective exponent e + 1 (e = s4_exp), so
        # shifting the leading one up to bit 27 gives exponent field e + 1 - lz. If that would
        # be below 1 the result is subnormal: shift only by e (so the scale is that of
        # exponent 1), leave the hidden bit 0 and use exponent field 0. A zero sum shifts to
        # zero whatever the amount; it only needs its exponent field forced to 0 as well.
        # ------------------------------------------------------------------------------------
        s4_exp = Signal(E, name="s4_exp")
        # Subnormal: lz > e, i.e. the sum's top e + 1 bits are all zero. Tested as that in stage 4, beside
        # the leading-zero count, against a mask of those bits decoded from the exponent a stage earlier,
        # and registered (timing: a compare of lz with e after the count mapped as a ripple of LUTs, the
        # bf16 lanes' ninth level in the P = 4 engine; the test in this stage, ten). A zero sum may read
        # subnormal where lz = SUMW <= e; it is forced to +-0 with exponent field 0 either way.
        s3_mask = Signal(SUMW, name="s3_mask")   # (loaded from s2_exp below)
        subnormal = Signal(name="s4_subnormal")
        m.d.sync += subnormal.eq(~(s3_sum & s3_mask).any())
        # Shifted both ways side by side and the right one picked by that test (s4_exp < lz <= 28
        # when subnormal), rather than shifted by the picked amount (timing: the test and the amount's
        # select were in series with the shifter; one more shifter per lane).
        by_lz = (s4_sum << s4_lz)[:SUMW]
        by_exp = (s4_sum << s4_exp[:LZB])[:SUMW]
        normalised = Mux(subnormal, by_exp, by_lz)
        s5_sig = Signal(F + 1, name="s5_sig")               # hidden bit + fraction
        s5_low = Signal(4, name="s5_low")                # round bit and three sticky bits
        s5_exp = Signal(E, name="s5_exp")                # exponent field before rounding, 0..255
        m.d.sync += [
            s5_sig.eq(normalised[4:]),
            s5_low.eq(normalised[:4]),
            s5_exp.eq(Mux(subnormal | s4_zero, 0, (s4_exp + 1 - s4_lz)[:E])),
        ]

        # ------------------------------------------------------------------------------------
        # Stage 6: round to nearest, ties to even (§4.3.1), handle overflow and specials, pack.
        # ------------------------------------------------------------------------------------
        s5_sign = Signal(name="s5_sign")
        s5_special = Signal(name="s5_special")
        s5_invalid = Signal(name="s5_invalid")
        s5_inf_sign = Signal(name="s5_inf_sign")
        self._round_pack(m, s5_sig, s5_low, s5_exp,
                         {"sign": s5_sign, "special": s5_special, "invalid": s5_invalid, "inf_sign": s5_inf_sign})

        # ------------------------------------------------------------------------------------
        # Values that only travel along the pipeline to the stage that needs them.
        # ------------------------------------------------------------------------------------
        s2_exp, s3_exp = Signal(E, name="s2_exp"), Signal(E, name="s3_exp")
        s2_sign, s2_zero_sign = Signal(name="s2_sign"), Signal(name="s2_zero_sign")
        s2_special, s3_special, s4_special = (Signal(name=f"s{i}_special") for i in (2, 3, 4))
        s2_invalid, s3_invalid, s4_invalid = (Signal(name=f"s{i}_invalid") for i in (2, 3, 4))
        s2_inf_sign, s3_inf_sign, s4_inf_sign = (Signal(name=f"s{i}_inf_sign") for i in (2, 3, 4))
        m.d.sync += s3_mask.eq(Cat(*(s2_exp >= SUMW - 1 - pos for pos in range(SUMW))))
        m.d.sync += [
            s2_sub.eq(s1_sub),
            s2_exp.eq(s1_exp), s3_exp.eq(s2_exp), s4_exp.eq(s3_exp),
            s2_sign.eq(s1_sign), s3_sign.eq(s2_sign), s5_sign.eq(s4_sign),
            s2_zero_sign.eq(s1_zero_sign), s3_zero_sign.eq(s2_zero_sign),
            s2_special.eq(s1_special), s3_special.eq(s2_special),
            s4_special.eq(s3_special), s5_special.eq(s4_special),
            s2_invalid.eq(s1_invalid), s3_invalid.eq(s2_invalid),
            s4_invalid.eq(s3_invalid), s5_invalid.eq(s4_invalid),
            s2_inf_sign.eq(s1_inf_sign), s3_inf_sign.eq(s2_inf_sign),
            s4_inf_sign.eq(s3_inf_sign), s5_inf_sign.eq(s4_inf_sign),
        ]

        # Every register above updates only on edges with en = 1 (a stall freezes the pipe).
        return EnableInserter(self.en)(m)

    def _round_pack(self, m, sig, low, exp, flags):
        """The last stage (both depths): round to nearest, ties to even (§4.3.1), overflow and special
        values, pack into ``self.s``. ``sig`` is hidden bit + fraction (F + 1 bits), ``low`` the round
        bit above three sticky bits, ``exp`` the exponent field before rounding, ``flags`` the
        registered ``sign``, ``special``, ``invalid`` and ``inf_sign``."""
        E, F = self.exp_bits, self.frac_bits
        W = self.width
        EXP_MAX = (1 << E) - 1
        POS_INF = EXP_MAX << F
        CANON = self.canonical_nan
        round_bit = low[3]
        sticky_bit = low[:3] != 0
        round_up = round_bit & (sticky_bit | sig[0])
        # Exponent field above fraction: an increment that carries out of the fraction bumps
        # the exponent, which is exactly right both for 1.11..1 -> 10.0 (renormalise) and for
        # the largest subnormal -> smallest normal. Rounding 254/1.11..1 up lands on 255/0 = Inf.
        packed = Cat(sig[:F], exp)
        rounded = (packed + round_up)[:W - 1]
        # Exponent field 255 before rounding: the carry of an addition already overflowed
        # (§7.4: roundTiesToEven carries all overflows to Inf).
        overflow = exp == EXP_MAX
        m.d.sync += self.s.eq(
            Mux(flags["special"],
                Mux(flags["invalid"], CANON, Cat(Const(POS_INF, W - 1), flags["inf_sign"])),
                Mux(overflow, Cat(Const(POS_INF, W - 1), flags["sign"]), Cat(rounded, flags["sign"]))))

    def _elaborate_deep(self, m, s1):
        """The seven-stage pipeline (``deep=True``); ``s1`` holds stage 1's registers (shared with the
        six-stage one). Every stage ends in a register; stages 2-6 are split so that no path is more than
        five LUT levels (yosys estimate, xcup; class docstring)."""
        E, F = self.exp_bits, self.frac_bits
        SIG = F + 1 + _EXTRA                      # aligned significand: hidden + fraction + G/R/S
        SUMW = SIG + 1                            # with the carry
        SHB = SIG.bit_length()                    # bits of a shift that can still leave a bit in place
        GROUPS = -(-SUMW // 4)                    # leading zeros are counted in groups of four bits
        PAD = 4 * GROUPS - SUMW                   # zero bits below the sum to fill the last group

        # ------------------------------------------------------------------------------------
        # Stage 2: align, first half. The shift amount is the exponent difference d; its two low
        # bits shift here, by 0 … 3, which only drops the three zero bits below the significand
        # (G/R/S), so nothing is lost yet. A difference of 2^SHB or more (``far``) shifts every bit
        # out, which a shift by d mod 2^SHB ≥ SIG would too, so the rest of d is SHB − 2 bits.
        # ------------------------------------------------------------------------------------
        small_ext = Cat(Const(0, _EXTRA), s1["small"])
        d = Cat(s1["diff"], Const(0, SHB))         # zero-extended: SHB may exceed the exponent's bits
        part = (small_ext >> d[:2])[:SIG]
        BLOCKS = -(-SIG // 4)
        s2_part = Signal(SIG, name="s2_part")
        s2_hi = Signal(SHB - 2, name="s2_hi")     # d // 4 (mod 2^(SHB - 2))
        s2_far = Signal(name="s2_far")
        s2_big = Signal(SIG, name="s2_big")
        # For the sticky bit: whether block k (bits 4k … 4k + 3) of the partly shifted significand
        # holds a one. Stage 3 shifts whole blocks out.
        s2_any = Signal(BLOCKS, name="s2_any")
        m.d.sync += [
            s2_part.eq(part),
            s2_hi.eq(d[2:SHB]),
            s2_far.eq(d[SHB:] != 0),
            s2_big.eq(Cat(Const(0, _EXTRA), s1["big"])),
            s2_any.eq(Cat(*(part[4 * k:4 * k + 4] != 0 for k in range(BLOCKS)))),
        ]

        # ------------------------------------------------------------------------------------
        # Stage 3: align, second half: shift by 4·(d // 4), or out entirely when far; the blocks
        # shifted out (k < d // 4, or all when far) go into the sticky bit. In parallel, the
        # normalisation's stop mask from the exponent (stage 5).
        # ------------------------------------------------------------------------------------
        shifted = s2_part
        for i in reversed(range(len(s2_hi))):     # the widest step first
            shifted = Mux(s2_hi[i], shifted >> (4 << i), shifted)
        aligned = Mux(s2_far, 0, shifted[:SIG])
        sticky = (s2_any & Cat(*(s2_far | (s2_hi > k) for k in range(BLOCKS)))) != 0
        s2_exp = Signal(E, name="s2_exp")
        s3_big = Signal(SIG, name="s3_big")
        s3_small = Signal(SIG, name="s3_small")
        # Stop mask: a one at bit SUMW − 1 − e of the sum (e = the larger operand's effective
        # exponent), where the leading one of a result of exponent field 1 sits. Counting the
        # leading zeros of sum | mask gives min(lz(sum), e): the shift that normalises the sum, or
        # for a result below the normal range (lz > e) makes it subnormal (shift by e only).
        s3_mask = Signal(SUMW, name="s3_mask")
        m.d.sync += [
            s3_big.eq(s2_big),
            s3_small.eq(Cat(aligned[0] | sticky, aligned[1:])),
            s3_mask.eq(Cat(*(s2_exp == SUMW - 1 - p for p in range(SUMW)))),
        ]

        # ------------------------------------------------------------------------------------
        # Stage 4: add or subtract (the larger operand is first: never negative), as one adder:
        # big + ~small + 1 modulo 2^SUMW is big − small. The count's input sum | mask with it.
        # ------------------------------------------------------------------------------------
        s3_sub = Signal(name="s3_sub")
        inv = Cat(*(s3_sub for _ in range(SUMW)))
        total = (s3_big + (s3_small ^ inv) + s3_sub)[:SUMW]
        # The count's input is sum | mask, in groups of four bits from the top (g = 0 the top group;
        # zero bits below the sum fill the last one). Per group, registered with the sum: whether it
        # holds a one, and its leading zeros (0 … 3, for a group that holds one).
        val = Cat(Const(0, PAD), total | s3_mask)
        top = 4 * GROUPS
        groups = [val[top - 4 * (g + 1):top - 4 * g] for g in range(GROUPS)]
        s4_sum = Signal(SUMW, name="s4_sum")
        s4_nz = Signal(GROUPS, name="s4_nz")
        s4_f = [Signal(2, name=f"s4_f{g}") for g in range(GROUPS)]
        m.d.sync += [s4_sum.eq(total), s4_nz.eq(Cat(*(grp != 0 for grp in groups)))]
        m.d.sync += [f.eq(Mux(grp[3], 0, Mux(grp[2], 1, Mux(grp[1], 2, 3)))) for f, grp in zip(s4_f, groups)]

        # ------------------------------------------------------------------------------------
        # Stage 5: leading zeros of sum | mask, first half: c = leading all-zero groups (0 …
        # GROUPS; a balanced counter over the group flags); shift the sum left by 4c, and take the
        # leading zeros f of the first non-zero group. Sign of an exact zero.
        # ------------------------------------------------------------------------------------
        summ = Cat(Const(0, PAD), s4_sum)
        CW = 1 << GROUPS.bit_length()             # flags padded with a one below, to a power of two
        flags = Cat(Const(1 << (CW - GROUPS - 1), CW - GROUPS), *reversed([s4_nz[g] for g in range(GROUPS)]))
        c = _leading_zeros(flags)                 # GROUPS when every group is zero
        CB = len(c)
        # Shift by 4c one bit of c at a time, the widest step first: the low bits of c take longer
        # to count (they depend on more groups), so they select last.
        shifted = summ
        for i in reversed(range(CB)):
            shifted = Mux(c[i], shifted << (4 << i), shifted)
        # f of the first group that holds a one, as an AND-OR over the groups (flat, not through c).
        fine = Const(0, 2)
        for g in range(GROUPS):
            first = s4_nz[g] & ~s4_nz[:g].any() if g else s4_nz[0]
            fine = fine | Mux(first, s4_f[g], 0)
        s4_sign, s4_zero_sign = Signal(name="s4_sign"), Signal(name="s4_zero_sign")
        s5_sum = Signal(4 * GROUPS, name="s5_sum")
        s5_lz = Signal(CB + 2, name="s5_lz")        # 4c (+ f in stage 6)
        s5_f = Signal(2, name="s5_f")
        s5_sign = Signal(name="s5_sign")
        sum_zero = s4_sum == 0
        m.d.sync += [
            s5_sum.eq(shifted[:top]),
            s5_lz.eq(Cat(Const(0, 2), c)),
            s5_f.eq(fine),
            s5_sign.eq(Mux(sum_zero, s4_zero_sign, s4_sign)),
        ]

        # ------------------------------------------------------------------------------------
        # Stage 6: leading zeros, second half: shift by f. The bit that lands at the top (bit
        # SUMW − 1 of the sum) is the result's hidden bit: 1 when normalised, 0 when subnormal or
        # zero (then the exponent field is 0); else the field is e + 1 − (4c + f).
        # ------------------------------------------------------------------------------------
        normalised = (s5_sum << s5_f)[PAD:top]
        hidden = normalised[SUMW - 1]
        s5_exp = Signal(E, name="s5_exp")
        s6_sig = Signal(F + 1, name="s6_sig")
        s6_low = Signal(4, name="s6_low")
        s6_exp = Signal(E, name="s6_exp")
        m.d.sync += [
            s6_sig.eq(normalised[4:]),
            s6_low.eq(normalised[:4]),
            s6_exp.eq(Mux(hidden, (s5_exp + 1 - (s5_lz | s5_f))[:E], 0)),
        ]

        # Stage 7: round, pack, specials (as the six-stage pipeline's last stage).
        s6 = {k: Signal(name=f"s6_{k}") for k in ("sign", "special", "invalid", "inf_sign")}
        self._round_pack(m, s6_sig, s6_low, s6_exp, s6)

        # Values that only travel along the pipeline to the stage that needs them: each from stage 1
        # to its last stage, through the named registers where a stage reads them.
        named = {"sub": {3: s3_sub}, "exp": {2: s2_exp, 5: s5_exp}, "sign": {4: s4_sign},
                 "zero_sign": {4: s4_zero_sign}, "special": {6: s6["special"]}, "invalid": {6: s6["invalid"]},
                 "inf_sign": {6: s6["inf_sign"]}}
        for key, at in named.items():
            v = s1[key]
            for k in range(2, max(at) + 1):
                nxt = at.get(k, None)
                if nxt is None:
                    nxt = Signal.like(v, name=f"s{k}_{key}")
                m.d.sync += nxt.eq(v)
                v = nxt
        m.d.sync += s6["sign"].eq(s5_sign)     # the sign after stage 5's zero decision


class FP32Adder(FloatAdder):
    """Fully pipelined IEEE 754 binary32 adder, ``s = a + b``: :class:`FloatAdder` (8, 23).

    Computes the correctly rounded sum in roundTiesToEven (IEEE 754-2008 §4.3.1). Subnormal
    operands and results are handled exactly (no flush to zero). An exact zero result is +0
    unless both operands are -0 (IEEE 754-2008 §6.3). A sum whose magnitude rounds beyond the
    largest finite number becomes ±Inf (IEEE 754-2008 §7.4). ``Inf + Inf`` of equal sign is
    that Inf; ``Inf + (-Inf)`` and any NaN operand (quiet or signalling) give
    :data:`CANONICAL_NAN`.

    The adder accepts one pair of operands per enabled clock edge and produces their sum
    :attr:`latency` enabled edges later: 6 (:attr:`LATENCY`), or 7 with ``deep`` (the 512-bit
    datapath's pipeline, ≤ 5 LUT levels at 322.27 MHz on xcup: :class:`FloatAdder`). ``en`` is a
    clock enable for the whole pipeline: on an
    edge where ``en`` is 0 no register changes, so stalling freezes the operands in flight and
    the output.

    Parameters
    ----------
    deep : bool
        The seven-stage pipeline (:class:`FloatAdder`); default False.

    Attributes
    ----------
    LATENCY : int
        Number of enabled clock edges (``en`` = 1) from ``a``/``b`` to ``s`` of the default depth;
        class constant.
    latency : int
        This instance's (6, or 7 with ``deep``).
    a : Signal(32), in
        First operand, binary32 bit pattern.
    b : Signal(32), in
        Second operand, binary32 bit pattern.
    en : Signal(1), in
        Clock enable of every pipeline register.
    s : Signal(32), out
        Sum of the operands presented ``latency`` enabled edges earlier. Driven straight from
        the last pipeline register. Resets to 0 (+0.0).

    Raises
    ------
    TypeError
        ``deep`` not a bool.
    """

    def __init__(self, deep: bool = False):
        super().__init__(8, 23, deep)


class AdderLanes(wiring.Component):
    """``lanes`` independent :class:`FP32Adder` side by side, for a wide datapath.

    Lane ``i`` adds bits ``[32*i, 32*i + 32)`` of ``a`` and ``b`` into the same bits of ``s``.
    All lanes share one clock enable, so they stay in lock step. Arithmetic is that of
    :class:`FP32Adder`: roundTiesToEven (IEEE 754-2008 §4.3.1), zero signs per §6.3, overflow
    to ±Inf per §7.4, subnormals kept.

    Parameters
    ----------
    lanes : int
        Number of fp32 lanes, at least 1.
    deep : bool
        Build the seven-stage adders (:class:`FloatAdder` ``deep``); default False (six stages).

    Attributes
    ----------
    LATENCY : int
        Enabled clock edges from ``a``/``b`` to ``s`` of the default depth, equal to
        :attr:`FP32Adder.LATENCY` (6); class constant.
    latency : int
        This instance's: 6, or 7 with ``deep``.
    deep : bool
        As given.
    lanes : int
        Number of lanes.
    a : Signal(32 * lanes), in
        First operands, lane ``i`` in bits ``[32*i, 32*i + 32)``.
    b : Signal(32 * lanes), in
        Second operands, same layout.
    en : Signal(1), in
        Clock enable of every lane's pipeline.
    s : Signal(32 * lanes), out
        Sums, same layout, registered.

    Raises
    ------
    TypeError
        If ``lanes`` is not an integer (``bool`` is rejected too), or ``deep`` not a bool.
    ValueError
        If ``lanes`` is less than 1.
    """

    LATENCY = FP32Adder.LATENCY

    def __init__(self, lanes, deep: bool = False):
        if isinstance(lanes, bool) or not isinstance(lanes, int):
            reject(self, TypeError(f"lanes must be an int, not {lanes!r}"))
        if lanes < 1:
            reject(self, ValueError(f"lanes must be at least 1, not {lanes}"))
        self.lanes = lanes
        self.deep = _check_deep(self, deep)
        self.latency = latency(deep)
        super().__init__({
            "a": In(32 * lanes),
            "b": In(32 * lanes),
            "en": In(1),
            "s": Out(32 * lanes),
        })

    def elaborate(self, platform):
        m = Module()
        for i in range(self.lanes):
            adder = m.submodules[f"lane{i}"] = FP32Adder(self.deep)
            bits = slice(32 * i, 32 * i + 32)
            m.d.comb += [
                adder.a.eq(self.a[bits]),
                adder.b.eq(self.b[bits]),
                adder.en.eq(self.en),
                self.s[bits].eq(adder.s),
            ]
        return m
