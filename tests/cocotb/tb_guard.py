"""cocotb testbench: the collective guard on a simulated 3-node ring, through the host driver.

``tests/test_guard.py`` builds the Verilator model (:func:`build`) and runs :func:`guard`
(:func:`run_case`). One simulation, in order:

1. another host's CONTROL arrives at rank 1 in the middle of a collective: refused, counted in
   ``control_refused``, answered with a STATS frame that shows the unchanged configuration and
   echoes the intruder's request tag; the collective completes bit-exact;
2. a collective left running (only its first chunk pushed) makes the next allreduce's CONTROL be
   refused at every node (:class:`~wirereduce.host.driver.ControlRefused`, which says to pass
   ``abort=True``); with ``abort=True`` the new collective runs, bit-exact;
3. after it, an allreduce without ABORT is taken again (the node knows its collective finished).
"""

from __future__ import annotations

from pathlib import Path

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles
from wirereduce.host.driver import Cluster, ControlRefused, default_window, parse_stats
from wirereduce.host.transports.cocotb import CocotbTransport, start_network
from wirereduce.sim.golden.allreduce import bit_mismatches, ring_allreduce

from wirereduce.config import NodeConfig
from wirereduce.protocol import Header, Opcode

NODES = 3
CONFIG = NodeConfig(64, 1500, slots=4)
PERIOD_PS = 6400
TOP = "wirereduce_net"


def build(build_dir: str | Path):
    """Build the Verilator model of a 3-node ring of :data:`CONFIG` nodes on link models."""
    from wirereduce.sim.cluster.network import network_verilog
    from wirereduce.sim.engines.runner import build_block_model

    runner, build_dir = build_block_model(network_verilog(NODES, CONFIG, 4), TOP, build_dir)
    return runner, build_dir


def run_case(sim, case: str) -> tuple[int, Path]:
    """Run cocotb test ``case`` of this module; (failures, log file)."""
    from wirereduce.sim.engines.runner import run_block_case

    runner, build_dir = sim
    return run_block_case(runner, build_dir, TOP, "tb_guard", case)


class TapTransport(CocotbTransport):
    """A :class:`CocotbTransport` that keeps every frame each host received (``seen``)."""

    def __init__(self, dut, nodes: int, **kw):
        super().__init__(dut, nodes, **kw)
        self.seen = [[] for _ in range(nodes)]

    async def recv(self, node: int, timeout_cycles: int | None = None) -> bytes:
        data = await super().recv(node, timeout_cycles)
        self.seen[node].append(data)
        return data


async def _reset(dut):
    await start_network(dut, NODES, PERIOD_PS)


def _exact(results, arrays, what: str):
    want = ring_allreduce(arrays)
    for k, r in enumerate(results):
        bad = bit_mismatches(r, want)
        assert bad.size == 0, f"{what}: node {k} differs from the golden sum at {bad.size} elements"


def _answers(frames, tag: int) -> list[dict]:
    return [parse_stats(f) for f in frames
            if Header.unpack(f).opcode == Opcode.STATS and parse_stats(f)["request_tag"] == tag]


@cocotb.test()
async def guard(dut):
    await _reset(dut)
    t = TapTransport(dut, NODES, clock_period_ns=PERIOD_PS / 1000)
    progress = []
    cluster = Cluster(t, CONFIG, window=default_window(CONFIG), link_rate=8,
                      on_chunk=lambda node, seq: progress.append((node, seq)))
    rng = np.random.default_rng(14)
    epf = CONFIG.max_elements

    # 1. An intruding CONTROL at rank 1 while collective 1 (8 chunks) runs.
    a = [rng.standard_normal(8 * epf - 5).astype(np.float32) for _ in range(NODES)]
    task = cocotb.start_soon(cluster.allreduce(a))
    while not any(node == 1 for node, _ in progress):
        await ClockCycles(dut.clk, 5)
    intruder = Header(opcode=Opcode.CONTROL, collective=77, src=1, hop=NODES, seq=1, count=0xBEEF).pack()
    await t.send(1, intruder)
    _exact(await task, a, "collective 1 with an intruding CONTROL")
    (answer,) = _answers(t.seen[1], 0xBEEF)
    assert (answer["collective"], answer["rank"], answer["nodes"], answer["chunks"]) == (1, 1, NODES, 8), answer
    assert answer["control_refused"] == 1, answer
    st = await cluster.stats(1)
    assert st["control_refused"] == 1 and st["collective"] == 1 and st["result_frames"] == 8, st

    # 2. Collective 2 left running: CONTROL, and only chunk 0 of 3 pushed and summed.
    b = [rng.standard_normal(3 * epf).astype(np.float32) for _ in range(NODES)]
    rnd = cluster.plan(b).round
    for s in rnd.sessions:
        await t.send(s.rank, rnd.control(s.rank))
        s.check_ack(await t.recv(s.rank))
    for s in rnd.sessions:
        await t.send(s.rank, next(iter(rnd.pushes(s.rank))).frame)
    for s in rnd.sessions:
        assert s.receive(await t.recv(s.rank)) and s.received[0]
    c = [rng.standard_normal(2 * epf + 7).astype(np.float32) for _ in range(NODES)]
    try:
        await cluster.allreduce(c)
    except ControlRefused as e:
        msg = str(e)
        for k in range(NODES):
            assert f"node {k} refused the CONTROL of collective 3" in msg, msg
        assert "running collective 2" in msg and "abort=True" in msg, msg
    else:
        raise AssertionError("a CONTROL without ABORT was taken while collective 2 was running")
    _exact(await cluster.allreduce(c, abort=True), c, "collective 4, aborting collective 2")
    for k in range(NODES):
        st = await cluster.stats(k)
        assert st["collective"] == 4 and st["control_refused"] == (2 if k == 1 else 1), (k, st)

    # 3. Collective 4 finished everywhere: the next CONTROL needs no ABORT.
    d = [rng.standard_normal(9).astype(np.float32) for _ in range(NODES)]
    _exact(await cluster.allreduce(d), d, "collective 5 after the aborting one")
