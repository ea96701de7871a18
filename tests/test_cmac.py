"""100G CMAC glue: receive store-and-forward with header strip, transmit with header and no underflow.

amaranth.sim, two unrelated clocks on each side of the AsyncFIFOs. Expectations come from the
frames as sent (bytes sliced in Python), never from the design.
"""

from __future__ import annotations

import random

import pytest
from amaranth.back import rtlil
from amaranth.sim import Simulator
from wirereduce.boards.cmac_ip import cmac_ip_tcl
from wirereduce.hdl.eth.port import eth_header
from wirereduce.hdl.xilinx.cmac import (
    ETH_MIN_FRAME_BYTES,
    Cmac100G,
    CmacRxGlue,
    CmacTxGlue,
    EthPrepend,
)

from wirereduce.protocol import ETHERTYPE

B = 64                      # bytes a beat
SYNC_PERIOD = 1 / 322.265625e6
MTU = 9000
MAX_ETH = 14 + MTU          # 9014


def beats_of(frame: bytes):
    out = []
    for off in range(0, len(frame), B):
        chunk = frame[off:off + B]
        out.append((int.from_bytes(chunk.ljust(B, b"\0"), "little"), (1 << len(chunk)) - 1, off + B >= len(frame)))
    return out


def eth(payload: bytes, rng: random.Random, ethertype: int = ETHERTYPE) -> bytes:
    return eth_header(rng.getrandbits(48), rng.getrandbits(48), ethertype) + payload


def payload(n: int, rng: random.Random) -> bytes:
    return rng.randbytes(n)


# ---------------------------------------------------------------- receive


async def drive_cmac_rx(ctx, port, frames, rng, gap_prob, start=20):
    """Drive the CMAC RX stream: frames of (bytes, tuser); random idle cycles, never back-pressured.

    The first frame starts after ``start`` cycles: the glue takes frames from 16 cycles after reset.
    """
    if start:
        await ctx.tick("cmac_rx").repeat(start)
    for frame, tuser in frames:
        for word, keep, last in beats_of(frame):
            while rng.random() < gap_prob:
                ctx.set(port.tvalid, 0)
                await ctx.tick("cmac_rx")
            ctx.set(port.tvalid, 1)
            ctx.set(port.tdata, word)
            ctx.set(port.tkeep, keep)
            ctx.set(port.tlast, last)
            ctx.set(port.tuser, tuser if last else rng.getrandbits(1))   # tuser only counts on the last beat
            await ctx.tick("cmac_rx")
    ctx.set(port.tvalid, 0)


async def collect(ctx, o, got, rng, ready_prob, stop, hold_cycles=0, marks=None):
    """Collect frames from a beat stream in sync until ``stop()`` and the stream stays idle; with
    ``marks`` (a list) each frame's ``bad`` (last beat) is appended to it, and ``bad`` must be 0 on
    every other beat."""
    cur = b""
    idle = 0
    cycle = 0
    while True:
        r = int(cycle >= hold_cycles and rng.random() < ready_prob)
        ctx.set(o.ready, r)
        _, _, v, data, keep, last, bad = await ctx.tick().sample(o.valid, o.payload.data, o.payload.keep,
                                                                 o.payload.last, o.payload.bad)
        cycle += 1
        if v and r:
            idle = 0
            n = bin(keep).count("1")
            assert keep == (1 << n) - 1, f"keep {keep:#x} not contiguous from byte 0"
            assert n > 0, "empty beat"
            cur += int(data).to_bytes(B, "little")[:n]
            if not last:
                assert n == B, "a beat before the last one is not full"
                assert not bad, "bad set on a beat other than the last"
            else:
                got.append(cur)
                if marks is not None:
                    marks.append(bad)
                cur = b""
        elif cycle > hold_cycles:
            idle += 1
        if stop() and idle > 200:
            assert cur == b"", f"a frame was left unfinished after {len(cur)} bytes"
            return


