"""Xilinx Alveo U55C: two QSFP28 cages at 100 Gbit/s through the UltraScale+ integrated CMACs.

The board contract (:mod:`wirereduce.boards`): :data:`NAME`, :data:`PART`, :data:`YOSYS_FAMILY`,
:class:`Platform`, :func:`top`.

Ring wiring of :func:`top` (one node per card, 512-bit datapath at 322.265625 MHz):

======  ===============  ================================  ================================
cage    neighbour        node ports                        CMAC (site, GTY channels)
======  ===============  ================================  ================================
QSFP0   rank - 1         ``cw_in`` ← RX, ``ccw_out`` → TX  ``cmac_usplus_0`` CMACE4_X0Y3, X0Y24–27 (quad 130)
QSFP1   rank + 1         ``ccw_in`` ← RX, ``cw_out`` → TX  ``cmac_usplus_1`` CMACE4_X0Y4, X0Y28–31 (quad 131)
======  ===============  ================================  ================================

So cable QSFP1 of rank k to QSFP0 of rank k+1, and QSFP1 of the last rank to QSFP0 of rank 0.

**The host port has no cage on this board.** A U55C talks to its host over PCIe (QDMA), which
is out of scope for now: the node's ``host_rx`` is tied idle and ``host_tx`` always ready (its
frames are discarded). Until a PCIe host link exists, nothing can send the CONTROL frame that
sets a node's rank, so this top builds, places and brings the 100G links up, but cannot run an
allreduce by itself.

Facts used, from public sources:

- Part ``xcu55c-fsvh2892-2L-e``; QSFP28 GTY pins, their 161.1328125 MHz reference clocks (from
  the on-board SI5394, OUT0 → quad 130 MGTREFCLK0 AD42/AD43, OUT1 → quad 131 AB42/AB43), the
  100 MHz system clocks, the QSFP LEDs and HBM CATTRIP: the public U55C/U55N/Varium C1100 XDC
  ("XDC constraints for the Xilinx Alveo U55C/Alveo U55N/Varium C1100 board", Alex Forencich,
  Corundum/taxi family) and ``Xilinx/open-nic-shell`` ``constr/au55c/pins.xdc``.
- CMAC sites and GT groups: ``Xilinx/open-nic-shell``
  ``src/cmac_subsystem/vivado_ip/cmac_usplus_{0,1}_au55c.tcl``.
- HBM CATTRIP (BE45) must be held low or the board's power is shut off (AR72926, as
  ``constr/au55c/pins.xdc`` notes); the top drives it low.
- QSFP28 module control (reset, low power, presence) is handled by the card's satellite
  controller, not by FPGA pins.
"""

from __future__ import annotations

from amaranth import ClockDomain, ClockSignal, Elaboratable, Module, Signal
from amaranth.build import Attrs, Clock, DiffPairs, Pins, Resource, Subsignal
from amaranth.hdl import DomainRenamer
from amaranth.lib import io, wiring
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.vendor import XilinxPlatform
from wirereduce.hdl.core.node import Node
from wirereduce.hdl.xilinx.cmac import Cmac100G, CmacRxGlue, CmacTxGlue, cmac_ip_tcl

from wirereduce.config import NodeConfig

__all__ = ["NAME", "PART", "YOSYS_FAMILY", "Platform", "top", "U55CTop", "QSFP_REFCLK_HZ", "CMACS"]

NAME = "u55c"
PART = "xcu55c-fsvh2892-2L-e"
YOSYS_FAMILY = "xcup"

#: QSFP28 GTY reference clock, Hz (SI5394 OUT0/OUT1; 161.1328125 MHz = 25.78125 Gbit/s / 160).
QSFP_REFCLK_HZ = 161_132_812.5
#: Per cage: the IP module name, the CMAC hard block and the four GTY channels, lane 1 first.
CMACS = (
    ("cmac_usplus_0", "CMACE4_X0Y3", ("X0Y24", "X0Y25", "X0Y26", "X0Y27")),
    ("cmac_usplus_1", "CMACE4_X0Y4", ("X0Y28", "X0Y29", "X0Y30", "X0Y31")),
)
#: Cycles of the 100 MHz clock the CMACs are held in reset after configuration (655 µs).
_POR_CYCLES = 1 << 16


