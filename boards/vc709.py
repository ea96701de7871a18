"""Xilinx VC709 (XC7VX690T-2FFG1761): Amaranth platform and the board contract of :mod:`wirereduce.boards`.

Pins and I/O standards are SPEC.md's "VC709 facts". Pins that SPEC.md does not list (the PCIe
lanes, the Si5324 interrupt) and the SLEW/DRIVE/PULLUP attributes come from the public VC709
constraint file of Alex Forencich's verilog-ethernet (``example/VC709/fpga/fpga.xdc``, also in
fpganinja/taxi), which agrees with SPEC.md on every pin both list. GT pins (SFP+ TX/RX, refclks,
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
GT user clocks    322.265625 MHz    TXOUTCLK / RXOUTCLK nets (:mod:`wirereduce.hdl.xilinx.gth`)
================  ================  ===========================================

The board top (:func:`top`, :mod:`wirereduce.boards.vc709_top`) derives its 156.25 MHz core clock
from ``clk200`` with an MMCM; Vivado derives that clock's constraint from the input's.
"""

from __future__ import annotations

from amaranth.build import Attrs, Clock, DiffPairs, Pins, Resource, Subsignal
from amaranth.vendor import XilinxPlatform

__all__ = ["NAME", "PART", "YOSYS_FAMILY", "Platform", "top", "SFP_PINS", "OPENFPGALOADER_ARGS",
           "CONFIG_CONSTRAINTS"]

NAME = "vc709"
PART = "xc7vx690tffg1761-2"
YOSYS_FAMILY = "xc7"

#: openFPGALoader arguments that select the VC709's JTAG (SPEC.md: on-board Digilent FTDI cable;
#: SRAM load only).
OPENFPGALOADER_ARGS = ("-c", "digilent", "--fpga-part", "xc7vx690tffg1761")

#: SFP+ cages (SPEC.md table; cages 0 and 1 are swapped relative to the schematic's net names):
#: cage → (tx_p, tx_n, rx_p, rx_n, tx_disable, los, mod_detect, tx_fault).
SFP_PINS = {
    0: ("AN2", "AN1", "AM8", "AM7", "Y42", "AA40", "AA42", "AA39"),
    1: ("AP4", "AP3", "AN6", "AN5", "AB41", "Y39", "AB42", "Y38"),
    2: ("AM4", "AM3", "AL6", "AL5", "AC38", "AD38", "AC39", "AA41"),
    3: ("AL2", "AL1", "AJ6", "AJ5", "AC40", "AD40", "AC41", "AE38"),
}

#: Device configuration (SPEC.md "Config": CFGBVS GND, CONFIG_VOLTAGE 1.8; UG470 "Configuration
#: Bank Voltage Select"), appended to every XDC of this platform.
CONFIG_CONSTRAINTS = "\n".join([
    "set_property CFGBVS GND [current_design]",
    "set_property CONFIG_VOLTAGE 1.8 [current_design]",
    "set_property BITSTREAM.GENERAL.COMPRESS TRUE [current_design]",
])

_LVCMOS18_OUT = dict(IOSTANDARD="LVCMOS18", SLEW="SLOW", DRIVE="12")
_LVCMOS18_IN_PU = dict(IOSTANDARD="LVCMOS18", PULLUP="TRUE")


def _sfp(cage: int) -> Resource:
    tx_p, tx_n, rx_p, rx_n, tx_disable, los, mod_detect, tx_fault = SFP_PINS[cage]
    return Resource(
        "sfp", cage,
        Subsignal("tx", DiffPairs(tx_p, tx_n, dir="o")),
        Subsignal("rx", DiffPairs(rx_p, rx_n, dir="i")),
        # tx_disable is active high (SPEC.md); a 1 turns the cage's laser off
        Subsignal("tx_disable", Pins(tx_disable, dir="o"), Attrs(**_LVCMOS18_OUT)),
        Subsignal("los", Pins(los, dir="i"), Attrs(**_LVCMOS18_IN_PU)),
        Subsignal("mod_detect", Pins(mod_detect, dir="i"), Attrs(**_LVCMOS18_IN_PU)),
        Subsignal("tx_fault", Pins(tx_fault, dir="i"), Attrs(**_LVCMOS18_IN_PU)),
    )


