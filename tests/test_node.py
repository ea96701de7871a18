"""Block tests of the node and the ring network in amaranth.sim (fast; no Verilog simulator)."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth_harness import HostPorts, simulate, stream_recv, stream_send
from wirereduce.hdl.core.node import Node
from wirereduce.host.driver import NodeSession, parse_stats
from wirereduce.sim.cluster.network import Network
from wirereduce.sim.golden.allreduce import bit_mismatches, ring_allreduce

from wirereduce.config import NodeConfig
from wirereduce.protocol import Header, Opcode, frame, max_elements

EDGE = np.array([0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45, 1.1754942e-38, 1.1754944e-38, -1.1754944e-38,
                 3.4028235e38, -3.4028235e38, np.inf, -np.inf, np.nan, 1e30, 1e-30, 0.5, 2.0 ** -24,
                 1.0 + 2.0 ** -23], dtype=np.float32)


def edge_arrays(nodes: int, n: int, seed: int) -> list[np.ndarray]:
    """Edge values and normals mixed, so every lane sees special cases against each other."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(nodes):
        a = rng.standard_normal(n).astype(np.float32) * np.float32(10.0) ** rng.integers(-30, 30, n).astype(np.float32)
        pick = rng.random(n) < 0.5
        a[pick] = rng.choice(EDGE, pick.sum())
        out.append(a.astype(np.float32))
    # Exact cancellation and a sum that becomes subnormal, at fixed positions.
    out[0][0], out[1][0] = np.float32(1.5), np.float32(-1.5)
    if n > 1:
        out[0][1], out[1][1] = np.float32(1.1754944e-38), np.float32(-1.1754942e-38)
    for a in out[2:]:
        a[:2] = 0.0
    return out


def run_ring(nodes: int, arrays, mtu=1500, ready_prob=1.0, seed=0):
    cfg = NodeConfig(64, mtu, slots=4)
    dut = Network(nodes, cfg, link_latency=3)
    hp = HostPorts(dut, 64, np.random.default_rng(seed), ready_prob)
    sessions = [NodeSession(k, nodes, 7, a, max_elements(mtu)) for k, a in enumerate(arrays)]
    stats = {}
    acked = set()  # ranks whose CONTROL answer has arrived: the collector reads the port after that

    def pusher(s):
        async def tb(ctx):
            await hp.send(ctx, s.rank, s.control_frame())
            s.check_ack(await hp.recv(ctx, s.rank))
            acked.add(s.rank)
            await ctx.tick().repeat(10)  # every node configured before the first chunk moves
            for f in s.push_frames():
                await hp.send(ctx, s.rank, f)
        return tb

    def collector(s):
        async def tb(ctx):
            while s.rank not in acked:
                await ctx.tick()
            while not s.done:
                s.receive(await hp.recv(ctx, s.rank))
            await ctx.tick().repeat(20)
            await hp.send(ctx, s.rank, Header(opcode=Opcode.STATS_REQUEST).pack())
            stats[s.rank] = parse_stats(await hp.recv(ctx, s.rank))
        return tb

    simulate(dut, [pusher(s) for s in sessions] + [collector(s) for s in sessions])
    return [s.result for s in sessions], stats


