"""Tests of wirereduce.sim.golden.codec: the INCEPTIONN-style codec v1 golden model (docs/codec.md)."""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from wirereduce.sim.golden import codec as G
from wirereduce.sim.golden.allreduce import bit_mismatches
from wirereduce.sim.workloads import compression as R

from wirereduce import codec as C

F32 = np.float32
U32 = np.uint32

ks = st.integers(min_value=C.K_MIN, max_value=C.K_MAX)
f32 = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)
small_f32 = st.floats(min_value=-1.0, max_value=1.0, exclude_min=True, exclude_max=True, width=32,
                      allow_subnormal=True)
# NaN with any payload and sign, and every other bit pattern at or above |1.0|
big_bits = st.integers(min_value=0x3F80_0000, max_value=0x7FFF_FFFF).flatmap(
    lambda a: st.sampled_from([a, a | 0x8000_0000]))
any_bits = st.integers(min_value=0, max_value=0xFFFF_FFFF)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _bits(x) -> np.ndarray:
    return np.asarray(x, dtype=F32).view(U32)


def _from_bits(u) -> np.ndarray:
    return np.asarray(u, dtype=U32).view(F32)


def _scalar_quantize(g: np.ndarray, k: int) -> np.ndarray:
    """decode_scalar(encode_scalar(x)) element by element, assembled by bits."""
    out = np.empty(g.size, dtype=U32)
    for i, x in enumerate(g):
        out[i] = _bits(C.decode_scalar(*C.encode_scalar(x, k), k))
    return out.view(F32)


