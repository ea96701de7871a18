"""Hostile and malformed frames on a schedule engine's network ports (amaranth.sim): a frame is
checked against its header fields, the collective, the table and its own length before any beat of
it is summed; the good frame after it sums exactly (docs/protocol.md "Drop rules")."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth_harness import simulate
from helpers import no_frame, recv, send, stats
from wirereduce.hdl.core.engine import Engine
from wirereduce.host.driver import parse_stats

from wirereduce.codec import decode, encode
from wirereduce.config import EngineConfig
from wirereduce.protocol import Codec, Flag, Header, Opcode, frame
from wirereduce.table import LOCAL, EngineEntry, encode_entry

COLL, RANK = 9, 2
LOCAL_CHUNKS = [np.array([1.0, -2.5, 1e-45], np.float32), np.array([0.25, 7.0, -1.0], np.float32)]
CHILD = [np.array([3.0, 0.5, 1e-45], np.float32), np.array([-1.0, 2.0, 3.0], np.float32)]
RESULT = [np.array([9.0, -8.0, 0.5], np.float32), np.array([1.5, 2.5, -3.5], np.float32)]


def reduce_hdr(seq=0, **kw):
    return Header(opcode=Opcode.REDUCE, collective=COLL, seq=seq, count=3, src=1, hop=0).replace(**kw)


def bcast_hdr(seq=0, **kw):
    return Header(opcode=Opcode.BROADCAST, collective=COLL, seq=seq, count=3, src=3, hop=0).replace(**kw)


def run_engine(testbench, chunks=2, local=LOCAL_CHUNKS, k=None, entries=None, width=64):
    """One engine at rank RANK of one flow: its unit sums the child's frame (port 0) then the local
    chunk and sends the partial sum to the parent on port 1; the result comes back on port 1 and is
    forwarded on port 0 and delivered to the host. The host pushes ``local`` first (None: the
    testbench pushes). ``k``: an engine built with the codec runs a collective compressed with
    error bound 2^-k (the pushes compressed). ``entries``: another table (EngineEntry list, one per
    flow). ``width``: the engine's datapath width (64, or 512 with fp32 lanes only: there a frame of
    three elements is one beat)."""
    formats = {} if width == 64 else {"formats": ("fp32",)}
    dut = Engine(EngineConfig(width, 1500, slots=4, ports=2, max_flows=8, codec=k is not None, **formats))
    entries = entries or [EngineEntry(1, (0, LOCAL), 0, 1, 0b01, True)]
    entry = b"".join(encode_entry(e).to_bytes(8, "little") for e in entries)
    codec = {} if k is None else {"codec": Codec.INCEPTIONN_V1, "eb_k": k}

    async def tb(ctx):
        await send(ctx, dut.host_rx, Header(opcode=Opcode.SCHEDULE, seq=0, count=2 * len(entries)).pack() + entry)
        st = parse_stats((await recv(ctx, dut.host_tx))[0])
        assert st["drop_count"] == 0 and st["control_refused"] == 0, st
        await send(ctx, dut.host_rx, Header(opcode=Opcode.CONTROL, collective=COLL, src=RANK, hop=len(entries),
                                            seq=chunks, **codec).pack())
        assert parse_stats((await recv(ctx, dut.host_tx))[0])["control_refused"] == 0
        if local is not None:
            for g in range(chunks):
                await send(ctx, dut.host_rx, push_frame(g, local[g], k))
        await testbench(ctx, dut)

    simulate(dut, [tb])


def push_frame(g, values, k=None, flows=1):
    """HOST_PUSH of chunk ``g`` (compressed with error bound 2^-k where ``k`` is given)."""
    hdr = Header(opcode=Opcode.HOST_PUSH, collective=COLL, seq=g, hop=g % flows, count=3)
    if k is None:
        return frame(hdr, values)
    return frame(hdr.replace(codec=Codec.INCEPTIONN_V1, eb_k=k), encode(np.asarray(values, np.float32), k))


def words(a):
    return np.asarray(a, np.float32).view(np.uint32).tolist()


def check_partial(data, seq):
    h = Header.unpack(data)
    assert (h.opcode, h.seq, h.hop, h.count, h.flags, h.src) == (Opcode.REDUCE, seq, 0, 3, 0, RANK), h
    want = (CHILD[seq] + LOCAL_CHUNKS[seq]).astype(np.float32)   # the table's order: child, then local
    assert words(np.frombuffer(data[16:], "<f4")) == words(want)


GOOD0 = frame(reduce_hdr(0), CHILD[0])

CASES = {
    # Frames for chunk 0, each wrong in one way: (bytes, network port it arrives on, counter). Port 0
    # faces the flow's child (REDUCE comes in, BROADCAST goes out), port 1 its parent.
    "runt": (GOOD0[:9], 0, "drop_short"),
    "version": (frame(reduce_hdr(0, version=2), CHILD[0]), 0, "drop_version"),
    "host_push_on_network": (frame(reduce_hdr(0, opcode=Opcode.HOST_PUSH), CHILD[0]), 0, "drop_opcode"),
    "control_on_network": (reduce_hdr(0, opcode=Opcode.CONTROL).pack(), 0, "drop_opcode"),
    "broadcast_from_the_child": (frame(bcast_hdr(0), CHILD[0]), 0, "drop_opcode"),
    "reduce_from_the_parent": (GOOD0, 1, "drop_opcode"),
    "collective": (frame(reduce_hdr(0, collective=COLL + 1), CHILD[0]), 0, "drop_collective"),
    "flags": (frame(reduce_hdr(0, flags=0x80), CHILD[0]), 0, "drop_flags"),
    "abort_flag": (frame(reduce_hdr(0, flags=Flag.ABORT), CHILD[0]), 0, "drop_flags"),
    "dtype": (frame(reduce_hdr(0, dtype=7), CHILD[0]), 0, "drop_dtype"),
    "codec": (frame(reduce_hdr(0, codec=Codec.INCEPTIONN_V1, eb_k=10), CHILD[0]), 0, "drop_codec"),
    "seq_past_chunks": (frame(reduce_hdr(5), CHILD[0]), 0, "drop_seq"),
    "flow_not_loaded": (frame(reduce_hdr(0, hop=3), CHILD[0]), 0, "drop_count"),
    "count_zero": (reduce_hdr(0, count=0).pack(), 0, "drop_count"),
    "count_too_large": (frame(reduce_hdr(0, count=400), np.zeros(400, np.float32)), 0, "drop_count"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_frame_dropped_whole_then_good_one_sums_exactly(case):
    """Each malformed or misrouted frame is dropped whole and counted once; the child's good frame
    after it is summed exactly, and no beat of the bad one reaches an output or the host."""
    data, port, counter = CASES[case]
    seen = {}

    async def tb(ctx, dut):
        await send(ctx, getattr(dut, f"net{port}_in"), data)
        await send(ctx, dut.net0_in, GOOD0)
        seen["out"] = await recv(ctx, dut.net1_out)
        seen["quiet_child"] = await no_frame(ctx, dut.net0_out, 100)
        seen["stats"] = await stats(ctx, dut)

    run_engine(tb)
    out, bad_out = seen["out"]
    assert not bad_out
    check_partial(out, 0)
    assert seen["quiet_child"], "a frame went out towards the child"
    st = seen["stats"]
    drops = {k: v for k, v in st.items() if k.startswith("drop_") and v}
    assert drops == {counter: 1}, (case, drops)
    assert st["reduce_frames"] == 1 and st["broadcast_frames"] == 0 and st["result_frames"] == 0


def test_forged_broadcast_from_the_child_never_reaches_the_host():
    """A BROADCAST of chunk 0 that arrives from the child (the port the result is sent on, not the
    one it comes from) is dropped: the host gets chunk 0's result once, the parent's, bit for bit,
    and the child gets it forwarded."""
    seen = {}
    forged = frame(bcast_hdr(0), np.full(3, 666.0, np.float32))

    async def tb(ctx, dut):
        await send(ctx, dut.net0_in, forged)
        await send(ctx, dut.net0_in, GOOD0)
        seen["partial"] = await recv(ctx, dut.net1_out)
        await send(ctx, dut.net1_in, frame(bcast_hdr(0), RESULT[0]))
        seen["host"] = await recv(ctx, dut.host_tx)
        seen["child"] = await recv(ctx, dut.net0_out)
        seen["no_more"] = await no_frame(ctx, dut.host_tx, 100)
        seen["stats"] = await stats(ctx, dut)

    run_engine(tb)
    check_partial(seen["partial"][0], 0)
    for key, opcode in (("host", Opcode.HOST_RESULT), ("child", Opcode.BROADCAST)):
        data, bad = seen[key]
        h = Header.unpack(data)
        assert not bad and (h.opcode, h.seq, h.hop, h.count) == (opcode, 0, 0, 3), (key, h)
        assert words(np.frombuffer(data[16:], "<f4")) == words(RESULT[0]), key
    assert seen["no_more"]
    st = seen["stats"]
    assert st["drop_opcode"] == 1 and st["broadcast_frames"] == 1 and st["result_frames"] == 1, st


def test_result_only_for_a_partial_sum_out():
    """A BROADCAST is taken only for a chunk whose partial sum this node has sent and whose result
    has not come yet: one before the partial sum (early) and a second one (a replay with other
    values) are dropped and counted in ``drop_seq``; the host gets chunk 0's genuine result once."""
    seen = {}
    other = frame(bcast_hdr(0), np.full(3, 666.0, np.float32))

    async def tb(ctx, dut):
        await send(ctx, dut.net1_in, other)                       # early: no partial sum out yet
        seen["early"] = await no_frame(ctx, dut.host_tx, 150)
        await send(ctx, dut.net0_in, GOOD0)
        seen["partial"] = await recv(ctx, dut.net1_out)
        await send(ctx, dut.net1_in, frame(bcast_hdr(0), RESULT[0]))
        seen["host"] = await recv(ctx, dut.host_tx)
        seen["child"] = await recv(ctx, dut.net0_out)
        await send(ctx, dut.net1_in, other)                       # a second result for chunk 0
        seen["again"] = await no_frame(ctx, dut.host_tx, 150)
        seen["stats"] = await stats(ctx, dut)

    run_engine(tb)
    assert seen["early"] and seen["again"]
    check_partial(seen["partial"][0], 0)
    for key in ("host", "child"):
        data, bad = seen[key]
        assert not bad and Header.unpack(data).seq == 0
        assert words(np.frombuffer(data[16:], "<f4")) == words(RESULT[0]), key
    st = seen["stats"]
    drops = {k: v for k, v in st.items() if k.startswith("drop_") and v}
    assert drops == {"drop_seq": 2} and st["broadcast_frames"] == 1 and st["result_frames"] == 1, st


