"""One in-network allreduce node: host port, two ring ports, local buffer and reduce pipeline.

Ring schedule (docs/background.md "NTT ring", with the directions split as ``docs/architecture.md`` shows):
the *reduce* pass runs clockwise, rank 0 → 1 → … → N-1, on the ``cw`` ports; rank N-1
completes each chunk's sum and starts the *broadcast* pass counter-clockwise,
N-1 → N-2 → … → 0, on the ``ccw`` ports, while every node delivers the finished chunk to its
host. Each directed link carries the message once, so reduce and broadcast overlap and the
allreduce of M bytes takes about M / B plus the pipeline's fill time.

Roles by rank (``rank`` and ``nodes`` are run-time registers set by a CONTROL frame):

- rank 0 turns its host's HOST_PUSH frames straight into REDUCE frames (no add);
- ranks 1 … N-2 add their local chunk to each passing REDUCE frame and forward it, and
  forward each BROADCAST frame while delivering it to the host as HOST_RESULT;
- rank N-1 adds its chunk and sends the sum both to the host and counter-clockwise.

Every input goes through a :class:`~wirereduce.hdl.stream.frame.FrameGate`: a frame whose header is
wrong for its port (version, opcode, collective, sequence number, element count, runt) is
dropped whole before any beat of it reaches the adders, and counted in the STATS counters
(:data:`wirereduce.protocol.STATS_COUNTERS`) that a STATS_REQUEST from the host reads.

A frame whose last beat says ``bad`` (a cut-through Ethernet receiver found its FCS wrong after
the node had started on it, :mod:`wirereduce.hdl.stream.frame`) is processed like any other, and every
frame it turns into leaves with ``bad`` on its last beat too: the Ethernet port sends it with a
stomped FCS, the next hop drops it at its host NIC or passes it on marked, and no host ever
receives it. The sum it carried is lost whole; no part of it is applied anywhere. The chunk is
missing at every host (the driver reports it, :class:`~wirereduce.host.driver.ChunksLost`), the
sequence numbers stay in step and the rest of the collective completes. A HOST_PUSH marked
``bad`` does not fill its buffer slot (the ring then waits for that chunk, and the driver
reports the stall).

The node's parts, each in its own module of ``hdl/core``: the run-time state a CONTROL frame sets
(:mod:`~wirereduce.hdl.core.control`), the decisions of the three input gates
(:mod:`~wirereduce.hdl.core.gates`), the local buffer's slot bookkeeping
(:mod:`~wirereduce.hdl.core.slots`), the reduce pipeline (:mod:`~wirereduce.hdl.core.reduce`), the
forks and muxes that route frames to the outputs (:mod:`~wirereduce.hdl.core.routes`) and the
counters and STATS answer (:mod:`~wirereduce.hdl.core.status`).
"""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.codec.port import codec_port_stages
from wirereduce.hdl.core.control import RunState
from wirereduce.hdl.core.gates import broadcast_input, host_input, reduce_input
from wirereduce.hdl.core.reduce import ReducePipeline
from wirereduce.hdl.core.routes import broadcast_fork, ccw_output, host_output, pipeline_input, pipeline_output
from wirereduce.hdl.core.slots import LocalSlots
from wirereduce.hdl.core.status import (
    PORT_COUNTERS,
    EventCounters,
    StatusResponder,
    port_counters_layout,
    report_status,
)
from wirereduce.hdl.stream.frame import FrameGate, FrameStream, tagged_layout

from wirereduce.config import NodeConfig
from wirereduce.protocol import STATS_COUNTERS

__all__ = ["Node", "NodeConfig", "StatusResponder", "PORT_COUNTERS"]


