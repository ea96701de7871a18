"""What the host transports to one rank's node share (raw Ethernet,
:class:`~wirereduce.host.transports.packet.PacketTransport`; PCIe DMA,
:class:`~wirereduce.host.transports.xdma.XdmaTransport`): the interface
:class:`~wirereduce.host.rank.EngineRankDriver` drives, apart from ``send``/``recv``/``close``."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
from collections.abc import Awaitable, Sequence

__all__ = ["RankTransport", "check_rank", "host_socket", "close_host_socket", "open_transport"]


def check_rank(rank: int, nodes: int, timeout: float | None = None) -> None:
    """Validate a transport's ``rank`` of ``nodes`` and its receive ``timeout`` (seconds, optional).

    Raises
    ------
    ValueError
        On a malformed value.
    """
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise ValueError(f"nodes must be an int ≥ 1, not {nodes!r}")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < nodes:
        raise ValueError(f"rank must be 0 … {nodes - 1}, not {rank!r}")
    if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                                or not timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")


def host_socket(prefix: str) -> socket.socket:
    """A UNIX datagram socket bound in a fresh temporary directory (``prefix``…``/host.sock``): the
    host's end towards a ``wirereduce sim serve --unix`` node. :func:`close_host_socket` removes it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(os.path.join(tempfile.mkdtemp(prefix=prefix), "host.sock"))
    return sock


def close_host_socket(sock: socket.socket) -> None:
    """Close ``sock``; if it is a UNIX socket bound by :func:`host_socket`, remove its file and directory."""
    name = sock.getsockname() if sock.family == socket.AF_UNIX else None
    sock.close()
    if name:
        try:
            os.unlink(name)
            os.rmdir(os.path.dirname(name))
        except OSError:
            pass


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


def open_transport(rank: int, nodes: int, *, interface: str | None = None, unix: str | None = None,
                   xdma: str | None = None, dma: bool = False, node_mac=None, mtu: int | None = None,
                   timeout: float = 2.0) -> RankTransport:
    """Rank ``rank``'s transport to its node, by where the node is: ``unix`` (the socket directory of
    ``wirereduce sim serve --unix``; with ``dma`` the nodes' DMA sockets,
    :meth:`XdmaTransport.unix <wirereduce.host.transports.xdma.XdmaTransport.unix>`, else raw
    Ethernet over :meth:`PacketTransport.unix <wirereduce.host.transports.packet.PacketTransport.unix>`),
    ``xdma`` (a VC709 running the PCIe top: the XDMA device prefix,
    :class:`~wirereduce.host.transports.xdma.XdmaTransport`) or ``interface`` (raw Ethernet,
    :class:`~wirereduce.host.transports.packet.PacketTransport`, with ``node_mac`` and ``mtu``).
    The callers check that exactly one is given, in their own options' names.

    Raises what the chosen transport raises (FileNotFoundError, PermissionError, ValueError)."""
    from wirereduce.host.transports.packet import PacketTransport
    from wirereduce.host.transports.xdma import XdmaTransport

    if unix is not None:
        kind = XdmaTransport if dma else PacketTransport
        return kind.unix(unix, rank, nodes, timeout=timeout)
    if xdma is not None:
        return XdmaTransport(xdma, rank, nodes, timeout=timeout)
    return PacketTransport(interface, rank, nodes, node=node_mac, mtu=mtu, timeout=timeout)
