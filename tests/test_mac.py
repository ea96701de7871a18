"""10G Ethernet MAC (hdl/eth/mac.py): amaranth.sim block tests, and cocotb tests of its Verilog with cocotbext-eth.

The block tests drive the XGMII and the frame streams cycle by cycle and check against values
computed here independently: FCS with :func:`zlib.crc32`, frames built with scapy, the line
decoded byte by byte. The cocotb tests (``-m cocotb``) build one Verilator model of
:class:`tb_mac.MacTop` and run the testbenches of ``tests/cocotb/tb_mac.py``.
"""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path

import pytest
from amaranth import Const, Module, Signal
from amaranth.lib import wiring
from amaranth.sim import Simulator
from wirereduce.hdl.eth.mac import (
    FCS_ALGORITHM,
    JUMBO_FRAME_BYTES,
    MacRx,
    MacTx,
    RxCutThrough,
    RxDropBad,
    crc_update,
    fcs_value,
)

IDLE, START, TERM, ERROR = 0x07, 0xFB, 0xFD, 0xFE
SFD_TAIL = bytes([0x55] * 6 + [0xD5])  # what follows /S/ in a frame's first column


# --- independent models -------------------------------------------------------------------------

def fcs(frame: bytes) -> bytes:
    return struct.pack("<I", zlib.crc32(frame))


def padded(frame: bytes) -> bytes:
    return frame.ljust(60, b"\0")


def eth(payload_bytes: int, seed: int = 0) -> bytes:
    """An Ethernet II frame (no FCS) of ``14 + payload_bytes`` bytes, built with scapy."""
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    rnd = random.Random(seed)
    body = bytes(rnd.randrange(256) for _ in range(payload_bytes))
    return bytes(Ether(dst="02:00:00:00:00:01", src="02:00:00:00:00:02", type=0x88B5) / Raw(body))


def udp(payload_bytes: int) -> bytes:
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    return bytes(Ether(dst="02:00:00:00:00:01", src="02:00:00:00:00:02") / IP(dst="10.0.0.1") / UDP(dport=4791)
                 / Raw(b"\xa5" * payload_bytes))


def on_line(body: bytes, ctrl_at: dict[int, int] | None = None) -> list[tuple[int, int]]:
    """Frame bytes after the SFD as (byte, ctrl) pairs; ``ctrl_at`` puts control characters at offsets."""
    pairs = [(b, 0) for b in body]
    for pos, ch in (ctrl_at or {}).items():
        pairs[pos] = (ch, 1)
    return pairs


def columns(frames: list[list[tuple[int, int]]], gap: int = 12, sfd: int = 0xD5) -> list[tuple[int, int]]:
    """XGMII columns of ``frames`` (each the (byte, ctrl) pairs after the SFD).

    /S/ goes at the first lane 0 or lane 4 at least ``gap`` bytes after the previous /T/ (so
    the gaps are ``gap`` … ``gap + 3`` and both start lanes occur).
    """
    seq = [(IDLE, 1)] * 8
    for f in frames:
        while len(seq) % 4:
            seq.append((IDLE, 1))
        seq += [(START, 1)] + [(0x55, 0)] * 6 + [(sfd, 0)] + list(f) + [(TERM, 1)] + [(IDLE, 1)] * (gap - 1)
    seq += [(IDLE, 1)] * (-len(seq) % 8 + 24)
    return [(sum(b << 8 * k for k, (b, _) in enumerate(seq[n:n + 8])),
             sum(c << k for k, (_, c) in enumerate(seq[n:n + 8]))) for n in range(0, len(seq), 8)]


