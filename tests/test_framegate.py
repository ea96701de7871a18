"""Block tests of :class:`~wirereduce.hdl.stream.frame.FrameGate`'s length check in amaranth.sim,
at every width whose header takes two beats (64 bit) or one (128, 512 bit).

The expected output of every frame comes from a model written from the rule in the class
docstring and docs/protocol.md "Drop rules", beat by beat: a frame leaves unchanged when its
length is what its header says; a short one leaves whole with its last beat marked ``bad``; a
long one (or one with a partial beat before its last) is cut at its expected last byte (or at
that beat), the cut beat marked ``bad`` and the rest dropped; every mismatch pulses
``length_error``, or ``oversize`` when the frame was longer than the MTU. Runts (shorter than a
header) are dropped by the parent. Frames come back to back, with and without back-pressure.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from amaranth import Module, Mux
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from test_codec_hdl import Received, sink, source
from wirereduce.hdl.stream.frame import FrameGate, FrameStream, decode_expect, expect_layout

from wirereduce.protocol import HEADER_BYTES, Header, Opcode

MTU = 256


class _Gate(wiring.Component):
    """A FrameGate whose parent accepts every frame with a whole header, expecting 16 + 4·count
    bytes, and drops runts. ``raw_ok``: ``head_raw``/``head_raw_short`` are ``head``/``head_short``
    and ``head_raw_valid`` is high (or ``head_valid`` is low), and ``head_read`` only with ``head_valid``."""

    def __init__(self, width, decoded=False, open_hop=None):
        self._w = width
        self._decoded = decoded
        self._open_hop = open_hop   # frames with this ``hop`` are given the MTU as an open bound
        super().__init__({"i": In(FrameStream(width)), "o": Out(FrameStream(width)),
                          "length_error": Out(1), "oversize": Out(1), "raw_ok": Out(1)})

    def elaborate(self, platform):
        m = Module()
        nb = self._w // 8
        m.submodules.gate = gate = FrameGate(self._w, -(-MTU // nb) + 1, check_length=True, max_bytes=MTU,
                                             expect_decoded=self._decoded)
        wiring.connect(m, wiring.flipped(self.i), gate.i)
        eb = HEADER_BYTES + 4 * gate.head.count
        if self._open_hop is not None:
            is_open = gate.head.hop == self._open_hop
            eb = Mux(is_open, MTU, eb)
            m.d.comb += gate.expect_open.eq(is_open)
        m.d.comb += [
            gate.accept.eq(gate.head_valid & ~gate.head_short),
            gate.drop.eq(gate.head_valid & gate.head_short),
            gate.expect.eq(decode_expect(m, eb, self._w)) if self._decoded else gate.expect_bytes.eq(eb),
            self.o.valid.eq(gate.o.valid), gate.o.ready.eq(self.o.ready),
            self.o.payload.data.eq(gate.o.payload.data), self.o.payload.keep.eq(gate.o.payload.keep),
            self.o.payload.last.eq(gate.o.payload.last), self.o.payload.bad.eq(gate.o.payload.bad),
            self.length_error.eq(gate.length_error), self.oversize.eq(gate.oversize),
            # head_raw_valid is up whenever head_valid is, and a header is read only while it shows
            self.raw_ok.eq((~gate.head_valid | ((gate.head_raw.as_value() == gate.head.as_value())
                                                & (gate.head_raw_short == gate.head_short)
                                                & gate.head_raw_valid))
                           & (~gate.head_read | gate.head_valid)),
        ]
        return m


def beats_of(data: bytes, nb: int, short_beat: int | None = None):
    """Beats of ``data``, ``nb`` bytes each; ``short_beat``: that beat (not the last) carries only
    half its bytes (a partial ``keep`` before the end), the rest of the frame follows it."""
    beats, pos, i = [], 0, 0
    while pos < len(data):
        take = nb // 2 if i == short_beat else nb
        chunk = data[pos:pos + take]
        pos += len(chunk)
        beats.append({"data": int.from_bytes(chunk, "little"), "keep": (1 << len(chunk)) - 1,
                      "last": int(pos >= len(data)), "bad": 0})
        i += 1
    return beats


def model(beats, expect: int, nb: int):
    """What leaves the gate for one accepted frame: (bytes, bad, pulse) with pulse None,
    "length_error" or "oversize"; from the rule in FrameGate's docstring."""
    last_idx = (expect - 1) // nb
    exp_cnt = expect - last_idx * nb
    out = b""
    for i, b in enumerate(beats):
        cnt = bin(b["keep"]).count("1")
        at_end = i == last_idx
        raw = b["data"].to_bytes(nb, "little")
        out += raw[:min(cnt, exp_cnt) if at_end else cnt]
        if b["last"]:
            bad = not (at_end and b["keep"] == (1 << exp_cnt) - 1)
            return out, int(bad), "length_error" if bad else None
        if at_end or b["keep"] != (1 << nb) - 1:
            # Cut off: its length counts whole beats up to the last one, and the last one's bytes.
            total = (len(beats) - 1) * nb + bin(beats[-1]["keep"]).count("1")
            return out, 1, "oversize" if total > MTU else "length_error"
    raise AssertionError("a frame without a last beat")


