"""Compressed collectives on schedule engines built with the codec (``EngineConfig(codec=True)``).

Every input of a codec engine decompresses what arrives compressed and every output compresses
what leaves (:class:`~wirereduce.hdl.codec.port.CodecIn` / ``CodecOut``, as on the ring node), so
each hop of a tree decompresses its children's partial sums, sums them with its local chunk in the
table's order and recompresses (docs/codec.md "On the schedule engine"). The results must equal
:func:`wirereduce.sim.golden.schedule.allreduce` with ``compression=k`` bit for bit, whatever the
back-pressure; a malformed compressed frame is marked bad as its last byte arrives (decoded cut-through) and
nothing made of it reaches a host.
"""

from __future__ import annotations

import numpy as np
import pytest
from amaranth_harness import simulate
from conftest import shared_tmp
from helpers import no_frame, recv, send, stats
from test_bench import _tag_block
from test_codec_hdl import gradients
from test_engine_hostile import COLL, LOCAL_CHUNKS, RANK, reduce_hdr, run_engine
from wirereduce.hdl.core.engine import Engine
from wirereduce.host.driver import parse_stats
from wirereduce.host.engine import EngineSession
from wirereduce.sim.engines.fastengine import FastEngineSim, golden_check
from wirereduce.sim.golden import codec as G
from wirereduce.sim.golden.schedule import allreduce as golden_allreduce

from wirereduce import codec
from wirereduce import schedule as sched
from wirereduce.config import EngineConfig
from wirereduce.protocol import Codec, DType, Flag, Header, Opcode, frame
from wirereduce.table import LOCAL, EngineEntry, encode_entry

CFG = EngineConfig(64, 1500, 8, ports=2, max_flows=8, codec=True)
TOPOLOGY = "ring:3"   # multitree on it: node 0 sums two children, in the table's order


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    # One build for every xdist worker (FastEngineSim locks it); every algorithm on ring:3 runs on it.
    return FastEngineSim(TOPOLOGY, CFG, 4, build_root=shared_tmp(tmp_path_factory, "codecengine"))


def check(arrays, s, res, k):
    bad = golden_check(arrays, s, res.results, compression=k)
    assert bad == [0] * len(arrays), f"elements differing from the golden compressed allreduce per node: {bad}"


@pytest.mark.verilator
@pytest.mark.parametrize("alg,k,rx,tx", [("multitree", 8, 1.0, 1.0), ("multitree", 12, 0.6, 0.4),
                                         ("biring", 10, 0.8, 0.7), ("ring", 10, 1.0, 1.0)])
def test_compressed_allreduce_bitexact(net, alg, k, rx, tx):
    """Gradient-like values, 12 chunks a node, each hop decompressing, summing and recompressing."""
    s = sched.build(TOPOLOGY, alg)
    rng = np.random.default_rng(k)
    n = 12 * codec.max_elements_compressed(1500) - 31
    arrays = [(rng.standard_normal(n) * 10.0 ** rng.uniform(-4, -1, n)).astype(np.float32) for _ in range(3)]
    res = net.allreduce(arrays, s, compression=k, rx_valid_prob=rx, tx_ready_prob=tx, seed=k, final_stats=True)
    check(arrays, s, res, k)
    for st in res.final_stats:
        assert not {c: v for c, v in st.items() if c.startswith("drop_") and v}, st


@pytest.mark.verilator
@pytest.mark.parametrize("alg,chunk_words", [("multitree", (1, 7, 64, 349)), ("biring", 100)])
def test_compressed_allreduce_with_chunk_profile(net, alg, chunk_words):
    """Compressed chunks shorter than the compressed bound (``chunk_words``: a one-value first
    chunk, odd sizes, a full one), under back-pressure: bit-exact, as the codec works element by
    element and each element's sum order is its flow's; the plan really cuts those sizes."""
    s = sched.build(TOPOLOGY, alg)
    rng = np.random.default_rng(41)
    n = 3 * 349 + 5
    arrays = [(rng.standard_normal(n) * 10.0 ** rng.uniform(-4, -1, n)).astype(np.float32) for _ in range(3)]
    sizes = {c.count for c in EngineSession(0, s, CFG, 1, arrays[0], 8, compression=9,
                                            chunk_words=chunk_words).chunks}
    prof = (chunk_words,) if isinstance(chunk_words, int) else chunk_words
    assert max(sizes) <= max(prof) and (1 in sizes) == (1 in prof), sizes
    res = net.allreduce(arrays, s, compression=9, chunk_words=chunk_words, rx_valid_prob=0.8, tx_ready_prob=0.7,
                        seed=3, final_stats=True)
    check(arrays, s, res, 9)
    for st in res.final_stats:
        assert not {c: v for c, v in st.items() if c.startswith("drop_") and v}, st


