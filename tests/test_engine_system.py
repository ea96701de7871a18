"""Schedule-engine networks in the fast engine (Verilator + frame player): every algorithm
bit-exact against the golden model in table order, and the same bits whatever the link latencies
and host back-pressure."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from helpers import edge_arrays
from wirereduce.host.driver import DriverError
from wirereduce.host.engine import EngineSession
from wirereduce.sim.engines.fastengine import FastEngineSim, golden_check

from wirereduce import schedule as sched
from wirereduce.config import EngineConfig
from wirereduce.protocol import Header, Opcode

pytestmark = pytest.mark.verilator

CFG2 = EngineConfig(64, 1500, slots=8, ports=2, max_flows=64)


@pytest.fixture(scope="module")
def ring4():
    """One build: four P = 2 engines in a ring, links at 10G, hosts at 50G (5x)."""
    return FastEngineSim("ring:4", CFG2, 4, link_rate=Fraction(8, 5), host_rate=8, jitter=5, seed=3)


@pytest.mark.parametrize("alg,n", [("ring", 1), ("ring", 3001), ("biring", 7), ("biring", 5000)])
def test_ring4_bitexact(ring4, alg, n):
    s = sched.build("ring:4", alg)
    arrays = edge_arrays(4, n, seed=n)
    r = ring4.allreduce(arrays, s)
    assert golden_check(arrays, s, r.results) == [0, 0, 0, 0]
    assert r.chunks == len(EngineSession(0, s, CFG2, 1, arrays[0], 8).chunks)
    for st in r.stats:
        assert st["chunks"] == r.chunks and st["nodes"] == len(s.flows)


def test_short_chunks_same_bits(ring4):
    """``chunk_words``: chunks shorter than a frame (more chunks per flow for a small message), or
    a profile of sizes per round, give the same bits as full frames, and the number of chunks the
    plan says; bad values raise before anything runs."""
    s = sched.build("ring:4", "biring")
    arrays = edge_arrays(4, 3001, seed=31)
    full = ring4.allreduce(arrays, s)
    short = ring4.allreduce(arrays, s, chunk_words=64)
    assert golden_check(arrays, s, short.results) == [0, 0, 0, 0]
    assert np.array_equal(np.concatenate(short.results).view(np.uint32), np.concatenate(full.results).view(np.uint32))
    per_flow = [-(-(r.stop - r.start) // 64) for r in s.split(3001)]
    assert short.chunks == sum(per_flow) > full.chunks
    # A chunk profile (one size per round, the last repeated): chunks of different sizes in one
    # collective, the same bits again.
    ramp = ring4.allreduce(arrays, s, chunk_words=(16, 48, 200, 371))
    assert np.array_equal(np.concatenate(ramp.results).view(np.uint32), np.concatenate(full.results).view(np.uint32))
    counts = [min(e, r.stop - r.start - o) for r in s.split(3001)
              for o, e in zip((0, 16, 64, 264, 635, 1006), (16, 48, 200, 371, 371, 371)) if o < r.stop - r.start]
    assert ramp.chunks == len(counts)
    for bad in (0, CFG2.max_elements + 1, 2.0, (), (16, 0), (16, CFG2.max_elements + 1), (16, 2.0), "16"):
        with pytest.raises(ValueError, match="chunk_words"):
            ring4.allreduce(arrays, s, chunk_words=bad)
    # Compressed: up to what a compressed frame holds whatever the values (349 at MTU 1500), not 371.
    codec_cfg = EngineConfig(64, 1500, ports=2, codec=True)
    assert EngineSession(0, s, codec_cfg, 1, arrays[0], 8, compression=10, chunk_words=16).chunks[0].count == 16
    with pytest.raises(ValueError, match="chunk_words must be an int from 1 to 349"):
        EngineSession(0, s, codec_cfg, 1, arrays[0], 8, compression=10, chunk_words=(16, 350))


def test_same_bits_any_timing(ring4):
    """Host back-pressure and gaps at three seeds (the links have per-link latency jitter): the
    results are the golden model's, bit for bit, every time."""
    s = sched.build("ring:4", "biring")
    arrays = edge_arrays(4, 2000, seed=11)
    runs = [ring4.allreduce(arrays, s, rx_valid_prob=0.7, tx_ready_prob=0.6, seed=seed) for seed in (1, 2, 3)]
    bits = [np.concatenate(r.results).view(np.uint32) for r in runs]
    assert golden_check(arrays, s, runs[0].results) == [0, 0, 0, 0]
    assert all(np.array_equal(b, bits[0]) for b in bits[1:])
    assert len({r.cycles for r in runs}) > 1  # the timing did change


