"""Simulated networks of schedule engines on any topology (ring, torus, mesh, hypercube).

:class:`ScheduleNetwork` cables :class:`~wirereduce.hdl.core.engine.Engine` s: one engine per node of a
:class:`~wirereduce.schedule.Topology`, every directed cable a
:class:`~wirereduce.sim.cluster.network.LinkModel`, and every host port behind a link model of its
own, whose rate may differ from the network's (the host link: a 10G NIC, or PCIe Gen3 x8 modelled
at 50 Gbit/s, docs/architecture.md "Host link"). Its flat host ports ``host{k}_rx_*``/``host{k}_tx_*``
(:func:`~wirereduce.sim.cluster.network.host_wires`) are what the cocotb transport and the
Verilator frame player drive.
"""

from __future__ import annotations

import random
from fractions import Fraction

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.core.engine import Engine
from wirereduce.hdl.params import rejecting
from wirereduce.sim.cluster.box import Boxes
from wirereduce.sim.cluster.network import (
    ETH_MAC_PREFIX,
    LinkModel,
    bytes_per_cycle,
    check_links,
    clock_mhz,
    cmac_cable,
    delayed,
    drive_injection,
    eth_cable,
    eth_mac,
    eth_port,
    flip_line,
    host_wires,
    injectable_members,
    injection_members,
    line_bytes_per_cycle,
    line_rate_gbps,
    wire_injectable,
)

from wirereduce.config import EngineConfig
from wirereduce.protocol import engine_ports
from wirereduce.schedule import Topology, parse_topology

__all__ = ["ScheduleNetwork", "InjectableEngine", "schednet_verilog", "link_latencies", "engine_rates"]

#: Beats an engine's Ethernet port buffers before it starts a frame on the wire
#: (:class:`~wirereduce.hdl.eth.port.TxStartBuffer`): a multicast feeds its ports in lock-step, and
#: a port whose MAC is still ending its last frame (FCS, inter-frame gap) holds the others back by a
#: few cycles at a frame's start; a frame that has started on an Ethernet wire cannot wait.
ETH_TX_START = 8

#: Verilog module name of the engine in a boxed :class:`ScheduleNetwork` (its ``Boxes`` kind "engine").
ENGINE_MODULE = "wirereduce_engine"
#: Address indices (:func:`~wirereduce.sim.cluster.network.eth_mac`) of an engine's host port with
#: ``host_links="eth"`` (its :func:`~wirereduce.hdl.eth.port.role_mac` once CONTROL makes node u rank u)
#: and of the host's NIC.
HOST_PORT = 2
NIC_PORT = 0xFE


def link_latencies(topology: Topology, latency: int, jitter: int = 0, seed: int = 0) -> dict[tuple[int, int], int]:
    """Latency in cycles of every directed link ``(node, port)``: ``latency`` plus a random 0 … ``jitter``."""
    rng = random.Random(seed)
    # without jitter the latency itself, so the caller's check sees what was given (True + 0 would be 1)
    return {lk: latency + rng.randint(0, jitter) if jitter else latency for lk in topology.directed_links()}


class InjectableEngine(wiring.Component):
    """An :class:`~wirereduce.hdl.core.engine.Engine` whose network inputs also take frames from
    injection ports ``inj{p}`` (p = 0 … P-1), merged a whole frame at a time with what the cable
    delivers (:class:`~wirereduce.hdl.stream.frame.FrameArbiter`), in front of everything the
    engine does with a frame (its codec stage, its gate): the fuzz suite's hook for hostile
    frames on a network port (:mod:`wirereduce.sim.fuzz`). Every other member is the engine's own.
    Simulation only.
    """

    def __init__(self, config: EngineConfig):
        self.config = config
        self._engine = Engine(config)
        self._ports = {f"net{p}_in": f"inj{p}" for p in range(config.ports)}
        super().__init__(injectable_members(self._engine, self._ports, config.width))

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine = engine = self._engine
        wire_injectable(m, self, engine, self._ports, self.config.width)
        return m