def test_replayed_reduce_dropped_and_the_collective_goes_on():
    """A child's REDUCE sent again after its chunk was summed (a replay) would take the chunk's
    reduce-buffer slot and hold it: chunk g + 2S, which needs that slot, would wait at the gate for
    ever. The gate drops it (``drop_seq``), and also a copy that arrives while the first copy still
    waits in its slot for the local chunk; every partial sum of ten chunks (slots 4: 2S = 8) comes
    out once, bit for bit."""
    chunks = 10
    rng = np.random.default_rng(7)
    local = [rng.standard_normal(3).astype(np.float32) for _ in range(chunks)]
    child = [rng.standard_normal(3).astype(np.float32) for _ in range(chunks)]
    seen = {"partials": []}

    def child_frame(g):
        return frame(reduce_hdr(g), child[g])

    async def tb(ctx, dut):
        for g in range(chunks - 1):
            await send(ctx, dut.host_rx, push_frame(g, local[g]))
            await send(ctx, dut.net0_in, child_frame(g))
            seen["partials"].append(await recv(ctx, dut.net1_out))
            if g == 0:
                await send(ctx, dut.net0_in, child_frame(0))      # replay of a summed chunk (slot 0)
        # chunk 9: its frame waits in slot 1 for the local chunk; a second copy arrives behind it
        last = chunks - 1
        await send(ctx, dut.net0_in, child_frame(last))
        await send(ctx, dut.net0_in, child_frame(last))
        await send(ctx, dut.host_rx, push_frame(last, local[last]))
        seen["partials"].append(await recv(ctx, dut.net1_out))
        seen["no_more"] = await no_frame(ctx, dut.net1_out, 300)
        seen["stats"] = await stats(ctx, dut)

    run_engine(tb, chunks, local=None)
    assert len(seen["partials"]) == chunks
    for g, (data, bad) in enumerate(seen["partials"]):
        h = Header.unpack(data)
        assert not bad and (h.opcode, h.seq, h.count) == (Opcode.REDUCE, g, 3), (g, h)
        assert words(np.frombuffer(data[16:], "<f4")) == words((child[g] + local[g]).astype(np.float32)), g
    assert seen["no_more"], "a replayed chunk was summed again"
    st = seen["stats"]
    drops = {k: v for k, v in st.items() if k.startswith("drop_") and v}
    assert drops == {"drop_seq": 2}, drops
    assert st["reduce_frames"] == chunks


