"""The allreduce benchmark behind ``make bench``: bandwidth, bounds, hop latency, simulation speed.

For every configuration (datapath width, MTU, ring size) and message size the benchmark runs one
allreduce of random fp32 gradients on a simulated ring of schedule engines running the NTT ring
schedule (:class:`RingSetup`, :func:`run_ring`: the fast engine), checks every node's result bit for
bit against :func:`wirereduce.sim.golden.ring_allreduce`, and prints an nccl-tests-style table.
The simulated clock gives the time: ``time = cycles / clock_mhz``, where ``cycles`` runs from
the first beat pushed to the last result beat.

Units: bandwidths are **Gbit/s** (nccl-tests prints GB/s; links are rated in Gbit/s, so the
bounds read more naturally that way). Sizes are bytes per node; ``K``/``M``/``G`` are binary
(1024, 1024², 1024³) as in nccl-tests.

Figures, per record (see :func:`bench_record`):

- ``algbw_gbps`` = message bits / time (nccl-tests' algbw);
- ``busbw_gbps`` = algbw · 2(N−1)/N (nccl-tests' allreduce bus bandwidth);
- ``bound_gbps``, the **frame-efficiency bound** (:func:`frame_bound_gbps`): the link's line rate
  times payload bytes over wire bytes, summed over the message's chunks. The in-network ring
  sends the message across each link exactly once, so this is the best algbw it can reach;
- ``ring_bound_gbps``, the algbw of a **bandwidth-optimal host ring** (reduce-scatter +
  all-gather) on the same links (:func:`ring_bound_gbps`);
- ``ring_time_ratio`` = our time / the host ring's time, with its target
  ``ring_time_target`` = N/(2(N−1)) + 0.02 (docs/background.md "Performance targets").

Outputs in ``out_dir``: ``<name>.json``, a JSON list of records, each with a ``kind``:
``"meta"`` (one, first: what was run, when, on what), ``"allreduce"`` (one per run) and
``"hop_latency"`` (one per width and path); and ``<name>.png``, algbw against size with the two
bounds as dashed reference lines.
"""

from __future__ import annotations

import datetime
import itertools
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from wirereduce.sim.cluster.network import LINE_RATE_GBPS, clock_mhz, line_rate_gbps

from wirereduce.config import EngineConfig, NodeConfig
from wirereduce.protocol import HEADER_BYTES, max_elements, wire_bytes

__all__ = [
    "BenchConfig", "BenchError", "LINE_RATE_GBPS", "FULL_CONFIGS", "FULL_SIZES", "QUICK_CONFIGS",
    "QUICK_SIZES", "ETH_CONFIGS", "ETH_SIZES", "ETH_QUICK_CONFIGS", "ETH_QUICK_SIZES", "run_eth_rows",
    "HOP_LATENCY_TARGET", "line_rate_gbps", "check_bench_width", "chunk_sizes", "frame_bound_gbps",
    "ring_bound_gbps", "ring_time_target", "bench_record", "make_gradients", "parse_size",
    "format_size", "run_bench", "write_plot", "codec_link_bound",
]


#: Added latency per hop docs/background.md "Performance targets" asks for, cycles (cut-through, excluding MAC/PHY).
HOP_LATENCY_TARGET = 16

KiB = 1024
MiB = 1024 * KiB


class BenchError(RuntimeError):
    """The benchmark cannot go on: a result that is not bit-exact, a missing engine, bad output."""


@dataclass(frozen=True, order=True)
class BenchConfig:
    """One simulated cluster to benchmark: datapath width (bits), MTU (bytes), ring size."""

    width: int
    mtu: int
    nodes: int

    def __str__(self) -> str:
        return f"{self.nodes} nodes, {self.width} bit, MTU {self.mtu}"


#: ``make bench``: 2, 4 and 8 nodes, MTU 1500 and 9000, 64 and 512 bit.
FULL_CONFIGS: tuple[BenchConfig, ...] = tuple(
    BenchConfig(w, m, n) for w, m, n in itertools.product((64, 512), (1500, 9000), (2, 4, 8)))
#: ``make bench``: 8 KiB … 16 MiB.
FULL_SIZES: tuple[int, ...] = (8 * KiB, 32 * KiB, 128 * KiB, 512 * KiB, 2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB)
#: ``make bench QUICK=1``: three builds of 4 nodes (64 bit at both MTUs, 512 bit jumbo).
QUICK_CONFIGS: tuple[BenchConfig, ...] = (BenchConfig(64, 1500, 4), BenchConfig(64, 9000, 4),
                                          BenchConfig(512, 9000, 4))
#: ``make bench QUICK=1``: one small, one medium and one large message (the 4 MiB target size).
QUICK_SIZES: tuple[int, ...] = (8 * KiB, 512 * KiB, 4 * MiB)
#: Ethernet-link rows (``RingSetup(links="eth")``: MAC + 10GBASE-R PCS on every link), 4 nodes, 10G.
ETH_CONFIGS: tuple[BenchConfig, ...] = (BenchConfig(64, 1500, 4), BenchConfig(64, 9000, 4))
ETH_SIZES: tuple[int, ...] = (8 * KiB, 128 * KiB, 512 * KiB, 4 * MiB)
#: ``make bench QUICK=1``: the Ethernet-link subset.
ETH_QUICK_CONFIGS: tuple[BenchConfig, ...] = (BenchConfig(64, 1500, 4),)
ETH_QUICK_SIZES: tuple[int, ...] = (8 * KiB, 4 * MiB)


# --------------------------------------------------------------------------------------------
# Bounds


def check_bench_width(width: int) -> int:
    """A width the benchmark runs: one with an Ethernet line rate
    (:data:`~wirereduce.sim.cluster.network.LINE_RATE_GBPS`: 10G at 64 bit, 100G at 512 bit); returns it.

    Raises
    ------
    ValueError
        For a width with no Ethernet rate.
    """
    if width not in LINE_RATE_GBPS:
        raise ValueError(f"no line rate is defined for a {width}-bit datapath "
                         f"(benchmarked widths: {', '.join(map(str, LINE_RATE_GBPS))})")
    return width


