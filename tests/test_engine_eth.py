"""Schedule engines cabled with real 10G Ethernet (``ScheduleNetwork(links="eth")``): every network
port an ``EthPort10G`` (Ethernet II framing, MAC with FCS, 10GBASE-R PCS, cut-through receive),
every cable a stream of scrambled 66-bit blocks, on the fast engine. Results are compared bit for
bit with the golden model in table order (:func:`wirereduce.sim.engines.fastengine.golden_check`).

One build (ring:4, the configuration ``wirereduce sim allreduce --topology ring:4 --algorithm
biring --links eth --compress K`` builds: codec engines, which pass uncompressed collectives
through untouched) serves every test here, the CLI's included.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from helpers import edge_arrays, ring_steady_state
from wirereduce.sim.cluster.network import eth_mac
from wirereduce.sim.cluster.schednet import ScheduleNetwork
from wirereduce.sim.engines.fastengine import FastEngineSim, golden_check

from wirereduce import schedule as sched
from wirereduce.config import EngineConfig
from wirereduce.protocol import ETHERTYPE, HEADER_BYTES, STATS_COUNTERS, Header, Opcode, max_elements, wire_bytes

pytestmark = pytest.mark.verilator
ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "sim-engine-eth"
#: What the CLI builds for ring:4 biring --compress K at its defaults (16 slots, ports = degree,
#: max_flows = 8, the codec at every port).
CFG = EngineConfig(64, 1500, slots=16, ports=2, max_flows=8, codec=True)
DROPS = tuple(name for name in STATS_COUNTERS if name.startswith("drop_"))


@pytest.fixture(scope="module")
def eth_ring4():
    return FastEngineSim("ring:4", CFG, 4, links="eth", build_root=BUILD)


def _no_drops(stats):
    """No engine dropped a frame (STATS after the last result) and each delivered every chunk's
    result once. (A frame cut off on an Ethernet wire never reaches a gate: it shows as a stall,
    :class:`~wirereduce.sim.engines.fastengine.EngineStalled`, not as a drop.)"""
    assert stats is not None
    for k, st in enumerate(stats):
        assert st["result_frames"] == st["chunks"], f"node {k}: {st['result_frames']} of {st['chunks']} results"
        assert all(name in st for name in DROPS), sorted(st)
        bad = {name: st[name] for name in DROPS if st[name]}
        assert not bad, f"node {k} dropped frames: {bad}"
        assert st["ports"] == CFG.ports
        lost = {name: v for name, v in st.items() if v and (name.startswith("link_drop_") or name.endswith(
            ("_fcs_errors", "_runts", "_oversize", "_code_errors", "_overflow", "_stomped", "_aborted")))}
        assert not lost, f"node {k}'s ports lost frames: {lost}"


def test_eth_links_refused_where_they_cannot_run():
    """Before any build: Ethernet at 512 bit, a host link faster than the 10G cables (the MAC and PCS
    run at the datapath clock), paced cables, and the 100G CMAC glue at 64 bit."""
    with pytest.raises(ValueError, match="64-bit"):
        ScheduleNetwork("ring:4", EngineConfig(512, 9000, ports=2), links="eth")
    with pytest.raises(ValueError, match="host link cannot be faster"):
        ScheduleNetwork("ring:4", CFG, links="eth", link_rate=Fraction(8, 5), host_rate=Fraction(8))   # 50G host
    with pytest.raises(ValueError, match="host link cannot be faster"):
        ScheduleNetwork("ring:4", CFG, links="eth", link_rate=Fraction(8, 5), host_rate=Fraction(8, 5))
    with pytest.raises(ValueError, match="512-bit"):
        ScheduleNetwork("ring:4", CFG, links="cmac")
    with pytest.raises(ValueError, match="links must be one of"):
        FastEngineSim("ring:4", CFG, 4, links="fibre", build_root=BUILD)


@pytest.mark.parametrize("alg,n", [("biring", 1), ("biring", 3001), ("ring", 777), ("multitree", 1999)])
def test_fp32_over_ethernet_bitexact(eth_ring4, alg, n):
    """Edge values (±0, subnormals, Inf, NaN, overflow, cancellation), odd lengths, several frames a
    flow: every host's result is the golden model's. multitree's roots multicast on both network
    ports in lock-step; without the ports' start buffer (``ETH_TX_START``) a port still ending its
    last frame held the other back mid-frame, its MAC underran and the frame was lost."""
    s = sched.build("ring:4", alg)
    arrays = edge_arrays(4, n, seed=n + 5)
    r = eth_ring4.allreduce(arrays, s, final_stats=True)
    assert golden_check(arrays, s, r.results) == [0, 0, 0, 0]
    _no_drops(r.final_stats)


def test_bf16_max_and_int32_over_ethernet(eth_ring4):
    """bf16 MAX with NaN and ±0 and an int32 SUM that wraps, on the same build."""
    rng = np.random.default_rng(9)
    s = sched.build("ring:4", "biring")
    bf = [rng.standard_normal(1501).astype(ml_dtypes.bfloat16) for _ in range(4)]
    bf[1][:4] = np.array([np.nan, -0.0, 0.0, -np.inf], ml_dtypes.bfloat16)
    r = eth_ring4.allreduce(bf, s, op="max")
    assert golden_check(bf, s, r.results, op="max") == [0, 0, 0, 0]
    ints = [rng.integers(-2**31, 2**31, 999, dtype=np.int64).astype(np.int32) for _ in range(4)]
    r = eth_ring4.allreduce(ints, s, final_stats=True)
    assert golden_check(ints, s, r.results) == [0, 0, 0, 0]
    _no_drops(r.final_stats)


def test_same_bits_with_host_backpressure(eth_ring4):
    """Host gaps and back-pressure at two seeds: the same bits every time, and the timing moved."""
    s = sched.build("ring:4", "biring")
    arrays = edge_arrays(4, 2000, seed=4)
    runs = [eth_ring4.allreduce(arrays, s, rx_valid_prob=0.7, tx_ready_prob=0.6, seed=seed) for seed in (1, 2)]
    assert golden_check(arrays, s, runs[0].results) == [0, 0, 0, 0]
    assert np.array_equal(np.concatenate(runs[0].results).view(np.uint32),
                          np.concatenate(runs[1].results).view(np.uint32))
    assert runs[0].cycles != runs[1].cycles


def test_cli_sim_allreduce_links_eth(eth_ring4, tmp_path, capsys):
    """``wirereduce sim allreduce --topology ring:4 --algorithm biring --links eth --engine fast
    --compress 12 --check --late 2 15000 --pcap FILE`` end to end, on the fixture's build: bit-exact
    with rank 2 starting late, the run at least that long, the capture written."""
    from wirereduce.cli import main

    arrays = edge_arrays(4, 1234, seed=8)
    inp, out = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(inp, **{f"node{k}": a for k, a in enumerate(arrays)})
    code = main(["sim", "allreduce", "--topology", "ring:4", "--algorithm", "biring", "--links", "eth",
                 "--engine", "fast", "--compress", "12", "--input", str(inp), "--output", str(out), "--check",
                 "--build-dir", str(BUILD), "--late", "2", "15000", "--pcap", str(tmp_path / "c.pcap")])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "rank 2 started 15000 cycles late" in text and "lost to receive FIFO overflow 0" in text, text
    assert int(text.split("simulated cycles=")[1].split()[0]) >= 15000
    assert (tmp_path / "c.pcap").stat().st_size > 24 and f"wrote {tmp_path / 'c.pcap'}" in text
    with np.load(out) as got:
        results = [got[f"node{k}"] for k in range(4)]
    assert golden_check(arrays, sched.build("ring:4", "biring"), results, compression=12) == [0, 0, 0, 0]
    assert "node3: bit-exact" in text and "compression=k12" in text


@pytest.mark.parametrize("alg,k,rx,tx", [("multitree", 8, 0.7, 0.6), ("biring", 10, 1.0, 1.0),
                                         ("ring", 24, 0.9, 0.5)])
def test_compressed_over_ethernet(eth_ring4, alg, k, rx, tx):
    """Compressed collectives over the Ethernet ports: every frame on a wire is a compressed frame
    (shorter than its uncompressed form, tags first) in Ethernet II with its FCS; each hop
    decompresses, sums in the table's order and recompresses. Bit for bit the golden compressed
    allreduce, no drops, whatever the host back-pressure."""
    s = sched.build("ring:4", alg)
    rng = np.random.default_rng(k)
    n = 7001
    arrays = [(rng.standard_normal(n) * 10.0 ** rng.uniform(-5, 0, n)).astype(np.float32) for _ in range(4)]
    r = eth_ring4.allreduce(arrays, s, compression=k, rx_valid_prob=rx, tx_ready_prob=tx, seed=k, final_stats=True)
    assert golden_check(arrays, s, r.results, compression=k) == [0, 0, 0, 0]
    _no_drops(r.final_stats)


def test_capped_host_link_never_cuts_a_frame(eth_ring4):
    """biring delivers results from both directions, twice what the 10G host link takes, so the
    engines' host FIFOs fill. A forwarded BROADCAST that had to wait for its host copy in the middle
    of a frame would underrun the next port's MAC (the frame ends with /E/ and is lost: before the
    fix, 4 of 138 broadcasts never arrived at 65,536 elements). A source now starts only with room
    for a whole frame in its host FIFO: every result arrives, bit-exact."""
    s = sched.build("ring:4", "biring")
    rng = np.random.default_rng(12)
    arrays = [rng.standard_normal(65536).astype(np.float32) for _ in range(4)]
    r = eth_ring4.allreduce(arrays, s, final_stats=True)
    assert golden_check(arrays, s, r.results) == [0, 0, 0, 0]
    _no_drops(r.final_stats)


def test_ring_runs_at_the_host_links_rate(eth_ring4):
    """The NTT ring (``ring``) behind 10G host links: in the steady state every further chunk costs
    one frame's wire time on the host link (:func:`~wirereduce.protocol.wire_bytes` / 8 cycles), the
    bound, and no more: measured as the difference of two runs, 16 and 48 chunks. With host FIFOs of
    exactly two frames each chunk cost one to three cycles more (a writer waited for the frame before
    to start leaving; ``HOST_FIFO_SLACK``), 0.98 of the bound instead of 0.99+."""
    cost, _ = ring_steady_state(eth_ring4, 4, seed=21)
    per_chunk = max_elements(CFG.mtu)
    bound = wire_bytes(HEADER_BYTES + 4 * per_chunk) / 8                 # 192.25 cycles at MTU 1500
    assert bound - 0.05 <= cost <= bound + 0.05, f"{cost:.3f} cycles a chunk, the host link's bound {bound}"


def test_stats_count_every_frame_on_every_cable(eth_ring4, tmp_path):
    """Each engine's STATS carry its Ethernet ports' MAC counters (``net{p}_…``): every frame a
    port sent arrived at the port on the other end of its cable, and the engine accepted what its
    ports delivered (REDUCE + BROADCAST frames = the frames its network ports received). The cable
    out of node 0's port 0 is captured to pcap and read back with scapy: as many frames as the port
    counted sent, our EtherType and the two ports' addresses, a wirereduce header in every frame."""
    s = sched.build("ring:4", "biring")
    arrays = edge_arrays(4, 2345, seed=21)
    pcap = tmp_path / "node0-port0.pcap"
    r = eth_ring4.allreduce(arrays, s, final_stats=True, pcap=pcap)
    assert golden_check(arrays, s, r.results) == [0, 0, 0, 0]
    st = r.final_stats
    _no_drops(st)
    topo = s.topology
    for u in range(4):
        for p, (v, q) in enumerate(topo.links[u]):
            assert st[u][f"net{p}_tx_frames"] > 0
            assert st[u][f"net{p}_tx_frames"] == st[v][f"net{q}_rx_frames"], (u, p, v, q)
        assert sum(st[u][f"net{p}_rx_frames"] for p in range(2)) == (st[u]["reduce_frames"]
                                                                     + st[u]["broadcast_frames"])
        assert st[u]["host_rx_frames"] == 0 and st[u]["link_drop_host"] == 0   # the host link is a model

    from scapy.layers.l2 import Ether
    from scapy.utils import rdpcap

    pkts = rdpcap(str(pcap))
    assert len(pkts) == st[0]["net0_tx_frames"]
    times = [float(p.time) for p in pkts]
    assert times == sorted(times) and times[0] > 0
    v, q = topo.links[0][0]
    opcodes = set()
    for p in pkts:
        assert Ether in p and p[Ether].type == ETHERTYPE
        assert int(p[Ether].src.replace(":", ""), 16) == eth_mac(0, 0)
        assert int(p[Ether].dst.replace(":", ""), 16) == eth_mac(v, q)
        frame = bytes(p[Ether].payload)
        h = Header.unpack(frame)
        assert h.collective == 1 and 0 < h.count <= max_elements(CFG.mtu)
        assert len(frame) == max(HEADER_BYTES + 4 * h.count, 46)   # short frames padded to the minimum
        opcodes.add(h.opcode)
    assert opcodes == {Opcode.REDUCE, Opcode.BROADCAST}


