"""The host side of ``wirereduce sim serve``: each simulated node's host port behind a Linux TAP
interface (or, without root, a UNIX datagram socket), carrying Ethernet II frames.

A TAP interface (``/dev/net/tun``, ``TUNSETIFF`` with ``IFF_TAP | IFF_NO_PI``) is the far end of a
cable: what a process on the interface sends (an ``AF_PACKET`` socket,
:class:`wirereduce.host.transports.packet.PacketTransport`) is read here as a whole Ethernet frame
without FCS, and what is written here arrives on the interface. The bridge keeps frames whose
EtherType is 0x88B5 and destination the node's MAC (others, e.g. the kernel's IPv6 neighbour
discovery, are counted in :attr:`HostPort.ignored`), cuts genuine padding
(:func:`~wirereduce.host.transports.packet.strip_padding`) and hands the wirereduce frame to the
node's host link; frames from the node go out with the node's MAC as source to the last host MAC
heard (or broadcast before that).

With UNIX sockets each node also has a :class:`DmaPort`, ``DIR/node<k>.dma``: its host port as the
VC709 PCIe top's DMA streams carry it, raw wirereduce frames with no Ethernet header, one per
datagram (:class:`wirereduce.host.transports.xdma.XdmaTransport.unix`). A node answers on the port
its host last sent a frame on.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import time

from wirereduce.host.transports.packet import (
    ETHERTYPE,
    eth_frame,
    node_mac,
    parse_eth_frame,
    strip_padding,
)

__all__ = ["HostPort", "TapPort", "UnixPort", "DmaPort", "open_ports"]

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
SIOCSIFMTU = 0x8922
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


class HostPort:
    """One node's host port seen from outside: Ethernet frames in and out of a file descriptor."""

    def __init__(self, rank: int):
        self.rank = rank
        self.mac = node_mac(rank)
        self.host = b"\xff" * 6
        #: Frames read and set aside (another EtherType or destination, malformed).
        self.ignored = 0
        self.frames_in = 0
        self.frames_out = 0
        #: Frames for the host dropped because it could not take them (:class:`UnixPort`: its queue
        #: stayed full for :attr:`UnixPort.SEND_WAIT` seconds).
        self.dropped = 0

    def fileno(self) -> int:
        raise NotImplementedError

    def _read(self) -> bytes | None:
        raise NotImplementedError

    def _write(self, data: bytes) -> None:
        raise NotImplementedError

    def read(self) -> bytes | None:
        """The next wirereduce frame for the node (non-blocking), or None if nothing usable was waiting."""
        data = self._read()
        if data is None:
            return None
        try:
            dst, src, etype, payload = parse_eth_frame(data)
        except ValueError:
            self.ignored += 1
            return None
        if etype != ETHERTYPE or dst != self.mac or not payload:
            self.ignored += 1
            return None
        self.host = src
        self.frames_in += 1
        return strip_padding(payload)

    def write(self, payload: bytes) -> None:
        """Send one wirereduce frame from the node to its host."""
        self.frames_out += 1
        self._write(eth_frame(self.host, self.mac, payload))

    def close(self) -> None:
        pass


