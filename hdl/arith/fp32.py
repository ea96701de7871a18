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
One result per clock (initiation interval 1), :attr:`FP32Adder.LATENCY` = 6 enabled clock edges
from operands to sum. Every stage ends in a register and is kept short (the target is at most six
LUT levels between registers on Xilinx 7-series, carry chains counted as fast wiring; this split
was designed for it but has not been checked by synthesis yet):

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
                                 that tiny results come out subnormal; compute the exponent field
 6    round / pack               roundTiesToEven increment, overflow to Inf, special values, pack
====  =========================  ====================================================================

Significand format inside the pipeline (27 bits before the add, 28 after)::

    bit 27   26   25 ......... 3    2    1    0
        C    H    fraction(23)    G    R    S

``H`` is the hidden bit (1 for normal numbers, 0 for subnormals), ``G``/``R`` are the guard and
round bits and ``S`` the sticky bit: the OR of every bit shifted out during alignment. ``C`` is the
carry out of an effective addition. Three extra low bits are enough for correct rounding: an
effective subtraction that cancels more than one leading bit only happens when the exponents
differ by at most one, and then the alignment shift lost nothing.
"""

from amaranth.hdl import Cat, Const, EnableInserter, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.params import reject

__all__ = ["CANONICAL_NAN", "FloatAdder", "FP32Adder", "AdderLanes"]

#: The NaN every invalid or NaN-input addition produces: positive, quiet, zero payload.
CANONICAL_NAN = 0x7FC0_0000

_EXTRA = 3          # guard, round, sticky below the significand


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
    :attr:`canonical_nan`). Latency :attr:`LATENCY` = 6 enabled edges for every format.

    Parameters
    ----------
    exp_bits : int
        Exponent field bits, 2 … 11.
    frac_bits : int
        Stored fraction bits, 2 … 52.

    Attributes
    ----------
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
    """

    LATENCY = 6

    def __init__(self, exp_bits: int = 8, frac_bits: int = 23):
        for name, v, lo, hi in (("exp_bits", exp_bits, 2, 11), ("frac_bits", frac_bits, 2, 52)):
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                reject(self, ValueError(f"{name} must be an int in {lo} … {hi}, not {v!r}"))
        self.exp_bits, self.frac_bits = exp_bits, frac_bits
        self.width = 1 + exp_bits + frac_bits
        super().__init__({"a": In(self.width), "b": In(self.width), "en": In(1), "s": Out(self.width)})

    @property
    def canonical_nan(self) -> int:
        """The NaN this adder produces: exponent all ones, top fraction bit set, sign 0."""
        return ((1 << self.exp_bits) - 1) << self.frac_bits | 1 << (self.frac_bits - 1)

    def elaborate(self, platform):
        m = Module()
        E, F = self.exp_bits, self.frac_bits
        W = self.width
        EXP_MAX = (1 << E) - 1
        SIG = F + 1 + _EXTRA                      # aligned significand: hidden + fraction + G/R/S
        SUMW = SIG + 1                            # with the carry
        LZW = 1 << (SUMW - 1).bit_length()        # leading-zero counter width (power of two) ...
        if LZW == SUMW:
            LZW *= 2                              # ... with room for at least one padding bit
        LZB = (LZW - 1).bit_length()              # bits of the count
        SHB = SIG.bit_length()                    # bits of the clamped alignment shift
        POS_INF = EXP_MAX << F
        CANON = self.canonical_nan

        # ------------------------------------------------------------------------------------
        # Stage 1: unpack, classify, compare magnitudes, swap, exponent difference.
        # ------------------------------------------------------------------------------------
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

        # ------------------------------------------------------------------------------------
        # Stage 2: align the smaller significand, folding shifted-out bits into the sticky bit.
        # ------------------------------------------------------------------------------------
        # A shift of SIG or more moves every bit into the sticky bit, so clamp it to SIG.
        shift = Signal(SHB, name="s2_align_shift")
        m.d.comb += shift.eq(Mux(s1_diff >= SIG, SIG, s1_diff[:SHB]))
        small_ext = Cat(Const(0, _EXTRA), s1_small)                 # 27 bits, G/R/S zero
        aligned = (small_ext >> shift)[:SIG]
        # Bit i of small_ext is lost iff i < shift. The mask is built from the shift amount
        # directly, in parallel with the shifter, rather than from the shifter's output.
        lost_mask = Cat(*(shift > i for i in range(SIG)))
        sticky = (small_ext & lost_mask) != 0

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
        subnormal = s4_lz > s4_exp
        norm_shift = Mux(subnormal, s4_exp[:LZB], s4_lz)   # s4_exp < lz <= 28 when subnormal
        normalised = (s4_sum << norm_shift)[:SUMW]
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
        round_bit = s5_low[3]
        sticky_bit = s5_low[:3] != 0
        round_up = round_bit & (sticky_bit | s5_sig[0])
        # Exponent field above fraction: an increment that carries out of the fraction bumps
        # the exponent, which is exactly right both for 1.11..1 -> 10.0 (renormalise) and for
        # the largest subnormal -> smallest normal. Rounding 254/1.11..1 up lands on 255/0 = Inf.
        packed = Cat(s5_sig[:F], s5_exp)
        rounded = (packed + round_up)[:W - 1]
        s5_sign = Signal(name="s5_sign")
        s5_special = Signal(name="s5_special")
        s5_invalid = Signal(name="s5_invalid")
        s5_inf_sign = Signal(name="s5_inf_sign")
        # Exponent field 255 before rounding: the carry of an addition already overflowed
        # (§7.4: roundTiesToEven carries all overflows to Inf).
        overflow = s5_exp == EXP_MAX
        m.d.sync += self.s.eq(
            Mux(s5_special,
                Mux(s5_invalid, CANON, Cat(Const(POS_INF, W - 1), s5_inf_sign)),
                Mux(overflow, Cat(Const(POS_INF, W - 1), s5_sign), Cat(rounded, s5_sign))))

        # ------------------------------------------------------------------------------------
        # Values that only travel along the pipeline to the stage that needs them.
        # ------------------------------------------------------------------------------------
        s2_exp, s3_exp = Signal(E, name="s2_exp"), Signal(E, name="s3_exp")
        s2_sign, s2_zero_sign = Signal(name="s2_sign"), Signal(name="s2_zero_sign")
        s2_special, s3_special, s4_special = (Signal(name=f"s{i}_special") for i in (2, 3, 4))
        s2_invalid, s3_invalid, s4_invalid = (Signal(name=f"s{i}_invalid") for i in (2, 3, 4))
        s2_inf_sign, s3_inf_sign, s4_inf_sign = (Signal(name=f"s{i}_inf_sign") for i in (2, 3, 4))
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


