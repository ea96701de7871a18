"""VC709 platform, board top, ``make bitstream`` / ``wirereduce bitstream`` and ``flash`` (no Vivado needed).

The pin table is re-typed from docs/boards.md "VC709" here, not imported from ``boards/vc709.py``.
The registry (``wirereduce.boards.load``) and the shared board pattern are tested here too.
One board build (``make bitstream`` into a temporary directory, about 45 s) is shared by the tests of
the generated tree.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from amaranth import Elaboratable, Instance, Module
from amaranth.build import ResourceError
from amaranth.build.run import LocalBuildProducts
from amaranth.lib.io import DifferentialPort, SingleEndedPort
from amaranth.vendor import XilinxPlatform
from amaranth_boards.test.blinky import Blinky
from wirereduce.boards import BOARDS, load
from wirereduce.boards import build as board_build
from wirereduce.boards import common as board_common
from wirereduce.boards.vc709 import VC709Platform

from wirereduce import cli

ROOT = Path(__file__).resolve().parents[1]

# --- docs/boards.md "VC709", re-typed: pin → IOSTANDARD (None: dedicated GT pin, no I/O standard) ---
SYS_CLK = {"H19": "DIFF_SSTL15_DCI", "G18": "DIFF_SSTL15_DCI"}
SFP_TABLE = [  # cage, TX p/n, RX p/n, tx_disable, los, mod_detect, tx_fault
    (0, "AN2", "AN1", "AM8", "AM7", "Y42", "AA40", "AA42", "AA39"),
    (1, "AP4", "AP3", "AN6", "AN5", "AB41", "Y39", "AB42", "Y38"),
    (2, "AM4", "AM3", "AL6", "AL5", "AC38", "AD38", "AC39", "AA41"),
    (3, "AL2", "AL1", "AJ6", "AJ5", "AC40", "AD40", "AC41", "AE38"),
]
SFP = {}
for _cage, *_pins in SFP_TABLE:
    SFP.update({p: None for p in _pins[:4]})
    SFP.update({p: "LVCMOS18" for p in _pins[4:]})
REFCLKS = {"AH8": None, "AH7": None, "AK8": None, "AK7": None}
I2C_SI5324 = {"AT35": "LVCMOS18", "AU32": "LVCMOS18", "AY42": "LVCMOS18", "AT36": "LVCMOS18"}
LEDS = {p: "LVCMOS18" for p in "AM39 AN39 AR37 AT37 AR35 AP41 AP42 AU39".split()}
BUTTONS = {p: "LVCMOS18" for p in "AV40 AR40 AW40 AP40 AU38 AV39".split()}
UART = {"AU36": "LVCMOS18", "AU33": "LVCMOS18"}
PCIE = {"AB8": None, "AB7": None, "AV35": "LVCMOS18"}
TOP_PINS = {**SYS_CLK, **SFP, **REFCLKS, **I2C_SI5324, **LEDS, **BUTTONS, **UART}
ALL_PINS = {**TOP_PINS, **PCIE}

GT_USRCLK_NS = 1e9 / (10.3125e9 / 32)   # 3.103 ns


def parse_xdc(text: str):
    """(pin → IOSTANDARD or None, clock name → (period ns, target)) from an Amaranth XDC."""
    port_pin = dict((port, pin) for pin, port in
                    re.findall(r'set_property LOC (\S+) \[get_ports "([^"]+)"\]', text))
    port_std = dict((port, value) for value, port in
                    re.findall(r'set_property IOSTANDARD "?([A-Z0-9_]+)"? \[get_ports "([^"]+)"\]', text))
    pins = {pin: port_std.get(port) for port, pin in port_pin.items()}
    clocks = {name: (float(period), target) for name, period, target in
              re.findall(r"create_clock -name (\S+) -period (\S+) \[get_nets \"([^\"]+)\"\]", text)}
    return pins, clocks


def check_pins(xdc_pins, expected):
    missing = sorted(set(expected) - set(xdc_pins))
    assert not missing, f"pins not placed: {missing}"
    wrong = {p: (xdc_pins[p], want) for p, want in expected.items() if xdc_pins[p] != want}
    assert not wrong, f"IOSTANDARD (got, want): {wrong}"


# --- the board contract and the platform alone ------------------------------------------------------

def test_board_registry():
    board = load("vc709")
    assert board.name == "vc709"
    assert board.platform is VC709Platform
    assert board.part == "xc7vx690tffg1761-2"
    assert board.yosys_family == "xc7"
    with pytest.raises(ValueError, match="mtu"):
        board.top(mtu=10)
    with pytest.raises(ValueError, match="refclk"):
        board.top(refclk="pll")
    with pytest.raises(TypeError, match="does not take option.*it takes: host, mtu, refclk, slots, width"):
        board.top(lanes=4)
    with pytest.raises(ValueError, match="width is the PCIe top's engine width"):
        board.top(width=64)
    with pytest.raises(ValueError, match="unknown board 'kc705'; choose one of: u55c, vc709"):
        load("kc705")


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_board_follows_one_pattern(name):
    """Platform module ``<board>.py`` with ``<BOARD>Platform``, top module ``<board>_top.py`` with ``top``."""
    board = load(name)
    assert issubclass(board.platform, XilinxPlatform)
    assert board.platform.__module__ == f"wirereduce.boards.{name}"
    assert board.platform.__name__ == f"{name.upper()}Platform"
    assert board.top.__module__ == f"wirereduce.boards.{name}_top"
    for attr in ("device", "package", "speed", "default_clk", "resources", "connectors",
                 "config_constraints", "openfpgaloader_args"):
        assert attr in vars(board.platform), attr
    assert "toolchain_program" in vars(board.platform) and "toolchain_prepare" in vars(board.platform)
    with pytest.raises(TypeError, match="does not take option"):
        board.top(nosuchoption=1)


def test_hdl_does_not_import_boards():
    hdl = ROOT / "hdl"
    offenders = [str(p.relative_to(ROOT)) for p in hdl.rglob("*.py")
                 if re.search(r"^\s*(from|import)\s+wirereduce\.boards", p.read_text(), re.M)]
    assert offenders == []


# --- VC709Platform as an amaranth-boards platform ------------------------------------------------------

def test_vc709_platform_is_amaranth_boards_style():
    p = VC709Platform()
    assert (p.device, p.package, p.speed) == ("xc7vx690t", "ffg1761", "2")
    assert p._part == "xc7vx690tffg1761-2"
    assert p.default_clk == "clk200" and p.default_clk_frequency == 200e6
    assert p.default_rst == "rst"
    # amaranth-boards resource names and numbering
    for name, count in (("led", 8), ("button", 5), ("sfp", 4), ("uart", 1), ("i2c", 1), ("rst", 1)):
        for k in range(count):
            p.lookup(name, k)
        with pytest.raises(ResourceError):
            p.lookup(name, count)


def test_vc709_every_resource_is_requestable():
    p = VC709Platform()
    for res in list(p.resources.values()):
        p.request(res.name, res.number, dir="-")


# Pin → (IOSTANDARD, other attributes) of the platform's LVCMOS18 pins, re-typed from the board XDC
# (docs/boards.md pins; SLEW/DRIVE/PULLUP from verilog-ethernet's VC709 fpga.xdc, as boards/vc709.py says).
_OUT12 = {"SLEW": "SLOW", "DRIVE": "12"}
_OUT8 = {"SLEW": "SLOW", "DRIVE": "8"}
_PU = {"PULLUP": "TRUE"}
ATTRS = {
    **{p: _OUT12 for p in "AM39 AN39 AR37 AT37 AR35 AP41 AP42 AU39".split()},       # LEDs
    **{p: {} for p in "AV40 AR40 AW40 AP40 AU38 AV39".split()},                      # buttons
    "AU36": _OUT8, "AU33": {},                                                        # UART tx, rx
    "AT35": _OUT8, "AU32": _OUT8, "AY42": _OUT8, "AT36": _OUT12, "AU34": _PU,         # I2C, Si5324
    **{row[5]: _OUT12 for row in SFP_TABLE},                                          # tx_disable
    **{p: _PU for row in SFP_TABLE for p in row[6:]},                                 # los, mod_detect, tx_fault
    "AV35": _PU,                                                                      # PERST#
}


def test_vc709_blinky_builds_with_amaranth_boards_test_design():
    """amaranth-boards' own Blinky (every ``led``, every ``button``, default clock and reset)."""
    plan = VC709Platform().build(Blinky(), name="blinky", do_build=False)
    pins, clocks = parse_xdc(plan.files["blinky.xdc"])
    leds = "AM39 AN39 AR37 AT37 AR35 AP41 AP42 AU39".split()
    check_pins(pins, {**SYS_CLK, **{p: "LVCMOS18" for p in leds + "AV40 AR40 AW40 AP40 AU38 AV39".split()}})
    assert clocks["clk200_0__p"][0] == pytest.approx(5.0)
    assert "set_property CFGBVS GND [current_design]" in plan.files["blinky.xdc"]
    assert "source " not in plan.files["blinky.tcl"]      # no IP Tcl in a design that adds none