def test_torus2x2_multitree_and_multiring_bitexact():
    sim = FastEngineSim("torus:2x2", CFG2, 4, link_rate=Fraction(8, 5), host_rate=8)
    for alg in ("multitree", "multitree-balanced", "multiring"):
        s = sched.build("torus:2x2", alg)
        for n in (1, 777):
            arrays = edge_arrays(4, n, seed=n + 1)
            assert golden_check(arrays, s, sim.allreduce(arrays, s).results) == [0, 0, 0, 0]


def test_bad_arguments_raise_before_running(ring4):
    s = sched.build("ring:4", "ring")
    with pytest.raises(ValueError, match="window"):
        ring4.allreduce([np.zeros(4, np.float32)] * 4, s, window=9)
    with pytest.raises(ValueError, match="torus"):
        ring4.allreduce([np.zeros(4, np.float32)] * 4, sched.build("torus:2x2", "multitree"))
    with pytest.raises(ValueError, match="ports"):
        FastEngineSim("torus:4x4", CFG2)


def test_session_rejects_foreign_results():
    s = sched.build("ring:4", "biring")
    sess = EngineSession(0, s, CFG2, 9, np.arange(100, dtype=np.float32), 4)
    c = sess.chunks[1]
    good = Header(opcode=Opcode.HOST_RESULT, collective=9, seq=1, hop=c.flow, count=c.count).pack()
    good += bytes(4 * c.count)
    sess.receive(good)
    with pytest.raises(DriverError, match="twice"):
        sess.receive(good)
    # a late result of another (aborted) collective, and a stray STATS: recorded and ignored
    stale = Header(opcode=Opcode.HOST_RESULT, collective=8, seq=2, hop=2, count=1)
    sess.receive(stale.pack() + bytes(4))
    sess.receive(Header(opcode=Opcode.STATS).pack())
    assert [(h.opcode, h.collective) for h in sess.unexpected] == [(Opcode.HOST_RESULT, 8), (Opcode.STATS, 0)]
    assert sess.received == {1} and not sess.done
    with pytest.raises(DriverError, match="does not match"):
        sess.receive(Header(opcode=Opcode.HOST_RESULT, collective=9, seq=2, hop=3, count=c.count).pack()
                     + bytes(4 * c.count))
    assert [p.after for p in sess.push_frames()][:6] == [0, 0, 0, 0, 1, 2]


# --- element formats and operations (wirereduce.formats) -------------------------------------------------------------


def format_arrays(name: str, nodes: int, n: int, seed: int) -> list[np.ndarray]:
    """Arrays of format ``name``: every special class (±0, subnormals, ±Inf, NaNs, max finite), random
    bit patterns, values of mixed magnitude, exact cancellation; int32 across the whole range (wraps)."""
    from wirereduce.formats import FORMATS

    f = FORMATS[name]
    rng = np.random.default_rng(seed)
    if name == "fp32":
        return edge_arrays(nodes, n, seed)
    if name == "int32":
        out = [rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32) for _ in range(nodes)]
        out[0][:1] = 2**31 - 1
        out[1][:1] = 1          # wraps at the first add
        return out
    dt, u = f.numpy_dtype, f.uint
    specials = np.array([0, 0x8000, 1, 0x8001, (1 << f.frac_bits) - 1, 1 << f.frac_bits,
                         ((1 << f.exp_bits) - 2) << f.frac_bits | ((1 << f.frac_bits) - 1),
                         (1 << f.exp_bits) - 1 << f.frac_bits, 0x8000 | ((1 << f.exp_bits) - 1 << f.frac_bits),
                         ((1 << f.exp_bits) - 1 << f.frac_bits) | 1], dtype=u)
    out = []
    for _ in range(nodes):
        a = (rng.standard_normal(n) * 2.0 ** rng.integers(-12, 12, n)).astype(np.float32).astype(dt).view(u).copy()
        pick = rng.random(n) < 0.3
        a[pick] = rng.choice(specials, pick.sum())
        wild = rng.random(n) < 0.1
        a[wild] = rng.integers(0, 1 << 16, wild.sum()).astype(u)
        out.append(a.view(dt))
    out[0][:1] = np.float32(1.5)
    out[1][:1] = np.float32(-1.5)
    return out