def test_reduce_of_another_flows_chunk_dropped():
    """Three flows on one unit (chunk g is flow g mod 3); only flow 0 has a child, on port 0. A
    REDUCE on port 0 for chunk 1 claiming flow 0 (``hop`` 0: port 0 is among flow 0's terms, and
    chunk 1 is one the unit waits for) belongs to no flow that takes a term from port 0. Taken, it
    would sit in the reduce-buffer slot chunk 9 (flow 0, 9 mod 2S = 1) needs, and that chunk's
    frame would wait at the gate for ever. The gate drops it (``drop_seq``: ``hop`` ≠ seq mod F);
    every partial sum of ten chunks comes out, bit for bit."""
    chunks, flows = 10, 3
    entries = [EngineEntry(1, (0, LOCAL), 1, 1, 0b01, True), EngineEntry(1, (LOCAL,), 2, 1, 0, True),
               EngineEntry(1, (LOCAL,), 0, 1, 0, True)]
    rng = np.random.default_rng(11)
    local = [rng.standard_normal(3).astype(np.float32) for _ in range(chunks)]
    child = [rng.standard_normal(3).astype(np.float32) for _ in range(chunks)]
    seen = {"partials": []}

    async def tb(ctx, dut):
        await send(ctx, dut.net0_in, frame(reduce_hdr(1, hop=0), child[1]))   # chunk 1 is flow 1's
        for g in range(chunks):
            await send(ctx, dut.host_rx, push_frame(g, local[g], flows=flows))
            if g % flows == 0:
                await send(ctx, dut.net0_in, frame(reduce_hdr(g, hop=0), child[g]))
            try:
                seen["partials"].append(await recv(ctx, dut.net1_out))
            except TimeoutError:
                raise AssertionError(f"chunk {g}'s partial sum never came (the port stalled)") from None
        seen["stats"] = await stats(ctx, dut)

    run_engine(tb, chunks, local=None, entries=entries)
    for g, (data, bad) in enumerate(seen["partials"]):
        h = Header.unpack(data)
        assert not bad and (h.opcode, h.seq, h.hop) == (Opcode.REDUCE, g, g % flows), (g, h)
        want = (child[g] + local[g]).astype(np.float32) if g % flows == 0 else local[g]
        assert words(np.frombuffer(data[16:], "<f4")) == words(want), g
    drops = {k: v for k, v in seen["stats"].items() if k.startswith("drop_") and v}
    assert drops == {"drop_seq": 1}, drops


