"""The U55C board top: one allreduce node on the two QSFP28 cages at 100 Gbit/s, through the
UltraScale+ integrated CMACs (platform: :mod:`wirereduce.boards.u55c`).

Ring wiring (one node per card, 512-bit datapath at 322.265625 MHz):

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

What the top adds to the build (:mod:`wirereduce.boards.common`): the Tcl of the two CMAC IPs
(``cmac_usplus_0.tcl``, ``cmac_usplus_1.tcl``, :func:`wirereduce.boards.cmac_ip.cmac_ip_tcl`,
receive limit for the top's MTU) and ``u55c_top.xdc`` (:attr:`U55CTop.constraints`).
"""

from __future__ import annotations

from amaranth import ClockDomain, ClockSignal, Elaboratable, Module, Signal
from amaranth.hdl import DomainRenamer
from amaranth.lib import io, wiring
from amaranth.lib.cdc import ResetSynchronizer
from wirereduce.boards.cmac_ip import cmac_ip_tcl
from wirereduce.boards.common import check_options
from wirereduce.boards.u55c import CMACS
from wirereduce.hdl.core.node import Node
from wirereduce.hdl.eth.port import port_counters
from wirereduce.hdl.xilinx.cmac import Cmac100G, CmacRxGlue, CmacTxGlue, cmac_port_stats

from wirereduce.config import NodeConfig

__all__ = ["U55CTop", "top", "CONSTRAINTS_FILE"]

#: The extra XDC file the top adds to the build.
CONSTRAINTS_FILE = "u55c_top.xdc"
#: Cycles of the 100 MHz clock the CMACs are held in reset after configuration (655 µs).
_POR_CYCLES = 1 << 16


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

    Attributes
    ----------
    node : Node
        The allreduce node (512-bit datapath).
    constraints : str
        What :data:`CONSTRAINTS_FILE` holds: the top's clocks asynchronous to each other, and no
        timing on the LED and CATTRIP outputs.
    ip_tcl : dict of str to str
        The IP Tcl files the top adds to the build: file name → Tcl generating that CMAC.
    """

    def __init__(self, mtu: int = 9000, slots: int = 8):
        self.config = NodeConfig(width=512, mtu=mtu, slots=slots)
        self.node = Node(self.config)

    @property
    def constraints(self) -> str:
        clock_groups = " ".join(
            f"-group [get_clocks -include_generated_clocks {clk}]"
            for clk in ("qsfp_0__refclk__p", "qsfp_1__refclk__p", "clk100_0__p"))
        return "\n".join([
            # Each CMAC's user clock derives from its own cage's reference clock; the node's
            # clock is CMAC 0's. All crossings go through AsyncFIFOs and FFSynchronizers.
            f"set_clock_groups -asynchronous {clock_groups}",
            "set_false_path -to [get_ports {qsfp_led_* hbm_cattrip_*}]",
        ])

    @property
    def ip_tcl(self) -> dict[str, str]:
        # 100 MHz init_clk, receive limit for the node's MTU
        return {f"{name}.tcl": cmac_ip_tcl(name, site, gts, mtu=self.config.mtu, init_clk_mhz=100.0)
                for name, site, gts in CMACS}

    def elaborate(self, platform):
        m = Module()
        mtu = self.config.mtu
        m.submodules.node = node = self.node

        on_board = platform is not None
        init_clk = Signal()
        if on_board:
            for filename, tcl in self.ip_tcl.items():
                platform.add_file(filename, tcl)
            platform.add_file(CONSTRAINTS_FILE, self.constraints)
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
        # Cut-through receive (a frame found bad at its FCS goes on marked `bad` and leaves the
        # next CMAC with tx_axis_tuser set, stomped), and the ports' counters in the node's STATS.
        stats = {}
        for k, (cmac, (to_node, from_node)) in enumerate(zip(cmacs, ring)):
            rx_glue = CmacRxGlue(mtu, cut_through=True)
            tx_glue = CmacTxGlue(mtu, src_mac=0x02_00_00_88_B5_00 | k)
            stats[("cw", "ccw")[k]] = cmac_port_stats(rx_glue, tx_glue)
            rx = DomainRenamer({"cmac_rx": f"cmac{k}"})(rx_glue)
            tx = DomainRenamer({"cmac_tx": f"cmac{k}"})(tx_glue)
            m.submodules[f"rx{k}"] = rx
            m.submodules[f"tx{k}"] = tx
            wiring.connect(m, cmac.rx, rx.cmac)
            wiring.connect(m, tx.cmac, cmac.tx)
            wiring.connect(m, rx.o, to_node)
            wiring.connect(m, from_node, tx.i)

        m.d.comb += node.port_counters.eq(port_counters(stats))

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
    check_options("u55c", options, {"mtu", "slots", "width"})
    width = options.pop("width", 512)
    if width != 512:
        raise ValueError(f"the U55C's CMAC user interface is 512 bits wide; width must be 512, not {width!r}")
    return U55CTop(**options)