def chunk_sizes(elements: int, mtu: int) -> list[int]:
    """Elements per chunk when ``elements`` fp32 are split into frames of MTU ``mtu``: the host
    driver's own chunking (:func:`~wirereduce.host.driver.plan_chunks` of
    :func:`~wirereduce.host.driver.chunk_elements`), full chunks of the MTU's
    :func:`~wirereduce.protocol.max_elements` and a shorter last one."""
    from wirereduce.host.driver import chunk_elements, plan_chunks

    if not isinstance(elements, (int, np.integer)) or elements < 1:
        raise ValueError(f"elements must be a positive int, not {elements!r}")
    return [n for _, n in plan_chunks(int(elements), chunk_elements(NodeConfig(mtu=mtu)))]


def frame_bound_gbps(elements: int, mtu: int, width: int) -> float:
    """Frame-efficiency bound on algbw, Gbit/s: line rate · payload bytes / wire bytes.

    The message of ``elements`` fp32 travels as chunks of ``max_elements(mtu)`` elements (the
    last one shorter); each frame costs ``wire_bytes(16 + 4·count)`` on the wire (Ethernet
    header, padding, preamble + SFD, FCS, inter-frame gap). The in-network ring moves the message
    across every link once, so its algbw cannot exceed this. Example: MTU 1500 at 10G, full
    frames carry 1484 payload bytes in 1538 wire bytes, 9.649 Gbit/s.
    """
    sizes = chunk_sizes(elements, mtu)
    wire = sum(wire_bytes(HEADER_BYTES + 4 * n) for n in sizes)
    return line_rate_gbps(check_bench_width(width)) * 4 * int(elements) / wire


def ring_bound_gbps(nodes: int, elements: int, mtu: int, width: int) -> float:
    """algbw, Gbit/s, of a bandwidth-optimal host ring allreduce on the same links.

    A host ring (reduce-scatter, then all-gather) sends 2(N−1)/N · M bytes from every node, so it
    takes T_ring = 2(N−1)/N · M / B. We take B = the links' *payload* rate, i.e. the
    frame-efficiency bound of the same message on the same links (:func:`frame_bound_gbps`), so
    the host ring is charged the same framing as we are (no IP/UDP headers, no host or PCIe
    time: the most favourable host ring there is). Its algbw is then B · N / (2(N−1)).
    """
    if not isinstance(nodes, int) or nodes < 2:
        raise ValueError(f"nodes must be an int ≥ 2, not {nodes!r}")
    return frame_bound_gbps(elements, mtu, width) * nodes / (2 * (nodes - 1))


def ring_time_target(nodes: int) -> float:
    """Largest allowed (our time / host-ring time): N/(2(N−1)) + 0.02 (docs/background.md "Performance targets")."""
    return nodes / (2 * (nodes - 1)) + 0.02


# --------------------------------------------------------------------------------------------
# Records


def bench_record(config: BenchConfig, rec: dict, arrays: Sequence[np.ndarray], *, setup=None,
                 golden: np.ndarray | None = None) -> dict:
    """One ``"allreduce"`` record from a runner result ``rec`` (see :func:`run_bench`).

    Compares every node's result with the golden ring allreduce bit for bit: ``bitexact`` is
    True only if all agree, and ``wrong`` counts the differing elements over all nodes (``first_wrong``
    describes the first one, or is None).

    Fields: kind, nodes, bytes, count, type, redop, mtu, width_bits, clock_mhz, line_rate_gbps,
    slots, link_latency, frames, cycles, time_us, algbw_gbps, busbw_gbps, bound_gbps,
    ring_bound_gbps, efficiency, ring_time_ratio, ring_time_target, bitexact, wrong, first_wrong,
    sim_cycles, wall_s, build_s, sim_cycles_per_s.
    """
    from wirereduce.sim.golden.allreduce import bit_mismatches, ring_allreduce

    n = config.nodes
    elements = int(rec["elements"])
    nbytes = int(rec["bytes"])
    cycles = int(rec["cycles"])
    if cycles <= 0:
        raise BenchError(f"{config}, {nbytes} B: the engine reported {cycles} cycles")
    check_bench_width(config.width)
    mhz = getattr(setup, "clock", None) or clock_mhz(config.width)
    gbps = getattr(setup, "link_gbps", None) or line_rate_gbps(config.width)
    time_us = cycles / mhz
    algbw = nbytes * 8 / (time_us * 1e3)  # bits per ns = Gbit/s
    scale = gbps / line_rate_gbps(config.width)  # links slower than the width's own rate
    bound = frame_bound_gbps(elements, config.mtu, config.width) * scale
    ring = ring_bound_gbps(n, elements, config.mtu, config.width) * scale

    want = ring_allreduce(arrays) if golden is None else golden
    results = rec["results"]
    wrong = 0
    first = None
    if len(results) != n:
        raise BenchError(f"{config}, {nbytes} B: the engine returned {len(results)} results for {n} nodes")
    for k, got in enumerate(results):
        got = np.asarray(got)
        if got.shape != want.shape:
            wrong += want.size
            if first is None:
                first = f"node{k}: shape {got.shape}, expected {want.shape}"
            continue
        bad = bit_mismatches(got, want)
        wrong += int(bad.size)
        if bad.size and first is None:
            i = int(bad[0])
            g = np.float32(got[i])
            w = want[i]
            first = (f"node{k}[{i}] = {g!r} (0x{g.view(np.uint32):08x}), golden {w!r} "
                     f"(0x{w.view(np.uint32):08x}); {bad.size} of {want.size} elements differ at node{k}")

    sim_cycles = int(rec.get("sim_cycles", cycles))
    wall = float(rec.get("wall_s", float("nan")))
    return {
        "kind": "allreduce",
        "nodes": n,
        "bytes": nbytes,
        "count": elements,
        "type": "float",
        "redop": "sum",
        "mtu": config.mtu,
        "width_bits": config.width,
        "clock_mhz": mhz,
        "line_rate_gbps": gbps,
        "slots": setup.config.slots if setup is not None else None,
        "link_latency": getattr(setup, "link_latency", None),
        "links": getattr(setup, "links", "model"),
        "frames": int(rec.get("frames", len(chunk_sizes(elements, config.mtu)))),
        "cycles": cycles,
        "time_us": time_us,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * 2 * (n - 1) / n,
        "bound_gbps": bound,
        "ring_bound_gbps": ring,
        "efficiency": algbw / bound,
        "ring_time_ratio": ring / algbw,  # T_ours / T_ring = (M/algbw) / (M/ring)
        "ring_time_target": ring_time_target(n),
        "bitexact": wrong == 0,
        "wrong": wrong,
        "first_wrong": first,
        "sim_cycles": sim_cycles,
        "wall_s": wall,
        "build_s": float(rec.get("build_s", 0.0)),
        "sim_cycles_per_s": sim_cycles / wall if wall > 0 else None,
    }