class FP32Adder(FloatAdder):
    """Fully pipelined IEEE 754 binary32 adder, ``s = a + b``: :class:`FloatAdder` (8, 23).

    Computes the correctly rounded sum in roundTiesToEven (IEEE 754-2008 §4.3.1). Subnormal
    operands and results are handled exactly (no flush to zero). An exact zero result is +0
    unless both operands are -0 (IEEE 754-2008 §6.3). A sum whose magnitude rounds beyond the
    largest finite number becomes ±Inf (IEEE 754-2008 §7.4). ``Inf + Inf`` of equal sign is
    that Inf; ``Inf + (-Inf)`` and any NaN operand (quiet or signalling) give
    :data:`CANONICAL_NAN`.

    The adder accepts one pair of operands per enabled clock edge and produces their sum
    :attr:`LATENCY` enabled edges later. ``en`` is a clock enable for the whole pipeline: on an
    edge where ``en`` is 0 no register changes, so stalling freezes the operands in flight and
    the output.

    Attributes
    ----------
    LATENCY : int
        Number of enabled clock edges (``en`` = 1) from ``a``/``b`` to ``s``; class constant.
    a : Signal(32), in
        First operand, binary32 bit pattern.
    b : Signal(32), in
        Second operand, binary32 bit pattern.
    en : Signal(1), in
        Clock enable of every pipeline register.
    s : Signal(32), out
        Sum of the operands presented ``LATENCY`` enabled edges earlier. Driven straight from
        the last pipeline register. Resets to 0 (+0.0).
    """

    def __init__(self):
        super().__init__(8, 23)


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

    Attributes
    ----------
    LATENCY : int
        Enabled clock edges from ``a``/``b`` to ``s``, equal to :attr:`FP32Adder.LATENCY`.
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
        If ``lanes`` is not an integer (``bool`` is rejected too).
    ValueError
        If ``lanes`` is less than 1.
    """

    LATENCY = FP32Adder.LATENCY

    def __init__(self, lanes):
        if isinstance(lanes, bool) or not isinstance(lanes, int):
            reject(self, TypeError(f"lanes must be an int, not {lanes!r}"))
        if lanes < 1:
            reject(self, ValueError(f"lanes must be at least 1, not {lanes}"))
        self.lanes = lanes
        super().__init__({
            "a": In(32 * lanes),
            "b": In(32 * lanes),
            "en": In(1),
            "s": Out(32 * lanes),
        })

    def elaborate(self, platform):
        m = Module()
        for i in range(self.lanes):
            adder = m.submodules[f"lane{i}"] = FP32Adder()
            bits = slice(32 * i, 32 * i + 32)
            m.d.comb += [
                adder.a.eq(self.a[bits]),
                adder.b.eq(self.b[bits]),
                adder.en.eq(self.en),
                self.s[bits].eq(adder.s),
            ]
        return m
