"""The VC709 PCIe top's engine (boards/vc709_engine_top.py): a 256-bit schedule engine at 156.25 MHz
behind 10G network ports, so that its host port carries up to 40 Gbit/s (docs/boards.md "PCIe host
link"). Fast engine (Verilator + frame player): bit-exact against the golden model, and a host link
faster than a network port at the board's own clock, which a 64-bit engine cannot have."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from helpers import edge_arrays
from wirereduce.sim.cluster.network import clock_mhz, line_bytes_per_cycle, line_rate_gbps
from wirereduce.sim.cluster.schednet import engine_rates
from wirereduce.sim.engines.fastengine import FastEngineSim, golden_check

from wirereduce import schedule as sched
from wirereduce.config import EngineConfig

#: The PCIe top's engine on a ring (P = 2), with the fp32 and bf16 lanes: the engines `sim allreduce
#: --topology ring:4 --algorithm biring --width 256 --formats fp32 bf16` builds (one build for both).
CFG = EngineConfig(256, 1500, slots=16, ports=2, max_flows=8, formats=("fp32", "bf16"))
#: 40 Gbit/s: the host port's rate at 256 bit and 156.25 MHz.
HOST_GBPS = 40.0
#: Where the fixture and the CLI test build (the same model).
BUILD = "build/fastengine"


def test_256_bit_rates_are_the_pcie_tops():
    """256 bit runs at the 10G ports' 156.25 MHz with 10G links (8 bytes a cycle: a quarter of a
    beat), and a 40 Gbit/s host link needs no faster clock: it is the engine's full width."""
    assert clock_mhz(256) == 156.25 and line_rate_gbps(256) == 10.0
    assert line_bytes_per_cycle(256) == 8
    assert engine_rates(256, HOST_GBPS) == (156.25, Fraction(8), Fraction(32))
    # a 64-bit engine needs a 5x clock to model the same host link (docs/architecture.md "Host link")
    assert engine_rates(64, HOST_GBPS)[0] == 625.0


@pytest.fixture(scope="module")
def ring4_256():
    """One build: four 256-bit engines in a ring, 10G links (8 bytes a cycle), 40G hosts."""
    mhz, link, host = engine_rates(256, HOST_GBPS)
    return FastEngineSim("ring:4", CFG, 4, link_rate=link, host_rate=host, build_root=BUILD)


@pytest.mark.verilator
@pytest.mark.parametrize("alg,n", [("ring", 1), ("ring", 3001), ("biring", 9), ("biring", 4999)])
def test_256_bit_engines_bitexact(ring4_256, alg, n):
    s = sched.build("ring:4", alg)
    arrays = edge_arrays(4, n, seed=n)
    r = ring4_256.allreduce(arrays, s)
    assert golden_check(arrays, s, r.results) == [0, 0, 0, 0]


@pytest.mark.verilator
def test_256_bit_engines_bf16_bitexact(ring4_256):
    """bf16 packs 16 elements into a 256-bit beat's eight 32-bit lanes."""
    import ml_dtypes

    s = sched.build("ring:4", "biring")
    rng = np.random.default_rng(7)
    arrays = [(rng.standard_normal(2001) * 2.0 ** rng.integers(-20, 20, 2001)).astype(ml_dtypes.bfloat16)
              for _ in range(4)]
    r = ring4_256.allreduce(arrays, s)
    assert golden_check(arrays, s, r.results) == [0, 0, 0, 0]


@pytest.mark.verilator
def test_host_link_faster_than_a_network_port(ring4_256):
    """At the board's clock the host port moves more than one 10G network port: biring on the
    same engines beats 10 Gbit/s of algbw (B·N/(N − 1) = 13.3 Gbit/s is its bound), which no schedule
    can behind a 10G host port (every host pushes and receives the whole message); the NTT ring
    stays at one link's rate. Simulated cycles, deterministic."""
    elements = 1 << 16   # 256 KiB a node
    rng = np.random.default_rng(11)
    arrays = [rng.standard_normal(elements).astype(np.float32) for _ in range(4)]
    us = {}
    for alg in ("ring", "biring"):
        s = sched.build("ring:4", alg)
        r = ring4_256.allreduce(arrays, s)
        assert golden_check(arrays, s, r.results) == [0, 0, 0, 0]
        us[alg] = r.cycles / clock_mhz(256)
    gbps = {alg: elements * 4 * 8 / (t * 1e3) for alg, t in us.items()}
    assert gbps["ring"] < 10.0 < 11.0 < gbps["biring"], gbps
    assert us["ring"] / us["biring"] > 1.15, us


@pytest.mark.verilator
def test_cli_sim_allreduce_width_256(ring4_256, tmp_path, capsys):
    """`wirereduce sim allreduce --topology ring:4 --algorithm biring --width 256 --host-link-gbps 40`:
    the fixture's engines (the same build), the .npz result bit-exact, the figures at 156.25 MHz."""
    from wirereduce.cli import main

    arrays = edge_arrays(4, 1001, seed=41)
    inp, out = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(inp, **{f"node{k}": a for k, a in enumerate(arrays)})
    code = main(["sim", "allreduce", "--topology", "ring:4", "--algorithm", "biring", "--width", "256",
                 "--host-link-gbps", "40", "--formats", "fp32", "bf16", "--slots", "16", "--input", str(inp),
                 "--output", str(out), "--check", "--build-dir", BUILD])
    text = capsys.readouterr().out
    assert code == 0, text
    with np.load(out) as got:
        results = [got[f"node{k}"] for k in range(4)]
    assert golden_check(arrays, sched.build("ring:4", "biring"), results) == [0, 0, 0, 0]
    assert "node3: bit-exact" in text and "156.25 MHz" in text, text
