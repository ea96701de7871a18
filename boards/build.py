"""``wirereduce bitstream`` and ``wirereduce flash``: build trees and programming for any board of
:mod:`wirereduce.boards`.

``bitstream`` elaborates the board's top on its platform and writes the Amaranth/Vivado build tree
(``<name>.v``, ``<name>.xdc``, ``<name>.tcl``, ``build_<name>.sh`` and the extra files the top adds,
:mod:`wirereduce.boards.common`) under ``build/<board>/``; it runs
Vivado on it only when ``vivado`` is on PATH. Without Vivado the tree is the deliverable: copy it to a
machine with Vivado and run ``sh build_<name>.sh`` there (exit status 0 either way, unless Vivado
itself fails).

``flash`` loads a bitstream into the FPGA's configuration SRAM over JTAG, with openFPGALoader
(preferred, with the platform's ``openfpgaloader_args``, as its ``toolchain_program`` does;
``-c digilent --fpga-part xc7vx690tffg1761`` on the VC709, docs/boards.md "JTAG") or else Vivado's
hardware manager (a TCL script written next to the bitstream). When no tool or no bitstream is
there, or the tool fails (no cable, board off), it says what is missing and exits non-zero.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from wirereduce.boards.common import openfpgaloader_command

__all__ = ["design_name", "write_tree", "cmd_bitstream", "cmd_flash", "flash_command", "vivado_flash_tcl",
           "add_subcommands", "FlashError"]


class FlashError(Exception):
    """``flash`` cannot proceed: a tool, the bitstream or the cable is missing (exit status 1)."""


def design_name(board: str) -> str:
    """Name of the design and its files for ``board`` (e.g. ``wirereduce_vc709``)."""
    return f"wirereduce_{board}"


def _load(board: str):
    from wirereduce.boards import load

    return load(board)


def write_tree(board: str, out: str | Path, **top_options) -> tuple[Path, object]:
    """Elaborate ``board``'s top with ``top_options`` and write its Vivado build tree into ``out``.

    Returns the directory and the Amaranth ``BuildPlan`` (``plan.execute_local(out)`` runs Vivado).

    Raises
    ------
    ValueError
        Unknown board (:func:`wirereduce.boards.load`) or bad top options (e.g. MTU).
    """
    spec = _load(board)
    top = spec.top(**top_options)
    out = Path(out)
    name = design_name(board)
    plan = spec.platform().build(top, name=name, build_dir=str(out), do_build=False)
    plan.extract(str(out))
    return out, plan


def _engine_width(args) -> int:
    """The PCIe top's engine width the build used: ``--width`` or the top's default."""
    from wirereduce.boards.vc709_engine_top import WIDTH

    return args.width or WIDTH


def cmd_bitstream(args) -> int:
    """``wirereduce bitstream``: write the build tree; run Vivado when it is on PATH."""
    from wirereduce.errors import CliError

    out = Path(args.out or f"build/{args.board}")
    options = {} if args.mtu is None else {"mtu": args.mtu}
    if args.host is not None:
        options["host"] = args.host
    if args.width is not None:
        options["width"] = args.width
    try:
        tree, plan = write_tree(args.board, out, **options)
    except (TypeError, ValueError) as e:
        raise CliError(str(e)) from e
    name = design_name(args.board)
    files = sorted(p.name for p in tree.iterdir() if p.is_file())
    mtu = "board default" if args.mtu is None else args.mtu
    host = "" if args.host is None else f", host link {args.host}"
    host += f", engine {_engine_width(args)} bit" if args.host == "pcie" else ""
    print(f"wrote the Vivado build tree for {args.board} (MTU {mtu}{host}) to {tree}/: {', '.join(files)}")
    if shutil.which("vivado") is None:
        print(f"vivado is not on PATH: stopped after writing the build tree (no bitstream). To make "
              f"{tree}/{name}.bit, run `sh build_{name}.sh` in {tree} on a machine with Vivado (or put "
              f"vivado on PATH and run this again).")
        return 0
    print(f"running Vivado in {tree} (log: {tree}/{name}.log); this takes a while")
    try:
        plan.execute_local(str(tree))
    except subprocess.CalledProcessError as e:
        print(f"wirereduce: Vivado failed (exit {e.returncode}); see {tree}/{name}.log", file=sys.stderr)
        return 1
    print(f"bitstream: {tree}/{name}.bit")
    return 0


def flash_command(board: str, bitstream: Path) -> list[str]:
    """openFPGALoader command line that loads ``bitstream`` into ``board``'s FPGA (SRAM): the
    platform's ``openfpgaloader_args``, the same its ``toolchain_program`` uses."""
    return openfpgaloader_command(_load(board).platform.openfpgaloader_args, bitstream, tool="openFPGALoader")


