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
(docs/architecture.md "Timing budgets"): the compressor has 7. The decompressor (16) is not yet. The 512-bit
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

    Attributes
    ----------
    i : In(stream.Signature(chunk_layout(width)))
        Chunks. ``count`` bytes of ``data`` are used (bytes above them are ignored).
    o : Out(FrameStream(width))
        Packed beats. ``valid`` is registered (depends on the buffer fill only); ``i.ready``
        depends combinationally on ``o.ready``.
    error : Out(1)
        The ``error`` bit of the frame's ``last`` chunk, valid with ``o.payload.last``.

    Raises
    ------
    TypeError, ValueError
        If ``width`` is not a valid datapath width (see :func:`~wirereduce.hdl.stream.frame.check_width`).
    """

    def __init__(self, width: int):
        with rejecting(self):
            check_width(width)
        self.width = width
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
        m.d.comb += [
            self.o.valid.eq(have_beat | flush),
            self.o.payload.data.eq(buf[:w]),
            self.o.payload.keep.eq(Mux(have_beat, (1 << nb) - 1, _keep_mask(fill, nb))),
            self.o.payload.last.eq(o_last),
            self.error.eq(err),
            # A chunk fits if at most B bytes stay after this cycle's beat leaves.
            self.i.ready.eq(Mux(flush, o_last & self.o.ready, ~have_beat | self.o.ready)),
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
        m.d.comb += incoming.eq(chunk.data & _byte_mask(chunk.count, nb))
        with m.If(i_fire):
            m.d.sync += [
                buf.eq(rem_buf | (incoming << _bytes(rem[:lb]))[:2 * w]),
                fill.eq(rem + chunk.count),
                flush.eq(chunk.last),
                err.eq(chunk.error),
            ]
        with m.Else():
            m.d.sync += [buf.eq(rem_buf), fill.eq(rem)]
            with m.If(o_fire & o_last):
                m.d.sync += flush.eq(0)
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


def _decode_small(m: Module, q, sign, k, name: str):
    """fp32 bits of ``(-1)**sign * q * 2**-k`` for a 15-bit ``q`` (exact; ``q = 0`` gives ±0)."""
    lz = Signal(range(16), name=f"{name}_lz")
    # Highest set bit wins: scan upwards so later (higher) bits override.
    lz_expr = Const(15, 4)
    for p in range(15):
        lz_expr = Mux(q[p], 14 - p, lz_expr)
    m.d.comb += lz.eq(lz_expr)
    norm = Signal(15, name=f"{name}_norm")
    m.d.comb += norm.eq(q << lz)
    exp = (141 - lz - k)[:8]
    out = Signal(32, name=f"{name}_val")
    m.d.comb += out.eq(Mux(q == 0, Cat(Const(0, 31), sign), Cat(Const(0, 9), norm[:14], exp, sign)))
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
    buffers are double (ping-pong), so the next frame is taken in while the previous one is
    sent; the beats of a frame wait in the two input stages while their bank is still being sent.

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
    * **Size**: two tag rows of ``width`` bits per 16 input beats and two code rows per input beat
      of ``max_elements`` values (two frames), plus two :class:`BytePacker`.

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
        If ``width`` is not a valid datapath width or ``max_elements`` is not in 1 … 65535.
    """

    def __init__(self, width: int, max_elements: int):
        _check_args(self, width, max_elements)
        self.width = width
        self.max_elements = max_elements
        self.lanes = width // 32
        super().__init__({
            "i": In(FrameStream(width)),
            "k": In(8),
            "o": Out(FrameStream(width)),
            "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        w, lanes, maxn = self.width, self.lanes, self.max_elements
        nb = w // 8
        units = nb // 8  # 8-byte tag units per beat
        max_beats = _cdiv(maxn, lanes)
        tag_rows = _cdiv(max_beats, 16)  # per bank; a row holds the tags of 16 input beats
        code_rows = max_beats            # per bank; 4 bytes per value at most

        m.submodules.pack_codes = pack_in = BytePacker(w)
        m.submodules.pack_out = pack_out = BytePacker(w)
        m.submodules.tag_mem = tag_mem = memory.Memory(shape=w, depth=2 * tag_rows, init=[])
        m.submodules.code_mem = code_mem = memory.Memory(shape=w, depth=2 * code_rows, init=[])
        tag_wr, code_wr = tag_mem.write_port(), code_mem.write_port()
        tag_rd, code_rd = tag_mem.read_port(), code_mem.read_port()

        k = _clamp_k(m, self.k, "k_clamped")

        # Bank b is busy from the input's last beat of a frame until the reader has issued the
        # frame's last row, and full from the cycle its codes are all written until then.
        busy = Signal(2)
        busy_set = Signal(2)
        full = Signal(2)
        full_set = Signal(2)
        full_clr = Signal(2)
        m.d.sync += [busy.eq((busy | busy_set) & ~full_clr), full.eq((full | full_set) & ~full_clr)]
        meta_n = Array(Signal(range(maxn + 1), name=f"n{b}") for b in range(2))
        meta_c = Array(Signal(range(4 * maxn + 1), name=f"code_bytes{b}") for b in range(2))
        meta_err = Array(Signal(name=f"err{b}") for b in range(2))

        # ------------------------------------------------------------------------------------
        # Input, in three registered stages (each takes a beat when the next one can):
        #   A  the beat, which lanes hold values, and k as the thresholds of the tag compares;
        #   B  per lane the tag, the code and its length in bytes;
        #   s1 the beat's codes compacted into one chunk for the packer; the tags collect.
        # ------------------------------------------------------------------------------------
        beat = self.i.payload
        wr_bank = Signal()
        index = Signal(range(max_beats + 1))      # beat of the frame, saturating at max_beats

        s1_valid = Signal()
        s1 = Signal(chunk_layout(w))
        m.d.comb += [pack_in.i.valid.eq(s1_valid), pack_in.i.payload.eq(s1)]
        s1_free = Signal()
        m.d.comb += s1_free.eq(~s1_valid | pack_in.i.ready)
        b_valid = Signal()
        b_bank = Signal()
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
        a_bank = Signal()
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
                m.d.sync += [index.eq(0), wr_bank.eq(~wr_bank)]
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
            tag_wr.addr.eq(Mux(b_bank, tag_rows, 0) + b_index[4:]),
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
        cw_bank = Signal()
        cw_addr = Signal(range(code_rows + 1))
        m.d.comb += [
            pack_in.o.ready.eq(1),
            code_wr.addr.eq(Mux(cw_bank, code_rows, 0) + cw_addr),
            code_wr.data.eq(pack_in.o.payload.data),
            code_wr.en.eq(pack_in.o.valid & pack_in.o.payload.keep[0]),
        ]
        with m.If(pack_in.o.valid):
            with m.If(pack_in.o.payload.last):
                m.d.sync += [cw_addr.eq(0), cw_bank.eq(~cw_bank)]
                m.d.comb += full_set.bit_select(cw_bank, 1).eq(1)
            with m.Else():
                m.d.sync += cw_addr.eq(cw_addr + 1)

        # ------------------------------------------------------------------------------------
        # Output: read the tag rows then the code rows of a full bank into the output packer.
        # ------------------------------------------------------------------------------------
        rd_bank = Signal()
        rd_tags = Signal(init=1)
        rd_idx = Signal(range(max(tag_rows, code_rows) + 1))
        # Per bank, from its metadata (registered: written at the frame's last beat in stage B,
        # read only once the bank is full, at least three cycles later): the last tag beat, the
        # tag bytes in it, the last code beat, the code bytes in it, whether there are codes.
        d_tag_last = Array(Signal(range(tag_rows * 16 + 1), name=f"tag_last{b}") for b in range(2))
        d_tag_tail = Array(Signal(range(nb + 1), name=f"tag_tail{b}") for b in range(2))
        d_code_last = Array(Signal(range(code_rows + 1), name=f"code_last{b}") for b in range(2))
        d_code_tail = Array(Signal(range(nb + 1), name=f"code_tail{b}") for b in range(2))
        d_no_codes = Array(Signal(name=f"no_codes{b}") for b in range(2))
        for b in range(2):
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
        advance = Signal()
        m.d.comb += [
            advance.eq(~r1_valid | pack_out.i.ready),
            tag_rd.addr.eq(Mux(rd_bank, tag_rows, 0) + rd_idx),
            code_rd.addr.eq(Mux(rd_bank, code_rows, 0) + rd_idx),
            tag_rd.en.eq(advance),
            code_rd.en.eq(advance),
            pack_out.i.valid.eq(r1_valid),
            pack_out.i.payload.data.eq(Mux(r1_tags, tag_rd.data, code_rd.data)),
            pack_out.i.payload.count.eq(r1_count),
            pack_out.i.payload.last.eq(r1_last),
            pack_out.i.payload.error.eq(r1_err),
        ]
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
            m.d.sync += [rd_idx.eq(0), rd_tags.eq(1), rd_bank.eq(~rd_bank)]
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

    The tag block is stored first (a ping-pong buffer, one row per input beat). The codes that
    follow enter a ``2*width``-bit byte buffer; for each output beat the tags of its
    ``width/32`` values give their code lengths, each lane picks its code at the running byte
    offset, decodes it, and the beat consumes the sum of the lengths. Up to ``width/8`` code
    bytes enter and leave the buffer per cycle, so one output beat per cycle is sustained even
    when every value is raw. Code chunks wait in a small FIFO (:attr:`fifo_depth` entries, a tag
    block's worth of beats plus 4), so the input runs ahead and stores the next frame's tag
    block in the other bank while the current frame's values still leave.

    Timing (``valid`` and ``ready`` held high; measured and asserted in
    ``tests/test_codec_hdl.py``):

    * **Latency**: an output beat is taken 3 cycles after the input beat that completes its code
      bytes, 4 when a frame's first beat needs bytes of two input beats (512 bit, tag block
      ending mid-beat); the frame's whole tag block must have arrived before its first beat.
    * **Throughput**: one output beat per cycle once codes are available. Back to back a frame
      costs ``max(input beats, output beats)`` plus at most 2 cycles: at 64 bit frames of 33,
      100 and 371 values leave with no idle output cycle; at 512 bit a frame whose tag block ends
      mid-beat may cost one more cycle (24.9 cycles for 24 output beats at 371 values, 7.7 for 7
      at 100). A frame of one input beat takes 1.5 cycles (512 bit).
    * **Size**: two tag rows of ``width`` bits per 16 output beats of ``max_elements`` values, a
      ``2*width``-bit byte buffer and the chunk FIFO.

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
        Compressed payloads. ``i.ready`` depends combinationally on ``i.payload`` (``keep`` and
        ``last``: whether the beat carries code bytes) and on ``o.ready``.
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
        units = nb // 8
        ll = _log2(lanes)
        tag_rows = _cdiv(8 * _cdiv(maxn, 32), nb)  # input beats holding tags, per bank
        max_out = _cdiv(maxn, lanes)

        m.submodules.tag_mem = tag_mem = memory.Memory(shape=w, depth=2 * tag_rows, init=[])
        tag_wr = tag_mem.write_port()
        tag_rd = tag_mem.read_port(transparent_for=(tag_wr,))
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
        # Input side: tag bytes to the tag buffer, code bytes (and every frame's end) to the FIFO.
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
        cur_n = Signal(range(maxn + 1))
        m.d.comb += cur_n.eq(Mux(first, n_port, b_n[in_bank]))

        t_units = Signal(range(_cdiv(maxn, 32) + 1))   # 8-byte units of the tag block
        t_beats = Signal(range(tag_rows + 1))          # beats holding tag bytes
        t_tail_unit = Signal(range(units))             # unit of the block's last 8 bytes in its last beat
        t_tail = Signal(range(nb + 1))                 # tag bytes in the last tag beat
        m.d.comb += [
            t_units.eq((cur_n + 31) >> 5),
            t_beats.eq((t_units + units - 1) >> _log2(units)),
        ]
        if units == 1:
            m.d.comb += t_tail.eq(8)
        else:
            m.d.comb += [t_tail_unit.eq((t_units - 1)[:_log2(units)]), t_tail.eq(_bytes(t_tail_unit + 1))]

        in_tags = index < t_beats
        tag_end = index == t_beats - 1
        kept = Signal(range(nb + 1))
        m.d.comb += kept.eq(sum(beat.keep[b] for b in range(nb)))
        tag_bytes = Signal(range(nb + 1))
        m.d.comb += tag_bytes.eq(Mux(tag_end, t_tail, Mux(in_tags, nb, 0)))
        code_count = Signal(range(nb + 1))
        m.d.comb += code_count.eq(Mux(kept > tag_bytes, kept - tag_bytes, 0))
        kept_data = Signal(w)
        m.d.comb += kept_data.eq(beat.data & _byte_mask(kept, nb))

        # Padding check: bits 2*(n % 32) … 63 of the block's last 8-byte unit must be zero.
        pad = Signal(64)
        last_unit = kept_data[:64] if units == 1 else kept_data.word_select(t_tail_unit, 64)
        m.d.comb += pad.eq(last_unit >> Cat(Const(0, 1), cur_n[:5]))
        pad_err = tag_end & (cur_n[:5] != 0) & (pad != 0)
        # The payload ends before its tag block does.
        tags_cut = beat.last & in_tags & (~tag_end | (kept < t_tail))

        needs_push = (code_count != 0) | beat.last
        tag_ok = ~in_tags | ~b_full[in_bank]
        m.d.comb += self.i.ready.eq(tag_ok & (~needs_push | chunks.w_rdy))
        i_fire = self.i.valid & self.i.ready

        w_chunk = Signal(chunk)
        m.d.comb += [
            w_chunk.data.eq(kept_data >> _bytes(tag_bytes)),
            w_chunk.count.eq(code_count),
            w_chunk.last.eq(beat.last),
            chunks.w_data.eq(w_chunk.as_value()),
            chunks.w_en.eq(i_fire & needs_push),
            tag_wr.addr.eq(Mux(in_bank, tag_rows, 0) + index),
            tag_wr.data.eq(kept_data),
            tag_wr.en.eq(i_fire & in_tags),
        ]
        with m.If(i_fire):
            err_now = (first & n_bad) | pad_err | tags_cut
            m.d.sync += b_err[in_bank].eq(Mux(first, 0, b_err[in_bank]) | err_now)
            with m.If(first):
                m.d.sync += [b_n[in_bank].eq(n_port), b_k[in_bank].eq(k_port)]
            with m.If(in_tags & (tag_end | beat.last)):
                m.d.sync += [b_full[in_bank].eq(1), b_rows[in_bank].eq(index + 1)]
            with m.If(beat.last):
                m.d.sync += [index.eq(0), in_bank.eq(~in_bank)]
            with m.Else():
                m.d.sync += index.eq(Mux(index == tag_rows, index, index + 1))

        # ------------------------------------------------------------------------------------
        # Output side: one beat of ``lanes`` values per cycle from the byte buffer.
        # ------------------------------------------------------------------------------------
        ubuf = Signal(2 * w)                 # code bytes of the current frame; bytes ≥ fill are 0
        fill = Signal(range(2 * nb + 1))
        out_bank = Signal()
        j = Signal(range(max_out))           # output beat of the frame
        ended = Signal()                     # the frame's last chunk has been taken
        err_acc = Signal()

        on = b_full[out_bank]
        n_o = b_n[out_bank]
        k_o = Signal(range(K_MAX + 1))
        m.d.comb += k_o.eq(b_k[out_bank])
        out_beats_m1 = Signal(range(max_out))
        last_lanes_m1 = Signal(range(lanes))
        m.d.comb += [out_beats_m1.eq((n_o - 1) >> ll), last_lanes_m1.eq((n_o - 1)[:ll])]
        is_final = j == out_beats_m1

        row = Signal(w)
        m.d.comb += row.eq(Mux((j >> 4) < b_rows[out_bank], tag_rd.data, 0))
        tslice = row.word_select(j[:4], 2 * lanes)
        tags, lengths = [], []
        for lane in range(lanes):
            t = Signal(2, name=f"lane{lane}_tag")
            m.d.comb += t.eq(Mux(~is_final | (lane <= last_lanes_m1), tslice[2 * lane:2 * lane + 2], 0))
            ln = Signal(3, name=f"lane{lane}_len")
            m.d.comb += ln.eq(_code_length(t))
            tags.append(t)
            lengths.append(ln)
        offsets = [Const(0, 1)]
        for lane in range(1, lanes + 1):
            o = Signal(range(4 * lane + 1), name=f"offset{lane}")
            m.d.comb += o.eq(offsets[-1] + lengths[lane - 1])
            offsets.append(o)
        need = offsets[-1]

        o_valid = Signal()
        o_beat = Signal(beat_layout(w))
        o_err = Signal()
        m.d.comb += [self.o.valid.eq(o_valid), self.o.payload.eq(o_beat), self.error.eq(o_err)]
        slot_free = ~o_valid | self.o.ready
        enough = fill >= need
        fire = Signal()
        drain = Signal()    # the last beat has its bytes but the frame has not ended: drop extra bytes
        m.d.comb += [
            fire.eq(on & slot_free & Mux(is_final, ended, enough | ended)),
            drain.eq(on & is_final & ~ended & enough),
        ]
        take = Signal(range(nb + 1))
        m.d.comb += take.eq(Mux(fire, Mux(enough, need, fill), 0))
        done = fire & is_final
        # Bytes staying in the buffer after this cycle (none when the frame is done: the next
        # frame's first chunk may enter the emptied buffer in the same cycle).
        rem = Signal(range(2 * nb + 1))
        m.d.comb += rem.eq(Mux(done, 0, fill - take))

        head = Signal(chunk)
        m.d.comb += head.eq(chunks.r_data)
        take_chunk = Signal()
        m.d.comb += [
            take_chunk.eq(chunks.r_rdy & (~ended | done) & (drain | (rem <= nb))),
            chunks.r_en.eq(take_chunk),
        ]
        push = take_chunk & ~drain

        # Decode each lane from the window at its offset.
        window = ubuf[:w]
        values = []
        for lane in range(lanes):
            t = tags[lane]
            c = Signal(32, name=f"lane{lane}_code")
            m.d.comb += c.eq(window >> _bytes(offsets[lane]))
            complete = offsets[lane + 1] <= fill
            one = t == 1
            q = Signal(15, name=f"lane{lane}_q")
            m.d.comb += q.eq(Mux(one, c[:7], c[:15]))
            sign = Mux(one, c[7], c[15])
            small = _decode_small(m, q, sign, k_o, f"lane{lane}")
            v = Signal(32, name=f"lane{lane}_value")
            m.d.comb += v.eq(Mux((t == 0) | ~complete, 0, Mux(t == 3, c, small)))
            values.append(v)

        with m.If(o_valid & self.o.ready):
            m.d.sync += o_valid.eq(0)
        with m.If(fire):
            last_keep = _keep_mask(Cat(Const(0, 2), last_lanes_m1 + 1), nb)
            frame_err = err_acc | ~enough | (is_final & ((fill > need) | b_err[out_bank]))
            m.d.sync += [
                o_valid.eq(1),
                o_beat.data.eq(Cat(*values)),
                o_beat.keep.eq(Mux(is_final, last_keep, (1 << nb) - 1)),
                o_beat.last.eq(is_final),
                o_err.eq(frame_err),
                err_acc.eq(frame_err),
                j.eq(j + 1),
            ]
        with m.If(done):
            m.d.sync += [j.eq(0), err_acc.eq(0), ended.eq(0), out_bank.eq(~out_bank), b_full[out_bank].eq(0)]
        with m.If(take_chunk):
            m.d.sync += ended.eq(head.last)
            with m.If(drain & (head.count != 0)):
                m.d.sync += err_acc.eq(1)

        # Tag rows are read one cycle ahead: the address is that of the next cycle's beat.
        j_next = Mux(done, 0, Mux(fire, j + 1, j))
        bank_next = out_bank ^ done
        m.d.comb += tag_rd.addr.eq(Mux(bank_next, tag_rows, 0) + (j_next >> 4))

        # The byte buffer: the beat's bytes leave from the bottom, a chunk enters above the rest.
        kept_bytes = Signal(2 * w)
        m.d.comb += kept_bytes.eq(Mux(done, 0, ubuf >> _bytes(take)))
        with m.If(push):
            incoming = (head.data & _byte_mask(head.count, nb)) << _bytes(rem)
            m.d.sync += [ubuf.eq(kept_bytes | incoming[:2 * w]), fill.eq(rem + head.count)]
        with m.Else():
            m.d.sync += [ubuf.eq(kept_bytes), fill.eq(rem)]
        return m
