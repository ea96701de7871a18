"""The layering of ``docs/architecture.md``, held by import-linter contracts (``[tool.importlinter]``
in ``pyproject.toml``).

The folders ``hdl/``, ``sim/``, ``host/`` and ``boards/`` are mapped into the ``wirereduce``
namespace by setuptools' ``package-dir``, which import-linter's scanner cannot follow, so the test
copies the sources into one ``wirereduce/`` tree in a temporary folder and lints that.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"wirereduce": "", "hdl": "hdl", "sim": "sim", "host": "host", "boards": "boards"}


def _mirror(dst: Path) -> Path:
    """Copy the package's sources into ``dst/wirereduce`` as one tree; returns ``dst``."""
    pkg = dst / "wirereduce"
    for folder, sub in FOLDERS.items():
        shutil.copytree(ROOT / folder, pkg / sub, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")
    return dst


def _lint(tree: Path) -> subprocess.CompletedProcess:
    cli = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", cli, "--config", "pyproject.toml", "--no-cache"], cwd=tree, text=True,
                          capture_output=True, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, timeout=300)


def test_layer_contracts_hold(tmp_path):
    result = _lint(_mirror(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout


@pytest.mark.parametrize("module, forbidden", [
    ("host/driver.py", "wirereduce.sim.golden.allreduce"),
    ("hdl/core/engine.py", "wirereduce.hdl.eth.mac"),
    ("hdl/stream/frame.py", "wirereduce.host.driver"),
    ("wirereduce/protocol.py", "wirereduce.hdl.stream.frame"),
])
def test_a_forbidden_import_is_caught(tmp_path, module, forbidden):
    """The contracts can fail: one import across a layer boundary breaks them."""
    tree = _mirror(tmp_path)
    target = tree / "wirereduce" / module.removeprefix("wirereduce/")
    target.write_text(target.read_text() + f"\nimport {forbidden}  # noqa\n")
    result = _lint(tree)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout.upper()