def cases(width, rng):
    """(beats, expected output or None for a runt) for a mix of lengths around the header's."""
    nb = width // 8
    out = []
    max_count = (MTU - HEADER_BYTES) // 4
    counts = sorted({0, 1, 2, 3, nb // 4, nb // 4 + 1, 2 * nb // 4, max_count - 1, max_count})
    for i, n in enumerate(counts):
        hdr = Header(opcode=Opcode.REDUCE, count=n, seq=i).pack()
        body = rng.bytes(4 * n)
        expect = HEADER_BYTES + 4 * n
        variants = [hdr + body, hdr + body[:-1], hdr + body[:-4], hdr + body + b"\x01",
                    hdr + body + rng.bytes(4), hdr + body + rng.bytes(nb), hdr[:15],
                    hdr + body + rng.bytes(MTU)]
        for data in variants:
            beats = beats_of(data, nb)
            out.append((beats, None if len(data) < HEADER_BYTES else model(beats, expect, nb)))
        # A partial beat before the last one: cut there.
        data = hdr + body + rng.bytes(nb)
        beats = beats_of(data, nb, short_beat=len(data) // nb // 2 + 1)
        if len(beats) > 2 and beats[-1]["last"]:
            out.append((beats, model(beats, expect, nb)))
    out.append((beats_of(b"\x01\x03\x00", nb), None))  # a runt
    return out


def _run_and_check(dut, todo, width, pressure):
    """Run ``dut`` (a :class:`_Gate`) on ``todo`` ((beats, expected output or None for a runt) pairs),
    with back-pressure on both sides if ``pressure``; check every frame that leaves, its mark and the
    order of the ``length_error``/``oversize`` pulses against the expected outputs."""
    want = [w for _, w in todo if w is not None]
    rec = Received()
    pulses = []

    async def count(ctx):
        async for _, _, le, ov, raw_ok in ctx.tick().sample(dut.length_error, dut.oversize, dut.raw_ok):
            assert not (le and ov)
            assert raw_ok, "head_raw differs from head while head_valid"
            if le or ov:
                pulses.append("length_error" if le else "oversize")

    vp, rp = (0.7, 0.6) if pressure else (1.0, 1.0)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(source(dut.i, [b for b, _ in todo], valid_prob=vp, seed=width))
    sim.add_testbench(sink(dut.o, len(want), width, rec, error=dut.o.payload.bad, ready_prob=rp, seed=width + 1))
    sim.add_process(count)
    sim.run()
    assert len(rec.frames) == len(want)
    for k, (got, bad, (exp, exp_bad, _)) in enumerate(zip(rec.frames, rec.errors, want)):
        assert got == exp, f"frame {k}: {len(got)} bytes out, want {len(exp)}"
        assert bad == exp_bad, f"frame {k}: bad {bad}, want {exp_bad}"
    assert pulses == [p for _, _, p in want if p]


@pytest.mark.parametrize("width", [64, 128, 512])
@pytest.mark.parametrize("pressure", [False, True])
@pytest.mark.parametrize("decoded", [False, True], ids=["expect_bytes", "expect_decoded"])
def test_length_check_every_case(width, pressure, decoded):
    rng = np.random.default_rng(width + pressure)
    todo = cases(width, rng)
    rng.shuffle(todo)
    # End on a good frame, so the last cut-off frame's pulse (at its end) is seen.
    good = beats_of(Header(opcode=Opcode.REDUCE, count=1, seq=99).pack() + bytes(4), width // 8)
    todo.append((good, model(good, HEADER_BYTES + 4, width // 8)))
    _run_and_check(_Gate(width, decoded), todo, width, pressure)


def _holed(data: bytes, nb: int, rng, where: str):
    """Beats of ``data`` whose ``keep`` is not a thermometer code on one beat (``where``: "last" or
    "middle"): one kept lane below the top one cleared, or a lane above the top one set. The data
    bytes are the frame's in every lane."""
    beats = beats_of(data, nb)
    k = len(beats) - 1 if where == "last" else len(beats) // 2
    keep = beats[k]["keep"]
    top = keep.bit_length()
    if top >= 2 and rng.random() < 0.5:
        keep &= ~(1 << int(rng.integers(0, top - 1)))      # a hole below the top kept lane
    elif top < nb:
        keep |= 1 << int(rng.integers(top, nb))            # a kept lane past a dropped one
    else:
        keep &= ~(1 << int(rng.integers(0, nb - 1)))
    beats[k]["keep"] = keep
    return beats


@pytest.mark.parametrize("width", [64, 512])
@pytest.mark.parametrize("decoded", [False, True], ids=["expect_bytes", "expect_decoded"])
def test_length_check_keep_not_contiguous(width, decoded):
    """A beat whose ``keep`` has a gap (hostile, or a broken MAC) is never taken for a right-length
    last beat: on the last beat it marks the frame ``bad`` with ``length_error``; before the last, the
    frame is cut there. The verdicts come from :func:`model` (which compares ``keep`` whole) and are
    checked frame by frame, with the count of ``length_error`` pulses; output ``keep`` may have gaps
    here, so the bytes are not compared."""
    nb = width // 8
    rng = np.random.default_rng(7 + width)
    todo = []
    for i, n in enumerate([1, 3, nb // 4, nb // 4 + 1, 2 * nb // 4 + 3, 40]):
        hdr = Header(opcode=Opcode.REDUCE, count=n, seq=i).pack()
        data = hdr + rng.bytes(4 * n)
        for where in ("last", "middle"):
            beats = _holed(data, nb, rng, where)
            if where == "middle" and len(beats) < 3:
                continue
            todo.append((beats, model(beats, HEADER_BYTES + 4 * n, nb)))
    good = beats_of(Header(opcode=Opcode.REDUCE, count=1, seq=99).pack() + bytes(4), nb)
    todo.append((good, model(good, HEADER_BYTES + 4, nb)))
    assert sum(bad for _, (_, bad, _) in todo) == len(todo) - 1
    dut = _Gate(width, decoded)
    bads, pulses = [], []

    async def watch(ctx):
        ctx.set(dut.o.ready, 1)
        async for _, _, v, last, bad, le in ctx.tick().sample(dut.o.valid, dut.o.payload.last, dut.o.payload.bad,
                                                           dut.length_error):
            if le:
                pulses.append(1)
            if v and last:
                bads.append(int(bad))

    async def done(ctx):
        await ctx.tick().repeat(60 * len(todo) * (MTU // nb + 4))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(source(dut.i, [b for b, _ in todo], seed=width))
    sim.add_process(watch)
    sim.add_testbench(done)
    sim.run()
    assert bads == [bad for _, (_, bad, _) in todo]
    assert len(pulses) == sum(1 for _, (_, _, p) in todo if p)


def model_open(beats, nb: int):
    """What leaves the gate for a frame given the MTU as an open bound (``expect_open``): the frame
    unchanged and unmarked if it is at most the MTU with no partial beat before its last, else cut
    as with an exact expectation of the MTU."""
    total = sum(bin(b["keep"]).count("1") for b in beats)
    partial = any(b["keep"] != (1 << nb) - 1 for b in beats[:-1])
    if not partial and total <= MTU:
        return b"".join(b["data"].to_bytes(nb, "little")[:bin(b["keep"]).count("1")] for b in beats), 0, None
    return model(beats, MTU, nb)


@pytest.mark.parametrize("width", [64, 128, 512])
@pytest.mark.parametrize("pressure", [False, True])
def test_length_check_open_bound(width, pressure):
    """``expect_open`` (the engine's forwarded compressed BROADCASTs): a frame of any length up to the
    MTU leaves unchanged and unmarked; a longer one is cut at the MTU and counted ``oversize``; one
    with a partial beat before its last is cut there; frames without it are checked exactly as before."""
    rng = np.random.default_rng(3 * width + pressure)
    nb = width // 8
    todo = []
    lengths = sorted({16, 17, 16 + nb, 15 + 2 * nb, 100, MTU - nb, MTU - nb + 1, MTU - 1, MTU, MTU + 1,
                      MTU + nb - 1, MTU + nb, MTU + 3 * nb})
    for i, n in enumerate(lengths):
        hdr = Header(opcode=Opcode.BROADCAST, count=5, seq=i, hop=7).pack()
        data = hdr + rng.bytes(n - HEADER_BYTES)
        beats = beats_of(data, nb)
        todo.append((beats, model_open(beats, nb)))
        if len(beats) > 3:
            beats = beats_of(data, nb, short_beat=2)
            todo.append((beats, model_open(beats, nb)))
        exact = Header(opcode=Opcode.REDUCE, count=(n - 16) // 4, seq=i).pack()   # not open: exact check
        data = exact + rng.bytes(n - HEADER_BYTES)
        beats = beats_of(data, nb)
        todo.append((beats, model(beats, HEADER_BYTES + 4 * ((n - 16) // 4), nb)))
    rng.shuffle(todo)
    good = beats_of(Header(opcode=Opcode.REDUCE, count=1, seq=99).pack() + bytes(4), nb)
    todo.append((good, model(good, HEADER_BYTES + 4, nb)))
    _run_and_check(_Gate(width, True, open_hop=7), todo, width, pressure)


@pytest.mark.parametrize("width", [64, 128, 256, 512])
def test_decode_expect_count_matches_decode_expect(width):
    """``decode_expect_count(count)`` (the engine's header checks and summation units: one incrementer)
    gives the bits ``decode_expect(16 + 4·count)`` gives, for every count a frame of MTU 9000 can have
    and the 16-bit field's top values; ``count_beats(count)`` is that ``last + 1``."""
    from amaranth import Module, Signal
    from amaranth.sim import Simulator
    from wirereduce.hdl.stream.frame import count_beats, decode_expect, decode_expect_count

    m = Module()
    count = Signal(16)
    ref = decode_expect(m, 16 + 4 * count, width, name="ref")
    fast = decode_expect_count(m, count, width, name="fast")
    beats = Signal(17)
    m.d.comb += beats.eq(count_beats(count, width))
    counts = [*range(2300), 16383, 16384, 40000, 65534, 65535]
    bad = []

    async def tb(ctx):
        for c in counts:
            ctx.set(count, c)
            want = ctx.get(ref.as_value())
            if ctx.get(fast.as_value()) != want or ctx.get(beats) != ctx.get(ref.last) + 1:
                bad.append(c)

    sim = Simulator(m)
    sim.add_testbench(tb)
    sim.run()
    assert bad == []


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="Icarus Verilog (iverilog) is not installed")
def test_decode_expect_count_verilog_matches_on_icarus(tmp_path):
    """The Verilog of ``decode_expect_count`` gives ``decode_expect``'s bits in an event-driven simulator
    too: written with a ``Switch``, Amaranth put its constant bits in an ``always @*`` block that Icarus
    never runs (X) and the Verilator engines dropped frames on (``drop_length``), while amaranth.sim
    agreed."""
    from amaranth import Module, Signal
    from amaranth.back import verilog
    from wirereduce.hdl.stream.frame import decode_expect, decode_expect_count

    m = Module()
    count = Signal(16)
    outs = []
    for width in (64, 512):
        for k, fn in enumerate((lambda c, w: decode_expect(m, 16 + 4 * c, w, name=f"ref{w}"),
                                lambda c, w: decode_expect_count(m, c, w, name=f"fast{w}"))):
            o = Signal(expect_layout(width).size, name=f"o{width}_{k}")
            m.d.comb += o.eq(fn(count, width).as_value())
            outs.append(o)
    (tmp_path / "dut.v").write_text(verilog.convert(m, ports=[count, *outs], name="dut"))
    checks = " ".join(f"if (o{w}_0 !== o{w}_1) bad = bad + 1;" for w in (64, 512))
    decls = " ".join(f"wire [{len(o) - 1}:0] {o.name};" for o in outs)
    conns = ", ".join(f".{o.name}({o.name})" for o in outs)
    (tmp_path / "tb.v").write_text(f"""module tb; reg [15:0] count; {decls} integer i, bad;
  dut d(.count(count), {conns});
  initial begin bad = 0;
    for (i = 0; i < 2300; i = i + 1) begin count = i; #1; {checks} end
    $display("bad=%0d", bad); $finish; end
endmodule
""")
    subprocess.run(["iverilog", "-o", str(tmp_path / "sim"), str(tmp_path / "tb.v"), str(tmp_path / "dut.v")],
                   check=True, capture_output=True)
    out = subprocess.run(["vvp", str(tmp_path / "sim")], check=True, capture_output=True, text=True).stdout
    assert "bad=0" in out, out
