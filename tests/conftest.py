"""Puts the block testbenches of ``tests/cocotb/`` on the import path (cocotb loads them by module name),
and builds the simulation models' per-cycle C++ at ``-O0``.

``-O0`` (:func:`wirereduce.sim.engines.verilator.cxx_opt`): the tests' runs are short and the
optimised builds were most of the suite's time (a 4-node Ethernet codec ring: 868 s of C++ at
``-O2``). The build caches are keyed by the level, so ``make bench`` never reuses these models.
"""

import os
import sys
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
