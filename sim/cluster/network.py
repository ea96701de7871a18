"""The cables of simulated networks (:mod:`wirereduce.sim.cluster.schednet`): link models, 10G
Ethernet and 100G CMAC cables, fault injection and the flat host and injection ports.

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

from amaranth import Module, Mux, Signal
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.params import rejecting
from wirereduce.hdl.stream.frame import FrameArbiter, FrameStream, beat_layout

from wirereduce.config import check_width
from wirereduce.protocol import ETH_HEADER_BYTES, ETH_MIN_PAYLOAD_BYTES, ETH_OVERHEAD_BYTES

__all__ = ["LinkModel", "CmacCable", "host_wires", "line_rate_gbps", "clock_mhz", "bytes_per_cycle",
           "line_bytes_per_cycle", "LINE_RATE_GBPS", "CLOCK_MHZ", "LINKS", "check_links", "eth_mac", "eth_port",
           "delayed"]

# Link timing, defined here once for the network, the engines and the benchmark.


#: Design clock, MHz, of each board datapath width: 156.25 at 64 bit (the 10G MAC/PCS clock) and at
#: 256 bit (the VC709 PCIe top's engine, on the same clock as its 10G ports), 322.265625 at 512 bit
#: (the UltraScale+ CMAC's 100G user clock).
CLOCK_MHZ = {64: 156.25, 256: 156.25, 512: 322.265625}


def clock_mhz(width: int) -> float:
    """Design clock for a datapath width (:data:`CLOCK_MHZ`), scaled by width from 156.25 MHz at
    64 bit otherwise."""
    return CLOCK_MHZ.get(width, 156.25 * width / 64)


#: Ethernet line rate, Gbit/s, of the link each board datapath width serves: 10GbE at 64 bit and at
#: 256 bit (the VC709 PCIe top: its engine is 256 bit so that the host port carries 40 Gbit/s, its
#: network ports are the 10G cages, a frame filling a quarter of the engine's beats), 100GbE at 512 bit.
LINE_RATE_GBPS = {64: 10.0, 256: 10.0, 512: 100.0}


def line_rate_gbps(width: int) -> float:
    """Ethernet line rate a datapath width serves: 10 Gbit/s at 64 and 256 bit, 100 Gbit/s at 512 bit
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
    paced to about 61 % of the cycles; 256 bit: 10 Gbit/s / 156.25 MHz = 8 bytes a cycle, a quarter
    of a 32-byte beat.
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


def host_wires(m, top, k, rx, tx):
    """Connect ``top``'s flat ``host{k}_*`` ports (AXI4-Stream names, as :func:`injection_members`
    gives them without the ``inj`` prefix) to the stream ``rx`` (into the network) and ``tx``."""
    g = lambda s: getattr(top, f"host{k}_{s}")  # noqa: E731
    m.d.comb += [
        rx.payload.data.eq(g("rx_tdata")), rx.payload.keep.eq(g("rx_tkeep")),
        rx.payload.last.eq(g("rx_tlast")), rx.valid.eq(g("rx_tvalid")),
        g("rx_tready").eq(rx.ready),
        g("tx_tdata").eq(tx.payload.data), g("tx_tkeep").eq(tx.payload.keep),
        g("tx_tlast").eq(tx.payload.last), g("tx_tvalid").eq(tx.valid), g("tx_tuser").eq(tx.payload.bad),
        tx.ready.eq(g("tx_tready")),
    ]


#: What a simulated network's links are: link models, real 10G Ethernet (MAC + PCS), or 100G
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


#: Prefix of every address in an Ethernet-linked network (the ports' ``mac_prefix``).
ETH_MAC_PREFIX = 0x02_77_72_00_00_00


def eth_mac(node: int, port: int) -> int:
    """MAC address of port ``port`` of ``node`` in an Ethernet-linked network: locally
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
