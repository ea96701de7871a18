"""10GBASE-R physical coding sublayer (IEEE 802.3 clause 49): 64b/66b, scrambler, block lock, BER.

The PCS sits between the MAC's XGMII and a transceiver (GTH) whose own gearbox is switched off, so
that this module also does the 66-bit ↔ word conversion. Transmit path (:class:`PCSTx`)::

    XGMII ─► Encoder ─► Scrambler ─► TxGearbox ─► 32/64-bit words to the GTH (bit 0 first)

Receive path (:class:`PCSRx`)::

    words from the GTH ─► RxGearbox ─┬─► Descrambler ─► Decoder ─► XGMII
                            ▲  slip  ├─► BlockLock ─► block_lock
                            └────────┤
                                     └─► BerMonitor ─► hi_ber

Everything here runs in one clock domain, the transceiver's word clock (10.3125 Gb/s divided by the
word width: 322.265625 MHz at 32 bit, 161.1328125 MHz at 64 bit). A 66-bit block arrives or
leaves in ``width / 66`` of the cycles, so the XGMII side is paced by stream handshakes: 32 of
every 33 cycles at 64 bit, 16 of every 33 at 32 bit. The crossing to a 156.25 MHz MAC clock is
not part of this module. Column in to column out through both halves with no line delay takes
10-11 cycles at 64 bit and 15-16 cycles at 32 bit (measured in simulation; the encoder and the
decoder each have a pipeline register more since they were cut to the logic-level budget, which
added 2 cycles at 64 bit and 3 at 32 bit).

XGMII
-----
Clause 46 transfers 32 bits and 4 control flags per clock edge; two transfers are combined here
into one 64-bit column (:data:`xgmii_layout`): lane ``k`` is ``data[8k:8k+8]`` with control flag
``ctrl[k]``, lane 0 being the first byte on the wire (the first transfer's lane 0).

Bit order
---------
A 66-bit block is a :data:`block_layout`: ``header`` (2 bits) then ``payload`` (64 bits); bit 0
of ``header`` is the first bit on the line, then bit 1, then payload bit 0 … 63 (49.2.4.3, "bit 0
transmitted first"). The clause writes the sync header in transmission order, "01" for a data
block and "10" for a control block; as a 2-bit integer with bit 0 first on the line these are
:data:`SYNC_DATA` = 0b10 and :data:`SYNC_CTRL` = 0b01. A block type byte, a data octet, a 7-bit
control code and a 4-bit O code are each sent least significant bit first.

Control characters (Table 49-1)
-------------------------------
=====================  ===========  ====================  ==================================
character              XGMII        10GBASE-R code        here
=====================  ===========  ====================  ==================================
idle /I/               0x07         0x00 (7 bit)          supported
LPI /LI/               0x06         0x06 (7 bit)          not supported (no EEE): invalid
start /S/              0xFB         block type            lane 0 or lane 4
terminate /T/          0xFD         block type            any lane
error /E/              0xFE         0x1E (7 bit)          supported
sequence ordered set   0x9C         O code 0x0            lane 0 or lane 4
signal ordered set     0x5C         O code 0xF            lane 0 or lane 4
reserved0…5            0x1C 0x3C    0x2D 0x33             supported (passed through)
                       0x7C 0xBC    0x4B 0x55
                       0xDC 0xF7    0x66 0x78
=====================  ===========  ====================  ==================================

Block formats (Figure 49-7)
---------------------------
Every format of the figure is implemented, in both directions. ``Dk`` is data octet of lane k,
``Ck`` the 7-bit control code of lane k, ``Ok`` a 4-bit O code, ``0`` zero bits (sent as zero;
the decoder ignores them). Lane pattern: ``D`` data, ``C`` a character with a 7-bit code, ``O``
an ordered-set character, ``S`` start, ``T`` terminate::

    type  lanes 0..7  payload fields after the type byte (bit 8 upwards)
    data  DDDDDDDD    sync header 01 (SYNC_DATA), payload = D0 D1 … D7
    0x1E  CCCCCCCC    C0 C1 C2 C3 C4 C5 C6 C7
    0x2D  CCCCODDD    C0 C1 C2 C3 O4 D5 D6 D7
    0x33  CCCCSDDD    C0 C1 C2 C3 0000 D5 D6 D7
    0x66  ODDDSDDD    D1 D2 D3 O0 0000 D5 D6 D7
    0x55  ODDDODDD    D1 D2 D3 O0 O4 D5 D6 D7
    0x78  SDDDDDDD    D1 D2 D3 D4 D5 D6 D7
    0x4B  ODDDCCCC    D1 D2 D3 O0 C4 C5 C6 C7
    0x87  TCCCCCCC    0000000 C1 C2 C3 C4 C5 C6 C7
    0x99  DTCCCCCC    D0 000000 C2 C3 C4 C5 C6 C7
    0xAA  DDTCCCCC    D0 D1 00000 C3 C4 C5 C6 C7
    0xB4  DDDTCCCC    D0 D1 D2 0000 C4 C5 C6 C7
    0xCC  DDDDTCCC    D0 D1 D2 D3 000 C5 C6 C7
    0xD2  DDDDDTCC    D0 D1 D2 D3 D4 00 C6 C7
    0xE1  DDDDDDTC    D0 D1 D2 D3 D4 D5 0 C7
    0xFF  DDDDDDDT    D0 D1 D2 D3 D4 D5 D6

The fields fall on fixed payload positions, which the gateware uses: the type byte at bits 0–7,
``Ck`` at ``8 + 7k``, ``O0`` at 32, ``O4`` at 36, and ``Dk`` at ``8k`` except in terminate blocks,
where ``Dk`` is at ``8 + 8k``.

Simplifications against clause 49
----------------------------------
* No EEE: LPI (0x06) is not a valid character, and the LPI states (TX_WAKE, RX_LI, …) of the
  transmit and receive state diagrams are absent.
* No PRBS31 or square-wave test patterns, no test-pattern checker, no clause 45 MDIO registers:
  the status counters are plain saturating 32-bit counters with a ``clear`` input.
* The 125 µs BER timer counts received blocks (:data:`BER_WINDOW_BLOCKS`), not time.
* The receiver treats a control block with an unknown 7-bit control code or O code as invalid
  (R_TYPE = E, the whole block becomes /E/).

Read from the clause as remembered, not checked against the text
------------------------------------------------------------------
These were written without the standard at hand; each is one line to change if it reads
differently:

* in TX_E and RX_E a start block (T_TYPE / R_TYPE = S) stays in the E state (error block out);
  a data block moves to TX_D / RX_D;
* the zero bits of Figure 49-7 are ignored by the decoder rather than checked;
* LBLOCK_T is taken as a 0x55 block with the local-fault sequence in both halves;
* the BER monitor is held in its initial state while ``block_lock`` is 0.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.params import reject, rejecting

__all__ = [
    "xgmii_layout", "block_layout", "SYNC_DATA", "SYNC_CTRL",
    "XGMII_IDLE", "XGMII_START", "XGMII_TERMINATE", "XGMII_ERROR", "XGMII_SEQUENCE", "XGMII_SIGNAL",
    "CONTROL_CODES", "ORDERED_SET_CODES", "BLOCK_FORMATS", "BER_WINDOW_BLOCKS",
    "IDLE_COLUMN", "EBLOCK_R", "LBLOCK_R", "EBLOCK_T_PAYLOAD", "LBLOCK_T_PAYLOAD",
    "check_gearbox_width",
    "Encoder", "Scrambler", "Descrambler", "Decoder", "BlockLock", "BerMonitor",
    "TxGearbox", "RxGearbox", "PCSTx", "PCSRx",
]

#: One 64-bit XGMII column (two 32-bit transfers): lane k is ``data[8k:8k+8]``, ``ctrl[k]`` its flag.
xgmii_layout = data.StructLayout({"data": 64, "ctrl": 8})
#: One 64b/66b block, bit 0 of ``header`` first on the line, then ``payload`` bit 0 … 63.
block_layout = data.StructLayout({"header": 2, "payload": 64})

#: Sync header of a data block ("01" in transmission order, 49.2.4.3).
SYNC_DATA = 0b10
#: Sync header of a control block ("10" in transmission order).
SYNC_CTRL = 0b01

XGMII_IDLE = 0x07
XGMII_START = 0xFB
XGMII_TERMINATE = 0xFD
XGMII_ERROR = 0xFE
XGMII_SEQUENCE = 0x9C
XGMII_SIGNAL = 0x5C

#: XGMII control characters carried as 7-bit codes (Table 49-1), without LPI (no EEE).
CONTROL_CODES = {
    XGMII_IDLE: 0x00, XGMII_ERROR: 0x1E,
    0x1C: 0x2D, 0x3C: 0x33, 0x7C: 0x4B, 0xBC: 0x55, 0xDC: 0x66, 0xF7: 0x78,
}
#: XGMII ordered-set characters carried as 4-bit O codes (Table 49-1).
ORDERED_SET_CODES = {XGMII_SEQUENCE: 0x0, XGMII_SIGNAL: 0xF}

#: Control block formats of Figure 49-7: block type → lane pattern (lane 0 first).
BLOCK_FORMATS = {
    0x1E: "CCCCCCCC", 0x2D: "CCCCODDD", 0x33: "CCCCSDDD", 0x66: "ODDDSDDD",
    0x55: "ODDDODDD", 0x78: "SDDDDDDD", 0x4B: "ODDDCCCC",
    0x87: "TCCCCCCC", 0x99: "DTCCCCCC", 0xAA: "DDTCCCCC", 0xB4: "DDDTCCCC",
    0xCC: "DDDDTCCC", 0xD2: "DDDDDTCC", 0xE1: "DDDDDDTC", 0xFF: "DDDDDDDT",
}

#: 125 µs in blocks: 10.3125 Gb/s / 66 bit = 156.25 M blocks/s, × 125 µs = 19531.25 (49.2.14).
BER_WINDOW_BLOCKS = 19531

#: An XGMII column of eight idles (what the MAC sends between frames).
IDLE_COLUMN = {"data": 0x0707_0707_0707_0707, "ctrl": 0xFF}
#: EBLOCK_R (49.2.13.2.1): eight /E/ characters.
EBLOCK_R = {"data": 0xFEFE_FEFE_FEFE_FEFE, "ctrl": 0xFF}
#: LBLOCK_R: two local-fault sequence ordered sets, |Seq| 0x00 0x00 0x01| in lanes 0-3 and 4-7.
LBLOCK_R = {"data": 0x0100_009C_0100_009C, "ctrl": 0x11}


def _ctrl_payload(fields):
    """A 64-bit payload value from ``(bit position, width, value)`` fields (Python ints)."""
    value = 0
    for pos, width, v in fields:
        value |= (v & ((1 << width) - 1)) << pos
    return value


#: EBLOCK_T payload: control block 0x1E with eight /E/ codes (0x1E).
EBLOCK_T_PAYLOAD = _ctrl_payload([(0, 8, 0x1E)] + [(8 + 7 * k, 7, 0x1E) for k in range(8)])
#: LBLOCK_T payload: block 0x55 carrying the local-fault ordered set in both halves.
LBLOCK_T_PAYLOAD = _ctrl_payload([(0, 8, 0x55), (24, 8, 0x01), (56, 8, 0x01)])


class _Kind(enum.Enum, shape=3):
    """Block classification of 49.2.13.2.3 (T_TYPE on transmit, R_TYPE on receive)."""
    C = 0   # control only: 0x1E, 0x2D, 0x4B, 0x55
    S = 1   # start: 0x33, 0x66, 0x78
    T = 2   # terminate: 0x87 … 0xFF
    D = 3   # data
    E = 4   # anything else


def _format_kind(pattern):
    return _Kind.T if "T" in pattern else _Kind.S if "S" in pattern else _Kind.C


def _field_pos(pattern, lane):
    """Payload bit position of lane ``lane``'s field in a control block of ``pattern``."""
    kind = pattern[lane]
    if kind == "C":
        return 8 + 7 * lane
    if kind == "O":
        return 32 if lane == 0 else 36
    if kind == "D":
        return 8 + 8 * lane if "T" in pattern else 8 * lane
    return None  # S and T have no field of their own: the block type says where they are