def test_vc709_extra_files_are_read(tmp_path):
    """A top's ``.xdc`` extra files are read after the platform's, its ``.tcl`` ones sourced before synthesis."""

    class WithFiles(Blinky):
        def elaborate(self, platform):
            platform.add_file("a.tcl", "puts a\n")
            platform.add_file("extra.xdc", "# extra\n")
            platform.add_file("b.tcl", "puts b\n")
            return super().elaborate(platform)

    plan = VC709Platform().build(WithFiles(), name="t", do_build=False, script_after_read="puts user")
    tcl = plan.files["t.tcl"]
    assert plan.files["a.tcl"] == "puts a\n" and plan.files["extra.xdc"] == "# extra\n"
    assert tcl.index('read_xdc t.xdc') < tcl.index('read_xdc "extra.xdc"') < tcl.index("source a.tcl")
    assert tcl.index("source a.tcl") < tcl.index("source b.tcl") < tcl.index("puts user") < tcl.index("synth_design")


def _fake_products(tmp_path, name):
    (tmp_path / f"{name}.bit").write_bytes(b"\xff" * 32)
    return LocalBuildProducts(str(tmp_path))


def test_vc709_toolchain_program_runs_openfpgaloader(monkeypatch, tmp_path):
    calls = []

    def check_call(cmd, *args, **kwargs):
        calls.append(cmd)
        assert Path(cmd[-1]).read_bytes() == b"\xff" * 32     # the extracted bitstream exists while it runs
        return 0

    monkeypatch.delenv("OPENFPGALOADER", raising=False)
    monkeypatch.setattr(board_common.subprocess, "check_call", check_call)
    VC709Platform().toolchain_program(_fake_products(tmp_path, "top"), "top")
    assert len(calls) == 1
    # docs/boards.md "JTAG": cable digilent, part xc7vx690tffg1761; no -f/--write-flash: SRAM load
    assert calls[0][:-1] == ["openFPGALoader", "-c", "digilent", "--fpga-part", "xc7vx690tffg1761"]
    assert calls[0][-1].endswith(".bit")

    calls.clear()
    monkeypatch.setenv("OPENFPGALOADER", "/opt/ofl/bin/openFPGALoader")
    VC709Platform().toolchain_program(_fake_products(tmp_path, "x"), "x")
    assert calls[0][0] == "/opt/ofl/bin/openFPGALoader"


