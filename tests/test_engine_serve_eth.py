"""Schedule engines served live over real 10G Ethernet, as the VC709 SFP top cables them:
``wirereduce sim serve --topology ring:3 --links eth --host-links eth`` (the cocotb engine of a
:class:`~wirereduce.sim.cluster.schednet.ScheduleNetwork` with ``links="eth"``: MAC + 10GBASE-R PCS at
every network port, the cables carrying scrambled 66-bit blocks; ``host_links="eth"``: each host
behind a simulated NIC cabled to its engine's host port, with the SFP top's source filter) behind
UNIX sockets, driven by one ``wirereduce rank allreduce --topology`` process per rank, and ``sim
allreduce --topology … --links eth --host-links eth --engine cocotb`` on the same build. Every result
is compared bit for bit with the golden model in the schedule's order."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import RECEIVE_TIMEOUT, ROOT, rank_processes, served_engines, sim_allreduce_checked
from wirereduce.sim.golden.schedule import allreduce as golden_allreduce
from wirereduce.sim.golden.schedule import mismatches

from wirereduce import schedule as sched

TOPOLOGY = "ring:3"
NODES = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``wirereduce sim serve --topology ring:3 --links eth --host-links eth --unix DIR`` (a cold Verilator
    build takes minutes)."""
    with served_engines(tmp_path_factory, "engine-serve-eth",
                        ["--topology", TOPOLOGY, "--links", "eth", "--host-links", "eth"],
                        "10G Ethernet links", "hosts behind 10G NICs") as srv:
        yield srv


def _hard_fp32(rng, n):
    a = rng.standard_normal(n).astype(np.float32)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38], np.float32)
    a[rng.choice(n, 30, replace=False)] = rng.choice(special, 30)
    return a


@pytest.mark.cocotb
@pytest.mark.parametrize("algorithm,collective", [("multitree", 10), ("biring", 20)])
def test_ranks_over_served_ethernet_engines(server, algorithm, collective):
    """One `rank allreduce --topology ring:3` process per rank, fp32 with NaN, ±Inf, ±0, subnormals
    and values whose sums overflow, over engines cabled with 10G Ethernet: bit-exact against the
    golden model in the schedule's order (several frames per flow: 3001 elements)."""
    rng = np.random.default_rng(collective)
    arrays = [_hard_fp32(rng, 3001) for _ in range(NODES)]
    tmp = server["tmp"]
    stem = f"{algorithm}{collective}"
    np.savez(tmp / f"{stem}.npz", **{f"node{k}": a for k, a in enumerate(arrays)})
    outs = [tmp / f"{stem}_{k}.npy" for k in range(NODES)]
    rank_processes(NODES, lambda k: ["--topology", TOPOLOGY, "--algorithm", algorithm, "--rank", str(k),
                                     "--unix", str(server["socks"]), "--input", str(tmp / f"{stem}.npz"),
                                     "--output", str(outs[k]), "--barrier", str(tmp / f"bar-{stem}"),
                                     "--collective", str(collective), "--timeout", str(RECEIVE_TIMEOUT)])
    want = golden_allreduce(arrays, sched.build(TOPOLOGY, algorithm), "sum")
    for k in range(NODES):
        got = np.load(outs[k], allow_pickle=False)
        assert mismatches(got, want[k]).size == 0, f"rank {k} differs from the golden {algorithm} allreduce"


@pytest.mark.cocotb
def test_sim_allreduce_links_eth_on_the_cocotb_engine(server, tmp_path, capsys):
    """`wirereduce sim allreduce --topology ring:3 --algorithm ring --links eth --host-links eth --engine
    cocotb --check` reuses the server's build (the same engines and ports) and is bit-exact; int32 sums wrap."""
    rng = np.random.default_rng(5)
    arrays = [rng.integers(-2**31, 2**31, 777, dtype=np.int64).astype(np.int32) for _ in range(NODES)]
    arrays[0][:2] = [2**31 - 1, -2**31]
    arrays[1][:2] = [1, -1]
    arrays[2][:2] = [0, 0]
    got = sim_allreduce_checked(tmp_path, capsys, arrays, TOPOLOGY, "ring", "--links", "eth", "--host-links", "eth",
                                "--engine", "cocotb")
    assert got[0][0] == np.int32(-2**31) and got[0][1] == np.int32(2**31 - 1)   # modulo 2^32


@pytest.mark.cocotb
def test_cocotb_engine_retries_a_chunk_lost_on_a_cable(server, tmp_path, capsys):
    """`sim allreduce --topology ring:3 --algorithm biring --links eth --host-links eth --engine cocotb
    --corrupt 0 40 --corrupt-port 1`: one bit error on node 0's port-1 cable spoils a frame (bad FCS,
    passed on marked bad, never delivered), so its chunk is lost at every host. Without --retries the
    run fails with every rank's report and says what to do; with --retries 1 the ranks agree on the
    lost chunks inside the simulation and sum them again, and every result is bit-exact against the
    golden biring allreduce (the server's build, reused)."""
    from wirereduce.cli import main

    rng = np.random.default_rng(11)
    arrays = [_hard_fp32(rng, 801) for _ in range(NODES)]
    np.savez(tmp_path / "in.npz", **{f"node{k}": a for k, a in enumerate(arrays)})
    argv = ["sim", "allreduce", "--topology", TOPOLOGY, "--algorithm", "biring", "--links", "eth", "--host-links",
            "eth", "--engine", "cocotb", "--corrupt", "0", "40", "--corrupt-port", "1", "--timeout", "20000",
            "--input", str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz"),
            "--build-dir", str(ROOT / "build" / "sim")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "lost chunks" in err and "--retries N sums the lost chunks again" in err, err
    assert main(argv + ["--retries", "1", "--check"]) == 0
    out = capsys.readouterr().out
    assert "lost chunk(s) summed again (--retries)" in out and out.count("bit-exact") == NODES, out
    got = np.load(tmp_path / "out.npz")
    want = golden_allreduce(arrays, sched.build(TOPOLOGY, "biring"), "sum")
    for k in range(NODES):
        assert mismatches(got[f"node{k}"], want[k]).size == 0, k
