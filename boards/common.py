"""What the board platforms and tops of :mod:`wirereduce.boards` share: one pattern for every board.

Each board is two modules:

``boards/<board>.py`` — the platform
    ``<Board>Platform(XilinxPlatform)`` written the way amaranth-boards writes platforms
    (``device``/``package``/``speed``, ``default_clk``, ``resources``, ``connectors``,
    ``toolchain_program``), plus the board's fixed Vivado settings (``config_constraints``) and
    the openFPGALoader arguments of its JTAG (``openfpgaloader_args``). It holds board facts only,
    nothing of wirereduce: ``<Board>Platform().build(elaboratable, do_program=True)`` builds and
    loads any design, as with any amaranth-boards platform.
``boards/<board>_top.py`` — the top
    The top-level elaboratable (one schedule engine wired to the board's cages) and the factory
    ``top(**options)``. Whatever the top needs in the build besides its gateware it adds during
    ``elaborate`` with ``platform.add_file``: an ``<board>_top.xdc`` of timing constraints on its
    own clocks (Vivado reads every ``.xdc`` extra file after the platform's), and the Tcl of the
    Vivado IPs it instantiates (``.tcl`` extra files, sourced before synthesis; the U55C's
    CMACs, :mod:`wirereduce.boards.cmac_ip`). The VC709's Si5324 needs nothing there: it is
    programmed by gateware inside the top (:mod:`wirereduce.boards.si5324`).

The functions here are the platform and top halves of that pattern: :func:`vivado_overrides`
(each platform's ``toolchain_prepare``), :func:`openfpgaloader_program` (each platform's
``toolchain_program``) and :func:`check_options` (each ``top``).
"""

from __future__ import annotations

import os
import subprocess

__all__ = ["vivado_overrides", "openfpgaloader_command", "openfpgaloader_program", "check_options"]


def vivado_overrides(platform, kwargs: dict) -> dict:
    """The Vivado template overrides of a board build: ``kwargs`` (the ``build`` overrides) with

    - ``add_constraints``: ``platform.config_constraints`` in front of the caller's;
    - ``script_after_read``: ``source <file>`` for each ``.tcl`` extra file of ``platform``
      (the tops' IP generation), in the order they were added, in front of the caller's.
    """
    kwargs = dict(kwargs)
    constraints = platform.config_constraints
    if kwargs.get("add_constraints"):
        constraints += "\n" + kwargs["add_constraints"]
    kwargs["add_constraints"] = constraints
    sources = "".join(f"source {name}\n" for name in platform.iter_files(".tcl"))
    if sources:
        kwargs["script_after_read"] = sources + kwargs.get("script_after_read", "")
    return kwargs


def openfpgaloader_command(args, bitstream, tool: str | None = None) -> list[str]:
    """The openFPGALoader command line that loads ``bitstream`` into the FPGA's SRAM.

    ``args`` select the cable and part (a platform's ``openfpgaloader_args``); ``tool`` is the
    program to run (default: ``$OPENFPGALOADER``, else ``openFPGALoader``, as amaranth-boards does).
    """
    tool = tool or os.environ.get("OPENFPGALOADER", "openFPGALoader")
    return [tool, *args, str(bitstream)]


def openfpgaloader_program(platform, products, name: str) -> None:
    """``toolchain_program`` of a board platform: load ``<name>.bit`` of ``products`` over JTAG.

    Raises
    ------
    subprocess.CalledProcessError
        openFPGALoader failed (no cable, board off, no permission on the USB device).
    """
    with products.extract(f"{name}.bit") as bitstream:
        subprocess.check_call(openfpgaloader_command(platform.openfpgaloader_args, bitstream))


def check_options(board: str, options: dict, known) -> None:
    """Reject options a board's ``top`` does not take.

    Raises
    ------
    TypeError
        On an unknown option (the message lists the known ones).
    """
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"board {board!r} does not take option(s) {', '.join(unknown)}; "
                        f"it takes: {', '.join(sorted(known))}")
