"""Tests of wirereduce.sim.golden.allreduce: input checks, the ring summation order, bit comparison."""

from __future__ import annotations

import numpy as np
import pytest
from wirereduce.sim.golden.allreduce import bit_mismatches, check_inputs, ring_allreduce

F32 = np.float32


def _bits(x) -> np.ndarray:
    return np.asarray(x, dtype=F32).view(np.uint32)


def _from_bits(u) -> np.ndarray:
    return np.asarray(u, dtype=np.uint32).view(F32)


def _scalar_ring(arrays) -> np.ndarray:
    """((g0 + g1) + g2) + … elementwise, one Python-level np.float32 scalar addition at a time."""
    n = arrays[0].size
    out = np.empty(n, dtype=F32)
    with np.errstate(all="ignore"):
        for i in range(n):
            acc = F32(arrays[0][i])
            for a in arrays[1:]:
                acc = F32(acc + F32(a[i]))
                assert type(acc) is F32
            out[i] = acc
    return out


def _double_rounded_ring(arrays) -> np.ndarray:
    """The same order via float64: an fp32 sum computed in binary64 and rounded once more to fp32
    is correctly rounded (53 ≥ 2·24 + 2), so this is a second, independent reference."""
    n = arrays[0].size
    out = np.empty(n, dtype=F32)
    with np.errstate(all="ignore"):
        for i in range(n):
            acc = float(arrays[0][i])
            for a in arrays[1:]:
                acc = float(np.float64(acc) + np.float64(a[i]))
                acc = float(F32(acc))
            out[i] = F32(acc)
    return out


def _assert_same_bits(got, want):
    """Bit-exact equality, except that NaN payloads are not specified (any NaN gives a NaN)."""
    got, want = np.asarray(got, dtype=F32), np.asarray(want, dtype=F32)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(_bits(got)[ok], _bits(want)[ok])


def _special_mix(rng: np.random.Generator, n: int) -> np.ndarray:
    """float32 values mixing normals, random bit patterns, subnormals, zeros, infinities, NaNs, huge."""
    kind = rng.integers(0, 8, n)
    normal = rng.standard_normal(n).astype(F32)
    raw = _from_bits(rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32))
    sign = rng.integers(0, 2, n).astype(np.uint32) << 31
    subnormal = _from_bits(sign | rng.integers(1, 1 << 23, n, dtype=np.uint32))
    zero = _from_bits(sign)
    inf = _from_bits(sign | np.uint32(0x7F800000))
    nan = _from_bits(np.uint32(0x7F800000) | rng.integers(1, 1 << 23, n, dtype=np.uint32) | sign)
    huge = (np.where(sign, -1, 1) * np.finfo(F32).max * rng.uniform(0.5, 1.0, n)).astype(F32)
    tiny = (rng.standard_normal(n) * 2.0**-126).astype(F32)  # near the normal/subnormal border
    choices = [normal, raw, subnormal, zero, inf, nan, huge, tiny]
    out = np.empty(n, dtype=F32)
    for k, c in enumerate(choices):
        out[kind == k] = c[kind == k]
    return out


# --- check_inputs ------------------------------------------------------------------------------

def _good(n=5, nodes=3, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(F32) for _ in range(nodes)]


def test_check_inputs_accepts_and_normalises():
    arrays = _good()
    strided = np.arange(10, dtype=F32)[::2]  # float32, 1-D, but not contiguous
    out = check_inputs([arrays[0], strided, arrays[2]], nodes=3)
    assert len(out) == 3
    for a in out:
        assert a.dtype == np.dtype("<f4") and a.flags.c_contiguous and a.ndim == 1
    np.testing.assert_array_equal(out[1], strided)
    np.testing.assert_array_equal(out[0], arrays[0])


def test_check_inputs_float64_names_node():
    arrays = _good()
    arrays[2] = arrays[2].astype(np.float64)
    with pytest.raises(ValueError, match=r"node2.*float64"):
        check_inputs(arrays)