def vivado_flash_tcl(bitstream: Path) -> str:
    """Vivado hardware-manager TCL that programs the first device of the first JTAG target."""
    bit = str(Path(bitstream).resolve()).replace("\\", "/")
    return "\n".join([
        "open_hw_manager",
        "connect_hw_server",
        "if {[llength [get_hw_targets]] == 0} { puts \"ERROR: no JTAG target (cable) found\"; exit 2 }",
        "open_hw_target [lindex [get_hw_targets] 0]",
        "set dev [lindex [get_hw_devices] 0]",
        "current_hw_device $dev",
        f"set_property PROGRAM.FILE {{{bit}}} $dev",
        "program_hw_devices $dev",
        "close_hw_target",
        "exit 0",
        "",
    ])


def cmd_flash(args) -> int:
    """``wirereduce flash``: program the board; exit 1 with a message when something is missing."""
    from wirereduce.errors import CliError

    try:
        _load(args.board)
    except ValueError as e:
        raise CliError(str(e)) from e
    name = design_name(args.board)
    bit = Path(args.bitstream) if args.bitstream else Path(f"build/{args.board}/{name}.bit")
    loader = shutil.which("openFPGALoader")
    vivado = shutil.which("vivado")
    missing = []
    if not bit.is_file():
        missing.append(f"no bitstream at {bit} (make one with `make bitstream BOARD={args.board}` on a machine "
                       f"with Vivado, or pass --bitstream PATH)")
    if loader is None and vivado is None:
        missing.append("neither openFPGALoader nor vivado is on PATH (install openFPGALoader, e.g. "
                       "`apt-get install openfpgaloader`, or Vivado's Lab Tools)")
    if missing:
        print(f"wirereduce: cannot flash {args.board}: " + "; ".join(missing), file=sys.stderr)
        return 1
    if loader is not None:
        cmd = flash_command(args.board, bit)
        cmd[0] = loader
        print("running: " + " ".join(cmd))
        rc = subprocess.run(cmd).returncode
        tool = "openFPGALoader"
    else:
        tcl = bit.parent / f"flash_{name}.tcl"
        tcl.write_text(vivado_flash_tcl(bit))
        cmd = [vivado, "-mode", "batch", "-nojournal", "-nolog", "-source", str(tcl)]
        print("running: " + " ".join(cmd))
        rc = subprocess.run(cmd).returncode
        tool = "Vivado hardware manager"
    if rc != 0:
        print(f"wirereduce: {tool} failed (exit {rc}): is the board powered and its USB-JTAG cable "
              f"connected (and the udev rules / permissions for it in place)?", file=sys.stderr)
        return 1
    print(f"loaded {bit} into the {args.board} (SRAM: lost at power-off)")
    return 0


def add_subcommands(sub) -> None:
    """Register ``bitstream`` and ``flash`` on the ``wirereduce`` sub-parser ``sub``."""
    from wirereduce.boards import BOARDS

    p = sub.add_parser(
        "bitstream", help="write the Vivado build tree of a board (and run Vivado when it is on PATH)",
        description="Elaborates the board top (one schedule engine, its Ethernet ports on the board's cages) "
                    "and writes Verilog, XDC, TCL and build script under --out. Runs Vivado only when `vivado` "
                    "is on PATH; otherwise stops after writing the tree (exit 0).")
    p.add_argument("--board", default="vc709", choices=sorted(BOARDS), help="board (default: vc709)")
    p.add_argument("--out", default=None, help="build directory (default: build/<board>)")
    p.add_argument("--mtu", type=int, default=None,
                   help="largest frame in bytes (default: the board's, 1500 on the vc709; 9000 for jumbo)")
    p.add_argument("--host", default=None, choices=("sfp", "pcie"),
                   help="host link (vc709 only): sfp (default; the schedule engine with 2 ring ports on cages "
                        "1-2, host on SFP+ cage 0) or pcie (the schedule engine with 4 network ports on cages 0-3, "
                        "host over PCIe Gen3 x8 with XDMA)")
    p.add_argument("--width", type=int, default=None, choices=(64, 128, 256, 512),
                   help="engine datapath width in bits: with --host pcie 256 (default: a 40 Gbit/s host port at "
                        "156.25 MHz, the cages' 64-bit ports converted at the engine's edge), 128 or 64 (the host "
                        "capped at a cage's 10 Gbit/s); the u55c takes 512 only; the vc709 SFP top is 64 bit")
    p.set_defaults(func=cmd_bitstream)

    p = sub.add_parser(
        "flash", help="load a bitstream into a board over JTAG (openFPGALoader or Vivado)",
        description="Loads the bitstream into the FPGA's configuration SRAM with openFPGALoader, or Vivado's "
                    "hardware manager when openFPGALoader is missing. Exits 1 and says what is missing when no "
                    "tool, no bitstream or no cable is there.")
    p.add_argument("--board", default="vc709", choices=sorted(BOARDS), help="board (default: vc709)")
    p.add_argument("--bitstream", default=None, help="the .bit file (default: build/<board>/wirereduce_<board>.bit)")
    p.set_defaults(func=cmd_flash)