def test_bit_error_on_a_cable_is_counted_where_it_happened(eth_ring4):
    """A bit flipped in the 40th data block node 0 sends out of its port 0: the engine on the other
    end counts the frame's bad FCS on its own port (``link_drop_net{q}``, ``net{q}_rx_fcs_errors``)
    and no other port does; the frame never reaches a sum, and the run stalls with the count in
    its message instead of a wrong result."""
    cable_error_counted(eth_ring4, sched.build("ring:4", "biring"), edge_arrays(4, 1500, seed=22), 40, 12_000)


def cable_error_counted(sim, s, arrays, block: int, timeout_cycles: int) -> None:
    """Run ``arrays`` with a bit flipped in the ``block``-th block (beat) node 0 sends out of its
    port 0: the run stalls (EngineStalled) naming the far end's ``link_drop_net{q} 1``; that port
    counts one FCS error and no other port counts any."""
    from wirereduce.sim.engines.fastengine import EngineStalled

    v, q = s.topology.links[0][0]
    with pytest.raises(EngineStalled, match=f"link_drop_net{q} 1") as info:
        sim.allreduce(arrays, s, corrupt=(0, 0, block), timeout_cycles=timeout_cycles)
    st = info.value.stats
    assert st[v][f"link_drop_net{q}"] == 1 and st[v][f"net{q}_rx_fcs_errors"] == 1
    others = {(u, name): val for u in st for name, val in st[u].items()
              if val and name.endswith("_fcs_errors") and (u, name) != (v, f"net{q}_rx_fcs_errors")}
    assert not others, others


