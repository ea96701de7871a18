"""Tests of wirereduce.host.driver: chunk planning, the sans-IO session and Cluster over a fake transport."""

from __future__ import annotations

import asyncio
import math
import struct
from collections.abc import Awaitable, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wirereduce.host.driver import (
    Allreduce,
    ChunksLost,
    Cluster,
    CollectiveIds,
    ControlRefused,
    DriverError,
    NodeSession,
    chunk_elements,
    default_window,
    gather_ranges,
    loss_report,
    parse_stats,
    plan_chunks,
    scatter_ranges,
)
from wirereduce.sim.golden import codec as G
from wirereduce.sim.golden.allreduce import ring_allreduce

from wirereduce import codec
from wirereduce.config import NodeConfig
from wirereduce.protocol import (
    HEADER_BYTES,
    STATS_COUNTERS,
    VERSION,
    Codec,
    Flag,
    Header,
    Opcode,
    ProtocolError,
    max_elements,
)

F32 = np.float32
FIXED = settings(derandomize=True, database=None, max_examples=200, deadline=None)


def _bits(x) -> np.ndarray:
    return np.asarray(x, dtype=F32).view(np.uint32)


def _mixed(rng: np.random.Generator, n: int) -> np.ndarray:
    """Normals of many magnitudes with subnormals, signed zeros, infinities and NaNs sprinkled in."""
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-20, 20, n)).astype(F32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -3e-42, 3.4e38], dtype=F32)
    pick = rng.random(n) < 0.2
    a[pick] = rng.choice(special, pick.sum())
    return a


def _stats_frame(values: dict[str, int], **hdr) -> bytes:
    """A STATS frame as a node sends it: header, then STATS_COUNTERS as little-endian u32."""
    h = Header(opcode=Opcode.STATS, count=len(STATS_COUNTERS), **hdr)
    return h.pack() + struct.pack(f"<{len(STATS_COUNTERS)}I", *(values.get(k, 0) for k in STATS_COUNTERS))


def _result_frame(collective: int, seq: int, values: np.ndarray, *, count: int | None = None,
                  opcode: int = Opcode.HOST_RESULT, src: int = 0) -> bytes:
    h = Header(opcode=opcode, collective=collective, seq=seq, src=src,
               count=values.size if count is None else count)
    return h.pack() + np.asarray(values, dtype="<f4").tobytes()


# --- plan_chunks ---------------------------------------------------------------------------------

def test_plan_chunks_exact_tiling():
    assert plan_chunks(12, 4) == [(0, 4), (4, 4), (8, 4)]
    assert plan_chunks(371, 371) == [(0, 371)]


