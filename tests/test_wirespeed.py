"""Wire speed of one node in amaranth.sim: one beat per cycle, frames back to back, at 64 and 512 bit.

Every test drives a lone :class:`~wirereduce.hdl.core.node.Node` through its six stream ports from
async testbenches: a CONTROL frame configures the rank, the host pushes its local chunks, then
back-to-back streams of frames enter the ring or host inputs while every output is watched beat
by beat. Results are checked bit for bit against numpy float32 sums computed here, in the order
``incoming + local``.
"""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator
from amaranth_harness import to_beats
from wirereduce.hdl.arith.fp32 import CANONICAL_NAN
from wirereduce.hdl.core.node import Node
from wirereduce.host.driver import parse_stats
from wirereduce.sim.bench.latency import engine_hop_latency, hop_latency

from wirereduce.config import NodeConfig
from wirereduce.protocol import HEADER_BYTES, Header, Opcode, frame, max_elements

COLLECTIVE = 21
NODES = 3
SPECIAL = np.array([0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, -1.1754944e-38, 3.4028235e38, -3.4028235e38,
                    np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0 ** -24], dtype=np.float32)

INPUTS = ("host_rx", "cw_in", "ccw_in")
OUTPUTS = ("host_tx", "cw_out", "ccw_out")


# --- data -------------------------------------------------------------------------------------

def values(rng: np.random.Generator, n: int) -> np.ndarray:
    """fp32 values of many magnitudes, with IEEE special values mixed in."""
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)).astype(np.float32)
    pick = rng.random(n) < 0.15
    a[pick] = rng.choice(SPECIAL, int(pick.sum()))
    return a


def fp32_sum(incoming: np.ndarray, local: np.ndarray) -> np.ndarray:
    """``incoming + local`` in float32, as uint32 bits; NaN results are the adder's canonical NaN."""
    with np.errstate(all="ignore"):
        s = (incoming.astype(np.float32) + local.astype(np.float32)).astype(np.float32)
    bits = s.view(np.uint32).copy()
    bits[np.isnan(s)] = CANONICAL_NAN
    return bits


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype="<f4").view(np.uint32)


def chunk_counts(cfg: NodeConfig) -> list[int]:
    """Mixed frame sizes: the shortest (1 element), the largest, odd and even ones."""
    mx = max_elements(cfg.mtu)
    return [1, mx, 1, 13, mx - 1]


# --- simulation -------------------------------------------------------------------------------

class Clock:
    """Counts the ticks one testbench has waited for; every testbench starts at cycle 0."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.n = 0

    async def tick(self, *signals):
        sampled = await self.ctx.tick().sample(*signals)
        self.n += 1
        return sampled[2:]


class Record:
    """What happened on the ports: per output the received frames, with each beat's cycle."""

    def __init__(self):
        self.frames = {p: [] for p in OUTPUTS}        # [(bytes, [cycle, ...], [(keep, last), ...])]
        self.accepted = {p: [] for p in INPUTS}       # cycles an input beat was taken
        self.stalled = {p: [] for p in INPUTS}        # cycles an input beat was offered and refused
        self.extra = {p: 0 for p in OUTPUTS}          # beats after the expected frames
        self.ack = None
        self.stats = None

    def out_bytes(self, port):
        return [f for f, _, _ in self.frames[port]]

    def out_cycles(self, port):
        return [c for _, cyc, _ in self.frames[port] for c in cyc]


