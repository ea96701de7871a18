"""Xilinx VC709 (XC7VX690T-2FFG1761): the Amaranth platform, written the way amaranth-boards writes one.

Pins and I/O standards are those of docs/boards.md "VC709". Pins outside its main tables (the PCIe
lanes, the Si5324 interrupt) and the SLEW/DRIVE/PULLUP attributes come from the public VC709
constraint file of Alex Forencich's verilog-ethernet (``example/VC709/fpga/fpga.xdc``, also in
fpganinja/taxi), which agrees with those tables on every pin both list. GT pins (SFP+ TX/RX, refclks,
PCIe lanes) carry no I/O standard: they are dedicated transceiver pins, reached only through
``GTHE2_CHANNEL`` / ``IBUFDS_GTE2`` and requested raw (``dir="-"``).

Clocks constrained here (``create_clock`` in the generated XDC):

================  ================  ===========================================
clock             frequency         pins
================  ================  ===========================================
``clk200``        200 MHz           H19 / G18, DIFF_SSTL15_DCI (system clock)
``sfp_refclk``    156.25 MHz        AH8 / AH7, MGTREFCLK0_113 (from the Si5324)
``sma_refclk``    156.25 MHz        AK8 / AK7, MGTREFCLK1_113 (SMA J25/J26)
``pcie_refclk``   100 MHz           AB8 / AB7, MGTREFCLK1_115
================  ================  ===========================================

The wirereduce top of this board is :mod:`wirereduce.boards.vc709_top`.
"""

from __future__ import annotations

from amaranth.build import Attrs, Clock, DiffPairs, Pins, Resource, Subsignal
from amaranth.vendor import XilinxPlatform
from amaranth_boards.resources import ButtonResources, I2CResource, LEDResources
from wirereduce.boards.common import openfpgaloader_program, vivado_overrides

__all__ = ["VC709Platform", "SFP_PINS", "BUTTONS"]

#: SFP+ cages (docs/boards.md "SFP+ cages"; cages 0 and 1 are swapped relative to the schematic's net names):
#: cage → (tx_p, tx_n, rx_p, rx_n, tx_disable, los, mod_detect, tx_fault).
SFP_PINS = {
    0: ("AN2", "AN1", "AM8", "AM7", "Y42", "AA40", "AA42", "AA39"),
    1: ("AP4", "AP3", "AN6", "AN5", "AB41", "Y39", "AB42", "Y38"),
    2: ("AM4", "AM3", "AL6", "AL5", "AC38", "AD38", "AC39", "AA41"),
    3: ("AL2", "AL1", "AJ6", "AJ5", "AC40", "AD40", "AC41", "AE38"),
}

#: Push buttons (``button`` resource number → button, pin): the five of the direction pad.
#: The CPU reset button is the ``rst`` resource.
BUTTONS = {0: ("N", "AR40"), 1: ("W", "AW40"), 2: ("S", "AP40"), 3: ("E", "AU38"), 4: ("C", "AV39")}

_LVCMOS18_OUT = dict(IOSTANDARD="LVCMOS18", SLEW="SLOW", DRIVE="12")
_LVCMOS18_IN_PU = dict(IOSTANDARD="LVCMOS18", PULLUP="TRUE")
_LVCMOS18_OUT_8MA = dict(IOSTANDARD="LVCMOS18", SLEW="SLOW", DRIVE="8")


def _sfp(cage: int) -> Resource:
    tx_p, tx_n, rx_p, rx_n, tx_disable, los, mod_detect, tx_fault = SFP_PINS[cage]
    return Resource(
        "sfp", cage,
        Subsignal("tx", DiffPairs(tx_p, tx_n, dir="o")),
        Subsignal("rx", DiffPairs(rx_p, rx_n, dir="i")),
        # tx_disable is active high (docs/boards.md "SFP+ cages"); a 1 turns the cage's laser off
        Subsignal("tx_disable", Pins(tx_disable, dir="o"), Attrs(**_LVCMOS18_OUT)),
        Subsignal("los", Pins(los, dir="i"), Attrs(**_LVCMOS18_IN_PU)),
        Subsignal("mod_detect", Pins(mod_detect, dir="i"), Attrs(**_LVCMOS18_IN_PU)),
        Subsignal("tx_fault", Pins(tx_fault, dir="i"), Attrs(**_LVCMOS18_IN_PU)),
    )


