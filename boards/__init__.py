"""Boards: the Xilinx VC709 (10G, SFP+) and the Alveo U55C (100G, QSFP28).

Every board follows one pattern (:mod:`wirereduce.boards.common`): a platform module
``<board>.py`` with an amaranth-boards style ``<Board>Platform`` class, and a top module
``<board>_top.py`` with the top-level elaboratable and its factory ``top(**options)``.
:data:`BOARDS` lists them so that ``wirereduce bitstream``, ``wirereduce flash`` and
``wirereduce resources`` treat all boards alike; :func:`load` returns one as a :class:`Board`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["BOARDS", "Board", "load"]


@dataclass(frozen=True)
class Board:
    """One board of :data:`BOARDS`, imported.

    Attributes
    ----------
    name : str
        The name used on the command line (``make bitstream BOARD=<name>``).
    platform : type
        The board's :class:`amaranth.vendor.XilinxPlatform` subclass.
    top : callable
        ``top(**options)``: the board's top-level elaboratable (a schedule engine wired to the board's ports).
    yosys_family : str
        The ``synth_xilinx -family`` of the part (``"xc7"``, ``"xcup"``).
    """

    name: str
    platform: type
    top: Callable
    yosys_family: str

    @property
    def part(self) -> str:
        """The FPGA part as Vivado spells it, e.g. ``"xc7vx690tffg1761-2"``."""
        return self.platform()._part


#: Board name → (platform class, top factory, Yosys family); classes and factories as
#: ``"module:attribute"`` of this package, imported by :func:`load`.
BOARDS: dict[str, tuple[str, str, str]] = {
    "vc709": ("wirereduce.boards.vc709:VC709Platform", "wirereduce.boards.vc709_top:top", "xc7"),
    "u55c": ("wirereduce.boards.u55c:U55CPlatform", "wirereduce.boards.u55c_top:top", "xcup"),
}


def _import(target: str):
    module, attribute = target.split(":")
    return getattr(importlib.import_module(module), attribute)


def load(name: str) -> Board:
    """Import board ``name``.

    Raises
    ------
    ValueError
        If ``name`` is not one of :data:`BOARDS` (the message lists them).
    """
    if name not in BOARDS:
        raise ValueError(f"unknown board {name!r}; choose one of: {', '.join(sorted(BOARDS))}")
    platform, top, family = BOARDS[name]
    return Board(name, _import(platform), _import(top), family)
