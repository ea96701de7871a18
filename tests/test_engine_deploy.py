"""One process per rank on schedule engines: ``wirereduce sim serve --topology`` (the cocotb engine
of a :class:`~wirereduce.sim.cluster.schednet.ScheduleNetwork` behind UNIX sockets, no root) and
``wirereduce rank allreduce --topology`` / :class:`~wirereduce.host.rank.EngineRankDriver`.

One build serves every schedule of its topology and every format: the ranks load their tables
at run time. Every result is compared bit for bit with the golden model in the schedule's order
(:func:`wirereduce.sim.golden.schedule.allreduce`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from conftest import RECEIVE_TIMEOUT, per_rank, rank_processes, served_engines, sim_allreduce_checked
from wirereduce.host.rank import EngineRankDriver, FileBarrier, served_engine_config
from wirereduce.host.transports.packet import PacketTransport
from wirereduce.sim.golden.schedule import allreduce as golden_allreduce
from wirereduce.sim.golden.schedule import mismatches

from wirereduce import schedule as sched
from wirereduce.cli import main
from wirereduce.config import EngineConfig

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = "ring:4"
NODES = 4
#: What the ranks are told for uncompressed collectives (``sim serve --topology ring:4``'s defaults).
CONFIG = served_engine_config(TOPOLOGY)
#: What the server builds (``sim serve --topology ring:4 --codec``): the same engines with the codec at
#: every port, which pass uncompressed collectives through untouched; one build serves both.
CODEC_CONFIG = served_engine_config(TOPOLOGY, codec=True)


# ---- checks before anything is sent (no simulator) ----

def test_engine_rank_driver_refuses_bad_arguments():
    s = sched.build(TOPOLOGY, "biring")
    with pytest.raises(TypeError, match="EngineConfig"):
        EngineRankDriver(None, 0, s, None)
    with pytest.raises(ValueError, match="rank must be 0 … 3"):
        EngineRankDriver(None, 4, s, CONFIG)
    with pytest.raises(ValueError, match="window"):
        EngineRankDriver(None, 0, s, CONFIG, window=CONFIG.slots + 1)
    with pytest.raises(ValueError, match="flows"):
        EngineRankDriver(None, 0, sched.build("ring:8", "biring"), EngineConfig(ports=2, max_flows=8))
    for bad in (0, CONFIG.max_elements + 1, (), (64, 0), "64", 64.0):
        with pytest.raises(ValueError, match="chunk_words"):
            EngineRankDriver(None, 0, s, CONFIG, chunk_words=bad)
    with pytest.raises(ValueError, match="from 1 to 349 .what a compressed frame holds"):
        EngineRankDriver(None, 0, s, CODEC_CONFIG, chunk_words=(64, 371)).allreduce(np.ones(8, np.float32),
                                                                                   compression=8)
    d = EngineRankDriver(None, 0, s, CONFIG)
    with pytest.raises(ValueError, match="no codec"):
        d.allreduce(np.ones(8, np.float32), compression=8)
    with pytest.raises(ValueError, match="op"):
        d.allreduce(np.ones(8, np.float32), op="prod")
    with pytest.raises(ValueError, match="formats"):
        EngineRankDriver(None, 0, s, EngineConfig(ports=2, formats=("fp32",))).allreduce(
            np.ones(8, ml_dtypes.bfloat16))
    assert d.ids.next == 1 and not d.unfinished, "a refused call took a collective id or marked the driver"


@pytest.mark.parametrize("argv, message", [
    (["rank", "allreduce", "--topology", TOPOLOGY, "--rank", "0", "--unix", "x"], "--algorithm"),
    (["rank", "allreduce", "--topology", "ring:1", "--algorithm", "ring", "--rank", "0", "--unix", "x"],
     "--topology"),
    (["rank", "allreduce", "--topology", TOPOLOGY, "--nodes", "3", "--algorithm", "ring", "--rank", "0",
      "--unix", "x"], "disagrees"),
    (["rank", "allreduce", "--nodes", "300", "--rank", "0", "--unix", "x"], "ring size from 2 to 255"),
    (["rank", "allreduce", "--nodes", "4", "--max-flows", "3", "--rank", "0", "--unix", "x"], "max_flows"),
    (["rank", "allreduce", "--topology", TOPOLOGY, "--algorithm", "ring", "--max-flows", "3", "--rank", "0",
      "--unix", "x"], "max_flows"),
    (["sim", "serve", "--topology", TOPOLOGY, "--links", "eth", "--host-link-gbps", "50", "--unix", "x"],
     "links='eth'"),
    (["sim", "serve", "--topology", TOPOLOGY, "--links", "eth", "--width", "512", "--unix", "x"], "64"),
    (["rank", "allreduce", "--topology", TOPOLOGY, "--algorithm", "ring", "--compress", "3", "--rank", "0",
      "--unix", "x"], "--compress"),
    (["rank", "allreduce", "--nodes", "4", "--compress", "25", "--rank", "0", "--unix", "x"], "--compress"),
    (["sim", "serve", "--topology", "torus:4x4", "--ports", "2", "--unix", "x"], "ports ≥ 4"),
    (["sim", "serve", "--nodes", "4", "--ports", "1", "--unix", "x"], "ports"),
    (["sim", "serve", "--unix", "x"], "--nodes N"),
    (["rank", "allreduce", "--topology", TOPOLOGY, "--algorithm", "multiring", "--chunk-bytes", "2000", "--rank", "0",
      "--unix", "x"], "1484"),
    (["rank", "allreduce", "--topology", TOPOLOGY, "--algorithm", "multiring", "--chunk-bytes", "1484", "--compress",
      "8", "--rank", "0", "--unix", "x"], "1396 (the fp32 bytes a compressed frame holds"),
    (["rank", "allreduce", "--topology", TOPOLOGY, "--algorithm", "biring", "--multiring-roots", "2", "--rank", "0",
      "--unix", "x"], "--algorithm multiring"),
    (["rank", "allreduce", "--topology", TOPOLOGY, "--algorithm", "multiring", "--multiring-roots", "3", "--rank",
      "0", "--unix", "x"], "divisor"),
    (["rank", "allreduce", "--topology", TOPOLOGY, "--algorithm", "ring", "--retries", "1", "--rank", "0",
      "--unix", "x"], "--barrier DIR"),
    (["rank", "allreduce", "--nodes", "4", "--retries", "1", "--rank", "0", "--unix", "x"], "--barrier DIR"),
    (["rank", "allreduce", "--topology", TOPOLOGY, "--algorithm", "ring", "--retries", "-1", "--rank", "0",
      "--unix", "x"], "--retries"),
])
def test_cli_engine_deploy_errors(argv, message, capsys, tmp_path):
    """Wrong arguments of `sim serve --topology` / `rank allreduce --topology` are refused with a
    message naming the problem, before anything is built or opened."""
    np.savez(tmp_path / "in.npz", **{f"node{k}": np.ones(8, np.float32) for k in range(4)})
    argv = [a if a != "x" else str(tmp_path / "socks") for a in argv]
    if argv[:2] == ["rank", "allreduce"]:
        argv += ["--input", str(tmp_path / "in.npz"), "--output", str(tmp_path / "o.npy")]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "socks").exists()


def test_cli_rank_without_a_server(tmp_path, capsys):
    """`rank allreduce --topology` with no `sim serve` behind the socket directory fails with a
    message naming what is missing, not a traceback."""
    np.savez(tmp_path / "in.npz", **{f"node{k}": np.ones(8, np.int32) for k in range(4)})
    argv = ["rank", "allreduce", "--topology", TOPOLOGY, "--algorithm", "ring", "--rank", "1", "--unix",
            str(tmp_path / "socks"), "--input", str(tmp_path / "in.npz"), "--output", str(tmp_path / "o.npy"),
            "--timeout", "1"]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "node1" in err and "sim serve" in err, err
    assert not (tmp_path / "o.npy").exists()


# ---- the cocotb engine behind UNIX sockets ----

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``wirereduce sim serve --topology ring:4 --codec --unix DIR`` (a cold Verilator build takes minutes)."""
    with served_engines(tmp_path_factory, "engine-serve", ["--topology", TOPOLOGY, "--codec"], "codec") as srv:
        yield srv


