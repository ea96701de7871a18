"""A :class:`~wirereduce.host.driver.Transport` for the simulated cluster, over cocotb.

Each host port of :class:`wirereduce.sim.cluster.schednet.ScheduleNetwork` is an AXI4-Stream pair driven by
cocotbext-axi's ``AxiStreamSource`` (host → node) and ``AxiStreamSink`` (node → host). The
driver core above it is the same one that drives real boards.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence

import cocotb
from cocotb.triggers import ClockCycles, Event, with_timeout
from cocotb.utils import get_sim_time
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

__all__ = ["Barrier", "CocotbTransport", "start_network"]


class Barrier:
    """The start barrier of ranks that share one simulation: every rank's driver awaits it between
    its CONTROL acknowledgement and its first push (:class:`~wirereduce.host.rank.EngineRankDriver`
    ``barrier``), so no node gets a frame of a collective before it took its CONTROL.

    Released once ``parties`` ranks reached it (``on_release()`` is called then, once);
    :meth:`release` lets every rank through at once (a rank that failed before reaching it);
    :meth:`reset` re-arms it for the next collective.
    """

    def __init__(self, parties: int, on_release=None):
        self.parties, self.on_release = parties, on_release
        self.reset()

    def reset(self) -> None:
        self.count, self.event = 0, Event()

    def release(self) -> None:
        self.event.set()

    def __call__(self):
        self.count += 1
        if self.count == self.parties:
            if self.on_release is not None:
                self.on_release()
            self.event.set()
        return self.event.wait()

    def wait(self):
        """Await the release without counting as a rank (an injector that starts with the collective)."""
        return self.event.wait()


async def start_network(dut, nodes: int, period_ps: int, inputs: tuple[str, ...] = ()) -> None:
    """Reset ``wirereduce_net`` and start its clock (``period_ps``): every host input, and the other
    top inputs named in ``inputs``, driven to 0 first (Icarus is 4-state: undriven bus inputs would
    reach the gates as X), the first clock edge after that, reset held 4 cycles, then 2 cycles
    before anything is sent."""
    from cocotb.clock import Clock
    from cocotb.triggers import Timer

    dut.rst.value = 1
    for k in range(nodes):
        for name in ("tvalid", "tdata", "tkeep", "tlast"):
            getattr(dut, f"host{k}_rx_{name}").value = 0
        getattr(dut, f"host{k}_tx_tready").value = 0
    for name in inputs:
        getattr(dut, name).value = 0
    await Timer(period_ps, "ps")
    cocotb.start_soon(Clock(dut.clk, period_ps, unit="ps").start())
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 2)


class CocotbTransport:
    """Host ports ``host{k}_rx`` / ``host{k}_tx`` of a simulated network top.

    Parameters
    ----------
    dut : cocotb handle of ``wirereduce_net``
    nodes : int
    timeout_cycles : int
        The default wait of ``recv``: one that waits longer than this many clock cycles raises
        ``TimeoutError``, so a lost frame fails the run instead of hanging it. The driver gives
        each ``recv`` its own wait (the round's deadline).
    clock_period_ns : float
        Period of ``dut.clk`` (time in cycles, :meth:`now`).
    """

    def __init__(self, dut, nodes: int, timeout_cycles: int = 200_000, clock_period_ns: float = 6.4):
        self.dut = dut
        self.nodes = nodes
        self.period_ns = clock_period_ns
        self.timeout_cycles = timeout_cycles
        self.sources = []
        self.sinks = []
        #: Frames each host's port dropped because they arrived marked bad.
        self.bad_frames = [0] * nodes
        for k in range(nodes):
            self.sources.append(AxiStreamSource(AxiStreamBus.from_prefix(dut, f"host{k}_rx"), dut.clk, dut.rst))
            self.sinks.append(AxiStreamSink(AxiStreamBus.from_prefix(dut, f"host{k}_tx"), dut.clk, dut.rst))

    async def send(self, node: int, data: bytes) -> None:
        await self.sources[node].send(AxiStreamFrame(bytes(data)))

    async def recv(self, node: int, timeout_cycles: int | None = None) -> bytes:
        """The next good frame node ``node`` sends its host, waiting at most ``timeout_cycles``
        (default: the transport's) for each frame. A frame marked ``bad`` (``tuser`` on its last
        beat: a stomped FCS on a real link) is dropped here, as a NIC drops it, and counted in
        :attr:`bad_frames`."""
        cycles = self.timeout_cycles if timeout_cycles is None else max(1, int(timeout_cycles))
        while True:
            try:
                f = await with_timeout(self.sinks[node].recv(), round(cycles * self.period_ns * 1000), "ps")
            except TimeoutError as e:  # cocotb's SimTimeoutError subclasses TimeoutError
                raise TimeoutError(f"node {node} sent its host nothing for {cycles} cycles of simulated time; "
                                   f"a frame was lost or the ring is stalled") from e
            user = f.tuser if isinstance(f.tuser, list) else [f.tuser]
            if any(u for u in user if u):
                self.bad_frames[node] += 1
                continue
            return bytes(f.tdata)

    def now(self) -> int:
        """Simulated time in cycles of ``dut.clk``."""
        return int(get_sim_time("ps") / (self.period_ns * 1000))

    async def gather(self, coros: Sequence[Awaitable]) -> list:
        tasks = [cocotb.start_soon(c) for c in coros]
        return [await t for t in tasks]

    async def idle(self, cycles: int = 1) -> None:
        await ClockCycles(self.dut.clk, cycles)