def make_gradients(nodes: int, elements: int, seed: Sequence[int]) -> list[np.ndarray]:
    """``nodes`` float32 gradients of ``elements`` values, N(0, 0.01²), from the seed sequence."""
    rng = np.random.default_rng(list(seed))
    return [(rng.standard_normal(elements, dtype=np.float32) * np.float32(1e-2)).astype(np.float32)
            for _ in range(nodes)]


# --------------------------------------------------------------------------------------------
# Sizes

_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]?)(?:i?b)?\s*$", re.I)
_UNIT = {"": 1, "k": KiB, "m": MiB, "g": 1024 * MiB}


def parse_size(text: str) -> int:
    """Bytes of a size like ``8192``, ``8K``, ``8KiB``, ``16M``, ``1G`` (binary units).

    Raises
    ------
    ValueError
        If the text is not a size, or not a positive multiple of 4 bytes (whole fp32 elements).
    """
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"size {text!r} is not a number of bytes like 8192, 8K, 512KiB or 16M")
    n = int(m.group(1)) * _UNIT[m.group(2).lower()]
    if n < 4 or n % 4:
        raise ValueError(f"size {text!r} = {n} B is not a positive multiple of 4 bytes (whole fp32 elements)")
    return n


def format_size(n: int) -> str:
    """``8K``, ``16M``, ``1536`` … the shortest exact binary spelling of ``n`` bytes."""
    for unit, scale in (("G", 1024 * MiB), ("M", MiB), ("K", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


# --------------------------------------------------------------------------------------------
# Output


def _out(text: str = "") -> None:
    print(text, flush=True)


def _config_header(config: BenchConfig) -> str:
    mhz = clock_mhz(config.width)
    return (f"#\n# allreduce, {config.nodes} nodes, {config.width} bit @ {mhz:g} MHz "
            f"({line_rate_gbps(config.width):g}G), MTU {config.mtu} ({max_elements(config.mtu)} elements/frame)\n"
            f"# algbw, busbw and bound in Gbit/s (nccl-tests prints GB/s); bound = frame-efficiency bound;\n"
            f"# t/ring = our time / bandwidth-optimal host ring's time, target "
            f"≤ {ring_time_target(config.nodes):.3f}\n#\n"
            f"# {'size':>10} {'count':>10} {'type':>6} {'redop':>5} {'time':>10} {'algbw':>7} {'busbw':>7} "
            f"{'#wrong':>6} {'bound':>7} {'%bound':>7} {'t/ring':>6}\n"
            f"# {'(B)':>10} {'(elements)':>10} {'':>6} {'':>5} {'(us)':>10} {'(Gb/s)':>7} {'(Gb/s)':>7} "
            f"{'':>6} {'(Gb/s)':>7}")


def _row(r: dict) -> str:
    return (f"  {r['bytes']:>10} {r['count']:>10} {r['type']:>6} {r['redop']:>5} {r['time_us']:>10.2f} "
            f"{r['algbw_gbps']:>7.3f} {r['busbw_gbps']:>7.3f} {r['wrong']:>6} {r['bound_gbps']:>7.3f} "
            f"{100 * r['efficiency']:>6.2f}% {r['ring_time_ratio']:>6.3f}")


def _config_footer(rows: list[dict]) -> str:
    avg = sum(r["busbw_gbps"] for r in rows) / len(rows)
    lines = ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {avg:.3f} Gbit/s"]
    big = [r for r in rows if r["bytes"] >= 4 * MiB]
    if big:
        eff = min(r["efficiency"] for r in big)
        ratio = max(r["ring_time_ratio"] - r["ring_time_target"] for r in big)
        lines.append(f"# ≥ 4 MiB: algbw ≥ {100 * eff:.2f} % of the bound (target 99 %: "
                     f"{'met' if eff >= 0.99 else 'MISSED'}); time vs host ring "
                     f"{'within' if ratio <= 0 else 'OVER'} target "
                     f"(worst margin {-ratio:+.3f})")
    return "\n".join(lines)


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _git_commit() -> str | None:
    """HEAD of the source tree, with ``+dirty`` when it has uncommitted changes; None outside git."""
    head = _git("rev-parse", "HEAD")
    if not head:
        return None
    return head + ("+dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")


def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def _write_json(path: Path, records: list[dict]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_jsonable(records), indent=1) + "\n")
    os.replace(tmp, path)


def write_plot(path: str | Path, records: Iterable[dict], title: str = "") -> Path:
    """algbw against message size, one subplot per (width, MTU), one line per ring size, with the
    frame-efficiency bound and each ring size's host-ring bound as dashed reference lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    rows = [r for r in records if r.get("kind") == "allreduce"]
    if not rows:
        raise BenchError("no allreduce records to plot")
    panels = sorted({(r["width_bits"], r["mtu"]) for r in rows})
    ncols = min(2, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.4 * ncols, 4.4 * nrows), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    all_nodes = sorted({r["nodes"] for r in rows})
    for ax, (width, mtu) in zip(axes.flat, panels):
        mine = [r for r in rows if (r["width_bits"], r["mtu"]) == (width, mtu)]
        sizes = sorted({r["bytes"] for r in mine})
        bound = [frame_bound_gbps(s // 4, mtu, width) for s in sizes]
        ax.plot(sizes, bound, "k--", lw=1.2, label="frame-efficiency bound B")
        for n in sorted({r["nodes"] for r in mine}):
            c = colours[all_nodes.index(n) % len(colours)]
            pts = sorted((r["bytes"], r["algbw_gbps"]) for r in mine
                         if r["nodes"] == n and r.get("links", "model") == "model")
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=c, label=f"{n} nodes, in-network")
            eth = sorted((r["bytes"], r["algbw_gbps"]) for r in mine if r["nodes"] == n and r.get("links") == "eth")
            if eth:
                ax.plot([p[0] for p in eth], [p[1] for p in eth], "s:", color=c,
                        label=f"{n} nodes, in-network, 10G Ethernet links")
            ring = [ring_bound_gbps(n, s // 4, mtu, width) for s in sizes]
            ax.plot(sizes, ring, "--", color=c, lw=1.2, label=f"{n} nodes, host-ring bound")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticks(sizes, [format_size(s) for s in sizes], rotation=45 if len(sizes) > 6 else 0)
        ax.set_ylim(0, line_rate_gbps(width) * 1.05)
        ax.set_xlabel("message size per node (bytes)")
        ax.set_ylabel("algbw (Gbit/s)")
        ax.set_title(f"{width} bit @ {clock_mhz(width):g} MHz ({line_rate_gbps(width):g}G), MTU {mtu}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    note = ("dashed black: frame-efficiency bound B (payload / wire bytes × line rate); "
            "dashed colour: bandwidth-optimal host ring, time 2(N−1)/N · M/B")
    fig.suptitle((title + "\n" if title else "") + note, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------
# The benchmark


@dataclass(frozen=True)
class RingSetup:
    """What a benchmark row runs on: a ring of ``nodes`` schedule engines (P = 2 network ports, the
    engine every board top carries) running the NTT ring schedule (``ring:N``, ``ring``).

    ``config`` is every engine's :class:`~wirereduce.config.EngineConfig`; ``links`` link models,
    ``"eth"`` (10G Ethernet, MAC + 10GBASE-R PCS, at every network port) or ``"cmac"``;
    ``link_gbps`` / ``clock_mhz`` override the width's line rate and clock (link models only: a
    512-bit core at 156.25 MHz behind 10G links, the compressed rows). ``simulator`` is recorded
    (the fast engine always runs Verilator).

    Raises ValueError on a bad ring size or rate, before anything is built."""

    nodes: int
    config: EngineConfig
    link_latency: int = 4
    links: str = "model"
    link_gbps: float | None = None
    clock_mhz: float | None = None
    simulator: str = "verilator"

    def __post_init__(self):
        if not isinstance(self.nodes, int) or isinstance(self.nodes, bool) or not 2 <= self.nodes <= 255:
            raise ValueError(f"nodes must be a ring size from 2 to 255, not {self.nodes!r}")
        if not isinstance(self.config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig, not {self.config!r}")
        if not isinstance(self.link_latency, int) or self.link_latency < 1:
            raise ValueError(f"link_latency must be ≥ 1 cycle, not {self.link_latency!r}")
        for name in ("link_gbps", "clock_mhz"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0):
                raise ValueError(f"{name} must be a positive number or None, not {v!r}")
        if (self.link_gbps is not None or self.clock_mhz is not None) and self.links != "model":
            raise ValueError("link_gbps and clock_mhz apply to link models (links='model') only")
        self.link_rate  # noqa: B018 -- raises when the links would be faster than the datapath

    @property
    def clock(self) -> float:
        """Core clock in MHz (``clock_mhz`` or the width's)."""
        return float(self.clock_mhz) if self.clock_mhz is not None else clock_mhz(self.config.width)

    @property
    def link_rate(self):
        """Wire bytes per cycle of every link (a Fraction; the width's line rate by default).
        Raises ValueError if the links would move more than ``width / 8`` bytes a cycle."""
        from wirereduce.sim.cluster.network import bytes_per_cycle, line_bytes_per_cycle

        if self.link_gbps is None and self.clock_mhz is None:
            return line_bytes_per_cycle(self.config.width)
        gbps = self.link_gbps if self.link_gbps is not None else line_rate_gbps(self.config.width)
        rate = bytes_per_cycle(gbps, self.clock)
        if not 0 < rate <= self.config.bytes_per_beat:
            raise ValueError(f"{gbps:g} Gbit/s links at {self.clock:g} MHz move {float(rate):.2f} bytes a cycle; "
                             f"a {self.config.width}-bit datapath carries at most {self.config.bytes_per_beat}")
        return rate


def ring_setup(nodes: int, width: int, mtu: int, slots: int, *, codec: bool = False, **kw) -> RingSetup:
    """A :class:`RingSetup` of ``nodes`` engines built as ``EngineConfig(width, mtu, slots, ports=2,
    max_flows=8, codec=codec)`` (one flow is all the ring schedule needs); ``kw`` as RingSetup's.
    Raises ValueError/TypeError on a bad value."""
    return RingSetup(nodes, EngineConfig(width, mtu, slots, ports=2, max_flows=8, codec=codec), **kw)


_SIMS: dict = {}


def run_ring(setup: RingSetup, arrays, *, build_root: str | Path = "build/fastsim", progress: bool = False,
             compression: int | None = None) -> dict:
    """One allreduce of ``arrays`` (float32, one per node) on ``setup``'s ring of engines, on the fast
    engine (:class:`~wirereduce.sim.engines.fastengine.FastEngineSim`, built once per setup and
    cached); the benchmark's default runner. Returns ``{"results", "cycles", "sim_cycles", "wall_s",
    "build_s", "elements", "frames", "bytes"}`` (cycles from the first push to the last result).

    Raises
    ------
    ValueError
        On bad arrays or ``compression``, before anything is built.
    wirereduce.sim.engines.fastengine.EngineStalled
        If results are missing at the deadline.
    """
    from wirereduce.sim.engines.fastengine import FastEngineSim

    from wirereduce import schedule as sched

    schedule = sched.build(f"ring:{setup.nodes}", "ring")
    key = (setup, str(Path(build_root).resolve()))
    sim = _SIMS.get(key)
    if sim is None:
        rate = setup.link_rate
        # Ethernet rows: every link Ethernet, the hosts' too (a NIC cabled to each engine's host port)
        sim = _SIMS[key] = FastEngineSim(schedule.topology, setup.config, setup.link_latency, link_rate=rate,
                                         host_rate=rate, build_root=Path(build_root) / "engine", links=setup.links,
                                         host_links="eth" if setup.links == "eth" else "model")
    r = sim.allreduce(arrays, schedule, progress=progress, compression=compression)
    return {"results": r.results, "cycles": r.cycles, "sim_cycles": r.sim_cycles, "wall_s": r.wall_s,
            "build_s": r.build_s, "elements": r.elements, "frames": r.chunks, "bytes": r.bytes}


def _default_runner():
    return run_ring


def _default_latency():
    from wirereduce.sim.bench.latency import hop_latency  # ImportError handled by the caller

    return hop_latency


def _measure_latency(widths: Sequence[int], mtu: int, latency: Callable | None) -> list[dict]:
    """Hop latency records for each width and path; None (with a warning) when unavailable."""
    out = []
    fn = latency
    if fn is None:
        try:
            fn = _default_latency()
        except ImportError as e:
            warnings.warn(f"hop latency not measured: wirereduce.sim.bench.latency is unavailable ({e})",
                          RuntimeWarning, stacklevel=3)
            fn = None
    for width in widths:
        for path in ("reduce", "broadcast"):
            err = None
            cycles = None
            if fn is not None:
                try:
                    cycles = int(fn(width=width, mtu=mtu, path=path))
                except Exception as e:  # a latency failure must not lose the bandwidth results
                    err = f"{type(e).__name__}: {e}"
                    warnings.warn(f"hop latency {width} bit {path} not measured: {err}", RuntimeWarning,
                                  stacklevel=3)
            else:
                err = "wirereduce.sim.bench.latency unavailable"
            mhz = clock_mhz(width)
            out.append({
                "kind": "hop_latency", "width_bits": width, "mtu": mtu, "clock_mhz": mhz, "path": path,
                "cycles": cycles, "ns": None if cycles is None else cycles / mhz * 1e3,
                "target_cycles": HOP_LATENCY_TARGET,
                "meets_target": None if cycles is None else cycles <= HOP_LATENCY_TARGET,
                "definition": "first beat in to first beat out of one node, cut-through, excluding the link",
                "error": err,
            })
    return out


def _latency_table(recs: list[dict]) -> str:
    lines = ["#", "# added latency per hop: first beat in to first beat out, excluding the link "
             f"(target ≤ {HOP_LATENCY_TARGET} cycles)", "#",
             f"# {'width':>6} {'clock':>11} {'path':>10} {'cycles':>7} {'ns':>7}  target"]
    for r in recs:
        c = "n/a" if r["cycles"] is None else str(r["cycles"])
        ns = "n/a" if r["ns"] is None else f"{r['ns']:.1f}"
        verdict = ("not measured" if r["cycles"] is None else "met" if r["meets_target"] else "MISSED")
        lines.append(f"  {r['width_bits']:>6} {r['clock_mhz']:>7.3f} MHz {r['path']:>10} {c:>7} {ns:>7}  {verdict}")
    return "\n".join(lines)


def _speed_table(rows: list[dict]) -> str:
    lines = ["#", "# simulation speed: simulated cycles per wall-clock second (build excluded)", "#",
             f"# {'nodes':>5} {'width':>5} {'mtu':>5} {'sim cycles':>12} {'wall (s)':>9} {'cycles/s':>12} "
             f"{'build (s)':>9}"]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["width_bits"], r["mtu"], r["nodes"]), []).append(r)
    for (w, m, n), rs in groups.items():
        cyc = sum(r["sim_cycles"] for r in rs)
        wall = sum(r["wall_s"] for r in rs if r["wall_s"] == r["wall_s"])
        build = max(r["build_s"] for r in rs)  # one (cached) build per configuration
        speed = f"{cyc / wall:>12,.0f}" if wall > 0 else f"{'n/a':>12}"
        lines.append(f"  {n:>5} {w:>5} {m:>5} {cyc:>12,} {wall:>9.2f} {speed} {build:>9.1f}")
    cyc = sum(r["sim_cycles"] for r in rows)
    wall = sum(r["wall_s"] for r in rows if r["wall_s"] == r["wall_s"])
    if wall > 0:
        lines.append(f"# all: {cyc:,} simulated cycles in {wall:.2f} s = {cyc / wall:,.0f} cycles/s")
    return "\n".join(lines)