class Node(wiring.Component):
    """One allreduce node (see the module docstring for the schedule and roles).

    Parameters
    ----------
    config : NodeConfig

    Attributes
    ----------
    host_rx : In(FrameStream(width))
        Frames from the host: HOST_PUSH, CONTROL, STATS_REQUEST.
    host_tx : Out(FrameStream(width))
        Frames to the host: HOST_RESULT, STATS.
    cw_in, cw_out : reduce direction (from rank-1, to rank+1).
    ccw_in, ccw_out : broadcast direction (from rank+1, to rank-1).
    port_counters : In(ArrayLayout(32, len(PORT_COUNTERS)))
        The counters of the ports in front of ``host_rx``/``host_tx``, ``cw_in``/``ccw_out`` and
        ``ccw_in``/``cw_out``, reported as they are in the last STATS values
        (:data:`~wirereduce.hdl.core.status.PORT_COUNTERS`: ``link_drop_{port}``, then
        ``{port}_{counter}``). Ethernet ports fill it with
        :func:`wirereduce.hdl.eth.port.port_counters`; leave at 0 where the ports are not Ethernet.
    control_taken : Out(1)
        High for one cycle after a CONTROL frame started a collective (not for a refused one).
    rank, nodes : Out(8)
        The run-time rank and ring size (CONTROL's ``src`` and ``hop``; 0 before any CONTROL),
        already the new ones while ``control_taken`` is high. With ``control_taken`` they let
        the ports in front (e.g. the Ethernet ports' source filter, ``hdl/eth/port.py``) follow the
        node's configuration without the node knowing what they are.
    probe : Out(2 * len(PROBE_POINTS)), or None
        Simulation only (``probe=True``): one (start, end) pair of bits per point of
        :data:`PROBE_POINTS`, high in the cycle a frame's first / last beat passes there; None
        without ``probe``.
    """

    def __init__(self, config: NodeConfig | None = None, *, probe: bool = False):
        self.config = config if config is not None else NodeConfig()
        beat = FrameStream(self.config.width)
        members = {
            "host_rx": In(beat), "host_tx": Out(beat),
            "cw_in": In(beat), "cw_out": Out(beat),
            "ccw_in": In(beat), "ccw_out": Out(beat),
            "port_counters": In(port_counters_layout()),
            "control_taken": Out(1), "rank": Out(8), "nodes": Out(8),
        }
        if probe:
            members["probe"] = Out(2 * len(PROBE_POINTS))
        super().__init__(members)
        if not probe:
            self.probe = None

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        w = cfg.width
        tagged = tagged_layout(w)
        run = RunState(codec=cfg.codec)
        events = EventCounters()
        m.d.sync += run.taken.eq(0)   # before any run.start, which sets it for one cycle
        m.d.comb += [self.control_taken.eq(run.taken), self.rank.eq(run.rank), self.nodes.eq(run.nodes)]

        m.submodules.host_gate = host_gate = FrameGate(w, cfg.max_beats, check_length=True, max_bytes=cfg.mtu)
        m.submodules.cw_gate = cw_gate = FrameGate(w, cfg.max_beats, check_length=True, max_bytes=cfg.mtu)
        m.submodules.ccw_gate = ccw_gate = FrameGate(w, cfg.max_beats, check_length=True, max_bytes=cfg.mtu)
        host_rx, cw_in, ccw_in, host_tx, cw_out, ccw_out = _port_stages(m, self, events)
        wiring.connect(m, host_rx, host_gate.i)
        wiring.connect(m, cw_in, cw_gate.i)
        wiring.connect(m, ccw_in, ccw_gate.i)
        index_bits = len(host_gate.o.payload.index)

        m.submodules.pipe = pipe = ReducePipeline(w, index_bits, cfg.slots, cfg.slot_beats)
        m.submodules.status = status = StatusResponder(w, len(STATS_COUNTERS))
        slots = LocalSlots(cfg.slots)

        # Host: CONTROL / STATS_REQUEST answered with STATS; pushed chunks go to the local buffer
        # (ranks > 0) or straight into the ring (rank 0).
        quiet = ~(host_gate.busy | cw_gate.busy | ccw_gate.busy | pipe.busy)
        host_input(m, host_gate, status, run, slots, events, cfg.max_elements, cfg.codec, quiet)
        filled = slots.write(m, pipe, host_gate.o, run.is_first, (cfg.slot_beats - 1).bit_length())
        # Clockwise input: REDUCE frames wait for their local chunk; the pipeline's last read frees it.
        reduce_input(m, cw_gate, run, slots, events, cfg.max_elements, cfg.codec)
        slots.update(m, *filled, pipe.release, pipe.release_slot)

        pipeline_input(m, pipe, host_gate.o, cw_gate.o, run, w, index_bits,
                       slots.is_bad(slots.of(cw_gate.o.payload.hdr.seq)))
        last_fork = pipeline_output(m, pipe, run, tagged, cw_out)
        # Counter-clockwise input: BROADCAST frames, forwarded and delivered to the host.
        broadcast_input(m, ccw_gate, run, events, cfg.max_elements, cfg.codec)
        bc_fork = broadcast_fork(m, ccw_gate.o, run, tagged)
        ccw_output(m, last_fork, bc_fork, run, tagged, ccw_out)
        host_output(m, last_fork, bc_fork, status, run, events, tagged, w, host_tx)

        report_status(m, status, run, events, self.port_counters)
        events.update(m)
        if self.probe is not None:
            points = {
                "host_rx": self.host_rx, "cw_in": self.cw_in, "ccw_in": self.ccw_in,
                "host_rx_dec": host_rx, "cw_in_dec": cw_in, "ccw_in_dec": ccw_in,
                "host_gate": host_gate.o, "cw_gate": cw_gate.o, "ccw_gate": ccw_gate.o,
                "pipe_i": pipe.i, "pipe_o": pipe.o,
                "host_tx_enc": host_tx, "cw_out_enc": cw_out, "ccw_out_enc": ccw_out,
                "host_tx": self.host_tx, "cw_out": self.cw_out, "ccw_out": self.ccw_out,
            }
            for j, name in enumerate(PROBE_POINTS):
                s = points[name]
                go = s.valid & s.ready
                in_frame = Signal(name=f"probe_{name}_in_frame")
                with m.If(go):
                    m.d.sync += in_frame.eq(~s.payload.last)
                m.d.comb += [self.probe[2 * j].eq(go & ~in_frame), self.probe[2 * j + 1].eq(go & s.payload.last)]
        return m