def test_check_inputs_2d_names_node():
    arrays = _good(n=6)
    arrays[1] = arrays[1].reshape(2, 3)
    with pytest.raises(ValueError, match=r"node1.*\(2, 3\).*1-D"):
        check_inputs(arrays)


def test_check_inputs_empty_names_node():
    arrays = _good()
    arrays[2] = np.zeros(0, dtype=F32)
    with pytest.raises(ValueError, match=r"node2.*empty"):
        check_inputs(arrays)
    with pytest.raises(ValueError, match=r"node0.*empty"):
        check_inputs([np.zeros(0, dtype=F32)] * 3)


def test_check_inputs_unequal_lengths_names_node():
    arrays = _good(n=5)
    arrays[1] = np.ones(4, dtype=F32)
    with pytest.raises(ValueError, match=r"node1.*length 4.*node0.*5"):
        check_inputs(arrays)


def test_check_inputs_one_node():
    with pytest.raises(ValueError, match="at least 2 nodes"):
        check_inputs(_good(nodes=1))
    with pytest.raises(ValueError, match="at least 2 nodes"):
        check_inputs([])


def test_check_inputs_wrong_count():
    with pytest.raises(ValueError, match=r"expected 4 arrays.*got 3"):
        check_inputs(_good(nodes=3), nodes=4)
    assert len(check_inputs(_good(nodes=3), nodes=3)) == 3


def test_ring_allreduce_checks_inputs():
    arrays = _good()
    arrays[0] = arrays[0].astype(np.float16)
    with pytest.raises(ValueError, match="node0"):
        ring_allreduce(arrays)


# --- ring_allreduce ----------------------------------------------------------------------------

@pytest.mark.parametrize("nodes,n,seed", [(2, 257, 1), (3, 300, 2), (4, 500, 3), (7, 200, 4)])
def test_ring_allreduce_matches_scalar_loop(nodes, n, seed):
    rng = np.random.default_rng(seed)
    arrays = [_special_mix(rng, n) for _ in range(nodes)]
    copies = [a.copy() for a in arrays]
    got = ring_allreduce(arrays)
    assert got.dtype == F32 and got.shape == (n,)
    _assert_same_bits(got, _scalar_ring(arrays))
    _assert_same_bits(got, _double_rounded_ring(arrays))
    for a, c in zip(arrays, copies):  # inputs untouched
        np.testing.assert_array_equal(_bits(a), _bits(c))
    # the data really exercised the special cases
    assert np.isnan(got).any() and np.isinf(got).any()
    assert all((((_bits(a) & 0x7F800000) == 0) & ((_bits(a) & 0x007FFFFF) != 0)).any() for a in arrays)
    assert (((_bits(got) & 0x7F800000) == 0) & ((_bits(got) & 0x007FFFFF) != 0)).any()  # subnormal sums


def test_ring_allreduce_subnormal_results_kept():
    tiny = _from_bits([1, 2, 3, 0x007FFFFF])  # smallest subnormals and the largest one
    got = ring_allreduce([tiny, tiny])
    want = _from_bits([2, 4, 6, 0x00FFFFFE])  # exact; 2·largest subnormal is the normal 0x00FFFFFE
    np.testing.assert_array_equal(_bits(got), _bits(want))
    # no flush to zero: a subnormal plus -0 stays that subnormal
    np.testing.assert_array_equal(_bits(ring_allreduce([tiny, np.full(4, -0.0, F32)])), _bits(tiny))


def test_ring_allreduce_ieee_specials():
    inf, nan = F32(np.inf), F32(np.nan)
    fmax = np.finfo(F32).max
    g0 = np.array([inf, inf, 1.0, fmax, -0.0, -0.0], dtype=F32)
    g1 = np.array([-inf, 1.0, nan, fmax, -0.0, 0.0], dtype=F32)
    got = ring_allreduce([g0, g1])
    assert np.isnan(got[0])                        # inf - inf
    assert got[1] == inf                           # inf + finite
    assert np.isnan(got[2])                        # NaN in, NaN out
    assert got[3] == inf                           # overflow rounds to +inf
    assert _bits(got[4]) == _bits(F32(-0.0))       # -0 + -0 = -0
    assert _bits(got[5]) == _bits(F32(0.0))        # -0 + +0 = +0 (round to nearest)


