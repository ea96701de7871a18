"""100G glue: the UltraScale+ integrated 100G Ethernet MAC (CMAC) to the node's 512-bit frame streams.

The CMAC (Xilinx ``cmac_usplus``, PG203) is configured with its AXI4-Stream user interface: one
512-bit beat a cycle of its 322.265625 MHz user clock, ``tkeep`` marking the valid bytes of the
last beat, FCS added on transmit and checked and stripped on receive, preamble and SFD handled
inside. What it hands us is therefore an Ethernet frame from the destination address to the last
payload byte; our node ports carry the wirereduce frame *without* the 14-byte Ethernet II header
(:mod:`wirereduce.protocol`), so the glue strips the header on receive and prepends it on
transmit, a 14-byte realignment of the 64-byte beats.

Blocks
------
:class:`CmacRxGlue`
    CMAC RX AXI4-Stream (``cmac_rx`` domain, cannot be stalled) to a frame stream in ``sync``
    through an :class:`~amaranth.lib.fifo.AsyncFIFO`: store-and-forward (no beat of a frame with
    ``tuser`` set ever reaches the core) or, with ``cut_through=True`` (the ring ports), beats
    passed on as they arrive and a ``tuser`` frame marked ``bad`` on its last beat, as the 10G
    ports do; every dropped or marked frame is counted.
:class:`CmacTxGlue`
    Frame stream in ``sync`` to CMAC TX AXI4-Stream (``cmac_tx`` domain): header prepended,
    padded to the 60-byte minimum, and each frame buffered whole before its first beat goes out,
    so ``tvalid`` never drops inside a frame (PG203: a TX underflow corrupts the frame); a frame
    marked ``bad`` leaves with ``tx_axis_tuser`` on its last beat (the CMAC stomps its FCS).
:func:`cmac_port_stats`
    A glue pair's counters under the 10G ports' names, for the node's STATS.
:class:`EthPrepend`
    The header and the padding to 60 bytes, on the 14-byte
    :class:`~wirereduce.hdl.stream.realign.Realigner` (receive strips with one directly).
:class:`Cmac100G`
    Black-box wrapper of the Vivado-generated ``cmac_usplus`` instance; the board build generates
    the IP (``boards/cmac_ip.py``).

Sources: PG203 (UltraScale+ Devices Integrated 100G Ethernet Subsystem), sections "AXI4-Stream
interface", "Valid Cycles" (packets under 64 bytes must be avoided) and "With AXI4-Lite interface"
(the ``ctl_rx_enable`` / ``ctl_tx_send_rfi`` / ``ctl_tx_enable`` bring-up order); the port list
of the IP's instantiation template (``cmac_usplus_0.veo``, IP version 2.6/3.1) and the OpenNIC
shell (``Xilinx/open-nic-shell``, ``src/cmac_subsystem/cmac_subsystem_cmac_wrapper.sv``: RX
user clock tied to ``gt_txusrclk2``; ``vivado_ip/cmac_usplus_*_au55c.tcl``: IP configuration).
"""

from __future__ import annotations

from amaranth import Cat, Const, Instance, Module, Mux, Signal
from amaranth.hdl import IOPort
from amaranth.lib import data, fifo, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.eth.port import check_mac, eth_header
from wirereduce.hdl.params import reject, rejecting
from wirereduce.hdl.stream.frame import FrameStream
from wirereduce.hdl.stream.realign import Realigner

from wirereduce.config import check_mtu
from wirereduce.protocol import ETH_HEADER_BYTES, ETH_MIN_PAYLOAD_BYTES, ETH_PORT_COUNTERS, ETHERTYPE, HEADER_BYTES

__all__ = [
    "CMAC_WIDTH", "CMAC_BYTES", "ETH_MIN_FRAME_BYTES", "DEFAULT_SRC_MAC", "DEFAULT_DST_MAC",
    "CmacRxSignature", "CmacTxSignature", "eth_frame_beats",
    "EthPrepend", "CmacRxGlue", "CmacTxGlue", "Cmac100G", "cmac_port_stats",
]

#: Width of the CMAC's AXI4-Stream data bus in bits (PG203, AXI4-Stream user interface).
CMAC_WIDTH = 512
#: Bytes a beat.
CMAC_BYTES = CMAC_WIDTH // 8
#: Shortest frame the glue hands the CMAC, destination address to last pad byte (FCS excluded):
#: 14 + 46 = 60 bytes. PG203 ("Valid Cycles"): packets under 64 bytes with FCS may lock the core up.
ETH_MIN_FRAME_BYTES = ETH_HEADER_BYTES + ETH_MIN_PAYLOAD_BYTES
#: Default source address: locally administered (bit 1 of the first byte), unicast.
DEFAULT_SRC_MAC = 0x02_00_00_88_B5_00
#: Default destination: broadcast. Ring links are point to point, so no address is needed to
#: reach the neighbour, and the receive side does not filter on it.
DEFAULT_DST_MAC = 0xFF_FF_FF_FF_FF_FF

_H = ETH_HEADER_BYTES           # 14
_S = CMAC_BYTES - _H            # 50: payload bytes that share a beat with the header