def _ranks(server, calls, first_collective: int, name: str, timeout: float = RECEIVE_TIMEOUT):
    """Run ``calls(k, transport, barrier)`` for every rank in its own thread (its own UNIX socket,
    ``timeout`` seconds per receive); returns rank → list of results."""
    def rank(k):
        with PacketTransport.unix(server["socks"], k, NODES, timeout=timeout) as tr:
            return calls(k, tr, FileBarrier(server["tmp"] / name, k, NODES))

    out = per_rank(NODES, rank)
    for k in range(NODES):
        assert isinstance(out.get(k), list), f"rank {k}: {out.get(k)!r}"
    return out


def _hard_fp32(rng, n):
    a = rng.standard_normal(n).astype(np.float32)
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38],
                       np.float32)
    a[rng.choice(n, 40, replace=False)] = rng.choice(special, 40)
    return a


@pytest.mark.cocotb
def test_engine_ranks_every_format_and_two_schedules(server):
    """Four ranks (threads, one EngineRankDriver and one UNIX socket each) on one served build:
    biring bf16 SUM (odd length), fp32 MAX with NaN/±0/±Inf, int32 SUM that wraps; then new
    drivers load the `ring` schedule into the same engines and run fp16 MIN. Every rank's every
    result equals the golden model's bit for bit."""
    rng = np.random.default_rng(17)
    n = 1501
    cases = [
        ("sum", [rng.standard_normal(n).astype(ml_dtypes.bfloat16) for _ in range(NODES)]),
        ("max", [_hard_fp32(rng, n) for _ in range(NODES)]),
        ("sum", [rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32) for _ in range(NODES)]),
    ]
    biring = sched.build(TOPOLOGY, "biring")

    def calls(k, tr, bar):
        d = EngineRankDriver(tr, k, biring, CONFIG, barrier=bar)
        res = [d.allreduce(arrays[k], op=op) for op, arrays in cases]
        assert d.ids.next == 1 + len(cases) and d.table_loaded and not d.unfinished
        return res

    out = _ranks(server, calls, 1, "bar1")
    for i, (op, arrays) in enumerate(cases):
        want = golden_allreduce(arrays, biring, op)
        assert any(np.asarray(w).view(np.uint8).any() for w in want)
        for k in range(NODES):
            got = out[k][i]
            assert got.dtype == arrays[k].dtype
            bad = mismatches(got, want[k])
            assert bad.size == 0, f"case {i} ({op}, {arrays[0].dtype}) rank {k}: {bad.size} elements differ"
    # wrap-around really happened in the int32 case
    wide = sum(a.astype(np.int64) for a in cases[2][1])
    assert (wide != wide.astype(np.int32)).any()

    ring = sched.build(TOPOLOGY, "ring")
    arrays = [rng.standard_normal(700).astype(np.float16) for _ in range(NODES)]
    arrays[0][:4] = [np.float16(-0.0), np.float16(np.nan), np.float16(np.inf), np.float16(6e-8)]

    def calls2(k, tr, bar):
        return [EngineRankDriver(tr, k, ring, CONFIG, barrier=bar, first_collective=10).allreduce(arrays[k], op="min")]

    out = _ranks(server, calls2, 10, "bar2")
    want = golden_allreduce(arrays, ring, "min")
    for k in range(NODES):
        assert mismatches(out[k][0], want[k]).size == 0, f"ring fp16 min, rank {k} differs"


