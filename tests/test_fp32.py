# amaranth: UnusedElaboratable=no
"""Tests of the pipelined binary32 adder (``wirereduce.hdl.arith.fp32``) against numpy float32.

Every expected sum comes from numpy (``float32 + float32``), never from a hard-coded table. A
non-NaN result must match bit for bit; where numpy says NaN the adder must give its canonical
quiet NaN (numpy's payload and sign are platform details and are not compared).
"""

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.sim import Simulator
from amaranth_harness import stream_operands
from wirereduce.hdl.arith.fp32 import CANONICAL_NAN, AdderLanes, FloatAdder, FP32Adder

LATENCY = FP32Adder.LATENCY


@pytest.fixture(params=[False, True], ids=["shallow", "deep"])
def deep(request):
    """Both pipeline depths: the six-stage adder and the seven-stage one of the 512-bit datapath."""
    return request.param


# ----------------------------------------------------------------------------------------------
# Reference model and vector generators
# ----------------------------------------------------------------------------------------------

def f32_bits(values):
    """Bit patterns (uint32) of ``values`` rounded to float32."""
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def expected_sum(a, b):
    """numpy's float32 ``a + b`` of two uint32 bit-pattern arrays, as uint32 bit patterns."""
    a = np.asarray(a, dtype=np.uint32)
    b = np.asarray(b, dtype=np.uint32)
    with np.errstate(all="ignore"):
        return (a.view(np.float32) + b.view(np.float32)).view(np.uint32)


def is_nan(bits):
    bits = np.asarray(bits, dtype=np.uint32)
    return ((bits & 0x7F80_0000) == 0x7F80_0000) & ((bits & 0x007F_FFFF) != 0)


def check_sums(a, b, got):
    """Assert that ``got`` is the float32 sum of ``a`` and ``b`` (arrays of equal shape)."""
    a, b = np.asarray(a, dtype=np.uint32), np.asarray(b, dtype=np.uint32)
    got = np.asarray(got, dtype=np.uint64).astype(np.uint32)
    exp = expected_sum(a, b)
    nan = is_nan(exp)
    bad = np.where(nan, got != CANONICAL_NAN, got != exp)
    if bad.any():
        idx = np.argwhere(bad)
        lines = [
            f"  {a[tuple(i)]:08x} + {b[tuple(i)]:08x}: got {got[tuple(i)]:08x}, "
            f"want {'NaN' if nan[tuple(i)] else f'{exp[tuple(i)]:08x}'}"
            for i in idx[:10]
        ]
        pytest.fail(f"{len(idx)} of {bad.size} sums wrong:\n" + "\n".join(lines))


# Interesting operands (bit patterns). Results are never listed: numpy computes them.
EDGE_VALUES = np.concatenate([
    np.array([
        0x0000_0000, 0x8000_0000,              # ±0
        0x0000_0001, 0x8000_0001,              # ±smallest subnormal
        0x0000_0002, 0x0000_0003,
        0x007F_FFFF, 0x807F_FFFF,              # ±largest subnormal
        0x0040_0000, 0x8040_0000,              # 2**-127
        0x0080_0000, 0x8080_0000,              # ±smallest normal
        0x0080_0001, 0x00C0_0000, 0x00FF_FFFF, 0x8100_0000,
        0x7F7F_FFFF, 0xFF7F_FFFF, 0x7F7F_FFFE,  # ±largest finite, and its neighbour
        0x7F80_0000, 0xFF80_0000,              # ±Inf
        0x7FC0_0000, 0xFFC0_0001,              # quiet NaNs
        0x7F80_0001, 0xFFA5_A5A5,              # signalling NaNs with payloads
    ], dtype=np.uint32),
    f32_bits([
        1.0, -1.0, 1.5, -1.5,
        2.0**-24, -(2.0**-24), 3 * 2.0**-24, 2.0**-24 + 2.0**-47,   # ties next to 1.0
        1 + 2.0**-23, -(1 + 2.0**-23), 2.0**-25,
        2.0**24, -(2.0**24 + 2), 2.0**-126 - 2.0**-127 - 2.0**-140,
        2.0**103, 2.0**103 * (1 + 2.0**-23), 2.0**102,                 # half an ulp of max
        1e30, -1e30, 1e-30, -1e-30, 3.1415927, -2.7182817,
    ]),
])


def cross(values):
    """All ordered pairs of ``values``."""
    a, b = np.meshgrid(values, values, indexing="ij")
    return a.ravel(), b.ravel()


