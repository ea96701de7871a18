"""Board platforms and tops: the Xilinx VC709 (10G, SFP+) and one 100G UltraScale+ board.

Every board module in this package follows one contract, so that ``wirereduce bitstream``,
``wirereduce flash`` and ``wirereduce resources`` treat them alike:

``NAME`` : str
    The name used on the command line (``make bitstream BOARD=<NAME>``).
``PART`` : str
    The FPGA part as Vivado spells it, e.g. ``"xc7vx690tffg1761-2"``.
``YOSYS_FAMILY`` : str
    The ``synth_xilinx -family`` of the part (``"xc7"``, ``"xcup"``).
``Platform`` : class
    The :class:`amaranth.vendor.XilinxPlatform` subclass of the board.
``top(**options)`` : function
    Returns the board's top-level elaboratable (a node wired to the board's ports).

:data:`BOARDS` maps each name to its module; :func:`load` imports one.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["BOARDS", "load"]

#: Board name → module of this package that implements the contract above.
BOARDS: dict[str, str] = {
    "vc709": "wirereduce.boards.vc709",
    "u55c": "wirereduce.boards.u55c",
}


def load(name: str) -> ModuleType:
    """Import the module of board ``name``.

    Raises
    ------
    ValueError
        If ``name`` is not one of :data:`BOARDS` (the message lists them).
    """
    if name not in BOARDS:
        raise ValueError(f"unknown board {name!r}; choose one of: {', '.join(sorted(BOARDS))}")
    return importlib.import_module(BOARDS[name])
