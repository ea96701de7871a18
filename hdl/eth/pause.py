"""IEEE 802.3x flow control: MAC Control PAUSE frames (IEEE 802.3 clause 31, annex 31B) for the 10G MAC.

A PAUSE frame is a MAC Control frame (EtherType 0x8808, clause 31.4) with opcode 0x0001 and a
2-byte ``pause_time`` in *pause quanta* of 512 bit times (annex 31B.2); it goes to the reserved
multicast address 01-80-C2-00-00-01 (or to the station's own address, 31B.3.3), is padded to
the minimum frame (42 reserved zero bytes after ``pause_time``) and carries an FCS. On receipt a
MAC finishes the frame it is sending, then starts no new *data* frame until ``pause_time`` ×
512 bit times have passed; a new PAUSE frame restarts the timer, ``pause_time = 0`` releases it at
once (31B.3.7). MAC Control frames themselves are not held back.

Timing. The 64-bit XGMII moves 64 bit times a column, so one quantum is 8 columns: 51.2 ns at
10 Gbit/s, i.e. 8 cycles of the 156.25 MHz MAC clock (:data:`COLUMNS_PER_QUANTUM`). Both blocks
here run under the same clock enable as the MAC (one enabled cycle = one XGMII column, also behind
a 32-bit gearbox where the MAC is enabled 32 cycles of 33), so the timer counts columns and is
exact in both ports.

Blocks
------
:class:`PauseRx`
    After :class:`~wirereduce.hdl.eth.mac.MacRx`: recognises PAUSE frames addressed to the port,
    consumes them (no beat of one reaches the receive FIFO) and reports each good one
    (FCS checked) as ``pause`` with its ``quanta``.
:class:`PauseTx`
    Before :class:`~wirereduce.hdl.eth.mac.MacTx`: holds data frames while the peer's PAUSE timer
    runs, and sends this port's own PAUSE frames (XOFF while the receive FIFO is above its
    high-water mark, refreshed before they expire; XON, ``pause_time = 0``, when it drains below
    the low-water mark) between frames, ahead of queued data frames.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.eth.mac import rx_beat_layout
from wirereduce.hdl.stream.frame import FrameStream

__all__ = ["PAUSE_DST", "MAC_CONTROL_ETHERTYPE", "PAUSE_OPCODE", "QUANTUM_BITS", "COLUMNS_PER_QUANTUM",
           "PAUSE_MAX", "pause_frame", "parse_pause", "PauseRx", "PauseTx"]

#: Reserved multicast destination of PAUSE frames (IEEE 802.3 annex 31B.1).
PAUSE_DST = 0x01_80_C2_00_00_01
#: The MAC Control EtherType (IEEE 802.3 clause 31.4.1.3, "Type" 88-08).
MAC_CONTROL_ETHERTYPE = 0x8808
#: The PAUSE opcode (IEEE 802.3 annex 31A).
PAUSE_OPCODE = 0x0001
#: One pause quantum: 512 bit times (annex 31B.2).
QUANTUM_BITS = 512
#: XGMII columns (64 bits each) in one quantum: 8; at 10 Gbit/s 51.2 ns = 8 cycles of 156.25 MHz.
COLUMNS_PER_QUANTUM = QUANTUM_BITS // 64
#: The largest pause_time (quanta): 65535 × 51.2 ns ≈ 3.355 ms at 10 Gbit/s.
PAUSE_MAX = 0xFFFF

_ETHERTYPE_LE = int.from_bytes(MAC_CONTROL_ETHERTYPE.to_bytes(2, "big"), "little")
_OPCODE_LE = int.from_bytes(PAUSE_OPCODE.to_bytes(2, "big"), "little")


def _mac_le(mac: int) -> int:
    """A MAC address as the 48 low bits of a beat (first byte on the wire in bits 0..7)."""
    return int.from_bytes(mac.to_bytes(6, "big"), "little")


def _mac_le_value(mac) -> Value:
    """:func:`_mac_le` of an int, or of a 48-bit value (an address the port takes as an input)."""
    if isinstance(mac, int):
        return Const(_mac_le(mac), 48)
    mac = Value.cast(mac)
    return Cat(*(mac[8 * k:8 * k + 8] for k in reversed(range(6))))


def pause_frame(src: int, quanta: int, dst: int = PAUSE_DST) -> bytes:
    """The 60 bytes of a PAUSE frame, destination address to the end of the padding (no FCS):
    ``dst``, ``src``, 88-08, opcode 00-01, ``quanta`` (most significant byte first) and 42 zero
    bytes (annex 31B.1).

    Raises
    ------
    ValueError
        If an address is not a 48-bit int or ``quanta`` not in 0 … 65535.
    """
    from wirereduce.hdl.eth.port import check_mac, eth_header

    check_mac("src", src)
    if not isinstance(quanta, int) or isinstance(quanta, bool) or not 0 <= quanta <= PAUSE_MAX:
        raise ValueError(f"quanta must be an int from 0 to {PAUSE_MAX}, not {quanta!r}")
    body = PAUSE_OPCODE.to_bytes(2, "big") + quanta.to_bytes(2, "big")
    return eth_header(dst, src, MAC_CONTROL_ETHERTYPE) + body + bytes(60 - 14 - len(body))


def parse_pause(frame: bytes, local_mac: int | None = None) -> int | None:
    """The ``pause_time`` of ``frame`` (bytes from the destination address on, no FCS) if it is a
    PAUSE frame :class:`PauseRx` honours (to :data:`PAUSE_DST` or ``local_mac``, EtherType 88-08,
    opcode 00-01, at least 18 bytes), else None."""
    if len(frame) < 18 or frame[12:16] != b"\x88\x08\x00\x01":
        return None
    dst = int.from_bytes(frame[:6], "big")
    if dst != PAUSE_DST and dst != local_mac:
        return None
    return int.from_bytes(frame[16:18], "big")


class PauseRx(wiring.Component):
    """Receive side of PAUSE (annex 31B.3): finds PAUSE frames in the :class:`MacRx` output,
    consumes them and reports the good ones.

    The beats pass through a 2-beat delay line, so that when a frame's first beat leaves, its
    second (source address end, EtherType, opcode) is known: a frame to :data:`PAUSE_DST` or
    ``local_mac`` with EtherType 88-08 and opcode 00-01 is consumed whole (no beat of it leaves);
    any other frame, other MAC Control frames included, passes unchanged, 2 cycles later (the
    deframer drops those by EtherType). At the consumed frame's last beat, if :class:`MacRx` found
    it good (FCS, length), ``pause`` is high for that cycle with ``quanta`` = its pause_time and
    ``frames`` counts it; a bad one is only counted by :class:`MacRx` (e.g. ``fcs_errors``).

    Every cycle of this block is one XGMII column: run it under the MAC's clock enable and gate
    ``o.valid`` and ``pause`` with it.

    Parameters
    ----------
    local_mac : int or Value
        The port's own address, also honoured as a PAUSE destination (31B.3.3); a 48-bit value
        when the port takes its address as an input (:class:`~wirereduce.hdl.eth.port.EthPort10G`
        with ``local_mac=None``).

    Attributes
    ----------
    i, o : stream.Signature(rx_beat_layout(), always_ready=True)
    pause : Out(1); quanta : Out(16)
    frames : Out(32)
        Good PAUSE frames received (wrapping).
    """

    def __init__(self, local_mac):
        self.local_mac = local_mac
        sig = stream.Signature(rx_beat_layout(), always_ready=True)
        super().__init__({"i": In(sig), "o": Out(sig), "pause": Out(1), "quanta": Out(16), "frames": Out(32)})

    def elaborate(self, platform):
        m = Module()
        lay = rx_beat_layout()
        s1_v, s2_v = Signal(), Signal()
        s1, s2 = Signal(lay), Signal(lay)
        m.d.sync += [s1_v.eq(self.i.valid), s1.eq(self.i.payload), s2_v.eq(s1_v), s2.eq(s1)]

        idx = Signal(range(4))     # beat of s2 within its frame, saturating at 3
        drop = Signal()            # the frame in s2 is a PAUSE frame (from its second beat on)
        drop_now = Signal()
        quanta = Signal(16)
        dst = s2.data[:48]
        header_is_pause = ((dst == _mac_le(PAUSE_DST)) | (dst == _mac_le_value(self.local_mac))) \
            & (s1.data[32:48] == _ETHERTYPE_LE) & (s1.data[48:64] == _OPCODE_LE)
        m.d.comb += drop_now.eq(Mux(idx == 0, s1_v & ~s2.last & header_is_pause, drop))
        # pause_time: frame bytes 16-17, most significant first, in lanes 0-1 of beat 2.
        q_now = Cat(s2.data[8:16], s2.data[0:8])
        with m.If(s2_v):
            m.d.sync += idx.eq(Mux(s2.last, 0, Mux(idx == 3, 3, idx + 1)))
            with m.If(idx == 0):
                m.d.sync += drop.eq(drop_now)
            with m.If(idx == 2):
                m.d.sync += quanta.eq(q_now)
        m.d.comb += [
            self.o.valid.eq(s2_v & ~drop_now),
            self.o.payload.eq(s2),
            self.quanta.eq(Mux(idx == 2, q_now, quanta)),
            self.pause.eq(s2_v & s2.last & drop_now & ~s2.bad & (idx >= 2)),
        ]
        with m.If(self.pause):
            m.d.sync += self.frames.eq(self.frames + 1)
        return m


class PauseTx(wiring.Component):
    """Transmit side of PAUSE: the gate in front of :class:`~wirereduce.hdl.eth.mac.MacTx`.

    - **Honouring the peer** (annex 31B.3.7). ``peer_pause`` (one cycle, with ``peer_quanta``)
      loads the pause timer with ``peer_quanta`` × :data:`COLUMNS_PER_QUANTUM` columns (0 clears
      it); it counts down one a cycle. A data frame on ``i`` may start only while the timer is 0;
      a frame already started (its first beat shown to the MAC) always finishes.
    - **Sending PAUSE** (``enable``). ``xoff`` (the receive FIFO at or above its high-water mark)
      sets the wanted state, ``xon`` (below its low-water mark) clears it. A PAUSE frame goes
      out, before any waiting data frame, as soon as no frame is in flight: XOFF with
      ``pause_time = quanta`` when the state is wanted and not yet announced, again once
      ``refresh`` columns have passed since the last XOFF while still wanted, and XON
      (``pause_time = 0``) when no longer wanted after an XOFF. PAUSE frames are not held by
      the peer's pause (MAC Control frames, 31B.3.7), so two ports pausing each other never
      deadlock. Each one is 18 bytes on ``o`` (the MAC pads it to 60 and adds the FCS).

    One cycle is one XGMII column: run it under the MAC's clock enable.

    Parameters
    ----------
    local_mac : int or Value
        Source address of the PAUSE frames sent (a 48-bit value: an address taken as an input).
    quanta : int
        pause_time of an XOFF, 1 … 65535 (default :data:`PAUSE_MAX`).
    refresh : int or None
        Columns between XOFFs while still above the low-water mark; default half the XOFF's
        time (``quanta × 8 / 2``), so a new XOFF reaches the peer long before the old expires.

    Attributes
    ----------
    i, o : FrameStream(64)
    xoff, xon : In(1)
    peer_pause : In(1); peer_quanta : In(16)
    enable : In(1)
        Send PAUSE frames at all (default on).
    paused : Out(1)
        The peer's pause timer is running.
    sent : Out(32)
        PAUSE frames sent (wrapping).

    Raises
    ------
    ValueError
        If ``quanta`` is not in 1 … 65535 or ``refresh`` not a positive int below ``quanta × 8``.
    """

    def __init__(self, local_mac: int, quanta: int = PAUSE_MAX, refresh: int | None = None):
        if not isinstance(quanta, int) or isinstance(quanta, bool) or not 1 <= quanta <= PAUSE_MAX:
            raise ValueError(f"PauseTx quanta must be an int from 1 to {PAUSE_MAX}, not {quanta!r}")
        if refresh is None:
            refresh = quanta * COLUMNS_PER_QUANTUM // 2
        if not isinstance(refresh, int) or isinstance(refresh, bool) or not 1 <= refresh < quanta * COLUMNS_PER_QUANTUM:
            raise ValueError(f"PauseTx refresh must be 1 … {quanta * COLUMNS_PER_QUANTUM - 1} columns, not {refresh!r}")
        if isinstance(local_mac, int):
            pause_frame(local_mac, 0)   # raises on an address that is not 48 bits
        self.local_mac = local_mac
        self.quanta = quanta
        self.refresh = refresh
        super().__init__({
            "i": In(FrameStream(64)), "o": Out(FrameStream(64)),
            "xoff": In(1), "xon": In(1), "enable": In(1, init=1),
            "peer_pause": In(1), "peer_quanta": In(16),
            "paused": Out(1), "sent": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        o, i = self.o, self.i

        # The peer's pause timer, in columns.
        timer = Signal(16 + 3)
        with m.If(self.peer_pause):
            m.d.sync += timer.eq(self.peer_quanta * COLUMNS_PER_QUANTUM)
        with m.Elif(timer != 0):
            m.d.sync += timer.eq(timer - 1)
        m.d.comb += self.paused.eq(timer != 0)

        # Our own pause state: wanted (hysteresis between the marks) and announced.
        want = Signal()
        announced = Signal()
        since = Signal(range(self.refresh + 1))
        with m.If(self.xoff):
            m.d.sync += want.eq(1)
        with m.Elif(self.xon):
            m.d.sync += want.eq(0)
        with m.If(announced & (since != self.refresh)):
            m.d.sync += since.eq(since + 1)
        send_xoff = self.enable & want & (~announced | (since == self.refresh))
        send_xon = announced & ~want
        need = Signal()
        m.d.comb += need.eq(send_xoff | send_xon)

        # Frame in flight on o: committed once its first beat has been shown to the MAC.
        committed = Signal()
        cur_pause = Signal()
        beat = Signal(range(3))
        q = Signal(16)                   # pause_time of the PAUSE frame in flight
        q_now = Signal(16)
        m.d.comb += q_now.eq(Mux(committed, q, Mux(send_xoff, self.quanta, 0)))
        # Header: PAUSE_DST, local_mac, 88-08, opcode 00-01 (pause_frame's first 16 bytes).
        hdr = Cat(Const(_mac_le(PAUSE_DST), 48), _mac_le_value(self.local_mac),
                  Const(int.from_bytes(pause_frame(0, 0)[12:16], "little"), 32))
        pause_beats = [hdr[:64], hdr[64:], Cat(q_now[8:16], q_now[:8], Const(0, 48))]
        pause_data = Signal(64)
        with m.Switch(beat):
            for k, value in enumerate(pause_beats):
                with m.Case(k):
                    m.d.comb += pause_data.eq(value)
        use_pause = Mux(committed, cur_pause, need)
        data_ok = Mux(committed, 1, ~need & (timer == 0) & ~self.peer_pause)
        with m.If(use_pause):
            m.d.comb += [o.valid.eq(1), o.payload.data.eq(pause_data),
                         o.payload.keep.eq(Mux(beat == 2, 0x03, 0xFF)), o.payload.last.eq(beat == 2)]
        with m.Else():
            m.d.comb += [o.valid.eq(i.valid & data_ok), o.payload.eq(i.payload),
                         i.ready.eq(o.ready & data_ok)]
        take = o.valid & o.ready
        with m.If(o.valid & ~committed):
            m.d.sync += [committed.eq(1), cur_pause.eq(use_pause), q.eq(q_now)]
            with m.If(use_pause):
                m.d.sync += [announced.eq(send_xoff), since.eq(0)]
        with m.If(take & use_pause):
            m.d.sync += beat.eq(beat + 1)
        with m.If(take & o.payload.last):
            m.d.sync += [committed.eq(0), beat.eq(0)]
            with m.If(use_pause):
                m.d.sync += self.sent.eq(self.sent + 1)
        return m
