# amaranth: UnusedElaboratable=no
"""Tests of the multi-format reduce lanes (``wirereduce.hdl.arith.lanes``) and their golden model
(``wirereduce.formats``).

Two independent references: the golden model (numpy / ml_dtypes, what every system test compares
against) is itself checked against exact rational arithmetic (``fractions.Fraction``, rounded to
nearest-even by hand here), and the gateware is checked against the golden model bit for bit.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from amaranth.back import rtlil
from amaranth.hdl import Fragment
from amaranth_harness import stream_operands
from wirereduce.hdl.arith.fp32 import FloatAdder
from wirereduce.hdl.arith.lanes import ReduceLanes

from wirereduce.formats import (
    CANONICAL_NAN,
    FORMATS,
    Op,
    combine,
    combine_words,
    dtype_byte,
    from_words,
    parse_dtype_byte,
    to_words,
)
from wirereduce.protocol import ProtocolError

# ------------------------------------------------------------------------------------------------
# An exact reference: decode to a Fraction, add exactly, round to nearest-even by hand.
# ------------------------------------------------------------------------------------------------


def exact_value(bits: int, f):
    """The value of a float bit pattern as a Fraction; None for Inf and NaN."""
    e = (bits >> f.frac_bits) & ((1 << f.exp_bits) - 1)
    m = bits & ((1 << f.frac_bits) - 1)
    sign = -1 if bits >> (f.bits - 1) else 1
    bias = (1 << (f.exp_bits - 1)) - 1
    if e == (1 << f.exp_bits) - 1:
        return None
    if e == 0:
        return sign * Fraction(m, 1 << f.frac_bits) * Fraction(2) ** (1 - bias)
    return sign * (1 + Fraction(m, 1 << f.frac_bits)) * Fraction(2) ** (e - bias)


def exact_round(x: Fraction, f, zero_negative: bool) -> int:
    """Bits of ``x`` rounded to nearest-even in format ``f`` (overflow to Inf)."""
    if x == 0:
        return (1 << (f.bits - 1)) if zero_negative else 0
    neg, x = x < 0, abs(x)
    bias = (1 << (f.exp_bits - 1)) - 1
    emin = 1 - bias
    e = emin
    while x >= Fraction(2) ** (e + 1):
        e += 1
    q = x / Fraction(2) ** (e - f.frac_bits)
    n, r = q.numerator // q.denominator, q - q.numerator // q.denominator
    if r > Fraction(1, 2) or (r == Fraction(1, 2) and n % 2):
        n += 1
    if x < Fraction(2) ** emin:                      # subnormal (n may round up to the smallest normal)
        bits = n
    else:
        if n == 1 << (f.frac_bits + 1):
            n, e = n >> 1, e + 1
        biased = e + bias
        if biased >= (1 << f.exp_bits) - 1:
            bits = ((1 << f.exp_bits) - 1) << f.frac_bits
        else:
            bits = biased << f.frac_bits | (n & ((1 << f.frac_bits) - 1))
    return bits | ((1 << (f.bits - 1)) if neg else 0)


def special_patterns16(f) -> np.ndarray:
    """Every special class of a 16-bit format, and ties/near-ties at several exponents."""
    E, F = f.exp_bits, f.frac_bits
    exp_all = (1 << E) - 1
    out = []
    for s in (0, 1 << 15):
        out += [s, s | 1, s | 2, s | ((1 << F) - 1), s | (1 << F), s | (1 << F) | 1,   # 0, subnormals, min normal
                s | ((exp_all - 1) << F | ((1 << F) - 1)), s | ((exp_all - 1) << F),  # max finite, its binade
                s | (exp_all << F),                                                     # Inf
                s | (exp_all << F) | 1, s | (exp_all << F) | (1 << (F - 1)),            # sNaN, qNaN
                s | ((1 << (E - 1)) - 1) << F, s | ((1 << (E - 1)) - 1) << F | 1]        # 1.0, 1 + ulp
        for g in range(1, F + 3):                                                        # exponent gaps: ties
            out.append(s | max(1, (((1 << (E - 1)) - 1 - g) << F) if (1 << (E - 1)) - 1 - g > 0 else 1))
    return np.array(sorted(set(out)), dtype=np.uint16)


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_golden_sum_is_the_exactly_rounded_sum(name):
    f = FORMATS[name]
    rng = np.random.default_rng(7)
    sp = special_patterns16(f)
    a = np.concatenate([np.repeat(sp, sp.size), rng.integers(0, 1 << 16, 6000).astype(np.uint16)])
    b = np.concatenate([np.tile(sp, sp.size), rng.integers(0, 1 << 16, 6000).astype(np.uint16)])
    # operands of close magnitude: cancellation and ties
    b[-3000:] = a[-3000:] ^ rng.integers(0, 1 << (f.frac_bits + 2), 3000).astype(np.uint16) ^ np.uint16(0x8000)
    got = combine(a.view(f.numpy_dtype), b.view(f.numpy_dtype), f).view(np.uint16)
    wrong = []
    for x, y, g in zip(a.tolist(), b.tolist(), got.tolist()):
        vx, vy = exact_value(x, f), exact_value(y, f)
        if vx is None or vy is None:
            continue   # specials: checked by test_golden_specials
        want = exact_round(vx + vy, f, bool(x >> 15) and bool(y >> 15))
        if want != g:
            wrong.append((hex(x), hex(y), hex(g), hex(want)))
    assert not wrong, wrong[:10]


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16"])
def test_golden_specials(name):
    f = FORMATS[name]
    dt, u = f.numpy_dtype, f.uint
    inf = np.array([np.inf, -np.inf, np.nan, 1.0, -0.0, 0.0], dtype=np.float32).astype(dt)
    r = combine(inf[[0, 0, 2, 3, 4, 4]], inf[[1, 0, 3, 2, 4, 5]], f).view(u)
    nan = CANONICAL_NAN[name]
    assert r[0] == nan and r[2] == nan and r[3] == nan                # Inf − Inf, NaN + x, x + NaN
    assert r[1] == inf[0:1].view(u)[0]                                # Inf + Inf
    assert r[4] == inf[4:5].view(u)[0] and r[5] == 0                 # −0 + −0 = −0; −0 + +0 = +0
    mx = combine(inf[[4, 5, 2, 1]], inf[[5, 4, 3, 3]], f, Op.MAX).view(u)
    mn = combine(inf[[4, 5, 2, 1]], inf[[5, 4, 3, 3]], f, Op.MIN).view(u)
    assert mx[0] == 0 and mx[1] == 0 and mx[2] == nan and mx[3] == inf[3:4].view(u)[0]
    assert mn[0] == inf[4:5].view(u)[0] and mn[1] == inf[4:5].view(u)[0] and mn[2] == nan
    assert mn[3] == inf[1:2].view(u)[0]


def test_golden_int32_wraps_and_compares_signed():
    a = np.array([2**31 - 1, -(2**31), -1, 5], np.int32)
    b = np.array([1, -1, 1, -7], np.int32)
    assert combine(a, b, "int32").tolist() == [-(2**31), 2**31 - 1, 0, -2]
    assert combine(a, b, "int32", Op.MAX).tolist() == [2**31 - 1, -1, 1, 5]
    assert combine(a, b, "int32", Op.MIN).tolist() == [1, -(2**31), -1, -7]


def test_words_round_trip_and_padding():
    import ml_dtypes

    x = np.arange(5, dtype=np.float32).astype(ml_dtypes.bfloat16)
    w = to_words(x)
    assert w.dtype == np.uint32 and w.size == 3 and (w[2] >> 16) == 0        # odd tail padded with +0
    assert from_words(w, "bf16", 5).view(np.uint16).tolist() == x.view(np.uint16).tolist()
    assert (w[0] & 0xFFFF) == x[:1].view(np.uint16)[0]                        # element 0 in the low half
    h = np.array([1.5, -2.0], np.float16)
    assert to_words(h).tolist() == [int(h.view(np.uint16)[0]) | int(h.view(np.uint16)[1]) << 16]


def test_dtype_byte():
    assert dtype_byte("fp32") == 1
    assert dtype_byte("bf16", "max") == 0x12
    assert parse_dtype_byte(0x24) == (FORMATS["int32"], Op.MIN)
    for bad in (0, 5, 0x31, 0xF1):
        with pytest.raises(ProtocolError):
            parse_dtype_byte(bad)
    with pytest.raises(ValueError, match="sum, max or min"):
        dtype_byte("fp32", "prod")


# ------------------------------------------------------------------------------------------------
# Gateware
# ------------------------------------------------------------------------------------------------


def run_lanes(mode: int, a: np.ndarray, b: np.ndarray, lanes: int = 2, en_prob: float = 1.0, seed: int = 0,
              formats: tuple[str, ...] = tuple(FORMATS), deep: bool = False):
    """Stream word rows through ReduceLanes(lanes, formats, deep) with ``mode`` (stalls, junk on stalled
    clocks: :func:`amaranth_harness.stream_operands`); returns the result words, flat."""
    async def set_mode(ctx):
        ctx.set(dut.mode, mode)
        await ctx.tick()
        await ctx.tick()

    dut = ReduceLanes(lanes, formats, deep=deep)
    got, _ = stream_operands(dut, a, b, lanes=lanes, en_prob=en_prob, seed=seed, setup=set_mode)
    return got.astype(np.uint32).reshape(-1)


def operands(name: str, rng, n: int):
    """Word operands for format ``name``: specials crossed, random patterns, close magnitudes."""
    f = FORMATS[name]
    if f.bits == 16:
        sp = special_patterns16(f)
        x = np.concatenate([np.repeat(sp, sp.size), rng.integers(0, 1 << 16, 2 * n).astype(np.uint16)])
        y = np.concatenate([np.tile(sp, sp.size), rng.integers(0, 1 << 16, 2 * n).astype(np.uint16)])
        y[-n:] = x[-n:] ^ rng.integers(0, 1 << (f.frac_bits + 2), n).astype(np.uint16) ^ np.uint16(0x8000)
        if x.size % 2:
            x, y = x[:-1], y[:-1]
        return to_words(x.view(f.numpy_dtype)), to_words(y.view(f.numpy_dtype))
    if name == "int32":
        edge = np.array([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0x80000001], np.uint32)
    else:
        edge = np.array([0, 0x80000000, 1, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000,
                         0xFF800000, 0x7FC00000, 0xFF800001, 0x3F800000, 0xBF800001, 0x33800000], np.uint32)
    x = np.concatenate([np.repeat(edge, edge.size), rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)])
    y = np.concatenate([np.tile(edge, edge.size), rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)])
    return x, y


@pytest.mark.parametrize("deep", [False, True], ids=["shallow", "deep"])
@pytest.mark.parametrize("op", list(Op), ids=lambda o: o.name)
@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16", "int32"])
def test_lanes_match_golden(name, op, deep):
    rng = np.random.default_rng(hash((name, int(op))) & 0xFFFF)
    a, b = operands(name, rng, 300)
    if a.size % 2:
        a, b = np.append(a, np.uint32(0)), np.append(b, np.uint32(0))
    got = run_lanes(dtype_byte(name, op), a, b, en_prob=0.9, seed=int(op), deep=deep)
    want = combine_words(a, b, name, op)
    bad = np.flatnonzero(got != want)
    assert not bad.size, [(hex(a[i]), hex(b[i]), hex(got[i]), hex(want[i])) for i in bad[:10]]


def even_operands(name: str, seed: int, n: int):
    """:func:`operands` of format ``name``, padded to whole rows of two lanes."""
    a, b = operands(name, np.random.default_rng(seed), n)
    if a.size % 2:
        a, b = np.append(a, np.uint32(0)), np.append(b, np.uint32(0))
    return a, b


@pytest.mark.parametrize("formats", [("fp32",), ("fp32", "bf16")], ids="+".join)
def test_fewer_formats_same_bits(formats):
    """Lanes built for some formats give, for every mode of those, the bits of the lanes built for all
    four and of the golden model (specials crossed, stalls); a mode of a format not built computes fp32
    SUM (the engine refuses such a CONTROL: tests/test_engine.py)."""
    for name in formats:
        for op in Op:
            a, b = even_operands(name, 11 + int(op), 120)
            mode = dtype_byte(name, op)
            got = run_lanes(mode, a, b, en_prob=0.9, seed=int(op), formats=formats)
            full = run_lanes(mode, a, b, en_prob=0.9, seed=int(op))
            bad = np.flatnonzero((got != full) | (got != combine_words(a, b, name, op)))
            assert not bad.size, (name, op.name, [(hex(a[i]), hex(b[i]), hex(got[i]), hex(full[i])) for i in bad[:10]])
    a, b = even_operands("fp32", 5, 40)
    for name in [n for n in FORMATS if n not in formats]:
        got = run_lanes(dtype_byte(name, "max"), a, b, formats=formats)
        assert (got == combine_words(a, b, "fp32")).all(), name


def test_fewer_formats_fewer_cells():
    """Only the built formats' adders are there (fp32 one, bf16 and fp16 two per word), and the
    design shrinks with them; a bad ``formats`` raises."""
    def float_adders(dut):
        def walk(fragment):
            yield fragment
            for sub, *_ in fragment.subfragments:
                yield from walk(sub)
        return sum(isinstance(o, FloatAdder) for f in walk(Fragment.get(dut, None)) for o in (f.origins or ()))

    sizes = {}
    for formats, per_word in [(tuple(FORMATS), 5), (("fp32", "bf16"), 3), (("fp32",), 1)]:
        dut = ReduceLanes(2, formats)
        assert dut.formats == formats
        assert float_adders(dut) == 2 * per_word
        sizes[formats] = len(rtlil.convert(dut, name="lanes"))
    assert sizes[("fp32",)] < sizes[("fp32", "bf16")] < sizes[tuple(FORMATS)], sizes
    for bad in [("bf16",), "fp32", ("fp32", "fp8")]:
        with pytest.raises((TypeError, ValueError), match="formats"):
            ReduceLanes(1, bad)


def test_unknown_mode_is_fp32_sum():
    rng = np.random.default_rng(3)
    a, b = operands("fp32", rng, 40)
    a, b = a[:40], b[:40]
    got = run_lanes(0, a, b)
    assert (got == combine_words(a, b, "fp32")).all()


def test_every_format_has_the_adders_latency():
    assert FloatAdder.LATENCY == ReduceLanes.LATENCY == 6
    assert ReduceLanes(1).latency == FloatAdder(8, 7).latency == 6
    assert ReduceLanes(1, deep=True).latency == FloatAdder(5, 10, deep=True).latency == 7
    with pytest.raises(TypeError, match="deep"):
        ReduceLanes(1, deep="yes")


@pytest.mark.parametrize("formats", [("fp32",), ("fp32", "fp16")], ids="+".join)
def test_deep_fewer_formats_same_bits(formats):
    """The deep lanes built for some formats give the golden model's bits for every mode of those."""
    for name in formats:
        for op in Op:
            a, b = even_operands(name, 21 + int(op), 60)
            got = run_lanes(dtype_byte(name, op), a, b, en_prob=0.8, seed=int(op), formats=formats, deep=True)
            bad = np.flatnonzero(got != combine_words(a, b, name, op))
            assert not bad.size, (name, op.name, [(hex(a[i]), hex(b[i]), hex(got[i])) for i in bad[:10]])


@pytest.mark.parametrize("bad", [(1, 7), (8, 1), (12, 10), (True, 7)])
def test_float_adder_parameters(bad):
    with pytest.raises(ValueError):
        FloatAdder(*bad)
