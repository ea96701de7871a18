"""The host-side allreduce driver: a sans-IO protocol core and the loop that runs it.

The core (:class:`NodeSession`) knows the protocol and nothing about I/O: it turns one node's
gradient into frames (CONTROL, then HOST_PUSH chunks), takes the frames the node sends back
(STATS, HOST_RESULT) and reassembles the result. A :class:`Transport` only moves frame bytes
to and from node ``k``'s host port; :class:`Cluster` runs one session per node over it. The
same code drives the cocotb simulation (:mod:`wirereduce.host.transports.cocotb`) and, with
another transport, real boards (the pattern of Glasgow's applet interfaces).
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from wirereduce.protocol import (
    HEADER_BYTES,
    STATS_COUNTERS,
    Codec,
    Header,
    Opcode,
    ProtocolError,
    frame,
    max_elements,
)

__all__ = ["plan_chunks", "parse_stats", "NodeSession", "Transport", "Cluster", "DriverError", "ChunksLost",
           "loss_report", "lost_ranges", "gather_ranges", "scatter_ranges", "check_retries"]


class DriverError(RuntimeError):
    """The cluster did not do what the protocol promises (missing or malformed results)."""


class ChunksLost(DriverError):
    """The ring stopped before every host had every result: a frame was lost on the way.

    Raised instead of waiting for ever. Frames are dropped whole (a bad FCS at an Ethernet port,
    a bad header at a node), so every result a host *did* receive is complete and correct; the
    lost chunks are not recovered (rerun the allreduce).

    Attributes
    ----------
    missing : dict[int, list[int]]
        Rank → sequence numbers of the result chunks that host did not receive.
    stats : dict[int, dict[str, int] | None]
        Rank → its STATS counters read after the stall (None where the node did not answer).
    results : list of numpy.ndarray, float32
        What each host received, zeros where a chunk is missing.
    received : list of numpy.ndarray, bool, shape (chunks,)
        Per host, which result chunks arrived.
    chunks : list of (int, int)
        (offset, count) in elements of every chunk.
    """

    def __init__(self, message: str, sessions, stats: dict):
        super().__init__(message)
        self.missing = {s.rank: s.missing for s in sessions}
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
)


def check_retries(retries) -> int:
    """Validate a ``retries`` count (an int ≥ 0); returns it. Raises ValueError otherwise."""
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise ValueError(f"retries must be an int ≥ 0, not {retries!r}")
    return retries


def lost_ranges(err: ChunksLost) -> list[tuple[int, int]]:
    """(offset, count) in elements of every chunk that some host is missing, in order."""
    lost = sorted(set().union(*err.missing.values()))
    return [err.chunks[s] for s in lost]


def gather_ranges(arrays, ranges) -> list[np.ndarray]:
    """Each array's elements in ``ranges``, concatenated (float32, shape (sum of counts,))."""
    return [np.concatenate([a[off:off + n] for off, n in ranges]).astype(np.float32) for a in arrays]


def scatter_ranges(result: np.ndarray, ranges, values: np.ndarray) -> np.ndarray:
    """A copy of ``result`` with ``values`` (as :func:`gather_ranges` laid them out) put back in ``ranges``."""
    out = np.array(result, dtype=np.float32, copy=True)
    pos = 0
    for off, n in ranges:
        out[off:off + n] = values[pos:pos + n]
        pos += n
    return out