def test_vc709_build_do_program_programs_what_it_built(monkeypatch, tmp_path):
    """``build(top, do_program=True)``: build (Vivado faked), then toolchain_program on the products."""
    programmed = []

    def execute_local(plan, root="build", **kwargs):
        assert "blinky.tcl" in plan.files
        return _fake_products(tmp_path, "blinky")

    monkeypatch.setenv("AMARANTH_ENV_VIVADO", "/dev/null")      # skip the up-front check for vivado
    monkeypatch.setattr("amaranth.build.run.BuildPlan.execute_local", execute_local)
    monkeypatch.setattr(board_common.subprocess, "check_call", lambda cmd, **kw: programmed.append(cmd))
    VC709Platform().build(Blinky(), name="blinky", build_dir=str(tmp_path), do_program=True)
    assert [c[:-1] for c in programmed] == [["openFPGALoader", "-c", "digilent", "--fpga-part", "xc7vx690tffg1761"]]


class _EveryResource(Elaboratable):
    """Requests every resource raw and hangs all its pins on one black box, so all get placed."""

    def elaborate(self, platform):
        m = Module()
        ports = {}

        def collect(prefix, obj):
            if isinstance(obj, DifferentialPort):
                ports[f"io_{prefix}_p"], ports[f"io_{prefix}_n"] = obj.p, obj.n
            elif isinstance(obj, SingleEndedPort):
                ports[f"io_{prefix}"] = obj.io
            else:                                        # a PortGroup of subsignals
                for name, sub in vars(obj).items():
                    if not name.startswith("_"):
                        collect(f"{prefix}_{name}", sub)

        for res in platform.resources.values():
            collect(f"{res.name}{res.number}", platform.request(res.name, res.number, dir="-"))
        m.submodules.pins = Instance("PINS", **ports)
        return m


