"""Block tests of the schedule engine in amaranth.sim: small networks of engines, every algorithm,
bit-exact against the golden model in the schedule's summation order."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth_harness import recv_beats, simulate, stream_recv, stream_send
from helpers import edge_arrays
from wirereduce.hdl.core.engine import Engine
from wirereduce.host.driver import parse_stats
from wirereduce.sim.cluster.network import LinkModel, line_bytes_per_cycle
from wirereduce.sim.cluster.schednet import cmac_engine_links
from wirereduce.sim.golden.allreduce import bit_mismatches
from wirereduce.sim.golden.schedule import allreduce as golden_allreduce

from wirereduce import schedule as sched
from wirereduce import table
from wirereduce.config import EngineConfig
from wirereduce.formats import FORMATS, dtype_byte
from wirereduce.protocol import HEADER_BYTES, Header, Opcode, frame


class Mesh(wiring.Component):
    """Engines cabled as ``topology`` says, each directed link a LinkModel of ``latencies[(u, p)]``
    (``links="cmac"``: the U55C's 100G CMAC glue and a cable model instead, 512 bit,
    :func:`~wirereduce.sim.cluster.schednet.cmac_engine_links`)."""

    def __init__(self, topology, config, latencies, rate=None, links="model"):
        self.topology, self.config, self.latencies, self.rate = topology, config, latencies, rate
        self.links_kind = links
        self.engines = [Engine(config) for _ in range(topology.nodes)]
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        topo, P = self.topology, self.config.ports
        self.links = {}
        for u, e in enumerate(self.engines):
            m.submodules[f"e{u}"] = e
        if self.links_kind == "cmac":
            lat = {lk: self.latencies.get(lk, 3) for lk in topo.directed_links()}
            rate = self.rate if self.rate is not None else line_bytes_per_cycle(self.config.width)
            cmac_engine_links(m, self.engines, topo, self.config, lat, rate)
        for u in range(topo.nodes):
            for p, (v, q) in enumerate(topo.links[u] if self.links_kind == "model" else ()):
                link = LinkModel(self.config.width, self.latencies.get((u, p), 3), self.rate)
                m.submodules[f"l{u}_{p}"] = link
                self.links[(u, p)] = link
                wiring.connect(m, getattr(self.engines[u], f"net{p}_out"), link.i)
                wiring.connect(m, link.o, getattr(self.engines[v], f"net{q}_in"))
        for u in range(topo.nodes):
            for p in range(len(topo.links[u]), P):
                m.d.comb += [getattr(self.engines[u], f"net{p}_out").ready.eq(1),
                             getattr(self.engines[u], f"net{p}_in").valid.eq(0)]
        return m


def run_schedule(s, arrays, *, ports=None, mtu=1500, elements=None, seed=0, window=4, ready_prob=1.0,
                 max_latency=3, slots=4, rate=None, trace=None, priority="broadcast", lookahead=2,
                 formats=tuple(FORMATS), width=64, links="model"):
    ports = ports or s.topology.degree
    cfg = EngineConfig(width, mtu, slots=slots, ports=ports, max_flows=64, priority=priority, lookahead=lookahead,
                       formats=formats)
    rng = np.random.default_rng(seed)
    lat = {lk: int(rng.integers(1, max_latency + 1)) for lk in s.topology.directed_links()}
    dut = Mesh(s.topology, cfg, lat, rate, links)
    n = arrays[0].size
    chunks = table.plan(n, s, elements or cfg.max_elements)
    F, C = len(s.flows), len(chunks)
    results = [np.full(n, np.nan, dtype=np.float32) for _ in arrays]
    got = [set() for _ in arrays]
    acked = set()
    stats = {}

    def host(u):
        e = dut.engines[u]

        async def pusher(ctx):
            for first_flow, payload in table.table_frames_payloads(s, u, ports, 64):
                hdr = Header(opcode=Opcode.SCHEDULE, seq=first_flow, count=len(payload) // 4, collective=9)
                await stream_send(ctx, e.host_rx, hdr.pack() + payload, width)
                st = parse_stats(await stream_recv(ctx, e.host_tx, width))
                assert st["control_refused"] == 0 and st["drop_count"] == 0, st
            ctl = Header(opcode=Opcode.CONTROL, collective=5, src=u, hop=F, seq=C, count=77)
            await stream_send(ctx, e.host_rx, ctl.pack(), width)
            st = parse_stats(await stream_recv(ctx, e.host_tx, width))
            assert st["request_tag"] == 77 and st["control_refused"] == 0, st
            acked.add(u)
            while len(acked) < len(arrays):
                await ctx.tick()
            for c in chunks:
                while True:
                    missing = next((g for g in range(C) if g not in got[u]), C)
                    if c.seq < missing + window:
                        break
                    await ctx.tick()
                hdr = Header(opcode=Opcode.HOST_PUSH, collective=5, seq=c.seq, hop=c.flow, count=c.count)
                if trace is not None:
                    trace.append(("push", u, c.seq, clock[0]))
                await stream_send(ctx, e.host_rx, frame(hdr, arrays[u][c.start:c.start + c.count]), width)

        async def collector(ctx):
            while u not in acked:
                await ctx.tick()
            while len(got[u]) < C:
                try:
                    tx = e.host_tx
                    data = await recv_beats(ctx, tx.valid, tx.ready, tx.payload.data, tx.payload.keep,
                                            tx.payload.last, width, 20000, lambda: int(rng.random() < ready_prob))
                except TimeoutError:
                    missing = sorted(set(range(C)) - got[u])
                    raise TimeoutError(f"node {u}: chunks {missing} of {C} never arrived") from None
                h = Header.unpack(data)
                assert h.opcode == Opcode.HOST_RESULT and h.collective == 5, h
                c = chunks[h.seq]
                assert h.hop == c.flow and h.count == c.count, (h, c)
                assert h.seq not in got[u]
                results[u][c.start:c.start + c.count] = np.frombuffer(data[HEADER_BYTES:], dtype="<f4")
                got[u].add(h.seq)
                if trace is not None:
                    trace.append(("result", u, h.seq, clock[0]))
            await ctx.tick().repeat(30)
            await stream_send(ctx, e.host_rx, Header(opcode=Opcode.STATS_REQUEST, count=3).pack(), width)
            stats[u] = parse_stats(await stream_recv(ctx, e.host_tx, width))
        return [pusher, collector]

    clock = [0]

    async def count(ctx):
        async for _ in ctx.tick():
            clock[0] += 1

    simulate(dut, [tb for u in range(len(arrays)) for tb in host(u)], processes=[count])
    return results, stats


def check(s, arrays, **kw):
    results, stats = run_schedule(s, arrays, **kw)
    want = golden_allreduce(arrays, s)
    for u, r in enumerate(results):
        bad = bit_mismatches(r, want[u])  # bit for bit; any NaN equals any NaN (docs/arithmetic.md)
        assert bad.size == 0, f"node {u}: {bad.size} elements differ, first at {bad[:5]}"
    for u, st in stats.items():
        drops = {k: v for k, v in st.items() if k.startswith("drop_") and v}
        assert not drops, f"node {u}: {drops}"
    return stats


@pytest.mark.parametrize("topo,alg,n", [
    ("ring:2", "ring", 1), ("ring:3", "ring", 700), ("ring:4", "biring", 97),
    ("torus:2x2", "multitree", 301), ("torus:2x2", "multitree-balanced", 203),
])
def test_engine_bitexact(topo, alg, n):
    s = sched.build(topo, alg)
    arrays = edge_arrays(s.nodes, n, seed=n)
    check(s, arrays, elements=40)


def test_engine_bitexact_512():
    """Two 512-bit engines, whose summation units have the deep (seven-stage) lanes: the golden model's
    bits (edge values: subnormals, ties, Inf, NaN; two chunks, several beats each). fp32-only lanes keep
    the 16-lane simulation short; the deep lanes of every format are checked lane by lane
    (tests/test_lanes.py, tests/test_lanes_exhaustive.py) and have the same latency."""
    assert EngineConfig(512, 1500, ports=2).deep_lanes and not EngineConfig(64, 1500, ports=2).deep_lanes
    s = sched.build("ring:2", "ring")
    arrays = edge_arrays(s.nodes, 90, seed=90)
    check(s, arrays, elements=45, width=512, formats=("fp32",))


@pytest.mark.parametrize("alg", ["ring", "biring"])
def test_engine_bitexact_512_over_cmac_glue(alg):
    """The U55C top's engines: two 512-bit engines cabled with the 100G CMAC glue (``CmacTxGlue`` →
    cable model → ``CmacRxGlue``, cut-through), bit-exact, and the glue's counters in every engine's
    STATS (``net{p}_rx_frames``, ``net{p}_tx_frames``, no ``link_drop_net{p}``)."""
    s = sched.build("ring:2", alg)
    arrays = edge_arrays(s.nodes, 90, seed=91)
    stats = check(s, arrays, elements=45, width=512, formats=("fp32",), links="cmac")
    rx = {u: st["net0_rx_frames"] + st["net1_rx_frames"] for u, st in stats.items()}
    tx = {u: st["net0_tx_frames"] + st["net1_tx_frames"] for u, st in stats.items()}
    assert all(rx.values()) and sum(rx.values()) == sum(tx.values()), (rx, tx)   # every frame sent arrived
    for u, st in stats.items():
        assert not {k: v for k, v in st.items() if v and (k.startswith("link_drop_") or k.endswith(
            ("_fcs_errors", "_stomped", "_overflow", "_ethertype_drops")))}, (u, st)


def test_unit_priority_and_fp32_only_lanes_same_bits():
    """The allocator's other priority (partial sums before broadcasts) changes the timing only, and
    engines whose lanes carry fp32 only (``EngineConfig.formats``) sum fp32 to the same bits."""
    s = sched.build("ring:4", "biring")
    arrays = edge_arrays(s.nodes, 97, seed=4)
    check(s, arrays, elements=40, priority="unit", formats=("fp32",))
    with pytest.raises(ValueError, match="priority"):
        EngineConfig(64, 1500, ports=2, priority="fifo")


@pytest.mark.parametrize("topo,alg,n,lookahead", [
    ("ring:4", "biring", 97, 1), ("torus:2x2", "multitree-balanced", 203, 3), ("ring:4", "biring", 97, 4),
])
def test_engine_bitexact_any_lookahead(topo, alg, n, lookahead):
    """Units that look 1 (in order), 3 or 4 chunks ahead, with random link latencies (1-9 cycles) and
    host back-pressure: the golden model's bits (the table fixes the summation order, not D)."""
    s = sched.build(topo, alg)
    arrays = edge_arrays(s.nodes, n, seed=n)
    check(s, arrays, elements=40, lookahead=lookahead, seed=lookahead, max_latency=9, ready_prob=0.6)


