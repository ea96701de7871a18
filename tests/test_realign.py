"""The byte realigner (hdl/stream/realign.py) against a Python model of its frames, bit for bit.

Random frames of 0 bytes to several beats (some with an empty last beat), random ``bad`` and
side-channel values on every beat, random gaps on the input and random back-pressure on the
output; every kept byte, ``keep``, ``last``, ``bad`` and ``side`` of every output beat is
compared with what the model says. The model works on bytes (``frame[n:]``, ``head + frame``),
not on the design's shift registers.
"""

from __future__ import annotations

import random

import pytest
from amaranth.hdl import Fragment
from amaranth.sim import Simulator
from wirereduce.hdl.stream.frame import FrameStream
from wirereduce.hdl.stream.realign import Realigner

SIDE_BITS = 8


def make_frames(rng: random.Random, nb: int, count: int, n: int):
    """Frames as (bytes, empty_last, [(bad, side) per beat]); lengths around every beat boundary
    and around ``n``, 0 … 4 beats."""
    special = {0, 1, nb - 1, nb, nb + 1, 2 * nb, n - 1, n, n + 1, n + nb - 1, n + nb, n + nb + 1}
    lengths = sorted(x for x in special if x >= 0)
    frames = []
    for k in range(count):
        length = lengths[k] if k < len(lengths) else rng.randrange(0, 4 * nb + 1)
        frame = rng.randbytes(length)
        # A frame whose bytes end on a beat boundary may carry one more, empty, beat (BytePacker
        # does that); a frame of no bytes is a single empty beat.
        empty_last = length == 0 or (length % nb == 0 and rng.random() < 0.5)
        nbeats = -(-length // nb) + (1 if empty_last and length else 0) or 1
        frames.append((frame, empty_last, [(rng.getrandbits(1), rng.getrandbits(SIDE_BITS))
                                            for _ in range(nbeats)]))
    return frames


def input_beats(frame: bytes, empty_last: bool, extra, nb: int, rng: random.Random):
    """(data, keep, last, bad, side) of each input beat; bytes outside keep are random."""
    chunks = [frame[k:k + nb] for k in range(0, len(frame), nb)]
    if empty_last and chunks or not chunks:
        chunks.append(b"")
    beats = []
    for k, chunk in enumerate(chunks):
        raw = chunk + rng.randbytes(nb - len(chunk))
        bad, side = extra[k]
        beats.append((int.from_bytes(raw, "little"), (1 << len(chunk)) - 1, k == len(chunks) - 1, bad, side))
    return beats


def model(frame: bytes, empty_last: bool, extra, nb: int, *, strip: int = 0, head: bytes = b""):
    """Expected output beats (bytes, last, bad, side) of one frame."""
    n = strip or len(head)
    out = frame[strip:] if strip else head + frame
    chunks = [out[k:k + nb] for k in range(0, len(out), nb)]
    in_beats = len(extra)
    # Beats pass unshifted when n is whole beats: an empty last beat then stays one.
    if not chunks or (n % nb == 0 and empty_last and in_beats > 1):
        chunks.append(b"")
    shift = n if strip else -n
    last_in = in_beats - 1
    beats = []
    for j, chunk in enumerate(chunks):
        # The side of the input beat taken when output beat j leaves: the one holding the last
        # input byte that output beat j needs (the waiting first beat for head-only beats).
        src = min(max(((j + 1) * nb + shift - 1) // nb, 0), last_in)
        last = j == len(chunks) - 1
        beats.append((chunk, last, extra[last_in][0] if last else 0, extra[src][1]))
    return beats


def run(width: int, frames, *, strip: int = 0, heads=None, seed: int = 0, gap: float = 0.3, stall: float = 0.3,
        side: bool = True):
    nb = width // 8
    dut = Realigner(width, strip=strip, insert=len(heads[0]) if heads else 0, side=SIDE_BITS if side else None)
    rng = random.Random(seed)
    beats = [input_beats(f, e, x, nb, rng) for f, e, x in frames]
    expected = [b for k, (f, e, x) in enumerate(frames)
                for b in model(f, e, x, nb, strip=strip, head=heads[k] if heads else b"")]
    got = []
    i_cycles, o_cycles = [], []

    async def driver(ctx):
        cycle = 0
        for k, frame_beats in enumerate(beats):
            for index, (data, keep, last, bad, side_value) in enumerate(frame_beats):
                while rng.random() < gap:
                    ctx.set(dut.i.valid, 0)
                    ctx.set(dut.i.payload.data, rng.getrandbits(width))
                    await ctx.tick()
                    cycle += 1
                if heads:
                    # head is read until the frame's first beat is taken; garbage after that.
                    ctx.set(dut.head, int.from_bytes(heads[k], "little") if index == 0
                            else rng.getrandbits(8 * len(heads[k])))
                p = dut.i.payload
                ctx.set(p.data, data)
                ctx.set(p.keep, keep)
                ctx.set(p.last, last)
                ctx.set(p.bad, bad)
                if side:
                    ctx.set(p.side, side_value)
                ctx.set(dut.i.valid, 1)
                while True:
                    _, _, ready = await ctx.tick().sample(dut.i.ready)
                    cycle += 1
                    if ready:
                        i_cycles.append(cycle)
                        break
        ctx.set(dut.i.valid, 0)

    async def collector(ctx):
        orng = random.Random(seed + 1)
        cycle = 0
        idle = 0
        p = dut.o.payload
        fields = [dut.o.valid, p.data, p.keep, p.last, p.bad] + ([p.side] if side else [])
        while len(got) < len(expected) and idle < 200:
            ready = int(orng.random() >= stall)
            ctx.set(dut.o.ready, ready)
            _, _, valid, data, keep, last, bad, *side_value = await ctx.tick().sample(*fields)
            cycle += 1
            idle += 1
            if valid and ready:
                idle = 0
                o_cycles.append(cycle)
                count = bin(keep).count("1")
                assert keep == (1 << count) - 1, f"keep {keep:#x} not contiguous from byte 0"
                got.append((data.to_bytes(nb, "little")[:count], bool(last), bad, side_value[0] if side else None))
        for _ in range(20):       # nothing more may come out
            ctx.set(dut.o.ready, 1)
            _, _, valid = await ctx.tick().sample(dut.o.valid)
            assert not valid, "an output beat beyond the expected frames"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(driver)
    sim.add_testbench(collector)
    sim.run()
    if not side:
        expected = [(d, last, bad, None) for d, last, bad, _ in expected]
    assert len(got) == len(expected), f"{len(got)} output beats, expected {len(expected)}"
    for k, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"output beat {k}: got {g}, expected {e}"
    return i_cycles, o_cycles


STRIP_CASES = [(64, n) for n in (1, 2, 6, 7, 8, 14, 16, 17, 24)] + [(128, 14), (128, 16)] + \
    [(512, n) for n in (1, 14, 16, 50, 63, 64, 78, 128)]
INSERT_CASES = [(64, n) for n in (1, 2, 6, 8, 14, 16, 17, 24)] + [(128, 14), (128, 16)] + \
    [(512, n) for n in (1, 14, 16, 50, 64, 78, 128)]


@pytest.mark.parametrize("width, n", STRIP_CASES)
def test_strip_matches_model(width, n):
    rng = random.Random(width * 1000 + n)
    frames = make_frames(rng, width // 8, 40, n)
    run(width, frames, strip=n, seed=n)


@pytest.mark.parametrize("width, n", INSERT_CASES)
def test_insert_matches_model(width, n):
    rng = random.Random(width * 1000 + n + 7)
    frames = make_frames(rng, width // 8, 40, n)
    heads = [rng.randbytes(n) for _ in frames]
    run(width, frames, heads=heads, seed=n)


@pytest.mark.parametrize("width, strip, insert", [(64, 14, 0), (64, 0, 14), (512, 16, 0), (512, 0, 16)])
def test_without_side_channel_the_ports_are_frame_streams(width, strip, insert):
    dut = Realigner(width, strip=strip, insert=insert)
    assert dut.signature.members["i"].signature.flip() == FrameStream(width)
    assert dut.signature.members["o"].signature == FrameStream(width)
    Fragment.get(dut, None)
    rng = random.Random(width + strip)
    frames = make_frames(rng, width // 8, 12, strip or insert)
    heads = [rng.randbytes(insert) for _ in frames] if insert else None
    run(width, frames, strip=strip, heads=heads, seed=3, side=False)


@pytest.mark.parametrize("width, n", [(64, 14), (64, 16), (512, 14), (512, 16), (512, 64)])
def test_strip_takes_back_to_back_frames_one_beat_a_cycle(width, n):
    """Input always valid, output always ready: the input is taken every cycle, except that a
    one-beat frame after a frame with an extra last beat waits one cycle."""
    nb = width // 8
    rng = random.Random(n)
    frames = make_frames(rng, nb, 30, n)
    i_cycles, _ = run(width, frames, strip=n, seed=1, gap=0, stall=0)
    q, r = divmod(n, nb)
    waits = 0
    for (prev, prev_empty, prev_x), (_, _, x) in zip(frames, frames[1:]):
        # The extra last beat: the last beat is shifted (not the first one kept) and holds more than r bytes.
        last_bytes = 0 if prev_empty else len(prev) - nb * (len(prev_x) - 1)
        extra_beat = r and len(prev_x) > q + 1 and last_bytes > r
        waits += bool(extra_beat and len(x) == 1)
    assert i_cycles[-1] - i_cycles[0] + 1 == len(i_cycles) + waits


@pytest.mark.parametrize("width, n", [(64, 14), (64, 16), (512, 14), (512, 16), (512, 80)])
def test_insert_output_has_no_bubbles(width, n):
    """Input always valid, output always ready: an output beat leaves in every cycle."""
    rng = random.Random(n + 1)
    frames = make_frames(rng, width // 8, 30, n)
    heads = [rng.randbytes(n) for _ in frames]
    _, o_cycles = run(width, frames, heads=heads, seed=2, gap=0, stall=0)
    assert o_cycles[-1] - o_cycles[0] + 1 == len(o_cycles)


def test_parameters_are_checked():
    with pytest.raises(ValueError, match="exactly one of strip and insert"):
        Realigner(64)
    with pytest.raises(ValueError, match="exactly one of strip and insert"):
        Realigner(64, strip=2, insert=2)
    with pytest.raises(TypeError, match="strip must be an int"):
        Realigner(64, strip=1.5)
    with pytest.raises(ValueError, match="width"):
        Realigner(96, strip=2)
    with pytest.raises(TypeError):
        FrameStream("64")
    assert FrameStream(64) != FrameStream(512)
    assert repr(FrameStream(512)) == "FrameStream(512)"