class ScheduleNetwork(wiring.Component):
    """One :class:`~wirereduce.hdl.core.engine.Engine` per node of ``topology``, cabled as it says.

    Parameters
    ----------
    topology : Topology or str
        ``"ring:4"``, ``"torus:4x4"``, … (:func:`wirereduce.schedule.parse_topology`).
    config : EngineConfig
        Every engine's build; ``config.ports`` must be at least the topology's degree (ports
        beyond a node's degree are left idle).
    link_latency : int or dict
        Cycles of every cable, or ``{(node, port): cycles}`` per directed link
        (:func:`link_latencies`).
    link_rate, host_rate : Fraction, optional
        Wire bytes per cycle of the network cables and of the host links; default the width's line
        rate (:func:`~wirereduce.sim.cluster.network.line_bytes_per_cycle`). A host link faster than
        the network's is what lets tree schedules beat the ring.
    links : str
        ``"model"`` (default): every cable a :class:`~wirereduce.sim.cluster.network.LinkModel`.
        ``"eth"``: real 10G Ethernet, 64 bit only: every cabled network port of every engine is an
        :class:`~wirereduce.hdl.eth.port.EthPort10G` (Ethernet II framing, MAC with FCS, 10GBASE-R
        PCS, cut-through receive: a frame found bad at its FCS is passed on marked ``bad`` and sent
        on with a stomped FCS), addressed ``eth_mac(node, port)``, and every cable carries one
        scrambled 66-bit block a cycle each way, delayed by the link's latency. The MAC and PCS run
        at the datapath clock, so the cables are 10G only at 156.25 MHz: ``link_rate`` must be the
        line rate and ``host_rate`` at most that. Host links stay link models. Each port starts a
        frame on the wire once :data:`ETH_TX_START` beats of it are in (a multicast's ports run in
        lock-step); a multicast source that also delivers to its host starts only with room for the
        whole frame in its host FIFO (:class:`~wirereduce.hdl.core.engine.PacketFifo` ``room``), so no
        engine output pauses in the middle of a frame. Every engine's ``port_counters`` (its STATS
        ``link_drop_net{p}``, ``net{p}_rx_fcs_errors`` …) come from its ports. Fault injection:
        inputs ``flip_link`` (16 bit) and ``flip_block`` (32 bit); the cable out of port ``p`` of
        node ``u``, ``flip_link = u · config.ports + p``, inverts a bit of its ``flip_block``-th data
        block (or, bit 31 set, of the wirereduce header of its ``flip_block & 0x7FFFFFFF``-th frame;
        :func:`~wirereduce.sim.cluster.network.flip_line`); ``flip_block = 0``: never. A capture
        tap, outputs ``tap_t{data,keep,last,valid}``: the Ethernet frames (no FCS) node 0 sends out
        of its network port 0, one 64-bit beat a cycle ``tap_tvalid`` is high (the frame player's
        pcap, ``FastEngineSim.allreduce(pcap=…)``).
        ``"cmac"``: the 100G CMAC glue of the U55C top at every cabled network port, 512 bit only
        (:func:`cmac_engine_links`: ``CmacTxGlue`` → ``CmacCable`` at ``link_rate`` →
        ``CmacRxGlue``, cut-through); host links stay link models. Fault injection as with
        ``"eth"``, ``flip_block`` counting the cable's 512-bit beats (bit 31 unused): the beat's
        frame arrives as one with a bad FCS (:class:`~wirereduce.sim.cluster.network.CmacCable`).
    host_links : str
        ``"model"`` (default): each host link a link model at ``host_rate``. ``"eth"`` (with
        ``links="eth"`` and a host link at the line rate): each host reaches its engine over 10G
        Ethernet as on the VC709 SFP top (``boards/vc709_top.py``): a NIC port with fixed addresses
        (``eth_mac(node, NIC_PORT)``, PAUSE, a frame sent only once all of it is in, as a NIC's
        DMA does) cabled to the engine's host port, an ``EthPort10G`` with
        ``role="host"`` (store and forward, PAUSE; the source filter of docs/protocol.md: CONTROL,
        STATS_REQUEST and SCHEDULE from anyone, everything else only from the sender of the CONTROL
        the engine took; its own address :func:`~wirereduce.hdl.eth.port.role_mac` of the engine's
        rank), its counters in the engine's STATS (``host_*``, ``link_drop_host``).
    boxed : bool
        The Verilog path's network (:func:`schednet_verilog`): every engine and every Ethernet port a
        :class:`~wirereduce.sim.cluster.box.Box` of its design, collected in ``boxes`` as the network
        elaborates, so that identical ones are converted once (conversion time). Default
        False: the components themselves, for simulating in Python.
    inject : bool
        Give every engine injection ports (:class:`InjectableEngine`), flat on the top as
        ``inj{u}_{p}_t{data,keep,last,valid,ready,user}`` (``tuser`` = ``bad``) for every cabled
        network port p of node u: frames put there enter the engine's ``net{p}_in`` as if the
        cable had delivered them (the fuzz suite, :mod:`wirereduce.sim.fuzz`).

    Raises
    ------
    ValueError
        A topology node with more ports than the engines have, a bad latency or rate, ``links``
        not "model", "eth" or "cmac", "eth" at a width other than 64 bit or with a host link faster
        than the network's, "cmac" at a width other than 512 bit; ``host_links`` not "model" or "eth", or "eth"
        without ``links="eth"`` or with a host link slower than the line rate.
    """

    def __init__(self, topology: Topology | str, config: EngineConfig | None = None,
                 link_latency: int | dict = 4, link_rate: Fraction | int | None = None,
                 host_rate: Fraction | int | None = None, boxed: bool = False, links: str = "model",
                 host_links: str = "model", inject: bool = False):
        self.boxed = bool(boxed)
        self.inject = bool(inject)
        self.boxes = Boxes() if self.boxed else None
        with rejecting(self):
            self.topology = parse_topology(topology)
            self.config = config if config is not None else EngineConfig(ports=self.topology.degree)
            if not isinstance(self.config, EngineConfig):
                raise TypeError(f"config must be an EngineConfig, not {self.config!r}")
            if self.topology.degree > self.config.ports:
                raise ValueError(f"{self.topology.name} has nodes with {self.topology.degree} ports; the engines "
                                 f"have {self.config.ports}: build them with ports ≥ {self.topology.degree}")
            if self.topology.nodes > 255:
                raise ValueError(f"at most 255 nodes, not {self.topology.nodes}")
            w = self.config.width
            if isinstance(link_latency, dict):
                self.latencies = dict(link_latency)
            else:
                self.latencies = link_latencies(self.topology, link_latency)
            if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in self.latencies.values()):
                raise ValueError(f"every link latency must be an int ≥ 1 cycle, not {link_latency!r}")
            self.link_latency = max(self.latencies.values())
            self.link_rate = Fraction(link_rate) if link_rate is not None else line_bytes_per_cycle(w)
            self.host_rate = Fraction(host_rate) if host_rate is not None else line_bytes_per_cycle(w)
            for name, r in (("link_rate", self.link_rate), ("host_rate", self.host_rate)):
                if not 0 < r <= w // 8:
                    raise ValueError(f"{name} must be in (0, {w // 8}] bytes a cycle, not {r}")
            self.links = check_links(links, w)
            if self.links == "eth" and (self.link_rate != line_bytes_per_cycle(w) or self.host_rate > self.link_rate):
                raise ValueError("links='eth' runs the MAC and PCS at the datapath clock (10G at 156.25 MHz): the "
                                 "network links are at the line rate and a host link cannot be faster than them "
                                 f"(link_rate {self.link_rate}, host_rate {self.host_rate} bytes a cycle); use "
                                 "links='model' for a faster host link")
            if host_links not in ("model", "eth"):
                raise ValueError(f"host_links must be 'model' or 'eth', not {host_links!r}")
            if host_links == "eth" and (self.links != "eth" or self.host_rate != line_bytes_per_cycle(w)):
                raise ValueError("host_links='eth' puts a 10G Ethernet port at each host: it needs links='eth' and "
                                 f"a host link at the line rate (links {self.links!r}, host_rate {self.host_rate} "
                                 "bytes a cycle)")
            self.host_links = host_links
        self.nodes = self.topology.nodes
        members = {}
        for k in range(self.nodes):
            members[f"host{k}_tx_tuser"] = Out(1)
            for p in range(len(self.topology.links[k]) if self.inject else 0):
                members.update(injection_members(f"inj{k}_{p}", w))
            for d, flow_in in (("rx", True), ("tx", False)):
                dir_in, dir_out = (In, Out) if flow_in else (Out, In)
                members[f"host{k}_{d}_tdata"] = dir_in(w)
                members[f"host{k}_{d}_tkeep"] = dir_in(w // 8)
                members[f"host{k}_{d}_tlast"] = dir_in(1)
                members[f"host{k}_{d}_tvalid"] = dir_in(1)
                members[f"host{k}_{d}_tready"] = dir_out(1)
        if self.links in ("eth", "cmac"):
            members.update({"flip_link": In(16), "flip_block": In(32)})
        if self.links == "eth":
            members.update({"tap_tdata": Out(64), "tap_tkeep": Out(8), "tap_tlast": Out(1), "tap_tvalid": Out(1)})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        topo, cfg = self.topology, self.config
        w = cfg.width
        make = (lambda: InjectableEngine(cfg)) if self.inject else (lambda: Engine(cfg))
        if self.boxed:
            key = ("inject", cfg) if self.inject else cfg
            engines = [self.boxes.box("engine", key, make) for _ in range(topo.nodes)]
        else:
            engines = [make() for _ in range(topo.nodes)]
        for u, e in enumerate(engines):
            m.submodules[f"node{u}"] = e
            for p in range(len(topo.links[u]) if self.inject else 0):
                drive_injection(m, getattr(e, f"inj{p}"), lambda s, u=u, p=p: getattr(self, f"inj{u}_{p}_{s}"))
            for p in range(len(topo.links[u]), cfg.ports if self.inject else 0):
                m.d.comb += getattr(e, f"inj{p}").valid.eq(0)
            if self.host_links == "model":
                m.submodules[f"link_host{u}_rx"] = rx = LinkModel(w, self.link_latency, self.host_rate)
                m.submodules[f"link_host{u}_tx"] = tx = LinkModel(w, self.link_latency, self.host_rate)
                wiring.connect(m, rx.o, e.host_rx)
                wiring.connect(m, e.host_tx, tx.i)
                host_wires(m, self, u, rx.i, tx.o)
            for p, (v, q) in enumerate(topo.links[u]):
                if self.links != "model":
                    continue
                link = m.submodules[f"link{u}_{p}"] = LinkModel(w, self.latencies[(u, p)], self.link_rate)
                wiring.connect(m, getattr(e, f"net{p}_out"), link.i)
                wiring.connect(m, link.o, getattr(engines[v], f"net{q}_in"))
            for p in range(len(topo.links[u]), cfg.ports):
                m.d.comb += [getattr(e, f"net{p}_out").ready.eq(1), getattr(e, f"net{p}_in").valid.eq(0)]
        if self.links == "eth":
            self._eth_ports(m, engines)
        if self.links == "cmac":
            cables = cmac_engine_links(m, engines, topo, cfg, self.latencies, self.link_rate)
            for (u, p), cable in cables.items():
                m.d.comb += [cable.flip.eq(self.flip_link == u * cfg.ports + p), cable.flip_beat.eq(self.flip_block)]
        return m

    def _eth_ports(self, m, engines):
        """An :class:`~wirereduce.hdl.eth.port.EthPort10G` at every cabled network port, and the
        cables between them (class docstring, ``links``)."""
        from wirereduce.hdl.eth.port import TxStartBuffer, port_counters

        topo = self.topology
        ports = {}
        host_ports = {}
        for u, e in enumerate(engines):
            if self.host_links == "eth":
                # the engine's host port as on the VC709 SFP top, and the host's NIC, one cable between
                side = m.submodules[f"eth_host{u}"] = eth_port(
                    m, self.boxes, self.config.mtu, eth_mac(u, HOST_PORT), eth_mac(u, NIC_PORT), role="host",
                    flow_control=True, mac_prefix=ETH_MAC_PREFIX, cable_cycles=self.link_latency)
                # The NIC as a host's NIC behaves: it sends PAUSE when the host is slow to take what it
                # receives, and sends a frame only once all of it is in (a DMA read ahead of the wire), so
                # a host that hands it a frame with gaps never underruns its MAC.
                nic = m.submodules[f"eth_nic{u}"] = eth_port(
                    m, self.boxes, self.config.mtu, eth_mac(u, NIC_PORT), eth_mac(u, HOST_PORT),
                    mac_prefix=ETH_MAC_PREFIX, flow_control=True, cable_cycles=self.link_latency)
                frame_beats = -(-self.config.mtu // 8)
                nic_dma = m.submodules[f"nic_dma{u}"] = TxStartBuffer(depth=2 * frame_beats + 2,
                                                                      threshold=2 * frame_beats + 3)
                wiring.connect(m, nic_dma.o, nic.tx)
                m.d.comb += [side.rank.eq(e.rank), side.nodes.eq(0), side.control_taken.eq(e.control_taken)]
                wiring.connect(m, e.host_tx, side.tx)
                wiring.connect(m, side.rx, e.host_rx)
                eth_cable(m, side, nic, self.link_latency)
                host_wires(m, self, u, nic_dma.i, nic.rx)
                host_ports[u] = side
            for p, (v, q) in enumerate(topo.links[u]):
                eth = m.submodules[f"eth{u}_{p}"] = eth_port(
                    m, self.boxes, self.config.mtu, eth_mac(u, p), eth_mac(v, q), cut_through=True,
                    mac_prefix=ETH_MAC_PREFIX, cable_cycles=self.latencies[(u, p)], tx_start=ETH_TX_START)
                wiring.connect(m, getattr(e, f"net{p}_out"), eth.tx)
                wiring.connect(m, eth.rx, getattr(e, f"net{p}_in"))
                ports[(u, p)] = eth
            names = engine_ports(self.config.ports)
            stats = {names[1 + p]: ports[(u, p)].stats for p in range(len(topo.links[u]))}
            if u in host_ports:
                stats["host"] = host_ports[u].stats
            m.d.comb += e.port_counters.eq(port_counters(stats, names))
        tap = ports[(0, 0)]
        m.d.comb += [self.tap_tdata.eq(tap.tx_tap.data), self.tap_tkeep.eq(tap.tx_tap.keep),
                     self.tap_tlast.eq(tap.tx_tap.last), self.tap_tvalid.eq(tap.tx_tap_valid)]
        for (u, p), eth in ports.items():
            v, q = topo.links[u][p]
            line = flip_line(m, eth.line_tx, self.flip_link == u * self.config.ports + p, self.flip_block)
            m.d.comb += ports[(v, q)].line_rx.eq(delayed(m, line, self.latencies[(u, p)]))


def cmac_engine_links(m, engines, topology: Topology, config: EngineConfig, latencies: dict, rate) -> dict:
    """Cable ``engines`` (512-bit :class:`~wirereduce.hdl.core.engine.Engine` s, one per node of
    ``topology``) with the 100G CMAC glue of the U55C top (``boards/u55c_top.py``), in ``m``, one
    clock domain: each directed link ``(u, p) → (v, q)`` is engine u's ``net{p}_out`` →
    :class:`~wirereduce.hdl.xilinx.cmac.CmacTxGlue` → :class:`~wirereduce.sim.cluster.network.CmacCable`
    (``latencies[(u, p)]`` cycles, ``rate`` wire bytes a cycle) → ``CmacRxGlue(cut_through=True)`` →
    engine v's ``net{q}_in``: a frame found bad on a cable goes on
    marked ``bad`` and leaves every later hop stomped. Each engine's ``port_counters`` come from its
    glue pairs (:func:`~wirereduce.hdl.xilinx.cmac.cmac_port_stats`: ``net{p}_*``, ``link_drop_net{p}``).
    Returns the cables by directed link (each has ``flip``/``flip_beat`` for fault injection, tied low
    unless the caller drives them)."""
    from wirereduce.hdl.eth.port import port_counters
    from wirereduce.hdl.xilinx.cmac import cmac_port_stats

    rxs = [{} for _ in engines]
    txs = [{} for _ in engines]
    cables = {}
    for u, e in enumerate(engines):
        for p, (v, q) in enumerate(topology.links[u]):
            tx, cable, rx = cmac_cable(m, (f"cmac{u}_{p}_tx", f"cmac{u}_{p}", f"cmac{v}_{q}_rx"),
                                       getattr(e, f"net{p}_out"), getattr(engines[v], f"net{q}_in"), config.mtu,
                                       latencies[(u, p)], rate, eth_mac(u, p))
            txs[u][p], rxs[v][q] = tx, rx
            cables[(u, p)] = cable
    names = engine_ports(config.ports)
    for u, e in enumerate(engines):
        stats = {names[1 + p]: cmac_port_stats(rxs[u][p], txs[u][p]) for p in range(len(topology.links[u]))}
        m.d.comb += e.port_counters.eq(port_counters(stats, names))
    return cables


def schednet_verilog(topology: Topology | str, config: EngineConfig | None = None, link_latency: int | dict = 4,
                     link_rate: Fraction | int | None = None, host_rate: Fraction | int | None = None,
                     links: str = "model", host_links: str = "model", inject: bool = False) -> str:
    """Verilog text of a :class:`ScheduleNetwork` with top module ``wirereduce_net``, boxed: the
    engine is converted once, as module :data:`ENGINE_MODULE`, and instantiated at every node; with
    ``links="eth"`` so is each kind of Ethernet port (``wirereduce_ethport``, … : one per distinct
    cable latency), their addresses tied to constants outside the boxes
    (:func:`~wirereduce.sim.cluster.network.eth_port`)."""
    from amaranth.back import verilog
    from wirereduce.sim.cluster.vcache import cached_verilog

    top = ScheduleNetwork(topology, config, link_latency, link_rate, host_rate, boxed=True, links=links,
                          host_links=host_links, inject=inject)
    top._MustUse__silence = True   # a cached text leaves it unconverted

    def make():
        net = verilog.convert(top, name="wirereduce_net", emit_src=False)
        return net + top.boxes.verilog()

    # The key is what the network was built from after its checks and defaults (the topology's
    # links, every directed link's latency, the rates as fractions).
    args = (top.topology, top.config, top.latencies, top.link_rate, top.host_rate, links,
            *((host_links,) if host_links != "model" else ()), *(("inject",) if inject else ()))
    return cached_verilog("schednet", args, make)


def engine_rates(width: int, host_gbps: float | None, link_gbps: float | None = None):
    """(clock MHz, link bytes/cycle, host bytes/cycle) of a simulated schedule-engine network.

    The network links run at the width's line rate (10 Gbit/s at 64 bit) or ``link_gbps``. A host link
    faster than the datapath at its standard clock (``host_gbps`` > 10 at 64 bit) is simulated by
    running the datapath at the clock that makes it as fast as the host link and pacing the network
    links to their rate (docs/architecture.md "Host link")."""
    link = line_rate_gbps(width) if link_gbps is None else link_gbps
    host = link if host_gbps is None else host_gbps
    for name, v in (("--host-link-gbps", host), ("--link-gbps", link)):
        if not v > 0:
            raise ValueError(f"{name} must be positive, not {v}")
    mhz = max(clock_mhz(width), max(host, link) * 1000 / width)
    rate = lambda g: min(Fraction(width // 8), bytes_per_cycle(g, mhz))  # noqa: E731
    return mhz, rate(link), rate(host)