def random_normals(rng, n, exp_lo=1, exp_hi=254, max_diff=2):
    """Normal operands whose exponents differ by at most ``max_diff``, random signs."""
    exp_a = rng.integers(exp_lo, exp_hi + 1, n)
    exp_b = np.clip(exp_a + rng.integers(-max_diff, max_diff + 1, n), 1, 254)
    sign = rng.integers(0, 2, (2, n)).astype(np.uint32) << 31
    frac = rng.integers(0, 1 << 23, (2, n)).astype(np.uint32)
    a = sign[0] | (exp_a.astype(np.uint32) << 23) | frac[0]
    b = sign[1] | (exp_b.astype(np.uint32) << 23) | frac[1]
    return a, b


def near_cancellation(rng, n):
    """``b`` is ``-a`` nudged by a few ulps: massive cancellation and renormalisation."""
    exp = rng.integers(1, 255, n).astype(np.uint32)
    sign = rng.integers(0, 2, n).astype(np.uint32) << 31
    a = sign | (exp << 23) | rng.integers(0, 1 << 23, n).astype(np.uint32)
    # Neighbouring magnitudes are neighbouring integers; stay finite.
    mag = np.clip((a & 0x7FFF_FFFF).astype(np.int64) + rng.integers(-300, 301, n), 0, 0x7F7F_FFFF)
    b = (sign ^ 0x8000_0000) | mag.astype(np.uint32)
    return a, b


def sparse_significands(rng, n):
    """Significands with few set bits (or few clear bits): exact ties are frequent."""
    exp = rng.integers(100, 160, (2, n)).astype(np.uint32)
    frac = (rng.integers(0, 8, (2, n)) << rng.integers(0, 21, (2, n))).astype(np.uint32)
    frac = np.where(rng.random((2, n)) < 0.5, frac, 0x7F_FFFF ^ frac).astype(np.uint32)
    sign = rng.integers(0, 2, (2, n)).astype(np.uint32) << 31
    v = sign | (exp << 23) | frac
    return v[0], v[1]


def random_subnormals(rng, n):
    """Pairs of subnormals, and subnormals with tiny normals, random signs."""
    sign = rng.integers(0, 2, (2, n)).astype(np.uint32) << 31
    a = sign[0] | rng.integers(0, 1 << 23, n).astype(np.uint32)
    # Half the b are subnormal, half have exponent field 1..3.
    b_exp = np.where(rng.random(n) < 0.5, 0, rng.integers(1, 4, n)).astype(np.uint32)
    b = sign[1] | (b_exp << 23) | rng.integers(0, 1 << 23, n).astype(np.uint32)
    return a, b


def random_patterns(rng, n):
    """Uniformly random bit patterns: every class, NaNs and Infs included."""
    return (rng.integers(0, 1 << 32, (2, n), dtype=np.uint64).astype(np.uint32))


# ----------------------------------------------------------------------------------------------
# Simulation harness
# ----------------------------------------------------------------------------------------------

def pack(lane_values):
    """Lane ``i`` of a row of uint32 into bits [32i, 32i+32) of one integer."""
    return sum(int(v) << (32 * i) for i, v in enumerate(lane_values))


def unpack(value, lanes):
    return [(value >> (32 * i)) & 0xFFFF_FFFF for i in range(lanes)]


def run_stream(dut, a, b, *, lanes=1, en_prob=1.0, seed=0):
    """Stream operand rows ``a``/``b`` (shape (n, lanes)) through ``dut`` with stalls and junk on
    stalled clocks (:func:`amaranth_harness.stream_operands`); returns ``(sums, cycles)``."""
    return stream_operands(dut, a, b, lanes=lanes, en_prob=en_prob, seed=seed)


def check_adder(a, b, deep=False, **kwargs):
    got, _ = run_stream(FP32Adder(deep=deep), a, b, **kwargs)
    check_sums(a, b, got[:, 0])


# ----------------------------------------------------------------------------------------------
# FP32Adder
# ----------------------------------------------------------------------------------------------

def test_edge_values_crossed(deep):
    a, b = cross(EDGE_VALUES)
    check_adder(a, b, deep=deep)


