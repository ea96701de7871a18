"""The VC709 board top: the schedule engine with P = 2 network ports (a ring) and its host port on
three SFP+ cages at 10GBASE-R (platform: :mod:`wirereduce.boards.vc709`).

Cages (docs/boards.md "SFP+ cages" numbering, :data:`wirereduce.boards.vc709.SFP_PINS`):

====  =================================  ====================================  ===========================
cage  role                               engine ports                          Ethernet port
====  =================================  ====================================  ===========================
0     host link                          ``host_rx`` ← rx, tx ← ``host_tx``    store-and-forward, PAUSE,
                                                                               ``role="host"``
1     ring neighbour rank − 1            ``net0_in`` ← rx, tx ← ``net0_out``   cut-through, no role
2     ring neighbour rank + 1            ``net1_in`` ← rx, tx ← ``net1_out``   cut-through, no role
3     reserved: laser off (tx_disable),  GTH channel powered down
====  =================================  ====================================  ===========================

Ports 0 and 1 are the schedule's numbering of a ring (:func:`wirereduce.schedule.ring`: port 0 to
rank − 1, port 1 to rank + 1), so the cabling is the NTT ring's: cage 2 of rank k to cage 1 of rank
k + 1. The host loads the engine's table with SCHEDULE frames and runs any schedule of a ring
(``ring``, ``biring``, ``multitree``) over this link (:class:`wirereduce.host.rank.EngineRankDriver`
over :class:`~wirereduce.host.transports.packet.PacketTransport`); the host port takes CONTROL,
STATS_REQUEST and SCHEDULE from any source and locks to the CONTROL's sender (docs/protocol.md
"Source filter"). Until 2026-11-29 this top carried the ring-only node (``hdl/core/node.py``).

Clock domains:

- ``init``: 200 MHz system clock (IBUFDS + BUFG); the Si5324 programmer and the GTH reset sequencer.
- ``sync``: 156.25 MHz from an MMCM on the system clock (200 MHz × 25 / 4 = 1250 MHz VCO, / 8;
  MMCME2 VCO range 600-1440 MHz at -2, DS183); the engine and the core side of each Ethernet port.
- ``gt{n}_tx`` / ``gt{n}_rx`` for n = 0-3: 322.265625 MHz TXOUTCLK / RXOUTCLK of each GTH channel
  (:mod:`wirereduce.hdl.xilinx.gth`); the MAC and PCS of each port (:class:`~wirereduce.hdl.eth.port.EthPort10GCdc`,
  the board version of the single-clock port; frames cross to ``sync`` through asynchronous FIFOs).

Start-up: the CPU reset button (AV40) resets ``init`` and ``sync``. :class:`~wirereduce.boards.si5324.Si5324Init`
programs the Si5324 (docs/boards.md: mux 0x74 channel 7, 0x75 off, Si5324 at 0x68, ICAL); its ``done`` is
the GTH sequencer's ``refclk_ready``, so the QPLL and channels stay in reset until the reference
clock runs (with ``refclk="sma"`` the QPLL takes the SMA clock and does not wait).

LEDs (DS2 … DS9 = ``led`` 0-7): 0-2 link up of cages 0-2; 3 transceivers ready; 4 activity
(a frame in or out on any cage, stretched to ~50 ms); 5 error (Si5324 not acknowledging, a GTH
restart, or a high bit-error rate on a cage); 6 heartbeat of ``sync`` (~1.2 Hz); 7 Si5324 programmed.

What the top adds to the build (:mod:`wirereduce.boards.common`): ``vc709_top.xdc``
(:attr:`VC709Top.constraints`). The Si5324 needs no file: it is programmed by the gateware above.
"""

from __future__ import annotations

from amaranth import Cat, ClockDomain, ClockSignal, Const, Elaboratable, Instance, Module, Signal
from amaranth.hdl import DomainRenamer
from amaranth.lib import io, wiring
from amaranth.lib.cdc import FFSynchronizer, ResetSynchronizer
from wirereduce.boards.common import check_options
from wirereduce.hdl.core.engine import Engine
from wirereduce.hdl.params import rejecting
from wirereduce.hdl.xilinx.gth import GthQuad10G

from wirereduce.config import EngineConfig
from wirereduce.protocol import engine_ports

__all__ = ["VC709Top", "top", "INIT_HZ", "CORE_HZ", "CAGE_ROLES", "PORTS", "RESERVED_CAGE", "CONSTRAINTS_FILE"]

