"""The wirereduce wire protocol, defined once for gateware, golden model, driver, tests and docs.

A wirereduce frame is the payload of an Ethernet II frame with EtherType :data:`ETHERTYPE`
(0x88B5, IEEE 802 local experimental, docs/protocol.md "Framing"). It starts with one fixed
16-byte header (:data:`HEADER_FIELDS`) followed by the element payload.

Byte order: every multi-byte field, and every fp32 element, is **little-endian**. That makes
the header a plain bit-slice of a beat (byte 0 of a frame is bits 0..7 of the first beat), so
the gateware reads it with a :class:`amaranth.lib.data.StructLayout` and no byte swapping, and a
fp32 payload is the bytes of a little-endian ``numpy.float32`` array.

Inside a node, ports carry the frame *without* the 14-byte Ethernet header: the Ethernet
framing is added and stripped at the link (see ``docs/protocol.md``); the link model charges
its bytes all the same.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, fields, replace

import numpy as np

__all__ = [
    "ETHERTYPE", "VERSION", "HEADER_BYTES", "ETH_HEADER_BYTES", "ETH_OVERHEAD_BYTES",
    "ETH_MIN_PAYLOAD_BYTES", "STATS_COUNTERS", "Opcode", "DType", "Codec", "CODEC_FORWARDED", "Flag", "Header",
    "HEADER_FIELDS", "header_layout", "max_elements", "wire_bytes", "ProtocolError", "NODE_COUNTERS",
    "engine_ports", "engine_port_counters", "engine_stats_counters", "stats_counters",
]

#: EtherType of wirereduce frames (IEEE 802 local experimental EtherType 1).
ETHERTYPE = 0x88B5
#: Protocol version this code speaks.
VERSION = 1
#: Bytes of the wirereduce header.
HEADER_BYTES = 16
#: Bytes of the Ethernet II header (destination, source, EtherType), IEEE 802.3 clause 3.
ETH_HEADER_BYTES = 14
#: Bytes a frame costs on the wire beyond its Ethernet header and payload: preamble + SFD (8),
#: FCS (4) and the minimum inter-frame gap (12), IEEE 802.3 clauses 3 and 4.
ETH_OVERHEAD_BYTES = 24
#: Minimum Ethernet payload; shorter frames are padded (IEEE 802.3 clause 3.2.7).
ETH_MIN_PAYLOAD_BYTES = 46


class ProtocolError(ValueError):
    """A frame or header that does not follow this protocol."""


class Opcode(enum.IntEnum):
    """What a frame is for (header field ``opcode``)."""

    #: Partial sum travelling the reduce direction of a schedule.
    REDUCE = 1
    #: Finished sum travelling the broadcast direction.
    BROADCAST = 2
    #: Host → node: one chunk of the host's local gradient.
    HOST_PUSH = 3
    #: Node → host: one chunk of the finished sum.
    HOST_RESULT = 4
    #: Host → node: start a collective. ``collective`` is its id, ``src`` the node's rank,
    #: ``hop`` the number of nodes, ``seq`` the number of chunks, ``dtype``/``codec``/``eb_k``
    #: what its data frames carry, ``count`` the request tag (echoed in STATS ``request_tag``),
    #: ``flags`` may hold :attr:`Flag.ABORT`. Header only (16 bytes). Answered with STATS.
    CONTROL = 5
    #: Host → node: ask for the status and drop counters; ``count`` is the request tag. Header
    #: only (16 bytes). Answered with STATS.
    STATS_REQUEST = 6
    #: Node → host: status and counters, payload :data:`STATS_COUNTERS` as little-endian u32.
    STATS = 7
    #: Host → schedule engine: table entries (:mod:`wirereduce.table`), ``seq`` the first flow
    #: they are for, ``count`` the payload's 32-bit words (2 per entry), ``collective`` the request
    #: tag (echoed in STATS ``request_tag``). Refused while a collective runs. Answered with STATS.
    SCHEDULE = 8


class DType(enum.IntEnum):
    """Element format of the payload: bits 0-3 of the header field ``dtype``; bits 4-7 hold the
    operation (:class:`wirereduce.formats.Op`, SUM = 0), so ``dtype`` = 1 is fp32 SUM."""

    FP32 = 1
    #: bfloat16, two elements per 32-bit payload word
    BF16 = 2
    #: IEEE 754 binary16, two elements per 32-bit payload word
    FP16 = 3
    #: two's-complement 32-bit integer (SUM wraps modulo 2**32)
    INT32 = 4


class Codec(enum.IntEnum):
    """Payload encoding (header field ``codec``); ``eb_k`` is the error-bound exponent."""

    NONE = 0
    INCEPTIONN_V1 = 1


#: ``codec`` of a compressed BROADCAST inside a codec engine that its ``CodecIn`` passed on as it
#: arrived (its length checked against its tags) instead of decompressing it; the engine's
#: ``CodecOut`` sets it back to ``INCEPTIONN_V1`` as the frame leaves, so it is never on a wire, and
#: a frame that arrives with it is taken as ``INCEPTIONN_V1`` (a BROADCAST) or dropped (any other
#: opcode: ``drop_codec``). docs/codec.md "Forwarded broadcasts".
CODEC_FORWARDED = 0x81


class Flag(enum.IntFlag):
    """Bits of the header field ``flags``; every other bit must be 0 (docs/protocol.md)."""

    #: CONTROL: start the new collective even if another one is still running (abort it).
    ABORT = 0x01
    #: REDUCE/BROADCAST/HOST_PUSH/HOST_RESULT: a placeholder for a chunk known lost (a frame
    #: spoilt on a cable, dropped by a gate). Header only, always marked ``bad``; it keeps the
    #: sequence numbers of every node in step and is never delivered to a host as a result.
    LOST = 0x02


#: Flags valid on each opcode; a frame with any other bit set is dropped (``drop_flags``).
FLAGS_ALLOWED: dict[int, int] = {
    Opcode.REDUCE: Flag.LOST, Opcode.BROADCAST: Flag.LOST, Opcode.HOST_PUSH: 0,
    Opcode.HOST_RESULT: Flag.LOST, Opcode.CONTROL: Flag.ABORT, Opcode.STATS_REQUEST: 0, Opcode.STATS: 0,
    Opcode.SCHEDULE: 0,
}

#: The header, in wire order: (name, bits). Sums to ``HEADER_BYTES * 8``.
HEADER_FIELDS: tuple[tuple[str, int], ...] = (
    ("version", 8),     # VERSION
    ("opcode", 8),      # Opcode
    ("dtype", 8),       # DType
    ("codec", 8),       # Codec
    ("eb_k", 8),        # error bound 2**-eb_k when codec != NONE
    ("src", 8),         # rank of the node (or host) that sent this frame
    ("hop", 8),         # hops travelled by a REDUCE/BROADCAST frame; node count in CONTROL
    ("flags", 8),       # Flag bits (FLAGS_ALLOWED per opcode), otherwise 0
    ("collective", 16), # collective id, set by CONTROL; frames of another id are dropped
    ("count", 16),      # elements in this frame's payload
    ("seq", 32),        # chunk sequence number within the collective; chunk total in CONTROL
)
assert sum(b for _, b in HEADER_FIELDS) == HEADER_BYTES * 8

_STRUCT = struct.Struct("<" + "".join({8: "B", 16: "H", 32: "I"}[b] for _, b in HEADER_FIELDS))

#: Counters carried by a STATS frame, in order, each a little-endian u32.
STATS_COUNTERS: tuple[str, ...] = (
    "collective",        # current collective id
    "rank",              # current rank
    "nodes",             # current node count
    "chunks",            # chunks in the current collective
    "request_tag",       # ``count`` of the last CONTROL / STATS_REQUEST (the request this STATS answers)
    "reduce_frames",     # REDUCE frames accepted from the ring
    "broadcast_frames",  # BROADCAST frames accepted from the ring
    "push_frames",       # HOST_PUSH frames accepted from the host
    "result_frames",     # HOST_RESULT frames sent to the host
    "drop_version",      # frames dropped: wrong protocol version
    "drop_opcode",       # frames dropped: opcode unknown or not valid on that port/rank
    "drop_collective",   # frames dropped: collective id is not the current one
    "drop_seq",          # frames dropped: sequence number out of order
    "drop_count",        # frames dropped: element count too large or not matching the local chunk
    "drop_short",        # frames dropped: shorter than the header
    "drop_codec",        # frames dropped: codec/eb_k not what this node was built with or this collective uses
    "drop_length",       # frames dropped (or passed on marked bad): length disagrees with the header / tags
    "drop_oversize",     # frames cut off and dropped: longer than the node's MTU
    "drop_dtype",        # frames dropped: dtype not the collective's
    "drop_flags",        # frames dropped: a flag bit not valid for the opcode
    "control_refused",   # CONTROL frames refused: a collective is running and the frame has no ABORT flag
    "drop_queue",        # beats lost: an engine output queue or host FIFO written while full (never expected)
    "link_drop_host",    # frames that went bad on the host's link into this node (FCS, runt, oversize, code, overflow)
    "link_drop_cw",      # likewise on the link from rank-1 (cw input); stomped frames not counted
    "link_drop_ccw",     # likewise on the link from rank+1 (ccw input)
    "drop_source",       # frames dropped by the ports: source MAC not the neighbour the port listens to
)
#: The MAC/port counters of one Ethernet port (``hdl/eth/port.py``, ``eth_stats_layout``), in order.
ETH_PORT_COUNTERS: tuple[str, ...] = (
    "rx_frames",           # frames delivered to the node
    "rx_fcs_errors",       # frames with a bad FCS (a bit error on this link)
    "rx_runts",            # frames shorter than 64 bytes
    "rx_oversize",         # frames longer than the MTU allows
    "rx_code_errors",      # frames cut short by a control character, bad preambles
    "rx_overflow",         # frames lost: no room in the receive FIFO
    "rx_ethertype_drops",  # good frames with another EtherType
    "rx_short_drops",      # frames too short for an Ethernet header
    "rx_stomped",          # frames that arrived with a stomped FCS (spoilt before this link)
    "tx_frames",           # frames sent
    "tx_stomped",          # of those, sent with a stomped FCS
    "tx_aborted",          # frames ended with /E/ (an underrun)
    "rx_source_drops",     # good frames from a source MAC other than the peer this port listens to
    "rx_pause_frames",     # IEEE 802.3x PAUSE frames received (honoured by the transmitter)
    "tx_pause_frames",     # PAUSE frames sent (receive FIFO over its threshold)
)
#: The node's three ports, in the order their counters follow the node's own in a STATS frame.
ETH_PORTS: tuple[str, ...] = ("host", "cw", "ccw")
STATS_COUNTERS += tuple(f"{port}_{name}" for port in ETH_PORTS for name in ETH_PORT_COUNTERS)
#: The STATS values that come from the ports in front of the node, the last ones: ``link_drop_{port}``,
#: then ``{port}_{counter}`` (the node's ``port_counters`` input, filled by the Ethernet layer).
PORT_COUNTERS: tuple[str, ...] = STATS_COUNTERS[STATS_COUNTERS.index("link_drop_host"):]
#: The counters of a node's own (not the ports'): the first values of every STATS frame, ring node
#: or schedule engine.
NODE_COUNTERS: tuple[str, ...] = STATS_COUNTERS[:STATS_COUNTERS.index("link_drop_host")]


def engine_ports(ports: int) -> tuple[str, ...]:
    """The port names of a schedule engine with ``ports`` network ports, in the order their
    counters follow in its STATS frame: ``host``, then ``net0`` … ``net{ports-1}`` (the schedule's
    port numbering, :class:`wirereduce.schedule.Topology`)."""
    return ("host",) + tuple(f"net{p}" for p in range(ports))


def engine_port_counters(ports: int) -> tuple[str, ...]:
    """What a schedule engine with ``ports`` network ports reads from the ports in front of it
    (its ``port_counters`` input), as :data:`PORT_COUNTERS` is the ring node's: ``link_drop_{port}``
    for each of :func:`engine_ports`, ``drop_source``, then ``{port}_{counter}`` for each port and
    each of :data:`ETH_PORT_COUNTERS`."""
    names = engine_ports(ports)
    return (tuple(f"link_drop_{p}" for p in names) + ("drop_source",)
            + tuple(f"{p}_{c}" for p in names for c in ETH_PORT_COUNTERS))


def engine_stats_counters(ports: int) -> tuple[str, ...]:
    """The counters of a schedule engine's STATS frame (``ports`` network ports, 1 … 8):
    :data:`NODE_COUNTERS`, ``ports`` (the engine's network port count, a constant), then
    :func:`engine_port_counters`. 24 + 16·(ports + 1) values (72 at P = 2, 104 at P = 4), never
    the ring node's 71, so a STATS frame's ``count`` names its layout (:func:`stats_counters`)."""
    if not isinstance(ports, int) or isinstance(ports, bool) or not 1 <= ports <= 8:
        raise ValueError(f"ports must be an int from 1 to 8, not {ports!r}")
    return NODE_COUNTERS + ("ports",) + engine_port_counters(ports)


def stats_counters(count: int) -> tuple[str, ...] | None:
    """The counter names of a STATS frame whose header ``count`` is ``count``: :data:`STATS_COUNTERS`
    (the ring node's, 71) or :func:`engine_stats_counters` of the port count it implies; None if
    no layout has that many values."""
    if count == len(STATS_COUNTERS):
        return STATS_COUNTERS
    with_host, rest = divmod(count - len(NODE_COUNTERS) - 2, len(ETH_PORT_COUNTERS) + 1)
    if rest == 0 and 1 <= with_host - 1 <= 8:
        return engine_stats_counters(with_host - 1)
    return None


def header_layout():
    """Return the header as an :class:`amaranth.lib.data.StructLayout` (128 bits).

    Field order and widths are :data:`HEADER_FIELDS`; bit 0 is bit 0 of byte 0 of the frame.
    """
    from amaranth.lib import data

    return data.StructLayout({name: bits for name, bits in HEADER_FIELDS})


@dataclass(frozen=True)
class Header:
    """One wirereduce header. ``pack()`` gives its 16 wire bytes; ``unpack()`` reads them."""

    opcode: int
    collective: int = 0
    seq: int = 0
    count: int = 0
    src: int = 0
    hop: int = 0
    dtype: int = DType.FP32
    codec: int = Codec.NONE
    eb_k: int = 0
    flags: int = 0
    version: int = VERSION

    def pack(self) -> bytes:
        """The 16 header bytes. Raises :class:`ProtocolError` if a field does not fit."""
        values = []
        for name, bits in HEADER_FIELDS:
            v = int(getattr(self, name))
            if not 0 <= v < (1 << bits):
                raise ProtocolError(f"header field {name}={v} does not fit in {bits} bits")
            values.append(v)
        return _STRUCT.pack(*values)

    @classmethod
    def unpack(cls, frame: bytes) -> Header:
        """Read the header from the first 16 bytes of ``frame``.

        Raises :class:`ProtocolError` if ``frame`` is shorter than the header.
        """
        if len(frame) < HEADER_BYTES:
            raise ProtocolError(f"frame of {len(frame)} bytes is shorter than the {HEADER_BYTES}-byte header")
        values = _STRUCT.unpack_from(frame)
        return cls(**{name: v for (name, _), v in zip(HEADER_FIELDS, values)})

    def to_int(self) -> int:
        """The header as one little-endian integer, as the gateware's StructLayout sees it."""
        return int.from_bytes(self.pack(), "little")

    def replace(self, **changes) -> Header:
        return replace(self, **changes)

    def __repr__(self) -> str:
        parts = []
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "opcode":
                try:
                    v = Opcode(v).name
                except ValueError:
                    pass
            parts.append(f"{f.name}={v}")
        return f"Header({', '.join(parts)})"


def frame(header: Header, payload: bytes | np.ndarray = b"") -> bytes:
    """Header followed by ``payload`` (fp32 arrays are written little-endian)."""
    if isinstance(payload, np.ndarray):
        payload = np.ascontiguousarray(payload, dtype="<f4").tobytes()
    return header.pack() + bytes(payload)


def max_elements(mtu: int) -> int:
    """fp32 elements that fit in one frame of Ethernet payload ``mtu`` bytes (1500, 9000, ...).

    Raises :class:`ProtocolError` if the MTU cannot hold the header and one element.
    """
    n = (mtu - HEADER_BYTES) // 4
    if n < 1:
        raise ProtocolError(f"MTU {mtu} cannot carry the {HEADER_BYTES}-byte header and one element")
    return n


def wire_bytes(frame_bytes: int) -> int:
    """Bytes of wire time one wirereduce frame of ``frame_bytes`` (header + payload) costs.

    Adds the Ethernet header, pads to the minimum payload and adds preamble, SFD, FCS and IFG.
    """
    return ETH_HEADER_BYTES + max(frame_bytes, ETH_MIN_PAYLOAD_BYTES) + ETH_OVERHEAD_BYTES