@pytest.mark.parametrize("nodes,n,ready_prob", [(2, 1, 1.0), (3, 5, 0.6), (2, 745, 0.8), (4, 371, 1.0)])
def test_ring_bitexact(nodes, n, ready_prob):
    arrays = edge_arrays(nodes, n, seed=nodes * 1000 + n)
    results, stats = run_ring(nodes, arrays, ready_prob=ready_prob)
    want = ring_allreduce(arrays)
    for k, r in enumerate(results):
        bad = bit_mismatches(r, want)
        assert bad.size == 0, f"node{k}: {bad.size} elements differ, first at {bad[:5]}"
    chunks = -(-n // max_elements(1500))
    for k in range(nodes):
        s = stats[k]
        assert s["result_frames"] == chunks and s["push_frames"] == chunks
        assert s["reduce_frames"] == (chunks if k > 0 else 0)
        assert s["broadcast_frames"] == (chunks if k < nodes - 1 else 0)
        assert all(v == 0 for name, v in s.items() if name.startswith("drop_")), s


def _rank1_of_3(testbench):
    """A lone node configured as rank 1 of 3, collective 9, one chunk of 3 elements pushed."""
    cfg = NodeConfig(64, 1500, slots=2)
    dut = Node(cfg)
    local = np.array([1.0, -2.5, 1e-45], dtype=np.float32)

    async def tb(ctx):
        await stream_send(ctx, dut.host_rx, Header(opcode=Opcode.CONTROL, collective=9, src=1, hop=3, seq=1).pack(), 64)
        parse_stats(await stream_recv(ctx, dut.host_tx, 64))
        await stream_send(ctx, dut.host_rx, frame(Header(opcode=Opcode.HOST_PUSH, collective=9, seq=0, count=3),
                                                  local), 64)
        await testbench(ctx, dut, local)

    simulate(dut, [tb])


def test_bad_ring_frames_are_dropped_counted_and_never_summed():
    incoming = np.array([3.0, 0.5, 1e-45], dtype=np.float32)
    good = Header(opcode=Opcode.REDUCE, collective=9, seq=0, count=3, src=0, hop=1)
    bad_frames = {
        "drop_opcode": frame(good.replace(opcode=0x55), incoming),
        "drop_collective": frame(good.replace(collective=8), incoming),
        "drop_seq": frame(good.replace(seq=1), incoming),
        "drop_version": frame(good.replace(version=9), incoming),
        "drop_count": frame(good.replace(count=2), incoming[:2]),
        "drop_short": good.pack()[:10],
    }
    seen = {}

    async def tb(ctx, dut, local):
        for f in bad_frames.values():
            await stream_send(ctx, dut.cw_in, f, 64)
        await stream_send(ctx, dut.cw_in, frame(good, incoming), 64)
        out = await stream_recv(ctx, dut.cw_out, 64)
        seen["out"] = out
        await stream_send(ctx, dut.host_rx, Header(opcode=Opcode.STATS_REQUEST).pack(), 64)
        seen["stats"] = parse_stats(await stream_recv(ctx, dut.host_tx, 64))
        seen["local"] = local

    _rank1_of_3(tb)
    hdr = Header.unpack(seen["out"])
    assert (hdr.opcode, hdr.src, hdr.hop, hdr.seq, hdr.count) == (Opcode.REDUCE, 1, 2, 0, 3)
    got = np.frombuffer(seen["out"][16:], dtype="<f4")
    want = (incoming + seen["local"]).astype(np.float32)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    stats = seen["stats"]
    for name in bad_frames:
        assert stats[name] == 1, (name, stats)
    assert stats["reduce_frames"] == 1


def test_bad_host_frames_are_dropped_and_counted():
    stats = {}
    cfg = NodeConfig(64, 1500, slots=2)
    dut = Node(cfg)

    async def tb(ctx):
        await stream_send(ctx, dut.host_rx, Header(opcode=Opcode.CONTROL, collective=4, src=0, hop=2, seq=2).pack(), 64)
        parse_stats(await stream_recv(ctx, dut.host_tx, 64))
        x = np.ones(4, np.float32)
        await stream_send(ctx, dut.host_rx, frame(Header(opcode=0xEE, collective=4, count=4), x), 64)
        await stream_send(ctx, dut.host_rx, frame(Header(opcode=Opcode.HOST_PUSH, collective=5, count=4), x), 64)
        await stream_send(ctx, dut.host_rx, frame(Header(opcode=Opcode.HOST_PUSH, collective=4, count=0), x), 64)
        await stream_send(ctx, dut.host_rx, Header(opcode=Opcode.STATS_REQUEST).pack(), 64)
        stats.update(parse_stats(await stream_recv(ctx, dut.host_tx, 64)))

    simulate(dut, [tb])
    assert stats["drop_opcode"] == 1 and stats["drop_collective"] == 1 and stats["drop_count"] == 1, stats
    assert stats["push_frames"] == 0


def test_port_counters_reach_stats_in_order():
    """The Ethernet ports' stats, through ``hdl/eth/port.port_counters`` and the node's generic
    ``port_counters`` input, land in STATS as ``link_drop_{port}`` (the rx drop sum) and
    ``{port}_{counter}``; a port that is not Ethernet reads 0."""
    from amaranth import Const, Module
    from wirereduce.hdl.core.status import PORT_COUNTERS
    from wirereduce.hdl.eth.port import RX_DROP_COUNTERS, port_counters

    from wirereduce.protocol import ETH_PORT_COUNTERS, STATS_COUNTERS

    assert STATS_COUNTERS[-len(PORT_COUNTERS):] == PORT_COUNTERS
    values = {port: {name: (0xF000_0000 | k << 8 | j) for j, name in enumerate(ETH_PORT_COUNTERS)}
              for k, port in enumerate(("cw", "ccw"))}
    m = Module()
    m.submodules.node = dut = Node(NodeConfig(64, 1500, slots=2))
    m.d.comb += dut.port_counters.eq(port_counters(
        {port: {name: Const(v, 32) for name, v in vs.items()} for port, vs in values.items()}))
    stats = {}

    async def tb(ctx):
        await stream_send(ctx, dut.host_rx, Header(opcode=Opcode.STATS_REQUEST).pack(), 64)
        stats.update(parse_stats(await stream_recv(ctx, dut.host_tx, 64)))

    simulate(m, [tb])
    for port in ("host", "cw", "ccw"):
        vs = values.get(port, dict.fromkeys(ETH_PORT_COUNTERS, 0))
        assert stats[f"link_drop_{port}"] == sum(vs[n] for n in RX_DROP_COUNTERS) % (1 << 32)
        for name in ETH_PORT_COUNTERS:
            assert stats[f"{port}_{name}"] == vs[name], (port, name)
    with pytest.raises(ValueError, match="ports"):
        port_counters({"west": values["cw"]})


def test_node_config_errors():
    with pytest.raises(ValueError, match="power of two"):
        NodeConfig(slots=3)
    with pytest.raises(ValueError, match="mtu"):
        NodeConfig(mtu=10)
    with pytest.raises(ValueError, match="width"):
        NodeConfig(width=96)
    with pytest.raises(ValueError, match="nodes"):
        Network(1)
