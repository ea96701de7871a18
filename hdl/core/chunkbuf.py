"""A reduce buffer addressed by chunk: frames of chunk g go to slot g mod Q, readable cut-through.

The schedule engine's summation units may take their chunks out of order
(:class:`~wirereduce.hdl.core.sumunit.SumUnit`, lookahead of D chunks), so the frames a unit sums
cannot wait in FIFO queues: two children that send two chunks in opposite orders would leave each
chunk behind the other at one FIFO head each (a deadlock). Here a frame of chunk g is written to
slot ``g mod Q`` (Q = 2·``slots``, docs/architecture.md "Why the engine cannot deadlock" for why
no two chunks in flight ever share a slot) and the unit reads any slot's beats as soon as they are
written, so a sum starts while its frames are still arriving (cut-through).

A frame whose slot is still taken waits at the input (``i.ready`` low) and ``collisions`` pulses:
the window rule makes that impossible, so a pulse would be a bug, never lost data.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.stream.frame import tagged_layout

__all__ = ["ChunkBuffer", "reader_signature"]


def reader_signature(width: int, slots: int, max_beats: int) -> wiring.Signature:
    """The reader's side of a :class:`ChunkBuffer` (members from the reader's view).

    ``valid`` (a frame's first beat is in), ``seq``, ``count`` (its header fields), ``filled``
    (beats written), ``done`` (its last beat is in), ``bad`` (that last beat was marked bad): one
    per slot. ``new``, ``new_seq`` and ``new_count`` (registers): a frame's first beat was written at
    the last clock edge, and its ``seq`` and ``count`` (a reader that waits for chunk g compares
    ``new_seq`` with g, two registers, instead of selecting slot g mod Q's ``seq`` first: timing).
    ``rd_addr`` = slot · ``max_beats`` + beat and ``rd_en`` read a beat, whose ``data``
    appears the cycle after; ``free`` with ``free_slot`` empties a slot.
    """
    return wiring.Signature({
        "valid": In(slots), "done": In(slots), "bad": In(slots),
        "seq": In(data.ArrayLayout(32, slots)), "count": In(data.ArrayLayout(16, slots)),
        "new": In(1), "new_seq": In(32), "new_count": In(16),
        "filled": In(data.ArrayLayout(range(max_beats + 1), slots)),
        "rd_addr": Out(range(slots * max_beats)), "rd_en": Out(1), "rd_data": In(width),
        "free": Out(1), "free_slot": Out(range(slots)),
    })


#: Block RAM modes (depth, data bits) of a 36 Kbit Xilinx block RAM (7 series and UltraScale, UG473 /
#: UG573 "Block RAM Port Aspect Ratios", parity bits left out).
BRAM36_MODES = ((512, 64), (1024, 32), (2048, 16), (4096, 8), (8192, 4), (16384, 2), (32768, 1))


def bram_column(width: int, depth: int) -> int:
    """Bits of a column of a ``width`` × ``depth`` memory such that each column fits a single 36 Kbit
    block RAM in depth (one RAM or a row of them, no read-data multiplexer): the widest mode of
    :data:`BRAM36_MODES` at least ``depth`` deep, or ``width`` when one 512-deep RAM holds it (or the
    memory is deeper than any mode, left to the tools)."""
    for d, bits in BRAM36_MODES:
        if depth <= d:
            return min(width, bits) if d > 512 else width
    return width


class ChunkBuffer(wiring.Component):
    """Frames in slots by chunk number (module docstring).

    Parameters
    ----------
    width : int
        Datapath width in bits.
    slots : int
        Q, a power of two: frames of chunk g go to slot g mod Q.
    max_beats : int
        Beats of the longest frame (a slot's size).
    checked : bool
        The writer checks the slot itself (the schedule engine's network gates: the head frame
        waits until a registered ``r.valid`` of its slot reads free, so the gate's ``ready`` does
        not go through this slot select): ``i.ready`` is then always high, and ``collisions`` still
        pulses if a first beat ever found its slot taken.
    early_seq : bool
        The writer shows a frame's ``i_seq`` at least one cycle before it offers the frame's first
        beat, unchanged until then (the schedule engine's network gates: a head frame waits in
        the gate's START state through the flow look-up, two cycles, its header at ``i_seq``). The
        first beat's slot (one-hot) and address are then taken from registers loaded every cycle
        from ``i_seq``, not decoded from it in front of the slot flags' enables and the block RAMs'
        write address (timing: the 512-bit engine's deepest paths ran from the gate's header FIFO
        through that decode). A first beat written otherwise is a protocol error of the writer:
        ``collisions`` pulses with it. Needs ``checked``.

    Attributes
    ----------
    i : In(stream.Signature(tagged_layout(width))); i_seq, i_flow, i_count : In
        Beats in; the header fields are sampled with the first beat (as :class:`FrameQueue`).
    r : In(reader_signature(width, slots, max_beats))
        The summation unit's side.
    collisions : Out(1)
        Pulses when a first beat finds its slot taken (it waits).
    """

    def __init__(self, width: int, slots: int, max_beats: int, checked: bool = False, early_seq: bool = False):
        if slots < 1 or slots & (slots - 1):
            raise ValueError(f"slots must be a power of two, not {slots}")
        if early_seq and not checked:
            raise ValueError("early_seq needs checked=True (the writer checks the slot before offering a first beat)")
        self._w, self._q, self._mb = width, slots, max_beats
        self._checked = bool(checked)
        self._early = bool(early_seq)
        super().__init__({
            "i": In(stream.Signature(tagged_layout(width))), "i_seq": In(32), "i_flow": In(8), "i_count": In(16),
            "r": In(reader_signature(width, slots, max_beats)), "collisions": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        Q, MB = self._q, self._mb
        bits = (Q - 1).bit_length()
        # The buffer in columns as wide as one block RAM holds at this depth (``bram_column``): a
        # deeper memory than a block RAM's mode at its width is cascaded with a multiplexer on the read
        # data, in front of a summation unit's operand select (timing: 3008 × 64 bit took three 1K × 36
        # RAMs deep at P = 4, 8 slots, MTU 1500, and the 3:1 select made the engine's only 10-level path).
        depth, cw = Q * MB, bram_column(self._w, Q * MB)
        wps, rps = [], []
        for i in range(0, self._w, cw):
            mem = m.submodules[f"mem{i // cw}" if cw < self._w else "mem"] = memory.Memory(
                shape=min(cw, self._w - i), depth=depth, init=[])
            wps.append((mem.write_port(), slice(i, i + cw)))
            rps.append(mem.read_port())
        wp = Signal(data.StructLayout({"addr": range(depth), "data": self._w, "en": 1}), name="wp")
        for port, bits_ in wps:
            m.d.comb += [port.addr.eq(wp.addr), port.data.eq(wp.data[bits_]), port.en.eq(wp.en)]
        for port in rps:
            m.d.comb += [port.addr.eq(self.r.rd_addr), port.en.eq(self.r.rd_en)]
        m.d.comb += self.r.rd_data.eq(Cat(*(port.data for port in rps)))

        valid, done, bad = Signal(Q), Signal(Q), Signal(Q)
        seqs = Signal(data.ArrayLayout(32, Q))
        counts = Signal(data.ArrayLayout(16, Q))
        filled = Signal(data.ArrayLayout(range(MB + 1), Q))
        m.d.comb += [self.r.valid.eq(valid), self.r.done.eq(done), self.r.bad.eq(bad), self.r.seq.eq(seqs),
                     self.r.count.eq(counts), self.r.filled.eq(filled)]

        write = self.i.valid & self.i.ready
        first = self.i.payload.first
        if self._early:
            # The first beat's slot, one-hot, its number and its address, each loaded every cycle from
            # ``i_seq`` (unchanged since the cycle before a first beat is offered: ``early_seq``); the
            # slot being written, one-hot, and the next beat's address, loaded at each write.
            seq_slot = self.i_seq[:bits] if bits else Const(0, 1)
            new_slot = Signal(max(bits, 1), name="pre_slot")
            new_1h = Signal(Q, name="pre_onehot")
            new_addr = Signal(range(depth), name="pre_addr")
            m.d.sync += [new_slot.eq(seq_slot), new_1h.eq(1 << seq_slot), new_addr.eq(seq_slot * MB)]
            w_1h = Signal(Q, name="wslot_onehot")
            waddr = Signal(range(depth + 1), name="waddr")
            m.d.comb += wp.addr.eq(Mux(first, new_addr, waddr))
            with m.If(write):
                m.d.sync += waddr.eq(wp.addr + 1)
                with m.If(first):
                    m.d.sync += w_1h.eq(new_1h)
            first_at = [new_1h[k] for k in range(Q)]
            here_at = [Mux(first, new_1h[k], w_1h[k]) for k in range(Q)]
            taken = (valid & new_1h).any()
            early_error = seq_slot != new_slot   # i_seq not shown the cycle before
        else:
            new_slot = self.i_seq[:bits] if bits else 0
            wslot = Signal(max(bits, 1))      # the slot of the frame being written
            slot = Signal(max(bits, 1))
            with m.If(first):
                m.d.comb += slot.eq(new_slot)
            with m.Else():
                m.d.comb += slot.eq(wslot)
            with m.If(write & first):
                m.d.sync += wslot.eq(new_slot)
            fill_arr = Array(filled[k] for k in range(Q))
            m.d.comb += wp.addr.eq(slot * MB + fill_arr[slot] if bits else fill_arr[slot])
            # A first beat writes slot new_slot, the others wslot: decoded apart (timing: the header's
            # slot is not muxed with wslot in front of the first-beat enables).
            first_at = [new_slot == k for k in range(Q)]
            here_at = [(first & (new_slot == k)) | (~first & (wslot == k)) for k in range(Q)]
            taken = (valid >> new_slot)[0]   # only a first beat can find its slot taken
            early_error = Const(0, 1)
        if self._checked:
            # The writer offers a first beat only once it has seen the slot free (``r.valid``, a cycle
            # before: only its own first beats fill a slot): ready never depends on the slot (timing).
            m.d.comb += self.i.ready.eq(1)
        else:
            m.d.comb += self.i.ready.eq(~first | ~taken)
        m.d.comb += self.collisions.eq(self.i.valid & first & (taken | early_error))
        m.d.comb += [wp.data.eq(self.i.payload.data), wp.en.eq(write)]
        for k in range(Q):
            first_here = first & first_at[k]
            here = here_at[k]
            with m.If(self.r.free & (self.r.free_slot == k)):
                m.d.sync += [valid[k].eq(0), done[k].eq(0), bad[k].eq(0), filled[k].eq(0)]
            with m.Elif(write & here):
                m.d.sync += filled[k].eq(Mux(first, 1, filled[k] + 1))
                with m.If(self.i.payload.last):
                    m.d.sync += [done[k].eq(1), bad[k].eq(self.i.payload.bad)]
                with m.Elif(first):
                    # A slot is free here (done low) unless a frame's tail was ever written without its
                    # first beat; the new frame starts clean either way.
                    m.d.sync += [done[k].eq(0), bad[k].eq(0)]
            with m.If(write & first_here):
                m.d.sync += [seqs[k].eq(self.i_seq), counts[k].eq(self.i_count)]
                with m.If(~(self.r.free & (self.r.free_slot == k))):
                    m.d.sync += valid[k].eq(1)
        # The frame whose first beat was written at the last edge (the slot it made valid): its seq, count.
        new, new_seq, new_count = Signal(name="new"), Signal(32, name="new_seq"), Signal(16, name="new_count")
        m.d.sync += new.eq(write & self.i.payload.first & ~(self.r.free & (self.r.free_slot == new_slot)))
        with m.If(write & self.i.payload.first):
            m.d.sync += [new_seq.eq(self.i_seq), new_count.eq(self.i_count)]
        m.d.comb += [self.r.new.eq(new), self.r.new_seq.eq(new_seq), self.r.new_count.eq(new_count)]
        return m