def _qsfp(number, rx_p, rx_n, tx_p, tx_n, refclk_p, refclk_n):
    # GT pads take no IO standard and no IO buffer: request them with dir="-".
    return Resource("qsfp", number,
                    Subsignal("rx", DiffPairs(rx_p, rx_n, dir="i")),
                    Subsignal("tx", DiffPairs(tx_p, tx_n, dir="o")),
                    Subsignal("refclk", DiffPairs(refclk_p, refclk_n, dir="i"), Clock(QSFP_REFCLK_HZ)))


class Platform(XilinxPlatform):
    """Alveo U55C (``xcu55c-fsvh2892-2L-e``), Vivado toolchain.

    Resources: ``clk100`` #0/#1 (100 MHz LVDS system clocks), ``qsfp`` #0/#1 (four GTY lanes
    each way and the 161.1328125 MHz reference clock), ``qsfp_led`` #0/#1 (``act``, ``stat_g``,
    ``stat_y``, LVCMOS18), ``hbm_cattrip`` (LVCMOS18, must be driven low).

    A build also generates the two CMAC IPs (:func:`wirereduce.hdl.xilinx.cmac.cmac_ip_tcl`, added to
    the ``script_after_read`` override), writes the configuration-flash settings of the public
    XDC (SPI x4, 1.8 V) and declares the three reference clocks asynchronous to each other.
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

    #: Configuration and bitstream settings (public U55C XDC, "General configuration").
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

    def __init__(self, *, toolchain="Vivado", mtu: int = 9000):
        super().__init__(toolchain=toolchain)
        self.mtu = mtu

    def ip_tcl(self) -> str:
        """Tcl generating both CMAC IPs (100 MHz ``init_clk``, receive limit for ``self.mtu``)."""
        return "".join(cmac_ip_tcl(name, site, gts, mtu=self.mtu, init_clk_mhz=100.0) for name, site, gts in CMACS)

    def toolchain_prepare(self, fragment, name, **kwargs):
        clock_groups = " ".join(
            f"-group [get_clocks -include_generated_clocks {clk}]"
            for clk in ("qsfp_0__refclk__p", "qsfp_1__refclk__p", "clk100_0__p"))
        kwargs["script_after_read"] = self.ip_tcl() + kwargs.get("script_after_read", "")
        kwargs["add_constraints"] = "\n".join([
            self.config_constraints,
            # Each CMAC's user clock derives from its own cage's reference clock; the node's
            # clock is CMAC 0's. All crossings go through AsyncFIFOs and FFSynchronizers.
            f"set_clock_groups -asynchronous {clock_groups}",
            "set_false_path -to [get_ports {qsfp_led_* hbm_cattrip_*}]",
            kwargs.get("add_constraints", ""),
        ])
        return super().toolchain_prepare(fragment, name, **kwargs)


class U55CTop(Elaboratable):
    """One wirereduce node on the U55C, ring ports on the two QSFP28 cages (module docstring).

    Clock domains: ``sync`` (the node) and ``cmac0`` run on CMAC 0's ``gt_txusrclk2``
    (322.265625 MHz, as the OpenNIC shell runs its 322 MHz user box on the CMAC clock); ``cmac1``
    on CMAC 1's; ``init`` on the 100 MHz system clock, which also drives the CMACs' ``init_clk``
    and a power-on reset that holds them in ``sys_reset`` for 655 µs. ``sync`` and ``cmacN`` are
    reset by the CMACs' user resets.

    LEDs per cage: ``stat_g`` link up (``stat_rx_aligned``), ``stat_y`` CMAC in reset,
    ``act`` a 1.5 Hz heartbeat of the 100 MHz clock (0) / of the node clock (1).

    Parameters
    ----------
    mtu, slots : int
        As :class:`~wirereduce.hdl.core.node.NodeConfig` (width is 512).
    """

    def __init__(self, mtu: int = 9000, slots: int = 8):
        self.config = NodeConfig(width=512, mtu=mtu, slots=slots)
        self.node = Node(self.config)

    def elaborate(self, platform):
        m = Module()
        mtu = self.config.mtu
        m.submodules.node = node = self.node

        on_board = platform is not None
        init_clk = Signal()
        if on_board:
            m.submodules.clk100 = clk100 = io.Buffer("i", platform.request("clk100", 0, dir="-"))
            m.d.comb += init_clk.eq(clk100.i)
        m.domains.init = ClockDomain("init", reset_less=True)
        m.d.comb += ClockSignal("init").eq(init_clk)
        por = Signal(range(_POR_CYCLES + 1))
        sys_reset = Signal()
        m.d.comb += sys_reset.eq(por != _POR_CYCLES)
        with m.If(sys_reset):
            m.d.init += por.eq(por + 1)
        heartbeat = Signal(27)
        m.d.init += heartbeat.eq(heartbeat + 1)

        cmacs = []
        for k, (ip_name, _site, _gts) in enumerate(CMACS):
            pads = platform.request("qsfp", k, dir="-") if on_board else None
            cmac = Cmac100G(ip_name, pads)
            m.submodules[f"cmac{k}"] = cmac
            m.d.comb += [cmac.init_clk.eq(init_clk), cmac.sys_reset.eq(sys_reset)]
            m.domains += ClockDomain(f"cmac{k}")
            m.d.comb += ClockSignal(f"cmac{k}").eq(cmac.usr_clk)
            m.submodules[f"cmac{k}_rst"] = ResetSynchronizer(cmac.usr_rx_reset | cmac.usr_tx_reset,
                                                             domain=f"cmac{k}")
            cmacs.append(cmac)

        m.domains.sync = ClockDomain("sync")
        m.d.comb += ClockSignal("sync").eq(cmacs[0].usr_clk)
        m.submodules.sync_rst = ResetSynchronizer(cmacs[0].usr_rx_reset | cmacs[0].usr_tx_reset, domain="sync")

        # QSFP0 faces rank - 1: reduce frames come in, broadcast frames go out.
        # QSFP1 faces rank + 1: reduce frames go out, broadcast frames come in.
        ring = ((node.cw_in, node.ccw_out), (node.ccw_in, node.cw_out))
        for k, (cmac, (to_node, from_node)) in enumerate(zip(cmacs, ring)):
            rx = DomainRenamer({"cmac_rx": f"cmac{k}"})(CmacRxGlue(mtu))
            tx = DomainRenamer({"cmac_tx": f"cmac{k}"})(CmacTxGlue(mtu, src_mac=0x02_00_00_88_B5_00 | k))
            m.submodules[f"rx{k}"] = rx
            m.submodules[f"tx{k}"] = tx
            wiring.connect(m, cmac.rx, rx.cmac)
            wiring.connect(m, tx.cmac, cmac.tx)
            wiring.connect(m, rx.o, to_node)
            wiring.connect(m, from_node, tx.i)

        # Placeholder host port (no cage on this board; PCIe/QDMA to come): nothing in, all out dropped.
        m.d.comb += [node.host_rx.valid.eq(0), node.host_tx.ready.eq(1)]

        if on_board:
            node_beat = Signal(27)
            m.d.sync += node_beat.eq(node_beat + 1)
            for k, cmac in enumerate(cmacs):
                led = platform.request("qsfp_led", k, dir="-")
                for pin_name, value in (("stat_g", cmac.rx_aligned), ("stat_y", sys_reset),
                                        ("act", heartbeat[-1] if k == 0 else node_beat[-1])):
                    buf = io.Buffer("o", getattr(led, pin_name))
                    m.submodules[f"led{k}_{pin_name}"] = buf
                    m.d.comb += buf.o.eq(value)
            m.submodules.cattrip = cattrip = io.Buffer("o", platform.request("hbm_cattrip", 0, dir="-"))
            m.d.comb += cattrip.o.eq(0)
        return m


def top(**options) -> U55CTop:
    """The board's top-level elaboratable: :class:`U55CTop`.

    Options: ``mtu`` (bytes, default 9000), ``slots`` (default 8); ``width`` may be given but
    must be 512 (the CMAC's bus).

    Raises
    ------
    TypeError
        On an option this board does not know (the message lists the known ones).
    ValueError
        On a width other than 512, or a bad ``mtu`` / ``slots`` (from ``NodeConfig``).
    """
    known = {"mtu", "slots", "width"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"board {NAME!r} does not take option(s) {', '.join(unknown)}; "
                        f"it takes: {', '.join(sorted(known))}")
    width = options.pop("width", 512)
    if width != 512:
        raise ValueError(f"the U55C's CMAC user interface is 512 bits wide; width must be 512, not {width!r}")
    return U55CTop(**options)
