"""The Alveo U55C board: its platform, and its build tree (Verilog, XDC, Tcl) without running Vivado."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from amaranth.build import ResourceError
from amaranth.build.run import LocalBuildProducts
from wirereduce.boards import common as board_common
from wirereduce.boards import u55c_top
from wirereduce.boards.u55c import U55CPlatform

from wirereduce import boards


@pytest.fixture(scope="module")
def plan():
    return U55CPlatform().build(u55c_top.top(mtu=1500), name="top", do_build=False)


def test_registry():
    board = boards.load("u55c")
    assert board.platform is U55CPlatform and board.top is u55c_top.top
    assert (board.name, board.part, board.yosys_family) == ("u55c", "xcu55c-fsvh2892-2L-e", "xcup")


def test_platform_is_amaranth_boards_style():
    p = U55CPlatform()
    assert (p.device, p.package, p.speed, p._part) == ("xcu55c", "fsvh2892", "2L-e", "xcu55c-fsvh2892-2L-e")
    assert p.default_clk == "clk100" and p.default_clk_frequency == 100e6
    for name, count in (("clk100", 2), ("qsfp", 2), ("qsfp_led", 2), ("hbm_cattrip", 1)):
        for k in range(count):
            p.lookup(name, k)
        with pytest.raises(ResourceError):
            p.lookup(name, count)
    for res in list(p.resources.values()):
        p.request(res.name, res.number, dir="-")


def test_platform_alone_adds_no_cmac():
    """The CMAC IPs and the clock groups belong to the top: a bare platform build has none."""
    from amaranth_boards.test.blinky import Blinky

    plan = U55CPlatform().build(Blinky(), name="blinky", do_build=False)
    assert "cmac_usplus" not in plan.files["blinky.tcl"] and "source " not in plan.files["blinky.tcl"]
    xdc = plan.files["blinky.xdc"]
    assert "set_clock_groups" not in xdc
    assert "set_property CONFIG_MODE SPIx4 [current_design]" in xdc
    assert re.search(r'set_property LOC BK10 \[get_ports "clk100_0__p"\]', xdc)
    assert re.search(r'set_property IOSTANDARD "LVDS" \[get_ports "clk100_0__p"\]', xdc)


def test_toolchain_program_runs_openfpgaloader(monkeypatch, tmp_path):
    (tmp_path / "top.bit").write_bytes(b"\xff" * 8)
    calls = []
    monkeypatch.delenv("OPENFPGALOADER", raising=False)
    monkeypatch.setattr(board_common.subprocess, "check_call", lambda cmd, **kw: calls.append(cmd))
    U55CPlatform().toolchain_program(LocalBuildProducts(str(tmp_path)), "top")
    assert [c[:-1] for c in calls] == [["openFPGALoader", "--fpga-part", "xcu55c"]]
    assert Path(calls[0][-1]).suffix == ".bit"


def test_tcl_targets_the_part_and_generates_both_cmacs(plan):
    tcl = plan.files["top.tcl"]
    assert "create_project -force -name top -part xcu55c-fsvh2892-2L-e" in tcl
    ip0, ip1 = plan.files["cmac_usplus_0.tcl"], plan.files["cmac_usplus_1.tcl"]
    assert "CONFIG.CMAC_CORE_SELECT {CMACE4_X0Y3}" in ip0 and "CONFIG.GT_GROUP_SELECT {X0Y24~X0Y27}" in ip0
    assert "CONFIG.CMAC_CORE_SELECT {CMACE4_X0Y4}" in ip1 and "CONFIG.GT_GROUP_SELECT {X0Y28~X0Y31}" in ip1
    # the receive limit follows the top's MTU: 14 + 1500 + 4
    assert "CONFIG.RX_MAX_PACKET_LEN {1518}" in ip0 and "CONFIG.RX_MAX_PACKET_LEN {1518}" in ip1
    # The IPs exist before synthesis reads the design.
    assert tcl.index("source cmac_usplus_0.tcl") < tcl.index("source cmac_usplus_1.tcl") < tcl.index("synth_design")


# Public U55C XDC: QSFP0 on GTY quad 130, QSFP1 on quad 131 (lane: rx_p, tx_p).
QSFP_PINS = {
    0: {"rx__p": ["AD51", "AC53", "AC49", "AB51"], "rx__n": ["AD52", "AC54", "AC50", "AB52"],
        "tx__p": ["AD46", "AC44", "AB46", "AA48"], "tx__n": ["AD47", "AC45", "AB47", "AA49"],
        "refclk__p": ["AD42"], "refclk__n": ["AD43"]},
    1: {"rx__p": ["AA53", "Y51", "W53", "V51"], "rx__n": ["AA54", "Y52", "W54", "V52"],
        "tx__p": ["AA44", "Y46", "W48", "W44"], "tx__n": ["AA45", "Y47", "W49", "W45"],
        "refclk__p": ["AB42"], "refclk__n": ["AB43"]},
}


def test_xdc_places_the_qsfp_pins(plan):
    xdc = plan.files["top.xdc"]
    by_port = {port.replace("\\[", "["): pin
               for pin, port in re.findall(r'set_property LOC (\w+) \[get_ports "([^"]+)"\]', xdc)}
    for cage, groups in QSFP_PINS.items():
        for group, pins in groups.items():
            for lane, pin in enumerate(pins):
                port = f"qsfp_{cage}__{group}[{lane}]" if len(pins) > 1 else f"qsfp_{cage}__{group}"
                assert by_port.get(port) == pin, f"{port}: {by_port.get(port)} != {pin}"
    # GT pads carry no IO standard (no IO buffer either).
    assert not re.search(r"IOSTANDARD .*qsfp_\d__(rx|tx|refclk)", xdc)
    assert by_port["hbm_cattrip_0__io"] == "BE45"


def test_xdc_constrains_the_clocks(plan):
    xdc = plan.files["top.xdc"]
    periods = {name: float(p) for name, p in re.findall(r"create_clock -name (\S+) -period ([\d.]+)", xdc)}
    assert periods["qsfp_0__refclk__p"] == pytest.approx(1e3 / 161.1328125, abs=1e-3)
    assert periods["qsfp_1__refclk__p"] == pytest.approx(1e3 / 161.1328125, abs=1e-3)
    assert periods["clk100_0__p"] == pytest.approx(10.0)
    assert "set_property CONFIG_VOLTAGE 1.8 [current_design]" in xdc
    top_xdc = plan.files["u55c_top.xdc"]
    assert "set_clock_groups -asynchronous" in top_xdc
    assert "set_false_path -to [get_ports {qsfp_led_* hbm_cattrip_*}]" in top_xdc
    assert 'read_xdc "u55c_top.xdc"' in plan.files["top.tcl"]


def test_verilog_instantiates_both_cmacs_and_the_engine(plan):
    v = plan.files["top.v"]
    assert re.search(r"^\s*cmac_usplus_0 ", v, re.M) and re.search(r"^\s*cmac_usplus_1 ", v, re.M)
    assert ".gt_rxp_in(qsfp_0__rx__p)" in v and ".gt_ref_clk_p(qsfp_1__refclk__p)" in v
    # the schedule engine with two 512-bit network ports (no ring-only node)
    engine = re.search(r"^module \\top\.engine \((.*?)\);", v, re.M | re.S)
    assert engine, "no engine module in the U55C top"
    for name in ("net0_in__ready", "net1_in__ready", "net0_out__valid", "net1_out__valid"):
        assert name in engine.group(1), name
    assert "net2_" not in engine.group(1)
    assert not re.search(r"^module \\top\.node\b", v, re.M)
    assert u55c_top.PORTS == 2


def test_top_rejects_other_widths_and_unknown_options():
    with pytest.raises(ValueError, match="width must be 512"):
        u55c_top.top(width=64)
    with pytest.raises(TypeError, match="does not take option"):
        u55c_top.top(speed=100)
