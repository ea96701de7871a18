"""One 10G Ethernet port for a node: Ethernet II framing, the MAC and the 10GBASE-R PCS.

A node's ports carry wirereduce frames **without** the 14-byte Ethernet header (``docs/protocol.md``);
this module adds it on the way out and strips it on the way in, and puts :mod:`wirereduce.hdl.eth.mac`
and :mod:`wirereduce.hdl.eth.pcs` between the node and the line::

    tx ─► EthFramer ─► MacTx ─► Encoder ─► Scrambler ─┬─(cdc=False) line_tx: a 66-bit block a cycle
      (dst, src, 0x88B5)  (preamble, FCS, IFG)        └─(cdc=True)  TxGearbox ─► gt_tx_data (32 bit)

    rx ◄─ EthDeframer ◄─ RxDropBad ◄─ MacRx ◄─ Decoder ◄─ Descrambler ◄─┬─ line_rx (cdc=False)
      (EtherType check,  (bad frames            ▲ BlockLock, BerMonitor └─ RxGearbox ◄─ gt_rx_data
       padding trimmed)   dropped whole;
                          RxCutThrough: marked)

Blocks
------
:class:`EthFramer`
    Prepends destination MAC, source MAC and EtherType :data:`~wirereduce.protocol.ETHERTYPE`
    (a 14-byte realignment of the 64-bit beats, IEEE 802.3 clause 3.2.3 … 3.2.6).
:class:`EthDeframer`
    Strips the Ethernet header, drops and counts frames with another EtherType, and trims the
    zero padding a short frame got on the wire (clause 3.2.8) back to the wirereduce length.
:class:`EthPort10G`
    The whole port, single-clock for the simulated ring (``cdc=False``) or with the MAC and PCS
    in the transceiver's clock domains for a board (``cdc=True``).

Store and forward, or cut-through, on receive
---------------------------------------------
:class:`~wirereduce.hdl.eth.mac.MacRx` knows whether a frame is good only at its FCS, after the last
byte. By default :class:`~wirereduce.hdl.eth.mac.RxDropBad` holds each frame until it is complete and
drops bad ones (FCS, runt, oversize, code error) whole, so no beat of a bad frame ever reaches
the node; that costs one frame time of latency per receiving port (188 cycles for a 1500-byte
frame). With ``cut_through=True``, :class:`~wirereduce.hdl.eth.mac.RxCutThrough` passes beats on as
they arrive and marks a bad frame's last beat ``bad``: the node adds and forwards it at once, and
the transmitting port sends whatever it turned into with a stomped FCS (inverted,
:class:`~wirereduce.hdl.eth.mac.MacTx`), so the next hop drops it or, cut-through itself, passes it
on marked. The ring's ports are cut-through; the host-facing ports stay store and forward, so no
bad frame is ever written into a buffer slot or delivered to a host.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.hdl import DomainRenamer, EnableInserter
from amaranth.lib import cdc, data, fifo, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.eth.mac import FCS_BYTES, MacRx, MacTx, RxCutThrough, RxDropBad
from wirereduce.hdl.eth.pcs import (
    IDLE_COLUMN,
    BerMonitor,
    BlockLock,
    Decoder,
    Descrambler,
    Encoder,
    PCSRx,
    PCSTx,
    Scrambler,
    block_layout,
    xgmii_layout,
)
from wirereduce.hdl.params import rejecting
from wirereduce.hdl.stream.frame import FrameStream, beat_layout
from wirereduce.hdl.stream.realign import Realigner

from wirereduce.config import check_mtu
from wirereduce.protocol import ETH_HEADER_BYTES, ETH_PORT_COUNTERS, ETH_PORTS, ETHERTYPE, HEADER_BYTES, STATS_COUNTERS

__all__ = ["DEFAULT_LOCAL_MAC", "DEFAULT_PEER_MAC", "GT_WORD_BITS", "GT_CLOCK_MHZ", "eth_stats_layout",
           "check_mac", "eth_header", "max_frame_bytes", "rx_drops", "port_counters", "EthFramer", "EthDeframer",
           "EthPort10G"]

#: Locally administered unicast addresses (IEEE 802 U/L bit set) used when none is given.
DEFAULT_LOCAL_MAC = 0x02_77_72_00_00_00
DEFAULT_PEER_MAC = 0x02_77_72_00_00_01
#: Transceiver word width (bits) and word clock (MHz) of the board port: 10.3125 Gbaud / 32.
GT_WORD_BITS = 32
GT_CLOCK_MHZ = 322.265625

_BEAT = 8  # bytes per 64-bit beat


def eth_header(dst: int, src: int, ethertype: int = ETHERTYPE) -> bytes:
    """The 14-byte Ethernet II header as it goes on the wire: addresses and EtherType most
    significant byte first (IEEE 802.3 clauses 3.2.3 … 3.2.6), e.g.
    ``eth_header(0xFFFFFFFFFFFF, 0x020000000001)[12:] == b"\\x88\\xb5"``.

    Raises
    ------
    ValueError
        If an address is not a 48-bit int (:func:`check_mac`) or the EtherType not a 16-bit int.
    """
    check_mac("dst", dst)
    check_mac("src", src)
    if not isinstance(ethertype, int) or isinstance(ethertype, bool) or not 0 <= ethertype < 1 << 16:
        raise ValueError(f"ethertype must be a 16-bit int, not {ethertype!r}")
    return dst.to_bytes(6, "big") + src.to_bytes(6, "big") + ethertype.to_bytes(2, "big")


def max_frame_bytes(mtu: int) -> int:
    """Longest Ethernet frame of a node MTU, destination address to FCS: ``mtu + 14 + 4`` bytes
    (1518 at MTU 1500, 9018 at 9000; clause 4.4.2 maxBasicFrameSize for 1500)."""
    return mtu + ETH_HEADER_BYTES + FCS_BYTES


def eth_stats_layout() -> data.StructLayout:
    """:class:`EthPort10G` counters, 32 bits each, wrapping; all in the ``sync`` domain.

    ``rx_frames``: frames delivered to the node; ``rx_fcs_errors``, ``rx_runts``, ``rx_oversize``,
    ``rx_code_errors``: frames :class:`~wirereduce.hdl.eth.mac.MacRx` found bad and
    :class:`~wirereduce.hdl.eth.mac.RxDropBad` dropped (``rx_code_errors`` includes bad preambles);
    ``rx_overflow``: frames lost because the receive FIFO was full (a real link has no
    back-pressure); ``rx_ethertype_drops``: good frames with an EtherType other than 0x88B5;
    ``rx_short_drops``: frames too short to hold an Ethernet header and 3 bytes;
    ``rx_stomped``: frames that arrived with a stomped FCS (bad before they reached this link);
    ``tx_frames``: frames sent; ``tx_stomped``: of those, sent with a stomped FCS (a cut-through
    frame found bad upstream); ``tx_aborted``: frames ended with /E/ (an underrun).

    With ``cut_through`` a bad frame is not dropped but delivered marked ``bad``: it counts in its
    error counter and, being delivered, in ``rx_frames`` too.
    """
    return data.StructLayout({name: 32 for name in ETH_PORT_COUNTERS})


#: The :func:`eth_stats_layout` counters of frames that went bad on the link into a port, or that
#: the port could not take (``rx_stomped``, frames spoilt before this link, is not one of them).
RX_DROP_COUNTERS = ("rx_fcs_errors", "rx_runts", "rx_oversize", "rx_code_errors", "rx_overflow",
                    "rx_ethertype_drops", "rx_short_drops")


def rx_drops(stats):
    """Frames that went bad on the link into a port (or found no room), as one 32-bit wrapping
    value: the sum of the :data:`RX_DROP_COUNTERS` of ``stats`` (an :func:`eth_stats_layout`
    view). Store and forward, the port dropped them; cut-through, it passed them on marked, to
    be stomped. A node reports it in its ``link_drop_*`` STATS counters (``docs/protocol.md``):
    the counter that is not 0 names the link where frames were lost."""
    total = stats[RX_DROP_COUNTERS[0]]
    for name in RX_DROP_COUNTERS[1:]:
        total = total + stats[name]
    return total[:32]


def check_mac(name: str, mac) -> int:
    """Validate a MAC address given as an int (``0x0200_0000_0001``); returns it.

    Raises
    ------
    ValueError
        If ``mac`` is not an int of 0 … 2**48 - 1; the message names the parameter ``name``.
    """
    if not isinstance(mac, int) or isinstance(mac, bool) or not 0 <= mac < 1 << 48:
        raise ValueError(f"{name} must be a 48-bit MAC address as an int (0x0200_0000_0001), not {mac!r}")
    return mac


#: What :func:`port_counters` gives, in order: the last STATS values (``link_drop_{port}``, then
#: ``{port}_{counter}``), the node's ``port_counters`` input.
PORT_COUNTERS = (tuple(f"link_drop_{port}" for port in ETH_PORTS)
                 + tuple(f"{port}_{name}" for port in ETH_PORTS for name in ETH_PORT_COUNTERS))
assert STATS_COUNTERS[-len(PORT_COUNTERS):] == PORT_COUNTERS


def port_counters(stats):
    """The node's ``port_counters`` (:class:`~wirereduce.hdl.core.node.Node`) from the
    :attr:`EthPort10G.stats` of the Ethernet ports in front of it: ``stats`` maps each of
    :data:`~wirereduce.protocol.ETH_PORTS` (``host``, ``cw``, ``ccw``) that is Ethernet to its
    port's stats. Returns one value of :data:`PORT_COUNTERS` 32-bit counters: each port's
    :func:`rx_drops` (``link_drop_{port}``), then its counters (``{port}_{counter}``); 0 for a port
    not in ``stats``."""
    unknown = set(stats) - set(ETH_PORTS)
    if unknown:
        raise ValueError(f"ports must be among {ETH_PORTS}, not {sorted(unknown)}")
    zero = Const(0, 32)
    values = ([rx_drops(stats[port]) if port in stats else zero for port in ETH_PORTS]
              + [stats[port][name] if port in stats else zero for port in ETH_PORTS for name in ETH_PORT_COUNTERS])
    return Cat(*values)


def _nbytes(m, keep):
    """Bytes in a beat whose ``keep`` is contiguous from lane 0, as a Signal."""
    n = Signal(range(_BEAT + 1))
    for lane in range(_BEAT):
        with m.If(keep[lane]):
            m.d.comb += n.eq(lane + 1)
    return n


def _keep_of(n):
    """``keep`` with the low ``n`` lanes set (n a Value of 0 … 8)."""
    return Cat(*(n > k for k in range(_BEAT)))


class EthFramer(wiring.Component):
    """Node frames in, Ethernet II frames out: prepends ``dst``, ``src`` and EtherType 0x88B5.

    The byte shifting is a :class:`~wirereduce.hdl.stream.realign.Realigner` (insert 14 bytes):
    output beat 0 is the first 8 header bytes, beat 1 the last 6 and frame bytes 0–1, beat ``j`` ≥ 2
    frame bytes ``8j − 14 … 8j − 7``. A frame of ``n`` input beats leaves as ``n + 1`` beats, or
    ``n + 2`` when its last beat has more than 2 bytes. The input waits (``i.ready`` low) during
    output beat 0 and that extra tail beat, and otherwise takes a beat in every cycle the output
    does, so a frame whose beats arrive back to back leaves back to back (what
    :class:`~wirereduce.hdl.eth.mac.MacTx` needs). What this block adds: a new frame starts only
    while ``enable`` is high (the port's ``link_up``); a started frame always finishes.

    Parameters
    ----------
    dst, src : int
        48-bit MAC addresses (most significant byte first on the wire).

    Attributes
    ----------
    i : In(FrameStream(64))
        Wirereduce frames, at least 1 byte.
    o : Out(FrameStream(64))
        Ethernet frames without FCS.
    enable : In(1)

    Raises
    ------
    ValueError
        If an address is not a 48-bit int.
    """

    def __init__(self, dst: int = DEFAULT_PEER_MAC, src: int = DEFAULT_LOCAL_MAC):
        with rejecting(self):
            self.header = eth_header(dst, src)
        super().__init__({
            "i": In(FrameStream(64)),
            "o": Out(FrameStream(64)),
            "enable": In(1, init=1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.realign = ra = Realigner(64, insert=ETH_HEADER_BYTES)
        started = Signal()               # the frame's first beat has left: it finishes, enable or not
        go = self.enable | started
        m.d.comb += [
            ra.head.eq(int.from_bytes(self.header, "little")),
            ra.i.payload.eq(self.i.payload),
            ra.i.valid.eq(self.i.valid & go),
            self.i.ready.eq(ra.i.ready & go),
        ]
        wiring.connect(m, ra.o, wiring.flipped(self.o))
        with m.If(ra.o.valid & ra.o.ready):
            m.d.sync += started.eq(~ra.o.payload.last)
        return m


class EthDeframer(wiring.Component):
    """Ethernet II frames in, node frames out: checks and strips the 14-byte header.

    - A frame whose EtherType (bytes 12–13) is not :data:`~wirereduce.protocol.ETHERTYPE` is
      consumed and dropped whole before any beat leaves, and counted in ``ethertype_drops``.
    - A frame too short to carry the header plus 3 bytes (≤ 16 bytes) is dropped and counted in
      ``short_drops`` (:class:`~wirereduce.hdl.eth.mac.MacRx` never passes one: a good frame has at
      least 60 bytes).
    - **Padding.** The MAC pads short frames to 60 bytes (clause 3.2.8) and Ethernet carries no
      length for an EtherType frame, so the upper layer knows its own: for ``codec = NONE``
      (header byte 3) the frame is cut to ``16 + 4·count`` bytes when it is longer (CONTROL,
      STATS_REQUEST and short data frames). Compressed frames (``codec ≠ NONE``) are passed
      uncut: their length is in their tags, so one shorter than 46 bytes keeps its padding.

    The header comes off in a :class:`~wirereduce.hdl.stream.realign.Realigner` (strip 14 bytes):
    output beat ``j`` is input bytes ``14 + 8j … 21 + 8j``; the two header beats are taken without
    output, then one beat out for every beat in. On the realigner's side channel each beat carries
    whether its frame is dropped (EtherType, length: decided as input beats 0 and 1 go in), and
    whether it is the input frame's last beat, with its ``bad``; the drop and the padding cut are
    done on the realigner's output. ``bad`` on an input frame's last beat goes to its output
    frame's last beat; the last output beat of a frame cut short of its padding therefore waits
    until the padding's last beat (the verdict) has arrived, and leaves in that cycle.

    Attributes
    ----------
    i : In(FrameStream(64))
        Ethernet frames without FCS: good ones (from :class:`~wirereduce.hdl.eth.mac.RxDropBad`), or
        any with the verdict in ``bad`` (from :class:`~wirereduce.hdl.eth.mac.RxCutThrough`).
    o : Out(FrameStream(64))
        Wirereduce frames.
    frames, ethertype_drops, short_drops : Out(32)
        Wrapping counters.
    """

    def __init__(self):
        super().__init__({
            "i": In(FrameStream(64)),
            "o": Out(FrameStream(64)),
            "frames": Out(32), "ethertype_drops": Out(32), "short_drops": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        # Side channel: the frame is dropped; the input frame's last beat (taken in this output
        # beat's cycle) and its bad.
        side = data.StructLayout({"drop": 1, "end": 1, "bad": 1})
        m.submodules.realign = ra = Realigner(64, strip=ETH_HEADER_BYTES, side=side)

        # ---- Input: mark the beats of frames to drop, decided on input beats 0 and 1. ----
        beat = i.payload
        idx = Signal(range(3))                   # input beat of the frame: 0, 1, 2 = any later one
        dropping = Signal()                      # the current frame is dropped (from its beat 1 on)
        drop_now = Signal()
        ethertype = int.from_bytes(ETHERTYPE.to_bytes(2, "big"), "little")
        wrong_type = beat.data[32:48] != ethertype   # frame bytes 12–13, in input beat 1
        with m.Switch(idx):
            with m.Case(0):
                m.d.comb += drop_now.eq(beat.last)
            with m.Case(1):
                m.d.comb += drop_now.eq(beat.last | wrong_type)
            with m.Default():
                m.d.comb += drop_now.eq(dropping)
        m.d.comb += [
            ra.i.payload.data.eq(beat.data), ra.i.payload.keep.eq(beat.keep),
            ra.i.payload.last.eq(beat.last), ra.i.payload.bad.eq(beat.bad),
            ra.i.payload.side.drop.eq(drop_now), ra.i.payload.side.end.eq(beat.last),
            ra.i.payload.side.bad.eq(beat.bad),
            ra.i.valid.eq(i.valid), i.ready.eq(ra.i.ready),
        ]
        with m.If(i.valid & i.ready):
            with m.If(beat.last):
                m.d.sync += idx.eq(0)
            with m.Elif(idx < 2):
                m.d.sync += idx.eq(idx + 1)
            with m.If(idx == 1):
                m.d.sync += dropping.eq(drop_now)
            with m.If((idx < 2) & beat.last):
                m.d.sync += self.short_drops.eq(self.short_drops + 1)
            with m.Elif((idx == 1) & wrong_type):
                m.d.sync += self.ethertype_drops.eq(self.ethertype_drops + 1)

        # ---- Output: drop marked frames, cut the padding. ----
        r = ra.o
        rb = r.payload
        n = _nbytes(m, rb.keep)
        pos = Signal(16)                         # frame bytes sent so far (8 a beat)
        codec_none = Signal()
        limit = Signal(range(HEADER_BYTES + 4 * 65535 + 1))
        pend_data = Signal(64)                   # the cut last beat, waiting for the padding's end
        pend_keep = Signal(8)
        take = r.valid & r.ready

        def finish():
            m.d.sync += [self.frames.eq(self.frames + 1), pos.eq(0)]

        # The wirereduce length once the header's count is known: output beat 1 (frame bytes
        # 8 … 15) carries it in frame bytes 10–11.
        lim_now = Signal.like(limit)
        m.d.comb += lim_now.eq(Mux(pos == _BEAT, HEADER_BYTES + 4 * rb.data[16:32], limit))
        trim = Signal()
        m.d.comb += trim.eq(codec_none & (pos >= _BEAT) & (lim_now <= pos + _BEAT))
        left = Signal(range(2 * _BEAT))          # bytes of the frame left to send when trimming
        m.d.comb += left.eq(lim_now - pos)
        cut_keep = _keep_of(Mux(left < n, left, n))

        with m.FSM():
            with m.State("BODY"):
                with m.If(rb.side.drop):
                    m.d.comb += r.ready.eq(1)
                with m.Else():
                    ends = trim & (rb.last | rb.side.end)   # the cut, with the input frame's end
                    early = trim & ~ends                    # the cut, before the padding's end
                    m.d.comb += o.payload.data.eq(rb.data)
                    with m.If(trim):
                        m.d.comb += [o.payload.keep.eq(cut_keep), o.payload.last.eq(1),
                                     o.payload.bad.eq(rb.side.bad)]
                    with m.Else():
                        m.d.comb += [o.payload.keep.eq(rb.keep), o.payload.last.eq(rb.last),
                                     o.payload.bad.eq(rb.bad)]
                    with m.If(early):
                        m.d.comb += r.ready.eq(1)
                    with m.Else():
                        m.d.comb += [o.valid.eq(r.valid), r.ready.eq(o.ready)]
                    with m.If(take):
                        m.d.sync += pos.eq(pos + _BEAT)
                        with m.If(pos == 0):
                            m.d.sync += codec_none.eq(rb.data[24:32] == 0)  # frame byte 3
                        with m.If(pos == _BEAT):
                            m.d.sync += limit.eq(lim_now)
                        with m.If(early):
                            m.d.sync += [pend_data.eq(rb.data), pend_keep.eq(cut_keep)]
                            m.next = "PAD"
                        with m.Elif(o.payload.last):
                            finish()
                            with m.If(~rb.last):
                                m.next = "REST"
            with m.State("PAD"):
                # Padding is consumed; the held last beat leaves with the padding's last beat.
                m.d.comb += [o.payload.data.eq(pend_data), o.payload.keep.eq(pend_keep),
                             o.payload.last.eq(1), o.payload.bad.eq(rb.side.bad),
                             o.valid.eq(r.valid & rb.side.end), r.ready.eq(~rb.side.end | o.ready)]
                with m.If(take & rb.side.end):
                    finish()
                    m.next = "BODY"
                    with m.If(~rb.last):
                        m.next = "REST"
            with m.State("REST"):
                # The realigner's extra last beat of a frame already ended by the cut.
                m.d.comb += r.ready.eq(1)
                with m.If(r.valid & rb.last):
                    m.next = "BODY"
        return m


class _PulseCount(wiring.Component):
    """Counts in ``sync`` the increments of a counter that lives in another domain."""

    def __init__(self, domain: str):
        self._domain = domain
        super().__init__({"src": In(32), "count": Out(32)})

    def elaborate(self, platform):
        m = Module()
        prev = Signal(32)
        m.submodules.ps = ps = cdc.PulseSynchronizer(i_domain=self._domain, o_domain="sync")
        m.d[self._domain] += prev.eq(self.src)
        m.d.comb += ps.i.eq(prev != self.src)
        with m.If(ps.o):
            m.d.sync += self.count.eq(self.count + 1)
        return m


class EthPort10G(wiring.Component):
    """A 10GBASE-R Ethernet port for one node port: framing, MAC, PCS, status and counters.

    Parameters
    ----------
    mtu : int
        The node's MTU (largest wirereduce frame, bytes); the MAC accepts frames up to
        :func:`max_frame_bytes` (mtu + 18) and drops longer ones as oversize.
    cdc : bool
        ``True`` (a board): the MAC and PCS run in the transceiver's domains — ``gt_tx`` (the
        GTH's TXUSRCLK2, 322.265625 MHz at 32 bits: :data:`GT_CLOCK_MHZ`, :data:`GT_WORD_BITS`) and
        ``gt_rx`` (the recovered RXUSRCLK2) — with the 32-bit gearboxes; frames cross to and from
        ``sync`` through :class:`amaranth.lib.fifo.AsyncFIFO`. The PCS takes or gives an XGMII
        column in 16 of 33 word cycles, so the MAC runs in the GT domains under
        :class:`~amaranth.hdl.EnableInserter` (effectively 156.25 MHz). Transmit is store and
        forward across the crossing (a frame starts only once all of it is in the FIFO), so the
        MAC never underruns whatever ``sync`` runs at.
        ``False`` (the simulated ring): everything in ``sync`` at 156.25 MHz, where 10.3125 Gbaud is
        exactly one 66-bit block a cycle: ``line_tx`` carries the scrambled blocks, ``line_rx``
        takes them (a link model delays them), no gearbox, and block lock finds the sync headers
        at once (no slip needed).
    local_mac, peer_mac : int
        Source and destination addresses put on transmitted frames. Received frames are not
        filtered by address (a point-to-point link).
    rx_frames : int
        Receive FIFO depth in frames of ``max_frame_bytes(mtu)`` (≥ 1, default 2): what the node
        may fall behind the line before frames are lost (``stats.rx_overflow``).
    cut_through : bool
        Deliver frames as they arrive, a bad one with ``bad`` on its last beat
        (:class:`~wirereduce.hdl.eth.mac.RxCutThrough`), instead of holding each until its FCS is
        checked and dropping bad ones (:class:`~wirereduce.hdl.eth.mac.RxDropBad`, the default).
        Either way a frame that arrives with ``bad`` on ``tx`` leaves with a stomped FCS.

    Attributes
    ----------
    tx : In(FrameStream(64))
        Wirereduce frames to send (``sync``).
    rx : Out(FrameStream(64))
        Wirereduce frames received (``sync``), good ones only, Ethernet header stripped.
    link_up : Out(1)
        ``block_lock & ~hi_ber``; frames wait in ``tx`` while it is low.
    block_lock, hi_ber : Out(1)
        Receive PCS status (clauses 49.2.9, 49.2.14), synchronised to ``sync`` when ``cdc``.
    stats : Out(eth_stats_layout())
        Counters (``sync``).
    tx_tap : Out(beat_layout(64)); tx_tap_valid : Out(1)
        A copy of the Ethernet frames (header included, FCS not) as they leave the framer for
        the MAC, one beat in each cycle ``tx_tap_valid`` is high (``sync``): a capture point (pcap).
    line_tx : Out(block_layout)  — cdc=False only
        Scrambled 66-bit block sent this cycle (bit 0 of ``header`` first on the line).
    line_rx : In(block_layout)  — cdc=False only
        The block received this cycle.
    gt_tx_data : Out(32)  — cdc=True only
        TXDATA for a GTH with its gearbox off, ``gt_tx`` domain, bit 0 first.
    gt_rx_data : In(32)  — cdc=True only
        RXDATA, ``gt_rx`` domain, any bit alignment.

    Raises
    ------
    ValueError
        If ``mtu`` fails :func:`wirereduce.config.check_mtu`, an address is not 48 bits or
        ``rx_frames`` < 1.
    """

    def __init__(self, mtu: int, *, cdc: bool = True, local_mac: int = DEFAULT_LOCAL_MAC,
                 peer_mac: int = DEFAULT_PEER_MAC, rx_frames: int = 2, cut_through: bool = False):
        with rejecting(self):
            check_mtu(mtu)
            check_mac("local_mac", local_mac)
            check_mac("peer_mac", peer_mac)
            if not isinstance(rx_frames, int) or isinstance(rx_frames, bool) or rx_frames < 1:
                raise ValueError(f"rx_frames must be an int ≥ 1, not {rx_frames!r}")
        self.mtu = mtu
        self.cdc = bool(cdc)
        self.local_mac = local_mac
        self.peer_mac = peer_mac
        self.rx_frames = rx_frames
        self.cut_through = bool(cut_through)
        beat = FrameStream(64)
        members = {
            "tx": In(beat), "rx": Out(beat),
            "link_up": Out(1), "block_lock": Out(1), "hi_ber": Out(1),
            "stats": Out(eth_stats_layout()),
            "tx_tap": Out(beat_layout(64)), "tx_tap_valid": Out(1),
        }
        if self.cdc:
            members.update({"gt_tx_data": Out(GT_WORD_BITS), "gt_rx_data": In(GT_WORD_BITS)})
        else:
            members.update({"line_tx": Out(block_layout), "line_rx": In(block_layout)})
        super().__init__(members)

    @property
    def max_frame(self) -> int:
        return max_frame_bytes(self.mtu)

    def elaborate(self, platform):
        m = Module()
        max_frame = self.max_frame
        frame_beats = -(-max_frame // _BEAT)
        m.submodules.framer = framer = EthFramer(self.peer_mac, self.local_mac)
        m.submodules.deframer = deframer = EthDeframer()
        wiring.connect(m, wiring.flipped(self.tx), framer.i)
        wiring.connect(m, deframer.o, wiring.flipped(self.rx))
        m.d.comb += [
            framer.enable.eq(self.link_up),
            self.tx_tap_valid.eq(framer.o.valid & framer.o.ready),
            self.tx_tap.eq(framer.o.payload),
        ]
        st = self.stats
        m.d.comb += [st.rx_frames.eq(deframer.frames), st.rx_ethertype_drops.eq(deframer.ethertype_drops),
                     st.rx_short_drops.eq(deframer.short_drops)]
        rx_depth = self.rx_frames * frame_beats + 16
        drop_bad = RxCutThrough(max_frame, depth=rx_depth) if self.cut_through else RxDropBad(max_frame, depth=rx_depth)
        idle = xgmii_layout.const(IDLE_COLUMN).as_value()
        if not self.cdc:
            m.submodules.mac_tx = mac_tx = MacTx()
            m.submodules.mac_rx = mac_rx = MacRx(max_frame)
            m.submodules.drop_bad = drop_bad
            m.submodules.encoder = enc = Encoder()
            m.submodules.scrambler = scr = Scrambler()
            m.submodules.descrambler = dsc = Descrambler()
            m.submodules.decoder = dec = Decoder()
            m.submodules.lock = lock = BlockLock()
            m.submodules.ber = ber = BerMonitor()
            wiring.connect(m, framer.o, mac_tx.i)
            wiring.connect(m, enc.o, scr.i)
            m.d.comb += [
                enc.i.valid.eq(1), enc.i.payload.eq(Cat(mac_tx.xgmii.data, mac_tx.xgmii.ctrl)),
                scr.o.ready.eq(1), self.line_tx.eq(scr.o.payload),
                dsc.i.valid.eq(1), dsc.i.payload.eq(self.line_rx),
                lock.header.eq(self.line_rx.header), lock.valid.eq(1),
                ber.header.eq(self.line_rx.header), ber.valid.eq(1), ber.block_lock.eq(lock.block_lock),
                dec.link_ok.eq(lock.block_lock & ~ber.hi_ber),
                Cat(mac_rx.xgmii.data, mac_rx.xgmii.ctrl).eq(Mux(dec.o.valid, dec.o.payload.as_value(), idle)),
                self.block_lock.eq(lock.block_lock), self.hi_ber.eq(ber.hi_ber),
                self.link_up.eq(lock.block_lock & ~ber.hi_ber),
            ]
            wiring.connect(m, dsc.o, dec.i)
            wiring.connect(m, mac_rx.o, drop_bad.i)
            wiring.connect(m, drop_bad.o, deframer.i)
            m.d.comb += [
                st.rx_fcs_errors.eq(mac_rx.stats.fcs_errors), st.rx_runts.eq(mac_rx.stats.runts),
                st.rx_oversize.eq(mac_rx.stats.oversize), st.rx_code_errors.eq(mac_rx.stats.errors),
                st.rx_overflow.eq(drop_bad.overflow), st.rx_stomped.eq(mac_rx.stats.stomped),
                st.tx_frames.eq(mac_tx.stats.frames), st.tx_stomped.eq(mac_tx.stats.stomped),
                st.tx_aborted.eq(mac_tx.stats.aborted),
                mac_tx.stomp.eq(mac_tx.i.payload.bad),
            ]
            return m

        # ---- cdc=True: MAC and PCS in the transceiver domains -------------------------------------
        blay = beat_layout(64)
        depth = 1 << (frame_beats + 8).bit_length()       # a whole frame and then some, power of 2
        # Transmit: beats and end-of-frame tokens cross together; gt_tx starts a frame only once its
        # token (written with its last beat) has arrived, so every beat of it is readable.
        m.submodules.tx_beats = tx_beats = fifo.AsyncFIFO(width=blay.size, depth=depth, w_domain="sync",
                                                          r_domain="gt_tx")
        m.submodules.tx_tokens = tx_tokens = fifo.AsyncFIFO(width=1, depth=depth, w_domain="sync",
                                                            r_domain="gt_tx")
        m.d.comb += [
            framer.o.ready.eq(tx_beats.w_rdy & tx_tokens.w_rdy),
            tx_beats.w_data.eq(framer.o.payload.as_value()),
            tx_beats.w_en.eq(framer.o.valid & framer.o.ready),
            tx_tokens.w_en.eq(framer.o.valid & framer.o.ready & framer.o.payload.last),
        ]
        m.submodules.pcs_tx = pcs_tx = DomainRenamer("gt_tx")(PCSTx(GT_WORD_BITS))
        tx_en = Signal()
        m.d.comb += tx_en.eq(pcs_tx.xgmii.ready)
        mac_tx = MacTx()
        m.submodules.mac_tx = DomainRenamer("gt_tx")(EnableInserter(tx_en)(mac_tx))
        sending = Signal()
        stored = data.View(blay, tx_beats.r_data)
        take = Signal()
        m.d.comb += [
            mac_tx.i.valid.eq(sending & tx_beats.r_rdy),
            mac_tx.i.payload.eq(stored),
            mac_tx.stomp.eq(stored.bad),
            take.eq(mac_tx.i.valid & mac_tx.i.ready & tx_en),
            tx_beats.r_en.eq(take),
            tx_tokens.r_en.eq(~sending & tx_tokens.r_rdy),
            pcs_tx.xgmii.valid.eq(1),
            pcs_tx.xgmii.payload.eq(Cat(mac_tx.xgmii.data, mac_tx.xgmii.ctrl)),
            self.gt_tx_data.eq(pcs_tx.tx_data),
        ]
        with m.If(~sending & tx_tokens.r_rdy):
            m.d.gt_tx += sending.eq(1)
        with m.Elif(take & stored.last):
            m.d.gt_tx += sending.eq(0)

        # Receive: the MAC takes a column whenever the PCS gives one; RxDropBad, in gt_rx, holds
        # each frame until its verdict and then writes it into the crossing FIFO.
        m.submodules.pcs_rx = pcs_rx = DomainRenamer("gt_rx")(PCSRx(GT_WORD_BITS))
        rx_en = Signal()
        m.d.comb += [pcs_rx.rx_data.eq(self.gt_rx_data), rx_en.eq(pcs_rx.xgmii.valid)]
        mac_rx = MacRx(max_frame)
        m.submodules.mac_rx = DomainRenamer("gt_rx")(EnableInserter(rx_en)(mac_rx))
        m.submodules.drop_bad = DomainRenamer("gt_rx")(drop_bad)
        m.d.comb += [
            Cat(mac_rx.xgmii.data, mac_rx.xgmii.ctrl).eq(pcs_rx.xgmii.payload.as_value()),
            drop_bad.i.payload.eq(mac_rx.o.payload),
            drop_bad.i.valid.eq(mac_rx.o.valid & rx_en),  # MacRx's output register holds between enables
        ]
        m.submodules.rx_beats = rx_beats = fifo.AsyncFIFO(width=blay.size, depth=depth, w_domain="gt_rx",
                                                          r_domain="sync")
        m.d.comb += [
            rx_beats.w_data.eq(drop_bad.o.payload.as_value()),
            rx_beats.w_en.eq(drop_bad.o.valid),
            drop_bad.o.ready.eq(rx_beats.w_rdy),
            deframer.i.valid.eq(rx_beats.r_rdy),
            deframer.i.payload.eq(rx_beats.r_data),
            rx_beats.r_en.eq(deframer.i.ready),
        ]

        # Status and counters into sync.
        lock_s, ber_s = Signal(), Signal()
        m.submodules.sync_lock = cdc.FFSynchronizer(pcs_rx.block_lock, lock_s, o_domain="sync")
        m.submodules.sync_ber = cdc.FFSynchronizer(pcs_rx.hi_ber, ber_s, o_domain="sync")
        m.d.comb += [self.block_lock.eq(lock_s), self.hi_ber.eq(ber_s), self.link_up.eq(lock_s & ~ber_s)]
        for name, domain, src in (
            ("rx_fcs_errors", "gt_rx", mac_rx.stats.fcs_errors), ("rx_runts", "gt_rx", mac_rx.stats.runts),
            ("rx_oversize", "gt_rx", mac_rx.stats.oversize), ("rx_code_errors", "gt_rx", mac_rx.stats.errors),
            ("rx_overflow", "gt_rx", drop_bad.overflow), ("rx_stomped", "gt_rx", mac_rx.stats.stomped),
            ("tx_frames", "gt_tx", mac_tx.stats.frames), ("tx_stomped", "gt_tx", mac_tx.stats.stomped),
            ("tx_aborted", "gt_tx", mac_tx.stats.aborted),
        ):
            m.submodules[f"count_{name}"] = pc = _PulseCount(domain)
            m.d.comb += [pc.src.eq(src), st[name].eq(pc.count)]
        return m