@pytest.fixture(scope="module")
def platform_tree():
    plan = VC709Platform().build(_EveryResource(), name="pins", do_build=False)
    return plan.files


def test_platform_places_every_spec_pin(platform_tree):
    pins, clocks = parse_xdc(platform_tree["pins.xdc"])
    check_pins(pins, ALL_PINS)
    # the LVCMOS18 pins carry exactly their SLEW/DRIVE/PULLUP
    text = platform_tree["pins.xdc"]
    port_pin = {port: pin for pin, port in re.findall(r'set_property LOC (\S+) \[get_ports "([^"]+)"\]', text)}
    attrs = {}
    for name, value, port in re.findall(r'set_property (SLEW|DRIVE|PULLUP) "?(\w+)"? \[get_ports "([^"]+)"\]', text):
        attrs.setdefault(port_pin[port], {})[name] = value
    assert {pin: attrs.get(pin, {}) for pin in ATTRS} == ATTRS
    assert set(attrs) <= set(ATTRS)
    # every clock input is constrained at its frequency
    periods = {name: p for name, (p, _) in clocks.items()}
    assert periods["clk200_0__p"] == pytest.approx(1e9 / 200e6)
    assert periods["sfp_refclk_0__p"] == pytest.approx(1e9 / 156.25e6)
    assert periods["sma_refclk_0__p"] == pytest.approx(1e9 / 156.25e6)
    assert periods["pcie_refclk_0__p"] == pytest.approx(1e9 / 100e6)
    text = platform_tree["pins.xdc"]
    assert "set_property CFGBVS GND [current_design]" in text
    assert "set_property CONFIG_VOLTAGE 1.8 [current_design]" in text
    assert "-part xc7vx690tffg1761-2" in platform_tree["pins.tcl"]


# --- the board top: one build through `make bitstream` without Vivado --------------------------------

def _path_without_vivado():
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not (Path(d) / "vivado").exists())