def test_ring_allreduce_deterministic():
    rng = np.random.default_rng(11)
    arrays = [_special_mix(rng, 100) for _ in range(4)]
    a, b = ring_allreduce(arrays), ring_allreduce(arrays)
    np.testing.assert_array_equal(_bits(a), _bits(b))


def test_order_matters_constructed():
    # 1 + 2^-24 is a tie and rounds to 1 (even); 2^-24 + 2^-24 = 2^-23 is exact.
    one, half_ulp = F32(1.0), F32(2.0**-24)
    left = F32(F32(one + half_ulp) + half_ulp)
    right = F32(one + F32(half_ulp + half_ulp))
    assert left != right  # float32 addition is not associative here
    g = [np.array([one], F32), np.array([half_ulp], F32), np.array([half_ulp], F32)]
    got = ring_allreduce(g)
    assert _bits(got[0]) == _bits(left)
    assert _bits(got[0]) != _bits(right)
    # rank order, not any other: the same values in another rank order give the other sum
    assert _bits(ring_allreduce(g[::-1])[0]) == _bits(right)


def test_order_matters_cancellation():
    big = F32(1e20)
    g = [np.array([big], F32), np.array([-big], F32), np.array([1.0], F32)]
    assert ring_allreduce(g)[0] == F32(1.0)                # (1e20 - 1e20) + 1
    assert ring_allreduce([g[1], g[2], g[0]])[0] == 0.0    # (-1e20 + 1) + 1e20


def test_order_matters_random():
    """Among random data, find elements where rank order and the reverse order disagree."""
    rng = np.random.default_rng(5)
    arrays = [(rng.standard_normal(2000) * 10.0 ** rng.integers(-3, 4, 2000)).astype(F32) for _ in range(4)]
    fwd = ring_allreduce(arrays)
    rev = ring_allreduce(arrays[::-1])
    differ = np.flatnonzero(_bits(fwd) != _bits(rev))
    assert differ.size > 0
    scalar = _scalar_ring(arrays)
    np.testing.assert_array_equal(_bits(fwd)[differ], _bits(scalar)[differ])


# --- bit_mismatches ------------------------------------------------------------------------------

def test_bit_mismatches_equal_arrays():
    rng = np.random.default_rng(9)
    x = _special_mix(rng, 300)
    assert bit_mismatches(x, x.copy()).size == 0


def test_bit_mismatches_any_nan_matches_any_nan():
    quiet = _from_bits([0x7FC00000])
    other = _from_bits([0xFFC00001])  # negative NaN with a payload
    signalling = _from_bits([0x7F800001])
    assert bit_mismatches(quiet, other).size == 0
    assert bit_mismatches(other, signalling).size == 0
    # but a NaN does not match a number, nor an infinity
    assert list(bit_mismatches(quiet, np.array([1.0], F32))) == [0]
    assert list(bit_mismatches(np.array([np.inf], F32), quiet)) == [0]


def test_bit_mismatches_signed_zero_and_ulp():
    got = np.array([-0.0, 0.0, 1.0, 1.0, 3.0], dtype=F32)
    want = np.array([0.0, 0.0, np.nextafter(F32(1.0), F32(2.0)), 1.0, 3.0], dtype=F32)
    assert (got == want).tolist()[0]  # numpy's == says -0 equals +0 ...
    assert bit_mismatches(got, want).tolist() == [0, 2]  # ... bit_mismatches does not


def test_bit_mismatches_shape_mismatch():
    with pytest.raises(ValueError, match="shape"):
        bit_mismatches(np.zeros(3, F32), np.zeros(4, F32))