def run_eth_rows(configs: Iterable[BenchConfig | tuple[int, int, int]], sizes: Iterable[int], *, run: Callable,
                 records: list[dict], rows: list[dict], json_path: Path, build_root: str | Path = "build/fastsim",
                 slots: int = 16, link_latency: int = 4, seed: int = 0, progress: bool = False) -> list[dict]:
    """The Ethernet-link rows of the benchmark: the same allreduce with every link real 10G Ethernet.

    Each configuration (64 bit only) is built with ``RingSetup(links="eth")``: every ring and host
    link is MAC + 10GBASE-R PCS with a 66-bit block cable (``hdl/eth/port.py``), so the time now
    includes real framing, preamble, FCS, the deficit-idle-count gap, the PCS pipeline, the
    cut-through receive buffer of the ring ports and the store-and-forward bad-frame filter of the
    host ports (one frame of latency at each end). Prints the same
    nccl-tests-style table, then each row's algbw next to the link-model row of the same size
    when one ran; appends records (``links = "eth"``) to ``records`` and ``rows`` and rewrites
    ``json_path`` after each run. Same gradients as the link-model rows (same seeds).

    Raises
    ------
    ValueError
        On a configuration that is not 64 bit, or a bad size, before anything runs.
    BenchError
        If a result is not bit-exact or the engine reports another size.
    """
    configs = sorted({c if isinstance(c, BenchConfig) else BenchConfig(*c) for c in configs})
    sizes = sorted(set(int(s) for s in sizes))
    for s in sizes:
        if s < 4 or s % 4:
            raise ValueError(f"size {s} B is not a positive multiple of 4 bytes")
    setups = {c: ring_setup(c.nodes, c.width, c.mtu, slots, link_latency=link_latency, links="eth")
              for c in configs}
    model = {(r["width_bits"], r["mtu"], r["nodes"], r["bytes"]): r for r in rows if r.get("links", "model") == "model"}
    out = []
    for config in configs:
        setup = setups[config]
        _out(_config_header(config).replace("\n#\n# ", f"\n# links: 10G Ethernet (MAC + 10GBASE-R PCS, "
                                            f"cut-through ring ports), {link_latency}-cycle cables\n#\n# ", 1))
        mine = []
        for size in sizes:
            elements = size // 4
            arrays = make_gradients(config.nodes, elements, (seed, config.nodes, config.width, config.mtu, size))
            rec = run(setup, arrays, build_root=build_root, progress=progress)
            if int(rec["bytes"]) != size or int(rec["elements"]) != elements:
                raise BenchError(f"{config}, Ethernet links: asked for {size} B, the engine reports {rec['bytes']} B")
            r = bench_record(config, rec, arrays, setup=setup)
            rows.append(r)
            records.append(r)
            mine.append(r)
            _out(_row(r))
            _write_json(json_path, records)
            if not r["bitexact"]:
                raise BenchError(f"{config}, {size} B, Ethernet links: not bit-exact: {r['wrong']} wrong "
                                 f"element(s); first: {r['first_wrong']} (records so far in {json_path})")
        _out(_config_footer(mine))
        _out(f"# Ethernet links vs link model (algbw, Gbit/s):\n# {'size':>10} {'eth':>7} {'model':>7} {'ratio':>6}")
        for r in mine:
            ref = model.get((r["width_bits"], r["mtu"], r["nodes"], r["bytes"]))
            ref_bw = f"{ref['algbw_gbps']:>7.3f}" if ref else f"{'-':>7}"
            ratio = f"{r['algbw_gbps'] / ref['algbw_gbps']:>6.3f}" if ref else f"{'-':>6}"
            _out(f"  {r['bytes']:>10} {r['algbw_gbps']:>7.3f} {ref_bw} {ratio}")
        out.extend(mine)
    return out


