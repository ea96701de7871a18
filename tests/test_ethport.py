"""EthPort10G and EthPort10GCdc (hdl/eth/port.py): framing, MAC and PCS of one node port, in amaranth.sim.

Frames are compared byte for byte with what was sent. Bad frames are made on the line itself:
XGMII columns built here (FCS with :func:`zlib.crc32`) are encoded and scrambled by the PCS
blocks and fed to a port's ``line_rx``, or a bit of a data block is flipped on the wire.
"""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from amaranth import Cat, ClockDomain, ClockSignal, Module, ResetSignal, Signal
from amaranth.hdl import Fragment
from amaranth.lib import wiring
from amaranth.sim import Simulator
from amaranth_harness import stream_recv, stream_send, to_beats
from test_mac import columns, fcs, on_line
from wirereduce.hdl.eth.pcs import SYNC_DATA, Encoder, Scrambler
from wirereduce.hdl.eth.port import (
    DEFAULT_MAC_PREFIX,
    EthFramer,
    EthPort10G,
    EthPort10GCdc,
    eth_header,
    eth_stats_layout,
    role_mac,
)

from wirereduce import codec
from wirereduce.protocol import Codec, Flag, Header, Opcode, frame

MTU = 1500


def wr_frame(rng: random.Random, count: int, *, codec: int = Codec.NONE, seq: int = 0, extra: int = 0) -> bytes:
    """A wirereduce frame: header with ``count`` and random payload of 4·count (+ ``extra``) bytes."""
    h = Header(opcode=Opcode.REDUCE, codec=codec, collective=1, count=count, seq=seq)
    return h.pack() + bytes(rng.randrange(256) for _ in range(4 * count + extra))


def random_frames(seed: int, n: int) -> list[bytes]:
    rng = random.Random(seed)
    out = [Header(opcode=Opcode.CONTROL, collective=1, count=0).pack()]  # 16 bytes: padded on the wire
    out.append(wr_frame(rng, 371, seq=1))  # a full MTU 1500 frame
    for i in range(n):
        count = rng.choice([1, 2, 3, 7, 8, 9, rng.randrange(1, 372)])
        out.append(wr_frame(rng, count, seq=i + 2))
    # Compressed payloads are not cut to 4·count (their length is in their tags): any length ≥ 46.
    out.append(wr_frame(rng, 3, codec=Codec.INCEPTIONN_V1, extra=31))
    return out


