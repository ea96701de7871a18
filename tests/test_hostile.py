"""Hostile and malformed frames at one node (amaranth.sim): every frame is checked against its own
length, its header fields and the collective, and a frame spoilt on a cable costs one chunk only
(docs/protocol.md "Drop rules", "Lost chunks")."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth_harness import simulate
from wirereduce.hdl.core.node import Node
from wirereduce.host.driver import parse_stats

from wirereduce.config import NodeConfig
from wirereduce.protocol import Codec, DType, Flag, Header, Opcode, frame

W = 64
B = W // 8
COLL = 9
LOCAL = [np.array([1.0, -2.5, 1e-45], np.float32), np.array([0.25, 7.0, -1.0], np.float32)]
INCOMING = [np.array([3.0, 0.5, 1e-45], np.float32), np.array([-1.0, 2.0, 3.0], np.float32)]


async def send(ctx, port, data: bytes, bad: bool = False, keeps: dict | None = None):
    """One frame on stream ``port``; ``bad`` on its last beat; ``keeps`` overrides beat keeps."""
    p = port.payload
    beats = [data[o:o + B] for o in range(0, len(data), B)] or [b""]
    for j, chunk in enumerate(beats):
        lst = j == len(beats) - 1
        ctx.set(p.data, int.from_bytes(chunk.ljust(B, b"\0"), "little"))
        ctx.set(p.keep, (keeps or {}).get(j, (1 << len(chunk)) - 1))
        ctx.set(p.last, lst)
        ctx.set(p.bad, bad and lst)
        ctx.set(port.valid, 1)
        await ctx.tick().until(port.ready)
    ctx.set(port.valid, 0)
    ctx.set(p.bad, 0)


async def recv(ctx, port, max_cycles=3000) -> tuple[bytes, bool]:
    """One frame from stream ``port``: its bytes and its ``bad`` flag."""
    p = port.payload
    out = b""
    ctx.set(port.ready, 1)
    for _ in range(max_cycles):
        _, _, v, word, kp, lst, bad = await ctx.tick().sample(port.valid, p.data, p.keep, p.last, p.bad)
        if v:
            out += int(word).to_bytes(B, "little")[:bin(kp).count("1")]
            if lst:
                ctx.set(port.ready, 0)
                return out, bool(bad)
    raise TimeoutError(f"no frame for {max_cycles} cycles")


async def recv_both(ctx, a, b, max_cycles=3000):
    """One frame from each of streams ``a`` and ``b`` (a node's fork feeds both in lock-step)."""
    outs = {0: [b"", None], 1: [b"", None]}
    ports = (a, b)
    for port in ports:
        ctx.set(port.ready, 1)
    for _ in range(max_cycles):
        for k, port in enumerate(ports):
            p = port.payload
            if outs[k][1] is not None:
                continue
            v, word, kp, lst, bad = (ctx.get(port.valid), ctx.get(p.data), ctx.get(p.keep), ctx.get(p.last),
                                     ctx.get(p.bad))
            if v:
                outs[k][0] += int(word).to_bytes(B, "little")[:bin(kp).count("1")]
                if lst:
                    outs[k][1] = bool(bad)
        await ctx.tick()  # the beats seen above are taken at this edge
        for k, port in enumerate(ports):
            if outs[k][1] is not None:
                ctx.set(port.ready, 0)
        if all(o[1] is not None for o in outs.values()):
            return (outs[0][0], outs[0][1]), (outs[1][0], outs[1][1])
    raise TimeoutError(f"no frames for {max_cycles} cycles")


async def no_frame(ctx, port, cycles=200) -> bool:
    ctx.set(port.ready, 1)
    for _ in range(cycles):
        _, _, v = await ctx.tick().sample(port.valid)
        if v:
            return False
    return True


async def stats(ctx, dut):
    await send(ctx, dut.host_rx, Header(opcode=Opcode.STATS_REQUEST).pack())
    data, _ = await recv(ctx, dut.host_tx)
    return parse_stats(data)


def run_node(rank: int, nodes: int, testbench, chunks: int = 2, codec: bool = False, push=True, ctl=None):
    """A lone node at ``rank`` of ``nodes``, collective COLL of ``chunks`` chunks, its host's
    chunks LOCAL pushed (ranks > 0) before ``testbench(ctx, dut)`` runs."""
    dut = Node(NodeConfig(W, 1500, slots=2, codec=codec))

    async def tb(ctx):
        await send(ctx, dut.host_rx, ctl or Header(opcode=Opcode.CONTROL, collective=COLL, src=rank, hop=nodes,
                                                     seq=chunks).pack())
        await recv(ctx, dut.host_tx)
        if push and rank > 0:
            for seq in range(chunks):
                await send(ctx, dut.host_rx, frame(Header(opcode=Opcode.HOST_PUSH, collective=COLL, seq=seq,
                                                          count=3), LOCAL[seq]))
        await testbench(ctx, dut)

    simulate(dut, [tb])


def reduce_hdr(seq=0, **kw):
    return Header(opcode=Opcode.REDUCE, collective=COLL, seq=seq, count=3, src=0, hop=1).replace(**kw)


def good_sum(seq):
    return (INCOMING[seq] + LOCAL[seq]).astype(np.float32)


def check_sum(data: bytes, seq: int):
    hdr = Header.unpack(data)
    assert (hdr.opcode, hdr.seq, hdr.count, hdr.flags) == (Opcode.REDUCE, seq, 3, 0)
    got = np.frombuffer(data[16:], "<f4")
    assert got.view(np.uint32).tolist() == good_sum(seq).view(np.uint32).tolist()


GOOD0 = frame(reduce_hdr(0), INCOMING[0])

# Malformed REDUCE frames for chunk 0 whose header is right: (bytes, keeps, counter).
LENGTH_CASES = {
    "header_only": (reduce_hdr(0).pack(), None, "drop_length"),
    "one_byte_short": (GOOD0[:-1], None, "drop_length"),
    "one_element_short": (GOOD0[:-4], None, "drop_length"),
    "one_byte_long": (GOOD0 + b"\x01", None, "drop_length"),
    "one_element_long": (GOOD0 + b"\x00\x00\x80\x3f", None, "drop_length"),
    "over_mtu": (GOOD0 + bytes(range(256)) * 8, None, "drop_oversize"),
    "keep_gap": (GOOD0 + b"\0" * 4, {2: 0b11110111}, "drop_length"),
    "compressed_to_raw_node": (frame(reduce_hdr(0), b"\x55"), None, "drop_length"),
}


@pytest.mark.parametrize("case", list(LENGTH_CASES))
def test_length_mismatch_leaves_marked_bad_counted_then_next_chunk_exact(case):
    """A REDUCE frame whose length disagrees with its count is cut at its expected length (never
    a byte more leaves) and leaves marked bad; the next chunk is summed bit-exact."""
    data, keeps, counter = LENGTH_CASES[case]
    seen = {}

    async def tb(ctx, dut):
        await send(ctx, dut.cw_in, data, keeps=keeps)
        seen["out0"] = await recv(ctx, dut.cw_out)
        await send(ctx, dut.cw_in, frame(reduce_hdr(1), INCOMING[1]))
        seen["out1"] = await recv(ctx, dut.cw_out)
        seen["stats"] = await stats(ctx, dut)

    run_node(1, 3, tb)
    out0, bad0 = seen["out0"]
    assert bad0, "a frame of the wrong length must leave marked bad"
    assert len(out0) <= 16 + 12
    out1, bad1 = seen["out1"]
    assert not bad1
    check_sum(out1, 1)
    st = seen["stats"]
    assert st[counter] == 1, st
    assert st["drop_length"] + st["drop_oversize"] == 1, st
    assert st["reduce_frames"] == 2


@pytest.mark.parametrize("rank", [0, 1])
def test_short_host_push_loses_its_chunk_only(rank):
    """A HOST_PUSH shorter than its count: at rank 0 the REDUCE it becomes leaves marked bad; at
    rank 1 its slot is marked lost and the REDUCE added to it leaves marked bad. The next chunk
    is exact either way (no stall)."""
    seen = {}

    async def tb(ctx, dut):
        short = frame(Header(opcode=Opcode.HOST_PUSH, collective=COLL, seq=0, count=3), LOCAL[0])[:-4]
        await send(ctx, dut.host_rx, short)
        await send(ctx, dut.host_rx, frame(Header(opcode=Opcode.HOST_PUSH, collective=COLL, seq=1, count=3),
                                           LOCAL[1]))
        if rank > 0:
            await send(ctx, dut.cw_in, frame(reduce_hdr(0), INCOMING[0]))
        seen["out0"] = await recv(ctx, dut.cw_out)
        if rank > 0:
            await send(ctx, dut.cw_in, frame(reduce_hdr(1), INCOMING[1]))
        seen["out1"] = await recv(ctx, dut.cw_out)
        seen["stats"] = await stats(ctx, dut)

    run_node(rank, 3, tb, push=False)
    assert seen["out0"][1], "the chunk pushed short must leave marked bad"
    out1, bad1 = seen["out1"]
    assert not bad1
    if rank > 0:
        check_sum(out1, 1)
    else:
        assert np.frombuffer(out1[16:], "<f4").view(np.uint32).tolist() == LOCAL[1].view(np.uint32).tolist()
    assert seen["stats"]["drop_length"] == 1


FIELD_CASES = {
    "drop_dtype": reduce_hdr(0, dtype=7),
    "drop_flags": reduce_hdr(0, flags=0x80),
    "drop_flags_abort": reduce_hdr(0, flags=Flag.ABORT),
    "drop_codec": reduce_hdr(0, codec=Codec.INCEPTIONN_V1, eb_k=10),
    "drop_codec_ebk": reduce_hdr(0, eb_k=3),
    "drop_count_lost": reduce_hdr(0, flags=Flag.LOST, count=3),
}


@pytest.mark.parametrize("case", list(FIELD_CASES))
def test_header_fields_checked(case):
    """dtype, flags, codec and eb_k that this collective does not use: dropped whole, counted, and
    the good frame after it is summed exactly."""
    seen = {}

    async def tb(ctx, dut):
        await send(ctx, dut.cw_in, frame(FIELD_CASES[case], INCOMING[0]))
        await send(ctx, dut.cw_in, GOOD0)
        seen["out"] = await recv(ctx, dut.cw_out)
        seen["stats"] = await stats(ctx, dut)

    run_node(1, 3, tb)
    out, bad = seen["out"]
    assert not bad
    check_sum(out, 0)
    counter = "drop_" + case.split("_")[1]
    assert seen["stats"][counter] == 1, seen["stats"]
    assert seen["stats"]["reduce_frames"] == 1


def test_codec_frame_on_node_without_codec_dropped():
    """A node built without the codec refuses a compressed collective, and drops compressed frames
    in an uncompressed one (drop_codec)."""
    seen = {}
    ctl = Header(opcode=Opcode.CONTROL, collective=COLL, src=1, hop=3, seq=2, codec=Codec.INCEPTIONN_V1, eb_k=10)

    async def tb(ctx, dut):
        await send(ctx, dut.cw_in, frame(reduce_hdr(0, codec=Codec.INCEPTIONN_V1, eb_k=10), b"\0" * 4))
        seen["quiet"] = await no_frame(ctx, dut.cw_out)
        seen["stats"] = await stats(ctx, dut)

    run_node(1, 3, tb, push=False, ctl=ctl.pack())
    assert seen["quiet"]
    # the compressed CONTROL is refused: no collective runs (rank 0 by default) and the frame is dropped
    st = seen["stats"]
    assert st["control_refused"] == 1 and st["drop_opcode"] + st["drop_collective"] == 1

    async def tb2(ctx, dut):
        await send(ctx, dut.cw_in, frame(reduce_hdr(0, codec=Codec.INCEPTIONN_V1, eb_k=10), b"\0" * 4))
        seen["quiet2"] = await no_frame(ctx, dut.cw_out)
        seen["stats2"] = await stats(ctx, dut)

    run_node(1, 3, tb2, push=False)
    assert seen["quiet2"] and seen["stats2"]["drop_codec"] == 1


@pytest.mark.parametrize("mutation", ["collective", "seq", "opcode", "count", "version"])
def test_spoilt_header_becomes_lost_placeholder_and_ring_stays_in_step(mutation):
    """A REDUCE frame whose header was spoilt on the cable (dropped at the gate) and whose last
    beat says bad (its FCS failed) is replaced by a LOST placeholder marked bad, so the next
    chunk still goes through; the same mutation on a good-FCS frame (a stray) leaves no
    placeholder and the real chunk 0 that follows is summed."""
    changes = {"collective": {"collective": COLL ^ 0x40}, "seq": {"seq": 1 << 20}, "opcode": {"opcode": 0x21},
               "count": {"count": 3 ^ 0x10}, "version": {"version": 0x21}}[mutation]
    spoilt = frame(reduce_hdr(0).replace(**changes), INCOMING[0])
    seen = {}

    async def tb(ctx, dut):
        await send(ctx, dut.cw_in, spoilt, bad=True)
        seen["ph"] = await recv(ctx, dut.cw_out)
        await send(ctx, dut.cw_in, frame(reduce_hdr(1), INCOMING[1]))
        seen["out1"] = await recv(ctx, dut.cw_out)
        await send(ctx, dut.cw_in, spoilt, bad=False)  # a stray with a good FCS: no placeholder
        seen["quiet"] = await no_frame(ctx, dut.cw_out)
        seen["stats"] = await stats(ctx, dut)

    run_node(1, 3, tb)
    ph, bad = seen["ph"]
    hdr = Header.unpack(ph)
    assert bad and len(ph) == 16
    assert (hdr.opcode, hdr.seq, hdr.flags, hdr.collective, hdr.count) == (Opcode.REDUCE, 0, Flag.LOST, COLL, 0)
    out1, bad1 = seen["out1"]
    assert not bad1
    check_sum(out1, 1)
    assert seen["quiet"]
    st = seen["stats"]
    assert st["reduce_frames"] == 2
    assert sum(v for k, v in st.items() if k.startswith("drop_")) == 2, st


def test_lost_placeholder_passes_every_rank_marked_bad():
    """A LOST REDUCE at the last rank becomes a LOST BROADCAST (ccw) and a LOST HOST_RESULT, both
    marked bad; a LOST BROADCAST at a middle rank is forwarded and delivered marked bad; none is
    counted as a drop, and the next chunk is exact."""
    seen = {}
    lost = Header(opcode=Opcode.REDUCE, collective=COLL, seq=0, count=0, flags=Flag.LOST).pack()

    async def last(ctx, dut):
        await send(ctx, dut.cw_in, lost, bad=True)
        seen["ccw"], seen["host"] = await recv_both(ctx, dut.ccw_out, dut.host_tx)
        seen["stats_last"] = await stats(ctx, dut)

    run_node(2, 3, last)
    for key, op in (("ccw", Opcode.BROADCAST), ("host", Opcode.HOST_RESULT)):
        data, bad = seen[key]
        h = Header.unpack(data)
        # marked bad on the ring; to the host a well-formed report of the lost chunk
        assert bad == (key == "ccw") and len(data) == 16, key
        assert (h.opcode, h.flags, h.seq) == (op, Flag.LOST, 0), key
    assert all(v == 0 for k, v in seen["stats_last"].items() if k.startswith("drop_"))

    bcast = Header(opcode=Opcode.BROADCAST, collective=COLL, seq=0, count=0, flags=Flag.LOST).pack()

    async def middle(ctx, dut):
        await send(ctx, dut.ccw_in, bcast, bad=True)
        seen["fwd"], seen["res"] = await recv_both(ctx, dut.ccw_out, dut.host_tx)
        seen["stats_mid"] = await stats(ctx, dut)

    run_node(1, 3, middle)
    assert seen["fwd"][1] and not seen["res"][1]
    assert Header.unpack(seen["res"][0]).opcode == Opcode.HOST_RESULT
    assert all(v == 0 for k, v in seen["stats_mid"].items() if k.startswith("drop_"))
    assert seen["stats_mid"]["broadcast_frames"] == 1


def test_lost_flag_forced_bad_even_with_good_fcs():
    """A LOST frame that arrives unmarked (a hostile sender) is still forwarded marked bad, and
    its host gets only the 16-byte LOST report, never a payload."""
    seen = {}
    bcast = Header(opcode=Opcode.BROADCAST, collective=COLL, seq=0, count=0, flags=Flag.LOST).pack()

    async def tb(ctx, dut):
        await send(ctx, dut.ccw_in, bcast + b"\x00" * 12, bad=False)
        seen["fwd"], seen["res"] = await recv_both(ctx, dut.ccw_out, dut.host_tx)

    run_node(1, 3, tb)
    assert seen["fwd"][1]
    assert len(seen["res"][0]) == 16 and Header.unpack(seen["res"][0]).flags == Flag.LOST


def test_dtype_must_match_control():
    seen = {}

    async def tb(ctx, dut):
        await send(ctx, dut.cw_in, frame(reduce_hdr(0, dtype=DType.FP32 + 1), INCOMING[0]))
        await send(ctx, dut.cw_in, GOOD0)
        seen["out"] = await recv(ctx, dut.cw_out)
        seen["stats"] = await stats(ctx, dut)

    run_node(1, 3, tb)
    check_sum(seen["out"][0], 0)
    assert seen["stats"]["drop_dtype"] == 1


def test_placeholder_for_the_last_chunk_finishes():
    """The placeholder of the collective's last chunk: the port's sequence number reaches the chunk
    total as its first beat leaves, and the placeholder must still end (found by the fuzz suite:
    it used to stop after its first beat and hold the host port for ever)."""
    seen = {}

    async def tb(ctx, dut):
        spoilt = frame(Header(opcode=Opcode.BROADCAST, collective=COLL ^ 1, seq=0, count=3), INCOMING[0])
        await send(ctx, dut.ccw_in, spoilt, bad=True)
        seen["fwd"], seen["res"] = await recv_both(ctx, dut.ccw_out, dut.host_tx)
        seen["stats"] = await stats(ctx, dut)

    run_node(1, 3, tb, chunks=1)
    h = Header.unpack(seen["res"][0])
    assert (h.opcode, h.flags, h.seq) == (Opcode.HOST_RESULT, Flag.LOST, 0) and len(seen["res"][0]) == 16
    assert seen["fwd"][1]
    assert seen["stats"]["broadcast_frames"] == 1 and seen["stats"]["drop_collective"] == 1
