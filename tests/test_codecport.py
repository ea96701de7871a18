"""Block tests of the codec stages at a node's ports (``wirereduce.hdl.codec.port``) in amaranth.sim.

Expected frames come from the golden codec (:mod:`wirereduce.sim.golden.codec`) and the protocol's frame
builder: a compressed data frame must come out of :class:`CodecIn` as its header followed by
``decode(payload)`` bit for bit, a raw one with ``codec = INCEPTIONN_V1`` out of :class:`CodecOut` as
its header followed by ``encode(values, eb_k)`` byte for byte; every other frame unchanged, in order;
a malformed compressed frame not at all (and counted).
"""

from __future__ import annotations

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator
from test_codec_hdl import Received, byte_beats, gradients, sink, source, u32
from wirereduce.hdl.codec.port import CodecIn, CodecOut, InsertHeader, StripHeader
from wirereduce.hdl.params import silence_unused
from wirereduce.hdl.stream.frame import FrameGate

from wirereduce import codec
from wirereduce.protocol import CODEC_FORWARDED, Codec, Flag, Header, Opcode, frame

WIDTHS = [64, 256, 512]
MAXN = 120


def _beats_of(frames, width):
    return [byte_beats(f, width) for f in frames]


def run(dut, frames, width, n_out, *, valid_prob=1.0, ready_prob=1.0, seed=0, beats=None):
    """Run ``dut`` on ``frames`` (or the given ``beats``) until ``n_out`` frames came out: the
    received frames (with ``bad`` of each as its error) and the ``dropped`` pulses."""
    rec = Received()
    drops = []

    async def count_drops(ctx):
        async for _, _, d in ctx.tick().sample(dut.dropped):
            if d:
                drops.append(1)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(source(dut.i, beats or _beats_of(frames, width), valid_prob=valid_prob, seed=seed))
    sim.add_testbench(sink(dut.o, n_out, width, rec, ready_prob=ready_prob, seed=seed + 1, error=dut.o.payload.bad))
    sim.add_process(count_drops)
    sim.run()
    return rec, len(drops)


