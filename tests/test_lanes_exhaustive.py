"""Exhaustive and hard-case tests of the reduce lanes (``wirereduce.hdl.arith.lanes.ReduceLanes``)
through Verilator (:mod:`wirereduce.sim.engines.lanesim`), bit for bit against the golden model
(:func:`wirereduce.formats.combine`).

* bf16: every one of the 65536 patterns as ``a`` against 256 ``b`` patterns (every special class,
  and values that give every tie pattern and deep cancellations with the 65536 ``a``), 2^24 pairs,
  SUM, MAX and MIN.
* fp16: every pattern against 32 ``b`` patterns, plus constructed ties at every exponent gap,
  subnormal results, overflow, exact cancellation; SUM, MAX, MIN.
* int32: wrap-around, signed MAX/MIN, random full range. fp32: specials crossed, close magnitudes
  and random pairs.
* The deep (seven-stage) lanes of the 512-bit datapath (``deep=True``), a model of their own: the
  same pairs against the golden model, except bf16 MAX/MIN on all ``a`` × 32 ``b`` only (a
  comparator, not the adder; keeps the added time to about a minute).

The hard cases are not only intended but counted: :func:`classify` computes every close pair's
exact sum in integers, and the tests assert that ties with an even and an odd lower neighbour occur
at every exponent gap where they can, that cancellations need every normalisation shift, and so
on. The same integer arithmetic gives the correctly rounded sum (:func:`exact_sum_bits`), which the
golden model must match on those pairs (an independent check of the golden model beyond
tests/test_lanes.py, itself checked there against ``exact_round``).
"""

from __future__ import annotations

import time
from fractions import Fraction

import numpy as np
import pytest
from test_lanes import exact_round, exact_value, special_patterns16
from wirereduce.sim.engines import lanesim
from wirereduce.sim.engines.lanesim import run_lanes

from wirereduce.formats import FORMATS, Op, combine, combine_words, dtype_byte, parse_dtype_byte

pytestmark = pytest.mark.verilator

OPS = list(Op)


@pytest.fixture(scope="module", autouse=True)
def lanes_model():
    """Build the model once (and time it apart from the runs)."""
    t0 = time.perf_counter()
    exe = lanesim.build_lanes()
    print(f"\nlanes model: {exe} ({time.perf_counter() - t0:.1f} s incl. Verilog, "
          f"{lanesim.last_build_s:.1f} s Verilator)")
    return exe


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------


def pack16(x: np.ndarray) -> np.ndarray:
    """uint16 elements (even count) to payload words, element 2i in the low half."""
    x = np.asarray(x, np.uint16)
    return x[0::2].astype(np.uint32) | (x[1::2].astype(np.uint32) << np.uint32(16))


def unpack16(w: np.ndarray) -> np.ndarray:
    out = np.empty(w.size * 2, np.uint16)
    out[0::2] = (w & 0xFFFF).astype(np.uint16)
    out[1::2] = (w >> 16).astype(np.uint16)
    return out


def assert_same(a, b, got, want, digits: int, what: str):
    """Bit-for-bit equality; the message lists the first failing (a, b, got, want) in hex."""
    bad = np.flatnonzero(got != want)
    if bad.size:
        h = lambda v: f"0x{int(v):0{digits}x}"  # noqa: E731
        rows = ", ".join(f"({h(a[i])}, {h(b[i])}, {h(got[i])}, {h(want[i])})" for i in bad[:8])
        pytest.fail(f"{what}: {bad.size} of {got.size} results differ; first (a, b, got, want): {rows}")


def check16(name: str, op: Op, a: np.ndarray, b: np.ndarray, deep: bool = False):
    """Run the element pairs (uint16) of ``name`` through the lanes (``deep``: the seven-stage ones) and
    compare with the golden model."""
    f = FORMATS[name]
    if a.size % 2:
        a, b = np.append(a, np.uint16(0)), np.append(b, np.uint16(0))
    got = unpack16(run_lanes(dtype_byte(name, op), pack16(a), pack16(b), deep=deep))
    want = combine(a.view(f.numpy_dtype), b.view(f.numpy_dtype), f, op).view(np.uint16)
    assert_same(a, b, got, want, 4, f"{name} {op.name}" + (" deep" if deep else ""))
    return a.size


