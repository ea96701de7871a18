"""Raw-Ethernet transport for ONE rank: its host talks to its own node through a Linux interface.

This is the transport a user runs against a real board (a VC709's cage 0 cabled to the host's
NIC) or against ``wirereduce sim serve`` (a simulated node behind a TAP interface). Frames are
Ethernet II (IEEE 802.3 clause 3): destination the node's MAC, source the interface's MAC,
EtherType :data:`~wirereduce.protocol.ETHERTYPE` (0x88B5, IEEE local experimental), payload one
wirereduce frame (``docs/protocol.md``).

- **Sending.** A payload shorter than the 46-byte minimum (CONTROL, STATS_REQUEST: 16 bytes) is
  zero-padded to it here (clause 3.2.7), as a NIC would; veth and TAP interfaces do not pad.
- **Receiving.** Only EtherType 0x88B5 frames from the node's MAC addressed to this interface are
  taken; the padding a short frame got on the wire is cut off again (:func:`strip_padding`: only
  a frame of exactly 46 bytes is cut, and only to a length its header fixes).
- **MTU.** The interface's MTU (``/sys/class/net/<if>/mtu``) must be at least the nodes'
  :attr:`NodeConfig.mtu <wirereduce.config.NodeConfig.mtu>`, else the kernel would refuse the
  full chunks (jumbo frames need ``ip link set <if> mtu 9000`` on the host, the switch if any,
  and nodes built with ``--mtu 9000``); a smaller one raises :class:`ValueError` naming both
  fixes (raise the interface MTU, or build/drive the nodes with the smaller MTU).
- **Without root.** ``AF_PACKET`` needs root or ``CAP_NET_RAW``; without them
  :class:`PermissionError` says how to get them. :meth:`PacketTransport.unix` is the same
  transport over a UNIX datagram socket to ``wirereduce sim serve --unix DIR``, for machines
  without TAP or root.

The transport satisfies :class:`wirereduce.host.driver.Transport` for its own rank only
(``send``/``recv`` take the rank and refuse any other); :class:`wirereduce.host.rank.EngineRankDriver`
runs the allreduce over it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from pathlib import Path

from wirereduce.host.transports.base import RankTransport, check_rank, close_host_socket, host_socket

from wirereduce.protocol import ETH_HEADER_BYTES, ETH_MIN_PAYLOAD_BYTES, ETHERTYPE, HEADER_BYTES, Codec, Header, Opcode

__all__ = ["PacketTransport", "node_mac", "parse_mac", "format_mac", "interface_mac", "interface_mtu",
           "eth_frame", "parse_eth_frame", "strip_padding", "RAW_SOCKET_HELP", "HEADER_ONLY"]

#: What to do without the privilege ``AF_PACKET`` needs.
RAW_SOCKET_HELP = "needs root or CAP_NET_RAW: run with sudo or setcap cap_net_raw+ep $(which python)"

#: Opcodes whose frames are the 16-byte header alone (``count`` is a request tag, not elements).
HEADER_ONLY = (Opcode.CONTROL, Opcode.STATS_REQUEST)


def node_mac(rank: int) -> bytes:
    """Default MAC of node ``rank``'s host port: locally administered ``02:77:72:00:rr:02``, the one
    the simulated Ethernet network gives it (``wirereduce.sim.cluster.network.eth_mac(rank, 2)``)
    and ``wirereduce sim serve`` answers from. A real board's MAC is whatever its top sets."""
    if not isinstance(rank, int) or not 0 <= rank < 256:
        raise ValueError(f"rank must be 0 … 255, not {rank!r}")
    return bytes([0x02, 0x77, 0x72, 0x00, rank, 0x02])


def parse_mac(mac: str | bytes | int) -> bytes:
    """A MAC address as 6 bytes, from ``"02:77:72:00:00:02"``, 6 bytes or a 48-bit int.

    Raises ValueError on anything else."""
    if isinstance(mac, (bytes, bytearray)) and len(mac) == 6:
        return bytes(mac)
    if isinstance(mac, int) and not isinstance(mac, bool) and 0 <= mac < 1 << 48:
        return mac.to_bytes(6, "big")
    if isinstance(mac, str):
        parts = mac.replace("-", ":").split(":")
        if len(parts) == 6 and all(len(p) == 2 for p in parts):
            try:
                return bytes(int(p, 16) for p in parts)
            except ValueError:
                pass
    raise ValueError(f"not a MAC address (6 bytes, or 'xx:xx:xx:xx:xx:xx'): {mac!r}")