def test_lookahead_range():
    for d in (0, 5):
        with pytest.raises(ValueError, match="lookahead"):
            EngineConfig(64, 1500, ports=2, lookahead=d)
    assert "lookahead=3" in repr(EngineConfig(64, 1500, ports=2, lookahead=3))


def test_codec_engines_default_to_lookahead_three():
    """A codec engine's units look 3 chunks ahead unless told otherwise (compressed biring on ring:4:
    216,392 → 156,141 cycles, docs/codec.md "On the schedule engine"); without the codec 2; an explicit
    lookahead is kept either way, and the default equals its explicit value (same build, same hash)."""
    from wirereduce.config import CODEC_LOOKAHEAD

    assert CODEC_LOOKAHEAD == 3
    assert EngineConfig(64, 1500, ports=2).lookahead == 2
    assert EngineConfig(64, 1500, ports=2, codec=True).lookahead == 3
    assert EngineConfig(64, 1500, ports=2, codec=True, lookahead=2).lookahead == 2
    assert EngineConfig(64, 1500, ports=2, lookahead=4).lookahead == 4
    assert EngineConfig(64, 1500, ports=2, codec=True) == EngineConfig(64, 1500, ports=2, codec=True, lookahead=3)


def test_engine_same_bits_any_timing():
    """Random link latencies (1-9 cycles) and random host back-pressure, three seeds: the same bits,
    the golden model's, every time (the table fixes the order, not the arrivals)."""
    s = sched.build("torus:2x2", "multitree")
    arrays = edge_arrays(s.nodes, 90, seed=5)   # 4 flows, 1-2 chunks of 24 each: frames of several flows interleave
    runs = []
    for seed in (1, 2, 3):
        results, _ = run_schedule(s, arrays, elements=24, seed=seed, max_latency=9, ready_prob=0.6)
        runs.append(np.concatenate(results).view(np.uint32))
    want = np.concatenate(golden_allreduce(arrays, s))
    for r in runs:
        assert bit_mismatches(r.view(np.float32), want).size == 0
    assert all(np.array_equal(r, runs[0]) for r in runs[1:])