#: Compressed rows (:func:`run_codec_rows`): 4 nodes with a 512-bit core at the 10G clock, 156.25 MHz
#: (64 B a cycle), behind 10G link models (8 B a cycle), MTU 9000, so the links, not the core, set the pace.
CODEC_CONFIG = BenchConfig(512, 9000, 4)
CODEC_CLOCK_MHZ = clock_mhz(64)
CODEC_LINK_GBPS = line_rate_gbps(64)
CODEC_KS: tuple[int, ...] = (8, 10, 12)
#: Buffer slots (= host window) of the compressed rows. A compressing hop is store-and-forward
#: (the decompressor's commit buffer, the compressor's tag block), so a chunk's round trip is
#: several frame times per hop; the window must cover it, or it, not the links, sets the pace.
CODEC_SLOTS = 32
CODEC_SIZES: tuple[int, ...] = (1 * MiB, 4 * MiB)
CODEC_QUICK_SIZES: tuple[int, ...] = (256 * KiB,)
#: The issue's target for speed-up / compression ratio.
CODEC_EFFICIENCY_TARGET = 0.9


def codec_link_bound(arrays: Sequence[np.ndarray], k: int, mtu: int, hops: list[np.ndarray] | None = None, *,
                     host_compressed: bool = False) -> float:
    """The speed-up over the uncompressed ring that the links alone allow a compressed ring (the
    framing bound of ``speedup``): the busiest link's wire bytes uncompressed ÷ compressed.

    Every chunk is one frame (``max_elements(mtu)`` raw, ``max_elements_compressed(mtu)``
    compressed fp32 values; :func:`~wirereduce.protocol.wire_bytes` adds the header, Ethernet
    header, FCS, preamble and inter-frame gap). The links are the ring's N−1 reduce hops and N−1
    broadcast hops (:func:`wirereduce.sim.golden.codec.ring_payloads`), each host's pushes
    (compressed: ``Q(x_r)``) and each host's results (the final sum). Divided by the compression
    ratio it is the highest ``speedup_ratio`` any hardware could reach on these gradients.
    ``hops``: ``ring_payloads(arrays, k, host_compressed=host_compressed)`` when the caller has it
    already. ``host_compressed``: the hosts push ``quantize(x_r)`` (the driver's ``compression=k``,
    what the bench runs), which changes the sums the reduce and broadcast hops carry.

    Raises
    ------
    ValueError
        Bad ``arrays``, ``k`` or ``mtu`` (the codec's and protocol's checks).
    """
    from wirereduce.sim.golden import codec as G

    from wirereduce import codec

    def link_bytes(vec: np.ndarray, per: int, compressed: bool) -> int:
        total = 0
        for i in range(0, vec.size, per):
            part = vec[i:i + per]
            total += wire_bytes(HEADER_BYTES + (codec.encoded_size(part, k) if compressed else 4 * part.size))
        return total

    raw_per, comp_per = max_elements(mtu), codec.max_elements_compressed(mtu)
    if hops is None:
        hops = G.ring_payloads(arrays, k, host_compressed=host_compressed)
    links = list(hops) + list(arrays) + [hops[-1]]
    raw = max(link_bytes(v, raw_per, False) for v in links)
    comp = max(link_bytes(v, comp_per, True) for v in links)
    return raw / comp


