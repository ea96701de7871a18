"""A summation unit of the schedule engine: one flow's partial sum at a time, in the table's order.

The unit walks its chunks in increasing chunk number ``g`` (the table's ``next_flow``/``gap``
chain, :mod:`wirereduce.table`). For chunk ``g`` of flow ``f`` its table entry names the terms
of the sum, left to right: children's partial sums arriving on network ports and the host's
local chunk. Once every term is there (the frame of chunk ``g`` at the head of each port's
reduce queue, the local chunk in its buffer slot) it streams them all in lock step, beat by
beat, through a chain of fp32 adder lanes:

    ((t0 + t1) + t2) + …        (term i joins after i-1 adder stages)

so the result's bits are fixed by the table and never by arrival order. It is cut-through: a
beat leaves ``1 + 6·(terms - 1)`` cycles after it entered, at the tap after its frame's last
term (at most :attr:`SumUnit.latency`), while the frames are still arriving; a frame with another
number of terms than the ones in the chain waits until the chain is empty. The header words pass
through from term 0 (rewritten at the engine's outputs), as do lanes outside ``keep``.

A term whose frame ends early (a length error marked by its gate) is padded and the sum leaves
marked ``bad``; a term frame whose ``count`` disagrees with the local chunk's is never joined
(the unit pulses ``mismatch`` once and waits: the chunk is lost, and nothing of it is applied).
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.arith.fp32 import AdderLanes
from wirereduce.hdl.stream.frame import tagged_layout

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
        Datapath width in bits (``width // 32`` fp32 lanes).
    ports : int
        Network ports P of the engine (term codes 0 … P-1).
    terms : int
        Most terms this unit adds (P for a unit that sends to a parent port, P + 1 for the root
        unit); sets the adder chain's length and :attr:`latency`.
    slots, slot_beats : int
        Local buffer geometry (powers of two), as :class:`~wirereduce.config.NodeConfig`.
    req : int or None
        Output request mask of every frame (``1 << parent port``); ``None`` for the root unit,
        whose frames request the entry's ``forward`` ports and, with ``deliver``, the host
        (bit P).

    Attributes
    ----------
    q{p} : In(stream.Signature(tagged_layout(width)))
        Beats of the reduce queue of port p; ``q{p}_head`` its head frame; ``q{p}_pop`` pulses
        when this unit has taken that frame's last beat.
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
    o : Out(stream.Signature(tagged_layout(width))); o_req : Out(ports + 1)
        The sums; ``o_req`` is the frame's output request, valid with each beat.
    busy, mismatch : Out(1)
    """

    def __init__(self, width: int, ports: int, terms: int, slots: int, slot_beats: int, req: int | None = None):
        if not 1 <= terms <= MAX_TERMS:
            raise ValueError(f"a unit adds 1 … {MAX_TERMS} terms, not {terms}")
        self._w, self._p, self._t = width, ports, terms
        self._slots, self._sb, self._req = slots, slot_beats, req
        tagged = tagged_layout(width)
        members = {}
        for p in range(ports):
            members[f"q{p}"] = In(stream.Signature(tagged))
            members[f"q{p}_head"] = In(queue_head_layout())
            members[f"q{p}_pop"] = Out(1)
        members.update({
            "wr_addr": In(range(slots * slot_beats)), "wr_data": In(width), "wr_en": In(1),
            "slot_valid": In(slots), "slot_bad": In(slots), "slot_counts": In(data.ArrayLayout(16, slots)),
            "slot_seqs": In(data.ArrayLayout(32, slots)),
            "release": Out(1), "release_slot": Out(range(slots)),
            "tab_addr": Out(8), "tab_data": In(64),
            "start": In(1), "first": In(9), "chunks": In(32),
            "o": Out(stream.Signature(tagged)), "o_req": Out(ports + 1),
            "busy": Out(1), "mismatch": Out(1),
        })
        super().__init__(members)

    @property
    def latency(self) -> int:
        """Most cycles from a beat entering the adder chain to it leaving: 1 + 6·(terms − 1)."""
        return 1 + AdderLanes.LATENCY * (self._t - 1)

    def elaborate(self, platform):
        m = Module()
        w, P, T = self._w, self._p, self._t
        lanes, bpb = w // 32, w // 8
        S, SB = self._slots, self._sb
        slot_bits = (S - 1).bit_length()
        beat_bits = (SB - 1).bit_length()
        shift = (bpb - 1).bit_length()
        qs = [getattr(self, f"q{p}") for p in range(P)]
        heads = [getattr(self, f"q{p}_head") for p in range(P)]

        m.submodules.buf = buf = memory.Memory(shape=w, depth=S * SB, init=[])
        rd = buf.read_port()
        wp = buf.write_port()
        m.d.comb += [wp.addr.eq(self.wr_addr), wp.data.eq(self.wr_data), wp.en.eq(self.wr_en)]

        # --- cursor: chunk g of flow f, and its table entry -------------------------------------
        g = Signal(32)
        f = Signal(8)
        act = Signal()
        stale = Signal()   # the table read of a new f is under way
        stuck = Signal()   # a count mismatch was reported for this g
        m.d.comb += self.tab_addr.eq(f)
        m.d.sync += stale.eq(0)
        entry = self.tab_data
        codes = [entry[3 + 3 * i:6 + 3 * i] for i in range(MAX_TERMS)]
        fits = Const(1, 1)
        for i in range(T, MAX_TERMS):
            fits = fits & (codes[i] == NONE)

        slot = g[:slot_bits] if slot_bits else Const(0, 1)
        slot_seqs = Array(self.slot_seqs[k] for k in range(S))
        # The slot must hold chunk g itself: a unit may reach g while the slot still (or already)
        # holds chunk g ± slots of another unit's flow.
        slot_ok = (self.slot_valid >> slot)[0] & (slot_seqs[slot] == g)
        slot_bad = (self.slot_bad >> slot)[0]
        slot_counts = Array(self.slot_counts[k] for k in range(S))
        count = slot_counts[slot]

        ready = fits
        count_ok = Const(1, 1)
        has_local = Const(0, 1)
        for i in range(T):
            c = codes[i]
            r = (c == NONE) | ((c == LOCAL) & slot_ok)
            ok = Const(1, 1)
            for p in range(P):
                r = r | ((c == p) & heads[p].valid & (heads[p].seq == g))
                ok = ok & ((c != p) | (heads[p].count == count))
            ready = ready & r
            count_ok = count_ok & ok
            has_local = has_local | (c == LOCAL)
        ready = ready & has_local & (codes[0] != NONE)
        # Frames in the chain all leave at one tap (``depth`` adders in): a frame with another
        # number of terms joins only once the chain is empty.
        depth = Signal(range(T), name="depth")
        new_depth = Signal(range(T + 1))
        m.d.comb += new_depth.eq(sum((codes[i] != NONE for i in range(T)), Const(0, range(T + 1))) - 1)
        chain_empty = Signal()
        ready = ready & ((new_depth == depth) | chain_empty)

        # --- streaming state -----------------------------------------------------------------------
        streaming = Signal()
        cur = [Signal(3, name=f"code{i}") for i in range(T)]
        nbeats = Signal(16)
        last_keep = Signal(bpb)
        beat = Signal(16)
        cur_slot = Signal(max(1, slot_bits))
        cur_bad = Signal()
        cur_req = Signal(P + 1)
        ended = Signal(T)
        bad_acc = Signal()
        next_f = entry[24:32]
        gap = entry[32:40]
        fwd_req = Cat(entry[40:40 + P], entry[46])

        # The whole chain advances together; it stalls only when its output is held.
        en = Signal()
        out_valid = Signal()
        m.d.comb += en.eq(~out_valid | self.o.ready)

        nbytes = HEADER_BYTES + 4 * count
        with m.If(self.start):
            m.d.sync += [
                g.eq(self.first[:8]), f.eq(self.first[:8]), act.eq(~self.first[8]), stale.eq(1),
                streaming.eq(0), stuck.eq(0),
            ]
        with m.Elif(~streaming & act & ~stale & (g < self.chunks) & ready):
            with m.If(count_ok):
                m.d.sync += [
                    streaming.eq(1), beat.eq(0), ended.eq(0), bad_acc.eq(0),
                    nbeats.eq((nbytes + bpb - 1) >> shift),
                    last_keep.eq(Cat(*((nbytes - (((nbytes + bpb - 1) >> shift) - 1 << shift)) > k
                                       for k in range(bpb)))),
                    cur_slot.eq(slot), cur_bad.eq(slot_bad),
                    cur_req.eq(fwd_req if self._req is None else self._req), depth.eq(new_depth),
                ] + [cur[i].eq(codes[i]) for i in range(T)]
            with m.Elif(~stuck):
                m.d.comb += self.mismatch.eq(1)
                m.d.sync += stuck.eq(1)

        # Operands of the beat now: each port term's queue head (or padding once its frame ended).
        term_valid = Const(1, 1)
        for i in range(T):
            v = (cur[i] == NONE) | (cur[i] == LOCAL) | ended[i]
            for p in range(P):
                v = v | ((cur[i] == p) & qs[p].valid)
            term_valid = term_valid & v
        fire = Signal()
        m.d.comb += fire.eq(streaming & en & term_valid)
        is_last = beat == nbeats - 1
        early = Const(0, 1)   # a term's frame ended before this beat
        now_bad = Const(0, 1)
        take = [Const(0, 1)] * P
        vals = []
        for i in range(T):
            val = Signal(w, name=f"opnd{i}")
            for p in range(P):
                use = (cur[i] == p) & ~ended[i]
                take[p] = take[p] | use
                with m.If(use):
                    m.d.comb += val.eq(qs[p].payload.data)
                early = early | (use & qs[p].payload.last & ~is_last) | ((cur[i] == p) & ended[i])
                now_bad = now_bad | (use & qs[p].payload.last & qs[p].payload.bad)
            vals.append(val)
        for p in range(P):
            m.d.comb += qs[p].ready.eq(fire & take[p])
        with m.If(fire):
            m.d.sync += [beat.eq(beat + 1), bad_acc.eq(bad_acc | early | now_bad)]
            for i in range(T):
                ends = Const(0, 1)
                for p in range(P):
                    ends = ends | ((cur[i] == p) & ~ended[i] & qs[p].payload.last)
                with m.If(ends):
                    m.d.sync += ended[i].eq(1)
            with m.If(is_last):
                m.d.sync += [streaming.eq(0), g.eq(g + gap), f.eq(next_f), stale.eq(1), stuck.eq(0)]
                m.d.comb += [self.release.eq(1), self.release_slot.eq(cur_slot)]
                for p in range(P):
                    popped = Const(0, 1)
                    for i in range(T):
                        popped = popped | (cur[i] == p)
                    m.d.comb += getattr(self, f"q{p}_pop").eq(popped)

        # Local chunk: read this beat from the buffer (data next cycle, like the operands' stage 1).
        addr = Cat(beat[:beat_bits], cur_slot) if slot_bits else beat[:beat_bits]
        m.d.comb += [rd.addr.eq(addr), rd.en.eq(en)]

        # --- stage 1 and the adder chain ----------------------------------------------------------
        meta = data.StructLayout({
            "valid": 1, "keep": bpb, "last": 1, "bad": 1, "first": 1, "mask": lanes, "present": T,
            "req": P + 1,
        })
        s1 = Signal(meta)
        s1_vals = [Signal(w, name=f"s1_opnd{i}") for i in range(T)]
        s1_local = Signal(T)
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
                s1_local.eq(Cat(*(cur[i] == LOCAL for i in range(T)))),
            ] + [s1_vals[i].eq(vals[i]) for i in range(T)]
        terms = [Mux(s1_local[i], rd.data, s1_vals[i]) for i in range(T)]

        def delay(sig, n, name):
            for k in range(n):
                nxt = Signal.like(sig, name=f"{name}_d{k}")
                with m.If(en):
                    m.d.sync += nxt.eq(sig)
                sig = nxt
            return sig

        L = AdderLanes.LATENCY
        acc = terms[0]
        stage_meta = s1
        valids = [s1.valid]
        taps = [(acc, stage_meta)]
        for i in range(1, T):
            adder = m.submodules[f"add{i}"] = AdderLanes(lanes)
            b = delay(terms[i], L * (i - 1), f"term{i}")
            m.d.comb += [adder.a.eq(acc), adder.b.eq(b), adder.en.eq(en)]
            through = delay(acc, L, f"acc{i}")
            # Beats of frames that leave at an earlier tap go no further.
            nmeta = Signal(meta, name=f"meta{i}_in")
            m.d.comb += [nmeta.eq(stage_meta), nmeta.valid.eq(stage_meta.valid & (depth > i - 1))]
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

        # The frames in the chain leave at the tap after their last term: 1 + 6·(terms − 1) cycles.
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
            self.busy.eq(streaming | Cat(*valids).any()),
            chain_empty.eq(~Cat(*valids).any()),
        ]
        return m
