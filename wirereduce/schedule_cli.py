"""``wirereduce schedule``: build, check and report an allreduce schedule (:mod:`wirereduce.schedule`).

Hook it into the main parser with ``add_subcommand(sub)``.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["add_subcommand", "cmd_schedule"]


def add_subcommand(subparsers) -> None:
    """Register ``schedule`` on the ``wirereduce`` sub-parser ``subparsers``."""
    from wirereduce.schedule import ALGORITHMS

    p = subparsers.add_parser(
        "schedule", help="build an allreduce schedule (ring, biring, multitree, multitree-balanced) and report "
                                 "its steps and loads",
        description="Builds the schedule, checks it (every tree spans the network, no link carries two flows in "
                    "one step, port budgets hold, every result reaches every node) and prints its lock-step "
                    "steps, per-step and per-link load and the lower bound.")
    p.add_argument("--topology", default="torus:4x4",
                   help="ring:N, torus:AxB, mesh:AxB, torus:AxBxC or hypercube:N (default: torus:4x4)")
    p.add_argument("--algorithm", default="multitree", choices=ALGORITHMS, help="schedule (default: multitree)")
    p.add_argument("--ports", type=int, default=None,
                   help="multitree: links per node and step (default: the topology's degree)")
    p.add_argument("--full-round", action="store_true",
                   help="multitree: end a step only when a whole round of roots adds nothing (the simulator "
                        "stops when the last root does; shortens mesh schedules)")
    p.add_argument("--mesh-distance-fix", action="store_true",
                   help="multitree: use the correct corner distance for mesh priorities (the simulator's differs)")
    p.add_argument("--roots", type=int, default=None, metavar="R",
                   help="multiring: roots per ring and direction, a divisor of the node count (2·k·R flows on k "
                        "rings; default: every node; bench-schedules --multiring-roots runs the same)")
    p.add_argument("--mtu", type=int, default=None, help="also print the bound with frames of this MTU")
    p.add_argument("--json", metavar="FILE", default=None, help="write the schedule and its tables as JSON")
    p.add_argument("--plot", metavar="FILE.png", default=None, help="draw the trees (needs matplotlib)")
    p.set_defaults(func=cmd_schedule)


def cmd_schedule(args) -> int:
    from wirereduce.errors import CliError
    from wirereduce.schedule import build, describe_schedule, frame_efficiency, plot_trees, validate

    options = {}
    if args.algorithm == "multitree":
        options = {"ports": args.ports, "full_round": args.full_round, "mesh_distance_fix": args.mesh_distance_fix}
    elif args.algorithm == "multitree-balanced" and not (args.full_round or args.mesh_distance_fix):
        options = {"ports": args.ports}
    elif args.full_round or args.mesh_distance_fix:
        raise CliError(f"--full-round and --mesh-distance-fix are multitree options, not {args.algorithm}")
    elif args.ports is not None:
        raise CliError(f"--ports is a multitree and multitree-balanced option, not {args.algorithm}")
    if args.roots is not None:
        if args.algorithm != "multiring":
            raise CliError(f"--roots is a multiring option, not {args.algorithm}")
        options = {"roots": args.roots}
    try:
        if args.mtu is not None:
            frame_efficiency(args.mtu)
        schedule = build(args.topology, args.algorithm, **options)
        validate(schedule)
    except ValueError as e:
        raise CliError(str(e)) from e
    print(describe_schedule(schedule, mtu=args.mtu))
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(schedule.to_dict(), indent=1) + "\n")
        except OSError as e:
            raise CliError(f"cannot write {args.json}: {e}") from e
        print(f"wrote {args.json}")
    if args.plot:
        try:
            plot_trees(schedule, args.plot)
        except ImportError as e:
            raise CliError("--plot needs matplotlib: run '.venv/bin/pip install matplotlib'") from e
        except OSError as e:
            raise CliError(f"cannot write {args.plot}: {e}") from e
        print(f"wrote {args.plot}")
    return 0
