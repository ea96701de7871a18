"""Drive a Network's flat host ports from amaranth.sim async testbenches (fast block tests)."""

from __future__ import annotations

import numpy as np
from amaranth.sim import Simulator


def to_beats(data: bytes, width: int):
    b = width // 8
    beats = []
    for off in range(0, len(data), b):
        chunk = data[off:off + b]
        keep = (1 << len(chunk)) - 1
        beats.append((int.from_bytes(chunk.ljust(b, b"\0"), "little"), keep, off + b >= len(data)))
    return beats


class HostPorts:
    """Frame-level send/recv on host{k}_rx/tx of a Network top inside amaranth.sim."""

    def __init__(self, dut, width: int, rng: np.random.Generator | None = None, ready_prob: float = 1.0):
        self.dut = dut
        self.width = width
        self.rng = rng
        self.ready_prob = ready_prob

    def port(self, k, d, s):
        return getattr(self.dut, f"host{k}_{d}_t{s}")

    async def send(self, ctx, k, data: bytes):
        p = lambda s: self.port(k, "rx", s)  # noqa: E731
        await send_beats(ctx, p("valid"), p("ready"), p("data"), p("keep"), p("last"), data, self.width)

    async def recv(self, ctx, k, max_cycles=20000) -> bytes:
        p = lambda s: self.port(k, "tx", s)  # noqa: E731

        def ready():
            return 1 if self.rng is None else int(self.rng.random() < self.ready_prob)

        try:
            return await recv_beats(ctx, p("valid"), p("ready"), p("data"), p("keep"), p("last"),
                                    self.width, max_cycles, ready)
        except TimeoutError as e:
            raise TimeoutError(f"node {k}: {e}") from None


def simulate(dut, testbenches, vcd: str | None = None, processes=()):
    sim = Simulator(dut)
    sim.add_clock(6.4e-9)
    for tb in testbenches:
        sim.add_testbench(tb)
    for proc in processes:
        sim.add_process(proc)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()


async def send_beats(ctx, valid, ready, data, keep, last, frame: bytes, width: int):
    """Send one frame on the given stream signals, waiting for ``ready`` on each beat."""
    for word, k, lst in to_beats(frame, width):
        ctx.set(data, word)
        ctx.set(keep, k)
        ctx.set(last, lst)
        ctx.set(valid, 1)
        await ctx.tick().until(ready)
    ctx.set(valid, 0)


async def recv_beats(ctx, valid, ready, data, keep, last, width: int, max_cycles=5000, ready_fn=None) -> bytes:
    """Receive one frame from the given stream signals; ``ready_fn()`` picks ``ready`` each cycle."""
    out = b""
    for _ in range(max_cycles):
        r = 1 if ready_fn is None else ready_fn()
        ctx.set(ready, r)
        _, _, v, word, kp, lst = await ctx.tick().sample(valid, data, keep, last)
        if v and r:
            out += int(word).to_bytes(width // 8, "little")[:bin(kp).count("1")]
            if lst:
                ctx.set(ready, 0)
                return out
    raise TimeoutError(f"no frame for {max_cycles} cycles")


async def stream_send(ctx, port, frame: bytes, width: int):
    """Send one frame on an Amaranth stream interface ``port`` (beat_layout payload)."""
    p = port.payload
    await send_beats(ctx, port.valid, port.ready, p.data, p.keep, p.last, frame, width)


async def stream_recv(ctx, port, width: int, max_cycles=5000) -> bytes:
    """Receive one frame from an Amaranth stream interface ``port``."""
    p = port.payload
    return await recv_beats(ctx, port.valid, port.ready, p.data, p.keep, p.last, width, max_cycles)


def stream_operands(dut, a, b, *, lanes: int = 1, en_prob: float = 1.0, seed: int = 0, setup=None):
    """Stream operand rows ``a``/``b`` (uint32, shape (n, lanes)) through a pipelined lane block
    (``a``, ``b``, ``en`` in; ``s`` out; ``dut.latency`` enabled edges) in amaranth.sim.

    Each clock, ``en`` is 1 with probability ``en_prob``. On a stalled clock the inputs are set to
    uniformly random words (junk the pipeline must ignore) and ``s`` must not change. The result of row ``j``
    is read after the ``j + LATENCY``-th enabled edge. ``setup`` is an optional ``async def
    setup(ctx)`` run first (set a mode, let it settle). Returns ``(results, cycles)``: uint64
    results of shape (n, lanes) and the clock edges taken.
    """
    a = np.asarray(a, dtype=np.uint32).reshape(-1, lanes)
    b = np.asarray(b, dtype=np.uint32).reshape(-1, lanes)
    n = len(a)
    rng = np.random.default_rng(seed)
    latency = dut.latency
    results = []
    cycles = 0

    def pack(row):
        return sum(int(v) << (32 * i) for i, v in enumerate(row))

    async def tb(ctx):
        nonlocal cycles
        if setup is not None:
            await setup(ctx)
        presented = enabled = 0
        while len(results) < n:
            en = int(rng.random() < en_prob)
            if en and presented < n:
                ctx.set(dut.a, pack(a[presented]))
                ctx.set(dut.b, pack(b[presented]))
            else:
                ja, jb = rng.integers(0, 2**32, (2, lanes), dtype=np.uint64)
                ctx.set(dut.a, pack(ja))
                ctx.set(dut.b, pack(jb))
            ctx.set(dut.en, en)
            before = ctx.get(dut.s)
            await ctx.tick()
            cycles += 1
            if en:
                presented += 1
                enabled += 1
                if enabled >= latency:
                    v = ctx.get(dut.s)
                    results.append([(v >> (32 * i)) & 0xFFFF_FFFF for i in range(lanes)])
            else:
                assert ctx.get(dut.s) == before, "s changed on a stalled clock"

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    return np.array(results, dtype=np.uint64).reshape(n, lanes), cycles