def _stats(ctx, e, data: bytes, width: int = 64):
    async def go():
        await stream_send(ctx, e.host_rx, data, width)
        return parse_stats(await stream_recv(ctx, e.host_tx, width))
    return go()


def test_control_and_schedule_rules():
    """CONTROL is refused without a good table; SCHEDULE is refused while a collective runs and
    dropped when its length field is bad; every answer is one STATS frame with the request tag."""
    s = sched.build("ring:2", "ring")
    e = Engine(EngineConfig(64, 1500, slots=4, ports=2, max_flows=8))
    (first, payload), = table.table_frames_payloads(s, 0, 2, 64)
    out = {}

    async def tb(ctx):
        ctl = Header(opcode=Opcode.CONTROL, collective=5, src=0, hop=1, seq=2, count=11).pack()
        out["no_table"] = await _stats(ctx, e, ctl)
        bad = Header(opcode=Opcode.SCHEDULE, seq=0, count=3, collective=12).pack() + payload[:8] + b"\0" * 4
        out["odd_count"] = await _stats(ctx, e, bad)
        good = Header(opcode=Opcode.SCHEDULE, seq=0, count=2, collective=13).pack() + payload
        out["table"] = await _stats(ctx, e, good)
        out["control"] = await _stats(ctx, e, ctl)
        again = Header(opcode=Opcode.SCHEDULE, seq=0, count=2, collective=14).pack() + payload
        out["busy"] = await _stats(ctx, e, again)

    simulate(e, [tb])
    assert out["no_table"]["control_refused"] == 1 and out["no_table"]["chunks"] == 0
    assert out["odd_count"]["drop_count"] == 1 and out["odd_count"]["request_tag"] == 12
    assert out["table"]["request_tag"] == 13 and out["table"]["control_refused"] == 1
    assert out["control"]["control_refused"] == 1 and out["control"]["chunks"] == 2
    assert out["control"]["nodes"] == 1  # STATS "nodes" of an engine: its flow count
    assert out["busy"]["control_refused"] == 2 and out["busy"]["request_tag"] == 14