def _place(fields):
    """Concatenate a 64-bit payload from ``(bit position, value)`` fields; gaps are zero bits."""
    parts, pos = [], 0
    for start, value in sorted(fields, key=lambda f: f[0]):
        assert start >= pos
        if start > pos:
            parts.append(Const(0, start - pos))
        parts.append(value)
        pos = start + len(value)
    assert pos <= 64
    if pos < 64:
        parts.append(Const(0, 64 - pos))
    return Cat(*parts)


def check_gearbox_width(width):
    """Validate a transceiver word width in bits; returns it.

    Raises
    ------
    TypeError
        If ``width`` is not an int.
    ValueError
        If ``width`` is not 32 or 64 (the GTH's 4-byte and 8-byte internal data widths; a
        width of at most 66 also keeps the gearboxes at one block per clock).
    """
    if not isinstance(width, int) or isinstance(width, bool):
        raise TypeError(f"width must be an int number of bits, not {width!r}")
    if width not in (32, 64):
        raise ValueError(f"width must be 32 or 64 bits, not {width}")
    return width


# ------------------------------------------------------------------------------------------------
# 64b/66b encoder (49.2.4) and transmit state diagram (49.2.13.3)
# ------------------------------------------------------------------------------------------------

class _TxState(enum.Enum, shape=3):
    INIT = 0
    C = 1
    D = 2
    T = 3
    E = 4


