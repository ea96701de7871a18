"""One 10G Ethernet port for a node: Ethernet II framing, the MAC and the 10GBASE-R PCS.

A node's ports carry wirereduce frames **without** the 14-byte Ethernet header (``docs/protocol.md``);
this module adds it on the way out and strips it on the way in, and puts :mod:`wirereduce.hdl.eth.mac`
and :mod:`wirereduce.hdl.eth.pcs` between the node and the line::

    EthPort10G (single clock, sync: the simulated ring)

    tx ─► EthFramer ─► MacTx ─► Encoder ─► Scrambler ─► line_tx: a 66-bit block a cycle
      (dst, src, 0x88B5)  (preamble, FCS, IFG)
          └── MacPcsTx ─────────────────────┘
    rx ◄─ EthDeframer ◄─ RxDropBad ◄─ MacRx ◄─ Decoder ◄─ Descrambler ◄─ line_rx
      (EtherType check,  (bad frames            ▲ BlockLock, BerMonitor
       padding trimmed)   dropped whole;
                          RxCutThrough: marked)
                        └── MacPcsRx ──────────────────────────────┘

    EthPort10GCdc (the board): the same pieces, MacPcsTx and MacPcsRx in the transceiver's domains

    tx ─► EthFramer ─► AsyncFIFO ─► MacPcsTx ─► TxGearbox ─► gt_tx_data (32 bit)
    rx ◄─ EthDeframer ◄─ AsyncFIFO ◄─ MacPcsRx ◄─ RxGearbox ◄─ gt_rx_data
          (sync)        (crossing)    (gt_tx, gt_rx)
    block_lock, hi_ber ◄─ FFSynchronizer; stats ◄─ the MAC counters' increments, counted again

Blocks
------
:class:`EthFramer`
    Prepends destination MAC, source MAC and EtherType :data:`~wirereduce.protocol.ETHERTYPE`
    (a 14-byte realignment of the 64-bit beats, IEEE 802.3 clause 3.2.3 … 3.2.6).
:class:`EthDeframer`
    Strips the Ethernet header, drops and counts frames with another EtherType, and trims the
    zero padding a short frame got on the wire (clause 3.2.8) back to the wirereduce length.
:class:`MacPcsTx`, :class:`MacPcsRx`
    The MAC and the PCS of one direction, single clock, on 66-bit blocks.
:class:`EthPort10G`
    The whole port, single clock (``sync``), for the simulated ring: ``line_tx``/``line_rx``.
:class:`EthPort10GCdc`
    The board's port: the same single-clock pieces, MAC and PCS moved into the transceiver's
    clock domains (``gt_tx``, ``gt_rx``) with 32-bit gearboxes, and the clock-domain crossings
    around them. A crossing wraps single-clock components; it is not a flag inside them.

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
from amaranth.lib import cdc, data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.eth.mac import FCS_BYTES, MacRx, MacTx, RxCutThrough, RxDropBad
from wirereduce.hdl.eth.pause import PAUSE_MAX, PauseRx, PauseTx
from wirereduce.hdl.eth.pcs import (
    BerMonitor,
    BlockLock,
    Decoder,
    Descrambler,
    Encoder,
    RxGearbox,
    Scrambler,
    TxGearbox,
    block_layout,
)
from wirereduce.hdl.params import rejecting
from wirereduce.hdl.stream.frame import FrameStream, beat_layout
from wirereduce.hdl.stream.realign import Realigner

from wirereduce.config import check_mtu
from wirereduce.protocol import (
    ETH_HEADER_BYTES,
    ETH_MIN_PAYLOAD_BYTES,
    ETH_PORT_COUNTERS,
    ETH_PORTS,
    ETHERTYPE,
    HEADER_BYTES,
    Codec,
    Flag,
    Opcode,
)

__all__ = ["DEFAULT_LOCAL_MAC", "DEFAULT_PEER_MAC", "DEFAULT_MAC_PREFIX", "PORT_ROLES", "role_mac",
           "check_mac_prefix", "GT_WORD_BITS", "GT_CLOCK_MHZ", "eth_stats_layout",
           "check_mac", "eth_header", "max_frame_bytes", "rx_drops", "port_counters", "EthFramer", "EthDeframer",
           "TX_LINE_COUNTERS", "RX_LINE_COUNTERS", "PauseBudget", "pause_budget", "MacPcsTx", "MacPcsRx",
           "EthPort10G", "EthPort10GCdc"]

#: Locally administered unicast addresses (IEEE 802 U/L bit set) used when none is given.
DEFAULT_LOCAL_MAC = 0x02_77_72_00_00_00
DEFAULT_PEER_MAC = 0x02_77_72_00_00_01
#: The locally administered prefix of the addresses a port derives from its node's rank
#: (:func:`role_mac`): ``02:77:72:00:rr:pp``.
DEFAULT_MAC_PREFIX = 0x02_77_72_00_00_00
#: The roles of a port whose addresses follow its node (:class:`EthPort10G` ``role``) and the port
#: index each puts in the low byte of its address: ``next`` faces rank + 1 (sends REDUCE, hears
#: BROADCAST), ``prev`` faces rank − 1 (sends BROADCAST, hears REDUCE), ``host`` the host.
PORT_ROLES = {"next": 0, "prev": 1, "host": 2}


def role_mac(prefix: int, rank: int, role: str) -> int:
    """The address of the ``role`` port of the node at ``rank``: ``prefix | rank << 8 | index``
    (:data:`PORT_ROLES`); what :class:`EthPort10G` with ``role`` computes in gateware, e.g.
    ``role_mac(DEFAULT_MAC_PREFIX, 3, "prev") == 0x02_77_72_00_03_01``."""
    return check_mac_prefix(prefix) | (rank << 8) | PORT_ROLES[role]


def check_mac_prefix(prefix) -> int:
    """Validate a :func:`role_mac` prefix: a 48-bit int whose low 16 bits are 0; returns it.

    Raises
    ------
    ValueError
        If it is not a 48-bit int or its low 16 bits (rank and port) are not 0.
    """
    check_mac("mac_prefix", prefix)
    if prefix & 0xFFFF:
        raise ValueError(f"mac_prefix must have its low 16 bits 0 (rank and port go there), not {prefix:#014x}")
    return prefix
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




def port_counters(stats, ports: tuple[str, ...] = ETH_PORTS):
    """A node's ``port_counters`` (:class:`~wirereduce.hdl.core.engine.Engine`) from the
    :attr:`EthPort10G.stats` of the Ethernet ports in front of it: ``stats`` maps each of
    ``ports`` (default :data:`~wirereduce.protocol.ETH_PORTS`: ``host``, ``cw``, ``ccw``; a schedule
    engine's: :func:`~wirereduce.protocol.engine_ports`) that is Ethernet to its port's stats.
    Returns one value of :data:`~wirereduce.protocol.PORT_COUNTERS` (the engine's:
    :func:`~wirereduce.protocol.engine_port_counters`) 32-bit counters: each port's
    :func:`rx_drops` (``link_drop_{port}``), ``drop_source`` (every port's ``rx_source_drops``),
    then each port's counters (``{port}_{counter}``); 0 for a port not in ``stats``.

    Raises
    ------
    ValueError
        A key of ``stats`` not in ``ports``.
    """
    unknown = set(stats) - set(ports)
    if unknown:
        raise ValueError(f"ports must be among {tuple(ports)}, not {sorted(unknown)}")
    zero = Const(0, 32)

    def value(port, name):
        return stats[port][name] if port in stats else zero

    drop_source = zero
    for port in stats:
        drop_source = drop_source + value(port, "rx_source_drops")
    values = ([rx_drops(stats[port]) if port in stats else zero for port in ports] + [drop_source[:32]]
              + [value(port, name) for port in ports for name in ETH_PORT_COUNTERS])
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
    dst_mac, src_mac : In(48)
        The addresses put on each frame (read as its first beat leaves); undriven, ``dst`` and
        ``src``. A port whose addresses follow the node's rank drives them.

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
            "dst_mac": In(48, init=dst), "src_mac": In(48, init=src),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.realign = ra = Realigner(64, insert=ETH_HEADER_BYTES)
        started = Signal()               # the frame's first beat has left: it finishes, enable or not
        go = self.enable | started
        m.d.comb += [
            ra.head.eq(Cat(*(mac[8 * k:8 * k + 8] for mac in (self.dst_mac, self.src_mac) for k in reversed(range(6))),
                           Const(int.from_bytes(self.header[12:], "little"), 16))),
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
    - **Source filter** (``source_filter=True``): a frame whose source address (bytes 6–11) is not
      ``expect`` while ``expect_valid`` is high is dropped whole and counted in ``source_drops``,
      unless its opcode (frame byte 15) is one of ``open_opcodes`` (the host port's CONTROL,
      STATS_REQUEST and SCHEDULE, which any host may send). While ``expect_valid`` is low only those pass.
      ``ctrl_src`` is the source address of the last CONTROL frame passed on. Checks in this
      order: short, EtherType, source.
    - **Padding** (clause 3.2.8: the MAC pads a frame to 60 bytes, a 46-byte payload, and an
      EtherType frame carries no length). Only a frame whose wirereduce part is **exactly 46
      bytes** is cut, to the length its header claims when that is shorter: 16 bytes for CONTROL,
      STATS_REQUEST, STATS and ``flags & LOST`` placeholders; ``16 + 4·count`` for
      ``codec = NONE``; for ``codec = INCEPTIONN_V1`` ``16 + tag_bytes(count) + Σ code bytes``,
      read from the tags (docs/codec.md). A frame of any other length is never cut, so the
      node's own length checks see what really arrived (a hostile over-long frame is not
      hidden), and so is a 46-byte frame whose claim is longer than 46 (the decompressor drops a
      compressed one).

    The header comes off in a :class:`~wirereduce.hdl.stream.realign.Realigner` (strip 14 bytes):
    output beat ``j`` is input bytes ``14 + 8j … 21 + 8j``; the two header beats are taken without
    output, then one beat out for every beat in. On the realigner's side channel each beat carries
    whether its frame is dropped (EtherType, length, source: decided as input beats 0 and 1 go
    in). A frame that may be padded (claim < 46 bytes, or a compressed one of at most 96
    elements) is held from its output beat 1 on in a 6-beat buffer until its end or its 47th
    byte shows whether it is padded; then the buffer leaves cut, or whole and unchanged, and a
    longer frame streams on. ``bad`` of the input's last beat goes to the output's last beat.

    Parameters
    ----------
    source_filter : bool
        Check source addresses (default False: every source passes, ``source_drops`` stays 0).
    open_opcodes : tuple of int
        Opcodes that pass from any source.

    Attributes
    ----------
    i : In(FrameStream(64))
        Ethernet frames without FCS: good ones (from :class:`~wirereduce.hdl.eth.mac.RxDropBad`), or
        any with the verdict in ``bad`` (from :class:`~wirereduce.hdl.eth.mac.RxCutThrough`).
    o : Out(FrameStream(64))
        Wirereduce frames.
    expect : In(48); expect_valid : In(1)
        The one source address that passes (besides ``open_opcodes``), and whether there is one.
    ctrl_src : Out(48)
        Source address of the last CONTROL frame passed on (0 before).
    frames, ethertype_drops, short_drops, source_drops : Out(32)
        Wrapping counters.
    """

    def __init__(self, source_filter: bool = False, open_opcodes: tuple = ()):
        self.source_filter = bool(source_filter)
        self.open_opcodes = tuple(int(op) for op in open_opcodes)
        super().__init__({
            "i": In(FrameStream(64)),
            "o": Out(FrameStream(64)),
            "expect": In(48), "expect_valid": In(1), "ctrl_src": Out(48),
            "frames": Out(32), "ethertype_drops": Out(32), "short_drops": Out(32), "source_drops": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        side = data.StructLayout({"drop": 1})
        m.submodules.realign = ra = Realigner(64, strip=ETH_HEADER_BYTES, side=side)

        # ---- Input: mark the beats of frames to drop, decided on input beats 0 and 1. ----
        beat = i.payload
        idx = Signal(range(3))                   # input beat of the frame: 0, 1, 2 = any later one
        dropping = Signal()                      # the current frame is dropped (from its beat 1 on)
        drop_now = Signal()
        src_hi = Signal(16)                      # frame bytes 6–7 (input beat 0)
        ethertype = int.from_bytes(ETHERTYPE.to_bytes(2, "big"), "little")
        wrong_type = beat.data[32:48] != ethertype   # frame bytes 12–13, in input beat 1
        src_bytes = [src_hi[0:8], src_hi[8:16]] + [beat.data[8 * k:8 * k + 8] for k in range(4)]
        src = Cat(*reversed(src_bytes))          # bytes 6 … 11, most significant first on the wire
        opcode = beat.data[56:64]                # frame byte 15: wirereduce byte 1
        wrong_src = Signal()
        if self.source_filter:
            open_op = 0
            for op in self.open_opcodes:
                open_op = open_op | (opcode == op)
            m.d.comb += wrong_src.eq(~open_op & ~(self.expect_valid & (src == self.expect)))
        with m.Switch(idx):
            with m.Case(0):
                m.d.comb += drop_now.eq(beat.last)
            with m.Case(1):
                m.d.comb += drop_now.eq(beat.last | wrong_type | wrong_src)
            with m.Default():
                m.d.comb += drop_now.eq(dropping)
        m.d.comb += [
            ra.i.payload.data.eq(beat.data), ra.i.payload.keep.eq(beat.keep),
            ra.i.payload.last.eq(beat.last), ra.i.payload.bad.eq(beat.bad),
            ra.i.payload.side.drop.eq(drop_now),
            ra.i.valid.eq(i.valid), i.ready.eq(ra.i.ready),
        ]
        with m.If(i.valid & i.ready):
            with m.If(beat.last):
                m.d.sync += idx.eq(0)
            with m.Elif(idx < 2):
                m.d.sync += idx.eq(idx + 1)
            with m.If(idx == 0):
                m.d.sync += src_hi.eq(beat.data[48:64])
            with m.If(idx == 1):
                m.d.sync += dropping.eq(drop_now)
                with m.If(~drop_now & (opcode == Opcode.CONTROL)):
                    m.d.sync += self.ctrl_src.eq(src)
            with m.If((idx < 2) & beat.last):
                m.d.sync += self.short_drops.eq(self.short_drops + 1)
            with m.Elif((idx == 1) & wrong_type):
                m.d.sync += self.ethertype_drops.eq(self.ethertype_drops + 1)
            with m.Elif((idx == 1) & wrong_src):
                m.d.sync += self.source_drops.eq(self.source_drops + 1)

        # ---- Output: drop marked frames; hold frames that may be padded, then cut or replay. ----
        r = ra.o
        rb = r.payload
        n = _nbytes(m, rb.keep)
        pos = Signal(16)                         # frame bytes that have left realigner so far
        take = r.valid & r.ready
        pad_len = ETH_MIN_PAYLOAD_BYTES          # 46
        head_only = Signal()                     # beat 0: CONTROL, STATS_REQUEST, STATS or LOST
        codec_byte = Signal(8)
        claim = Signal(range(HEADER_BYTES + 4 * 65536 + 1))   # the claimed length, from beat 1 on
        count = Signal(16)
        tag_words = Signal(3)                    # 64-bit tag words of a compressed frame (≤ 3 here)
        frame_bad = Signal()
        total = Signal(16)
        ended = Signal()                         # the held frame's last beat has been taken

        m.submodules.held = held = fifo.SyncFIFOBuffered(width=len(rb.data) + len(rb.keep) + 2, depth=8)
        h_data, h_keep = held.r_data[:64], held.r_data[64:72]
        h_last, h_bad = held.r_data[72], held.r_data[73]
        m.d.comb += held.w_data.eq(Cat(rb.data, rb.keep, rb.last, rb.bad))

        def head_only_of(d):
            op, flags = d[8:16], d[56:64]
            return ((op == Opcode.CONTROL) | (op == Opcode.STATS_REQUEST) | (op == Opcode.STATS)
                    | ((flags & Flag.LOST) != 0))

        # Beat 1 (frame bytes 8 … 15) carries count in frame bytes 10–11.
        count_now = rb.data[16:32]
        raw_claim = HEADER_BYTES + 4 * count_now
        compressed = codec_byte == Codec.INCEPTIONN_V1
        may_pad = Mux(head_only, 1, Mux(codec_byte == Codec.NONE, raw_claim < pad_len,
                                        compressed & (count_now <= 96)))
        # Code bytes of the 32 tags of one tag word: 0, 1, 2, 4 for tags 0 … 3 (docs/codec.md).
        code_bytes = 0
        for t in range(32):
            tag = rb.data[2 * t:2 * t + 2]
            code_bytes = code_bytes + Mux(tag == 3, 4, tag)
        word = (pos - 16)[3:6]                   # tag word index of the beat at pos ≥ 16

        with m.FSM():
            with m.State("BODY"):
                with m.If(rb.side.drop):
                    m.d.comb += r.ready.eq(1)
                with m.Elif((pos == _BEAT) & may_pad):
                    m.d.comb += [held.w_en.eq(r.valid), r.ready.eq(held.w_rdy)]
                    with m.If(take):
                        m.d.sync += [
                            pos.eq(pos + _BEAT), count.eq(count_now), ended.eq(rb.last),
                            frame_bad.eq(rb.bad), total.eq(pos + n),
                            claim.eq(Mux(head_only | ~compressed, Mux(head_only, HEADER_BYTES, raw_claim),
                                         HEADER_BYTES + 8 * ((count_now + 31) >> 5))),
                            tag_words.eq((count_now + 31) >> 5),
                        ]
                        m.next = "HOLD"
                        with m.If(rb.last):
                            m.next = "DECIDE"
                with m.Else():
                    m.d.comb += [o.payload.eq(rb), o.valid.eq(r.valid), r.ready.eq(o.ready)]
                    with m.If(take):
                        m.d.sync += pos.eq(pos + _BEAT)
                        with m.If(pos == 0):
                            m.d.sync += [head_only.eq(head_only_of(rb.data)), codec_byte.eq(rb.data[24:32])]
                        with m.If(rb.last):
                            m.d.sync += [self.frames.eq(self.frames + 1), pos.eq(0)]
            with m.State("HOLD"):
                # Beats 2 … 5 into the buffer; a compressed frame's tag words add their code bytes.
                m.d.comb += [held.w_en.eq(r.valid), r.ready.eq(held.w_rdy)]
                with m.If(take):
                    m.d.sync += [pos.eq(pos + _BEAT), total.eq(pos + n), frame_bad.eq(rb.bad), ended.eq(rb.last)]
                    with m.If(~head_only & compressed & (word < tag_words)):
                        m.d.sync += claim.eq(claim + code_bytes)
                    with m.If(rb.last | (pos + n > pad_len)):
                        m.next = "DECIDE"
            with m.State("DECIDE"):
                with m.If(ended & (total == pad_len) & (claim < pad_len)):
                    m.d.sync += pos.eq(_BEAT)
                    m.next = "CUT"
                with m.Else():
                    m.next = "REPLAY"
            with m.State("CUT"):
                # The held beats up to the claimed length leave, the last one cut; the rest is padding.
                left = claim - pos
                cut = left <= _BEAT
                m.d.comb += [o.payload.data.eq(h_data), o.payload.keep.eq(Mux(cut, _keep_of(left[:4]), h_keep)),
                             o.payload.last.eq(cut), o.payload.bad.eq(cut & frame_bad),
                             o.valid.eq(held.r_rdy), held.r_en.eq(o.ready)]
                with m.If(held.r_rdy & o.ready):
                    m.d.sync += pos.eq(pos + _BEAT)
                    with m.If(cut):
                        m.d.sync += self.frames.eq(self.frames + 1)
                        m.next = "FLUSH"
            with m.State("FLUSH"):
                m.d.comb += held.r_en.eq(1)
                with m.If(held.level == 0):
                    m.d.sync += pos.eq(0)
                    m.next = "BODY"
            with m.State("REPLAY"):
                # Not padding: the held beats leave as they came; a longer frame then streams on.
                m.d.comb += [o.payload.data.eq(h_data), o.payload.keep.eq(h_keep), o.payload.last.eq(h_last),
                             o.payload.bad.eq(h_bad), o.valid.eq(held.r_rdy), held.r_en.eq(o.ready)]
                with m.If(held.r_rdy & o.ready & h_last):
                    m.d.sync += [self.frames.eq(self.frames + 1), pos.eq(0)]
                    m.next = "BODY"
                with m.Elif(held.level == 0):
                    m.next = "BODY"     # (pos > 46 and not ended: BODY streams the rest as is)
        return m


#: The :func:`eth_stats_layout` counters kept on the line side of a port, by :class:`MacPcsTx` and
#: :class:`MacPcsRx` (in the transceiver domains of :class:`EthPort10GCdc`).
TX_LINE_COUNTERS = ("tx_frames", "tx_stomped", "tx_aborted", "tx_pause_frames")
RX_LINE_COUNTERS = ("rx_fcs_errors", "rx_runts", "rx_oversize", "rx_code_errors", "rx_overflow", "rx_stomped",
                    "rx_pause_frames")

#: Cycles (XGMII columns) of the pipelines a PAUSE decision crosses, rounded up, for
#: :func:`pause_budget`: the level compare and its synchroniser into the transmit domain
#: (``_DECIDE``); PauseTx → MacTx → encoder → scrambler → gearbox (``_TX_PIPE``); gearbox →
#: descrambler → decoder → MacRx → PauseRx, and the pause request's crossing (``_RX_PIPE``).
#: Each path grew by 2 when MacTx/encoder and decoder/MacRx got an output stage each for the
#: logic-level budget (docs/architecture.md "Timing budgets"), so both are 2 more than before.
_DECIDE, _TX_PIPE, _RX_PIPE = 8, 10, 18
#: Columns of a PAUSE frame on the wire: start column, 64 bytes, /T/ and the gap.
_PAUSE_COLUMNS = 11


class PauseBudget(tuple):
    """:func:`pause_budget`'s answer: ``(high, low, in_flight, depth)`` in 64-bit beats."""

    __slots__ = ()

    def __new__(cls, high, low, in_flight, depth):
        return super().__new__(cls, (high, low, in_flight, depth))

    high = property(lambda self: self[0])
    low = property(lambda self: self[1])
    in_flight = property(lambda self: self[2])
    depth = property(lambda self: self[3])


def pause_budget(max_frame: int, cable_cycles: int, store_and_forward: bool = False) -> PauseBudget:
    """Receive FIFO thresholds and depth for IEEE 802.3x flow control without loss.

    When the FIFO reaches ``high`` beats the port decides to send XOFF; until the peer stops, at
    most one beat a column keeps arriving for ``in_flight`` columns: the decision's own latency,
    this port's frame in progress (one ``max_frame`` frame, F + 3 columns with its start, tail and
    gap, F = ⌈max_frame / 8⌉), the XOFF frame (11 columns), the transmit pipeline, the cable
    (``cable_cycles``), the peer's receive pipeline up to its PAUSE detection, the peer's frame
    in progress (F + 3 again: a started frame always finishes, annex 31B.3.7), its transmit
    pipeline, the cable back and our receive pipeline. ``depth = high + in_flight + F``: the
    cut-through buffer admits a frame only if a whole ``max_frame`` fits
    (:class:`~wirereduce.hdl.eth.mac.RxCutThrough`), so the last frame of the flight still
    finds room. ``high = F`` (one frame of slack for normal jitter), ``low = F // 2`` (XON).
    ``store_and_forward``: the FIFO holds every frame whole before it leaves, so its level reaches F
    on every full-size frame however fast its reader is; ``high = 2F`` then (a frame held and one
    frame of slack; with ``high = F`` every full-size frame sent an XOFF and the peer stopped for
    the round trip to the XON: the schedule engines' host cables at 0.60 of the line rate).

    Returns
    -------
    PauseBudget
        ``(high, low, in_flight, depth)`` in beats; e.g. 1518-byte frames, 4-cycle cables:
        ``pause_budget(1518, 4) == (190, 95, 469, 849)``.

    Raises
    ------
    ValueError
        If ``cable_cycles`` is not an int ≥ 0 or ``max_frame`` not ≥ 64.
    """
    if not isinstance(cable_cycles, int) or isinstance(cable_cycles, bool) or cable_cycles < 0:
        raise ValueError(f"cable_cycles must be an int ≥ 0 (one-way cable + PHY latency, cycles), not {cable_cycles!r}")
    if not isinstance(max_frame, int) or max_frame < 64:
        raise ValueError(f"max_frame must be an int ≥ 64 bytes, not {max_frame!r}")
    f = -(-max_frame // _BEAT)
    one_way = _TX_PIPE + cable_cycles + _RX_PIPE
    in_flight = _DECIDE + (f + 3) + _PAUSE_COLUMNS + one_way + (f + 3) + one_way
    high = 2 * f if store_and_forward else f
    return PauseBudget(high, f // 2, in_flight, high + in_flight + f)


class MacPcsTx(wiring.Component):
    """Transmit MAC and PCS, single clock: Ethernet frames in, scrambled 66-bit blocks out.

    :class:`~wirereduce.hdl.eth.mac.MacTx` → :class:`~wirereduce.hdl.eth.pcs.Encoder` →
    :class:`~wirereduce.hdl.eth.pcs.Scrambler`. The MAC makes an XGMII column in each cycle the
    encoder takes one (it runs under :class:`~amaranth.hdl.EnableInserter` on the encoder's
    ``i.ready``): every cycle when ``o.ready`` is always 1 (:class:`EthPort10G`, a block a cycle),
    32 of 33 behind a 32-bit :class:`~wirereduce.hdl.eth.pcs.TxGearbox` (:class:`EthPort10GCdc`).
    ``bad`` on a frame's last beat sends it with a stomped FCS.

    IEEE 802.3x flow control: a :class:`~wirereduce.hdl.eth.pause.PauseTx` in front of the MAC,
    under the same clock enable (a cycle of it is an XGMII column, so the pause timer counts
    exact quanta of 8 columns), holds data frames while the peer's PAUSE timer runs
    (``peer_pause``), and sends PAUSE frames when ``xoff``/``xon`` ask (``flow_control``).

    Parameters
    ----------
    local_mac : int
        Source address of the PAUSE frames.
    flow_control : bool
        Send PAUSE frames (XOFF/XON); received ones are honoured either way.
    pause_quanta : int
        pause_time of an XOFF (1 … 65535).

    Attributes
    ----------
    i : In(FrameStream(64))
        Ethernet frames without FCS; a started frame's beats must come back to back (in enabled
        cycles), else the MAC ends it with /E/ (``tx_aborted``).
    o : Out(stream.Signature(block_layout))
        Scrambled blocks, bit 0 of ``header`` first on the line.
    xoff, xon : In(1)
        The receive FIFO is at or above its high-water mark / below its low-water mark.
    peer_pause : In(1); peer_quanta : In(16)
        A good PAUSE frame was received (one cycle, any cycle: it is held until the next
        enabled one) and its pause_time.
    stats : Out(StructLayout of :data:`TX_LINE_COUNTERS`)
        Wrapping 32-bit counters; ``tx_frames`` counts every frame the MAC ended, the PAUSE
        frames (also in ``tx_pause_frames``) included.
    """

    def __init__(self, local_mac: int = DEFAULT_LOCAL_MAC, *, flow_control: bool = False,
                 pause_quanta: int = PAUSE_MAX):
        self.local_mac = local_mac
        self.flow_control = bool(flow_control)
        self.pause_quanta = pause_quanta
        super().__init__({
            "i": In(FrameStream(64)),
            "o": Out(stream.Signature(block_layout)),
            "xoff": In(1), "xon": In(1), "peer_pause": In(1), "peer_quanta": In(16),
            "stats": Out(data.StructLayout({name: 32 for name in TX_LINE_COUNTERS})),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.encoder = enc = Encoder()
        m.submodules.scrambler = scr = Scrambler()
        en = Signal()
        mac_tx = MacTx()
        pause = PauseTx(self.local_mac, self.pause_quanta)
        m.submodules.mac_tx = EnableInserter(en)(mac_tx)
        m.submodules.pause_tx = EnableInserter(en)(pause)
        wiring.connect(m, enc.o, scr.i)
        wiring.connect(m, scr.o, wiring.flipped(self.o))
        # A PAUSE request waits here for the next enabled cycle (PauseTx sees it in exactly one).
        req, req_q = Signal(), Signal(16)
        with m.If(self.peer_pause):
            m.d.sync += [req.eq(1), req_q.eq(self.peer_quanta)]
        with m.Elif(en):
            m.d.sync += req.eq(0)
        m.d.comb += [
            en.eq(enc.i.ready),
            pause.enable.eq(self.flow_control),
            pause.xoff.eq(self.xoff), pause.xon.eq(self.xon),
            pause.peer_pause.eq(req), pause.peer_quanta.eq(req_q),
            pause.i.valid.eq(self.i.valid),
            pause.i.payload.eq(self.i.payload),
            self.i.ready.eq(pause.i.ready & en),
            mac_tx.i.valid.eq(pause.o.valid),
            mac_tx.i.payload.eq(pause.o.payload),
            pause.o.ready.eq(mac_tx.i.ready),
            mac_tx.stomp.eq(pause.o.payload.bad),
            enc.i.valid.eq(1),
            enc.i.payload.eq(Cat(mac_tx.xgmii.data, mac_tx.xgmii.ctrl)),
            self.stats.tx_frames.eq(mac_tx.stats.frames),
            self.stats.tx_stomped.eq(mac_tx.stats.stomped),
            self.stats.tx_aborted.eq(mac_tx.stats.aborted),
            self.stats.tx_pause_frames.eq(pause.sent),
        ]
        return m


class MacPcsRx(wiring.Component):
    """Receive PCS and MAC, single clock: 66-bit blocks in, checked Ethernet frames out.

    :class:`~wirereduce.hdl.eth.pcs.Descrambler` → :class:`~wirereduce.hdl.eth.pcs.Decoder` →
    :class:`~wirereduce.hdl.eth.mac.MacRx` → :class:`~wirereduce.hdl.eth.mac.RxDropBad` (or
    :class:`~wirereduce.hdl.eth.mac.RxCutThrough`), with :class:`~wirereduce.hdl.eth.pcs.BlockLock`
    and :class:`~wirereduce.hdl.eth.pcs.BerMonitor` on the sync headers. The MAC takes a column in
    each cycle the decoder gives one (:class:`~amaranth.hdl.EnableInserter` on its ``o.valid``):
    every cycle once the pipeline is full when a block comes every cycle (:class:`EthPort10G`), 32
    of 33 behind a 32-bit :class:`~wirereduce.hdl.eth.pcs.RxGearbox` (:class:`EthPort10GCdc`).

    Parameters
    ----------
    max_frame : int
        Longest frame the MAC accepts, bytes (:func:`max_frame_bytes`).
    depth : int
        Beats of the receive FIFO in the drop stage.
    cut_through : bool
        :class:`~wirereduce.hdl.eth.mac.RxCutThrough` instead of
        :class:`~wirereduce.hdl.eth.mac.RxDropBad`.

    Attributes
    ----------
    local_mac : int
        The port's address: PAUSE frames to it (or to 01-80-C2-00-00-01) are honoured.
    high, low : int, optional
        Receive FIFO levels (beats) of ``xoff`` and ``xon`` (:func:`pause_budget`); default
        never / never.

    Attributes
    ----------
    i : In(stream.Signature(block_layout, always_ready=True))
        Received blocks, one with each ``i.valid``.
    pause : Out(1); pause_quanta : Out(16)
        One cycle for each good PAUSE frame received
        (:class:`~wirereduce.hdl.eth.pause.PauseRx`, between the MAC and the FIFO: the frame is
        consumed), with its pause_time.
    xoff, xon : Out(1)
        The FIFO level is ≥ ``high`` / < ``low``.
    slip : Out(1)
        :class:`~wirereduce.hdl.eth.pcs.BlockLock`'s bit-slip request, for a gearbox in front;
        blocks that are aligned already never need it.
    o : Out(FrameStream(64))
        Ethernet frames without FCS; the line cannot wait, so frames the FIFO has no room for are
        lost (``rx_overflow``).
    block_lock, hi_ber : Out(1)
    stats : Out(StructLayout of :data:`RX_LINE_COUNTERS`)
        Wrapping 32-bit counters.
    """

    def __init__(self, max_frame: int, *, depth: int, cut_through: bool = False,
                 local_mac: int = DEFAULT_LOCAL_MAC, high: int | None = None, low: int | None = None):
        self.max_frame = max_frame
        self.depth = depth
        self.cut_through = bool(cut_through)
        self.local_mac = local_mac
        self.high = depth if high is None else high
        self.low = 0 if low is None else low
        super().__init__({
            "i": In(stream.Signature(block_layout, always_ready=True)),
            "slip": Out(1),
            "o": Out(FrameStream(64)),
            "block_lock": Out(1), "hi_ber": Out(1),
            "pause": Out(1), "pause_quanta": Out(16), "xoff": Out(1), "xon": Out(1),
            "stats": Out(data.StructLayout({name: 32 for name in RX_LINE_COUNTERS})),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.descrambler = dsc = Descrambler()
        m.submodules.decoder = dec = Decoder()
        m.submodules.lock = lock = BlockLock()
        m.submodules.ber = ber = BerMonitor()
        en = Signal()
        mac_rx = MacRx(self.max_frame)
        m.submodules.mac_rx = EnableInserter(en)(mac_rx)
        pause_rx = PauseRx(self.local_mac)
        m.submodules.pause_rx = EnableInserter(en)(pause_rx)
        drop = RxCutThrough if self.cut_through else RxDropBad
        m.submodules.drop_bad = drop_bad = drop(self.max_frame, depth=self.depth)
        wiring.connect(m, wiring.flipped(self.i), dsc.i)
        wiring.connect(m, dsc.o, dec.i)
        wiring.connect(m, drop_bad.o, wiring.flipped(self.o))
        st = self.stats
        m.d.comb += [
            lock.header.eq(self.i.payload.header), lock.valid.eq(self.i.valid),
            ber.header.eq(self.i.payload.header), ber.valid.eq(self.i.valid),
            ber.block_lock.eq(lock.block_lock),
            self.slip.eq(lock.slip),
            dec.link_ok.eq(lock.block_lock & ~ber.hi_ber),
            self.block_lock.eq(lock.block_lock), self.hi_ber.eq(ber.hi_ber),
            en.eq(dec.o.valid),
            Cat(mac_rx.xgmii.data, mac_rx.xgmii.ctrl).eq(dec.o.payload.as_value()),
            pause_rx.i.payload.eq(mac_rx.o.payload),
            pause_rx.i.valid.eq(mac_rx.o.valid),
            drop_bad.i.payload.eq(pause_rx.o.payload),
            drop_bad.i.valid.eq(pause_rx.o.valid & en),  # the registers hold between enables
            self.pause.eq(pause_rx.pause & en), self.pause_quanta.eq(pause_rx.quanta),
            self.xoff.eq(drop_bad.level >= self.high), self.xon.eq(drop_bad.level < self.low),
            st.rx_fcs_errors.eq(mac_rx.stats.fcs_errors), st.rx_runts.eq(mac_rx.stats.runts),
            st.rx_oversize.eq(mac_rx.stats.oversize), st.rx_code_errors.eq(mac_rx.stats.errors),
            st.rx_overflow.eq(drop_bad.overflow), st.rx_stomped.eq(mac_rx.stats.stomped),
            st.rx_pause_frames.eq(pause_rx.frames),
        ]
        return m


class _EthPort(wiring.Component):
    """What :class:`EthPort10G` and :class:`EthPort10GCdc` share: the parameters, the node-side
    members and, in ``sync``, the framing (:meth:`_framing`). ``line`` adds the line members."""

    def __init__(self, mtu: int, *, local_mac: int | None, peer_mac: int | None, rx_frames: int, cut_through: bool,
                 flow_control: bool, cable_cycles: int, pause_quanta: int, line: dict,
                 role: str | None = None, mac_prefix: int = DEFAULT_MAC_PREFIX):
        with rejecting(self):
            check_mtu(mtu)
            # An address given as None is an In(48) member of the same name instead (EthPort10G).
            addresses = {name: mac for name, mac in (("local_mac", local_mac), ("peer_mac", peer_mac))
                         if mac is not None}
            for name, mac in addresses.items():
                check_mac(name, mac)
            if not isinstance(rx_frames, int) or isinstance(rx_frames, bool) or rx_frames < 1:
                raise ValueError(f"rx_frames must be an int ≥ 1, not {rx_frames!r}")
            if role is not None and role not in PORT_ROLES:
                raise ValueError(f"role must be None or one of {', '.join(PORT_ROLES)}, not {role!r}")
            check_mac_prefix(mac_prefix)
            self.budget = pause_budget(max_frame_bytes(mtu), cable_cycles, store_and_forward=not cut_through)
            if (not isinstance(pause_quanta, int) or isinstance(pause_quanta, bool)
                    or not 1 <= pause_quanta <= PAUSE_MAX):
                raise ValueError(f"pause_quanta must be an int from 1 to {PAUSE_MAX}, not {pause_quanta!r}")
        self.role = role
        self.mac_prefix = mac_prefix
        self.flow_control = bool(flow_control)
        self.cable_cycles = cable_cycles
        self.pause_quanta = pause_quanta
        self.mtu = mtu
        for name, mac in addresses.items():
            setattr(self, name, mac)
        self.rx_frames = rx_frames
        self.cut_through = bool(cut_through)
        beat = FrameStream(64)
        super().__init__({
            "tx": In(beat), "rx": Out(beat),
            "link_up": Out(1), "block_lock": Out(1), "hi_ber": Out(1),
            "stats": Out(eth_stats_layout()),
            "tx_tap": Out(beat_layout(64)), "tx_tap_valid": Out(1),
            "rank": In(8), "nodes": In(8), "control_taken": In(1),
            **{name: In(48) for name in ("local_mac", "peer_mac") if name not in addresses},
            **line,
        })

    @property
    def max_frame(self) -> int:
        return max_frame_bytes(self.mtu)

    @property
    def _frame_beats(self) -> int:
        return -(-self.max_frame // _BEAT)

    @property
    def rx_depth(self) -> int:
        """Beats of the receive FIFO: ``rx_frames`` frames + 16, or with ``flow_control`` at least
        :func:`pause_budget`'s depth."""
        depth = self.rx_frames * self._frame_beats + 16
        return max(depth, self.budget.depth) if self.flow_control else depth

    def _mac_pcs(self):
        """The port's line side, single clock: ``(MacPcsTx(...), MacPcsRx(...))``."""
        fc = {"high": self.budget.high, "low": self.budget.low} if self.flow_control else {}
        return (MacPcsTx(self.local_mac, flow_control=self.flow_control, pause_quanta=self.pause_quanta),
                MacPcsRx(self.max_frame, depth=self.rx_depth, cut_through=self.cut_through,
                         local_mac=self.local_mac, **fc))

    def _framing(self, m):
        """Adds the :class:`EthFramer` and :class:`EthDeframer` (``sync``) between ``tx``/``rx``
        and the MAC side, the tap, the deframer's counters and ``link_up`` (from ``block_lock``
        and ``hi_ber``, which the port drives); returns the framer's output and the deframer's
        input, the port's Ethernet frames out and in."""
        fixed = lambda mac, default: mac if isinstance(mac, int) else default  # noqa: E731
        m.submodules.framer = framer = EthFramer(fixed(self.peer_mac, DEFAULT_PEER_MAC),
                                                 fixed(self.local_mac, DEFAULT_LOCAL_MAC))
        if self.role is None:  # addresses taken as inputs (a role drives them in _addresses)
            if not isinstance(self.peer_mac, int):
                m.d.comb += framer.dst_mac.eq(self.peer_mac)
            if not isinstance(self.local_mac, int):
                m.d.comb += framer.src_mac.eq(self.local_mac)
        # host → node commands any host may send: CONTROL, STATS_REQUEST and a schedule engine's
        # SCHEDULE (its table is loaded before the CONTROL that locks the port; a ring node drops it)
        opened = (Opcode.CONTROL, Opcode.STATS_REQUEST, Opcode.SCHEDULE) if self.role == "host" else ()
        m.submodules.deframer = deframer = EthDeframer(self.role is not None, opened)
        wiring.connect(m, wiring.flipped(self.tx), framer.i)
        wiring.connect(m, deframer.o, wiring.flipped(self.rx))
        st = self.stats
        m.d.comb += [
            self.link_up.eq(self.block_lock & ~self.hi_ber),
            framer.enable.eq(self.link_up),
            self.tx_tap_valid.eq(framer.o.valid & framer.o.ready),
            self.tx_tap.eq(framer.o.payload),
            st.rx_frames.eq(deframer.frames), st.rx_ethertype_drops.eq(deframer.ethertype_drops),
            st.rx_short_drops.eq(deframer.short_drops), st.rx_source_drops.eq(deframer.source_drops),
        ]
        if self.role is not None:
            self._addresses(m, framer, deframer)
        return framer.o, deframer.i

    def _addresses(self, m, framer, deframer):
        """The run-time addresses of a port with a ``role`` (docs/protocol.md, Source filter).

        All follow the node's CONTROL (``control_taken``, ``rank``, ``nodes``): ``configured`` from
        the first one on. Own address :func:`role_mac` of ``rank``. A ring port sends to and hears
        only its neighbour's facing port (``next``: rank + 1's ``prev`` port; ``prev``: rank − 1's
        ``next`` port, modulo ``nodes``). The host port locks, at each CONTROL the node takes, to
        the source address of the last CONTROL frame it passed on, sends to it, and hears only it
        (besides CONTROL, STATS_REQUEST and SCHEDULE, from anyone); before the first, it sends to the
        broadcast address."""
        prefix = Const(self.mac_prefix, 48)
        rank, nodes = self.rank, self.nodes
        configured = Signal()
        with m.If(self.control_taken):
            m.d.sync += configured.eq(1)
        own = prefix | (rank << 8) | PORT_ROLES[self.role]
        if self.role == "host":
            lock = Signal(48)
            with m.If(self.control_taken):
                m.d.sync += lock.eq(deframer.ctrl_src)
            peer = Mux(configured, lock, Const(0xFFFF_FFFF_FFFF, 48))
        elif self.role == "next":
            after = Mux(rank + 1 >= nodes, 0, rank + 1)[:8]
            peer = prefix | (after << 8) | PORT_ROLES["prev"]
        else:
            before = Mux(rank == 0, nodes - 1, rank - 1)[:8]
            peer = prefix | (before << 8) | PORT_ROLES["next"]
        m.d.comb += [
            framer.src_mac.eq(own), framer.dst_mac.eq(peer),
            deframer.expect.eq(peer), deframer.expect_valid.eq(configured),
        ]


class EthPort10G(_EthPort):
    """A 10GBASE-R Ethernet port for one node port, single clock: framing, MAC, PCS, status and
    counters, all in ``sync`` (the simulated ring).

    At 156.25 MHz, 10.3125 Gbaud is exactly one 66-bit block a cycle: ``line_tx`` carries the
    scrambled blocks, ``line_rx`` takes them (a link model delays them), no gearbox, and block
    lock finds the sync headers at once (no slip needed). :class:`EthFramer` →
    :class:`MacPcsTx` → ``line_tx``; ``line_rx`` → :class:`MacPcsRx` → :class:`EthDeframer`.
    :class:`EthPort10GCdc` is the same port with the MAC and PCS in a transceiver's clock domains.

    Parameters
    ----------
    mtu : int
        The node's MTU (largest wirereduce frame, bytes); the MAC accepts frames up to
        :func:`max_frame_bytes` (mtu + 18) and drops longer ones as oversize.
    local_mac, peer_mac : int or None
        Source and destination addresses put on transmitted frames when ``role`` is None;
        received frames are then not filtered by address. ``local_mac`` is also the source of the
        PAUSE frames sent and a PAUSE destination honoured, role or not. None: the address is an
        ``In(48)`` member of the same name, driven by whoever builds the port, so that ports that
        differ only in their addresses are one design: the simulated networks convert
        it once for all their ports (``sim/cluster/box.py``), not once per port.
    role : None, "host", "next" or "prev"
        The port's place at its node (:data:`PORT_ROLES`). With a role, the addresses follow the
        node's CONTROL (``rank``, ``nodes``, ``control_taken``) and the port drops, and counts in
        ``stats.rx_source_drops``, every frame not from the one source it listens to: for a ring
        port its neighbour's facing port (:func:`role_mac`), for the host port the sender of the
        CONTROL the node took (CONTROL, STATS_REQUEST and SCHEDULE pass from anyone). Before the first
        CONTROL a ring port takes nothing and the host port only CONTROL, STATS_REQUEST and SCHEDULE
        (docs/protocol.md, Source filter).
    mac_prefix : int
        The :func:`role_mac` prefix (low 16 bits 0), default :data:`DEFAULT_MAC_PREFIX`.
    rx_frames : int
        Receive FIFO depth in frames of ``max_frame_bytes(mtu)`` (≥ 1, default 2): what the node
        may fall behind the line before frames are lost (``stats.rx_overflow``).
    cut_through : bool
        Deliver frames as they arrive, a bad one with ``bad`` on its last beat
        (:class:`~wirereduce.hdl.eth.mac.RxCutThrough`), instead of holding each until its FCS is
        checked and dropping bad ones (:class:`~wirereduce.hdl.eth.mac.RxDropBad`, the default).
        Either way a frame that arrives with ``bad`` on ``tx`` leaves with a stomped FCS.
    flow_control : bool
        IEEE 802.3x: send PAUSE frames when the receive FIFO passes its high-water mark (XOFF,
        refreshed) and when it drains below the low-water mark (XON), sized by
        :func:`pause_budget` so that nothing is lost (the FIFO grows to its ``depth``). PAUSE
        frames received are honoured either way (``hdl/eth/pause.py``, annex 31B).
    cable_cycles : int
        One-way cable + PHY latency (cycles) the flow-control budget allows for (default 64:
        about 70 m of fibre plus the transceivers at 156.25 MHz).
    pause_quanta : int
        pause_time of the XOFF frames (1 … 65535 quanta of 512 bit times; default 65535).
    tx_start : int, optional
        A :class:`TxStartBuffer` in front of the MAC that starts a frame once this many beats of it
        (1 … 32), or all of it, are in: its source may then fall behind by that many cycles in all
        without the MAC underrunning, at that many cycles of latency. For a source that feeds
        several ports in lock-step (a schedule engine's multicast). Ports with ``flow_control`` have
        one of 32 beats anyway.

    Attributes
    ----------
    tx : In(FrameStream(64))
        Wirereduce frames to send (``sync``).
    rx : Out(FrameStream(64))
        Wirereduce frames received (``sync``), good ones only, Ethernet header stripped.
    link_up : Out(1)
        ``block_lock & ~hi_ber``; frames wait in ``tx`` while it is low.
    block_lock, hi_ber : Out(1)
        Receive PCS status (clauses 49.2.9, 49.2.14), in ``sync``.
    stats : Out(eth_stats_layout())
        Counters (``sync``).
    rank, nodes, control_taken : In(8), In(8), In(1)
        The engine's (:class:`~wirereduce.hdl.core.engine.Engine`) outputs of the same names (used with
        a ``role`` only).
    tx_tap : Out(beat_layout(64)); tx_tap_valid : Out(1)
        A copy of the Ethernet frames (header included, FCS not) as they leave the framer for
        the MAC, one beat in each cycle ``tx_tap_valid`` is high (``sync``): a capture point (pcap).
    line_tx : Out(block_layout)
        Scrambled 66-bit block sent this cycle (bit 0 of ``header`` first on the line).
    line_rx : In(block_layout)
        The block received this cycle.
    local_mac, peer_mac : In(48)
        Only for an address given as None: the address, constant in practice.

    Raises
    ------
    ValueError
        If ``mtu`` fails :func:`wirereduce.config.check_mtu`, an address is not 48 bits,
        ``rx_frames`` < 1, ``cable_cycles`` < 0, ``pause_quanta`` is not 1 … 65535, ``role`` is unknown
        or ``mac_prefix`` fails :func:`check_mac_prefix`.
    """

    def __init__(self, mtu: int, *, local_mac: int = DEFAULT_LOCAL_MAC, peer_mac: int = DEFAULT_PEER_MAC,
                 rx_frames: int = 2, cut_through: bool = False, flow_control: bool = False,
                 cable_cycles: int = 64, pause_quanta: int = PAUSE_MAX, role: str | None = None,
                 mac_prefix: int = DEFAULT_MAC_PREFIX, tx_start: int | None = None):
        if tx_start is not None and (not isinstance(tx_start, int) or not 1 <= tx_start <= 32):
            raise ValueError(f"tx_start must be None or 1 … 32 beats, not {tx_start!r}")
        self.tx_start = tx_start
        super().__init__(mtu, local_mac=local_mac, peer_mac=peer_mac, rx_frames=rx_frames,
                         cut_through=cut_through, flow_control=flow_control, cable_cycles=cable_cycles,
                         pause_quanta=pause_quanta, role=role, mac_prefix=mac_prefix,
                         line={"line_tx": Out(block_layout), "line_rx": In(block_layout)})

    def elaborate(self, platform):
        m = Module()
        eth_tx, eth_rx = self._framing(m)
        m.submodules.mac_pcs_tx, m.submodules.mac_pcs_rx = tx, rx = self._mac_pcs()
        if self.flow_control or self.tx_start:  # give the source slack (TxStartBuffer): PAUSE frames
            # delay data frames; a multicast source feeds several ports in lock-step
            m.submodules.tx_start = start = TxStartBuffer(threshold=self.tx_start or 32)
            wiring.connect(m, eth_tx, start.i)
            eth_tx = start.o
        wiring.connect(m, eth_tx, tx.i)
        wiring.connect(m, rx.o, eth_rx)
        m.d.comb += [
            tx.peer_pause.eq(rx.pause), tx.peer_quanta.eq(rx.pause_quanta),
            tx.xoff.eq(rx.xoff), tx.xon.eq(rx.xon),
            tx.o.ready.eq(1), self.line_tx.eq(tx.o.payload),
            rx.i.valid.eq(1), rx.i.payload.eq(self.line_rx),
            self.block_lock.eq(rx.block_lock), self.hi_ber.eq(rx.hi_ber),
        ]
        m.d.comb += [self.stats[name].eq(tx.stats[name]) for name in TX_LINE_COUNTERS]
        m.d.comb += [self.stats[name].eq(rx.stats[name]) for name in RX_LINE_COUNTERS]
        return m


class TxStartBuffer(wiring.Component):
    """A small FIFO in front of the MAC that starts a frame only once ``threshold`` beats of it,
    or all of it, are in: the beats after that may come late by up to ``threshold`` cycles in all
    without the MAC underrunning.

    A port that sends PAUSE frames delays the frame queued behind one by up to 11 columns; a node
    output fed by a fork (host and ``ccw_out`` in lock-step) then keeps feeding this FIFO, so the
    fork's other output never starves.

    Attributes
    ----------
    i, o : FrameStream(64)
    """

    def __init__(self, depth: int = 64, threshold: int = 32):
        self.depth = depth
        self.threshold = threshold
        super().__init__({"i": In(FrameStream(64)), "o": Out(FrameStream(64))})

    def elaborate(self, platform):
        m = Module()
        blay = beat_layout(64)
        m.submodules.fifo = q = fifo.SyncFIFOBuffered(width=blay.size, depth=self.depth)
        ends = Signal(range(self.depth + 1))      # frames whose last beat is in the FIFO
        sending = Signal()
        win = self.i.valid & self.i.ready & self.i.payload.last
        wout = self.o.valid & self.o.ready & self.o.payload.last
        m.d.sync += ends.eq(ends + win - wout)
        m.d.comb += [
            q.w_data.eq(self.i.payload.as_value()), q.w_en.eq(self.i.valid), self.i.ready.eq(q.w_rdy),
            self.o.payload.eq(q.r_data),
            self.o.valid.eq(q.r_rdy & (sending | (ends != 0) | (q.r_level >= self.threshold))),
            q.r_en.eq(self.o.valid & self.o.ready),
        ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += sending.eq(~self.o.payload.last)
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


class EthPort10GCdc(_EthPort):
    """The board version of :class:`EthPort10G`: the same port with its MAC and PCS in a GTH
    transceiver's clock domains, and the clock-domain crossings around them.

    The framing (:class:`EthFramer`, :class:`EthDeframer`) stays in ``sync``; the single-clock
    :class:`MacPcsTx` and :class:`MacPcsRx` run in ``gt_tx`` (the GTH's TXUSRCLK2, 322.265625 MHz
    at 32 bits: :data:`GT_CLOCK_MHZ`, :data:`GT_WORD_BITS`) and ``gt_rx`` (the recovered
    RXUSRCLK2) behind the 32-bit :class:`~wirereduce.hdl.eth.pcs.TxGearbox` and
    :class:`~wirereduce.hdl.eth.pcs.RxGearbox`, all put there with
    :class:`~amaranth.hdl.DomainRenamer`. The PCS takes or gives an XGMII column in 32 of 33 word
    cycles, so the MACs run at effectively 156.25 MHz. What this component adds is the crossing:

    - frames to and from ``sync`` through :class:`amaranth.lib.fifo.AsyncFIFO`. Transmit is store
      and forward across the crossing (a frame starts only once all of it is in the FIFO), so
      the MAC never underruns whatever ``sync`` runs at;
    - ``block_lock`` and ``hi_ber`` through :class:`amaranth.lib.cdc.FFSynchronizer`;
    - the MAC counters as their increments, counted again in ``sync``.

    Parameters, the attributes other than the line's, and exceptions are those of
    :class:`EthPort10G`: ``tx``, ``rx``, ``link_up``, ``block_lock``, ``hi_ber`` (synchronised),
    ``stats`` and ``tx_tap``/``tx_tap_valid``, all in ``sync``. In place of ``line_tx``/``line_rx``:

    Attributes
    ----------
    gt_tx_data : Out(32)
        TXDATA for a GTH with its gearbox off, ``gt_tx`` domain, bit 0 first.
    gt_rx_data : In(32)
        RXDATA, ``gt_rx`` domain, any bit alignment.
    """

    def __init__(self, mtu: int, *, local_mac: int = DEFAULT_LOCAL_MAC, peer_mac: int = DEFAULT_PEER_MAC,
                 rx_frames: int = 2, cut_through: bool = False, flow_control: bool = False,
                 cable_cycles: int = 64, pause_quanta: int = PAUSE_MAX, role: str | None = None,
                 mac_prefix: int = DEFAULT_MAC_PREFIX):
        with rejecting(self):  # its MAC runs in the transceiver's domains: addresses are constants
            check_mac("local_mac", local_mac)
            check_mac("peer_mac", peer_mac)
        super().__init__(mtu, local_mac=local_mac, peer_mac=peer_mac, rx_frames=rx_frames,
                         cut_through=cut_through, flow_control=flow_control, cable_cycles=cable_cycles,
                         pause_quanta=pause_quanta, role=role, mac_prefix=mac_prefix,
                         line={"gt_tx_data": Out(GT_WORD_BITS), "gt_rx_data": In(GT_WORD_BITS)})

    def elaborate(self, platform):
        m = Module()
        eth_tx, eth_rx = self._framing(m)
        tx, rx = self._mac_pcs()
        m.submodules.mac_pcs_tx = DomainRenamer("gt_tx")(tx)
        m.submodules.mac_pcs_rx = DomainRenamer("gt_rx")(rx)
        m.submodules.tx_gearbox = tx_gb = DomainRenamer("gt_tx")(TxGearbox(GT_WORD_BITS))
        m.submodules.rx_gearbox = rx_gb = DomainRenamer("gt_rx")(RxGearbox(GT_WORD_BITS))
        wiring.connect(m, tx.o, tx_gb.i)
        wiring.connect(m, rx_gb.o, rx.i)
        m.d.comb += [self.gt_tx_data.eq(tx_gb.data), rx_gb.data.eq(self.gt_rx_data), rx_gb.slip.eq(rx.slip)]

        blay = beat_layout(64)
        depth = 1 << (self._frame_beats + 8).bit_length()    # a whole frame and then some, power of 2
        # Transmit: beats and end-of-frame tokens cross together; gt_tx starts a frame only once its
        # token (written with its last beat) has arrived, so every beat of it is readable.
        m.submodules.tx_beats = tx_beats = fifo.AsyncFIFO(width=blay.size, depth=depth, w_domain="sync",
                                                          r_domain="gt_tx")
        m.submodules.tx_tokens = tx_tokens = fifo.AsyncFIFO(width=1, depth=depth, w_domain="sync",
                                                            r_domain="gt_tx")
        m.d.comb += [
            eth_tx.ready.eq(tx_beats.w_rdy & tx_tokens.w_rdy),
            tx_beats.w_data.eq(eth_tx.payload.as_value()),
            tx_beats.w_en.eq(eth_tx.valid & eth_tx.ready),
            tx_tokens.w_en.eq(eth_tx.valid & eth_tx.ready & eth_tx.payload.last),
        ]
        sending = Signal()
        take = Signal()
        m.d.comb += [
            tx.i.valid.eq(sending & tx_beats.r_rdy),
            tx.i.payload.eq(tx_beats.r_data),
            take.eq(tx.i.valid & tx.i.ready),
            tx_beats.r_en.eq(take),
            tx_tokens.r_en.eq(~sending & tx_tokens.r_rdy),
        ]
        with m.If(~sending & tx_tokens.r_rdy):
            m.d.gt_tx += sending.eq(1)
        with m.Elif(take & tx.i.payload.last):
            m.d.gt_tx += sending.eq(0)

        # Receive: MacPcsRx, in gt_rx, holds each frame until its verdict (or marks it, cut-through)
        # and writes it into the crossing FIFO.
        m.submodules.rx_beats = rx_beats = fifo.AsyncFIFO(width=blay.size, depth=depth, w_domain="gt_rx",
                                                          r_domain="sync")
        m.d.comb += [
            rx_beats.w_data.eq(rx.o.payload.as_value()),
            rx_beats.w_en.eq(rx.o.valid),
            rx.o.ready.eq(rx_beats.w_rdy),
            eth_rx.valid.eq(rx_beats.r_rdy),
            eth_rx.payload.eq(rx_beats.r_data),
            rx_beats.r_en.eq(eth_rx.ready),
        ]

        # Flow control, gt_rx → gt_tx: each PAUSE received (its pause_time) through a small FIFO,
        # the FIFO's two watermark levels through synchronisers.
        m.submodules.pause_cross = pause_cross = fifo.AsyncFIFO(width=16, depth=4, w_domain="gt_rx",
                                                                r_domain="gt_tx")
        m.d.comb += [
            pause_cross.w_en.eq(rx.pause), pause_cross.w_data.eq(rx.pause_quanta),
            pause_cross.r_en.eq(1),
            tx.peer_pause.eq(pause_cross.r_rdy), tx.peer_quanta.eq(pause_cross.r_data),
        ]
        m.submodules.sync_xoff = cdc.FFSynchronizer(rx.xoff, tx.xoff, o_domain="gt_tx")
        m.submodules.sync_xon = cdc.FFSynchronizer(rx.xon, tx.xon, o_domain="gt_tx")

        # Status and counters into sync.
        m.submodules.sync_lock = cdc.FFSynchronizer(rx.block_lock, self.block_lock, o_domain="sync")
        m.submodules.sync_ber = cdc.FFSynchronizer(rx.hi_ber, self.hi_ber, o_domain="sync")
        for names, domain, src in ((RX_LINE_COUNTERS, "gt_rx", rx.stats), (TX_LINE_COUNTERS, "gt_tx", tx.stats)):
            for name in names:
                m.submodules[f"count_{name}"] = pc = _PulseCount(domain)
                m.d.comb += [pc.src.eq(src[name]), self.stats[name].eq(pc.count)]
        return m
