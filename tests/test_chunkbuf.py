"""Block tests of the engine's chunk-addressed reduce buffer (``hdl/core/chunkbuf.py``) in amaranth.sim."""

from __future__ import annotations

from amaranth_harness import simulate
from wirereduce.hdl.core.chunkbuf import ChunkBuffer

W, Q, MB = 64, 4, 6


def _offer(ctx, b, k, words, bad):
    """Offer beat ``k`` of a frame of ``words`` (valid, data, first, last, bad on the last, all lanes kept)."""
    ctx.set(b.i.valid, 1)
    ctx.set(b.i.payload.data, words[k])
    ctx.set(b.i.payload.first, k == 0)
    ctx.set(b.i.payload.last, k == len(words) - 1)
    ctx.set(b.i.payload.bad, bad and k == len(words) - 1)
    ctx.set(b.i.payload.keep, 0xFF)


async def _write(ctx, b, seq, words, bad=False):
    """One frame of chunk ``seq``: ``words`` beats; returns the cycles it waited on its first beat."""
    waited = 0
    for k in range(len(words)):
        _offer(ctx, b, k, words, bad)
        ctx.set(b.i_seq, seq)
        ctx.set(b.i_count, 10 + seq)
        while not ctx.get(b.i.ready):
            waited += 1
            await ctx.tick()
        await ctx.tick()
    ctx.set(b.i.valid, 0)
    return waited


async def _read(ctx, b, slot, beats):
    out = []
    for k in range(beats):
        ctx.set(b.r.rd_addr, slot * MB + k)
        ctx.set(b.r.rd_en, 1)
        await ctx.tick()
        out.append(ctx.get(b.r.rd_data))
    ctx.set(b.r.rd_en, 0)
    return out


async def _free(ctx, b, slot):
    ctx.set(b.r.free, 1)
    ctx.set(b.r.free_slot, slot)
    await ctx.tick()
    ctx.set(b.r.free, 0)


def test_frames_land_in_their_chunks_slot_and_read_back():
    b = ChunkBuffer(W, Q, MB)
    seen = {}

    async def tb(ctx):
        # chunks 6 and 3 arrive in that order; each lands in slot g mod Q, readable in any order
        await _write(ctx, b, 6, [0x600 + k for k in range(3)])
        await _write(ctx, b, 3, [0x300 + k for k in range(5)], bad=True)
        assert ctx.get(b.r.valid) == (1 << 2) | (1 << 3)
        assert ctx.get(b.r.done) == (1 << 2) | (1 << 3)
        assert ctx.get(b.r.bad) == 1 << 3
        assert ctx.get(b.r.seq[2]) == 6 and ctx.get(b.r.seq[3]) == 3
        assert ctx.get(b.r.count[3]) == 13 and ctx.get(b.r.filled[3]) == 5 and ctx.get(b.r.filled[2]) == 3
        seen[3] = await _read(ctx, b, 3, 5)
        seen[2] = await _read(ctx, b, 2, 3)
        await _free(ctx, b, 3)
        assert ctx.get(b.r.valid) == 1 << 2 and ctx.get(b.r.filled[3]) == 0 and ctx.get(b.r.done) == 1 << 2

    simulate(b, [tb])
    assert seen[3] == [0x300 + k for k in range(5)]
    assert seen[2] == [0x600 + k for k in range(3)]


def test_a_taken_slot_holds_the_next_frame_until_freed():
    b = ChunkBuffer(W, Q, MB)
    log = {}

    async def writer(ctx):
        await _write(ctx, b, 1, [0x100, 0x101])
        log["waited"] = await _write(ctx, b, 1 + Q, [0x500, 0x501])   # same slot: must wait for the free
        log["after"] = await _read(ctx, b, 1, 2)

    async def reader(ctx):
        for _ in range(10):
            await ctx.tick()
        log["collisions"] = ctx.get(b.collisions)
        log["before"] = await _read(ctx, b, 1, 2)
        await _free(ctx, b, 1)

    simulate(b, [writer, reader])
    assert log["before"] == [0x100, 0x101]     # the waiting frame never overwrote the first one
    assert log["waited"] >= 8 and log["collisions"] == 1
    assert log["after"] == [0x500, 0x501]


def test_partly_written_frame_is_readable_cut_through():
    b = ChunkBuffer(W, Q, MB)
    log = {}

    async def tb(ctx):
        for k in range(2):   # the first two beats of a four-beat frame of chunk 2
            ctx.set(b.i.valid, 1)
            ctx.set(b.i.payload.data, 0x200 + k)
            ctx.set(b.i.payload.first, k == 0)
            ctx.set(b.i.payload.last, 0)
            ctx.set(b.i_seq, 2)
            await ctx.tick()
        ctx.set(b.i.valid, 0)
        log["filled"], log["done"] = ctx.get(b.r.filled[2]), ctx.get(b.r.done)
        log["beats"] = await _read(ctx, b, 2, 2)

    simulate(b, [tb])
    assert log["filled"] == 2 and log["done"] == 0 and log["beats"] == [0x200, 0x201]


