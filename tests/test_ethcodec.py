"""Compression over real Ethernet: codec nodes (``NodeConfig(codec=True)``) behind 10GBASE-R ports
(``links="eth"``), on the fast engine.

Compressed frames get padded on the wire when short; the deframer cuts a 46-byte frame to the
length its tags give (docs/protocol.md, Padding). A compressed frame spoilt on a cable reaches the
cut-through ring port's node marked ``bad``; ``CodecIn`` turns it into a header-only placeholder
(``flags | LOST``, still marked), so no value of it is added, the ring stays in step, every host
misses that one chunk and ``--retries 1`` sums it again.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import shared_tmp
from wirereduce.sim.engines.fastsim import FastSim
from wirereduce.sim.engines.runner import SimSetup
from wirereduce.sim.golden.codec import ring_allreduce_compressed

from wirereduce.codec import max_elements_compressed
from wirereduce.config import NodeConfig

pytestmark = pytest.mark.verilator
K = 10
SETUP = SimSetup(nodes=4, config=NodeConfig(64, 1500, 8, codec=True), links="eth")
EPF = max_elements_compressed(1500)   # 349 elements a compressed frame


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    # Shared by both xdist workers: one model build (FastSim locks it).
    return shared_tmp(tmp_path_factory, "ethcodec")


@pytest.fixture(scope="module")
def sim(root):
    return FastSim(SETUP, root / "fast")  # the CLI's --build-dir root puts its fast builds there


def gradients(seed, n):
    """Gradient-like values: most small (tags 1, 2), some 0, a few ≥ 1 (raw)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for _ in range(4):
        g = (rng.standard_normal(n) * 10.0 ** rng.integers(-4, 0, n)).astype(np.float32)
        g[rng.random(n) < 0.1] = 0
        g[rng.random(n) < 0.02] *= 5000
        arrays.append(g)
    return arrays


def exact(got, want):
    return np.array_equal(np.asarray(got, np.float32).view(np.uint32), want.view(np.uint32))


def test_cli_compressed_eth_allreduce_bitexact(root, monkeypatch, capsys):
    """``wirereduce sim allreduce --links eth --compress 10 --engine fast`` on 4 nodes: every host
    gets the golden compressed ring sum bit for bit; two short chunks (7 and 1 elements) are padded
    on every link and cut back by their tags."""
    from wirereduce.cli import main

    arrays = gradients(1, 2 * EPF + 7)
    arrays = [np.concatenate([a, np.zeros(1, np.float32) + a[0]]) for a in arrays]  # + a 1-element tail
    monkeypatch.chdir(root)
    np.savez("in.npz", **{f"node{k}": a for k, a in enumerate(arrays)})
    code = main(["sim", "allreduce", "--nodes", "4", "--input", "in.npz", "--output", "out.npz", "--links", "eth",
                 "--compress", str(K), "--engine", "fast", "--build-dir", str(root)])
    out = capsys.readouterr()
    assert code == 0, out.err
    want = ring_allreduce_compressed(arrays, K, host_compressed=True)
    got = np.load(root / "out.npz")
    for k in range(4):
        assert exact(got[f"node{k}"], want), f"node {k}"


def test_bit_error_with_compression_loses_one_chunk_then_retried(sim):
    """One bit flipped on the cable rank 1 → rank 2 inside the second compressed REDUCE frame
    (values in [1, 2): every element raw, 190 blocks a frame, block 300). Rank 2 gets it marked
    bad and makes a placeholder of it: no value of it reaches a sum, no ``drop_codec``, the other
    chunks complete, and the run reports the one missing chunk at every host (``ChunksLost``)
    with the link it was spoilt on. With ``retries=1`` the whole result is exact."""
    from wirereduce.host.driver import ChunksLost

    rng = np.random.default_rng(3)
    arrays = [(1 + rng.random(4 * EPF)).astype(np.float32) for _ in range(4)]
    want = ring_allreduce_compressed(arrays, K, host_compressed=True)
    with pytest.raises(ChunksLost) as info:
        sim.allreduce(arrays, compression=K, corrupt=(1, 300), timeout_cycles=20_000, final_stats=True)
    err = info.value
    st = err.stats
    assert all(err.missing[k] == [1] for k in range(4)), err.missing
    assert st[2]["link_drop_cw"] == 1 and st[2]["cw_rx_fcs_errors"] == 1
    assert all(st[k]["drop_codec"] == 0 and st[k]["drop_seq"] == 0 for k in range(4))
    assert "node 2: 1 frames spoilt on the link from rank − 1" in str(err)
    for k in range(4):
        for seq, (off, n) in enumerate(err.chunks):
            if err.received[k][seq]:
                assert exact(err.results[k][off:off + n], want[off:off + n]), f"node {k} chunk {seq}"

    res = sim.allreduce(arrays, compression=K, corrupt=(1, 300), timeout_cycles=20_000, retries=1)
    assert res.retried == 1
    for k in range(4):
        assert exact(res.results[k], want), f"node {k}"
