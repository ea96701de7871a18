"""The host side's shared pieces: chunking, STATS parsing, collective ids and request tags, the
transport protocol, and what a lost chunk raises.

Every host driver builds on these: the schedule engine's sans-IO sessions and rounds
(:mod:`wirereduce.host.engine`: :class:`~wirereduce.host.engine.EngineSession`,
:class:`~wirereduce.host.engine.EngineAllreduce`), the per-rank driver over a real interface
(:class:`wirereduce.host.rank.EngineRankDriver`), the cocotb and packet transports
(:mod:`wirereduce.host.transports`) and the fast engine's frame player
(:mod:`wirereduce.sim.engines.fastengine`).
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Sequence
from typing import Protocol

import numpy as np

from wirereduce.config import NodeConfig
from wirereduce.protocol import (
    HEADER_BYTES,
    STATS_COUNTERS,
    Codec,
    Header,
    Opcode,
    ProtocolError,
    stats_counters,
)

__all__ = ["plan_chunks", "chunk_elements", "parse_stats", "CodecFields", "CollectiveIds", "RequestTags",
           "Transport", "DriverError", "ChunksLost", "loss_report", "lost_chunks", "gather_ranges", "scatter_ranges",
           "check_retries", "check_window", "check_timeout", "DEADLINE_SLACK_CYCLES", "ANSWER_CYCLES"]


class DriverError(RuntimeError):
    """The cluster did not do what the protocol promises (missing or malformed results)."""


class ChunksLost(DriverError):
    """The collective ended before every host had every result: chunks were lost on the way.

    Raised instead of waiting for ever: when the round's deadline passes with results missing. The
    lost chunks are summed again only with ``retries``
    (:meth:`EngineAllreduce.retry <wirereduce.host.engine.EngineAllreduce.retry>`).

    What it claims: every chunk in :attr:`received` passed every check
    :meth:`EngineSession.receive <wirereduce.host.engine.EngineSession.receive>` makes (opcode,
    collective, sequence number, dtype, codec, ``eb_k``, flags, length and, for compressed chunks,
    the tags) and holds the values the node sent; that is all the driver can vouch for. A chunk
    in :attr:`missing` has no value (zeros in :attr:`results`); it was either
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
    """Validate a deadline override (None: the simulator derives it from the message; or an int ≥ 1
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
def lost_chunks(err: ChunksLost) -> list[int]:
    """Sequence numbers of every chunk that some host is missing, in increasing order."""
    return sorted(set().union(*err.missing.values()))


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

    ``sessions``: the :class:`~wirereduce.host.engine.EngineSession` of each host; ``stats``: rank →
    STATS counters or None; ``what``: how the loss showed (e.g. "results still missing after
    51,234 cycles").
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
    """Elements per chunk for engines built as ``config``: :attr:`NodeConfig.max_elements
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
    """Decode a STATS frame into ``{counter name: value}``. The names are a schedule
    engine's :func:`~wirereduce.protocol.engine_stats_counters`
    (its ``ports`` network ports ``net0`` …, each with ``link_drop_net{p}`` and the MAC counters
    ``net{p}_…``) when the header's ``count`` says so (:func:`~wirereduce.protocol.stats_counters`;
    docs/protocol.md "STATS payload"), else the fixed layout :data:`STATS_COUNTERS`.

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
    (the error-bound exponent k, or None uncompressed); mixed into
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