def check32(name: str, op: Op, a: np.ndarray, b: np.ndarray, deep: bool = False):
    f = FORMATS[name]
    got = run_lanes(dtype_byte(name, op), a, b, deep=deep)
    want = combine(a.view(f.numpy_dtype), b.view(f.numpy_dtype), f, op).view(np.uint32)
    assert_same(a, b, got, want, 8, f"{name} {op.name}" + (" deep" if deep else ""))
    return a.size


# ------------------------------------------------------------------------------------------------
# Exact sums of 16-bit floats in integers (pairs of close exponents)
# ------------------------------------------------------------------------------------------------


def classify(a: np.ndarray, b: np.ndarray, f, max_gap: int = 24) -> dict:
    """Exact sums of the finite pairs with an exponent gap ≤ ``max_gap``, in integers.

    Returns a dict of arrays over those pairs: ``idx`` (into ``a``/``b``), ``gap`` (|ea − eb|,
    subnormals at exponent 1), ``tie`` (the exact sum lies halfway between two neighbours),
    ``odd`` (the lower neighbour, in magnitude, has an odd significand), ``shift`` (the larger
    operand's leading bit minus the sum's: > 0 a cancellation needing that many normalisation
    places, −1 a carry; absent for a zero sum), ``zero``, and ``bits``: the correctly rounded sum
    (roundTiesToEven, overflow to Inf, x + (−x) = +0, (−0) + (−0) = −0)."""
    E, F = f.exp_bits, f.frac_bits
    emax = (1 << E) - 1
    a, b = a.astype(np.int64), b.astype(np.int64)
    ea, eb = (a >> F) & emax, (b >> F) & emax
    sel = np.flatnonzero((ea != emax) & (eb != emax) & (np.abs(np.maximum(ea, 1) - np.maximum(eb, 1)) <= max_gap))
    a, b, ea, eb = a[sel], b[sel], ea[sel], eb[sel]
    ma = np.where(ea > 0, (a & ((1 << F) - 1)) | (1 << F), a & ((1 << F) - 1))
    mb = np.where(eb > 0, (b & ((1 << F) - 1)) | (1 << F), b & ((1 << F) - 1))
    ea, eb = np.maximum(ea, 1), np.maximum(eb, 1)
    e0 = np.minimum(ea, eb)                       # the sum in units of 2^(e0 − bias − F)
    xa, xb = ma << (ea - e0), mb << (eb - e0)
    sa, sb = (a >> (f.bits - 1)) & 1, (b >> (f.bits - 1)) & 1
    s = np.where(sa == 1, -xa, xa) + np.where(sb == 1, -xb, xb)
    m = np.abs(s)
    zero = m == 0
    msb = lambda v: np.frexp(np.maximum(v, 1).astype(np.float64))[1] - 1  # noqa: E731  (exact: v < 2^53)
    p = msb(m)
    shift = np.maximum(msb(xa), msb(xb)) - p
    sh = np.maximum(p - F, 0)
    q, rem = m >> sh, m & ((1 << sh) - 1)
    half = np.where(sh > 0, 1 << np.maximum(sh - 1, 0), -1)
    tie = (sh > 0) & (rem == half)
    odd = (q & 1) == 1
    up = (rem > half) & (sh > 0) | tie & odd
    q = q + up
    # bits of the rounded magnitude q · 2^sh units
    be = e0 + p - F                                # biased exponent if normal, before a carry of the rounding
    carry = q == (1 << (F + 1))
    be = be + carry
    q = np.where(carry, q >> 1, q)
    normal_bits = (be << F) | (q & ((1 << F) - 1))
    # p < F: exact; normal if e0 + p − F ≥ 1 (shift the significand up), else subnormal: m · 2^(e0 − 1)
    small_normal = (be << F) | ((m << np.maximum(F - p, 0)) & ((1 << F) - 1))
    sub_bits = m << np.maximum(e0 - 1, 0)
    mag = np.where(p >= F, normal_bits, np.where(be >= 1, small_normal, sub_bits))
    mag = np.where(be >= emax, emax << F, mag)      # overflow to Inf (p ≥ F there)
    neg = np.where(zero, (sa == 1) & (sb == 1), s < 0)
    bits = (np.where(zero, 0, mag) | (neg.astype(np.int64) << (f.bits - 1))).astype(np.uint16)
    return {"idx": sel, "gap": np.abs(ea - eb), "tie": tie, "odd": odd, "shift": np.where(zero, -99, shift),
            "zero": zero, "bits": bits}


def tie_classes(c: dict, max_gap: int) -> set:
    return {(int(g), bool(o)) for g, o in set(zip(c["gap"][c["tie"]].tolist(), c["odd"][c["tie"]].tolist()))
            if g <= max_gap}


