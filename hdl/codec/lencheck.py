"""Length check of compressed payloads as they pass (docs/codec.md "Payload layout").

A compressed payload of ``n`` elements is a tag block of ``8*ceil(n/32)`` bytes (2 bits per
element, zero padded) followed by ``n1 + 2*n2 + 4*n3`` code bytes (``n_t`` = elements with tag
``t``). :class:`CompressedLengthCheck` watches the beats of such payloads go by, without holding
them, and gives each frame's verdict (well formed or not) a fixed number of cycles after its last
beat: what a :class:`~wirereduce.hdl.codec.port.CodecIn` needs to forward a compressed frame
unchanged (cut-through) and still mark its last beat ``bad`` when the payload does not match
its tags. The rule is that of :func:`wirereduce.codec.decode`, which raises ``ValueError`` on
exactly the payloads this flags (for ``1 ≤ n ≤ max_elements``).
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from wirereduce.hdl.params import rejecting

from wirereduce.config import check_width

__all__ = ["CompressedLengthCheck"]

#: Adder levels of the per-beat sum between two registers (each about one LUT level with its carry
#: chain); the last group also takes the frame's accumulator (one more level).
_ADDS_PER_STAGE = 3

#: Code bytes of two tags (a nibble of the tag block) by the nibble's value: 0 … 8, four bits an
#: entry, entry ``x`` in bits ``4x … 4x+3``. A look-up (one LUT per result bit); a tag byte's code
#: bytes are the sum of its two nibbles'.
_NIB_TABLE = Const(sum(sum((0, 1, 2, 4)[(x >> (2 * t)) & 3] for t in range(2)) << (4 * x) for x in range(16)), 4 * 16)


def _log2(x: int) -> int:
    assert x > 0 and x & (x - 1) == 0, x
    return x.bit_length() - 1


def _any(bits) -> Signal | Const:
    """OR of a list of 1-bit values (0 for none)."""
    bits = list(bits)
    return Cat(*bits).any() if bits else Const(0, 1)


class CompressedLengthCheck(wiring.Component):
    """Checks each compressed payload's length against its tags, beat by beat, never stalling.

    The beats of compressed payloads (no wirereduce header: byte 0 of a frame's first beat is
    byte 0 of its tag block; byte ``j`` of a beat is ``data[8j : 8j+8]``) are presented on
    ``beat`` and taken when ``strobe`` is high, at up to one beat a cycle, with any gaps, frames
    back to back. ``n`` is the frame's ``hdr.count`` (the same on every beat). Exactly
    :attr:`latency` cycles after the strobe of a frame's last beat ``done`` pulses, once per
    frame and in frame order, with ``error`` = 1 if the frame is malformed:

    * ``n`` is 0 or above ``max_elements``;
    * its length in bytes is not ``8*ceil(n/32)`` plus the code bytes of its ``n`` tags, which
      includes a payload that ends inside its tag block (docs/codec.md "Payload layout");
    * a padding tag (elements ``n … 32*ceil(n/32) - 1``, all in the last 8-byte word of the tag
      block) is not zero;
    * a beat other than the last is not full (``keep`` not all ones), or a last beat's ``keep``
      is not a thermometer code (ones from byte 0 up; ``keep`` = 0, an empty beat, is one).

    ``beat.bad`` is not looked at (the caller combines it with the verdict).

    How: a beat counter gives each beat its place in the payload. In the cycle a beat is taken,
    each 8-byte word of it is classified against ``n`` (a tag word when ``32 * (its word index in
    the payload) < n``: a compare of ``n`` with the beat counter, no multiplier), each byte's
    code bytes (0 … 16, its two nibbles' looked up and added) and which of its tags are non-zero
    padding tags (slot ``≥ n mod 32``) are worked out; all this is registered (stage A). Stage B
    masks the code bytes of non-tag words to 0, starts an adder tree over the beat
    (:data:`_ADDS_PER_STAGE` levels a stage, registered; each add a carry chain), and works out
    the beat's own checks: padding in the last tag word, ``keep`` (by 8-byte groups), and the
    bytes received up to the end of the beat (``width/8`` times the beat index, plus the last
    beat's byte count read off its thermometer ``keep``). The tree's last stage adds the beat's
    sum to the frame's accumulator, kept in carry-save form (two words, one LUT level and no carry
    chain a beat; it starts at the tag block's ``8*ceil(n/32)`` bytes), and ORs the beat's checks
    into the frame's; one more stage compares the accumulator with the bytes received (a
    carry-save compare, again without a carry chain). Bytes of the last beat beyond its ``keep``
    may be counted as tags; they matter only when the tag block itself is cut short, which is an
    error either way (fewer bytes arrived than the tag block alone).

    Timing: :attr:`latency` is 4 cycles at 64 bit, 5 at 128 … 512 bit (6 at 1024): one input
    stage, ``ceil(log2(width/8) / 3)`` adder stages, two compare stages (6-bit groups, then their
    AND). The inputs reach the first registers through the compare of ``n`` with the beat
    counter, the nibble look-ups and one add, and the counter's increment. By the yosys estimate
    (synthesised alone, ``wirereduce resources --blocks lencheck64 lencheck512``): 5 LUT levels at 512 bit on
    xcup (its budget; the deepest are the input-side padding slots, which ABC maps deeper than their
    3-4 levels since they have slack against the tree's carry chains; the final compare, 6 levels in
    one stage, is split in two), 1,740 LUT and 941 FF; 6 levels at 64 bit on xc7 (budget 9), 313 LUT
    and 219 FF.

    Parameters
    ----------
    width : int
        Datapath width in bits (64 … 1024, a power of two: :func:`~wirereduce.config.check_width`).
    max_elements : int
        Most elements (``n``) a well-formed frame may have, 1 … 65535; sizes the beat counter and
        the accumulator.

    Attributes
    ----------
    latency : int
        Cycles from the strobe of a frame's last beat to its ``done`` pulse.
    beat : In(hdr_beat_layout(width))
        The beat (:func:`~wirereduce.hdl.codec.port.hdr_beat_layout`): ``data`` (``width``
        bits), ``keep`` (``width // 8`` bits, one per byte), ``last``, ``bad`` (ignored) and
        ``hdr`` (only ``hdr.count`` is used, the element count ``n``).
    strobe : In(1)
        A beat is taken this cycle (the caller's ``valid & ready``).
    done : Out(1)
        Pulses once per frame, :attr:`latency` cycles after the strobe of its last beat.
    error : Out(1)
        With ``done``: 1 if the frame is malformed (see above).

    Raises
    ------
    TypeError
        If ``width`` or ``max_elements`` is not an int.
    ValueError
        If ``width`` is not a valid datapath width or ``max_elements`` is not in 1 … 65535.
    """

    @staticmethod
    def latency_of(width: int) -> int:
        """:attr:`latency` of a check of ``width`` bits (cycles), without building one: one input
        stage, the adder stages, two compare stages."""
        return 3 + -(-_log2(check_width(width) // 8) // _ADDS_PER_STAGE)

    def __init__(self, width: int, max_elements: int):
        with rejecting(self):
            check_width(width)
            if isinstance(max_elements, bool) or not isinstance(max_elements, int):
                raise TypeError(f"max_elements must be an int, not {max_elements!r}")
            if not 1 <= max_elements <= 0xFFFF:
                raise ValueError(f"max_elements must be in 1..65535 (the header's 16-bit count), not {max_elements}")
        # Imported here: port.py imports this module at its top.
        from wirereduce.hdl.codec.port import hdr_beat_layout

        self.width = width
        self.max_elements = max_elements
        self._adds = _log2(width // 8)      # adder levels of a beat's sum (one leaf per byte)
        self.latency = self.latency_of(width)
        super().__init__({
            "beat": In(hdr_beat_layout(width)),
            "strobe": In(1),
            "done": Out(1),
            "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        maxn = self.max_elements
        nb = self.width // 8                # bytes a beat
        words = nb // 8                     # 8-byte (32-tag) words a beat
        lw = _log2(words)
        nw_max = -(-maxn // 32)             # tag words of the largest frame
        longest = 8 * nw_max + 4 * maxn     # bytes of the longest well-formed payload
        # Beat counter: its all-ones value, reached by a frame that is not over, is beyond the
        # longest well-formed payload (such a frame is flagged and the counter wraps).
        ib = (longest // nb + 2).bit_length()
        # The accumulator's largest value with n ≤ max_elements: the tag block plus 16 code
        # bytes per tag byte (padding tags counted as they come).
        acc_max = 8 * nw_max * 17

        def reg(value, name, **kw):
            """``value`` registered (a pipeline register: no reset unless given)."""
            s = Signal(value.shape() if hasattr(value, "shape") else 1, name=name,
                       reset_less=kw.get("reset_less", True), attrs=kw.get("attrs"))
            m.d.sync += s.eq(value)
            return s

        def add(a, b, name):
            """``a + b`` in a wire Yosys keeps: adds left as they are map to a carry chain each
            (one LUT level), where a merged multi-operand add becomes a deeper full-adder tree."""
            s = Signal(range(2 ** len(a) + 2 ** len(b) - 1), name=name, attrs={"keep": 1})
            m.d.comb += s.eq(a + b)
            return s

        b = self.beat
        n = b.hdr.count

        # ---- frame state: the index of the next beat in its frame, and that plus one ----------------
        idx = Signal(ib)
        idx1 = Signal(ib + 1, init=1)
        first = Signal(init=1)
        with m.If(self.strobe):
            m.d.sync += [
                idx.eq(Mux(b.last, 0, idx + 1)),
                idx1.eq(Mux(b.last, 1, idx1 + 1)),
                first.eq(b.last),
            ]

        # ---- stage A: from the inputs ---------------------------------------------------------------
        a_v = reg(self.strobe, "a_v", reset_less=False)
        a_last = reg(b.last, "a_last")
        a_first = reg(first, "a_first")
        a_keep = reg(b.keep, "a_keep")
        a_idx = reg(idx, "a_idx")
        a_idx1 = reg(idx1, "a_idx1")
        a_n = reg(n, "a_n")
        a_nw8 = reg(Cat(Const(0, 3), (n + 31)[5:]), "a_nw8")        # 8*ceil(n/32): tag block bytes
        r = n[:5]
        # Tag slot t of a word is padding in the last tag word when t >= n mod 32 > 0; a_pz: that
        # slot's tag is not zero.
        a_pz = reg(Cat(*((b.data[2 * t] | b.data[2 * t + 1]) & (r != 0) & (r <= t % 32) for t in range(4 * nb))),
                   "a_pz")
        a_code = [reg(add(_NIB_TABLE.word_select(b.data[8 * j:8 * j + 4], 4),
                          _NIB_TABLE.word_select(b.data[8 * j + 4:8 * j + 8], 4), f"code{j}"), f"a_code{j}")
                  for j in range(nb)]
        # Word w is a tag word when its first element, 32 * (idx * words + w) (wires, no adder),
        # is below n; a_tnext: the same for the word after the beat.
        a_tw = reg(Cat(*((Cat(Const(0, 5), Const(w, lw), idx) if lw else Cat(Const(0, 5), idx)) < n
                         for w in range(words))), "a_tw")
        a_tnext = reg(Cat(Const(0, 5 + lw), idx1) < n, "a_tnext")

        # ---- stage B: each word's code bytes; the beat's checks, first half --------------------------
        tnext = [a_tw[w + 1] for w in range(words - 1)] + [a_tnext]
        # Padding: a non-zero padding tag in the last tag word (a tag word followed by one that is not).
        pad = Cat(*(a_tw[w] & ~tnext[w] & a_pz[32 * w:32 * w + 32].any() for w in range(words)))
        # keep, by 8-byte group: all ones unless last; on the last beat a thermometer.
        kbad = Cat(*(_any(~a_keep[i] & (~a_last | (a_keep[i + 1] if i + 1 < nb else 0))
                          for i in range(8 * g, 8 * g + 8)) for g in range(words)))
        # The last beat's byte count mod 8 (a thermometer below full): bit k is set when the top
        # 1 sits at byte 8g + c - 1 of some group g with bit k of c set (c = 1 … 7); here per
        # group, ORed over the groups (full below it, empty above it) in the last adder stage.
        part = Cat(*(_any(a_keep[8 * g + c - 1] & ~a_keep[8 * g + c] for c in range(1, 8) if c >> k & 1)
                     for g in range(words) for k in range(3)))
        side = {
            "v": a_v, "last": a_last, "first": a_first, "nw8": a_nw8,
            "full": Cat(*(a_keep[8 * g + 7] for g in range(words))),   # groups with their top byte
            "part": part,
            "rbeats": Mux(a_keep[nb - 1], a_idx1, a_idx),               # whole beats received
            "nbad": (a_n == 0) | (a_n > maxn),
            "kbad": kbad,
            "ovf": a_idx.all() & ~a_last,
            "pad": pad,
        }
        vals = [Mux(a_tw[j // 8], a_code[j], 0) for j in range(nb)]

        # Adder tree over the beat, registered every _ADDS_PER_STAGE levels; the last group goes
        # on into the accumulator in the same stage.
        left = self._adds
        stage = 0
        while True:
            for _ in range(min(_ADDS_PER_STAGE, left)):
                vals = [add(vals[i], vals[i + 1], f"t{stage}_add{len(vals)}_{i // 2}") for i in range(0, len(vals), 2)]
                left -= 1
            if left == 0:
                break
            stage += 1
            vals = [reg(v, f"t{stage}_sum{i}") for i, v in enumerate(vals)]
            side = {key: reg(v, f"t{stage}_{key}", reset_less=key != "v") for key, v in side.items()}
        bsum = vals[0]

        # ---- last adder stage: the frame's accumulator; the beat's checks, second half ---------------
        # Whole 8-byte groups of the last beat below the partial one (a thermometer of group tops).
        full = side["full"]
        groups = Cat(*(_any(full[g - 1] & ~full[g] for g in range(1, words) if g >> k & 1) for k in range(lw)))
        part = side["part"]
        part = Cat(*(_any(part[3 * g + k] for g in range(words)) for k in range(3)))
        rcv = Cat(part, groups, side["rbeats"])                        # bytes received
        # The accumulator in carry-save form (acc_s + acc_c, modulo 2**wc: no value reaches it),
        # so its update is one LUT level and no carry chain: (acc_s, acc_c) + bsum, or
        # 8*ceil(n/32) + bsum on a frame's first beat.
        wc = max(acc_max.bit_length(), len(rcv)) + 1
        acc_s = Signal(wc)
        acc_c = Signal(wc)
        base_s = Mux(side["first"], side["nw8"], acc_s)
        base_c = Mux(side["first"], 0, acc_c)
        sum_s = (base_s ^ base_c ^ bsum)[:wc]
        sum_c = Cat(Const(0, 1), (base_s & base_c) | (base_s & bsum) | (base_c & bsum))[:wc]
        ferr = Signal()
        ferr_now = (~side["first"] & ferr) | side["kbad"].any() | side["ovf"] | side["pad"].any()
        with m.If(side["v"]):
            m.d.sync += [acc_s.eq(sum_s), acc_c.eq(sum_c), ferr.eq(ferr_now)]
        f_done = reg(side["v"] & side["last"], "f_done", reset_less=False)
        f_s = reg(sum_s, "f_s")
        f_c = reg(sum_c, "f_c")
        f_nrcv = reg(~rcv.as_unsigned()[:wc] if len(rcv) >= wc else ~Cat(rcv, Const(0, wc - len(rcv))), "f_nrcv")
        f_err = reg(ferr_now | side["nbad"], "f_err")

        # ---- compare: f_s + f_c == rcv, i.e. f_s + f_c + ~rcv is all ones (mod 2**wc), without a
        # carry chain: with x, y the carry-save sum of the three, x + y is all ones exactly when
        # x ^ y is (then x & y = 0).
        x = f_s ^ f_c ^ f_nrcv
        y = Cat(Const(0, 1), (f_s & f_c) | (f_s & f_nrcv) | (f_c & f_nrcv))[:wc]
        # ``x ^ y`` all ones, by groups of 6 bits into registers, then their AND (timing: the AND of
        # all of them behind the carry-save terms was 6 levels at 512 bit on xcup, budget 5)
        xy = x ^ y
        groups = reg(Cat(*(xy[i:i + 6].all() for i in range(0, wc, 6))), "f_groups")
        g_done = reg(f_done, "g_done", reset_less=False)
        g_err = reg(f_err, "g_err")
        m.d.sync += [
            self.done.eq(g_done),
            self.error.eq(g_err | ~groups.all()),
        ]
        return m