def format_mac(mac: bytes) -> str:
    return ":".join(f"{b:02x}" for b in mac)


def _sysfs(interface: str, name: str) -> str:
    path = Path("/sys/class/net") / interface / name
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise ValueError(f"no network interface {interface!r} here (see `ip link`)") from None


def interface_mac(interface: str) -> bytes:
    """The MAC address of a Linux network interface (``/sys/class/net/<if>/address``).

    Raises ValueError if there is no such interface."""
    return parse_mac(_sysfs(interface, "address"))


def interface_mtu(interface: str) -> int:
    """The MTU of a Linux network interface in bytes (the Ethernet payload it carries)."""
    return int(_sysfs(interface, "mtu"))


def eth_frame(dst: bytes, src: bytes, payload: bytes) -> bytes:
    """An Ethernet II frame without FCS: ``dst``, ``src``, EtherType 0x88B5, ``payload`` zero-padded
    to the 46-byte minimum (IEEE 802.3 clause 3.2.7)."""
    pad = max(0, ETH_MIN_PAYLOAD_BYTES - len(payload))
    return dst + src + struct.pack("!H", ETHERTYPE) + bytes(payload) + bytes(pad)


def strip_padding(payload: bytes) -> bytes:
    """A wirereduce frame with the Ethernet padding it got on the wire cut off.

    Ethernet carries no length for an EtherType frame, so only genuine padding is cut: a payload
    of exactly 46 bytes (the minimum, clause 3.2.7) whose header fixes a shorter length is cut to
    it: CONTROL and STATS_REQUEST to 16 bytes; an uncompressed data frame (``codec = NONE``) to
    ``16 + 4·count``; a compressed one (``INCEPTIONN_V1``) to the length its tags announce
    (``docs/codec.md``: tag block, then 0, 1, 2 or 4 code bytes per element). Anything else
    (longer payloads, malformed headers or tag blocks) is returned whole, for the node or the
    session to reject.
    """
    if len(payload) != ETH_MIN_PAYLOAD_BYTES:
        return bytes(payload)
    try:
        hdr = Header.unpack(payload)
    except Exception:  # a malformed header: leave it to the node / the session to reject
        return bytes(payload)
    if hdr.opcode in HEADER_ONLY:
        return bytes(payload[:HEADER_BYTES])
    want = None
    if hdr.codec == Codec.NONE:
        want = HEADER_BYTES + 4 * hdr.count
    elif hdr.codec == Codec.INCEPTIONN_V1:
        want = _compressed_bytes(payload, hdr.count)
    if want is not None and HEADER_BYTES < want < ETH_MIN_PAYLOAD_BYTES:
        return bytes(payload[:want])
    return bytes(payload)