@pytest.mark.parametrize("width", [64, 512])
@pytest.mark.parametrize("extra", [-8, 8])
def test_schedule_frame_of_the_wrong_length(width, extra):
    """A SCHEDULE frame shorter or longer than its count says is dropped at the length check and counted
    (``drop_length``, also when its one beat at 512 bit ends it), its answer says so, and the table it
    spoilt is refused by CONTROL until a good SCHEDULE frame replaces it."""
    s = sched.build("ring:2", "ring")
    e = Engine(EngineConfig(width, 1500, slots=4, ports=2, max_flows=8))
    (first, payload), = table.table_frames_payloads(s, 0, 2, width)
    ctl = Header(opcode=Opcode.CONTROL, collective=5, src=0, hop=1, seq=2, count=11).pack()
    body = payload + bytes(extra) if extra > 0 else payload[:len(payload) + extra]
    out = {}

    async def tb(ctx):
        out["bad"] = await _stats(ctx, e, Header(opcode=Opcode.SCHEDULE, seq=0, count=2, collective=21).pack()
                                  + body, width)
        out["control"] = await _stats(ctx, e, ctl, width)
        out["table"] = await _stats(ctx, e, Header(opcode=Opcode.SCHEDULE, seq=0, count=2,
                                                   collective=22).pack() + payload, width)
        out["control2"] = await _stats(ctx, e, ctl, width)

    simulate(e, [tb])
    assert len(payload) == 8 and len(body) == 8 + extra   # one entry (count 2 words); 8 bytes fewer or more
    assert out["bad"]["request_tag"] == 21 and out["bad"]["drop_length"] == 1, out["bad"]
    assert out["control"]["control_refused"] == 1 and out["control"]["chunks"] == 0
    assert out["table"]["request_tag"] == 22 and out["table"]["drop_length"] == 1
    assert out["control2"]["control_refused"] == 1 and out["control2"]["chunks"] == 2


