"""10 Gigabit Ethernet MAC at the 64-bit XGMII: transmit, receive, and a store-and-forward bad-frame filter.

The client side of the MAC is the frame stream of :mod:`wirereduce.hdl.stream.frame` (:func:`beat_layout`
at 64 bits): an Ethernet frame from the first byte of the destination address to the last byte of
the payload, **without** preamble, SFD and FCS. The line side is one 64-bit XGMII column a cycle
of the 156.25 MHz clock (:class:`XgmiiSignature`): 8 data bytes and 8 control flags, lane 0 the
first byte on the wire, i.e. two 32-bit XGMII transfers of IEEE 802.3 clause 46 side by side.

Blocks
------
:class:`MacTx`
    Frames in, XGMII out: preamble, SFD, padding, FCS, /T/ and a deficit-idle-count gap.
:class:`MacRx`
    XGMII in, frames out: finds /S/, checks SFD, FCS and length; marks the last beat of a bad
    frame instead of dropping it (for cut-through) and counts frames and errors.
:class:`RxDropBad`
    Optional store-and-forward stage after :class:`MacRx` that drops bad frames whole.
:class:`RxCutThrough`
    The cut-through alternative: passes beats as they arrive, the verdict in ``bad`` on the last.

The FCS (IEEE 802.3 clause 3.2.9) is CRC-32 as :data:`amaranth.lib.crc.catalog.CRC32_ETHERNET`
defines it; both directions update it 8 bytes a cycle, and 0 … 8 bytes on the last column of a
frame, with XOR networks derived from that catalog entry (:func:`crc_update`).
"""

from __future__ import annotations

from functools import cache

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import crc, data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.params import reject
from wirereduce.hdl.stream.frame import FrameStream, beat_layout

__all__ = [
    "XGMII_IDLE", "XGMII_START", "XGMII_TERMINATE", "XGMII_ERROR", "PREAMBLE_BYTE", "SFD_BYTE",
    "FCS_ALGORITHM", "FCS_BYTES", "MIN_FRAME_BYTES", "MAX_FRAME_BYTES", "JUMBO_FRAME_BYTES", "IFG_BYTES",
    "XgmiiSignature", "crc_update", "fcs_value", "rx_error_layout", "rx_beat_layout", "rx_stats_layout",
    "tx_stats_layout", "MacTx", "MacRx", "RxDropBad", "RxCutThrough",
]

#: XGMII control characters (IEEE 802.3 Table 46-3), sent with the lane's control flag set.
XGMII_IDLE = 0x07
XGMII_START = 0xFB
XGMII_TERMINATE = 0xFD
XGMII_ERROR = 0xFE
#: Preamble octet and start frame delimiter (clauses 3.2.1, 3.2.2): 0x55 × 7 then 0xD5 on the wire.
PREAMBLE_BYTE = 0x55
SFD_BYTE = 0xD5
#: The frame check sequence: CRC-32, sent least significant byte first (clause 3.2.9).
FCS_ALGORITHM = crc.catalog.CRC32_ETHERNET
FCS_BYTES = 4
#: Shortest valid frame, destination address to FCS: minFrameSize 512 bits (clause 4.4.2).
MIN_FRAME_BYTES = 64
#: Longest untagged frame, destination address to FCS: maxBasicFrameSize (clause 4.4.2).
#: Add 4 for a VLAN tag (1522, clause 3.5).
MAX_FRAME_BYTES = 1518
#: Longest frame with the jumbo MTU of 9000 bytes (not an IEEE size; add 4 for a VLAN tag).
JUMBO_FRAME_BYTES = 9018
#: Nominal inter-packet gap in bytes, /T/ included: 96 bit times (clause 4.4.2).
IFG_BYTES = 12

_LANES = 8
_IDLE_COLUMN = int.from_bytes(bytes([XGMII_IDLE] * _LANES), "little")
_ERROR_COLUMN = int.from_bytes(bytes([XGMII_ERROR] * _LANES), "little")
#: /S/ in lane 0, six preamble octets, SFD: the first column of every frame the MAC sends.
_START_COLUMN = int.from_bytes(bytes([XGMII_START] + [PREAMBLE_BYTE] * 6 + [SFD_BYTE]), "little")
#: Bytes of the padded frame before the FCS (clause 3.2.8: 46 bytes of data plus the header).
_PADDED_BYTES = MIN_FRAME_BYTES - FCS_BYTES
#: The longest deficit idle count: a gap may be shortened by up to 3 bytes (clause 46.3.1.4).
_DIC_MAX = 3
#: The gap counter of :class:`MacTx` saturates here; any larger gap allows a start in lane 0.
_IFG_SATURATE = 63


class XgmiiSignature(wiring.Signature):
    """One 64-bit XGMII direction, as the transmitting side sees it.

    Members
    -------
    data : Out(64)
        Byte lane ``k`` is ``data[8*k : 8*k+8]``; lane 0 is the first byte on the wire.
    ctrl : Out(8)
        ``ctrl[k]`` marks lane ``k`` as a control character (TXC/RXC, clause 46.3.1.2).

    Both reset to idle (/I/ in every lane, all control flags set).
    """

    def __init__(self):
        super().__init__({
            "data": Out(64, init=_IDLE_COLUMN),
            "ctrl": Out(8, init=0xFF),
        })


