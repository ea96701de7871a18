"""PCIe host link glue (hdl/xilinx/pcie.py) in amaranth.sim, the XDMA IP Tcl (boards/xdma_ip.py)
and the VC709 PCIe engine top (boards/vc709_engine_top.py).

The XDMA itself is hard IP and cannot be simulated; its AXI4-Stream side is modelled here by two
testbenches in the ``pcie`` domain: an H2C source that sends each frame as one packet of 256-bit
beats (``tkeep`` all ones but on the last beat, ``tvalid`` dropping at random between beats) and a
C2H sink that takes beats with ``tready`` at random. A third testbench in ``sync`` stands in for the
engine: it takes ``host_rx`` beats with random ``ready`` and sends each frame straight back on
``host_tx`` with random gaps. Frames of random lengths must come back bit-exact and whole, at
several ratios of the two clocks.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from amaranth import Elaboratable, Module
from amaranth.back import rtlil
from amaranth.sim import Simulator
from wirereduce.boards.xdma_ip import xdma_ip_tcl
from wirereduce.hdl.params import silence_unused
from wirereduce.hdl.stream.widthconv import StreamDownsizer, StreamUpsizer
from wirereduce.hdl.xilinx.pcie import AxisSignature, Xdma, XdmaHostGlue

AXIS = 256


def _beats(frame: bytes, width: int):
    """(data int, keep int, last) beats of ``frame`` on a ``width``-bit stream."""
    nb = width // 8
    out = []
    for off in range(0, len(frame), nb):
        chunk = frame[off:off + nb]
        out.append((int.from_bytes(chunk.ljust(nb, b"\0"), "little"), (1 << len(chunk)) - 1, off + nb >= len(frame)))
    return out


def _run_loop(frames, width, pcie_ns, sync_ns, *, seed, fifo_depth=16, p_valid=0.7, p_ready=0.6,
              max_cycles=None):
    """Send ``frames`` H2C, loop them through a model engine, collect them C2H.

    Returns (frames received on c2h, frames seen on host_rx as lists of (data, keep, last) beats).
    """
    if max_cycles is None:     # generous: every byte at 1/4 of a 64-bit beat a cycle, twice over
        max_cycles = 1000 + 16 * sum(-(-len(f) // 8) for f in frames)
    dut = XdmaHostGlue(width=width, axis_width=AXIS, fifo_depth=fifo_depth)
    rng = np.random.default_rng(seed)
    sim = Simulator(dut)
    sim.add_clock(pcie_ns * 1e-9, domain="pcie")
    sim.add_clock(sync_ns * 1e-9, domain="sync", phase=0.37 * sync_ns * 1e-9)
    got, engine_beats = [], []
    queue = collections.deque()     # frames the model engine has received, to send back
    done = {"h2c": False}

    async def h2c_source(ctx):
        for frame in frames:
            for word, keep, last in _beats(frame, AXIS):
                while rng.random() > p_valid:           # gap between beats
                    ctx.set(dut.h2c.tvalid, 0)
                    await ctx.tick("pcie")
                ctx.set(dut.h2c.tdata, word)
                ctx.set(dut.h2c.tkeep, keep)
                ctx.set(dut.h2c.tlast, last)
                ctx.set(dut.h2c.tvalid, 1)
                for _ in range(max_cycles):
                    _, _, ready = await ctx.tick("pcie").sample(dut.h2c.tready)
                    if ready:
                        break
                else:
                    raise TimeoutError("H2C: tready stayed low")
        ctx.set(dut.h2c.tvalid, 0)
        done["h2c"] = True

    async def engine(ctx):
        rx, tx = dut.host_rx, dut.host_tx
        cur, cur_beats = b"", []
        sending = None              # beats of the frame being sent back
        for _ in range(max_cycles):
            if sending is None and queue:
                sending = collections.deque(_beats(queue.popleft(), width))
            if sending and rng.random() < p_valid:
                word, keep, last = sending[0]
                ctx.set(tx.payload.data, word)
                ctx.set(tx.payload.keep, keep)
                ctx.set(tx.payload.last, last)
                ctx.set(tx.valid, 1)
            else:
                ctx.set(tx.valid, 0)
            r = int(rng.random() < p_ready)
            ctx.set(rx.ready, r)
            _, _, rv, rd, rk, rl, tv, tr = await ctx.tick("sync").sample(
                rx.valid, rx.payload.data, rx.payload.keep, rx.payload.last, tx.valid, tx.ready)
            if tv and tr:
                sending.popleft()
                if not sending:
                    sending = None
            if rv and r:
                cur_beats.append((rd, rk, rl))
                cur += int(rd).to_bytes(width // 8, "little")[:bin(rk).count("1")]
                if rl:
                    engine_beats.append(cur_beats)
                    queue.append(cur)
                    cur, cur_beats = b"", []
            if len(got) >= len(frames):
                return
        raise TimeoutError(f"{len(got)} of {len(frames)} frames back after {max_cycles} cycles")

    async def c2h_sink(ctx):
        cur = b""
        for _ in range(max_cycles):
            if len(got) >= len(frames):
                return
            r = int(rng.random() < p_ready)
            ctx.set(dut.c2h.tready, r)
            _, _, v, d, k, last = await ctx.tick("pcie").sample(dut.c2h.tvalid, dut.c2h.tdata, dut.c2h.tkeep,
                                                                 dut.c2h.tlast)
            if v and r:
                n = bin(k).count("1")
                assert k == (1 << n) - 1, f"C2H tkeep not contiguous from byte 0: {k:#x}"
                assert last or n == AXIS // 8, "C2H beat short of full before tlast"
                cur += int(d).to_bytes(AXIS // 8, "little")[:n]
                if last:
                    got.append(cur)
                    cur = b""

    sim.add_testbench(h2c_source)
    sim.add_testbench(engine)
    sim.add_testbench(c2h_sink)
    sim.run()
    return got, engine_beats


def _frames(rng, n, lo=1, hi=300):
    return [rng.integers(0, 256, int(rng.integers(lo, hi + 1)), dtype=np.uint8).tobytes() for _ in range(n)]


@pytest.mark.parametrize("pcie_ns, sync_ns", [
    (4.0, 6.4),       # 250 MHz axi_aclk, 156.25 MHz engine (the VC709)
    (4.0, 3.1),       # engine faster than axi_aclk (322 MHz)
    (4.0, 4.0),       # same frequency, phase offset
])
def test_frames_cross_h2c_engine_c2h_bit_exact(pcie_ns, sync_ns):
    rng = np.random.default_rng(17)
    # random lengths 1 … 300 bytes (every tkeep pattern), plus wirereduce-shaped frames (16 + 4·count)
    frames = _frames(rng, 24) + [bytes(rng.integers(0, 256, 16 + 4 * c, dtype=np.uint8)) for c in (1, 2, 3, 60)]
    got, engine_beats = _run_loop(frames, 64, pcie_ns, sync_ns, seed=int(pcie_ns * 10 + sync_ns))
    assert len(got) == len(frames)
    for k, (a, b) in enumerate(zip(got, frames)):
        assert a == b, f"frame {k} ({len(b)} bytes) came back different"
    # on the engine side: ceil(L/8) beats, keep all ones but on the last beat, contiguous there
    for k, (beats, frame) in enumerate(zip(engine_beats, frames)):
        assert len(beats) == -(-len(frame) // 8), k
        assert [b[2] for b in beats] == [0] * (len(beats) - 1) + [1], k
        assert all(b[1] == 0xFF for b in beats[:-1]), k
        tail = len(frame) - 8 * (len(beats) - 1)
        assert beats[-1][1] == (1 << tail) - 1, k


def test_full_rate_without_back_pressure():
    """No gaps, ready always: the crossing and the converters do not lose rate (one 64-bit beat a
    sync cycle out of the downsizer while frames are queued)."""
    rng = np.random.default_rng(3)
    frames = _frames(rng, 12, 64, 256)
    got, _ = _run_loop(frames, 64, 4.0, 6.4, seed=1, p_valid=1.0, p_ready=1.0, fifo_depth=64)
    assert got == frames


def test_same_width_is_a_plain_crossing():
    rng = np.random.default_rng(5)
    frames = _frames(rng, 10)
    got, engine_beats = _run_loop(frames, 256, 4.0, 6.4, seed=2)
    assert got == frames
    assert [len(b) for b in engine_beats] == [-(-len(f) // 32) for f in frames]


def test_link_reset_ends_a_cut_frame_bad_and_the_next_frames_pass():
    """A pcie reset (``~axi_aresetn``) while an H2C frame is part-way to the engine: that frame ends
    with a ``bad`` last beat of no bytes, and the frames sent after the reset arrive whole, not bad."""
    from amaranth import ClockDomain, Signal

    glue = XdmaHostGlue(width=64, fifo_depth=64)
    pcie_rst = Signal()

    class Top(Elaboratable):
        def elaborate(self, platform):
            m = Module()
            m.domains.pcie = cd = ClockDomain("pcie")
            m.d.comb += cd.rst.eq(pcie_rst)
            m.domains.sync = ClockDomain("sync")
            m.submodules.glue = glue
            return m

    sim = Simulator(Top())
    sim.add_clock(4e-9, domain="pcie")
    sim.add_clock(6.4e-9, domain="sync")
    rng = np.random.default_rng(9)
    long_frame = bytes(rng.integers(0, 256, 1600, dtype=np.uint8))
    after = [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in (36, 100, 257)]
    got = []                       # (bytes, bad of the last beat)
    state = {"beats": 0}

    async def h2c(ctx):
        async def send(frame):
            for word, keep, last in _beats(frame, AXIS):
                ctx.set(glue.h2c.tdata, word)
                ctx.set(glue.h2c.tkeep, keep)
                ctx.set(glue.h2c.tlast, last)
                ctx.set(glue.h2c.tvalid, 1)
                await ctx.tick("pcie").until(glue.h2c.tready)
            ctx.set(glue.h2c.tvalid, 0)
        await send(long_frame)                  # 50 beats: all in the FIFO, the engine is slower
        while state["beats"] < 5:
            await ctx.tick("pcie")
        ctx.set(pcie_rst, 1)                    # link reset part-way through the frame
        await ctx.delay(16e-9)                  # (a tick of a domain in reset raises DomainReset)
        ctx.set(pcie_rst, 0)
        await ctx.tick("pcie").repeat(8)
        for f in after:
            await send(f)

    async def engine(ctx):
        rx = glue.host_rx
        ctx.set(rx.ready, 1)
        cur = b""
        for _ in range(3000):
            _, _, v, d, k, last, bad = await ctx.tick("sync").sample(
                rx.valid, rx.payload.data, rx.payload.keep, rx.payload.last, rx.payload.bad)
            if v:
                state["beats"] += 1
                cur += int(d).to_bytes(8, "little")[:bin(k).count("1")]
                if last:
                    got.append((cur, bad))
                    cur = b""
                    if len(got) == 1 + len(after):
                        return
        raise TimeoutError(f"{len(got)} frames")

    sim.add_testbench(h2c)
    sim.add_testbench(engine)
    sim.run()
    cut, cut_bad = got[0]
    assert cut_bad == 1 and 0 < len(cut) < len(long_frame) and long_frame.startswith(cut)
    assert got[1:] == [(f, 0) for f in after]


def test_converters_keep_bad_and_tkeep():
    """``bad`` on the last narrow beat reaches the last wide beat and back; ``c2h_bad`` pulses once."""
    up, down = StreamUpsizer(256, 64), StreamDownsizer(256, 64)

    class Pair(Elaboratable):
        def elaborate(self, platform):
            m = Module()
            m.submodules.up, m.submodules.down = up, down
            from amaranth.lib import wiring
            wiring.connect(m, up.o, down.i)
            return m

    sim = Simulator(Pair())
    sim.add_clock(1e-8)
    frame = bytes(range(1, 45))       # 44 bytes: 6 beats of 64 bit, 2 wide beats (32 + 12 bytes)
    seen = []

    async def src(ctx):
        for word, keep, last in _beats(frame, 64):
            ctx.set(up.i.payload.data, word)
            ctx.set(up.i.payload.keep, keep)
            ctx.set(up.i.payload.last, last)
            ctx.set(up.i.payload.bad, last)
            ctx.set(up.i.valid, 1)
            await ctx.tick().until(up.i.ready)
        ctx.set(up.i.valid, 0)

    async def sink(ctx):
        ctx.set(down.o.ready, 1)
        wide = []
        for _ in range(40):
            _, _, v, d, k, lst, bad, wv, wk, wl, wb = await ctx.tick().sample(
                down.o.valid, down.o.payload.data, down.o.payload.keep, down.o.payload.last, down.o.payload.bad,
                up.o.valid & down.i.ready, up.o.payload.keep, up.o.payload.last, up.o.payload.bad)
            if wv:
                wide.append((wk, wl, wb))
            if v:
                seen.append((d, k, lst, bad))
                if lst:
                    break
        assert wide == [(0xFFFFFFFF, 0, 0), (0xFFF, 1, 1)]

    sim.add_testbench(src)
    sim.add_testbench(sink)
    sim.run()
    assert [(k, lst, bad) for _, k, lst, bad in seen] == [(0xFF, 0, 0)] * 5 + [(0x0F, 1, 1)]
    back = b"".join(int(d).to_bytes(8, "little")[:bin(k).count("1")] for d, k, _, _ in seen)
    assert back == frame


def test_parameters_are_checked_before_simulation():
    with pytest.raises(ValueError, match="at least as wide"):
        XdmaHostGlue(width=512, axis_width=256)
    with pytest.raises(ValueError, match="fifo_depth"):
        XdmaHostGlue(fifo_depth=24)
    with pytest.raises(ValueError, match="power of two"):
        StreamDownsizer(256, 48)
    with pytest.raises(ValueError, match="ip_name"):
        Xdma("xdma-0")
    assert AxisSignature(256) == AxisSignature(256) != AxisSignature(512)


# --- the XDMA IP: Tcl and instance -----------------------------------------------------------------

def _config(tcl: str) -> dict[str, str]:
    return dict(re.findall(r"CONFIG\.(\w+) \{([^}]*)\}", tcl))


def test_xdma_tcl_names_the_vc709_pcie_block_and_link():
    tcl = xdma_ip_tcl("xdma_0")
    assert tcl.startswith("create_ip -name xdma -vendor xilinx.com -library ip -module_name xdma_0\n")
    cfg = _config(tcl)
    assert cfg["pcie_blk_locn"] == "X0Y1"                 # GTH quads 114/115, lane 0 = GTHE2_CHANNEL_X1Y23
    assert cfg["pl_link_cap_max_link_width"] == "X8"
    assert cfg["pl_link_cap_max_link_speed"] == "8.0_GT/s"
    assert cfg["ref_clk_freq"] == "100_MHz"
    assert cfg["axi_data_width"] == "256_bit" and cfg["axisten_freq"] == "250"
    assert cfg["xdma_axi_intf_mm"] == "AXI_Stream"
    assert cfg["xdma_rnum_chnl"] == "1" and cfg["xdma_wnum_chnl"] == "1"
    assert cfg["axilite_master_en"] == "false" and cfg["cfg_mgmt_if"] == "false"
    assert "generate_target all [get_ips xdma_0]" in tcl
    with pytest.raises(ValueError, match="ip_name"):
        xdma_ip_tcl("0bad")


def test_xdma_instance_ports():
    """The black box converts with the template's port names and widths (8 lanes, 256/32-bit streams)."""
    text = rtlil.convert(Xdma("xdma_0"), ports=None)
    cell = re.search(r"cell \\xdma_0 .*?\n  end", text, re.S).group(0)
    for port in ("sys_clk", "sys_rst_n", "user_lnk_up", "axi_aclk", "axi_aresetn", "usr_irq_req",
                 "pci_exp_rxp", "pci_exp_rxn", "pci_exp_txp", "pci_exp_txn",
                 "m_axis_h2c_tdata_0", "m_axis_h2c_tkeep_0", "m_axis_h2c_tlast_0", "m_axis_h2c_tvalid_0",
                 "m_axis_h2c_tready_0", "s_axis_c2h_tdata_0", "s_axis_c2h_tkeep_0", "s_axis_c2h_tlast_0",
                 "s_axis_c2h_tvalid_0", "s_axis_c2h_tready_0"):
        assert re.search(rf"connect \\{port} ", cell), port
    assert re.search(r"wire width 8 input \d+ +\\xdma_0_pci_exp_rxp", text)
    assert re.search(r"wire width 256 output \d+ +\\h2c__tdata", text)