@pytest.fixture(scope="module")
def make_tree(tmp_path_factory):
    if shutil.which("vivado", path=_path_without_vivado()) is not None:  # pragma: no cover
        pytest.skip("vivado is reachable; this test is about the tree-only path")
    out = tmp_path_factory.mktemp("vc709")
    env = {**os.environ, "PATH": _path_without_vivado()}
    # -o: treat the venv stamp as up to date (never reinstall from inside a test)
    r = subprocess.run(["make", "-o", ".venv/.installed", "bitstream", "BOARD=vc709", f"OUT={out}"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return out, r


def test_make_bitstream_without_vivado_writes_tree(make_tree):
    out, r = make_tree
    assert r.returncode == 0, r.stderr[-3000:]
    assert "vivado is not on PATH" in r.stdout
    assert "stopped after writing the build tree" in r.stdout
    for f in ("wirereduce_vc709.v", "wirereduce_vc709.xdc", "wirereduce_vc709.tcl", "build_wirereduce_vc709.sh",
              "vc709_top.xdc"):
        assert (out / f).is_file(), f
    assert not (out / "wirereduce_vc709.bit").exists()


def test_top_xdc_pins_and_clocks(make_tree):
    out, _ = make_tree
    text = (out / "wirereduce_vc709.xdc").read_text()
    pins, clocks = parse_xdc(text)
    check_pins(pins, TOP_PINS)
    periods = {name: p for name, (p, _) in clocks.items()}
    assert periods["clk200_0__p"] == pytest.approx(5.0)
    assert periods["sfp_refclk_0__p"] == pytest.approx(6.4)
    assert periods["sma_refclk_0__p"] == pytest.approx(6.4)
    for n in range(4):
        for d in ("tx", "rx"):
            assert periods[f"gt{n}_{d}outclk"] == pytest.approx(GT_USRCLK_NS), (n, d)
    # every clock input port of the design has a create_clock
    constrained = {t for _, t in clocks.values()}
    for port in ("clk200_0__p", "sfp_refclk_0__p", "sma_refclk_0__p"):
        assert port in constrained
    assert "set_property CONFIG_VOLTAGE 1.8 [current_design]" in text
    # the top's clock groups come in its own XDC, read after the platform's
    top_xdc = (out / "vc709_top.xdc").read_text()
    assert "set_clock_groups -asynchronous" in top_xdc and "clk200_0__p" in top_xdc
    assert "core_clk_mmcm" in top_xdc and "gt3_rxoutclk" in top_xdc


def test_top_tcl_and_verilog(make_tree):
    out, _ = make_tree
    tcl = (out / "wirereduce_vc709.tcl").read_text()
    assert re.search(r"create_project .* -part xc7vx690tffg1761-2\b", tcl)
    assert "synth_design -top wirereduce_vc709" in tcl
    assert (tcl.index("read_xdc wirereduce_vc709.xdc") < tcl.index('read_xdc "vc709_top.xdc"')
            < tcl.index("synth_design"))
    v = (out / "wirereduce_vc709.v").read_text()
    assert len(re.findall(r"^\s*GTHE2_COMMON #\(", v, re.M)) == 1
    channels = re.findall(r"^\s*GTHE2_CHANNEL #\(.*?\n  \);", v, re.M | re.S)
    assert len(channels) == 4
    # cage 3 reserved: its channel is powered down, the others run
    assert sum(".TXPD(2'h3)" in c for c in channels) == 1
    assert sum(".TXPD(2'h0)" in c for c in channels) == 3
    assert "sfp_3__tx__p" in next(c for c in channels if ".TXPD(2'h3)" in c)
    assert re.search(r"MMCME2_BASE #\(.*?\.CLKFBOUT_MULT_F\(25\.0\).*?\.DIVCLK_DIVIDE\(32'd4\)", v, re.S)
    assert 200e6 * 25 / 4 / 8 == 156.25e6



def test_sfp_top_carries_the_schedule_engine_with_two_ring_ports(make_tree):
    """The SFP-host VC709 top is the schedule engine with P = 2 (no ring-only node): ports net0, net1
    behind cages 1 and 2, the host port behind cage 0, one Ethernet port each."""
    out, _ = make_tree
    v = (out / "wirereduce_vc709.v").read_text()
    engine = re.search(r"^module \\wirereduce_vc709\.engine \((.*?)\);", v, re.M | re.S)
    assert engine, "no engine module in the VC709 top"
    ports = engine.group(1)
    for name in ("net0_in__ready", "net1_in__ready", "net0_out__valid", "net1_out__valid", "host_tx__valid"):
        assert name in ports, name
    assert "net2_" not in ports
    assert not re.search(r"^module \\wirereduce_vc709\.node\b", v, re.M)
    for n in range(3):
        assert re.search(rf"^module \\wirereduce_vc709\.eth{n} ", v, re.M), n
    assert not re.search(r"^module \\wirereduce_vc709\.eth3 ", v, re.M)
    from wirereduce.boards import vc709_top
    assert vc709_top.PORTS == 2 and vc709_top.CAGE_ROLES[1] == ("net0_in", "net0_out")

# --- wirereduce bitstream / flash through the CLI ---------------------------------------------------

def test_bitstream_bad_mtu_is_a_user_error(capsys, tmp_path):
    rc = cli.main(["bitstream", "--board", "vc709", "--out", str(tmp_path / "x"), "--mtu", "10"])
    assert rc == 2
    assert "mtu" in capsys.readouterr().err


def _no_tools(monkeypatch, present=None):
    present = present or {}
    monkeypatch.setattr(board_build.shutil, "which", lambda name, *a, **k: present.get(name))


def test_flash_without_tools_or_bitstream(monkeypatch, capsys, tmp_path):
    _no_tools(monkeypatch)
    rc = cli.main(["flash", "--board", "vc709", "--bitstream", str(tmp_path / "missing.bit")])
    err = capsys.readouterr().err
    assert rc == 1
    assert "no bitstream at" in err and "missing.bit" in err
    assert "openFPGALoader" in err and "vivado" in err


def test_flash_without_tools_but_with_bitstream(monkeypatch, capsys, tmp_path):
    bit = tmp_path / "x.bit"
    bit.write_bytes(b"\0" * 16)
    _no_tools(monkeypatch)
    rc = cli.main(["flash", "--board", "vc709", "--bitstream", str(bit)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "neither openFPGALoader nor vivado is on PATH" in err
    assert "no bitstream" not in err


def _fake_tool(tmp_path, name, rc):
    log = tmp_path / f"{name}.args"
    tool = tmp_path / name
    tool.write_text(f"#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done > {log}\nexit {rc}\n")
    tool.chmod(0o755)
    return tool, log


def test_flash_with_openfpgaloader(monkeypatch, capsys, tmp_path):
    bit = tmp_path / "x.bit"
    bit.write_bytes(b"\0" * 16)
    tool, log = _fake_tool(tmp_path, "openFPGALoader", 0)
    _no_tools(monkeypatch, {"openFPGALoader": str(tool)})
    assert cli.main(["flash", "--board", "vc709", "--bitstream", str(bit)]) == 0
    # docs/boards.md "JTAG": cable digilent, part xc7vx690tffg1761
    assert log.read_text().split() == ["-c", "digilent", "--fpga-part", "xc7vx690tffg1761", str(bit)]


def test_flash_reports_a_missing_cable(monkeypatch, capsys, tmp_path):
    bit = tmp_path / "x.bit"
    bit.write_bytes(b"\0" * 16)
    tool, _ = _fake_tool(tmp_path, "openFPGALoader", 1)   # what it does when no cable answers
    _no_tools(monkeypatch, {"openFPGALoader": str(tool)})
    assert cli.main(["flash", "--board", "vc709", "--bitstream", str(bit)]) == 1
    assert "cable" in capsys.readouterr().err


def test_flash_falls_back_to_vivado(monkeypatch, capsys, tmp_path):
    bit = tmp_path / "x.bit"
    bit.write_bytes(b"\0" * 16)
    tool, log = _fake_tool(tmp_path, "vivado", 0)
    _no_tools(monkeypatch, {"vivado": str(tool)})
    assert cli.main(["flash", "--board", "vc709", "--bitstream", str(bit)]) == 0
    args = log.read_text().split()
    assert args[:2] == ["-mode", "batch"]
    tcl = Path(args[args.index("-source") + 1]).read_text()
    assert f"set_property PROGRAM.FILE {{{bit.resolve()}}}" in tcl
    assert "program_hw_devices" in tcl and "open_hw_target" in tcl


def test_unknown_board_is_rejected(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["flash", "--board", "nosuchboard"])
    assert e.value.code == 2