def _next_state(m, state, kind, nxt, t_ok=1):
    """Drive ``nxt`` from ``state`` and the block ``kind`` by the transmit/receive state diagrams
    (figures 49-16 and 49-17), which share their transitions: from D, data stays in D and a
    terminate goes to T; from E, a control block, data or a terminate leave it; from INIT, C and
    T, a control block goes to C and a start to D; anything else goes to E. ``t_ok`` is the
    receive side's look-ahead: a terminate goes to T only if the next block is a start or a
    control block (always 1 on the transmit side)."""
    term = (kind == _Kind.T) & t_ok
    with m.Switch(state):
        with m.Case(_TxState.D, _TxState.E):
            with m.If((state == _TxState.E) & (kind == _Kind.C)):
                m.d.comb += nxt.eq(_TxState.C)
            with m.Elif(kind == _Kind.D):
                m.d.comb += nxt.eq(_TxState.D)
            with m.Elif(term):
                m.d.comb += nxt.eq(_TxState.T)
            with m.Else():
                m.d.comb += nxt.eq(_TxState.E)
        with m.Default():  # INIT, C, T
            with m.Switch(kind):
                with m.Case(_Kind.C):
                    m.d.comb += nxt.eq(_TxState.C)
                with m.Case(_Kind.S):
                    m.d.comb += nxt.eq(_TxState.D)
                with m.Default():
                    m.d.comb += nxt.eq(_TxState.E)


