"""The U55C board top: the schedule engine with P = 2 network ports (a ring) on the two QSFP28
cages at 100 Gbit/s, through the UltraScale+ integrated CMACs (platform: :mod:`wirereduce.boards.u55c`).

Ring wiring (one engine per card, 512-bit datapath at 322.265625 MHz; ports 0 and 1 are the
schedule's numbering of a ring, :func:`wirereduce.schedule.ring`: port 0 to rank − 1, port 1 to rank + 1):

======  ===============  ==================================  ================================
cage    neighbour        engine ports                        CMAC (site, GTY channels)
======  ===============  ==================================  ================================
QSFP0   rank - 1         ``net0_in`` ← RX, ``net0_out`` → TX  ``cmac_usplus_0`` CMACE4_X0Y3, X0Y24–27 (quad 130)
QSFP1   rank + 1         ``net1_in`` ← RX, ``net1_out`` → TX  ``cmac_usplus_1`` CMACE4_X0Y4, X0Y28–31 (quad 131)
======  ===============  ==================================  ================================

So cable QSFP1 of rank k to QSFP0 of rank k+1, and QSFP1 of the last rank to QSFP0 of rank 0.
Until 2026-11-29 this top carried the ring-only node (``hdl/core/node.py``), with the same cabling.

**The host port has no cage on this board.** A U55C talks to its host over PCIe (QDMA), which
is out of scope for now: the engine's ``host_rx`` is tied idle and ``host_tx`` always ready (its
frames are discarded). Until a PCIe host link exists, nothing can load the engine's table or send
the CONTROL frame that sets its rank, so this top builds, places and brings the 100G links up, but
cannot run an allreduce by itself.

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
from wirereduce.hdl.core.engine import Engine
from wirereduce.hdl.eth.port import port_counters
from wirereduce.hdl.xilinx.cmac import Cmac100G, CmacRxGlue, CmacTxGlue, cmac_port_stats

from wirereduce.config import EngineConfig
from wirereduce.protocol import engine_ports

__all__ = ["U55CTop", "top", "CONSTRAINTS_FILE"]

#: Network ports of the engine (a ring: QSFP0 to rank − 1, QSFP1 to rank + 1).
PORTS = 2
#: The extra XDC file the top adds to the build.
CONSTRAINTS_FILE = "u55c_top.xdc"
#: Cycles of the 100 MHz clock the CMACs are held in reset after configuration (655 µs).
_POR_CYCLES = 1 << 16


class U55CTop(Elaboratable):
    """One schedule engine on the U55C, its two network ports on the two QSFP28 cages (module docstring).

    Clock domains: ``sync`` (the engine) and ``cmac0`` run on CMAC 0's ``gt_txusrclk2``
    (322.265625 MHz, as the OpenNIC shell runs its 322 MHz user box on the CMAC clock); ``cmac1``
    on CMAC 1's; ``init`` on the 100 MHz system clock, which also drives the CMACs' ``init_clk``
    and a power-on reset that holds them in ``sys_reset`` for 655 µs. ``sync`` and ``cmacN`` are
    reset by the CMACs' user resets.

    LEDs per cage: ``stat_g`` link up (``stat_rx_aligned``), ``stat_y`` CMAC in reset,
    ``act`` a 1.5 Hz heartbeat of the 100 MHz clock (0) / of the engine clock (1).

    Parameters
    ----------
    mtu, slots : int
        As :class:`~wirereduce.config.EngineConfig` (width is 512, ports 2).

    Attributes
    ----------
    engine : Engine
        ``Engine(EngineConfig(512, mtu, slots, ports=2))``: the schedule engine (512-bit datapath).
    constraints : str
        What :data:`CONSTRAINTS_FILE` holds: the top's clocks asynchronous to each other, and no
        timing on the LED and CATTRIP outputs.
    ip_tcl : dict of str to str
        The IP Tcl files the top adds to the build: file name → Tcl generating that CMAC.
    """

    def __init__(self, mtu: int = 9000, slots: int = 8):
        self.config = EngineConfig(width=512, mtu=mtu, slots=slots, ports=PORTS)
        self.engine = Engine(self.config)

    @property
    def constraints(self) -> str:
        clock_groups = " ".join(
            f"-group [get_clocks -include_generated_clocks {clk}]"
            for clk in ("qsfp_0__refclk__p", "qsfp_1__refclk__p", "clk100_0__p"))
        return "\n".join([
            # Each CMAC's user clock derives from its own cage's reference clock; the engine's
            # clock is CMAC 0's. All crossings go through AsyncFIFOs and FFSynchronizers.
            f"set_clock_groups -asynchronous {clock_groups}",
            "set_false_path -to [get_ports {qsfp_led_* hbm_cattrip_*}]",
        ])

    @property
    def ip_tcl(self) -> dict[str, str]:
        # 100 MHz init_clk, receive limit for the engine's MTU
        return {f"{name}.tcl": cmac_ip_tcl(name, site, gts, mtu=self.config.mtu, init_clk_mhz=100.0)
                for name, site, gts in CMACS}

    def elaborate(self, platform):
        m = Module()
        mtu = self.config.mtu
        m.submodules.engine = engine = self.engine

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

        # QSFP k is the engine's network port k: QSFP0 faces rank - 1, QSFP1 rank + 1.
        # Cut-through receive (a frame found bad at its FCS goes on marked `bad` and leaves the
        # next CMAC with tx_axis_tuser set, stomped), and the ports' counters in the engine's STATS.
        stats = {}
        for k, cmac in enumerate(cmacs):
            to_node, from_node = getattr(engine, f"net{k}_in"), getattr(engine, f"net{k}_out")
            rx_glue = CmacRxGlue(mtu, cut_through=True)
            tx_glue = CmacTxGlue(mtu, src_mac=0x02_00_00_88_B5_00 | k)
            stats[f"net{k}"] = cmac_port_stats(rx_glue, tx_glue)
            rx = DomainRenamer({"cmac_rx": f"cmac{k}"})(rx_glue)
            tx = DomainRenamer({"cmac_tx": f"cmac{k}"})(tx_glue)
            m.submodules[f"rx{k}"] = rx
            m.submodules[f"tx{k}"] = tx
            wiring.connect(m, cmac.rx, rx.cmac)
            wiring.connect(m, tx.cmac, cmac.tx)
            wiring.connect(m, rx.o, to_node)
            wiring.connect(m, from_node, tx.i)

        m.d.comb += engine.port_counters.eq(port_counters(stats, engine_ports(PORTS)))

        # Placeholder host port (no cage on this board; PCIe/QDMA to come): nothing in, all out dropped.
        m.d.comb += [engine.host_rx.valid.eq(0), engine.host_tx.ready.eq(1)]

        if on_board:
            engine_beat = Signal(27)
            m.d.sync += engine_beat.eq(engine_beat + 1)
            for k, cmac in enumerate(cmacs):
                led = platform.request("qsfp_led", k, dir="-")
                for pin_name, value in (("stat_g", cmac.rx_aligned), ("stat_y", sys_reset),
                                        ("act", heartbeat[-1] if k == 0 else engine_beat[-1])):
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
        On a width other than 512, or a bad ``mtu`` / ``slots`` (from ``EngineConfig``).
    """
    check_options("u55c", options, {"mtu", "slots", "width"})
    width = options.pop("width", 512)
    if width != 512:
        raise ValueError(f"the U55C's CMAC user interface is 512 bits wide; width must be 512, not {width!r}")
    return U55CTop(**options)