def run_codec_rows(sizes: Iterable[int], *, run: Callable, records: list[dict], json_path: Path,
                   ks: Sequence[int] = CODEC_KS, config: BenchConfig = CODEC_CONFIG,
                   clock: float = CODEC_CLOCK_MHZ, link_gbps: float = CODEC_LINK_GBPS,
                   build_root: str | Path = "build/fastsim", slots: int = CODEC_SLOTS, link_latency: int = 4,
                   seed: int = 0, progress: bool = False) -> list[dict]:
    """The compressed allreduce next to the uncompressed one on the same codec nodes and gradients.

    The gradients are real (:func:`wirereduce.sim.workloads.gradients.gradient_stream`: the demo CNN's
    per-worker gradients of consecutive data-parallel training steps). Every size runs once
    uncompressed and once per ``k`` with ``compression=k`` (hosts push compressed, every hop
    decompresses, adds and recompresses, results come back compressed), each checked bit for bit
    against :func:`~wirereduce.sim.golden.ring_allreduce` or
    :func:`~wirereduce.sim.golden.codec.ring_allreduce_compressed` (``host_compressed=True``). algbw is
    counted in uncompressed bytes. ``speedup`` = uncompressed time / compressed time;
    ``ratio`` = raw bytes / compressed bytes of every payload the ring carries (all reduce and
    broadcast hops of the hosts' quantized values, ``ring_payloads(..., host_compressed=True)``,
    :func:`wirereduce.sim.codec.compression_ratio`); ``speedup_ratio`` =
    speedup / ratio, target :data:`CODEC_EFFICIENCY_TARGET`; ``link_bound_speedup`` =
    :func:`codec_link_bound` (what the links alone allow) and ``link_bound_ratio`` = it / ratio, the
    highest ``speedup_ratio`` any hardware could reach here. Records (``kind = "allreduce"``,
    ``compression`` = k or None) are appended to ``records`` and ``json_path`` is rewritten
    after every run.

    Raises
    ------
    ValueError
        On a bad size or ``k``, before anything runs.
    BenchError
        If a result is not bit-exact.
    """
    from wirereduce.sim.golden import codec as G
    from wirereduce.sim.workloads.gradients import gradient_stream

    from wirereduce import codec

    sizes = sorted(set(int(s) for s in sizes))
    for s in sizes:
        if s < 4 or s % 4:
            raise ValueError(f"size {s} B is not a positive multiple of 4 bytes")
    ks = [codec.check_k(k) for k in ks]
    setup = ring_setup(config.nodes, config.width, config.mtu, slots, codec=True, link_latency=link_latency,
                       link_gbps=link_gbps, clock_mhz=clock)
    _out(f"#\n# compressed allreduce (INCEPTIONN-style codec v1 at every port), {config.nodes} nodes, "
         f"{config.width}-bit core @ {clock:g} MHz behind {link_gbps:g}G links, MTU {config.mtu}, "
         f"{slots} slots (host window)\n"
         f"# real gradients (demo CNN, consecutive training steps); algbw in uncompressed bytes;\n"
         f"# ratio = raw / compressed bytes the ring carries; target speedup/ratio ≥ {CODEC_EFFICIENCY_TARGET}\n"
         f"# link/ratio = the links' bound on the speed-up (busiest link, frames counted) / ratio\n#\n"
         f"# {'size':>10} {'k':>4} {'time':>10} {'algbw':>7} {'#wrong':>6} {'ratio':>6} {'speedup':>7} "
         f"{'sp/ratio':>8} {'link/ratio':>10}\n"
         f"# {'(B)':>10} {'':>4} {'(us)':>10} {'(Gb/s)':>7}")
    out = []
    for size in sizes:
        elements = size // 4
        arrays = gradient_stream(config.nodes, elements, seed=seed)
        base = None
        for k in [None, *ks]:
            rec = run(setup, arrays, build_root=build_root, progress=progress, compression=k)
            golden = None if k is None else G.ring_allreduce_compressed(arrays, k, host_compressed=True)
            r = bench_record(config, rec, arrays, setup=setup, golden=golden)
            r["compression"] = k
            r["links"] = f"model {link_gbps:g}G, codec nodes"
            if k is None:
                base = r
                r.update(ratio=1.0, speedup=1.0, speedup_ratio=1.0, link_bound_speedup=1.0, link_bound_ratio=1.0)
            else:
                # The payloads this ring carries: the hosts push Q(x_r) (host_compressed), as checked above.
                hops = G.ring_payloads(arrays, k, host_compressed=True)
                ratio = codec.compression_ratio(np.concatenate(hops), k)
                speedup = base["time_us"] / r["time_us"]
                link = codec_link_bound(arrays, k, config.mtu, hops, host_compressed=True)
                r.update(ratio=ratio, speedup=speedup, speedup_ratio=speedup / ratio,
                         link_bound_speedup=link, link_bound_ratio=link / ratio)
            records.append(r)
            out.append(r)
            _write_json(json_path, records)
            kk = "none" if k is None else str(k)
            _out(f"  {size:>10} {kk:>4} {r['time_us']:>10.2f} {r['algbw_gbps']:>7.3f} {r['wrong']:>6} "
                 f"{r['ratio']:>6.2f} {r['speedup']:>7.2f} {r['speedup_ratio']:>8.3f} {r['link_bound_ratio']:>10.3f}")
            if not r["bitexact"]:
                raise BenchError(f"compressed allreduce, k={k}, {size} B: not bit-exact: {r['wrong']} wrong "
                                 f"element(s); first: {r['first_wrong']} (records so far in {json_path})")
    return out


