"""The fuzz suite: build a network with injection ports, run the cases, judge them.

:func:`run_fuzz` builds the simulated network with injection ports: schedule
engines on any topology running any schedule
(:class:`~wirereduce.sim.cluster.schednet.ScheduleNetwork` with ``inject=True``, every rank an
:class:`~wirereduce.host.rank.EngineRankDriver`, :mod:`wirereduce.sim.fuzz.cocotb_engine_fuzz`); link
models or 10G Ethernet, with or without the codec. It runs every
:class:`~wirereduce.sim.fuzz.cases.FuzzCase` in one simulation and returns one :class:`Verdict` a
case (:func:`judge`):

- **hang**: the case did not finish (the simulation stopped);
- **error**: the driver raised something other than a report of lost chunks (a malformed result);
- **silent_wrong**: some host holds a result chunk that is not the golden sum, bit for bit
  (``view(np.uint32)``; NaN payloads compared as NaN), without being told it is missing;
- **uncounted**: the frame moved none of the counters its kind must move at the node it hit
  (:data:`~wirereduce.sim.fuzz.cases.EXPECTED`), and it was not taken as a lost chunk either;
- **fresh_wrong**: the allreduce run after the case is not bit-exact.

``wirereduce fuzz`` (``make fuzz``) prints the table and the line
``FUZZ cases=<n> silent_wrong=<w> hangs=<h>``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from wirereduce.sim.fuzz.cases import EXPECTED, FuzzCase, make_cases

__all__ = ["Verdict", "run_fuzz", "judge", "format_table"]


@dataclass
class Verdict:
    """How one case ended (see the module docstring)."""

    case: FuzzCase
    outcome: str
    counted: str
    hang: bool = False
    error: bool = False
    silent_wrong: bool = False
    uncounted: bool = False
    fresh_wrong: bool = False

    @property
    def ok(self) -> bool:
        return not (self.hang or self.error or self.silent_wrong or self.uncounted or self.fresh_wrong)


def _golden(arrays, compression, schedule):
    """Every host's golden result under ``schedule``, in its table order (one array per node)."""
    from wirereduce.sim.golden.schedule import allreduce

    return allreduce(arrays, schedule, compression=compression)


