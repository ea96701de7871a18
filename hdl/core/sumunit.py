"""A summation unit of the schedule engine: one chunk's partial sum at a time, in the table's order.

The unit follows its chunks in increasing chunk number ``g`` (the table's ``next_flow``/``gap``
chain, :mod:`wirereduce.table`) with a **lookahead of D** (``lookahead``, 1 … 4, default 2):
candidate C0 is the oldest chunk it has not summed, C(k+1) the next one after Ck in its order
(chunk ``g + gap`` of flow ``next_flow`` of Ck's entry). For a candidate's chunk of flow ``f`` the
table entry names the terms of the sum, left to right: children's partial sums arriving on network
ports and the host's local chunk. A candidate is ready once every term is there (the first beat of
its frame in slot g mod 2·slots of that port's :class:`~wirereduce.hdl.core.chunkbuf.ChunkBuffer`,
the local chunk in its buffer slot); the unit takes the first ready candidate (so a late chunk does
not hold up the ones after it: docs/architecture.md "Why the engine stays at the ring's rate"; D = 1
is strictly in order), the ones after it move down one place and the last is worked out anew. The
entries come from one synchronous table read a cycle, the first candidate's whose entry is not in.
It streams all the chunk's terms in lock step, beat by beat, through a chain of reduce lanes
(:class:`~wirereduce.hdl.arith.lanes.ReduceLanes`: the collective's format and operation, ``mode``):

    ((t0 + t1) + t2) + …        (term i joins after i-1 adder stages)

so the result's bits are fixed by the table and never by arrival order. It is cut-through: a
beat is read from its buffer as soon as it is written and leaves ``1 + L·(terms - 1) + max(0, terms - 2)``
cycles after it entered the chain (L the lanes' latency: 6, or 7 from 512 bit up, where the lanes are
built deep for the 322.27 MHz timing budget: :func:`wirereduce.config.deep_lanes`; each adder after
the first takes the sum before it through a register), at the tap after its frame's last term (at
most :attr:`SumUnit.latency`), while the frames are still arriving; a frame with another number of
terms than the ones in the chain waits until the chain is empty. The header words pass through
from term 0 (rewritten at the engine's outputs), as do lanes outside ``keep``.

A term whose frame ends early (a length error marked by its gate) is padded with zeros and the sum
leaves marked ``bad``; a term frame whose ``count`` disagrees with the local chunk's is never
joined (the unit pulses ``mismatch`` once and does not take that chunk: it is lost, and nothing of
it is applied).
"""

from __future__ import annotations

import operator
from functools import reduce

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.arith.fp32 import latency as lanes_latency
from wirereduce.hdl.arith.lanes import ReduceLanes
from wirereduce.hdl.core.chunkbuf import reader_signature
from wirereduce.hdl.params import rejecting
from wirereduce.hdl.stream.frame import count_beats, decode_expect_count, tagged_layout

from wirereduce.config import MAX_LOOKAHEAD, deep_lanes
from wirereduce.formats import FORMATS
from wirereduce.protocol import HEADER_BYTES
from wirereduce.table import LOCAL, MAX_TERMS, NONE

__all__ = ["SumUnit", "queue_head_layout"]

HEADER_WORDS = HEADER_BYTES // 4


def queue_head_layout() -> data.StructLayout:
    """What a reduce queue shows of the frame at its head."""
    return data.StructLayout({"valid": 1, "seq": 32, "flow": 8, "count": 16})


