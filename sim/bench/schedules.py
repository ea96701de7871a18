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

The engines are built for fp32 only (``EngineConfig(formats=("fp32",))``, recorded as ``formats``):
the benchmark sums fp32, the lanes' other formats would take no part in it and only make the
Verilator model larger (per 32-bit lane word one float adder instead of five, fp32's comparator
only, no integer adder). The cycles do not depend on it: the lanes' latency is the same for every
set of formats. :func:`run_format_bench` builds every format.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from wirereduce import schedule as sched
from wirereduce.config import EngineConfig, flows_room
from wirereduce.protocol import wire_bytes
from wirereduce.table import plan

__all__ = ["ROWS", "QUICK_ROWS", "SIZES", "QUICK_SIZES", "run_schedule_bench", "lower_bound_gbps",
           "FORMAT_WIDTHS", "run_format_bench", "CODEC_ROWS", "schedule_payloads", "schedule_link_bound",
           "run_codec_schedule_bench"]

#: (topology, algorithms) the full benchmark runs.
ROWS = (("ring:4", ("ring", "biring")), ("ring:8", ("ring", "biring")), ("torus:4x4", ("ring", "multitree")),
        ("hypercube:8", ("multitree",)))
#: The quick set (``make bench QUICK=1`` and the tests).
QUICK_ROWS = (("ring:4", ("ring", "biring")),)
SIZES = (32 << 10, 256 << 10, 1 << 20, 4 << 20)
QUICK_SIZES = (32 << 10, 256 << 10)


def _wire(schedule, elements: int, cfg: EngineConfig, chunk_words=None) -> int:
    prof = _profile(chunk_words)
    per = cfg.max_elements if prof is None else tuple(min(w, cfg.max_elements) for w in prof)
    return sum(wire_bytes(16 + 4 * c.count) for c in plan(elements, schedule, per))


def lower_bound_gbps(schedule, elements: int, cfg: EngineConfig, link_gbps: float, host_gbps: float,
                     chunk_words: int | tuple[int, ...] | None = None) -> float:
    """The d-port and host-link lower bound on algbw, frame overhead included (module docstring),
    for chunks of at most ``chunk_words`` words, or of that chunk profile (one size per round,
    :func:`wirereduce.table.plan`; default: full frames)."""
    n, d = schedule.nodes, schedule.topology.min_degree
    wire = _wire(schedule, elements, cfg, chunk_words)
    t_ports = 2 * (n - 1) / n * wire * 8 / (d * link_gbps)
    t_host = wire * 8 / host_gbps
    return elements * 4 * 8 / max(t_ports, t_host)


def window_slots(flows: int) -> int:
    """Buffer slots (= the host window, ``EngineConfig.slots``) for a schedule of ``flows`` flows: two
    chunks in flight per flow, at least 16, a power of two. With one per flow the window, not the
    links, sets the pace: ring:8 biring (16 flows) at 4 MiB reached 0.95 of its bound with 16 slots
    and 1.00 with 32 (``bench/results/outq-ring8-biring[-s32].json``); the 4x4 torus's balanced trees
    (16 flows) went from 0.72 to 0.83 with 32 (docs/architecture.md "MULTITREE below its targets")."""
    return max(16, 1 << (2 * max(1, flows) - 1).bit_length())