def loss_report(sessions, stats: dict, what: str) -> str:
    """The message of a :class:`ChunksLost`: which chunks each host is missing, and which nodes
    counted dropped frames (STATS ``link_drop_*`` and ``drop_*``, ``docs/protocol.md``).

    ``sessions``: the :class:`NodeSession` of each host; ``stats``: rank → STATS counters or None;
    ``what``: how the loss showed (e.g. "the ring stalled after 51,234 cycles").
    """
    lines = [f"{what} with results missing (frames were lost; every result received is complete):"]
    for s in sessions:
        if not s.done:
            miss = s.missing
            more = f" … ({len(miss)} in all)" if len(miss) > 8 else ""
            lines.append(f"  node {s.rank}: {s.results_received}/{len(s.chunks)} result chunks, "
                         f"missing {miss[:8]}{more}")
    for rank in sorted(stats):
        st = stats[rank]
        if st is None:
            lines.append(f"  node {rank}: did not answer a STATS_REQUEST")
            continue
        for name, why in _DROP_REASONS:
            if st.get(name):
                lines.append(f"  node {rank}: {st[name]} {why} [{name}]")
    if not any(st is not None for st in stats.values()):
        lines.append("  (no node's counters could be read)")
    lines.append("Lost chunks are not recovered: check the links (cables, FCS error counters) and rerun.")
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


def parse_stats(data: bytes) -> dict[str, int]:
    """Decode a STATS frame into ``{counter name: value}`` (names: :data:`STATS_COUNTERS`).

    Raises
    ------
    ProtocolError
        If the frame is not a STATS frame or is too short.
    """
    hdr = Header.unpack(data)
    if hdr.opcode != Opcode.STATS:
        raise ProtocolError(f"not a STATS frame: {hdr!r}")
    need = HEADER_BYTES + 4 * len(STATS_COUNTERS)
    if len(data) < need:
        raise ProtocolError(f"STATS frame of {len(data)} bytes, expected {need}")
    values = struct.unpack_from(f"<{len(STATS_COUNTERS)}I", data, HEADER_BYTES)
    return dict(zip(STATS_COUNTERS, values))


@dataclass
class NodeSession:
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
        Chunk size in elements (≤ :func:`wirereduce.protocol.max_elements` of the MTU; with
        ``compression``, ≤ :func:`wirereduce.sim.codec.max_elements_compressed` of the MTU, so
        that even an incompressible chunk fits in one frame).
    compression : int, optional
        Error-bound exponent ``k`` (4 … 24) of the INCEPTIONN-style codec (SPEC.md codec v1):
        pushes are sent compressed (``codec = INCEPTIONN_V1``, ``eb_k = k``; the nodes must be
        built with ``NodeConfig(codec=True)``) and compressed results are decoded. ``None``
        (default): uncompressed.

    Attributes
    ----------
    result : numpy.ndarray, float32, shape (n,)
        The reassembled sum, complete when :attr:`done`.
    unexpected : list of Header
        Frames received that belong to no chunk of this collective (kept for diagnosis).
    """

    rank: int
    nodes: int
    collective: int
    data: np.ndarray
    elements_per_frame: int
    compression: int | None = None
    chunks: list[tuple[int, int]] = field(init=False)
    result: np.ndarray = field(init=False)
    received: np.ndarray = field(init=False)
    unexpected: list = field(init=False, default_factory=list)

    def __post_init__(self):
        if not 0 <= self.rank < self.nodes:
            raise ValueError(f"rank {self.rank} outside 0 … {self.nodes - 1}")
        if not 0 <= self.collective < 1 << 16:
            raise ValueError(f"collective id {self.collective} does not fit in 16 bits")
        if self.compression is not None:
            from wirereduce.codec import check_k

            self.compression = check_k(self.compression)
        self.chunks = plan_chunks(self.data.size, self.elements_per_frame)
        self.result = np.zeros(self.data.size, dtype=np.float32)
        self.received = np.zeros(len(self.chunks), dtype=bool)

    def control_frame(self) -> bytes:
        """The CONTROL frame that starts the collective on this node."""
        return Header(opcode=Opcode.CONTROL, collective=self.collective, src=self.rank,
                      hop=self.nodes, seq=len(self.chunks)).pack()

    def check_ack(self, data: bytes) -> dict[str, int]:
        """Check the STATS answer to :meth:`control_frame`; returns the counters.

        Raises
        ------
        DriverError
            If the node did not take the configuration.
        """
        stats = parse_stats(data)
        want = {"collective": self.collective, "rank": self.rank, "nodes": self.nodes,
                "chunks": len(self.chunks)}
        got = {k: stats[k] for k in want}
        if got != want:
            raise DriverError(f"node {self.rank} did not take the CONTROL frame: has {got}, sent {want}")
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

    def receive(self, data: bytes) -> None:
        """Take one HOST_RESULT frame from the node.

        A frame of another collective, opcode or an out-of-range chunk is recorded in
        :attr:`unexpected` and otherwise ignored.

        Raises
        ------
        DriverError
            If a chunk's length disagrees with its header, or a chunk arrives twice.
        """
        hdr = Header.unpack(data)
        if (hdr.opcode != Opcode.HOST_RESULT or hdr.collective != self.collective
                or hdr.seq >= len(self.chunks)):
            self.unexpected.append(hdr)
            return
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
        if self.received[hdr.seq]:
            raise DriverError(f"node {self.rank}: result chunk {hdr.seq} arrived twice")
        self.result[off:off + n] = values
        self.received[hdr.seq] = True

    @property
    def done(self) -> bool:
        return bool(self.received.all())

    @property
    def missing(self) -> list[int]:
        return [int(k) for k in np.flatnonzero(~self.received)]


class Transport(Protocol):
    """Moves frames (wirereduce header + payload, no Ethernet header) to and from host ports."""

    nodes: int

    async def send(self, node: int, data: bytes) -> None:
        """Queue ``data`` for node ``node``'s host port (may wait while the port is busy)."""

    async def recv(self, node: int) -> bytes:
        """Next frame node ``node`` sent its host. Raises TimeoutError if none comes in time."""

    async def gather(self, coros: Sequence[Awaitable]) -> list:
        """Run coroutines concurrently and return their results in order."""

    async def idle(self, cycles: int = 1) -> None:
        """Let time pass (and other coroutines run): used while a push waits for its window."""