def test_a_torn_frame_leaves_no_done_for_the_next():
    """A frame's tail written without its first beat (its first beat lost to a flush) must not make
    the next frame in that slot look whole before its own last beat (``done``, ``bad``)."""
    b = ChunkBuffer(W, Q, MB, checked=True)
    log = {}

    async def tb(ctx):
        # the tail: two non-first beats, the last marked bad; they land in the slot being written (0)
        for k in range(2):
            ctx.set(b.i.valid, 1)
            ctx.set(b.i.payload.first, 0)
            ctx.set(b.i.payload.last, k == 1)
            ctx.set(b.i.payload.bad, k == 1)
            ctx.set(b.i.payload.keep, 0xFF)
            await ctx.tick()
        ctx.set(b.i.valid, 0)
        log["torn"] = (ctx.get(b.r.valid), ctx.get(b.r.done), ctx.get(b.r.bad))
        # the next frame for slot 0: after its first beat it is in, not done, not bad
        ctx.set(b.i.valid, 1)
        ctx.set(b.i.payload.first, 1)
        ctx.set(b.i.payload.last, 0)
        ctx.set(b.i.payload.bad, 0)
        ctx.set(b.i_seq, 4)
        await ctx.tick()
        ctx.set(b.i.valid, 0)
        log["first"] = (ctx.get(b.r.valid) & 1, ctx.get(b.r.done) & 1, ctx.get(b.r.bad) & 1)

    simulate(b, [tb])
    assert log["torn"] == (0, 1, 1)   # the tail leaves its marks (no first beat: not valid)
    assert log["first"] == (1, 0, 0)


async def _write_early(ctx, b, seq, words, bad=False, show=1):
    """One frame of chunk ``seq`` as the engine's gates write it with ``early_seq``: ``i_seq`` shown
    ``show`` cycles before the first beat is offered; beats back to back, and beats with gaps."""
    ctx.set(b.i.valid, 0)
    ctx.set(b.i_seq, seq)
    ctx.set(b.i_count, 10 + seq)
    for _ in range(show):
        await ctx.tick()
    hits = 0
    for k in range(len(words)):
        _offer(ctx, b, k, words, bad)
        hits += ctx.get(b.collisions)
        await ctx.tick()
        if k == 1:      # a gap between beats: the slot and the next address are held
            ctx.set(b.i.valid, 0)
            await ctx.tick()
    ctx.set(b.i.valid, 0)
    return hits


def test_early_seq_frames_land_in_their_slots_like_the_decoded_buffer():
    """``early_seq`` (the engine's gates): the first beat's slot and address from registers loaded from
    ``i_seq`` the cycle before. Frames of chunks in any order land where the decoded buffer puts them,
    flags, header fields and data alike; ``collisions`` stays low."""

    def run(early):
        b = ChunkBuffer(W, Q, MB, checked=True, early_seq=early)
        out = {}

        async def tb(ctx):
            hits = 0
            for seq, n in ((6, 3), (3, 5), (0, 1), (5, 6)):
                hits += await _write_early(ctx, b, seq, [(seq << 8) + k for k in range(n)], bad=seq == 3)
            out["flags"] = (ctx.get(b.r.valid), ctx.get(b.r.done), ctx.get(b.r.bad),
                            [ctx.get(b.r.seq[k]) for k in range(Q)], [ctx.get(b.r.count[k]) for k in range(Q)],
                            [ctx.get(b.r.filled[k]) for k in range(Q)])
            out["data"] = {slot: await _read(ctx, b, slot, n) for slot, n in ((2, 3), (3, 5), (0, 1), (1, 6))}
            await _free(ctx, b, 2)
            # the freed slot takes a new chunk, written at the slot's first beat again
            hits += await _write_early(ctx, b, 10, [0xA00, 0xA01, 0xA02, 0xA03])
            out["again"] = await _read(ctx, b, 2, 4)
            out["hits"] = hits

        simulate(b, [tb])
        return out

    early, decoded = run(True), run(False)
    assert early == decoded
    assert early["flags"][0] == 0b1111 and early["flags"][2] == 1 << 3 and early["flags"][5] == [1, 6, 3, 5]
    assert early["data"][1] == [0x500 + k for k in range(6)] and early["again"] == [0xA00 + k for k in range(4)]
    assert early["hits"] == 0


def test_early_seq_first_beat_of_a_late_seq_pulses_collisions():
    """A first beat whose ``i_seq`` was not shown the cycle before breaks ``early_seq``'s contract: it
    pulses ``collisions`` (the registered slot is the old one)."""
    b = ChunkBuffer(W, Q, MB, checked=True, early_seq=True)
    log = {}

    async def tb(ctx):
        log["ok"] = await _write_early(ctx, b, 1, [0x100, 0x101, 0x102])
        log["late"] = await _write_early(ctx, b, 2, [0x200, 0x201, 0x202], show=0)

    simulate(b, [tb])
    assert log == {"ok": 0, "late": 1}


def test_early_seq_first_beat_after_a_torn_tail_is_beat_zero():
    """After a tail written without its first beat, the next frame's first beat is still written at its
    slot's beat 0 (the decoded buffer wrote it at the torn tail's count, where no reader looks)."""
    b = ChunkBuffer(W, Q, MB, checked=True, early_seq=True)
    log = {}

    async def tb(ctx):
        for k in range(2):    # a torn tail into slot 0
            ctx.set(b.i.valid, 1)
            ctx.set(b.i.payload.data, 0xEE0 + k)
            ctx.set(b.i.payload.first, 0)
            ctx.set(b.i.payload.last, k == 1)
            await ctx.tick()
        await _write_early(ctx, b, 4, [0x400, 0x401, 0x402])
        log["beats"] = await _read(ctx, b, 0, 3)

    simulate(b, [tb])
    assert log["beats"] == [0x400, 0x401, 0x402]


def test_early_seq_needs_checked():
    import pytest

    with pytest.raises(ValueError, match="early_seq needs checked=True"):
        ChunkBuffer(W, Q, MB, early_seq=True)