def test_late_host_same_bits(eth_ring4):
    """A host that starts 20,000 cycles after the others: the engines wait for its chunks (every
    result needs them), nothing is dropped or overflows, and the bits are those of the run in
    lock-step; a bad ``late`` raises before anything runs."""
    s = sched.build("ring:4", "multitree")
    arrays = edge_arrays(4, 3000, seed=23)
    r = eth_ring4.allreduce(arrays, s, late=(2, 20_000), final_stats=True)
    assert golden_check(arrays, s, r.results) == [0, 0, 0, 0]
    assert r.cycles >= 20_000
    _no_drops(r.final_stats)
    for bad, what in (((4, 10), "rank"), ((1, -1), "cycles"), ((1,), "pair")):
        with pytest.raises(ValueError, match=what):
            eth_ring4.allreduce(arrays, s, late=bad)


def test_corrupt_refused_before_anything_runs(eth_ring4):
    s = sched.build("ring:4", "biring")
    arrays = edge_arrays(4, 10, seed=1)
    for bad, what in (((0, 2, 5), "port"), ((4, 0, 5), "node"), ((0, 0, 0), "block"), ((0, 0, 3, "payload"), "mode"),
                      ((0, 0), "corrupt must be")):
        with pytest.raises(ValueError, match=what):
            eth_ring4.allreduce(arrays, s, corrupt=bad)


