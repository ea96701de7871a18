"""``wirereduce fuzz``: run the fuzz suite (:mod:`wirereduce.sim.fuzz`) and print its table."""

from __future__ import annotations

import json
import time

from wirereduce.errors import CliError

__all__ = ["add_subcommand", "cmd_fuzz"]


def cmd_fuzz(args) -> int:
    from wirereduce.sim.engines.runner import SimSetup, SimulationError
    from wirereduce.sim.fuzz.cases import KINDS, make_cases
    from wirereduce.sim.fuzz.run import format_table, run_fuzz

    from wirereduce.config import NodeConfig

    kinds = tuple(args.kinds.split(",")) if args.kinds else KINDS
    try:
        config = NodeConfig(args.width, args.mtu, slots=4, codec=args.compress is not None)
        setup = SimSetup(nodes=args.nodes, config=config, links=args.links)
        cases = make_cases(args.cases, args.nodes, args.seed, kinds)
    except (TypeError, ValueError) as e:
        raise CliError(str(e)) from e
    print(f"fuzz: {len(cases)} cases on {args.nodes} nodes, {args.width} bit, links={args.links}"
          f"{'' if args.compress is None else f', compressed k={args.compress}'}, seed {args.seed} "
          f"(the build is cached under {args.build_dir})", flush=True)
    t0 = time.perf_counter()
    try:
        verdicts = run_fuzz(setup, cases, seed=args.seed, compression=args.compress, build_root=args.build_dir,
                            timeout_cycles=args.timeout)
    except ValueError as e:
        raise CliError(str(e)) from e
    except SimulationError as e:
        raise CliError(f"simulation failed: {e}") from e
    print(format_table(verdicts))
    print(f"wall {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**v.case.as_dict(), "outcome": v.outcome, "counted": v.counted, "ok": v.ok,
                        "hang": v.hang, "error": v.error, "silent_wrong": v.silent_wrong, "uncounted": v.uncounted,
                        "fresh_wrong": v.fresh_wrong} for v in verdicts], f, indent=1)
    return 0 if all(v.ok for v in verdicts) else 1


def add_subcommand(sub) -> None:
    p = sub.add_parser(
        "fuzz", help="inject hostile and malformed frames next to real allreduces in a simulated ring",
        description="Runs CASES allreduces on a simulated ring (cocotb + Verilator), each with one malformed "
                    "or hostile frame injected into a host or ring port (kinds: short, version, opcode, "
                    "collective, flags, dtype, codec, seq_far, count_zero, count_big, payload_short, "
                    "payload_long, header_only, oversize, lost_forged, control_mid, stats_request, garbage), "
                    "and checks after each: no hang, no host holds a wrong value (every result chunk is the "
                    "golden sum or reported missing), the frame is counted in the right STATS counter, and a "
                    "fresh allreduce afterwards is bit-exact. Prints 'case | injected | outcome' and a last "
                    "line 'FUZZ cases=<n> silent_wrong=<w> hangs=<h> …'; exit 1 if any case failed.")
    p.add_argument("--cases", type=int, default=36, help="number of cases (default: 36, every kind twice)")
    p.add_argument("--seed", type=int, default=0, help="seed of the case generator and the arrays (default: 0)")
    p.add_argument("--nodes", type=int, default=3, help="ring size (default: 3)")
    p.add_argument("--links", choices=("model", "eth"), default="model", help="link models or 10G Ethernet")
    p.add_argument("--width", type=int, default=64, help="datapath width in bits (default: 64)")
    p.add_argument("--mtu", type=int, default=1500, help="MTU in bytes (default: 1500)")
    p.add_argument("--compress", type=int, default=None, metavar="K",
                   help="compressed collectives (INCEPTIONN, error bound 2^-K) on nodes built with the codec")
    p.add_argument("--kinds", default=None, help="comma-separated subset of the kinds (default: all)")
    p.add_argument("--timeout", type=int, default=8000, metavar="CYCLES",
                   help="quiet cycles after which a host reports its missing chunks (default: 8000)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the verdicts as JSON")
    p.add_argument("--build-dir", default="build/fuzz", help="where the simulator builds go (default: build/fuzz)")
    p.set_defaults(func=cmd_fuzz)
