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
    Header,
    Opcode,
    ProtocolError,
    frame,
)

__all__ = ["plan_chunks", "chunk_elements", "parse_stats", "NodeSession", "CollectiveIds", "Push", "Round",
           "Allreduce", "Transport", "Cluster", "DriverError", "ChunksLost", "loss_report", "lost_ranges",
           "gather_ranges", "scatter_ranges", "check_retries", "check_window", "default_window"]


class DriverError(RuntimeError):
    """The cluster did not do what the protocol promises (missing or malformed results)."""


class ChunksLost(DriverError):
    """The ring stopped before every host had every result: a frame was lost on the way.

    Raised instead of waiting for ever. Frames are dropped whole (a bad FCS at an Ethernet port,
    a bad header at a node), so every result a host *did* receive is complete and correct; the
    lost chunks are summed again only with ``retries`` (:meth:`Allreduce.retry`).

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


def check_window(window) -> int | None:
    """Validate a host ``window`` (None: no window, or an int ≥ 1 chunks); returns it.

    Raises ValueError otherwise (0 included: say None for no window).
    """
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise ValueError(f"window must be None or an int ≥ 1 chunks, not {window!r}")
    return window


def default_window(config: NodeConfig) -> int:
    """The window of a host on a link without back-pressure (a real NIC): the nodes' buffer
    ``slots``, so that a push always finds its buffer slot free (:meth:`NodeSession.results_needed`)."""
    return config.slots


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
        Chunk size in elements (:func:`chunk_elements` of the nodes' configuration).
    compression : int, optional
        Error-bound exponent ``k`` (4 … 24) of the INCEPTIONN-style codec (docs/codec.md):
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
        codec, k = (Codec.NONE, 0) if self.compression is None else (Codec.INCEPTIONN_V1, self.compression)
        return Header(opcode=Opcode.CONTROL, collective=self.collective, src=self.rank,
                      hop=self.nodes, seq=len(self.chunks), codec=codec, eb_k=k).pack()

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


class CollectiveIds:
    """Collective ids handed out in turn: ``first``, then one more each time, 65535 wrapping to 1.

    Raises ValueError if ``first`` is not 0 … 65535.
    """

    def __init__(self, first: int = 1):
        if not isinstance(first, int) or isinstance(first, bool) or not 0 <= first < 1 << 16:
            raise ValueError(f"collective must be 0 … 65535, not {first!r}")
        self.next = first

    def take(self) -> int:
        """The next id (and advance)."""
        collective = self.next
        self.next = collective % 0xFFFF + 1
        return collective


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
    """

    def __init__(self, collective: int, arrays, elements_per_frame: int, compression: int | None = None,
                 window: int | None = None):
        self.collective = collective
        self.arrays = arrays
        self.window = window
        self.sessions = [NodeSession(k, len(arrays), collective, a, elements_per_frame, compression)
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

    Raises
    ------
    ValueError
        On bad arrays (:func:`wirereduce.arrays.check_inputs`), ``compression``, ``window`` or
        ``retries``.
    """

    def __init__(self, config: NodeConfig, arrays, *, nodes: int | None = None, compression: int | None = None,
                 window: int | None = None, retries: int = 0, ids: CollectiveIds | None = None):
        from wirereduce.arrays import check_inputs

        arrays = check_inputs(arrays, nodes)
        self.retries = check_retries(retries)
        self.window = check_window(window)
        self.elements_per_frame = chunk_elements(config, compression)
        self.compression = compression
        self.ids = ids if ids is not None else CollectiveIds()
        self.elements = int(arrays[0].size)
        #: Lost chunks summed again so far.
        self.retried = 0
        self._lost: list[tuple[list[tuple[int, int]], list[np.ndarray]]] = []
        self.round = self._round(arrays)
        #: Chunks per host of the first round (the whole gradient).
        self.frames = len(self.round.chunks)

    def _round(self, arrays) -> Round:
        return Round(self.ids.take(), arrays, self.elements_per_frame, self.compression, self.window)

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
    """Runs allreduces (:class:`Allreduce`) over a :class:`Transport`, one :class:`NodeSession` per node.

    Parameters
    ----------
    transport : Transport
    config : NodeConfig
        How the nodes were built (MTU and codec set the chunk size, :func:`chunk_elements`).
    on_chunk : callable, optional
        Called as ``on_chunk(node, seq)`` for every result chunk received (progress bars).
    window : int, optional
        Chunks a host may push ahead of the results it has received
        (:meth:`NodeSession.results_needed`); set it to :func:`default_window` (the nodes' buffer
        ``slots``) on a link without back-pressure. ``None`` (default): rely on the transport's
        back-pressure.

    Raises
    ------
    ValueError
        If ``window`` is not None or an int ≥ 1.
    """

    def __init__(self, transport: Transport, config: NodeConfig | None = None,
                 on_chunk: Callable[[int, int], None] | None = None, window: int | None = None):
        self.window = check_window(window)
        self.transport = transport
        self.nodes = transport.nodes
        self.config = config if config is not None else NodeConfig()
        self.on_chunk = on_chunk
        #: Collective ids of the rounds, in turn over the cluster's life.
        self.ids = CollectiveIds()

    def chunk_elements(self, compression: int | None = None) -> int:
        """Elements per chunk (:func:`chunk_elements` of the nodes' configuration)."""
        return chunk_elements(self.config, compression)

    def plan(self, arrays: Sequence[np.ndarray], compression: int | None = None, retries: int = 0) -> Allreduce:
        """The :class:`Allreduce` of ``arrays`` on this cluster (checked; nothing sent): see :meth:`allreduce`."""
        return Allreduce(self.config, arrays, nodes=self.nodes, compression=compression, window=self.window,
                         retries=retries, ids=self.ids)

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
        the result is then :func:`wirereduce.sim.golden.codec.ring_allreduce_compressed` with
        ``host_compressed=True``, bit for bit.

        ``retries=r``: when chunks are lost (:class:`ChunksLost`), run up to ``r`` more
        collectives over just the lost elements and put their sums in place (:class:`Allreduce`).

        Returns
        -------
        list of numpy.ndarray
            What each node's host received (all equal to the schedule's sum).

        Raises
        ------
        ValueError
            On bad inputs, before any frame is sent (see :func:`wirereduce.arrays.check_inputs`).
        ChunksLost
            If results stop coming before every chunk arrived (a frame was lost) and the retries
            are used up: names the missing chunks and the nodes' drop counters; the results
            received are complete.
        DriverError, TimeoutError
            If a node does not answer its CONTROL frame or a result is malformed.
        """
        return await self.run(self.plan(arrays, compression, retries))

    async def run(self, job: Allreduce) -> list[np.ndarray]:
        """Run ``job``'s rounds until one completes (or :meth:`Allreduce.retry` gives up); its results."""
        while True:
            try:
                await self._run_round(job.round)
            except ChunksLost as err:
                if not job.retry(err):
                    raise
                continue
            return job.results()

    async def _run_round(self, rnd: Round) -> None:
        """Carry out one :class:`Round`; raises its :class:`ChunksLost` if a node goes quiet."""
        sessions = rnd.sessions

        async def start(s: NodeSession):
            await self.transport.send(s.rank, rnd.control(s.rank))
            s.check_ack(await self.transport.recv(s.rank))

        await self.transport.gather([start(s) for s in sessions])  # the start barrier

        stalled = False

        async def push(s: NodeSession):
            for p in rnd.pushes(s.rank):
                while s.results_received < p.after:
                    if stalled:
                        return
                    await self.transport.idle(1)
                if stalled:
                    return
                await self.transport.send(s.rank, p.frame)

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
            raise rnd.lost(stats, "a node sent no result in time")