@pytest.mark.parametrize("seed", [1, 2])
def test_host_fifo_discards_frames_that_went_bad(seed):
    """The engine's host FIFO (``PacketFifo``) passes good frames whole and in order and reads out
    and discards every frame whose last beat is marked ``bad`` (a result spoilt on a cable after
    the engine started on it cut-through), one ``dropped`` pulse each, under random gaps on its
    input and back-pressure on its output; frames of one beat included."""
    from wirereduce.hdl.core.engine import PacketFifo

    rng = np.random.default_rng(seed)
    w, mb = 64, 6
    dut = PacketFifo(w, 2 * mb, mb)
    frames = []
    for f in range(40):
        n = int(rng.integers(1, mb + 1))
        frames.append(([int(rng.integers(0, 2**63)) | (f << 56) for _ in range(n)], bool(rng.random() < 0.35)))
    frames[-1] = (frames[-1][0], False)
    got, dropped = [], [0]

    async def writer(ctx):
        for beats, bad in frames:
            for k, d in enumerate(beats):
                while rng.random() < 0.3:
                    ctx.set(dut.i.valid, 0)
                    await ctx.tick()
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload, {"data": d, "keep": 0xFF, "last": k == len(beats) - 1,
                                        "bad": bad and k == len(beats) - 1, "first": k == 0})
                await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)

    async def reader(ctx):
        cur = []
        want = sum(1 for _, bad in frames if not bad)
        for _ in range(5000):
            ready = int(rng.random() < 0.6)
            ctx.set(dut.o.ready, ready)
            valid, payload, drop = ctx.get(dut.o.valid), ctx.get(dut.o.payload), ctx.get(dut.dropped)
            dropped[0] += drop
            if valid and ready:
                assert not payload.bad
                cur.append(payload.data)
                if payload.last:
                    got.append(cur)
                    cur = []
            await ctx.tick()
            if len(got) == want and dropped[0] == len(frames) - want:
                break

    simulate(dut, [writer, reader])
    assert got == [beats for beats, bad in frames if not bad]
    assert dropped[0] == sum(bad for _, bad in frames)