#: Frequency of the ``init`` domain (the system clock), Hz.
INIT_HZ = 200_000_000
#: Frequency of the ``sync`` domain (the engine), Hz: 200 MHz × 25 / 4 / 8.
CORE_HZ = 156_250_000
#: Cage → (engine input fed by the cage's receiver, engine output sent by the cage's transmitter).
CAGE_ROLES = {0: ("host_rx", "host_tx"), 1: ("net0_in", "net0_out"), 2: ("net1_in", "net1_out")}
#: Network ports of the engine (a ring: rank − 1 and rank + 1).
PORTS = 2
#: The cage that is not used (laser off, channel powered down).
RESERVED_CAGE = 3
#: The extra XDC file the top adds to the build.
CONSTRAINTS_FILE = "vc709_top.xdc"


class VC709Top(Elaboratable):
    """The VC709 top (see the module docstring for cages, clocks, start-up and LEDs).

    Parameters
    ----------
    mtu : int
        Largest wirereduce frame in bytes (default 1500; 9000 for jumbo frames): the engine's and the
        Ethernet ports' MTU.
    slots : int
        Buffer slots of the engine (power of two, default 8).
    refclk : str
        ``"si5324"`` (default): the QPLL runs from MGTREFCLK0_113 after the Si5324 is programmed;
        ``"sma"``: from MGTREFCLK1_113 (an external 156.25 MHz clock on J25/J26).

    Attributes
    ----------
    engine : Engine
        ``Engine(EngineConfig(64, mtu, slots, ports=2))``: the schedule engine (64-bit datapath).
    constraints : str
        What :data:`CONSTRAINTS_FILE` holds: asynchronous clock groups between the system, core and
        GT clocks.

    Raises
    ------
    ValueError
        On a bad ``mtu``/``slots`` (from :class:`~wirereduce.config.EngineConfig`) or ``refclk``.
    """

    def __init__(self, mtu: int = 1500, slots: int = 8, refclk: str = "si5324"):
        with rejecting(self):
            if refclk not in ("si5324", "sma"):
                raise ValueError(f"refclk must be 'si5324' (on-board, programmed over I2C) or 'sma', not {refclk!r}")
            self.config = EngineConfig(64, mtu, slots, ports=PORTS)
        self.mtu = mtu
        self.refclk = refclk
        self.engine = Engine(self.config)

    @property
    def constraints(self) -> str:
        gt = " ".join(f"gt{n}_{d}outclk" for n in range(4) for d in ("tx", "rx"))
        groups = [
            "-group [get_clocks clk200_0__p]",
            "-group [get_clocks -of_objects [get_nets core_clk_mmcm]]",
            *[f"-group [get_clocks -quiet {c}]" for c in gt.split()],
        ]
        # the MMCM output is a clock Vivado derives from clk200 (its own group here); the groups make
        # every crossing between these clocks asynchronous (the crossings are FFSynchronizers, ResetSynchronizers and
        # AsyncFIFOs, which Amaranth constrains itself)
        return "set_clock_groups -asynchronous \\\n    " + " \\\n    ".join(groups)

    def elaborate(self, platform):
        from wirereduce.hdl.eth.port import EthPort10GCdc, port_counters

        m = Module()
        platform.add_file(CONSTRAINTS_FILE, self.constraints)
        si, quad, sfp = board_infrastructure(m, platform, self.refclk)

        # --- engine and Ethernet ports -----------------------------------------------------------
        m.submodules.engine = engine = self.engine
        ports = {}
        stats = {}  # the ports' stats, by the engine port they serve: host, net0, net1
        for n, (to_engine, from_engine) in CAGE_ROLES.items():
            name = to_engine.removesuffix("_rx").removesuffix("_in")
            host = name == "host"
            # The host port: store-and-forward (a host frame reaches the engine whole, FCS checked),
            # the source filter of docs/protocol.md (role "host"), and IEEE 802.3x PAUSE to the host
            # NIC when its receive FIFO fills. The network ports as on the PCIe top: cut-through, no
            # PAUSE (the engine's receive queues cannot overflow with the driver's window ≤ slots,
            # docs/architecture.md), fixed addresses (a cable has one neighbour on it).
            port = EthPort10GCdc(self.mtu, cut_through=not host, role="host" if host else None, flow_control=host)
            ports[n] = port
            m.d.comb += [port.rank.eq(engine.rank), port.nodes.eq(0), port.control_taken.eq(engine.control_taken)]
            m.submodules[f"eth{n}"] = DomainRenamer({"gt_tx": f"gt{n}_tx", "gt_rx": f"gt{n}_rx"})(port)
            ch = quad.channels[n]
            m.d.comb += [ch.tx_data.eq(port.gt_tx_data), port.gt_rx_data.eq(ch.rx_data)]
            wiring.connect(m, port.rx, getattr(engine, to_engine))
            wiring.connect(m, getattr(engine, from_engine), port.tx)
            stats[name] = port.stats
        # the ports' MAC counters into the engine's STATS (link_drop_host, net0_rx_fcs_errors, …)
        m.d.comb += engine.port_counters.eq(port_counters(stats, engine_ports(PORTS)))
        m.d.comb += quad.channels[RESERVED_CAGE].tx_data.eq(0)

        for n, s in sfp.items():
            m.d.comb += s.tx_disable.o.eq(1 if n == RESERVED_CAGE else 0)

        # --- status LEDs -------------------------------------------------------------------------
        leds = [platform.request("led", k) for k in range(8)]
        gt_ready = Signal()
        si_done = Signal()
        si_error = Signal()
        restarted = Signal()
        m.submodules.sync_gt_ready = FFSynchronizer(quad.channels[0].tx_ready, gt_ready)
        m.submodules.sync_si_done = FFSynchronizer(si.done, si_done)
        m.submodules.sync_si_error = FFSynchronizer(si.error, si_error)
        m.submodules.sync_restarted = FFSynchronizer(quad.restarts != 0, restarted)

        activity = Signal()
        m.d.comb += activity.eq(Cat(*[(p.rx.valid & p.rx.ready) | (p.tx.valid & p.tx.ready)
                                      for p in ports.values()]).any())
        stretch = Signal(range(CORE_HZ // 20 + 1))   # ~50 ms
        with m.If(activity):
            m.d.sync += stretch.eq(CORE_HZ // 20)
        with m.Elif(stretch != 0):
            m.d.sync += stretch.eq(stretch - 1)
        heartbeat = Signal(27)
        m.d.sync += heartbeat.eq(heartbeat + 1)

        hi_ber = Signal()
        m.d.comb += hi_ber.eq(ports[0].hi_ber | ports[1].hi_ber | ports[2].hi_ber)
        led_values = [
            ports[0].link_up, ports[1].link_up, ports[2].link_up, gt_ready,
            stretch != 0, si_error | restarted | hi_ber, heartbeat[-1], si_done,
        ]
        for led, value in zip(leds, led_values):
            m.d.comb += led.o.eq(value)

        # --- unused I/O: buttons and status inputs are placed (for the pin check), UART idles high
        uart = platform.request("uart", 0)
        m.d.comb += uart.tx.o.eq(1)
        for k in range(5):
            platform.request("button", k)
        return m


def board_infrastructure(m: Module, platform, refclk: str, off_cages=(RESERVED_CAGE,)):
    """What every VC709 top builds around its gateware, into ``m``: the ``init`` (200 MHz system clock),
    ``sync`` (156.25 MHz MMCM) and ``gt{n}_tx``/``gt{n}_rx`` domains (n = 0-3), the CPU reset button,
    the Si5324 start-up over I2C and the GTH quad 113 at 10GBASE-R from ``refclk`` (``"si5324"`` or
    ``"sma"``), the channels of ``off_cages`` powered down; see :class:`VC709Top` (module docstring:
    clocks, start-up).

    Returns ``(si, quad, sfp)``: the :class:`~wirereduce.boards.si5324.Si5324Init` (``init``), the
    :class:`~wirereduce.hdl.xilinx.gth.GthQuad10G` (``init``), whose ``channels[n]`` the caller wires
    to cage n's port, and the requested ``sfp`` resources by cage (their ``tx_disable`` is the
    caller's to drive). Used by :class:`VC709Top` and
    :class:`wirereduce.boards.vc709_engine_top.VC709EngineTop`.
    """
    from wirereduce.boards.si5324 import Si5324Init

    m.domains += [ClockDomain("init"), ClockDomain("sync")]
    m.domains += [ClockDomain(f"gt{n}_{d}") for n in range(4) for d in ("tx", "rx")]

    # --- clocks and resets -------------------------------------------------------------
    clk200 = platform.request("clk200", 0, dir="-")
    clk200_ibuf = Signal()
    m.submodules.clk200_ibufds = Instance("IBUFDS", i_I=clk200.p, i_IB=clk200.n, o_O=clk200_ibuf)
    m.submodules.clk200_bufg = Instance("BUFG", i_I=clk200_ibuf, o_O=ClockSignal("init"))
    reset_btn = platform.request("rst", 0)
    m.submodules.init_rst = ResetSynchronizer(reset_btn.i, domain="init")

    core_clk_mmcm = Signal()
    mmcm_fb = Signal()
    mmcm_locked = Signal()
    m.submodules.core_mmcm = Instance(
        "MMCME2_BASE",
        p_BANDWIDTH="OPTIMIZED", p_CLKIN1_PERIOD=5.0, p_DIVCLK_DIVIDE=4, p_CLKFBOUT_MULT_F=25.0,
        p_CLKOUT0_DIVIDE_F=8.0, p_CLKOUT0_DUTY_CYCLE=0.5, p_CLKOUT0_PHASE=0.0, p_STARTUP_WAIT="FALSE",
        i_CLKIN1=clk200_ibuf, i_CLKFBIN=mmcm_fb, o_CLKFBOUT=mmcm_fb, i_RST=reset_btn.i,
        i_PWRDWN=Const(0, 1), o_CLKOUT0=core_clk_mmcm, o_LOCKED=mmcm_locked)
    m.submodules.core_bufg = Instance("BUFG", i_I=core_clk_mmcm, o_O=ClockSignal("sync"))
    m.submodules.sync_rst = ResetSynchronizer(~mmcm_locked | reset_btn.i, domain="sync")

    # --- Si5324 over I2C (open drain: the pin is driven low while *_oe is 1) -----------------
    i2c = platform.request("i2c", 0, dir={"scl": "-", "sda": "-"})
    mux_rst_n = platform.request("i2c_mux_rst_n", 0, dir="-")
    si_pins = platform.request("si5324", 0, dir={"rst_n": "-", "int": "-"})
    m.submodules.si5324 = si = DomainRenamer("init")(Si5324Init(INIT_HZ))
    for name in ("scl", "sda"):
        m.submodules[f"i2c_{name}"] = buf = io.Buffer("io", getattr(i2c, name))
        m.d.comb += [buf.o.eq(0), buf.oe.eq(getattr(si, f"{name}_oe")), getattr(si, f"{name}_i").eq(buf.i)]
    m.submodules.i2c_mux_rst = mux_rst = io.Buffer("o", mux_rst_n)
    m.submodules.si5324_rst = si_rst = io.Buffer("o", si_pins.rst_n)
    m.d.comb += [mux_rst.o.eq(si.mux_rst_n), si_rst.o.eq(si.si5324_rst_n)]

    # --- transceivers ----------------------------------------------------------------------
    sfp = {n: platform.request("sfp", n, dir={"tx": "-", "rx": "-"}) for n in range(4)}
    sfp_refclk = platform.request("sfp_refclk", 0, dir="-")
    sma_refclk = platform.request("sma_refclk", 0, dir="-")
    lanes = {n: (s.tx.p, s.tx.n, s.rx.p, s.rx.n) + (("off",) if n in off_cages else ())
             for n, s in sfp.items()}
    quad = GthQuad10G(INIT_HZ, sfp_refclk, sma_refclk, lanes=lanes, use_refclk1=refclk == "sma",
                      domains=False)
    m.submodules.gth = DomainRenamer("init")(quad)
    m.d.comb += quad.refclk_ready.eq(Const(1, 1) if refclk == "sma" else si.done)
    return si, quad, sfp


def top(**options):
    """The board's top-level elaboratable: :class:`VC709Top` (``host="sfp"``, the default: the engine with
    two ring ports and the host on SFP+ cage 0) or, with
    ``host="pcie"``, :class:`wirereduce.boards.vc709_engine_top.VC709EngineTop` (the schedule engine
    with four network ports on cages 0-3 and the host over PCIe Gen3 x8).

    Options: ``host`` (``"sfp"`` or ``"pcie"``), ``mtu`` (bytes, default 1500), ``slots`` (default 8),
    ``refclk`` (``"si5324"``, default, or ``"sma"``); with ``host="pcie"`` also ``width`` (the engine's
    datapath: 256 bits, the default, for a 40 Gbit/s host port; 128; or 64).

    Raises
    ------
    TypeError
        On an option this board does not know (the message lists the known ones).
    ValueError
        On a bad ``host``, ``mtu`` / ``slots`` (from ``NodeConfig`` / ``EngineConfig``), ``refclk`` or
        ``width`` (or ``width`` without ``host="pcie"``: the SFP top's engine is 64 bit, its host on a cage).
    """
    check_options("vc709", options, {"mtu", "slots", "refclk", "host", "width"})
    host = options.pop("host", "sfp")
    if "width" in options and host != "pcie":
        raise ValueError("width is the PCIe top's engine width (host='pcie'); the SFP top's engine is 64 bit, "
                         "as fast as its host link on cage 0")
    if host == "pcie":
        from wirereduce.boards.vc709_engine_top import VC709EngineTop

        return VC709EngineTop(**options)
    if host != "sfp":
        raise ValueError(f"host must be 'sfp' (SFP+ cage 0 at 10GBASE-R) or 'pcie' (PCIe Gen3 x8), not {host!r}")
    return VC709Top(**options)
