"""Host transport over PCIe: the VC709 PCIe top's DMA streams through Xilinx's ``xdma`` driver.

The VC709 PCIe top (:mod:`wirereduce.boards.vc709_engine_top`, docs/boards.md "PCIe host link")
carries whole wirereduce frames on the XDMA's two AXI4-Stream channels, header first and **no
Ethernet header**: one AXI4-Stream packet per frame. Xilinx's Linux driver for the core
(``dma_ip_drivers/XDMA/linux-kernel``, PG195 "Linux driver") makes each channel a character device:
``/dev/xdma0_h2c_0`` (host to card) and ``/dev/xdma0_c2h_0`` (card to host). On a streaming
channel one ``write()`` is one packet (``tlast`` on its last beat) and one ``read()`` returns at
most one packet, ending at its ``tlast``; so a frame is one write and one read, and no framing is
added here.

:class:`XdmaTransport` has the interface of
:class:`~wirereduce.host.transports.packet.PacketTransport` (``send``/``recv``/``gather``/``idle``
for one rank's node), so :class:`~wirereduce.host.rank.EngineRankDriver` runs over either.
:meth:`XdmaTransport.unix` reaches a simulated node instead: ``wirereduce sim serve --unix DIR``
serves each node's host port on ``DIR/node<k>.dma`` too, raw frames one per datagram, as the DMA
streams carry them. Nothing here has run against a board (docs/boards.md "Not tested on hardware").
"""

from __future__ import annotations

import asyncio
import os
import queue
import socket
import threading

from wirereduce.host.transports.base import RankTransport, check_rank, close_host_socket, host_socket

__all__ = ["XdmaTransport", "MAX_READ", "XDMA_DRIVER_HELP"]

#: Bytes one read asks for: above any frame (MTU 9000 at most), so a read returns a whole packet.
MAX_READ = 1 << 16

#: What to do when the device files are missing.
XDMA_DRIVER_HELP = ("load Xilinx's xdma driver (github.com/Xilinx/dma_ip_drivers, XDMA/linux-kernel: "
                    "`make install && modprobe xdma`), check the board enumerated (`lspci -d 10ee:`) and that "
                    "the bitstream is the PCIe top (`make bitstream BOARD=vc709 HOST=pcie`)")