def check_chunk_bytes(chunk_bytes: Iterable) -> tuple:
    """``chunk_bytes`` of :func:`run_schedule_bench` as a tuple: each None (full frames), a multiple
    of 4 from 4 to a full frame's payload at MTU 1500 (1,484 bytes), or a *chunk profile*: a
    non-empty sequence of such sizes, one per round of chunks, the last one repeated
    (:func:`wirereduce.table.plan`; for example ``(256, 768, 1484)``: a small first chunk gets
    chain schedules going sooner, docs/architecture.md "Chunk profiles"), returned as a tuple.
    Raises ValueError otherwise."""
    top = 4 * EngineConfig(64, 1500).max_elements

    def ok(b):
        return isinstance(b, int) and not isinstance(b, bool) and 4 <= b <= top and b % 4 == 0

    out = []
    for b in chunk_bytes:
        if b is None or ok(b):
            out.append(b)
        elif isinstance(b, (tuple, list)) and b and all(ok(x) for x in b):
            out.append(tuple(b))
        else:
            raise ValueError(f"chunk_bytes must be multiples of 4 from 4 to {top} (a full frame's payload at "
                             f"MTU 1500), sequences of them (chunk profiles), or None, not {b!r}")
    return tuple(out)


def _profile(chunk_bytes) -> tuple[int, ...] | None:
    """A ``chunk_bytes`` entry (None, an int or a profile) as a profile: None or a tuple of sizes."""
    return None if chunk_bytes is None else (chunk_bytes,) if isinstance(chunk_bytes, int) else tuple(chunk_bytes)


def profile_label(chunk_bytes) -> str:
    """``"512"`` or ``"256,512,512,512,256"``: a ``chunk_bytes`` entry as the CLI spells it."""
    return ",".join(map(str, _profile(chunk_bytes)))