def test_plan_chunks_last_shorter():
    assert plan_chunks(10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert plan_chunks(3, 371) == [(0, 3)]
    assert plan_chunks(1, 1) == [(0, 1)]


@FIXED
@given(st.integers(1, 5000), st.integers(1, 600))
def test_plan_chunks_covers_in_order(n, epf):
    chunks = plan_chunks(n, epf)
    assert len(chunks) == -(-n // epf)
    pos = 0
    for k, (off, cnt) in enumerate(chunks):
        assert off == pos and 1 <= cnt <= epf
        if k < len(chunks) - 1:
            assert cnt == epf
        pos += cnt
    assert pos == n


@pytest.mark.parametrize("n,epf", [(0, 4), (-1, 4), (5, 0), (5, -3)])
def test_plan_chunks_errors(n, epf):
    with pytest.raises(ValueError):
        plan_chunks(n, epf)


# --- parse_stats ---------------------------------------------------------------------------------

def test_parse_stats_round_trip():
    values = {name: (k * 2654435761 + 17) % (1 << 32) for k, name in enumerate(STATS_COUNTERS)}
    got = parse_stats(_stats_frame(values, collective=7, src=2, hop=4, seq=9))
    assert got == values
    assert list(got) == list(STATS_COUNTERS)


def test_parse_stats_errors():
    ok = _stats_frame({})
    with pytest.raises(ProtocolError, match="expected"):
        parse_stats(ok[:-1])
    with pytest.raises(ProtocolError, match="not a STATS"):
        parse_stats(Header(opcode=Opcode.HOST_RESULT).pack() + ok[HEADER_BYTES:])
    with pytest.raises(ProtocolError):
        parse_stats(ok[:HEADER_BYTES - 1])


# --- NodeSession -------------------------------------------------------------------------------

def _session(n=23, epf=5, rank=1, nodes=3, collective=42, seed=0) -> NodeSession:
    rng = np.random.default_rng(seed)
    return NodeSession(rank, nodes, collective, _mixed(rng, n), epf)


def test_session_construction_errors():
    x = np.ones(4, F32)
    with pytest.raises(ValueError, match="rank"):
        NodeSession(3, 3, 1, x, 2)
    with pytest.raises(ValueError, match="rank"):
        NodeSession(-1, 3, 1, x, 2)
    with pytest.raises(ValueError, match="16 bits"):
        NodeSession(0, 3, 1 << 16, x, 2)
    with pytest.raises(ValueError):
        NodeSession(0, 3, 1, x, 0)


def test_control_frame_fields():
    s = _session(n=23, epf=5, rank=2, nodes=4, collective=0xBEEF)
    raw = s.control_frame()
    assert len(raw) == HEADER_BYTES
    h = Header.unpack(raw)
    assert h.opcode == Opcode.CONTROL and h.version == VERSION
    assert h.collective == 0xBEEF
    assert h.src == 2            # the node's rank
    assert h.hop == 4            # the ring size
    assert h.seq == -(-23 // 5)  # the chunk total
    assert h.count == 0


def test_push_frames_reassemble():
    s = _session(n=23, epf=5, rank=1, collective=42)
    frames = list(s.push_frames())
    assert len(frames) == len(s.chunks) == 5
    payload = b""
    for k, f in enumerate(frames):
        h = Header.unpack(f)
        assert h.opcode == Opcode.HOST_PUSH and h.collective == 42 and h.src == 1 and h.seq == k
        assert h.count == (5 if k < 4 else 3)
        assert len(f) == HEADER_BYTES + 4 * h.count
        payload += f[HEADER_BYTES:]
    np.testing.assert_array_equal(np.frombuffer(payload, dtype="<f4").view(np.uint32), _bits(s.data))


def test_push_frames_fit_mtu():
    rng = np.random.default_rng(1)
    s = NodeSession(0, 2, 1, _mixed(rng, 1000), max_elements(1500))
    assert all(len(f) <= 1500 for f in s.push_frames())
    assert len(list(s.push_frames())) == -(-1000 // max_elements(1500))


def test_receive_reassembles_out_of_order():
    s = _session(n=23, epf=5, collective=42)
    rng = np.random.default_rng(3)
    want = _mixed(rng, 23)
    order = rng.permutation(len(s.chunks))
    for i, seq in enumerate(order):
        assert not s.done
        off, n = s.chunks[seq]
        s.receive(_result_frame(42, int(seq), want[off:off + n]))
        assert s.missing == sorted(int(k) for k in order[i + 1:])
    assert s.done and s.missing == [] and s.unexpected == []
    np.testing.assert_array_equal(_bits(s.result), _bits(want))


def test_receive_ignores_foreign_frames():
    s = _session(n=10, epf=5, collective=42)
    chunk = np.ones(5, F32)
    foreign = [
        _result_frame(43, 0, chunk),                         # another collective
        _result_frame(42, 0, chunk, opcode=Opcode.BROADCAST),  # another opcode
        _result_frame(42, 0, chunk, opcode=Opcode.HOST_PUSH),
        _stats_frame({"collective": 42}, collective=42),     # a STATS frame
    ]
    for f in foreign:
        assert s.receive(f) is False
    assert [h.opcode for h in s.unexpected] == [Opcode.HOST_RESULT, Opcode.BROADCAST, Opcode.HOST_PUSH,
                                                Opcode.STATS]
    assert s.missing == [0, 1] and not s.done
    assert not s.result.any()
    with pytest.raises(DriverError, match="out of range"):  # a chunk of this collective beyond its end
        s.receive(_result_frame(42, 2, chunk))


def test_receive_duplicate_chunk_raises():
    s = _session(n=10, epf=5, collective=42)
    f = _result_frame(42, 1, np.arange(5, dtype=F32))
    s.receive(f)
    with pytest.raises(DriverError, match="twice"):
        s.receive(f)


@pytest.mark.parametrize("count,elements", [(4, 4), (5, 4), (4, 5), (6, 6)])
def test_receive_length_mismatch_raises(count, elements):
    s = _session(n=10, epf=5, collective=42)  # chunk 0 has 5 elements
    with pytest.raises(DriverError, match="chunk 0"):
        s.receive(_result_frame(42, 0, np.ones(elements, F32), count=count))
    assert s.missing == [0, 1]


def test_receive_short_frame_raises_protocol_error():
    s = _session()
    with pytest.raises(ProtocolError):
        s.receive(b"\x01\x04")


def test_check_ack():
    """The answer is the STATS frame that echoes the CONTROL's request tag; one that shows another
    configuration means the node refused the CONTROL (ControlRefused, which says to pass abort=True);
    anything else is not the answer."""
    s = NodeSession(1, 3, 42, _mixed(np.random.default_rng(0), 23), 5, tag=0x1234)
    assert Header.unpack(s.control_frame()).count == 0x1234
    good = {"collective": 42, "rank": 1, "nodes": 3, "chunks": 5, "push_frames": 0, "request_tag": 0x1234}
    assert s.is_answer(_stats_frame(good))
    assert s.check_ack(_stats_frame(good))["chunks"] == 5
    for key, bad in (("collective", 41), ("rank", 0), ("nodes", 4), ("chunks", 4)):
        with pytest.raises(ControlRefused, match="abort=True") as info:
            s.check_ack(_stats_frame({**good, key: bad, "control_refused": 1}))
        assert info.value.rank == 1 and info.value.stats[key] == bad
        assert info.value.sent == {"collective": 42, "rank": 1, "nodes": 3, "chunks": 5}
    for other in (_stats_frame({**good, "request_tag": 0x1233}), _result_frame(42, 0, np.ones(14, F32))):
        assert not s.is_answer(other)
        with pytest.raises(DriverError, match="expected the STATS answer to CONTROL request 4660"):
            s.check_ack(other)
    with pytest.raises(ValueError, match="tag"):
        NodeSession(1, 3, 42, np.ones(4, F32), 2, tag=1 << 16)


# --- Cluster over a fake transport -------------------------------------------------------------

class FakeTransport:
    """N software "nodes" behind host ports: enough of a node to drive Cluster.

    CONTROL is answered with STATS echoing the configuration and the request tag, and refused
    (configuration unchanged, ``control_refused`` + 1) without ``Flag.ABORT`` while the node's
    collective has results left to send; HOST_PUSH chunks are collected; once every node has
    pushed chunk ``s``, the float32 sum in rank order is sent to every node as HOST_RESULT chunk
    ``s``. ``sent`` records every frame the driver sent. Time: one cycle is ``cycle_s`` seconds.
    """

    def __init__(self, nodes: int, *, reverse_results=False, noise=False, bad_ack_rank=None,
                 lose=None, timeout=2.0, window=None, mtu=9000, stray_stats=False, lost_flag=None,
                 result_header=None, cycle_s=1e-5):
        self.nodes = nodes
        self.cycle_s = cycle_s
        self.stray_stats = stray_stats          # a STATS answering someone else comes before each answer
        self.lost_flag = lost_flag              # (node, seq): a LOST placeholder instead of this result
        self.result_header = result_header      # fields to set in every result header
        self.finished = [0] * nodes             # results sent (or lost) of the current collective
        self.mtu = mtu
        self.eb_k = None                        # set by a compressed push: results go back compressed
        self.window = window                    # check: no push more than `window` ahead of results
        self.results_out = [0] * nodes
        self.sent: list[tuple[int, bytes]] = []
        self.inbox = [asyncio.Queue() for _ in range(nodes)]
        self.config = [None] * nodes  # (collective, rank, nodes, chunks)
        self.counters = [dict.fromkeys(STATS_COUNTERS, 0) for _ in range(nodes)]
        self.pushed: dict[int, dict[int, np.ndarray]] = {}
        self.held: list[tuple[int, bytes]] = []
        self.reverse_results = reverse_results  # deliver results last chunk first, at the end
        self.noise = noise                      # a frame of another collective before each result
        self.bad_ack_rank = bad_ack_rank        # this node reports a wrong rank in its STATS
        self.lose = lose                        # (node, seq): this result is never delivered
        self.timeout = timeout

    def _stats(self, node: int, tag: int = 0) -> bytes:
        c = self.counters[node]
        coll, rank, nodes, chunks = self.config[node] or (0, 0, 0, 0)
        c.update(collective=coll, rank=rank, nodes=nodes, chunks=chunks, request_tag=tag)
        if node == self.bad_ack_rank:
            c["rank"] = rank + 1
        return _stats_frame(c, collective=coll, src=rank, hop=nodes, seq=chunks)

    def _deliver(self, node: int, data: bytes) -> None:
        self.inbox[node].put_nowait(data)

    def _deliver_result(self, node: int, data: bytes) -> None:
        self.results_out[node] += 1
        self._deliver(node, data)

    async def send(self, node: int, data: bytes) -> None:
        self.sent.append((node, bytes(data)))
        await asyncio.sleep(0)  # let the other coroutines run, as a real port would
        h = Header.unpack(data)
        if self.stray_stats and h.opcode in (Opcode.CONTROL, Opcode.STATS_REQUEST):
            # Someone else's answer: another configuration and another tag.
            self.inbox[node].put_nowait(_stats_frame({"collective": 999, "rank": (node + 1) % self.nodes,
                                                      "nodes": self.nodes, "chunks": 77,
                                                      "request_tag": (h.count + 1) & 0xFFFF}))
        if h.opcode == Opcode.CONTROL:
            running = self.config[node] is not None and self.finished[node] < self.config[node][3]
            if running and not h.flags & Flag.ABORT:
                self.counters[node]["control_refused"] += 1
            else:
                self.config[node] = (h.collective, h.src, h.hop, h.seq)
                self.finished[node] = 0
                self.pushed = {}
            self._deliver(node, self._stats(node, h.count))
        elif h.opcode == Opcode.STATS_REQUEST:
            self._deliver(node, self._stats(node, h.count))
        elif h.opcode == Opcode.HOST_PUSH:
            coll, rank, nodes, chunks = self.config[node]
            assert h.collective == coll and h.seq < chunks and h.src == rank
            if h.codec == Codec.INCEPTIONN_V1:  # what a codec node's CodecIn does
                assert len(data) <= self.mtu, "a compressed push does not fit the MTU"
                self.eb_k = h.eb_k
                values = codec.decode(data[HEADER_BYTES:], h.count, h.eb_k)
            else:
                assert len(data) == HEADER_BYTES + 4 * h.count
                values = np.frombuffer(data, dtype="<f4", offset=HEADER_BYTES).astype(F32)
            self.counters[node]["push_frames"] += 1
            if self.window is not None:
                assert h.seq < self.results_out[node] + self.window, (
                    f"node {node} pushed chunk {h.seq} with only {self.results_out[node]} results back")
            got = self.pushed.setdefault(h.seq, {})
            assert rank not in got
            got[rank] = values
            if len(got) == self.nodes:
                self._finish(h.seq, coll, chunks)
        else:  # pragma: no cover - the driver sends nothing else
            raise AssertionError(f"unexpected frame from the driver: {h!r}")

    def _finish(self, seq: int, coll: int, chunks: int) -> None:
        parts = self.pushed.pop(seq)
        acc = parts[0].copy()
        if self.eb_k is not None:  # the compressed ring: every hop recompresses (golden model)
            acc = G.ring_allreduce_compressed([parts[r] for r in range(self.nodes)], self.eb_k)
        else:
            with np.errstate(all="ignore"):
                for r in range(1, self.nodes):  # rank order
                    acc = (acc + parts[r]).astype(F32)
        for node in range(self.nodes):
            if self.lose == (node, seq):
                continue
            self.finished[node] += 1
            rank = self.config[node][1]
            f = _result_frame(coll, seq, acc, src=rank)
            if self.eb_k is not None:
                h = Header.unpack(f).replace(codec=Codec.INCEPTIONN_V1, eb_k=self.eb_k)
                f = h.pack() + codec.encode(acc, self.eb_k)
            if self.result_header is not None:
                f = Header.unpack(f).replace(**self.result_header).pack() + f[HEADER_BYTES:]
            if self.lost_flag == (node, seq):
                f = Header.unpack(f).replace(flags=Flag.LOST).pack()  # header only
            if self.window is not None:  # results take a while to come back, as on a real ring
                asyncio.get_running_loop().call_later(0.002, self._deliver_result, node, f)
                continue
            if self.noise:
                self._deliver(node, _result_frame((coll + 1) & 0xFFFF, seq, acc))
            if self.reverse_results:
                self.held.append((node, f))
            else:
                self._deliver(node, f)
        if self.reverse_results and seq == chunks - 1:
            for node, f in reversed(self.held):
                self._deliver(node, f)
            self.held = []

    async def recv(self, node: int, timeout_cycles: int | None = None) -> bytes:
        wait = self.timeout if timeout_cycles is None else timeout_cycles * self.cycle_s
        try:
            return await asyncio.wait_for(self.inbox[node].get(), wait)
        except asyncio.TimeoutError as e:  # not the builtin TimeoutError before Python 3.11
            raise TimeoutError(f"node {node} sent its host nothing for {wait} s") from e

    def now(self) -> int:
        return int(asyncio.get_running_loop().time() / self.cycle_s)

    async def gather(self, coros: Sequence[Awaitable]) -> list:
        return list(await asyncio.gather(*coros))

    async def idle(self, cycles: int = 1) -> None:
        await asyncio.sleep(0)


def _arrays(nodes: int, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [_mixed(rng, n) for _ in range(nodes)]


def _assert_same_bits(got, want):
    got, want = np.asarray(got, F32), np.asarray(want, F32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(_bits(got)[ok], _bits(want)[ok])


@pytest.mark.parametrize("nodes,n,mtu,kw", [
    (2, 1, 1500, {}),
    (3, 1000, 1500, {}),
    (4, 50, HEADER_BYTES + 4 * 7, {}),                       # 8 chunks, the last one shorter
    (4, 56, HEADER_BYTES + 4 * 7, {"reverse_results": True}),  # results arrive out of order
    (5, 333, 400, {"noise": True}),                          # foreign frames interleaved
    (3, 5000, 9000, {}),
])
def test_cluster_allreduce_matches_golden(nodes, n, mtu, kw):
    arrays = _arrays(nodes, n, seed=nodes * 1000 + n)
    t = FakeTransport(nodes, **kw)
    cluster = Cluster(t, NodeConfig(mtu=mtu))
    results = asyncio.run(cluster.allreduce(arrays))
    want = ring_allreduce(arrays)
    assert len(results) == nodes
    for r in results:
        assert r.dtype == F32 and r.shape == (n,)
        _assert_same_bits(r, want)
    # the driver sent, per node: one CONTROL first, then every chunk in order
    chunks = -(-n // max_elements(mtu))
    for node in range(nodes):
        hdrs = [Header.unpack(d) for k, d in t.sent if k == node]
        assert hdrs[0].opcode == Opcode.CONTROL and hdrs[0].src == node and hdrs[0].hop == nodes
        assert [h.opcode for h in hdrs[1:]] == [Opcode.HOST_PUSH] * chunks
        assert [h.seq for h in hdrs[1:]] == list(range(chunks))
    # every CONTROL was sent before any HOST_PUSH, so no node sees chunks of an unknown collective
    ops = [Header.unpack(d).opcode for _, d in t.sent]
    assert ops[:nodes] == [Opcode.CONTROL] * nodes


def test_cluster_collective_ids_advance_and_wrap():
    arrays = _arrays(2, 10, seed=1)
    t = FakeTransport(2)
    cluster = Cluster(t)

    async def run_many():
        await cluster.allreduce(arrays)
        await cluster.allreduce(arrays)
        cluster.ids.next = 0xFFFF
        await cluster.allreduce(arrays)
        await cluster.allreduce(arrays)

    asyncio.run(run_many())
    ids = [Header.unpack(d).collective for k, d in t.sent if k == 0 and Header.unpack(d).opcode == Opcode.CONTROL]
    assert ids == [1, 2, 0xFFFF, 1]


def test_cluster_on_chunk_progress():
    calls = []
    t = FakeTransport(3)
    cluster = Cluster(t, NodeConfig(mtu=HEADER_BYTES + 4 * 4), on_chunk=lambda node, seq: calls.append((node, seq)))
    asyncio.run(cluster.allreduce(_arrays(3, 10, seed=2)))
    assert sorted(calls) == [(node, seq) for node in range(3) for seq in range(3)]


def test_cluster_on_chunk_progress_with_foreign_frames():
    calls = []
    t = FakeTransport(3, noise=True)
    cluster = Cluster(t, NodeConfig(mtu=HEADER_BYTES + 4 * 4), on_chunk=lambda node, seq: calls.append((node, seq)))
    asyncio.run(cluster.allreduce(_arrays(3, 10, seed=2)))
    assert sorted(calls) == [(node, seq) for node in range(3) for seq in range(3)]


def test_cluster_stats():
    t = FakeTransport(2)
    cluster = Cluster(t)
    asyncio.run(cluster.allreduce(_arrays(2, 400, seed=3)))
    stats = asyncio.run(cluster.stats(1))
    assert stats["rank"] == 1 and stats["nodes"] == 2 and stats["chunks"] == 2 and stats["push_frames"] == 2
    assert Header.unpack(t.sent[-1][1]).opcode == Opcode.STATS_REQUEST


def test_cluster_bad_ack_raises():
    t = FakeTransport(3, bad_ack_rank=2)
    with pytest.raises(DriverError, match="node 2"):
        asyncio.run(Cluster(t).allreduce(_arrays(3, 10, seed=4)))
    assert not any(Header.unpack(d).opcode == Opcode.HOST_PUSH for _, d in t.sent)


def test_cluster_lost_result_is_reported_with_counters():
    """A result that never comes: ChunksLost names the chunk and the node's drop counters (read
    with a STATS_REQUEST after the stall), and what did arrive is the golden sum, bit for bit."""
    t = FakeTransport(2, lose=(1, 1), timeout=0.05)
    t.counters[1]["link_drop_cw"] = 1  # what an Ethernet port that dropped a frame reports
    arrays = _arrays(2, 30, seed=5)
    with pytest.raises(ChunksLost) as info:
        asyncio.run(Cluster(t, NodeConfig(mtu=HEADER_BYTES + 4 * 10)).allreduce(arrays))
    err = info.value
    assert err.missing == {0: [], 1: [1]}
    assert "node 1: 2/3 result chunks, missing [1]" in str(err)
    assert "node 1: 1 frames spoilt on the link from rank − 1" in str(err)
    assert err.stats[1]["link_drop_cw"] == 1 and err.stats[0]["link_drop_cw"] == 0
    assert [Header.unpack(d).opcode for k, d in t.sent if k == 1][-1] == Opcode.STATS_REQUEST
    want = ring_allreduce(arrays)
    for rank, (res, got) in enumerate(zip(err.results, err.received)):
        for seq, (off, n) in enumerate(err.chunks):
            if got[seq]:
                _assert_same_bits(res[off:off + n], want[off:off + n])
            else:
                assert (rank, seq) == (1, 1)


def test_cluster_retries_the_lost_chunk():
    """With ``retries=1`` the lost chunk is summed again in a second collective of just its
    elements (one CONTROL with chunks = 1, one push per node) and put in place: the result is the
    golden sum, bit for bit, at every node. ``retries`` is checked before anything is sent."""
    t = FakeTransport(3, lose=(1, 1), timeout=0.05)
    arrays = _arrays(3, 30, seed=7)
    results = asyncio.run(Cluster(t, NodeConfig(mtu=HEADER_BYTES + 4 * 10)).allreduce(arrays, retries=1))
    want = ring_allreduce(arrays)
    for r in results:
        _assert_same_bits(r, want)
    controls = [Header.unpack(d) for k, d in t.sent if k == 0 and Header.unpack(d).opcode == Opcode.CONTROL]
    assert [(h.collective, h.seq) for h in controls] == [(1, 3), (2, 1)]  # 3 chunks, then the lost one
    pushes = [Header.unpack(d) for k, d in t.sent if k == 2 and Header.unpack(d).opcode == Opcode.HOST_PUSH]
    assert [(h.collective, h.count) for h in pushes] == [(1, 10)] * 3 + [(2, 10)]
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="retries"):
            asyncio.run(Cluster(FakeTransport(3)).allreduce(arrays, retries=bad))


def test_ranges_gather_and_scatter():
    a = np.arange(10, dtype=F32)
    ranges = [(2, 3), (8, 2)]
    (g,) = gather_ranges([a], ranges)
    assert g.tolist() == [2, 3, 4, 8, 9]
    out = scatter_ranges(np.zeros(10, F32), ranges, g * 10)
    assert out.tolist() == [0, 0, 20, 30, 40, 0, 0, 0, 80, 90]


def test_loss_report_without_counters():
    s = NodeSession(0, 2, 1, np.zeros(5, F32), 2)
    msg = loss_report([s], {0: None}, "the ring stalled")
    assert "node 0: 0/3 result chunks, missing [0, 1, 2]" in msg
    assert "node 0: did not answer a STATS_REQUEST" in msg and "no node's counters" in msg


def test_loss_report_names_an_engines_network_port():
    """An engine's STATS name its network ports (``link_drop_net{p}``): the report says which port's
    link spoilt frames, ports in numeric order, beside the node's own drop counters."""
    s = NodeSession(0, 2, 1, np.zeros(5, F32), 2)
    msg = loss_report([s], {0: {"link_drop_net10": 1, "link_drop_net2": 3, "link_drop_net0": 0, "drop_seq": 2}},
                      "the engines stalled")
    assert "node 0: 3 frames spoilt on the link into network port 2" in msg
    assert "node 0: 1 frames spoilt on the link into network port 10" in msg
    assert msg.index("network port 2") < msg.index("network port 10") < msg.index("[drop_seq]")
    assert "network port 0" not in msg


def _bad_inputs():
    good = _arrays(3, 8, seed=6)
    return {
        "float64": [good[0], good[1].astype(np.float64), good[2]],
        "unequal": [good[0], good[1][:7], good[2]],
        "empty": [good[0], good[1], np.zeros(0, F32)],
        "2-D": [good[0], good[1].reshape(2, 4), good[2]],
        "wrong count": good[:2],
    }


@pytest.mark.parametrize("case", list(_bad_inputs()))
def test_cluster_bad_inputs_send_nothing(case):
    t = FakeTransport(3)
    with pytest.raises(ValueError):
        asyncio.run(Cluster(t).allreduce(_bad_inputs()[case]))
    assert t.sent == []


@pytest.mark.parametrize("window", [1, 3, 8])
def test_cluster_window_limits_pushes_ahead_of_results(window):
    """With a window, no host pushes more than ``window`` chunks ahead of its results (the fake
    node asserts it on every push), and the sum is still the golden one."""
    nodes, mtu = 3, HEADER_BYTES + 4 * 5
    arrays = _arrays(nodes, 61, seed=window)
    t = FakeTransport(nodes, window=window)
    got = asyncio.run(Cluster(t, NodeConfig(mtu=mtu), window=window).allreduce(arrays))
    for g in got:
        _assert_same_bits(g, ring_allreduce(arrays))


@pytest.mark.parametrize("window", [0, -1, 2.5, True])
def test_cluster_rejects_bad_window(window):
    with pytest.raises(ValueError, match="window"):
        Cluster(FakeTransport(2), window=window)


def test_collective_ids_wrap():
    ids = CollectiveIds(0xFFFE)
    assert [ids.take() for _ in range(4)] == [0xFFFE, 0xFFFF, 1, 2]
    ids = CollectiveIds(0)
    assert [ids.take() for _ in range(2)] == [0, 1]
    for bad in (-1, 1 << 16, 1.0, True):
        with pytest.raises(ValueError, match="collective"):
            CollectiveIds(bad)


def test_chunk_elements_from_the_node_config():
    assert chunk_elements(NodeConfig(mtu=1500)) == max_elements(1500) == NodeConfig(mtu=1500).max_elements == 371
    assert chunk_elements(NodeConfig(mtu=9000), 10) == codec.max_elements_compressed(9000)
    assert default_window(NodeConfig(slots=16)) == 16
    with pytest.raises(ValueError, match="k must be"):
        chunk_elements(NodeConfig(), 3)


def _answer(rnd, lose=()):
    """Deliver the golden sum of every chunk of ``rnd`` to every host, except (rank, seq) in ``lose``."""
    want = ring_allreduce(rnd.arrays)
    for s in rnd.sessions:
        for seq, (off, n) in enumerate(s.chunks):
            if (s.rank, seq) not in lose:
                s.receive(_result_frame(rnd.collective, seq, want[off:off + n], src=s.rank))


def test_allreduce_plan_rounds_and_retries_sans_io():
    """The plan any engine carries out: the first round over every element (windowed pushes), then,
    for each loss while retries are left, a round of just the lost chunks' elements under the next
    collective id; the results put every round's sums in place."""
    arrays = _arrays(3, 45, seed=9)
    job = Allreduce(NodeConfig(mtu=HEADER_BYTES + 4 * 10), arrays, nodes=3, window=2, retries=2,
                    ids=CollectiveIds(0xFFFF))
    rnd = job.round
    assert (rnd.collective, rnd.chunks, job.frames) == (0xFFFF, [(0, 10), (10, 10), (20, 10), (30, 10), (40, 5)], 5)
    # request tags 1, 2, 3 for ranks 0, 1, 2; no ABORT in the first round
    assert Header.unpack(rnd.control(1)) == Header(opcode=Opcode.CONTROL, collective=0xFFFF, src=1, hop=3, seq=5,
                                                   count=2)
    assert [Header.unpack(rnd.control(k)).count for k in range(3)] == [1, 2, 3]
    assert all(Header.unpack(rnd.control(k)).flags == 0 for k in range(3))
    assert [(p.seq, p.after) for p in rnd.pushes(2)] == [(0, 0), (1, 0), (2, 1), (3, 2), (4, 3)]
    _answer(rnd, lose={(0, 1), (2, 4)})
    err = rnd.lost({0: None, 1: None, 2: None}, "the test stopped it")
    assert err.missing == {0: [1], 1: [], 2: [4]} and "node 0: 4/5 result chunks, missing [1]" in str(err)
    assert job.retry(err)
    rnd = job.round
    assert rnd.collective == 1 and rnd.chunks == [(0, 10), (10, 5)] and job.retried == 2
    # a retry round aborts the round that lost chunks (it never finished on some node); fresh tags
    assert [Header.unpack(rnd.control(k)).flags for k in range(3)] == [Flag.ABORT] * 3
    assert [Header.unpack(rnd.control(k)).count for k in range(3)] == [4, 5, 6]
    np.testing.assert_array_equal(rnd.arrays[1], np.concatenate([arrays[1][10:20], arrays[1][40:45]]))
    _answer(rnd, lose={(1, 0)})
    assert job.retry(rnd.lost({}, "again"))
    rnd = job.round
    assert rnd.collective == 2 and rnd.chunks == [(0, 10)] and job.retried == 3
    _answer(rnd)
    for r in job.results():
        _assert_same_bits(r, ring_allreduce(arrays))
    assert not job.retry(rnd.lost({}, "no retries left"))


def test_allreduce_plan_checks_before_any_round():
    good = _arrays(2, 8, seed=1)
    for kw, match in (({"retries": -1}, "retries"), ({"window": 0}, "window"), ({"compression": 25}, "k must be"),
                      ({"nodes": 3}, "expected 3 arrays")):
        ids = CollectiveIds()
        with pytest.raises(ValueError, match=match):
            Allreduce(NodeConfig(), good, ids=ids, **kw)
        assert ids.next == 1, "no collective id is used up by a plan that is refused"


def test_results_needed_rule():
    rule = NodeSession.results_needed
    assert [rule(s, 3) for s in range(6)] == [0, 0, 0, 1, 2, 3]
    assert [rule(s, None) for s in range(3)] == [0, 0, 0] == [rule(s, 0) for s in range(3)]


# --- compression ----------------------------------------------------------------------------------


@pytest.mark.parametrize("nodes,n,mtu,k", [(2, 1, 1500, 8), (4, 2000, 1500, 10), (3, 5000, 9000, 12)])
def test_cluster_compressed_allreduce_matches_golden(nodes, n, mtu, k):
    """Pushes go out compressed (codec header, k, at most max_elements_compressed per chunk) and the
    compressed results decode to the golden compressed ring's sum, bit for bit."""
    rng = np.random.default_rng(n + k)
    arrays = [(rng.standard_normal(n) * 10.0 ** rng.integers(-6, 1, n)).astype(F32) for _ in range(nodes)]
    arrays[0][:3] = [np.inf, -0.0, 3e-42][:min(3, n)]
    t = FakeTransport(nodes, mtu=mtu)
    results = asyncio.run(Cluster(t, NodeConfig(mtu=mtu)).allreduce(arrays, compression=k))
    want = G.ring_allreduce_compressed(arrays, k, host_compressed=True)
    for r in results:
        _assert_same_bits(r, want)
    pushes = [Header.unpack(d) for _, d in t.sent if Header.unpack(d).opcode == Opcode.HOST_PUSH]
    assert all(h.codec == Codec.INCEPTIONN_V1 and h.eb_k == k for h in pushes)
    assert max(h.count for h in pushes) == min(n, codec.max_elements_compressed(mtu))
    assert len(pushes) == nodes * -(-n // codec.max_elements_compressed(mtu))


@pytest.mark.parametrize("k", [3, 25, 2.0, "8"])
def test_cluster_bad_compression_sends_nothing(k):
    t = FakeTransport(2)
    with pytest.raises((ValueError, TypeError)):
        asyncio.run(Cluster(t).allreduce(_arrays(2, 8, seed=1), compression=k))
    assert t.sent == []


def test_receive_compressed_result_errors():
    s = NodeSession(0, 2, 1, np.ones(8, F32), 8, compression=10)
    h = Header(opcode=Opcode.HOST_RESULT, collective=1, seq=0, count=8, codec=Codec.INCEPTIONN_V1, eb_k=10)
    good = codec.encode(np.full(8, 0.5, F32), 10)
    with pytest.raises(DriverError, match="malformed"):
        s.receive(h.pack() + good[:-1])
    with pytest.raises(DriverError, match="count 7"):
        s.receive(h.replace(count=7).pack() + good)
    s.receive(h.pack() + good)
    assert (s.result == 0.5).all() and s.done


# --- request tags, refused CONTROL, result checks, lost chunks, deadlines (issue 14) ---------------


def test_stray_stats_before_the_answer_is_not_the_acknowledgement():
    """Before every answer the fake node delivers a STATS frame answering someone else (another
    configuration, another tag). Matched by request tag, it is skipped: the allreduce and a
    STATS read both get their own answers. Every request carries a fresh tag."""
    arrays = _arrays(3, 25, seed=21)
    t = FakeTransport(3, stray_stats=True)
    cluster = Cluster(t, NodeConfig(mtu=HEADER_BYTES + 4 * 10))

    async def run():
        res = await cluster.allreduce(arrays)
        return res, await cluster.stats(2)

    results, stats = asyncio.run(run())
    for r in results:
        _assert_same_bits(r, ring_allreduce(arrays))
    assert (stats["collective"], stats["rank"], stats["chunks"], stats["push_frames"]) == (1, 2, 3, 3)
    tags = [Header.unpack(d).count for _, d in t.sent
            if Header.unpack(d).opcode in (Opcode.CONTROL, Opcode.STATS_REQUEST)]
    assert sorted(tags) == [1, 2, 3, 4] and stats["request_tag"] == 4


def test_control_refused_while_running_then_abort():
    """A node whose collective lost a chunk never finished it: a new allreduce without ``abort`` is
    refused by that node (ControlRefused names it, what it runs, and says to pass abort=True; no push
    is sent), and with ``abort=True`` the new collective runs to the golden sum."""
    arrays = _arrays(3, 30, seed=22)
    t = FakeTransport(3, lose=(1, 2))
    cluster = Cluster(t, NodeConfig(mtu=HEADER_BYTES + 4 * 10))
    with pytest.raises(ChunksLost):
        asyncio.run(cluster.allreduce(arrays))
    assert cluster.unfinished
    cluster.unfinished = False  # as a driver started afresh, which does not know what it left running
    t.lose = None
    pushes = sum(Header.unpack(d).opcode == Opcode.HOST_PUSH for _, d in t.sent)
    with pytest.raises(ControlRefused, match=r"node 1 refused the CONTROL of collective 2 .* running collective 1 "
                                             r"\(rank 1 of 3, 3 chunks\).*abort=True") as info:
        asyncio.run(cluster.allreduce(arrays))
    assert info.value.rank == 1 and info.value.stats["control_refused"] == 1
    assert sum(Header.unpack(d).opcode == Opcode.HOST_PUSH for _, d in t.sent) == pushes, "nothing pushed"
    results = asyncio.run(cluster.allreduce(arrays, abort=True))
    for r in results:
        _assert_same_bits(r, ring_allreduce(arrays))
    controls = [Header.unpack(d) for k, d in t.sent if k == 1 and Header.unpack(d).opcode == Opcode.CONTROL]
    assert [(h.collective, h.flags) for h in controls] == [(1, 0), (2, 0), (3, Flag.ABORT)]


def test_next_allreduce_aborts_what_a_lost_one_left_running():
    """The cluster remembers that its last allreduce lost chunks: the next one aborts the collective
    left running (ABORT on its CONTROL frames) and is bit-exact; the one after that needs no abort."""
    arrays = _arrays(3, 30, seed=23)
    t = FakeTransport(3, lose=(1, 2))
    cluster = Cluster(t, NodeConfig(mtu=HEADER_BYTES + 4 * 10))
    with pytest.raises(ChunksLost):
        asyncio.run(cluster.allreduce(arrays))
    t.lose = None
    for _ in range(2):
        for r in asyncio.run(cluster.allreduce(arrays)):
            _assert_same_bits(r, ring_allreduce(arrays))
    assert not cluster.unfinished
    controls = [Header.unpack(d) for k, d in t.sent if k == 1 and Header.unpack(d).opcode == Opcode.CONTROL]
    assert [h.flags for h in controls] == [0, Flag.ABORT, 0]


def test_control_carries_dtype_codec_and_k():
    plain = NodeSession(0, 2, 5, np.ones(4, F32), 2)
    packed = NodeSession(0, 2, 5, np.ones(4, F32), 2, compression=12, abort=True)
    h, hc = Header.unpack(plain.control_frame()), Header.unpack(packed.control_frame())
    assert (h.dtype, h.codec, h.eb_k, h.flags) == (1, Codec.NONE, 0, 0)
    assert (hc.dtype, hc.codec, hc.eb_k, hc.flags) == (1, Codec.INCEPTIONN_V1, 12, Flag.ABORT)


@pytest.mark.parametrize("compression,fields,match", [
    (None, {"codec": Codec.INCEPTIONN_V1, "eb_k": 10}, "asked for uncompressed"),
    (None, {"eb_k": 3}, "asked for uncompressed"),
    (10, {"codec": Codec.NONE, "eb_k": 0}, "asked for compressed with k = 10"),
    (10, {"eb_k": 11}, "asked for compressed with k = 10"),
    (None, {"dtype": 2}, "dtype 2"),
    (None, {"flags": 0x04}, "flags 0x04"),
    (None, {"flags": Flag.LOST | 0x01}, "flags 0x03"),
])
def test_receive_refuses_a_result_with_other_fields(compression, fields, match):
    """A result of this collective whose dtype, codec, eb_k or flags are not what the session asked
    for is refused (DriverError), and nothing of it is taken."""
    s = NodeSession(0, 2, 1, np.ones(8, F32), 8, compression=compression)
    h = Header(opcode=Opcode.HOST_RESULT, collective=1, seq=0, count=8, codec=s.codec, eb_k=s.eb_k).replace(**fields)
    values = np.full(8, 0.5, F32)
    payload = codec.encode(values, h.eb_k) if h.codec == Codec.INCEPTIONN_V1 else values.astype("<f4").tobytes()
    with pytest.raises(DriverError, match=match):
        s.receive(h.pack() + payload)
    assert not s.received.any() and not s.lost.any() and not s.result.any()


def test_cluster_uncompressed_session_refuses_a_compressed_result():
    t = FakeTransport(2, result_header={"codec": Codec.INCEPTIONN_V1, "eb_k": 10})
    with pytest.raises(DriverError, match="refused"):
        asyncio.run(Cluster(t).allreduce(_arrays(2, 8, seed=23)))


def test_lost_results_are_reported_missing_not_values():
    """A HOST_RESULT with Flag.LOST reports its chunk lost: missing, not an error, not a value. The
    round ends as soon as every chunk is received or reported (no deadline wait), ChunksLost tells
    the lost chunk from the received ones per rank, and a retry recovers it bit-exact."""
    s = NodeSession(0, 2, 1, np.ones(8, F32), 4)
    assert s.receive(Header(opcode=Opcode.HOST_RESULT, collective=1, seq=1, count=4, flags=Flag.LOST).pack())
    assert s.reported_lost == [1] and s.missing == [0, 1] and s.never_arrived == [0] and not s.settled
    with pytest.raises(DriverError, match="twice"):
        s.receive(Header(opcode=Opcode.HOST_RESULT, collective=1, seq=1, count=4, flags=Flag.LOST).pack())

    arrays = _arrays(3, 30, seed=24)
    t = FakeTransport(3, lost_flag=(2, 1), cycle_s=1.0)  # a deadline of hours: the round must not wait for it
    cluster = Cluster(t, NodeConfig(mtu=HEADER_BYTES + 4 * 10))
    with pytest.raises(ChunksLost, match="reported chunks lost") as info:
        asyncio.run(cluster.allreduce(arrays))
    err = info.value
    assert err.missing == {0: [], 1: [], 2: [1]} and err.reported_lost == {0: [], 1: [], 2: [1]}
    assert err.never_arrived == {0: [], 1: [], 2: []}
    msg = str(err)
    assert "node 2: 2/3 result chunks, missing [1] (reported lost by the node: [1])" in msg
    assert "node 0: 3/3 result chunks, all received" in msg and "every check" in msg
    assert not err.received[2][1] and not err.results[2][10:20].any()
    want = ring_allreduce(arrays)
    for rank, got in enumerate(err.received):
        for seq, (off, n) in enumerate(err.chunks):
            if got[seq]:
                _assert_same_bits(err.results[rank][off:off + n], want[off:off + n])
    t.lost_flag = None
    for r in asyncio.run(cluster.allreduce(arrays, retries=1, abort=True)):
        _assert_same_bits(r, want)


def test_never_arrived_is_told_from_reported_lost():
    s = NodeSession(0, 2, 1, np.ones(12, F32), 4)
    s.receive(Header(opcode=Opcode.HOST_RESULT, collective=1, seq=0, count=4, flags=Flag.LOST).pack())
    s.receive(_result_frame(1, 2, np.ones(4, F32)))
    msg = loss_report([s], {0: None}, "the test stopped")
    assert "node 0: 1/3 result chunks, missing [0, 1] (reported lost by the node: [0]; never arrived: [1])" in msg


def test_deadline_from_size_nodes_and_link_rate():
    """The deadline is 4 × the expected time + 5,000 cycles; the expected time is the message's
    wire bytes over one link plus 2N + 2 hops of 64 cycles and one worst-case frame each
    (docs/architecture.md "Stall detection")."""
    from wirereduce.host.driver import (
        DEADLINE_FACTOR,
        DEADLINE_SLACK_CYCLES,
        HOP_CYCLES,
        check_timeout,
        deadline_cycles,
        expected_cycles,
    )

    from wirereduce.protocol import wire_bytes

    assert (DEADLINE_FACTOR, DEADLINE_SLACK_CYCLES, HOP_CYCLES) == (4, 5_000, 64)
    chunks = plan_chunks(1000, 371)  # 371, 371, 258 elements
    frames = [wire_bytes(16 + 4 * n + 8 * -(-n // 32)) for _, n in chunks]
    want = math.ceil(sum(frames) / 8 + 10 * (64 + max(frames) / 8))
    assert expected_cycles(chunks, 4, 8) == want
    assert deadline_cycles(chunks, 4, 8) == 4 * want + 5_000
    assert deadline_cycles(chunks, 4, 8, slowdown=2.5) == math.ceil(4 * want * 2.5) + 5_000
    assert expected_cycles(chunks, 4, 4) > expected_cycles(chunks, 4, 8)  # slower links, later
    big = plan_chunks(10_000, 371)  # 9,000 elements more: their wire time more, the fill the same
    more = sum(wire_bytes(16 + 4 * n + 8 * -(-n // 32)) for _, n in big) - sum(frames)
    assert abs(expected_cycles(big, 4, 8) - expected_cycles(chunks, 4, 8) - more / 8) <= 1
    trip = 10 * (64 + max(frames) / 8)  # a small window: chunks / window round trips at least
    assert expected_cycles(chunks, 4, 8, window=1) == math.ceil(2 * trip + trip)  # one chunk a trip
    assert expected_cycles(chunks, 4, 8, window=3) == want  # every chunk in flight at once: no limit
    assert deadline_cycles(chunks, 4, 8, window=1) == 4 * math.ceil(3 * trip) + 5_000
    cluster = Cluster(FakeTransport(4), NodeConfig(mtu=1500), link_rate=8)
    rnd = cluster.plan(_arrays(4, 1000, seed=1)).round
    assert cluster.deadline(rnd) == 4 * want + 5_000
    assert Cluster(FakeTransport(4), timeout_cycles=123).deadline(rnd) == 123
    for bad in (0, -5, 1.5, True, "9"):
        with pytest.raises(ValueError, match="timeout"):
            check_timeout(bad)
        with pytest.raises(ValueError, match="timeout"):
            Cluster(FakeTransport(2), timeout_cycles=bad)
    with pytest.raises(ValueError, match="slowdown"):
        deadline_cycles(chunks, 4, 8, slowdown=0.5)


def test_stall_ends_at_the_deadline():
    """A result that never comes ends the round at its deadline (not after a fixed quiet time)."""
    t = FakeTransport(2, lose=(0, 0), cycle_s=1e-5)
    cluster = Cluster(t, timeout_cycles=3_000)  # 30 ms

    async def run():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(ChunksLost, match="deadline of 3,000 cycles"):
            await cluster.allreduce(_arrays(2, 8, seed=25))
        return loop.time() - t0

    took = asyncio.run(run())
    assert 0.03 <= took < 0.03 + 2 * 0.05 + 0.5  # the deadline, then two STATS round trips


def test_parse_stats_of_an_engine():
    """A STATS frame whose ``count`` is a schedule engine's layout decodes under the engine's
    names (network ports ``net0`` …), and a short one is refused."""
    from wirereduce.protocol import engine_stats_counters

    names = engine_stats_counters(4)
    values = {name: (k * 40503 + 5) % (1 << 32) for k, name in enumerate(names)}
    data = (Header(opcode=Opcode.STATS, count=len(names)).pack()
            + struct.pack(f"<{len(names)}I", *(values[k] for k in names)))
    got = parse_stats(data)
    assert got == values and list(got) == list(names)
    assert got["link_drop_net3"] == values["link_drop_net3"]
    with pytest.raises(ProtocolError, match="expected"):
        parse_stats(data[:-4])