class Encoder(wiring.Component):
    """64b/66b encoder with the transmit state diagram, one XGMII column to one block.

    Every column that matches a format of Figure 49-7 (see the module docstring) is encoded;
    T_TYPE (49.2.13.2.3) classifies it as C (0x1E, 0x2D, 0x4B, 0x55), S (0x33, 0x66, 0x78),
    T (0x87 … 0xFF), D (all data) or E (no format matches: a control character in a data
    position, /S/ outside lane 0/4, an ordered set outside lane 0/4, LPI, an unknown control
    character, …). The transmit state diagram then decides between the encoded block and
    EBLOCK_T (eight /E/ codes in a 0x1E block):

    ========  ===============================================  =============================
    state     next state on T_TYPE of the new column           block sent in the new state
    ========  ===============================================  =============================
    INIT, C,  C → C, S → D, D/T/E → E                          ENCODE(column) in C, D, T;
    T                                                          EBLOCK_T in E
    D         D → D, T → T, C/S/E → E
    E         C → C, D → D, T → T, S/E → E
    ========  ===============================================  =============================

    So a frame that does not end with /T/, a /S/ inside a frame, data outside a frame and every
    unencodable column become error blocks. TX_INIT is the reset state; its LBLOCK_T (block 0x55
    with two local-fault ordered sets) is the block in the output register after reset.

    Two pipeline registers: the first holds the column's format (the lane compares and the
    format match) with its bytes and control codes, the second the block that ENCODE's
    multiplexers and the state diagram made of it, so that neither half is deep (yosys estimate:
    ≤ 9 LUT levels at 156.25 MHz on xc7, docs/architecture.md "Timing budgets"). A column taken
    in one cycle is ``o.payload`` two cycles later when the
    output is never stalled. Both stages advance when the stage after them is empty or being
    emptied (``i.ready = ~stage1_valid | ~o.valid | o.ready``). Both are full after reset,
    each holding LBLOCK_T (block 0x55 with two local-fault ordered sets, TX_INIT's block), so a
    gearbox behind the encoder has a block from the first cycle, and the first column taken
    comes out after two LBLOCK_T blocks.

    Attributes
    ----------
    i : In(stream.Signature(xgmii_layout))
        XGMII columns.
    o : Out(stream.Signature(block_layout))
        Unscrambled 66-bit blocks.
    """

    i: In(stream.Signature(xgmii_layout))
    o: Out(stream.Signature(block_layout))

    def elaborate(self, platform):
        m = Module()
        x = self.i.payload

        # Per-lane character classes.
        byte = [x.data[8 * k:8 * k + 8] for k in range(8)]
        ctrl = [x.ctrl[k] for k in range(8)]
        code = [Signal(7, name=f"code{k}") for k in range(8)]
        is_c = [Signal(name=f"is_c{k}") for k in range(8)]
        for k in range(8):
            with m.Switch(byte[k]):
                for char, c7 in CONTROL_CODES.items():
                    with m.Case(char):
                        m.d.comb += [code[k].eq(c7), is_c[k].eq(ctrl[k])]
        is_lane = {
            "D": [~ctrl[k] for k in range(8)],
            "C": is_c,
            "S": [ctrl[k] & (byte[k] == XGMII_START) for k in range(8)],
            "T": [ctrl[k] & (byte[k] == XGMII_TERMINATE) for k in range(8)],
            "O": [ctrl[k] & ((byte[k] == XGMII_SEQUENCE) | (byte[k] == XGMII_SIGNAL)) for k in range(8)],
        }
        formats = [("DDDDDDDD", None)] + [(pattern, btype) for btype, pattern in BLOCK_FORMATS.items()]

        def matches(pattern):
            cond = Const(1)
            for k, kind in enumerate(pattern):
                cond = cond & is_lane[kind][k]
            return cond

        # Stage 1: which format the column has (the lane classes are disjoint and the patterns
        # distinct, so at most one), with the column's bytes, 7-bit control codes and ordered-set
        # kinds. After reset it holds the LBLOCK_R column, which encodes to LBLOCK_T (block 0x55,
        # class C) and which the state diagram passes in TX_INIT.
        s1_valid = Signal(init=1)
        s1_hits = Signal(len(formats), init=1 << [btype for _, btype in formats].index(0x55))
        s1_data = Signal(64, init=LBLOCK_R["data"])
        s1_code = Signal(7 * 8)
        s1_osig = Signal(8)  # lane k's ordered set is a signal (O code 0xF), not a sequence
        hits_now = Cat(*(matches(pattern) for pattern, _ in formats))
        osig_now = Cat(*(byte[k] == XGMII_SIGNAL for k in range(8)))

        # Stage 2: ENCODE and T_TYPE from the registered format, as an AND-OR of the formats (a
        # priority chain over 16 formats would be deeper), EBLOCK_T if none matched.
        r_byte = [s1_data[8 * k:8 * k + 8] for k in range(8)]
        r_code = [s1_code[7 * k:7 * k + 7] for k in range(8)]
        r_ocode = [s1_osig[k].replicate(4) for k in range(8)]  # 0xF signal, 0x0 sequence
        assert ORDERED_SET_CODES == {XGMII_SEQUENCE: 0x0, XGMII_SIGNAL: 0xF}
        field = {"D": r_byte, "C": r_code, "O": r_ocode}
        payload = Const(0, 64)
        kind_bits = {k: Const(0) for k in (_Kind.C, _Kind.S, _Kind.T, _Kind.D)}
        for n, (pattern, btype) in enumerate(formats):
            hit = s1_hits[n]
            if btype is None:
                value = s1_data
                kind_bits[_Kind.D] = kind_bits[_Kind.D] | hit
            else:
                fields = [(0, Const(btype, 8))]
                fields += [(_field_pos(pattern, k), field[c][k]) for k, c in enumerate(pattern) if c in field]
                value = _place(fields)
                kind_bits[_format_kind(pattern)] = kind_bits[_format_kind(pattern)] | hit
            payload = payload | (value & hit.replicate(64))
        none = ~s1_hits.any()
        encoded = Signal(block_layout)
        s1_kind = Signal(_Kind)
        m.d.comb += [
            encoded.header.eq(Mux(s1_hits[0], SYNC_DATA, SYNC_CTRL)),
            encoded.payload.eq(payload),
            # _Kind values: C 0, S 1, T 2, D 3, E 4.
            s1_kind.eq(Cat(kind_bits[_Kind.S] | kind_bits[_Kind.D], kind_bits[_Kind.T] | kind_bits[_Kind.D], none)),
        ]

        # Stage 2: transmit state diagram on stage 1's class.
        state = Signal(_TxState, init=_TxState.INIT)
        nxt = Signal(_TxState)
        _next_state(m, state, s1_kind, nxt)

        o_valid = Signal(init=1)
        o_block = Signal(block_layout, init={"header": SYNC_CTRL, "payload": LBLOCK_T_PAYLOAD})
        adv2 = Signal()
        adv1 = Signal()
        m.d.comb += [
            adv2.eq(~o_valid | self.o.ready),
            adv1.eq(~s1_valid | adv2),
            self.o.valid.eq(o_valid),
            self.o.payload.eq(o_block),
            self.i.ready.eq(adv1),
        ]
        with m.If(adv1):
            m.d.sync += s1_valid.eq(self.i.valid)
            with m.If(self.i.valid):
                m.d.sync += [s1_hits.eq(hits_now), s1_data.eq(x.data), s1_code.eq(Cat(*code)), s1_osig.eq(osig_now)]
        with m.If(adv2):
            m.d.sync += o_valid.eq(s1_valid)
            with m.If(s1_valid):
                m.d.sync += state.eq(nxt)
                with m.If(nxt == _TxState.E):
                    m.d.sync += [o_block.header.eq(SYNC_CTRL), o_block.payload.eq(EBLOCK_T_PAYLOAD)]
                with m.Else():
                    m.d.sync += o_block.eq(encoded)
        return m


# ------------------------------------------------------------------------------------------------
# Scrambler and descrambler (49.2.6, 49.2.10)
# ------------------------------------------------------------------------------------------------

def _scramble(state, bits, *, descramble):
    """One block of the self-synchronising scrambler ``1 + x^39 + x^58``, unrolled over 64 bits.

    ``state[i]`` is the scrambled line bit ``58 - i`` bits before this block (``state[57]`` the
    latest). Bit ``k`` of the block is ``bits[k] ^ line[k-39] ^ line[k-58]`` where ``line`` is the
    scrambled stream: the output when scrambling, the input when descrambling.

    Returns
    -------
    (Value, Value)
        The 64 transformed bits and the 58-bit state after the block (its last 58 line bits).
    """
    out = []
    line = [bits[k] for k in range(64)] if descramble else out

    def tap(k):  # scrambled line bit at block position k (negative: from the state)
        return state[58 + k] if k < 0 else line[k]

    for k in range(64):
        out.append(bits[k] ^ tap(k - 39) ^ tap(k - 58))
    # 64 > 58, so the new state is made of this block's line bits only.
    return Cat(*out), Cat(*line[64 - 58:])


class Scrambler(wiring.Component):
    """Self-synchronising scrambler ``G(x) = 1 + x^39 + x^58`` over the 64 payload bits (49.2.6).

    Payload bit 0 is scrambled first (it is sent first); the sync header passes unscrambled.
    One pipeline register, ``i.ready = ~o.valid | o.ready``; the 58-bit state starts at zero.

    Attributes
    ----------
    i : In(stream.Signature(block_layout))
    o : Out(stream.Signature(block_layout))
    """

    i: In(stream.Signature(block_layout))
    o: Out(stream.Signature(block_layout))

    def elaborate(self, platform):
        m = Module()
        state = Signal(58)
        scrambled, new_state = _scramble(state, self.i.payload.payload, descramble=False)
        o_valid = Signal()
        o_block = Signal(block_layout)
        m.d.comb += [
            self.o.valid.eq(o_valid),
            self.o.payload.eq(o_block),
            self.i.ready.eq(~o_valid | self.o.ready),
        ]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [
                o_valid.eq(1),
                o_block.header.eq(self.i.payload.header),
                o_block.payload.eq(scrambled),
                state.eq(new_state),
            ]
        with m.Elif(self.o.ready):
            m.d.sync += o_valid.eq(0)
        return m


