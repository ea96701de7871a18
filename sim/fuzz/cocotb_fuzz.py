"""cocotb testbench of the fuzz suite: real collectives with one hostile frame each.

Reads ``$WIREREDUCE_FUZZ`` (written by :func:`wirereduce.sim.fuzz.run.run_fuzz`): the set-up,
the cases (:class:`~wirereduce.sim.fuzz.cases.FuzzCase`) and the arrays. For each case it runs an
allreduce through the host driver while the case's frame goes into the case's port (host ports
through the host's own link, ring ports through the network's injection ports ``inj{k}_{cw,ccw}``),
reads every node's STATS before and after, then runs a fresh allreduce; it writes what every host
received (or which chunks it was told are missing), the counters and the fresh results, for the
oracle (:func:`wirereduce.sim.fuzz.run.judge`) to judge outside the simulator.
"""

from __future__ import annotations

import json
import os

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSource
from wirereduce.host.driver import ChunksLost, Cluster, DriverError, default_window
from wirereduce.host.transports.cocotb import CocotbTransport, start_network
from wirereduce.sim.fuzz.cases import build_frame, case_inputs

from wirereduce.config import NodeConfig
from wirereduce.protocol import Codec, max_elements


@cocotb.test()
async def fuzz(dut):
    with open(os.environ["WIREREDUCE_FUZZ"]) as f:
        spec = json.load(f)
    nodes = spec["nodes"]
    config = NodeConfig(**spec["config"])
    period_ps = round(1e6 / spec["clock_mhz"])
    inputs = np.load(spec["inputs"])

    await start_network(dut, nodes, period_ps, tuple(
        f"inj{k}_{port}_{name}" for k in range(nodes) for port in ("cw", "ccw")
        for name in ("tvalid", "tdata", "tkeep", "tlast", "tuser")))

    transport = CocotbTransport(dut, nodes, timeout_cycles=spec["timeout_cycles"], clock_period_ns=period_ps / 1000)
    inject = {(k, port): AxiStreamSource(AxiStreamBus.from_prefix(dut, f"inj{k}_{port}"), dut.clk, dut.rst)
              for k in range(nodes) for port in ("cw", "ccw")}
    cluster = Cluster(transport, config, window=default_window(config))
    compression = spec["compression"]
    codec = Codec.NONE if compression is None else Codec.INCEPTIONN_V1
    elements = int(inputs["node0_case0"].size)
    chunk = cluster.chunk_elements(compression)
    chunks = -(-elements // chunk)

    async def stats_all():
        out = []
        for k in range(nodes):
            try:
                out.append(await cluster.stats(k))
            except (TimeoutError, DriverError):
                out.append(None)
        return out

    records = []
    for case_dict in spec["cases"]:
        case, arrays, fresh, rec = case_inputs(inputs, case_dict, nodes)
        before = await stats_all()
        plan = cluster.plan(arrays, compression=compression)
        collective = plan.round.collective
        data = build_frame(case, collective=collective, chunks=chunks, count=min(chunk, elements), nodes=nodes,
                           max_elements=max_elements(config.mtu), mtu=config.mtu, codec=codec,
                           eb_k=compression or 0)
        rec["frame_bytes"] = len(data)
        rec["collective"] = collective

        async def injector(case=case, data=data):
            # after every node took the CONTROL, then ``after`` chunk times into the collective
            await ClockCycles(dut.clk, spec["start_cycles"] + case.after * spec["cycles_per_chunk"])
            if case.port == "host":
                await transport.send(case.node, data)
            else:
                await inject[(case.node, case.port)].send(AxiStreamFrame(data, tuser=int(case.bad)))

        task = cocotb.start_soon(injector())
        try:
            results = await cluster.run(plan)
            rec["outcome"] = "complete"
            rec["results"] = [r.tobytes().hex() for r in results]
            rec["missing"] = {str(k): [] for k in range(nodes)}
        except ChunksLost as err:
            rec["outcome"] = "lost"
            rec["results"] = [r.tobytes().hex() for r in err.results]
            rec["missing"] = {str(k): v for k, v in err.missing.items()}
            rec["received"] = [r.tolist() for r in err.received]
        except (DriverError, TimeoutError) as err:
            rec["outcome"] = "error"
            rec["error"] = f"{type(err).__name__}: {err}"
        await task
        await ClockCycles(dut.clk, 50)
        after = await stats_all()
        rec["stats_before"], rec["stats_after"] = before, after
        try:
            # abort: a hostile CONTROL may have started a collective of its own on some node
            fresh_results = await cluster.allreduce(fresh, compression=compression, abort=True)
            rec["fresh"] = [r.tobytes().hex() for r in fresh_results]
        except (DriverError, TimeoutError) as err:
            rec["fresh"] = None
            rec["fresh_error"] = f"{type(err).__name__}: {err}"
        records.append(rec)
        with open(spec["records"], "w") as f:  # after every case, so a crash keeps what was done
            json.dump(records, f)