def _rank_processes(server, arrays, algorithm: str, stem: str, collective: int, *extra: str) -> list[Path]:
    """One ``wirereduce rank allreduce --topology ring:4 --algorithm ALGORITHM`` process per rank on the
    served engines, ``arrays`` from an .npz, a shared barrier, collective ``collective``; fails the test
    if a rank fails. Returns each rank's output .npy."""
    tmp = server["tmp"]
    np.savez(tmp / f"{stem}.npz", **{f"node{k}": a for k, a in enumerate(arrays)})
    outs = [tmp / f"{stem}{k}.npy" for k in range(NODES)]
    rank_processes(NODES, lambda k: ["--topology", TOPOLOGY, "--algorithm", algorithm, *extra, "--rank", str(k),
                                     "--unix", str(server["socks"]), "--input", str(tmp / f"{stem}.npz"),
                                     "--output", str(outs[k]), "--barrier", str(tmp / f"bar-{stem}"),
                                     "--collective", str(collective), "--timeout", str(RECEIVE_TIMEOUT)])
    return outs


@pytest.mark.cocotb
def test_engine_one_process_per_rank_cli(server):
    """`wirereduce rank allreduce --topology ring:4 --algorithm biring`, one process per rank,
    bf16 arrays from an .npz: every rank's .npy is the golden bf16 allreduce bit for bit."""
    rng = np.random.default_rng(3)
    arrays = [(rng.standard_normal(2000) * 1e-3).astype(ml_dtypes.bfloat16) for _ in range(NODES)]
    outs = _rank_processes(server, arrays, "biring", "out", 40)
    want = golden_allreduce(arrays, sched.build(TOPOLOGY, "biring"), "sum")
    for k in range(NODES):
        got = np.load(outs[k], allow_pickle=False)
        got = got.view(ml_dtypes.bfloat16) if got.dtype.kind == "V" else got
        assert mismatches(got, want[k]).size == 0, f"rank {k} differs from the golden bf16 allreduce"