class Descrambler(wiring.Component):
    """Self-synchronising descrambler ``1 + x^39 + x^58`` (49.2.10), inverse of :class:`Scrambler`.

    Its state is the last 58 received payload bits, so from any starting state every output bit
    is right once 58 payload bits have passed: the last 6 bits of the first block, and all later
    blocks. The sync header passes unchanged.

    The receive path cannot be stalled, so both ports are ``always_ready``: one block in per
    cycle with ``i.valid``, out one cycle later with ``o.valid``.

    Attributes
    ----------
    i : In(stream.Signature(block_layout, always_ready=True))
    o : Out(stream.Signature(block_layout, always_ready=True))
    """

    i: In(stream.Signature(block_layout, always_ready=True))
    o: Out(stream.Signature(block_layout, always_ready=True))

    def elaborate(self, platform):
        m = Module()
        state = Signal(58)
        plain, new_state = _scramble(state, self.i.payload.payload, descramble=True)
        m.d.sync += self.o.valid.eq(self.i.valid)
        with m.If(self.i.valid):
            m.d.sync += [
                self.o.payload.header.eq(self.i.payload.header),
                self.o.payload.payload.eq(plain),
                state.eq(new_state),
            ]
        return m


# ------------------------------------------------------------------------------------------------
# 64b/66b decoder (49.2.11) and receive state diagram (49.2.13.3)
# ------------------------------------------------------------------------------------------------

# The receive state diagram has the same five states as the transmit one.
_RxState = _TxState


class Decoder(wiring.Component):
    """64b/66b decoder with the receive state diagram, one block to one XGMII column.

    R_TYPE (49.2.13.2.3) classifies a block: D for sync header :data:`SYNC_DATA`; for
    :data:`SYNC_CTRL`, C / S / T by block type (as on transmit) if every 7-bit control code is
    one of :data:`CONTROL_CODES` and every O code one of :data:`ORDERED_SET_CODES`; E for an
    invalid sync header (00 or 11), an unknown block type or an unknown code. The receive state
    diagram needs R_TYPE_NEXT, the class of the following block, so a block is decided when its
    successor arrives:

    ========  ======================================================  ==========================
    state     next state on R_TYPE (and R_TYPE_NEXT) of the block     column sent in new state
    ========  ======================================================  ==========================
    INIT, C,  C → C, S → D, D/T/E → E                                 DECODE(block) in C, D, T;
    T                                                                 EBLOCK_R in E
    D         D → D, T with next S or C → T, otherwise → E
    E         C → C, D → D, T with next S or C → T, otherwise → E
    ========  ======================================================  ==========================

    While ``link_ok`` is 0 (no block lock, or hi_ber) the diagram is held in RX_INIT and every
    column is LBLOCK_R, two local-fault ordered sets (49.2.13.3), which tells the reconciliation
    sublayer the link is down.

    Latency: the column of a block leaves with ``o.valid`` two cycles after the ``i.valid`` of
    the *next* block: one register holds R_TYPE and DECODE of the block just in, so that the
    state diagram works from registers (yosys estimate ≤ 9 LUT levels at 156.25 MHz on xc7,
    docs/architecture.md "Timing budgets"). ``block_error`` is 1 with ``o.valid`` when the column is EBLOCK_R because
    the diagram is in RX_E (the clause's errored-block count).

    Attributes
    ----------
    i : In(stream.Signature(block_layout, always_ready=True))
        Descrambled blocks.
    o : Out(stream.Signature(xgmii_layout, always_ready=True))
        XGMII columns.
    link_ok : In(1)
        ``block_lock & ~hi_ber``.
    block_error : Out(1)
    """

    i: In(stream.Signature(block_layout, always_ready=True))
    o: Out(stream.Signature(xgmii_layout, always_ready=True))
    link_ok: In(1)
    block_error: Out(1)

    #: The formats a block can have: a data block, then the control block types of Figure 49-7.
    _FORMATS = [("DDDDDDDD", None)] + [(pattern, btype) for btype, pattern in BLOCK_FORMATS.items()]

    def elaborate(self, platform):
        m = Module()
        fmt, chars = self._classify(m, self.i.payload)

        # Stage 1: the format (one-hot) and the decoded control characters of the block that
        # arrived in the previous cycle, so that R_TYPE, the state diagram and DECODE's lane
        # multiplexers start from registers.
        new_valid = Signal()
        new_fmt = Signal(len(fmt))
        new_p = Signal(64)
        new_chars = Signal(len(chars))
        link_ok = Signal()  # delayed with the block, so the column decided is the same
        m.d.sync += [new_valid.eq(self.i.valid), link_ok.eq(self.link_ok)]
        with m.If(self.i.valid):
            m.d.sync += [new_fmt.eq(fmt), new_p.eq(self.i.payload.payload), new_chars.eq(chars)]
        new_kind = self._r_type(m, new_fmt)
        column = self._decode(m, new_fmt, new_p, new_chars)

        cur_valid = Signal()
        cur_kind = Signal(_Kind)
        cur_column = Signal(xgmii_layout)
        with m.If(new_valid):
            m.d.sync += [cur_valid.eq(1), cur_kind.eq(new_kind), cur_column.eq(column)]

        # Receive state diagram: cur_kind is R_TYPE, new_kind (the block after it) R_TYPE_NEXT.
        state = Signal(_RxState, init=_RxState.INIT)
        nxt = Signal(_RxState)
        t_ok = (new_kind == _Kind.S) | (new_kind == _Kind.C)
        _next_state(m, state, cur_kind, nxt, t_ok)

        step = new_valid & cur_valid
        m.d.sync += [self.o.valid.eq(step), self.block_error.eq(0)]
        with m.If(step):
            with m.If(~link_ok):
                m.d.sync += [state.eq(_RxState.INIT), self.o.payload.eq(xgmii_layout.const(LBLOCK_R))]
            with m.Else():
                m.d.sync += state.eq(nxt)
                with m.If(nxt == _RxState.E):
                    m.d.sync += [self.o.payload.eq(xgmii_layout.const(EBLOCK_R)), self.block_error.eq(1)]
                with m.Else():
                    m.d.sync += self.o.payload.eq(cur_column)
        return m

    @classmethod
    def _classify(cls, m, block):
        """The format of ``block`` one-hot (bit ``n`` for ``_FORMATS[n]``; none for an invalid
        header or block type, or an unknown control code or O code in it), and its decoded
        characters: the 8-bit XGMII character of each lane's 7-bit control code (lanes 0-7,
        8 bits each), then of the O codes at payload bits 32 and 36. All combinational;
        :meth:`_r_type` and :meth:`_decode` take them from there."""
        p = block.payload
        ctl_char = [Signal(8, name=f"ctl_char{k}") for k in range(8)]
        ctl_ok = [Signal(name=f"ctl_ok{k}") for k in range(8)]
        for k in range(8):
            with m.Switch(p[8 + 7 * k:15 + 7 * k]):
                for char, c7 in CONTROL_CODES.items():
                    with m.Case(c7):
                        m.d.comb += [ctl_char[k].eq(char), ctl_ok[k].eq(1)]
        os_char, os_ok = {}, {}
        for k, pos in ((0, 32), (4, 36)):
            os_char[k] = Signal(8, name=f"os_char{k}")
            os_ok[k] = Signal(name=f"os_ok{k}")
            with m.Switch(p[pos:pos + 4]):
                for char, o4 in ORDERED_SET_CODES.items():
                    with m.Case(o4):
                        m.d.comb += [os_char[k].eq(char), os_ok[k].eq(1)]

        is_ctrl = block.header == SYNC_CTRL
        hits = [block.header == SYNC_DATA]
        for pattern, btype in cls._FORMATS[1:]:
            ok = is_ctrl & (p[:8] == btype)
            for k, c in enumerate(pattern):
                if c == "C":
                    ok = ok & ctl_ok[k]
                elif c == "O":
                    ok = ok & os_ok[k]
            hits.append(ok)
        return Cat(*hits), Cat(*ctl_char, os_char[0], os_char[4])

    @classmethod
    def _r_type(cls, m, fmt):
        """R_TYPE from :meth:`_classify`'s format: the class of the format that hit, E if none."""
        kind_bits = {k: Const(0) for k in (_Kind.C, _Kind.S, _Kind.T, _Kind.D)}
        for n, (pattern, btype) in enumerate(cls._FORMATS):
            fk = _Kind.D if btype is None else _format_kind(pattern)
            kind_bits[fk] = kind_bits[fk] | fmt[n]
        kind = Signal(_Kind)
        # _Kind values: C 0, S 1, T 2, D 3, E 4.
        m.d.comb += kind.eq(Cat(kind_bits[_Kind.S] | kind_bits[_Kind.D], kind_bits[_Kind.T] | kind_bits[_Kind.D],
                                ~fmt.any()))
        return kind

    @classmethod
    def _decode(cls, m, fmt, p, chars):
        """DECODE: the column of a block from :meth:`_classify`'s format and characters and the
        block's payload ``p``, as an AND-OR of the sources of each lane (meaningless for E)."""
        ctl_char = [chars[8 * k:8 * k + 8] for k in range(8)]
        os_char = {0: chars[64:72], 4: chars[72:80]}
        lanes, flags = [], []
        for k in range(8):
            sel, src = {}, {}
            flag = Const(0)
            for n, (pattern, btype) in enumerate(cls._FORMATS):
                c = pattern[k]
                if c == "D":
                    pos = k * 8 if btype is None else _field_pos(pattern, k)
                    key, value = ("D", pos), p[pos:pos + 8]
                elif c == "C":
                    key, value = ("C",), ctl_char[k]
                elif c == "O":
                    key, value = ("O",), os_char[k]
                else:
                    key, value = (c,), Const(XGMII_START if c == "S" else XGMII_TERMINATE, 8)
                if c != "D":
                    flag = flag | fmt[n]
                sel[key] = sel.get(key, Const(0)) | fmt[n]
                src[key] = value
            lane = Const(0, 8)
            for key, value in src.items():
                lane = lane | (value & sel[key].replicate(8))
            lanes.append(lane)
            flags.append(flag)
        column = Signal(xgmii_layout)
        m.d.comb += [column.data.eq(Cat(*lanes)), column.ctrl.eq(Cat(*flags))]
        return column