class Pair(wiring.Component):
    """Two single-clock ports cabled back to back with ``delay`` cycles of wire each way; ``flip``
    inverts payload bit 5 of the ``flip_at``-th data block on the a → b wire (0: never)."""

    def __init__(self, delay: int = 3, b_cut_through: bool = False):
        self.delay = delay
        self.a = EthPort10G(MTU, local_mac=0x020000000001, peer_mac=0x020000000002)
        self.b = EthPort10G(MTU, local_mac=0x020000000002, peer_mac=0x020000000001,
                            cut_through=b_cut_through)
        super().__init__({"flip_at": wiring.In(16)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.a = a = self.a
        m.submodules.b = b = self.b
        data_blocks = Signal(16)
        ab = a.line_tx.as_value()
        with m.If(a.line_tx.header == SYNC_DATA):
            m.d.sync += data_blocks.eq(data_blocks + 1)
        flip = (a.line_tx.header == SYNC_DATA) & (data_blocks + 1 == self.flip_at)
        ab = ab ^ (flip << 7)
        ba = b.line_tx.as_value()
        for _ in range(self.delay):
            ab_r, ba_r = Signal(66), Signal(66)
            m.d.sync += [ab_r.eq(ab), ba_r.eq(ba)]
            ab, ba = ab_r, ba_r
        m.d.comb += [b.line_rx.eq(ab), a.line_rx.eq(ba)]
        return m


def run(dut, benches, clocks=(("sync", 6.4e-9),)):
    sim = Simulator(dut)
    for domain, period in clocks:
        sim.add_clock(period, domain=domain)
    for tb in benches:
        sim.add_testbench(tb)
    sim.run()


def stats(ctx, port) -> dict[str, int]:
    return {name: ctx.get(getattr(port.stats, name)) for name in eth_stats_layout().members}


def test_eth_header_and_parameters():
    assert eth_header(0x0102030405AB, 0x0A0B0C0D0E0F) == bytes.fromhex("0102030405ab0a0b0c0d0e0f88b5")
    with pytest.raises(ValueError, match="48-bit"):
        EthPort10G(MTU, local_mac=1 << 48)
    with pytest.raises(ValueError, match="mtu"):
        EthPort10G(19)
    with pytest.raises(ValueError, match="rx_frames"):
        EthPort10G(MTU, rx_frames=0)
    with pytest.raises(ValueError, match="rx_frames"):
        EthPort10GCdc(MTU, rx_frames=0)

    # The crossing is its own component around the single-clock pieces, not a flag: same node side.
    single, board = EthPort10G(MTU), EthPort10GCdc(MTU)
    shared = {"tx", "rx", "link_up", "block_lock", "hi_ber", "stats", "tx_tap", "tx_tap_valid",
              "rank", "nodes", "control_taken"}
    assert set(single.signature.members) == shared | {"line_tx", "line_rx"}
    assert set(board.signature.members) == shared | {"gt_tx_data", "gt_rx_data"}
    for port in (single, board):
        Fragment.get(port, None)
    with pytest.raises(ValueError, match="dst"):
        EthFramer(dst=-1)
    with pytest.raises(ValueError, match="role"):
        EthPort10G(MTU, role="cw")
    with pytest.raises(ValueError, match="low 16 bits"):
        EthPort10G(MTU, role="host", mac_prefix=0x02_77_72_00_00_01)
    assert role_mac(DEFAULT_MAC_PREFIX, 3, "prev") == 0x02_77_72_00_03_01


def test_back_to_back_random_frames_bitexact():
    """Both directions at once: every frame arrives whole, in order, byte for byte; the padding of
    short frames is trimmed; nothing is dropped or counted as an error."""
    dut = Pair()
    ab = random_frames(1, 12)
    ba = random_frames(2, 12)
    got = {"ab": [], "ba": []}
    final = {}

    def sender(port, frames):
        async def tb(ctx):
            for f in frames:
                await stream_send(ctx, port.tx, f, 64)
        return tb

    def receiver(port, frames, key):
        async def tb(ctx):
            for _ in frames:
                got[key].append(await stream_recv(ctx, port.rx, 64, max_cycles=3000))
            if key == "ab":
                await ctx.tick().repeat(20)
                final["a"], final["b"] = stats(ctx, dut.a), stats(ctx, dut.b)
                final["up"] = (ctx.get(dut.a.link_up), ctx.get(dut.b.link_up), ctx.get(dut.a.hi_ber))
        return tb

    run(dut, [sender(dut.a, ab), sender(dut.b, ba), receiver(dut.b, ab, "ab"), receiver(dut.a, ba, "ba")])
    assert got["ab"] == ab
    assert got["ba"] == ba
    assert final["up"] == (1, 1, 0)
    for port, n in (("a", len(ba)), ("b", len(ab))):
        s = final[port]
        assert s["rx_frames"] == n and s["tx_frames"] == n, (port, s)
        assert all(v == 0 for k, v in s.items() if k not in ("rx_frames", "tx_frames")), (port, s)


def test_bit_error_on_the_wire_drops_the_frame():
    """A flipped bit in the scrambled line: the FCS check fails, that frame is dropped whole and
    counted, the frames around it arrive intact."""
    rng = random.Random(5)
    frames = [wr_frame(rng, 40, seq=k) for k in range(4)]  # 176 bytes + 14: 24 data blocks each
    dut = Pair()
    got, final = [], {}

    async def tb_send(ctx):
        ctx.set(dut.flip_at, 24 + 10)  # a data block in the middle of the second frame
        for f in frames:
            await stream_send(ctx, dut.a.tx, f, 64)

    async def tb_recv(ctx):
        for _ in range(3):
            got.append(await stream_recv(ctx, dut.b.rx, 64, max_cycles=3000))
        await ctx.tick().repeat(60)
        final.update(stats(ctx, dut.b))
        final["valid"] = ctx.get(dut.b.rx.valid)

    run(dut, [tb_send, tb_recv])
    assert got == [frames[0], frames[2], frames[3]]
    assert final["rx_fcs_errors"] == 1 and final["rx_frames"] == 3 and final["valid"] == 0


async def send_marked(ctx, port, frame: bytes, bad: int):
    """Send one frame on a port's ``tx`` with ``bad`` on its last beat (what a node forwards)."""
    beats = to_beats(frame, 64)
    for word, keep, last in beats:
        ctx.set(port.tx.payload.data, word)
        ctx.set(port.tx.payload.keep, keep)
        ctx.set(port.tx.payload.last, last)
        ctx.set(port.tx.payload.bad, bad & last)
        ctx.set(port.tx.valid, 1)
        await ctx.tick().until(port.tx.ready)
    ctx.set(port.tx.valid, 0)
    ctx.set(port.tx.payload.bad, 0)


async def recv_marked(ctx, port, max_cycles=3000) -> tuple[bytes, int]:
    """One frame from a port's ``rx`` and the ``bad`` flag of its last beat."""
    out = b""
    ctx.set(port.rx.ready, 1)
    p = port.rx.payload
    for _ in range(max_cycles):
        _, _, v, word, kp, lst, bad = await ctx.tick().sample(port.rx.valid, p.data, p.keep, p.last, p.bad)
        if v:
            out += int(word).to_bytes(8, "little")[:bin(kp).count("1")]
            if lst:
                ctx.set(port.rx.ready, 0)
                return out, bad
    raise TimeoutError(f"no frame for {max_cycles} cycles")


def test_cut_through_marks_a_bad_frame_and_the_next_hop_gets_it_stomped():
    """Port b is cut-through: a bit flipped on the a → b wire in the second frame comes out of b
    with all its bytes and ``bad`` on its last beat (counted as an FCS error), the others clean.
    Sent back from b to a as a node would forward them (``bad`` kept), the marked frame leaves b
    with a stomped FCS (``tx_stomped``), and store-and-forward port a drops it, counted as stomped
    (spoilt upstream) rather than as an FCS error of its own link."""
    rng = random.Random(6)
    frames = [wr_frame(rng, 40, seq=k) for k in range(3)] + [wr_frame(rng, 3, seq=3)]  # the last one padded
    dut = Pair(b_cut_through=True)
    at_b, at_a, final = [], [], {}

    async def tb_send(ctx):
        ctx.set(dut.flip_at, 24 + 10)  # a data block in the middle of the second frame
        for f in frames:
            await stream_send(ctx, dut.a.tx, f, 64)

    async def tb_forward(ctx):
        for _ in frames:
            f, bad = await recv_marked(ctx, dut.b)
            at_b.append((f, bad))
            await send_marked(ctx, dut.b, f, bad)

    async def tb_back(ctx):
        for _ in range(3):
            at_a.append(await stream_recv(ctx, dut.a.rx, 64, max_cycles=4000))
        await ctx.tick().repeat(80)
        final["a"], final["b"] = stats(ctx, dut.a), stats(ctx, dut.b)

    run(dut, [tb_send, tb_forward, tb_back])
    assert [bad for _, bad in at_b] == [0, 1, 0, 0]
    assert [f for f, _ in at_b][::2] == frames[::2] and at_b[3][0] == frames[3]
    assert len(at_b[1][0]) == len(frames[1]) and at_b[1][0] != frames[1]
    assert at_a == [frames[0], frames[2], frames[3]]
    assert final["b"]["rx_fcs_errors"] == 1 and final["b"]["rx_frames"] == 4
    assert final["b"]["tx_stomped"] == 1 and final["b"]["tx_frames"] == 4
    assert final["a"]["rx_stomped"] == 1 and final["a"]["rx_fcs_errors"] == 0 and final["a"]["rx_frames"] == 3


class RawLine(wiring.Component):
    """XGMII columns from the testbench → Encoder → Scrambler → a single-clock port's line_rx."""

    def __init__(self, **port_args):
        self.port = EthPort10G(MTU, **port_args)
        super().__init__({"data": wiring.In(64), "ctrl": wiring.In(8, init=0xFF)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.enc = enc = Encoder()
        m.submodules.scr = scr = Scrambler()
        m.submodules.port = port = self.port
        wiring.connect(m, enc.o, scr.i)
        m.d.comb += [enc.i.valid.eq(1), enc.i.payload.data.eq(self.data), enc.i.payload.ctrl.eq(self.ctrl),
                     scr.o.ready.eq(1), port.line_rx.eq(scr.o.payload), port.rx.ready.eq(1)]
        return m


def test_bad_frames_dropped_and_counted():
    """On the line: a good frame, a bad FCS, a wrong EtherType, a runt, a frame cut by /E/, an
    oversize frame, a good frame. Only the two good ones reach the node; each bad one is counted."""
    rng = random.Random(9)
    hdr = eth_header(0x020000000001, 0x020000000002)
    good1 = wr_frame(rng, 20, seq=0)
    good2 = wr_frame(rng, 11, seq=1)
    ipv4 = eth_header(0x020000000001, 0x020000000002, 0x0800) + bytes(range(50))
    runt = hdr + good1[:30]                                # 44 bytes + FCS: under 64
    oversize = hdr + wr_frame(rng, 372, seq=2)             # 14 + 1504 + 4 > 1518
    cut = hdr + good2
    lines = [
        on_line(hdr + good1 + fcs(hdr + good1)),
        on_line(hdr + good2 + bytes(4)),                   # wrong FCS
        on_line(ipv4 + fcs(ipv4)),
        on_line(runt + fcs(runt)),
        on_line(cut + fcs(cut), ctrl_at={30: 0xFE}),       # /E/ inside the frame
        on_line(oversize + fcs(oversize)),
        on_line(hdr + good2 + fcs(hdr + good2)),
    ]
    cols = [(0x0707070707070707, 0xFF)] * 80 + columns(lines)  # 80 idle blocks: block lock first
    dut = RawLine()
    beats, final = [], {}

    async def tb(ctx):
        for d, c in cols + [(0x0707070707070707, 0xFF)] * 300:
            ctx.set(dut.data, d)
            ctx.set(dut.ctrl, c)
            _, _, v, p = await ctx.tick().sample(dut.port.rx.valid, dut.port.rx.payload)
            if v:
                beats.append((int(p.data), int(p.keep), int(p.last)))
        final.update(stats(ctx, dut.port))

    run(dut, [tb])
    frames, cur = [], b""
    for d, k, last in beats:
        cur += d.to_bytes(8, "little")[:bin(k).count("1")]
        if last:
            frames.append(cur)
            cur = b""
    assert frames == [good1, good2]
    want = {"rx_frames": 2, "rx_fcs_errors": 1, "rx_ethertype_drops": 1, "rx_runts": 1, "rx_code_errors": 1,
            "rx_oversize": 1, "rx_overflow": 0, "rx_short_drops": 0}
    assert {k: final[k] for k in want} == want


class Loopback(wiring.Component):
    """An EthPort10GCdc port with its transceiver data looped back 13 bits late (so block lock must slip
    to find the boundary); gt_rx is clocked by gt_tx."""

    def __init__(self):
        self.port = EthPort10GCdc(MTU)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.domains.gt_rx = ClockDomain()
        m.d.comb += [ClockSignal("gt_rx").eq(ClockSignal("gt_tx")), ResetSignal("gt_rx").eq(ResetSignal("gt_tx"))]
        m.submodules.port = port = self.port
        prev = Signal(32)
        m.d.gt_tx += prev.eq(port.gt_tx_data)
        m.d.comb += port.gt_rx_data.eq(Cat(prev, port.gt_tx_data)[32 - 13:64 - 13])
        return m


@pytest.mark.parametrize("sync_mhz", [156.25, 100.0, 250.0])
def test_cdc_loopback_two_clocks(sync_mhz):
    """GT domains at 322.265625 MHz, the core at another clock: frames sent on ``tx`` come back on
    ``rx`` intact through both AsyncFIFOs, the 32-bit gearboxes and block lock (which has to find
    the boundary: the loopback shifts the bit stream by 13 bits)."""
    rng = random.Random(int(sync_mhz))
    frames = [wr_frame(rng, c, seq=k) for k, c in enumerate([1, 371, 5, 60, 17, 200])]
    dut = Loopback()
    got, final = [], {}

    async def tb_send(ctx):
        for f in frames:
            await stream_send(ctx, dut.port.tx, f, 64)

    async def tb_recv(ctx):
        for _ in frames:
            got.append(await stream_recv(ctx, dut.port.rx, 64, max_cycles=6000))
        await ctx.tick().repeat(30)
        final.update(stats(ctx, dut.port))
        final["up"] = ctx.get(dut.port.link_up)

    run(dut, [tb_send, tb_recv], clocks=(("sync", 1e-6 / sync_mhz), ("gt_tx", 1e-6 / 322.265625)))
    assert got == frames
    assert final["up"] == 1
    assert final["rx_frames"] == len(frames) and final["tx_frames"] == len(frames)
    assert final["rx_fcs_errors"] == final["rx_code_errors"] == final["tx_aborted"] == final["rx_overflow"] == 0


def test_framer_realigns_and_waits_for_link():
    """EthFramer alone: header prepended for every last-beat length, nothing starts while
    ``enable`` is low."""
    dut = EthFramer(dst=0x0A0B0C0D0E0F, src=0x010203040506)
    frames = [bytes(range(1, n + 1)) for n in range(1, 20)]
    got = []

    async def tb_send(ctx):
        ctx.set(dut.enable, 0)
        await ctx.tick().repeat(5)
        assert ctx.get(dut.o.valid) == 0
        ctx.set(dut.enable, 1)
        for f in frames:
            await stream_send(ctx, dut.i, f, 64)

    async def tb_recv(ctx):
        for _ in frames:
            got.append(await stream_recv(ctx, dut.o, 64))

    run(dut, [tb_send, tb_recv])
    hdr = eth_header(0x0A0B0C0D0E0F, 0x010203040506)
    assert got == [hdr + f for f in frames]


def test_stats_layout_fields():
    assert set(eth_stats_layout().members) >= {"rx_frames", "rx_fcs_errors", "rx_ethertype_drops", "rx_overflow"}
    assert struct.calcsize("<I") * len(eth_stats_layout().members) * 8 == eth_stats_layout().size


def _run_line(dut, items, *, rank=0, nodes=0, tx_frame=None):
    """Feed ``items`` to a :class:`RawLine`: Ethernet frames (bytes, FCS added here) and the string
    ``"control"`` (a one-cycle ``control_taken`` with ``rank``/``nodes``, between frames). Returns the
    frames the port delivered (bytes, bad), its stats, and, when ``tx_frame`` is given (sent on
    ``tx`` at the end), the first 12 bytes the framer put in front of it (dst, src)."""
    idle = [(0x0707070707070707, 0xFF)]
    script = idle * 80
    for item in items:
        if item == "control":  # as a node takes it: after the frames before it have been delivered
            script += idle * 100 + ["control"]
        else:
            script += columns([on_line(item + fcs(item))]) + idle * 4
    script += idle * 300
    got, final, tap = [], {}, []

    async def tb(ctx):
        ctx.set(dut.port.rank, rank)
        ctx.set(dut.port.nodes, nodes)
        cur = b""
        for step in script:
            if step == "control":
                ctx.set(dut.port.control_taken, 1)
                await ctx.tick()
                ctx.set(dut.port.control_taken, 0)
                continue
            ctx.set(dut.data, step[0])
            ctx.set(dut.ctrl, step[1])
            _, _, v, p = await ctx.tick().sample(dut.port.rx.valid, dut.port.rx.payload)
            if v:
                cur += int(p.data).to_bytes(8, "little")[:bin(int(p.keep)).count("1")]
                if p.last:
                    got.append((cur, int(p.bad)))
                    cur = b""
        if tx_frame is not None:
            await stream_send(ctx, dut.port.tx, tx_frame, 64)
            await ctx.tick().repeat(20)
        final.update(stats(ctx, dut.port))

    async def taps(ctx):
        async for _, _, tv, tp in ctx.tick().sample(dut.port.tx_tap_valid, dut.port.tx_tap):
            if tv:
                tap.append(int(tp.data).to_bytes(8, "little"))

    sim = Simulator(dut)
    sim.add_clock(6.4e-9)
    sim.add_testbench(tb)
    sim.add_process(taps)
    sim.run()
    return got, final, b"".join(tap)[:12]


def test_ring_port_hears_only_its_neighbour_and_trims_only_padding():
    """A ``prev`` port of rank 2 of 4 listens to rank 1's ``next`` port: nothing before the node's
    CONTROL, then only that source (a frame from rank 3 is dropped and counted in
    ``rx_source_drops``). Padding: 46-byte frames are cut to what their header claims (raw data,
    a LOST placeholder, a compressed frame by its tags); a frame with more payload than its count
    claims, or one whose claim exceeds 46 bytes, is passed uncut for the node's length check."""
    rng = random.Random(3)
    mine = role_mac(DEFAULT_MAC_PREFIX, 2, "prev")
    peer = role_mac(DEFAULT_MAC_PREFIX, 1, "next")
    other = role_mac(DEFAULT_MAC_PREFIX, 3, "prev")
    hdr = eth_header(mine, peer)
    early = wr_frame(rng, 20, seq=0)
    good = wr_frame(rng, 20, seq=0)
    short = wr_frame(rng, 2, seq=1)                            # 24 bytes: padded to 46 on the wire
    long_claim = wr_frame(rng, 2, seq=2, extra=36)             # 60 bytes claiming 24: not padding
    lost = Header(opcode=Opcode.REDUCE, collective=1, count=300, seq=3, flags=int(Flag.LOST)).pack()
    g = np.array([0.5, 0.0, 1e-3], np.float32)
    comp = frame(Header(opcode=Opcode.REDUCE, codec=Codec.INCEPTIONN_V1, eb_k=10, collective=1, count=3, seq=4),
                 codec.encode(g, 10))
    big_claim = Header(opcode=Opcode.REDUCE, collective=1, count=9, seq=5).pack() + bytes(30)  # claims 52
    pad = lambda f: f.ljust(46, b"\0")  # noqa: E731
    items = [hdr + early, "control", hdr + good, eth_header(mine, other) + good, hdr + pad(short),
             hdr + long_claim, hdr + pad(lost), hdr + pad(comp), hdr + pad(big_claim)]
    dut = RawLine(role="prev", cut_through=True)
    got, st, tap = _run_line(dut, items, rank=2, nodes=4, tx_frame=wr_frame(rng, 3))
    assert len(comp) < 46
    assert [f for f, _ in got] == [good, short, long_claim, lost, comp, pad(big_claim)]
    assert st["rx_source_drops"] == 2 and st["rx_frames"] == 6
    assert tap == eth_header(peer, mine)[:12]     # it sends to rank 1's next port, from its own address


def test_host_port_locks_to_the_control_sender():
    """The host port before any CONTROL takes only CONTROL, STATS_REQUEST and SCHEDULE (from anyone:
    a schedule engine's table is loaded before its CONTROL); once the node takes a CONTROL it hears
    only that frame's sender (plus those three) and sends to it."""
    rng = random.Random(4)
    nic, stray = 0x02_00_00_00_00_0A, 0x02_00_00_00_00_0B
    mine = role_mac(DEFAULT_MAC_PREFIX, 1, "host")
    push = frame(Header(opcode=Opcode.HOST_PUSH, collective=1, count=20), np.ones(20, np.float32))
    ctl = Header(opcode=Opcode.CONTROL, collective=1, src=1, hop=2, seq=1).pack()
    req = Header(opcode=Opcode.STATS_REQUEST).pack()
    sched = Header(opcode=Opcode.SCHEDULE, collective=7, count=2, seq=0).pack() + bytes(range(8))
    pad = lambda f: f.ljust(46, b"\0")  # noqa: E731
    items = [eth_header(mine, nic) + push, eth_header(mine, stray) + pad(req), eth_header(mine, nic) + pad(sched),
             eth_header(mine, nic) + pad(ctl),
             "control", eth_header(mine, nic) + push, eth_header(mine, stray) + push,
             eth_header(mine, stray) + pad(req), eth_header(mine, stray) + pad(sched)]
    dut = RawLine(role="host")
    got, st, tap = _run_line(dut, items, rank=1, nodes=2, tx_frame=wr_frame(rng, 3))
    assert [f for f, _ in got] == [req, sched, ctl, push, req, sched]
    assert st["rx_source_drops"] == 2
    assert tap == eth_header(nic, mine)[:12]