def test_stats_carry_the_ports_counters():
    """An engine's STATS frame has its own layout (``engine_stats_counters(P)``: its port count, then
    ``link_drop_{host,net0,…}``, ``drop_source`` and every port's MAC counters), which the header's
    ``count`` names; each value of the ``port_counters`` input lands under its own name."""
    from wirereduce.protocol import engine_port_counters, engine_stats_counters

    P = 3
    e = Engine(EngineConfig(64, 1500, slots=4, ports=P, max_flows=8))
    names = engine_port_counters(P)
    want = {name: (k * 2654435761 + 99) % (1 << 32) for k, name in enumerate(names)}
    out = {}

    async def tb(ctx):
        for k, name in enumerate(names):
            ctx.set(e.port_counters[k], want[name])
        req = Header(opcode=Opcode.STATS_REQUEST, count=321).pack()
        await stream_send(ctx, e.host_rx, req, 64)
        out["raw"] = await stream_recv(ctx, e.host_tx, 64)

    simulate(e, [tb])
    hdr = Header.unpack(out["raw"])
    assert hdr.opcode == Opcode.STATS and hdr.count == len(engine_stats_counters(P)) == 88
    assert len(out["raw"]) == 16 + 4 * hdr.count
    st = parse_stats(out["raw"])
    assert list(st) == list(engine_stats_counters(P))
    assert st["ports"] == P and st["request_tag"] == 321
    assert {name: st[name] for name in names} == want


@pytest.mark.parametrize("formats, modes", [
    (("fp32",), [("bf16", "sum"), ("int32", "max"), ("fp32", "sum")]),
    (("fp32", "bf16"), [("int32", "max"), ("fp16", "min"), ("bf16", "max")]),
], ids=["fp32", "fp32+bf16"])
def test_control_refuses_formats_not_built(formats, modes):
    """A CONTROL whose dtype byte names a format the engine's lanes are not built with is refused
    (``control_refused``, no collective starts), whatever the operation; one of a built format starts
    the collective (the last of ``modes``)."""
    s = sched.build("ring:2", "ring")
    e = Engine(EngineConfig(64, 1500, slots=4, ports=2, max_flows=8, formats=formats))
    (first, payload), = table.table_frames_payloads(s, 0, 2, 64)
    out = []

    async def tb(ctx):
        await _stats(ctx, e, Header(opcode=Opcode.SCHEDULE, seq=0, count=2, collective=13).pack() + payload)
        for name, op in modes:
            ctl = Header(opcode=Opcode.CONTROL, collective=5, src=0, hop=1, seq=2, count=11,
                         dtype=dtype_byte(name, op))
            out.append(await _stats(ctx, e, ctl.pack()))

    simulate(e, [tb])
    for k, st in enumerate(out[:-1]):
        assert st["control_refused"] == k + 1 and st["chunks"] == 0, (modes[k], st)
    assert out[-1]["control_refused"] == len(modes) - 1 and out[-1]["chunks"] == 2, (modes[-1], out[-1])


