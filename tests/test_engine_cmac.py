"""Schedule engines cabled with the U55C top's 100G CMAC glue (``ScheduleNetwork(links="cmac")``:
``CmacTxGlue`` → a model of the CMAC's AXI4-Stream user sides and the cable → ``CmacRxGlue``,
cut-through) on the fast engine: two 512-bit engines, bit-exact against the golden model in table
order, every frame sent counted received, and a bit error on one cable counted at the port on its
far end and never summed. One build (what ``wirereduce sim allreduce --topology ring:2 --width 512
--links cmac --formats fp32`` builds) serves every test here, the CLI's included: fp32-only lanes
halve the 512-bit engine's build (133 s against 301 s cold, on this machine) and carry every fp32 bit
the same way (the other formats' deep lanes: tests/test_lanes.py, tests/test_lanes_exhaustive.py;
through engines: tests/test_engine.py, tests/test_engine_eth.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import edge_arrays
from test_engine_eth import cable_error_counted
from wirereduce.sim.engines.fastengine import FastEngineSim, golden_check

from wirereduce import schedule as sched
from wirereduce.config import EngineConfig

pytestmark = pytest.mark.verilator
ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "sim-engine-cmac"
#: What the CLI builds for ring:2 at 512 bit with ``--formats fp32`` (16 slots, ports = degree, max_flows = 8).
CFG = EngineConfig(512, 1500, slots=16, ports=2, max_flows=8, formats=("fp32",))
LOSSES = ("_fcs_errors", "_stomped", "_overflow", "_ethertype_drops")


@pytest.fixture(scope="module")
def cmac2():
    return FastEngineSim("ring:2", CFG, 4, links="cmac", build_root=BUILD)


@pytest.mark.parametrize("alg", ["biring", "multitree"])
def test_bitexact_and_every_frame_counted(cmac2, alg):
    """Edge values (NaN, ±Inf, ±0, subnormals), several frames a flow: bit-exact; each port's
    glue counted as many frames received as the port on the other end of its cable sent; no
    engine or port lost one."""
    s = sched.build("ring:2", alg)
    arrays = edge_arrays(2, 3001, seed=31)
    r = cmac2.allreduce(arrays, s, final_stats=True)
    assert golden_check(arrays, s, r.results) == [0, 0]
    st = r.final_stats
    for u in range(2):
        for p, (v, q) in enumerate(s.topology.links[u]):
            assert st[u][f"net{p}_tx_frames"] > 0
            assert st[u][f"net{p}_tx_frames"] == st[v][f"net{q}_rx_frames"], (u, p, v, q)
        assert st[u]["result_frames"] == st[u]["chunks"]
        lost = {k: v for k, v in st[u].items() if v and (k.startswith(("drop_", "link_drop_")) or k.endswith(LOSSES))}
        assert not lost, (u, lost)


def test_bit_error_on_a_100g_cable_is_counted_where_it_happened(cmac2):
    """A bit flipped in the 3rd 512-bit beat node 0 sends out of its port 0 (a payload beat of its
    first data frame): the CMAC model flags the frame (``tuser``), the far end's glue counts it on
    its own port (``net{q}_rx_fcs_errors``, ``link_drop_net{q}``) and the engine never sums it; the
    run stalls with the count in its message instead of a wrong result."""
    s = sched.build("ring:2", "biring")
    arrays = edge_arrays(2, 3001, seed=32)
    cable_error_counted(cmac2, s, arrays, 3, 20_000)
    with pytest.raises(ValueError, match="links='eth'"):   # no wirereduce-header mode on a 100G cable
        cmac2.allreduce(arrays, s, corrupt=(0, 0, 1, "header"))
    with pytest.raises(ValueError, match="pcap"):
        cmac2.allreduce(arrays, s, pcap="x.pcap")


def test_cli_sim_allreduce_links_cmac(cmac2, tmp_path, capsys):
    """``wirereduce sim allreduce --topology ring:2 --algorithm biring --width 512 --links cmac
    --engine fast --formats fp32 --check`` (the fixture's build): bit-exact at both nodes; with ``--corrupt 0 3``
    it stalls and says where the frame was lost (exit 2, no traceback)."""
    from wirereduce.cli import main

    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(5000).astype(np.float32) for _ in range(2)]
    np.savez(tmp_path / "in.npz", **{f"node{k}": a for k, a in enumerate(arrays)})
    args = ["sim", "allreduce", "--topology", "ring:2", "--algorithm", "biring", "--width", "512", "--links", "cmac",
            "--engine", "fast", "--input", str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz"),
            "--build-dir", str(BUILD), "--formats", "fp32"]
    assert main(args + ["--check"]) == 0
    out = capsys.readouterr().out
    assert out.count("bit-exact") == 2, out
    got = np.load(tmp_path / "out.npz")
    assert golden_check(arrays, sched.build("ring:2", "biring"), [got["node0"], got["node1"]]) == [0, 0]
    assert main(args + ["--timeout", "20000", "--corrupt", "0", "3"]) == 2
    err = capsys.readouterr().err
    assert "stalled" in err and "link_drop_net" in err, err