def expected_tie_classes(f) -> set:
    """Ties exist at gaps 0 … p + 1 (p = F + 1 significand bits); at the largest gap only as
    2^e − 2^(e − p − 1), whose lower neighbour (all ones) is odd."""
    top = f.frac_bits + 2
    return {(g, o) for g in range(top) for o in (False, True)} | {(top, True)}


def test_classify_is_exact():
    """The integer reference against the Fraction one of tests/test_lanes.py."""
    rng = np.random.default_rng(11)
    for name in ("bf16", "fp16"):
        f = FORMATS[name]
        a = rng.integers(0, 1 << 16, 3000).astype(np.uint16)
        b = np.concatenate([rng.integers(0, 1 << 16, 1000),
                            a[1000:] ^ rng.integers(0, 1 << (f.frac_bits + 3), 2000)]).astype(np.uint16)
        b[1000:2000] ^= np.uint16(0x8000)
        c = classify(a, b, f)
        assert c["idx"].size > 1500
        for i, bits in zip(c["idx"].tolist(), c["bits"].tolist()):
            x, y = int(a[i]), int(b[i])
            want = exact_round(exact_value(x, f) + exact_value(y, f), f, bool(x >> 15) and bool(y >> 15))
            assert bits == want, (name, hex(x), hex(y), hex(bits), hex(want))
    assert exact_value(0x3F80, FORMATS["bf16"]) == Fraction(1)


# ------------------------------------------------------------------------------------------------
# bf16: all 65536 a × 256 b
# ------------------------------------------------------------------------------------------------


def bf16_b_sample() -> np.ndarray:
    """256 bf16 patterns: every special class (both signs), and values that with all 65536 ``a``
    make every tie pattern and cancellation (counted in :func:`test_bf16_sample_covers_the_hard_cases`)."""
    out = []
    for s in (0, 0x8000):
        out += [s | v for v in (
            0x0000, 0x0001, 0x0002, 0x0040, 0x007F,      # ±0, smallest / a mid / largest subnormal
            0x0080, 0x0081, 0x00FF,                      # smallest normal, next, its binade's top
            0x7F7F, 0x7F7E, 0x7F00,                      # largest normal, next below, its binade's bottom
            0x7F80,                                      # Inf
            0x7F81, 0x7FA5, 0x7FBF,                      # signalling NaNs with payloads
            0x7FC0, 0x7FC1, 0x7FD3, 0x7FFF,              # quiet NaNs, with payloads
            0x3F80, 0x3F81, 0x3FFF, 0x4000,              # 1.0, 1 + ulp, 2 − ulp, 2
            0x3400, 0x3C00, 0x4B00, 0x5F00)]             # powers of two (deep cancellations)
    rng = np.random.default_rng(2024)
    rest = 256 - len(out)
    # finite normals of every exponent range, odd and even significands
    fill = rng.integers(0x0080, 0x7F80, rest).astype(np.uint16) | (rng.integers(0, 2, rest) << 15).astype(np.uint16)
    sample = np.array(out + fill.tolist(), np.uint16)
    k = 0
    while np.unique(sample).size < 256:                  # replace duplicates deterministically
        sample = np.unique(sample)
        sample = np.concatenate([sample, (np.arange(256 - sample.size) * 977 + 0x3001 + k).astype(np.uint16)])
        k += 1
    return sample


@pytest.fixture(scope="module")
def bf16_pairs():
    b = bf16_b_sample()
    return np.tile(np.arange(1 << 16, dtype=np.uint16), b.size), np.repeat(b, 1 << 16)


def test_bf16_sample_covers_the_hard_cases(bf16_pairs):
    f = FORMATS["bf16"]
    a, b = bf16_pairs
    bs = bf16_b_sample()
    assert bs.size == 256 and np.unique(bs).size == 256
    for v in (0x0000, 0x8000, 0x0001, 0x807F, 0x0080, 0xFF7F, 0x7F80, 0xFF80, 0x7F81, 0xFFC1, 0x3F80, 0xBF80):
        assert v in bs, hex(v)
    c = classify(a, b, f)
    assert tie_classes(c, 12) == expected_tie_classes(f)
    assert set(range(0, f.frac_bits + 2)) <= set(c["shift"][c["shift"] >= 0].tolist())   # 0 … 8 places
    assert (c["shift"] == -1).any() and c["zero"].any()
    # The golden model is the correctly rounded sum on every one of these pairs.
    want = combine(a[c["idx"]].view(f.numpy_dtype), b[c["idx"]].view(f.numpy_dtype), f).view(np.uint16)
    assert_same(a[c["idx"]], b[c["idx"]], want, c["bits"], 4, "bf16 golden vs exact")


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_bf16_all_a_against_256_b(bf16_pairs, op):
    a, b = bf16_pairs
    assert check16("bf16", op, a, b) == 1 << 24