def parse_line(cols: list[tuple[int, int]]) -> list[dict]:
    """Frames on an XGMII line: ``start`` / ``end`` byte positions of /S/ and of the control
    character that ended the frame (``ender``), and the ``body`` bytes between them."""
    frames, cur = [], None
    for n, (d, c) in enumerate(cols):
        for lane in range(8):
            b, k, pos = (d >> 8 * lane) & 0xFF, (c >> lane) & 1, 8 * n + lane
            if cur is None:
                assert k, f"data byte {b:#04x} outside a frame at byte {pos}"
                if b == START:
                    cur = {"start": pos, "body": bytearray()}
            elif k:
                cur.update(end=pos, ender=b)
                frames.append(cur)
                cur = None
            else:
                cur["body"].append(b)
    assert cur is None, "the line ends inside a frame"
    return frames


def beats_of(frame: bytes) -> list[tuple[int, int, int]]:
    out = []
    for off in range(0, len(frame), 8):
        chunk = frame[off:off + 8]
        out.append((int.from_bytes(chunk.ljust(8, b"\0"), "little"), (1 << len(chunk)) - 1, int(off + 8 >= len(frame))))
    return out


def run(dut, testbench, vcd: str | None = None):
    sim = Simulator(dut)
    sim.add_clock(6.4e-9)
    sim.add_testbench(testbench)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()


BUBBLE = "bubble"


async def drive_tx(ctx, tx: MacTx, items: list, tail_cycles: int = 40) -> list[tuple[int, int]]:
    """Offer beats ``(data, keep, last, stomp, abort)`` (or BUBBLE: one cycle without a beat) to
    ``tx.i``; return the XGMII column of every cycle."""
    cols = []
    i = after = 0
    while after < tail_cycles:
        item = items[i] if i < len(items) else None
        beat = item if isinstance(item, tuple) else None
        ctx.set(tx.i.valid, beat is not None)
        if beat is not None:
            d, keep, last, stomp, abort = beat
            ctx.set(tx.i.payload.data, d)
            ctx.set(tx.i.payload.keep, keep)
            ctx.set(tx.i.payload.last, last)
            ctx.set(tx.stomp, stomp)
            ctx.set(tx.abort, abort)
        else:
            ctx.set(tx.abort, 0)
        _, _, ready, d, c = await ctx.tick().sample(tx.i.ready, tx.xgmii.data, tx.xgmii.ctrl)
        cols.append((d, c))
        if item is BUBBLE or (beat is not None and ready):
            i += 1
        elif item is None:
            after += 1
    return cols


def tx_items(frame: bytes, stomp: int = 0, abort_beat: int | None = None, bubble_after: int | None = None):
    out = []
    for n, (d, keep, last) in enumerate(beats_of(frame)):
        out.append((d, keep, last, stomp, int(n == abort_beat)))
        if n == bubble_after:
            out.append(BUBBLE)
    return out


def collect_frames(beats) -> list[dict]:
    """Frames from sampled beats of a MacRx output (or a beat_layout stream)."""
    frames, cur = [], bytearray()
    for p in beats:
        n = bin(int(p.keep)).count("1")
        cur += int(p.data).to_bytes(8, "little")[:n]
        if p.last:
            rec = {"data": bytes(cur)}
            if hasattr(p, "bad"):
                rec["bad"] = int(p.bad)
            if hasattr(p, "error"):
                rec["error"] = {k: int(getattr(p.error, k)) for k in ("fcs", "runt", "oversize", "code", "stomped")}
            frames.append(rec)
            cur = bytearray()
    assert not cur, "a frame without its last beat"
    return frames


async def drive_rx(ctx, port, cols, out, ready_fn=None):
    """Put ``cols`` on the XGMII ``port`` one a cycle; collect beats of ``out`` (a stream)."""
    beats = []
    for d, c in cols + [(0x0707070707070707, 0xFF)] * 8:  # the receiver's latency
        ctx.set(port.data, d)
        ctx.set(port.ctrl, c)
        r = 1 if ready_fn is None else ready_fn()
        if not isinstance(out.ready, Const):
            ctx.set(out.ready, r)
        _, _, v, p = await ctx.tick().sample(out.valid, out.payload)
        if v and r:
            beats.append(p)
    return beats