def run_rx(glue, frames, *, cmac_period, seed, gap_prob=0.4, ready_prob=0.9, hold_cycles=0, start=20,
           marks=None):
    rng = random.Random(seed)
    got = []
    done = []

    async def sender(ctx):
        await drive_cmac_rx(ctx, glue.cmac, frames, rng, gap_prob, start)
        done.append(1)

    counters = {}

    async def receiver(ctx):
        await collect(ctx, glue.o, got, random.Random(seed + 1), ready_prob, lambda: bool(done), hold_cycles, marks)
        names = ("frames", "bad", "filtered", "overflow") + (("stomped",) if marks is not None else ())
        counters.update({k: ctx.get(getattr(glue, k)) for k in names})

    sim = Simulator(glue)
    sim.add_clock(SYNC_PERIOD, domain="sync")
    sim.add_clock(cmac_period, domain="cmac_rx")
    sim.add_testbench(sender)
    sim.add_testbench(receiver)
    sim.run()
    return got, counters


def classify(frame: bytes, tuser: int, mtu: int = MTU) -> str:
    """The drop reason a frame must get, computed from its bytes."""
    if tuser:
        return "bad"
    if len(frame) <= 14 or frame[12:14] != ETHERTYPE.to_bytes(2, "big") or len(frame) > 14 + mtu:
        return "filtered"
    return "good"


def rx_frames(rng: random.Random, count: int):
    """Random frames: one-beat, odd tails, around beat edges, max 9014, plus bad and foreign ones."""
    edge = [15, 16, 60, 63, 64, 65, 77, 78, 79, 127, 128, 129, 1514, MAX_ETH]
    frames = []
    for k in range(count):
        n = edge[k] if k < len(edge) else rng.choice([rng.randint(15, 200), rng.randint(15, 2000),
                                                        rng.randint(15, MAX_ETH)])
        kind = rng.random()
        if kind < 0.15:
            frames.append((eth(payload(n - 14, rng), rng), 1))                  # FCS error
        elif kind < 0.25:
            frames.append((eth(payload(n - 14, rng), rng, 0x0800), 0))          # IPv4: not ours
        else:
            frames.append((eth(payload(n - 14, rng), rng), 0))
    # Filtered by length: header only, shorter than a header, one byte over the MTU.
    frames.insert(3, (eth(b"", rng), 0))
    frames.insert(7, (rng.randbytes(9), 0))
    frames.insert(11, (eth(payload(MTU + 1, rng), rng), 0))
    frames.insert(12, (eth(payload(MTU, rng), rng, 0x8100), 0))                 # VLAN tag: not ours
    return frames


@pytest.mark.parametrize("cmac_mhz", [390.0, 250.0])
def test_rx_delivers_good_frames_bit_exact_and_counts_drops(cmac_mhz):
    rng = random.Random(4)
    frames = rx_frames(rng, 34)
    glue = CmacRxGlue(mtu=MTU)
    got, counters = run_rx(glue, frames, cmac_period=1 / (cmac_mhz * 1e6), seed=int(cmac_mhz))
    kinds = [classify(f, u) for f, u in frames]
    want = [f[14:] for (f, _), k in zip(frames, kinds) if k == "good"]
    assert kinds.count("bad") >= 3 and kinds.count("filtered") >= 6   # the test covers every reason
    assert len(got) == len(want), f"{len(got)} frames delivered, {len(want)} expected"
    for k, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"frame {k}: {len(g)} bytes delivered, {len(w)} expected, first difference at " \
                       f"{next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))}"
    assert counters == {"frames": len(want), "bad": kinds.count("bad"),
                        "filtered": kinds.count("filtered"), "overflow": 0}


def test_rx_back_to_back_one_beat_frames_at_line_rate():
    """Short frames with no idle cycle at all: none lost, none merged."""
    rng = random.Random(9)
    frames = [(eth(payload(rng.randint(1, 50), rng), rng), 0) for _ in range(60)]
    glue = CmacRxGlue(mtu=1500)
    got, counters = run_rx(glue, frames, cmac_period=SYNC_PERIOD * 1.02, seed=3, gap_prob=0.0, ready_prob=1.0)
    assert got == [f[14:] for f, _ in frames]
    assert counters == {"frames": 60, "bad": 0, "filtered": 0, "overflow": 0}