def run_schedule_bench(rows: Iterable = ROWS, sizes: Iterable[int] = SIZES, host_gbps: Iterable[float] = (50.0, 10.0),
                       *, out_dir: str | Path = "bench/results", name: str = "bench-schedules",
                       build_root: str | Path = "build/fastengine", seed: int = 1, plot: bool = True,
                       lookahead: int | None = None, priority: str = "auto", slots: int | None = None, threads: int = 1,
                       progress: bool = False, chunk_bytes: Iterable[int | None] = (None,),
                       multiring_roots: int | None = None, width: int = 64) -> list[dict]:
    """Run the benchmark; print a table; write ``<name>.json`` (and ``<name>.png``) in ``out_dir``.

    ``width``: the engines' datapath, 64 (default; 156.25 MHz, a host link above 10 Gbit/s simulated
    by a faster clock, docs/architecture.md "Host link") or 256 (the VC709 PCIe top's engine: 10G
    network ports at 156.25 MHz, a frame filling a quarter of the beats, and a host port of up to
    40 Gbit/s at that clock); MTU 1500 at both. Records carry ``width`` and ``mtu``.

    ``lookahead``, ``priority`` and ``slots`` are the engines' :class:`~wirereduce.config.EngineConfig`
    fields (summation units' lookahead D, allocator priority, buffer slots = the host window); every
    record carries them. ``slots`` None (default): :func:`window_slots` of the topology's schedule
    with the most flows, the same for every algorithm of the topology (so ``vs_ring`` compares equal
    engines). ``threads``: cores each simulation runs on (Verilator ``--threads``);
    ``progress``: a progress bar (chunks delivered) per run. Every algorithm of a topology runs on
    the same engines (``max_flows`` of its schedule with the most flows): one build per topology
    and host link. ``chunk_bytes``: chunk payload sizes
    to run every algorithm but the ring at, bytes, a multiple of 4, or chunk profiles (sequences of
    sizes, one per round; :func:`check_chunk_bytes`) (None: full frames; the ring,
    the ``vs_ring`` reference, always runs full frames); records carry ``chunk_bytes`` (the
    largest chunk) and ``chunk_profile`` (the profile's bytes per round, or None).
    ``multiring_roots``: roots per ring and direction of the ``multiring`` rows
    (:func:`~wirereduce.schedule.multiring_schedule` ``roots``; None: every node); records carry
    ``options``, the schedule's options.

    Raises
    ------
    ValueError
        A bad ``lookahead``, ``priority``, ``slots``, ``chunk_bytes`` or ``width`` (before anything
        is built).
    """
    if width not in (64, 256):
        raise ValueError(f"width must be 64 or 256 (engines with 10G network ports), not {width!r}")
    mtu = _mtu_of(width)
    EngineConfig(width, mtu, slots=16 if slots is None else slots, ports=2, lookahead=lookahead,
                 priority=priority)   # raises before any build
    chunk_bytes = check_chunk_bytes(chunk_bytes)
    from wirereduce.sim.cluster.schednet import engine_rates
    from wirereduce.sim.engines.fastengine import FastEngineSim, golden_check

    link_gbps = 10.0
    records: list[dict] = []
    print(f"{'topology':>12} {'algorithm':>9} {'host':>6} {'size':>8} {'cycles':>10} {'algbw':>8} {'bound':>8} "
          f"{'of bound':>8} {'vs ring':>7} {'vs 1-port':>9} {'exact':>5}", flush=True)
    for topo, algs in rows:
        built: dict[str, object] = {}   # algorithm -> its schedule, or why it has none
        for alg in algs:
            try:
                opts = {"roots": multiring_roots} if alg == "multiring" and multiring_roots is not None else {}
                built[alg] = sched.build(topo, alg, **opts)
            except ValueError as e:   # e.g. no ring order on a 3-D torus
                built[alg] = e
        most_flows = max((len(s.flows) for s in built.values() if not isinstance(s, ValueError)), default=1)
        topo_slots = slots if slots is not None else window_slots(most_flows)
        # Every algorithm of a topology on the same engines (one build; ``vs_ring`` compares equal
        # engines): table room for the schedule with the most flows.
        topo_flows = flows_room(most_flows)
        for host in host_gbps:
            mhz, link_rate, host_rate = engine_rates(width, host, link_gbps)
            ring_time: dict[int, int] = {}
            for alg in algs:
                s = built[alg]
                if isinstance(s, ValueError):
                    print(f"{topo:>12} {alg:>9} skipped: {s}", flush=True)
                    continue
                flows = len(s.flows)
                cfg = EngineConfig(width, mtu, slots=topo_slots, ports=s.topology.degree,
                                   max_flows=topo_flows, lookahead=lookahead,
                                   priority=priority, formats=("fp32",))
                sim = FastEngineSim(topo, cfg, 4, link_rate=link_rate, host_rate=host_rate, build_root=build_root,
                                    threads=threads)
                for size, cb in ((size, cb) for size in sizes for cb in ((None,) if alg == "ring" else chunk_bytes)):
                    elements = size // 4
                    prof = _profile(cb)
                    words = None if prof is None else tuple(b // 4 for b in prof)
                    rng = np.random.default_rng([seed, size, s.nodes])
                    arrays = [rng.standard_normal(elements).astype(np.float32) for _ in range(s.nodes)]
                    t0 = time.perf_counter()
                    r = sim.allreduce(arrays, s, progress=progress, chunk_words=words)
                    wall = time.perf_counter() - t0
                    bad = golden_check(arrays, s, r.results)
                    us = r.cycles / mhz
                    algbw = size * 8 / (us * 1e3)
                    bound = lower_bound_gbps(s, elements, cfg, link_gbps, host, words)
                    if alg == "ring":
                        ring_time[size] = r.cycles
                    wire = _wire(s, elements, cfg, words)
                    one_port_us = 2 * (s.nodes - 1) / s.nodes * wire * 8 / (link_gbps * 1e3)
                    rec = {
                        "kind": "schedule", "topology": s.topology.name, "algorithm": alg, "nodes": s.nodes,
                        "width": width, "mtu": mtu, "ports": cfg.ports, "lookahead": cfg.lookahead,
                        "priority": cfg.priority, "slots": cfg.slots,
                        "formats": list(cfg.formats), "flows": flows, "options": dict(s.options), "bytes": size,
                        "chunk_bytes": 4 * min(max(words or (cfg.max_elements,)), cfg.max_elements),
                        "chunk_profile": list(cb) if isinstance(cb, tuple) else None,
                        "elements": elements, "chunks": r.chunks,
                        "host_link_gbps": host, "link_gbps": link_gbps, "clock_mhz": mhz, "cycles": r.cycles,
                        "us": us, "algbw_gbps": algbw, "lower_bound_gbps": bound, "of_bound": algbw / bound,
                        "vs_ring": (ring_time[size] / r.cycles) if size in ring_time else None,
                        "vs_one_port_ring": one_port_us / us, "capped": host <= link_gbps,
                        "bitexact": not any(bad), "sim_cycles_per_s": r.sim_cycles / max(r.wall_s, 1e-9),
                        "sim_threads": threads, "build_s": r.build_s, "wall_s": wall,
                    }
                    records.append(rec)
                    _write(out_dir, name, records)   # after every run: a long benchmark keeps what it measured
                    vs = f"{rec['vs_ring']:.2f}" if rec["vs_ring"] is not None else "-"
                    chunk = "" if cb is None else f"  ({profile_label(cb)} B chunks)"
                    print(f"{s.topology.name:>12} {alg:>9} {host:>5g}G {size >> 10:>7}K {r.cycles:>10,} "
                          f"{algbw:>8.2f} {bound:>8.2f} {rec['of_bound']:>8.2f} {vs:>7} "
                          f"{rec['vs_one_port_ring']:>9.2f} {'yes' if rec['bitexact'] else 'NO':>5}"
                          f"{'  (capped by the host link)' if rec['capped'] else ''}{chunk}", flush=True)
    _write(out_dir, name, records)
    if plot and records:
        _plot(Path(out_dir) / f"{name}.png", records)
    return records


#: (width, network link Gbit/s, host link Gbit/s) of the format benchmark: the VC709's 10G links
#: with a 50G PCIe host, and 100G links at 512 bit with a host as fast as one link.
FORMAT_WIDTHS = ((64, 10.0, 50.0), (512, 100.0, 100.0))


def format_arrays(fmt: str, nodes: int, elements: int, seed: int = 1) -> list[np.ndarray]:
    """Random gradients of format ``fmt`` (fp32, bf16, fp16: normal values of mixed magnitude;
    int32: the whole range), one array of ``elements`` per node."""
    from wirereduce.formats import FORMATS

    rng = np.random.default_rng([seed, elements, nodes])
    if fmt == "int32":
        return [rng.integers(-(2**31), 2**31, elements, dtype=np.int64).astype(np.int32) for _ in range(nodes)]
    dt = FORMATS[fmt].numpy_dtype
    return [(rng.standard_normal(elements) * 2.0 ** rng.integers(-8, 8, elements)).astype(np.float32).astype(dt)
            for _ in range(nodes)]


def _mtu_of(width: int) -> int:
    """The MTU the benchmarks build engines of ``width`` bits with: 1500 at 64 bit and at 256 bit
    (10G network ports), 9000 (jumbo) at 512 bit (100G)."""
    return 1500 if width in (64, 256) else 9000


def run_format_bench(topology: str = "ring:4", algorithm: str = "biring", elements: int = 1 << 20,
                     formats=("fp32", "bf16", "fp16", "int32"), widths=FORMAT_WIDTHS, op: str = "sum", *,
                     out_dir: str | Path = "bench/results", name: str = "bench-formats",
                     build_root: str | Path = "build/fastengine", seed: int = 1) -> list[dict]:
    """Elements per second of each number format on the schedule engine, against fp32's.

    For every ``(width, link Gbit/s, host Gbit/s)`` of ``widths`` and format, one allreduce of
    ``elements`` random values per node (default 2^20: 4 MiB of fp32, 2 MiB of bf16) with
    ``algorithm`` on ``topology``, checked bit for bit against the golden model
    (:func:`wirereduce.sim.engines.fastengine.golden_check`). Records ``elements_per_s``
    (elements / simulated time) and ``vs_fp32`` = this format's elements/s ÷ fp32's at the same
    width and rates: bf16 and fp16 pack two elements per 32-bit lane, so the target is ≥ 1.95.
    Prints a table; writes ``<name>.json`` in ``out_dir``; returns the records.
    """
    from wirereduce.sim.cluster.schednet import engine_rates
    from wirereduce.sim.engines.fastengine import FastEngineSim, golden_check

    records: list[dict] = []
    s = sched.build(topology, algorithm)
    flows = len(s.flows)
    print(f"{'topology':>10} {'algorithm':>9} {'width':>5} {'links':>6} {'host':>6} {'format':>6} {'elements':>9} "
          f"{'cycles':>10} {'algbw':>8} {'Melem/s':>9} {'vs fp32':>7} {'exact':>5}", flush=True)
    for width, link_gbps, host_gbps in widths:
        mhz, link_rate, host_rate = engine_rates(width, host_gbps, link_gbps)
        cfg = EngineConfig(width, _mtu_of(width), slots=16, ports=s.topology.degree,
                           max_flows=flows_room(flows))
        sim = FastEngineSim(topology, cfg, 4, link_rate=link_rate, host_rate=host_rate, build_root=build_root)
        fp32_rate = None
        for fmt in formats:
            arrays = format_arrays(fmt, s.nodes, elements, seed)
            r = sim.allreduce(arrays, s, op=op)
            bad = golden_check(arrays, s, r.results, op)
            us = r.cycles / mhz
            rate = elements / (us * 1e-6)
            if fmt == "fp32":
                fp32_rate = rate
            rec = {
                "kind": "format", "topology": s.topology.name, "algorithm": algorithm, "nodes": s.nodes,
                "width": width, "mtu": cfg.mtu, "link_gbps": link_gbps, "host_link_gbps": host_gbps, "clock_mhz": mhz,
                "format": fmt, "op": op, "elements": elements, "bytes": r.bytes, "chunks": r.chunks,
                "cycles": r.cycles, "us": us, "algbw_gbps": r.bytes * 8 / (us * 1e3), "elements_per_s": rate,
                "vs_fp32": rate / fp32_rate if fp32_rate else None, "bitexact": not any(bad),
            }
            records.append(rec)
            _write(out_dir, name, records)
            vs = f"{rec['vs_fp32']:.3f}" if rec["vs_fp32"] else "-"
            print(f"{s.topology.name:>10} {algorithm:>9} {width:>5} {link_gbps:>5g}G {host_gbps:>5g}G {fmt:>6} "
                  f"{elements:>9} {r.cycles:>10,} {rec['algbw_gbps']:>8.2f} {rate / 1e6:>9.1f} {vs:>7} "
                  f"{'yes' if rec['bitexact'] else 'NO':>5}", flush=True)
    return records


#: (topology, algorithms) of the compressed schedule benchmark.
CODEC_ROWS = (("ring:4", ("ring", "biring")),)
#: Slots (= the host window) of the compressed rows' engines: a compressing hop stores each frame (twice until
#: the cut-through CodecIn of 2026-12-01, once since), so a chunk's round trip is long and 16 slots held the
#: compressed ring back (ring:4, 1 MiB, k = 8: 161,987 cycles
#: with 32 against 172,462; docs/codec.md "On the schedule engine").
CODEC_SCHEDULE_SLOTS = 32


def _flow_sums(arrays, schedule, k: int) -> list[tuple[dict, np.ndarray]]:
    """Per flow of a compressed collective of ``schedule``: (every non-root node's partial sum, the
    result), uint32 words, as :func:`wirereduce.sim.golden.schedule.flow_result` with
    ``compression=k`` gives them (the hosts push ``quantize(x, k)``)."""
    from wirereduce.sim.golden.schedule import flow_result

    words = [np.asarray(a, np.float32).view(np.uint32) for a in arrays]
    out = []
    for f in range(len(schedule.flows)):
        partials: dict[int, np.ndarray] = {}
        result = flow_result(words, schedule, f, compression=k, partials=partials)
        root = schedule.flows[f].root
        out.append(({u: p for u, p in partials.items() if u != root}, result))
    return out


def schedule_payloads(arrays, schedule, k: int, sums=None) -> list[np.ndarray]:
    """Every payload a compressed collective of ``schedule`` sends on a network link, as fp32 values
    before compression (encoding a value or its quantized form gives the same bytes): each non-root
    node's partial sum of each flow (to its parent), and each flow's result once per tree edge (the
    gather). The hosts push ``quantize(x, k)``, as :func:`wirereduce.sim.golden.schedule.allreduce`
    with ``compression=k`` says. ``sums``: :func:`_flow_sums` when the caller has them."""
    out = []
    for partials, result in sums if sums is not None else _flow_sums(arrays, schedule, k):
        out += [partials[u].view(np.float32) for u in sorted(partials)]
        out += [result.view(np.float32)] * (schedule.nodes - 1)
    return out


def schedule_link_bound(arrays, schedule, k: int, mtu: int, sums=None) -> float:
    """The speed-up over the same schedule uncompressed that the network links alone allow a
    compressed collective (its framing bound): the busiest directed link's wire bytes uncompressed ÷
    compressed, the schedule's counterpart of :func:`wirereduce.sim.bench.algbw.codec_link_bound`.

    Every chunk is one frame, planned as the driver plans it (:func:`wirereduce.table.plan` with
    ``max_elements(mtu)`` raw and ``max_elements_compressed(mtu)`` compressed fp32 values a chunk);
    each tree edge carries the child's partial sum of the chunk up and the flow's result down, and
    :func:`~wirereduce.protocol.wire_bytes` adds the header, Ethernet header, FCS, preamble and gap.
    Host links are left out (they carry every host's pushes and results whatever the schedule).
    Divided by the compression ratio it is the highest ``speedup_ratio`` any engine could reach on
    these gradients. ``sums``: :func:`_flow_sums` when the caller has them.

    Raises ValueError on a bad ``k`` or ``mtu`` (the codec's and protocol's checks).
    """
    from wirereduce import codec
    from wirereduce.protocol import HEADER_BYTES, max_elements, wire_bytes
    from wirereduce.table import plan

    sums = sums if sums is not None else _flow_sums(arrays, schedule, k)
    n = np.asarray(arrays[0]).size
    base = [sl.start or 0 for sl in schedule.split(n)]   # a flow's sums are its share of the message

    def frame(v, part: slice, compressed: bool) -> int:
        """Wire bytes of the frame that carries ``v[part]`` (uint32 words), compressed or raw."""
        body = codec.encoded_size(v[part].view(np.float32), k) if compressed else 4 * (part.stop - part.start)
        return wire_bytes(HEADER_BYTES + body)

    busiest = []
    for per, compressed in ((max_elements(mtu), False), (codec.max_elements_compressed(mtu), True)):
        load: dict[tuple[int, int], int] = {}
        for c in plan(n, schedule, per):
            partials, result = sums[c.flow]
            part = slice(c.start - base[c.flow], c.start - base[c.flow] + c.count)
            down = frame(result, part, compressed)
            for e in schedule.flows[c.flow].edges:
                load[e.child, e.parent] = load.get((e.child, e.parent), 0) + frame(partials[e.child], part, compressed)
                load[e.parent, e.child] = load.get((e.parent, e.child), 0) + down
        busiest.append(max(load.values()))
    return busiest[0] / busiest[1]


def run_codec_schedule_bench(rows: Iterable = CODEC_ROWS, sizes: Iterable[int] = (1 << 20,),
                             ks: Iterable[int] = (8, 10, 12), host_gbps: float = 50.0, *,
                             out_dir: str | Path = "bench/results", name: str = "bench-schedules-codec",
                             build_root: str | Path = "build/fastengine", seed: int = 0,
                             slots: int = CODEC_SCHEDULE_SLOTS,
                             threads: int = 1, progress: bool = False, lookahead: int | None = None,
                             priority: str = "auto", width: int = 64) -> list[dict]:
    """Compressed collectives on codec schedule engines (``EngineConfig(codec=True)``), next to the
    uncompressed one on the same engines and gradients.

    For every (topology, algorithm) of ``rows`` and size, the demo CNN's real gradients
    (:func:`wirereduce.sim.workloads.gradients.gradient_stream`) run once uncompressed and once per
    k compressed (hosts push compressed, every hop decompresses, sums in table order and
    recompresses), each checked bit for bit against :func:`wirereduce.sim.golden.schedule.allreduce`
    (with ``compression=k``). Records ``speedup`` = uncompressed time ÷ compressed time, ``ratio``
    = raw ÷ compressed bytes of every payload the links carry (:func:`schedule_payloads`) and
    ``speedup_ratio`` = speedup ÷ ratio (the ring node's target is ≥ 0.9, docs/codec.md
    "Performance"); ``link_bound_speedup`` = :func:`schedule_link_bound` and ``link_ratio`` = it ÷
    ``ratio``, the highest ``speedup_ratio`` the links allow. algbw counts uncompressed bytes.
    Network links 10G, host link ``host_gbps``.
    ``slots``, ``lookahead`` and ``priority`` are the engines' :class:`~wirereduce.config.EngineConfig`
    fields (buffer slots = the host window, the summation units' lookahead D, None: the codec
    engine's default, :data:`~wirereduce.config.CODEC_LOOKAHEAD`, the allocator's priority); records
    carry them. ``width``: the engines' datapath, 64 (MTU 1500) or 512 (MTU 9000, a core of 64 bytes a
    cycle behind the same 10G links, so the links and not the codec stages' one beat a cycle set the
    pace, as in the ring's compressed rows, :data:`wirereduce.sim.bench.algbw.CODEC_CONFIG`). A
    compressing hop stores each frame (once, in the compressor, since the cut-through ``CodecIn`` of
    2026-12-01; twice before; docs/codec.md "Latency"), so the units wait longer for their oldest
    chunk than on uncompressed trees, and a deeper lookahead pays off there (docs/codec.md "On the schedule engine").
    Prints a table; writes ``<name>.json`` in ``out_dir``; returns the records.

    Raises
    ------
    ValueError
        A bad k, size, slots, lookahead or priority, before anything is built.
    """
    from wirereduce.sim.cluster.schednet import engine_rates
    from wirereduce.sim.engines.fastengine import FastEngineSim, golden_check
    from wirereduce.sim.workloads.gradients import gradient_stream

    from wirereduce.codec import check_k, compression_ratio

    ks = [check_k(k) for k in ks]
    sizes = sorted({int(x) for x in sizes})
    if any(x < 4 or x % 4 for x in sizes):
        raise ValueError(f"sizes must be positive multiples of 4 bytes, not {sizes}")
    if width not in (64, 512):
        raise ValueError(f"width must be 64 (MTU 1500) or 512 (MTU 9000), not {width!r}")
    mtu = _mtu_of(width)
    EngineConfig(width, mtu, slots=slots, ports=2, lookahead=lookahead, priority=priority)   # raises before any build
    link_gbps = 10.0
    mhz, link_rate, host_rate = engine_rates(width, host_gbps, link_gbps)
    records: list[dict] = []
    print(f"{'topology':>10} {'algorithm':>9} {'size':>8} {'k':>4} {'cycles':>10} {'algbw':>8} {'ratio':>6} "
          f"{'speedup':>7} {'sp/ratio':>8} {'link/ratio':>10} {'exact':>5}", flush=True)
    for topo, algs in rows:
        for alg in algs:
            s = sched.build(topo, alg)
            flows = len(s.flows)
            cfg = EngineConfig(width, mtu, slots=slots, ports=s.topology.degree, max_flows=flows_room(flows),
                               formats=("fp32",), codec=True, lookahead=lookahead, priority=priority)
            sim = FastEngineSim(topo, cfg, 4, link_rate=link_rate, host_rate=host_rate, build_root=build_root,
                                threads=threads)
            for size in sizes:
                elements = size // 4
                arrays = gradient_stream(s.nodes, elements, seed=seed)
                base = None
                for k in [None, *ks]:
                    r = sim.allreduce(arrays, s, progress=progress, compression=k)
                    bad = golden_check(arrays, s, r.results, compression=k)
                    us = r.cycles / mhz
                    rec = {
                        "kind": "schedule-codec", "topology": s.topology.name, "algorithm": alg, "nodes": s.nodes,
                        "ports": cfg.ports, "width": width, "mtu": mtu, "slots": cfg.slots, "lookahead": cfg.lookahead,
                        "priority": cfg.priority, "flows": flows, "bytes": size, "elements": elements,
                        "chunks": r.chunks, "compression": k, "host_link_gbps": host_gbps, "link_gbps": link_gbps,
                        "clock_mhz": mhz, "cycles": r.cycles, "us": us, "algbw_gbps": size * 8 / (us * 1e3),
                        "bitexact": not any(bad),
                    }
                    if k is None:
                        base = r.cycles
                        rec.update(ratio=1.0, speedup=1.0, speedup_ratio=1.0)
                    else:
                        sums = _flow_sums(arrays, s, k)
                        ratio = compression_ratio(np.concatenate(schedule_payloads(arrays, s, k, sums)), k)
                        bound = schedule_link_bound(arrays, s, k, mtu, sums)
                        rec.update(ratio=ratio, speedup=base / r.cycles, speedup_ratio=base / r.cycles / ratio,
                                   link_bound_speedup=bound, link_ratio=bound / ratio)
                    records.append(rec)
                    _write(out_dir, name, records)
                    kk = "none" if k is None else str(k)
                    print(f"{s.topology.name:>10} {alg:>9} {size >> 10:>7}K {kk:>4} {r.cycles:>10,} "
                          f"{rec['algbw_gbps']:>8.2f} {rec['ratio']:>6.2f} {rec['speedup']:>7.2f} "
                          f"{rec['speedup_ratio']:>8.3f} {rec.get('link_ratio', 1.0):>10.3f} "
                          f"{'yes' if rec['bitexact'] else 'NO':>5}", flush=True)
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
    def key(r):   # one curve per topology, algorithm, host link and chunk size (or profile)
        return (r["topology"], r["algorithm"], r["host_link_gbps"],
                _profile(r.get("chunk_profile") or r.get("chunk_bytes")))

    full = {key(r)[3] for r in records if r["algorithm"] == "ring"}
    keys = set(map(key, records))
    several = len({k[3] for k in keys}) > 1   # chunk sizes to tell apart in the legend
    for topo, alg, host, chunk in sorted(keys, key=lambda k: (*k[:3], k[3] is None, [-b for b in k[3] or ()])):
        rs = sorted((r for r in records if key(r) == (topo, alg, host, chunk)), key=lambda r: r["bytes"])
        style = "-" if host > 10 else ":"
        short = several and chunk is not None and chunk not in full
        ax.plot([r["bytes"] for r in rs], [r["algbw_gbps"] for r in rs], style, marker="o",
                label=f"{topo} {alg}, host {host:g}G" + (f", {profile_label(chunk)} B chunks" if short else ""))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message bytes per node")
    ax.set_ylabel("algbw (Gbit/s)")
    ax.set_title("schedule engine: algbw against size (network links 10G; dotted: 10G host link, capped)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