def test_rounding_ties_and_near_ties(deep):
    # 1 + k * 2**-25 for small k covers below/at/above half an ulp at even and odd significands;
    # the same around 2**24 (integers), at the top of the range and in the subnormal range.
    k = np.arange(-8, 9, dtype=np.float64)
    bases = [1.0, 1 + 2.0**-23, 2.0**24, 2.0**24 + 2, 2.0**-126, 2.0**-125 * 1.5]
    a, b = [], []
    for base in bases:
        for sign in (1.0, -1.0):
            a.append(f32_bits(np.full(k.shape, sign * base)))
            b.append(f32_bits(sign * k * base * 2.0**-25 + sign * (k != 0) * base * 2.0**-49))
            a.append(f32_bits(np.full(k.shape, sign * base)))
            b.append(f32_bits(sign * k * base * 2.0**-25))
    a.append(np.full(4, 0x7F7F_FFFF, dtype=np.uint32))    # max + about half an ulp of max
    b.append(f32_bits([2.0**103, 2.0**103 * (1 - 2.0**-24), 2.0**103 * (1 + 2.0**-23), 2.0**104]))
    check_adder(np.concatenate(a), np.concatenate(b), deep=deep)


def test_random_sparse_significands(deep):
    rng = np.random.default_rng(8)
    a, b = sparse_significands(rng, 1500)
    check_adder(a, b, deep=deep)


def test_random_bit_patterns(deep):
    rng = np.random.default_rng(1)
    a, b = random_patterns(rng, 2000)
    check_adder(a, b, deep=deep)


def test_random_close_exponents_and_cancellation(deep):
    rng = np.random.default_rng(2)
    a1, b1 = random_normals(rng, 1000, max_diff=2)
    a2, b2 = near_cancellation(rng, 1000)
    a3, b3 = random_normals(rng, 500, exp_lo=1, exp_hi=8, max_diff=3)   # results go subnormal
    check_adder(np.concatenate([a1, a2, a3]), np.concatenate([b1, b2, b3]), deep=deep)


def test_random_exponent_gaps_around_sticky_boundary(deep):
    # Exponent differences up to 30 exercise every alignment shift, including the clamp to
    # "all bits go into sticky" at 27 and beyond.
    rng = np.random.default_rng(3)
    a, b = random_normals(rng, 1500, exp_lo=20, exp_hi=240, max_diff=30)
    check_adder(a, b, deep=deep)


def test_sticky_every_gap_and_lowest_set_bit(deep):
    # The sticky bit is "the smaller significand's lowest set bit is shifted out": every exponent gap
    # 0 … 40 against every position 0 … 23 of that bit, with the bits above it (hidden bit set) the
    # hidden bit alone, all ones or random, so the lost bit decides a tie often; even and odd larger
    # operands, added and subtracted; and subnormal smaller operands (no hidden bit) at gaps 0 … 40.
    rng = np.random.default_rng(11)
    a, b = [], []
    for gap in range(41):
        for low in range(24):
            mask = (1 << 24) - (1 << low)                        # bits low … 23 (23: the hidden bit)
            for above in (1 << 23, mask, int(rng.integers(0, 1 << 24)) & mask | 1 << 23):
                sig = above | 1 << low
                big_exp = 60 + gap
                for lsb in (0, 1):
                    big = (big_exp << 23) | (int(rng.integers(0, 1 << 22)) << 1) | lsb
                    for sign in (0, 1):
                        a.append(big)
                        b.append(((big_exp - gap) << 23) | (sig & ((1 << 23) - 1)) | sign << 31)
        for low in range(23):
            a.append(((gap + 1) << 23) | int(rng.integers(0, 1 << 23)))
            b.append(((1 << 23) - (1 << low)) & int(rng.integers(0, 1 << 23)) | 1 << low)
    check_adder(np.array(a, dtype=np.uint32), np.array(b, dtype=np.uint32), deep=deep)


def test_random_subnormals(deep):
    rng = np.random.default_rng(4)
    a, b = random_subnormals(rng, 1500)
    check_adder(a, b, deep=deep)


def test_stalls_keep_order_and_hold_output(deep):
    rng = np.random.default_rng(5)
    a1, b1 = random_normals(rng, 150, max_diff=26)
    a2, b2 = random_patterns(rng, 100)
    a, b = np.concatenate([a1, a2]), np.concatenate([b1, b2])
    got, cycles = run_stream(FP32Adder(deep=deep), a, b, en_prob=0.5, seed=6)
    check_sums(a, b, got[:, 0])
    assert cycles > len(a) + LATENCY     # there were stalls


def test_throughput_one_result_per_cycle(deep):
    rng = np.random.default_rng(7)
    a, b = random_normals(rng, 200, max_diff=5)
    dut = FP32Adder(deep=deep)
    got, cycles = run_stream(dut, a, b, en_prob=1.0)
    check_sums(a, b, got[:, 0])
    # n vectors in n cycles, the last result latency - 1 cycles after the last vector went in.
    assert cycles == len(a) + dut.latency - 1