def test_rx_overflow_drops_whole_frames_never_truncates():
    """The core stalls while frames keep arriving: frames are lost whole and counted, none is cut."""
    rng = random.Random(11)
    frames = [(eth(payload(rng.choice([rng.randint(1, 120), rng.randint(200, 1400)]), rng), rng), 0)
              for _ in range(40)]
    glue = CmacRxGlue(mtu=1500, depth=40)       # 64 beats: about three 1500-byte frames
    got, counters = run_rx(glue, frames, cmac_period=SYNC_PERIOD * 0.8, seed=5, gap_prob=0.1,
                           ready_prob=0.9, hold_cycles=500)
    sent = [f[14:] for f, _ in frames]
    # Every delivered frame is one sent frame, whole, in order: a subsequence of the sent ones.
    pos = 0
    for k, g in enumerate(got):
        while pos < len(sent) and sent[pos] != g:
            pos += 1
        assert pos < len(sent), f"delivered frame {k} ({len(g)} bytes) is not a whole sent frame in order"
        pos += 1
    lost = len(sent) - len(got)
    assert lost >= 5, "the stall was meant to overflow the FIFO"
    assert counters == {"frames": len(got), "bad": 0, "filtered": 0, "overflow": lost}


def test_rx_counts_frames_that_arrive_before_it_is_armed():
    """Frames in the first 16 cycles after reset are lost (the FIFOs' read side leaves reset then)."""
    rng = random.Random(17)
    frames = [(eth(payload(30, rng), rng), 0) for _ in range(24)]      # one beat each, back to back
    got, counters = run_rx(CmacRxGlue(mtu=1500), frames, cmac_period=SYNC_PERIOD, seed=2, gap_prob=0.0,
                           ready_prob=1.0, start=0)
    # Frames 0..15 are sampled on the first 16 clock edges, before the glue is armed.
    assert got == [f[14:] for f, _ in frames[16:]]
    assert counters == {"frames": 8, "bad": 0, "filtered": 0, "overflow": 16}


