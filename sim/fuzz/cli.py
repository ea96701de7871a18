"""``wirereduce fuzz``: run the fuzz suite (:mod:`wirereduce.sim.fuzz`) and print its table."""

from __future__ import annotations

import json
import time

from wirereduce.errors import CliError

__all__ = ["add_subcommand", "cmd_fuzz"]


def cmd_fuzz(args) -> int:
    from wirereduce.sim.engines.runner import EngineSetup, SimulationError
    from wirereduce.sim.fuzz.cases import KINDS, engine_ports, make_cases
    from wirereduce.sim.fuzz.run import format_table, run_fuzz

    from wirereduce import schedule as sched
    from wirereduce.config import EngineConfig

    kinds = tuple(args.kinds.split(",")) if args.kinds else KINDS
    try:
        if args.topology is None:   # --nodes N: a ring of N engines running the NTT ring schedule
            args.topology = f"ring:{3 if args.nodes is None else args.nodes}"
            args.algorithm = args.algorithm or "ring"
        elif args.nodes is not None:
            raise ValueError("give --nodes N (--topology ring:N) or --topology, not both")
        if args.algorithm is None:
            raise ValueError(f"--topology needs --algorithm ({', '.join(sched.ALGORITHMS)}): the schedule every "
                             f"rank runs while the frames go in")
        topo = sched.parse_topology(args.topology)
        sched.build(topo.name, args.algorithm)   # an unknown algorithm, or one the topology cannot run
        config = EngineConfig(args.width, args.mtu, slots=4, ports=max(2, topo.degree),
                              codec=args.compress is not None)
        setup = EngineSetup(topology=topo.name, config=config, links=args.links)
        cases = make_cases(args.cases, topo.nodes, args.seed, kinds, ports=engine_ports(topo))
        where = f"{topo.name} {args.algorithm} (schedule engines)"
    except (TypeError, ValueError) as e:
        raise CliError(str(e)) from e
    print(f"fuzz: {len(cases)} cases on {where}, {args.width} bit, links={args.links}"
          f"{'' if args.compress is None else f', compressed k={args.compress}'}, seed {args.seed} "
          f"(the build is cached under {args.build_dir})", flush=True)
    t0 = time.perf_counter()
    try:
        verdicts = run_fuzz(setup, cases, seed=args.seed, compression=args.compress, build_root=args.build_dir,
                            timeout_cycles=args.timeout, algorithm=args.algorithm)
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
        "fuzz", help="inject hostile and malformed frames next to real allreduces in a simulated network",
        description="Runs CASES allreduces on a simulated network (cocotb + Verilator): schedule engines on "
                    "--topology running --algorithm (what the board tops carry; --nodes N: --topology ring:N "
                    "--algorithm ring), each with one malformed or hostile frame injected into a host or network port "
                    "(kinds: short, version, opcode, "
                    "collective, flags, dtype, codec, seq_far, count_zero, count_big, payload_short, "
                    "payload_long, header_only, oversize, lost_forged, control_mid, abort_mid, stats_request, "
                    "garbage), "
                    "and checks after each: no hang, no host holds a wrong value (every result chunk is the "
                    "golden sum or reported missing), the frame is counted in the right STATS counter, and a "
                    "fresh allreduce afterwards is bit-exact. Prints 'case | injected | outcome' and a last "
                    "line 'FUZZ cases=<n> silent_wrong=<w> hangs=<h> …'; exit 1 if any case failed.")
    p.add_argument("--cases", type=int, default=36, help="number of cases (default: 36, every kind twice)")
    p.add_argument("--seed", type=int, default=0, help="seed of the case generator and the arrays (default: 0)")
    p.add_argument("--topology", default=None, metavar="SPEC",
                   help="schedule engines on this topology (ring:N, torus:AxB, mesh:AxB, hypercube:N); "
                        "with --algorithm")
    p.add_argument("--algorithm", default=None,
                   help="the schedule the ranks run (ring, biring, multiring, multitree, multitree-balanced; "
                        "default with --nodes: ring)")
    p.add_argument("--nodes", type=int, default=None,
                   help="without --topology: a ring of N engines running the NTT ring schedule, --topology ring:N "
                        "--algorithm ring (default: 3)")
    p.add_argument("--links", choices=("model", "eth"), default="model",
                   help="link models or 10G Ethernet (64 bit) between the nodes")
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
