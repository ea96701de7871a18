"""cocotb testbench of a network of schedule engines: one allreduce that
:func:`wirereduce.sim.engines.runner.run_engine_allreduce` wrote.

Every rank is an :class:`~wirereduce.host.rank.EngineRankDriver` on one
:class:`~wirereduce.host.transports.cocotb.CocotbTransport` (the same driver a rank process runs
against a board or ``sim serve --topology``): it loads its node's table, starts the collective,
waits at a barrier until every node took its CONTROL, pushes within the window and collects. With
``retries`` the ranks agree on the lost chunks through an in-simulation exchange and sum them again
(:class:`~wirereduce.host.rank.EngineRankDriver` ``retries``); ``flip`` sets the network's fault
injection (one bit error on one cable) before anything is sent.
"""

from __future__ import annotations

import json
import os
import time

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, Event
from wirereduce.host.driver import ChunksLost
from wirereduce.host.rank import EngineRankDriver
from wirereduce.host.transports.cocotb import Barrier, CocotbTransport, start_network

from wirereduce import schedule as sched
from wirereduce.config import EngineConfig


class _Exchange:
    """Every rank's ``exchange(value)`` for :class:`EngineRankDriver` retries: awaits every rank's
    value of the same round, returns them in rank order."""

    def __init__(self, parties: int):
        self.parties, self.rounds = parties, {}

    def for_rank(self, rank: int):
        calls = [0]

        async def exchange(value):
            r = calls[0]
            calls[0] += 1
            values, event = self.rounds.setdefault(r, ({}, Event()))
            values[rank] = value
            if len(values) == self.parties:
                event.set()
            await event.wait()
            return [values[k] for k in range(self.parties)]

        return exchange



@cocotb.test()
async def engine_allreduce(dut):
    """Run the allreduce of ``$WIREREDUCE_ENGINE_JOB`` and write the results and the record."""
    spec = json.loads(open(os.environ["WIREREDUCE_ENGINE_JOB"]).read())
    config = EngineConfig(**{**spec["config"], "formats": tuple(spec["config"]["formats"])})
    schedule = sched.build(spec["topology"], spec["algorithm"], **spec.get("options", {}))
    nodes = schedule.nodes
    period_ps = round(1e6 / spec["clock_mhz"])
    inputs = np.load(spec["inputs"])
    arrays = [inputs[f"node{k}"] for k in range(nodes)]
    if spec["bf16"]:
        import ml_dtypes

        arrays = [a.view(ml_dtypes.bfloat16) for a in arrays]

    await start_network(dut, nodes, period_ps, tuple(spec.get("top_inputs", ())))
    if spec.get("flip") is not None:   # one bit error on a cable (ScheduleNetwork links="eth"/"cmac")
        dut.flip_link.value, dut.flip_block.value = spec["flip"]

    transport = CocotbTransport(dut, nodes, timeout_cycles=spec["timeout_cycles"],
                                clock_period_ns=period_ps / 1000)
    start = []
    barrier = Barrier(nodes, lambda: start.append(transport.now()))
    retries = spec.get("retries", 0)
    exchange = _Exchange(nodes)
    drivers = [EngineRankDriver(transport, k, schedule, config, window=spec["window"], barrier=barrier,
                                first_collective=spec["collective"], retries=retries,
                                chunk_words=spec.get("chunk_words"),
                                exchange=exchange.for_rank(k) if retries else None) for k in range(nodes)]
    wall = time.perf_counter()
    k = spec.get("compression")

    async def one(d, a):
        try:
            return await d.allreduce_async(a, k, op=spec["op"])
        except ChunksLost as e:
            return e

    outcomes = await transport.gather([one(d, a) for d, a in zip(drivers, arrays)])
    end = transport.now()
    lost = {r: str(o) for r, o in enumerate(outcomes) if isinstance(o, ChunksLost)}
    # a rank that lost chunks has no result (the runner raises with ``lost``)
    results = [np.zeros_like(a) if isinstance(o, ChunksLost) else o for o, a in zip(outcomes, arrays)]
    wall = time.perf_counter() - wall
    await ClockCycles(dut.clk, 10)
    outputs = {f"node{k}": (r.view(np.uint16) if spec["bf16"] else r) for k, r in enumerate(results)}
    np.savez(spec["outputs"], **outputs)
    with open(spec["record"], "w") as f:
        json.dump({"cycles": end - start[0] if start else None, "wall_s": wall, "elements": int(arrays[0].size),
                   "retried": max(d.retried for d in drivers), "lost": lost}, f)
