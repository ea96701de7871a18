"""Block tests of the codec gateware (``wirereduce.hdl.codec.compressor``) in amaranth.sim, against sim/golden/codec.py.

The golden codec :mod:`wirereduce.sim.golden.codec` is the definition: the compressor's output bytes must
equal :func:`~wirereduce.sim.codec.encode`, the decompressor's output bits
:func:`~wirereduce.sim.codec.decode`, and the two in series :func:`~wirereduce.sim.codec.quantize`.
Streams are driven from async testbenches, with random ``valid`` gaps on inputs and random
``ready`` on outputs in some tests, and with both held high where throughput is measured.
"""

from __future__ import annotations

import numpy as np
import pytest
from amaranth import Module
from amaranth.back import verilog
from amaranth.lib import wiring
from amaranth.sim import Simulator
from amaranth_harness import to_beats
from wirereduce.hdl.codec.compressor import BytePacker, Compressor, Decompressor

from wirereduce import codec

WIDTHS = [64, 512]
KS = [4, 7, 12, 17, 24]
COUNTS = [1, 2, 3, 31, 32, 33, 100]
MAX = 100            # max_elements of most tests
MTU_MAX = 371        # fp32 values in a raw frame at MTU 1500


# ----------------------------------------------------------------------------------------------
# data


def gradients(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """fp32 values hitting every tag, the tag boundaries and IEEE special values."""
    eb = np.float32(2.0 ** -k)
    specials = np.array([
        0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, -1.1754944e-38,          # ±0, subnormals
        np.inf, -np.inf, 1.0, -1.0, 3.4028235e38, 2.0,                    # raw by magnitude
        np.nextafter(np.float32(1), np.float32(0)),                       # largest below 1
    ], dtype=np.float32)
    nans = np.array([0x7FC0_0000, 0xFFC0_1234, 0x7F80_0001, 0x7FBF_FFFF], dtype=np.uint32).view(np.float32)
    edges = []
    for e in (0, 7, 15):  # q = 1, 2**7 and 2**15: the tag boundaries
        b = np.float32(2.0 ** (e - k))
        edges += [b, np.nextafter(b, np.float32(0)), np.nextafter(b, np.float32(2))]
    edges = np.array(edges, dtype=np.float32)
    kind = rng.integers(0, 8, n)
    mag = np.empty(n, dtype=np.float32)
    lo_hi = {1: (-k - 30, -k), 2: (-k, 7 - k), 3: (7 - k, 15 - k), 4: (min(15 - k, -1), 0), 5: (0, 40)}
    for t, (lo, hi) in lo_hi.items():
        sel = kind == t
        mag[sel] = (2.0 ** rng.uniform(lo, hi, int(sel.sum()))).astype(np.float32)
    sel = kind == 0
    mag[sel] = rng.choice(specials, int(sel.sum()))
    sel = kind == 6
    mag[sel] = rng.choice(edges, int(sel.sum()))
    sel = kind == 7
    mag[sel] = rng.choice(nans, int(sel.sum()))
    sign = np.where(rng.random(n) < 0.5, np.float32(-1), np.float32(1))
    out = mag.copy()
    flip = (kind != 0) & (kind != 7)
    out[flip] = (mag[flip] * sign[flip]).astype(np.float32)
    assert eb > 0
    return out


def u32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype="<f4").view("<u4")