@pytest.mark.cocotb
def test_ranks_over_the_pcie_tops_dma_streams(server):
    """The host side of the VC709 PCIe top (XdmaTransport): four ranks reach the served engines
    through their DMA sockets (raw frames, no Ethernet header, as the XDMA's streams carry them):
    EngineRankDriver in threads, fp32 edge values with biring, then `rank allreduce --dma`, one
    process per rank, bf16 with the ring; every result bit-exact against the golden model."""
    from wirereduce.host.transports.xdma import XdmaTransport

    assert all((server["socks"] / f"node{k}.dma").exists() for k in range(NODES))
    rng = np.random.default_rng(23)
    arrays = [_hard_fp32(rng, 1203) for _ in range(NODES)]
    biring = sched.build(TOPOLOGY, "biring")

    def rank(k):
        with XdmaTransport.unix(server["socks"], k, NODES, timeout=RECEIVE_TIMEOUT) as tr:
            bar = FileBarrier(server["tmp"] / "bar-dma", k, NODES)
            return [EngineRankDriver(tr, k, biring, CONFIG, barrier=bar, first_collective=95).allreduce(arrays[k])]

    out = per_rank(NODES, rank)
    want = golden_allreduce(arrays, biring, "sum")
    for k in range(NODES):
        assert isinstance(out.get(k), list), f"rank {k}: {out.get(k)!r}"
        assert mismatches(out[k][0], want[k]).size == 0, f"rank {k} differs over the DMA socket"
    bf = [(rng.standard_normal(900) * 1e-2).astype(ml_dtypes.bfloat16) for _ in range(NODES)]
    outs = _rank_processes(server, bf, "ring", "dma", 96, "--dma")
    want = golden_allreduce(bf, sched.build(TOPOLOGY, "ring"), "sum")
    for k in range(NODES):
        got = np.load(outs[k], allow_pickle=False)
        got = got.view(ml_dtypes.bfloat16) if got.dtype.kind == "V" else got
        assert mismatches(got, want[k]).size == 0, f"rank {k} differs (rank allreduce --dma)"