class XdmaTransport(RankTransport):
    """Rank ``rank``'s host port over the XDMA character devices of its board.

    Parameters
    ----------
    device : str
        The driver's device prefix, e.g. ``/dev/xdma0`` (the first card): frames go to
        ``{device}_h2c_{channel}`` and come from ``{device}_c2h_{channel}``.
    rank, nodes : int
        This host's rank and the number of nodes.
    channel : int
        The DMA channel pair (0: the PCIe top generates one H2C and one C2H channel).
    timeout : float
        Seconds a :meth:`recv` waits before raising ``TimeoutError``.

    Raises
    ------
    FileNotFoundError
        If a device file is missing (:data:`XDMA_DRIVER_HELP` says what to do).
    PermissionError
        If the device files cannot be opened (root, or a udev rule giving the user access).
    ValueError
        On a malformed argument.
    """

    def __init__(self, device: str | os.PathLike | None, rank: int, nodes: int, channel: int = 0,
                 timeout: float = 2.0, *, _sock: socket.socket | None = None, _peer: str | None = None):
        check_rank(rank, nodes, timeout)
        if not isinstance(channel, int) or isinstance(channel, bool) or not 0 <= channel <= 3:
            raise ValueError(f"channel must be 0 … 3 (the XDMA has up to 4 per direction), not {channel!r}")
        self.rank, self.nodes, self.timeout = rank, nodes, float(timeout)
        self.sock = _sock
        self._peer = _peer
        self._frames: queue.SimpleQueue | None = None
        self._reader: threading.Thread | None = None
        self._closed = False
        self._wlock = threading.Lock()
        self.h2c = self.c2h = None
        if _sock is not None:
            self.where = f"socket {_peer}"
            self.sock.setblocking(False)
            return
        base = os.fspath(device)
        self.h2c, self.c2h = f"{base}_h2c_{channel}", f"{base}_c2h_{channel}"
        self.where = f"{self.c2h}"
        for path in (self.h2c, self.c2h):
            if not os.path.exists(path):
                raise FileNotFoundError(f"no XDMA device {path}: {XDMA_DRIVER_HELP}")
        try:
            self.h2c_fd = os.open(self.h2c, os.O_WRONLY)
            try:
                self.c2h_fd = os.open(self.c2h, os.O_RDONLY)
            except OSError:
                os.close(self.h2c_fd)
                raise
        except PermissionError as e:
            raise PermissionError(f"cannot open the XDMA devices {self.h2c} / {self.c2h} ({e}): run as root or "
                                  f"give your user access (a udev rule: KERNEL==\"xdma*\", MODE=\"0666\")") from e

    @classmethod
    def unix(cls, directory: str | os.PathLike, rank: int, nodes: int, timeout: float = 2.0) -> XdmaTransport:
        """The same transport to a node of ``wirereduce sim serve --unix DIR``: its host port's DMA
        streams as the datagram socket ``DIR/node<rank>.dma`` (raw frames, one per datagram).

        Raises FileNotFoundError if the server's socket is not there."""
        check_rank(rank, nodes, timeout)
        peer = os.path.join(os.fspath(directory), f"node{rank}.dma")
        if not os.path.exists(peer):
            raise FileNotFoundError(f"no simulated DMA port at {peer}: start `wirereduce sim serve --unix {directory}`")
        return cls(None, rank, nodes, timeout=timeout, _sock=host_socket("wr-dma"), _peer=peer)

    def close(self) -> None:
        """Close the devices (or the socket). A read the reader thread has pending ends with them."""
        if self._closed:
            return
        self._closed = True
        if self.sock is not None:
            close_host_socket(self.sock)
            return
        for fd in (self.h2c_fd, self.c2h_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    async def send(self, node: int, data: bytes) -> None:
        """Send one wirereduce frame to the node: one write, one DMA packet.

        Raises OSError if the driver took only part of it."""
        self._check(node)
        loop = asyncio.get_running_loop()
        if self.sock is not None:
            await loop.sock_sendto(self.sock, data, self._peer)
            return
        n = await loop.run_in_executor(None, self._write, data)
        if n != len(data):
            raise OSError(f"{self.h2c} took {n} of a {len(data)}-byte frame: the DMA packet was cut")

    def _write(self, data: bytes) -> int:
        """One write (one DMA packet), one at a time: sends the event loop runs together reach the
        device in turn, never as interleaved writes."""
        with self._wlock:
            return os.write(self.h2c_fd, data)

    def _read_loop(self, frames: queue.SimpleQueue) -> None:
        """The device's reader thread: one blocking read per packet, queued, until closed (an
        event loop of its own would not do: each :meth:`EngineRankDriver.allreduce
        <wirereduce.host.rank.EngineRankDriver.allreduce>` runs in a new one)."""
        while not self._closed:
            try:
                data = os.read(self.c2h_fd, MAX_READ)
            except OSError as e:
                if not self._closed:
                    frames.put(e)
                return
            if data:
                frames.put(data)

    #: Seconds between looks at the reader thread's queue while waiting for a frame.
    POLL_S = 0.0002

    async def _next(self, left: float) -> bytes:
        loop = asyncio.get_running_loop()
        if self.sock is not None:
            return await asyncio.wait_for(loop.sock_recv(self.sock, MAX_READ), left)
        if self._frames is None:
            self._frames = queue.SimpleQueue()
            self._reader = threading.Thread(target=self._read_loop, args=(self._frames,), daemon=True,
                                            name=f"xdma-c2h-rank{self.rank}")
            self._reader.start()
        deadline = loop.time() + left
        while True:
            try:
                got = self._frames.get_nowait()
            except queue.Empty:
                if loop.time() >= deadline:
                    raise asyncio.TimeoutError from None
                await asyncio.sleep(self.POLL_S)
                continue
            if isinstance(got, OSError):
                raise got
            return got

    async def recv(self, node: int) -> bytes:
        """The next wirereduce frame from the node (one DMA packet).

        Raises TimeoutError after :attr:`timeout` seconds without one."""
        self._check(node)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while (left := deadline - loop.time()) > 0:
            try:
                data = await self._next(left)
            except asyncio.TimeoutError:
                break
            if not data:     # an empty packet carries no frame
                continue
            self._arrived()
            return data
        raise TimeoutError(f"node {self.rank} sent its host nothing on {self.where} for {self.timeout:g} s: a "
                           f"frame was lost, a rank stopped, or the board is not running the PCIe top")