class TapPort(HostPort):
    """Node ``rank``'s host port as TAP interface ``name`` (created here, gone when closed), its MTU
    set to ``mtu`` and brought up. Needs root or ``CAP_NET_ADMIN``."""

    def __init__(self, rank: int, name: str, mtu: int):
        super().__init__(rank)
        self.name = name
        try:
            self.fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        except (FileNotFoundError, PermissionError) as e:
            raise PermissionError(f"cannot open /dev/net/tun for TAP {name} ({e}): needs root or CAP_NET_ADMIN "
                                  f"and the tun module; or serve over UNIX sockets (--unix DIR)") from e
        try:
            fcntl.ioctl(self.fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
        except OSError as e:
            os.close(self.fd)
            raise PermissionError(f"cannot create TAP interface {name!r}: {e} (needs root or CAP_NET_ADMIN)") from e
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            ifr = name.encode().ljust(16, b"\0")
            fcntl.ioctl(s, SIOCSIFMTU, struct.pack("16si", ifr, mtu))
            flags = struct.unpack_from("H", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH", ifr, 0)), 16)[0]
            fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", ifr, flags | IFF_UP))
        self.buf = 65536

    def fileno(self) -> int:
        return self.fd

    def _read(self):
        try:
            return os.read(self.fd, self.buf)
        except BlockingIOError:
            return None

    def _write(self, data):
        os.write(self.fd, data)

    def close(self):
        os.close(self.fd)


class UnixPort(HostPort):
    """Node ``rank``'s host port as a UNIX datagram socket ``directory/node<rank>.sock`` (no root):
    :meth:`PacketTransport.unix <wirereduce.host.transports.packet.PacketTransport.unix>` talks to it."""

    #: File name suffix of the socket.
    SUFFIX = "sock"

    def __init__(self, rank: int, directory: str):
        super().__init__(rank)
        self.path = os.path.join(directory, f"node{rank}.{self.SUFFIX}")
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setblocking(False)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.peer = None

    def fileno(self):
        return self.sock.fileno()

    def _read(self):
        try:
            data, self.peer = self.sock.recvfrom(65536)
        except BlockingIOError:
            return None
        return data

    #: Seconds :meth:`write` waits for room in the rank's receive queue before it drops a frame.
    SEND_WAIT = 30.0

    def _write(self, data):
        if self.peer is None:
            return
        # A rank's datagram queue holds net.unix.max_dgram_qlen frames (10 by default): a rank that is
        # slow to read (a loaded machine) makes sendto fail with EAGAIN. The simulation waits for it
        # (simulated time stands still) instead of losing a result or stopping the server.
        deadline = time.monotonic() + self.SEND_WAIT
        while True:
            try:
                self.sock.sendto(data, self.peer)
                return
            except (ConnectionRefusedError, FileNotFoundError):  # the rank's process went away
                self.peer = None
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self.dropped += 1
                    return
                time.sleep(0.001)

    def close(self):
        self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


class DmaPort(UnixPort):
    """Node ``rank``'s host port as the PCIe top's DMA streams: the UNIX datagram socket
    ``directory/node<rank>.dma`` carrying raw wirereduce frames (no Ethernet header), one per
    datagram, as one XDMA packet carries one frame (docs/boards.md "PCIe host link").
    :meth:`XdmaTransport.unix <wirereduce.host.transports.xdma.XdmaTransport.unix>` talks to it."""

    SUFFIX = "dma"

    def read(self) -> bytes | None:
        data = self._read()
        if data is None:
            return None
        if not data:          # an empty datagram carries no frame
            self.ignored += 1
            return None
        self.frames_in += 1
        return data

    def write(self, payload: bytes) -> None:
        self.frames_out += 1
        self._write(payload)


def open_ports(nodes: int, taps: list[str] | None, unix: str | None, mtu: int) -> list[HostPort]:
    """One :class:`HostPort` per node: TAP interfaces ``taps`` (one name per node) or UNIX sockets in
    ``unix``, where each node has a :class:`DmaPort` too (listed after the :class:`UnixPort`\\ s:
    ``ports[k]`` and ``ports[nodes + k]`` are node k's).

    Raises ValueError if neither or both are given or ``taps`` has the wrong length."""
    if (taps is None) == (unix is None):
        raise ValueError("give either TAP interface names (one per node) or a UNIX socket directory")
    if taps is not None:
        if len(taps) != nodes:
            raise ValueError(f"{len(taps)} TAP names for {nodes} nodes: give one per node")
        ports = []
        try:
            for k, name in enumerate(taps):
                ports.append(TapPort(k, name, mtu))
        except Exception:
            for p in ports:
                p.close()
            raise
        return ports
    os.makedirs(unix, exist_ok=True)
    return [UnixPort(k, unix) for k in range(nodes)] + [DmaPort(k, unix) for k in range(nodes)]