def test_latency_and_registered_output(deep):
    dut = FP32Adder(deep=deep)
    LATENCY = 7 if deep else 6     # the documented depths, not read back from the adder
    a, b = f32_bits([1.5, 2.25])
    want = int(expected_sum(a, b))
    seen = []

    async def tb(ctx):
        ctx.set(dut.en, 1)
        ctx.set(dut.a, int(a))
        ctx.set(dut.b, int(b))
        # s is a register: changing the inputs does not reach it without a clock edge.
        assert ctx.get(dut.s) == 0
        for _ in range(LATENCY):
            seen.append(ctx.get(dut.s))
            await ctx.tick()
            ctx.set(dut.a, 0)
            ctx.set(dut.b, 0)
        seen.append(ctx.get(dut.s))
        await ctx.tick()
        seen.append(ctx.get(dut.s))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    assert seen[:LATENCY] == [0] * LATENCY
    assert seen[LATENCY] == want
    assert seen[LATENCY + 1] == 0     # 0 + 0 followed it


def test_latency_is_a_class_constant():
    assert isinstance(FP32Adder.LATENCY, int) and FP32Adder.LATENCY >= 1
    assert AdderLanes.LATENCY == FP32Adder.LATENCY


def test_latency_per_instance():
    """The class constant is the default depth's; each instance carries its own."""
    assert FP32Adder().latency == AdderLanes(2).latency == FP32Adder.LATENCY == 6
    assert FP32Adder(deep=True).latency == AdderLanes(2, deep=True).latency == FloatAdder.DEEP_LATENCY == 7
    assert FloatAdder(5, 10, deep=True).latency == 7 and FloatAdder(8, 7).latency == 6


@pytest.mark.parametrize("bad", [1, 0, None, "yes"])
def test_deep_must_be_a_bool(bad):
    for make in (lambda: FP32Adder(deep=bad), lambda: AdderLanes(2, deep=bad), lambda: FloatAdder(8, 7, bad)):
        with pytest.raises(TypeError, match="deep"):
            make()


# ----------------------------------------------------------------------------------------------
# AdderLanes
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lanes, rows, deep", [(2, 500, False), (16, 100, False), (16, 60, True)])
def test_lanes_independent(lanes, rows, deep):
    rng = np.random.default_rng(100 + lanes)
    kinds = [random_normals(rng, rows * lanes, max_diff=28), random_patterns(rng, rows * lanes),
             random_subnormals(rng, rows * lanes), near_cancellation(rng, rows * lanes),
             sparse_significands(rng, rows * lanes)]
    pick = rng.integers(0, len(kinds), rows * lanes)
    a = np.choose(pick, [k[0] for k in kinds]).astype(np.uint32).reshape(rows, lanes)
    b = np.choose(pick, [k[1] for k in kinds]).astype(np.uint32).reshape(rows, lanes)
    # Edge values too, different in every lane.
    ea, eb = cross(EDGE_VALUES)
    sel = rng.choice(len(ea), rows * lanes // 4, replace=False)
    a.ravel()[: len(sel)] = ea[sel]
    b.ravel()[: len(sel)] = eb[sel]
    dut = AdderLanes(lanes, deep=deep)
    assert dut.latency == (7 if deep else 6)
    got, _ = run_stream(dut, a, b, lanes=lanes, en_prob=0.7, seed=lanes)
    check_sums(a, b, got)


def test_lane_layout():
    # Lane i must read bits [32i, 32i+32) and write the same bits of s.
    lanes = 4
    a = f32_bits([1.0, 2.0, 4.0, 8.0]).reshape(1, lanes)
    b = f32_bits([0.5, 0.25, -4.0, 1e-3]).reshape(1, lanes)
    got, _ = run_stream(AdderLanes(lanes), a, b, lanes=lanes)
    check_sums(a, b, got)


@pytest.mark.parametrize("lanes, error", [
    (0, ValueError), (-1, ValueError), (1.0, TypeError), ("2", TypeError), (True, TypeError),
    (None, TypeError),
])
def test_lanes_constructor_errors(lanes, error):
    with pytest.raises(error):
        AdderLanes(lanes)


def test_verilog_conversion():
    text = verilog.convert(AdderLanes(2), name="adder_lanes")
    assert "module adder_lanes" in text
    assert "module" in verilog.convert(FP32Adder())
    assert "module adder_lanes" in verilog.convert(AdderLanes(2, deep=True), name="adder_lanes")