def stats_of(ctx, view, names) -> dict[str, int]:
    return {n: ctx.get(getattr(view, n)) for n in names}


RX_COUNTERS = ("frames_ok", "bytes_ok", "fcs_errors", "runts", "oversize", "errors", "stomped")


# --- CRC --------------------------------------------------------------------------------------

def test_crc_update_matches_zlib():
    """The 0 … 8-byte CRC networks continue any CRC state exactly as zlib.crc32 does."""
    state = Signal(32)
    word = Signal(64)
    regs = [Signal(32, name=f"crc{k}") for k in range(9)]
    outs = [Signal(32, name=f"fcs{k}") for k in range(9)]
    m = Module()
    for k, (r, o) in enumerate(zip(regs, outs)):
        m.d.comb += [r.eq(crc_update(state, word, k)), o.eq(fcs_value(r))]
    rnd = random.Random(5)

    async def tb(ctx):
        for prefix_len in (0, 1, 7, 8, 13, 64):
            prefix = bytes(rnd.randrange(256) for _ in range(prefix_len))
            data = bytes(rnd.randrange(256) for _ in range(8))
            # zlib's running value is the reflected, inverted register.
            reg = int(f"{zlib.crc32(prefix) ^ 0xFFFFFFFF:032b}"[::-1], 2)
            if not prefix:
                assert reg == FCS_ALGORITHM.initial_crc
            ctx.set(state, reg)
            ctx.set(word, int.from_bytes(data, "little"))
            for k in range(9):
                assert ctx.get(outs[k]) == zlib.crc32(prefix + data[:k]), (prefix_len, k)

    sim = Simulator(m)
    sim.add_testbench(tb)
    sim.run()


# --- transmit -----------------------------------------------------------------------------------

def check_tx_frame(f: dict, frame: bytes, stomp: bool = False):
    body = bytes(f["body"])
    assert f["ender"] == TERM, f"frame ended with {f['ender']:#04x}, not /T/"
    assert f["start"] % 4 == 0, f"/S/ at byte {f['start']} is not in lane 0 or 4"
    assert body[:7] == SFD_TAIL, body[:7].hex()
    want = padded(frame)
    assert body[7:-4] == want, (len(body) - 11, len(want))
    good = fcs(want)
    assert body[-4:] == (bytes(b ^ 0xFF for b in good) if stomp else good)


def test_tx_fcs_padding_and_gap():
    """Every length around the padding and FCS boundaries, scapy UDP and 0x88B5 frames, a full-size
    frame; all offered back to back: preamble, padding, FCS (zlib), /S/ lanes, IFG ≥ 9 and the
    deficit idle count keeping the average at 12 bytes; the input never waits mid-frame."""
    lengths = [1, 14, 42, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 71, 72, 73, 100, 1514]
    frames = [eth(n - 14, seed=n) if n >= 14 else bytes(range(n)) for n in lengths]
    frames += [udp(18), udp(200)]
    rnd = random.Random(1)
    frames += [eth(rnd.randrange(46, 200), seed=100 + k) for k in range(24)]
    tx = MacTx()
    result = {}

    async def tb(ctx):
        items = [it for f in frames for it in tx_items(f)]
        result["cols"] = await drive_tx(ctx, tx, items)
        result["stats"] = stats_of(ctx, tx.stats, ("frames", "stomped", "aborted"))

    run(tx, tb)
    line = parse_line(result["cols"])
    assert len(line) == len(frames)
    for f, frame in zip(line, frames):
        check_tx_frame(f, frame)
    gaps = [b["start"] - a["end"] for a, b in zip(line, line[1:])]
    assert min(gaps) >= 9 and max(gaps) <= 15, gaps
    # The deficit idle count is 0 … 3, so over back-to-back frames the gaps sum to 12 each ± 3.
    assert abs(sum(gaps) - 12 * len(gaps)) <= 3, (sum(gaps), len(gaps))
    assert {f["start"] % 8 for f in line} == {0, 4}
    assert result["stats"] == {"frames": len(frames), "stomped": 0, "aborted": 0}
    # Line time: each frame costs its padded length + 24 bytes (preamble, FCS, IFG), within one column.
    wire = sum(len(padded(f)) + 24 for f in frames)
    assert line[-1]["end"] - line[0]["start"] <= wire


