"""The VC709 engine top: the schedule engine with P = 4 network ports on the four SFP+ cages at
10GBASE-R and the host over PCIe Gen3 x8 (platform: :mod:`wirereduce.boards.vc709`; built with
``make bitstream BOARD=vc709 HOST=pcie``, i.e. ``top(host="pcie")`` of :mod:`wirereduce.boards.vc709_top`).

Sixteen VC709s cable a 4×4 torus: cage p of every board is the engine's network port p (the
schedule's port numbering, :class:`wirereduce.schedule.Topology`), so the cabling follows the
topology's port map.

====  ========================  ========================================
cage  engine port               Ethernet port
====  ========================  ========================================
0-3   ``net{p}_in`` ← upsizer   ``EthPort10GCdc(cut_through=True)``, no
      ← rx, tx ← downsizer ←    role (fixed addresses, no source filter),
      ``net{p}_out``            64 bit
PCIe  ``host_rx`` ← H2C,        :class:`~wirereduce.hdl.xilinx.pcie.XdmaHostGlue` on the XDMA
      C2H ← ``host_tx``         (:class:`~wirereduce.hdl.xilinx.pcie.Xdma`, ``xdma_0``), 256 bit
====  ========================  ========================================

**The host link is faster than a network port.** The engine's datapath is 256 bit wide at
156.25 MHz (``width``, default 256): 40 Gbit/s through its host port, four cages' worth, where a
64-bit engine would cap the host at a cage's 10 Gbit/s and with it every schedule at the NTT
ring's time (docs/architecture.md "Host link"). The XDMA's streams are 256 bit, so the host glue is
a plain clock crossing; each cage's 64-bit Ethernet port reaches the engine through a
:class:`~wirereduce.hdl.stream.widthconv.StreamUpsizer` (rx: four beats into one, cut-through, a
cycle of register) and a :class:`~wirereduce.hdl.stream.widthconv.StreamDownsizer` (tx: one beat
into four; the port's transmit crossing is store and forward, so the MAC never underruns).
A network frame then fills a quarter of the engine's beats, as in the simulated networks at
``width=256`` (:func:`wirereduce.sim.cluster.network.clock_mhz`).

Clock domains: those of :func:`wirereduce.boards.vc709_top.board_infrastructure` (``init`` 200 MHz,
``sync`` 156.25 MHz: the engine and the core side of the Ethernet ports, ``gt{n}_tx``/``gt{n}_rx``
322.265625 MHz) plus ``pcie``: the XDMA's ``axi_aclk`` (250 MHz, derived by the PCIe block's PIPE
clocking from the 100 MHz slot reference clock AB8/AB7 through an ``IBUFDS_GTE2``), reset by
``~axi_aresetn``. The two DMA streams cross between ``pcie`` and ``sync`` through the glue's
``AsyncFIFO``\\ s. PERST# (AV35) is the XDMA's ``sys_rst_n``.

LEDs (DS2 … DS9 = ``led`` 0-7): 0-3 link up of cages 0-3; 4 PCIe link up (``user_lnk_up``);
5 error (Si5324 not acknowledging, a GTH restart, or a high bit-error rate on a cage); 6 heartbeat
of ``sync`` (~1.2 Hz); 7 activity (a frame in or out on any cage or the host link, ~50 ms).

What the top adds to the build: ``vc709_engine_top.xdc`` (asynchronous clock groups, now with
``pcie``) and ``xdma_0.tcl`` (the IP, :func:`wirereduce.boards.xdma_ip.xdma_ip_tcl`), sourced
before synthesis. Not built with Vivado and not run on a board (docs/boards.md "PCIe host link").
"""

from __future__ import annotations

from amaranth import Cat, ClockDomain, ClockSignal, Elaboratable, Instance, Module, Signal
from amaranth.hdl import DomainRenamer
from amaranth.lib import io, wiring
from amaranth.lib.cdc import FFSynchronizer, ResetSynchronizer
from wirereduce.boards.vc709_top import CORE_HZ, board_infrastructure
from wirereduce.boards.xdma_ip import xdma_ip_tcl
from wirereduce.hdl.core.engine import Engine
from wirereduce.hdl.params import rejecting
from wirereduce.hdl.stream.widthconv import StreamDownsizer, StreamUpsizer
from wirereduce.hdl.xilinx.pcie import XDMA_WIDTH, Xdma, XdmaHostGlue

from wirereduce.config import EngineConfig
from wirereduce.protocol import engine_ports

__all__ = ["VC709EngineTop", "PORTS", "WIDTH", "XDMA_IP", "CONSTRAINTS_FILE"]