# ------------------------------------------------------------------------------------------------
# fp16: all a × 32 b, and constructed hard cases
# ------------------------------------------------------------------------------------------------


def fp16_hard_pairs() -> tuple[np.ndarray, np.ndarray]:
    f = FORMATS["fp16"]
    F = f.frac_bits
    rng = np.random.default_rng(16)
    # every pattern against 32 b: specials (±0, subnormal extremes, min normal, max, Inf, NaNs, 1.0)
    b32 = [0x0000, 0x8000, 0x0001, 0x83FF, 0x0400, 0xFBFF, 0x7BFF, 0x7C00, 0xFC00, 0x7C01, 0xFE00, 0x7E2A,
           0x3C00, 0xBC00, 0x3C01, 0x4000, 0x0200, 0x8401, 0x7800, 0xF800]
    b32 += rng.integers(0x0400, 0x7C00, 32 - len(b32)).astype(np.uint16).tolist()
    b32 = np.array(b32, np.uint16)
    b32[20:] |= (np.arange(12) % 2 << 15).astype(np.uint16)
    xa = [np.tile(np.arange(1 << 16, dtype=np.uint16), b32.size)]
    xb = [np.repeat(b32, 1 << 16)]
    # ties at every gap: b's bits below a's ulp set to a half (for a plain sum, a carry, a cancellation)
    n = 4000
    for g in range(0, F + 3):
        ea = rng.integers(g + 1, 31, n)
        a = (ea << F) | rng.integers(0, 1 << F, n)
        eb = ea - g
        fb = rng.integers(0, 1 << F, n)
        k = rng.integers(-1, 2, n) + g                      # shifted-out bits: g − 1, g, g + 1
        k = np.clip(k, 1, F + 1)
        low = (1 << k) - 1
        fb = (fb & ~low) | (1 << (k - 1))
        fb = np.where(k > F, fb & ((1 << F) - 1), fb)
        b = (eb << F) | (fb & ((1 << F) - 1))
        sa, sb = rng.integers(0, 2, n) << 15, rng.integers(0, 2, n) << 15
        # gap 12 ties exist only as 2^e − 2^(e − 12): half of the gap-12 cases made so
        if g == F + 2:
            a = (ea << F)
            b = (eb << F)
            sb = sa ^ 0x8000
        xa.append((a | sa).astype(np.uint16))
        xb.append((b | sb).astype(np.uint16))
    # subnormal results: subnormal/small-normal operands, and close opposites
    sub = rng.integers(0, 0x0800, (2, 20000)).astype(np.uint16)
    sub |= (rng.integers(0, 2, (2, 20000)) << 15).astype(np.uint16)
    xa.append(sub[0])
    xb.append(sub[1])
    # overflow: large operands of one sign (max + max, max + half ulp ties, ...)
    big = rng.integers(0x7400, 0x7C00, (2, 20000)).astype(np.uint16)
    sgn = (rng.integers(0, 2, 20000) << 15).astype(np.uint16)
    xa.append(big[0] | sgn)
    xb.append(big[1] | sgn)
    # exact cancellation: x + (−x) = +0, and ±0 combinations
    x = rng.integers(0, 0x7C00, 20000).astype(np.uint16) | (rng.integers(0, 2, 20000) << 15).astype(np.uint16)
    xa += [x, np.array([0x8000, 0x8000, 0x0000, 0x0000], np.uint16)]
    xb += [x ^ np.uint16(0x8000), np.array([0x8000, 0x0000, 0x8000, 0x0000], np.uint16)]
    # specials crossed (the special_patterns16 of tests/test_lanes.py) and random close magnitudes
    sp = special_patterns16(f)
    xa.append(np.repeat(sp, sp.size))
    xb.append(np.tile(sp, sp.size))
    r = rng.integers(0, 1 << 16, 100000).astype(np.uint16)
    xa.append(r)
    xb.append(r ^ rng.integers(0, 1 << (F + 4), r.size).astype(np.uint16) ^ np.uint16(0x8000))
    return np.concatenate(xa), np.concatenate(xb)


