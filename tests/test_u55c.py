"""The Alveo U55C board: its build tree (Verilog, XDC, Tcl) without running Vivado."""

from __future__ import annotations

import re

import pytest
from wirereduce.boards import u55c

from wirereduce import boards


@pytest.fixture(scope="module")
def plan():
    platform = u55c.Platform()
    return platform.build(u55c.top(mtu=1500), name="top", do_build=False)


def test_contract():
    mod = boards.load("u55c")
    assert mod is u55c
    assert (mod.NAME, mod.PART, mod.YOSYS_FAMILY) == ("u55c", "xcu55c-fsvh2892-2L-e", "xcup")
    assert mod.Platform()._part == mod.PART


def test_tcl_targets_the_part_and_generates_both_cmacs(plan):
    tcl = plan.files["top.tcl"]
    assert "create_project -force -name top -part xcu55c-fsvh2892-2L-e" in tcl
    assert "CONFIG.CMAC_CORE_SELECT {CMACE4_X0Y3}" in tcl and "CONFIG.GT_GROUP_SELECT {X0Y24~X0Y27}" in tcl
    assert "CONFIG.CMAC_CORE_SELECT {CMACE4_X0Y4}" in tcl and "CONFIG.GT_GROUP_SELECT {X0Y28~X0Y31}" in tcl
    # The IPs exist before synthesis reads the design.
    assert tcl.index("create_ip -name cmac_usplus") < tcl.index("synth_design")


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
    assert "set_clock_groups -asynchronous" in xdc
    assert "set_property CONFIG_VOLTAGE 1.8 [current_design]" in xdc


def test_verilog_instantiates_both_cmacs_and_the_node(plan):
    v = plan.files["top.v"]
    assert re.search(r"^\s*cmac_usplus_0 ", v, re.M) and re.search(r"^\s*cmac_usplus_1 ", v, re.M)
    assert ".gt_rxp_in(qsfp_0__rx__p)" in v and ".gt_ref_clk_p(qsfp_1__refclk__p)" in v


def test_top_rejects_other_widths_and_unknown_options():
    with pytest.raises(ValueError, match="width must be 512"):
        u55c.top(width=64)
    with pytest.raises(TypeError, match="does not take option"):
        u55c.top(speed=100)