# ------------------------------------------------------------------------------------------------
# Block lock (49.2.9, Figure 49-14) and BER monitor (49.2.14, Figure 49-15)
# ------------------------------------------------------------------------------------------------

class BlockLock(wiring.Component):
    """Block synchronisation: finds the 66-bit boundary by testing sync headers (Figure 49-14).

    A sync header is valid if it is 01 or 10. Implemented as the lock state diagram with its
    two counters, one header tested per ``valid``:

    * not locked: the first invalid header asserts ``slip`` (for that cycle) and restarts the
      count; 64 valid headers in a row set ``block_lock`` (LOCK_INIT → RESET_CNT → TEST_SH →
      VALID_SH … → 64_GOOD);
    * locked: headers are counted in windows of 64; the 16th invalid header in a window clears
      ``block_lock`` and asserts ``slip`` (INVALID_SH → SLIP); a window with fewer ends
      (RESET_CNT), with or without invalid headers, and lock is kept.

    The slip takes effect before the next header is tested (:class:`RxGearbox` applies it at
    once, so ``slip_done`` is immediate). ``block_lock`` is registered.

    Attributes
    ----------
    header : In(2)
        Sync header of the block straight out of the gearbox.
    valid : In(1)
        ``header`` is a new block's.
    slip : Out(1)
        Shift the block boundary by one bit (combinational, with ``valid``).
    block_lock : Out(1)
    """

    header: In(2)
    valid: In(1)
    slip: Out(1)
    block_lock: Out(1)

    def elaborate(self, platform):
        m = Module()
        sh_cnt = Signal(range(64))
        sh_invalid_cnt = Signal(range(16))
        h = self.header
        sh_valid = h[0] ^ h[1]
        m.d.comb += self.slip.eq(self.valid & ~sh_valid & (~self.block_lock | (sh_invalid_cnt == 15)))
        with m.If(self.valid):
            with m.If(self.slip):
                m.d.sync += [self.block_lock.eq(0), sh_cnt.eq(0), sh_invalid_cnt.eq(0)]
            with m.Elif(sh_cnt == 63):
                # The 64th header of the window: unlocked, every header so far was valid.
                with m.If(sh_valid & (sh_invalid_cnt == 0)):
                    m.d.sync += self.block_lock.eq(1)
                m.d.sync += [sh_cnt.eq(0), sh_invalid_cnt.eq(0)]
            with m.Else():
                m.d.sync += [sh_cnt.eq(sh_cnt + 1), sh_invalid_cnt.eq(sh_invalid_cnt + ~sh_valid)]
        return m


