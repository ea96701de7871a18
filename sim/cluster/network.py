"""Simulated clusters: N nodes cabled into a ring by link models, and its Verilog.

The :class:`LinkModel` stands in for a full-duplex Ethernet link until the MAC exists. It
charges every frame what it costs on a real wire: the 14-byte Ethernet header, padding up to
the 46-byte minimum payload, preamble + SFD (8 B), FCS (4 B) and the inter-frame gap (12 B)
(:func:`wirereduce.protocol.wire_bytes`), so the throughput a simulation shows is the one real
10G/100G links would give. It delays every beat by ``latency`` cycles and applies credit-based
flow control: the sender may only put a beat on the wire when the receiver's buffer has room
for it, so a stalled receiver back-pressures without loss.
"""

from __future__ import annotations

from fractions import Fraction

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.core.node import Node
from wirereduce.hdl.params import rejecting
from wirereduce.hdl.stream.frame import FrameArbiter, FrameStream, beat_layout
from wirereduce.sim.cluster.box import Boxes

from wirereduce.config import NodeConfig, check_width
from wirereduce.protocol import ETH_HEADER_BYTES, ETH_MIN_PAYLOAD_BYTES, ETH_OVERHEAD_BYTES

__all__ = ["LinkModel", "CmacCable", "Network", "network_verilog", "line_rate_gbps", "clock_mhz", "bytes_per_cycle",
           "line_bytes_per_cycle", "LINE_RATE_GBPS", "LINKS", "check_links", "eth_mac", "eth_port", "delayed"]

# Link timing, defined here once for the network, the engines and the benchmark.


def clock_mhz(width: int) -> float:
    """Design clock for a datapath width: 156.25 MHz at 64 bit (10G MAC/PCS clock), 322.265625 MHz
    at 512 bit (the UltraScale+ CMAC's 100G user clock), scaled by width otherwise."""
    return {64: 156.25, 512: 322.265625}.get(width, 156.25 * width / 64)


#: Ethernet line rate, Gbit/s, of the link each standard datapath width serves: 10GbE, 100GbE.
LINE_RATE_GBPS = {64: 10.0, 512: 100.0}


def line_rate_gbps(width: int) -> float:
    """Ethernet line rate a datapath width serves: 10 Gbit/s at 64 bit, 100 Gbit/s at 512 bit
    (:data:`LINE_RATE_GBPS`), otherwise the width's raw beat rate at :func:`clock_mhz`."""
    return LINE_RATE_GBPS.get(width, width * clock_mhz(width) / 1000)


def bytes_per_cycle(gbps: float, mhz: float) -> Fraction:
    """Wire bytes per clock cycle of a ``gbps`` Gbit/s link at a ``mhz`` MHz clock, exactly (a Fraction)."""
    rate = Fraction(gbps).limit_denominator(1 << 20) * 1000 / 8
    return rate / Fraction(mhz).limit_denominator(1 << 20)


def line_bytes_per_cycle(width: int) -> Fraction:
    """Wire bytes per clock cycle at :func:`line_rate_gbps` and :func:`clock_mhz`, exactly.

    64 bit: 10 Gbit/s / 156.25 MHz = 8 bytes a cycle (every beat full); 512 bit:
    100 Gbit/s / 322.265625 MHz = 1280/33 ≈ 38.79 bytes a cycle, so a 64-byte beat stream is
    paced to about 61 % of the cycles.
    """
    return bytes_per_cycle(line_rate_gbps(width), clock_mhz(width))


