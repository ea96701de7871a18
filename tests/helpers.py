"""Helpers shared by the test modules: edge-value gradients and one-frame stream drivers for
block tests of an engine in amaranth.sim (64-bit ports unless a driver says otherwise)."""

from __future__ import annotations

import numpy as np
from wirereduce.host.driver import parse_stats

from wirereduce.protocol import Header, Opcode

W = 64
B = W // 8

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


async def send(ctx, port, data: bytes, bad: bool = False, keeps: dict | None = None):
    """One frame on stream ``port`` (of any width); ``bad`` on its last beat; ``keeps`` overrides beat
    keeps."""
    p = port.payload
    B = len(p.data) // 8
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
    """One frame from stream ``port`` (of any width): its bytes and its ``bad`` flag."""
    p = port.payload
    B = len(p.data) // 8
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


def ring_steady_state(sim, nodes: int, seed: int, final_stats: bool = False):
    """The NTT ring (``ring``) on ``sim`` (a FastEngineSim of ``ring:{nodes}``) at 16 and 48 full
    chunks of fp32, each run bit-exact against the golden model. Returns (cycles a chunk in the
    steady state: the difference of the two runs over their 32 chunks, the two EngineResults)."""
    from wirereduce.sim.engines.fastengine import golden_check

    from wirereduce import schedule as sched
    from wirereduce.protocol import max_elements

    s = sched.build(f"ring:{nodes}", "ring")
    per_chunk = max_elements(sim.config.mtu)
    rng = np.random.default_rng(seed)
    runs = []
    for chunks in (16, 48):
        arrays = [rng.standard_normal(chunks * per_chunk).astype(np.float32) for _ in range(nodes)]
        r = sim.allreduce(arrays, s, final_stats=final_stats)
        assert golden_check(arrays, s, r.results) == [0] * nodes
        assert r.chunks == chunks
        runs.append(r)
    return (runs[1].cycles - runs[0].cycles) / 32, runs
