"""Block tests of ``CompressedLengthCheck`` (hdl/codec/lencheck.py) in amaranth.sim.

The verdict is checked against an independent definition: a frame of ``n`` elements is malformed
when ``n`` is 0 or above ``max_elements``, when :func:`wirereduce.codec.decode` raises on its
payload (docs/codec.md "Payload layout": length, padding tags), or when its ``keep`` is not as a
stream's must be (full beats, a thermometer on the last). Beats are driven back to back and with
random gaps (random data, ``keep``, ``last`` and ``count`` on the idle cycles); every frame must
get exactly one ``done``, exactly ``latency`` cycles after the strobe of its last beat.
"""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.sim import Simulator
from wirereduce.hdl.codec.lencheck import CompressedLengthCheck
from wirereduce.hdl.params import silence_unused

from wirereduce import codec

MAX = {64: 371, 128: 700, 256: 1000, 512: 2112}
KS = [4, 8, 12, 17, 24]
COUNTS = [1, 31, 32, 33, 64, 65]


# ----------------------------------------------------------------------------------------------
# frames


def values(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """fp32 values of every tag: below the error bound, small, medium, ≥ 1, ±Inf and NaN."""
    kind = rng.integers(0, 6, n)
    lo_hi = {0: (-k - 20, -k), 1: (-k, 7 - k), 2: (min(7 - k, -1), min(15 - k, 0)), 3: (0, 30)}
    mag = np.zeros(n, dtype=np.float32)
    for t, (lo, hi) in lo_hi.items():
        sel = kind == t
        mag[sel] = (2.0 ** rng.uniform(lo, hi, int(sel.sum()))).astype(np.float32)
    sel = kind == 4
    mag[sel] = rng.choice(np.array([0.0, np.inf, np.nan, 1.0], dtype=np.float32), int(sel.sum()))
    sign = np.where(rng.random(n) < 0.5, np.float32(-1), np.float32(1))
    return (mag * sign).astype(np.float32)


def malformed(payload: bytes, n: int, max_elements: int) -> bool:
    """The expected verdict on a payload whose beats are well formed."""
    if n == 0 or n > max_elements:
        return True
    try:
        codec.decode(payload, n, 10)
    except ValueError:
        return True
    return False


def beats_of(payload: bytes, width: int) -> list[tuple[int, int, int]]:
    """(data, keep, last) of each beat; an empty payload is one empty beat."""
    nb = width // 8
    chunks = [payload[o:o + nb] for o in range(0, len(payload), nb)] or [b""]
    return [(int.from_bytes(c.ljust(nb, b"\0"), "little"), (1 << len(c)) - 1, int(i == len(chunks) - 1))
            for i, c in enumerate(chunks)]


class Frame:
    def __init__(self, payload: bytes, n: int, width: int, max_elements: int, beats=None, error=None, what=""):
        self.n = n
        self.beats = beats if beats is not None else beats_of(payload, width)
        self.error = malformed(payload, n, max_elements) if error is None else error
        self.what = what

    def __repr__(self):
        return f"Frame(n={self.n}, beats={len(self.beats)}, error={self.error}, {self.what})"


def set_padding_tag(payload: bytes, n: int, rng, with_code: bool = False) -> bytes:
    """The payload with a padding tag (element n … 32*ceil(n/32) - 1) made non-zero; with
    ``with_code`` also as many bytes appended as that tag's code has, so that only the padding
    (not the length the tags announce, padding included) is wrong."""
    e = int(rng.integers(n, 32 * -(-n // 32)))
    tag = int(rng.integers(1, 4))
    b = bytearray(payload)
    b[e // 4] |= tag << (2 * (e % 4))
    return bytes(b) + (rng.bytes(codec.CODE_BYTES[tag]) if with_code else b"")


def corrupt(rng, payload: bytes, n: int, width: int, maxn: int) -> list[Frame]:
    """The payload, truncated (by 1, a few, into the tag block, to nothing), extended, with a
    padding tag set, and its n replaced by 0 and by max_elements + 1."""
    tb = codec.tag_bytes(n)
    out = [Frame(payload, n, width, maxn, what="as encoded")]
    cuts = {1, 2, 3, 5, int(rng.integers(1, len(payload) + 1)), len(payload) - tb + 1, len(payload)}
    for d in sorted(c for c in cuts if 1 <= c <= len(payload)):
        out.append(Frame(payload[:-d], n, width, maxn, what=f"short by {d}"))
    for d in (1, 4, int(rng.integers(1, 70))):
        out.append(Frame(payload + rng.bytes(d), n, width, maxn, what=f"long by {d}"))
    if n % 32:
        out.append(Frame(set_padding_tag(payload, n, rng), n, width, maxn, what="padding tag"))
        for _ in range(3):
            out.append(Frame(set_padding_tag(payload, n, rng, with_code=True), n, width, maxn,
                             what="padding tag and its code"))
    out.append(Frame(payload, 0, width, maxn, what="n = 0"))
    out.append(Frame(b"", 0, width, maxn, what="n = 0, empty"))
    out.append(Frame(payload, maxn + 1, width, maxn, what="n > max"))
    return out


def random_frame(rng, width: int, maxn: int) -> Frame:
    """A random frame: a random size, k and corruption (about half well formed)."""
    n = int(rng.choice([1, 2, 31, 32, 33, maxn, int(rng.integers(1, maxn + 1)), int(rng.integers(1, 100))]))
    k = int(rng.choice(KS))
    payload = codec.encode(values(rng, n, k), k)
    how = int(rng.integers(0, 10))
    if how == 0:
        d = int(rng.integers(1, len(payload) + 1))
        return Frame(payload[:-d], n, width, maxn, what=f"short by {d}")
    if how == 1:
        d = int(rng.integers(1, 20))
        return Frame(payload + rng.bytes(d), n, width, maxn, what=f"long by {d}")
    if how == 2 and n % 32:
        return Frame(set_padding_tag(payload, n, rng, with_code=bool(rng.integers(0, 2))), n, width, maxn,
                     what="padding tag")
    if how == 3:
        bad_n = int(rng.choice([0, maxn + 1, 65535]))
        return Frame(payload, bad_n, width, maxn, what=f"n = {bad_n}")
    if how == 4:
        # Another n, keeping the payload: right or wrong as decode says.
        other = int(rng.integers(1, maxn + 1))
        return Frame(payload, other, width, maxn, what=f"n {n} -> {other}")
    return Frame(payload, n, width, maxn, what="as encoded")


# ----------------------------------------------------------------------------------------------
# driver


def run(width: int, maxn: int, frames: list[Frame], *, gap_prob: float = 0.0, seed: int = 0):
    """Drive ``frames`` into a fresh checker; check the timing and the verdict of every frame."""
    dut = CompressedLengthCheck(width, maxn)
    lat = dut.latency
    rng = np.random.default_rng(seed)
    nb = width // 8
    last_cycles: list[int] = []
    verdicts: list[tuple[int, int]] = []

    async def tb(ctx):
        cycle = 0

        async def step():
            nonlocal cycle
            _, _, done, err = await ctx.tick().sample(dut.done, dut.error)
            if done:
                verdicts.append((cycle, int(err)))
            cycle += 1

        for f in frames:
            for data, keep, last in f.beats:
                while gap_prob and rng.random() < gap_prob:
                    # Idle: the beat fields are noise and must be ignored.
                    ctx.set(dut.strobe, 0)
                    ctx.set(dut.beat.data, int.from_bytes(rng.bytes(nb), "little"))
                    ctx.set(dut.beat.keep, int(rng.integers(0, 1 << nb)) if nb < 63 else (1 << nb) - 1)
                    ctx.set(dut.beat.last, int(rng.integers(0, 2)))
                    ctx.set(dut.beat.hdr.count, int(rng.integers(0, 65536)))
                    await step()
                ctx.set(dut.strobe, 1)
                ctx.set(dut.beat.data, data)
                ctx.set(dut.beat.keep, keep)
                ctx.set(dut.beat.last, last)
                ctx.set(dut.beat.hdr.count, f.n)
                if last:
                    last_cycles.append(cycle)
                await step()
        ctx.set(dut.strobe, 0)
        for _ in range(lat + 4):
            await step()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()

    assert [c for c, _ in verdicts] == [c + lat for c in last_cycles], "done not exactly latency after each last beat"
    wrong = [(i, f) for i, (f, (_, e)) in enumerate(zip(frames, verdicts)) if e != int(f.error)]
    assert not wrong, f"{len(wrong)} wrong verdicts of {len(frames)}, first: {wrong[:5]}"
    return dut


def frame_set(width: int, seed: int) -> list[Frame]:
    rng = np.random.default_rng(seed)
    maxn = MAX[width]
    frames = []
    for i, n in enumerate([*COUNTS, maxn]):
        k = KS[i % len(KS)]
        frames += corrupt(rng, codec.encode(values(rng, n, k), k), n, width, maxn)
    return frames


# ----------------------------------------------------------------------------------------------
# tests


@pytest.mark.parametrize("width", [64, 512])
def test_sizes_and_corruptions_back_to_back(width):
    frames = frame_set(width, seed=width)
    assert any(f.error for f in frames) and any(not f.error for f in frames)
    run(width, MAX[width], frames)


@pytest.mark.parametrize("width", [64, 512])
def test_sizes_and_corruptions_with_gaps(width):
    run(width, MAX[width], frame_set(width, seed=width + 1), gap_prob=0.3, seed=width)


@pytest.mark.parametrize("width", [64, 512])
def test_random_frames(width):
    rng = np.random.default_rng(1000 + width)
    frames = [random_frame(rng, width, MAX[width]) for _ in range(200)]
    assert 40 < sum(f.error for f in frames) < 160
    # Back to back for the first half, with gaps for the second.
    run(width, MAX[width], frames[:100], seed=width)
    run(width, MAX[width], frames[100:], gap_prob=0.2, seed=width + 7)


@pytest.mark.parametrize("width", [64, 512])
def test_single_beat_frames(width):
    """Frames of one beat back to back, including empty ones (keep = 0) and one byte ones."""
    rng = np.random.default_rng(5)
    maxn = MAX[width]
    frames = []
    for _ in range(40):
        n = int(rng.integers(1, 33))
        payload = codec.encode(values(rng, n, 8), 8)[:width // 8]
        frames.append(Frame(payload[:int(rng.integers(0, len(payload) + 1))], n, width, maxn))
        frames.append(Frame(payload, n, width, maxn))
    frames.append(Frame(b"", 1, width, maxn))
    assert all(len(f.beats) == 1 for f in frames)
    run(width, maxn, frames)


@pytest.mark.parametrize("width", [64, 512])
def test_keep_errors(width):
    """A beat before the last that is not full, or a last beat whose keep has a hole, is an
    error even when the bytes would otherwise be right."""
    rng = np.random.default_rng(9)
    maxn = MAX[width]
    nb = width // 8
    frames = []
    for n in (100, 400, maxn):
        payload = codec.encode(values(rng, n, 10), 10)
        good = beats_of(payload, width)
        assert len(good) >= 2
        frames.append(Frame(payload, n, width, maxn))
        # A middle beat with its top byte dropped: the length is off as well.
        beats = list(good)
        d, _, lst = beats[0]
        beats[0] = (d, (1 << nb) - 1 - (1 << (nb - 1)), lst)
        frames.append(Frame(payload, n, width, maxn, beats=beats, error=True, what="short middle beat"))
        # A middle beat with a hole and a last beat one byte longer: the byte count matches.
        beats = list(good)
        if beats[-1][1] != (1 << nb) - 1:
            d, _, lst = beats[0]
            beats[0] = (d, (1 << nb) - 1 - 2, lst)
            d, k, lst = beats[-1]
            beats[-1] = (d, (k << 1) | 1, lst)
            frames.append(Frame(payload, n, width, maxn, beats=beats, error=True, what="hole in a middle beat"))
        # A last beat whose keep is not a thermometer (same number of bytes).
        d, k, lst = good[-1]
        cnt = bin(k).count("1")
        if 1 <= cnt < nb:
            beats = list(good)
            beats[-1] = (d, ((1 << cnt) - 1) ^ 1 | (1 << cnt), lst)
            frames.append(Frame(payload, n, width, maxn, beats=beats, error=True, what="holey last keep"))
        frames.append(Frame(payload, n, width, maxn))
    run(width, maxn, frames, gap_prob=0.1, seed=3)


@pytest.mark.parametrize("width", [64, 512])
def test_very_long_frames(width):
    """Frames far longer than any well-formed one: zeros (tag 0, no codes) of 2**j beats and the
    8 bytes of one tag word, which a beat counter that wrapped unnoticed would take for n = 1's
    8-byte payload; each followed by a good frame."""
    rng = np.random.default_rng(11)
    maxn = MAX[width]
    good = codec.encode(values(rng, 5, 8), 8)
    frames = []
    for j in range(6, 12):
        frames.append(Frame(bytes((width // 8) * 2 ** j + 8), 1, width, maxn, what=f"2**{j} beats"))
        frames.append(Frame(good, 5, width, maxn))
    assert [f.error for f in frames] == [True, False] * 6
    run(width, maxn, frames)


@pytest.mark.parametrize("width", [128, 256])
def test_other_widths(width):
    rng = np.random.default_rng(width)
    frames = frame_set(width, seed=width)[::2] + [random_frame(rng, width, MAX[width]) for _ in range(30)]
    run(width, MAX[width], frames, gap_prob=0.15, seed=width)


def test_latency():
    """4 cycles at 64 bit, 5 at 128 … 512 (the docstring's figures)."""
    for w, lat in ((64, 4), (128, 5), (256, 5), (512, 5)):
        dut = CompressedLengthCheck(w, 2112)
        silence_unused(dut)
        assert dut.latency == lat


def test_converts_to_verilog():
    dut = CompressedLengthCheck(512, 2112)
    text = verilog.convert(dut, name="lencheck512")
    assert "module lencheck512" in text


@pytest.mark.parametrize("width, maxn, exc", [
    (96, 100, ValueError), (2048, 100, ValueError), (64.0, 100, TypeError),
    (64, 0, ValueError), (64, 65536, ValueError), (64, 1.5, TypeError), (64, True, TypeError),
])
def test_rejects_bad_parameters(width, maxn, exc):
    with pytest.raises(exc):
        CompressedLengthCheck(width, maxn)