class LinkModel(wiring.Component):
    """One direction of a link: wire-rate shaping, ``latency`` cycles of delay, credits.

    Parameters
    ----------
    width : int
        Datapath width in bits; the wire moves ``width // 8`` bytes per cycle (so 64 bit at
        156.25 MHz is 10 Gbit/s, 512 bit at 322.27 MHz about 165 Gbit/s of raw beat rate,
        of which a 100G wire uses what ``rate`` says: :func:`line_bytes_per_cycle`).
    latency : int
        Cycles from a beat entering to it leaving (cable + PHY), ≥ 1.
    rate : int or fractions.Fraction, optional
        Wire bytes per clock cycle (exact; 1280/33 for 100G at 322.265625 MHz); defaults to
        ``width // 8``. Bytes are counted in units of ``1 / rate.denominator``, so a fractional
        rate is kept exactly over any number of frames (no drift).

    Raises
    ------
    ValueError
        If ``latency`` < 1 or ``rate`` is not in 1 … width/8.
    """

    def __init__(self, width: int, latency: int = 4, rate: int | Fraction | None = None):
        with rejecting(self):
            check_width(width)
            if not isinstance(latency, int) or latency < 1:
                raise ValueError(f"link latency must be an int ≥ 1 cycle, not {latency!r}")
            rate = Fraction(width // 8 if rate is None else rate)
            if not 1 <= rate <= width // 8:
                raise ValueError(f"the link rate must be 1 … {width // 8} bytes a cycle, not {rate}")
        self._width = width
        self._latency = latency
        self._rate = rate
        beat = FrameStream(width)
        super().__init__({"i": In(beat), "o": Out(beat)})

    def elaborate(self, platform):
        m = Module()
        w = self._width
        lay = beat_layout(w)
        # Wire time in units of 1/den byte: a beat of n bytes costs n*den units, a cycle drains num.
        num, den = self._rate.numerator, self._rate.denominator
        depth = 2 * self._latency + 8  # enough credits to keep the wire busy across the delay

        m.submodules.rx = rx = fifo.SyncFIFOBuffered(width=lay.size, depth=depth)

        # Bytes still to be serialised on the wire; a beat may start while at most one cycle's
        # worth is left, and any remainder carries into the next beat (deficit idle count).
        busy = Signal(range((2 * 65536 + 2 * w) * den))
        frame_bytes = Signal(16)
        credits = Signal(range(depth + 1), init=depth)
        beat = self.i.payload
        nbytes = Signal(range(w // 8 + 1))
        m.d.comb += nbytes.eq(sum(beat.keep[k] for k in range(w // 8)))
        total = frame_bytes + nbytes
        tail = ETH_HEADER_BYTES + ETH_OVERHEAD_BYTES
        pad = Signal(16)
        with m.If(total < ETH_MIN_PAYLOAD_BYTES):
            m.d.comb += pad.eq(ETH_MIN_PAYLOAD_BYTES - total)
        cost = Signal(range((w // 8 + tail + ETH_MIN_PAYLOAD_BYTES + 1) * den))
        m.d.comb += cost.eq((nbytes + Mux(beat.last, tail + pad, 0)) * den)

        send = Signal()
        m.d.comb += [
            self.i.ready.eq((busy <= num) & (credits != 0)),
            send.eq(self.i.valid & self.i.ready),
        ]
        drain = Signal(len(busy) + 1)
        m.d.comb += drain.eq(busy + Mux(send, cost, 0))
        with m.If(drain > num):
            m.d.sync += busy.eq(drain - num)
        with m.Else():
            m.d.sync += busy.eq(0)
        with m.If(send):
            m.d.sync += frame_bytes.eq(Mux(beat.last, 0, total))

        # The cable: a fixed delay line that never stalls (credits guarantee room at the far end).
        valid = send
        payload = beat.as_value()
        for k in range(self._latency):
            v = Signal(name=f"wire_valid{k}")
            p = Signal(lay.size, name=f"wire_beat{k}")
            m.d.sync += [v.eq(valid), p.eq(payload)]
            valid, payload = v, p
        m.d.comb += [rx.w_en.eq(valid), rx.w_data.eq(payload)]

        m.d.comb += [
            self.o.valid.eq(rx.r_rdy),
            self.o.payload.eq(rx.r_data),
            rx.r_en.eq(self.o.ready),
        ]
        popped = rx.r_rdy & self.o.ready
        m.d.sync += credits.eq(credits - send + popped)
        return m


def injectable_members(inner, ports: dict[str, str], width: int) -> dict:
    """The signature members of a wrapper around ``inner`` (a node or an engine) with an injection
    port ``ports[name]`` (``In(FrameStream(width))``) beside each of ``inner``'s inputs ``name``."""
    members = dict(inner.signature.members)
    members.update({inj: In(FrameStream(width)) for inj in ports.values()})
    return members


def wire_injectable(m, outer, inner, ports: dict[str, str], width: int) -> None:
    """Elaborate a wrapper made with :func:`injectable_members`: each input ``name`` in ``ports``
    reaches ``inner`` through a :class:`~wirereduce.hdl.stream.frame.FrameArbiter` (whole frames)
    with its injection port ``ports[name]``; every other member is passed straight through."""
    for name, member in inner.signature.members.items():
        if name in ports:
            arb = m.submodules[f"inj_arb_{name}"] = FrameArbiter(beat_layout(width), 2)
            wiring.connect(m, wiring.flipped(getattr(outer, name)), arb.i0)
            wiring.connect(m, wiring.flipped(getattr(outer, ports[name])), arb.i1)
            wiring.connect(m, arb.o, getattr(inner, name))
        elif member.is_signature:
            if member.flow == In:
                wiring.connect(m, wiring.flipped(getattr(outer, name)), getattr(inner, name))
            else:
                wiring.connect(m, getattr(inner, name), wiring.flipped(getattr(outer, name)))
        elif member.flow == In:
            m.d.comb += getattr(inner, name).eq(getattr(outer, name))
        else:
            m.d.comb += getattr(outer, name).eq(getattr(inner, name))


def injection_members(prefix: str, width: int) -> dict:
    """The flat AXI4-Stream members of one injection port on a network top:
    ``{prefix}_t{data,keep,last,valid,user}`` in (``tuser`` = ``bad``) and ``{prefix}_tready`` out
    (driven by :func:`drive_injection`)."""
    members = {f"{prefix}_{sig}": In(shape) for sig, shape in
               (("tdata", width), ("tkeep", width // 8), ("tlast", 1), ("tvalid", 1), ("tuser", 1))}
    members[f"{prefix}_tready"] = Out(1)
    return members


def drive_injection(m, stream, flat) -> None:
    """Drive injection port ``stream`` from the flat AXI4-Stream ports ``flat("tdata")`` … of a
    network top (``tuser`` = ``bad``)."""
    m.d.comb += [
        stream.payload.data.eq(flat("tdata")), stream.payload.keep.eq(flat("tkeep")),
        stream.payload.last.eq(flat("tlast")), stream.payload.bad.eq(flat("tuser")),
        stream.valid.eq(flat("tvalid")), flat("tready").eq(stream.ready),
    ]


class InjectableNode(wiring.Component):
    """A :class:`~wirereduce.hdl.core.node.Node` whose ring inputs also take frames from two
    injection ports, ``inj_cw`` and ``inj_ccw``, merged a whole frame at a time with what the
    link delivers (:class:`~wirereduce.hdl.stream.frame.FrameArbiter`): the fuzz suite's hook
    for hostile frames on a ring port (:mod:`wirereduce.sim.fuzz`). Every other member is the
    node's own. Simulation only.
    """

    _PORTS = {"cw_in": "inj_cw", "ccw_in": "inj_ccw"}

    def __init__(self, config: NodeConfig):
        self.config = config
        self._node = Node(config)
        super().__init__(injectable_members(self._node, self._PORTS, config.width))

    def elaborate(self, platform):
        m = Module()
        m.submodules.node = node = self._node
        wire_injectable(m, self, node, self._PORTS, self.config.width)
        return m


class CmacCable(wiring.Component):
    """One direction of a 100G cable as two CMACs' AXI4-Stream user sides see it (PG203).

    The hard IP cannot be simulated here; this is what its user side does with a frame, and
    nothing more: the frame the sending glue hands ``tx`` (Ethernet header to last pad byte, FCS
    added by the CMAC) comes out of ``rx`` ``latency`` cycles later, beat for beat, as the
    receiving CMAC would hand it on (FCS checked and stripped). No FCS is computed: the cable
    knows which frames would fail theirs.

    - ``tx.tready`` paces the sender at the line rate ``rate`` (wire bytes per cycle, each frame
      costing its bytes plus preamble, FCS and inter-frame gap, 24 bytes), dropping inside frames
      as the real CMAC does; ``rx`` has gaps accordingly and no ``tready``.
    - A frame sent with ``tuser`` on its last beat (stomped by the sending CMAC) arrives with
      ``tuser`` and ``stomped`` on its last beat (its FCS is a stomped one).
    - Fault injection: when ``flip`` is high, the ``flip_beat``-th beat (1-based, counted from
      reset over the beats this cable carries) has bit 5 of byte 40 inverted (payload, after the
      Ethernet and wirereduce headers of a first beat); its frame arrives with ``tuser`` on its
      last beat and ``stomped`` low, as an FCS error on this link. ``flip_beat = 0``: never.

    Parameters
    ----------
    latency : int
        Cycles from a beat taken on ``tx`` to it on ``rx``, ≥ 1.
    rate : fractions.Fraction or int
        Wire bytes per cycle, 1 … 64 (1280/33 for 100 Gbit/s at 322.265625 MHz).

    Attributes
    ----------
    tx : In(CmacTxSignature()); rx : Out(CmacRxSignature())
    flip : In(1); flip_beat : In(32)

    Raises
    ------
    ValueError
        If ``latency`` < 1 or ``rate`` is outside 1 … 64.
    """

    def __init__(self, latency: int = 4, rate: Fraction | int = 64):
        from wirereduce.hdl.xilinx.cmac import CmacRxSignature, CmacTxSignature

        with rejecting(self):
            if not isinstance(latency, int) or isinstance(latency, bool) or latency < 1:
                raise ValueError(f"cable latency must be an int ≥ 1 cycle, not {latency!r}")
            rate = Fraction(rate)
            if not 1 <= rate <= 64:
                raise ValueError(f"the cable rate must be 1 … 64 bytes a cycle, not {rate}")
        self._latency = latency
        self._rate = rate
        super().__init__({"tx": In(CmacTxSignature()), "rx": Out(CmacRxSignature()),
                          "flip": In(1), "flip_beat": In(32)})

    def elaborate(self, platform):
        m = Module()
        tx = self.tx
        num, den = self._rate.numerator, self._rate.denominator
        busy = Signal(range((2 * 64 + 2 * ETH_OVERHEAD_BYTES) * den + num + 1))
        nbytes = Signal(range(65))
        m.d.comb += nbytes.eq(sum(tx.tkeep[k] for k in range(64)))
        take = Signal()
        m.d.comb += [tx.tready.eq(busy <= num), take.eq(tx.tvalid & tx.tready)]
        cost = (nbytes + Mux(tx.tlast, ETH_OVERHEAD_BYTES, 0)) * den
        drain = Signal(len(busy) + 1)
        m.d.comb += drain.eq(busy + Mux(take, cost, 0))
        m.d.sync += busy.eq(Mux(drain > num, drain - num, 0))

        beats = Signal(32)
        spoilt = Signal()           # a beat of the current frame was flipped
        hit = Signal()
        m.d.comb += hit.eq(take & self.flip & (beats + 1 == self.flip_beat))
        with m.If(take & self.flip):
            m.d.sync += beats.eq(beats + 1)
        with m.If(take):
            m.d.sync += spoilt.eq(~tx.tlast & (spoilt | hit))
        bit = 8 * 40 + 5
        valid, tdata, tkeep, tlast = take, tx.tdata ^ (hit << bit), tx.tkeep, tx.tlast
        error = spoilt | hit
        tuser = tx.tlast & (tx.tuser | error)
        stomped = tx.tlast & tx.tuser & ~error
        widths = {"valid": 1, "data": 512, "keep": 64, "last": 1, "user": 1, "stomped": 1}
        for k in range(self._latency):
            regs = [Signal(w, name=f"wire_{name}{k}") for name, w in widths.items()]
            m.d.sync += [r.eq(x) for r, x in zip(regs, (valid, tdata, tkeep, tlast, tuser, stomped))]
            valid, tdata, tkeep, tlast, tuser, stomped = regs
        rx = self.rx
        m.d.comb += [rx.tvalid.eq(valid), rx.tdata.eq(tdata), rx.tkeep.eq(tkeep), rx.tlast.eq(tlast & valid),
                     rx.tuser.eq(tuser & valid), rx.stomped.eq(stomped & valid)]
        return m


class Network(wiring.Component):
    """``nodes`` :class:`~wirereduce.hdl.core.node.Node` instances in a ring, for simulation.

    Node ``k``'s ``cw_out`` feeds node ``(k+1) % nodes``'s ``cw_in`` and its ``ccw_out`` feeds
    node ``(k-1) % nodes``'s ``ccw_in``, each through a :class:`LinkModel`. The host ports are
    flat AXI4-Stream signals named ``host{k}_rx_t{data,keep,last,valid,ready}`` (host → node)
    and ``host{k}_tx_t…`` (node → host), which cocotbext-axi's bus models drive.

    Parameters
    ----------
    nodes : int
        Ring size, 2 … 255.
    config : NodeConfig
    link_latency : int
        Cycles of delay of every link.
    host_links : bool
        Put a :class:`LinkModel` at the line rate between each host port and its node too (the
        host's own 10G/100G link), so a host can push no faster than a real NIC. Default True.
    links : str
        ``"model"`` (default): every link is a :class:`LinkModel`. ``"eth"`` (64 bit only): every
        link is real 10GBASE-R, see :func:`_eth_links`; the top then also has a capture tap
        ``tap_t{data,keep,last,valid}``: the Ethernet frames (no FCS) node 0 sends node 1 (cw),
        and fault-injection inputs ``flip_link`` (8 bit) and ``flip_block`` (32 bit): one bit of
        the ``flip_block``-th data block node ``flip_link`` sends node ``flip_link + 1`` is
        inverted on the cable (``flip_block = 0``: never), see :func:`_eth_links`.

    link_rate : fractions.Fraction or int, optional
        Wire bytes per cycle of every link model; default :func:`line_bytes_per_cycle` of the
        width: 10 Gbit/s at 64 bit, 100 Gbit/s at 512 bit. A wider datapath than its links
        (e.g. 512 bit at 156.25 MHz behind 10G links: 8) is where compressed frames pay off.
    inject : bool
        Give every node injection ports (:class:`InjectableNode`), flat on the top as
        ``inj{k}_{cw,ccw}_t{data,keep,last,valid,ready,user}`` (``tuser`` = ``bad``): frames put
        there enter node ``k``'s ring input as if the link had delivered them (the fuzz suite).

    boxed : bool
        Build the Verilog path's network (:func:`network_verilog`): every node and every Ethernet
        port a :class:`~wirereduce.sim.cluster.box.Box` of its design, collected in ``boxes``
        (:class:`~wirereduce.sim.cluster.box.Boxes`, filled as the network elaborates), so that
        identical ones are converted once. Default False: the components themselves,
        for simulating the network in Python.

    Every host output also has ``host{k}_tx_tuser``: the frame's ``bad`` on its last beat (a
    host NIC drops such a frame, as it would one with a stomped FCS).

    Raises
    ------
    ValueError
        If ``nodes`` is outside 2 … 255, ``links`` is not "model" or "eth", "eth" is asked
        for at a width other than 64, or ``link_rate`` is not in (0, width/8].
    """

    def __init__(self, nodes: int, config: NodeConfig | None = None, link_latency: int = 4,
                 host_links: bool = True, links: str = "model", link_rate: Fraction | int | None = None,
                 inject: bool = False, probe: bool = False, boxed: bool = False):
        self.boxed = bool(boxed)
        self.boxes = Boxes() if self.boxed else None
        with rejecting(self):
            self.inject = bool(inject)
            self._probing = bool(probe) and not self.inject
            if not isinstance(nodes, int) or not 2 <= nodes <= 255:
                raise ValueError(f"a ring needs 2 … 255 nodes, not {nodes!r}")
            self.nodes = nodes
            self.config = config if config is not None else NodeConfig()
            self.link_latency = link_latency
            self.host_links = host_links
            self.links = check_links(links, self.config.width)
            w = self.config.width
            self.link_rate = Fraction(link_rate) if link_rate is not None else line_bytes_per_cycle(w)
            if not 0 < self.link_rate <= w // 8:
                raise ValueError(f"link_rate must be in (0, {w // 8}] bytes a cycle, not {link_rate!r}")
        members = {}
        if self._probing:
            from wirereduce.hdl.core.node import PROBE_POINTS
            members["probe"] = Out(2 * len(PROBE_POINTS) * nodes)
        if self.links == "eth":
            members.update({"tap_tdata": Out(64), "tap_tkeep": Out(8), "tap_tlast": Out(1), "tap_tvalid": Out(1),
                            "flip_link": In(8), "flip_block": In(32)})
        if self.links == "cmac":
            members.update({"flip_link": In(8), "flip_block": In(32)})
        for k in range(nodes):
            members[f"host{k}_tx_tuser"] = Out(1)
            if self.inject:
                for port in ("cw", "ccw"):
                    members.update(injection_members(f"inj{k}_{port}", w))
            for d, flow_in in (("rx", True), ("tx", False)):
                dir_in, dir_out = (In, Out) if flow_in else (Out, In)
                members[f"host{k}_{d}_tdata"] = dir_in(w)
                members[f"host{k}_{d}_tkeep"] = dir_in(w // 8)
                members[f"host{k}_{d}_tlast"] = dir_in(1)
                members[f"host{k}_{d}_tvalid"] = dir_in(1)
                members[f"host{k}_{d}_tready"] = dir_out(1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        n = self.nodes
        w = self.config.width
        rate = self.link_rate
        cfg, probing = self.config, self._probing
        if self.boxed:  # one node design for all (rank and ring size come from CONTROL at run time)
            boxes = self.boxes
            if self.inject:
                ring = [boxes.box("node", ("inject", cfg), lambda: InjectableNode(cfg)) for _ in range(n)]
            else:
                ring = [boxes.box("node", (cfg, probing), lambda: Node(cfg, probe=probing)) for _ in range(n)]
        else:
            ring = [InjectableNode(cfg) if self.inject else Node(cfg, probe=probing) for _ in range(n)]
        if self._probing:
            m.d.comb += self.probe.eq(Cat(*(node.probe for node in ring)))
        if self.inject:
            for k, node in enumerate(ring):
                for port in ("cw", "ccw"):
                    drive_injection(m, getattr(node, f"inj_{port}"),
                                    lambda s, k=k, port=port: getattr(self, f"inj{k}_{port}_{s}"))
        if self.links == "eth":
            for k, node in enumerate(ring):
                m.submodules[f"node{k}"] = node
            hosts = _eth_links(m, ring, self.config.mtu, self.link_latency, self.host_links,
                               self.flip_link, self.flip_block, self.boxes)
            for k, (rx, tx) in enumerate(hosts):
                self._host_wires(m, k, rx, tx)
            tap = m.submodules["eth_cw0"]
            m.d.comb += [self.tap_tdata.eq(tap.tx_tap.data), self.tap_tkeep.eq(tap.tx_tap.keep),
                         self.tap_tlast.eq(tap.tx_tap.last), self.tap_tvalid.eq(tap.tx_tap_valid)]
            return m
        for k, node in enumerate(ring):
            m.submodules[f"node{k}"] = node
        if self.links == "cmac":
            _cmac_links(m, ring, self.config.mtu, self.link_latency, rate, self.flip_link, self.flip_block)
        for k, node in enumerate(ring):
            rx, tx = node.host_rx, node.host_tx
            if self.host_links:
                m.submodules[f"link_host{k}_rx"] = rx_link = LinkModel(w, self.link_latency, rate)
                wiring.connect(m, rx_link.o, node.host_rx)
                if self.links == "cmac":
                    tx_out = _cmac_host_tx(m, k, node.host_tx, self.config.mtu, self.link_latency, rate)
                else:
                    m.submodules[f"link_host{k}_tx"] = tx_link = LinkModel(w, self.link_latency, rate)
                    wiring.connect(m, node.host_tx, tx_link.i)
                    tx_out = tx_link.o
                rx, tx = rx_link.i, tx_out
            self._host_wires(m, k, rx, tx)
        for k in range(n if self.links == "model" else 0):
            nxt = (k + 1) % n
            cw = LinkModel(w, self.link_latency, rate)
            ccw = LinkModel(w, self.link_latency, rate)
            m.submodules[f"link_cw{k}_{nxt}"] = cw
            m.submodules[f"link_ccw{nxt}_{k}"] = ccw
            wiring.connect(m, ring[k].cw_out, cw.i)
            wiring.connect(m, cw.o, ring[nxt].cw_in)
            wiring.connect(m, ring[nxt].ccw_out, ccw.i)
            wiring.connect(m, ccw.o, ring[k].ccw_in)
        return m

    def _host_wires(self, m, k, rx, tx):
        """Connect the flat ``host{k}_*`` ports to the stream ``rx`` (into the ring) and ``tx``."""
        g = lambda s: getattr(self, f"host{k}_{s}")  # noqa: E731
        m.d.comb += [
            rx.payload.data.eq(g("rx_tdata")), rx.payload.keep.eq(g("rx_tkeep")),
            rx.payload.last.eq(g("rx_tlast")), rx.valid.eq(g("rx_tvalid")),
            g("rx_tready").eq(rx.ready),
            g("tx_tdata").eq(tx.payload.data), g("tx_tkeep").eq(tx.payload.keep),
            g("tx_tlast").eq(tx.payload.last), g("tx_tvalid").eq(tx.valid), g("tx_tuser").eq(tx.payload.bad),
            tx.ready.eq(g("tx_tready")),
        ]


#: What a :class:`Network`'s links are: link models, real 10G Ethernet (MAC + PCS), or 100G
#: CMAC glue on :class:`CmacCable` models of the CMAC's user side.
LINKS = ("model", "eth", "cmac")


def check_links(links: str, width: int) -> str:
    """Validate a ``links`` choice (:data:`LINKS`) for a datapath ``width``; returns it.

    Raises
    ------
    ValueError
        If ``links`` is not one of :data:`LINKS`, is ``"eth"`` at a width other than 64 (the
        10G MAC and PCS are 64-bit XGMII), or ``"cmac"`` at a width other than 512 (the CMAC's
        AXI4-Stream bus, PG203).
    """
    if links not in LINKS:
        raise ValueError(f"links must be one of {', '.join(LINKS)}, not {links!r}")
    if links == "eth" and width != 64:
        raise ValueError(f"links='eth' is 10G Ethernet (MAC + 10GBASE-R PCS) at a 64-bit datapath, not {width} bit")
    if links == "cmac" and width != 512:
        raise ValueError(f"links='cmac' is the 100G CMAC glue at a 512-bit datapath, not {width} bit")
    return links


#: Prefix of every address in an Ethernet-linked :class:`Network` (the ports' ``mac_prefix``).
ETH_MAC_PREFIX = 0x02_77_72_00_00_00


def eth_mac(node: int, port: int) -> int:
    """MAC address of port ``port`` of ``node`` in an Ethernet-linked :class:`Network`: locally
    administered ``02:77:72:00:nn:pp``; port 0 faces node + 1 (cw), 1 node − 1, 2 the host, and
    3 is the host's own NIC. Ports 0 … 2 are those :func:`wirereduce.hdl.eth.port.role_mac` gives
    the node once CONTROL has made node ``nn`` rank ``nn`` (roles ``next``, ``prev``, ``host``)."""
    return ETH_MAC_PREFIX | (node << 8) | port


def delayed(m, value, cycles: int):
    """``value`` through ``cycles`` registers (a cable's latency); ``value`` itself for 0."""
    for _ in range(cycles):
        r = Signal(len(value))
        m.d.sync += r.eq(value)
        value = r
    return value


def eth_port(m, boxes, mtu: int, local_mac: int, peer_mac: int, **params):
    """An :class:`~wirereduce.hdl.eth.port.EthPort10G` ``(mtu, local_mac=…, peer_mac=…, **params)``;
    with ``boxes`` (a :class:`~wirereduce.sim.cluster.box.Boxes`) a box of the port built with its
    addresses as inputs (``local_mac=None, peer_mac=None``), which this ties to ``local_mac`` and
    ``peer_mac`` in ``m``: the ports of a network that differ only in their addresses are then one
    design, converted once. Frames and counters are those of the port itself."""
    from wirereduce.hdl.eth.port import EthPort10G

    if boxes is None:
        return EthPort10G(mtu, local_mac=local_mac, peer_mac=peer_mac, **params)
    port = boxes.box("ethport", (mtu, params), lambda: EthPort10G(mtu, local_mac=None, peer_mac=None, **params))
    m.d.comb += [port.local_mac.eq(local_mac), port.peer_mac.eq(peer_mac)]
    return port


def flip_line(m, line, flip, flip_block):
    """Fault injection on a 10G cable: ``line`` (a port's ``line_tx``, one 66-bit block a cycle)
    with payload bit 5 of one scrambled data block inverted while ``flip`` is high: the
    ``flip_block``-th data block (1-based; 0: never), or with bit 31 of ``flip_block`` set the
    third data block (wirereduce header bytes 2 … 9) of the ``flip_block & 0x7FFFFFFF``-th frame
    (run of data blocks). Returns the value to put on the cable."""
    from wirereduce.hdl.eth.pcs import SYNC_DATA

    data_blocks = Signal(32)
    is_data = line.header == SYNC_DATA
    with m.If(is_data & flip):
        m.d.sync += data_blocks.eq(data_blocks + 1)
    # Header mode (flip_block bit 31): the frame is the (flip_block & 0x7FFFFFFF)-th run of
    # data blocks (a frame's data blocks are consecutive, between its /S/ and /T/ control
    # blocks), and the block hit is its third: wirereduce header bytes 2 … 9.
    runs, in_run, run_block = Signal(31), Signal(), Signal(8)
    with m.If(flip):
        m.d.sync += in_run.eq(is_data)
        with m.If(is_data):
            with m.If(~in_run):
                m.d.sync += [runs.eq(runs + 1), run_block.eq(1)]
            with m.Elif(run_block != 0xFF):
                m.d.sync += run_block.eq(run_block + 1)
    this_run = Mux(in_run, runs, runs + 1)
    this_block = Mux(in_run, run_block + 1, 1)
    hit_header = flip_block[31] & (this_run == flip_block[:31]) & (this_block == 3)
    hit_payload = ~flip_block[31] & (data_blocks + 1 == flip_block)
    return line.as_value() ^ ((is_data & flip & (hit_header | hit_payload)) << 7)


def _eth_links(m, ring, mtu, latency, host_links, flip_link, flip_block, boxes=None):
    """Cable ``ring`` with single-clock :class:`~wirereduce.hdl.eth.port.EthPort10G` ports.

    Node k's port ``eth_cw{k}`` (tx: ``cw_out``, rx: ``ccw_in``) faces node k+1's ``eth_ccw{k+1}``
    (tx: ``ccw_out``, rx: ``cw_in``); each host has a NIC port ``eth_nic{k}`` facing the node's
    ``eth_host{k}`` (tx: ``host_tx``, rx: ``host_rx``). Every cable carries one scrambled 66-bit
    block a cycle each way, delayed ``latency`` cycles: 10.3125 Gbaud at 156.25 MHz.

    The ring ports are cut-through (``EthPort10G(cut_through=True)``: a frame found bad at its
    FCS is forwarded marked and sent on with a stomped FCS); the host ports, node side and NIC
    side, are store and forward, so a bad frame is never buffered or delivered.

    The node's ports have roles (``next``, ``prev``, ``host``): their addresses follow the node's
    CONTROL and they drop frames from any other source than their neighbour (``rx_source_drops``,
    the node's ``drop_source``); the NIC ports have fixed addresses and no filter.


    IEEE 802.3x flow control (``hdl/eth/pause.py``): every port honours PAUSE frames; the ports
    that receive REDUCE (``eth_ccw{k}``) and HOST_PUSH (``eth_host{k}``) frames also send them
    (``EthPort10G(flow_control=True)``): XOFF when the node stops taking frames and the FIFO passes
    its high-water mark, XON when it drains; the FIFO is sized by
    :func:`~wirereduce.hdl.eth.port.pause_budget` for this ``latency``, so a late host costs
    time, never frames. The ports receiving BROADCAST and results do not send PAUSE: their
    peers' transmitters are fed by a fork (host and ``ccw_out`` in lock-step), and holding one
    of them at a frame start would underrun the other mid-frame; those receivers are never held
    up anyway (docs/architecture.md, Flow control).

    Fault injection: on the cable from node ``flip_link`` to node ``flip_link + 1`` (cw), payload
    bit 5 of the ``flip_block``-th scrambled data block (1-based) is inverted, so the frame it
    belongs to fails its FCS at the receiver (``flip_block = 0``: never). With bit 31 of
    ``flip_block`` set, the bit is in the third data block of the ``flip_block & 0x7FFFFFFF``-th
    frame on that cable instead, which carries wirereduce header bytes 2 … 9: after the
    descrambler (x^58 + x^39 + 1, IEEE 802.3 clause 49.2.6) bits 5, 44 and 63 of that block are
    wrong, i.e. ``dtype``, ``flags`` and ``collective``, so the frame fails its header check.

    With ``boxes``, every port is a box (:func:`eth_port`): four port designs for any ring size.

    Returns the host side ``[(rx, tx)]`` streams of each host (rx: into the ring, tx: out of it).
    """
    from wirereduce.hdl.eth.port import port_counters

    n = len(ring)
    stats = [{} for _ in ring]  # each node's Ethernet ports' stats, by ETH_PORTS name

    def port(name, node, idx, peer_node, peer_idx, cut_through=False, role=None, flow_control=False):
        p = eth_port(m, boxes, mtu, eth_mac(node, idx), eth_mac(peer_node, peer_idx),
                     cut_through=cut_through, role=role, mac_prefix=ETH_MAC_PREFIX,
                     flow_control=flow_control, cable_cycles=latency)
        m.submodules[name] = p
        if role is not None:  # the node's ports follow its CONTROL: addresses and source filter
            m.d.comb += [p.rank.eq(ring[node].rank), p.nodes.eq(ring[node].nodes),
                         p.control_taken.eq(ring[node].control_taken)]
        return p

    for k in range(n):
        nxt = (k + 1) % n
        cw = port(f"eth_cw{k}", k, 0, nxt, 1, cut_through=True, role="next")
        ccw = port(f"eth_ccw{nxt}", nxt, 1, k, 0, cut_through=True, role="prev", flow_control=True)  # receives REDUCE
        wiring.connect(m, ring[k].cw_out, cw.tx)
        wiring.connect(m, cw.rx, ring[k].ccw_in)
        wiring.connect(m, ring[nxt].ccw_out, ccw.tx)
        wiring.connect(m, ccw.rx, ring[nxt].cw_in)
        stats[k]["ccw"], stats[nxt]["cw"] = cw.stats, ccw.stats
        eth_cable(m, cw, ccw, latency, flip_link == k, flip_block)
    hosts = []
    for k, node in enumerate(ring):
        if not host_links:
            hosts.append((node.host_rx, node.host_tx))
            continue
        side = port(f"eth_host{k}", k, 2, k, 3, role="host", flow_control=True)  # receives HOST_PUSH
        nic = port(f"eth_nic{k}", k, 3, k, 2)
        wiring.connect(m, node.host_tx, side.tx)
        wiring.connect(m, side.rx, node.host_rx)
        stats[k]["host"] = side.stats
        eth_cable(m, side, nic, latency)
        hosts.append((nic.tx, nic.rx))
    for node, node_stats in zip(ring, stats):
        m.d.comb += node.port_counters.eq(port_counters(node_stats))
    return hosts


def eth_cable(m, a, b, latency: int, flip=None, flip_block=None) -> None:
    """A 10G cable between Ethernet ports ``a`` and ``b`` (each with ``line_tx``/``line_rx``, one
    66-bit block a cycle), in ``m``: each direction delayed ``latency`` cycles. Fault injection:
    with ``flip`` (a 1-bit value), the a → b direction inverts a bit of its ``flip_block``-th data
    block (:func:`flip_line`); b → a is never flipped."""
    ab, ba = a.line_tx.as_value(), b.line_tx.as_value()
    if flip is not None:
        ab = flip_line(m, a.line_tx, flip, flip_block)
    m.d.comb += [b.line_rx.eq(delayed(m, ab, latency)), a.line_rx.eq(delayed(m, ba, latency))]


def cmac_cable(m, names: tuple[str, str, str], src, dst, mtu: int, latency: int, rate, src_mac: int,
               cut_through: bool = True):
    """One direction of a 100G link in ``m``, single clock: ``src`` (a frame stream) →
    :class:`~wirereduce.hdl.xilinx.cmac.CmacTxGlue` (source address ``src_mac``) →
    :class:`CmacCable` (``latency`` cycles, ``rate`` wire bytes a cycle) →
    :class:`~wirereduce.hdl.xilinx.cmac.CmacRxGlue` (``cut_through``) → ``dst`` (or nothing, with
    ``dst=None``: the caller takes ``rx.o``); the glue's CMAC domains renamed to ``sync``, the three
    added as submodules ``names`` = (transmit glue, cable, receive glue). Returns ``(tx, cable, rx)``."""
    from amaranth.hdl import DomainRenamer
    from wirereduce.hdl.xilinx.cmac import CmacRxGlue, CmacTxGlue

    tx = CmacTxGlue(mtu, src_mac=src_mac)
    rx = CmacRxGlue(mtu, cut_through=cut_through)
    cable = CmacCable(latency, rate)
    m.submodules[names[0]] = DomainRenamer({"cmac_tx": "sync"})(tx)
    m.submodules[names[1]] = cable
    m.submodules[names[2]] = DomainRenamer({"cmac_rx": "sync"})(rx)
    wiring.connect(m, src, tx.i)
    wiring.connect(m, tx.cmac, cable.tx)
    wiring.connect(m, cable.rx, rx.cmac)
    if dst is not None:
        wiring.connect(m, rx.o, dst)
    return tx, cable, rx


def _cmac_links(m, ring, mtu, latency, rate, flip_link, flip_block):
    """Cable the ring ``ring`` (512-bit nodes) with 100G CMAC glue, single clock.

    Each direction of each ring link is ``node.cw_out`` (or ``ccw_out``) →
    :class:`~wirereduce.hdl.xilinx.cmac.CmacTxGlue` → :class:`CmacCable` (``latency`` cycles,
    ``rate`` wire bytes a cycle) → :class:`~wirereduce.hdl.xilinx.cmac.CmacRxGlue` with
    ``cut_through=True`` → the next node's ``cw_in`` (``ccw_in``), the glue's CMAC domains
    renamed to ``sync``. As on the 10G ring, a frame found bad on a cable is passed on marked
    ``bad`` and leaves every later hop with ``tuser`` set (stomped). The node's ``cw``/``ccw``
    port counters come from the glue (:func:`~wirereduce.hdl.xilinx.cmac.cmac_port_stats`); the
    host links stay :class:`LinkModel` s (the U55C's host port is not Ethernet).

    Fault injection: the cable from node ``flip_link`` to node ``flip_link + 1`` (cw) flips a
    bit of its ``flip_block``-th beat (:class:`CmacCable`; ``flip_block = 0``: never).
    """
    from wirereduce.hdl.eth.port import port_counters
    from wirereduce.hdl.xilinx.cmac import cmac_port_stats

    n = len(ring)
    rxs = [{} for _ in ring]    # each node's receive glue by port ("cw": feeds cw_in, "ccw": ccw_in)
    txs = [{} for _ in ring]    # its transmit glue by the same port (the "cw" port sends ccw_out)
    for k in range(n):
        nxt = (k + 1) % n
        # (name, source stream, sink stream, sending node and its port, receiving node and its port)
        for name, src, dst, (s_node, s_port), (r_node, r_port), flip in (
                (f"cw{k}_{nxt}", ring[k].cw_out, ring[nxt].cw_in, (k, "ccw"), (nxt, "cw"), flip_link == k),
                (f"ccw{nxt}_{k}", ring[nxt].ccw_out, ring[k].ccw_in, (nxt, "cw"), (k, "ccw"), None)):
            tx, cable, rx = cmac_cable(m, (f"cmac_{name}_tx", f"cmac_{name}", f"cmac_{name}_rx"), src, dst, mtu,
                                       latency, rate, eth_mac(s_node, 0 if s_port == "ccw" else 1))
            if flip is not None:
                m.d.comb += [cable.flip.eq(flip), cable.flip_beat.eq(flip_block)]
            txs[s_node][s_port] = tx
            rxs[r_node][r_port] = rx
    for node, rx_ports, tx_ports in zip(ring, rxs, txs):
        stats = {port: cmac_port_stats(rx_ports[port], tx_ports[port]) for port in rx_ports}
        m.d.comb += node.port_counters.eq(port_counters(stats))


def _cmac_host_tx(m, k, src, mtu, latency, rate):
    """Node ``k``'s results to its host over a 100G cable: ``src`` (the node's ``host_tx``) →
    CmacTxGlue → :class:`CmacCable` → CmacRxGlue (store and forward) → the returned stream.

    A frame the node sends marked ``bad`` (a chunk spoilt upstream, forwarded cut-through) leaves
    with ``tuser`` set and the host side's glue drops it whole, as a host NIC drops a frame with a
    stomped FCS; so the host never takes a spoilt sum, and the chunk is reported missing. The host
    side cannot be back-pressured (an Ethernet NIC): a host that stops reading loses frames
    (the glue's ``overflow``), which the frame player never does at ``tx_ready_prob = 1``.
    """
    _, _, rx = cmac_cable(m, (f"cmac_host{k}_tx", f"cmac_host{k}", f"cmac_nic{k}_rx"), src, None, mtu, latency, rate,
                          eth_mac(k, 2), cut_through=False)
    return rx.o


def network_verilog(nodes: int, config: NodeConfig | None = None, link_latency: int = 4,
                    host_links: bool = True, links: str = "model", link_rate: Fraction | int | None = None,
                    inject: bool = False, probe: bool = False) -> str:
    """Verilog text of a :class:`Network` with top module ``wirereduce_net``, boxed
    (``Network(boxed=True)``): the node is converted once, as module ``wirereduce_node``, and so is
    each kind of Ethernet port (``wirereduce_ethport``, ``wirereduce_ethport1``, …), each
    instantiated wherever the network has one; their texts follow the network's. A four-node
    Ethernet ring is then one node and four ports to convert instead of four and sixteen."""
    from amaranth.back import verilog
    from wirereduce.sim.cluster.vcache import cached_verilog

    top = Network(nodes, config, link_latency, host_links, links, link_rate, inject, probe, boxed=True)
    top._MustUse__silence = True   # a cached text leaves it unconverted

    def make():
        net = verilog.convert(top, name="wirereduce_net", emit_src=False)
        return net + top.boxes.verilog()

    # The key is what the network was built from after its checks and defaults, as schednet_verilog's.
    args = (top.nodes, top.config, top.link_latency, top.host_links, top.links, top.link_rate, top.inject,
            top._probing)
    return cached_verilog("network", args, make)