def test_tx_stomp_abort_underrun():
    """``stomp`` inverts the FCS (short padded frame and long frame); ``abort`` mid-frame and an
    underrun end the frame with /E/ and drop the rest of its beats; the next frames are intact."""
    f_short, f_long, f_a, f_b, f_c = eth(20, 1), eth(300, 2), eth(200, 3), eth(120, 4), eth(64, 5)
    tx = MacTx()
    result = {}

    async def tb(ctx):
        items = (tx_items(f_short, stomp=1) + tx_items(f_a, abort_beat=5) + tx_items(f_long, stomp=1)
                 + tx_items(f_b, bubble_after=3) + tx_items(f_c))
        result["cols"] = await drive_tx(ctx, tx, items)
        result["stats"] = stats_of(ctx, tx.stats, ("frames", "stomped", "aborted"))

    run(tx, tb)
    line = parse_line(result["cols"])
    assert len(line) == 5
    check_tx_frame(line[0], f_short, stomp=True)
    assert line[1]["ender"] == ERROR and bytes(line[1]["body"][7:]) == f_a[:40]
    check_tx_frame(line[2], f_long, stomp=True)
    assert line[3]["ender"] == ERROR and bytes(line[3]["body"][7:]) == f_b[:32]
    check_tx_frame(line[4], f_c)
    assert result["stats"] == {"frames": 3, "stomped": 2, "aborted": 2}


# --- receive ------------------------------------------------------------------------------------

def rx_run(cols, max_frame=1518, drop_bad=None, ready_fn=None, cut_through=False):
    """Simulate MacRx (and an RxDropBad after it if ``drop_bad`` is a dict of its parameters, or
    an RxCutThrough with those parameters if ``cut_through``)."""
    m = Module()
    m.submodules.rx = rx = MacRx(max_frame)
    out = rx.o
    if drop_bad is not None:
        m.submodules.drop = drop = (RxCutThrough if cut_through else RxDropBad)(max_frame, **drop_bad)
        wiring.connect(m, rx.o, drop.i)
        out = drop.o
    result = {}

    async def tb(ctx):
        beats = await drive_rx(ctx, rx.xgmii, cols, out, ready_fn)
        if ready_fn is not None:  # let a stalled consumer empty the FIFO
            beats += await drive_rx(ctx, rx.xgmii, [(0x0707070707070707, 0xFF)] * 3000, out)
        result["frames"] = collect_frames(beats)
        result["stats"] = stats_of(ctx, rx.stats, RX_COUNTERS)
        if drop_bad is not None:
            result["drop"] = stats_of(ctx, drop, ("overflow",) if cut_through else ("dropped", "overflow"))

    run(m, tb)
    return result


def test_rx_good_frames_both_lanes_min_gap():
    """Back-to-back frames with 5-byte gaps (the least a receiver may see), /S/ in lanes 0 and 4,
    every last-beat size: all come out intact and good, and the counters add up."""
    rnd = random.Random(7)
    frames = [padded(eth(rnd.randrange(0, 120), seed=k)) for k in range(40)] + [padded(udp(10)), eth(1500, 9)]
    cols = columns([on_line(f + fcs(f)) for f in frames], gap=5)
    line = parse_line(cols)
    assert {f["start"] % 8 for f in line} == {0, 4}
    assert min(b["start"] - a["end"] for a, b in zip(line, line[1:])) == 5
    res = rx_run(cols)
    assert [f["data"] for f in res["frames"]] == frames
    assert all(f["bad"] == 0 for f in res["frames"])
    assert res["stats"] == {"frames_ok": len(frames), "bytes_ok": sum(map(len, frames)), "fcs_errors": 0,
                            "runts": 0, "oversize": 0, "errors": 0, "stomped": 0}


