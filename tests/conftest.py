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


#: Modules whose module-scoped fixture builds a simulation model (a Verilator build of 1-5 minutes).
#: Under ``pytest -n 2 --dist loadgroup`` (``make test``) each runs on one xdist worker, so the
#: model is built once instead of once per worker that draws one of its tests, and a worker never
#: sits waiting on the other's build lock (``shared_tmp``).
ONE_WORKER_MODULES = frozenset({
    "test_cmacring", "test_codecring", "test_deploy", "test_engine_system", "test_ethcodec", "test_ethring",
    "test_fastsim", "test_i2c", "test_mac", "test_pcie", "test_boards", "test_gth",
})


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        name = item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else ""
        if name in ONE_WORKER_MODULES:
            item.add_marker(pytest.mark.xdist_group(name))