def run_bench(configs: Iterable[BenchConfig | tuple[int, int, int]], sizes: Iterable[int], *,
              name: str = "bench", runner: Callable | None = None, latency: Callable | None = None,
              progress: bool = False, out_dir: str | Path = "bench/results",
              build_root: str | Path = "build/fastsim", slots: int = 16, link_latency: int = 4,
              simulator: str = "verilator", seed: int = 0, measure_latency: bool = True,
              eth_configs: Iterable[BenchConfig | tuple[int, int, int]] = (),
              eth_sizes: Iterable[int] = (), codec_sizes: Iterable[int] = ()) -> list[dict]:
    """Run the benchmark; print its tables; write ``<name>.json`` and ``<name>.png``; return the records.

    Parameters
    ----------
    configs : iterable of BenchConfig or (width, mtu, nodes)
    sizes : iterable of int
        Message bytes per node, multiples of 4.
    name : str
        Base name of the output files.
    runner : callable, optional
        ``runner(setup, arrays, *, build_root, progress) -> dict`` with the keys of
        :func:`run_ring` (results, cycles, bytes, elements, frames, sim_cycles, wall_s, build_s);
        that function by default.
    latency : callable, optional
        ``latency(width=, mtu=, path=) -> cycles``; ``wirereduce.sim.bench.latency.hop_latency`` by
        default. If it cannot be imported or fails, the latency is recorded as None with a warning.
    progress : bool
        Passed to the runner (progress bars on stderr).
    out_dir : path
        Where the JSON and PNG go (created).
    build_root, slots, link_latency, simulator : passed on to the runner / :class:`RingSetup`.
    seed : int
        Base seed of the random gradients; each run's seed is (seed, nodes, width, mtu, bytes).
    eth_configs, eth_sizes : iterable
        Also run these configurations and sizes with Ethernet links (:func:`run_eth_rows`), after
        the link-model rows (empty: none; ``ETH_CONFIGS``/``ETH_SIZES`` for ``make bench``).
    codec_sizes : iterable of int
        Also run the compressed allreduce at these sizes (:func:`run_codec_rows`; empty: none;
        ``CODEC_SIZES`` for ``make bench``).
    measure_latency : bool
        Measure and print the hop latency after the allreduce runs.

    Raises
    ------
    ValueError
        On a bad configuration or size, before anything is simulated.
    BenchError
        If a result is not bit-exact (after printing its row and saving the records so far), or
        the engine is missing or returns something inconsistent.
    """
    configs = sorted({c if isinstance(c, BenchConfig) else BenchConfig(*c) for c in configs})
    sizes = sorted(set(int(s) for s in sizes))
    if not configs:
        raise ValueError("no configurations to benchmark")
    if not sizes:
        raise ValueError("no message sizes to benchmark")
    for s in sizes:
        if s < 4 or s % 4:
            raise ValueError(f"size {s} B is not a positive multiple of 4 bytes")
    setups = {}
    for c in configs:
        check_bench_width(c.width)
        setups[c] = ring_setup(c.nodes, c.width, c.mtu, slots, link_latency=link_latency, simulator=simulator)
    if not re.fullmatch(r"[\w.+-]+", name):
        raise ValueError(f"name {name!r} must be a plain file name (letters, digits, . _ + -)")
    run = runner if runner is not None else _default_runner()

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{name}.json"
    png_path = out_dir / f"{name}.png"
    meta = {
        "kind": "meta", "name": name,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": _git_commit(), "python": sys.version.split()[0], "platform": platform.platform(),
        "configs": [{"width_bits": c.width, "mtu": c.mtu, "nodes": c.nodes} for c in configs],
        "sizes": sizes, "slots": slots, "link_latency": link_latency, "simulator": simulator, "seed": seed,
        "gradients": "rng.standard_normal(float32) * 1e-2 per node, "
                     "rng = default_rng([seed, nodes, width, mtu, bytes])",
        "units": "bandwidths in Gbit/s; time_us in microseconds of simulated clock; bytes per node",
        "bound": "frame-efficiency bound: line rate * payload bytes / wire bytes over the message's frames "
                 "(wire bytes = Ethernet header + padding + preamble/SFD + FCS + IFG)",
        "ring_bound": "host ring algbw = B * N / (2(N-1)), from time 2(N-1)/N * M / B with B = bound_gbps",
        "complete": False,
    }
    records: list[dict] = [meta]
    rows: list[dict] = []
    t_start = time.perf_counter()

    for config in configs:
        setup = setups[config]
        _out(_config_header(config))
        mine = []
        for size in sizes:
            elements = size // 4
            arrays = make_gradients(config.nodes, elements, (seed, config.nodes, config.width, config.mtu, size))
            rec = run(setup, arrays, build_root=build_root, progress=progress)
            if int(rec["bytes"]) != size or int(rec["elements"]) != elements:
                raise BenchError(f"{config}: asked for {size} B ({elements} elements), the engine reports "
                                 f"{rec['bytes']} B ({rec['elements']} elements)")
            r = bench_record(config, rec, arrays, setup=setup)
            rows.append(r)
            mine.append(r)
            records.append(r)
            _out(_row(r))
            _write_json(json_path, records)
            if not r["bitexact"]:
                raise BenchError(f"{config}, {size} B: the result is not bit-exact against the golden ring "
                                 f"allreduce: {r['wrong']} wrong element(s); first: {r['first_wrong']} "
                                 f"(records so far in {json_path})")
        _out(_config_footer(mine))
        write_plot(png_path, records, title=f"wirereduce in-network ring allreduce ({name})")

    eth_configs = list(eth_configs)
    if eth_configs:
        run_eth_rows(eth_configs, eth_sizes, run=run, records=records, rows=rows, json_path=json_path,
                     build_root=build_root, slots=slots, link_latency=link_latency, seed=seed, progress=progress)
        write_plot(png_path, records, title=f"wirereduce in-network ring allreduce ({name})")
    codec_sizes = list(codec_sizes)
    if codec_sizes:
        rows.extend(run_codec_rows(codec_sizes, run=run, records=records, json_path=json_path,
                                   build_root=build_root, link_latency=link_latency, seed=seed,
                                   progress=progress))
    if measure_latency:
        widths = sorted({c.width for c in configs})
        mtu = min(c.mtu for c in configs)
        lat = _measure_latency(widths, mtu, latency)
        records.extend(lat)
        _out(_latency_table(lat))
    _out(_speed_table(rows))

    sim_cycles = sum(r["sim_cycles"] for r in rows)
    wall = sum(r["wall_s"] for r in rows if r["wall_s"] == r["wall_s"])
    meta.update({"complete": True, "total_s": time.perf_counter() - t_start, "sim_cycles": sim_cycles,
                 "sim_wall_s": wall, "sim_cycles_per_s": sim_cycles / wall if wall > 0 else None})
    _write_json(json_path, records)
    write_plot(png_path, records, title=f"wirereduce in-network ring allreduce ({name})")
    _out(f"#\n# wrote {json_path} and {png_path}")
    return records