def lenient_decode(payload: bytes, n: int, k: int) -> np.ndarray:
    """What the decompressor outputs for a malformed payload (its docstring, in Python).

    Tags beyond the payload are 0, tag-block padding is ignored, a value whose code bytes are not
    all present is +0.0, and bytes beyond the codes the tags announce are ignored.
    """
    tb = codec.tag_bytes(n)
    buf = np.frombuffer(payload, dtype=np.uint8)
    tagb = np.zeros(tb, dtype=np.uint8)
    tagb[:min(tb, buf.size)] = buf[:tb]
    t = ((tagb[:, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3).ravel()[:n]
    codes = buf[tb:].tobytes()
    fixed = bytearray(tagb.tobytes())
    pos = 0
    keep_tags = t.copy()
    for i, tag in enumerate(t):
        size = codec.CODE_BYTES[tag]
        if pos + size > len(codes):
            keep_tags[i] = 0  # decodes to +0.0
            pos = len(codes)
            continue
        fixed += codes[pos:pos + size]
        pos += size
    # Rebuild a well-formed payload with the incomplete values as tag 0.
    packed = np.zeros(tb, dtype=np.uint8)
    for i, tag in enumerate(keep_tags):
        packed[i // 4] |= np.uint8(tag << (2 * (i % 4)))
    return codec.decode(packed.tobytes() + bytes(fixed[tb:]), n, k)


# ----------------------------------------------------------------------------------------------
# stream drivers


class Clock:
    """Counts the ticks one testbench has waited for; every testbench starts at cycle 0."""

    def __init__(self, ctx, limit: int):
        self.ctx = ctx
        self.n = 0
        self.limit = limit

    async def tick(self, *signals):
        sampled = await self.ctx.tick().sample(*signals)
        self.n += 1
        assert self.n < self.limit, f"no progress after {self.n} cycles"
        return sampled[2:]


def source(port, frames, *, valid_prob=1.0, seed=0, on_frame=None, accepted=None, limit=100_000):
    """Testbench sending ``frames`` (lists of payload dicts) on stream ``port``.

    ``on_frame(ctx, f)`` runs before frame ``f``'s first beat is offered (to set side inputs);
    ``accepted`` collects the cycle of every accepted beat.
    """
    async def tb(ctx):
        clk = Clock(ctx, limit)
        rng = np.random.default_rng(seed)
        for f, beats in enumerate(frames):
            if on_frame is not None:
                on_frame(ctx, f)
            for beat in beats:
                while True:
                    v = valid_prob >= 1 or rng.random() < valid_prob
                    if v:
                        for name, value in beat.items():
                            ctx.set(getattr(port.payload, name), value)
                    ctx.set(port.valid, int(v))
                    (r,) = await clk.tick(port.ready)
                    if v and r:
                        if accepted is not None:
                            accepted.append(clk.n)
                        break
        ctx.set(port.valid, 0)
    return tb


class Received:
    """Frames seen on an output: bytes, the error bit of the last beat, each beat's cycle and keep."""

    def __init__(self):
        self.frames: list[bytes] = []
        self.errors: list[int] = []
        self.cycles: list[list[int]] = []
        self.keeps: list[list[int]] = []

    @property
    def all_cycles(self):
        return [c for cyc in self.cycles for c in cyc]


def sink(port, nframes, width, rec: Received, *, error=None, ready_prob=1.0, seed=1, limit=100_000):
    """Testbench receiving ``nframes`` frames from stream ``port`` into ``rec``."""
    nb = width // 8

    async def tb(ctx):
        clk = Clock(ctx, limit)
        rng = np.random.default_rng(seed)
        cur, cyc, keeps = b"", [], []
        while len(rec.frames) < nframes:
            r = int(ready_prob >= 1 or rng.random() < ready_prob)
            ctx.set(port.ready, r)
            sigs = [port.valid, port.payload.data, port.payload.keep, port.payload.last]
            if error is not None:
                sigs.append(error)
            v, data, keep, last, *err = await clk.tick(*sigs)
            if not (v and r):
                continue
            nkeep = bin(keep).count("1")
            assert keep == (1 << nkeep) - 1, f"keep {keep:#x} is not contiguous from byte 0"
            cur += int(data).to_bytes(nb, "little")[:nkeep]
            cyc.append(clk.n)
            keeps.append(nkeep)
            if last:
                rec.frames.append(cur)
                rec.errors.append(int(err[0]) if err else 0)
                rec.cycles.append(cyc)
                rec.keeps.append(keeps)
                cur, cyc, keeps = b"", [], []
        ctx.set(port.ready, 0)
    return tb


def simulate(dut, *testbenches):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for tb in testbenches:
        sim.add_testbench(tb)
    sim.run()


def value_beats(g: np.ndarray, width: int):
    return [{"data": d, "keep": kp, "last": int(lst)} for d, kp, lst in to_beats(u32(g).tobytes(), width)]


def byte_beats(payload: bytes, width: int):
    return [{"data": d, "keep": kp, "last": int(lst)} for d, kp, lst in to_beats(payload, width)]


def check_beat_format(rec: Received, width: int):
    """Every beat full except the last of a frame."""
    for keeps in rec.keeps:
        assert all(kp == width // 8 for kp in keeps[:-1]), keeps


# ----------------------------------------------------------------------------------------------
# runners


def run_compressor(width, frames, ks, *, max_elements=MAX, valid_prob=1.0, ready_prob=1.0, seed=0):
    dut = Compressor(width, max_elements)
    rec, acc = Received(), []

    def set_k(ctx, f):
        ctx.set(dut.k, ks[f])

    simulate(dut,
             source(dut.i, [value_beats(g, width) for g in frames], valid_prob=valid_prob, seed=seed,
                    on_frame=set_k, accepted=acc),
             sink(dut.o, len(frames), width, rec, error=dut.error, ready_prob=ready_prob, seed=seed + 1))
    return rec, acc


def run_decompressor(width, payloads, ns, ks, *, max_elements=MAX, valid_prob=1.0, ready_prob=1.0, seed=0):
    dut = Decompressor(width, max_elements)
    rec, acc = Received(), []

    def set_nk(ctx, f):
        ctx.set(dut.n, ns[f])
        ctx.set(dut.k, ks[f])

    simulate(dut,
             source(dut.i, [byte_beats(p, width) for p in payloads], valid_prob=valid_prob, seed=seed,
                    on_frame=set_nk, accepted=acc),
             sink(dut.o, len(payloads), width, rec, error=dut.error, ready_prob=ready_prob, seed=seed + 1))
    return rec, acc


def frame_set(rng, counts, ks):
    return [gradients(rng, n, k) for n, k in zip(counts, ks)]


def check_compressed(rec, frames, ks, width):
    assert len(rec.frames) == len(frames)
    for f, (g, k) in enumerate(zip(frames, ks)):
        want = codec.encode(g, k)
        assert rec.frames[f] == want, f"frame {f} (n={g.size}, k={k}): {rec.frames[f].hex()} != {want.hex()}"
        assert rec.errors[f] == 0
    check_beat_format(rec, width)


def check_decompressed(rec, want_bits, width):
    assert len(rec.frames) == len(want_bits)
    for f, want in enumerate(want_bits):
        got = np.frombuffer(rec.frames[f], dtype="<u4")
        assert got.size == want.size, (f, got.size, want.size)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"frame {f}: {bad.size} values differ, first {bad[:4]}: " \
                              f"{[hex(x) for x in got[bad[:4]]]} != {[hex(x) for x in want[bad[:4]]]}"
    check_beat_format(rec, width)


# ----------------------------------------------------------------------------------------------
# byte packer


def run_packer(width, frames, *, valid_prob=1.0, ready_prob=1.0, seed=0):
    dut = BytePacker(width)
    rec, acc = Received(), []
    beats = [[{"data": d, "count": c, "last": int(i == len(ch) - 1), "error": e}
              for i, (d, c) in enumerate(ch)] for ch, e in frames]
    simulate(dut, source(dut.i, beats, valid_prob=valid_prob, seed=seed, accepted=acc),
             sink(dut.o, len(frames), width, rec, error=dut.error, ready_prob=ready_prob, seed=seed + 1))
    return rec, acc


def random_chunks(rng, width, nframes, full=False):
    nb = width // 8
    frames = []
    for _ in range(nframes):
        chunks = []
        for _ in range(int(rng.integers(1, 8))):
            c = nb if full else int(rng.choice([0, nb, int(rng.integers(0, nb + 1))]))
            # Bytes above ``count`` are garbage the packer must ignore.
            chunks.append((int.from_bytes(rng.bytes(nb), "little"), c))
        frames.append((chunks, int(rng.integers(0, 2))))
    return frames


def packed_bytes(chunks, width):
    nb = width // 8
    return b"".join(d.to_bytes(nb, "little")[:c] for d, c in chunks)


@pytest.mark.parametrize("width", WIDTHS)
def test_packer_random(width):
    rng = np.random.default_rng(width)
    frames = random_chunks(rng, width, 40)
    frames.append(([(0, 0)], 1))  # a frame of no bytes: one empty beat
    rec, _ = run_packer(width, frames, valid_prob=0.7, ready_prob=0.6, seed=width)
    nb = width // 8
    for f, (chunks, err) in enumerate(frames):
        want = packed_bytes(chunks, width)
        assert rec.frames[f] == want, f
        assert rec.errors[f] == err
        # One beat per B bytes; an extra empty last beat only when the last chunk is empty and the
        # bytes before it fill whole beats.
        extra = int(chunks[-1][1] == 0 and len(want) % nb == 0)
        assert len(rec.keeps[f]) == -(-len(want) // nb) + extra, (f, rec.keeps[f])
    check_beat_format(rec, width)


@pytest.mark.parametrize("width", WIDTHS)
def test_packer_one_beat_per_cycle(width):
    """Full chunks back to back: one beat per cycle in and out, frames without gaps."""
    rng = np.random.default_rng(1)
    frames = random_chunks(rng, width, 20, full=True)
    rec, acc = run_packer(width, frames)
    assert [rec.frames[f] == packed_bytes(ch, width) for f, (ch, _) in enumerate(frames)] == [True] * len(frames)
    assert acc[-1] - acc[0] + 1 == len(acc)
    out = rec.all_cycles
    assert out[-1] - out[0] + 1 == len(out)
    assert out[0] - acc[0] == 1


# ----------------------------------------------------------------------------------------------
# compressor


@pytest.mark.parametrize("width", WIDTHS)
def test_compressor_matches_golden(width):
    rng = np.random.default_rng(10 + width)
    counts = COUNTS + COUNTS[::-1]
    ks = [KS[i % len(KS)] for i in range(len(counts))]
    frames = frame_set(rng, counts, ks)
    rec, _ = run_compressor(width, frames, ks)
    check_compressed(rec, frames, ks, width)


@pytest.mark.parametrize("width", WIDTHS)
def test_compressor_backpressure(width):
    """Random valid gaps on the input and random ready on the output: still byte-exact."""
    rng = np.random.default_rng(20 + width)
    counts = [int(x) for x in rng.integers(1, MAX + 1, 12)] + [1, MAX]
    ks = [int(x) for x in rng.integers(codec.K_MIN, codec.K_MAX + 1, len(counts))]
    frames = frame_set(rng, counts, ks)
    rec, _ = run_compressor(width, frames, ks, valid_prob=0.6, ready_prob=0.5, seed=width)
    check_compressed(rec, frames, ks, width)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("banks", [2, 4])
def test_compressor_runs_ahead(width, banks):
    """With the output stalled, the compressor takes ``banks`` whole frames (one per bank) and no
    more than the next frame's first beats into its input stages; released, it sends them all
    byte-exactly. This is the slack that lets a node run ahead of a slower link
    (``CodecOut``, docs/codec.md "Performance")."""
    rng = np.random.default_rng(70 + width + banks)
    counts = [MAX] * (banks + 2)
    ks = [8] * len(counts)
    frames = frame_set(rng, counts, ks)
    dut = Compressor(width, MAX, banks)
    rec, acc = Received(), []
    hold = 40 * beats(4 * MAX, width) * len(counts)

    def set_k(ctx, f):
        ctx.set(dut.k, ks[f])

    out = sink(dut.o, len(frames), width, rec, error=dut.error)

    async def stalled_sink(ctx):
        ctx.set(dut.o.ready, 0)
        for _ in range(hold):
            await ctx.tick()
        await out(ctx)

    simulate(dut, source(dut.i, [value_beats(g, width) for g in frames], on_frame=set_k, accepted=acc),
             stalled_sink)
    check_compressed(rec, frames, ks, width)
    per_frame = beats(4 * MAX, width)
    taken = sum(1 for c in acc if c <= hold)
    assert banks * per_frame <= taken < (banks + 1) * per_frame, (taken, per_frame)


# ----------------------------------------------------------------------------------------------
# decompressor


@pytest.mark.parametrize("width", WIDTHS)
def test_decompressor_matches_golden(width):
    rng = np.random.default_rng(30 + width)
    counts = COUNTS + COUNTS[::-1]
    ks = [KS[(i + 2) % len(KS)] for i in range(len(counts))]
    payloads = [codec.encode(g, k) for g, k in zip(frame_set(rng, counts, ks), ks)]
    rec, _ = run_decompressor(width, payloads, counts, ks)
    check_decompressed(rec, [u32(codec.decode(p, n, k)) for p, n, k in zip(payloads, counts, ks)], width)
    assert rec.errors == [0] * len(payloads)


@pytest.mark.parametrize("width", WIDTHS)
def test_decompressor_backpressure(width):
    rng = np.random.default_rng(40 + width)
    counts = [int(x) for x in rng.integers(1, MAX + 1, 12)] + [1, MAX]
    ks = [int(x) for x in rng.integers(codec.K_MIN, codec.K_MAX + 1, len(counts))]
    payloads = [codec.encode(g, k) for g, k in zip(frame_set(rng, counts, ks), ks)]
    rec, _ = run_decompressor(width, payloads, counts, ks, valid_prob=0.6, ready_prob=0.5, seed=width)
    check_decompressed(rec, [u32(codec.decode(p, n, k)) for p, n, k in zip(payloads, counts, ks)], width)
    assert rec.errors == [0] * len(payloads)


def test_decompressor_decodes_any_code():
    """Codes the encoder never emits (tag 1 with q = 0 and sign 1, tag 2 with a small q, tag 3 of a
    small value) decode by the same formulas as the golden decoder."""
    n, k = 8, 9
    tags = [1, 1, 2, 2, 3, 3, 1, 2]
    tag_block = bytearray(8)
    for i, t in enumerate(tags):
        tag_block[i // 4] |= t << (2 * (i % 4))
    codes = bytes([0x80, 0x00, 0x01, 0x80, 0xFF, 0xFF]) + u32(np.float32([1e-30, -0.0])).tobytes() + bytes([0x7F, 1, 0])
    payload = bytes(tag_block) + codes
    want = u32(codec.decode(payload, n, k))
    rec, _ = run_decompressor(64, [payload], [n], [k])
    check_decompressed(rec, [want], 64)


# ----------------------------------------------------------------------------------------------
# round trip


class RoundTrip(wiring.Component):
    """Compressor → Decompressor; ``n``/``k`` of the decompressor are set by the testbench."""

    def __init__(self, width, max_elements):
        self.comp = Compressor(width, max_elements)
        self.dec = Decompressor(width, max_elements)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.comp = self.comp
        m.submodules.dec = self.dec
        wiring.connect(m, self.comp.o, self.dec.i)
        return m


@pytest.mark.parametrize("width", WIDTHS)
def test_round_trip_is_quantize(width):
    rng = np.random.default_rng(50 + width)
    counts = [MAX, 1, 33, 100, 2, 64, 31]
    ks = [KS[i % len(KS)] for i in range(len(counts))]
    frames = frame_set(rng, counts, ks)
    top = RoundTrip(width, MAX)
    comp, dec = top.comp, top.dec
    rec = Received()

    def set_k(ctx, f):
        ctx.set(comp.k, ks[f])

    async def link(ctx):
        """Give the decompressor the count and k of each frame before its first beat."""
        f = 0
        ctx.set(dec.n, counts[0])
        ctx.set(dec.k, ks[0])
        while f < len(frames):
            _, _, v, r, last = await ctx.tick().sample(dec.i.valid, dec.i.ready, dec.i.payload.last)
            if v and r and last:
                f += 1
                if f < len(frames):
                    ctx.set(dec.n, counts[f])
                    ctx.set(dec.k, ks[f])

    simulate(top,
             source(comp.i, [value_beats(g, width) for g in frames], valid_prob=0.8, seed=3, on_frame=set_k),
             link,
             sink(dec.o, len(frames), width, rec, error=dec.error, ready_prob=0.7, seed=4))
    check_decompressed(rec, [u32(codec.quantize(g, k)) for g, k in zip(frames, ks)], width)
    assert rec.errors == [0] * len(frames)


# ----------------------------------------------------------------------------------------------
# malformed frames


@pytest.mark.parametrize("width", WIDTHS)
def test_decompressor_malformed_frames(width):
    """Wrong lengths, bad padding and bad counts set ``error`` and never hang; good frames after
    them decode exactly. Outputs follow the documented rule (:func:`lenient_decode`)."""
    rng = np.random.default_rng(60 + width)
    nb = width // 8
    k = 10
    cases = []  # (payload, n given, n used, error)

    def good(n):
        p = codec.encode(gradients(rng, n, k), k)
        cases.append((p, n, n, 0))
        return p

    good(40)
    p = codec.encode(gradients(rng, 40, k), k)
    assert len(p) > 8 + 3
    cases.append((p[:-3], 40, 40, 1))                            # codes cut short
    good(1)
    cases.append((p + rng.bytes(5), 40, 40, 1))                  # a few extra bytes
    cases.append((p + rng.bytes(3 * nb + 1), 40, 40, 1))         # several extra beats
    p = codec.encode(gradients(rng, MAX, k), k)
    cases.append((p[:5], MAX, MAX, 1))                           # ends inside the tag block
    cases.append((p[:codec.tag_bytes(MAX)], MAX, MAX, 1))        # tag block only
    good(MAX)
    p = bytearray(codec.encode(gradients(rng, 33, k), k))
    p[8] |= 1 << 2                                               # tag slot 33 of n = 33: padding
    cases.append((bytes(p), 33, 33, 1))
    # Bad padding in a frame of one output beat: the generator takes the bank's error in the cycle
    # after the tag block ends, while the padding check is still in its registers.
    for n, byte, bit in ((2, 0, 6), (1, 7, 7), (2, 3, 0)):
        p = bytearray(codec.encode(gradients(rng, n, k), k))
        p[byte] |= 1 << bit
        cases.append((bytes(p), n, n, 1))
        good(n)
    p = codec.encode(gradients(rng, 1, k), k)
    cases.append((p, 0, 1, 1))                                   # n = 0 is used as 1
    p = codec.encode(gradients(rng, MAX + 5, k), k)
    cases.append((p, MAX + 5, MAX, 1))                           # n > max_elements
    cases.append((codec.encode(np.zeros(70, dtype=np.float32), k), 70, 70, 0))  # no code bytes
    good(33)

    payloads = [c[0] for c in cases]
    for valid_prob, ready_prob in ((1.0, 1.0), (0.7, 0.6)):
        rec, _ = run_decompressor(width, payloads, [c[1] for c in cases], [k] * len(cases),
                                  valid_prob=valid_prob, ready_prob=ready_prob, seed=width)
        want = [u32(lenient_decode(p, used, k)) for p, _, used, _ in cases]
        check_decompressed(rec, want, width)
        assert rec.errors == [c[3] for c in cases]
    for p, n, used, err in cases:  # the golden decoder agrees on which payloads are malformed
        if n != used:
            continue  # a count the hardware cannot hold, not a malformed payload
        if err:
            with pytest.raises(ValueError):
                codec.decode(p, n, k)
        else:
            codec.decode(p, n, k)


@pytest.mark.parametrize("width", WIDTHS)
def test_compressor_too_many_values(width):
    """A frame of more than max_elements values: the first max_elements are compressed, ``error``."""
    rng = np.random.default_rng(70 + width)
    k = 9
    frames = [gradients(rng, n, k) for n in (MAX + 7, 5, MAX, MAX + 2 * width // 32 + 1, 1)]
    rec, _ = run_compressor(width, frames, [k] * len(frames), valid_prob=0.8, ready_prob=0.7, seed=2)
    assert [rec.frames[f] == codec.encode(g[:MAX], k) for f, g in enumerate(frames)] == [True] * len(frames)
    assert rec.errors == [1, 0, 0, 1, 0]
    check_beat_format(rec, width)


@pytest.mark.parametrize("width", WIDTHS)
def test_compressor_frame_without_values(width):
    """One beat with ``keep`` = 0: answered by one empty beat with ``error``; the next frame is fine."""
    dut = Compressor(width, MAX)
    g = gradients(np.random.default_rng(3), 5, 6)
    rec = Received()
    empty = [{"data": 0, "keep": 0, "last": 1}]
    simulate(dut,
             source(dut.i, [empty, value_beats(g, width), empty], on_frame=lambda ctx, f: ctx.set(dut.k, 6)),
             sink(dut.o, 3, width, rec, error=dut.error))
    assert rec.frames == [b"", codec.encode(g, 6), b""]
    assert rec.keeps[0] == [0] and rec.keeps[2] == [0]
    assert rec.errors == [1, 0, 1]


# ----------------------------------------------------------------------------------------------
# largest frames (MTU 1500)


@pytest.mark.parametrize("width", WIDTHS)
def test_mtu1500_frames(width):
    rng = np.random.default_rng(80 + width)
    counts = [MTU_MAX, MTU_MAX - 1, 1, MTU_MAX]
    ks = [6, 24, 12, 15]
    frames = frame_set(rng, counts, ks)
    rec, _ = run_compressor(width, frames, ks, max_elements=MTU_MAX, ready_prob=0.8, seed=5)
    check_compressed(rec, frames, ks, width)
    rec, _ = run_decompressor(width, rec.frames, counts, ks, max_elements=MTU_MAX, valid_prob=0.8, seed=6)
    check_decompressed(rec, [u32(codec.quantize(g, k)) for g, k in zip(frames, ks)], width)
    assert rec.errors == [0] * len(frames)


# ----------------------------------------------------------------------------------------------
# throughput and latency (ready and valid held high)


def beats(nbytes: int, width: int) -> int:
    return -(-nbytes // (width // 8))


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("n", [MTU_MAX, 33, 1])
def test_compressor_throughput(width, n):
    """Frames back to back: each costs at most max(input beats, output beats) + 2 cycles, and a
    stream of long frames is taken at ≥ 0.95 input beats per cycle."""
    rng = np.random.default_rng(90 + n)
    k = 8
    frames = [gradients(rng, n, k) for _ in range(8)]
    rec, acc = run_compressor(width, frames, [k] * len(frames), max_elements=MTU_MAX)
    check_compressed(rec, frames, [k] * len(frames), width)
    n_in = [beats(4 * n, width) for _ in frames]
    n_out = [len(kp) for kp in rec.keeps]
    total = rec.cycles[-1][-1] - acc[0] + 1
    # The first frame must all be in before it leaves: latency ≤ 9 cycles after its last beat
    # (7 … 9: two input stages, the input beat and its classification, then compaction, packing,
    # the buffers and the output packer).
    latency = rec.cycles[0][0] - acc[n_in[0] - 1]
    assert latency <= 9, latency
    # Ping-pong: frame f comes in while frame f-1 goes out.
    bound = n_in[0] + latency + sum(max(i, o) + 2 for i, o in zip(n_in[1:], n_out)) + n_out[-1] + 2
    assert total <= bound, (total, bound, n_in, n_out)
    if n == MTU_MAX:
        assert len(acc) / (acc[-1] - acc[0] + 1) >= 0.95


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("n", [MTU_MAX, 33, 1])
def test_decompressor_throughput(width, n):
    """Frames back to back: each costs at most max(input beats, output beats) + 2 cycles; on
    long frames the output has at most one idle cycle per frame (none at 64 bit)."""
    rng = np.random.default_rng(100 + n)
    k = 8
    frames = [gradients(rng, n, k) for _ in range(8)]
    frames.append(np.full(n, -1.5, dtype=np.float32))  # all raw: the input is the bottleneck
    frames.append(np.zeros(n, dtype=np.float32))       # no codes: the output is the bottleneck
    payloads = [codec.encode(g, k) for g in frames]
    rec, acc = run_decompressor(width, payloads, [n] * len(frames), [k] * len(frames), max_elements=MTU_MAX)
    check_decompressed(rec, [u32(codec.quantize(g, k)) for g in frames], width)
    n_in = [beats(len(p), width) for p in payloads]
    n_out = [len(kp) for kp in rec.keeps]
    total = rec.cycles[-1][-1] - acc[0] + 1
    # The first output beat is taken 5 clock edges after the first input beat with code bytes
    # (input stage, chunk FIFO, byte buffer, code extraction, output register), 7 when it needs
    # bytes of the next input beat too or its tag block ends in that beat (512 bit: the tag
    # block passes the input stage, the tag buffer, the generator and the two descriptor registers,
    # P2 and D).
    first_code = codec.tag_bytes(n) // (width // 8)
    latency = rec.cycles[0][0] - acc[first_code]
    assert latency <= 7, latency
    assert total <= sum(max(i, o) + 2 for i, o in zip(n_in, n_out)) + latency, (total, n_in, n_out)
    if n == MTU_MAX:
        out = rec.all_cycles
        idle = (out[-1] - out[0] + 1) - len(out)
        assert idle <= (len(frames) if width == 512 else 1) + n_in[-2] - n_out[-2], idle


# ----------------------------------------------------------------------------------------------
# construction


@pytest.mark.parametrize("cls", [Compressor, Decompressor])
def test_bad_parameters(cls):
    with pytest.raises(ValueError, match="width"):
        cls(96, 10)
    with pytest.raises(TypeError, match="width"):
        cls("64", 10)
    with pytest.raises(ValueError, match="max_elements"):
        cls(64, 0)
    with pytest.raises(TypeError, match="max_elements"):
        cls(64, 10.0)
    with pytest.raises(ValueError, match="width"):
        BytePacker(48)


def test_bad_banks():
    for banks in (1, 3, 32, 4.0, True):
        with pytest.raises(ValueError, match="banks"):
            Compressor(64, 10, banks)


@pytest.mark.parametrize("cls", [Compressor, Decompressor])
def test_converts_to_verilog(cls):
    text = verilog.convert(cls(64, MTU_MAX), name=cls.__name__)
    assert f"module {cls.__name__}" in text
