"""What the host transports to one rank's node share (raw Ethernet,
:class:`~wirereduce.host.transports.packet.PacketTransport`; PCIe DMA,
:class:`~wirereduce.host.transports.xdma.XdmaTransport`): the interface
:class:`~wirereduce.host.rank.EngineRankDriver` drives, apart from ``send``/``recv``/``close``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

__all__ = ["RankTransport"]


class RankTransport:
    """Base of a transport that reaches one node, node :attr:`rank`: ``gather``, ``idle`` (woken by
    :meth:`_arrived`), the node check and the context manager. Subclasses set :attr:`rank` and
    define ``send(node, data)``, ``recv(node)`` (calling :meth:`_arrived` with each frame) and
    ``close()``."""

    rank: int
    _got: asyncio.Event | None = None   # made inside the running loop

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:   # pragma: no cover - every subclass has its own
        raise NotImplementedError

    def _check(self, node: int) -> None:
        if node != self.rank:
            raise ValueError(f"this transport reaches node {self.rank} only, not node {node}")

    def _event(self) -> asyncio.Event:
        if self._got is None:
            self._got = asyncio.Event()
        return self._got

    def _arrived(self) -> None:
        """A frame came: wake :meth:`idle`."""
        self._event().set()

    async def gather(self, coros: Sequence[Awaitable]) -> list:
        return list(await asyncio.gather(*coros))

    async def idle(self, cycles: int = 1) -> None:
        """Wait until the next frame arrives (a result frees the window), or 10 ms."""
        ev = self._event()
        ev.clear()
        try:
            await asyncio.wait_for(ev.wait(), 0.01)
        except asyncio.TimeoutError:
            pass