def _mixed_in(rng, width):
    """Frames for CodecIn and what must come out of it: (input frames, expected output, drops)."""
    frames, want, drops = [], [], 0
    for i in range(14):
        kind = i % 7
        n = int(rng.choice([1, 2, 3, 16, 33, 64, MAXN]))
        k = int(rng.integers(4, 25))
        g = gradients(rng, n, k)
        op = [Opcode.REDUCE, Opcode.BROADCAST, Opcode.HOST_PUSH][i % 3]
        h = Header(opcode=op, count=n, seq=i, codec=Codec.INCEPTIONN_V1, eb_k=k)
        if kind in (0, 1, 2):           # compressed, well formed
            frames.append(frame(h, codec.encode(g, k)))
            want.append(frame(h, codec.decode(codec.encode(g, k), n, k)))
        elif kind == 3:                 # raw
            f = frame(h.replace(codec=Codec.NONE, eb_k=0), g)
            frames.append(f)
            want.append(f)
        elif kind == 4:                 # compressed but truncated: dropped
            p = codec.encode(g, k)
            frames.append(frame(h, p[:len(p) - 1]))
            drops += 1
        elif kind == 5:                 # CONTROL with the codec bits set: not a data frame, unchanged
            f = Header(opcode=Opcode.CONTROL, codec=Codec.INCEPTIONN_V1, eb_k=9, seq=4).pack()
            frames.append(f)
            want.append(f)
        else:                           # compressed with one byte too many: dropped
            frames.append(frame(h, codec.encode(g, k) + b"\x55"))
            drops += 1
    frames.append(b"\x01\x03\x00")      # a runt: passed on for the node's gate to count
    want.append(b"\x01\x03\x00")
    return frames, want, drops


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("pressure", [False, True])
def test_codec_in(width, pressure):
    rng = np.random.default_rng(width + pressure)
    frames, want, drops = _mixed_in(rng, width)
    dut = CodecIn(width, MAXN, -(-(16 + 4 * MAXN + 60) // (width // 8)))
    vp, rp = (0.7, 0.6) if pressure else (1.0, 1.0)
    rec, dropped = run(dut, frames, width, len(want), valid_prob=vp, ready_prob=rp, seed=width)
    assert len(rec.frames) == len(want)
    for got, exp in zip(rec.frames, want):
        assert len(got) == len(exp)
        assert got[:16] == exp[:16]
        assert (u32(np.frombuffer(got[16:], "<f4")) == u32(np.frombuffer(exp[16:], "<f4"))).all()
    assert dropped == drops


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("pressure", [False, True])
def test_codec_out(width, pressure):
    rng = np.random.default_rng(7 * width + pressure)
    frames, want = [], []
    for i in range(12):
        n = int(rng.choice([1, 2, 3, 15, 16, 33, MAXN]))
        k = int(rng.integers(4, 25))
        g = gradients(rng, n, k)
        op = [Opcode.REDUCE, Opcode.BROADCAST, Opcode.HOST_RESULT, Opcode.STATS][i % 4]
        h = Header(opcode=op, count=n, seq=i, codec=Codec.INCEPTIONN_V1 if i % 5 else Codec.NONE, eb_k=k)
        f = frame(h, g)
        frames.append(f)
        if h.codec and op != Opcode.STATS:
            want.append(frame(h, codec.encode(g, k)))
        else:
            want.append(f)
    dut = CodecOut(width, MAXN, -(-(16 + 4 * MAXN) // (width // 8)))
    vp, rp = (0.6, 0.5) if pressure else (1.0, 1.0)
    rec, dropped = run(dut, frames, width, len(want), valid_prob=vp, ready_prob=rp, seed=width + 3)
    assert rec.frames == want
    assert dropped == 0


class _StripInsert(wiring.Component):
    """FrameGate (always accept) → StripHeader → InsertHeader: must give back every frame."""

    def __init__(self, width):
        from amaranth.lib.wiring import In, Out
        from wirereduce.hdl.stream.frame import FrameStream

        self._w = width
        beat = FrameStream(width)
        super().__init__({"i": In(beat), "o": Out(beat), "dropped": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.gate = gate = FrameGate(self._w, 64)
        m.submodules.strip = strip = StripHeader(self._w, len(gate.o.payload.index))
        m.submodules.insert = insert = InsertHeader(self._w)
        wiring.connect(m, wiring.flipped(self.i), gate.i)
        m.d.comb += gate.accept.eq(gate.head_valid)
        wiring.connect(m, gate.o, strip.i)
        wiring.connect(m, strip.o, insert.i)
        wiring.connect(m, insert.o, wiring.flipped(self.o))
        return m


@pytest.mark.parametrize("width", [64, 128, 512])
def test_strip_insert_round_trip(width):
    """Every payload length 0 … 3 beats + 1 byte, under back-pressure: frames come back unchanged."""
    rng = np.random.default_rng(width)
    nb = width // 8
    frames = [Header(opcode=1, seq=n).pack() + rng.bytes(n) for n in range(0, 3 * nb + 2)]
    rec, _ = run(_StripInsert(width), frames, width, len(frames), valid_prob=0.8, ready_prob=0.7, seed=5)
    assert rec.frames == frames


@pytest.mark.parametrize("width", [64, 512])
def test_codec_stages_one_beat_per_cycle_uncompressed(width):
    """Raw frames pass a CodecIn/CodecOut pair back to back without an idle output cycle."""
    frames = [frame(Header(opcode=Opcode.REDUCE, count=MAXN, seq=i), np.full(MAXN, i, np.float32))
              for i in range(6)]
    dut = CodecOut(width, MAXN, -(-(16 + 4 * MAXN) // (width // 8)))
    rec, _ = run(dut, frames, width, len(frames))
    assert rec.frames == frames
    cycles = rec.all_cycles
    assert cycles[-1] - cycles[0] == len(cycles) - 1, "an idle cycle between beats"


def _marked(frames_bad, width):
    """Beats of (frame, bad) pairs: ``bad`` set on the last beat of the marked ones."""
    out = []
    for f, bad in frames_bad:
        beats = byte_beats(f, width)
        for b in beats:
            b["bad"] = int(bad and b["last"])
        out.append(beats)
    return out


def _run_marked(dut, inputs, want, width) -> int:
    """Run ``dut`` (a CodecIn or CodecOut) on (frame, bad) ``inputs``; check it sends ``want``
    ((frame, bad) pairs) and return how many frames it counted as dropped."""
    rec, drops = run(dut, None, width, len(want), beats=_marked(inputs, width))
    assert [(f, e) for f, e in zip(rec.frames, rec.errors)] == want
    return drops


@pytest.mark.parametrize("width", [64, 512])
def test_marked_frames_never_reach_the_adders(width):
    """Frames marked ``bad`` (a cut-through port found them spoilt). A compressed one leaves
    :class:`CodecIn` as a header-only placeholder (its header with ``flags | LOST``), still marked
    bad, so no decoded value of it goes on and downstream nodes stay in step; not counted as a
    codec drop. LOST placeholders and raw frames pass both stages unchanged with their mark;
    :class:`CodecOut` keeps the mark of a frame it compresses."""
    rng = np.random.default_rng(width)
    k = 10
    g1, g2, g3 = (gradients(rng, n, k) for n in (40, 33, 7))
    h = Header(opcode=Opcode.REDUCE, count=40, seq=0, codec=Codec.INCEPTIONN_V1, eb_k=k)
    good1 = frame(h, codec.encode(g1, k))
    spoilt = frame(h.replace(count=33, seq=1), codec.encode(g2, k))
    lost = h.replace(count=12, seq=2, flags=int(Flag.LOST)).pack()
    raw = frame(h.replace(codec=Codec.NONE, eb_k=0, count=7, seq=3), g3)
    good2 = frame(h.replace(count=7, seq=4), codec.encode(g3, k))
    inputs = [(good1, 0), (spoilt, 1), (lost, 1), (raw, 1), (good2, 0)]
    want = [(frame(h, codec.decode(codec.encode(g1, k), 40, k)), 0),
            (h.replace(count=33, seq=1, flags=int(Flag.LOST)).pack(), 1),
            (lost, 1), (raw, 1),
            (frame(h.replace(count=7, seq=4), codec.decode(codec.encode(g3, k), 7, k)), 0)]
    dut = CodecIn(width, MAXN, -(-(16 + 4 * MAXN + 60) // (width // 8)))
    drops = _run_marked(dut, inputs, want, width)
    assert drops == 0

    # CodecOut: the placeholder and the raw frame pass as they are; a compressed frame keeps its mark.
    vals = frame(h.replace(opcode=Opcode.BROADCAST, count=7), g3)
    inputs = [(lost, 1), (raw, 1), (vals, 1), (vals, 0)]
    enc = frame(h.replace(opcode=Opcode.BROADCAST, count=7), codec.encode(g3, k))
    want = [(lost, 1), (raw, 1), (enc, 1), (enc, 0)]
    _run_marked(CodecOut(width, MAXN, -(-(16 + 4 * MAXN + 60) // (width // 8))), inputs, want, width)


@pytest.mark.parametrize("width", [64, 512])
def test_marked_frames_pass_decoded_without_placeholders(width):
    """The schedule engine's CodecIn (``placeholders=False``): a compressed frame marked ``bad``
    leaves decoded, every value of it, still marked bad on its last beat (the engine sums it and
    marks what it turns into, as for an uncompressed frame marked bad); one whose payload does not
    decode is dropped whole and counted, marked bad or not."""
    rng = np.random.default_rng(width + 1)
    k = 10
    g1, g2, g3 = (gradients(rng, n, k) for n in (40, 33, 7))
    h = Header(opcode=Opcode.REDUCE, count=40, seq=0, codec=Codec.INCEPTIONN_V1, eb_k=k)
    dec = [codec.decode(codec.encode(g, k), g.size, k) for g in (g1, g2, g3)]
    spoilt = frame(h.replace(count=33, seq=1), codec.encode(g2, k))
    spoilt_long = frame(h.replace(count=7, seq=2), codec.encode(g3, k) + b"\x55")
    malformed = frame(h.replace(count=7, seq=3), codec.encode(g3, k) + b"\x55")
    raw = frame(h.replace(codec=Codec.NONE, eb_k=0, count=7, seq=4), g3)
    good = frame(h.replace(count=7, seq=5), codec.encode(g3, k))
    inputs = [(frame(h, codec.encode(g1, k)), 0), (spoilt, 1), (spoilt_long, 1), (malformed, 0), (raw, 1),
              (good, 0)]
    want = [(frame(h, dec[0]), 0), (frame(h.replace(count=33, seq=1), dec[1]), 1), (raw, 1),
            (frame(h.replace(count=7, seq=5), dec[2]), 0)]
    dut = CodecIn(width, MAXN, -(-(16 + 4 * MAXN + 60) // (width // 8)), placeholders=False)
    drops = _run_marked(dut, inputs, want, width)
    assert drops == 2


@pytest.mark.parametrize("width", [64, 512])
@pytest.mark.parametrize("pressure", [False, True])
def test_cut_through_codec_in_marks_malformed_frames_bad(width, pressure):
    """The schedule engine's CodecIn (``cut_through=True``): every compressed frame leaves decoded,
    as the decompressor emits it, ``count`` values long; one marked ``bad`` on arrival or whose
    length does not match its tags (truncated, one byte too long, padding not zero) leaves marked
    ``bad`` on its last beat (the engine discards everything made of it), and each malformed one
    is counted once in ``dropped``, marked or not; the values of the good ones are ``decode``'s
    bit for bit and their last beat is not marked."""
    rng = np.random.default_rng(width + 11 + pressure)
    k = 9
    g = [gradients(rng, n, k) for n in (40, 33, 7, MAXN, 1)]
    enc = [codec.encode(x, k) for x in g]
    dec = [codec.decode(e, x.size, k) for e, x in zip(enc, g)]
    h = Header(opcode=Opcode.REDUCE, count=40, seq=0, codec=Codec.INCEPTIONN_V1, eb_k=k)
    hs = [h.replace(count=x.size, seq=i) for i, x in enumerate(g)]
    pad = bytearray(enc[2])
    pad[1] |= 0xC0                       # tag slot 7 of a 7-element payload: padding not zero
    inputs = [(frame(hs[0], enc[0]), 0),                      # good
              (frame(hs[1], enc[1]), 1),                      # marked bad on a cable, decodes
              (frame(hs[2], enc[2] + b"\x55"), 1),            # marked and too long
              (frame(hs[2], enc[2] + b"\x55"), 0),            # too long
              (frame(hs[3], enc[3][:-3]), 0),                 # truncated
              (frame(hs[2], bytes(pad)), 0),                  # padding not zero
              (frame(hs[2].replace(codec=Codec.NONE, eb_k=0), g[2]), 1),   # raw, marked: unchanged
              (frame(hs[4], enc[4]), 0),                      # good, one value
              (frame(hs[3], enc[3]), 0)]                      # good, the largest
    # (header, values or None when not checked, bad)
    want = [(hs[0], dec[0], 0), (hs[1], dec[1], 1), (hs[2], dec[2], 1), (hs[2], dec[2], 1),
            (hs[3], None, 1), (hs[2], None, 1), (None, None, 1), (hs[4], dec[4], 0), (hs[3], dec[3], 0)]
    dut = CodecIn(width, MAXN, -(-(16 + 4 * MAXN + 60) // (width // 8)), placeholders=False, cut_through=True)
    vp, rp = (0.7, 0.6) if pressure else (1.0, 1.0)
    rec, drops = run(dut, None, width, len(want), beats=_marked(inputs, width), valid_prob=vp, ready_prob=rp,
                     seed=width + 5)
    assert len(rec.frames) == len(want)
    for i, (got, bad, (hdr, vals, want_bad)) in enumerate(zip(rec.frames, rec.errors, want)):
        assert bool(bad) == bool(want_bad), i
        if hdr is None:
            assert got == inputs[i][0], i
            continue
        assert got[:16] == hdr.pack(), i
        assert len(got) == 16 + 4 * hdr.count, i
        if vals is not None:
            assert u32(np.frombuffer(got[16:], "<f4")).tolist() == u32(vals).tolist(), i
    assert drops == 4   # too long (marked and not), truncated, padding


def test_cut_through_codec_in_needs_no_placeholders():
    with pytest.raises(ValueError, match="placeholders=False"):
        CodecIn(64, MAXN, 64, placeholders=True, cut_through=True)


@pytest.mark.parametrize("width", [64, 512])
def test_cut_through_codec_in_starts_before_the_frame_is_in(width):
    """Cut-through, not store-and-forward: with the input at one beat every 4 cycles (a slow
    link), the decoded frame's first beat leaves before the compressed frame's last beat has
    arrived; the commit-buffer CodecIn emits its first beat only after it."""
    rng = np.random.default_rng(width)
    k = 6
    x = gradients(rng, MAXN, k)
    f = frame(Header(opcode=Opcode.REDUCE, count=MAXN, seq=0, codec=Codec.INCEPTIONN_V1, eb_k=k),
              codec.encode(x, k))
    nin = len(byte_beats(f, width))
    assert nin >= 4
    firsts = {}
    for ct in (False, True):
        dut = CodecIn(width, MAXN, -(-(16 + 4 * MAXN + 60) // (width // 8)), placeholders=False, cut_through=ct)
        rec, acc = Received(), []
        sim = Simulator(dut)
        sim.add_clock(1e-8)
        sim.add_testbench(source(dut.i, [byte_beats(f, width)], valid_prob=0.25, seed=3, accepted=acc))
        sim.add_testbench(sink(dut.o, 1, width, rec, error=dut.o.payload.bad))
        sim.run()
        assert rec.frames[0][16:] == codec.decode(codec.encode(x, k), MAXN, k).tobytes()
        firsts[ct] = (rec.all_cycles[0], acc[-1])
    assert firsts[True][0] < firsts[True][1], firsts
    assert firsts[False][0] > firsts[False][1], firsts


def _forwarded(f: bytes) -> bytes:
    """``f`` with its header's ``codec`` byte set to CODEC_FORWARDED, as a forwarding CodecIn passes it."""
    return f[:3] + bytes([CODEC_FORWARDED]) + f[4:]


@pytest.mark.parametrize("width", [64, 512])
def test_compressed_frame_above_max_compressed_is_malformed(width):
    """``max_compressed`` (the engine's: ``max_elements_compressed(mtu)``, 349 at MTU 1500): a
    compressed frame of more values, up to ``max_elements``, is well-formed to ``decode`` but could
    compress to more than the MTU on the next hop, so it is marked ``bad`` and counted once
    (``drop_length`` at the engine), decoded (REDUCE) or forwarded (BROADCAST); one of exactly
    ``max_compressed`` values passes. Zeros compress to the tag block alone, so the frames are small."""
    k, top = 10, MAXN - 20
    zeros = np.zeros(top + 1, np.float32)
    h = Header(opcode=Opcode.REDUCE, seq=0, codec=Codec.INCEPTIONN_V1, eb_k=k)
    b = h.replace(opcode=Opcode.BROADCAST)
    inputs = [(frame(h.replace(count=top), codec.encode(zeros[:top], k)), 0),
              (frame(h.replace(count=top + 1, seq=1), codec.encode(zeros, k)), 0),
              (frame(b.replace(count=top + 1, seq=2), codec.encode(zeros, k)), 0),
              (frame(b.replace(count=top, seq=3), codec.encode(zeros[:top], k)), 0)]
    dut = CodecIn(width, MAXN, -(-(16 + 4 * MAXN + 60) // (width // 8)), placeholders=False, cut_through=True,
                  forward=True, max_compressed=top)
    rec, drops = run(dut, None, width, len(inputs), beats=_marked(inputs, width))
    assert [bool(e) for e in rec.errors] == [False, True, True, False]
    assert rec.frames[0][16:] == bytes(4 * top)                  # decoded
    assert rec.frames[3] == _forwarded(inputs[3][0])             # forwarded as it arrived
    assert drops == 2
    with pytest.raises(ValueError, match="max_compressed must be 1 … max_elements"):
        CodecIn(width, MAXN, 64, placeholders=False, cut_through=True, max_compressed=MAXN + 1)


def test_engine_codec_stages_bound_compressed_frames_by_the_mtu():
    """The schedule engine builds its CodecIns with the compressed bound of its MTU, not the raw
    frame's (349 and 371 at MTU 1500)."""
    from wirereduce.hdl.core.engine import Engine

    from wirereduce.config import EngineConfig

    cfg = EngineConfig(64, 1500, 4, ports=2, max_flows=8, codec=True)
    m = Engine(cfg).elaborate(None)
    silence_unused(m)
    subs = m._named_submodules.items()   # name -> (elaboratable, source location)
    stages = [s[0] for name, s in subs if name.startswith("codec_") and isinstance(s[0], CodecIn)]
    assert len(stages) == 3 and {s._max_compressed for s in stages} == {codec.max_elements_compressed(1500)} == {349}
    assert {s._max_elements for s in stages} == {cfg.max_elements} == {371}


@pytest.mark.parametrize("width", [64, 512])
@pytest.mark.parametrize("pressure", [False, True])
def test_forwarding_codec_in_passes_compressed_broadcasts_unchanged(width, pressure):
    """The engine's network CodecIn (``forward=True``): a compressed BROADCAST leaves byte for byte as
    it arrived, only its ``codec`` marked CODEC_FORWARDED; one whose length does not match its tags
    (truncated, too long, padding not zero) leaves the same way with ``bad`` on its last beat and is
    counted once, one marked ``bad`` on arrival keeps its mark and is not counted; a BROADCAST that
    arrives marked CODEC_FORWARDED is checked like any; REDUCE and HOST_PUSH are decoded as before,
    a REDUCE marked CODEC_FORWARDED passes as it is (the gate drops it), raw frames pass."""
    rng = np.random.default_rng(width + 21 + pressure)
    k = 10
    g = [gradients(rng, n, k) for n in (40, 33, 7, MAXN, 1)]
    enc = [codec.encode(x, k) for x in g]
    dec = [codec.decode(e, x.size, k) for e, x in zip(enc, g)]
    b = Header(opcode=Opcode.BROADCAST, count=40, seq=0, codec=Codec.INCEPTIONN_V1, eb_k=k)
    bs = [b.replace(count=x.size, seq=i) for i, x in enumerate(g)]
    pad = bytearray(enc[2])
    pad[1] |= 0xC0                       # tag slot 7 of a 7-element payload: padding not zero
    red = bs[1].replace(opcode=Opcode.REDUCE)
    push = bs[2].replace(opcode=Opcode.HOST_PUSH)
    fwd_in = frame(bs[4], enc[4])
    fwd_in = fwd_in[:3] + bytes([CODEC_FORWARDED]) + fwd_in[4:]
    red_fwd = frame(red, enc[1])
    red_fwd = red_fwd[:3] + bytes([CODEC_FORWARDED]) + red_fwd[4:]
    raw = frame(bs[2].replace(codec=Codec.NONE, eb_k=0), g[2])
    inputs = [(frame(bs[0], enc[0]), 0),                      # good
              (frame(red, enc[1]), 0),                        # REDUCE: decoded
              (frame(bs[1], enc[1]), 1),                      # marked on a cable: forwarded, still marked
              (frame(bs[2], enc[2] + b"\x55"), 0),            # too long
              (frame(bs[3], enc[3][:-3]), 0),                 # truncated
              (frame(bs[2], bytes(pad)), 0),                  # padding not zero
              (frame(push, enc[2]), 0),                       # HOST_PUSH: decoded
              (raw, 0),                                       # raw: unchanged
              (fwd_in, 0),                                    # arrives marked forwarded: checked, passes
              (red_fwd, 0),                                   # a REDUCE marked forwarded: unchanged
              (frame(bs[2].replace(count=0), b""), 0),        # count 0: marked, left to the gate's count
              (frame(bs[3], enc[3]), 0)]                      # good, the largest
    want = [(_forwarded(inputs[0][0]), 0), (frame(red, dec[1]), 0), (_forwarded(inputs[2][0]), 1),
            (_forwarded(inputs[3][0]), 1), (_forwarded(inputs[4][0]), 1), (_forwarded(inputs[5][0]), 1),
            (frame(push, dec[2]), 0), (raw, 0), (fwd_in, 0), (red_fwd, 0), (_forwarded(inputs[10][0]), 1),
            (_forwarded(inputs[11][0]), 0)]
    dut = CodecIn(width, MAXN, -(-(16 + 4 * MAXN + 60) // (width // 8)), placeholders=False, cut_through=True,
                  forward=True)
    vp, rp = (0.7, 0.6) if pressure else (1.0, 1.0)
    rec, drops = run(dut, None, width, len(want), beats=_marked(inputs, width), valid_prob=vp, ready_prob=rp,
                     seed=width + 7)
    assert len(rec.frames) == len(want)
    for i, (got, bad, (exp, want_bad)) in enumerate(zip(rec.frames, rec.errors, want)):
        assert got == exp, i
        assert bool(bad) == bool(want_bad), i
    assert drops == 3   # too long, truncated, padding (not the marked one, not count 0)


def test_forwarding_codec_in_needs_cut_through():
    with pytest.raises(ValueError, match="cut_through=True"):
        CodecIn(64, MAXN, 64, placeholders=False, forward=True)


@pytest.mark.parametrize("width", [64, 512])
def test_forwarded_broadcast_is_cut_through(width):
    """A forwarded BROADCAST's first beat leaves long before its last beat arrives (input at one beat
    every 4 cycles), and every beat within 20 cycles of arriving (the delay line that covers the
    length check's latency, the gate and the FIFOs)."""
    rng = np.random.default_rng(width + 3)
    k = 6
    x = gradients(rng, MAXN, k)
    f = frame(Header(opcode=Opcode.BROADCAST, count=MAXN, seq=0, codec=Codec.INCEPTIONN_V1, eb_k=k),
              codec.encode(x, k))
    assert len(byte_beats(f, width)) >= 4
    dut = CodecIn(width, MAXN, -(-(16 + 4 * MAXN + 60) // (width // 8)), placeholders=False, cut_through=True,
                  forward=True)
    rec, acc = Received(), []
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(source(dut.i, [byte_beats(f, width)], valid_prob=0.25, seed=3, accepted=acc))
    sim.add_testbench(sink(dut.o, 1, width, rec, error=dut.o.payload.bad))
    sim.run()
    assert rec.frames[0] == _forwarded(f)
    assert rec.errors == [0]
    assert rec.all_cycles[0] < acc[-1], (rec.all_cycles[0], acc)
    assert rec.all_cycles[0] < acc[0] + 20, (rec.all_cycles[0], acc)
    assert rec.all_cycles[-1] <= acc[-1] + 20, (rec.all_cycles[-1], acc[-1])


@pytest.mark.parametrize("width", [64, 512])
def test_codec_out_sends_forwarded_broadcasts_as_they_arrived(width):
    """CodecIn(forward) then CodecOut: a compressed BROADCAST comes out byte for byte as it went in
    (``codec`` INCEPTIONN_V1 again, not compressed twice), with its mark; a raw BROADCAST that asks for
    compression is still compressed."""
    rng = np.random.default_rng(width + 5)
    k = 8
    g = [gradients(rng, n, k) for n in (40, 7)]
    b = Header(opcode=Opcode.BROADCAST, count=40, seq=0, codec=Codec.INCEPTIONN_V1, eb_k=k)
    f0 = frame(b, codec.encode(g[0], k))
    f1 = frame(b.replace(count=7, seq=1), codec.encode(g[1], k))
    raw = frame(b.replace(count=7, seq=2), g[1])
    inputs = [(_forwarded(f0), 0), (_forwarded(f1), 1), (raw, 0)]
    want = [(f0, 0), (f1, 1), (frame(b.replace(count=7, seq=2), codec.encode(g[1], k)), 0)]
    _run_marked(CodecOut(width, MAXN, -(-(16 + 4 * MAXN + 60) // (width // 8))), inputs, want, width)


@pytest.mark.parametrize("width", [64, 512])
def test_forwarded_broadcasts_back_to_back_leave_without_a_gap(width):
    """Compressed BROADCASTs arriving back to back at one beat a cycle leave back to back: the
    forward path's delay line covers the length check's latency, so no frame's last beat waits for
    its verdict (a wait there is a bubble per frame that an input at full rate never makes up)."""
    rng = np.random.default_rng(width + 9)
    k = 10
    frames = []
    for i in range(6):
        x = gradients(rng, int(rng.integers(20, MAXN)), k)
        frames.append(frame(Header(opcode=Opcode.BROADCAST, count=x.size, seq=i, codec=Codec.INCEPTIONN_V1,
                                   eb_k=k), codec.encode(x, k)))
    dut = CodecIn(width, MAXN, -(-(16 + 4 * MAXN + 60) // (width // 8)), placeholders=False, cut_through=True,
                  forward=True)
    rec, drops = run(dut, frames, width, len(frames))
    assert rec.frames == [_forwarded(f) for f in frames] and drops == 0
    cycles = rec.all_cycles
    assert cycles[-1] - cycles[0] == len(cycles) - 1, "an idle cycle between beats"