@pytest.mark.cocotb
def test_train_bf16_gradients_through_served_engines(server):
    """`wirereduce train --topology ring:4 --algorithm biring --wire-dtype bf16 --backend sim --check
    --unix DIR --dma` (the fixture's `sim serve --topology`): four DDP processes, each bucket's fp32
    gradients sent as bf16 through its own engine (EngineRankDriver) over the engine's DMA socket
    (XdmaTransport, as over the VC709 PCIe top's host link), every bucket's bf16 sum compared bit
    for bit at rank 0 with the golden model in biring's order (CheckedBackend)."""
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'wirereduce[torch]')")
    pytest.importorskip("sklearn", reason="scikit-learn (the digits data set) is not installed")
    r = subprocess.run([sys.executable, "-m", "wirereduce.cli", "train", "--topology", TOPOLOGY, "--algorithm",
                        "biring", "--wire-dtype", "bf16", "--backend", "sim", "--unix", str(server["socks"]),
                        "--dma", "--steps", "2", "--check", "--no-progress"],
                       cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bfloat16 gradients on the wire" in r.stdout and "hosts on the boards' DMA sockets" in r.stdout
    assert "every bucket's sum bit-identical to the golden model (2 checked at rank 0)" in r.stdout


class _Lossy:
    """A rank's transport that loses the frames it is asked to send for which ``drop(header)`` is
    true (a dead NIC queue, a frame lost on the host link), and, with ``short``, waits 3 s per
    receive in the collectives ``short`` (so a stall shows in seconds) and RECEIVE_TIMEOUT in the
    others (it tells the collective from the CONTROL frames it sends)."""

    def __init__(self, transport, drop, short=None):
        self.inner, self.drop, self.short = transport, drop, short
        self.dropped = []

    async def send(self, node, data):
        from wirereduce.protocol import Header, Opcode

        h = Header.unpack(data)
        if h.opcode == Opcode.CONTROL and self.short is not None:
            self.inner.timeout = 3 if h.collective in self.short else RECEIVE_TIMEOUT
        if self.drop(h):
            self.dropped.append(h.collective)
            return
        await self.inner.send(node, data)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _no_pushes(transport):
    """Every HOST_PUSH lost (a rank whose pushes never reach its node)."""
    from wirereduce.protocol import Opcode

    return _Lossy(transport, lambda h: h.opcode == Opcode.HOST_PUSH)


@pytest.mark.cocotb
def test_engine_rank_without_pushes_fails_bounded_then_aborts(server):
    """Rank 3's pushes never reach its node: every rank raises ChunksLost within its receive timeout
    (none hangs, none returns a partial sum), naming its missing chunks. The same drivers then run
    the next collective with ``Flag.ABORT`` on their CONTROL: every engine drops what the stalled
    one left in flight, and every rank gets the golden result bit for bit."""
    import time

    from wirereduce.host.driver import ChunksLost

    rng = np.random.default_rng(23)
    first = [rng.standard_normal(900).astype(np.float32) for _ in range(NODES)]
    second = [rng.standard_normal(1300).astype(np.float32) for _ in range(NODES)]
    biring = sched.build(TOPOLOGY, "biring")
    drivers: dict = {}
    errors: dict = {}
    t0 = time.monotonic()

    def calls(k, tr, bar):
        lossy = _no_pushes(tr) if k == NODES - 1 else tr
        d = drivers[k] = EngineRankDriver(lossy, k, biring, CONFIG, barrier=bar, first_collective=50)
        try:
            d.allreduce(first[k])
        except ChunksLost as e:
            errors[k] = e
        assert d.unfinished
        d.transport = tr   # the pushes get through again
        tr.timeout = RECEIVE_TIMEOUT   # the short timeout was for the stalled collective only
        return [d.allreduce(second[k])]

    out = _ranks(server, calls, 50, "bar-abort", timeout=3)
    assert time.monotonic() - t0 < 300
    assert sorted(errors) == list(range(NODES)), "every rank must report the stalled collective"
    for k, e in errors.items():
        assert e.missing[k], f"rank {k}: ChunksLost names no missing chunk"
        assert "sent no result in time" in str(e)
    want = golden_allreduce(second, biring, "sum")
    for k in range(NODES):
        assert not drivers[k].unfinished and drivers[k].ids.next == 52
        assert mismatches(out[k][0], want[k]).size == 0, f"rank {k}: the collective after the abort differs"


@pytest.mark.cocotb
def test_engine_rank_retries_agree_on_the_lost_chunks(server):
    """EngineRankDriver(retries=1, exchange=FileExchange): rank 1's push of chunk 2 is lost in
    collective 60; every rank stalls, the ranks exchange what they miss, and collective 61 sums
    chunk 2 again in its own flow's share: every rank's bf16 result (odd length) equals the golden
    model's of the whole array bit for bit, as if nothing was lost. Then the push is lost in the
    first round and in the retry (62, 63): every rank raises ChunksLost. The next allreduce (64,
    ABORT) is bit-exact again."""
    from wirereduce.host.driver import ChunksLost
    from wirereduce.host.rank import FileExchange

    rng = np.random.default_rng(29)
    n = 801
    arrays = [rng.standard_normal(n).astype(ml_dtypes.bfloat16) for _ in range(NODES)]
    later = [rng.standard_normal(333).astype(np.float32) for _ in range(NODES)]
    biring = sched.build(TOPOLOGY, "biring")
    drivers, errors, dropped = {}, {}, {}

    def calls(k, tr, bar):
        from wirereduce.protocol import Opcode

        lose = {60, 62, 63} if k == 1 else set()
        lossy = _Lossy(tr, lambda h: h.opcode == Opcode.HOST_PUSH and h.seq == 2 and h.collective in lose,
                       short={60, 62, 63})
        ex = FileExchange(server["tmp"] / "exchange-retries", k, NODES, timeout=RECEIVE_TIMEOUT)
        d = drivers[k] = EngineRankDriver(lossy, k, biring, CONFIG, barrier=bar, first_collective=60, retries=1,
                                          exchange=ex)
        first = d.allreduce(arrays[k])
        retried = d.retried
        try:
            d.allreduce(arrays[k])
        except ChunksLost as e:
            errors[k] = e
        assert d.unfinished
        dropped[k] = list(lossy.dropped)
        return [first, retried, d.allreduce(later[k])]

    out = _ranks(server, calls, 60, "bar-retries")
    assert dropped[1] == [60, 62, 63] and not any(dropped[k] for k in (0, 2, 3)), dropped
    want = golden_allreduce(arrays, biring, "sum")
    for k in range(NODES):
        first, retried, last = out[k]
        assert retried >= 1, f"rank {k}: nothing was retried"
        assert first.dtype == arrays[k].dtype and first.shape == (n,)
        assert mismatches(first, want[k]).size == 0, f"rank {k}: the retried allreduce differs from the golden model"
    assert sorted(errors) == list(range(NODES)), "with the retry lost too, every rank must raise ChunksLost"
    assert all(2 in e.missing.get(k, []) or "still miss chunks" in str(e) for k, e in errors.items())
    want = golden_allreduce(later, biring, "sum")
    for k in range(NODES):
        assert not drivers[k].unfinished and drivers[k].ids.next == 65
        assert mismatches(out[k][2], want[k]).size == 0, f"rank {k}: the allreduce after the failed one differs"


def test_engine_rank_retries_refuse_bad_arguments(tmp_path):
    """retries without an exchange, or a bad count, raise before anything is sent; FileExchange
    gathers every rank's value in rank order and times out naming how many ranks came."""
    from wirereduce.host.rank import FileExchange

    s = sched.build(TOPOLOGY, "biring")
    with pytest.raises(ValueError, match="retries need exchange"):
        EngineRankDriver(None, 0, s, CONFIG, retries=1)
    with pytest.raises(ValueError, match="retries must be an int"):
        EngineRankDriver(None, 0, s, CONFIG, retries=-1, exchange=lambda v: [v])
    with pytest.raises(ValueError, match="rank must be"):
        FileExchange(tmp_path, 3, 3)
    out = per_rank(3, lambda k: FileExchange(tmp_path / "x", k, 3, timeout=30)([k, k * 10]))
    assert [out[k] for k in range(3)] == [[[0, 0], [1, 10], [2, 20]]] * 3
    with pytest.raises(TimeoutError, match="only 1 of 2 ranks reached exchange round 0"):
        FileExchange(tmp_path / "y", 0, 2, timeout=0.05)([1])


@pytest.mark.cocotb
def test_sim_allreduce_topology_on_the_cocotb_engine(server, tmp_path, capsys):
    """`wirereduce sim allreduce --topology ring:4 --algorithm ring --engine cocotb --codec`: the
    schedule engines on the cocotb engine (the build the module's `sim serve --topology --codec`
    uses: `--codec` reuses it instead of a 5-minute build of the plain engines, whose RTL the fast
    engine's tests cover), every rank an EngineRankDriver; fp16 MAX with ±0, NaN and ±Inf passing
    through the codec ports untouched, checked bit for bit (`--check`) against the golden model the
    fast engine is checked against (tests/test_engine_system.py)."""
    from wirereduce.sim.engines.runner import available_simulators

    if "verilator" not in available_simulators():
        pytest.skip("needs Verilator")
    rng = np.random.default_rng(41)
    arrays = [rng.standard_normal(999).astype(np.float16) for _ in range(NODES)]
    arrays[1][:6] = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 65504.0], np.float16)
    arrays[2][:6] = np.array([-0.0, 0.0, 1.0, -np.inf, np.inf, -65504.0], np.float16)
    got = sim_allreduce_checked(tmp_path, capsys, arrays, TOPOLOGY, "ring", "--engine", "cocotb", "--codec", op="max")
    assert np.isnan(got[0][2]) and np.signbit(got[0][0]) == np.False_


