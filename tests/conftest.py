"""Puts the block testbenches of ``tests/cocotb/`` on the import path (cocotb loads them by module name)."""

import sys
from pathlib import Path

_TB = str(Path(__file__).with_name("cocotb"))
if _TB not in sys.path:
    sys.path.insert(0, _TB)
