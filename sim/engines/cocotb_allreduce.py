"""cocotb testbench of the simulated cluster: runs the jobs :func:`wirereduce.sim.engines.runner.run_jobs` wrote.

It drives ``wirereduce_net`` only through the host driver (:class:`wirereduce.host.driver.Cluster`
over :class:`wirereduce.host.transports.cocotb.CocotbTransport`), as a user drives real boards.
"""

from __future__ import annotations

import json
import os
import time

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Timer
from cocotb.utils import get_sim_time
from wirereduce.host.driver import Cluster, default_window
from wirereduce.host.transports.cocotb import CocotbTransport

from wirereduce.config import NodeConfig
from wirereduce.protocol import HEADER_BYTES


@cocotb.test()
async def run_jobs(dut):
    """Run every job of ``$WIREREDUCE_JOBS`` in order and write the records and outputs."""
    spec = json.loads(open(os.environ["WIREREDUCE_JOBS"]).read())
    setup = spec["setup"]
    nodes = setup["nodes"]
    config = NodeConfig(**setup["config"])
    period_ps = round(1e6 / spec["clock_mhz"])
    inputs = np.load(spec["inputs"])

    dut.rst.value = 1
    # Drive every host input to a known value: Icarus is 4-state, and undriven (Z) bus inputs
    # would otherwise reach the frame gates' header logic as X.
    for k in range(nodes):
        for name in ("tvalid", "tdata", "tkeep", "tlast"):
            getattr(dut, f"host{k}_rx_{name}").value = 0
        getattr(dut, f"host{k}_tx_tready").value = 0
    # The Ethernet network's fault-injection inputs (links="eth"): 0, no fault. Left undriven they
    # are X under Icarus, and the X reaches every data block on the ring cables.
    for name in ("flip_link", "flip_block"):
        if hasattr(dut, name):
            getattr(dut, name).value = 0
    # The first clock edge comes after reset and the inputs are set, so no register samples X.
    await Timer(period_ps, "ps")
    cocotb.start_soon(Clock(dut.clk, period_ps, unit="ps").start())
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 2)

    transport = CocotbTransport(dut, nodes, clock_period_ns=period_ps / 1000)
    bar = None
    on_chunk = None
    if spec["progress"]:
        from tqdm import tqdm

        def on_chunk(node, seq):
            bar.update(1)

    # The window a user sets on a link without back-pressure: the nodes' buffer slots. Each round's
    # deadline: the driver's, from the message size, the ring size and the links' rate, or the override.
    cluster = Cluster(transport, config, on_chunk=on_chunk, window=default_window(config),
                      link_rate=spec["link_rate"], timeout_cycles=spec["timeout_cycles"])

    def now_cycles() -> int:
        return round(get_sim_time("ps") / period_ps)

    records, outputs = [], {}
    for j, job in enumerate(spec["jobs"]):
        op = job["op"]
        if op == "allreduce":
            arrays = [inputs[f"job{j}_node{k}"] for k in range(nodes)]
            plan = cluster.plan(arrays, compression=job.get("compression"), retries=job.get("retries", 0))
            n = plan.elements
            if spec["progress"]:
                bar = tqdm(total=plan.frames * nodes, unit="chunk", desc=f"allreduce {n} elements x {nodes} nodes",
                           leave=True)
            start = now_cycles()
            wall = time.perf_counter()
            results = await cluster.run(plan)
            wall = time.perf_counter() - wall
            cycles = now_cycles() - start
            if bar is not None:
                bar.close()
            for k, r in enumerate(results):
                outputs[f"job{j}_node{k}"] = r
            records.append({"op": op, "cycles": cycles, "elements": n, "bytes": n * 4,
                            "frames": plan.frames, "frame_header_bytes": HEADER_BYTES, "wall_s": wall})
        elif op == "send":
            await transport.send(job["node"], bytes.fromhex(job["frame"]))
            records.append({"op": op, "node": job["node"]})
        elif op == "stats":
            stats = await cluster.stats(job["node"])
            records.append({"op": op, "node": job["node"], "stats": stats})
    # Let anything still in flight drain, so a stray frame shows up in a later stats job's counters.
    await ClockCycles(dut.clk, 10)

    np.savez(spec["outputs"], **outputs)
    with open(spec["records"], "w") as f:
        json.dump(records, f)