#: The points a probing node (``Node(probe=True)``, simulation only) stamps frames at.
PROBE_POINTS = ("host_rx", "cw_in", "ccw_in", "host_rx_dec", "cw_in_dec", "ccw_in_dec",
                "host_gate", "cw_gate", "ccw_gate", "pipe_i", "pipe_o",
                "host_tx_enc", "cw_out_enc", "ccw_out_enc", "host_tx", "cw_out", "ccw_out")


def _port_stages(m: Module, node: Node, events: EventCounters):
    """The node's six ports as its gates and outputs see them: straight, or (codec nodes) through a
    :class:`~wirereduce.hdl.codec.port.CodecIn` / :class:`~wirereduce.hdl.codec.port.CodecOut`
    each (:func:`~wirereduce.hdl.codec.port.codec_port_stages`), whose drops count as
    ``drop_length``. Returns ``host_rx, cw_in, ccw_in, host_tx, cw_out, ccw_out``, inputs as
    sources and outputs as sinks of the node's logic."""
    ins, outs, dropped = codec_port_stages(m, node, node.config, ("host_rx", "cw_in", "ccw_in"),
                                           ("host_tx", "cw_out", "ccw_out"))
    for d in dropped:
        m.d.comb += events.flag("drop_length").eq(d)
    return ins["host_rx"], ins["cw_in"], ins["ccw_in"], outs["host_tx"], outs["cw_out"], outs["ccw_out"]
