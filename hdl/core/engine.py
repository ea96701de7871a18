"""The schedule engine: one node with P network ports that runs any allreduce tree schedule.

(Interface only in this commit; the logic follows.)
"""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.stream.frame import FrameStream

from wirereduce.config import EngineConfig

__all__ = ["Engine"]


class Engine(wiring.Component):
    """Schedule engine (see the module docstring).

    Parameters
    ----------
    config : EngineConfig

    Attributes
    ----------
    host_rx : In(FrameStream(width))
        Frames from the host: HOST_PUSH, SCHEDULE, CONTROL, STATS_REQUEST.
    host_tx : Out(FrameStream(width))
        Frames to the host: HOST_RESULT, STATS.
    net{p}_in, net{p}_out : In/Out(FrameStream(width)), p = 0 … P-1
        Network port p (the schedule's port numbering, :class:`wirereduce.schedule.Topology`).
    control_taken : Out(1); rank : Out(8)
        As :class:`~wirereduce.hdl.core.node.Node`.
    """

    def __init__(self, config: EngineConfig | None = None):
        self.config = config if config is not None else EngineConfig()
        beat = FrameStream(self.config.width)
        members = {"host_rx": In(beat), "host_tx": Out(beat), "control_taken": Out(1), "rank": Out(8)}
        for p in range(self.config.ports):
            members[f"net{p}_in"] = In(beat)
            members[f"net{p}_out"] = Out(beat)
        super().__init__(members)

    def elaborate(self, platform):
        return Module()