def test_rx_bad_frames():
    """FCS error, runts, oversize (1519 bytes; 1518 passes), cut short by /E/, an idle mid-frame,
    a bad SFD: each marked on its last beat (or not output) and counted once; good frames between
    them are unaffected."""
    good = [padded(eth(k * 7, seed=k)) for k in range(8)]
    big_ok, big_bad = eth(1500, 11), eth(1501, 12)
    bad_fcs = eth(80, 13)
    runt = eth(30, 14)
    e_mid, i_mid = eth(100, 15), eth(100, 16)
    lines = [
        (on_line(good[0] + fcs(good[0])), "good", good[0]),
        (on_line(bad_fcs + bytes(b ^ 0x01 for b in fcs(bad_fcs))), "fcs", bad_fcs),
        (on_line(good[1] + fcs(good[1])), "good", good[1]),
        (on_line(runt + fcs(runt)), "runt", runt),
        (on_line(b"\x01\x02\x03"), "none", None),           # 3 bytes: nothing to output, a runt
        (on_line(big_ok + fcs(big_ok)), "good", big_ok),
        (on_line(big_bad + fcs(big_bad)), "oversize", big_bad),
        (on_line(good[2] + fcs(good[2])), "good", good[2]),
        (on_line(e_mid + fcs(e_mid), {50: ERROR}), "code", e_mid),
        (on_line(good[3] + fcs(good[3])), "good", good[3]),
        (on_line(i_mid + fcs(i_mid), {77: IDLE}), "code", i_mid),
        (on_line(good[4] + fcs(good[4])), "good", good[4]),
    ]
    cols = columns([f for f, _, _ in lines])
    # A start whose SFD is wrong: not received, counted in errors.
    cols += columns([on_line(good[5] + fcs(good[5]))], sfd=0xD4)
    cols += columns([on_line(good[6] + fcs(good[6]))])
    res = rx_run(cols)
    want = [(kind, f) for _, kind, f in lines if kind != "none"] + [("good", good[6])]
    got = res["frames"]
    assert len(got) == len(want), [(len(f["data"]), f["error"]) for f in got]
    for g, (kind, f) in zip(got, want):
        if kind == "good":
            assert g["data"] == f and not g["bad"]
            continue
        assert g["bad"] and g["error"] == {k: int(k == kind) for k in g["error"]}, (kind, g["error"])
        if kind in ("fcs", "runt"):
            assert g["data"] == f
        elif kind == "oversize":
            assert f.startswith(g["data"]) and len(g["data"]) <= 1518
        else:  # cut short: whole columns before the error
            assert f.startswith(g["data"]) and len(g["data"]) < len(f)
    n_good = sum(k == "good" for k, _ in want)
    assert res["stats"] == {
        "frames_ok": n_good, "bytes_ok": sum(len(f) for k, f in want if k == "good"),
        "fcs_errors": 1, "runts": 2, "oversize": 1, "errors": 3, "stomped": 0,
    }


def test_rx_jumbo_limit():
    """With max_frame = 9018 a 9014-byte frame (MTU 9000) is good and a 9015-byte one oversize."""
    ok, big = eth(9000, 1), eth(9001, 2)
    res = rx_run(columns([on_line(ok + fcs(ok)), on_line(big + fcs(big))]), max_frame=JUMBO_FRAME_BYTES)
    assert res["frames"][0]["data"] == ok and not res["frames"][0]["bad"]
    assert res["frames"][1]["error"]["oversize"]
    assert res["stats"]["frames_ok"] == 1 and res["stats"]["oversize"] == 1


# --- TX and RX together, and the drop-bad filter -------------------------------------------------

