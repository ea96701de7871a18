"""The schedule benchmark: ring, bidirectional ring and MULTITREE on the schedule engine.

For every (topology, algorithm), host-link rate and message size it runs one allreduce of random
fp32 gradients on a simulated :class:`~wirereduce.sim.cluster.schednet.ScheduleNetwork` (fast
engine), checks every node's result bit for bit against
:func:`wirereduce.sim.golden.schedule.allreduce`, and records:

- ``algbw_gbps`` = message bits / time, time = cycles (first push to last result) / clock;
- ``lower_bound_gbps``: the algbw of the best any allreduce could do on these nodes
  (docs/background.md "Lower bound"), with the frame overhead: every node sends and receives
  2(N−1)/N of the message's wire bytes over its d ports of B, and every host pushes and receives
  the whole message over its host link: ``T ≥ max(2(N−1)/N · M_wire / (d·B), M_wire / B_host)``;
- ``vs_ring`` = time of the ``ring`` schedule (NTT's chain, on the same engines and nodes) ÷ this
  time (> 1: faster than the ring);
- ``vs_one_port_ring``: the same against MULTITREE's baseline, a unidirectional host ring on one
  port per node, 2(N−1)/N · M_wire / B;
- ``capped``: the host link is no faster than a network link, so every schedule is capped at
  M_wire / B_host, which the ring already reaches.

The network links run at 10 Gbit/s (64 bit). A host link faster than the datapath at 156.25 MHz
is simulated by clocking the datapath faster and pacing the network links
(:func:`wirereduce.sim.cluster.schednet.engine_rates`; docs/architecture.md "Host link").
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from wirereduce import schedule as sched
from wirereduce.config import EngineConfig
from wirereduce.protocol import wire_bytes
from wirereduce.table import plan

__all__ = ["ROWS", "QUICK_ROWS", "SIZES", "QUICK_SIZES", "run_schedule_bench", "lower_bound_gbps"]

#: (topology, algorithms) the full benchmark runs.
ROWS = (("ring:4", ("ring", "biring")), ("ring:8", ("ring", "biring")), ("torus:4x4", ("ring", "multitree")),
        ("hypercube:8", ("multitree",)))
#: The quick set (``make bench QUICK=1`` and the tests).
QUICK_ROWS = (("ring:4", ("ring", "biring")),)
SIZES = (32 << 10, 256 << 10, 1 << 20, 4 << 20)
QUICK_SIZES = (32 << 10, 256 << 10)


def _wire(schedule, elements: int, cfg: EngineConfig) -> int:
    return sum(wire_bytes(16 + 4 * c.count) for c in plan(elements, schedule, cfg.max_elements))


def lower_bound_gbps(schedule, elements: int, cfg: EngineConfig, link_gbps: float, host_gbps: float) -> float:
    """The d-port and host-link lower bound on algbw, frame overhead included (module docstring)."""
    n, d = schedule.nodes, schedule.topology.min_degree
    wire = _wire(schedule, elements, cfg)
    t_ports = 2 * (n - 1) / n * wire * 8 / (d * link_gbps)
    t_host = wire * 8 / host_gbps
    return elements * 4 * 8 / max(t_ports, t_host)


def run_schedule_bench(rows: Iterable = ROWS, sizes: Iterable[int] = SIZES, host_gbps: Iterable[float] = (50.0, 10.0),
                       *, out_dir: str | Path = "bench/results", name: str = "bench-schedules",
                       build_root: str | Path = "build/fastengine", seed: int = 1, plot: bool = True) -> list[dict]:
    """Run the benchmark; print a table; write ``<name>.json`` (and ``<name>.png``) in ``out_dir``."""
    from wirereduce.sim.cluster.schednet import engine_rates
    from wirereduce.sim.engines.fastengine import FastEngineSim, golden_check

    link_gbps = 10.0
    records: list[dict] = []
    print(f"{'topology':>12} {'algorithm':>9} {'host':>6} {'size':>8} {'cycles':>10} {'algbw':>8} {'bound':>8} "
          f"{'of bound':>8} {'vs ring':>7} {'vs 1-port':>9} {'exact':>5}", flush=True)
    for topo, algs in rows:
        for host in host_gbps:
            mhz, link_rate, host_rate = engine_rates(64, host, link_gbps)
            ring_time: dict[int, int] = {}
            for alg in algs:
                try:
                    s = sched.build(topo, alg)
                except ValueError as e:   # e.g. no ring order on a 3-D torus
                    print(f"{topo:>12} {alg:>9} skipped: {e}", flush=True)
                    continue
                flows = len(s.flows)
                cfg = EngineConfig(64, 1500, slots=16, ports=s.topology.degree,
                                   max_flows=max(8, 1 << (flows - 1).bit_length()))
                sim = FastEngineSim(topo, cfg, 4, link_rate=link_rate, host_rate=host_rate, build_root=build_root)
                for size in sizes:
                    elements = size // 4
                    rng = np.random.default_rng([seed, size, s.nodes])
                    arrays = [rng.standard_normal(elements).astype(np.float32) for _ in range(s.nodes)]
                    t0 = time.perf_counter()
                    r = sim.allreduce(arrays, s)
                    wall = time.perf_counter() - t0
                    bad = golden_check(arrays, s, r.results)
                    us = r.cycles / mhz
                    algbw = size * 8 / (us * 1e3)
                    bound = lower_bound_gbps(s, elements, cfg, link_gbps, host)
                    if alg == "ring":
                        ring_time[size] = r.cycles
                    wire = _wire(s, elements, cfg)
                    one_port_us = 2 * (s.nodes - 1) / s.nodes * wire * 8 / (link_gbps * 1e3)
                    rec = {
                        "kind": "schedule", "topology": s.topology.name, "algorithm": alg, "nodes": s.nodes,
                        "ports": cfg.ports, "flows": flows, "bytes": size, "elements": elements, "chunks": r.chunks,
                        "host_link_gbps": host, "link_gbps": link_gbps, "clock_mhz": mhz, "cycles": r.cycles,
                        "us": us, "algbw_gbps": algbw, "lower_bound_gbps": bound, "of_bound": algbw / bound,
                        "vs_ring": (ring_time[size] / r.cycles) if size in ring_time else None,
                        "vs_one_port_ring": one_port_us / us, "capped": host <= link_gbps,
                        "bitexact": not any(bad), "sim_cycles_per_s": r.sim_cycles / max(r.wall_s, 1e-9),
                        "wall_s": wall,
                    }
                    records.append(rec)
                    _write(out_dir, name, records)   # after every run: a long benchmark keeps what it measured
                    vs = f"{rec['vs_ring']:.2f}" if rec["vs_ring"] is not None else "-"
                    print(f"{s.topology.name:>12} {alg:>9} {host:>5g}G {size >> 10:>7}K {r.cycles:>10,} "
                          f"{algbw:>8.2f} {bound:>8.2f} {rec['of_bound']:>8.2f} {vs:>7} "
                          f"{rec['vs_one_port_ring']:>9.2f} {'yes' if rec['bitexact'] else 'NO':>5}"
                          f"{'  (capped by the host link)' if rec['capped'] else ''}", flush=True)
    _write(out_dir, name, records)
    if plot and records:
        _plot(Path(out_dir) / f"{name}.png", records)
    return records


def _write(out_dir, name: str, records: list[dict]) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(records, indent=1))


def _plot(path: Path, records: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    keys = sorted({(r["topology"], r["algorithm"], r["host_link_gbps"]) for r in records})
    for topo, alg, host in keys:
        rs = sorted((r for r in records if (r["topology"], r["algorithm"], r["host_link_gbps"]) == (topo, alg, host)),
                    key=lambda r: r["bytes"])
        style = "-" if host > 10 else ":"
        ax.plot([r["bytes"] for r in rs], [r["algbw_gbps"] for r in rs], style, marker="o",
                label=f"{topo} {alg}, host {host:g}G")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message bytes per node")
    ax.set_ylabel("algbw (Gbit/s)")
    ax.set_title("schedule engine: algbw against size (network links 10G; dotted: 10G host link, capped)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
