"""Gateware of the INCEPTIONN-style gradient codec (docs/codec.md).

Three components work on the *payload* of one frame (no wirereduce header; the node adds and
strips headers):

* :class:`BytePacker` packs a stream of variable-length byte chunks (0 … ``width/8`` bytes a
  cycle) densely into beats; the core of both the compressor and its output aligner.
* :class:`Compressor` turns a frame of fp32 values into the compressed payload, byte for byte
  what :func:`wirereduce.sim.codec.encode` returns.
* :class:`Decompressor` turns a compressed payload back into fp32 values, bit for bit what
  :func:`wirereduce.sim.codec.decode` returns.

The codec itself (INCEPTIONN, Li et al., MICRO 2018; golden model :mod:`wirereduce.sim.golden.codec`):
with the error bound ``2**-k`` (4 ≤ k ≤ 24) a value ``g`` with sign ``s`` is tag 3 (raw 32 bits)
if ``|g| ≥ 1``, Inf or NaN; else with ``q = floor(|g| * 2**k)`` tag 0 (no bits) if ``q = 0``,
tag 1 (one byte ``s*2**7 + q``) if ``q < 2**7``, tag 2 (two bytes ``s*2**15 + q``) if
``q < 2**15``, else tag 3. A payload of ``n`` values is ``8*ceil(n/32)`` bytes of 2-bit tags
(element ``i`` in bits ``2*(i%4)`` of byte ``i//4``, zero padded) followed by the byte-aligned
codes in element order.

In hardware the tag needs no multiplication: for a value with exponent field ``e`` (``|g| < 1``,
so ``e ≤ 126``), ``q ≥ 2**j`` exactly when ``e + k ≥ 127 + j``, so the tag comes from three
comparisons of ``e + k`` (with 127, 134 and 142), and ``q`` is the 24-bit significand shifted
right by ``150 - e - k`` (9 … 23 for tags 1 and 2). Decoding normalises ``q`` with a leading-zero
count: ``q * 2**-k`` has exponent field ``141 - lz(q) - k`` (``q`` read as 15 bits).

Every stream carries :func:`~wirereduce.hdl.stream.frame.beat_layout` beats: byte ``j`` of a frame is
``data[8*(j % B) : 8*(j % B) + 8]`` of beat ``j // B`` (``B = width // 8``), ``keep`` is all ones
except on the last beat. The ``error`` output of each component is a side band of its output
stream: it is meaningful on the beat with ``last`` = 1 (``o.valid`` high) and then tells whether
the frame it ends was malformed.

Timing: both are pipelined to the logic-level budget of the 64-bit (xc7, 156.25 MHz) blocks,
≤ 9 LUT levels between registers by the yosys estimate of ``wirereduce resources``
(docs/architecture.md "Timing budgets"): the compressor has 7, the decompressor 9. The 512-bit
instances (xcup, 322.27 MHz, ≤ 5 levels) are not yet checked against their budget.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.params import rejecting
from wirereduce.hdl.stream.frame import FrameStream, beat_layout

from wirereduce.config import check_width

__all__ = ["K_MIN", "K_MAX", "chunk_layout", "BytePacker", "Compressor", "Decompressor"]

#: Smallest and largest error-bound exponent (error bound ``2**-k``), as in :mod:`wirereduce.sim.golden.codec`.
K_MIN = 4
K_MAX = 24

#: Exponent field of 1.0: ``|g| ≥ 1``, Inf and NaN are exactly the values with exponent field ≥ 127.
_EXP_ONE = 127


def chunk_layout(width: int) -> data.StructLayout:
    """A chunk of bytes for a :class:`BytePacker` of ``width`` bits.

    Parameters
    ----------
    width : int
        Beat width in bits (a power of two, 64 … 1024).

    Returns
    -------
    data.StructLayout
        ``data`` (``width`` bits) holds ``count`` (0 … ``width/8``) bytes in its low bytes, byte
        ``j`` in bits ``8j … 8j+7``; ``last`` marks the final chunk of a frame; ``error`` (read
        with ``last``) is passed on to the frame's last beat.

    Raises
    ------
    TypeError, ValueError
        If ``width`` is not a valid datapath width (:func:`~wirereduce.hdl.stream.frame.check_width`).
    """
    check_width(width)
    return data.StructLayout({"data": width, "count": range(width // 8 + 1), "last": 1, "error": 1})


# --------------------------------------------------------------------------------------------------
# small helpers


def _log2(x: int) -> int:
    assert x > 0 and x & (x - 1) == 0, x
    return x.bit_length() - 1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _byte_mask(count, nbytes: int):
    """``8 * nbytes`` bits, the low ``count`` bytes ones (a thermometer code of ``count``)."""
    return Cat(*((count > j).replicate(8) for j in range(nbytes)))


def _keep_mask(count, nbytes: int):
    """``nbytes`` bits, the low ``count`` ones: ``keep`` of a beat holding ``count`` bytes."""
    return Cat(*(count > j for j in range(nbytes)))


def _bytes(x):
    """A shift amount of ``x`` bytes (``8 * x`` bits) without a multiplier."""
    return Cat(Const(0, 3), x)


def _clamp_k(m: Module, k, name: str):
    kc = Signal(range(K_MAX + 1), name=name)
    m.d.comb += kc.eq(Mux(k < K_MIN, K_MIN, Mux(k > K_MAX, K_MAX, k)))
    return kc


def _bank_base(bank, rows: int, banks: int):
    """First row of bank ``bank`` in a memory of ``banks`` banks of ``rows`` rows each: a
    multiplexer of the constants ``b * rows`` (no multiplier; ``rows`` need not be a power of two)."""
    return Array(Const(b * rows, range(banks * rows + 1)) for b in range(banks))[bank]


def _check_args(obj, width, max_elements):
    """Validate the constructor arguments of ``obj`` (:func:`~wirereduce.hdl.params.rejecting`)."""
    with rejecting(obj):
        check_width(width)
        if isinstance(max_elements, bool) or not isinstance(max_elements, int):
            raise TypeError(f"max_elements must be an int, not {max_elements!r}")
        if not 1 <= max_elements <= 0xFFFF:
            raise ValueError(f"max_elements must be in 1..65535 (the header's 16-bit count), not {max_elements}")


# --------------------------------------------------------------------------------------------------
# byte packer


class BytePacker(wiring.Component):
    """Packs variable-length byte chunks densely into full beats, frame by frame.

    Each cycle the packer takes one chunk of 0 … ``B`` bytes (``B = width // 8``) and emits one
    full beat once ``B`` bytes are buffered, so a stream of full chunks passes at one beat per
    cycle. The chunk with ``last`` ends a frame: its remaining bytes leave as the frame's last
    beat, ``keep`` marking them (low bytes, contiguous). The next frame starts at byte 0 of a new
    beat; its first chunk may enter in the cycle the previous frame's last beat leaves, so frames
    follow each other without a gap, except that one input cycle is lost when the end of a frame
    needs two more beats. A frame whose bytes end exactly at a beat boundary *before* its
    ``last`` chunk (the ``last`` chunk is empty), and a frame of no bytes at all, end with an
    empty beat (``keep`` = 0, ``last`` = 1).

    Internally a ``2*B``-byte buffer holds ``fill`` bytes; a chunk is shifted up by ``fill``
    bytes and ORed in, a beat leaves from the bottom.

    Parameters
    ----------
    width : int
        Beat width in bits (a power of two, 64 … 1024).
    clean : bool
        The bytes of every chunk above its ``count`` are zero (the chunk is not masked: timing).
        Default ``False``: they are ignored.

    Attributes
    ----------
    i : In(stream.Signature(chunk_layout(width)))
        Chunks. ``count`` bytes of ``data`` are used (bytes above them are ignored, or zero with
        ``clean``).
    o : Out(FrameStream(width))
        Packed beats. ``valid`` is registered (depends on the buffer fill only); ``i.ready`` is one
        of two registered flags, selected by ``o.ready``.
    error : Out(1)
        The ``error`` bit of the frame's ``last`` chunk, valid with ``o.payload.last``.

    Raises
    ------
    TypeError, ValueError
        If ``width`` is not a valid datapath width (see :func:`~wirereduce.hdl.stream.frame.check_width`).
    """

    def __init__(self, width: int, clean: bool = False):
        with rejecting(self):
            check_width(width)
        self.width = width
        self.clean = bool(clean)
        super().__init__({
            "i": In(stream.Signature(chunk_layout(width))),
            "o": Out(FrameStream(width)),
            "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        w = self.width
        nb = w // 8
        lb = _log2(nb)

        buf = Signal(2 * w)
        fill = Signal(range(2 * nb))
        flush = Signal()  # the buffered bytes end a frame: no more chunks for it
        err = Signal()

        have_beat = fill >= nb
        o_last = flush & (fill <= nb)
        # A chunk fits if at most B bytes stay after this cycle's beat leaves: with flush only once
        # the frame's last beat leaves, else when no beat waits or it leaves. That is one of two
        # registered flags, chosen by o.ready alone (timing, issue 16: the readiness of what feeds the
        # packer hangs off two registers and the output's ready, not off fill):
        #   rdy_o = ~flush | fill <= B   (ready if the output takes a beat this cycle)
        #   rdy_n = ~flush & fill < B    (ready if it does not)
        # Their next values are computed for every way fill and flush can change, from registers and
        # the chunk's count; the fires only select (below).
        rdy_o = Signal(init=1)
        rdy_n = Signal(init=1)
        m.d.comb += [
            self.o.valid.eq(have_beat | flush),
            self.o.payload.data.eq(buf[:w]),
            self.o.payload.keep.eq(Mux(have_beat, (1 << nb) - 1, _keep_mask(fill, nb))),
            self.o.payload.last.eq(o_last),
            self.error.eq(err),
            self.i.ready.eq(Mux(self.o.ready, rdy_o, rdy_n)),
        ]
        o_fire = self.o.valid & self.o.ready
        i_fire = self.i.valid & self.i.ready

        # Bytes staying after this cycle's output beat (fewer than B whenever a chunk is taken).
        rem = Signal(range(2 * nb))
        rem_buf = Signal(2 * w)
        with m.If(o_fire & o_last):
            m.d.comb += [rem.eq(0), rem_buf.eq(0)]
        with m.Elif(o_fire):
            m.d.comb += [rem.eq(fill - nb), rem_buf.eq(buf[w:])]
        with m.Else():
            m.d.comb += [rem.eq(fill), rem_buf.eq(buf)]

        chunk = self.i.payload
        incoming = Signal(w)
        m.d.comb += incoming.eq(chunk.data if self.clean else chunk.data & _byte_mask(chunk.count, nb))
        # When a chunk is taken, what stays is known from the registers alone (no o.ready in the
        # shift select; timing, issue 16): the bytes of buf above fill are always zero, so
        #   flush (then the last beat leaves now):  nothing stays;
        #   fill >= B (then a beat leaves now):    buf[w:], fill - B = fill[:lb] bytes;
        #   fill < B (no beat to leave):           buf[:w], fill = fill[:lb] bytes.
        kept = Signal(range(nb))
        kept_buf = Signal(w)
        m.d.comb += [
            kept.eq(Mux(flush, 0, fill[:lb])),
            kept_buf.eq(Mux(flush, 0, Mux(fill[lb], buf[w:], buf[:w]))),
        ]
        # The flags for the fill after a chunk enters (kept + count bytes, flush = its last).
        in_fill = Signal(range(2 * nb))
        m.d.comb += in_fill.eq(kept + chunk.count)
        with m.If(i_fire):
            m.d.sync += [
                buf.eq(kept_buf | (incoming << _bytes(kept))[:2 * w]),
                fill.eq(in_fill),
                flush.eq(chunk.last),
                err.eq(chunk.error),
                rdy_o.eq(~chunk.last | (in_fill <= nb)),
                rdy_n.eq(~chunk.last & (in_fill < nb)),
            ]
        with m.Else():
            m.d.sync += [buf.eq(rem_buf), fill.eq(rem)]
            with m.If(o_fire & o_last):
                # Empty, no frame waiting to end.
                m.d.sync += [flush.eq(0), rdy_o.eq(1), rdy_n.eq(1)]
            with m.Elif(o_fire):
                # A full beat left: fill - B < B bytes stay, so ready either way unless the frame is
                # still to end (flush), when only its last beat leaving makes room.
                m.d.sync += [rdy_o.eq(1), rdy_n.eq(~flush)]
        return m


# --------------------------------------------------------------------------------------------------
# per-value rules


def _classify(m: Module, bits, lim, sh, name: str):
    """Tag (2 bits), code (32 bits, unused high bytes zero) and code length (bytes) of one fp32.

    ``lim`` are the exponent fields ``127 - k``, ``134 - k``, ``142 - k`` at which ``q`` reaches
    1, ``2**7`` and ``2**15``; ``sh`` is ``(150 - k) % 32``. With them ``k`` costs no adder here.
    """
    sign = bits[31]
    exp = bits[23:31]
    # For tags 1 and 2 the value is normal (e ≥ 127 - k ≥ 103) and q = significand >> (150 - e - k).
    shift = Signal(5, name=f"{name}_shift")
    m.d.comb += shift.eq(sh - exp[:5])
    q = Signal(24, name=f"{name}_q")
    m.d.comb += q.eq(Cat(bits[:23], Const(1, 1)) >> shift)
    tag = Signal(2, name=f"{name}_tag")
    m.d.comb += tag.eq(Mux(exp >= _EXP_ONE, 3,
                           Mux(exp < lim[0], 0,
                               Mux(exp < lim[1], 1,
                                   Mux(exp < lim[2], 2, 3)))))
    code = Signal(32, name=f"{name}_code")
    length = Signal(3, name=f"{name}_len")
    with m.Switch(tag):
        with m.Case(1):
            m.d.comb += [code.eq(Cat(q[:7], sign)), length.eq(1)]
        with m.Case(2):
            m.d.comb += [code.eq(Cat(q[:15], sign)), length.eq(2)]
        with m.Case(3):
            m.d.comb += [code.eq(bits), length.eq(4)]
    return tag, code, length


def _code_length(tag):
    return Mux(tag == 3, 4, tag)


def _leading_zeros15(q):
    """Leading zeros of a 15-bit ``q`` (15 for ``q = 0``)."""
    # Highest set bit wins: scan upwards so later (higher) bits override.
    lz_expr = Const(15, 4)
    for p in range(15):
        lz_expr = Mux(q[p], 14 - p, lz_expr)
    return lz_expr


def _decode_small(m: Module, q, sign, base, name: str, lz=None):
    """fp32 bits of ``(-1)**sign * q * 2**-k`` for a 15-bit ``q`` (exact; ``q = 0`` gives ±0);
    ``base`` is ``141 - k``; ``lz``: ``q``'s leading zeros if known (a register a stage ahead)."""
    if lz is None:
        lz = Signal(range(16), name=f"{name}_lz")
        m.d.comb += lz.eq(_leading_zeros15(q))
    norm = Signal(15, name=f"{name}_norm")
    m.d.comb += norm.eq(q << lz)
    exp = (base - lz)[:8]
    out = Signal(32, name=f"{name}_val")
    # q = 0 exactly when all 15 bits are leading zeros.
    m.d.comb += out.eq(Mux(lz == 15, Cat(Const(0, 31), sign), Cat(Const(0, 9), norm[:14], exp, sign)))
    return out


# --------------------------------------------------------------------------------------------------
# compressor


class Compressor(wiring.Component):
    """INCEPTIONN-style compressor of one frame of fp32 values (docs/codec.md).

    A frame on ``i`` is ``n`` fp32 values (``1 ≤ n ≤ max_elements``), ``width // 32`` per beat,
    lane ``j`` of beat ``b`` being element ``b * width/32 + j``; ``keep`` is all ones except on
    the last beat, where it covers whole 4-byte lanes from lane 0. The frame on ``o`` is its
    compressed payload, exactly ``wirereduce.sim.codec.encode(values, k)``: the tag block, then
    the codes, packed densely, ``keep`` on the last beat.

    Because the tags come first, a frame is stored whole before it leaves. Each input beat is
    registered with ``k`` (as the thresholds of the tag compares), then each lane is classified
    (tag, 0/1/2/4 code bytes) into a second register stage; from there the beat's codes are
    compacted into one chunk of at most ``width/8`` bytes and a :class:`BytePacker` packs the
    chunks into a code buffer (:mod:`amaranth.lib.memory`, one beat per row) while the tags
    collect in a tag buffer (one row per 16 input beats). When the code buffer holds the whole
    frame, a reader sends the tag rows and then the code rows through a second
    :class:`BytePacker`, which shifts the codes to follow the tag block byte-exactly. Both
    buffers have ``banks`` banks (2: ping-pong), used in turn, so the next ``banks - 1`` frames are
    taken in while one is sent; the beats of a frame wait in the two input stages while their
    bank is still being sent.

    Timing (``valid`` and ``ready`` held high; measured and asserted in
    ``tests/test_codec_hdl.py``):

    * **Latency**: one frame (store and forward). The first output beat is taken 7 … 9 cycles
      after the frame's last input beat when the output side is idle (two of them are the input
      stages that keep the classification within the logic-level budget).
    * **Throughput**: one input beat per cycle, less one cycle at the end of a frame whose
      compressed bytes need one more beat to flush; one output beat per cycle while a frame is
      sent (the tag block and the codes are packed back to back). Back to back a frame costs
      ``max(input beats, output beats)`` plus at most 2 cycles: frames of 371 values are taken
      at 0.999 (64 bit) and 0.997 (512 bit) input beats per cycle, frames of 100 values at 0.994
      and 0.976 (30 frames of gradients back to back, ``k`` = 8). Frames of a few beats are
      limited by the two buffers covering the latency: about 2.3 cycles per one-beat frame, 4.1
      per three-beat frame at 512 bit.
    * **Size**: ``banks`` tag rows of ``width`` bits per 16 input beats and ``banks`` code rows per
      input beat of ``max_elements`` values (``banks`` frames), plus two :class:`BytePacker` and a skid
      register of one row behind the row read (the reader advances on registers, not on the output's
      ready).

    Malformed input is consumed to its ``last`` beat and flagged with ``error``: a frame of more
    than ``max_elements`` values keeps its first ``max_elements`` values (later ones are dropped)
    and is sent as their compressed payload; a frame of no values (one beat with ``keep`` = 0)
    is answered by one empty beat (``keep`` = 0, ``last`` = 1). ``k`` outside 4 … 24 is used as
    the nearest of 4 and 24 (not flagged).

    Parameters
    ----------
    width : int
        Datapath width in bits (64 for 10G, 512 for 100G; a power of two 64 … 1024).
    max_elements : int
        Most values in one frame (371 at MTU 1500); sizes the buffers.
    banks : int
        Frames the buffers hold (2, 4, 8 or 16; default 2): with the output stalled, ``banks``
        whole frames are taken. More banks let the input run ahead of a slower output (a
        512-bit core behind 10G links); 4 did not speed up the compressed bench
        (docs/codec.md "Performance").

    Attributes
    ----------
    i : In(FrameStream(width))
        fp32 values, little-endian, one frame per payload. ``i.ready`` does not depend on
        ``o.ready`` or on the payload.
    k : In(8)
        Error-bound exponent (error bound ``2**-k``); must be constant during an input frame.
    o : Out(FrameStream(width))
        Compressed payloads.
    error : Out(1)
        With ``o.payload.last``: 1 if the frame had no values or more than ``max_elements``.

    Raises
    ------
    TypeError, ValueError
        If ``width`` is not a valid datapath width, ``max_elements`` is not in 1 … 65535 or
        ``banks`` is not 2, 4, 8 or 16 (ValueError).
    """

    def __init__(self, width: int, max_elements: int, banks: int = 2):
        _check_args(self, width, max_elements)
        with rejecting(self):
            if isinstance(banks, bool) or not isinstance(banks, int) or banks not in (2, 4, 8, 16):
                raise ValueError(f"banks must be 2, 4, 8 or 16, not {banks!r}")
        self.width = width
        self.max_elements = max_elements
        self.lanes = width // 32
        self.banks = banks
        super().__init__({
            "i": In(FrameStream(width)),
            "k": In(8),
            "o": Out(FrameStream(width)),
            "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        w, lanes, maxn, nbanks = self.width, self.lanes, self.max_elements, self.banks
        nb = w // 8
        units = nb // 8  # 8-byte tag units per beat
        max_beats = _cdiv(maxn, lanes)
        tag_rows = _cdiv(max_beats, 16)  # per bank; a row holds the tags of 16 input beats
        code_rows = max_beats            # per bank; 4 bytes per value at most

        # Both packers take clean chunks (timing: no mask in front of the buffer): a compacted beat's
        # codes have no bytes above their lengths, and a stored row none above its count (a tag row
        # is zero above the frame's tags, a code row is a packed beat, zero above its keep).
        m.submodules.pack_codes = pack_in = BytePacker(w, clean=True)
        m.submodules.pack_out = pack_out = BytePacker(w, clean=True)
        m.submodules.tag_mem = tag_mem = memory.Memory(shape=w, depth=nbanks * tag_rows, init=[])
        m.submodules.code_mem = code_mem = memory.Memory(shape=w, depth=nbanks * code_rows, init=[])
        tag_wr, code_wr = tag_mem.write_port(), code_mem.write_port()
        tag_rd, code_rd = tag_mem.read_port(), code_mem.read_port()

        k = _clamp_k(m, self.k, "k_clamped")

        # Bank b is busy from the input's last beat of a frame until the reader has issued the
        # frame's last row, and full from the cycle its codes are all written until then.
        busy = Signal(nbanks)
        busy_set = Signal(nbanks)
        full = Signal(nbanks)
        full_set = Signal(nbanks)
        full_clr = Signal(nbanks)
        m.d.sync += [busy.eq((busy | busy_set) & ~full_clr), full.eq((full | full_set) & ~full_clr)]
        meta_n = Array(Signal(range(maxn + 1), name=f"n{b}") for b in range(nbanks))
        meta_c = Array(Signal(range(4 * maxn + 1), name=f"code_bytes{b}") for b in range(nbanks))
        meta_err = Array(Signal(name=f"err{b}") for b in range(nbanks))

        # ------------------------------------------------------------------------------------
        # Input, in three registered stages (each takes a beat when the next one can):
        #   A  the beat, which lanes hold values, and k as the thresholds of the tag compares;
        #   B  per lane the tag, the code and its length in bytes;
        #   s1 the beat's codes compacted into one chunk for the packer; the tags collect.
        # ------------------------------------------------------------------------------------
        beat = self.i.payload
        wr_bank = Signal(range(nbanks))
        index = Signal(range(max_beats + 1))      # beat of the frame, saturating at max_beats

        s1_valid = Signal()
        s1 = Signal(chunk_layout(w))
        m.d.comb += [pack_in.i.valid.eq(s1_valid), pack_in.i.payload.eq(s1)]
        s1_free = Signal()
        m.d.comb += s1_free.eq(~s1_valid | pack_in.i.ready)
        b_valid = Signal()
        b_bank = Signal(range(nbanks))
        b_fire = Signal()
        # A beat leaves stage B (its tags and the frame's metadata are written) once its bank is
        # not busy with the previous frame of that bank: stages A and B fill meanwhile.
        m.d.comb += b_fire.eq(b_valid & s1_free & ~busy.bit_select(b_bank, 1))
        b_free = ~b_valid | b_fire
        a_valid = Signal()
        a_free = ~a_valid | b_free
        a_fire = Signal()
        m.d.comb += a_fire.eq(a_valid & b_free)

        in_ready = Signal()
        m.d.comb += [
            in_ready.eq(a_free),
            self.i.ready.eq(in_ready),
        ]
        i_fire = self.i.valid & in_ready

        # Stage A.
        a_data = Signal(w)
        a_lane = Signal(lanes)                    # lane holds a value of the frame
        a_over = Signal()                         # a value beyond max_elements (dropped)
        a_last = Signal()
        a_index = Signal(range(max_beats + 1))
        a_bank = Signal(range(nbanks))
        # A value with exponent field e has q >= 1, >= 2**7, >= 2**15 when e >= 127 - k, 134 - k,
        # 142 - k; q is its significand shifted right by (150 - k) - e.
        a_lim = [Signal(8, name=f"a_lim{i}") for i in range(3)]
        a_sh = Signal(5)
        present = [beat.keep[4 * j] for j in range(lanes)]
        # Element index * lanes + j < max_elements, as a compare of the beat index alone.
        in_range = [index < _cdiv(maxn - j, lanes) for j in range(lanes)]
        with m.If(a_fire):
            m.d.sync += a_valid.eq(0)
        with m.If(i_fire):
            m.d.sync += [
                a_valid.eq(1), a_data.eq(beat.data), a_last.eq(beat.last), a_index.eq(index), a_bank.eq(wr_bank),
                a_lane.eq(Cat(*(present[j] & in_range[j] for j in range(lanes)))),
                a_over.eq(Cat(*(present[j] & ~in_range[j] for j in range(lanes))).any()),
                a_lim[0].eq(_EXP_ONE - k), a_lim[1].eq(_EXP_ONE + 7 - k), a_lim[2].eq(_EXP_ONE + 15 - k),
                a_sh.eq((150 - k)[:5]),
            ]

        # Stage B.
        b_tags = [Signal(2, name=f"lane{j}_t") for j in range(lanes)]
        b_codes = [Signal(32, name=f"lane{j}_c") for j in range(lanes)]
        b_lens = [Signal(3, name=f"lane{j}_l") for j in range(lanes)]
        b_nvalid = Signal(range(lanes + 1))
        b_over = Signal()
        b_last = Signal()
        b_index = Signal(range(max_beats + 1))
        classified = [_classify(m, a_data[32 * j:32 * j + 32], a_lim, a_sh, f"lane{j}") for j in range(lanes)]
        with m.If(b_fire):
            m.d.sync += b_valid.eq(0)
        with m.If(a_fire):
            m.d.sync += [
                b_valid.eq(1), b_nvalid.eq(sum(a_lane[j] for j in range(lanes))), b_over.eq(a_over),
                b_last.eq(a_last), b_index.eq(a_index), b_bank.eq(a_bank),
            ]
            for j, (t, c, ln) in enumerate(classified):
                v = a_lane[j]
                m.d.sync += [b_tags[j].eq(Mux(v, t, 0)), b_codes[j].eq(Mux(v, c, 0)), b_lens[j].eq(Mux(v, ln, 0))]

        # Stage s1: compaction.
        offsets = [Const(0, 1)]
        for j in range(1, lanes + 1):
            o = Signal(range(4 * j + 1), name=f"offset{j}")
            m.d.comb += o.eq(offsets[-1] + b_lens[j - 1])
            offsets.append(o)
        count = offsets[-1]
        chunk = Signal(w)
        parts = [(b_codes[j] << _bytes(offsets[j]))[:w] for j in range(lanes)]
        expr = parts[0]
        for p in parts[1:]:
            expr = expr | p
        m.d.comb += chunk.eq(expr)
        with m.If(pack_in.i.ready):
            m.d.sync += s1_valid.eq(0)
        with m.If(b_fire):
            m.d.sync += [s1_valid.eq(1), s1.data.eq(chunk), s1.count.eq(count), s1.last.eq(b_last)]

        # Input-side frame bookkeeping: the beat index and bank at the input, the counts, tags,
        # the bank's metadata and its busy bit at stage B.
        with m.If(i_fire):
            with m.If(beat.last):
                m.d.sync += [index.eq(0), wr_bank.eq(wr_bank + 1)]
            with m.Else():
                m.d.sync += index.eq(Mux(index == max_beats, index, index + 1))

        n_acc = Signal(range(maxn + 1))
        c_acc = Signal(range(4 * maxn + 1))
        e_acc = Signal()
        tag_acc = Signal(w)

        # Tag row: 16 beats of 2*lanes tag bits each; written on every beat, so the row in
        # memory always holds the tags so far (and zeros above them: the block's padding).
        slot = b_index[:4]
        row = Signal(w)
        m.d.comb += row.eq(Mux(slot == 0, 0, tag_acc) | (Cat(*b_tags) << Cat(Const(0, _log2(2 * lanes)), slot))[:w])
        m.d.comb += [
            tag_wr.addr.eq(_bank_base(b_bank, tag_rows, nbanks) + b_index[4:]),
            tag_wr.data.eq(row),
            tag_wr.en.eq(b_fire & (b_index < max_beats)),
        ]

        with m.If(b_fire):
            m.d.sync += tag_acc.eq(row)
            with m.If(b_last):
                m.d.comb += busy_set.bit_select(b_bank, 1).eq(1)
                m.d.sync += [
                    n_acc.eq(0), c_acc.eq(0), e_acc.eq(0),
                    meta_n[b_bank].eq(n_acc + b_nvalid),
                    meta_c[b_bank].eq(c_acc + count),
                    meta_err[b_bank].eq(e_acc | b_over | (n_acc + b_nvalid == 0)),
                ]
            with m.Else():
                m.d.sync += [n_acc.eq(n_acc + b_nvalid), c_acc.eq(c_acc + count), e_acc.eq(e_acc | b_over)]

        # Packed code beats go to the code buffer of the bank the packer's frame belongs to.
        cw_bank = Signal(range(nbanks))
        cw_addr = Signal(range(code_rows + 1))
        m.d.comb += [
            pack_in.o.ready.eq(1),
            code_wr.addr.eq(_bank_base(cw_bank, code_rows, nbanks) + cw_addr),
            code_wr.data.eq(pack_in.o.payload.data),
            code_wr.en.eq(pack_in.o.valid & pack_in.o.payload.keep[0]),
        ]
        with m.If(pack_in.o.valid):
            with m.If(pack_in.o.payload.last):
                m.d.sync += [cw_addr.eq(0), cw_bank.eq(cw_bank + 1)]
                m.d.comb += full_set.bit_select(cw_bank, 1).eq(1)
            with m.Else():
                m.d.sync += cw_addr.eq(cw_addr + 1)

        # ------------------------------------------------------------------------------------
        # Output: read the tag rows then the code rows of a full bank into the output packer.
        # ------------------------------------------------------------------------------------
        rd_bank = Signal(range(nbanks))
        rd_tags = Signal(init=1)
        rd_idx = Signal(range(max(tag_rows, code_rows) + 1))
        # Per bank, from its metadata (registered: written at the frame's last beat in stage B,
        # read only once the bank is full, at least three cycles later): the last tag beat, the
        # tag bytes in it, the last code beat, the code bytes in it, whether there are codes.
        d_tag_last = Array(Signal(range(tag_rows * 16 + 1), name=f"tag_last{b}") for b in range(nbanks))
        d_tag_tail = Array(Signal(range(nb + 1), name=f"tag_tail{b}") for b in range(nbanks))
        d_code_last = Array(Signal(range(code_rows + 1), name=f"code_last{b}") for b in range(nbanks))
        d_code_tail = Array(Signal(range(nb + 1), name=f"code_tail{b}") for b in range(nbanks))
        d_no_codes = Array(Signal(name=f"no_codes{b}") for b in range(nbanks))
        for b in range(nbanks):
            n_b, c_b = meta_n[b], meta_c[b]
            units_total = (n_b + 31) >> 5  # 8-byte units of the tag block
            m.d.sync += [
                # A frame of no values still sends one (empty) chunk, so that its last beat leaves.
                d_tag_last[b].eq(Mux(n_b == 0, 0, ((units_total + units - 1) >> _log2(units)) - 1)),
                d_tag_tail[b].eq(Mux(n_b == 0, 0, 8 if units == 1 else _bytes((units_total - 1)[:_log2(units)] + 1))),
                d_code_last[b].eq(((c_b + nb - 1) >> _log2(nb)) - 1),
                d_code_tail[b].eq((c_b - 1)[:_log2(nb)] + 1),
                d_no_codes[b].eq(c_b == 0),
            ]
        no_codes = d_no_codes[rd_bank]

        r1_valid = Signal()
        r1_tags = Signal()
        r1_count = Signal(range(nb + 1))
        r1_last = Signal()
        r1_err = Signal()
        r1 = Signal(chunk_layout(w))
        m.d.comb += [
            r1.data.eq(Mux(r1_tags, tag_rd.data, code_rd.data)),
            r1.count.eq(r1_count), r1.last.eq(r1_last), r1.error.eq(r1_err),
        ]
        # The row read (r1, the buffers' read registers) has a skid register behind it (sk: a row
        # the output packer did not take while the next one was read), so the reader advances
        # whenever the skid is empty: registers, not the packer's ready (which follows the output's
        # ready), decide the reads, the row index and the banks' flags (timing, issue 16). The
        # packer takes the skid's row first; with its ready held high the skid is never used.
        sk_valid = Signal()
        sk = Signal(chunk_layout(w))
        advance = Signal()
        m.d.comb += [
            advance.eq(~r1_valid | ~sk_valid),
            tag_rd.addr.eq(_bank_base(rd_bank, tag_rows, nbanks) + rd_idx),
            code_rd.addr.eq(_bank_base(rd_bank, code_rows, nbanks) + rd_idx),
            tag_rd.en.eq(advance),
            code_rd.en.eq(advance),
            pack_out.i.valid.eq(r1_valid | sk_valid),
            pack_out.i.payload.eq(Mux(sk_valid, sk, r1)),
        ]
        with m.If(sk_valid):
            with m.If(pack_out.i.ready):
                m.d.sync += sk_valid.eq(0)
        with m.Elif(r1_valid & ~pack_out.i.ready):
            m.d.sync += [sk_valid.eq(1), sk.eq(r1)]
        active = full.bit_select(rd_bank, 1)
        finish = Signal()
        with m.If(advance):
            m.d.sync += r1_valid.eq(active)
            with m.If(active):
                m.d.sync += [r1_tags.eq(rd_tags), r1_err.eq(meta_err[rd_bank])]
                with m.If(rd_tags):
                    last_tag = rd_idx == d_tag_last[rd_bank]
                    m.d.sync += [r1_count.eq(Mux(last_tag, d_tag_tail[rd_bank], nb)), r1_last.eq(last_tag & no_codes)]
                    with m.If(last_tag):
                        m.d.sync += [rd_idx.eq(0), rd_tags.eq(0)]
                        m.d.comb += finish.eq(no_codes)
                    with m.Else():
                        m.d.sync += rd_idx.eq(rd_idx + 1)
                with m.Else():
                    last_code = rd_idx == d_code_last[rd_bank]
                    m.d.sync += [r1_count.eq(Mux(last_code, d_code_tail[rd_bank], nb)), r1_last.eq(last_code)]
                    m.d.sync += rd_idx.eq(rd_idx + 1)
                    m.d.comb += finish.eq(last_code)
        with m.If(finish):
            m.d.sync += [rd_idx.eq(0), rd_tags.eq(1), rd_bank.eq(rd_bank + 1)]
            m.d.comb += full_clr.bit_select(rd_bank, 1).eq(1)

        wiring.connect(m, pack_out.o, wiring.flipped(self.o))
        m.d.comb += self.error.eq(pack_out.error)
        return m


# --------------------------------------------------------------------------------------------------
# decompressor


class Decompressor(wiring.Component):
    """INCEPTIONN-style decompressor of one compressed payload per frame (docs/codec.md).

    A frame on ``i`` is one compressed payload of ``n`` values; ``n`` (the header's ``count``)
    and ``k`` (its ``eb_k``) are sampled with the frame's first beat. The frame on ``o`` is the
    ``n`` decoded fp32 values, ``width // 32`` per beat, ``keep`` covering ``4*n`` bytes on the
    last beat: bit for bit ``wirereduce.sim.codec.decode(payload, n, k)``.

    Each input beat is registered with its place in the tag block (how many of its bytes are
    tag bytes). The tag block is stored first (a ping-pong buffer, one row per input beat). The
    codes that follow enter a ``2*width``-bit byte buffer. A generator walks the output beats of
    each stored tag block and registers, one beat ahead, the tags of the beat's ``width/32``
    values, their code lengths and running byte offsets (in two registers, P2 then D, so the
    byte buffer's loop starts from registers); when the buffer holds the beat's bytes,
    each lane's code is taken at its offset into a register while the beat's bytes leave the
    buffer, and the next cycle decodes the codes into the output register. Up to ``width/8``
    code bytes enter and leave the buffer per cycle, so one output beat per cycle is sustained
    even when every value is raw. The buffer's loop is kept short: besides ``fill`` a register holds
    ``fill`` less the waiting beat's byte count (its sign says whether the bytes are there), every next
    value of both is computed for a beat that fires and for one that does not, and the fire
    selects; the output register has a skid register behind it, so the pipeline advances on a
    register and the output's ``ready`` stays out of the loop (with ``ready`` held high the skid
    is never used). Code chunks wait in a small FIFO (:attr:`fifo_depth` entries,
    a tag block's worth of beats plus 4, of which the input fills all but one: its room is read
    from a register), so the input runs ahead and stores the next frame's tag
    block in the other bank while the current frame's values still leave.

    Timing (``valid`` and ``ready`` held high; measured and asserted in
    ``tests/test_codec_hdl.py``):

    * **Latency**: an output beat is taken 5 cycles after the input beat that completes its code
      bytes (input stage, chunk FIFO, byte buffer, code extraction, output register), and a
      frame's first beat no earlier than 7 cycles after the input beat that ends its tag block
      (input stage, tag buffer, generator, two descriptor registers, extraction, output register).
    * **Throughput**: one output beat per cycle once codes are available. Back to back a frame
      costs ``max(input beats, output beats)`` plus at most 2 cycles: at 64 bit frames of 33,
      100 and 371 values leave with no idle output cycle; at 512 bit a frame whose tag block ends
      mid-beat may cost one more cycle (24.7 cycles for 24 output beats at 371 values, 7.8 for 7
      at 100; 30 frames of gradients back to back, ``k`` = 8). Frames of one input beat leave
      at one per cycle (512 bit): a bank's tag rows are free for the next block as soon as the
      generator has read the last of them.
    * **Size**: two tag rows of ``width`` bits per 16 output beats of ``max_elements`` values, a
      ``2*width``-bit byte buffer, the chunk FIFO, and the pipeline registers (an input beat, a
      beat's codes before decoding, the output beat).

    Malformed input never hangs the decompressor: every input frame is consumed to its ``last``
    beat and gives one output frame of ``n`` values, with ``error`` set on its last beat if

    * the payload is **truncated** (ends before its tag block or before the codes its tags
      announce): missing tags count as tag 0 and values whose code bytes are missing or
      incomplete are output as +0.0;
    * the payload is **too long**: the values are decoded from the bytes the tags announce, the
      extra bytes are consumed and dropped (the frame's last output beat waits for the input's
      last beat);
    * a padding bit of the tag block is not zero (the values are decoded as usual);
    * ``n`` is 0 or above ``max_elements`` (it is then used as 1 or ``max_elements``).

    ``k`` outside 4 … 24 is used as the nearest of 4 and 24 (not flagged).

    Parameters
    ----------
    width : int
        Datapath width in bits (64 for 10G, 512 for 100G; a power of two 64 … 1024).
    max_elements : int
        Most values in one frame (371 at MTU 1500); sizes the tag buffer.

    Attributes
    ----------
    fifo_depth : int
        Entries of the code-chunk FIFO.
    i : In(FrameStream(width))
        Compressed payloads. ``i.ready`` depends on registers only (not on ``i.payload`` or
        ``o.ready``).
    n : In(16)
        Element count of the payload, sampled with its first beat.
    k : In(8)
        Error-bound exponent of the payload, sampled with its first beat.
    o : Out(FrameStream(width))
        Decoded fp32 values, little-endian.
    error : Out(1)
        With ``o.payload.last``: 1 if the frame was malformed (see above).

    Raises
    ------
    TypeError, ValueError
        If ``width`` is not a valid datapath width or ``max_elements`` is not in 1 … 65535.
    """

    def __init__(self, width: int, max_elements: int):
        _check_args(self, width, max_elements)
        self.width = width
        self.max_elements = max_elements
        self.lanes = width // 32
        # A tag block's worth of code beats, and some: enough to hide the next tag block.
        self.fifo_depth = _cdiv(8 * _cdiv(max_elements, 32), width // 8) + 4
        super().__init__({
            "i": In(FrameStream(width)),
            "n": In(16),
            "k": In(8),
            "o": Out(FrameStream(width)),
            "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        w, lanes, maxn = self.width, self.lanes, self.max_elements
        nb = w // 8
        lb = _log2(nb)
        units = nb // 8
        lu = _log2(units)
        ll = _log2(lanes)
        tag_rows = _cdiv(8 * _cdiv(maxn, 32), nb)  # input beats holding tags, per bank
        max_out = _cdiv(maxn, lanes)

        m.submodules.tag_mem = tag_mem = memory.Memory(shape=w, depth=2 * tag_rows, init=[])
        tag_wr = tag_mem.write_port()
        tag_rd = tag_mem.read_port()
        # Code chunks wait here, so the input runs ahead and stores the next frame's tag block
        # while the output still works on the previous frame.
        chunk = chunk_layout(w)
        m.submodules.chunks = chunks = fifo.SyncFIFO(width=chunk.size, depth=self.fifo_depth)

        # Per bank: the frame's n and k, whether its tags are stored (full), errors seen on the
        # input side, and how many tag rows were written.
        b_n = Array(Signal(range(maxn + 1), name=f"n{b}") for b in range(2))
        b_k = Array(Signal(range(K_MAX + 1), name=f"k{b}") for b in range(2))
        b_full = Array(Signal(name=f"full{b}") for b in range(2))
        b_err = Array(Signal(name=f"in_err{b}") for b in range(2))
        b_rows = Array(Signal(range(tag_rows + 1), name=f"tag_rows{b}") for b in range(2))

        # ------------------------------------------------------------------------------------
        # Input side, two steps. Stage A takes the beat and registers it with what its position
        # in the frame says: how many of its bytes are tag bytes, whether it ends the tag block.
        # Then tag bytes go to the tag buffer, code bytes (and every frame's end) to the FIFO.
        # ------------------------------------------------------------------------------------
        beat = self.i.payload
        in_bank = Signal()
        index = Signal(range(tag_rows + 1))  # beat of the frame, saturating at tag_rows
        first = index == 0

        n_port = Signal(range(maxn + 1))
        n_bad = Signal()
        m.d.comb += [
            n_port.eq(Mux(self.n == 0, 1, Mux(self.n > maxn, maxn, self.n))),
            n_bad.eq((self.n == 0) | (self.n > maxn)),
        ]
        k_port = _clamp_k(m, self.k, "k_clamped")

        def tag_shape(n):
            """(beats holding tags - 1, tag bytes in the last of them, its 8-byte unit) of n values."""
            t_units_m1 = (n - 1) >> 5  # 8-byte units of the tag block, less one
            tail_unit = t_units_m1[:lu] if units > 1 else Const(0, 1)
            return t_units_m1 >> lu, _bytes(tail_unit + 1), tail_unit

        def pad_mask(n):
            """Bits of the tag block's last 8-byte unit that must be zero: 2*(n % 32) … 63 (a table
            of constants, no compares: timing)."""
            table = [sum(1 << b for b in range(64) if v != 0 and v <= b // 2) for v in range(32)]
            return Array(Const(t, 64) for t in table)[n[:5]]

        # The first beat ends the tag block: n ≤ 32 * units (n_port - 1 < 32 * units), as bit tests of
        # n (32 * units is a power of two), not a compare after the clamp (timing: the input's ready).
        lim = 32 * units
        first_ends = (self.n[_log2(lim):] == 0) | (self.n == lim) if maxn > lim else Const(1)

        # The current input frame's tag shape, registered with its first beat.
        f_tb_m1 = Signal(range(tag_rows))
        f_tail = Signal(range(nb + 1))
        f_unit = Signal(range(units))
        f_n5 = Signal(5)                     # n % 32 of the frame, for the tag padding check
        p_tb_m1, p_tail, p_unit = tag_shape(n_port)

        a_valid = Signal()
        a_data = Signal(w)                   # the beat, bytes beyond keep zeroed
        a_kept = Signal(range(nb + 1))
        a_last = Signal()
        a_first = Signal()
        a_nbad = Signal()
        a_n = Signal(range(maxn + 1))
        a_k = Signal(range(K_MAX + 1))
        a_bank = Signal()
        a_index = Signal(range(tag_rows + 1))
        a_in_tags = Signal()
        a_tag_end = Signal()
        a_tail = Signal(range(nb + 1))
        a_unit = Signal(range(units))
        a_n5 = Signal(5)

        kept = Signal(range(nb + 1))
        m.d.comb += kept.eq(sum(beat.keep[b] for b in range(nb)))

        # What the beat's place in the frame says, computed as it is registered (timing: the
        # input's ready then hangs off registers, not off the tail compare and subtraction).
        in_tags_n = Signal()
        tag_end_n = Signal()
        tail_n = Signal(range(nb + 1))
        m.d.comb += [
            in_tags_n.eq(first | (index <= f_tb_m1)),
            tag_end_n.eq(Mux(first, first_ends, index == f_tb_m1)),
            tail_n.eq(Mux(first, p_tail, f_tail)),
        ]
        # The first beat's and a later beat's counts apart, the first beat selecting (timing, issue 16:
        # at 64 bit a first beat has no code bytes, its tag-block tail being the whole beat, so the
        # count and needs_push do not wait for n from the header; the same values as
        # Mux(tag_end_n, Mux(kept > tail_n, kept - tail_n, 0), Mux(in_tags_n, 0, kept))).
        if units == 1:
            cc_first = Const(0)              # the tag block is whole 8-byte units, the beat one
        else:
            cc_first = Mux(first_ends, Mux(kept > p_tail, kept - p_tail, 0), 0)
        cc_later = Mux(index == f_tb_m1, Mux(kept > f_tail, kept - f_tail, 0), Mux(index <= f_tb_m1, 0, kept))
        code_count_n = Mux(first, cc_first, cc_later)
        code_count = Signal(range(nb + 1))   # code bytes of the registered beat
        needs_push = Signal()                # it goes to the chunk FIFO: it has code bytes or ends the frame
        tag_bytes = Mux(a_tag_end, a_tail, Mux(a_in_tags, nb, 0))
        tag_ok = ~a_in_tags | ~b_full[a_bank]
        a_go = Signal()
        # Room in the chunk FIFO from a register (timing, issue 16: the FIFO's level compare stays out
        # of the input's ready, which a codec stage's header FIFO, route FIFO and gate hang off; with
        # lookahead-3 units the codec engine's 10-level paths ran level → w_rdy → ready → route FIFO).
        # A level of at most depth − 2 a cycle ago leaves room for this cycle's write whatever was
        # written then; the FIFO's last entry is given up for it (a tag block's beats + 3 remain).
        # Standalone the decompressor is 9 levels with it or with ``chunks.w_rdy`` here (1,643 against
        # 1,648 LUT, 2026-11-30, fourth session); the path it cut ran on through the codec stage
        # around it, so whether CodecIn's dec_in FIFO makes it redundant takes an
        # engine_p2_64_codec run (about 8 minutes of Yosys) to tell: not done, so it stays.
        chunks_room = Signal(init=1)
        m.d.sync += chunks_room.eq(chunks.level < self.fifo_depth - 1)
        m.d.comb += a_go.eq(a_valid & tag_ok & (~needs_push | chunks_room))
        m.d.comb += self.i.ready.eq(~a_valid | a_go)
        i_fire = self.i.valid & self.i.ready

        with m.If(a_go):
            m.d.sync += a_valid.eq(0)
        # The stage's registers load whenever it can take a beat, whether one comes or not (timing,
        # issue 16: the input's valid, which follows the codec stage's gate, only sets a_valid and
        # the frame's bookkeeping below); nothing reads them while a_valid is low.
        with m.If(self.i.ready):
            m.d.sync += [
                a_data.eq(beat.data & _byte_mask(kept, nb)),
                a_kept.eq(kept),
                a_last.eq(beat.last),
                a_first.eq(first),
                a_nbad.eq(first & n_bad),
                a_n.eq(n_port),
                a_k.eq(k_port),
                a_bank.eq(in_bank),
                a_index.eq(index),
                a_in_tags.eq(in_tags_n),
                a_tag_end.eq(tag_end_n),
                a_tail.eq(tail_n),
                code_count.eq(code_count_n),
                needs_push.eq((code_count_n != 0) | beat.last),
                a_unit.eq(Mux(first, p_unit, f_unit)),
                a_n5.eq(Mux(first, n_port[:5], f_n5)),
            ]
        with m.If(i_fire):
            m.d.sync += a_valid.eq(1)
            with m.If(first):
                m.d.sync += [f_tb_m1.eq(p_tb_m1), f_tail.eq(p_tail), f_unit.eq(p_unit), f_n5.eq(n_port[:5])]
            with m.If(beat.last):
                m.d.sync += [index.eq(0), in_bank.eq(~in_bank)]
            with m.Else():
                m.d.sync += index.eq(Mux(index == tag_rows, index, index + 1))

        # Padding check: bits 2*(n % 32) … 63 of the block's last 8-byte unit must be zero. Checked a
        # cycle late (timing, issue 16: the mask and the 64-bit OR stay out of the banks' error flags):
        # the OR of each byte of the masked unit is registered with the beat's going (pad_go) and its
        # bank, and ORed into the bank's error flag the cycle after, when the generator, which may
        # read the flag in that cycle (the bank became full with this beat), takes it from the
        # registers too (p1_err below).
        last_unit = a_data[:64] if units == 1 else a_data.word_select(a_unit, 64)
        masked = Signal(64)
        m.d.comb += masked.eq(last_unit & pad_mask(a_n5))
        pad_part = Signal(8)
        pad_go = Signal()
        pad_bank = Signal()
        pad_now = Signal()
        m.d.sync += [
            pad_part.eq(Cat(*(masked[8 * j:8 * j + 8].any() for j in range(8)))),
            pad_go.eq(a_go & a_tag_end),
            pad_bank.eq(a_bank),
        ]
        m.d.comb += pad_now.eq(pad_go & pad_part.any())
        # The payload ends before its tag block does.
        tags_cut = a_last & a_in_tags & (~a_tag_end | (a_kept < a_tail))

        w_chunk = Signal(chunk)
        m.d.comb += [
            w_chunk.data.eq(a_data >> _bytes(tag_bytes)),
            w_chunk.count.eq(code_count),
            w_chunk.last.eq(a_last),
            chunks.w_data.eq(w_chunk.as_value()),
            chunks.w_en.eq(a_go & needs_push),
            tag_wr.addr.eq(Mux(a_bank, tag_rows, 0) + a_index),
            tag_wr.data.eq(a_data),
            tag_wr.en.eq(a_go & a_in_tags),
        ]
        err_now = a_nbad | tags_cut
        for b in range(2):
            hit = a_go & (a_bank == b)
            m.d.sync += b_err[b].eq(Mux(hit & a_first, 0, b_err[b]) | (hit & err_now) | (pad_now & (pad_bank == b)))
        with m.If(a_go):
            with m.If(a_first):
                m.d.sync += [b_n[a_bank].eq(a_n), b_k[a_bank].eq(a_k)]
            with m.If(a_in_tags & (a_tag_end | a_last)):
                m.d.sync += [b_full[a_bank].eq(1), b_rows[a_bank].eq(a_index + 1)]

        # ------------------------------------------------------------------------------------
        # Output side, a pipeline of per-beat descriptors and two stages of values.
        #   G  the descriptor generator walks the output beats of each full bank and reads the
        #      tag row of each (one cycle, the tag buffer's read register);
        #   D  the beat's tags, their code lengths and running byte offsets, registered;
        #   E  when the beat's code bytes are in the byte buffer: each lane's code, extracted at
        #      its offset, while the beat's bytes leave the buffer;
        #   O  the decoded values (the output register).
        # ------------------------------------------------------------------------------------
        d_valid = Signal()
        d_tags = [Signal(2, name=f"lane{lane}_tag") for lane in range(lanes)]
        d_off = [Const(0, 1)] + [Signal(range(4 * lane + 1), name=f"offset{lane}") for lane in range(1, lanes + 1)]
        d_need = d_off[-1]
        d_final = Signal()
        d_lanes_m1 = Signal(range(lanes))
        d_k = Signal(range(K_MAX + 1))
        d_err = Signal()
        fire = Signal()
        d_free = ~d_valid | fire

        # G: generator.
        g_bank = Signal()
        g_j = Signal(range(max_out))
        g_n = b_n[g_bank]
        g_final = g_j == ((g_n - 1) >> ll)[:len(g_j)]
        p1_valid = Signal()
        p1_final = Signal()
        p1_rowok = Signal()
        p1_slot = Signal(4)
        p1_lanes_m1 = Signal(range(lanes))
        p1_k = Signal(range(K_MAX + 1))
        p1_err = Signal()
        # P2: the descriptor computed from P1's tag row, registered before D takes it (timing: the
        # tag row's slot select, the code lengths and their sum stay out of ``slack``'s update,
        # which was the codec engine's 10-level path, tag_rd data → slack).
        p2_valid = Signal()
        p2_adv = ~p2_valid | d_free
        p1_adv = ~p1_valid | p2_adv
        g_issue = Signal()
        m.d.comb += [
            g_issue.eq(b_full[g_bank] & p1_adv),
            tag_rd.addr.eq(Mux(g_bank, tag_rows, 0) + (g_j >> 4)),
            tag_rd.en.eq(p1_adv),
        ]
        with m.If(p1_adv):
            m.d.sync += [
                p1_valid.eq(g_issue), p1_final.eq(g_final), p1_rowok.eq((g_j >> 4) < b_rows[g_bank]),
                p1_slot.eq(g_j[:4]), p1_lanes_m1.eq((g_n - 1)[:ll]),
                # The bank's k, and its input-side errors (all known once its tags are stored, the
                # padding check's a cycle later: taken from its registers in that cycle).
                p1_k.eq(b_k[g_bank]), p1_err.eq(b_err[g_bank] | (pad_now & (pad_bank == g_bank))),
            ]
        with m.If(g_issue):
            with m.If(g_final):
                # The bank's tag rows are all read: the input may store the next block in it.
                m.d.sync += [g_j.eq(0), g_bank.eq(~g_bank), b_full[g_bank].eq(0)]
            with m.Else():
                m.d.sync += g_j.eq(g_j + 1)

        # D: the beat's tags (missing rows and lanes beyond n count as tag 0), lengths, offsets.
        row = Mux(p1_rowok, tag_rd.data, 0)
        tslice = row.word_select(p1_slot, 2 * lanes)
        p_tags = [Mux(~p1_final | (lane <= p1_lanes_m1), tslice[2 * lane:2 * lane + 2], 0) for lane in range(lanes)]
        p_off = [Const(0, 1)]
        for lane in range(1, lanes + 1):
            o = Signal(range(4 * lane + 1), name=f"next_offset{lane}")
            m.d.comb += o.eq(p_off[-1] + _code_length(p_tags[lane - 1]))
            p_off.append(o)
        p2_final = Signal()
        p2_lanes_m1 = Signal(range(lanes))
        p2_k = Signal(range(K_MAX + 1))
        p2_err = Signal()
        p2_tags = [Signal(2, name=f"p2_lane{lane}_tag") for lane in range(lanes)]
        p2_off = [Const(0, 1)] + [Signal(range(4 * lane + 1), name=f"p2_offset{lane}") for lane in range(1, lanes + 1)]
        with m.If(p2_adv):
            m.d.sync += [p2_valid.eq(p1_valid), p2_final.eq(p1_final), p2_lanes_m1.eq(p1_lanes_m1),
                         p2_k.eq(p1_k), p2_err.eq(p1_err)]
            m.d.sync += [p2_tags[lane].eq(p_tags[lane]) for lane in range(lanes)]
            m.d.sync += [p2_off[lane].eq(p_off[lane]) for lane in range(1, lanes + 1)]
        with m.If(d_free):
            m.d.sync += [d_valid.eq(p2_valid), d_final.eq(p2_final), d_lanes_m1.eq(p2_lanes_m1),
                         d_k.eq(p2_k), d_err.eq(p2_err)]
            m.d.sync += [d_tags[lane].eq(p2_tags[lane]) for lane in range(lanes)]
            m.d.sync += [d_off[lane].eq(p2_off[lane]) for lane in range(1, lanes + 1)]

        # The byte buffer and the beat's bytes.
        ubuf = Signal(2 * w)                 # code bytes of the current frame; bytes ≥ fill are 0
        fill = Signal(range(2 * nb + 1))
        # fill - d_need, kept in a register of its own (timing: "enough" is its sign bit, so the
        # beat's fire and the chunk's take do not wait for a compare of fill with d_need; its next
        # value is chosen among candidates computed in parallel, docs/architecture.md "Timing budgets").
        slack = Signal(range(-nb, 2 * nb + 1))
        ended = Signal()                     # the frame's last chunk has been taken
        err_acc = Signal()

        e_valid = Signal()
        o_valid = Signal()
        # The output register O has a skid register behind it (sk_*: a beat the output did not take
        # while the next one entered O), so O advances whenever the skid is empty: a register, not
        # the output's ready, decides whether the pipeline moves (timing: the ready of what follows
        # stays out of the byte buffer's loop). With ready held high the skid is never used.
        sk_valid = Signal()
        o_adv = ~sk_valid
        e_free = ~e_valid | o_adv
        enough = slack >= 0                  # fill >= d_need
        drain = Signal()    # the last beat has its bytes but the frame has not ended: drop extra bytes
        # Timing: everything below is computed twice from registers, for a beat that fires and for
        # one that does not; fire, the latest of the decisions, selects.
        fire_ok = Signal()                   # the beat fires if the E stage is free
        m.d.comb += [
            fire_ok.eq(d_valid & Mux(d_final, ended, enough | ended)),
            fire.eq(fire_ok & e_free),
            drain.eq(d_valid & d_final & ~ended & enough),
        ]
        done = Signal()
        m.d.comb += done.eq(fire & d_final)
        # Bytes staying in the buffer after this cycle: all but the beat's when it fires, none when
        # it takes all (a truncated frame) or the frame is done (the next frame's first chunk may
        # enter the emptied buffer in the same cycle). f_* assume the beat fires, n_* that it does not.
        f_empty = Signal()
        m.d.comb += f_empty.eq(d_final | ~enough)
        rem_fire = slack.as_unsigned()[:len(fill)]  # bytes staying when the beat fires and takes not all

        head = Signal(chunk)
        m.d.comb += head.eq(chunks.r_data)
        # A chunk is taken if it fits (at most nb bytes stay), or is dropped (drain), and belongs to
        # this frame (or this frame is done).
        f_take = Signal()
        n_take = Signal()
        m.d.comb += [
            f_take.eq(chunks.r_rdy & (~ended | d_final) & (drain | f_empty | (slack <= nb))),
            n_take.eq(chunks.r_rdy & ~ended & (drain | (fill <= nb))),
        ]
        take_chunk = Signal()
        m.d.comb += [
            take_chunk.eq(Mux(fire, f_take, n_take)),
            chunks.r_en.eq(take_chunk),
        ]
        f_push = f_take & ~drain
        n_push = n_take & ~drain

        # The byte buffer: the beat's bytes leave from the bottom, a chunk enters above the rest
        # (at most nb bytes stay when one enters; the shifts by each candidate run in parallel).
        # A chunk's bytes above its count are zero (the input stage masks the beat by its keep and
        # shifts the tag bytes out), so its data enters the buffer as it is.
        in_data = head.data
        f_kept = Signal(2 * w)
        f_in = Signal(2 * w)
        m.d.comb += [
            f_kept.eq(Mux(f_empty, 0, ubuf >> _bytes(d_need))),
            f_in.eq(Mux(f_empty, in_data, in_data << _bytes(rem_fire[:lb + 1]))),
        ]
        n_in = (in_data << _bytes(fill[:lb + 1]))[:2 * w]
        f_buf = Mux(f_push, f_kept | f_in, f_kept)
        n_buf = Mux(n_push, ubuf | n_in, ubuf)
        m.d.sync += ubuf.eq(Mux(fire, f_buf, n_buf))

        # fill and slack: every candidate is computed from registers (and the FIFO head, and the
        # next descriptor's byte count); fire and the pushes only select.
        count = head.count
        p_need = p2_off[-1]                  # bytes of the descriptor D takes when it is free (P2's)
        f_fill = Mux(f_push, Mux(f_empty, count, rem_fire + count), Mux(f_empty, 0, rem_fire))
        n_fill = Mux(n_push, fill + count, fill)
        m.d.sync += fill.eq(Mux(fire, f_fill, n_fill))

        def cand(name, value):
            sig = Signal(range(-2 * nb, 3 * nb + 1), name=f"slack_{name}")
            m.d.comb += sig.eq(value)
            return sig

        # D keeps its descriptor if it is valid and the beat does not fire, else takes the next one.
        f_slack = Mux(f_push,
                      Mux(f_empty, cand("empty_push", count - p_need), cand("fire_push", slack + count - p_need)),
                      Mux(f_empty, cand("empty", -p_need), cand("fire", slack - p_need)))
        n_slack = Mux(n_push, Mux(d_valid, cand("hold_push", slack + count), cand("keep_push", fill + count - p_need)),
                      Mux(d_valid, slack, cand("keep", fill - p_need)))
        m.d.sync += slack.eq(Mux(fire, f_slack, n_slack))

        # E: extract each lane's code from the window at its offset.
        window = ubuf[:w]
        e_zero = Signal(lanes)               # tag 0, or its code bytes are missing: +0.0
        e_raw = Signal(lanes)                # tag 3: the code is the value
        e_code = [Signal(32, name=f"lane{lane}_code") for lane in range(lanes)]
        e_q = [Signal(15, name=f"lane{lane}_q") for lane in range(lanes)]
        # q's leading zeros, counted as q is registered (timing, issue 16: the count is off the
        # decode stage, which then only shifts, subtracts and selects).
        e_lz = [Signal(range(16), name=f"lane{lane}_lz") for lane in range(lanes)]
        e_sign = Signal(lanes)
        e_base = Signal(8)                   # 141 - k: exponent field of q * 2**-k before normalisation
        e_keep = Signal(nb)
        e_last = Signal()
        e_err = Signal()
        with m.If(e_free):
            m.d.sync += e_valid.eq(fire)
        with m.If(fire):
            last_keep = _keep_mask(Cat(Const(0, 2), d_lanes_m1 + 1), nb)
            frame_err = err_acc | ~enough | (d_final & ((slack > 0) | d_err))
            m.d.sync += [
                e_base.eq(141 - d_k),
                e_keep.eq(Mux(d_final, last_keep, (1 << nb) - 1)),
                e_last.eq(d_final),
                e_err.eq(frame_err),
                err_acc.eq(frame_err),
            ]
            for lane in range(lanes):
                t = d_tags[lane]
                c = Signal(32, name=f"lane{lane}_window")
                m.d.comb += c.eq(window >> _bytes(d_off[lane]))
                one = t == 1
                q = Signal(15, name=f"lane{lane}_q_in")
                m.d.comb += q.eq(Mux(one, c[:7], c[:15]))
                m.d.sync += [
                    e_code[lane].eq(c),
                    e_q[lane].eq(q),
                    e_lz[lane].eq(_leading_zeros15(q)),
                    e_sign[lane].eq(Mux(one, c[7], c[15])),
                    e_zero[lane].eq((t == 0) | (d_off[lane + 1] > fill)),
                    e_raw[lane].eq(t == 3),
                ]

        # After the beat: the frame's end (which overrides err_acc), the chunk taken.
        with m.If(done):
            m.d.sync += [err_acc.eq(0), ended.eq(0)]
        with m.If(take_chunk):
            m.d.sync += ended.eq(head.last)
            with m.If(drain & (head.count != 0)):
                m.d.sync += err_acc.eq(1)

        # O: decode.
        o_beat = Signal(beat_layout(w))
        o_err = Signal()
        sk_beat = Signal(beat_layout(w))
        sk_err = Signal()
        m.d.comb += [
            self.o.valid.eq(o_valid | sk_valid),
            self.o.payload.eq(Mux(sk_valid, sk_beat, o_beat)),
            self.error.eq(Mux(sk_valid, sk_err, o_err)),
        ]
        with m.If(sk_valid):
            with m.If(self.o.ready):
                m.d.sync += sk_valid.eq(0)
        with m.Elif(o_valid & ~self.o.ready):
            m.d.sync += [sk_valid.eq(1), sk_beat.eq(o_beat), sk_err.eq(o_err)]
        values = []
        for lane in range(lanes):
            small = _decode_small(m, e_q[lane], e_sign[lane], e_base, f"lane{lane}", lz=e_lz[lane])
            values.append(Mux(e_zero[lane], 0, Mux(e_raw[lane], e_code[lane], small)))
        with m.If(o_adv):
            m.d.sync += [
                o_valid.eq(e_valid),
                o_beat.data.eq(Cat(*values)),
                o_beat.keep.eq(e_keep),
                o_beat.last.eq(e_last),
                o_err.eq(e_err),
            ]
        return m