@pytest.mark.parametrize("name,op,alg,n", [
    ("bf16", "sum", "biring", 3001), ("fp16", "sum", "ring", 2999), ("int32", "sum", "biring", 1500),
    ("fp32", "max", "ring", 700), ("bf16", "min", "biring", 1201), ("fp16", "max", "biring", 9),
    ("int32", "min", "ring", 333), ("fp32", "min", "biring", 1),
])
def test_formats_bitexact(ring4, name, op, alg, n):
    """Every format and operation through four engines, bit for bit against the golden model in table
    order; 16-bit formats with an odd element count (a padded last word)."""
    s = sched.build("ring:4", alg)
    arrays = format_arrays(name, 4, n, seed=n)
    r = ring4.allreduce(arrays, s, op=op)
    assert [x.dtype for x in r.results] == [arrays[0].dtype] * 4
    assert golden_check(arrays, s, r.results, op) == [0, 0, 0, 0]


def test_bf16_frames_carry_twice_the_elements(ring4):
    """bf16 packs two elements per payload word: the same element count takes half the chunks."""
    s = sched.build("ring:4", "biring")
    fp = format_arrays("fp32", 4, 4000, seed=5)
    from wirereduce.formats import FORMATS

    bf = [a.astype(FORMATS["bf16"].numpy_dtype) for a in fp]
    r32, r16 = ring4.allreduce(fp, s), ring4.allreduce(bf, s)
    assert golden_check(bf, s, r16.results) == [0, 0, 0, 0]
    assert r16.bytes * 2 == r32.bytes and r16.chunks < r32.chunks


def test_format_arguments_raise_before_running(ring4):
    s = sched.build("ring:4", "ring")
    with pytest.raises(ValueError, match="sum, max or min"):
        ring4.allreduce([np.zeros(4, np.float32)] * 4, s, op="prod")
    with pytest.raises(ValueError, match="unsupported element format"):
        ring4.allreduce([np.zeros(4, np.float64)] * 4, s)
    with pytest.raises(ValueError, match="node1"):
        ring4.allreduce([np.zeros(4, np.float32), np.zeros(4, np.float16)] + [np.zeros(4, np.float32)] * 2, s)


def test_cli_sim_allreduce_on_the_engine(tmp_path, capsys):
    """``wirereduce sim allreduce --topology … --engine fast --check`` end to end: the .npz it writes
    is the golden model's allreduce in table order, bit for bit, and it prints the speed."""
    from wirereduce.cli import main

    arrays = edge_arrays(2, 700, seed=21)
    inp, out = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(inp, node0=arrays[0], node1=arrays[1])
    code = main(["sim", "allreduce", "--topology", "ring:2", "--algorithm", "biring", "--engine", "fast",
                 "--host-link-gbps", "50", "--input", str(inp), "--output", str(out), "--check",
                 "--build-dir", "build/sim-engine-cli"])
    text = capsys.readouterr().out
    assert code == 0, text
    with np.load(out) as got:
        results = [got["node0"], got["node1"]]
    assert golden_check(arrays, sched.build("ring:2", "biring"), results) == [0, 0]
    assert "node1: bit-exact" in text and "simulation speed=" in text