class Platform(XilinxPlatform):
    """The VC709 for Vivado: XC7VX690T, FFG1761 package, speed grade -2.

    Resources (``platform.request(name, number)``):

    - ``clk200`` 0: 200 MHz differential system clock (default clock).
    - ``sfp`` 0-3: ``tx``/``rx`` GT pin pairs, ``tx_disable`` (out, active high), ``los``,
      ``mod_detect``, ``tx_fault`` (in, pulled up), all LVCMOS18 but the GT pins.
    - ``sfp_refclk`` 0 (156.25 MHz, Si5324), ``sma_refclk`` 0 (156.25 MHz), ``pcie_refclk`` 0 (100 MHz).
    - ``i2c`` 0: ``scl``, ``sda`` (open drain, drive them with ``oe``), ``mux_rst_n`` (out).
    - ``si5324`` 0: ``rst_n`` (out, AT36), ``int`` (in, AU34).
    - ``led`` 0-7, ``button_reset`` 0 (CPU reset, active high), ``button_{n,w,s,e,c}`` 0.
    - ``uart`` 0: ``tx`` (FPGA → CP2103), ``rx`` (CP2103 → FPGA).
    - ``pcie_x8`` 0: ``tx``/``rx`` eight GT lane pairs on quads 114/115, ``perst_n`` (in).

    :meth:`build` appends :data:`CONFIG_CONSTRAINTS` to the XDC (``add_constraints`` given by the
    caller comes after it).
    """

    device = "xc7vx690t"
    package = "ffg1761"
    speed = "2"
    default_clk = "clk200"
    default_rst = "button_reset"

    resources = [
        Resource("clk200", 0, DiffPairs("H19", "G18", dir="i"), Clock(200e6),
                 Attrs(IOSTANDARD="DIFF_SSTL15_DCI")),
        *[_sfp(cage) for cage in SFP_PINS],
        Resource("sfp_refclk", 0, DiffPairs("AH8", "AH7", dir="i"), Clock(156.25e6)),
        Resource("sma_refclk", 0, DiffPairs("AK8", "AK7", dir="i"), Clock(156.25e6)),
        Resource("pcie_refclk", 0, DiffPairs("AB8", "AB7", dir="i"), Clock(100e6)),
        Resource("i2c", 0,
                 Subsignal("scl", Pins("AT35", dir="io")),
                 Subsignal("sda", Pins("AU32", dir="io")),
                 Subsignal("mux_rst_n", Pins("AY42", dir="o")),
                 Attrs(IOSTANDARD="LVCMOS18", SLEW="SLOW", DRIVE="8")),
        Resource("si5324", 0,
                 Subsignal("rst_n", Pins("AT36", dir="o"), Attrs(**_LVCMOS18_OUT)),
                 Subsignal("int", Pins("AU34", dir="i"), Attrs(**_LVCMOS18_IN_PU))),
        *[Resource("led", k, Pins(pin, dir="o"), Attrs(**_LVCMOS18_OUT))
          for k, pin in enumerate("AM39 AN39 AR37 AT37 AR35 AP41 AP42 AU39".split())],
        Resource("button_reset", 0, Pins("AV40", dir="i"), Attrs(IOSTANDARD="LVCMOS18")),
        *[Resource(f"button_{name}", 0, Pins(pin, dir="i"), Attrs(IOSTANDARD="LVCMOS18"))
          for name, pin in zip("nwsec", "AR40 AW40 AP40 AU38 AV39".split())],
        Resource("uart", 0,
                 Subsignal("tx", Pins("AU36", dir="o"), Attrs(IOSTANDARD="LVCMOS18", SLEW="SLOW", DRIVE="8")),
                 Subsignal("rx", Pins("AU33", dir="i"), Attrs(IOSTANDARD="LVCMOS18"))),
        Resource("pcie_x8", 0,
                 Subsignal("rx", DiffPairs("Y4 AA6 AB4 AC6 AD4 AE6 AF4 AG6",
                                           "Y3 AA5 AB3 AC5 AD3 AE5 AF3 AG5", dir="i")),
                 Subsignal("tx", DiffPairs("W2 AA2 AC2 AE2 AG2 AH4 AJ2 AK4",
                                           "W1 AA1 AC1 AE1 AG1 AH3 AJ1 AK3", dir="o")),
                 Subsignal("perst_n", Pins("AV35", dir="i"), Attrs(**_LVCMOS18_IN_PU))),
    ]
    connectors = []

    def build(self, elaboratable, name="top", build_dir="build", do_build=True, program_opts=None,
              do_program=False, *, add_constraints: str = "", **kwargs):
        """:meth:`XilinxPlatform.build` with :data:`CONFIG_CONSTRAINTS` put in front of ``add_constraints``."""
        constraints = CONFIG_CONSTRAINTS + ("\n" + add_constraints if add_constraints else "")
        return super().build(elaboratable, name, build_dir, do_build, program_opts, do_program,
                             add_constraints=constraints, **kwargs)


def top(**options):
    """The VC709 board top: one node, SFP+ cages 0-2 as host link and ring ports (see
    :class:`wirereduce.boards.vc709_top.Vc709Top`; ``options`` are its keyword arguments:
    ``mtu``, ``slots``, ``refclk``)."""
    from wirereduce.boards.vc709_top import Vc709Top

    return Vc709Top(**options)