def _same_bits(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Element-wise: the same bits, or both NaN."""
    return (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))


#: Kinds whose compressed frame no longer matches its tags (a count or a length changed after encoding).
_CODEC_LENGTH = ("count_zero", "count_big", "payload_short", "payload_long", "header_only", "oversize")


def judge(rec: dict, arrays, fresh, compression, schedule) -> Verdict:
    """The :class:`Verdict` of one case's record (what :mod:`cocotb_engine_fuzz` wrote; the engine's
    record names each chunk's ``[start, count]``) on engines running ``schedule``."""
    case = FuzzCase(**rec["case"])
    if rec.get("outcome") not in ("complete", "lost"):
        return Verdict(case, rec.get("error", "did not finish"), "-", error=True)
    want = _golden(arrays, compression, schedule)
    spans = [tuple(c) for c in rec["chunks"]]
    wrong = False
    any_missing = False
    for k, hexdata in enumerate(rec["results"]):
        got = np.frombuffer(bytes.fromhex(hexdata), np.float32)
        missing = set(rec["missing"].get(str(k), []))
        any_missing |= bool(missing)
        ok = _same_bits(got, want[k])
        for seq, (start, count) in enumerate(spans):
            if seq in missing:
                continue
            if not ok[start:start + count].all():
                wrong = True
    before, after = rec["stats_before"][case.node], rec["stats_after"][case.node]
    moved = {}
    if before is not None and after is not None:
        moved = {n: (after[n] - before[n]) % (1 << 32) for n in after
                 if (n.startswith("drop_") or n == "control_refused") and after[n] != before[n]}
    expected = EXPECTED[case.kind]
    if expected is not None and compression is not None and case.kind in _CODEC_LENGTH:
        # a compressed frame whose length does not match its tags is marked bad by the engine's codec
        # stage, in front of the gate, and counted in drop_length (docs/protocol.md "Length check")
        expected = expected + ("drop_length",)
    if expected is not None and case.port.startswith("net"):
        from wirereduce.sim.fuzz.cases import engine_routes

        if not engine_routes(schedule, case.node, int(case.port[3:])):
            expected = expected + ("drop_opcode",)  # that port takes no frames of this schedule
    if "collective" in rec:   # the stray CONTROL's collective is the case's + 100 (build_frame)
        taken = after is not None and after["collective"] == (rec["collective"] + 100) & 0xFFFF
    else:
        taken = (before is not None and after is not None and after["collective"] != before["collective"])
    if case.kind in ("control_mid", "abort_mid") and taken:
        moved["taken"] = 1  # arrived between collectives: a new collective, as any CONTROL then
    if expected is None:
        uncounted = False
    else:
        uncounted = not any(moved.get(n, 0) for n in expected) and not ("lost" in expected and any_missing)
    fresh_wrong = True
    if rec.get("fresh") is not None:
        want_fresh = _golden(fresh, compression, schedule)
        fresh_wrong = not all(_same_bits(np.frombuffer(bytes.fromhex(h), np.float32),
                                         want_fresh[k]).all()
                              for k, h in enumerate(rec["fresh"]))
    outcome = "complete" if rec["outcome"] == "complete" else (
        "lost " + ",".join(str(s) for s in sorted({s for v in rec["missing"].values() for s in v})))
    counted = " ".join(f"{n}+{v}" for n, v in sorted(moved.items())) or "-"
    return Verdict(case, outcome, counted, silent_wrong=wrong, uncounted=uncounted, fresh_wrong=fresh_wrong)


def run_fuzz(setup, cases: list[FuzzCase] | int, *, seed: int = 0, compression: int | None = None,
             elements: int | None = None, build_root: str | Path = "build/fuzz", timeout_cycles: int = 8000,
             waves: bool = False, algorithm: str | None = None) -> list[Verdict]:
    """Run ``cases`` (or that many :func:`make_cases` from ``seed``) on ``setup``'s network.

    Parameters
    ----------
    setup : wirereduce.sim.engines.runner.EngineSetup
        Schedule engines on ``setup.topology``; ``algorithm`` is the schedule every rank runs, and
        the cases' ports are "host" and "net{p}" (:func:`~wirereduce.sim.fuzz.cases.engine_ports`).
    cases : list of FuzzCase, or int
    compression : int, optional
        Run compressed collectives (k), on nodes built with the codec.
    elements : int, optional
        Elements per host per collective; default two chunks a flow (the last one short).
    timeout_cycles : int
        Quiet cycles after which a host's driver reports its missing chunks.
    algorithm : str
        ``"ring"``, ``"biring"``, ``"multitree"``, … (:func:`wirereduce.schedule.build`); required.

    Raises
    ------
    ValueError, TypeError
        On bad arguments, before anything is built.
    wirereduce.sim.engines.runner.SimulationError
        If the simulator fails to build or run (a hang shows as cases with no record).
    """
    from wirereduce.host.driver import chunk_elements
    from wirereduce.sim.engines.runner import EngineSetup, SimulationError, _build

    from wirereduce import schedule as sched

    if not isinstance(setup, EngineSetup):
        raise TypeError(f"setup must be an EngineSetup (schedule engines on a topology), not {setup!r}")
    if algorithm is None:
        raise ValueError(f"fuzzing schedule engines needs the schedule they run: algorithm= one of "
                         f"{', '.join(sched.ALGORITHMS)}")
    schedule = sched.build(setup.topology, algorithm)   # ValueError: unknown algorithm
    if len(schedule.flows) > setup.config.max_flows:
        raise ValueError(f"{setup.topology} {algorithm} has {len(schedule.flows)} flows; the engines hold "
                         f"{setup.config.max_flows}")
    if compression is not None:
        from wirereduce.codec import check_k

        check_k(compression)
        if not setup.config.codec:
            raise ValueError("compression needs engines built with the codec: EngineConfig(codec=True)")
    if "fp32" not in setup.config.formats:
        raise ValueError("the fuzz suite runs fp32 collectives: build the engines with fp32 among their formats")
    if isinstance(cases, int):
        from wirereduce.sim.fuzz.cases import engine_ports

        cases = make_cases(cases, setup.nodes, seed, ports=engine_ports(schedule.topology))
    if not isinstance(timeout_cycles, int) or timeout_cycles < 1000:
        raise ValueError(f"timeout_cycles must be an int ≥ 1000, not {timeout_cycles!r}")
    chunk = chunk_elements(setup.config, compression)
    default_n = 2 * len(schedule.flows) * chunk - chunk // 3
    n = elements if elements is not None else default_n
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"elements must be an int ≥ 1, not {n!r}")
    rng = np.random.default_rng(seed + 7)

    def draw():
        return [(rng.standard_normal(n) * np.float32(2.0) ** rng.integers(-20, 20, n)).astype(np.float32)
                for _ in range(setup.nodes)]

    arrays = {c.index: draw() for c in cases}
    fresh = {c.index: draw() for c in cases}
    build_root = Path(build_root).resolve()
    runner, build_dir = _build(setup, build_root, waves, inject=True)
    run_dir = build_dir / "fuzz"
    run_dir.mkdir(exist_ok=True)
    inputs = run_dir / "inputs.npz"
    records_path = run_dir / "records.json"
    records_path.unlink(missing_ok=True)
    np.savez(inputs, **{f"node{k}_case{i}": a[k] for i, a in arrays.items() for k in range(setup.nodes)},
             **{f"node{k}_fresh{i}": a[k] for i, a in fresh.items() for k in range(setup.nodes)})
    from dataclasses import asdict

    spec_file = run_dir / "fuzz.json"
    lines_per_chunk = -(-(16 + 4 * chunk) // setup.config.bytes_per_beat)
    spec = {
        "nodes": setup.nodes, "config": asdict(setup.config), "clock_mhz": setup.clock,
        "inputs": str(inputs), "records": str(records_path), "cases": [c.as_dict() for c in cases],
        "compression": compression, "timeout_cycles": timeout_cycles,
        "cycles_per_chunk": lines_per_chunk + 16, "start_cycles": 60 * setup.nodes + 200,
    }
    spec.update({"topology": schedule.topology.name, "algorithm": algorithm, "window": setup.config.slots,
                 "collective": 1, "top_inputs": list(setup.top_inputs)})
    spec_file.write_text(json.dumps(spec))
    env = {"WIREREDUCE_FUZZ": str(spec_file), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
           "COCOTB_LOG_LEVEL": "WARNING"}
    results_xml = run_dir / "results.xml"
    results_xml.unlink(missing_ok=True)
    module = "wirereduce.sim.fuzz.cocotb_engine_fuzz"
    try:
        runner.test(test_module=module, hdl_toplevel="wirereduce_net",
                    build_dir=build_dir, test_dir=run_dir, extra_env=env, waves=waves,
                    results_xml=str(results_xml), log_file=run_dir / "sim.log", timescale=("1ps", "1ps"))
    except SystemExit:
        pass
    records = json.loads(records_path.read_text()) if records_path.exists() else []
    if not records and cases:
        log = run_dir / "sim.log"
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log.exists() else ""
        raise SimulationError(f"the fuzz run produced no record; log {log}:\n{tail}")
    verdicts = []
    done = {r["case"]["index"]: r for r in records}
    for c in cases:
        if c.index not in done:
            verdicts.append(Verdict(c, "no record: the simulation stopped", "-", hang=True))
            continue
        verdicts.append(judge(done[c.index], arrays[c.index], fresh[c.index], compression, schedule))
    return verdicts


def format_table(verdicts: list[Verdict]) -> str:
    """``case | injected | outcome`` rows and the ``FUZZ cases=… silent_wrong=… hangs=…`` line."""
    rows = ["case | injected | outcome"]
    for v in verdicts:
        c = v.case
        flags = [name for name in ("hang", "error", "silent_wrong", "uncounted", "fresh_wrong") if getattr(v, name)]
        mark = "ok" if v.ok else "FAIL " + ",".join(flags)
        rows.append(f"{c.index} | {c.kind} → node {c.node} {c.port}{' (bad)' if c.bad else ''} after {c.after} | "
                    f"{v.outcome}; counted {v.counted}; {mark}")
    n = len(verdicts)
    rows.append(f"FUZZ cases={n} silent_wrong={sum(v.silent_wrong for v in verdicts)} "
                f"hangs={sum(v.hang for v in verdicts)} errors={sum(v.error for v in verdicts)} "
                f"uncounted={sum(v.uncounted for v in verdicts)} "
                f"fresh_wrong={sum(v.fresh_wrong for v in verdicts)}")
    return "\n".join(rows)