@cache
def _crc_masks(nbytes: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per output bit of the CRC register: the register bits and data bits that XOR into it.

    The CRC register is held as :class:`amaranth.lib.crc.Processor` holds it (not reflected); the
    data word is the ``8*nbytes``-bit word after the catalog's input reflection. The masks come
    from :meth:`amaranth.lib.crc.Parameters.compute` on the same polynomial (a CRC is linear in
    register and data), one basis vector at a time.
    """
    def raw(initial: int) -> crc.Parameters:
        return crc.Algorithm(crc_width=32, polynomial=FCS_ALGORITHM.polynomial, initial_crc=initial,
                             reflect_input=False, reflect_output=False, xor_output=0)(8 * nbytes)

    from_state = [raw(1 << i).compute([0]) for i in range(32)]
    from_data = [raw(0).compute([1 << j]) for j in range(8 * nbytes)]
    state_masks = tuple(sum(((w >> o) & 1) << i for i, w in enumerate(from_state)) for o in range(32))
    data_masks = tuple(sum(((w >> o) & 1) << j for j, w in enumerate(from_data)) for o in range(32))
    return state_masks, data_masks


def crc_update(state, data, nbytes: int):
    """The FCS CRC register after ``nbytes`` more bytes, as a combinational Amaranth value.

    Parameters
    ----------
    state : Value (32 bits)
        The CRC register; it starts at ``FCS_ALGORITHM.initial_crc`` (0xFFFFFFFF).
    data : Value
        The bytes, first byte in bits 0..7; only the low ``8 * nbytes`` bits are used.
    nbytes : int
        0 … 8 bytes (0 returns ``state``).

    Notes
    -----
    Ethernet sends each byte least significant bit first (clause 3.3), which is the catalog's
    ``reflect_input``: reflecting the whole little-endian word puts bit 0 of byte 0 first.

    Assign the result to a :class:`Signal` before slicing it: each slice of the expression
    would otherwise be built again from the whole XOR network.

    Each output bit is the XOR of the register and data bits its masks select, written as a
    reduction over just those bits (the data masks reflected here instead of the data). The same
    logic as ``(state & mask).xor()``, but Amaranth turns an AND with a constant into a bit-by-bit
    concatenation, which Verilator compiles into several times more C++ (a ring of Ethernet
    ports built 5-8 times slower).
    """
    if not FCS_ALGORITHM.reflect_input or not FCS_ALGORITHM.reflect_output:
        raise ValueError("the FCS algorithm must be bit-reflected, as Ethernet's is")
    if nbytes == 0:
        return state
    state_masks, data_masks = _crc_masks(nbytes)
    w = 8 * nbytes
    word = data[:w]

    def xor_of(value, mask, bits):
        # Bit j of the reflected word is bit bits-1-j of the data.
        picked = [value[j] for j in range(bits) if mask >> j & 1]
        return Cat(*picked).xor() if picked else Const(0, 1)

    return Cat(*(xor_of(state, sm, 32) ^ xor_of(word, int(f"{dm:0{w}b}"[::-1], 2), w)
                 for sm, dm in zip(state_masks, data_masks)))


def fcs_value(state):
    """The FCS of a CRC register (its 4 bytes go on the wire least significant first, clause 3.2.9)."""
    return state[::-1] ^ FCS_ALGORITHM.xor_output


def rx_error_layout() -> data.StructLayout:
    """Why a received frame is bad; at most one flag is set (priority from the top).

    ``code``: cut short by /E/ or another control character before /T/, or by a new /S/
    (clause 46.3.3); ``oversize``: longer than ``max_frame`` (clause 4.4.2 maxFrameSize);
    ``runt``: shorter than 64 bytes (minFrameSize); ``stomped``: the FCS is exactly the inverse of
    the right one, i.e. a cut-through node upstream stomped it (:attr:`MacTx.stomp`) because the
    frame went bad before it; ``fcs``: any other FCS mismatch, i.e. the frame went bad on this
    link (clause 3.4).
    """
    return data.StructLayout({"fcs": 1, "runt": 1, "oversize": 1, "code": 1, "stomped": 1})


def rx_beat_layout() -> data.StructLayout:
    """A received beat: :func:`beat_layout` (64) plus ``bad`` and ``error``, meaningful on the last beat.

    ``bad`` is the OR of ``error``; on every other beat both are 0.
    """
    return data.StructLayout({"data": 64, "keep": 8, "last": 1, "bad": 1, "error": rx_error_layout()})


def rx_stats_layout() -> data.StructLayout:
    """:class:`MacRx` counters, 32 bits each, wrapping.

    ``frames_ok`` / ``bytes_ok``: good frames and their bytes as the client sees them
    (destination address to end of payload, no FCS); ``fcs_errors``, ``runts``, ``oversize``,
    ``stomped``: bad frames by :func:`rx_error_layout`; ``errors``: frames cut short by a control
    character (``code``) and starts with a bad preamble or SFD.
    """
    return data.StructLayout({name: 32 for name in
                              ("frames_ok", "bytes_ok", "fcs_errors", "runts", "oversize", "errors", "stomped")})


def tx_stats_layout() -> data.StructLayout:
    """:class:`MacTx` counters, 32 bits each, wrapping.

    ``frames``: frames ended with an FCS and /T/ (stomped ones included); ``stomped``: of those,
    the ones sent with an inverted FCS; ``aborted``: frames ended with /E/ (abort or underrun).
    """
    return data.StructLayout({"frames": 32, "stomped": 32, "aborted": 32})


class MacTx(wiring.Component):
    """Transmit MAC: frames in, one XGMII column a cycle out.

    What goes on the wire for every frame (IEEE 802.3 clauses 3, 4 and 46):

    - /S/ in lane 0 of the frame's first column, six preamble bytes and the SFD (clauses 3.2.1,
      3.2.2, 46.3.1.4). The first column is built with /S/ in lane 0 and then sent either as is
      or delayed by 4 bytes, so /S/ lands in lane 0 or lane 4 of the wire column, whichever
      keeps the gap (below) — the two positions clause 46 allows on a 64-bit XGMII;
    - the frame bytes, zero-padded to 60 bytes (clause 3.2.8, minFrameSize of clause 4.4.2);
    - the FCS, CRC-32 over destination address … pad (clause 3.2.9), or its bitwise inverse when
      the frame is stomped;
    - /T/, then /I/ in the rest of the column and the inter-packet gap. The gap, counted from
      /T/ inclusive to the next /S/, is 12 bytes on average (clause 4.4.2) and never below 9:
      the deficit idle count of clause 46.3.1.4 lets a gap shrink by up to 3 bytes to put /S/
      in an allowed lane, and makes the next gaps longer by as much.

    Input timing: the MAC takes one beat a cycle from the first beat to the last without
    stalling. It stalls (``ready`` low) only while it sends something that is not frame
    data: the start column (1 cycle a frame, the first beat waits on ``i`` meanwhile), the pad
    columns of frames shorter than 60 bytes, the column after the last beat when FCS or /T/
    spill into it (last beat with 4 … 8 bytes), and the gap. A cycle without a beat in the
    middle of a frame is an underrun: the XGMII cannot pause, so the frame ends with /E/.

    Latency: the column the frame logic makes in a cycle (the start column, a beat taken, …) is
    on ``xgmii`` two cycles later (with /S/ in lane 4, its upper half a cycle later still). The
    second cycle is an output stage that puts the FCS of a frame's last column into the lanes
    the frame logic left for it, from the CRC it registered: CRC network and FCS placement in one
    cycle were too deep for 156.25 MHz (yosys estimate, docs/architecture.md "Timing budgets").

    Ending a frame badly (a cut-through node that has started forwarding a frame it then finds
    bad):

    - ``abort`` high in any cycle in which the MAC accepts beats of a frame ends the frame at
      once: that column is /E/ in every lane (transmit error propagation, clause 46.3.3), /T/
      follows, and the rest of the frame's beats, up to and including ``last``, are taken and
      dropped. Every receiver counts the frame as errored and drops it;
    - ``stomp`` high with the last beat sends the frame complete but with the FCS inverted
      (FCS XOR 0xFFFFFFFF), so the next hop's FCS check fails and it drops the frame.

    Attributes
    ----------
    i : In(FrameStream(64))
        Frames without preamble and FCS. ``keep`` is all ones except on the last beat, where it
        is contiguous from lane 0 (0 … 8 bytes).
    abort : In(1)
        End the current frame with /E/ (see above); ignored between frames.
    stomp : In(1)
        Sampled with the last beat: send this frame with an inverted FCS.
    xgmii : Out(XgmiiSignature())
        The transmit XGMII (TXD/TXC), registered, two cycles behind the frame logic.
    stats : Out(tx_stats_layout())
        Frame counters.
    """

    def __init__(self):
        super().__init__({
            "i": In(FrameStream(64)),
            "abort": In(1),
            "stomp": In(1),
            "xgmii": Out(XgmiiSignature()),
            "stats": Out(tx_stats_layout()),
        })

    def elaborate(self, platform):
        m = Module()
        beat = self.i.payload

        # Bytes in this beat (keep is contiguous from lane 0), and the beat with the bytes past
        # keep zeroed, which is also the zero padding of a short last beat.
        nbytes = Signal(range(_LANES + 1))
        for lane in range(_LANES):
            with m.If(beat.keep[lane]):
                m.d.comb += nbytes.eq(lane + 1)
        masked = Signal(64)
        m.d.comb += masked.eq(Cat(*(beat.data[8 * k:8 * k + 8] & beat.keep[k].replicate(8)
                                    for k in range(_LANES))))

        crc_reg = Signal(32, init=FCS_ALGORITHM.initial_crc)
        ncol = Signal(range(_LANES + 1))         # data columns sent, saturating at 8 (64 bytes)
        ifg = Signal(signed(8), init=_IFG_SATURATE)  # bytes from the last /T/ to this column
        dic = Signal(range(_DIC_MAX + 1))
        shift = Signal()                         # this frame's /S/ is in lane 4
        drain = Signal()                         # dropping the rest of an aborted frame
        stomp_r = Signal()
        pend_d = Signal(64)                      # the column after the last beat, if needed
        pend_c = Signal(8)
        pend_t = Signal(range(_LANES))           # its /T/ lane

        # The column the frame logic sends this cycle, with /S/ (if any) in lane 0.
        col_d = Signal(64)
        col_c = Signal(8)
        m.d.comb += [col_d.eq(_IDLE_COLUMN), col_c.eq(0xFF)]

        # Frame tail: the last tail_k bytes of tail_data, FCS, /T/, idles, over two columns.
        tail_go = Signal()
        tail_k = Signal(range(_LANES + 1))
        tail_data = Signal(64)
        tail_stomp = Signal()
        tail_cur_d, tail_nxt_d = Signal(64), Signal(64)
        tail_cur_c, tail_nxt_c = Signal(8), Signal(8)
        tail_crc = Signal(32)
        with m.Switch(tail_k):
            for k in range(_LANES + 1):
                with m.Case(k):
                    m.d.comb += tail_crc.eq(crc_update(crc_reg, tail_data, k))
        # The FCS lanes are left zero here; the output stage puts the FCS in them (see below).
        with m.Switch(tail_k):
            for k in range(_LANES + 1):
                with m.Case(k):
                    idles = 2 * _LANES - k - FCS_BYTES - 1
                    window = Cat(tail_data[:8 * k], Const(0, 8 * FCS_BYTES), Const(XGMII_TERMINATE, 8),
                                 Const(int.from_bytes(bytes([XGMII_IDLE] * idles), "little"), 8 * idles))
                    ctrl = ((1 << 2 * _LANES) - 1) ^ ((1 << (k + FCS_BYTES)) - 1)
                    m.d.comb += [Cat(tail_cur_d, tail_nxt_d).eq(window),
                                 Cat(tail_cur_c, tail_nxt_c).eq(ctrl)]
        with m.If(tail_go):
            m.d.sync += self.stats.frames.eq(self.stats.frames + 1)
            with m.If(tail_stomp):
                m.d.sync += self.stats.stomped.eq(self.stats.stomped + 1)

        sh = Signal()  # this column goes out 4 bytes late (its frame starts in lane 4)
        m.d.comb += sh.eq(shift)

        def tail(k, data_, stomp):
            m.d.comb += [tail_go.eq(1), tail_k.eq(k), tail_data.eq(data_), tail_stomp.eq(stomp),
                         col_d.eq(tail_cur_d), col_c.eq(tail_cur_c)]
            with m.If(tail_k < _LANES - FCS_BYTES):
                # /T/ is in this column at lane k + 4; count the gap from there.
                m.d.sync += ifg.eq(_LANES - (tail_k + FCS_BYTES) - Mux(shift, 4, 0))
                m.next = "IDLE"
            with m.Else():
                m.d.sync += [pend_d.eq(tail_nxt_d), pend_c.eq(tail_nxt_c), pend_t.eq(tail_k - FCS_BYTES)]
                m.next = "TAIL"

        def take_drained():
            m.d.comb += self.i.ready.eq(1)
            with m.If(self.i.valid & beat.last):
                m.d.sync += drain.eq(0)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(drain):
                    take_drained()
                # Deficit idle count (clause 46.3.1.4): /S/ goes at the first lane-0 or lane-4
                # position at least 9 + dic bytes after /T/; the dic grows by the bytes the gap
                # fell short of 12 and shrinks (not below 0) by the bytes it ran over.
                need = dic + (IFG_BYTES - _DIC_MAX)
                ok0 = ifg >= need
                ok4 = ifg + 4 >= need
                with m.If(self.i.valid & ~drain & (ok0 | ok4)):
                    gap = ifg + Mux(ok0, 0, 4)
                    slack = dic + IFG_BYTES - gap
                    m.d.comb += [col_d.eq(_START_COLUMN), col_c.eq(0x01), sh.eq(~ok0)]
                    m.d.sync += [shift.eq(~ok0), dic.eq(Mux(slack[-1], 0, slack)),
                                 crc_reg.eq(FCS_ALGORITHM.initial_crc), ncol.eq(0)]
                    m.next = "DATA"
                with m.Else():
                    m.d.sync += ifg.eq(Mux(ifg >= _IFG_SATURATE - _LANES, _IFG_SATURATE, ifg + _LANES))

            with m.State("DATA"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.abort | ~self.i.valid):
                    m.d.comb += [col_d.eq(_ERROR_COLUMN), col_c.eq(0xFF)]
                    m.d.sync += [pend_d.eq(Cat(Const(XGMII_TERMINATE, 8), Const(_IDLE_COLUMN, 56))),
                                 pend_c.eq(0xFF), pend_t.eq(0),
                                 drain.eq(~(self.i.valid & beat.last)),
                                 self.stats.aborted.eq(self.stats.aborted + 1)]
                    m.next = "TAIL"
                with m.Elif(beat.last):
                    with m.If((ncol == _LANES) | ((ncol == _LANES - 1) & (nbytes >= FCS_BYTES))):
                        tail(nbytes, masked, self.stomp)       # 60 bytes or more: no padding
                    with m.Elif(ncol == _LANES - 1):
                        tail(FCS_BYTES, masked, self.stomp)    # 57 … 59 bytes: pad in this column
                    with m.Else():
                        m.d.comb += [col_d.eq(masked), col_c.eq(0)]
                        m.d.sync += [crc_reg.eq(crc_update(crc_reg, masked, _LANES)),
                                     ncol.eq(ncol + 1), stomp_r.eq(self.stomp)]
                        m.next = "PAD"
                with m.Else():
                    m.d.comb += [col_d.eq(masked), col_c.eq(0)]
                    m.d.sync += [crc_reg.eq(crc_update(crc_reg, masked, _LANES)),
                                 ncol.eq(Mux(ncol == _LANES, _LANES, ncol + 1))]

            with m.State("PAD"):
                # Zero columns up to byte 60; the FCS then fills lanes 4..7 of column 7.
                with m.If(ncol == _LANES - 1):
                    tail(FCS_BYTES, 0, stomp_r)
                with m.Else():
                    m.d.comb += [col_d.eq(0), col_c.eq(0)]
                    m.d.sync += [crc_reg.eq(crc_update(crc_reg, Const(0, 64), _LANES)), ncol.eq(ncol + 1)]

            with m.State("TAIL"):
                m.d.comb += [col_d.eq(pend_d), col_c.eq(pend_c)]
                m.d.sync += ifg.eq(_LANES - pend_t - Mux(shift, 4, 0))
                with m.If(drain):
                    take_drained()
                m.next = "IDLE"

        # Output stage, one cycle after the frame logic: the column, with the FCS of a tail column
        # put in its lanes here, from the registered CRC (the CRC network and the FCS placement
        # in one cycle would be too deep for 156.25 MHz). FCS bytes past lane 7 (a last beat of 5
        # … 8 bytes) go into the next column, whose lanes for them the frame logic left zero too.
        b_d = Signal(64, init=_IDLE_COLUMN)
        b_c = Signal(8, init=0xFF)
        b_sh = Signal()
        b_tail = Signal()
        b_k = Signal(range(_LANES + 1))
        b_crc = Signal(32)
        b_stomp = Signal()
        m.d.sync += [b_d.eq(col_d), b_c.eq(col_c), b_sh.eq(sh), b_tail.eq(tail_go), b_k.eq(tail_k),
                     b_crc.eq(tail_crc), b_stomp.eq(tail_stomp)]
        fcs = Signal(32)
        m.d.comb += fcs.eq(fcs_value(b_crc) ^ b_stomp.replicate(32))
        fcs_win = Signal(2 * 64)  # the FCS at byte b_k of this column and the next
        with m.If(b_tail):
            with m.Switch(b_k):
                for k in range(_LANES + 1):
                    with m.Case(k):
                        m.d.comb += fcs_win.eq(Cat(Const(0, 8 * k), fcs))
        spill = Signal(64)
        out_d = Signal(64)
        m.d.comb += out_d.eq(b_d | fcs_win[:64] | spill)
        m.d.sync += spill.eq(fcs_win[64:])

        # Lane-4 frames: every column goes out 4 bytes late, its upper half carried over. The
        # carry holds idles whenever the lane changes, since a frame never starts in the column
        # right after its predecessor's last one unless that column's upper half is idle.
        carry_d = Signal(32, init=_IDLE_COLUMN & 0xFFFFFFFF)
        carry_c = Signal(4, init=0xF)
        m.d.sync += [
            self.xgmii.data.eq(Mux(b_sh, Cat(carry_d, out_d[:32]), out_d)),
            self.xgmii.ctrl.eq(Mux(b_sh, Cat(carry_c, b_c[:4]), b_c)),
            carry_d.eq(out_d[32:]),
            carry_c.eq(b_c[4:]),
        ]
        return m


class MacRx(wiring.Component):
    """Receive MAC: XGMII in, frames without preamble and FCS out, with a per-frame verdict.

    A frame starts with /S/ in lane 0 or lane 4 (clause 46.3.1.4 for the 64-bit column) followed
    by six preamble bytes and the SFD (clauses 3.2.1, 3.2.2); a start with anything else there
    is not received and counts in ``errors``. Frames starting in lane 4 are realigned, so the
    output always has the destination address in lane 0 of the first beat. A frame ends at the
    first control character: /T/ ends it normally; any other (/E/, /I/ — a frame cut short,
    an idle in the middle, a missing /T/ — or a new /S/) ends it as a ``code`` error (clause
    46.3.3). Gaps down to 5 bytes are received (the least a receiver may see, clause 4.4.2).

    The FCS is known only at the end, so the MAC never drops: each frame comes out beat by beat
    as it arrives (six cycles behind the line: the newest 8 bytes wait until the next column
    shows where the FCS begins, and an output stage checks the FCS of the last beat, a cycle
    after the CRC is complete: CRC network and FCS compares in one cycle were too deep for
    156.25 MHz, docs/architecture.md "Timing budgets"), and its last beat says ``bad`` and why
    (:func:`rx_error_layout`). A cut-through consumer that has already forwarded the head of a
    bad frame can then abort or stomp its outgoing copy (:class:`MacTx`); a store-and-forward
    consumer puts :class:`RxDropBad` after the MAC to get good frames only.

    - Runts (under 64 bytes with FCS, clause 4.4.2 minFrameSize) come out marked ``runt``;
      a frame with no bytes besides its FCS produces no beat at all (it is only counted).
    - Frames longer than ``max_frame`` (clause 4.4.2 maxFrameSize) come out cut after at most
      ``max_frame`` bytes, marked ``oversize``; the rest of the frame is discarded.

    Parameters
    ----------
    max_frame : int
        Longest good frame in bytes, destination address to FCS: :data:`MAX_FRAME_BYTES`
        (1518), 1522 with a VLAN tag, :data:`JUMBO_FRAME_BYTES` (9018) for MTU 9000.

    Attributes
    ----------
    xgmii : In(XgmiiSignature())
        The receive XGMII (RXD/RXC), registered on entry.
    o : Out(stream.Signature(rx_beat_layout(), always_ready=True))
        Received frames. The line cannot wait, so neither can this stream: the consumer takes
        a beat in every cycle ``valid`` is high (behind a FIFO or :class:`RxDropBad` if it may
        stall).
    stats : Out(rx_stats_layout())
        Frame and error counters.

    Raises
    ------
    ValueError
        If ``max_frame`` is not an int between 64 and 65535.
    """

    def __init__(self, max_frame: int = MAX_FRAME_BYTES):
        if not isinstance(max_frame, int) or isinstance(max_frame, bool) or not MIN_FRAME_BYTES <= max_frame < 1 << 16:
            reject(self, ValueError(f"max_frame must be an int number of bytes from 64 to 65535 (1518, 1522, 9018), "
                                    f"not {max_frame!r}"))
        self.max_frame = max_frame
        super().__init__({
            "xgmii": In(XgmiiSignature()),
            "o": Out(stream.Signature(rx_beat_layout(), always_ready=True)),
            "stats": Out(rx_stats_layout()),
        })

    def elaborate(self, platform):
        m = Module()
        max_frame = self.max_frame
        stats = self.stats

        # Line columns: r is the latest, p the one before.
        r_d = Signal(64, init=_IDLE_COLUMN)
        r_c = Signal(8, init=0xFF)
        p_d = Signal(64, init=_IDLE_COLUMN)
        p_c = Signal(8, init=0xFF)
        m.d.sync += [r_d.eq(self.xgmii.data), r_c.eq(self.xgmii.ctrl), p_d.eq(r_d), p_c.eq(r_c)]

        # Realign: a frame whose /S/ is in lane 4 is read 4 bytes late, so that /S/ is in lane 0
        # of the aligned column. Switching drops or repeats 4 bytes of the gap, never frame
        # data, as long as gaps are at least 5 bytes.
        shift = Signal()
        with m.If(r_c[0] & (r_d[:8] == XGMII_START)):
            m.d.sync += shift.eq(0)
        with m.Elif(r_c[4] & (r_d[32:40] == XGMII_START)):
            m.d.sync += shift.eq(1)
        a_d = Signal(64, init=_IDLE_COLUMN)
        a_c = Signal(8, init=0xFF)
        m.d.sync += [a_d.eq(Mux(shift, Cat(p_d[32:], r_d[:32]), p_d)),
                     a_c.eq(Mux(shift, Cat(p_c[4:], r_c[:4]), p_c))]

        # Decode the aligned column.
        is_start = Signal()
        pre_ok = Signal()
        m.d.comb += [
            is_start.eq(a_c[0] & (a_d[:8] == XGMII_START)),
            pre_ok.eq((a_c[1:] == 0) & (a_d[8:] == _START_COLUMN >> 8)),
        ]
        has_ctrl = Signal()
        j = Signal(range(_LANES))  # the first control lane
        for lane in reversed(range(_LANES)):
            with m.If(a_c[lane]):
                m.d.comb += j.eq(lane)
        m.d.comb += has_ctrl.eq(a_c.any())
        is_term = Signal()
        m.d.comb += is_term.eq(has_ctrl & (a_d.word_select(j, 8) == XGMII_TERMINATE))

        crc_reg = Signal(32, init=FCS_ALGORITHM.initial_crc)
        cnt = Signal(range(max_frame + 2 * _LANES))  # frame bytes so far, FCS included
        has_h = Signal()                               # a full column is held back in h_d
        h_d = Signal(64)

        # Verdict on a frame ending with /T/ in lane j.
        crc_fin = Signal(32)
        with m.Switch(j):
            for k in range(_LANES):
                with m.Case(k):
                    m.d.comb += crc_fin.eq(crc_update(crc_reg, a_d, k))
        total = Signal(range(max_frame + 3 * _LANES))
        m.d.comb += total.eq(cnt + j)
        # Every field of the verdict is one expression of the frame, ``code`` included (never set
        # here: a code error ends the frame elsewhere), so the Verilog is one continuous assign.
        # A field left to a constant-only ``always @*`` block stays X under Icarus 11, which never
        # runs a block with no inputs (tests/test_icarus.py).
        # The FSM's verdict has ``runt`` and ``oversize`` only; whether the FCS is right is decided
        # a cycle later, in the output stage, from the CRC registered here (crc_fin into the FCS
        # compares and the beat's flags in one cycle was too deep for 156.25 MHz).
        verdict = Signal(rx_error_layout())
        oversize = total > max_frame
        runt = ~oversize & (total < MIN_FRAME_BYTES)
        m.d.comb += verdict.eq(Cat(Const(0, 1), runt, oversize, Const(0, 2)))
        fin_crc = Signal(32)                    # crc_fin of the last /T/
        fin_total = Signal.like(total)          # and the frame's bytes with FCS

        # FSM output register; the beat after a /T/ column (j > 4) waits one cycle in pend_*.
        # ``chk``: the beat ends a frame with /T/, the FCS check is still to be done.
        o = Signal(rx_beat_layout())
        o_valid = Signal()
        o_chk = Signal()
        pend_valid = Signal()
        pend = Signal(rx_beat_layout())
        pend_chk = Signal()
        m.d.sync += [o_valid.eq(0), o_chk.eq(0), pend_valid.eq(0)]
        with m.If(pend_valid):
            m.d.sync += [o_valid.eq(1), o.eq(pend), o_chk.eq(pend_chk)]

        def emit(data_, keep, last, error=None):
            m.d.sync += [o_valid.eq(1), o.data.eq(data_), o.keep.eq(keep), o.last.eq(last),
                         o.bad.eq(0), o.error.eq(0)]
            if error is not None:
                m.d.sync += [o.bad.eq(error.as_value().any()), o.error.eq(error)]
            if error is verdict:
                m.d.sync += o_chk.eq(1)

        code = Signal(rx_error_layout())
        oversize = Signal(rx_error_layout())
        m.d.comb += [code.code.eq(1), oversize.oversize.eq(1)]

        def count(name):
            m.d.sync += stats[name].eq(stats[name] + 1)

        def start():
            with m.If(pre_ok):
                m.d.sync += [crc_reg.eq(FCS_ALGORITHM.initial_crc), cnt.eq(0), has_h.eq(0)]
                m.next = "DATA"
            with m.Else():
                count("errors")
                m.next = "IDLE"

        with m.FSM():
            with m.State("IDLE"):
                with m.If(is_start):
                    start()

            with m.State("DATA"):
                with m.If(~has_ctrl):
                    with m.If(cnt + _LANES > max_frame):
                        with m.If(has_h):
                            emit(h_d, 0xFF, 1, oversize)
                        count("oversize")
                        m.next = "IDLE"
                    with m.Else():
                        with m.If(has_h):
                            emit(h_d, 0xFF, 0)
                        m.d.sync += [h_d.eq(a_d), has_h.eq(1), cnt.eq(cnt + _LANES),
                                     crc_reg.eq(crc_update(crc_reg, a_d, _LANES))]
                with m.Elif(is_term):
                    m.d.sync += [fin_crc.eq(crc_fin), fin_total.eq(total)]
                    # The FCS is the 4 bytes before /T/: with j < 4 part of it is in h_d.
                    with m.If(j < FCS_BYTES):
                        with m.If(has_h):
                            emit(h_d, Cat(*(j + FCS_BYTES > k for k in range(_LANES))), 1, verdict)
                    with m.Elif(j == FCS_BYTES):
                        with m.If(has_h):
                            emit(h_d, 0xFF, 1, verdict)
                    with m.Else():
                        with m.If(has_h):
                            emit(h_d, 0xFF, 0)
                        m.d.sync += [pend_valid.eq(1), pend.data.eq(a_d),
                                     pend.keep.eq(Cat(*(j > k + FCS_BYTES for k in range(_LANES)))),
                                     pend.last.eq(1), pend.bad.eq(verdict.as_value().any()), pend.error.eq(verdict),
                                     pend_chk.eq(1)]
                    # The frames neither oversize nor runt are counted in the output stage.
                    with m.If(verdict.oversize):
                        count("oversize")
                    with m.Elif(verdict.runt):
                        count("runts")
                    m.next = "IDLE"
                with m.Else():
                    with m.If(has_h):
                        emit(h_d, 0xFF, 1, code)
                    count("errors")
                    m.next = "IDLE"
                    with m.If(is_start):
                        start()

        # Output stage: the FCS verdict of a beat ending a frame with /T/ (``o_chk``), and the
        # counters that depend on it. A frame neither runt nor oversize always ends with such a
        # beat (it has at least 60 bytes before its FCS). A frame whose FCS was sent inverted
        # leaves residue 0: the register starts from the output XOR (as for the residue,
        # amaranth.lib.crc.Parameters.residue), the inversion undoes that XOR, and 32 zero bits
        # leave 0. Any other mismatch is a link error.
        checked = o_chk & ~o.error.runt & ~o.error.oversize
        crc_bad = Signal()
        fcs_err = Signal()
        stomped = Signal()
        m.d.comb += [
            crc_bad.eq(checked & (fin_crc[::-1] != FCS_ALGORITHM(8).residue())),
            fcs_err.eq(crc_bad & (fin_crc != 0)),
            stomped.eq(crc_bad & (fin_crc == 0)),
        ]
        # The whole payload in one assignment (no constant-only ``always @*`` block for Icarus).
        m.d.sync += [
            self.o.valid.eq(o_valid),
            self.o.payload.eq(Cat(o.data, o.keep, o.last, o.bad | crc_bad,
                                  fcs_err, o.error.runt, o.error.oversize, o.error.code, stomped)),
        ]
        with m.If(o_valid & checked):
            with m.If(fcs_err):
                count("fcs_errors")
            with m.Elif(stomped):
                count("stomped")
            with m.Else():
                count("frames_ok")
                m.d.sync += stats.bytes_ok.eq(stats.bytes_ok + fin_total - FCS_BYTES)
        return m


def _rx_fifo_depth(component, max_frame: int, depth: int | None, frames: int) -> tuple[int, int]:
    """Beats of one ``max_frame`` frame, and the receive FIFO depth of :class:`RxDropBad` /
    :class:`RxCutThrough`: ``depth``, or ``frames`` such frames plus 16 beats when None.
    Raises ValueError if ``depth`` cannot hold one frame."""
    need = -(-max_frame // _LANES)
    if depth is None:
        depth = frames * need + 16
    if not isinstance(depth, int) or depth < need:
        reject(component, ValueError(f"depth must hold one {max_frame}-byte frame ({need} beats), not {depth!r}"))
    return need, depth


class RxDropBad(wiring.Component):
    """Store-and-forward filter after :class:`MacRx`: forwards good frames whole, drops bad ones.

    Beats are written to a FIFO as they arrive; when a frame's last beat arrives, its verdict
    (good or bad, and its beat count) goes to a second FIFO. The output side waits for a
    verdict, then forwards that many beats, or reads and discards them. A frame therefore
    leaves only after its last beat has arrived (one frame of latency) and the output never
    shows any beat of a bad frame. Good frames leave at one beat a cycle, with one idle cycle
    between frames.

    The input cannot wait (:class:`MacRx` cannot), so when the FIFO is full because the consumer
    stalls, frames are lost: a frame that finds the FIFO full is dropped whole and counted in
    ``overflow``. With the consumer always ready, a FIFO of ``max_frame`` bytes plus a few beats
    keeps up with back-to-back frames at line rate.

    Parameters
    ----------
    max_frame : int
        Longest frame :class:`MacRx` passes, in bytes with FCS; sets the default depth.
    depth : int or None
        FIFO depth in beats; default one ``max_frame`` frame plus 16 beats.

    Attributes
    ----------
    i : In(stream.Signature(rx_beat_layout(), always_ready=True))
        From :attr:`MacRx.o`.
    o : Out(FrameStream(64))
        Good frames.
    dropped : Out(32)
        Bad frames dropped (wrapping counter).
    overflow : Out(32)
        Frames lost, whole or in part, because the FIFO was full (wrapping counter).
    level : Out(range(depth + 1))
        Beats in the FIFO (its write-side level): what a flow-control threshold watches.

    Raises
    ------
    ValueError
        If ``depth`` is smaller than one ``max_frame`` frame.
    """

    def __init__(self, max_frame: int = MAX_FRAME_BYTES, depth: int | None = None):
        self.max_frame = max_frame
        self.frame_beats, self.depth = _rx_fifo_depth(self, max_frame, depth, frames=1)
        super().__init__({
            "i": In(stream.Signature(rx_beat_layout(), always_ready=True)),
            "o": Out(FrameStream(64)),
            "dropped": Out(32),
            "overflow": Out(32),
            "level": Out(range(self.depth + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        blay = beat_layout(64)
        nbits = (self.depth + 1).bit_length()
        m.submodules.beats = beats = fifo.SyncFIFOBuffered(width=blay.size, depth=self.depth)
        # A frame takes at least 8 beats (60 bytes), so this many verdicts cover a full FIFO.
        m.submodules.verdicts = verdicts = fifo.SyncFIFOBuffered(width=nbits + 1, depth=self.depth // 8 + 2)

        # Write side.
        beat = self.i.payload
        in_frame = Signal()
        admit = Signal()      # the frame has a verdict slot (checked at its first beat)
        lost = Signal()       # a beat of the frame did not fit
        nbeats = Signal(nbits)
        admit_now = Mux(in_frame, admit, verdicts.w_rdy)
        lost_before = in_frame & lost
        write = self.i.valid & admit_now & ~lost_before & beats.w_rdy
        lost_now = Signal()
        m.d.comb += lost_now.eq(lost_before | (self.i.valid & admit_now & ~beats.w_rdy))
        n_now = Signal(nbits)
        m.d.comb += n_now.eq(Mux(in_frame, nbeats, 0) + write)
        m.d.comb += [
            beats.w_data.eq(Cat(beat.data, beat.keep, beat.last)),
            beats.w_en.eq(write),
            self.level.eq(beats.w_level),
        ]
        with m.If(self.i.valid):
            with m.If(beat.last):
                m.d.sync += in_frame.eq(0)
                with m.If(admit_now & (n_now != 0)):
                    m.d.comb += [verdicts.w_en.eq(1), verdicts.w_data.eq(Cat(n_now, ~beat.bad & ~lost_now))]
                with m.If(~admit_now | lost_now):
                    m.d.sync += self.overflow.eq(self.overflow + 1)
                with m.Elif(beat.bad):
                    m.d.sync += self.dropped.eq(self.dropped + 1)
            with m.Else():
                m.d.sync += [in_frame.eq(1), admit.eq(admit_now), lost.eq(lost_now), nbeats.eq(n_now)]

        # Read side.
        active = Signal()
        good = Signal()
        left = Signal(nbits)
        stored = data.View(blay, beats.r_data)
        # The whole payload in one unconditional assignment, ``bad`` (always 0 here: bad frames
        # are dropped) included: no constant-only ``always @*`` block for Icarus to leave X.
        m.d.comb += self.o.payload.eq(Cat(stored.data, stored.keep, left == 1, Const(0, 1)))
        with m.If(~active):
            m.d.comb += verdicts.r_en.eq(verdicts.r_rdy)
            with m.If(verdicts.r_rdy):
                m.d.sync += [active.eq(1), left.eq(verdicts.r_data[:nbits]), good.eq(verdicts.r_data[nbits])]
        with m.Else():
            pop = Signal()
            with m.If(good):
                m.d.comb += [
                    self.o.valid.eq(beats.r_rdy),
                    pop.eq(self.o.valid & self.o.ready),
                ]
            with m.Else():
                m.d.comb += pop.eq(beats.r_rdy)
            m.d.comb += beats.r_en.eq(pop)
            with m.If(pop):
                m.d.sync += left.eq(left - 1)
                with m.If(left == 1):
                    m.d.sync += active.eq(0)
        return m


class RxCutThrough(wiring.Component):
    """Cut-through receive buffer after :class:`MacRx`: beats go on as they arrive, and the
    frame's verdict goes with its last beat as ``bad`` (:func:`~wirereduce.hdl.stream.frame.beat_layout`).

    A node behind it starts on a frame before its FCS is known; a frame found bad at the end
    leaves marked, so whatever it turned into is sent with a stomped FCS
    (:attr:`MacTx.stomp`) and dropped at the next hop (NTT's cut-through ring, docs/background.md "NTT ring";
    the stomped FCS of cut-through Ethernet switches).

    The input cannot wait, so the FIFO admits a frame at its first beat only if it has room for a
    whole ``max_frame`` frame; otherwise the frame is dropped whole (no beat of it leaves) and
    counted in ``overflow``. An admitted frame therefore always fits, and a frame is never cut.
    Latency: 2 cycles (the FIFO's buffered read) from a beat in to the same beat out.

    Parameters
    ----------
    max_frame : int
        Longest frame :class:`MacRx` passes, in bytes with FCS.
    depth : int or None
        FIFO depth in beats; default two ``max_frame`` frames plus 16 beats.

    Attributes
    ----------
    i : In(stream.Signature(rx_beat_layout(), always_ready=True))
        From :attr:`MacRx.o`.
    o : Out(FrameStream(64))
        Every admitted frame, ``bad`` set on the last beat of a bad one.
    overflow : Out(32)
        Frames dropped whole because the FIFO had no room for them (wrapping counter).
    level : Out(range(depth + 1))
        Beats in the FIFO (its write-side level): what a flow-control threshold watches.

    Raises
    ------
    ValueError
        If ``depth`` is smaller than one ``max_frame`` frame.
    """

    def __init__(self, max_frame: int = MAX_FRAME_BYTES, depth: int | None = None):
        self.max_frame = max_frame
        self.frame_beats, self.depth = _rx_fifo_depth(self, max_frame, depth, frames=2)
        super().__init__({
            "i": In(stream.Signature(rx_beat_layout(), always_ready=True)),
            "o": Out(FrameStream(64)),
            "overflow": Out(32),
            "level": Out(range(self.depth + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        blay = beat_layout(64)
        m.submodules.beats = beats = fifo.SyncFIFOBuffered(width=blay.size, depth=self.depth)
        beat = self.i.payload
        in_frame = Signal()
        admit = Signal()
        admit_now = Signal()
        m.d.comb += admit_now.eq(Mux(in_frame, admit, beats.w_level + self.frame_beats <= self.depth))
        m.d.comb += [
            beats.w_data.eq(Cat(beat.data, beat.keep, beat.last, beat.bad & beat.last)),  # beat_layout order
            beats.w_en.eq(self.i.valid & admit_now),
            self.level.eq(beats.w_level),
        ]
        with m.If(self.i.valid):
            with m.If(beat.last):
                m.d.sync += in_frame.eq(0)
                with m.If(~admit_now):
                    m.d.sync += self.overflow.eq(self.overflow + 1)
            with m.Else():
                m.d.sync += [in_frame.eq(1), admit.eq(admit_now)]
        m.d.comb += [
            self.o.valid.eq(beats.r_rdy),
            self.o.payload.eq(beats.r_data),
            beats.r_en.eq(self.o.ready),
        ]
        return m
