"""Driving a schedule engine: one rank's side of an allreduce that runs any tree schedule (sans-IO).

:class:`EngineSession` is :class:`~wirereduce.host.driver.NodeSession`'s counterpart for the
schedule engine (:mod:`wirereduce.hdl.core.engine`): it makes every frame one host sends and
checks every frame it gets back, and leaves the sending to a transport or a frame script.

1. SCHEDULE frames load the node's table (:func:`wirereduce.table.table_frames_payloads`), each
   answered with STATS;
2. CONTROL starts the collective (``src`` = rank, ``hop`` = flows F, ``seq`` = chunks C);
3. HOST_PUSH frames, chunk g = k·F + f in increasing g (:func:`wirereduce.table.plan`): chunk g
   only once the host holds ``g − W + 1`` results (the window W ≤ the engine's ``slots``; results
   come in any order across flows, and the count is what the engine's queue bound needs,
   docs/architecture.md "Why the engine cannot deadlock");
4. HOST_RESULT frames, one per chunk, are put in place by their chunk's element range.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from wirereduce.host.driver import CodecFields, DriverError, parse_stats

from wirereduce.config import EngineConfig
from wirereduce.formats import CANONICAL_NAN, Op, dtype_byte, format_of, from_words, to_words
from wirereduce.protocol import HEADER_BYTES, Flag, Header, Opcode, frame
from wirereduce.schedule import Schedule
from wirereduce.table import ENTRY_BYTES, plan, table_frames_payloads

__all__ = ["EngineSession", "EnginePush", "check_window"]


def check_window(window: int, config: EngineConfig) -> int:
    """The window, checked: 1 … ``config.slots`` (the engine's queues are sized for that)."""
    if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= config.slots:
        raise ValueError(f"the window must be 1 … {config.slots} chunks (the engine's slots), not {window!r}")
    return window


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
    chunk_words : int, optional
        At most this many 32-bit payload words per chunk (1 … the frame's maximum,
        ``config.max_elements``, or the compressed bound): shorter chunks, so that a small
        message has more chunks per flow to pipeline through a tree (docs/architecture.md "Small
        messages"). ``None`` (default): as many as a frame holds. The result bits do not depend on
        it (each element's sum order is its flow's). Uncompressed collectives only.

    Raises
    ------
    ValueError
        A rank outside the schedule, a bad window, an unsupported dtype or operation, a dtype whose
        format the engines are not built with (``config.formats``: they would refuse the CONTROL),
        a schedule with more flows than the engine holds; ``compression`` out of range, on
        another format than fp32, or for engines built without the codec; ``chunk_words`` not an
        int from 1 to what a frame holds, or given with ``compression``.
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
        per_chunk = self.config.max_elements
        if self.compression is not None:
            from wirereduce.codec import check_k, max_elements_compressed

            self.compression = check_k(self.compression)
            if not self.config.codec:
                raise ValueError("compression needs engines built with the codec (EngineConfig(codec=True)); "
                                 "these have no codec")
            if self.format.name != "fp32":
                raise ValueError(f"compression is fp32-only (docs/codec.md); the array is {self.format.name}")
            per_chunk = max_elements_compressed(self.config.mtu)
        if self.chunk_words is not None:
            if self.compression is not None:
                raise ValueError("chunk_words is for uncompressed collectives: compressed chunks are sized to "
                                 "the compressed bound (the golden model's chunking)")
            cw = self.chunk_words
            if not isinstance(cw, int) or isinstance(cw, bool) or not 1 <= cw <= per_chunk:
                raise ValueError(f"chunk_words must be an int from 1 to {per_chunk} (what a frame holds), not {cw!r}")
            per_chunk = cw
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
        """Take one HOST_RESULT frame. Raises DriverError on a frame that is not a result of this
        collective, a duplicate, or a length that does not match its chunk."""
        h = Header.unpack(data)
        if h.opcode != Opcode.HOST_RESULT or h.collective != self.collective:
            raise DriverError(f"node {self.rank}: unexpected frame {h!r}")
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