def unit_order(flows, arrivals, lookahead=2, gap=150):
    """The chunks one unit sums, in the order it sends them, when child frames come in ``arrivals``
    order, ``gap`` cycles apart; each sum checked bit for bit (child + local, the table's order).

    One engine, P = 2: ``flows`` flows (one chunk each), all summed by unit 1 (child on port 0, then the
    local chunk) and sent on port 1; every local chunk is in before the first child frame."""
    from wirereduce.table import LOCAL, EngineEntry, encode_entry

    cfg = EngineConfig(64, 1500, slots=4, ports=2, max_flows=8, lookahead=lookahead)
    dut = Engine(cfg)
    n = 9
    rng = np.random.default_rng(5)
    local = [rng.standard_normal(n).astype(np.float32) for _ in range(flows)]
    child = [rng.standard_normal(n).astype(np.float32) for _ in range(flows)]
    entries = [EngineEntry(1, (0, LOCAL), (f + 1) % flows, 1, 0, False) for f in range(flows)]
    payload = b"".join(encode_entry(e).to_bytes(8, "little") for e in entries)
    out = []

    async def host(ctx):
        ctx.set(dut.host_tx.ready, 1)
        hdr = Header(opcode=Opcode.SCHEDULE, seq=0, count=2 * flows)
        await stream_send(ctx, dut.host_rx, hdr.pack() + payload, 64)
        st = parse_stats(await stream_recv(ctx, dut.host_tx, 64))
        assert st["drop_count"] == 0 and st["control_refused"] == 0, st
        await stream_send(ctx, dut.host_rx, Header(opcode=Opcode.CONTROL, collective=5, src=1, hop=flows, seq=flows,
                                                   count=7).pack(), 64)
        assert parse_stats(await stream_recv(ctx, dut.host_tx, 64))["control_refused"] == 0
        for g in range(flows):
            await stream_send(ctx, dut.host_rx, frame(Header(opcode=Opcode.HOST_PUSH, collective=5, seq=g, hop=g,
                                                             count=n, src=1), local[g]), 64)
        for g in arrivals:
            await ctx.tick().repeat(gap)
            hdr = Header(opcode=Opcode.REDUCE, collective=5, seq=g, hop=g, count=n, src=0)
            await stream_send(ctx, dut.net0_in, frame(hdr, child[g]), 64)

    async def sums(ctx):
        for _ in arrivals:
            out.append(await stream_recv(ctx, dut.net1_out, 64, max_cycles=2000 + gap * len(arrivals)))

    simulate(dut, [host, sums])
    got = [Header.unpack(f) for f in out]
    assert all(h.opcode == Opcode.REDUCE for h in got)
    for h, f in zip(got, out):
        want = (child[h.seq] + local[h.seq]).view(np.uint32)
        assert np.array_equal(np.frombuffer(f[HEADER_BYTES:], dtype="<u4"), want)
    return [h.seq for h in got]


def test_unit_takes_the_next_chunk_when_the_oldest_is_late():
    """Lookahead of two: a unit whose oldest chunk's child frame has not come sums the next chunk first, and
    the late chunk afterwards; both sums are the table's order (child + local), bit for bit. An in-order
    unit (lookahead 1) waits for chunk 0."""
    assert unit_order(2, [1, 0]) == [1, 0]
    assert unit_order(2, [1, 0], lookahead=1) == [0, 1]


@pytest.mark.parametrize("lookahead,order", [(1, [0, 1, 2]), (2, [0, 2, 1]), (3, [2, 0, 1]), (4, [2, 0, 1])])
def test_unit_takes_the_third_chunk_with_lookahead_three(lookahead, order):
    """Child frames of chunks 2, 0, 1 in that order: with D = 3 (or 4, its last candidate past the last
    chunk) the unit sums chunk 2 while the two oldest wait; with D = 2 it can reach chunk 2 only once chunk 0
    is summed, in order (D = 1) only after chunk 1."""
    assert unit_order(3, [2, 0, 1], lookahead) == order