def test_count_mismatch_reported_once_and_the_next_chunk_sums():
    """A child's REDUCE for chunk 0 with a well-formed frame but another element count than the local
    chunk's is never joined: counted once in ``drop_count`` however long it waits (the unit reports a
    stuck candidate once), nothing of chunk 0 goes to the parent, and chunk 1 (the unit's lookahead)
    is summed exactly after it."""
    seen = {}
    short = frame(reduce_hdr(0, count=2), CHILD[0][:2])

    async def tb(ctx, dut):
        await send(ctx, dut.net0_in, short)
        seen["quiet"] = await no_frame(ctx, dut.net1_out, 300)
        seen["stats0"] = await stats(ctx, dut)
        await send(ctx, dut.net0_in, frame(reduce_hdr(1), CHILD[1]))
        seen["out"] = await recv(ctx, dut.net1_out)
        seen["stats1"] = await stats(ctx, dut)

    run_engine(tb)
    assert seen["quiet"], "a partial sum of chunk 0 went to the parent"
    for key in ("stats0", "stats1"):
        drops = {k: v for k, v in seen[key].items() if k.startswith("drop_") and v}
        assert drops == {"drop_count": 1}, (key, drops)
    out, bad = seen["out"]
    assert not bad
    check_partial(out, 1)


@pytest.mark.parametrize("opcode", [Opcode.CONTROL, Opcode.SCHEDULE], ids=["control", "schedule"])
def test_stray_command_refused_at_once_while_a_unit_is_held(opcode):
    """A CONTROL (without ABORT) or SCHEDULE that reaches the host port while a collective runs is
    refused and answered at once, even while the engine is not quiet: here a unit is held in the
    middle of its partial sum by a port that takes nothing. Before, the command waited for a quiet
    engine, and the pushes queued behind it at the host port were what a neighbour's gate waited
    for (holding its link, so the unit here stayed busy): the whole network stopped, STATS and
    ABORT included (found by the fuzz suite on a ring:3 biring). The held partial sum then leaves
    exact."""
    seen = {}
    if opcode == Opcode.CONTROL:
        stray = Header(opcode=Opcode.CONTROL, collective=COLL + 100, src=RANK, hop=1, seq=2, count=4242).pack()
    else:
        stray = Header(opcode=Opcode.SCHEDULE, seq=0, count=2, collective=4242).pack() + bytes(8)

    async def tb(ctx, dut):
        await send(ctx, dut.net0_in, GOOD0)       # the unit sums it into net1_out, which takes nothing
        await ctx.tick().repeat(40)
        await send(ctx, dut.host_rx, stray)
        data, _ = await recv(ctx, dut.host_tx, 300)
        seen["answer"] = parse_stats(data)
        seen["partial"] = await recv(ctx, dut.net1_out)
        seen["stats"] = await stats(ctx, dut)

    run_engine(tb)
    assert seen["answer"]["request_tag"] == 4242 and seen["answer"]["control_refused"] == 1, seen["answer"]
    assert seen["answer"]["collective"] == COLL
    data, bad = seen["partial"]
    assert not bad
    check_partial(data, 0)
    st = seen["stats"]
    assert st["control_refused"] == 1 and not any(v for k, v in st.items() if k.startswith("drop_")), st