# Verdict status codes of the receive store-and-forward queue.
_GOOD, _BAD, _FILTERED, _LOST, _STOMPED = range(5)
_LOST_BITS = 8                  # frames lost without a verdict slot, carried in the next verdict


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def eth_frame_beats(mtu: int) -> int:
    """512-bit beats of the longest Ethernet frame (14-byte header + ``mtu`` bytes, no FCS)."""
    return -(-(_H + check_mtu(mtu)) // CMAC_BYTES)


#: Write-side cycles after a reset before the first write (see :func:`_armed`).
_ARM_CYCLES = 16


def _armed(m, domain):
    """A signal that rises ``_ARM_CYCLES`` cycles of ``domain`` after its reset.

    An :class:`~amaranth.lib.fifo.AsyncFIFO` read side leaves reset a few read-clock cycles after
    the write side and discards whatever was written meanwhile. The glue writes each frame into
    two FIFOs (beats and verdict/count) that must stay paired, so it does not write at all until
    both read sides are out of reset: 16 write cycles cover read clocks down to a quarter of the
    write clock.
    """
    count = Signal(range(_ARM_CYCLES + 1))
    armed = Signal()
    m.d.comb += armed.eq(count == _ARM_CYCLES)
    with m.If(~armed):
        m.d[domain] += count.eq(count + 1)
    return armed


def _bytes_mask(keep):
    """Expand a per-byte keep vector to a per-bit mask."""
    return Cat(*(k.replicate(8) for k in keep))



def _check_depth(mtu, depth):
    """``(mtu, max_beats, depth)`` of a glue FIFO: ``depth`` (default: one longest frame + 16
    beats) rounded up to a power of two. Raises ValueError on a bad ``mtu`` or a ``depth`` that
    does not hold one longest frame."""
    mtu = check_mtu(mtu)
    max_beats = eth_frame_beats(mtu)
    if depth is None:
        depth = max_beats + 16
    if not isinstance(depth, int) or depth < max_beats:
        raise ValueError(f"depth must hold one {_H + mtu}-byte frame ({max_beats} beats of 64 bytes), "
                         f"not {depth!r}; raise depth or lower mtu")
    return mtu, max_beats, _pow2_at_least(depth)

class CmacRxSignature(wiring.Signature):
    """The CMAC's receive AXI4-Stream, as the CMAC drives it (PG203 ``rx_axis_*``).

    Members
    -------
    tvalid : Out(1)
    tdata : Out(512)
        Byte ``k`` of the beat is ``tdata[8*k : 8*k+8]``; byte 0 of the frame is byte 0 of beat 0.
    tkeep : Out(64)
        Valid bytes; all ones except on the last beat, where the valid bytes are contiguous from 0.
    tlast : Out(1)
    tuser : Out(1)
        On the last beat: the frame is bad (FCS error, too long, ...). Ignored on other beats.
    stomped : Out(1)
        With ``tuser`` on the last beat: the bad FCS was a stomped one (the sender marked the frame
        bad, PG203 ``stat_rx_stomped_fcs``), so the error did not happen on this link. The CMAC
        reports it on its statistics output, not in the stream: :class:`Cmac100G` drives it from
        ``stat_rx_stomped_fcs`` (see the note there).

    There is no ``tready``: the CMAC cannot be back-pressured.
    """

    def __init__(self):
        super().__init__({
            "tvalid": Out(1), "tdata": Out(CMAC_WIDTH), "tkeep": Out(CMAC_BYTES), "tlast": Out(1), "tuser": Out(1),
            "stomped": Out(1),
        })


class CmacTxSignature(wiring.Signature):
    """The CMAC's transmit AXI4-Stream, as user logic drives it (PG203 ``tx_axis_*``).

    Members
    -------
    tvalid, tlast : Out(1)
    tdata : Out(512); tkeep : Out(64)
        As in :class:`CmacRxSignature`.
    tuser : Out(1)
        On the last beat: the frame is bad, the CMAC sends it with a stomped FCS (PG203,
        ``tx_axis_tuser``: "bad packet"; counted in ``stat_tx_bad_fcs``) so the far end drops or
        marks it. The glue drives the frame's ``bad``.
    tready : In(1)
        The CMAC takes the beat. Once a frame's first beat is offered, ``tvalid`` must stay high
        until its last beat is taken, or the CMAC underflows (``tx_unfout``) and corrupts it.
    """

    def __init__(self):
        super().__init__({
            "tvalid": Out(1), "tdata": Out(CMAC_WIDTH), "tkeep": Out(CMAC_BYTES), "tlast": Out(1), "tuser": Out(1),
            "tready": In(1),
        })


class EthPrepend(wiring.Component):
    """Puts a fixed 14-byte Ethernet II header in front of every frame and pads short frames.

    The header goes on in a :class:`~wirereduce.hdl.stream.realign.Realigner` (insert 14 bytes):
    output beat 0 is the header followed by bytes 0..49 of input beat 0; output beat ``j`` is
    bytes 50..63 of input beat ``j-1`` followed by bytes 0..49 of beat ``j``. A frame whose last
    beat holds more than 50 bytes ends with one extra output beat, during which the input waits.
    What this block adds: a frame shorter than 60 bytes with its header (46 bytes of payload) is
    padded with zero bytes to 60, the IEEE 802.3 minimum without FCS (clause 3.2.8), which PG203
    asks for.

    Parameters
    ----------
    header : bytes
        The 14 header bytes (:func:`~wirereduce.hdl.eth.port.eth_header`).

    Attributes
    ----------
    i : In(FrameStream(512))
        Frames without Ethernet header; at least one byte each.
    o : Out(FrameStream(512))
        Ethernet frames, at least 60 bytes each.

    Raises
    ------
    ValueError
        If ``header`` is not 14 bytes.
    """

    def __init__(self, header: bytes):
        if not isinstance(header, (bytes, bytearray)) or len(header) != _H:
            reject(self, ValueError(f"header must be {_H} bytes (see eth_header()), not {header!r}"))
        self.header = bytes(header)
        super().__init__({"i": In(FrameStream(CMAC_WIDTH)), "o": Out(FrameStream(CMAC_WIDTH))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.realign = ra = Realigner(CMAC_WIDTH, insert=_H)
        wiring.connect(m, wiring.flipped(self.i), ra.i)
        m.d.comb += ra.head.eq(int.from_bytes(self.header, "little"))
        r, o = ra.o.payload, self.o.payload
        mid = Signal()      # inside a frame: its first beat has left
        m.d.comb += [
            o.eq(r), self.o.valid.eq(ra.o.valid), ra.o.ready.eq(self.o.ready),
        ]
        with m.If(~mid & r.last):
            # A one-beat frame: pad to the minimum with zero bytes.
            m.d.comb += [
                o.data.eq(r.data & _bytes_mask(r.keep)),
                o.keep.eq(r.keep | ((1 << ETH_MIN_FRAME_BYTES) - 1)),
            ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += mid.eq(~r.last)
        return m


def _trim_padding(m, i, o):
    """Connect frame stream ``i`` to ``o`` (both ``sync``, 512 bit), cutting Ethernet padding.

    The sending glue pads a frame to 60 bytes with its header (46 wirereduce bytes, IEEE 802.3
    clause 3.2.8) and Ethernet carries no length for an EtherType frame, so, as
    :class:`~wirereduce.hdl.eth.port.EthDeframer` does at 10G, a one-beat frame with
    ``codec = NONE`` (header byte 3) is cut to ``16 + 4·count`` bytes (count: header bytes 10–11)
    when it is longer. Only one-beat frames can carry padding (46 < 64 bytes); longer frames and
    compressed ones (their length is in their tags) pass unchanged.
    """
    first = Signal(init=1)
    p = i.payload
    limit = Signal(range(HEADER_BYTES + 4 * 65535 + 1))
    m.d.comb += [
        o.payload.eq(p), o.valid.eq(i.valid), i.ready.eq(o.ready),
        limit.eq(HEADER_BYTES + 4 * p.data[80:96]),
    ]
    with m.If(first & p.last & (p.data[24:32] == 0)):
        m.d.comb += o.payload.keep.eq(p.keep & Cat(*(limit > k for k in range(CMAC_BYTES))))
    with m.If(i.valid & i.ready):
        m.d.sync += first.eq(p.last)


class CmacRxGlue(wiring.Component):
    """CMAC receive stream (``cmac_rx`` domain) to the node's frame stream (``sync`` domain).

    The CMAC cannot wait, and a frame's verdict (``tuser``, set on its last beat when the FCS is
    wrong or the frame is malformed, PG203) comes only with its last beat. So the glue is
    store-and-forward: on the ``cmac_rx`` side every beat of a frame is written to an
    :class:`~amaranth.lib.fifo.AsyncFIFO` as it arrives, and when the frame ends its verdict
    (beat count and status) goes into a second AsyncFIFO. On the ``sync`` side a verdict is read
    first, then that many beats are forwarded (good frames) or read and discarded (all others),
    so **no beat of a dropped frame ever reaches** ``o`` and no frame leaves truncated. Good
    frames go through a :class:`~wirereduce.hdl.stream.realign.Realigner` that strips the header.

    A frame is dropped, whole, and counted when:

    - ``tuser`` is set on its last beat → ``bad``;
    - its EtherType is not :data:`wirereduce.protocol.ETHERTYPE` (0x88B5; VLAN-tagged frames
      included), it has no byte after the 14-byte header, or it is longer than ``14 + mtu``
      bytes → ``filtered`` (no beat of it is stored);
    - the beat FIFO is full when one of its beats arrives, or the verdict FIFO is full when it
      starts (the core did not take frames fast enough), or it starts within 16 ``cmac_rx``
      cycles of a reset (the FIFOs' read side is still leaving reset) → ``overflow``. The rest of
      the frame is discarded and the beats already stored are discarded by the reader.

    With ``cut_through=True`` the reader does not wait for the verdict: beats leave as soon as
    they are in the FIFO, each with its frame's ``last`` and ``bad`` stored beside it. A frame is
    admitted at its first beat only if the FIFO has room for ``max_beats + 1`` beats (else it is
    lost whole, ``overflow``); another EtherType or no payload byte: dropped whole, no beat stored
    (``filtered``); a ``tuser`` frame: delivered with ``bad`` on its last beat (``bad``, or
    ``stomped`` when the CMAC flags the FCS as stomped); a frame longer than ``14 + mtu`` bytes:
    ended at the beat that shows it, marked ``bad`` (``filtered``). Latency: the FIFO's
    synchroniser delay only.

    In both modes a one-beat frame with ``codec = NONE`` has its Ethernet padding cut off:
    it leaves at ``16 + 4·count`` bytes when longer (:func:`_trim_padding`, the rule of
    :class:`~wirereduce.hdl.eth.port.EthDeframer`).

    The destination address is not checked: ring links are point to point.

    Latency: a frame's first beat leaves ``o`` after its last beat has arrived plus the FIFO's
    synchroniser delay (about 3 ``sync`` cycles). With ``o`` always ready the ``sync`` side takes
    one beat a cycle with no gap between frames; the worst frame mix at 100 Gbit/s (65-byte
    frames, two beats per 89 wire bytes) needs 281 M beats/s, so a ``sync`` clock of 322 MHz
    keeps up and only a stalled core overflows the FIFO.

    Parameters
    ----------
    mtu : int
        Longest wirereduce frame in bytes (the Ethernet payload, 1500 or 9000), as
        :class:`~wirereduce.config.NodeConfig` ``mtu``.
    depth : int or None
        Beat FIFO depth in 512-bit beats, rounded up to a power of two; default the longest
        frame plus 16 beats (plus 17 with ``cut_through``; 256 at MTU 9000: 9014 bytes are 141 beats).
    cut_through : bool
        Pass beats on before the frame's verdict, marking bad frames (default False: store and forward).

    Attributes
    ----------
    cmac : In(CmacRxSignature()), domain ``cmac_rx``
        From :attr:`Cmac100G.rx`.
    o : Out(FrameStream(512)), domain ``sync``
        Good frames without the Ethernet header.
    frames, bad, stomped, filtered, overflow : Out(32), domain ``sync``
        Wrapping counters: good frames passed to ``o``, and frames dropped (cut-through: marked)
        for each reason above; ``stomped`` is a ``tuser`` frame whose FCS the CMAC reported stomped
        (``cmac.stomped``), ``bad`` any other ``tuser`` frame. A
        frame lost while the verdict FIFO was full is counted when the next verdict (or a
        count-only verdict, written as soon as there is room) is read.

    Raises
    ------
    ValueError
        On a bad ``mtu``, or a ``depth`` smaller than the longest frame (with ``cut_through``,
        than the longest frame plus 17 beats).
    TypeError
        If ``cut_through`` is not a bool.

    Notes
    -----
    A reset of ``sync`` alone keeps the reader's place in the queue (its state is reset-less),
    so later frames stay aligned with their verdicts. A reset of ``cmac_rx`` empties the FIFOs
    and clears the reader; a good frame being forwarded at that moment is cut short (no
    ``last``), so reset ``sync`` together with ``cmac_rx`` when that matters.
    """

    def __init__(self, mtu: int = 9000, depth: int | None = None, *, cut_through: bool = False):
        with rejecting(self):
            if cut_through is True and depth is None:
                depth = eth_frame_beats(mtu) + 17
            self.mtu, self.max_beats, self.depth = _check_depth(mtu, depth)
            if not isinstance(cut_through, bool):
                raise TypeError(f"cut_through must be a bool, not {cut_through!r}")
            if cut_through and self.depth < self.max_beats + 1 + 16:
                raise ValueError(f"a cut-through CmacRxGlue needs depth ≥ {self.max_beats + 17} beats "
                                 f"(one {_H + self.mtu}-byte frame, its cut-off beat and 16), not {depth!r}")
        self.cut_through = cut_through
        super().__init__({
            "cmac": In(CmacRxSignature()),
            "o": Out(FrameStream(CMAC_WIDTH)),
            "frames": Out(32), "bad": Out(32), "stomped": Out(32), "filtered": Out(32), "overflow": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        nbits = self.depth.bit_length()     # a frame never has more than `depth` beats stored
        vlay = data.StructLayout({"n": nbits, "status": 3, "lost_before": _LOST_BITS})
        ct = self.cut_through
        m.submodules.beats = beats = fifo.AsyncFIFO(
            width=CMAC_WIDTH + CMAC_BYTES + 2, depth=self.depth, w_domain="cmac_rx", r_domain="sync")
        m.submodules.verdicts = verdicts = fifo.AsyncFIFO(
            width=vlay.size, depth=16, w_domain="cmac_rx", r_domain="sync")

        # ---- Write side (cmac_rx): classify, store, write one verdict per admitted frame. ----
        rx = self.cmac
        in_frame = Signal()             # a beat of the current frame has been seen
        admitted = Signal()             # the current frame holds a verdict slot
        filtered = Signal()             # the current frame is dropped as not ours; no more beats are stored
        lost = Signal()                 # a beat of the current frame did not fit
        stored = Signal(nbits)          # beats of the current frame written
        seen = Signal(range(self.max_beats + 2))   # beats of the current frame seen, saturating
        pending = Signal(_LOST_BITS)    # frames lost without a verdict, not yet reported

        first = ~in_frame
        ethertype = Cat(rx.tdata[8 * 13:8 * 14], rx.tdata[8 * 12:8 * 13])
        runt = ~rx.tkeep[_H]            # no payload byte (first beat only)
        seen_now = Signal.like(seen)
        m.d.comb += seen_now.eq(Mux(first, 1, Mux(seen > self.max_beats, seen, seen + 1)))
        tail = _H + self.mtu - CMAC_BYTES * (self.max_beats - 1)   # bytes allowed in the last beat
        too_long = seen_now > self.max_beats
        if tail < CMAC_BYTES:
            too_long = too_long | ((seen_now == self.max_beats) & rx.tkeep[tail])
        armed = _armed(m, "cmac_rx")
        slot = verdicts.w_rdy & armed
        filt_now = Mux(first, (ethertype != ETHERTYPE) | runt, filtered) | too_long
        lost_prev = ~first & lost
        write = Signal()
        cut_bad = Signal()              # cut-through: the beat is stored as a frame's last, marked bad
        if ct:
            # Cut-through: a frame is admitted whole or not at all, when its first beat arrives with
            # room in the beat FIFO for its longest length plus the cut-off beat, so no beat of an
            # admitted frame is ever lost (a frame cannot be recalled once its first beats have left).
            # A frame found too long is ended at the beat that shows it, marked bad.
            room = beats.w_level <= self.depth - (self.max_beats + 1)
            admit_now = Mux(first, slot & (room | (ethertype != ETHERTYPE) | runt), admitted)
            lost_now = Mux(first, slot & ~room & ~((ethertype != ETHERTYPE) | runt), lost)
            filt_prev = ~first & filtered
            m.d.comb += [
                write.eq(rx.tvalid & admit_now & ~lost_now & ~filt_prev
                         & (Mux(first, ~((ethertype != ETHERTYPE) | runt), 1))),
                cut_bad.eq(too_long | rx.tuser),
            ]
            last_w = rx.tlast | too_long
        else:
            admit_now = Mux(first, slot, admitted)
            m.d.comb += write.eq(rx.tvalid & admit_now & ~filt_now & ~lost_prev & beats.w_rdy)
            lost_now = lost_prev | (admit_now & ~filt_now & ~beats.w_rdy)
            last_w = rx.tlast
        n_now = Mux(first, 0, stored) + write
        status = Mux(lost_now, _LOST, Mux(rx.tuser, Mux(rx.stomped, _STOMPED, _BAD),
                                          Mux(filt_now, _FILTERED, _GOOD)))
        verdict = Signal(vlay)
        m.d.comb += [
            beats.w_data.eq(Cat(rx.tdata, rx.tkeep, last_w, cut_bad)),
            beats.w_en.eq(write),
            verdicts.w_data.eq(verdict),
        ]
        pending_inc = Mux(pending == (1 << _LOST_BITS) - 1, pending, pending + 1)
        with m.If(rx.tvalid):
            with m.If(first & ~slot):
                m.d.cmac_rx += pending.eq(pending_inc)
            with m.If(rx.tlast):
                m.d.cmac_rx += in_frame.eq(0)
                with m.If(admit_now):
                    m.d.comb += [
                        verdict.n.eq(n_now), verdict.status.eq(status), verdict.lost_before.eq(pending),
                        verdicts.w_en.eq(1),
                    ]
                    m.d.cmac_rx += pending.eq(0)
            with m.Else():
                m.d.cmac_rx += [
                    in_frame.eq(1), admitted.eq(admit_now), filtered.eq(filt_now), lost.eq(lost_now),
                    stored.eq(n_now), seen.eq(seen_now),
                ]
        # Report frames lost without a slot as soon as there is one, in a count-only verdict
        # (n = 0, status good), unless a frame holds the slot or starts now and will carry them.
        with m.Elif(~(in_frame & admitted) & (pending != 0) & slot):
            m.d.comb += [
                verdict.n.eq(0), verdict.status.eq(_GOOD), verdict.lost_before.eq(pending),
                verdicts.w_en.eq(1),
            ]
            m.d.cmac_rx += pending.eq(0)

        # ---- Read side (sync): one verdict, then its beats; good ones go through the header strip. ----
        m.submodules.strip = strip = Realigner(CMAC_WIDTH, strip=_H)
        _trim_padding(m, strip.o, self.o)
        if ct:
            # Cut-through: beats go on as soon as they are readable, each with its stored last/bad;
            # verdicts are read only to count.
            s = strip.i
            m.d.comb += [
                s.payload.data.eq(beats.r_data[:CMAC_WIDTH]),
                s.payload.keep.eq(beats.r_data[CMAC_WIDTH:CMAC_WIDTH + CMAC_BYTES]),
                s.payload.last.eq(beats.r_data[-2]),
                s.payload.bad.eq(beats.r_data[-1]),
                s.valid.eq(beats.r_rdy),
                beats.r_en.eq(s.ready),
            ]
            v = data.View(vlay, verdicts.r_data)
            with m.If(verdicts.r_rdy):
                m.d.comb += verdicts.r_en.eq(1)
                m.d.sync += [
                    self.frames.eq(self.frames + ((v.status == _GOOD) & (v.n != 0))),
                    self.bad.eq(self.bad + (v.status == _BAD)),
                    self.stomped.eq(self.stomped + (v.status == _STOMPED)),
                    self.filtered.eq(self.filtered + (v.status == _FILTERED)),
                    self.overflow.eq(self.overflow + (v.status == _LOST) + v.lost_before),
                ]
            return m
        # The reader's place in the queue must survive a reset of its own domain alone (the FIFOs
        # keep their contents then); it is cleared when the write side has emptied the FIFOs.
        active = Signal(reset_less=True)
        left = Signal(nbits, reset_less=True)
        good = Signal(reset_less=True)
        v = data.View(vlay, verdicts.r_data)
        s = strip.i
        pop = Signal()
        m.d.comb += [
            s.payload.data.eq(beats.r_data[:CMAC_WIDTH]),
            s.payload.keep.eq(beats.r_data[CMAC_WIDTH:CMAC_WIDTH + CMAC_BYTES]),
            s.payload.last.eq(left == 1),
            s.valid.eq(active & good & beats.r_rdy),
            pop.eq(active & beats.r_rdy & (~good | s.ready)),
            beats.r_en.eq(pop),
        ]
        with m.If(pop):
            m.d.sync += left.eq(left - 1)
            with m.If(left == 1):
                m.d.sync += active.eq(0)
        # The next verdict is read in the cycle the last beat leaves: frames go back to back.
        with m.If((~active | (pop & (left == 1))) & verdicts.r_rdy):
            m.d.comb += verdicts.r_en.eq(1)
            with m.If(v.n != 0):
                m.d.sync += [active.eq(1), left.eq(v.n), good.eq(v.status == _GOOD)]
            m.d.sync += [
                self.frames.eq(self.frames + ((v.status == _GOOD) & (v.n != 0))),
                self.bad.eq(self.bad + (v.status == _BAD)),
                self.stomped.eq(self.stomped + (v.status == _STOMPED)),
                self.filtered.eq(self.filtered + (v.status == _FILTERED)),
                self.overflow.eq(self.overflow + (v.status == _LOST) + v.lost_before),
            ]
        with m.If(beats.r_rst | verdicts.r_rst):
            m.d.sync += active.eq(0)
        return m


class CmacTxGlue(wiring.Component):
    """The node's frame stream (``sync`` domain) to the CMAC transmit stream (``cmac_tx`` domain).

    Each frame gets its Ethernet II header (:class:`EthPrepend`: ``dst_mac``, ``src_mac``,
    EtherType 0x88B5) and is padded to 60 bytes if shorter; its beats are written to an
    :class:`~amaranth.lib.fifo.AsyncFIFO` and, after its last beat, its beat count to a second
    one. The ``cmac_tx`` side starts a frame only when its count has arrived **and** the beat
    FIFO's read level shows all its beats, then offers one beat a cycle with ``tvalid`` high until
    ``tlast`` is taken, whatever ``tready`` does.

    Why whole frames: PG203 requires that once a frame starts, data keeps coming until its end;
    an underflow (``tx_unfout``) corrupts the frame and the core must be reset. The node's output
    is cut-through from its ring input, which itself arrives at the far end's line rate and with
    gaps, so nothing bounds how late the next beat of a frame can be; a partial threshold would
    be a bet on the core's timing. Buffering the frame whole costs one frame of latency (about
    0.44 µs for 9014 bytes at 322 MHz) and makes underflow impossible by construction. The beat
    FIFO holds the longest frame plus 16 beats, so the next frame fills while one drains.

    Parameters
    ----------
    mtu : int
        Longest wirereduce frame in bytes (1500 or 9000). Longer input frames would never fit and
        stall the input forever: the node never sends them.
    depth : int or None
        Beat FIFO depth in beats (power of two); default the longest Ethernet frame plus 16.
    dst_mac, src_mac : int
        48-bit addresses of the header (:data:`DEFAULT_DST_MAC` broadcast, :data:`DEFAULT_SRC_MAC`).

    Attributes
    ----------
    i : In(FrameStream(512)), domain ``sync``
        Frames without Ethernet header, 1 to ``mtu`` bytes.
    cmac : Out(CmacTxSignature()), domain ``cmac_tx``
        To :attr:`Cmac100G.tx`; ``tuser`` on a frame's last beat is its ``bad`` (a frame that
        arrived cut-through and turned out bad leaves with a stomped FCS, as on the 10G ports).
    frames, stomped : Out(32), domain ``sync``
        Frames taken from ``i``, and of those the ones marked ``bad`` (wrapping counters).

    Notes
    -----
    A reset of ``cmac_tx`` alone (the CMAC's TX reset) keeps the reader's place; a reset of
    ``sync`` empties the FIFOs, and a frame being sent then ends early (an underflow the CMAC
    reports on ``tx_unfout``; the far end drops it on its FCS).

    Raises
    ------
    ValueError
        On a bad ``mtu`` or MAC address, or a ``depth`` below one longest frame.
    """

    def __init__(self, mtu: int = 9000, depth: int | None = None, *,
                 dst_mac: int = DEFAULT_DST_MAC, src_mac: int = DEFAULT_SRC_MAC):
        with rejecting(self):
            self.mtu, self.max_beats, self.depth = _check_depth(mtu, depth)
            self.header = eth_header(check_mac("dst_mac", dst_mac), check_mac("src_mac", src_mac))
        super().__init__({
            "i": In(FrameStream(CMAC_WIDTH)),
            "cmac": Out(CmacTxSignature()),
            "frames": Out(32), "stomped": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        nbits = self.depth.bit_length()
        m.submodules.prepend = prepend = EthPrepend(self.header)
        wiring.connect(m, wiring.flipped(self.i), prepend.i)
        m.submodules.beats = beats = fifo.AsyncFIFO(
            width=CMAC_WIDTH + CMAC_BYTES + 1, depth=self.depth, w_domain="sync", r_domain="cmac_tx")
        m.submodules.counts = counts = fifo.AsyncFIFO(width=nbits, depth=16, w_domain="sync", r_domain="cmac_tx")

        # ---- Write side (sync). ----
        p = prepend.o
        n = Signal(nbits)
        m.d.comb += [
            p.ready.eq(_armed(m, "sync") & beats.w_rdy & (~p.payload.last | counts.w_rdy)),
            beats.w_data.eq(Cat(p.payload.data, p.payload.keep, p.payload.bad & p.payload.last)),
            beats.w_en.eq(p.valid & p.ready),
            counts.w_data.eq(n + 1),
            counts.w_en.eq(p.valid & p.ready & p.payload.last),
        ]
        with m.If(p.valid & p.ready):
            m.d.sync += n.eq(Mux(p.payload.last, 0, n + 1))
            with m.If(p.payload.last):
                m.d.sync += [self.frames.eq(self.frames + 1), self.stomped.eq(self.stomped + p.payload.bad)]

        # ---- Read side (cmac_tx). ----
        tx = self.cmac
        # As on the receive side: a reset of cmac_tx alone (the CMAC's TX reset) must not lose the
        # reader's place in the FIFO; a reset of the write side empties it and clears the reader.
        sending = Signal(reset_less=True)
        left = Signal(nbits, reset_less=True)
        m.d.comb += [
            tx.tdata.eq(beats.r_data[:CMAC_WIDTH]),
            tx.tkeep.eq(beats.r_data[CMAC_WIDTH:CMAC_WIDTH + CMAC_BYTES]),
            tx.tlast.eq(left == 1),
            tx.tuser.eq(beats.r_data[-1] & (left == 1)),
            # Held high for the whole frame: every beat of it is already readable.
            tx.tvalid.eq(sending),
            beats.r_en.eq(sending & tx.tready),
        ]
        with m.If(sending):
            with m.If(tx.tready):
                m.d.cmac_tx += left.eq(left - 1)
                with m.If(left == 1):
                    m.d.cmac_tx += sending.eq(0)
        with m.Elif(counts.r_rdy & (beats.r_level >= counts.r_data)):
            m.d.comb += counts.r_en.eq(1)
            m.d.cmac_tx += [sending.eq(1), left.eq(counts.r_data)]
        with m.If(beats.r_rst | counts.r_rst):
            m.d.cmac_tx += sending.eq(0)
        return m


def cmac_port_stats(rx: CmacRxGlue, tx: CmacTxGlue) -> dict:
    """One ring port's counters, CMAC glue pair ``rx``/``tx``, by the names of the 10G ports'
    :func:`~wirereduce.hdl.eth.port.eth_stats_layout`, for
    :func:`~wirereduce.hdl.eth.port.port_counters` (so a 100G node fills the same STATS counters,
    ``{port}_{counter}`` and ``link_drop_{port}``, as a 10G one).

    ``rx_frames``: frames passed to the node (with ``cut_through``, the bad and stomped ones too,
    marked); ``rx_fcs_errors``: frames the CMAC flagged with ``tuser`` and not as stomped (an
    error on this link: FCS, and the CMAC's own runt/oversize checks); ``rx_stomped``: flagged
    as stomped (spoilt before this link); ``rx_ethertype_drops``: the glue's ``filtered`` (another
    EtherType, no payload byte, or longer than ``14 + mtu``); ``rx_overflow``; ``tx_frames``,
    ``tx_stomped``. The CMAC does not report the others here (``rx_runts``, ``rx_oversize``,
    ``rx_code_errors``, ``rx_short_drops``, ``tx_aborted``, source and PAUSE counters): 0.

    Returns a dict of every :data:`~wirereduce.protocol.ETH_PORT_COUNTERS` name to a 32-bit value
    in the glue's ``sync`` domain. Raises TypeError unless ``rx``/``tx`` are the glue blocks.
    """
    if not isinstance(rx, CmacRxGlue) or not isinstance(tx, CmacTxGlue):
        raise TypeError(f"cmac_port_stats takes a CmacRxGlue and a CmacTxGlue, not {rx!r}, {tx!r}")
    zero = Const(0, 32)
    delivered = rx.frames + rx.bad + rx.stomped if rx.cut_through else rx.frames
    known = {
        "rx_frames": delivered[:32], "rx_fcs_errors": rx.bad, "rx_stomped": rx.stomped,
        "rx_ethertype_drops": rx.filtered, "rx_overflow": rx.overflow,
        "tx_frames": tx.frames, "tx_stomped": tx.stomped,
    }
    return {name: known.get(name, zero) for name in ETH_PORT_COUNTERS}


class Cmac100G(wiring.Component):
    """The Vivado-generated ``cmac_usplus`` core (PG203) as a black-box :class:`Instance`.

    The IP must be generated with the AXI4-Stream user interface, without the AXI4-Lite
    register interface (the ``ctl_*`` inputs are ports), with RS-FEC included and flow control
    off: the board build's ``cmac_ip_tcl`` (``boards/cmac_ip.py``) writes that configuration.
    Bring-up follows PG203 ("With AXI4-Lite interface", done here with the ports):
    ``ctl_rx_enable`` = 1 always, remote fault indication (``ctl_tx_send_rfi``) until
    ``stat_rx_aligned``, then ``ctl_tx_enable``.

    Clocks: the GTs run from ``gt_ref_clk`` (161.1328125 MHz from the board's QSFP28 reference
    clock); the user side runs on ``gt_txusrclk2`` (322.265625 MHz), exposed as ``usr_clk``. As
    in the OpenNIC shell, the core's ``rx_clk`` input is driven from ``gt_txusrclk2``, so the RX
    stream is synchronous to ``usr_clk`` as well (one clock domain per core). ``init_clk`` is a
    free-running clock of the frequency the IP was generated for (``GT_DRP_CLK``, 100 MHz here);
    ``sys_reset`` resets the whole core, synchronous to ``init_clk``.

    Parameters
    ----------
    ip_name : str
        Module name of the generated IP (``cmac_usplus_0``, ``cmac_usplus_1``).
    pads : object or None
        The QSFP28 cage's transceiver pins, with IO values ``rx.p``, ``rx.n`` (4 lanes, in),
        ``tx.p``, ``tx.n`` (4 lanes, out) and ``refclk.p``, ``refclk.n`` (1, in), as
        ``platform.request("qsfp", k, dir="-")`` returns them; connected to the core without IO
        buffers (the GT pads have none). ``None`` makes top-level ports ``<ip_name>_gt_*``, for
        conversion in tests.
    rsfec : bool
        Enable Clause 91 RS-FEC in both directions (needed by 100GBASE-SR4/CR4 and most switches).

    Attributes
    ----------
    rx : Out(CmacRxSignature()), in ``usr_clk``
    tx : In(CmacTxSignature()), in ``usr_clk``
    init_clk, sys_reset : In(1)
    usr_clk : Out(1)
        ``gt_txusrclk2``, 322.265625 MHz.
    usr_rx_reset, usr_tx_reset : Out(1)
        The core's user-side resets (active high).
    rx_aligned : Out(1)
        ``stat_rx_aligned``: all lanes locked and aligned, the link is up.
    tx_ovf, tx_unf : Out(1)
        ``tx_ovfout`` / ``tx_unfout``: the TX stream rules were broken (should never happen).
    """

    def __init__(self, ip_name: str = "cmac_usplus_0", pads=None, *, rsfec: bool = True):
        if not isinstance(ip_name, str) or not ip_name.isidentifier():
            reject(self, ValueError(f"ip_name must be the Verilog module name of the generated IP, not {ip_name!r}"))
        self.ip_name = ip_name
        self.rsfec = bool(rsfec)
        if pads is None:
            class _Pair:
                def __init__(self, name, width):
                    self.p = IOPort(width, name=f"{name}_p")
                    self.n = IOPort(width, name=f"{name}_n")

            class _Pads:
                rx = _Pair(f"{ip_name}_gt_rx", 4)
                tx = _Pair(f"{ip_name}_gt_tx", 4)
                refclk = _Pair(f"{ip_name}_gt_ref_clk", 1)
            pads = _Pads()
        self.pads = pads
        super().__init__({
            "rx": Out(CmacRxSignature()),
            "tx": In(CmacTxSignature()),
            "init_clk": In(1), "sys_reset": In(1),
            "usr_clk": Out(1), "usr_rx_reset": Out(1), "usr_tx_reset": Out(1),
            "rx_aligned": Out(1), "tx_ovf": Out(1), "tx_unf": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        pads = self.pads
        fec = int(self.rsfec)
        # PG203 reports stomped FCSs on a statistics output (frames per cycle), not in the stream;
        # it is taken as the ``stomped`` of the frame whose last beat is on the stream in the same
        # cycle. PG203 does not state that alignment: on hardware a stomped frame whose statistics
        # pulse comes earlier counts as an FCS error of this link instead (to be checked on a board).
        stomped_fcs = Signal(3)
        m.d.comb += self.rx.stomped.eq(stomped_fcs != 0)
        m.submodules.core = Instance(
            self.ip_name,
            # Transceivers (4 × 25.78125 Gbit/s, CAUI-4) and their reference clock: straight to pads.
            ("i", "gt_rxp_in", pads.rx.p), ("i", "gt_rxn_in", pads.rx.n),
            ("o", "gt_txp_out", pads.tx.p), ("o", "gt_txn_out", pads.tx.n),
            ("i", "gt_ref_clk_p", pads.refclk.p), ("i", "gt_ref_clk_n", pads.refclk.n),
            i_init_clk=self.init_clk,
            i_sys_reset=self.sys_reset,
            i_gt_loopback_in=Const(0, 12),
            i_gtwiz_reset_tx_datapath=0, i_gtwiz_reset_rx_datapath=0,
            i_core_rx_reset=0, i_core_tx_reset=0, i_core_drp_reset=0,
            i_drp_clk=0, i_drp_addr=Const(0, 10), i_drp_di=Const(0, 16), i_drp_en=0, i_drp_we=0,
            o_gt_txusrclk2=self.usr_clk,
            i_rx_clk=self.usr_clk,
            o_usr_rx_reset=self.usr_rx_reset,
            o_usr_tx_reset=self.usr_tx_reset,
            # Control (PG203 bring-up order) and RS-FEC.
            i_ctl_rx_enable=1,
            i_ctl_rx_force_resync=0, i_ctl_rx_test_pattern=0,
            i_ctl_tx_enable=self.rx_aligned,
            i_ctl_tx_send_rfi=~self.rx_aligned,
            i_ctl_tx_send_lfi=0, i_ctl_tx_send_idle=0, i_ctl_tx_test_pattern=0,
            i_ctl_tx_rsfec_enable=fec, i_ctl_rx_rsfec_enable=fec,
            i_ctl_rx_rsfec_enable_correction=fec, i_ctl_rx_rsfec_enable_indication=fec,
            i_ctl_rsfec_ieee_error_indication_mode=fec,
            o_stat_rx_aligned=self.rx_aligned,
            # User streams.
            o_rx_axis_tvalid=self.rx.tvalid, o_rx_axis_tdata=self.rx.tdata, o_rx_axis_tkeep=self.rx.tkeep,
            o_rx_axis_tlast=self.rx.tlast, o_rx_axis_tuser=self.rx.tuser,
            o_stat_rx_stomped_fcs=stomped_fcs,
            i_tx_axis_tvalid=self.tx.tvalid, i_tx_axis_tdata=self.tx.tdata, i_tx_axis_tkeep=self.tx.tkeep,
            i_tx_axis_tlast=self.tx.tlast, i_tx_axis_tuser=self.tx.tuser, o_tx_axis_tready=self.tx.tready,
            i_tx_preamblein=Const(0, 56),
            o_tx_ovfout=self.tx_ovf, o_tx_unfout=self.tx_unf,
        )
        return m