@pytest.fixture(scope="module")
def fp16_pairs():
    return fp16_hard_pairs()


def test_fp16_pairs_cover_the_hard_cases(fp16_pairs):
    f = FORMATS["fp16"]
    a, b = fp16_pairs
    c = classify(a, b, f)
    assert tie_classes(c, 16) == expected_tie_classes(f)            # gaps 0 … 12
    assert set(range(0, f.frac_bits + 2)) <= set(c["shift"][c["shift"] >= 0].tolist())   # 0 … 11 places
    want = combine(a.view(np.float16), b.view(np.float16), f).view(np.uint16)
    ai, bi, wi = a.astype(np.int64), b.astype(np.int64), want.astype(np.int64)
    finite = lambda v: (v & 0x7C00) != 0x7C00  # noqa: E731
    sub_results = finite(ai) & finite(bi) & ((wi & 0x7C00) == 0) & ((wi & 0x3FF) != 0)
    assert sub_results.sum() > 1000
    assert ((wi & 0x7FFF) == 0x7C00)[finite(ai) & finite(bi)].sum() > 1000             # overflow to ±Inf
    cancel = finite(ai) & (ai != 0) & (bi == ai ^ 0x8000)
    assert cancel.sum() > 1000 and (wi[cancel] == 0).all()                             # x + (−x) = +0
    neg0 = (ai == 0x8000) & (bi == 0x8000)
    assert neg0.any() and (wi[neg0] == 0x8000).all()                                   # −0 + −0 = −0
    assert_same(a[c["idx"]], b[c["idx"]], want[c["idx"]], c["bits"], 4, "fp16 golden vs exact")


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_fp16_hard_cases(fp16_pairs, op):
    a, b = fp16_pairs
    assert check16("fp16", op, a, b) >= 2_000_000


# ------------------------------------------------------------------------------------------------
# int32 and fp32
# ------------------------------------------------------------------------------------------------


def int32_pairs():
    rng = np.random.default_rng(32)
    edge = np.array([0, 1, 2, 0x7FFFFFFE, 0x7FFFFFFF, 0x80000000, 0x80000001, 0xFFFFFFFF, 0xFFFFFFFE,
                     0x40000000, 0xC0000000, 0x00010000, 0xFFFF0000], np.uint32)
    r = rng.integers(0, 1 << 32, (2, 300000), dtype=np.uint64).astype(np.uint32)
    near = rng.integers(0x7FFF0000, 0x80010000, (2, 50000), dtype=np.uint64).astype(np.uint32)  # around the wrap
    return (np.concatenate([np.repeat(edge, edge.size), r[0], near[0], near[1] ^ np.uint32(0x80000000)]),
            np.concatenate([np.tile(edge, edge.size), r[1], near[1], near[0]]))


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_int32(op):
    a, b = int32_pairs()
    if op == Op.SUM:
        i = {(0x7FFFFFFF, 1): 0x80000000, (0x80000000, 0xFFFFFFFF): 0x7FFFFFFF}
        for (x, y), s in i.items():
            k = np.flatnonzero((a == x) & (b == y))[0]
            assert int(combine(a[k:k + 1].view(np.int32), b[k:k + 1].view(np.int32), "int32").view(np.uint32)[0]) == s
    assert check32("int32", op, a, b) > 400000


def fp32_pairs():
    rng = np.random.default_rng(33)
    edge = np.array([0, 0x80000000, 1, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00800000, 0x80800000, 0x7F7FFFFF,
                     0xFF7FFFFF, 0x7F7FFFFE, 0x7F000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001,
                     0xFFC00123, 0x7FBFFFFF, 0x3F800000, 0xBF800000, 0x3F800001, 0x3FFFFFFF, 0x40000000,
                     0x33800000, 0x33000000, 0x34000000, 0xB3800001, 0x00000002, 0x00400000], np.uint32)
    n = 300000
    r = rng.integers(0, 1 << 32, (2, n), dtype=np.uint64).astype(np.uint32)
    close = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    mask = (np.uint32(1) << rng.integers(1, 31, n).astype(np.uint32)) - np.uint32(1)
    close_b = close ^ (rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32) & mask)
    close_b ^= (rng.integers(0, 2, n).astype(np.uint32) << np.uint32(31))
    # ties: b = a's ulp/2 · odd power-of-two multiples at gaps 0 … 25
    g = rng.integers(0, 26, n).astype(np.uint32)
    ea = rng.integers(26, 254, n).astype(np.uint32)
    ta = (ea << np.uint32(23)) | rng.integers(0, 1 << 23, n).astype(np.uint32)
    tb = ((ea - g) << np.uint32(23)) | (rng.integers(0, 1 << 23, n).astype(np.uint32) >> g << g) | (
        np.uint32(1) << np.maximum(g, np.uint32(1)) - np.uint32(1)) & np.uint32(0x7FFFFF)
    tb ^= rng.integers(0, 2, n).astype(np.uint32) << np.uint32(31)
    return (np.concatenate([np.repeat(edge, edge.size), r[0], close, ta]),
            np.concatenate([np.tile(edge, edge.size), r[1], close_b, tb]))


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_fp32(op):
    a, b = fp32_pairs()
    assert check32("fp32", op, a, b) > 900000