@pytest.mark.verilator
@pytest.mark.parametrize("k", [4, 24])
def test_edge_values(net, k):
    """Every tag, the tag boundaries, ±0, subnormals, ±Inf, NaN payloads and values ≥ 1."""
    s = sched.build(TOPOLOGY, "multitree")
    rng = np.random.default_rng(k)
    arrays = [gradients(rng, 1000, k) for _ in range(3)]
    check(arrays, s, net.allreduce(arrays, s, compression=k, rx_valid_prob=0.8, tx_ready_prob=0.7, seed=k), k)


@pytest.mark.verilator
def test_bound_travels_per_collective(net):
    """Uncompressed, then k = 6, then k = 20 on the same engines: an uncompressed collective passes
    the codec untouched, and each compressed one takes its k from its frames' headers."""
    s = sched.build(TOPOLOGY, "multitree")
    rng = np.random.default_rng(5)
    arrays = [(rng.standard_normal(900) * 1e-2).astype(np.float32) for _ in range(3)]
    assert golden_check(arrays, s, net.allreduce(arrays, s, collective=11).results) == [0, 0, 0]
    for coll, k in ((12, 6), (13, 20)):
        check(arrays, s, net.allreduce(arrays, s, compression=k, collective=coll), k)


def test_golden_ring_schedule_is_the_compressed_ring():
    """Two independent golden models agree: the schedule model's compressed ring schedule and the
    ring node's compressed ring (``ring_allreduce_compressed``)."""
    rng = np.random.default_rng(3)
    for nodes in (2, 3, 5):
        s = sched.build(f"ring:{nodes}", "ring")
        arrays = [gradients(rng, 777, 9) for _ in range(nodes)]
        want = G.ring_allreduce_compressed(arrays, 9, host_compressed=True).view(np.uint32)
        for r in golden_allreduce(arrays, s, compression=9):
            got = r.view(np.uint32)
            nan = np.isnan(r) & np.isnan(want.view(np.float32))
            assert np.array_equal(got[~nan], want[~nan])


def test_session_compression_checks():
    """Compression is refused before anything is sent: k out of range, engines without the codec,
    a format other than fp32; compressed chunks hold the worst-case count (349 at MTU 1500)."""
    s = sched.build(TOPOLOGY, "multitree")
    a = np.ones(1000, np.float32)
    with pytest.raises(ValueError, match="k must be"):
        EngineSession(0, s, CFG, 1, a, 4, compression=3)
    with pytest.raises(ValueError, match="codec"):
        EngineSession(0, s, EngineConfig(64, 1500, 8, ports=2, max_flows=8), 1, a, 4, compression=8)
    with pytest.raises(ValueError, match="fp32-only"):
        EngineSession(0, s, CFG, 1, np.ones(8, np.int32), 4, compression=8)
    with pytest.raises(ValueError, match="fp32-only"):
        golden_allreduce([np.ones(8, np.int32)] * 3, s, compression=8)
    sess = EngineSession(0, s, CFG, 1, a, 4, compression=8)
    assert max(c.count for c in sess.chunks) <= codec.max_elements_compressed(1500) == 349
    # Shorter chunks are allowed up to that bound, not to the raw frame's 371.
    assert max(c.count for c in EngineSession(0, s, CFG, 1, a, 4, compression=8, chunk_words=100).chunks) == 100
    for bad in (350, (64, 371), 0):
        with pytest.raises(ValueError, match="chunk_words must be an int from 1 to 349"):
            EngineSession(0, s, CFG, 1, a, 4, compression=8, chunk_words=bad)
    h = Header.unpack(sess.control_frame())
    assert (h.codec, h.eb_k) == (Codec.INCEPTIONN_V1, 8)


