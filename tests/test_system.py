"""System tests: the generated Verilog of an N-node ring, simulated with cocotb, driven through the
host driver, checked bit for bit against the numpy golden allreduce.

Each (nodes, simulator) case builds once and runs all its jobs in one simulation; on a failure the
case is run again with waveforms on and the failure names the waveform file.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_node import edge_arrays
from wirereduce.sim.engines.runner import SimSetup, SimulationError, available_simulators, run_jobs
from wirereduce.sim.golden.allreduce import bit_mismatches, ring_allreduce

from wirereduce.protocol import Header, Opcode, frame, max_elements

pytestmark = pytest.mark.cocotb
SIMS = available_simulators()
EPF = max_elements(1500)


def need(sim):
    if sim not in SIMS:
        pytest.skip(f"{sim} is not installed (icarus: apt-get install iverilog)")


def run_with_waves_on_failure(setup, jobs, tmp_root, check):
    """Run ``jobs``; if the run or ``check(records)`` fails, rerun with waves and re-raise with the path."""
    try:
        records = run_jobs(setup, jobs, build_root=tmp_root)
        check(records)
        return records
    except (SimulationError, AssertionError) as first:
        try:
            records = run_jobs(setup, jobs, build_root=tmp_root, waves=True)
            check(records)
        except SimulationError as e:
            raise AssertionError(f"{first}\nwaveform of the rerun: {e.waves}") from first
        except AssertionError as again:
            waves = sorted((tmp_root).rglob("*.fst")) + sorted((tmp_root).rglob("*.vcd"))
            raise AssertionError(f"{again}\nwaveforms: {[str(w) for w in waves]}") from first
        raise


def check_allreduce(rec, arrays, label):
    want = ring_allreduce(arrays)
    for k, got in enumerate(rec["results"]):
        bad = bit_mismatches(got, want)
        assert bad.size == 0, (f"{label}: node{k} differs from the golden model at {bad.size} elements, "
                               f"first {bad[:5].tolist()}: got {got[bad[:5]].view(np.uint32)}, "
                               f"want {want[bad[:5]].view(np.uint32)}")


def bad_frame_jobs(nodes):
    """Frames every node must drop and count: unknown opcode, and a push of a stale collective."""
    x = np.arange(4, dtype=np.float32)
    return [
        {"op": "send", "node": nodes - 1, "frame": frame(Header(opcode=0x42, collective=1, count=4), x)},
        {"op": "send", "node": 0, "frame": frame(Header(opcode=Opcode.HOST_PUSH, collective=999, count=4), x)},
    ]


LENGTHS = [1, 7, EPF, EPF + 1, 2 * EPF + 5]


@pytest.mark.parametrize("nodes", [2, 3, 8])   # 4 ring nodes: tests/test_deploy.py, test_ethring.py, the fuzz suite
def test_ring_allreduce(nodes, tmp_path_factory):
    """Lengths of 1, odd, non-multiples of the lane count and of the frame payload, several frames;
    edge values (±0, subnormals, Inf, NaN, overflow, cancellation); then bad frames and stats."""
    need("verilator")
    inputs = [edge_arrays(nodes, n, seed=17 * nodes + n) for n in LENGTHS]
    jobs = [{"op": "allreduce", "arrays": a} for a in inputs]
    jobs += bad_frame_jobs(nodes)
    jobs += [{"op": "allreduce", "arrays": inputs[1]}]  # the ring still works after the bad frames
    jobs += [{"op": "stats", "node": k} for k in range(nodes)]
    setup = SimSetup(nodes=nodes, simulator="verilator")

    def check(records):
        for n, a, rec in zip(LENGTHS, inputs, records):
            check_allreduce(rec, a, f"{n} elements")
        check_allreduce(records[len(LENGTHS) + 2], inputs[1], "after bad frames")
        stats = {r["node"]: r["stats"] for r in records if r["op"] == "stats"}
        assert stats[nodes - 1]["drop_opcode"] == 1, stats[nodes - 1]
        assert stats[0]["drop_collective"] == 1, stats[0]
        total_chunks = sum(-(-n // EPF) for n in LENGTHS) + 1
        for k in range(nodes):
            assert stats[k]["result_frames"] == total_chunks, stats[k]

    run_with_waves_on_failure(setup, jobs, tmp_path_factory.mktemp(f"ring{nodes}"), check)


@pytest.mark.parametrize("sim", ["verilator", "icarus"])
def test_real_gradients(sim, tmp_path_factory):
    """Gradients of a real CNN on the digits data set, 4 data-parallel shards, both simulators."""
    need(sim)
    gradients = pytest.importorskip("wirereduce.sim.workloads.gradients")
    pytest.importorskip("torch")
    arrays = gradients.shard_gradients(nodes=4, steps=3, seed=1)
    setup = SimSetup(nodes=4, simulator=sim)

    def check(records):
        check_allreduce(records[0], arrays, f"real gradients on {sim}")
        assert records[0]["cycles"] > 0

    run_with_waves_on_failure(setup, [{"op": "allreduce", "arrays": arrays}],
                              tmp_path_factory.mktemp(f"grads_{sim}"), check)


def test_bad_job_raises_before_building(tmp_path):
    setup = SimSetup(nodes=2)
    with pytest.raises(ValueError, match="float32"):
        run_jobs(setup, [{"op": "allreduce", "arrays": [np.zeros(3), np.zeros(3)]}], build_root=tmp_path / "b")
    with pytest.raises(ValueError, match="node"):
        run_jobs(setup, [{"op": "stats", "node": 5}], build_root=tmp_path / "b")
    assert not (tmp_path / "b").exists()
