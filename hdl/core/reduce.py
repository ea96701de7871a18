"""The reduce pipeline: local chunk buffer, fp32 adder lanes and header rewrite.

A frame from a :class:`~wirereduce.hdl.stream.frame.FrameGate` enters beat by beat. Each beat reads
the beat of the same index from the local chunk buffer (the host's chunk with the frame's
sequence number, stored in the same beat layout as it arrived), the adder lanes add the two
lane by lane, and the frame leaves with its header rewritten (``src`` = this node, ``hop`` + 1,
``opcode`` as the node says). Beats flow through without waiting for the end of the frame:
this is the cut-through reduce of NTT's ring (docs/background.md "NTT ring").

Element order is fixed by the frame: the sum that leaves is ``incoming + local`` in fp32,
which is what the golden model (:func:`wirereduce.sim.golden.ring_allreduce`) computes.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.arith.fp32 import AdderLanes, latency
from wirereduce.hdl.stream.frame import gated_layout, tagged_layout

from wirereduce.config import check_width, deep_lanes
from wirereduce.protocol import HEADER_BYTES

__all__ = ["ReducePipeline", "reduce_input_layout"]

#: fp32 words the header occupies at the start of a frame; those lanes are never added.
HEADER_WORDS = HEADER_BYTES // 4


def reduce_input_layout(width: int, index_bits: int) -> data.StructLayout:
    """A gated beat plus ``add``: 1 to add the local chunk, 0 to pass the beat through unchanged."""
    fields = dict(gated_layout(width, index_bits).members)
    fields["add"] = 1
    return data.StructLayout(fields)


class ReducePipeline(wiring.Component):
    """Adds the local chunk to passing frames at one beat per cycle.

    Parameters
    ----------
    width : int
        Datapath width in bits; ``width // 32`` fp32 lanes are added per cycle.
    index_bits : int
        Width of the beat index of the input (see :class:`~wirereduce.hdl.stream.frame.FrameGate`).
    slots : int
        Chunks the local buffer holds (a power of two). Chunk ``seq`` lives in slot
        ``seq % slots``.
    slot_beats : int
        Beats a slot holds (a power of two ≥ the longest frame in beats).

    Attributes
    ----------
    i : In(stream.Signature(reduce_input_layout(width, index_bits)))
    o : Out(stream.Signature(tagged_layout(width)))
    wr_addr, wr_data, wr_en : In
        Write port of the local buffer: address ``slot * slot_beats + index``, one beat.
    rank : In(8)
        Written to the ``src`` field of each frame that leaves.
    opcode : In(8)
        Written to the ``opcode`` field of each frame that leaves.
    release, release_slot : Out
        ``release`` pulses for one cycle when the last beat of an added frame has been read
        from slot ``release_slot``, which the host may then refill.
    busy : Out(1)
        A beat is in the pipeline.

    Latency is :attr:`latency` cycles from input beat to output beat: one buffer-read stage and the
    adder lanes, whose depth follows the width (:func:`~wirereduce.config.deep_lanes`): 1 + 6 = 7
    below 512 bit (:attr:`LATENCY`), 1 + 7 = 8 from 512 bit up (the lanes pipelined to ≤ 5 LUT
    levels for 322.27 MHz, docs/architecture.md "Timing budgets").

    Raises
    ------
    ValueError
        If ``slots`` or ``slot_beats`` is not a power of two.
    """

    LATENCY = 1 + AdderLanes.LATENCY

    def __init__(self, width: int, index_bits: int, slots: int, slot_beats: int):
        self._width = check_width(width)
        self._deep = deep_lanes(width)
        self.latency = 1 + latency(self._deep)
        for name, v in (("slots", slots), ("slot_beats", slot_beats)):
            if not isinstance(v, int) or v < 1 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two, not {v!r}")
        self._slots = slots
        self._slot_beats = slot_beats
        self._index_bits = index_bits
        depth = slots * slot_beats
        super().__init__({
            "i": In(stream.Signature(reduce_input_layout(width, index_bits))),
            "o": Out(stream.Signature(tagged_layout(width))),
            "wr_addr": In(range(depth)),
            "wr_data": In(width),
            "wr_en": In(1),
            "rank": In(8),
            "opcode": In(8),
            "release": Out(1),
            "release_slot": Out(range(slots)),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        w = self._width
        lanes = w // 32
        slot_bits = (self._slots - 1).bit_length()
        beat_bits = (self._slot_beats - 1).bit_length()

        m.submodules.buf = buf = memory.Memory(shape=w, depth=self._slots * self._slot_beats, init=[])
        rd = buf.read_port()
        wp = buf.write_port()
        m.d.comb += [wp.addr.eq(self.wr_addr), wp.data.eq(self.wr_data), wp.en.eq(self.wr_en)]

        m.submodules.adder = adder = AdderLanes(lanes, deep=self._deep)

        # The whole pipeline advances together; it stalls only when its output is held.
        en = Signal()
        out_valid = Signal()
        m.d.comb += en.eq(~out_valid | self.o.ready)

        beat = self.i.payload
        slot = beat.hdr.seq[:slot_bits] if slot_bits else 0
        addr = Cat(beat.index[:beat_bits], slot) if slot_bits else beat.index[:beat_bits]
        m.d.comb += [rd.addr.eq(addr), rd.en.eq(en), self.i.ready.eq(en)]

        # Which lanes of this beat carry elements to add: not header words, inside ``keep``.
        mask = Signal(lanes)
        for j in range(lanes):
            word = beat.index * lanes + j
            m.d.comb += mask[j].eq(beat.add & (word >= HEADER_WORDS) & beat.keep[4 * j])

        m.d.comb += [
            self.release.eq(self.i.valid & self.i.ready & beat.add & beat.last),
            self.release_slot.eq(slot),
        ]

        # Stage 1: the buffer read completes; the adder lanes start.
        meta = data.StructLayout({
            "valid": 1, "data": w, "keep": w // 8, "last": 1, "bad": 1, "first": 1, "mask": lanes,
        })
        s1 = Signal(meta)
        with m.If(en):
            m.d.sync += [
                s1.valid.eq(self.i.valid), s1.data.eq(beat.data), s1.keep.eq(beat.keep),
                s1.last.eq(beat.last), s1.bad.eq(beat.bad), s1.first.eq(beat.first), s1.mask.eq(mask),
            ]
        m.d.comb += [adder.a.eq(s1.data), adder.b.eq(rd.data), adder.en.eq(en)]

        # Beat metadata travels beside the adder lanes.
        stage = s1
        stages_valid = [s1.valid]
        for k in range(adder.latency):
            nxt = Signal(meta, name=f"d{k + 2}")
            with m.If(en):
                m.d.sync += nxt.eq(stage)
            stage = nxt
            stages_valid.append(stage.valid)
        m.d.comb += out_valid.eq(stage.valid)
        m.d.comb += self.busy.eq(Cat(*stages_valid).any())

        # Output: the sum in added lanes, the beat itself elsewhere; header rewritten.
        out = Signal(w)
        for j in range(lanes):
            lane = slice(32 * j, 32 * j + 32)
            m.d.comb += out[lane].eq(Mux(stage.mask[j], adder.s[lane], stage.data[lane]))
        with m.If(stage.first):
            # Bytes 1 (opcode), 5 (src) and 6 (hop) of the header: always in beat 0 (width ≥ 64).
            m.d.comb += [
                out[8:16].eq(self.opcode),
                out[40:48].eq(self.rank),
                out[48:56].eq(stage.data[48:56] + 1),
            ]
        m.d.comb += [
            self.o.valid.eq(out_valid),
            self.o.payload.data.eq(out),
            self.o.payload.keep.eq(stage.keep),
            self.o.payload.last.eq(stage.last),
            self.o.payload.bad.eq(stage.bad),
            self.o.payload.first.eq(stage.first),
        ]
        return m
