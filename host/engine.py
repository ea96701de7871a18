"""Driving a schedule engine: one rank's side of an allreduce that runs any tree schedule (sans-IO).

:class:`EngineSession` is one host's side of one collective on the schedule engine
(:mod:`wirereduce.hdl.core.engine`): it makes every frame one host sends and
checks every frame it gets back, and leaves the sending to a transport or a frame script.

1. SCHEDULE frames load the node's table (:func:`wirereduce.table.table_frames_payloads`), each
   answered with STATS;
2. CONTROL starts the collective (``src`` = rank, ``hop`` = flows F, ``seq`` = chunks C);
3. HOST_PUSH frames, chunk g = k·F + f in increasing g (:func:`wirereduce.table.plan`): chunk g
   only once the host holds ``g − W + 1`` results (the window W ≤ the engine's ``slots``; results
   come in any order across flows, and the count is what the engine's queue bound needs,
   docs/architecture.md "Why the engine cannot deadlock");
4. HOST_RESULT frames, one per chunk, are put in place by their chunk's element range.

:class:`EngineAllreduce` holds the rounds of one allreduce over every rank, the first over the whole
message and, when chunks are lost and ``retries`` are left, one over just the lost chunks, each kept
in its own flow (:func:`plan_retry`), whose sums are put back in place.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from wirereduce.host.driver import (
    ChunksLost,
    CodecFields,
    CollectiveIds,
    DriverError,
    RequestTags,
    check_retries,
    gather_ranges,
    lost_chunks,
    parse_stats,
    scatter_ranges,
)

from wirereduce.config import EngineConfig
from wirereduce.formats import CANONICAL_NAN, Op, check_typed_inputs, dtype_byte, format_of, from_words, to_words
from wirereduce.protocol import HEADER_BYTES, Flag, Header, Opcode, frame
from wirereduce.schedule import Schedule
from wirereduce.table import ENTRY_BYTES, Chunk, plan, table_frames_payloads

__all__ = ["EngineSession", "EnginePush", "check_window", "check_chunk_words", "chunk_words_of_bytes", "RetryPlan",
           "plan_retry", "EngineAllreduce", "parse_chunk_bytes"]


def check_window(window: int, config: EngineConfig) -> int:
    """The window, checked: 1 … ``config.slots`` (the engine's queues are sized for that)."""
    if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= config.slots:
        raise ValueError(f"the window must be 1 … {config.slots} chunks (the engine's slots), not {window!r}")
    return window


def check_chunk_words(chunk_words, top: int, what: str = "what a frame holds") -> tuple[int, ...]:
    """``chunk_words`` (an int, or a chunk profile: a non-empty sequence of ints, one per round of
    chunks, :func:`wirereduce.table.plan`), checked: every size 1 … ``top`` words (``what``: what a
    frame holds, or for a compressed collective what a compressed frame holds whatever the values).
    Returns the sizes as a profile (an int as a one-size profile, which :func:`plan` cuts as that
    size).

    Raises ValueError otherwise.
    """
    sizes = (chunk_words,) if isinstance(chunk_words, int) and not isinstance(chunk_words, bool) else chunk_words
    try:
        sizes = tuple(sizes)
    except TypeError:
        sizes = None
    if not sizes or any(not isinstance(w, int) or isinstance(w, bool) or not 1 <= w <= top for w in sizes):
        raise ValueError(f"chunk_words must be an int from 1 to {top} ({what}), or a non-empty "
                         f"sequence of such sizes (a chunk profile), not {chunk_words!r}")
    return sizes


def parse_chunk_bytes(text: str) -> int | tuple[int, ...]:
    """``"512"`` → 512, ``"256,768,1484"`` → (256, 768, 1484): chunk sizes in bytes as
    ``--chunk-bytes`` and ``WIREREDUCE_CHUNK_BYTES`` spell them (checked by
    :func:`chunk_words_of_bytes`). Raises ValueError on text that is not such a list."""
    try:
        sizes = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise ValueError(f"{text!r} is not a size in bytes or a comma-separated list of them (e.g. 512 or "
                         f"256,768,1484)") from None
    return sizes[0] if len(sizes) == 1 else sizes


def chunk_words_of_bytes(chunk_bytes, mtu: int, compressed: bool = False) -> int | tuple[int, ...]:
    """Chunk sizes in payload bytes (an int, or a chunk profile: a non-empty sequence of ints, one
    per round of chunks) as :class:`EngineSession`'s ``chunk_words`` (32-bit words; an int stays an
    int). Every size is a multiple of 4 bytes from 4 to a full frame's payload at ``mtu`` (4 ·
    :func:`wirereduce.protocol.max_elements`: 1,484 bytes at MTU 1500, 8,984 at 9000), or with
    ``compressed`` to the fp32 bytes a compressed frame holds whatever the values (4 ·
    :func:`wirereduce.codec.max_elements_compressed`: 1,396 bytes at MTU 1500, 8,448 at 9000).

    Raises ValueError otherwise, naming the first bad size and the range.
    """
    from wirereduce.codec import max_elements_compressed
    from wirereduce.protocol import max_elements

    single = isinstance(chunk_bytes, int) and not isinstance(chunk_bytes, bool)
    sizes = (chunk_bytes,) if single else tuple(chunk_bytes) if isinstance(chunk_bytes, (tuple, list)) else None
    top = 4 * (max_elements_compressed(mtu) if compressed else max_elements(mtu))
    if not sizes:
        raise ValueError(f"chunk sizes must be an int or a non-empty list of ints (bytes), not {chunk_bytes!r}")
    bad = [b for b in sizes if not isinstance(b, int) or isinstance(b, bool) or not 4 <= b <= top or b % 4]
    if bad:
        whose = ("the fp32 bytes a compressed frame holds whatever the values" if compressed
                 else "a full frame's payload")
        raise ValueError(f"{bad[0]!r} is not a chunk size: give multiples of 4 bytes from 4 to {top} ({whose} at "
                         f"MTU {mtu})")
    words = tuple(b // 4 for b in sizes)
    return words[0] if single else words


@dataclass(frozen=True)
class EnginePush:
    """One HOST_PUSH frame, and how many results its host must hold before sending it."""

    seq: int
    after: int
    frame: bytes


@dataclass
class EngineSession(CodecFields):
    """One rank's allreduce on a schedule engine.

    Parameters
    ----------
    rank : int
    schedule : Schedule
    config : EngineConfig
        The engines' build (ports, MTU, slots, formats).
    collective : int
        Collective id, 0 … 65535.
    array : numpy.ndarray, shape (n,), float32, ml_dtypes.bfloat16, float16 or int32
        This host's gradient; its dtype is the collective's format (:mod:`wirereduce.formats`).
        Frames carry it as 32-bit payload words (two bf16/fp16 elements each).
    window : int
        Chunks pushed ahead of the results received, 1 … ``config.slots``.
    tag : int
        Request tag of the CONTROL (its STATS answer echoes it); SCHEDULE frames use
        ``tag + 1 …`` in their ``collective`` field.
    op : str or Op
        ``"sum"`` (default), ``"max"`` or ``"min"``.
    abort : bool
        The CONTROL carries ``Flag.ABORT``: the engine drops a collective it still runs (the
        host's last one did not finish) instead of refusing this one.
    compression : int, optional
        Error-bound exponent k (4 … 24) of the INCEPTIONN-style codec (docs/codec.md): pushes
        are sent compressed (``codec = INCEPTIONN_V1``, ``eb_k = k``), results arrive compressed
        and are decoded; chunks hold at most :func:`wirereduce.codec.max_elements_compressed`
        elements, so even an incompressible one fits a frame. fp32 arrays on engines built with
        ``EngineConfig(codec=True)`` only. ``None`` (default): uncompressed.
    chunk_words : int or sequence of int, optional
        At most this many 32-bit payload words per chunk (1 … the frame's maximum,
        ``config.max_elements``, or the compressed bound): shorter chunks, so that a small
        message has more chunks per flow to pipeline through a tree (docs/architecture.md "Small
        messages"). A sequence is a chunk profile, one size per round of chunks (chunk k of every
        flow), the last one repeated (:func:`wirereduce.table.plan`): a small first chunk gets
        chain schedules (``multiring``) going sooner; on the 4x4 torus at 32 KiB, 256, 768, 1,484
        bytes took 0.89 of full frames' time (docs/architecture.md "Chunk profiles"; it slowed
        the balanced trees). With ``compression``, 1 … the compressed bound. ``None`` (default):
        as many as a frame holds. The result bits do not depend on it (each element's sum order
        is its flow's, and the codec works element by element).

    Raises
    ------
    ValueError
        A rank outside the schedule, a bad window, an unsupported dtype or operation, a dtype whose
        format the engines are not built with (``config.formats``: they would refuse the CONTROL),
        a schedule with more flows than the engine holds; ``compression`` out of range, on
        another format than fp32, or for engines built without the codec; ``chunk_words`` (or a
        size of the profile) not an int from 1 to what a frame holds (with ``compression``, the
        compressed bound).
    """

    rank: int
    schedule: Schedule
    config: EngineConfig
    collective: int
    array: np.ndarray
    window: int
    tag: int = 1
    op: str | Op = "sum"
    abort: bool = False
    compression: int | None = None
    chunk_words: int | None = None
    result_words: np.ndarray = field(init=False)
    received: set = field(init=False, default_factory=set)
    #: Headers of the frames :meth:`receive` ignored (another opcode or collective).
    unexpected: list = field(init=False, default_factory=list)
    last_stats: dict | None = field(init=False, default=None)

    def __post_init__(self):
        if not 0 <= self.rank < self.schedule.nodes:
            raise ValueError(f"rank {self.rank} is not a node of {self.schedule.topology.name}")
        check_window(self.window, self.config)
        self.format = format_of(np.asarray(self.array).dtype)
        if self.format.name not in self.config.formats:
            raise ValueError(f"the array is {self.format.name}, but the engines are built with formats "
                             f"{', '.join(self.config.formats)} only (EngineConfig.formats); they would refuse "
                             f"the CONTROL")
        self.dtype = dtype_byte(self.format, self.op)
        per_chunk, holds = self.config.max_elements, "what a frame holds"
        if self.compression is not None:
            from wirereduce.codec import check_k, max_elements_compressed

            self.compression = check_k(self.compression)
            if not self.config.codec:
                raise ValueError("compression needs engines built with the codec (EngineConfig(codec=True)); "
                                 "these have no codec")
            if self.format.name != "fp32":
                raise ValueError(f"compression is fp32-only (docs/codec.md); the array is {self.format.name}")
            per_chunk = max_elements_compressed(self.config.mtu)
            holds = "what a compressed frame holds whatever the values"
        if self.chunk_words is not None:
            per_chunk = check_chunk_words(self.chunk_words, per_chunk, holds)
        self.words = to_words(self.array, self.format)
        self.chunks = plan(self.words.size, self.schedule, per_chunk)
        if len(self.schedule.flows) > self.config.max_flows:
            raise ValueError(f"the schedule has {len(self.schedule.flows)} flows; the engine holds "
                             f"{self.config.max_flows}: build it with max_flows ≥ {len(self.schedule.flows)}")
        # Chunks not received read as the format's NaN (0 for int32) until they are.
        fill = CANONICAL_NAN.get(self.format.name, 0)
        if self.format.per_word == 2:
            fill |= fill << 16
        self.result_words = np.full(self.words.size, fill, dtype=np.uint32)

    @property
    def result(self) -> np.ndarray:
        """The allreduce's result so far, shape (n,), the array's dtype."""
        return from_words(self.result_words, self.format, np.asarray(self.array).size)

    # -- frames to send ----------------------------------------------------------------------------

    def schedule_frames(self) -> list[bytes]:
        """The SCHEDULE frames that load this node's table, in order (each answered with STATS,
        request tags :meth:`schedule_tag`)."""
        per = (self.config.mtu - HEADER_BYTES) // ENTRY_BYTES
        out = []
        for i, (first, payload) in enumerate(table_frames_payloads(self.schedule, self.rank, self.config.ports, per)):
            hdr = Header(opcode=Opcode.SCHEDULE, seq=first, count=len(payload) // 4,
                         collective=(self.tag + 1 + i) & 0xFFFF)
            out.append(hdr.pack() + payload)
        return out

    def schedule_tag(self, i: int) -> int:
        """Request tag of SCHEDULE frame ``i``."""
        return (self.tag + 1 + i) & 0xFFFF

    def control_frame(self) -> bytes:
        return Header(opcode=Opcode.CONTROL, collective=self.collective, src=self.rank, dtype=self.dtype,
                      hop=len(self.schedule.flows), seq=len(self.chunks), count=self.tag & 0xFFFF,
                      codec=self.codec, eb_k=self.eb_k, flags=int(Flag.ABORT) if self.abort else 0).pack()

    def push_frames(self) -> list[EnginePush]:
        """Every HOST_PUSH, in chunk order, with the results its host must hold first (the window)."""
        out = []
        for c in self.chunks:
            hdr = Header(opcode=Opcode.HOST_PUSH, collective=self.collective, seq=c.seq, hop=c.flow,
                         count=c.count, src=self.rank, dtype=self.dtype, codec=self.codec, eb_k=self.eb_k)
            if self.compression is None:
                payload = self.words[c.start:c.start + c.count].astype("<u4").tobytes()
            else:
                from wirereduce.codec import encode

                payload = encode(self.words[c.start:c.start + c.count].view(np.float32), self.compression)
            out.append(EnginePush(c.seq, max(0, c.seq - self.window + 1), frame(hdr, payload)))
        return out

    # -- frames received ---------------------------------------------------------------------------

    def check_ack(self, data: bytes, tag: int) -> dict:
        """Check a STATS answer to a request with ``tag``; returns the counters.

        Raises DriverError if it is not one, or the request was refused or dropped."""
        h = Header.unpack(data)
        if h.opcode != Opcode.STATS:
            raise DriverError(f"node {self.rank}: expected a STATS answer, got {h!r}")
        st = parse_stats(data)
        if st["request_tag"] != tag & 0xFFFF:
            raise DriverError(f"node {self.rank}: STATS answers request {st['request_tag']}, not {tag}")
        before = self.last_stats or {"control_refused": 0, "drop_count": 0}
        self.last_stats = st
        refused = st["control_refused"] - before["control_refused"]
        dropped = st["drop_count"] - before["drop_count"]
        if refused or dropped:
            raise DriverError(f"node {self.rank} refused or dropped request {tag} (control_refused +{refused}, "
                              f"drop_count +{dropped}): a collective still running, or a table that does not "
                              f"fit the engine")
        return st

    def receive(self, data: bytes) -> None:
        """Take one frame from the node. A frame of another opcode or collective (a stray STATS, a
        late result of a collective that was aborted) is recorded in :attr:`unexpected` and
        otherwise ignored: an engine that takes an ABORT while results of the old collective are still in its host
        FIFOs delivers them after the CONTROL's answer. Raises DriverError on a result of this
        collective that is a duplicate, of no chunk, or does not match its chunk (flow, count,
        dtype, codec, length)."""
        h = Header.unpack(data)
        if h.opcode != Opcode.HOST_RESULT or h.collective != self.collective:
            self.unexpected.append(h)
            return
        if not 0 <= h.seq < len(self.chunks):
            raise DriverError(f"node {self.rank}: result for chunk {h.seq} of {len(self.chunks)}")
        c = self.chunks[h.seq]
        raw_len = self.compression is not None or len(data) == HEADER_BYTES + 4 * c.count
        if (h.hop != c.flow or h.count != c.count or not raw_len or h.dtype != self.dtype
                or (h.codec, h.eb_k) != (self.codec, self.eb_k)):
            raise DriverError(f"node {self.rank}: result {h!r} does not match chunk {c} ({len(data)} bytes, "
                              f"dtype byte 0x{self.dtype:02x}, codec {int(self.codec)}, eb_k {self.eb_k})")
        if h.seq in self.received:
            raise DriverError(f"node {self.rank}: chunk {h.seq} received twice")
        if self.compression is None:
            words = np.frombuffer(data[HEADER_BYTES:], dtype="<u4")
        else:
            from wirereduce.codec import decode

            try:
                words = decode(data[HEADER_BYTES:], c.count, self.compression).view(np.uint32)
            except ValueError as e:
                raise DriverError(f"node {self.rank}: compressed result chunk {h.seq} is malformed: {e}") from e
        self.result_words[c.start:c.start + c.count] = words
        self.received.add(h.seq)

    @property
    def done(self) -> bool:
        return len(self.received) == len(self.chunks)

    @property
    def missing(self) -> list[int]:
        return [c.seq for c in self.chunks if c.seq not in self.received]

    # -- what :class:`~wirereduce.host.driver.ChunksLost` reads of a session ------------------------

    @property
    def results_received(self) -> int:
        return len(self.received)

    @property
    def reported_lost(self) -> list[int]:
        """Always empty: an engine sends no LOST placeholders (a frame dropped at one of its gates
        stalls its chunk until the host's deadline)."""
        return []

    @property
    def never_arrived(self) -> list[int]:
        return self.missing


@dataclass(frozen=True)
class RetryPlan:
    """Where a retry round puts the chunks a round of a schedule-engine allreduce lost, so that each
    is summed again by its own flow (:func:`plan_retry`; sans-IO).

    The engine sums flow f's share of a message (``schedule.split(words)[f]``) in flow f's tree
    order, and different flows have different orders, so a word is summed bit for bit as in a
    loss-free run only if it is in its own flow's share. The retry message therefore has
    F × :attr:`share` payload words, every flow's share the same length (``Schedule.split`` cuts
    a message into equal shares): flow f's share, ``[f·share, (f+1)·share)``, holds flow f's lost
    chunks, in chunk order, then zero words up to :attr:`share`. The zero words' sums are discarded.
    A retried word's sum depends neither on where in its flow's share it lands nor on how that
    share is cut into chunks (each element's sum is its flow's terms, element by element), so the
    retried sums are those of the round that lost them.

    Attributes
    ----------
    chunks : tuple of int
        The lost chunks' ``seq`` in the round that lost them, flow by flow (flow 0's first), in
        chunk order within a flow.
    ranges : tuple of (int, int)
        (start, count) in payload words (32-bit; two bf16/fp16 elements each) of each of
        :attr:`chunks` in that round's message, in the same order.
    per_flow : tuple of int
        Lost payload words of each flow, F entries (0 for a flow that lost nothing).
    """

    chunks: tuple[int, ...]
    ranges: tuple[tuple[int, int], ...]
    per_flow: tuple[int, ...]

    @property
    def share(self) -> int:
        """Payload words of each flow's share of the retry message: the most any flow lost."""
        return max(self.per_flow)

    @property
    def words(self) -> int:
        """Payload words of the retry message: F × :attr:`share`."""
        return self.share * len(self.per_flow)

    def gather(self, words: np.ndarray) -> np.ndarray:
        """One rank's retry message: uint32 payload words, shape (:attr:`words`,), from its payload
        words (uint32, the message of the round that lost the chunks)."""
        (lost,) = gather_ranges([words], self.ranges, np.uint32)
        out = np.zeros(self.words, dtype=np.uint32)
        at = 0
        for f, n in enumerate(self.per_flow):
            out[f * self.share:f * self.share + n] = lost[at:at + n]
            at += n
        return out

    def scatter(self, result_words: np.ndarray, retry_words: np.ndarray) -> np.ndarray:
        """A copy of ``result_words`` (one rank's result words, uint32, of the round that lost the
        chunks) with the retry round's sums of them (``retry_words``, uint32, shape (:attr:`words`,))
        put in place; the padding's sums are dropped."""
        values = np.concatenate([retry_words[f * self.share:f * self.share + n] for f, n in enumerate(self.per_flow)])
        return scatter_ranges(result_words, self.ranges, values, np.uint32)


def plan_retry(chunks: Sequence[Chunk], lost: Iterable[int], flows: int) -> RetryPlan:
    """The :class:`RetryPlan` of the chunks ``lost`` (``seq`` numbers) of a round whose chunks are
    ``chunks`` (:func:`wirereduce.table.plan`, in ``seq`` order) on a schedule of ``flows`` flows.

    Raises ValueError if ``lost`` is empty or names a chunk the round does not have.
    """
    lost = sorted(set(lost))
    if not lost:
        raise ValueError("nothing to retry: no chunk was lost")
    if lost[0] < 0 or lost[-1] >= len(chunks):
        raise ValueError(f"lost chunks {lost} outside the round's chunks 0 … {len(chunks) - 1}")
    ordered = sorted((chunks[g] for g in lost), key=lambda c: (c.flow, c.seq))
    return RetryPlan(tuple(c.seq for c in ordered), tuple((c.start, c.count) for c in ordered),
                     tuple(sum(c.count for c in ordered if c.flow == f) for f in range(flows)))


class EngineAllreduce:
    """One allreduce on a network of schedule engines, retries included, sans-IO: the collective to
    run now (a session per rank) and how the sums of the retries go back in place.

    An engine runs :attr:`sessions`
    (every rank's SCHEDULE frames, CONTROL, pushes); when chunks are lost (the round's deadline
    passed with results missing: an engine sends no LOST placeholders) it hands the
    :class:`~wirereduce.host.driver.ChunksLost` to :meth:`retry`, which sets up the next round over
    just the lost chunks (every chunk some host is missing) or says that no retries are left; at
    the end :meth:`results` puts every round's sums in place.

    A retry round keeps every lost chunk in its own flow (:func:`plan_retry`): each flow's share of the
    retry message holds that flow's lost chunks, padded with zero words to the longest share. The result
    is therefore the loss-free run's, bit for bit (:func:`wirereduce.sim.golden.schedule.allreduce`).
    Re-running the whole collective would be bit-exact too, but costs the whole message for a lost
    chunk; summing the lost elements again in a message of their own (what the removed ring-only node's
    driver did) would put them in other flows, summed in other orders: other bits. The padding costs at
    most F − 1 chunks per lost chunk (one lost chunk of a full frame: F frames, one per flow). A padding
    chunk lost in a retry round is summed again like any other (its sum discarded).

    Parameters
    ----------
    schedule : Schedule
    config : EngineConfig
        How the engines were built.
    arrays : sequence of numpy.ndarray, shape (n,)
        One per rank, all float32, ml_dtypes.bfloat16, float16 or int32
        (:func:`wirereduce.formats.check_typed_inputs`).
    window : int, optional
        Chunks pushed ahead of the results received, 1 … ``config.slots`` (default ``slots``).
    op, compression, chunk_words
        As :class:`EngineSession`; every round has them.
    retries : int
        Rounds over lost chunks allowed after the first (an int ≥ 0).
    ids : CollectiveIds, optional
        Where the rounds' collective ids come from (default: from 1).
    tags : RequestTags, optional
        Where the request tags come from (default: from 1): per rank and round, its CONTROL's
        and one per SCHEDULE frame (:meth:`EngineSession.schedule_tag`).
    abort : bool
        The first round's CONTROL frames carry ``Flag.ABORT``. Retry rounds always carry it: the
        round that lost chunks never finished on some engine.

    Attributes
    ----------
    sessions : list of EngineSession
        The round to run now, one session per rank.
    retried : int
        Lost chunks summed again so far.
    elements : int
        Elements per rank.
    chunks : int
        Chunks per rank of the first round (the whole message).

    Raises
    ------
    ValueError
        On bad arrays, ``window``, ``op``, ``compression``, ``chunk_words`` or ``retries``, or a
        schedule of another node count or with more flows than the engines hold
        (:class:`EngineSession`), before anything is sent.
    """

    def __init__(self, schedule: Schedule, config: EngineConfig, arrays, *, window: int | None = None,
                 op: str | Op = "sum", compression: int | None = None, chunk_words: int | None = None,
                 retries: int = 0, ids: CollectiveIds | None = None, tags: RequestTags | None = None,
                 abort: bool = False):
        self.format, arrays = check_typed_inputs(arrays, schedule.nodes)
        self.retries = check_retries(retries)
        self.schedule = schedule
        self.config = config
        self.window = check_window(config.slots if window is None else window, config)
        self.op, self.compression, self.chunk_words = op, compression, chunk_words
        self.ids = ids if ids is not None else CollectiveIds()
        self.tags = tags if tags is not None else RequestTags()
        self._abort = bool(abort)
        self.elements = int(arrays[0].size)
        self.retried = 0
        #: Per retry so far: every rank's result words of the round that lost chunks, and the plan.
        self._lost: list[tuple[list[np.ndarray], RetryPlan]] = []
        self.sessions = self._round(arrays)
        self.chunks = len(self.sessions[0].chunks)

    def _round(self, arrays) -> list[EngineSession]:
        collective = self.ids.take()
        abort = self._abort or bool(self._lost)   # retry rounds abort the round that lost chunks
        sessions = []
        for k, a in enumerate(arrays):
            s = EngineSession(k, self.schedule, self.config, collective, a, self.window, tag=self.tags.next,
                              op=self.op, abort=abort, compression=self.compression, chunk_words=self.chunk_words)
            for _ in range(1 + len(s.schedule_frames())):   # its CONTROL's tag and its SCHEDULE frames'
                self.tags.take()
            sessions.append(s)
        return sessions

    def retry(self, err: ChunksLost) -> bool:
        """Take the loss of the round :attr:`sessions` ran (``err``, raised with those sessions): with
        retries left, make :attr:`sessions` a new collective of just the chunks some host is
        missing, each in its own flow (:func:`plan_retry`), and return True; else False (raise ``err``)."""
        if len(self._lost) == self.retries:
            return False
        rp = plan_retry(self.sessions[0].chunks, lost_chunks(err), len(self.schedule.flows))
        self._lost.append(([s.result_words.copy() for s in self.sessions], rp))
        self.retried += len(rp.chunks)
        self.sessions = self._round([from_words(rp.gather(s.words), self.format) for s in self.sessions])
        return True

    def results(self) -> list[np.ndarray]:
        """What each host holds once the round :attr:`sessions` completed: every round's sums in
        place. One array per rank, shape (:attr:`elements`,), the arrays' dtype."""
        words = [s.result_words for s in self.sessions]
        for received, rp in reversed(self._lost):
            words = [rp.scatter(r, w) for r, w in zip(received, words)]
        return [from_words(w, self.format, self.elements) for w in words]