class BerMonitor(wiring.Component):
    """High bit-error-ratio detector (49.2.14, Figure 49-15).

    ``hi_ber`` is set as soon as 16 invalid sync headers have been counted in the current
    window of ``window`` blocks (the clause's 125 µs timer; :data:`BER_WINDOW_BLOCKS` at
    10.3125 Gb/s), and cleared at the end of the first window with fewer than 16 (HI_BER →
    START_TIMER … → GOOD_BER). So once set, it stays for the rest of that window and the whole
    next one at least. The monitor is held in BER_MT_INIT (``hi_ber`` 0, counters cleared)
    while ``block_lock`` is 0. The timer counts blocks (``valid``), not time.

    Parameters
    ----------
    window : int
        Blocks per BER window, at least 16; tests shorten it.

    Attributes
    ----------
    header : In(2)
        Sync header of the block straight out of the gearbox.
    valid : In(1)
        ``header`` is a new block's.
    block_lock : In(1)
    hi_ber : Out(1)
    """

    def __init__(self, window=BER_WINDOW_BLOCKS):
        if not isinstance(window, int) or isinstance(window, bool):
            reject(self, TypeError(f"window must be an int number of blocks, not {window!r}"))
        if window < 16:
            reject(self, ValueError(f"window must be at least 16 blocks, not {window}"))
        self.window = window
        super().__init__({
            "header": In(2),
            "valid": In(1),
            "block_lock": In(1),
            "hi_ber": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        ber_cnt = Signal(range(17))
        timer = Signal(range(self.window))
        h = self.header
        bad = ~(h[0] ^ h[1])
        cnt_next = Mux(bad & (ber_cnt < 16), ber_cnt + 1, ber_cnt)
        with m.If(~self.block_lock):
            m.d.sync += [self.hi_ber.eq(0), ber_cnt.eq(0), timer.eq(0)]
        with m.Elif(self.valid):
            with m.If(timer == self.window - 1):
                m.d.sync += [self.hi_ber.eq(cnt_next == 16), ber_cnt.eq(0), timer.eq(0)]
            with m.Else():
                m.d.sync += [ber_cnt.eq(cnt_next), timer.eq(timer + 1)]
                with m.If(cnt_next == 16):
                    m.d.sync += self.hi_ber.eq(1)
        return m


# ------------------------------------------------------------------------------------------------
# Gearboxes (66-bit blocks ↔ transceiver words)
# ------------------------------------------------------------------------------------------------

class TxGearbox(wiring.Component):
    """66-bit blocks to ``width``-bit words, a word every cycle, bit 0 of each word first.

    The bit stream is the blocks' bits back to back (:data:`block_layout` order). A block is
    taken (``i.ready``) in the cycles where fewer than ``width`` bits are left over: 32 of every
    33 cycles at 64 bit, 16 of 33 at 32 bit. The first block after reset is taken in the first
    cycle, and starts at bit 0 of the first word. ``data`` is registered.

    If ``i.valid`` is 0 when a block is due, the line cannot wait: the gearbox sends a control
    sync header with an all-zero payload in its place. :class:`PCSTx` never lets that happen
    after its first cycle.

    Parameters
    ----------
    width : int
        Word width, 32 or 64 (:func:`check_gearbox_width`).

    Attributes
    ----------
    i : In(stream.Signature(block_layout))
    data : Out(width)
        The word for the transceiver's TXDATA (gearbox off), bit 0 transmitted first.
    """

    def __init__(self, width=64):
        with rejecting(self):
            self.width = check_gearbox_width(width)
        super().__init__({"i": In(stream.Signature(block_layout)), "data": Out(width)})

    def elaborate(self, platform):
        m = Module()
        w = self.width
        buf = Signal(66)            # bits left over from the last block; bits >= cnt are zero
        cnt = Signal(range(66))
        due = cnt < w
        block = Mux(self.i.valid, self.i.payload.as_value(), Const(SYNC_CTRL, 66))
        merged = Signal(w + 66)
        m.d.comb += [
            self.i.ready.eq(due),
            merged.eq(buf | Mux(due, block << cnt, 0)),
        ]
        m.d.sync += [
            self.data.eq(merged[:w]),
            buf.eq(merged[w:]),
            cnt.eq(Mux(due, cnt + 66 - w, cnt - w)),
        ]
        return m


class RxGearbox(wiring.Component):
    """``width``-bit words (a word every cycle, bit 0 first) to 66-bit blocks, with bit slip.

    Bits are collected and cut into 66-bit blocks; where the cut falls is arbitrary until
    :class:`BlockLock` moves it: ``slip`` (sampled at the clock edge) drops the oldest
    collected bit, which moves every following block boundary one bit later in the stream. The
    block cut at the same edge already reflects the slip. ``o.valid`` is 1 for one cycle per
    block (``width``/66 of the cycles on average); ``o`` is registered.

    Parameters
    ----------
    width : int
        Word width, 32 or 64 (:func:`check_gearbox_width`).

    Attributes
    ----------
    data : In(width)
        The transceiver's RXDATA (gearbox off).
    slip : In(1)
    o : Out(stream.Signature(block_layout, always_ready=True))
    """

    def __init__(self, width=64):
        with rejecting(self):
            self.width = check_gearbox_width(width)
        super().__init__({
            "data": In(width),
            "slip": In(1),
            "o": Out(stream.Signature(block_layout, always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        w = self.width
        buf = Signal(66)            # collected bits not yet in a block; bits >= cnt are zero
        cnt = Signal(range(66))
        merged = Signal(66 + w)
        m.d.comb += merged.eq(buf | (self.data << cnt))

        # Both outcomes of the slip are worked out from the registers alone, and ``slip``, which
        # comes late (BlockLock's counters), only picks one at the end.
        def cut(drop):
            shifted = merged[drop:]
            total = cnt + w - drop
            emit = total >= 66
            m.d.sync += self.o.valid.eq(emit)
            with m.If(emit):
                m.d.sync += [
                    self.o.payload.eq(shifted[:66]),
                    buf.eq(shifted[66:]),
                    cnt.eq(total - 66),
                ]
            with m.Else():
                m.d.sync += [buf.eq(shifted[:66]), cnt.eq(total)]

        with m.If(self.slip):
            cut(1)
        with m.Else():
            cut(0)
        return m


# ------------------------------------------------------------------------------------------------
# The two halves of the PCS
# ------------------------------------------------------------------------------------------------

class PCSTx(wiring.Component):
    """10GBASE-R transmit: XGMII columns in, scrambled 64b/66b words out for the transceiver.

    :class:`Encoder` → :class:`Scrambler` → :class:`TxGearbox`. The gearbox paces the input:
    ``xgmii.ready`` is 1 in ``width``/66 of the cycles (32 of 33 at 64 bit). A 10G MAC always
    has a column to send (idles between frames); if ``xgmii.valid`` is 0 when a column is taken,
    an idle column is encoded instead, which the transmit state diagram turns into an error
    block in the middle of a frame.

    A column goes through three pipeline registers (two in the encoder, one in the scrambler) and
    the gearbox's output register, waiting a cycle more when the gearbox skips one.

    Parameters
    ----------
    width : int
        Transceiver word width, 32 or 64.

    Attributes
    ----------
    xgmii : In(stream.Signature(xgmii_layout))
    tx_data : Out(width)
        TXDATA of a GTH with its internal gearbox off, bit 0 transmitted first.
    """

    def __init__(self, width=64):
        with rejecting(self):
            self.width = check_gearbox_width(width)
        super().__init__({"xgmii": In(stream.Signature(xgmii_layout)), "tx_data": Out(width)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.encoder = encoder = Encoder()
        m.submodules.scrambler = scrambler = Scrambler()
        m.submodules.gearbox = gearbox = TxGearbox(self.width)
        wiring.connect(m, encoder.o, scrambler.i)
        wiring.connect(m, scrambler.o, gearbox.i)
        idle = xgmii_layout.const(IDLE_COLUMN).as_value()
        m.d.comb += [
            encoder.i.valid.eq(1),
            encoder.i.payload.eq(Mux(self.xgmii.valid, self.xgmii.payload.as_value(), idle)),
            self.xgmii.ready.eq(encoder.i.ready),
            self.tx_data.eq(gearbox.data),
        ]
        return m


class PCSRx(wiring.Component):
    """10GBASE-R receive: transceiver words in, XGMII columns, lock and BER status out.

    :class:`RxGearbox` → :class:`Descrambler` → :class:`Decoder`, with :class:`BlockLock`
    steering the gearbox's bit slip and :class:`BerMonitor` watching the same sync headers.
    The words may start at any bit offset; block lock finds the boundary (on average about
    two blocks per wrong offset tried, then 64 good headers). Until ``block_lock`` is set,
    and while ``hi_ber`` is set, the columns are LBLOCK_R (local fault).

    ``xgmii.valid`` is 1 for one cycle per block (``width``/66 of the cycles); the receive path
    cannot be stalled. A block passes the gearbox, the descrambler and the decoder, which holds
    it until the next block has arrived (R_TYPE_NEXT) and one cycle more (its first register).

    Parameters
    ----------
    width : int
        Transceiver word width, 32 or 64.
    ber_window : int
        BER monitor window in blocks (:data:`BER_WINDOW_BLOCKS` = 125 µs).

    Attributes
    ----------
    rx_data : In(width)
        RXDATA of a GTH with its internal gearbox off, bit 0 received first.
    xgmii : Out(stream.Signature(xgmii_layout, always_ready=True))
    block_lock, hi_ber : Out(1)
    sh_errors : Out(32)
        Invalid sync headers seen while ``block_lock`` (saturating).
    block_errors : Out(32)
        Columns sent as EBLOCK_R by the receive state diagram (saturating; the clause's errored
        block count, without its clear-on-read management register).
    clear : In(1)
        Zero both counters.
    """

    def __init__(self, width=64, ber_window=BER_WINDOW_BLOCKS):
        with rejecting(self):
            self.width = check_gearbox_width(width)
        self.ber_window = ber_window
        super().__init__({
            "rx_data": In(width),
            "xgmii": Out(stream.Signature(xgmii_layout, always_ready=True)),
            "block_lock": Out(1),
            "hi_ber": Out(1),
            "sh_errors": Out(32),
            "block_errors": Out(32),
            "clear": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.gearbox = gearbox = RxGearbox(self.width)
        m.submodules.lock = lock = BlockLock()
        m.submodules.ber = ber = BerMonitor(self.ber_window)
        m.submodules.descrambler = descrambler = Descrambler()
        m.submodules.decoder = decoder = Decoder()
        wiring.connect(m, gearbox.o, descrambler.i)
        wiring.connect(m, descrambler.o, decoder.i)
        wiring.connect(m, decoder.o, wiring.flipped(self.xgmii))
        m.d.comb += [
            gearbox.data.eq(self.rx_data),
            lock.header.eq(gearbox.o.payload.header),
            lock.valid.eq(gearbox.o.valid),
            ber.header.eq(gearbox.o.payload.header),
            ber.valid.eq(gearbox.o.valid),
            gearbox.slip.eq(lock.slip),
            ber.block_lock.eq(lock.block_lock),
            decoder.link_ok.eq(lock.block_lock & ~ber.hi_ber),
            self.block_lock.eq(lock.block_lock),
            self.hi_ber.eq(ber.hi_ber),
        ]

        h = gearbox.o.payload.header
        sh_error = gearbox.o.valid & lock.block_lock & ~(h[0] ^ h[1])
        block_error = decoder.o.valid & decoder.block_error
        for counter, event in ((self.sh_errors, sh_error), (self.block_errors, block_error)):
            with m.If(self.clear):
                m.d.sync += counter.eq(0)
            with m.Elif(event & (counter != 0xFFFF_FFFF)):
                m.d.sync += counter.eq(counter + 1)
        return m