def test_multicast_goes_out_on_a_free_port_while_another_waits():
    """Output queues: a root's result for ports 0 and 1 and the host leaves on port 0, and reaches the host,
    while port 1's link holds its ``ready`` low; port 1 sends it (and the next chunk's) once its link
    takes frames again. With the old all-or-nothing allocator the multicast fed its ports in lock-step,
    so port 0 got no whole frame while port 1 was stalled."""
    from wirereduce.table import LOCAL, EngineEntry, encode_entry

    cfg = EngineConfig(64, 1500, slots=4, ports=2, max_flows=8)
    dut = Engine(cfg)
    n, chunks = 9, 2
    rng = np.random.default_rng(8)
    local = [rng.standard_normal(n).astype(np.float32) for _ in range(chunks)]
    payload = encode_entry(EngineEntry(table.ROOT, (LOCAL,), 0, 1, 0b11, True)).to_bytes(8, "little")
    got = {"host": [], "p0": [], "p1": []}
    when = {}

    async def host(ctx):
        await stream_send(ctx, dut.host_rx, Header(opcode=Opcode.SCHEDULE, seq=0, count=2).pack() + payload, 64)
        st = parse_stats(await stream_recv(ctx, dut.host_tx, 64))
        assert st["drop_count"] == 0 and st["control_refused"] == 0, st
        await stream_send(ctx, dut.host_rx, Header(opcode=Opcode.CONTROL, collective=5, src=3, hop=1, seq=chunks,
                                                   count=7).pack(), 64)
        assert parse_stats(await stream_recv(ctx, dut.host_tx, 64))["control_refused"] == 0
        for g in range(chunks):
            await stream_send(ctx, dut.host_rx, frame(Header(opcode=Opcode.HOST_PUSH, collective=5, seq=g, hop=0,
                                                             count=n, src=3), local[g]), 64)
        for _ in range(chunks):
            got["host"].append(await stream_recv(ctx, dut.host_tx, 64, max_cycles=2000))

    async def net(ctx):
        # port 1's link takes nothing (``ready`` low) until port 0 has sent both results whole
        for _ in range(chunks):
            got["p0"].append(await stream_recv(ctx, dut.net0_out, 64, max_cycles=3000))
        when["p0_done"] = True
        for _ in range(chunks):
            got["p1"].append(await stream_recv(ctx, dut.net1_out, 64, max_cycles=2000))

    simulate(dut, [host, net])
    assert when.get("p0_done")
    for key, opcode in (("p0", Opcode.BROADCAST), ("p1", Opcode.BROADCAST), ("host", Opcode.HOST_RESULT)):
        hs = [Header.unpack(f) for f in got[key]]
        assert [h.seq for h in hs] == list(range(chunks)) and all(h.opcode == opcode for h in hs), (key, hs)
        assert all(h.src == 3 for h in hs) or key == "host"
        for h, f in zip(hs, got[key]):
            assert np.array_equal(np.frombuffer(f[HEADER_BYTES:], dtype="<u4"), local[h.seq].view(np.uint32))


def test_out_queue_room_and_overflow():
    """OutQueue: ``room`` (registered) falls once a whole frame of ``max_beats`` more would not fit with the
    margin to spare; beats offered to a full queue are lost and each pulses ``overflow`` (what STATS
    ``drop_queue`` counts); the beats kept come out in order, cut-through."""
    from wirereduce.hdl.core.engine import OutQueue

    frames, mb, margin = 2, 5, 2
    depth = frames * mb + margin
    dut = OutQueue(64, frames, mb, margin=margin)
    seen = {"room": [], "overflow": 0, "out": []}

    async def tb(ctx):
        ctx.set(dut.o.ready, 0)
        for k in range(depth + 3):
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.payload.data, 1000 + k)
            _, _, room, ovf = await ctx.tick().sample(dut.room, dut.overflow)
            seen["room"].append(room)
            seen["overflow"] += ovf
        ctx.set(dut.i.valid, 0)
        await ctx.tick().repeat(2)
        assert not ctx.get(dut.room)
        ctx.set(dut.o.ready, 1)
        for _ in range(depth + 5):
            _, _, v, d = await ctx.tick().sample(dut.o.valid, dut.o.payload.data)
            if v:
                seen["out"].append(d)
        await ctx.tick().repeat(2)
        assert ctx.get(dut.room) and not ctx.get(dut.busy)

    simulate(dut, [tb])
    assert seen["overflow"] == 3, seen
    assert seen["out"] == [1000 + k for k in range(depth)], seen["out"]
    # room is registered (0 out of reset) from the level a cycle earlier: at the edge of write k it is up
    # while (k - 1) + margin <= depth - max_beats, i.e. k <= 6 (and 6 + max_beats = 11 <= depth: a frame
    # started then fits), down from k = 7 on
    assert seen["room"] == [0] + [1] * 6 + [0] * (depth + 3 - 7), seen["room"]