class VC709Platform(XilinxPlatform):
    """The VC709 for Vivado: XC7VX690T, FFG1761 package, speed grade -2.

    Resources (``platform.request(name, number)``):

    - ``clk200`` 0: 200 MHz differential system clock (default clock).
    - ``rst`` 0: the CPU reset button (AV40, active high; default reset).
    - ``sfp`` 0-3: ``tx``/``rx`` GT pin pairs, ``tx_disable`` (out, active high), ``los``,
      ``mod_detect``, ``tx_fault`` (in, pulled up), all LVCMOS18 but the GT pins.
    - ``sfp_refclk`` 0 (156.25 MHz, Si5324), ``sma_refclk`` 0 (156.25 MHz), ``pcie_refclk`` 0 (100 MHz).
    - ``i2c`` 0: ``scl``, ``sda`` (open drain, drive them with ``oe``); ``i2c_mux_rst_n`` 0 (out):
      the reset of the I2C switches in front of the Si5324.
    - ``si5324`` 0: ``rst_n`` (out, AT36), ``int`` (in, AU34).
    - ``led`` 0-7 (DS2 … DS9), ``button`` 0-4 (N, W, S, E, C: :data:`BUTTONS`).
    - ``uart`` 0: ``tx`` (FPGA → CP2103), ``rx`` (CP2103 → FPGA).
    - ``pcie_x8`` 0: ``tx``/``rx`` eight GT lane pairs on quads 114/115, ``perst_n`` (in).

    Builds append :attr:`config_constraints` to the XDC (CFGBVS, configuration voltage) and
    source the ``.tcl`` extra files before synthesis (:func:`wirereduce.boards.common.vivado_overrides`).
    :meth:`toolchain_program` loads the bitstream into SRAM over the on-board Digilent JTAG with
    openFPGALoader (:attr:`openfpgaloader_args`), so ``VC709Platform().build(top, do_program=True)``
    builds and loads a design.
    """

    device = "xc7vx690t"
    package = "ffg1761"
    speed = "2"
    default_clk = "clk200"
    default_rst = "rst"

    resources = [
        Resource("clk200", 0, DiffPairs("H19", "G18", dir="i"), Clock(200e6),
                 Attrs(IOSTANDARD="DIFF_SSTL15_DCI")),
        Resource("rst", 0, Pins("AV40", dir="i"), Attrs(IOSTANDARD="LVCMOS18")),

        *LEDResources(pins="AM39 AN39 AR37 AT37 AR35 AP41 AP42 AU39", attrs=Attrs(**_LVCMOS18_OUT)),
        *ButtonResources(pins={k: pin for k, (_, pin) in BUTTONS.items()}, attrs=Attrs(IOSTANDARD="LVCMOS18")),

        # UARTResource would put one set of attributes on both lines; tx drives 8 mA, rx has none
        Resource("uart", 0,
                 Subsignal("tx", Pins("AU36", dir="o"), Attrs(**_LVCMOS18_OUT_8MA)),
                 Subsignal("rx", Pins("AU33", dir="i"), Attrs(IOSTANDARD="LVCMOS18"))),

        I2CResource(0, scl="AT35", sda="AU32", attrs=Attrs(**_LVCMOS18_OUT_8MA)),
        Resource("i2c_mux_rst_n", 0, Pins("AY42", dir="o"), Attrs(**_LVCMOS18_OUT_8MA)),
        Resource("si5324", 0,
                 Subsignal("rst_n", Pins("AT36", dir="o"), Attrs(**_LVCMOS18_OUT)),
                 Subsignal("int", Pins("AU34", dir="i"), Attrs(**_LVCMOS18_IN_PU))),

        *[_sfp(cage) for cage in SFP_PINS],
        Resource("sfp_refclk", 0, DiffPairs("AH8", "AH7", dir="i"), Clock(156.25e6)),
        Resource("sma_refclk", 0, DiffPairs("AK8", "AK7", dir="i"), Clock(156.25e6)),

        Resource("pcie_refclk", 0, DiffPairs("AB8", "AB7", dir="i"), Clock(100e6)),
        Resource("pcie_x8", 0,
                 Subsignal("rx", DiffPairs("Y4 AA6 AB4 AC6 AD4 AE6 AF4 AG6",
                                           "Y3 AA5 AB3 AC5 AD3 AE5 AF3 AG5", dir="i")),
                 Subsignal("tx", DiffPairs("W2 AA2 AC2 AE2 AG2 AH4 AJ2 AK4",
                                           "W1 AA1 AC1 AE1 AG1 AH3 AJ1 AK3", dir="o")),
                 Subsignal("perst_n", Pins("AV35", dir="i"), Attrs(**_LVCMOS18_IN_PU))),
    ]
    connectors = []

    #: Device configuration (docs/boards.md "Configuration": CFGBVS GND, CONFIG_VOLTAGE 1.8; UG470 "Configuration
    #: Bank Voltage Select"), appended to the XDC of every build.
    config_constraints = "\n".join([
        "set_property CFGBVS GND [current_design]",
        "set_property CONFIG_VOLTAGE 1.8 [current_design]",
        "set_property BITSTREAM.GENERAL.COMPRESS TRUE [current_design]",
    ])

    #: openFPGALoader arguments that select the VC709's JTAG (docs/boards.md "JTAG": on-board Digilent FTDI
    #: cable; no ``-f``, so the bitstream goes to SRAM).
    openfpgaloader_args = ("-c", "digilent", "--fpga-part", "xc7vx690tffg1761")

    def toolchain_prepare(self, fragment, name, **kwargs):
        return super().toolchain_prepare(fragment, name, **vivado_overrides(self, kwargs))

    def toolchain_program(self, products, name):
        openfpgaloader_program(self, products, name)


if __name__ == "__main__":
    from amaranth_boards.test.blinky import Blinky

    VC709Platform().build(Blinky(), do_program=True)
