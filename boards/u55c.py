"""Xilinx Alveo U55C (XCU55C-FSVH2892-2L-E): the Amaranth platform, written the way amaranth-boards writes one.

Facts used, from public sources:

- Part ``xcu55c-fsvh2892-2L-e``; QSFP28 GTY pins, their 161.1328125 MHz reference clocks (from
  the on-board SI5394, OUT0 → quad 130 MGTREFCLK0 AD42/AD43, OUT1 → quad 131 AB42/AB43), the
  100 MHz system clocks, the QSFP LEDs and HBM CATTRIP: the public U55C/U55N/Varium C1100 XDC
  ("XDC constraints for the Xilinx Alveo U55C/Alveo U55N/Varium C1100 board", Alex Forencich,
  Corundum/taxi family) and ``Xilinx/open-nic-shell`` ``constr/au55c/pins.xdc``.
- CMAC sites and GT groups of the cages (:data:`CMACS`): ``Xilinx/open-nic-shell``
  ``src/cmac_subsystem/vivado_ip/cmac_usplus_{0,1}_au55c.tcl``.
- HBM CATTRIP (BE45) must be held low or the board's power is shut off (AR72926, as
  ``constr/au55c/pins.xdc`` notes); a design on this board must drive it low.
- QSFP28 module control (reset, low power, presence) is handled by the card's satellite
  controller, not by FPGA pins.

The wirereduce top of this board is :mod:`wirereduce.boards.u55c_top`.
"""

from __future__ import annotations

from amaranth.build import Attrs, Clock, DiffPairs, Pins, Resource, Subsignal
from amaranth.vendor import XilinxPlatform
from wirereduce.boards.common import openfpgaloader_program, vivado_overrides

__all__ = ["U55CPlatform", "QSFP_REFCLK_HZ", "CMACS"]

#: QSFP28 GTY reference clock, Hz (SI5394 OUT0/OUT1; 161.1328125 MHz = 25.78125 Gbit/s / 160).
QSFP_REFCLK_HZ = 161_132_812.5
#: Per cage (``qsfp`` resource number): the CMAC IP module name, the CMAC hard block next to the
#: cage's GTY quad and its four GTY channels, lane 1 first.
CMACS = (
    ("cmac_usplus_0", "CMACE4_X0Y3", ("X0Y24", "X0Y25", "X0Y26", "X0Y27")),   # QSFP0, quad 130
    ("cmac_usplus_1", "CMACE4_X0Y4", ("X0Y28", "X0Y29", "X0Y30", "X0Y31")),   # QSFP1, quad 131
)


def _qsfp(number, rx_p, rx_n, tx_p, tx_n, refclk_p, refclk_n):
    # GT pads take no IO standard and no IO buffer: request them with dir="-".
    return Resource("qsfp", number,
                    Subsignal("rx", DiffPairs(rx_p, rx_n, dir="i")),
                    Subsignal("tx", DiffPairs(tx_p, tx_n, dir="o")),
                    Subsignal("refclk", DiffPairs(refclk_p, refclk_n, dir="i"), Clock(QSFP_REFCLK_HZ)))


class U55CPlatform(XilinxPlatform):
    """The Alveo U55C for Vivado: XCU55C, FSVH2892 package, speed grade -2L-e.

    Resources (``platform.request(name, number)``):

    - ``clk100`` 0/1: 100 MHz LVDS system clocks (0 is the default clock).
    - ``qsfp`` 0/1: ``rx``/``tx`` four GTY lanes each way and ``refclk`` (161.1328125 MHz), raw
      GT pads (request them with ``dir="-"``); :data:`CMACS` names the CMAC next to each.
    - ``qsfp_led`` 0/1: ``act``, ``stat_g``, ``stat_y`` (LVCMOS18).
    - ``hbm_cattrip`` 0: LVCMOS18, pulled down; must be driven low (module docstring).

    Builds append :attr:`config_constraints` to the XDC (configuration flash: SPI x4, 1.8 V) and
    source the ``.tcl`` extra files before synthesis (:func:`wirereduce.boards.common.vivado_overrides`;
    the top's CMAC IPs). :meth:`toolchain_program` loads the bitstream into SRAM with openFPGALoader
    (:attr:`openfpgaloader_args`; openFPGALoader's support of this part is not confirmed:
    ``wirereduce flash`` falls back to Vivado's hardware manager).
    """

    device = "xcu55c"
    package = "fsvh2892"
    speed = "2L-e"
    default_clk = "clk100"

    resources = [
        Resource("clk100", 0, DiffPairs("BK10", "BL10", dir="i"), Clock(100e6), Attrs(IOSTANDARD="LVDS")),
        Resource("clk100", 1, DiffPairs("BK43", "BK44", dir="i"), Clock(100e6), Attrs(IOSTANDARD="LVDS")),
        _qsfp(0, "AD51 AC53 AC49 AB51", "AD52 AC54 AC50 AB52",
              "AD46 AC44 AB46 AA48", "AD47 AC45 AB47 AA49", "AD42", "AD43"),
        _qsfp(1, "AA53 Y51 W53 V51", "AA54 Y52 W54 V52",
              "AA44 Y46 W48 W44", "AA45 Y47 W49 W45", "AB42", "AB43"),
        Resource("qsfp_led", 0,
                 Subsignal("act", Pins("BL13", dir="o")), Subsignal("stat_g", Pins("BK11", dir="o")),
                 Subsignal("stat_y", Pins("BJ11", dir="o")), Attrs(IOSTANDARD="LVCMOS18")),
        Resource("qsfp_led", 1,
                 Subsignal("act", Pins("BK14", dir="o")), Subsignal("stat_g", Pins("BK15", dir="o")),
                 Subsignal("stat_y", Pins("BL12", dir="o")), Attrs(IOSTANDARD="LVCMOS18")),
        Resource("hbm_cattrip", 0, Pins("BE45", dir="o"), Attrs(IOSTANDARD="LVCMOS18", PULLDOWN="TRUE")),
    ]
    connectors = []

    #: Configuration and bitstream settings (public U55C XDC, "General configuration"), appended
    #: to the XDC of every build.
    config_constraints = "\n".join([
        "set_property CFGBVS GND [current_design]",
        "set_property CONFIG_VOLTAGE 1.8 [current_design]",
        "set_property BITSTREAM.CONFIG.CONFIGFALLBACK ENABLE [current_design]",
        "set_property BITSTREAM.GENERAL.COMPRESS TRUE [current_design]",
        "set_property CONFIG_MODE SPIx4 [current_design]",
        "set_property BITSTREAM.CONFIG.SPI_BUSWIDTH 4 [current_design]",
        "set_property BITSTREAM.CONFIG.CONFIGRATE 85.0 [current_design]",
        "set_property BITSTREAM.CONFIG.EXTMASTERCCLK_EN DISABLE [current_design]",
        "set_property BITSTREAM.CONFIG.SPI_FALL_EDGE YES [current_design]",
        "set_property BITSTREAM.CONFIG.UNUSEDPIN PULLUP [current_design]",
        "set_property BITSTREAM.CONFIG.SPI_32BIT_ADDR YES [current_design]",
    ])

    #: openFPGALoader arguments: the part without its speed grade (no ``-f``: SRAM load).
    openfpgaloader_args = ("--fpga-part", "xcu55c")

    def toolchain_prepare(self, fragment, name, **kwargs):
        return super().toolchain_prepare(fragment, name, **vivado_overrides(self, kwargs))

    def toolchain_program(self, products, name):
        openfpgaloader_program(self, products, name)