class SumUnit(wiring.Component):
    """Sums one flow's terms per chunk, cut-through, in the table's order (module docstring).

    Parameters
    ----------
    width : int
        Datapath width in bits (``width // 32`` fp32 lanes); from 512 bit up the lanes are the
        seven-stage ones (:func:`wirereduce.config.deep_lanes`).
    ports : int
        Network ports P of the engine (term codes 0 … P-1).
    terms : int
        Most terms this unit adds (P for a unit that sends to a parent port, P + 1 for the root
        unit); sets the adder chain's length and :attr:`latency`.
    slots, slot_beats : int
        Local buffer geometry (powers of two), as :class:`~wirereduce.config.NodeConfig`.
    max_beats : int, optional
        Beats of the longest frame (a reduce buffer slot); default ``slot_beats``.
    formats : tuple of str
        The formats the reduce lanes are built for (``EngineConfig.formats``); default all.
    req : int or None
        Output request mask of every frame (``1 << parent port``); ``None`` for the root unit,
        whose frames request the entry's ``forward`` ports and, with ``deliver``, the host
        (bit P).
    lookahead : int
        Candidates D, 1 … :data:`~wirereduce.config.MAX_LOOKAHEAD` (default 2): the unit may take
        any of the D oldest chunks of its order it has not summed (1: strictly in order). Each
        candidate adds its own readiness logic; results never depend on D, only the time.

    Attributes
    ----------
    b{p} : Out(reader_signature(width, 2·slots, max_beats))
        The reduce buffer of port p for this unit: slot states, a read port, ``free``.
    wr_addr, wr_data, wr_en : In
        Write port of this unit's copy of the local buffer (slot · slot_beats + beat).
    slot_valid, slot_bad : In(slots); slot_counts, slot_seqs : In(ArrayLayout(16 / 32, slots))
        Which slots hold a chunk, lost or not, its element count and its chunk number.
    release, release_slot : Out
        The local chunk of ``release_slot`` has been read whole.
    tab_addr : Out(8); tab_data : In(64)
        A synchronous read port of the schedule table.
    start : In(1); first : In(9); chunks : In(32)
        ``start`` (one cycle, a CONTROL frame taken) resets the unit to its first flow
        ``first`` (bit 8 set: the unit has no flow).
    hold : In(1)
        The unit takes no chunk while high (the engine raises it from a CONTROL frame's arrival
        until the unit's ``start``, which it gives a cycle after the CONTROL is taken, for timing;
        and while a SCHEDULE frame waits to be taken).
    mode : In(8)
        The collective's header ``dtype`` byte (format and operation, :mod:`wirereduce.formats`),
        set at CONTROL; the lanes compute it.
    o : Out(stream.Signature(tagged_layout(width))); o_req : Out(ports + 1)
        The sums; ``o_req`` is the frame's output request, valid with each beat.
    busy, mismatch : Out(1)
    discarded : Out(1)
        Pulses (a cycle after the slots are freed) when a summed chunk's slot held a frame in the
        buffer of a port that is not among the chunk's terms: a REDUCE whose ``hop`` named another
        flow than its chunk's (forged or misrouted), freed with the chunk's slots and never summed.
    cand_chunk : Out(ArrayLayout(32, lookahead)); cand_known : Out(lookahead)
        The candidates C0 … C(D-1) (chunk numbers, registers) and which of them are known (a prefix).
        Every chunk of the unit's order before C0, and between two known candidates, has been summed;
        the engine's gates drop a REDUCE frame for one of those (a replay) before it takes a slot.
    """

    def __init__(self, width: int, ports: int, terms: int, slots: int, slot_beats: int, req: int | None = None,
                 max_beats: int | None = None, lookahead: int = 2,
                 formats: tuple[str, ...] = tuple(FORMATS)):
        with rejecting(self):
            if not 1 <= terms <= MAX_TERMS:
                raise ValueError(f"a unit adds 1 … {MAX_TERMS} terms, not {terms}")
            if not 1 <= lookahead <= MAX_LOOKAHEAD:
                raise ValueError(f"lookahead must be 1 … {MAX_LOOKAHEAD} chunks, not {lookahead}")
            self._deep = deep_lanes(width)      # also checks the width
        self._w, self._p, self._t, self._d = width, ports, terms, lookahead
        self._slots, self._sb, self._req = slots, slot_beats, req
        self._mb = slot_beats if max_beats is None else max_beats
        self._formats = formats
        self._lanes_latency = lanes_latency(self._deep)
        # Whether a term's frame can be a single beat: only where a beat holds the whole header.
        self._one_beat = width // 8 >= HEADER_BYTES
        self._q = 2 * slots
        members = {}
        for p in range(ports):
            members[f"b{p}"] = Out(reader_signature(width, self._q, self._mb))
        members.update({
            "wr_addr": In(range(slots * slot_beats)), "wr_data": In(width), "wr_en": In(1),
            "slot_valid": In(slots), "slot_bad": In(slots), "slot_counts": In(data.ArrayLayout(16, slots)),
            "slot_seqs": In(data.ArrayLayout(32, slots)),
            "release": Out(1), "release_slot": Out(range(slots)),
            "tab_addr": Out(8), "tab_data": In(64),
            "start": In(1), "hold": In(1), "first": In(9), "chunks": In(32), "mode": In(8),
            "o": Out(stream.Signature(tagged_layout(width))), "o_req": Out(ports + 1),
            "busy": Out(1), "mismatch": Out(1), "discarded": Out(1),
            "cand_chunk": Out(data.ArrayLayout(32, lookahead)), "cand_known": Out(lookahead),
        })
        super().__init__(members)

    @property
    def latency(self) -> int:
        """Most cycles from a beat entering the adder chain to it leaving: 1 + L·(terms − 1) + max(0, terms − 2),
        L = 6, or 7 with the deep lanes of a datapath of 512 bit or more (:func:`wirereduce.config.deep_lanes`);
        each adder after the first takes the sum before it through a register."""
        return 1 + self._lanes_latency * (self._t - 1) + max(0, self._t - 2)

    def elaborate(self, platform):
        m = Module()
        w, P, T = self._w, self._p, self._t
        lanes, bpb = w // 32, w // 8
        S, SB, Q, MB = self._slots, self._sb, self._q, self._mb
        slot_bits = (S - 1).bit_length()
        beat_bits = (SB - 1).bit_length()
        qbits = (Q - 1).bit_length()
        bufs = [getattr(self, f"b{p}") for p in range(P)]

        m.submodules.buf = buf = memory.Memory(shape=w, depth=S * SB, init=[])
        rd = buf.read_port()
        wp = buf.write_port()
        m.d.comb += [wp.addr.eq(self.wr_addr), wp.data.eq(self.wr_data), wp.en.eq(self.wr_en)]

        # --- D candidates C0 … C(D-1) (lookahead D): C0 is the oldest chunk not yet summed in the
        # unit's own order, C(k+1) the chunk after Ck, worked out from Ck's entry. Each holds its chunk
        # number, flow and table entry. ``known`` and ``ld`` (entry loaded) are prefixes of the
        # candidates: C(k+1) is known only once Ck's entry is in, ld[k] only once Ck is known, and a
        # stuck candidate is loaded. known[0] is "the unit has a flow".
        D = self._d
        cand_g = [Signal(32, name=f"c{k}_g") for k in range(D)]
        cand_f = [Signal(8, name=f"c{k}_f") for k in range(D)]
        cand_ent = [Signal(64, name=f"c{k}_ent") for k in range(D)]
        known, ld = Signal(D, name="known"), Signal(D, name="ld")
        m.d.comb += [self.cand_known.eq(known)] + [self.cand_chunk[k].eq(cand_g[k]) for k in range(D)]
        stuck = Signal(D, name="stuck")   # a count mismatch was reported
        # Table reads: the address is the flow of the first candidate whose entry is not in; the data
        # is the entry of the address of the cycle before (an entry depends on its flow only).
        addr_q = Signal(8)
        addr_ok = Signal()
        addr = cand_f[D - 1]
        for k in reversed(range(D - 1)):
            addr = Mux(ld[k], addr, cand_f[k])
        m.d.comb += self.tab_addr.eq(addr)
        m.d.sync += [addr_q.eq(self.tab_addr), addr_ok.eq(~self.start)]
        tab_for = [addr_ok & known[k] & ~ld[k] & (addr_q == cand_f[k]) for k in range(D)]

        slot_seqs = Array(self.slot_seqs[k] for k in range(S))
        slot_counts = Array(self.slot_counts[k] for k in range(S))
        depth = Signal(range(T), name="depth")
        chain_empty = Signal(init=1)   # registered: see its update at the end

        def decode(ent):
            """What readiness needs of an entry, worked out as it is loaded (timing: registered with the
            entry, so a candidate's readiness is a few gates on registers): whether the entry can be
            summed here at all (every term fits the chain and is a known code, the first is a term and
            one is the local chunk), the ports it has terms on, and the chain depth it needs."""
            codes = [ent[3 + 3 * i:6 + 3 * i] for i in range(MAX_TERMS)]
            ok = codes[0] != NONE
            for i in range(T, MAX_TERMS):
                ok = ok & (codes[i] == NONE)
            has_local = Const(0, 1)
            for i in range(T):
                ok = ok & ((codes[i] == NONE) | (codes[i] == LOCAL) | (codes[i] < P))
                has_local = has_local | (codes[i] == LOCAL)
            need = Cat(*(reduce(operator.or_, (codes[i] == p for i in range(T))) for p in range(P)))
            nd = sum((codes[i] != NONE for i in range(T)), Const(0, range(T + 1))) - 1
            return ok & has_local, need, nd

        # The decoded entry of each candidate (``decode``), valid while its ``ld`` is up.
        cand_ok = Signal(D, name="ent_ok")
        cand_need = [Signal(P, name=f"c{k}_needs") for k in range(D)]
        cand_depth = [Signal(range(T + 1), name=f"c{k}_depth") for k in range(D)]

        def candidate(idx, g, ent, loaded):
            """Whether chunk g (entry ``ent``) of candidate ``idx`` can start now, its counts agree, and
            what it starts with."""
            name = f"c{idx}"
            codes = [ent[3 + 3 * i:6 + 3 * i] for i in range(MAX_TERMS)]
            slot = g[:slot_bits] if slot_bits else Const(0, 1)
            qslot = g[:qbits] if qbits else Const(0, 1)
            count = slot_counts[slot]
            # Registered readiness (timing: the slot compares are the unit's deepest logic). Whether each
            # term's frame is in its slot, whether its count agrees with the local chunk's and whether
            # g < chunks are sampled from the registered slot state and used the cycle after, but only
            # if the candidate did not change at that clock edge (``fresh``). For an unchanged candidate a
            # term that is in stays in (a slot that holds its chunk is freed by this unit alone, after
            # summing it) and, once every term is in, the counts are fixed (written with each frame's
            # first beat): the unit takes a chunk a cycle later than it could, never a wrong one.
            # The candidate's own state (its entry's verdict, whether it is loaded) is folded into a
            # sample as well (timing: the take loop, readiness → take → the candidates' next state, was
            # the VC709 engine's deepest path): for an unchanged candidate it is the same at the sample
            # and at the use. ``base`` is the entry's verdict, loaded, g < chunks and the local chunk
            # in. The needed ports are folded into the port samples too (once the compares behind them
            # were registers against registers, below, that no longer made them the deeper side).
            fresh = Signal(name=f"{name}_fresh")
            base = Signal(name=f"{name}_base")
            # Each port's sample in two registers, the frame just written (``arrived``) and the slot
            # selected (``kept``), ORed behind them (timing: the two compares and their OR in one
            # stage measured 9 levels in engine_p2_64, ABC chaining the 32-bit compare)
            here = Signal(P, name=f"{name}_terms_in")
            here_k = Signal(P, name=f"{name}_terms_kept")
            same = Signal(P, name=f"{name}_counts_agree")
            same_k = Signal(P, name=f"{name}_counts_kept")
            # The local chunk's slot (g mod S) is selected into registers at the edge before and compared
            # now, as ``kept`` below (timing: the select and the 32-bit compare behind it measured 8 levels
            # in the unit alone): a local chunk reads as in two cycles after it was written.
            # (``fresh`` says the candidate did not change at the edge the selects were taken)
            lsel_valid = Signal(name=f"{name}_local_valid")
            lsel_seq = Signal(32, name=f"{name}_local_seq")
            lsel_count = Signal(16, name=f"{name}_local_count")
            m.d.sync += [
                fresh.eq(~changed[idx]),
                lsel_valid.eq((self.slot_valid >> slot)[0]), lsel_seq.eq(slot_seqs[slot]), lsel_count.eq(count),
                base.eq(cand_ok[idx] & loaded & (g < self.chunks) & fresh & lsel_valid & (lsel_seq == g)),
            ]
            # A port buffer fills slot q only with a frame whose seq is q modulo Q (``ChunkBuffer``:
            # the slot is the seq's low bits), so chunk g is in slot g mod Q iff the slot is valid and
            # the seq's bits above the slot's equal g's. Two ways in (timing: the select of slot g mod Q
            # and the compare behind it were the P = 4 engine's deepest path, 10 levels):
            # - ``arrived``: the frame's first beat was written at the last edge with seq = g (the
            #   buffer's ``new``/``new_seq`` registers against the candidate's chunk number), so a
            #   frame that arrives while its chunk waits reads as in a cycle after it was written, as
            #   before;
            # - ``kept``: slot g mod Q's valid flag and seq, selected into registers at the edge before
            #   (``fresh``: the candidate did not change at that edge, so the slot selected is still
            #   its own) and compared now. A frame that was in before the candidate came up reads as
            #   in a cycle later than before, which only costs time while the unit is idle.
            # Both are exact compares of registers the slot's frame keeps until this unit frees it.
            # The counts agree likewise: the frame's count (``new_count``, or slot g mod Q's selected at
            # the edge before) against the local chunk's, selected at the edge before as well
            # (``lsel_count``). Whenever the candidate is ready, ``base`` says the local chunk was in at that
            # edge, so that count is its own; a frame's count is written with its first beat.
            need = cand_need[idx]
            for p, b in enumerate(bufs):
                sel_valid = Signal(name=f"{name}_b{p}_valid")
                sel_hi = Signal(32 - qbits, name=f"{name}_b{p}_seq_hi")
                sel_count = Signal(16, name=f"{name}_b{p}_count")
                m.d.sync += [sel_valid.eq((b.valid >> qslot)[0]),
                             sel_hi.eq(Array(b.seq[k][qbits:] for k in range(Q))[qslot]),
                             sel_count.eq(Array(b.count[k] for k in range(Q))[qslot])]
                arrived = b.new & (b.new_seq == g)
                kept = fresh & sel_valid & (sel_hi == g[qbits:])
                # (the entry's ports folded in: ``need`` changes only with the candidate; timing, the take
                # loop behind the readiness)
                m.d.sync += [
                    here[p].eq(~need[p] | arrived), here_k[p].eq(kept),
                    same[p].eq(~need[p] | (arrived & (b.new_count == lsel_count))),
                    same_k[p].eq(kept & (sel_count == lsel_count)),
                ]
            # Every term in (the local chunk, each port it has a term on) and the counts agree.
            ready = fresh & base & (here | here_k).all()
            count_ok = (same | same_k).all()
            new_depth = cand_depth[idx]
            # Frames in the chain all leave at one tap (``depth`` adders in): a frame with another
            # number of terms joins only once the chain is empty. Whether the depths agree is sampled
            # like the readiness (timing): the candidate's depth is fixed while ``fresh``, and ``depth``
            # changes only as a chunk starts, after which the unit streams for at least a cycle, when the
            # sample is taken anew.
            same_depth = Signal(name=f"{name}_same_depth")
            m.d.sync += same_depth.eq(new_depth == depth)
            rdy = Signal(name=f"{name}_ready")
            m.d.comb += rdy.eq(ready & (same_depth | chain_empty))
            good = Signal(name=f"{name}_count_ok")
            m.d.comb += good.eq(count_ok)
            # What starting this chunk sets that takes arithmetic on its count (its beats, the last beat's
            # keep, whether it is one beat) and its local slot's bad flag, registered every cycle like the
            # readiness (timing: the take then selects registers): used only with ``ready``, which needs
            # ``fresh``, the candidate unchanged at the last edge, and ``base``, its local chunk in, whose
            # count and flag are then fixed.
            # (the frame's length decoded as a FrameGate's length check decodes it: last beat's index, its
            # keep, one beat only where a beat holds more than the header)
            # (from the count directly, ``decode_expect_count``: timing; its beats ``last + 1`` in one
            # adder, ``count_beats``)
            exp = decode_expect_count(m, count, w, name=f"{name}_expect")
            pre_nbeats = Signal(16, name=f"{name}_nbeats")
            pre_keep = Signal(bpb, name=f"{name}_last_keep")
            pre_last = Signal(name=f"{name}_one_beat")
            pre_bad = Signal(name=f"{name}_slot_bad")
            pre_qoh = Signal(Q, name=f"{name}_qslot_onehot")   # its port buffers' slot, one-hot
            m.d.sync += [
                pre_nbeats.eq(count_beats(count, w)), pre_keep.eq(exp.keep), pre_last.eq(exp.one),
                pre_bad.eq((self.slot_bad >> slot)[0]),
            ]
            if self._one_beat:   # only read where a term's frame can be one beat (below)
                m.d.sync += pre_qoh.eq(Const(1, Q) << qslot)
            return rdy, good, (codes, slot, qslot, (pre_nbeats, pre_keep, pre_last, pre_bad, pre_qoh), new_depth,
                               ent, need)

        # changed[k]: candidate k's chunk, entry or state changes at this clock edge (set below).
        changed = Signal(D, name="changed")
        cands = [candidate(k, cand_g[k], cand_ent[k], ld[k]) for k in range(D)]
        dec_ok, dec_need, dec_depth = decode(self.tab_data)

        # --- streaming state -----------------------------------------------------------------------
        streaming = Signal()
        cur = [Signal(3, name=f"code{i}") for i in range(T)]
        nbeats = Signal(16)
        last_keep = Signal(bpb)
        beat = Signal(16)
        cur_slot = Signal(max(1, slot_bits))
        cur_qslot = Signal(max(1, qbits))
        # Each port's one-beat-frame flag per slot (``single``, a cycle behind the buffer's flags) and,
        # for the chunk's first cycle, its slot's ``single`` and ``bad`` picked at the take through the
        # candidate's slot one-hot (timing: a shift by ``cur_qslot`` there mapped as a chain of LUT5s,
        # the P = 4 engine's two 10-level pairs ``single`` → ``bad_acc`` / stage 1's ``bad``; then an
        # AND-OR behind a registered one-hot, 8 levels in engine_p2_512; now registers).
        # Exact: the unit takes a chunk at least two cycles after a term's first beat was written
        # (``here`` is registered from the buffer's ``new``), so a one-beat frame's ``done``, ``bad`` and
        # ``single`` already show at the take, and nothing writes the slot until the unit frees it.
        single = [Signal(Q, name=f"single{p}") for p in range(P)]
        start_end = Signal(P, name="start_single")
        start_bad = Signal(P, name="start_bad")
        cur_bad = Signal()
        cur_req = Signal(P + 1)
        bad_acc = Signal()

        # A chunk's first cycle, the last beat, the ports it has terms on and the registered fill
        # compares (see "Operands of the beat now" below).
        is_last = Signal(name="is_last_q")
        started = Signal()
        fired_q = Signal()
        gt0_q, gt1_q, done_q = Signal(P, name="gt0_q"), Signal(P, name="gt1_q"), Signal(P, name="done_q")
        used = Signal(P, name="ports_used")   # the ports the chunk being summed has terms on
        fire = Signal()
        m.d.sync += [started.eq(0), fired_q.eq(fire)]

        # The whole chain advances together; it stalls only when its output is held.
        en = Signal()
        out_valid = Signal()
        m.d.comb += en.eq(~out_valid | self.o.ready)

        # The unit takes the first candidate that is ready with agreeing counts, and only if the chunk
        # after it is known (or it is the last candidate, whose successor its own entry names): the
        # candidates after it shift down, so the unit's order always continues from an entry it holds.
        # A count mismatch is reported once, for the first candidate that is ready but bad when no
        # candidate before it is ready and good.
        idle = ~streaming & known[0] & ~self.start & ~self.hold
        take = [Signal(name=f"take{k}") for k in range(D)]
        taken = good_before = Const(0, 1)
        report = []
        for k, (rdy, good, _) in enumerate(cands):
            after = known[k + 1] if k + 1 < D else Const(1, 1)
            # (a stuck candidate is never taken: its counts disagree, ``good`` is low and stays so while
            # it is unchanged, so ``stuck`` is left out of the take, for timing; it only reports once)
            m.d.comb += take[k].eq(idle & rdy & good & after & ~taken)
            report.append(idle & rdy & ~good & ~stuck[k] & ~good_before)
            taken = taken | take[k]
            good_before = good_before | (rdy & good)
        for k, r in enumerate(report):
            with (m.Elif if k else m.If)(r):
                m.d.comb += self.mismatch.eq(1)
                m.d.sync += stuck[k].eq(1)

        def begin(codes, slot, qslot, pre, new_depth, ent, need):
            pre_nbeats, pre_keep, pre_last, pre_bad, pre_qoh = pre
            fwd_req = Cat(ent[40:40 + P], ent[46])
            m.d.sync += [
                streaming.eq(1), beat.eq(0), bad_acc.eq(0),
                nbeats.eq(pre_nbeats), last_keep.eq(pre_keep),
                cur_slot.eq(slot), cur_qslot.eq(qslot), cur_bad.eq(pre_bad),
                cur_req.eq(fwd_req if self._req is None else self._req), depth.eq(new_depth),
                started.eq(1),
                used.eq(need),
                is_last.eq(pre_last),
            ] + [cur[i].eq(codes[i]) for i in range(T)]
            if self._one_beat:
                m.d.sync += [start_end.eq(Cat(*((single[p] & pre_qoh).any() for p in range(P)))),
                             start_bad.eq(Cat(*((b.bad & pre_qoh).any() for b in bufs)))]

        def move_down(t):
            """Ct was taken: C(j) ← C(j+1) for j ≥ t, and the last candidate moves on to the chunk after
            it in the unit's order (known if its entry was in; else worked out once C(D-2)'s is)."""
            for j in range(t, D - 1):
                m.d.sync += [cand_g[j].eq(cand_g[j + 1]), cand_f[j].eq(cand_f[j + 1]),
                             cand_ent[j].eq(cand_ent[j + 1]), known[j].eq(known[j + 1]), ld[j].eq(ld[j + 1]),
                             stuck[j].eq(stuck[j + 1]), cand_ok[j].eq(cand_ok[j + 1]),
                             cand_need[j].eq(cand_need[j + 1]), cand_depth[j].eq(cand_depth[j + 1])]
            z = D - 1
            m.d.sync += [cand_g[z].eq(cand_g[z] + cand_ent[z][32:40]), cand_f[z].eq(cand_ent[z][24:32]),
                         known[z].eq(ld[z]), ld[z].eq(0), stuck[z].eq(0)]

        with m.If(self.start):
            m.d.sync += [cand_g[0].eq(self.first[:8]), cand_f[0].eq(self.first[:8]), known.eq(~self.first[8]),
                         ld.eq(0), stuck.eq(0), streaming.eq(0)]
            m.d.comb += changed.eq(-1)
        with m.Else():
            for k, (_, _, args) in enumerate(cands):
                with (m.Elif if k else m.If)(take[k]):
                    begin(*args)
                    move_down(k)
                    m.d.comb += [changed[j].eq(1) for j in range(k, D)]
            with m.Else():
                # One step a cycle: load the first known candidate's entry that is not in, or work out
                # the candidate after the last loaded one (never both: known and ld are prefixes).
                for k in range(D):
                    with (m.Elif if k else m.If)(tab_for[k]):
                        m.d.sync += [cand_ent[k].eq(self.tab_data), ld[k].eq(1), cand_ok[k].eq(dec_ok),
                                     cand_need[k].eq(dec_need), cand_depth[k].eq(dec_depth)]
                        m.d.comb += changed[k].eq(1)
                    if k + 1 < D:
                        with m.Elif(ld[k] & ~known[k + 1]):
                            m.d.sync += [cand_g[k + 1].eq(cand_g[k] + cand_ent[k][32:40]),
                                         cand_f[k + 1].eq(cand_ent[k][24:32]), known[k + 1].eq(1)]
                            m.d.comb += changed[k + 1].eq(1)

        # Operands of the beat now: each port term's beat from its buffer slot (or padding once its
        # frame ended short).
        #
        # What the slot being read holds is registered a beat ahead (timing: a 16-way select of the
        # slots' fill counts and compares used to sit in front of ``fire``, which enables the whole
        # chain, and of the bad flags): for each port, whether the fill count exceeded ``beat`` /
        # ``beat + 1`` (``gt0_q``/``gt1_q``) and equalled ``beat + 1`` / ``beat + 2`` (``eq0_q``/``eq1_q``)
        # at the edge before, whether the last beat was in (``done_q``) and marked bad (``bad_q``); the
        # ones for this beat are picked by whether a beat was read at that edge (``fired_q``). A slot
        # read by the unit only fills (it is freed by this unit, after the sum), so the beat is in if it
        # was a cycle ago (stale the safe way: a beat written a cycle ago reads as not yet in), and once
        # ``done_q`` is up the count is final and the compares exact. A beat is never read in the cycle
        # after it was written, so a frame whose last beat came in at the edge before has not ended at
        # the beat read (``done_q`` low reads as not ended, correctly). In the first cycle of a chunk
        # (``started``, beat 0, the registers are the slot before's) every port term's beat 0 is in (the
        # unit took the chunk with each term's first beat in: ``here``), and its frame ends there only
        # if it is a frame of one beat, a flag per slot (``single``) known since that beat was written.
        # ``is_last_q`` is ``beat == nbeats - 1``, decided as the beat before it is read.
        #
        # A frame of one beat reaches a buffer only where a beat holds the whole header (the gates drop
        # a frame shorter than the header, ``drop_short``): at 64 bit (8 of the header's 16 bytes a
        # beat) no term's frame ends at beat 0, and the flags for it are left out (timing: the
        # per-slot ``single`` and ``bad`` flags behind the one-hot slot were the P = 4 engine's
        # ``bad_acc``/stage 1 ``bad`` pairs at 10 levels).
        gone, end_here, bad_now = [], [], []
        for p, b in enumerate(bufs):
            filled = Array(b.filled[k] for k in range(Q))[cur_qslot]
            eq0_q, eq1_q, bad_q = Signal(name=f"eq0_q{p}"), Signal(name=f"eq1_q{p}"), Signal(name=f"bad_q{p}")
            m.d.sync += [gt0_q[p].eq(filled > beat), gt1_q[p].eq(filled > beat + 1),
                         eq0_q.eq(filled == beat + 1), eq1_q.eq(filled == beat + 2),
                         done_q[p].eq((b.done >> cur_qslot)[0]), bad_q.eq((b.bad >> cur_qslot)[0])]
            gt = Mux(fired_q, gt1_q[p], gt0_q[p])
            eqm1 = Mux(fired_q, eq1_q, eq0_q)   # beat == filled - 1
            gone.append(~started & done_q[p] & ~gt)                 # ended before this beat: pad
            if self._one_beat:
                m.d.sync += single[p].eq(Cat(*(b.done[k] & (b.filled[k] == 1) for k in range(Q))))
                end_here.append(Mux(started, start_end[p], done_q[p] & eqm1))   # ends at this beat
                bad_now.append(Mux(started, start_bad[p], bad_q))
            else:
                end_here.append(~started & done_q[p] & eqm1)
                bad_now.append(bad_q)
        term_valid = Const(1, 1)
        for p in range(P):
            avail = started | done_q[p] | Mux(fired_q, gt1_q[p], gt0_q[p])
            term_valid = term_valid & (~used[p] | avail)
        early = Const(0, 1)   # a term's frame ended at or before this beat (not its expected last)
        now_bad = Const(0, 1)
        for p in range(P):
            early = early | (used[p] & (gone[p] | (end_here[p] & ~is_last)))
            now_bad = now_bad | (used[p] & end_here[p] & bad_now[p])
        ended_now = []
        for i in range(T):
            ended_now.append(reduce(operator.or_, ((cur[i] == p) & gone[p] for p in range(P)), Const(0, 1)))
        m.d.comb += fire.eq(streaming & en & term_valid)
        for b in bufs:
            m.d.comb += [b.rd_addr.eq(cur_qslot * MB + beat if qbits else beat), b.rd_en.eq(en)]
        # The slots are released and freed a cycle after the last beat is read (registered, for
        # timing): nothing reads them again, and no frame of a later chunk of that slot can be on its
        # way yet (docs/architecture.md "Why the engine cannot deadlock", 2). The chunk's slot is freed
        # in every port's buffer, not only its terms': a frame there is one whose ``hop`` named another
        # flow of this unit than its chunk's (a forged or misrouted REDUCE, which the gate's window
        # check cannot tell from a waited-for one); it would hold the slot until chunk g + 2S needs it
        # and stall that port. It is dropped here and counted (``discarded``).
        release_q = Signal()
        release_slot_q = Signal.like(self.release_slot)
        free_q = Signal(P)
        free_slot_q = Signal(max(1, qbits))
        m.d.sync += [release_q.eq(0), free_q.eq(0)]
        m.d.comb += [self.release.eq(release_q), self.release_slot.eq(release_slot_q)]
        for p, b in enumerate(bufs):
            m.d.comb += [b.free.eq(free_q[p]), b.free_slot.eq(free_slot_q)]
        with m.If(fire):
            m.d.sync += [beat.eq(beat + 1), bad_acc.eq(bad_acc | early | now_bad), is_last.eq(beat + 2 == nbeats)]
            with m.If(is_last):
                m.d.sync += [streaming.eq(0), release_q.eq(1), release_slot_q.eq(cur_slot),
                             free_slot_q.eq(cur_qslot), free_q.eq((1 << P) - 1)]
        # a frame in the freed slot of a port outside the chunk's terms (registered with the free)
        stray = Signal(P)
        for p, b in enumerate(bufs):
            m.d.comb += stray[p].eq(~used[p] & ((b.valid >> cur_qslot)[0] if qbits else b.valid[0]))
        discarded_q = Signal()
        m.d.sync += discarded_q.eq(fire & is_last & stray.any())
        m.d.comb += self.discarded.eq(discarded_q)

        # Local chunk: read this beat from the buffer (data next cycle, like the buffers' reads).
        addr = Cat(beat[:beat_bits], cur_slot) if slot_bits else beat[:beat_bits]
        m.d.comb += [rd.addr.eq(addr), rd.en.eq(en)]

        # --- stage 1 and the adder chain ----------------------------------------------------------
        meta = data.StructLayout({
            "valid": 1, "keep": bpb, "last": 1, "bad": 1, "first": 1, "mask": lanes, "present": T,
            "req": P + 1,
        })
        s1 = Signal(meta)
        # Each term's operand source, registered with the beat as a term code (binary, timing): port p's
        # buffer (p) while that term's frame has not ended, the local buffer (LOCAL), else padding (NONE,
        # 0). A binary select of P ≤ 4 buffers and the local one is one 8-input function per bit (a LUT6
        # pair and a MUXF7: one LUT level), where a one-hot AND-OR of P + 1 sources was two; the first
        # adder's operand classification behind it was the VC709 engine's one 10-level path.
        s1_src = [Signal(3, name=f"s1_src{i}", init=NONE) for i in range(T)]
        mask = Signal(lanes)
        for j in range(lanes):
            word = beat * lanes + j
            keep_now = Mux(is_last, last_keep, (1 << bpb) - 1)
            m.d.comb += mask[j].eq((word >= HEADER_WORDS) & keep_now[4 * j])
        with m.If(en):
            m.d.sync += [
                s1.valid.eq(fire),
                s1.keep.eq(Mux(is_last, last_keep, (1 << bpb) - 1)),
                s1.last.eq(is_last), s1.first.eq(beat == 0),
                s1.bad.eq(is_last & (bad_acc | early | now_bad | cur_bad)),
                s1.mask.eq(mask), s1.req.eq(cur_req),
                s1.present.eq(Cat(*(cur[i] != NONE for i in range(T)))),
            ] + [s1_src[i].eq(Mux((cur[i] == LOCAL) | ((cur[i] < P) & ~ended_now[i]), cur[i], NONE))
                 for i in range(T)]
        terms = []
        # By code: ports 0 … P-1, zeros up to LOCAL, the local buffer, zeros (NONE).
        srcs = [b.rd_data for b in bufs] + [Const(0, w)] * (LOCAL - P) + [rd.data, Const(0, w)]
        for i in range(T):
            val = Signal(w, name=f"opnd{i}")
            with m.Switch(s1_src[i]):
                for code, d in enumerate(srcs):
                    if code < P or code == LOCAL:
                        with m.Case(code):
                            m.d.comb += val.eq(d)
            terms.append(val)

        def delay(sig, n, name):
            for k in range(n):
                nxt = Signal.like(sig, name=f"{name}_d{k}")
                with m.If(en):
                    m.d.sync += nxt.eq(sig)
                sig = nxt
            return sig

        L = self._lanes_latency
        acc = terms[0]
        stage_meta = s1
        valids = [s1.valid]
        taps = [(acc, stage_meta)]
        for i in range(1, T):
            adder = m.submodules[f"add{i}"] = ReduceLanes(lanes, self._formats, deep=self._deep)
            # Beats of frames that leave at an earlier tap go no further.
            nmeta = Signal(meta, name=f"meta{i}_in")
            m.d.comb += [nmeta.eq(stage_meta), nmeta.valid.eq(stage_meta.valid & (depth > i - 1))]
            if i >= 2:
                # The sum of the adder before is registered on its way into this one (timing: its
                # format select and the tap's select in front of this adder's operand classification
                # were 10 LUT levels): one cycle more for each term after the second.
                chain_meta = Signal(meta, name=f"meta{i}_chain")
                chain_acc = Signal(w, name=f"acc{i}_chain")
                with m.If(en):
                    m.d.sync += [chain_meta.eq(nmeta), chain_acc.eq(acc)]
                valids.append(chain_meta.valid)
                nmeta, acc = chain_meta, chain_acc
            b = delay(terms[i], (L + 1) * (i - 1), f"term{i}")
            m.d.comb += [adder.a.eq(acc), adder.b.eq(b), adder.en.eq(en), adder.mode.eq(self.mode)]
            through = delay(acc, L, f"acc{i}")
            for k in range(L):
                nxt = Signal(meta, name=f"meta{i}_{k}")
                with m.If(en):
                    m.d.sync += nxt.eq(nmeta)
                nmeta = nxt
                valids.append(nxt.valid)
            stage_meta = nmeta
            nacc = Signal(w, name=f"acc{i}")
            for j in range(lanes):
                lane = slice(32 * j, 32 * j + 32)
                m.d.comb += nacc[lane].eq(Mux(stage_meta.present[i] & stage_meta.mask[j], adder.s[lane], through[lane]))
            acc = nacc
            taps.append((acc, stage_meta))

        # The chain is empty, registered (timing: an OR of every stage's valid in front of ``take``): it
        # was empty at the edge before and no beat entered then, so it is empty now (a beat enters
        # only while streaming, and the unit takes a chunk only while not). A chain that has just
        # emptied reads as not empty for a cycle: a chunk of another depth waits a cycle more.
        m.d.sync += chain_empty.eq(~Cat(*valids).any() & ~fire)
        busy_q = Signal()
        m.d.sync += busy_q.eq(streaming | release_q | Cat(*valids).any())
        # The frames in the chain leave at the tap after their last term: 1 + L·(terms − 1) + max(0, terms − 2)
        # cycles.
        tap_acc = Array(a for a, _ in taps)[depth]
        tap_meta = Array(t for _, t in taps)[depth]
        m.d.comb += [
            out_valid.eq(tap_meta.valid),
            self.o.valid.eq(out_valid),
            self.o.payload.data.eq(tap_acc),
            self.o.payload.keep.eq(tap_meta.keep),
            self.o.payload.last.eq(tap_meta.last),
            self.o.payload.bad.eq(tap_meta.bad),
            self.o.payload.first.eq(tap_meta.first),
            self.o_req.eq(tap_meta.req),
            # busy: a cycle late at the end (timing: the chain's valids through a register; whatever is
            # in the chain or released now was in it or streaming the cycle before).
            self.busy.eq(streaming | busy_q),
        ]
        return m
