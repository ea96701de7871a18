"""The local buffer's bookkeeping: which slots hold a pushed chunk, and its element count.

At ranks > 0 each HOST_PUSH chunk ``seq`` is written to slot ``seq % slots`` of the
:class:`~wirereduce.hdl.core.reduce.ReducePipeline`'s buffer; the REDUCE frame of the same
``seq`` waits until its slot holds that chunk, and the pipeline's last read of it frees the slot.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Signal

__all__ = ["LocalSlots"]


class LocalSlots:
    """Slot ``k`` of ``valid`` is high while slot ``k`` holds a pushed chunk of ``count[k]`` elements;
    ``bad[k]`` if that chunk was lost (its HOST_PUSH arrived marked ``bad``, or a LOST placeholder
    stands for it): the REDUCE frame added to it then leaves marked ``bad``."""

    def __init__(self, slots: int):
        self.bits = (slots - 1).bit_length()
        self.valid = Signal(slots, name="slot_valid")
        self.bad = Signal(slots, name="slot_bad")
        self.count = Array(Signal(16, name=f"slot_count{k}") for k in range(slots))

    def of(self, seq):
        """The slot of chunk ``seq``."""
        return seq[:self.bits] if self.bits else Const(0, 1)

    def holds(self, slot):
        """High while ``slot`` holds a chunk."""
        return (self.valid >> slot)[0]

    def is_bad(self, slot):
        """High while ``slot`` holds a lost chunk."""
        return (self.bad >> slot)[0]

    def write(self, m: Module, pipe, push, rank_first, beat_bits: int):
        """Write the beats of HOST_PUSH stream ``push`` (a gated beat stream) to the buffer of
        ``pipe`` at ranks > 0 (``rank_first`` low); returns ``(filled, slot, count)``: a chunk
        has been written whole to ``slot`` in this cycle, with ``count`` elements, and ``bad``
        (its last beat was marked bad: the slot then holds a lost chunk)."""
        beat = push.payload
        slot = self.of(beat.hdr.seq)
        m.d.comb += [
            pipe.wr_addr.eq(Cat(beat.index[:beat_bits], slot) if self.bits else beat.index[:beat_bits]),
            pipe.wr_data.eq(beat.data),
            pipe.wr_en.eq(push.valid & push.ready & ~rank_first),
        ]
        filled = push.valid & push.ready & ~rank_first & beat.last
        return filled, slot, beat.hdr.count, beat.bad

    def update(self, m: Module, filled, slot, count, bad, release, release_slot):
        """A push fills a slot (:meth:`write`); the reduce pipeline's last read frees it."""
        for k in range(len(self.valid)):
            with m.If(filled & (slot == k)):
                m.d.sync += [self.valid[k].eq(1), self.count[k].eq(count), self.bad[k].eq(bad)]
            with m.Elif(release & (release_slot == k)):
                m.d.sync += self.valid[k].eq(0)