def test_loopback_tx_to_rx():
    """MacTx's line into MacRx (lane 0 and lane 4 starts as the DIC chooses): frames come back padded
    and good; a stomped frame comes back marked ``stomped`` (not an FCS error of this link), an
    aborted one as a code error."""
    rnd = random.Random(3)
    frames = [eth(rnd.randrange(0, 300), seed=k) for k in range(20)]
    m = Module()
    m.submodules.tx = tx = MacTx()
    m.submodules.rx = rx = MacRx()
    wiring.connect(m, tx.xgmii, rx.xgmii)
    result = {}

    async def tb(ctx):
        items = [it for f in frames for it in tx_items(f)]
        items += tx_items(eth(100, 50), stomp=1) + tx_items(eth(100, 51), abort_beat=4) + tx_items(frames[0])
        beats = []
        i = after = 0
        while after < 30:
            item = items[i] if i < len(items) else None
            ctx.set(tx.i.valid, item is not None)
            if item is not None:
                d, keep, last, stomp, abort = item
                ctx.set(tx.i.payload.data, d)
                ctx.set(tx.i.payload.keep, keep)
                ctx.set(tx.i.payload.last, last)
                ctx.set(tx.stomp, stomp)
                ctx.set(tx.abort, abort)
            _, _, ready, v, p = await ctx.tick().sample(tx.i.ready, rx.o.valid, rx.o.payload)
            if v:
                beats.append(p)
            if item is not None and ready:
                i += 1
            elif item is None:
                after += 1
        result["frames"] = collect_frames(beats)
        result["stats"] = stats_of(ctx, rx.stats, RX_COUNTERS)

    run(m, tb)
    got = result["frames"]
    assert [g["data"] for g in got[:20]] == [padded(f) for f in frames]
    assert not any(g["bad"] for g in got[:20])
    assert got[20]["data"] == eth(100, 50) and got[20]["bad"]
    assert got[20]["error"] == {"fcs": 0, "runt": 0, "oversize": 0, "code": 0, "stomped": 1}
    assert got[21]["error"]["code"] and eth(100, 51).startswith(got[21]["data"])
    assert got[22]["data"] == padded(frames[0]) and not got[22]["bad"]
    st = result["stats"]
    assert (st["frames_ok"], st["fcs_errors"], st["errors"], st["stomped"]) == (21, 0, 1, 1)


def test_drop_bad_filters_whole_frames():
    """RxDropBad behind MacRx with a consumer that stalls at random: exactly the good frames come
    out, whole and in order; bad ones are counted in ``dropped``."""
    rnd = random.Random(11)
    frames, want = [], []
    for k in range(30):
        f = padded(eth(rnd.randrange(0, 150), seed=k))
        kind = rnd.choice(["good", "good", "fcs", "runt", "cut"])
        if kind == "good":
            frames.append(on_line(f + fcs(f)))
            want.append(f)
        elif kind == "fcs":
            frames.append(on_line(f + bytes(b ^ 0x80 for b in fcs(f))))
        elif kind == "runt":
            frames.append(on_line(f[:40] + fcs(f[:40])))
        else:
            frames.append(on_line(f + fcs(f), {30: ERROR}))
    res = rx_run(columns(frames), drop_bad={}, ready_fn=lambda: rnd.random() < 0.8)
    assert [f["data"] for f in res["frames"]] == want
    assert res["drop"] == {"dropped": 30 - len(want), "overflow": 0}


def test_drop_bad_overflow_drops_whole_frames():
    """A stalled consumer and a 16-beat FIFO: frames that do not fit are lost whole, never cut."""
    frames = [padded(eth(60 + 8 * k, seed=k)) for k in range(8)]
    stall = iter([0] * 300)
    res = rx_run(columns([on_line(f + fcs(f)) for f in frames]), max_frame=128, drop_bad={"depth": 16},
                 ready_fn=lambda: next(stall, 1))
    out = [f["data"] for f in res["frames"]]
    assert out and all(f in frames for f in out)
    assert res["drop"]["overflow"] == len(frames) - len(out) > 0
    assert res["drop"]["dropped"] == 0