@pytest.mark.parametrize("cmac_mhz", [390.0, 250.0])
def test_rx_cut_through_forwards_bad_frames_marked_and_counts_them(cmac_mhz):
    """Cut-through: every frame of ours is delivered (good ones clean, ``tuser`` ones marked
    ``bad`` on their last beat, counted as ``bad`` or, when the CMAC says the FCS was stomped,
    ``stomped``); frames of another EtherType or without payload are dropped whole; a frame over
    the MTU is cut off at the beat that shows it and delivered marked. Expectations from the
    frames' bytes."""
    rng = random.Random(31)
    mtu = 1500
    frames = []
    for _ in range(60):
        n = rng.choice([rng.randint(15, 140), rng.randint(15, 14 + mtu)])
        kind = rng.random()
        tuser, stomped = (1, int(rng.random() < 0.5)) if kind < 0.25 else (0, 0)
        et = 0x0800 if 0.25 <= kind < 0.35 else ETHERTYPE
        frames.append((eth(payload(n - 14, rng), rng, et), tuser, stomped))
    frames.insert(5, (eth(b"", rng), 0, 0))                                   # header only
    frames.insert(9, (eth(payload(mtu + 1, rng), rng), 0, 0))                 # one byte too long
    frames.insert(13, (eth(payload(mtu + 200, rng), rng), 1, 0))              # too long and bad
    glue = CmacRxGlue(mtu=mtu, cut_through=True)
    marks = []

    # drive_cmac_rx sets tuser; set stomped alongside it on the same last beat.
    async def sender(ctx):
        r = random.Random(7)
        port = glue.cmac
        await ctx.tick("cmac_rx").repeat(20)
        for frame, tuser, stomped in frames:
            for word, keep, last in beats_of(frame):
                while r.random() < 0.3:
                    ctx.set(port.tvalid, 0)
                    await ctx.tick("cmac_rx")
                ctx.set(port.tvalid, 1)
                ctx.set(port.tdata, word)
                ctx.set(port.tkeep, keep)
                ctx.set(port.tlast, last)
                ctx.set(port.tuser, tuser if last else r.getrandbits(1))
                ctx.set(port.stomped, stomped if last else r.getrandbits(1))
                await ctx.tick("cmac_rx")
        ctx.set(port.tvalid, 0)
        done.append(1)

    done, got, counters = [], [], {}

    async def receiver(ctx):
        await collect(ctx, glue.o, got, random.Random(8), 0.9, lambda: bool(done), 0, marks)
        counters.update({k: ctx.get(getattr(glue, k)) for k in ("frames", "bad", "stomped", "filtered", "overflow")})

    sim = Simulator(glue)
    sim.add_clock(SYNC_PERIOD, domain="sync")
    sim.add_clock(1 / (cmac_mhz * 1e6), domain="cmac_rx")
    sim.add_testbench(sender)
    sim.add_testbench(receiver)
    sim.run()

    want, want_marks = [], []
    count = {"frames": 0, "bad": 0, "stomped": 0, "filtered": 0, "overflow": 0}
    cut = 14 + mtu                      # bytes of a too-long frame that reach the node: whole beats up to it
    cut_bytes = -(-(cut + 1) // B) * B  # the beat holding byte 14 + mtu is the last one delivered
    for frame, tuser, stomped in frames:
        ours = len(frame) > 14 and frame[12:14] == ETHERTYPE.to_bytes(2, "big")
        if not ours:
            count["filtered"] += 1
            continue
        if len(frame) > cut:
            want.append(frame[14:cut_bytes])
            want_marks.append(1)
            count["bad" if tuser and not stomped else "stomped" if tuser else "filtered"] += 1
            continue
        want.append(frame[14:])
        want_marks.append(tuser)
        count["frames" if not tuser else "stomped" if stomped else "bad"] += 1
    assert got == want
    assert marks == want_marks
    assert counters == count


@pytest.mark.parametrize("cut_through", [False, True])
def test_rx_trims_ethernet_padding_by_count(cut_through):
    """A short raw frame padded to 60 bytes by the sender comes out at ``16 + 4·count`` bytes; a
    compressed one (codec ≠ 0) and a longer raw frame keep every byte (EthDeframer's rule at 10G)."""
    from wirereduce.protocol import Header, Opcode

    rng = random.Random(41)
    frames, want = [], []
    for count, codec, extra in ((0, 0, 0), (1, 0, 0), (5, 0, 0), (7, 0, 0), (5, 1, 0), (12, 0, 0), (20, 0, 0),
                                (3, 0, 4)):
        hdr = Header(opcode=Opcode.REDUCE, codec=codec, count=count, seq=count).pack()
        body = hdr + rng.randbytes(4 * count + extra)     # extra: bytes beyond count (length mismatch)
        padded = body + bytes(max(0, 46 - len(body)))
        frames.append((eth(padded, rng), 0))
        keep = len(padded) if codec or len(padded) > 64 else min(len(padded), 16 + 4 * count)
        want.append(padded[:keep])
    glue = CmacRxGlue(mtu=1500, cut_through=cut_through)
    got, counters = run_rx(glue, frames, cmac_period=SYNC_PERIOD * 0.9, seed=6)
    assert got == want
    assert counters["frames"] == len(frames)


def test_rx_rejects_a_depth_below_one_frame():
    with pytest.raises(ValueError, match="depth must hold one 9014-byte frame"):
        CmacRxGlue(mtu=9000, depth=100)


# ---------------------------------------------------------------- transmit


def run_tx(glue, frames, *, cmac_period, seed, valid_prob=0.8, tready_prob=0.6, bads=None):
    """Send ``frames`` through the TX glue (``bads[k]``: frame ``k`` arrives marked ``bad``) and
    collect what the CMAC side takes; ``problems`` lists every PG203 rule broken, and a ``tuser``
    that differs from the frame's ``bad`` (on its last beat; 0 on every other beat)."""
    rng = random.Random(seed)
    bads = bads if bads is not None else [0] * len(frames)
    got = []
    problems = []

    async def sender(ctx):
        i = glue.i
        for frame, bad in zip(frames, bads):
            for word, keep, last in beats_of(frame):
                while rng.random() > valid_prob:
                    ctx.set(i.valid, 0)
                    await ctx.tick()
                ctx.set(i.payload.data, word | (rng.getrandbits(512) & ~_bitmask(keep)))  # junk beyond keep
                ctx.set(i.payload.keep, keep)
                ctx.set(i.payload.last, last)
                ctx.set(i.payload.bad, bad if last else rng.getrandbits(1))   # bad only counts on the last beat
                ctx.set(i.valid, 1)
                await ctx.tick().until(i.ready)
        ctx.set(i.valid, 0)

    async def cmac(ctx):
        t = glue.cmac
        trng = random.Random(seed + 1)
        cur = b""
        in_frame = False
        held = None     # (data, keep, last) offered but not taken last cycle
        idle = 0
        while len(got) < len(frames):
            r = int(trng.random() < tready_prob)
            ctx.set(t.tready, r)
            _, _, v, data, keep, last, user = await ctx.tick("cmac_tx").sample(
                t.tvalid, t.tdata, t.tkeep, t.tlast, t.tuser)
            if in_frame and not v:
                problems.append(f"tvalid dropped inside frame {len(got)}")
            if held is not None and (not v or (data, keep, last) != held):
                problems.append(f"beat changed before it was taken, frame {len(got)}")
            held = None
            if v:
                idle = 0
                in_frame = True
                if user != (bads[len(got)] if last else 0):
                    problems.append(f"tuser {user} on a {'last' if last else 'middle'} beat of frame {len(got)}")
                if r:
                    n = bin(keep).count("1")
                    cur += int(data).to_bytes(B, "little")[:n]
                    if last:
                        got.append(cur)
                        cur = b""
                        in_frame = False
                else:
                    held = (data, keep, last)
            else:
                idle += 1
                assert idle < 20000, f"no beat for 20000 cycles after {len(got)} frames"

    sim = Simulator(glue)
    sim.add_clock(SYNC_PERIOD, domain="sync")
    sim.add_clock(cmac_period, domain="cmac_tx")
    sim.add_testbench(sender)
    sim.add_testbench(cmac)
    sim.run()
    return got, problems


def _bitmask(keep: int) -> int:
    return int.from_bytes(bytes(0xFF if keep >> k & 1 else 0 for k in range(B)), "little")


def expected_tx(frame: bytes, header: bytes) -> bytes:
    out = header + frame
    return out + bytes(max(0, ETH_MIN_FRAME_BYTES - len(out)))


@pytest.mark.parametrize("cmac_mhz", [322.265625 * 1.07, 300.0])
def test_tx_prepends_header_pads_and_never_underflows(cmac_mhz):
    rng = random.Random(21)
    lengths = [1, 2, 45, 46, 47, 49, 50, 51, 63, 64, 114, 115, 500, MTU] + [rng.randint(1, MTU) for _ in range(8)]
    frames = [rng.randbytes(n) for n in lengths]
    dst, src = 0x02_11_22_33_44_55, 0x02_66_77_88_99_AA
    glue = CmacTxGlue(mtu=MTU, dst_mac=dst, src_mac=src)
    got, problems = run_tx(glue, frames, cmac_period=1 / (cmac_mhz * 1e6), seed=int(cmac_mhz))
    assert problems == []
    header = bytes.fromhex("021122334455" "0266778899aa" "88b5")
    assert len(got) == len(frames)
    for k, (g, f) in enumerate(zip(got, frames)):
        assert g == expected_tx(f, header), f"frame {k} ({len(f)} payload bytes) differs"


def test_tx_drives_tuser_from_bad_on_the_last_beat():
    """A frame that reaches the TX glue marked ``bad`` (cut-through, found bad upstream) leaves with
    ``tuser`` on its last beat, so the CMAC stomps its FCS (PG203 ``tx_axis_tuser``); good frames and
    every middle beat have ``tuser`` low; ``stomped`` counts the marked frames."""
    rng = random.Random(23)
    lengths = [1, 50, 51, 64, 115, 1500] + [rng.randint(1, 1500) for _ in range(14)]
    frames = [rng.randbytes(n) for n in lengths]
    bads = [rng.getrandbits(1) for _ in frames]
    bads[0], bads[1] = 1, 0
    glue = CmacTxGlue(mtu=1500)
    got, problems = run_tx(glue, frames, cmac_period=SYNC_PERIOD * 0.95, seed=4, bads=bads)
    assert problems == []
    assert [len(g) for g in got] == [max(ETH_MIN_FRAME_BYTES, 14 + len(f)) for f in frames]


def test_prepend_rejects_a_bad_header():
    with pytest.raises(ValueError, match="header must be 14 bytes"):
        EthPrepend(b"\x00" * 13)
    with pytest.raises(ValueError, match="48-bit MAC"):
        CmacTxGlue(src_mac=1 << 48)


# ---------------------------------------------------------------- the IP wrapper


def test_cmac100g_instance_has_the_pg203_ports():
    text = rtlil.convert(Cmac100G("cmac_usplus_1"))
    assert "cmac_usplus_1" in text
    for port in ("gt_rxp_in", "gt_txn_out", "gt_ref_clk_p", "init_clk", "sys_reset", "gt_txusrclk2", "rx_clk",
                 "rx_axis_tdata", "rx_axis_tuser", "tx_axis_tready", "tx_axis_tkeep", "ctl_rx_enable",
                 "ctl_tx_enable", "ctl_tx_send_rfi", "stat_rx_aligned", "ctl_rx_rsfec_enable", "usr_rx_reset"):
        assert f"\\{port} " in text, port


def test_cmac_ip_tcl_places_the_core():
    tcl = cmac_ip_tcl("cmac_usplus_0", "CMACE4_X0Y3", ("X0Y24", "X0Y25", "X0Y26", "X0Y27"), mtu=9000)
    for item in ("-module_name cmac_usplus_0", "CONFIG.CMAC_CORE_SELECT {CMACE4_X0Y3}",
                 "CONFIG.GT_GROUP_SELECT {X0Y24~X0Y27}", "CONFIG.LANE4_GT_LOC {X0Y27}",
                 "CONFIG.GT_REF_CLK_FREQ {161.1328125}", "CONFIG.USER_INTERFACE {AXIS}",
                 "CONFIG.RX_MAX_PACKET_LEN {9018}", "CONFIG.ENABLE_AXI_INTERFACE {0}"):
        assert item in tcl, item


def test_rx_overflow_of_verdict_queue_counts_every_lost_frame():
    """Many short frames while the core stalls: the verdict queue (16) fills before the beat FIFO."""
    rng = random.Random(13)
    frames = [(eth(payload(rng.randint(1, 40), rng), rng), 0) for _ in range(50)]
    glue = CmacRxGlue(mtu=1500)
    got, counters = run_rx(glue, frames, cmac_period=SYNC_PERIOD, seed=8, gap_prob=0.3, ready_prob=1.0,
                           hold_cycles=400)
    sent = [f[14:] for f, _ in frames]
    assert got == sent[:len(got)], "frames before the stall filled the queue must come out first, in order"
    assert 10 <= len(got) <= 20
    assert counters == {"frames": len(got), "bad": 0, "filtered": 0, "overflow": len(sent) - len(got)}