def _scalar_encode(g: np.ndarray, k: int) -> bytes:
    """The payload layout built from the scalar definition, one element at a time."""
    n = g.size
    tag_block = bytearray(C.tag_bytes(n))
    codes = bytearray()
    for i, x in enumerate(g):
        tag, code = C.encode_scalar(x, k)
        tag_block[i // 4] |= tag << (2 * (i % 4))
        codes += code
    return bytes(tag_block + codes)


# --------------------------------------------------------------------------------------------------
# the scalar definition itself, on hand-worked values


@pytest.mark.parametrize(
    "x, k, tag, code",
    [
        (0.0, 8, 0, b""),
        (-0.0, 8, 0, b""),
        (2.0 ** -9, 8, 0, b""),                  # below eb = 2**-8
        (2.0 ** -8, 8, 1, bytes([1])),           # exactly eb: q = 1
        (-(2.0 ** -8), 8, 1, bytes([0x81])),     # sign in bit 7
        (127 / 256, 8, 1, bytes([127])),         # largest one-byte q
        (128 / 256, 8, 2, (128).to_bytes(2, "little")),
        (-0.75, 12, 2, (0x8000 | 3072).to_bytes(2, "little")),
        (0.5, 16, 3, struct.pack("<f", 0.5)),    # q = 2**15: raw
        (0.5 - 2.0 ** -16, 16, 2, (0x7FFF).to_bytes(2, "little")),  # q = 2**15 - 1
        (1.0, 24, 3, struct.pack("<f", 1.0)),
        (-3.5, 4, 3, struct.pack("<f", -3.5)),
        (float("inf"), 8, 3, struct.pack("<f", float("inf"))),
        (0.1, 8, 1, bytes([25])),                # floor(0.1 * 256) = 25
        (-0.1, 8, 1, bytes([0x80 | 25])),
    ],
)
def test_encode_scalar_worked_values(x, k, tag, code):
    assert C.encode_scalar(F32(x), k) == (tag, code)
    got = C.encode(np.array([x], dtype=F32), k)
    assert got == bytes([tag]) + bytes(7) + code


def test_decode_scalar_worked_values():
    assert _bits(C.decode_scalar(0, b"", 8)) == 0  # +0.0, never -0.0
    assert C.decode_scalar(1, bytes([0x81]), 8) == F32(-(2.0 ** -8))
    assert C.decode_scalar(2, (0x8000 | 3072).to_bytes(2, "little"), 12) == F32(-0.75)
    assert _bits(C.decode_scalar(1, bytes([0x80]), 8)) == 0x8000_0000  # non-canonical: -0.0
    with pytest.raises(ValueError, match="code bytes"):
        C.decode_scalar(1, b"\x00\x00", 8)
    with pytest.raises(ValueError, match="tag"):
        C.decode_scalar(4, b"", 8)


def test_negative_zero_and_subnormals_become_positive_zero():
    g = _from_bits([0x8000_0000, 0x0000_0001, 0x8000_0001, 0x007F_FFFF, 0x807F_FFFF])
    for k in (C.K_MIN, 12, C.K_MAX):
        assert np.all(C.tags(g, k) == 0)
        assert np.all(_bits(C.quantize(g, k)) == 0)
        assert C.encode(g, k) == bytes(8)


# --------------------------------------------------------------------------------------------------
# properties


@SETTINGS
@given(x=small_f32, k=ks)
def test_error_below_bound(x, k):
    g = np.array([x], dtype=F32)
    d = C.decode(C.encode(g, k), 1, k)
    err = abs(Fraction(float(d[0])) - Fraction(float(g[0])))  # exact, no rounding
    assert err < Fraction(1, 2**k)
    assert float(d[0]) == 0.0 or math.copysign(1.0, float(d[0])) == math.copysign(1.0, float(g[0]))
    assert abs(float(d[0])) <= abs(float(g[0]))  # floor: magnitude never grows


@SETTINGS
@given(b=big_bits, k=ks)
def test_big_inf_nan_pass_through_bit_exact(b, k):
    g = _from_bits([b])
    assert C.tags(g, k)[0] == C.TAG_RAW
    payload = C.encode(g, k)
    assert payload == bytes([3]) + bytes(7) + struct.pack("<I", b)
    assert _bits(C.decode(payload, 1, k))[0] == b
    assert _bits(C.quantize(g, k))[0] == b
    assert C.encode_scalar(g[0], k) == (3, struct.pack("<I", b))
    assert _bits(C.decode_scalar(3, struct.pack("<I", b), k)) == b


@SETTINGS
@given(bits=hnp.arrays(np.uint32, st.integers(0, 80), elements=any_bits), k=ks)
def test_vectorised_equals_scalar_definition(bits, k):
    g = bits.view(F32)
    payload = C.encode(g, k)
    assert payload == _scalar_encode(g, k)
    assert len(payload) == C.encoded_size(g, k)
    want = _bits(_scalar_quantize(g, k))
    assert np.array_equal(_bits(C.decode(payload, g.size, k)), want)
    assert np.array_equal(_bits(C.quantize(g, k)), want)
    assert np.array_equal(C.tags(g, k), [C.encode_scalar(x, k)[0] for x in g])


@SETTINGS
@given(g=hnp.arrays(F32, st.integers(0, 200), elements=f32), k=ks)
def test_payload_length_formula_and_idempotence(g, k):
    t = C.tags(g, k)
    n1, n2, n3 = (int(np.sum(t == i)) for i in (1, 2, 3))
    size = 8 * math.ceil(g.size / 32) + n1 + 2 * n2 + 4 * n3
    assert len(C.encode(g, k)) == size == C.encoded_size(g, k) <= C.worst_case_size(g.size)
    q = C.quantize(g, k)
    assert np.array_equal(_bits(C.quantize(q, k)), _bits(q))
    assert C.encode(q, k) == C.encode(g, k)


@SETTINGS
@given(g=hnp.arrays(F32, st.integers(1, 100), elements=f32), k=ks, data=st.data())
def test_decode_rejects_truncated_and_too_long(g, k, data):
    payload = C.encode(g, k)
    cut = data.draw(st.integers(0, len(payload) - 1))
    with pytest.raises(ValueError, match="truncated"):
        C.decode(payload[:cut], g.size, k)
    extra = data.draw(st.binary(min_size=1, max_size=9))
    with pytest.raises(ValueError, match="too long"):
        C.decode(payload + extra, g.size, k)


def test_decode_rejects_bad_padding_and_arguments():
    g = np.array([0.5, 0.25, 0.125], dtype=F32)
    payload = bytearray(C.encode(g, 8))
    payload[0] |= 3 << 6  # tag slot 3 of a 3-element payload
    with pytest.raises(ValueError, match="padding"):
        C.decode(bytes(payload), 3, 8)
    payload = bytearray(C.encode(g, 8))
    payload[7] = 1
    with pytest.raises(ValueError, match="padding"):
        C.decode(bytes(payload), 3, 8)
    with pytest.raises(ValueError, match="n must be"):
        C.decode(b"", -1, 8)
    with pytest.raises(ValueError, match="k must be"):
        C.decode(C.encode(g, 8), 3, 3)
    assert C.decode(b"", 0, 8).shape == (0,)
    assert C.encode(np.zeros(0, dtype=F32), 8) == b""
    # bytes-like inputs
    p = C.encode(g, 8)
    for buf in (bytearray(p), memoryview(p), np.frombuffer(p, dtype=np.uint8)):
        assert np.array_equal(C.decode(buf, 3, 8), g)


def test_tag_bit_order():
    # tags 1, 2, 3, 0, 3 → byte 0 = 1 | 2<<2 | 3<<4 | 0<<6, byte 1 = 3
    g = np.array([2.0 ** -8, 0.5, 2.0, 0.0, -1.0], dtype=F32)
    p = C.encode(g, 8)
    assert p[:8] == bytes([0b00_11_10_01, 0b11, 0, 0, 0, 0, 0, 0])
    assert p[8:] == bytes([1]) + (128).to_bytes(2, "little") + struct.pack("<f", 2.0) + struct.pack("<f", -1.0)
    # 33 elements need two 8-byte tag words
    assert C.tag_bytes(32) == 8 and C.tag_bytes(33) == 16 and C.tag_bytes(0) == 0


def test_compression_ratio_and_sizes():
    g = np.full(64, 0.25, dtype=F32)  # tag 1 at k = 8: 16 tag bytes + 64 code bytes
    assert C.encoded_size(g, 8) == 80 and C.compression_ratio(g, 8) == 256 / 80
    assert C.compression_ratio(np.zeros(32, dtype=F32), 8) == 128 / 8
    assert C.compression_ratio(np.full(32, 2.0, dtype=F32), 8) == 128 / 136
    with pytest.raises(ValueError, match="empty"):
        C.compression_ratio(np.zeros(0, dtype=F32), 8)
    assert C.max_elements_compressed(1500) == 349
    assert C.max_elements_compressed(9000) == 2112
    for mtu in (1500, 9000, 100):
        n = C.max_elements_compressed(mtu)
        assert 16 + C.worst_case_size(n) <= mtu < 16 + C.worst_case_size(n + 1)
    with pytest.raises(ValueError, match="MTU"):
        C.max_elements_compressed(20)


@pytest.mark.parametrize("k", [3, 25, 0, -8, 8.0, True, "8", None])
def test_k_out_of_range(k):
    g = np.array([0.5], dtype=F32)
    for call in (lambda: C.quantize(g, k), lambda: C.tags(g, k), lambda: C.encode(g, k),
                 lambda: C.decode(b"", 0, k), lambda: C.encoded_size(g, k), lambda: C.encode_scalar(g[0], k),
                 lambda: G.ring_allreduce_compressed([g, g], k)):
        with pytest.raises(ValueError, match="k must"):
            call()


def test_k_checked_before_inputs():
    with pytest.raises(ValueError, match="k must"):
        G.ring_allreduce_compressed([np.zeros(3, dtype=np.float64)], 30)
    assert C.check_k(np.int64(12)) == 12


def test_dtype_and_shape_errors():
    with pytest.raises(ValueError, match="float32"):
        C.quantize(np.zeros(3), 8)
    with pytest.raises(ValueError, match="1-D"):
        C.encode(np.zeros((2, 2), dtype=F32), 8)
    assert C.quantize(np.full((2, 3), 0.3, dtype=F32), 8).shape == (2, 3)
    assert C.quantize(np.full(3, 0.3, dtype=">f4"), 8).dtype == F32


# --------------------------------------------------------------------------------------------------
# compressed allreduce


def _scalar_ring(arrays, k) -> np.ndarray:
    """quantize(...quantize(quantize(x0) + x1)... + x_{N-1}) one element and one scalar at a time."""
    n = arrays[0].size
    out = np.empty(n, dtype=U32)
    with np.errstate(all="ignore"):
        for i in range(n):
            p = C.decode_scalar(*C.encode_scalar(arrays[0][i], k), k)
            for a in arrays[1:]:
                s = F32(p + a[i])
                assert type(s) is F32
                p = C.decode_scalar(*C.encode_scalar(s, k), k)
            out[i] = _bits(p)
    return out.view(F32)


@settings(max_examples=60, deadline=None)
@given(nodes=st.integers(2, 6), n=st.integers(1, 40), k=ks, seed=st.integers(0, 2**32 - 1))
def test_ring_allreduce_compressed_equals_scalar_loop(nodes, n, k, seed):
    rng = np.random.default_rng(seed)
    scale = rng.choice([2.0 ** -k, 1e-3, 0.1, 1.0, 100.0])
    arrays = [(rng.standard_normal(n) * scale).astype(F32) for _ in range(nodes)]
    arrays[0][rng.integers(0, n)] = rng.choice(np.array([np.inf, -np.inf, np.nan, -0.0, 1e-45], dtype=F32))
    got = G.ring_allreduce_compressed(arrays, k)
    assert got.dtype == F32 and got.shape == (n,)
    assert bit_mismatches(got, _scalar_ring(arrays, k)).size == 0


def test_ring_allreduce_compressed_close_to_exact_sum():
    rng = np.random.default_rng(7)
    arrays = [(rng.standard_normal(1000) * 0.05).astype(F32) for _ in range(4)]
    exact = np.sum(np.stack(arrays).astype(np.float64), axis=0)
    for k in (8, 12, 16):
        got = G.ring_allreduce_compressed(arrays, k).astype(np.float64)
        # each of the 4 compressions loses < 2**-k; fp32 rounding adds a little more
        assert np.max(np.abs(got - exact)) < 4 * 2.0 ** -k + 1e-6


def test_ring_allreduce_compressed_input_checks():
    g = np.zeros(4, dtype=F32)
    with pytest.raises(ValueError, match="at least 2 nodes"):
        G.ring_allreduce_compressed([g], 8)
    with pytest.raises(ValueError, match="node1"):
        G.ring_allreduce_compressed([g, np.zeros(4)], 8)


def test_compression_table_small_run():
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    records = R.compression_table(ks=(8, 14), nodes=2, epochs=2)
    assert [(r["phase"], r["k"]) for r in records] == [
        (p, k) for p in ("start", "middle", "end") for k in (8, 14)]
    for r in records:
        assert r["ring_ratio"] > 1 and r["worker_ratio"] > 1 and r["sum_ratio"] > 1
        assert math.isclose(sum(r[f"tag{t}"] for t in range(4)), 1.0)
    text = R.format_table(records)
    assert "ring" in text and len(text.splitlines()) == 2 + len(records)


def test_workload_compression_ratios_command(capsys):
    """``wirereduce workload compression-ratios`` prints compression_table's table; bad k: a user error."""
    from wirereduce.cli import main

    assert main(["workload", "compression-ratios", "--k", "3"]) == 2
    assert capsys.readouterr().err.startswith("wirereduce: error: k must be")
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    assert main(["workload", "compression-ratios", "--k", "10", "--nodes", "2", "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert "demo CNN, 2 workers, 2 epochs" in out and len(out.splitlines()) == 1 + 2 + 3


def test_ring_allreduce_compressed_host_compressed():
    """Hosts that push compressed: each x_r is quantized before it is added, i.e. the plain
    compressed ring of the quantized inputs (elementwise definition, written out here)."""
    rng = np.random.default_rng(3)
    k = 9
    arrays = [(rng.standard_normal(500) * 10.0 ** rng.integers(-5, 2, 500)).astype(np.float32) for _ in range(4)]
    got = G.ring_allreduce_compressed(arrays, k, host_compressed=True)
    p = C.decode(C.encode(arrays[0], k), 500, k)
    for x in arrays[1:]:
        xq = C.decode(C.encode(x, k), 500, k)
        p = C.decode(C.encode(np.add(p, xq, dtype=np.float32), k), 500, k)
    assert bit_mismatches(got, p).size == 0
    assert bit_mismatches(got, G.ring_allreduce_compressed(arrays, k)).size > 0  # the option matters


def test_ring_payloads_host_compressed():
    """``ring_payloads(..., host_compressed=True)``: the hops of the ring whose hosts push Q(x_r),
    what the compressed bench runs; its broadcast hops carry that ring's result, and its sums
    differ from those of raw pushes (so do their compressed sizes, which the bench's ratio and
    link bound count)."""
    rng = np.random.default_rng(4)
    k = 9
    arrays = [(rng.standard_normal(500) * 10.0 ** rng.integers(-5, 2, 500)).astype(np.float32) for _ in range(4)]
    hops = G.ring_payloads(arrays, k, host_compressed=True)
    assert len(hops) == 6
    want = G.ring_allreduce_compressed(arrays, k, host_compressed=True)
    for h in hops[3:]:
        assert bit_mismatches(C.quantize(h, k), want).size == 0
    p = C.quantize(arrays[0], k)
    assert bit_mismatches(hops[0], p).size == 0
    for r, x in enumerate(arrays[1:-1], start=1):
        p = np.add(C.quantize(p, k), C.quantize(x, k), dtype=np.float32)
        assert bit_mismatches(hops[r], p).size == 0
    plain = G.ring_payloads(arrays, k)
    assert bit_mismatches(plain[-1], hops[-1]).size > 0  # the option matters