class Cluster:
    """Runs allreduces over a :class:`Transport`, one :class:`NodeSession` per node.

    Parameters
    ----------
    transport : Transport
    mtu : int
        Frame size limit in bytes (header + payload) the nodes were built for.
    on_chunk : callable, optional
        Called as ``on_chunk(node, seq)`` for every result chunk received (progress bars).
    window : int, optional
        Chunks a host may push ahead of the results it has received
        (:meth:`NodeSession.results_needed`); set it to the nodes' buffer ``slots`` on a link
        without back-pressure. ``None`` (default): rely on the transport's back-pressure.

    Raises
    ------
    ValueError
        If ``window`` is not None or an int ≥ 1.
    """

    def __init__(self, transport: Transport, mtu: int = 1500,
                 on_chunk: Callable[[int, int], None] | None = None, window: int | None = None):
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise ValueError(f"window must be None or an int ≥ 1 chunks, not {window!r}")
        self.window = window
        self.transport = transport
        self.nodes = transport.nodes
        self.mtu = mtu
        self.elements_per_frame = max_elements(mtu)
        self.on_chunk = on_chunk
        self._next_collective = 1

    def chunk_elements(self, compression: int | None = None) -> int:
        """Elements per chunk: the MTU's :func:`~wirereduce.protocol.max_elements`, or with
        ``compression`` the worst-case bound :func:`wirereduce.sim.codec.max_elements_compressed`
        (349 at MTU 1500, 2112 at 9000). Raises ValueError on a ``compression`` outside 4 … 24."""
        if compression is None:
            return self.elements_per_frame
        from wirereduce.codec import check_k, max_elements_compressed

        check_k(compression)
        return max_elements_compressed(self.mtu)

    async def stats(self, node: int) -> dict[str, int]:
        """Read node ``node``'s status and drop counters (a STATS_REQUEST round trip)."""
        await self.transport.send(node, Header(opcode=Opcode.STATS_REQUEST).pack())
        while True:
            data = await self.transport.recv(node)
            if Header.unpack(data).opcode == Opcode.STATS:
                return parse_stats(data)

    async def allreduce(self, arrays: Sequence[np.ndarray], compression: int | None = None,
                        retries: int = 0) -> list[np.ndarray]:
        """Sum ``arrays`` (one float32 array of equal length per node) across the cluster.

        ``compression=k`` (4 … 24) sends every chunk INCEPTIONN-compressed with error bound
        2^-k and decodes the compressed results (nodes built with ``NodeConfig(codec=True)``);
        the result is then :func:`wirereduce.sim.codec.ring_allreduce_compressed` with
        ``host_compressed=True``, bit for bit. Chunks hold at most
        :func:`wirereduce.sim.codec.max_elements_compressed` of the MTU.

        ``retries=r``: when chunks are lost (:class:`ChunksLost`), run up to ``r`` more
        collectives over just the lost elements (:func:`lost_ranges`) and put their sums in
        place. Sums are element by element in rank order, so the result is the same bit for bit
        however the elements are split into chunks.

        Returns
        -------
        list of numpy.ndarray
            What each node's host received (all equal to the schedule's sum).

        Raises
        ------
        ValueError
            On bad inputs, before any frame is sent (see :func:`wirereduce.sim.golden.check_inputs`).
        ChunksLost
            If results stop coming before every chunk arrived (a frame was lost): names the
            missing chunks and the nodes' drop counters; the results received are complete.
        DriverError, TimeoutError
            If a node does not answer its CONTROL frame or a result is malformed.
        """
        from wirereduce.arrays import check_inputs

        arrays = check_inputs(arrays, self.nodes)
        check_retries(retries)
        try:
            return await self._allreduce_once(arrays, compression)
        except ChunksLost as err:
            if retries == 0:
                raise
            ranges = lost_ranges(err)
            redone = await self.allreduce(gather_ranges(arrays, ranges), compression, retries - 1)
            return [scatter_ranges(r, ranges, s) for r, s in zip(err.results, redone)]

    async def _allreduce_once(self, arrays, compression):
        collective = self._next_collective
        self._next_collective = collective % 0xFFFF + 1
        sessions = [NodeSession(k, self.nodes, collective, a, self.chunk_elements(compression), compression)
                    for k, a in enumerate(arrays)]

        # Every node takes its configuration before any chunk moves, so no node sees a REDUCE
        # frame of a collective it has not been told about.
        async def start(s: NodeSession):
            await self.transport.send(s.rank, s.control_frame())
            s.check_ack(await self.transport.recv(s.rank))

        await self.transport.gather([start(s) for s in sessions])

        stalled = False

        async def push(s: NodeSession):
            for seq, f in enumerate(s.push_frames()):
                while s.results_received < s.results_needed(seq, self.window):
                    if stalled:
                        return
                    await self.transport.idle(1)
                if stalled:
                    return
                await self.transport.send(s.rank, f)

        async def collect(s: NodeSession):
            nonlocal stalled
            while not s.done and not stalled:
                try:
                    data = await self.transport.recv(s.rank)
                except TimeoutError:
                    stalled = True
                    return
                before = len(s.unexpected)
                s.receive(data)
                if self.on_chunk is not None and len(s.unexpected) == before:
                    self.on_chunk(s.rank, Header.unpack(data).seq)

        await self.transport.gather([push(s) for s in sessions] + [collect(s) for s in sessions])
        if stalled:
            stats = {}
            for s in sessions:
                try:
                    stats[s.rank] = await self.stats(s.rank)
                except (TimeoutError, ProtocolError):
                    stats[s.rank] = None
            raise ChunksLost(loss_report(sessions, stats, "a node sent no result in time"), sessions, stats)
        return [s.result for s in sessions]
