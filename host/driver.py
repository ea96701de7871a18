"""The host-side allreduce driver: a sans-IO protocol core and the loop that runs it.

The core knows the protocol and nothing about I/O. It makes every decision of an allreduce:

- :class:`NodeSession`: one node's gradient as frames (CONTROL, then HOST_PUSH chunks of
  :func:`chunk_elements`), and the frames the node sends back (STATS, HOST_RESULT) reassembled;
- :class:`Round`: one collective, a session per rank (id from :class:`CollectiveIds`), with the
  frames every host sends, in order, each with the results it waits for (:class:`Push`, the window);
- :class:`Allreduce`: the rounds of one allreduce: the first over the whole gradient and, when
  chunks are lost (:class:`ChunksLost`) and ``retries`` are left, one over just the lost elements,
  whose sums are put back in place.

Engines only carry these out. :class:`Cluster` runs them over a :class:`Transport`, which moves frame
bytes to and from node ``k``'s host port: the cocotb simulation
(:mod:`wirereduce.host.transports.cocotb`) and, with another transport, real boards (the pattern
of Glasgow's applet interfaces). The fast simulation engine (``wirereduce.sim.engines.fastsim``)
replays each :class:`Round` as a frame script.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from wirereduce.config import NodeConfig
from wirereduce.protocol import (
    HEADER_BYTES,
    STATS_COUNTERS,
    Codec,
    DType,
    Flag,
    Header,
    Opcode,
    ProtocolError,
    frame,
    stats_counters,
    wire_bytes,
)

__all__ = ["plan_chunks", "chunk_elements", "parse_stats", "NodeSession", "CollectiveIds", "RequestTags", "Push",
           "Round", "Allreduce", "Transport", "Cluster", "DriverError", "ControlRefused", "ChunksLost",
           "loss_report", "lost_chunks", "lost_ranges", "gather_ranges", "scatter_ranges", "check_retries",
           "check_window", "check_timeout", "default_window", "expected_cycles", "deadline_cycles", "DEADLINE_FACTOR",
           "DEADLINE_SLACK_CYCLES", "HOP_CYCLES", "ANSWER_CYCLES"]


class DriverError(RuntimeError):
    """The cluster did not do what the protocol promises (missing or malformed results)."""


class ControlRefused(DriverError):
    """A node refused the CONTROL frame that was to start a collective (docs/protocol.md "Starting a
    collective: CONTROL"): its STATS answer (matched by request tag) still shows the configuration
    it had. The node refuses a CONTROL without ``Flag.ABORT`` while its collective is still running
    (another host's, or one whose chunks were lost), and one with an invalid field; the driver sends
    only valid fields, except that compression needs a node built with the codec.

    Attributes
    ----------
    rank : int
        The node that refused.
    sent : dict[str, int]
        The configuration the CONTROL asked for (``collective``, ``rank``, ``nodes``, ``chunks``).
    stats : dict[str, int]
        The node's STATS answer: the configuration it kept and its counters (``control_refused``).
    """

    def __init__(self, message: str, rank: int, sent: dict, stats: dict):
        super().__init__(message)
        self.rank = rank
        self.sent = dict(sent)
        self.stats = dict(stats)


class ChunksLost(DriverError):
    """The collective ended before every host had every result: chunks were lost on the way.

    Raised instead of waiting for ever: when the round's deadline (:func:`deadline_cycles`) passes
    with results missing, or when every missing chunk was reported lost by the nodes (a HOST_RESULT
    with ``Flag.LOST``). The lost chunks are summed again only with ``retries``
    (:meth:`Allreduce.retry`; on schedule engines
    :meth:`EngineAllreduce.retry <wirereduce.host.engine.EngineAllreduce.retry>`).

    What it claims: every chunk in :attr:`received` passed every check :meth:`NodeSession.receive`
    makes (opcode, collective, sequence number, dtype, codec, ``eb_k``, flags, length and, for
    compressed chunks, the tags) and holds the values the node sent; that is all the driver can
    vouch for. A chunk in :attr:`missing` has no value (zeros in :attr:`results`); it was either
    reported lost by the node (:attr:`reported_lost`) or never arrived (:attr:`never_arrived`).

    Attributes
    ----------
    missing : dict[int, list[int]]
        Rank → sequence numbers of the result chunks that host did not receive.
    reported_lost : dict[int, list[int]]
        Rank → of those, the chunks its node reported lost (a LOST placeholder).
    never_arrived : dict[int, list[int]]
        Rank → of those, the chunks of which nothing arrived.
    stats : dict[int, dict[str, int] | None]
        Rank → its STATS counters read after the stall (None where the node did not answer).
    results : list of numpy.ndarray, float32
        What each host received, zeros where a chunk is missing.
    received : list of numpy.ndarray, bool, shape (chunks,)
        Per host, which result chunks arrived (and passed every check).
    chunks : list of (int, int)
        (offset, count) in elements of every chunk.
    """

    def __init__(self, message: str, sessions, stats: dict):
        super().__init__(message)
        self.missing = {s.rank: s.missing for s in sessions}
        self.reported_lost = {s.rank: s.reported_lost for s in sessions}
        self.never_arrived = {s.rank: s.never_arrived for s in sessions}
        self.stats = dict(stats)
        self.results = [s.result for s in sessions]
        self.received = [s.received.copy() for s in sessions]
        self.chunks = list(sessions[0].chunks)


#: Counters that name why a node dropped frames, with what to say about them.
_DROP_REASONS = (
    ("link_drop_cw", "frames spoilt on the link from rank − 1 (bad FCS, runt, code error …)"),
    ("link_drop_ccw", "frames spoilt on the link from rank + 1 (bad FCS, runt, code error …)"),
    ("link_drop_host", "frames spoilt on the link from its host"),
    ("drop_seq", "frames dropped for an out-of-order sequence number (after a lost one)"),
    ("drop_codec", "compressed frames dropped for a bad length"),
    ("drop_count", "frames dropped for a bad element count"),
    ("drop_short", "frames dropped as too short"),
    ("drop_version", "frames dropped for a bad version"),
    ("drop_opcode", "frames dropped for a bad opcode"),
    ("drop_collective", "frames of another collective dropped"),
    ("control_refused", "CONTROL frames refused (a collective was running, or a field was invalid)"),
)


def _drop_reasons(stats: dict) -> list[tuple[str, str]]:
    """:data:`_DROP_REASONS`, with a schedule engine's network ports (``link_drop_net{p}``) in
    front of it where ``stats`` has them."""
    nets = sorted((k for k in stats if k.startswith("link_drop_net")), key=lambda k: int(k[len("link_drop_net"):]))
    return [(k, f"frames spoilt on the link into network port {k[len('link_drop_net'):]} (bad FCS, runt, "
                f"code error …)") for k in nets] + list(_DROP_REASONS)


def check_retries(retries) -> int:
    """Validate a ``retries`` count (an int ≥ 0); returns it. Raises ValueError otherwise."""
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise ValueError(f"retries must be an int ≥ 0, not {retries!r}")
    return retries


def check_window(window) -> int | None:
    """Validate a host ``window`` (None: no window, or an int ≥ 1 chunks); returns it.

    Raises ValueError otherwise (0 included: say None for no window).
    """
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise ValueError(f"window must be None or an int ≥ 1 chunks, not {window!r}")
    return window


def check_timeout(timeout_cycles) -> int | None:
    """Validate a deadline override (None: derive it, :func:`deadline_cycles`; or an int ≥ 1
    cycles); returns it. Raises ValueError otherwise."""
    if timeout_cycles is not None and (not isinstance(timeout_cycles, int) or isinstance(timeout_cycles, bool)
                                       or timeout_cycles < 1):
        raise ValueError(f"timeout must be None or an int ≥ 1 cycles, not {timeout_cycles!r}")
    return timeout_cycles


#: Stall detection (docs/architecture.md "Stall detection"): a round is given
#: ``DEADLINE_FACTOR`` × :func:`expected_cycles` + ``DEADLINE_SLACK_CYCLES`` from its first push.
DEADLINE_FACTOR = 4
#: Fixed slack of every deadline, cycles: start-up, Python-side scheduling of a simulation's host
#: models, an Ethernet MAC/PCS's latency; also the wait for one STATS answer (:data:`ANSWER_CYCLES`).
DEADLINE_SLACK_CYCLES = 5_000
#: Cycles a STATS answer (to a CONTROL or STATS_REQUEST) may take: a 232-byte frame and two host links.
ANSWER_CYCLES = DEADLINE_SLACK_CYCLES
#: Cycles of latency one hop may add beyond serialising its frame: the gate (2), the reduce
#: pipeline (7), a link model (4 + its FIFO) or an Ethernet port's MAC and PCS (tens), generously.
HOP_CYCLES = 64


def expected_cycles(chunks: Sequence[tuple[int, int]], nodes: int, link_rate: float,
                    window: int | None = None) -> int:
    """Cycles one allreduce of ``chunks`` ((offset, count) in fp32 elements) should take on ``nodes``
    nodes whose links move ``link_rate`` wire bytes per cycle (8 at 10 Gbit/s and 156.25 MHz;
    ``line_bytes_per_cycle`` in ``sim/cluster/network.py``), from the first push to the last result.

    The time model of docs/architecture.md: the message's wire bytes (each chunk
    :func:`~wirereduce.protocol.wire_bytes` of its worst-case frame: every element raw, plus the
    compressed tags) over one link, plus the fill: the last chunk's trip through 2N + 2 hops (host
    link in, N − 1 reduce hops, N − 1 broadcast hops, host link out, and the codec's or a
    store-and-forward port's extra hop), each :data:`HOP_CYCLES` plus one whole frame. With a host
    ``window`` of W chunks (:meth:`NodeSession.results_needed`), at most W chunks are on that trip
    at a time, so the serialisation term is at least ``(chunks − W) / W`` trips.

    Raises ValueError on no chunks, ``nodes`` < 1 or ``link_rate`` ≤ 0.
    """
    if not chunks or nodes < 1 or not link_rate > 0:
        raise ValueError(f"expected_cycles needs chunks, nodes ≥ 1 and link_rate > 0, not "
                         f"{len(chunks)} chunks, {nodes}, {link_rate}")
    frames = [wire_bytes(HEADER_BYTES + 4 * n + 8 * -(-n // 32)) for _, n in chunks]
    trip = (2 * nodes + 2) * (HOP_CYCLES + max(frames) / link_rate)
    serial = sum(frames) / link_rate
    if window:  # the chunks beyond the first window each wait for a result: a trip per window
        serial = max(serial, max(0, len(chunks) - window) / window * trip)
    return math.ceil(serial + trip)


def deadline_cycles(chunks: Sequence[tuple[int, int]], nodes: int, link_rate: float,
                    slowdown: float = 1.0, window: int | None = None) -> int:
    """The deadline of one round: ``DEADLINE_FACTOR`` (4) × :func:`expected_cycles` (with the
    hosts' ``window``) × ``slowdown`` + ``DEADLINE_SLACK_CYCLES`` (5,000) cycles. ``slowdown`` ≥ 1
    stretches the expected time for hosts slower than the links (a simulation's random
    back-pressure: 1 / the probability that a host takes or offers a beat). A round still missing
    results at its deadline is over (:class:`ChunksLost`); ``timeout`` options override the deadline.
    """
    if not slowdown >= 1:
        raise ValueError(f"slowdown must be ≥ 1, not {slowdown!r}")
    expected = expected_cycles(chunks, nodes, link_rate, window)
    return math.ceil(DEADLINE_FACTOR * expected * slowdown) + DEADLINE_SLACK_CYCLES


def default_window(config: NodeConfig) -> int:
    """The window of a host on a link without back-pressure (a real NIC): the nodes' buffer
    ``slots``, so that a push always finds its buffer slot free (:meth:`NodeSession.results_needed`)."""
    return config.slots


def lost_chunks(err: ChunksLost) -> list[int]:
    """Sequence numbers of every chunk that some host is missing, in increasing order."""
    return sorted(set().union(*err.missing.values()))


def lost_ranges(err: ChunksLost) -> list[tuple[int, int]]:
    """(offset, count) in elements of every chunk that some host is missing, in order."""
    return [err.chunks[s] for s in lost_chunks(err)]


def gather_ranges(arrays, ranges, dtype=np.float32) -> list[np.ndarray]:
    """Each array's elements in ``ranges`` ((offset, count) pairs), concatenated: ``dtype`` (default
    float32; the schedule engine's retries gather uint32 payload words), shape (sum of counts,)."""
    return [np.concatenate([a[off:off + n] for off, n in ranges]).astype(dtype) for a in arrays]


def scatter_ranges(result: np.ndarray, ranges, values: np.ndarray, dtype=np.float32) -> np.ndarray:
    """A copy of ``result`` (as ``dtype``, default float32) with ``values`` (as :func:`gather_ranges`
    laid them out) put back in ``ranges``."""
    out = np.array(result, dtype=dtype, copy=True)
    pos = 0
    for off, n in ranges:
        out[off:off + n] = values[pos:pos + n]
        pos += n
    return out


def _seqs(seqs: list[int]) -> str:
    return f"{seqs[:8]}" + (f" … ({len(seqs)} in all)" if len(seqs) > 8 else "")


def loss_report(sessions, stats: dict, what: str) -> str:
    """The message of a :class:`ChunksLost`: per host, the chunks received and the chunks missing
    (reported lost by the node, or never arrived), and which nodes counted dropped frames (STATS
    ``link_drop_*`` and ``drop_*``, ``docs/protocol.md``).

    ``sessions``: the :class:`NodeSession` of each host; ``stats``: rank → STATS counters or None;
    ``what``: how the loss showed (e.g. "the ring stalled after 51,234 cycles").
    """
    lines = [f"{what} with results missing:"]
    for s in sessions:
        if s.done:
            lines.append(f"  node {s.rank}: {s.results_received}/{len(s.chunks)} result chunks, all received")
            continue
        detail = []
        if s.reported_lost:
            detail.append(f"reported lost by the node: {_seqs(s.reported_lost)}")
        if s.never_arrived:
            detail.append(f"never arrived: {_seqs(s.never_arrived)}")
        lines.append(f"  node {s.rank}: {s.results_received}/{len(s.chunks)} result chunks, "
                     f"missing {_seqs(s.missing)} ({'; '.join(detail)})")
    for rank in sorted(stats):
        st = stats[rank]
        if st is None:
            lines.append(f"  node {rank}: did not answer a STATS_REQUEST")
            continue
        for name, why in _drop_reasons(st):
            if st.get(name):
                lines.append(f"  node {rank}: {st[name]} {why} [{name}]")
    if not any(st is not None for st in stats.values()):
        lines.append("  (no node's counters could be read)")
    lines.append("Each chunk received passed every check the driver makes (opcode, collective, sequence "
                 "number, dtype, codec, eb_k, flags, length); the missing ones have no value (zeros).")
    lines.append("Lost chunks are not recovered: check the links (cables, FCS error counters) and rerun, "
                 "or pass retries.")
    return "\n".join(lines)


def plan_chunks(n: int, elements_per_frame: int) -> list[tuple[int, int]]:
    """Split ``n`` elements into chunks of at most ``elements_per_frame``: [(offset, count), …].

    Raises
    ------
    ValueError
        If ``n`` < 1 or ``elements_per_frame`` < 1.
    """
    if n < 1:
        raise ValueError(f"nothing to split: {n} elements")
    if elements_per_frame < 1:
        raise ValueError(f"elements_per_frame must be ≥ 1, not {elements_per_frame}")
    return [(off, min(elements_per_frame, n - off)) for off in range(0, n, elements_per_frame)]


def chunk_elements(config: NodeConfig, compression: int | None = None) -> int:
    """Elements per chunk for nodes built as ``config``: :attr:`NodeConfig.max_elements
    <wirereduce.config.NodeConfig.max_elements>` (371 at MTU 1500), or with ``compression`` the
    worst-case bound :func:`wirereduce.codec.max_elements_compressed` (349 at MTU 1500, 2112 at
    9000) so that even an incompressible chunk fits in one frame.

    Raises ValueError on a ``compression`` outside 4 … 24.
    """
    if compression is None:
        return config.max_elements
    from wirereduce.codec import check_k, max_elements_compressed

    check_k(compression)
    return max_elements_compressed(config.mtu)


def parse_stats(data: bytes) -> dict[str, int]:
    """Decode a STATS frame into ``{counter name: value}``. The names are the ring node's
    :data:`STATS_COUNTERS`, or a schedule engine's :func:`~wirereduce.protocol.engine_stats_counters`
    (its ``ports`` network ports ``net0`` …, each with ``link_drop_net{p}`` and the MAC counters
    ``net{p}_…``) when the header's ``count`` says so (:func:`~wirereduce.protocol.stats_counters`;
    docs/protocol.md "STATS payload").

    Raises
    ------
    ProtocolError
        If the frame is not a STATS frame or is too short for its layout.
    """
    hdr = Header.unpack(data)
    if hdr.opcode != Opcode.STATS:
        raise ProtocolError(f"not a STATS frame: {hdr!r}")
    names = stats_counters(hdr.count) or STATS_COUNTERS
    need = HEADER_BYTES + 4 * len(names)
    if len(data) < need:
        raise ProtocolError(f"STATS frame of {len(data)} bytes, expected {need}")
    values = struct.unpack_from(f"<{len(names)}I", data, HEADER_BYTES)
    return dict(zip(names, values))


class CodecFields:
    """The ``codec`` and ``eb_k`` header fields of a session's data frames, from its ``compression``
    (the error-bound exponent k, or None uncompressed); mixed into :class:`NodeSession` and
    :class:`~wirereduce.host.engine.EngineSession`."""

    compression: int | None

    @property
    def codec(self) -> int:
        """The ``codec`` field of this collective's data frames."""
        return Codec.NONE if self.compression is None else Codec.INCEPTIONN_V1

    @property
    def eb_k(self) -> int:
        """The ``eb_k`` field of this collective's data frames (0 uncompressed)."""
        return 0 if self.compression is None else self.compression


@dataclass
class NodeSession(CodecFields):
    """One node's part of one allreduce, sans-IO.

    Parameters
    ----------
    rank, nodes : int
        This node's position in the schedule and the ring size.
    collective : int
        Collective id (0 … 65535); the node drops frames of any other id.
    data : numpy.ndarray, float32, shape (n,)
        This node's gradient.
    elements_per_frame : int
        Chunk size in elements (:func:`chunk_elements` of the nodes' configuration).
    compression : int, optional
        Error-bound exponent ``k`` (4 … 24) of the INCEPTIONN-style codec (docs/codec.md):
        pushes are sent compressed (``codec = INCEPTIONN_V1``, ``eb_k = k``; the nodes must be
        built with ``NodeConfig(codec=True)``) and compressed results are decoded. ``None``
        (default): uncompressed.
    tag : int
        Request tag (0 … 65535) of the CONTROL frame (its ``count``); the node's STATS answer
        echoes it in ``request_tag`` (:meth:`is_answer`). Give every request a fresh one
        (:class:`RequestTags`).
    abort : bool
        Set ``Flag.ABORT`` in the CONTROL frame: the node aborts a collective still running
        instead of refusing the CONTROL.

    Attributes
    ----------
    result : numpy.ndarray, float32, shape (n,)
        The reassembled sum, complete when :attr:`done`.
    received, lost : numpy.ndarray, bool, shape (chunks,)
        Which result chunks arrived (and passed every check), which the node reported lost.
    unexpected : list of Header
        Frames received that belong to no chunk of this collective (kept for diagnosis).
    """

    rank: int
    nodes: int
    collective: int
    data: np.ndarray
    elements_per_frame: int
    compression: int | None = None
    tag: int = 0
    abort: bool = False
    chunks: list[tuple[int, int]] = field(init=False)
    result: np.ndarray = field(init=False)
    received: np.ndarray = field(init=False)
    lost: np.ndarray = field(init=False)
    unexpected: list = field(init=False, default_factory=list)

    def __post_init__(self):
        if not 0 <= self.rank < self.nodes:
            raise ValueError(f"rank {self.rank} outside 0 … {self.nodes - 1}")
        if not 0 <= self.collective < 1 << 16:
            raise ValueError(f"collective id {self.collective} does not fit in 16 bits")
        if not isinstance(self.tag, int) or not 0 <= self.tag < 1 << 16:
            raise ValueError(f"request tag {self.tag!r} does not fit in 16 bits")
        if self.compression is not None:
            from wirereduce.codec import check_k

            self.compression = check_k(self.compression)
        self.chunks = plan_chunks(self.data.size, self.elements_per_frame)
        self.result = np.zeros(self.data.size, dtype=np.float32)
        self.received = np.zeros(len(self.chunks), dtype=bool)
        self.lost = np.zeros(len(self.chunks), dtype=bool)

    def control_frame(self) -> bytes:
        """The CONTROL frame that starts the collective on this node: id, rank, node count, chunk
        count, the data frames' dtype/codec/eb_k, the request tag in ``count`` and, with
        ``abort``, ``Flag.ABORT``."""
        return Header(opcode=Opcode.CONTROL, collective=self.collective, src=self.rank, hop=self.nodes,
                      seq=len(self.chunks), count=self.tag, dtype=DType.FP32, codec=self.codec, eb_k=self.eb_k,
                      flags=Flag.ABORT if self.abort else 0).pack()

    def is_answer(self, data: bytes) -> bool:
        """Whether ``data`` is the STATS answer to :meth:`control_frame`: a STATS frame whose
        ``request_tag`` is :attr:`tag`. Anything else (a result of an earlier collective, a stray
        STATS, the answer to an earlier request) is not."""
        try:
            return parse_stats(data)["request_tag"] == self.tag
        except ProtocolError:
            return False

    def check_ack(self, data: bytes) -> dict[str, int]:
        """Check the STATS answer to :meth:`control_frame`; returns the counters.

        Raises
        ------
        DriverError
            If ``data`` is not the answer to this CONTROL (:meth:`is_answer`; skip such frames
            first).
        ControlRefused
            If the node refused the CONTROL: the answer shows another configuration.
        """
        if not self.is_answer(data):
            try:
                what = f"the answer to request {parse_stats(data)['request_tag']}"
            except ProtocolError:
                what = repr(Header.unpack(data))
            raise DriverError(f"node {self.rank}: expected the STATS answer to CONTROL request {self.tag}, "
                              f"got {what}")
        stats = parse_stats(data)
        want = {"collective": self.collective, "rank": self.rank, "nodes": self.nodes,
                "chunks": len(self.chunks)}
        got = {k: stats[k] for k in want}
        if got != want:
            codec = ("; or the node was built without the codec, which compression needs "
                     "(NodeConfig(codec=True))" if self.compression is not None else "")
            raise ControlRefused(
                f"node {self.rank} refused the CONTROL of collective {self.collective} (request {self.tag}; "
                f"control_refused = {stats.get('control_refused')}): it is running collective "
                f"{got['collective']} (rank {got['rank']} of {got['nodes']}, {got['chunks']} chunks), which "
                f"has not finished{codec}. Pass abort=True to abort it (retry rounds do), or wait for it "
                f"to finish.", self.rank, want, stats)
        return stats

    @staticmethod
    def results_needed(seq: int, window: int | None) -> int:
        """Results a host must have received before it may push chunk ``seq`` with a ``window``.

        The window is the host-side flow control for links without back-pressure (a real NIC):
        at most ``window`` chunks are pushed ahead of the results received, so with
        ``window`` ≤ the node's buffer slots a push always finds its slot free (a result for
        chunk ``s`` means every node has read chunk ``s`` from its buffer). ``None`` or 0: no
        window (rely on the host port's back-pressure).
        """
        return max(0, seq - window + 1) if window else 0

    @property
    def results_received(self) -> int:
        return int(self.received.sum())

    def push_frames(self):
        """HOST_PUSH frames of this node's chunks, in sequence order."""
        k = self.compression
        for seq, (off, n) in enumerate(self.chunks):
            hdr = Header(opcode=Opcode.HOST_PUSH, collective=self.collective, seq=seq, count=n,
                         src=self.rank)
            if k is None:
                yield frame(hdr, self.data[off:off + n])
            else:
                from wirereduce.codec import encode

                yield frame(hdr.replace(codec=Codec.INCEPTIONN_V1, eb_k=k), encode(self.data[off:off + n], k))

    def receive(self, data: bytes) -> bool:
        """Take one frame from the node; returns True if it was a result (or a lost-chunk report)
        of this collective.

        A frame of another opcode or collective is recorded in :attr:`unexpected` and otherwise
        ignored (a STATS, a late result of an earlier collective). A HOST_RESULT of this
        collective must pass every check, in order: ``seq`` below the chunk count; ``flags``
        0, or ``Flag.LOST`` alone, which reports the chunk lost (:attr:`lost`: missing, not an
        error, not a value; docs/protocol.md); ``dtype`` FP32; ``codec`` and ``eb_k`` those of
        this session (an uncompressed session refuses a compressed result and vice versa); the
        length: ``count`` elements, ``4·count`` payload bytes raw, or tags and codes that decode
        to ``count`` elements compressed.

        Raises
        ------
        DriverError
            If a result of this collective fails a check, or a chunk arrives (or is reported
            lost) twice.
        ProtocolError
            If ``data`` is shorter than a header.
        """
        hdr = Header.unpack(data)
        if hdr.opcode != Opcode.HOST_RESULT or hdr.collective != self.collective:
            self.unexpected.append(hdr)
            return False
        where = f"node {self.rank}: result chunk {hdr.seq} of collective {self.collective}"
        if hdr.seq >= len(self.chunks):
            raise DriverError(f"{where} is out of range: the collective has {len(self.chunks)} chunks")
        if self.received[hdr.seq] or self.lost[hdr.seq]:
            again = "reported lost" if hdr.flags == Flag.LOST else "arrived"
            raise DriverError(f"{where} {again} twice (it was already "
                              f"{'received' if self.received[hdr.seq] else 'reported lost'})")
        if hdr.flags == Flag.LOST:
            self.lost[hdr.seq] = True
            return True
        if hdr.flags:
            raise DriverError(f"{where} has flags {hdr.flags:#04x}: only LOST ({int(Flag.LOST):#04x}) may be set")
        if hdr.dtype != DType.FP32:
            raise DriverError(f"{where} has dtype {hdr.dtype}, not FP32 ({int(DType.FP32)})")
        if (hdr.codec, hdr.eb_k) != (self.codec, self.eb_k):
            asked = "uncompressed" if self.compression is None else f"compressed with k = {self.compression}"
            raise DriverError(f"{where} has codec {hdr.codec}, eb_k {hdr.eb_k}; this session asked for "
                              f"{asked} (codec {int(self.codec)}, eb_k {self.eb_k}): refused")
        off, n = self.chunks[hdr.seq]
        if hdr.codec == Codec.INCEPTIONN_V1:
            from wirereduce.codec import decode

            try:
                values = decode(data[HEADER_BYTES:], n, hdr.eb_k) if hdr.count == n else None
            except ValueError as e:
                raise DriverError(f"node {self.rank}: compressed result chunk {hdr.seq} is malformed: {e}") from e
            if values is None:
                raise DriverError(f"node {self.rank}: result chunk {hdr.seq} has count {hdr.count}, "
                                  f"expected {n} elements")
        elif hdr.count != n or len(data) != HEADER_BYTES + 4 * n:
            raise DriverError(f"node {self.rank}: result chunk {hdr.seq} has count {hdr.count} and "
                              f"{len(data) - HEADER_BYTES} payload bytes, expected {n} elements")
        else:
            values = np.frombuffer(data, dtype="<f4", count=n, offset=HEADER_BYTES)
        self.result[off:off + n] = values
        self.received[hdr.seq] = True
        return True

    @property
    def done(self) -> bool:
        """Every result chunk has arrived."""
        return bool(self.received.all())

    @property
    def settled(self) -> bool:
        """Every result chunk has arrived or been reported lost: nothing more to wait for."""
        return bool((self.received | self.lost).all())

    @property
    def missing(self) -> list[int]:
        """Chunks not received: reported lost or never arrived."""
        return [int(k) for k in np.flatnonzero(~self.received)]

    @property
    def reported_lost(self) -> list[int]:
        """Chunks the node reported lost (a HOST_RESULT with ``Flag.LOST``)."""
        return [int(k) for k in np.flatnonzero(self.lost)]

    @property
    def never_arrived(self) -> list[int]:
        """Chunks of which nothing arrived."""
        return [int(k) for k in np.flatnonzero(~self.received & ~self.lost)]


class CollectiveIds:
    """Collective ids handed out in turn: ``first``, then one more each time, 65535 wrapping to 1.

    Raises ValueError if ``first`` is not 0 … 65535.
    """

    _what = "collective"

    def __init__(self, first: int = 1):
        if not isinstance(first, int) or isinstance(first, bool) or not 0 <= first < 1 << 16:
            raise ValueError(f"{self._what} must be 0 … 65535, not {first!r}")
        self.next = first

    def take(self) -> int:
        """The next id (and advance)."""
        collective = self.next
        self.next = collective % 0xFFFF + 1
        return collective


class RequestTags(CollectiveIds):
    """Request tags (the ``count`` of CONTROL and STATS_REQUEST, echoed by the STATS answer's
    ``request_tag``) handed out in turn from ``first`` (default 1), 65535 wrapping to 1: a tag
    is 0 only in a node that has answered no request since reset, so a fresh tag never matches
    an answer to an earlier request. Raises ValueError if ``first`` is not 0 … 65535."""

    _what = "request tag"


@dataclass(frozen=True)
class Push:
    """One HOST_PUSH frame of a :class:`Round` and when its host may send it.

    ``after``: results the host must have received first (:meth:`NodeSession.results_needed`).
    """

    seq: int
    frame: bytes
    after: int


class Round:
    """One collective of an allreduce, sans-IO: a :class:`NodeSession` per rank, and what every
    host sends, in order and when.

    Every host sends :meth:`control` first and waits for its node's STATS answer; no host sends a
    push before every node has answered (so no node sees a REDUCE frame of a collective it has not
    been told about); then :meth:`pushes`, each once the host holds :attr:`Push.after` results.

    Parameters
    ----------
    collective : int
    arrays : list of numpy.ndarray, float32
        One (checked) array per rank.
    elements_per_frame : int
    compression : int, optional
    window : int, optional
        See :class:`Cluster`; None: no window.
    tags : RequestTags, optional
        Where each CONTROL's request tag comes from (default: a fresh :class:`RequestTags`).
    abort : bool
        Every CONTROL carries ``Flag.ABORT`` (abort a collective still running).
    """

    def __init__(self, collective: int, arrays, elements_per_frame: int, compression: int | None = None,
                 window: int | None = None, tags: RequestTags | None = None, abort: bool = False):
        self.collective = collective
        self.arrays = arrays
        self.window = window
        self.abort = abort
        #: Where this round's request tags came from; an engine takes its further requests' here.
        self.tags = tags = tags if tags is not None else RequestTags()
        self.sessions = [NodeSession(k, len(arrays), collective, a, elements_per_frame, compression,
                                     tag=tags.take(), abort=abort)
                         for k, a in enumerate(arrays)]

    @property
    def chunks(self) -> list[tuple[int, int]]:
        """(offset, count) in elements of every chunk."""
        return self.sessions[0].chunks

    def control(self, rank: int) -> bytes:
        return self.sessions[rank].control_frame()

    def pushes(self, rank: int) -> Iterator[Push]:
        """Rank ``rank``'s pushes in sequence order, each with the results it waits for."""
        s = self.sessions[rank]
        for seq, f in enumerate(s.push_frames()):
            yield Push(seq, f, s.results_needed(seq, self.window))

    def results(self) -> list[np.ndarray]:
        return [s.result for s in self.sessions]

    def lost(self, stats: dict, what: str, error: type[ChunksLost] = ChunksLost) -> ChunksLost:
        """The ``error`` (a :class:`ChunksLost`) for this round stopping with results missing; ``stats``:
        rank → STATS counters read after the stall or None; ``what``: how the loss showed."""
        return error(loss_report(self.sessions, stats, what), self.sessions, stats)


class Allreduce:
    """One allreduce, retries included, sans-IO: the collective to run now and how the sums of
    the retries go back in place.

    An engine runs :attr:`round`; when chunks are lost it hands the :class:`ChunksLost` to
    :meth:`retry`, which sets up the next round over just the lost elements (:func:`lost_ranges`)
    or says that no retries are left; at the end :meth:`results` puts every round's sums in
    place. Sums are element by element in rank order, so the result is the same bit for bit
    however the elements are split into chunks.

    Parameters
    ----------
    config : NodeConfig
        How the nodes were built (chunk size: :func:`chunk_elements`).
    arrays : sequence of numpy.ndarray, float32, shape (n,)
    nodes : int, optional
        Ring size the arrays must match.
    compression : int, optional
        Error-bound exponent k (4 … 24) of compressed pushes and results (:class:`NodeSession`).
    window : int, optional
        Chunks a host may push ahead of its results (:func:`check_window`); None: no window.
    retries : int
        Rounds over lost elements allowed after the first.
    ids : CollectiveIds, optional
        Where the rounds' collective ids come from (default: from 1).
    tags : RequestTags, optional
        Where the CONTROL frames' request tags come from (default: from 1).
    abort : bool
        The first round's CONTROL frames carry ``Flag.ABORT``: a collective still running on a
        node is aborted instead of the CONTROL being refused (:class:`ControlRefused`). Retry
        rounds always carry it: the round that lost chunks never finished on some node.

    Raises
    ------
    ValueError
        On bad arrays (:func:`wirereduce.arrays.check_inputs`), ``compression``, ``window`` or
        ``retries``.
    """

    def __init__(self, config: NodeConfig, arrays, *, nodes: int | None = None, compression: int | None = None,
                 window: int | None = None, retries: int = 0, ids: CollectiveIds | None = None,
                 tags: RequestTags | None = None, abort: bool = False):
        from wirereduce.arrays import check_inputs

        arrays = check_inputs(arrays, nodes)
        self.retries = check_retries(retries)
        self.window = check_window(window)
        self.elements_per_frame = chunk_elements(config, compression)
        self.compression = compression
        self.ids = ids if ids is not None else CollectiveIds()
        self.tags = tags if tags is not None else RequestTags()
        self._abort = bool(abort)
        self.elements = int(arrays[0].size)
        #: Lost chunks summed again so far.
        self.retried = 0
        self._lost: list[tuple[list[tuple[int, int]], list[np.ndarray]]] = []
        self.round = self._round(arrays)
        #: Chunks per host of the first round (the whole gradient).
        self.frames = len(self.round.chunks)

    def _round(self, arrays) -> Round:
        abort = self._abort or bool(self._lost)  # retry rounds abort the round that lost chunks
        return Round(self.ids.take(), arrays, self.elements_per_frame, self.compression, self.window,
                     self.tags, abort)

    def retry(self, err: ChunksLost) -> bool:
        """Take the loss of :attr:`round`: with retries left, make :attr:`round` a new collective of
        just the lost elements and return True; else False (raise ``err``)."""
        if len(self._lost) == self.retries:
            return False
        ranges = lost_ranges(err)
        self._lost.append((ranges, err.results))
        self.retried += len(ranges)
        self.round = self._round(gather_ranges(self.round.arrays, ranges))
        return True

    def results(self) -> list[np.ndarray]:
        """What each host holds once :attr:`round` completed: every round's sums in place."""
        out = self.round.results()
        for ranges, received in reversed(self._lost):
            out = [scatter_ranges(r, ranges, v) for r, v in zip(received, out)]
        return out


class Transport(Protocol):
    """Moves frames (wirereduce header + payload, no Ethernet header) to and from host ports.

    Time is counted in cycles of the nodes' clock (simulated time in a simulation, wall time at
    the nodes' clock rate on boards).
    """

    nodes: int

    async def send(self, node: int, data: bytes) -> None:
        """Queue ``data`` for node ``node``'s host port (may wait while the port is busy)."""

    async def recv(self, node: int, timeout_cycles: int | None = None) -> bytes:
        """Next frame node ``node`` sent its host. Raises TimeoutError if none comes within
        ``timeout_cycles`` (None: the transport's own default wait)."""

    def now(self) -> int:
        """Cycles since some fixed point in time (for deadlines)."""

    async def gather(self, coros: Sequence[Awaitable]) -> list:
        """Run coroutines concurrently and return their results in order."""

    async def idle(self, cycles: int = 1) -> None:
        """Let time pass (and other coroutines run): used while a push waits for its window."""


#: Frames a wait for a STATS answer skips at most (results of an earlier collective, stray STATS).
MAX_SKIPPED = 4096


class Cluster:
    """Runs allreduces (:class:`Allreduce`) over a :class:`Transport`, one :class:`NodeSession` per node.

    Parameters
    ----------
    transport : Transport
    config : NodeConfig
        How the nodes were built (MTU and codec set the chunk size, :func:`chunk_elements`).
    on_chunk : callable, optional
        Called as ``on_chunk(node, seq)`` for every result chunk received or reported lost
        (progress bars).
    window : int, optional
        Chunks a host may push ahead of the results it has received
        (:meth:`NodeSession.results_needed`); set it to :func:`default_window` (the nodes' buffer
        ``slots``) on a link without back-pressure. ``None`` (default): rely on the transport's
        back-pressure.
    link_rate : float, optional
        Wire bytes per cycle of the links (8 for 10 Gbit/s at 156.25 MHz; ``line_bytes_per_cycle``
        in ``sim/cluster/network.py``), for each round's deadline (:func:`deadline_cycles`).
        Default: ``config.bytes_per_beat``, the datapath's own rate.
    timeout_cycles : int, optional
        Overrides the deadline of every round: cycles from its first push to its last result.
        Default None: :func:`deadline_cycles` of the round's chunks, the node count and ``link_rate``.

    Raises
    ------
    ValueError
        If ``window`` is not None or an int ≥ 1, ``link_rate`` not positive or ``timeout_cycles``
        not None or an int ≥ 1.
    """

    def __init__(self, transport: Transport, config: NodeConfig | None = None,
                 on_chunk: Callable[[int, int], None] | None = None, window: int | None = None,
                 link_rate: float | None = None, timeout_cycles: int | None = None):
        self.window = check_window(window)
        self.timeout_cycles = check_timeout(timeout_cycles)
        self.transport = transport
        self.nodes = transport.nodes
        self.config = config if config is not None else NodeConfig()
        self.link_rate = self.config.bytes_per_beat if link_rate is None else link_rate
        if not self.link_rate > 0:
            raise ValueError(f"link_rate must be a positive number of bytes per cycle, not {link_rate!r}")
        self.on_chunk = on_chunk
        #: Collective ids of the rounds, in turn over the cluster's life.
        self.ids = CollectiveIds()
        #: Request tags of every CONTROL and STATS_REQUEST, in turn over the cluster's life.
        self.tags = RequestTags()
        #: The last allreduce ended with chunks lost or an error, so its collective may still be
        #: running on some node: the next one's CONTROL frames carry ``Flag.ABORT``. This cluster
        #: drives every node, so what it aborts is its own.
        self.unfinished = False

    def chunk_elements(self, compression: int | None = None) -> int:
        """Elements per chunk (:func:`chunk_elements` of the nodes' configuration)."""
        return chunk_elements(self.config, compression)

    def plan(self, arrays: Sequence[np.ndarray], compression: int | None = None, retries: int = 0,
             abort: bool = False) -> Allreduce:
        """The :class:`Allreduce` of ``arrays`` on this cluster (checked; nothing sent): see
        :meth:`allreduce`. After an allreduce that did not finish (:attr:`unfinished`) it aborts."""
        return Allreduce(self.config, arrays, nodes=self.nodes, compression=compression, window=self.window,
                         retries=retries, ids=self.ids, tags=self.tags, abort=abort or self.unfinished)

    def deadline(self, rnd: Round) -> int:
        """Cycles ``rnd`` may take from its first push to its last result: ``timeout_cycles`` if
        given, else :func:`deadline_cycles` of its chunks, the node count, ``link_rate`` and the window."""
        if self.timeout_cycles is not None:
            return self.timeout_cycles
        return deadline_cycles(rnd.chunks, self.nodes, self.link_rate, window=rnd.window)

    async def _answer(self, node: int, is_answer: Callable[[bytes], bool]) -> bytes:
        """The first frame from ``node`` that ``is_answer``; skips others (late results of an
        earlier collective, stray STATS, answers to earlier requests), at most :data:`MAX_SKIPPED`
        of them and for at most :data:`ANSWER_CYCLES` in all. Raises TimeoutError."""
        t = self.transport
        until = t.now() + ANSWER_CYCLES
        for _ in range(MAX_SKIPPED + 1):
            left = until - t.now()
            if left <= 0:
                break
            data = await t.recv(node, timeout_cycles=left)
            if is_answer(data):
                return data
        raise TimeoutError(f"node {node} sent no STATS answer to the request within {ANSWER_CYCLES} cycles")

    async def stats(self, node: int) -> dict[str, int]:
        """Read node ``node``'s status and drop counters (a STATS_REQUEST round trip, matched by its
        request tag: frames before the answer are skipped, :data:`ANSWER_CYCLES` at most).

        Raises TimeoutError if the answer does not come in time."""
        tag = self.tags.take()
        await self.transport.send(node, Header(opcode=Opcode.STATS_REQUEST, count=tag).pack())

        def is_answer(data: bytes) -> bool:
            try:
                return parse_stats(data)["request_tag"] == tag
            except ProtocolError:
                return False

        return parse_stats(await self._answer(node, is_answer))

    async def allreduce(self, arrays: Sequence[np.ndarray], compression: int | None = None,
                        retries: int = 0, abort: bool = False) -> list[np.ndarray]:
        """Sum ``arrays`` (one float32 array of equal length per node) across the cluster.

        ``compression=k`` (4 … 24) sends every chunk INCEPTIONN-compressed with error bound
        2^-k and decodes the compressed results (nodes built with ``NodeConfig(codec=True)``);
        the result is then :func:`wirereduce.sim.golden.codec.ring_allreduce_compressed` with
        ``host_compressed=True``, bit for bit.

        ``retries=r``: when chunks are lost (:class:`ChunksLost`), run up to ``r`` more
        collectives over just the lost elements and put their sums in place (:class:`Allreduce`).

        ``abort=True``: the CONTROL frames carry ``Flag.ABORT``, so a node still running an
        earlier collective aborts it instead of refusing (:class:`ControlRefused`).

        Every round has a deadline (:meth:`deadline`): results still missing then are lost.

        Returns
        -------
        list of numpy.ndarray
            What each node's host received (all equal to the schedule's sum).

        Raises
        ------
        ValueError
            On bad inputs, before any frame is sent (see :func:`wirereduce.arrays.check_inputs`).
        ControlRefused
            If a node refused the CONTROL (a collective still running there, without ``abort``):
            says which node, what it runs, and to pass ``abort=True``.
        ChunksLost
            If results are still missing at the round's deadline, or reported lost, and the
            retries are used up: names the missing chunks and the nodes' drop counters.
        DriverError, TimeoutError
            If a node does not answer its CONTROL frame or a result fails a check.
        """
        return await self.run(self.plan(arrays, compression, retries, abort))

    async def run(self, job: Allreduce) -> list[np.ndarray]:
        """Run ``job``'s rounds until one completes (or :meth:`Allreduce.retry` gives up); its results."""
        while True:
            try:
                await self._run_round(job.round)
            except ChunksLost as err:
                if not job.retry(err):
                    self.unfinished = True
                    raise
                continue
            except ControlRefused:
                raise
            except (DriverError, TimeoutError):
                self.unfinished = True
                raise
            self.unfinished = False
            return job.results()

    async def _run_round(self, rnd: Round) -> None:
        """Carry out one :class:`Round`; raises its :class:`ChunksLost` at the deadline with results
        missing, or when every missing result was reported lost."""
        sessions = rnd.sessions
        t = self.transport

        async def start(s: NodeSession):
            try:
                await t.send(s.rank, rnd.control(s.rank))
                s.check_ack(await self._answer(s.rank, s.is_answer))
            except (DriverError, TimeoutError) as e:  # every start ends before the first error is raised
                return e
            return None

        errors = [e for e in await t.gather([start(s) for s in sessions]) if e is not None]  # the start barrier
        if errors:
            refused = [e for e in errors if isinstance(e, ControlRefused)]
            if len(refused) > 1:
                raise ControlRefused("\n".join(str(e) for e in refused), refused[0].rank, refused[0].sent,
                                     refused[0].stats) from refused[0]
            raise errors[0]

        deadline = self.deadline(rnd)
        until = t.now() + deadline
        stalled = False

        async def push(s: NodeSession):
            for p in rnd.pushes(s.rank):
                while s.results_received + int(s.lost.sum()) < p.after:
                    if stalled:
                        return
                    await t.idle(1)
                if stalled:
                    return
                await t.send(s.rank, p.frame)

        async def collect(s: NodeSession):
            nonlocal stalled
            while not s.settled and not stalled:
                left = until - t.now()
                try:
                    if left <= 0:
                        raise TimeoutError
                    data = await t.recv(s.rank, timeout_cycles=left)
                except TimeoutError:
                    stalled = True
                    return
                if s.receive(data) and self.on_chunk is not None:
                    self.on_chunk(s.rank, Header.unpack(data).seq)

        await t.gather([push(s) for s in sessions] + [collect(s) for s in sessions])
        if stalled or not all(s.done for s in sessions):
            stats = {}
            for s in sessions:
                try:
                    stats[s.rank] = await self.stats(s.rank)
                except (TimeoutError, ProtocolError):
                    stats[s.rank] = None
            what = (f"the deadline of {deadline:,} cycles passed" if stalled else "the nodes reported chunks lost")
            raise rnd.lost(stats, what)