@pytest.mark.cocotb
def test_demo_topology_bf16_on_the_cocotb_engine(server, tmp_path, capsys):
    """`wirereduce demo --topology ring:4 --algorithm biring --dtype bf16 --engine cocotb --codec`:
    the engine's Verilog written, real CNN gradients rounded to bf16 through the engines (the
    served codec build, as above), every node bit-exact against the golden model (the RESULT line
    a script reads)."""
    from wirereduce.sim.engines.runner import available_simulators

    if "verilator" not in available_simulators():
        pytest.skip("needs Verilator")
    build = ROOT / "build" / "sim"
    assert main(["demo", "--topology", TOPOLOGY, "--algorithm", "biring", "--dtype", "bf16", "--engine", "cocotb",
                 "--codec", "--build-dir", str(build)]) == 0
    out = capsys.readouterr().out
    assert "RESULT topology=ring:4 algorithm=biring dtype=bf16 elements=3818 bitexact=true" in out, out
    assert (build.parent / "verilog" / "wirereduce_engine.v").stat().st_size > 0


@pytest.mark.parametrize("argv, message", [
    (["demo", "--nodes", "1", "--dtype", "bf16"], "ring size from 2 to 255"),
    (["demo", "--topology", TOPOLOGY], "--algorithm"),
    (["demo", "--topology", TOPOLOGY, "--nodes", "3", "--algorithm", "ring"], "disagrees"),
    (["demo", "--topology", TOPOLOGY, "--algorithm", "ring", "--compress", "3"], "--compress"),
])
def test_demo_topology_errors(argv, message, capsys, tmp_path):
    assert main([*argv, "--build-dir", str(tmp_path / "b")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


class _Hostile:
    """Sends three malformed copies of every HOST_PUSH before the push itself: one word short of
    its header's count, one word long, and with a wrong version byte (what a buggy host or a
    corrupted NIC buffer hands the node)."""

    def __init__(self, transport):
        self.inner, self.injected = transport, 0

    async def send(self, node, data):
        from wirereduce.protocol import Header, Opcode

        if Header.unpack(data).opcode == Opcode.HOST_PUSH:
            bad_version = bytes([data[0] ^ 0x0F]) + data[1:]
            for bad in (data[:-4], data + bytes(4), bad_version):
                await self.inner.send(node, bad)
                self.injected += 1
        await self.inner.send(node, data)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.cocotb
def test_engine_drops_malformed_pushes_and_sums_only_good_ones(server):
    """Every rank's every push is preceded by three malformed copies of it (a word short, a word
    long, a bad version), for chunk numbers the collective really has: each engine drops and counts
    all of them (``drop_*``), none reaches a sum, and every result is the golden model's bit for bit."""
    from wirereduce.protocol import STATS_COUNTERS

    rng = np.random.default_rng(31)
    arrays = [rng.standard_normal(1700).astype(np.float32) for _ in range(NODES)]
    biring = sched.build(TOPOLOGY, "biring")
    drops = [c for c in STATS_COUNTERS if c.startswith("drop_")]
    seen: dict = {}

    def calls(k, tr, bar):
        import asyncio

        hostile = _Hostile(tr)
        d = EngineRankDriver(hostile, k, biring, CONFIG, barrier=bar, first_collective=70)
        before = asyncio.run(d.stats())
        got = d.allreduce(arrays[k])
        after = asyncio.run(d.stats())
        seen[k] = (hostile.injected, sum(after[c] - before[c] for c in drops),
                   {c: after[c] - before[c] for c in drops if after[c] != before[c]})
        return [got]

    out = _ranks(server, calls, 70, "bar-hostile")
    want = golden_allreduce(arrays, biring, "sum")
    for k in range(NODES):
        injected, dropped, which = seen[k]
        assert injected >= 3 and dropped == injected, f"rank {k}: {injected} malformed frames, drops {which}"
        assert mismatches(out[k][0], want[k]).size == 0, f"rank {k}: a malformed push reached the sum"


# ---- compressed collectives on the served codec engines ----

def _gradients(rng, n):
    """Gradient-like fp32 values over six decades, with the codec's edge values."""
    a = (rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 0, n)).astype(np.float32)
    a[:8] = np.array([0.0, -0.0, 1e-45, -3e-39, 1.0, -2.5, 1e-3, 2.0 ** -9], np.float32)
    return a


@pytest.mark.cocotb
def test_compressed_one_process_per_rank_cli(server):
    """`wirereduce rank allreduce --topology ring:4 --algorithm multitree --compress 10`, one process
    per rank against the served codec engines: each rank pushes its chunks compressed, every hop
    decompresses, sums in the table's order and recompresses, and every rank's .npy is the golden
    compressed allreduce (`sim.golden.schedule.allreduce(..., compression=10)`) bit for bit; then
    an uncompressed collective on the same engines is the plain golden sum."""
    rng = np.random.default_rng(8)
    arrays = [_gradients(rng, 3001) for _ in range(NODES)]
    outs = _rank_processes(server, arrays, "multitree", "cout", 80, "--compress", "10")
    s = sched.build(TOPOLOGY, "multitree")
    want = golden_allreduce(arrays, s, "sum", compression=10)
    plain = golden_allreduce(arrays, s, "sum")
    for k in range(NODES):
        got = np.load(outs[k], allow_pickle=False)
        assert mismatches(got, want[k]).size == 0, f"rank {k} differs from the golden compressed allreduce"
    assert mismatches(want[0], plain[0]).size > 0, "k = 10 must change some bits, or the test cannot tell"

    def calls(k, tr, bar):
        return [EngineRankDriver(tr, k, s, CODEC_CONFIG, barrier=bar, first_collective=90).allreduce(arrays[k])]

    out = _ranks(server, calls, 90, "bar-plain")
    for k in range(NODES):
        assert mismatches(out[k][0], plain[k]).size == 0, f"rank {k}: uncompressed through the codec differs"


@pytest.mark.cocotb
def test_train_compressed_through_served_codec_engines(server):
    """`wirereduce train --topology ring:4 --algorithm biring --compress 10 --error-feedback --backend
    sim --check --unix DIR`: four DDP processes, each fp32 bucket compressed through its own codec
    engine, every bucket's sum compared bit for bit at rank 0 with the golden compressed biring."""
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'wirereduce[torch]')")
    pytest.importorskip("sklearn", reason="scikit-learn (the digits data set) is not installed")
    r = subprocess.run([sys.executable, "-m", "wirereduce.cli", "train", "--topology", TOPOLOGY, "--algorithm",
                        "biring", "--compress", "10", "--error-feedback", "--backend", "sim", "--unix",
                        str(server["socks"]), "--steps", "2", "--check", "--no-progress"],
                       cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "INCEPTIONN k=10" in r.stdout
    assert "every bucket's sum bit-identical to the golden model (2 checked at rank 0)" in r.stdout


@pytest.mark.cocotb
def test_sim_allreduce_compressed_on_the_cocotb_engine(server, tmp_path, capsys):
    """`wirereduce sim allreduce --topology ring:4 --algorithm biring --engine cocotb --compress 8
    --check`: the codec engines (the served build) on the cocotb engine, checked bit for bit
    against the golden compressed allreduce."""
    rng = np.random.default_rng(12)
    arrays = [_gradients(rng, 2500) for _ in range(NODES)]
    np.savez(tmp_path / "in.npz", **{f"node{k}": a for k, a in enumerate(arrays)})
    argv = ["sim", "allreduce", "--topology", TOPOLOGY, "--algorithm", "biring", "--engine", "cocotb",
            "--compress", "8", "--input", str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz"), "--check",
            "--build-dir", str(ROOT / "build" / "sim")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("bit-exact") == NODES and "compression=k8" in out, out
    got = np.load(tmp_path / "out.npz")
    want = golden_allreduce(arrays, sched.build(TOPOLOGY, "biring"), "sum", compression=8)
    for k in range(NODES):
        assert mismatches(got[f"node{k}"], want[k]).size == 0


@pytest.mark.cocotb
def test_chunk_profile_and_multiring_roots_per_rank_and_on_the_cocotb_engine(server, tmp_path, capsys):
    """`--chunk-bytes 256,768,1484 --multiring-roots 2` (the 4x4 torus's fastest 32 KiB set-up) reach
    the served engines both ways: `rank allreduce`, one process per rank (EngineRankDriver
    ``chunk_words``), and `sim allreduce --engine cocotb` (the job file carries the schedule's options
    and the profile). 1,501 fp32 elements in 4 flows: chunks of 64, 192 and 119 words. Every rank's
    result is the golden multiring allreduce with 2 roots bit for bit, which differs from the
    every-node-a-root schedule's bits, so a lost option would show. Last in the module: its collective
    id (100) is above every other test's."""
    rng = np.random.default_rng(17)
    arrays = [(rng.standard_normal(1501) * 10.0 ** rng.integers(-3, 3, 1501)).astype(np.float32)
              for _ in range(NODES)]
    s2 = sched.build(TOPOLOGY, "multiring", roots=2)
    want = golden_allreduce(arrays, s2, "sum")
    other = golden_allreduce(arrays, sched.build(TOPOLOGY, "multiring"), "sum")
    assert len(s2.flows) == 4 and mismatches(want[0], other[0]).size > 0, "the test could not tell the schedules apart"
    opts = ("--multiring-roots", "2", "--chunk-bytes", "256,768,1484")
    outs = _rank_processes(server, arrays, "multiring", "prof", 100, *opts)
    for k in range(NODES):
        assert mismatches(np.load(outs[k]), want[k]).size == 0, f"rank {k} differs from the golden allreduce"
    np.savez(tmp_path / "in.npz", **{f"node{k}": a for k, a in enumerate(arrays)})
    assert main(["sim", "allreduce", "--topology", TOPOLOGY, "--algorithm", "multiring", *opts, "--engine", "cocotb",
                 "--codec", "--input", str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz"), "--check",
                 "--build-dir", str(ROOT / "build" / "sim")]) == 0
    out = capsys.readouterr().out
    assert "flows=4" in out and "chunks=12" in out and "chunk_bytes=256,768,1484" in out, out
    got = np.load(tmp_path / "out.npz")
    for k in range(NODES):
        assert mismatches(got[f"node{k}"], want[k]).size == 0, f"node {k} differs on the cocotb engine"