def _compressed_bytes(payload: bytes, n: int) -> int | None:
    """Frame bytes a compressed payload of ``n`` elements announces in its tag block (None if the
    tag block does not fit)."""
    from wirereduce.codec import CODE_BYTES

    if not 1 <= n <= 4096:
        return None
    tb = 8 * -(-n // 32)
    body = payload[HEADER_BYTES:]
    if len(body) < tb:
        return None
    return HEADER_BYTES + tb + sum(CODE_BYTES[(body[i // 4] >> (2 * (i % 4))) & 3] for i in range(n))


def parse_eth_frame(data: bytes) -> tuple[bytes, bytes, int, bytes]:
    """``(dst, src, ethertype, payload)`` of an Ethernet II frame without FCS (no padding cut).

    Raises ValueError if it is shorter than the 14-byte header."""
    if len(data) < ETH_HEADER_BYTES:
        raise ValueError(f"an Ethernet frame of {len(data)} bytes, shorter than its 14-byte header")
    return bytes(data[:6]), bytes(data[6:12]), struct.unpack_from("!H", data, 12)[0], bytes(data[14:])


def _open_packet_socket(interface: str) -> socket.socket:
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETHERTYPE))
    except PermissionError as e:
        raise PermissionError(f"a raw Ethernet socket on {interface} {RAW_SOCKET_HELP}") from e
    try:
        sock.bind((interface, ETHERTYPE))
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot bind a raw Ethernet socket to interface {interface!r}: {e}") from e
    # Room for a burst of results (the window's worth and more) while the driver is busy.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    return sock


class PacketTransport(RankTransport):
    """Rank ``rank``'s host port, reached over a Linux interface with raw Ethernet frames.

    Parameters
    ----------
    interface : str
        The interface cabled to the node (``ip link``), e.g. ``enp1s0`` or a TAP of
        ``wirereduce sim serve``.
    rank, nodes : int
        This host's rank and the ring size.
    node : str, bytes or int, optional
        The node's MAC address (default :func:`node_mac` of ``rank``).
    mtu : int, optional
        The nodes' MTU (:attr:`NodeConfig.mtu <wirereduce.config.NodeConfig.mtu>`); checked
        against the interface's.
    timeout : float
        Seconds a :meth:`recv` waits before raising ``TimeoutError`` (a lost frame or a dead
        peer then fails the collective instead of hanging it).

    Raises
    ------
    PermissionError
        Without root or ``CAP_NET_RAW`` (:data:`RAW_SOCKET_HELP`).
    ValueError
        If the interface does not exist, its MTU is below ``mtu``, or an argument is malformed.
    """

    def __init__(self, interface: str | None, rank: int, nodes: int, node: str | bytes | int | None = None,
                 mtu: int | None = None, timeout: float = 2.0, *, _sock: socket.socket | None = None,
                 _src: bytes | None = None, _peer=None):
        check_rank(rank, nodes, timeout)
        self.rank = rank
        self.nodes = nodes
        self.timeout = float(timeout)
        self.node_mac = node_mac(rank) if node is None else parse_mac(node)
        self.interface = interface
        self._peer = _peer
        if _sock is None:
            if mtu is not None:
                have = interface_mtu(interface)  # ValueError: no such interface
                if have < mtu:
                    raise ValueError(
                        f"interface {interface} has MTU {have} bytes, smaller than the nodes' {mtu}: raise it "
                        f"(`ip link set {interface} mtu {mtu}`; the NIC and any switch must take jumbo frames) "
                        f"or build and drive the nodes with --mtu {have}")
            self.src_mac = interface_mac(interface)
            _sock = _open_packet_socket(interface)
        else:
            self.src_mac = _src
        self.sock = _sock
        self.sock.setblocking(False)
        #: Frames received and set aside: not EtherType 0x88B5 from the node to us.
        self.ignored = 0

    @classmethod
    def unix(cls, directory: str | os.PathLike, rank: int, nodes: int, timeout: float = 2.0) -> PacketTransport:
        """The same transport over a UNIX datagram socket to ``wirereduce sim serve --unix DIR``
        (node ``rank`` listens on ``DIR/node<rank>.sock``); needs neither root nor TAP.

        Raises FileNotFoundError if the server's socket is not there."""
        peer = os.path.join(os.fspath(directory), f"node{rank}.sock")
        if not os.path.exists(peer):
            raise FileNotFoundError(f"no simulated node at {peer}: start `wirereduce sim serve --unix {directory}`")
        sock = host_socket("wr-rank")
        src = bytes([0x02, 0x77, 0x72, 0x00, rank, 0x03])  # the host NIC of eth_mac(rank, 3)
        return cls(None, rank, nodes, timeout=timeout, _sock=sock, _src=src, _peer=peer)

    def close(self) -> None:
        close_host_socket(self.sock)

    async def send(self, node: int, data: bytes) -> None:
        """Send one wirereduce frame to the node (padded to the Ethernet minimum)."""
        self._check(node)
        f = eth_frame(self.node_mac, self.src_mac, data)
        loop = asyncio.get_running_loop()
        if self._peer is not None:
            await loop.sock_sendto(self.sock, f, self._peer)
        else:
            await loop.sock_sendall(self.sock, f)

    def _take(self, data: bytes) -> bytes | None:
        try:
            dst, src, etype, payload = parse_eth_frame(data)
        except ValueError:
            return None
        if etype != ETHERTYPE or src != self.node_mac or dst != self.src_mac:
            return None
        return strip_padding(payload)

    async def recv(self, node: int) -> bytes:
        """The next wirereduce frame from the node (padding cut, :func:`strip_padding`).

        Raises TimeoutError after :attr:`timeout` seconds without one."""
        self._check(node)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while True:
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                data = await asyncio.wait_for(loop.sock_recv(self.sock, 65536), left)
            except asyncio.TimeoutError:
                break
            payload = self._take(data)
            if payload is None:
                self.ignored += 1
                continue
            self._arrived()
            return payload
        where = f"interface {self.interface}" if self.interface else f"socket {self._peer}"
        raise TimeoutError(f"node {self.rank} ({format_mac(self.node_mac)}) sent its host nothing on {where} "
                           f"for {self.timeout:g} s: a frame was lost, a rank stopped, or the node is not there")