#: Network ports of the engine: one per SFP+ cage.
PORTS = 4
#: The engine's datapath width in bits: a 40 Gbit/s host port at 156.25 MHz (the XDMA's stream width).
WIDTH = 256
#: Module name of the XDMA IP.
XDMA_IP = "xdma_0"
#: The extra XDC file the top adds to the build.
CONSTRAINTS_FILE = "vc709_engine_top.xdc"


class VC709EngineTop(Elaboratable):
    """The VC709 engine top (see the module docstring for ports, clocks and LEDs).

    Parameters
    ----------
    mtu : int
        Largest wirereduce frame in bytes (default 1500): the engine's and the Ethernet ports' MTU.
    width : int
        The engine's datapath width in bits: 256 (default; a 40 Gbit/s host port at 156.25 MHz),
        128 (20 Gbit/s) or 64 (10 Gbit/s, the host capped at a cage's rate; no converters).
    slots : int
        Buffer slots of the engine (power of two, default 8).
    refclk : str
        ``"si5324"`` (default) or ``"sma"``: the reference clock of the SFP+ transceivers, as
        :class:`~wirereduce.boards.vc709_top.VC709Top`.

    Attributes
    ----------
    engine : Engine
        ``Engine(EngineConfig(width, mtu, slots, ports=4))``.
    net_upsizers, net_downsizers : list of StreamUpsizer, list of StreamDownsizer
        Cage ``p``'s 64-bit Ethernet port to the engine's ``width`` (``net{p}_up``: four beats into
        one at 256 bit, received frames) and back (``net{p}_down``: frames sent); the top's
        submodules.
    host_glue : XdmaHostGlue
        The XDMA's AXI4-Stream channels to the engine's host port (``width`` bits both sides).
    constraints : str
        What :data:`CONSTRAINTS_FILE` holds.
    ip_tcl : dict of str to str
        The ``.tcl`` extra files (``xdma_0.tcl``).

    Raises
    ------
    ValueError
        On a bad ``mtu``/``slots`` (from :class:`~wirereduce.config.EngineConfig`), ``width`` or ``refclk``.
    """

    def __init__(self, mtu: int = 1500, slots: int = 8, refclk: str = "si5324", width: int = WIDTH):
        with rejecting(self):
            if refclk not in ("si5324", "sma"):
                raise ValueError(f"refclk must be 'si5324' (on-board, programmed over I2C) or 'sma', not {refclk!r}")
            if width not in (64, 128, 256):
                raise ValueError(f"width must be 64, 128 or 256 bits (the cages' 64-bit ports up to the XDMA's "
                                 f"{XDMA_WIDTH}-bit streams), not {width!r}")
            self.config = EngineConfig(width, mtu, slots, ports=PORTS)
        self.mtu = mtu
        self.refclk = refclk
        self.engine = Engine(self.config)
        self.net_upsizers = [StreamUpsizer(width, 64) for _ in range(PORTS)]
        self.net_downsizers = [StreamDownsizer(width, 64) for _ in range(PORTS)]
        self.host_glue = XdmaHostGlue(width=width)

    @property
    def constraints(self) -> str:
        gt = [f"gt{n}_{d}outclk" for n in range(4) for d in ("tx", "rx")]
        groups = [
            "-group [get_clocks clk200_0__p]",
            "-group [get_clocks -of_objects [get_nets core_clk_mmcm]]",
            *[f"-group [get_clocks -quiet {c}]" for c in gt],
            # axi_aclk: generated inside the XDMA from its PIPE clock (the IP's own XDC creates it)
            "-group [get_clocks -of_objects [get_nets pcie_aclk]]",
        ]
        return "set_clock_groups -asynchronous \\\n    " + " \\\n    ".join(groups)

    @property
    def ip_tcl(self) -> dict[str, str]:
        return {f"{XDMA_IP}.tcl": xdma_ip_tcl(XDMA_IP)}

    def elaborate(self, platform):
        from wirereduce.hdl.eth.port import EthPort10GCdc, port_counters

        m = Module()
        for name, tcl in self.ip_tcl.items():
            platform.add_file(name, tcl)
        platform.add_file(CONSTRAINTS_FILE, self.constraints)
        si, quad, sfp = board_infrastructure(m, platform, self.refclk, off_cages=())

        # --- engine and network ports: cage p = net{p} ------------------------------------------
        m.submodules.engine = engine = self.engine
        ports = {}
        for n in range(PORTS):
            # Cut-through like the ring ports; no PAUSE: the engine's receive queues cannot overflow
            # with the driver's window ≤ slots (EngineConfig, docs/architecture.md).
            port = EthPort10GCdc(self.mtu, cut_through=True)
            ports[n] = port
            m.d.comb += [port.rank.eq(engine.rank), port.nodes.eq(0), port.control_taken.eq(engine.control_taken)]
            m.submodules[f"eth{n}"] = DomainRenamer({"gt_tx": f"gt{n}_tx", "gt_rx": f"gt{n}_rx"})(port)
            ch = quad.channels[n]
            m.d.comb += [ch.tx_data.eq(port.gt_tx_data), port.gt_rx_data.eq(ch.rx_data)]
            # the 64-bit port to the engine's width: four beats into one on the way in, one into four
            # on the way out (wires at width 64)
            up = m.submodules[f"net{n}_up"] = self.net_upsizers[n]
            down = m.submodules[f"net{n}_down"] = self.net_downsizers[n]
            wiring.connect(m, port.rx, up.i)
            wiring.connect(m, up.o, getattr(engine, f"net{n}_in"))
            wiring.connect(m, getattr(engine, f"net{n}_out"), down.i)
            wiring.connect(m, down.o, port.tx)
            m.d.comb += sfp[n].tx_disable.o.eq(0)
        # the ports' MAC counters into the engine's STATS (link_drop_net{p}, net{p}_rx_fcs_errors, …)
        m.d.comb += engine.port_counters.eq(port_counters({f"net{n}": port.stats for n, port in ports.items()},
                                                          engine_ports(self.config.ports)))

        # --- PCIe: XDMA and the host port glue ------------------------------------------------------
        m.domains += ClockDomain("pcie")
        pcie = platform.request("pcie_x8", 0, dir={"rx": "-", "tx": "-", "perst_n": "-"})
        pcie_refclk = platform.request("pcie_refclk", 0, dir="-")
        sys_clk = Signal()
        m.submodules.pcie_refclk_ibuf = Instance("IBUFDS_GTE2", i_I=pcie_refclk.p, i_IB=pcie_refclk.n,
                                                 i_CEB=0, o_O=sys_clk)
        m.submodules.perst = perst = io.Buffer("i", pcie.perst_n)
        m.submodules.xdma = xdma = Xdma(XDMA_IP, pcie)
        pcie_aclk = Signal()
        m.d.comb += [xdma.sys_clk.eq(sys_clk), xdma.sys_rst_n.eq(perst.i), pcie_aclk.eq(xdma.aclk),
                     ClockSignal("pcie").eq(pcie_aclk)]
        m.submodules.pcie_rst = ResetSynchronizer(~xdma.aresetn, domain="pcie")
        m.submodules.host = glue = self.host_glue
        wiring.connect(m, xdma.h2c, glue.h2c)
        wiring.connect(m, glue.c2h, xdma.c2h)
        wiring.connect(m, glue.host_rx, engine.host_rx)
        wiring.connect(m, engine.host_tx, glue.host_tx)

        # --- status LEDs -------------------------------------------------------------------------
        leds = [platform.request("led", k) for k in range(8)]
        si_error = Signal()
        restarted = Signal()
        link_up = Signal()
        m.submodules.sync_si_error = FFSynchronizer(si.error, si_error)
        m.submodules.sync_restarted = FFSynchronizer(quad.restarts != 0, restarted)
        m.submodules.sync_link_up = FFSynchronizer(xdma.link_up, link_up)
        streams = [s for p in ports.values() for s in (p.rx, p.tx)] + [glue.host_rx, glue.host_tx]
        activity = Signal()
        m.d.comb += activity.eq(Cat(*[s.valid & s.ready for s in streams]).any())
        stretch = Signal(range(CORE_HZ // 20 + 1))   # ~50 ms
        with m.If(activity):
            m.d.sync += stretch.eq(CORE_HZ // 20)
        with m.Elif(stretch != 0):
            m.d.sync += stretch.eq(stretch - 1)
        heartbeat = Signal(27)
        m.d.sync += heartbeat.eq(heartbeat + 1)
        hi_ber = Cat(*[p.hi_ber for p in ports.values()]).any()
        led_values = [*[p.link_up for p in ports.values()], link_up, si_error | restarted | hi_ber,
                      heartbeat[-1], stretch != 0]
        for led, value in zip(leds, led_values):
            m.d.comb += led.o.eq(value)

        uart = platform.request("uart", 0)
        m.d.comb += uart.tx.o.eq(1)
        for k in range(5):
            platform.request("button", k)
        return m