def run_node(cfg: NodeConfig, rank: int, *, pre_push=(), streams=None, expect=None,
             valid_prob=1.0, ready_prob=1.0, seed=0, stats=True, max_cycles=60000) -> Record:
    """Configure a lone node as ``rank`` of :data:`NODES` and run frame streams through it.

    ``pre_push`` frames go to ``host_rx`` after the CONTROL acknowledgement and before any stream
    starts; ``streams`` maps input ports to frames sent from one common start cycle; ``expect``
    maps output ports to the number of data frames (not STATS) each must deliver. With
    ``valid_prob`` / ``ready_prob`` below 1, every input leaves random gaps and every output
    drops ``ready`` at random (seeded). With ``stats`` a STATS_REQUEST at the end reads the
    counters into ``Record.stats``.
    """
    streams = streams or {}
    expect = expect or {}
    w = cfg.width
    n_chunks = max([len(f) for f in streams.values()] + [len(pre_push)] + [1])
    dut = Node(cfg)
    rec = Record()
    st = {"go": None, "done": set(), "end": False}
    master = np.random.default_rng(seed)
    rngs = {p: np.random.default_rng(master.integers(1 << 32)) for p in INPUTS + OUTPUTS}

    async def send(clk, port, frames, rng, port_name=None, log=False):
        for f in frames:
            for word, keep, last in to_beats(f, w):
                while True:
                    v = rng is None or rng.random() < valid_prob
                    ctx = clk.ctx
                    if v:
                        ctx.set(port.payload.data, word)
                        ctx.set(port.payload.keep, keep)
                        ctx.set(port.payload.last, last)
                    ctx.set(port.valid, int(v))
                    (r,) = await clk.tick(port.ready)
                    if log and v:
                        (rec.accepted if r else rec.stalled)[port_name].append(clk.n)
                    if v and r:
                        break
                    assert clk.n < max_cycles, f"{port_name}: stuck"
        clk.ctx.set(port.valid, 0)

    async def wait_go(clk):
        while st["go"] is None or clk.n < st["go"]:
            await clk.tick()
            assert clk.n < max_cycles, "never started"

    def driver(name):
        async def tb(ctx):
            clk = Clock(ctx)
            port = getattr(dut, name)
            rng = rngs[name] if valid_prob < 1 else None
            if name == "host_rx":
                control = Header(opcode=Opcode.CONTROL, collective=COLLECTIVE, src=rank, hop=NODES, seq=n_chunks)
                await send(clk, port, [control.pack()], None)
                while rec.ack is None:
                    await clk.tick()
                await send(clk, port, pre_push, None)
                st["go"] = clk.n + 2
            await wait_go(clk)
            await send(clk, port, streams.get(name, []), rng, name, log=True)
            if name == "host_rx" and stats:
                while st["done"] != set(expect):
                    await clk.tick()
                    assert clk.n < max_cycles, f"outputs not done: {st['done']} of {set(expect)}"
                await send(clk, port, [Header(opcode=Opcode.STATS_REQUEST).pack()], None)
        return tb

    def monitor(name):
        async def tb(ctx):
            clk = Clock(ctx)
            port = getattr(dut, name)
            p = port.payload
            rng = rngs[name] if ready_prob < 1 else None
            want = expect.get(name, 0)
            cur, cyc, meta = b"", [], []

            def finished():
                return len(rec.frames[name]) >= want and (name != "host_tx" or rec.stats is not None or not stats)

            while not (finished() and (name != "host_tx" or rec.ack is not None)):
                r = 1 if rng is None else int(rng.random() < ready_prob)
                ctx.set(port.ready, r)
                v, data, keep, last = await clk.tick(port.valid, p.data, p.keep, p.last)
                assert clk.n < max_cycles, f"{name}: {len(rec.frames[name])} of {want} frames after {clk.n} cycles"
                if not (v and r):
                    continue
                cur += int(data).to_bytes(w // 8, "little")
                cyc.append(clk.n)
                meta.append((int(keep), int(last)))
                if not last:
                    continue
                f = cur[:len(cur) - w // 8 + bin(int(keep)).count("1")]
                beats_cyc, beats_meta = cyc, meta
                cur, cyc, meta = b"", [], []
                if name == "host_tx" and Header.unpack(f).opcode == Opcode.STATS:
                    if rec.ack is None:
                        rec.ack = parse_stats(f)
                    else:
                        rec.stats = parse_stats(f)
                    continue
                rec.frames[name].append((f, beats_cyc, beats_meta))
                if len(rec.frames[name]) == want:
                    st["done"].add(name)
            if name == "host_tx":
                st["end"] = True
            # Nothing more may come out (no duplicated beat or frame) until the host is done.
            quiet = 0
            while quiet < 40 or not st["end"]:
                ctx.set(port.ready, 1)
                (v,) = await clk.tick(port.valid)
                rec.extra[name] += int(v)
                quiet += 1
                assert clk.n < max_cycles, f"{name}: never ended"
            ctx.set(port.ready, 0)
        return tb

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for name in INPUTS:
        sim.add_testbench(driver(name))
    for name in OUTPUTS:
        sim.add_testbench(monitor(name))
    sim.run()
    assert rec.ack is not None
    assert (rec.ack["rank"], rec.ack["nodes"], rec.ack["collective"], rec.ack["chunks"]) == \
        (rank, NODES, COLLECTIVE, n_chunks)
    for name in OUTPUTS:
        assert len(rec.frames[name]) == expect.get(name, 0), (name, len(rec.frames[name]))
        assert rec.extra[name] == 0, f"{name}: {rec.extra[name]} beats beyond the expected frames"
    return rec


# --- scenarios --------------------------------------------------------------------------------

def chunk_data(counts, seed):
    """Per chunk: (incoming values, local values), ``counts[k]`` elements each."""
    rng = np.random.default_rng(seed)
    return [(values(rng, n), values(rng, n)) for n in counts]


def push_frames(data, rank):
    return [frame(Header(opcode=Opcode.HOST_PUSH, collective=COLLECTIVE, seq=s, count=len(loc), src=rank), loc)
            for s, (_, loc) in enumerate(data)]


def ring_frames(data, opcode, src, hop):
    return [frame(Header(opcode=opcode, collective=COLLECTIVE, seq=s, count=len(inc), src=src, hop=hop), inc)
            for s, (inc, _) in enumerate(data)]


def check_frames(got: list[bytes], want_bits: list[np.ndarray], opcode, src, hop):
    """Header rewritten as expected, other fields kept, payload bit-exact."""
    assert len(got) == len(want_bits)
    for s, (f, wb) in enumerate(zip(got, want_bits)):
        h = Header.unpack(f)
        assert (h.opcode, h.src, h.hop) == (opcode, src, hop), (s, h)
        assert (h.collective, h.seq, h.count, h.version) == (COLLECTIVE, s, len(wb), 1), (s, h)
        assert len(f) == HEADER_BYTES + 4 * len(wb), (s, len(f))
        payload = np.frombuffer(f[HEADER_BYTES:], dtype="<u4")
        bad = np.flatnonzero(payload != wb)
        assert bad.size == 0, f"frame {s}: {bad.size} elements differ, first at {bad[:5]}: " \
                              f"{payload[bad[:5]]} != {wb[bad[:5]]}"


def check_beats(rec: Record, port: str, width: int):
    """Each output beat is well formed: keep all ones except on the last beat, contiguous."""
    full = (1 << (width // 8)) - 1
    for _f, _, meta in rec.frames[port]:
        for k, (keep, last) in enumerate(meta):
            assert last == (k == len(meta) - 1)
            if last:
                assert keep & (keep + 1) == 0 and keep != 0, hex(keep)
            else:
                assert keep == full, hex(keep)


def assert_no_idle(rec: Record, port: str):
    cyc = rec.out_cycles(port)
    assert cyc, port
    assert cyc[-1] - cyc[0] + 1 == len(cyc), \
        f"{port}: {len(cyc)} beats took {cyc[-1] - cyc[0] + 1} cycles; idle after cycles " \
        f"{[a for a, b in zip(cyc, cyc[1:]) if b != a + 1][:10]}"


def assert_never_stalled(rec: Record, port: str, nbeats: int):
    assert rec.stalled[port] == [], f"{port} refused beats at cycles {rec.stalled[port][:10]}"
    acc = rec.accepted[port]
    assert len(acc) == nbeats
    assert acc[-1] - acc[0] + 1 == nbeats


def nbeats(frames, width):
    return sum(len(to_beats(f, width)) for f in frames)


def assert_no_drops(stats):
    assert stats is not None
    drops = {k: v for k, v in stats.items() if k.startswith("drop_") and v}
    assert not drops, drops


WIDTHS = [64, 512]
MTUS = [1500, 9000]
WIDTH_MTU = [(w, m) for w in WIDTHS for m in MTUS]


# --- 1. no idle beat, each data path ----------------------------------------------------------

@pytest.mark.parametrize("width,mtu", WIDTH_MTU)
def test_rank0_push_to_cw_out_back_to_back(width, mtu):
    cfg = NodeConfig(width, mtu, slots=8)
    data = chunk_data(chunk_counts(cfg), seed=width + mtu)
    pushes = push_frames([(loc, loc) for _, loc in data], rank=0)
    rec = run_node(cfg, 0, streams={"host_rx": pushes}, expect={"cw_out": len(data)})
    assert_never_stalled(rec, "host_rx", nbeats(pushes, width))
    assert_no_idle(rec, "cw_out")
    check_beats(rec, "cw_out", width)
    check_frames(rec.out_bytes("cw_out"), [bits(loc) for _, loc in data], Opcode.REDUCE, 0, 1)
    assert rec.stats["push_frames"] == len(data) and rec.stats["reduce_frames"] == 0
    assert_no_drops(rec.stats)


@pytest.mark.parametrize("width,mtu", WIDTH_MTU)
def test_middle_rank_reduce_and_broadcast_back_to_back(width, mtu):
    """Rank 1 of 3: cw_in → cw_out (adds the pushed chunk) and ccw_in → ccw_out + host_tx, at once."""
    cfg = NodeConfig(width, mtu, slots=8)
    counts = chunk_counts(cfg)
    data = chunk_data(counts, seed=3 * width + mtu)
    bdata = chunk_data(counts[::-1], seed=5 * width + mtu)
    red = ring_frames(data, Opcode.REDUCE, src=0, hop=1)
    bc = ring_frames(bdata, Opcode.BROADCAST, src=2, hop=4)
    rec = run_node(cfg, 1, pre_push=push_frames(data, 1), streams={"cw_in": red, "ccw_in": bc},
                   expect={"cw_out": len(data), "ccw_out": len(bdata), "host_tx": len(bdata)})
    assert_never_stalled(rec, "cw_in", nbeats(red, width))
    assert_never_stalled(rec, "ccw_in", nbeats(bc, width))
    for port in OUTPUTS:
        assert_no_idle(rec, port)
        check_beats(rec, port, width)
    check_frames(rec.out_bytes("cw_out"), [fp32_sum(i, loc) for i, loc in data], Opcode.REDUCE, 1, 2)
    check_frames(rec.out_bytes("ccw_out"), [bits(i) for i, _ in bdata], Opcode.BROADCAST, 1, 5)
    check_frames(rec.out_bytes("host_tx"), [bits(i) for i, _ in bdata], Opcode.HOST_RESULT, 1, 5)
    s = rec.stats
    assert (s["reduce_frames"], s["broadcast_frames"], s["result_frames"], s["push_frames"]) == \
        (len(data), len(bdata), len(bdata), len(data))
    assert_no_drops(s)


@pytest.mark.parametrize("width,mtu", WIDTH_MTU)
def test_last_rank_reduce_to_host_and_ccw_back_to_back(width, mtu):
    cfg = NodeConfig(width, mtu, slots=8)
    data = chunk_data(chunk_counts(cfg)[::-1], seed=7 * width + mtu)
    red = ring_frames(data, Opcode.REDUCE, src=1, hop=2)
    rec = run_node(cfg, 2, pre_push=push_frames(data, 2), streams={"cw_in": red},
                   expect={"host_tx": len(data), "ccw_out": len(data)})
    assert_never_stalled(rec, "cw_in", nbeats(red, width))
    want = [fp32_sum(i, loc) for i, loc in data]
    for port in ("host_tx", "ccw_out"):
        assert_no_idle(rec, port)
        check_beats(rec, port, width)
    check_frames(rec.out_bytes("ccw_out"), want, Opcode.BROADCAST, 2, 3)
    check_frames(rec.out_bytes("host_tx"), want, Opcode.HOST_RESULT, 2, 3)
    assert rec.stats["result_frames"] == len(data) and rec.stats["reduce_frames"] == len(data)
    assert_no_drops(rec.stats)


# --- 2. random back-pressure on every port ----------------------------------------------------

@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("rank", [0, 1, 2])
def test_random_backpressure_every_port(width, rank):
    """Pushes, REDUCE and BROADCAST frames all at once, with random gaps and random ``ready``.

    The pushes are not sent ahead here: REDUCE frames arrive before their local chunk and wait.
    """
    cfg = NodeConfig(width, 1500, slots=8)
    counts = [1, 2, 57, max_elements(1500), 3, 30]
    data = chunk_data(counts, seed=11 * width + rank)
    bdata = chunk_data(counts[::-1], seed=13 * width + rank)
    streams, expect = {}, {}
    if rank == 0:
        streams["host_rx"] = push_frames([(loc, loc) for _, loc in data], 0)
        streams["ccw_in"] = ring_frames(bdata, Opcode.BROADCAST, src=1, hop=3)
        expect = {"cw_out": len(data), "host_tx": len(bdata)}
    elif rank == 1:
        streams["host_rx"] = push_frames(data, 1)
        streams["cw_in"] = ring_frames(data, Opcode.REDUCE, src=0, hop=1)
        streams["ccw_in"] = ring_frames(bdata, Opcode.BROADCAST, src=2, hop=3)
        expect = {"cw_out": len(data), "ccw_out": len(bdata), "host_tx": len(bdata)}
    else:
        streams["host_rx"] = push_frames(data, 2)
        streams["cw_in"] = ring_frames(data, Opcode.REDUCE, src=1, hop=2)
        expect = {"ccw_out": len(data), "host_tx": len(data)}
    rec = run_node(cfg, rank, streams=streams, expect=expect, valid_prob=0.7, ready_prob=0.6,
                   seed=width * 10 + rank)
    for port in expect:
        check_beats(rec, port, width)
    if rank == 0:
        check_frames(rec.out_bytes("cw_out"), [bits(loc) for _, loc in data], Opcode.REDUCE, 0, 1)
        check_frames(rec.out_bytes("host_tx"), [bits(i) for i, _ in bdata], Opcode.HOST_RESULT, 0, 4)
    elif rank == 1:
        check_frames(rec.out_bytes("cw_out"), [fp32_sum(i, loc) for i, loc in data], Opcode.REDUCE, 1, 2)
        check_frames(rec.out_bytes("ccw_out"), [bits(i) for i, _ in bdata], Opcode.BROADCAST, 1, 4)
        check_frames(rec.out_bytes("host_tx"), [bits(i) for i, _ in bdata], Opcode.HOST_RESULT, 1, 4)
    else:
        want = [fp32_sum(i, loc) for i, loc in data]
        check_frames(rec.out_bytes("ccw_out"), want, Opcode.BROADCAST, 2, 3)
        check_frames(rec.out_bytes("host_tx"), want, Opcode.HOST_RESULT, 2, 3)
    assert_no_drops(rec.stats)
    assert rec.stats["push_frames"] == len(data)
    assert rec.stats["result_frames"] == len(rec.frames["host_tx"])


# --- 3. shortest and longest frames -----------------------------------------------------------

@pytest.mark.parametrize("width,mtu", WIDTH_MTU)
def test_one_beat_and_max_size_frames(width, mtu):
    """1-element frames (a single beat at 512 bit) back to back, then a maximum-size frame."""
    cfg = NodeConfig(width, mtu, slots=8)
    mx = max_elements(mtu)
    counts = [1, 1, 1, mx]
    data = chunk_data(counts, seed=17 * width + mtu)
    red = ring_frames(data, Opcode.REDUCE, src=0, hop=1)
    rec = run_node(cfg, 1, pre_push=push_frames(data, 1), streams={"cw_in": red}, expect={"cw_out": len(data)},
                   stats=False)
    beats = [len(c) for _, c, _ in rec.frames["cw_out"]]
    assert beats == [-(-(HEADER_BYTES + 4 * n) // (width // 8)) for n in counts]
    assert beats[0] == (1 if width == 512 else 3)
    assert_no_idle(rec, "cw_out")
    check_frames(rec.out_bytes("cw_out"), [fp32_sum(i, loc) for i, loc in data], Opcode.REDUCE, 1, 2)


# --- 4. hop latency ---------------------------------------------------------------------------

def test_hop_latency_within_target():
    got = {(w, p): hop_latency(w, 1500, p) for w in WIDTHS for p in ("reduce", "broadcast")}
    assert got[64, "reduce"] <= 16 and got[64, "broadcast"] <= 16, got
    assert all(isinstance(v, int) and v > 0 for v in got.values()), got
    assert got[512, "reduce"] <= got[64, "reduce"] and got[512, "broadcast"] <= got[64, "broadcast"], got
    # The hop does not wait for the frame: it cuts through, whatever the MTU.
    assert hop_latency(64, 9000, "reduce") == got[64, "reduce"]


def test_engine_hop_latency_within_target():
    # The schedule engine's hop (P = 4, a VC709 torus node): a two-term reduce and a forwarded
    # broadcast (which the engine takes only after its own partial sum of the chunk left) both
    # cut through within the 16 cycles.
    got = {p: engine_hop_latency(64, 4, 2, p, 1500) for p in ("reduce", "broadcast")}
    assert all(isinstance(v, int) and 0 < v <= 16 for v in got.values()), got


def test_codec_engine_uncompressed_hop_cuts_through():
    # With the codec at its ports an uncompressed frame still cuts through: its hop costs the two
    # codec stages' fixed delay (FrameGate, registered route decision, bypass FIFO: 10 cycles at 64
    # bit, docs/codec.md), whatever the MTU, not a frame time (a 1,500-byte frame is 188 beats).
    plain = engine_hop_latency(64, 2, 2, "reduce", 1500)
    codec = [engine_hop_latency(64, 2, 2, "reduce", mtu, codec=True) for mtu in (1500, 9000)]
    assert all(plain < c <= plain + 10 for c in codec), (plain, codec)


def test_hop_latency_errors():
    with pytest.raises(ValueError, match="path"):
        hop_latency(64, 1500, "sideways")
    with pytest.raises(ValueError, match="width"):
        hop_latency(96)
    with pytest.raises(ValueError, match="width"):
        hop_latency("64")