def test_next_control_waits_for_the_forwards_of_a_finished_collective():
    """A host that has every result sends the next CONTROL (no ABORT) at once, while its engine still
    has results to forward to a child whose link is slow (here: takes nothing until the CONTROL
    is waiting). The engine is no longer running, so the CONTROL waits for a quiet engine; the ports
    go on sending what their output queues hold while it waits (held, the queues never empty and
    the engine never gets quiet: the node and the child that waits for those results stop for
    good). The child gets both results, bit for bit, then the CONTROL is taken and answered."""
    seen = {}

    async def tb(ctx, dut):
        for g in range(2):
            await send(ctx, dut.net0_in, frame(reduce_hdr(g), CHILD[g]))
            seen[f"partial{g}"] = await recv(ctx, dut.net1_out)
        for g in range(2):
            await send(ctx, dut.net1_in, frame(bcast_hdr(g), RESULT[g]))
        seen["host"] = [await recv(ctx, dut.host_tx) for _ in range(2)]
        await send(ctx, dut.host_rx, Header(opcode=Opcode.CONTROL, collective=COLL + 1, src=RANK, hop=1,
                                            seq=2).pack())
        await ctx.tick().repeat(50)
        seen["child"] = [await recv(ctx, dut.net0_out, 400) for _ in range(2)]
        seen["answer"] = parse_stats((await recv(ctx, dut.host_tx, 400))[0])

    run_engine(tb)
    for g in range(2):
        check_partial(seen[f"partial{g}"][0], g)
    for g, ((host, hbad), (child, cbad)) in enumerate(zip(seen["host"], seen["child"])):
        assert not hbad and not cbad
        for data, opcode in ((host, Opcode.HOST_RESULT), (child, Opcode.BROADCAST)):
            h = Header.unpack(data)
            assert (h.opcode, h.seq, h.count) == (opcode, g, 3), h
            assert words(np.frombuffer(data[16:], "<f4")) == words(RESULT[g])
    assert seen["answer"]["control_refused"] == 0 and seen["answer"]["collective"] == COLL + 1, seen["answer"]


def marked_then_good(frames, **engine):
    """The child's frames of chunks 0 and 1 (``frames``) on port 0 of :func:`run_engine` (``engine``:
    its keyword arguments), the first marked ``bad`` on its last beat. Checks that the partial sum of
    chunk 0 leaves marked and chunk 1's unmarked, that both frames were taken as REDUCE frames and no
    drop was counted (the link counted the bad one); returns the two partial sums' bytes."""
    seen = {}

    async def tb(ctx, dut):
        await send(ctx, dut.net0_in, frames[0], bad=True)
        seen["partial0"] = await recv(ctx, dut.net1_out)
        await send(ctx, dut.net0_in, frames[1])
        seen["partial1"] = await recv(ctx, dut.net1_out)
        seen["stats"] = await stats(ctx, dut)

    run_engine(tb, **engine)
    assert [seen[f"partial{g}"][1] for g in range(2)] == [True, False]
    st = seen["stats"]
    assert not any(v for n, v in st.items() if n.startswith("drop_")), st
    assert st["reduce_frames"] == 2, st
    return [seen[f"partial{g}"][0] for g in range(2)]


def test_compressed_frame_marked_bad_is_summed_and_its_sum_marked():
    """On an engine built with the codec, a compressed partial sum that arrives marked ``bad`` (its
    FCS found wrong by a cut-through port after the engine started on it) is taken as an
    uncompressed one would be: decoded, summed, and the partial sum it turns into leaves marked bad
    (so no host ever receives a value of it), with no drop counted (its link counted it). Before,
    the codec stage made it a LOST placeholder, which the engine's gates drop (``drop_flags``), and
    the unit then waited for that chunk until the host gave up. The next chunk sums exactly."""
    k = 10
    def compressed(g):
        return frame(reduce_hdr(g, codec=Codec.INCEPTIONN_V1, eb_k=k), encode(CHILD[g], k))

    partials = marked_then_good([compressed(0), compressed(1)], k=k)
    for g, data in enumerate(partials):
        h = Header.unpack(data)
        assert (h.opcode, h.seq, h.count, h.codec, h.eb_k) == (Opcode.REDUCE, g, 3, Codec.INCEPTIONN_V1, k), h
        terms = [decode(encode(np.asarray(x, np.float32), k), 3, k) for x in (CHILD[g], LOCAL_CHUNKS[g])]
        assert data[16:] == encode((terms[0] + terms[1]).astype(np.float32), k), g   # the table's order


@pytest.mark.parametrize("width", [64, 512])
def test_frame_marked_bad_is_summed_and_its_sum_marked(width):
    """A partial sum that arrives marked ``bad`` on its last beat (a cut-through port found its FCS
    wrong after the engine started on it) is summed, and the partial sum it turns into leaves marked
    bad, with no drop counted (its link counted it); the next chunk's good frame sums exactly and
    leaves unmarked. At 512 bit each frame is one beat, so its first beat is its last: the unit's
    chunk-start path (a one-beat frame's flags picked at the take) decides both."""
    partials = marked_then_good([frame(reduce_hdr(g), CHILD[g]) for g in range(2)], width=width)
    for g, data in enumerate(partials):
        check_partial(data, g)
