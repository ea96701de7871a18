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
        for word, keep, last in to_beats(data, self.width):
            ctx.set(self.port(k, "rx", "data"), word)
            ctx.set(self.port(k, "rx", "keep"), keep)
            ctx.set(self.port(k, "rx", "last"), last)
            ctx.set(self.port(k, "rx", "valid"), 1)
            await ctx.tick().until(self.port(k, "rx", "ready"))
        ctx.set(self.port(k, "rx", "valid"), 0)

    async def recv(self, ctx, k, max_cycles=20000) -> bytes:
        out = b""
        for _ in range(max_cycles):
            ready = 1 if self.rng is None else int(self.rng.random() < self.ready_prob)
            ctx.set(self.port(k, "tx", "ready"), ready)
            _, _, valid, word, keep, last = await ctx.tick().sample(
                self.port(k, "tx", "valid"), self.port(k, "tx", "data"),
                self.port(k, "tx", "keep"), self.port(k, "tx", "last"))
            if valid and ready:
                nb = bin(keep).count("1")
                out += int(word).to_bytes(self.width // 8, "little")[:nb]
                if last:
                    ctx.set(self.port(k, "tx", "ready"), 0)
                    return out
        raise TimeoutError(f"node {k} sent nothing for {max_cycles} cycles")


def simulate(dut, testbenches, vcd: str | None = None):
    sim = Simulator(dut)
    sim.add_clock(6.4e-9)
    for tb in testbenches:
        sim.add_testbench(tb)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()


async def stream_send(ctx, port, data: bytes, width: int):
    """Send one frame on an Amaranth stream interface ``port`` (beat_layout payload)."""
    for word, keep, last in to_beats(data, width):
        ctx.set(port.payload.data, word)
        ctx.set(port.payload.keep, keep)
        ctx.set(port.payload.last, last)
        ctx.set(port.valid, 1)
        await ctx.tick().until(port.ready)
    ctx.set(port.valid, 0)


async def stream_recv(ctx, port, width: int, max_cycles=5000) -> bytes:
    """Receive one frame from an Amaranth stream interface ``port``."""
    out = b""
    ctx.set(port.ready, 1)
    for _ in range(max_cycles):
        _, _, valid, word, keep, last = await ctx.tick().sample(
            port.valid, port.payload.data, port.payload.keep, port.payload.last)
        if valid:
            out += int(word).to_bytes(width // 8, "little")[:bin(keep).count("1")]
            if last:
                ctx.set(port.ready, 0)
                return out
    raise TimeoutError(f"no frame for {max_cycles} cycles")