# --- the VC709 engine top: `make bitstream BOARD=vc709 HOST=pcie` without Vivado -------------------

ROOT = Path(__file__).resolve().parents[1]
#: docs/boards.md "Other pins": the edge connector's lanes 0-7, and the PCIe reference clock / PERST#.
PCIE_RX = ("Y4 AA6 AB4 AC6 AD4 AE6 AF4 AG6", "Y3 AA5 AB3 AC5 AD3 AE5 AF3 AG5")
PCIE_TX = ("W2 AA2 AC2 AE2 AG2 AH4 AJ2 AK4", "W1 AA1 AC1 AE1 AG1 AH3 AJ1 AK3")


@pytest.fixture(scope="module")
def pcie_tree(tmp_path_factory):
    env_path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                               if d and not (Path(d) / "vivado").exists())
    out = tmp_path_factory.mktemp("vc709_pcie")
    # WIDTH=64: the tree's Tcl, XDC, pins and cages do not depend on the engine's width, and the 64-bit
    # engine's Verilog takes 70 s against 180 s at 256; the 256-bit top's converters are checked on
    # its elaboration (test_cage_ports_reach_the_256_bit_engine_through_converters)
    r = subprocess.run(["make", "-o", ".venv/.installed", "bitstream", "BOARD=vc709", "HOST=pcie", "WIDTH=64",
                        f"OUT={out}"],
                       cwd=ROOT, env={**os.environ, "PATH": env_path}, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return out, r.stdout


def test_make_bitstream_host_pcie_writes_the_engine_tree(pcie_tree):
    out, stdout = pcie_tree
    assert "host link pcie" in stdout and "stopped after writing the build tree" in stdout
    tcl = (out / "wirereduce_vc709.tcl").read_text()
    assert re.search(r"create_project .* -part xc7vx690tffg1761-2\b", tcl)
    # the IP Tcl is sourced before synthesis, the top's XDC read after the platform's
    assert tcl.index("source xdma_0.tcl") < tcl.index("synth_design")
    assert tcl.index("read_xdc wirereduce_vc709.xdc") < tcl.index('read_xdc "vc709_engine_top.xdc"')
    assert (out / "xdma_0.tcl").read_text() == xdma_ip_tcl("xdma_0")
    top_xdc = (out / "vc709_engine_top.xdc").read_text()
    assert "set_clock_groups -asynchronous" in top_xdc and "pcie_aclk" in top_xdc and "gt3_rxoutclk" in top_xdc


def test_engine_top_verilog_wires_four_cages_and_the_xdma(pcie_tree):
    out, _ = pcie_tree
    v = (out / "wirereduce_vc709.v").read_text()
    # one 10G Ethernet port per cage; all four GTH channels run (no cage reserved), one QPLL
    for p in range(4):
        assert re.search(rf"^module \\wirereduce_vc709\.eth{p} ", v, re.M), p
    assert not re.search(r"^module \\wirereduce_vc709\.eth4 ", v, re.M)
    channels = re.findall(r"^\s*GTHE2_CHANNEL #\(.*?\n  \);", v, re.M | re.S)
    assert len(channels) == 4 and all(".TXPD(2'h0)" in c for c in channels)
    assert len(re.findall(r"^\s*GTHE2_COMMON #\(", v, re.M)) == 1
    # the XDMA, its reference clock buffer, and the named clock nets the top's XDC groups by
    assert len(re.findall(r"^\s*xdma_0 \w+ \(", v, re.M)) == 1
    assert re.search(r"^\s*IBUFDS_GTE2 pcie_refclk_ibuf \(", v, re.M)
    assert "wire pcie_aclk;" in v and "wire core_clk_mmcm;" in v


def test_engine_top_elaborates_with_four_ports():
    """The engine of the top has P = 4 network ports and is 256 bit wide (a 40 Gbit/s host port at
    156.25 MHz, the XDMA's stream width); ``width=64`` gives the 64-bit engine with no converters;
    bad widths, and a width for the SFP top, raise before elaboration."""
    from wirereduce.boards import load
    from wirereduce.boards.vc709_engine_top import VC709EngineTop

    from wirereduce.config import EngineConfig

    top = VC709EngineTop()
    silence_unused(top)
    silence_unused(top.engine)
    assert top.config == EngineConfig(256, 1500, 8, ports=4)
    members = top.engine.signature.members
    assert {f"net{p}_{d}" for p in range(4) for d in ("in", "out")} <= set(members)
    assert "net4_in" not in members
    assert members["host_rx"].signature.width == 256 and members["net0_in"].signature.width == 256
    narrow = load("vc709").top(host="pcie", width=64)
    silence_unused(narrow)
    silence_unused(narrow.engine)
    assert narrow.config == EngineConfig(64, 1500, 8, ports=4)
    for bad in (512, 32, "256"):
        with pytest.raises(ValueError, match="width must be 64, 128 or 256"):
            VC709EngineTop(width=bad)
    with pytest.raises(ValueError, match="PCIe top's engine width"):
        load("vc709").top(width=256)


def test_cage_ports_reach_the_256_bit_engine_through_converters(pcie_tree):
    """Each cage's 64-bit Ethernet port meets the 256-bit engine through an upsizer (rx) and a
    downsizer (tx); the host glue has no converter left (256 = the XDMA's width). At ``WIDTH=64``
    (the build tree) the cages meet the engine directly."""
    from wirereduce.boards import load

    top = load("vc709").top(host="pcie", width=256)
    for p in range(4):
        up, down = top.net_upsizers[p], top.net_downsizers[p]
        assert isinstance(up, StreamUpsizer) and isinstance(down, StreamDownsizer), p
        assert (up.wide, up.narrow) == (down.wide, down.narrow) == (256, 64), p
    host = top.host_glue
    assert isinstance(host, XdmaHostGlue) and host.width == host.axis_width == 256

    out, stdout = pcie_tree
    assert "engine 64 bit" in stdout
    v = (out / "wirereduce_vc709.v").read_text()
    assert not re.search(r"^module \\wirereduce_vc709\.net\d_(up|down) ", v, re.M)
    assert re.search(r"^module \\wirereduce_vc709\.engine ", v, re.M)


def test_engine_top_places_the_pcie_pins(pcie_tree):
    out, _ = pcie_tree
    text = (out / "wirereduce_vc709.xdc").read_text()
    port_pin = {port: pin for pin, port in re.findall(r'set_property LOC (\S+) \[get_ports "([^"]+)"\]', text)}
    for sub, (ps, ns) in (("rx", PCIE_RX), ("tx", PCIE_TX)):
        for lane, (p, n) in enumerate(zip(ps.split(), ns.split())):
            assert port_pin[f"pcie_x8_0__{sub}__p\\[{lane}]"] == p, (sub, lane)
            assert port_pin[f"pcie_x8_0__{sub}__n\\[{lane}]"] == n, (sub, lane)
    assert port_pin["pcie_x8_0__perst_n__io"] == "AV35"
    assert port_pin["pcie_refclk_0__p"] == "AB8" and port_pin["pcie_refclk_0__n"] == "AB7"
    assert re.search(r"create_clock -name pcie_refclk_0__p -period 10\.0+ ", text)


def test_host_option_is_checked():
    from wirereduce.boards import load

    with pytest.raises(ValueError, match="host must be 'sfp'.*or 'pcie'"):
        load("vc709").top(host="usb")
    with pytest.raises(TypeError, match="does not take option.*host"):
        load("u55c").top(host="pcie")