def test_cli_corrupt_on_a_schedule_engine_cable(eth_ring4, tmp_path, capsys):
    """``sim allreduce --topology ring:4 --links eth --corrupt 0 40 --corrupt-port 1``: the run
    stalls, and the CLI says so with the receiving engine's count and that --retries would sum the lost
    chunks again (exit 2, no traceback); without
    ``--links eth`` the option is refused before anything is built."""
    from wirereduce.cli import main

    s = sched.build("ring:4", "biring")
    v, q = s.topology.links[0][1]
    inp = tmp_path / "in.npz"
    np.savez(inp, **{f"node{k}": a for k, a in enumerate(edge_arrays(4, 800, seed=3))})
    args = ["sim", "allreduce", "--topology", "ring:4", "--algorithm", "biring", "--engine", "fast",
            "--compress", "12", "--input", str(inp), "--output", str(tmp_path / "out.npz"),
            "--build-dir", str(BUILD), "--timeout", "12000", "--corrupt", "0", "40", "--corrupt-port", "1"]
    assert main(args + ["--links", "eth"]) == 2
    err = capsys.readouterr().err
    assert "stalled" in err and f"node {v}: " in err and f"link_drop_net{q} 1" in err, err
    assert "--retries N sums the lost chunks again" in err, err   # what to do about it
    assert main(args) == 2
    assert "need --links eth" in capsys.readouterr().err
    assert main(args + ["--links", "eth", "--corrupt-port", "2"]) == 2
    assert "corrupt port must be a cabled port" in capsys.readouterr().err