# --- one codec engine in amaranth.sim: hostile compressed frames ---------------------------------

K = 10
CHILD0 = np.array([3.0, 0.5, 1e-45], np.float32)
GOOD0 = frame(reduce_hdr(0, codec=Codec.INCEPTIONN_V1, eb_k=K), codec.encode(CHILD0, K))

BAD = {
    # (bytes, counter): a compressed REDUCE for chunk 0 from the child, wrong in one way
    "another_bound": (frame(reduce_hdr(0, codec=Codec.INCEPTIONN_V1, eb_k=K + 1), codec.encode(CHILD0, K + 1)),
                      "drop_codec"),
    "uncompressed_in_a_compressed_collective": (frame(reduce_hdr(0), CHILD0), "drop_codec"),
    "count_zero": (reduce_hdr(0, count=0, codec=Codec.INCEPTIONN_V1, eb_k=K).pack(), "drop_count"),
}
# Compressed REDUCEs for chunk 0 whose length does not match their tags: decoded cut-through, so
# only the last byte tells; marked bad there.
MALFORMED = {
    "truncated": GOOD0[:-1],
    "one_byte_too_long": GOOD0 + b"\0",
    "padding_not_zero": GOOD0[:16] + bytes([GOOD0[16] | 0xC0]) + GOOD0[17:],
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_compressed_frame_dropped_whole(case):
    """A compressed frame of the wrong bound or count, or an uncompressed one in a compressed
    collective, is dropped whole at the gate and counted once; the good compressed frame after it
    is summed exactly and its partial sum leaves compressed."""
    data, counter = BAD[case]
    seen = {}

    async def tb(ctx, dut):
        await send(ctx, dut.net0_in, data)
        await send(ctx, dut.net0_in, GOOD0)
        seen["out"] = await recv(ctx, dut.net1_out)
        seen["quiet_child"] = await no_frame(ctx, dut.net0_out, 100)
        seen["stats"] = await stats(ctx, dut)

    run_engine(tb, k=K)
    out, bad_out = seen["out"]
    assert not bad_out
    h = Header.unpack(out)
    assert (h.opcode, h.seq, h.count, h.src, h.codec, h.eb_k) == (Opcode.REDUCE, 0, 3, RANK, Codec.INCEPTIONN_V1, K)
    q = codec.quantize
    want = q(np.add(q(CHILD0, K), q(LOCAL_CHUNKS[0], K), dtype=np.float32), K)  # the table's order: child, local
    assert codec.decode(out[16:], 3, K).view(np.uint32).tolist() == want.view(np.uint32).tolist()
    assert seen["quiet_child"]
    drops = {c: v for c, v in seen["stats"].items() if c.startswith("drop_") and v}
    assert drops == {counter: 1}, (case, drops)


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_compressed_frame_spoils_its_chunk_only(case):
    """A compressed frame whose length does not match its tags is decoded cut-through (the
    ``CodecIn`` has no commit buffer) and marked ``bad`` on its last beat, counted once in
    ``drop_length``: the engine sums it, and the partial sum leaves marked bad (stomped FCS on an
    Ethernet port), as for an uncompressed frame whose length disagrees with its header
    (docs/protocol.md "Length check"), so no host takes a value of it and the driver sums the chunk
    again (``retries``). A second frame for the same chunk is a duplicate (``drop_seq``); the next
    chunk sums exactly."""
    data = MALFORMED[case]
    child1 = np.array([-1.25, 7.0, 2.0 ** -20], np.float32)
    seen = {}

    async def tb(ctx, dut):
        await send(ctx, dut.net0_in, data)
        await send(ctx, dut.net0_in, GOOD0)
        await send(ctx, dut.net0_in, frame(reduce_hdr(1, codec=Codec.INCEPTIONN_V1, eb_k=K), codec.encode(child1, K)))
        seen["out0"] = await recv(ctx, dut.net1_out)
        seen["out1"] = await recv(ctx, dut.net1_out)
        seen["quiet"] = await no_frame(ctx, dut.net1_out, 200)
        seen["stats"] = await stats(ctx, dut)

    run_engine(tb, k=K)
    (out0, bad0), (out1, bad1) = seen["out0"], seen["out1"]
    assert bad0 and not bad1
    assert (Header.unpack(out0).seq, Header.unpack(out1).seq) == (0, 1)
    q = codec.quantize
    want = q(np.add(q(child1, K), q(LOCAL_CHUNKS[1], K), dtype=np.float32), K)
    n1 = Header.unpack(out1).count
    assert codec.decode(out1[16:], n1, K).view(np.uint32).tolist() == want.view(np.uint32).tolist()
    assert seen["quiet"], "the duplicate of chunk 0 left the engine"
    drops = {c: v for c, v in seen["stats"].items() if c.startswith("drop_") and v}
    assert drops == {"drop_length": 1, "drop_seq": 1}, (case, drops)


def test_compressed_broadcast_forwarded_as_it_arrived():
    """A compressed BROADCAST is forwarded to the child and delivered to the host byte for byte as it
    arrived (``CodecIn(forward=True)``), not decoded and compressed again: its payload here holds a
    tag-1 code of -0.0 (sign set, q = 0), which ``decode`` reads as -0.0 and ``encode`` would write
    as tag 0 with no code, so only a forwarded frame keeps it. A BROADCAST whose length does not
    match its tags leaves towards the child marked ``bad`` (counted once in ``drop_length``) and never
    reaches the host."""
    seen = {}
    res0 = np.array([9.0, -0.0, 0.5], np.float32)
    enc = bytearray(codec.encode(res0, K))
    assert enc[0] & 0x0C == 0                    # element 1 (-0.0) has tag 0: no code
    canonical = bytes(enc)
    enc[0] |= 0x04                               # tag 1 for element 1 ...
    payload = bytes(enc[:8 + 4]) + b"\x80" + bytes(enc[8 + 4:])   # ... its code s = 1, q = 0 after 9.0's raw 4 bytes
    assert codec.decode(payload, 3, K).view(np.uint32).tolist() == [0x41100000, 0x80000000, 0x3F000000]
    assert codec.encode(codec.decode(payload, 3, K), K) == canonical   # tag 0 again
    bc = Header(opcode=Opcode.BROADCAST, collective=COLL, seq=0, count=3, src=3, hop=0, codec=Codec.INCEPTIONN_V1,
                eb_k=K)
    good = frame(bc, payload)
    child1 = np.array([-1.25, 7.0, 2.0 ** -20], np.float32)

    async def tb(ctx, dut):
        await send(ctx, dut.net0_in, GOOD0)
        seen["partial0"] = await recv(ctx, dut.net1_out)
        await send(ctx, dut.net1_in, good)
        seen["child0"] = await recv(ctx, dut.net0_out)
        seen["host0"] = await recv(ctx, dut.host_tx)
        await send(ctx, dut.net0_in, frame(reduce_hdr(1, codec=Codec.INCEPTIONN_V1, eb_k=K), codec.encode(child1, K)))
        seen["partial1"] = await recv(ctx, dut.net1_out)
        await send(ctx, dut.net1_in, frame(bc.replace(seq=1), payload)[:-1])          # truncated
        seen["child1"] = await recv(ctx, dut.net0_out)
        seen["host1"] = await no_frame(ctx, dut.host_tx, 200)
        seen["stats"] = await stats(ctx, dut)

    run_engine(tb, k=K)
    assert not seen["partial0"][1] and not seen["partial1"][1]
    child0, bad = seen["child0"]
    assert not bad and child0 == frame(bc.replace(src=RANK), payload)   # the engine's outputs set src
    host0, bad = seen["host0"]
    h = Header.unpack(host0)
    assert not bad and (h.opcode, h.seq, h.count, h.codec, h.eb_k) == (Opcode.HOST_RESULT, 0, 3, Codec.INCEPTIONN_V1, K)
    assert host0[16:] == payload
    child1_out, bad = seen["child1"]
    assert bad and child1_out[16:] == payload[:-1]
    assert seen["host1"], "a malformed result reached the host"
    drops = {c: v for c, v in seen["stats"].items() if c.startswith("drop_") and v}
    assert drops == {"drop_length": 1}, drops
    assert seen["stats"]["broadcast_frames"] == 2, seen["stats"]


ENTRY = encode_entry(EngineEntry(1, (0, LOCAL), 0, 1, 0b01, True)).to_bytes(8, "little")


def test_control_codec_rules():
    """A codec engine takes a compressed fp32 collective with 4 ≤ k ≤ 24 and refuses one with
    another format or k out of range; an engine without the codec refuses every compressed one."""
    got = {}

    def run(cfg, ctls, key):
        dut = Engine(cfg)

        async def tb(ctx):
            await send(ctx, dut.host_rx, Header(opcode=Opcode.SCHEDULE, seq=0, count=2).pack() + ENTRY)
            assert parse_stats((await recv(ctx, dut.host_tx))[0])["drop_count"] == 0
            for i, kw in enumerate(ctls):
                await send(ctx, dut.host_rx, Header(opcode=Opcode.CONTROL, collective=COLL, src=0, hop=1, seq=4,
                                                    count=i, flags=Flag.ABORT, **kw).pack())
                got.setdefault(key, []).append(parse_stats((await recv(ctx, dut.host_tx))[0])["control_refused"])
        simulate(dut, [tb])

    inc = {"codec": Codec.INCEPTIONN_V1}
    ctls = [dict(inc, eb_k=3), dict(inc, eb_k=25), dict(inc, eb_k=10, dtype=DType.BF16),
            dict(inc, eb_k=0), dict(eb_k=10), dict(inc, eb_k=10), dict(inc, eb_k=4, dtype=0x11)]
    run(CFG, ctls, "codec")
    run(EngineConfig(64, 1500, 8, ports=2, max_flows=8), [dict(inc, eb_k=10)], "plain")
    # refused: k 3, k 25, bf16, k 0, NONE with k; taken: fp32 SUM k 10 and fp32 MAX k 4 (ABORT set)
    assert got["codec"] == [1, 2, 3, 4, 5, 5, 5], got
    assert got["plain"] == [1], got


@pytest.mark.verilator
def test_cli_sim_allreduce_compressed(net, tmp_path, tmp_path_factory, capsys):
    """``wirereduce sim allreduce --topology ring:3 --algorithm multitree --compress 10 --check`` on
    the fixture's build (the same engines: its model is reused) reports every node bit-exact against
    the golden compressed allreduce."""
    from wirereduce.cli import main

    rng = np.random.default_rng(2)
    np.savez(tmp_path / "in.npz", **{f"node{k}": (rng.standard_normal(2000) * 1e-2).astype(np.float32)
                                     for k in range(3)})
    code = main(["sim", "allreduce", "--topology", TOPOLOGY, "--algorithm", "multitree", "--compress", "10",
                 "--slots", "8", "--input", str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz"),
                 "--check", "--build-dir", str(shared_tmp(tmp_path_factory, "codecengine"))])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("bit-exact vs the golden multitree allreduce in table order compression=k10") == 3, out


def test_schedule_payloads_of_the_ring_are_the_rings():
    """The compressed schedule benchmark's payloads (what its ratio counts) on the ``ring`` schedule
    are the ring node's (``ring_payloads``), hop for hop, as the links carry them (compressed)."""
    from wirereduce.sim.bench.schedules import schedule_payloads

    rng = np.random.default_rng(4)
    arrays = [(rng.standard_normal(500) * 1e-2).astype(np.float32) for _ in range(4)]
    got = schedule_payloads(arrays, sched.build("ring:4", "ring"), 10)
    want = G.ring_payloads(arrays, 10, host_compressed=True)
    assert len(got) == len(want) == 6
    for x, y in zip(got, want):
        assert np.array_equal(codec.quantize(x, 10).view(np.uint32), codec.quantize(y, 10).view(np.uint32))


def test_schedule_link_bound_of_the_ring_is_the_rings():
    """The schedule benchmark's link bound on the ``ring`` schedule equals the ring benchmark's
    (``codec_link_bound``, written apart: per hop from ``ring_payloads``), on real gradients where
    the busiest link is a broadcast hop carrying the final sum, at both MTUs."""
    from wirereduce.sim.bench.algbw import codec_link_bound
    from wirereduce.sim.bench.schedules import schedule_link_bound
    from wirereduce.sim.workloads.gradients import gradient_stream

    arrays = gradient_stream(4, 30_000, seed=2)
    for k, mtu in ((8, 9000), (12, 1500)):
        assert schedule_link_bound(arrays, sched.build("ring:4", "ring"), k, mtu) == pytest.approx(
            codec_link_bound(arrays, k, mtu, host_compressed=True), rel=1e-12)


@pytest.mark.parametrize("value, code_bytes", [(0.0, 0), (3.0, 4)])
def test_schedule_link_bound_by_hand(value, code_bytes):
    """Every value tag 0 (zeros) or tag 3 (raw codes; the sums stay ≥ 1): every payload compresses
    alike, so the bound is the busiest directed link's frames, raw over compressed. biring splits
    1,000 values into 8 flows of 125, one frame each raw and compressed at MTU 1500; the frames a
    directed link carries are counted here from the trees' edges (a partial sum up, the result
    down)."""
    from collections import Counter

    from wirereduce.sim.bench.schedules import schedule_link_bound

    from wirereduce.protocol import wire_bytes

    s = sched.build("ring:4", "biring")
    arrays = [np.full(1000, value, np.float32)] * 4
    uses = Counter()
    for f in s.flows:
        for e in f.edges:
            uses[e.child, e.parent] += 1
            uses[e.parent, e.child] += 1
    frames = max(uses.values())       # one chunk (125 values) per flow and edge direction
    raw = frames * wire_bytes(16 + 4 * 125)
    comp = frames * wire_bytes(16 + _tag_block(125) + code_bytes * 125)
    assert schedule_link_bound(arrays, s, 8, 1500) == pytest.approx(raw / comp)


def test_bench_schedules_compress_refuses_bad_k(tmp_path, capsys):
    from wirereduce.cli import main

    assert main(["bench-schedules", "--compress", "3", "--out-dir", str(tmp_path), "--build-dir",
                 str(tmp_path / "b")]) == 2
    assert "--compress" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


@pytest.mark.verilator
def test_hook_compressed_buckets_through_codec_engines(net):
    """The DDP hook's compressed path on the engine gateware: three ranks in one process, each with
    its own ``State(compress_k=10, error_feedback=True)`` over ``EngineGroup`` (the fixture's codec
    engines, biring on ring:3). Two steps of two buckets: every rank's averaged bucket is the golden
    compressed allreduce of what each rank sent (its gradient plus its residual), ÷ 3, bit for bit.
    Ranks that ask for different k get a ValueError each, before anything is simulated."""
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'wirereduce[torch]')")
    from conftest import per_rank

    import wirereduce.torch as wrt

    s = sched.build(TOPOLOGY, "biring")
    group = wrt.EngineGroup(net, s)
    states = [wrt.State(group.backend(k), compress_k=10, error_feedback=True) for k in range(3)]
    rng = np.random.default_rng(6)
    runs = len(group.runs)
    residual = {}   # (rank, bucket) -> what compression dropped last step, kept here independently
    for step in range(2):
        for index, n in enumerate((1, 2345)):
            grads = [(rng.standard_normal(n) * 10.0 ** rng.uniform(-5, -1, n)).astype(np.float32) for _ in range(3)]
            sent = [grads[k] + residual.get((k, index), np.zeros(n, np.float32)) for k in range(3)]
            for k in range(3):
                residual[k, index] = sent[k] - codec.quantize(sent[k], 10)
            out = per_rank(3, lambda k, i=index, g=grads: states[k].reduce(i, g[k].copy()))
            want = golden_allreduce(sent, s, "sum", compression=10)
            for k in range(3):
                assert isinstance(out[k], np.ndarray), out[k]
                ref = wrt.average(want[k], 3)
                assert np.array_equal(np.asarray(out[k]).view(np.uint32), ref.view(np.uint32)), \
                    f"step {step} bucket {index} rank {k}"
    assert len(group.runs) == runs + 4
    for st in states:
        st.close()
    out = per_rank(3, lambda k: group.backend(k).allreduce(np.ones(10, np.float32), compression=8 + (k == 2)))
    assert all(isinstance(out[k], ValueError) and "different compressions" in str(out[k]) for k in range(3)), out
    assert len(group.runs) == runs + 4
