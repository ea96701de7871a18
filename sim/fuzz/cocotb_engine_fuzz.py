"""cocotb testbench of the fuzz suite on a network of schedule engines: real collectives with one
hostile frame each.

Reads ``$WIREREDUCE_FUZZ`` (written by :func:`wirereduce.sim.fuzz.run.run_fuzz` for an
:class:`~wirereduce.sim.engines.runner.EngineSetup`): the topology and schedule, the cases
(:class:`~wirereduce.sim.fuzz.cases.FuzzCase`) and the arrays. Every rank is an
:class:`~wirereduce.host.rank.EngineRankDriver` (the driver a rank process runs against a board).
For each case every rank runs its allreduce while the case's frame goes into the case's port (host
ports through the host's own link, network ports through the injection ports ``inj{u}_{p}``, a
number of chunk times after every rank passed the start barrier), every node's STATS are read
before and after, then a fresh allreduce runs (its CONTROL with ABORT where the last one did not
finish). It writes what every host received (and which elements it was told are missing), the
counters and the fresh results, for the oracle (:func:`wirereduce.sim.fuzz.run.judge`).
"""

from __future__ import annotations

import json
import os

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSource
from wirereduce.host.driver import ChunksLost, DriverError
from wirereduce.host.engine import EngineSession
from wirereduce.host.rank import EngineRankDriver
from wirereduce.host.transports.cocotb import Barrier, CocotbTransport, start_network
from wirereduce.sim.fuzz.cases import build_frame, case_inputs, engine_routes

from wirereduce import schedule as sched
from wirereduce.config import EngineConfig
from wirereduce.protocol import Codec


async def _run_all(transport, drivers, arrays, compression, barrier):
    """Every rank's allreduce at once; per rank ("complete", result) or ("lost", ChunksLost) or
    ("error", message). A rank that fails releases ``barrier`` (the others then stall at its node
    and report their missing chunks, rather than wait at the barrier for ever)."""

    async def one(d, a):
        try:
            return ("complete", await d.allreduce_async(a, compression))
        except ChunksLost as e:
            barrier.release()
            return ("lost", e)
        except (DriverError, TimeoutError) as e:
            barrier.release()
            return ("error", f"{type(e).__name__}: {e}")

    return await transport.gather([one(d, a) for d, a in zip(drivers, arrays)])


@cocotb.test()
async def engine_fuzz(dut):
    with open(os.environ["WIREREDUCE_FUZZ"]) as f:
        spec = json.load(f)
    config = EngineConfig(**{**spec["config"], "formats": tuple(spec["config"]["formats"])})
    schedule = sched.build(spec["topology"], spec["algorithm"])
    nodes = schedule.nodes
    flows = len(schedule.flows)
    period_ps = round(1e6 / spec["clock_mhz"])
    inputs = np.load(spec["inputs"])
    links = schedule.topology.links
    inj_names = tuple(f"inj{u}_{p}_{name}" for u in range(nodes) for p in range(len(links[u]))
                      for name in ("tvalid", "tdata", "tkeep", "tlast", "tuser"))
    await start_network(dut, nodes, period_ps, inj_names + tuple(spec.get("top_inputs", ())))

    transport = CocotbTransport(dut, nodes, timeout_cycles=spec["timeout_cycles"], clock_period_ns=period_ps / 1000)
    inject = {(u, f"net{p}"): AxiStreamSource(AxiStreamBus.from_prefix(dut, f"inj{u}_{p}"), dut.clk, dut.rst)
              for u in range(nodes) for p in range(len(links[u]))}
    compression = spec["compression"]
    codec = Codec.NONE if compression is None else Codec.INCEPTIONN_V1

    async def stats_all(drivers):
        out = []
        for d in drivers:
            try:
                out.append(await d.stats())
            except (TimeoutError, DriverError):
                out.append(None)
        return out

    barrier = Barrier(nodes)
    drivers = [EngineRankDriver(transport, k, schedule, config, window=spec["window"], barrier=barrier,
                                first_collective=spec["collective"]) for k in range(nodes)]
    records = []
    for case_dict in spec["cases"]:
        case, arrays, fresh, rec = case_inputs(inputs, case_dict, nodes)
        before = await stats_all(drivers)
        # the session every rank is about to run (same collective id at every rank): its chunks
        s = EngineSession(0, schedule, config, drivers[0].ids.next, arrays[0], drivers[0].window,
                          compression=compression)
        counts = [c.count for c in s.chunks]
        routes = (engine_routes(schedule, case.node, int(case.port[3:])) if case.port.startswith("net") else None)
        data = build_frame(case, collective=s.collective, chunks=len(s.chunks), nodes=nodes,
                           max_elements=config.max_elements, mtu=config.mtu, codec=codec, eb_k=compression or 0,
                           flows=flows, counts=counts, routes=routes, dtype=s.dtype)
        rec["frame_bytes"] = len(data)
        rec["collective"] = s.collective
        rec["chunks"] = [[c.start, c.count] for c in s.chunks]
        barrier.reset()

        async def injector(case=case, data=data):
            # once every node took its CONTROL, then ``after`` chunk times into the collective
            await barrier.wait()
            await ClockCycles(dut.clk, 1 + case.after * spec["cycles_per_chunk"])
            if case.port == "host":
                await transport.send(case.node, data)
            else:
                await inject[(case.node, case.port)].send(AxiStreamFrame(data, tuser=int(case.bad)))

        task = cocotb.start_soon(injector())
        outcomes = await _run_all(transport, drivers, arrays, compression, barrier)
        await task
        errors = [o[1] for o in outcomes if o[0] == "error"]
        if errors:
            rec["outcome"] = "error"
            rec["error"] = "; ".join(errors)
        else:
            rec["outcome"] = "complete" if all(o[0] == "complete" for o in outcomes) else "lost"
            rec["results"], rec["missing"] = [], {}
            for k, (kind, val) in enumerate(outcomes):
                if kind == "complete":
                    rec["results"].append(np.asarray(val).tobytes().hex())
                    rec["missing"][str(k)] = []
                else:   # ChunksLost: what this rank received, and the chunks it was told are missing
                    rec["results"].append(np.asarray(val.results[0]).tobytes().hex())
                    rec["missing"][str(k)] = [int(g) for g in val.missing[k]]
        await ClockCycles(dut.clk, 50)
        rec["stats_before"], rec["stats_after"] = before, await stats_all(drivers)
        barrier.reset()
        for d in drivers:   # CONTROL with ABORT: a hostile CONTROL may have started a collective somewhere
            d.unfinished = True
        outcomes = await _run_all(transport, drivers, fresh, compression, barrier)
        if all(o[0] == "complete" for o in outcomes):
            rec["fresh"] = [np.asarray(o[1]).tobytes().hex() for o in outcomes]
        else:
            rec["fresh"] = None
            rec["fresh_error"] = "; ".join(str(o[1]) for o in outcomes if o[0] != "complete")
        records.append(rec)
        with open(spec["records"], "w") as f:  # after every case, so a crash keeps what was done
            json.dump(records, f)