def _mixed_frames(rnd, n):
    """(line bytes, frame, kind) of ``n`` frames, good or spoilt: bad FCS, runt, cut short by /E/."""
    out = []
    for k in range(n):
        f = padded(eth(rnd.randrange(0, 150), seed=k))
        kind = rnd.choice(["good", "good", "fcs", "runt", "cut"])
        if kind == "good":
            out.append((on_line(f + fcs(f)), f, kind))
        elif kind == "fcs":
            out.append((on_line(f + bytes(b ^ 0x80 for b in fcs(f))), f, kind))
        elif kind == "runt":
            out.append((on_line(f[:40] + fcs(f[:40])), f[:40], kind))
        else:
            out.append((on_line(f + fcs(f), {30: ERROR}), f, kind))
    return out


def test_cut_through_marks_bad_frames_instead_of_dropping():
    """RxCutThrough behind MacRx with a consumer that stalls at random: every frame comes out, in
    order, good ones unmarked and whole, bad ones with ``bad`` on their last beat (an FCS error
    with all its bytes, one cut short by /E/ with the bytes before the cut)."""
    rnd = random.Random(12)
    frames = _mixed_frames(rnd, 30)
    res = rx_run(columns([line for line, _, _ in frames]), drop_bad={}, cut_through=True,
                 ready_fn=lambda: rnd.random() < 0.8)
    got = res["frames"]
    assert len(got) == len(frames)
    for g, (_, f, kind) in zip(got, frames):
        assert g["bad"] == (kind != "good"), kind
        if kind in ("good", "fcs", "runt"):
            assert g["data"] == f
        else:
            assert f.startswith(g["data"]) and len(g["data"]) < len(f)
    assert res["drop"] == {"overflow": 0}
    assert res["stats"]["fcs_errors"] == sum(k == "fcs" for _, _, k in frames)


def test_cut_through_overflow_drops_whole_frames():
    """A stalled consumer and a 40-beat FIFO: a frame is admitted only with room for a whole
    128-byte frame, so frames are lost whole (counted), and never cut or marked."""
    frames = [padded(eth(60 + 8 * k, seed=k)) for k in range(8)]
    stall = iter([0] * 300)
    res = rx_run(columns([on_line(f + fcs(f)) for f in frames]), max_frame=128, drop_bad={"depth": 40},
                 cut_through=True, ready_fn=lambda: next(stall, 1))
    out = [f["data"] for f in res["frames"]]
    assert out and all(f in frames for f in out)
    assert not any(f["bad"] for f in res["frames"])
    assert res["drop"]["overflow"] == len(frames) - len(out) > 0


def test_parameters_are_checked():
    with pytest.raises(ValueError, match="max_frame"):
        MacRx(max_frame=60)
    with pytest.raises(ValueError, match="depth"):
        RxDropBad(1518, depth=100)
    with pytest.raises(ValueError, match="depth"):
        RxCutThrough(1518, depth=100)


# --- cocotb: the Verilog with cocotbext-eth -------------------------------------------------------

COCOTB_CASES = ["tx_frames", "tx_stomp_abort", "rx_frames", "rx_errors"]


@pytest.fixture(scope="module")
def mac_sim(tmp_path_factory):
    from tb_mac import build

    return build(tmp_path_factory.mktemp("mac_verilator"))


@pytest.mark.cocotb
@pytest.mark.parametrize("case", COCOTB_CASES)
def test_mac_cocotb(case, mac_sim):
    """One cocotb testbench of tests/cocotb/tb_mac.py on the Verilator model of MacTop (built once)."""
    from tb_mac import run_case

    failures, log = run_case(mac_sim, case)
    assert failures == 0, f"cocotb test {case} failed; log {log}:\n" + "\n".join(
        Path(log).read_text(errors="replace").splitlines()[-40:])
