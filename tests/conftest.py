"""Puts the block testbenches of ``tests/cocotb/`` on the import path (cocotb loads them by module name),
and builds the simulation models' per-cycle C++ at ``-O0``.

``-O0`` (:func:`wirereduce.sim.engines.verilator.cxx_opt`): the tests' runs are short and the
optimised builds were most of the suite's time (a 4-node Ethernet codec ring: 868 s of C++ at
``-O2``). The build caches are keyed by the level, so ``make bench`` never reuses these models.
"""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

_TB = str(Path(__file__).with_name("cocotb"))
if _TB not in sys.path:
    sys.path.insert(0, _TB)

os.environ.setdefault("WIREREDUCE_CXX_OPT", "-O0")


def shared_tmp(tmp_path_factory, name: str) -> Path:
    """A temporary directory every pytest-xdist worker of this session shares (the session's
    ``pytest-N`` root under xdist, the usual base directory without it), so a model one worker has
    built (locked: FastSim, FastEngineSim) is not built again by the other."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if base.name.startswith("popen-gw") else base
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    return path


ROOT = Path(__file__).resolve().parent.parent

#: Seconds a rank waits for a frame in tests that check results, not timeouts: the served simulators
#: take ~14 s for a 2,500-element compressed collective on an idle machine and more than 20 s next to
#: another xdist worker on 2 cores (CI once failed a rank after 20 s with every chunk still coming).
RECEIVE_TIMEOUT = 120


@contextlib.contextmanager
def sim_serve(args: list[str], *, build_dir: Path | None = None, timeout: float = 900):
    """``wirereduce sim serve ARGS --build-dir build/sim`` in a subprocess, until its ``serving``
    line (a cold Verilator build takes minutes: at most ``timeout`` seconds); yields
    ``(process, lines)``, the lines it printed so far. Stops it with SIGTERM on exit (killed after
    30 s) and fails the test if it ends before serving."""
    import pytest

    build_dir = ROOT / "build" / "sim" if build_dir is None else build_dir
    proc = subprocess.Popen([sys.executable, "-m", "wirereduce.cli", "sim", "serve", *args,
                             "--build-dir", str(build_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        lines = []
        deadline = time.monotonic() + timeout
        while not any(line.startswith("serving") for line in lines):
            line = proc.stdout.readline()
            if not line:
                pytest.fail("sim serve stopped:\n" + "".join(lines))
            lines.append(line)
            assert time.monotonic() < deadline, "sim serve did not come up:\n" + "".join(lines)
        yield proc, lines
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def rank_processes(nodes: int, argv_of, timeout: float = 600) -> None:
    """``wirereduce rank allreduce *argv_of(k)`` in one process per rank k, all at once; fails the test
    (with the rank's output) if a rank does not exit with 0 within ``timeout`` seconds."""
    procs = [subprocess.Popen([sys.executable, "-m", "wirereduce.cli", "rank", "allreduce", *argv_of(k)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(nodes)]
    for k, p in enumerate(procs):
        o, e = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"rank {k}: {o}{e}"


def per_rank(nodes: int, fn, join_timeout: float = 600) -> dict:
    """``fn(k)`` for every rank k in its own thread; returns rank → its return value, or the
    exception it raised (for the caller to report)."""
    out: dict = {}

    def rank(k):
        try:
            out[k] = fn(k)
        except Exception as e:  # reported by the caller
            out[k] = e

    threads = [threading.Thread(target=rank, args=(k,)) for k in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=join_timeout)
    return out


#: Test modules in falling order of their cost (seconds on 2 cores, most of it Verilator builds of
#: the modules' models; ``pytest -n 2 --dist loadfile --durations=80``, 2026-11-26). ``make test``
#: runs ``--dist loadfile --no-loadscope-reorder``: each module goes whole to one xdist worker, so a
#: module's model is built once (not once per worker), and the modules are handed out in this
#: order, the costly ones first (longest-processing-time first), so that the last modules to finish
#: are short ones and neither worker idles long at the end. Modules not listed follow in their
#: usual order. The order never changes which tests run or what they check.
HEAVY_FIRST = (
    "test_engine.py", "test_engine_deploy.py", "test_engine_eth.py", "test_engine_cmac.py",
    "test_torch.py", "test_engine_system.py", "test_engine_serve_eth.py", "test_pause.py", "test_pcie.py",
    "test_engine_256.py", "test_lanes_exhaustive.py", "test_ethport.py", "test_deploy.py", "test_fuzz.py",
    "test_mac.py", "test_latency.py", "test_boards.py",
)


def pytest_collection_modifyitems(session, config, items):
    """Puts the modules of :data:`HEAVY_FIRST` first, in that order; a stable sort, so every
    module's tests stay together and in their own order."""
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@contextlib.contextmanager
def served_engines(tmp_path_factory, name: str, args: list[str], *needles: str):
    """``wirereduce sim serve ARGS --unix DIR`` (schedule engines; a cold Verilator build takes
    minutes), skipped without Verilator; its ``serving`` line must name ``schedule engines`` and every
    one of ``needles``. Yields ``{"socks": DIR, "tmp": a directory for the ranks' files}``; checks that
    the server removed its sockets when stopped."""
    import pytest
    from wirereduce.sim.engines.runner import available_simulators

    if "verilator" not in available_simulators():
        pytest.skip("needs Verilator")
    tmp = tmp_path_factory.mktemp(name)
    socks = tmp / "socks"
    with sim_serve([*args, "--unix", str(socks)]) as (_, lines):
        assert all(n in lines[-1] for n in ("schedule engines", *needles)), lines[-1]
        yield {"socks": socks, "tmp": tmp}
    assert not list(socks.glob("*.sock")) and not list(socks.glob("*.dma"))


def sim_allreduce_checked(tmp_path, capsys, arrays, topology: str, algorithm: str, *extra: str, op: str = "sum"):
    """``wirereduce sim allreduce --topology TOPOLOGY --algorithm ALGORITHM --check EXTRA`` (``--op`` if
    not a sum) on ``arrays`` (one per node), builds in ``build/sim``: exit 0, a ``bit-exact`` line for
    every node, and every node's result equal bit for bit to the golden model in the schedule's order.
    Returns the results, one array per node."""
    import numpy as np
    from wirereduce.sim.golden.schedule import allreduce as golden_allreduce
    from wirereduce.sim.golden.schedule import mismatches

    from wirereduce import schedule as sched
    from wirereduce.cli import main

    np.savez(tmp_path / "in.npz", **{f"node{k}": a for k, a in enumerate(arrays)})
    argv = ["sim", "allreduce", "--topology", topology, "--algorithm", algorithm, *extra,
            *(["--op", op] if op != "sum" else []), "--input", str(tmp_path / "in.npz"),
            "--output", str(tmp_path / "out.npz"), "--check", "--build-dir", str(ROOT / "build" / "sim")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("bit-exact") == len(arrays), out
    got = np.load(tmp_path / "out.npz")
    want = golden_allreduce(arrays, sched.build(topology, algorithm), op)
    results = [got[f"node{k}"] for k in range(len(arrays))]
    for k, r in enumerate(results):
        assert mismatches(r, want[k]).size == 0, f"node {k} differs from the golden {algorithm} allreduce"
    return results
