"""cocotb testbench of ``wirereduce sim serve``: the simulated cluster's host ports bridged live
to TAP interfaces (or UNIX sockets), :mod:`wirereduce.sim.engines.bridge`.

Frames read from a port go into node k's host port (``host{k}_rx``, cocotbext-axi
``AxiStreamSource``) and through the host link (a :class:`LinkModel` or a 10G Ethernet port at line
rate), so they are paced at the host link's line rate in simulated time; frames the node sends
(``host{k}_tx``) go out of the port. The simulation is clocked only while frames are in flight:
after ``idle_cycles`` cycles without any frame in or out (and nothing queued) it stops clocking and
blocks in ``select`` on the ports, so an idle server costs no CPU. It stops when its parent (the
``wirereduce sim serve`` process) goes away.
"""

from __future__ import annotations

import json
import os
import select

import cocotb
from cocotb.triggers import ClockCycles
from cocotb.utils import get_sim_time
from cocotbext.axi import AxiStreamFrame
from wirereduce.host.transports.cocotb import CocotbTransport, start_network
from wirereduce.host.transports.packet import format_mac
from wirereduce.sim.engines.bridge import open_ports

#: Cycles between polls of the ports while the simulation is clocked.
POLL_CYCLES = 64


@cocotb.test()
async def serve(dut):
    """Bridge the ports of ``$WIREREDUCE_SERVE`` until the parent process exits."""
    spec = json.loads(open(os.environ["WIREREDUCE_SERVE"]).read())
    nodes = spec["nodes"]
    period_ps = round(1e6 / spec["clock_mhz"])
    parent = os.getppid()

    await start_network(dut, nodes, period_ps, tuple(spec.get("top_inputs", ())))

    transport = CocotbTransport(dut, nodes)
    ports = open_ports(nodes, spec["taps"], spec["unix"], spec["mtu"])
    # Node k answers on the port its host last sent on (its Ethernet socket or, with UNIX sockets, its
    # DMA socket); the Ethernet one until then.
    answer = {k: ports[k] for k in range(nodes)}
    ready = {"ports": [getattr(p, "name", None) or p.path for p in ports[:nodes]],
             "dma": [p.path for p in ports[nodes:]],
             "macs": [format_mac(p.mac) for p in ports[:nodes]], "pid": os.getpid()}
    tmp = spec["ready"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(ready, f)
    os.replace(tmp, spec["ready"])

    idle_cycles = spec["idle_cycles"]
    #: Frames each node sent its host marked bad, dropped here as a NIC drops a stomped FCS.
    stomped = [0] * nodes
    quiet = idle_cycles
    status = spec["ready"] + ".status"
    try:
        while True:
            moved = False
            for k, sink in enumerate(transport.sinks):
                while not sink.empty():
                    f = sink.recv_nowait()
                    moved = True
                    user = f.tuser if isinstance(f.tuser, list) else [f.tuser]
                    if any(u for u in user if u):   # marked bad (a stomped FCS on a real link): a NIC drops it
                        stomped[k] += 1
                        continue
                    answer[k].write(bytes(f.tdata))
            queued = any(not s.idle() for s in transport.sources)
            busy = moved or queued or quiet < idle_cycles
            readable, _, _ = select.select(ports, [], [], 0 if busy else 0.5)
            for p in readable:
                for _ in range(256):
                    payload = p.read()
                    if payload is None:
                        break
                    transport.sources[p.rank].send_nowait(AxiStreamFrame(payload))
                    answer[p.rank] = p
                    moved = True
            if moved:
                quiet = 0
            elif not busy:
                if os.getppid() != parent:
                    return
                continue
            await ClockCycles(dut.clk, POLL_CYCLES)
            quiet += POLL_CYCLES
            if quiet - POLL_CYCLES < idle_cycles <= quiet:  # just went idle
                with open(status, "w") as f:  # what a user (or a test) can look at
                    json.dump({"cycles": round(get_sim_time("ps") / period_ps),
                               **{key: [sum(getattr(p, key) for p in ports if p.rank == k) for k in range(nodes)]
                                  for key in ("frames_in", "frames_out", "ignored", "dropped")},
                               "stomped": stomped}, f)
    finally:
        for p in ports:
            p.close()