def test_mode_changes_between_words():
    """run_lanes drains the pipeline between modes: interleaved runs of every dtype byte (and an unknown one)."""
    rng = np.random.default_rng(5)
    modes = [dtype_byte(n, o) for n in FORMATS for o in OPS] + [0x00]
    seq = np.repeat(rng.choice(modes, 400), rng.integers(1, 40, 400))
    a = rng.integers(0, 1 << 32, seq.size, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 1 << 32, seq.size, dtype=np.uint64).astype(np.uint32)
    got = run_lanes(seq, a, b)
    for m in np.unique(seq).tolist():
        f, op = (FORMATS["fp32"], Op.SUM) if m == 0 else parse_dtype_byte(m)
        k = seq == m
        assert_same(a[k], b[k], got[k], combine_words(a[k], b[k], f, op), 8, f"mode 0x{m:02x}")


# ------------------------------------------------------------------------------------------------
# The deep (seven-stage) lanes of the 512-bit datapath: the same pairs, against the golden model
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def deep_model():
    t0 = time.perf_counter()
    exe = lanesim.build_lanes(deep=True)
    print(f"\ndeep lanes model: {exe} ({time.perf_counter() - t0:.1f} s, {lanesim.last_build_s:.1f} s Verilator)")
    return exe


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_deep_bf16(deep_model, bf16_pairs, op):
    """SUM: all 65536 a × 256 b (2^24 pairs); MAX/MIN (a comparator, not the adder): all a × the first 32 b."""
    a, b = bf16_pairs
    n = a.size if op == Op.SUM else 32 << 16
    assert check16("bf16", op, a[:n], b[:n], deep=True) == n


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_deep_fp16(deep_model, fp16_pairs, op):
    a, b = fp16_pairs
    assert check16("fp16", op, a, b, deep=True) >= 2_000_000


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_deep_int32_and_fp32(deep_model, op):
    assert check32("int32", op, *int32_pairs(), deep=True) > 400000
    assert check32("fp32", op, *fp32_pairs(), deep=True) > 900000


def test_deep_mode_changes_between_words(deep_model):
    rng = np.random.default_rng(6)
    modes = [dtype_byte(n, o) for n in FORMATS for o in OPS] + [0x00]
    seq = np.repeat(rng.choice(modes, 200), rng.integers(1, 40, 200))
    a = rng.integers(0, 1 << 32, seq.size, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 1 << 32, seq.size, dtype=np.uint64).astype(np.uint32)
    got = run_lanes(seq, a, b, deep=True)
    for m in np.unique(seq).tolist():
        f, op = (FORMATS["fp32"], Op.SUM) if m == 0 else parse_dtype_byte(m)
        k = seq == m
        assert_same(a[k], b[k], got[k], combine_words(a[k], b[k], f, op), 8, f"deep mode 0x{m:02x}")


def test_run_lanes_rejects_bad_arguments():
    with pytest.raises(ValueError, match="differ in length"):
        run_lanes(1, np.zeros(3, np.uint32), np.zeros(2, np.uint32))
    with pytest.raises(ValueError, match="1-D"):
        run_lanes(1, np.zeros((2, 2), np.uint32), np.zeros((2, 2), np.uint32))
    with pytest.raises(ValueError, match="uint32"):
        run_lanes(1, [-1], [0])
    with pytest.raises(ValueError, match="0-255"):
        run_lanes(256, [0], [0])
    with pytest.raises(ValueError, match="one per word"):
        run_lanes([1, 1], [0], [0])
    assert run_lanes(1, [], []).size == 0
