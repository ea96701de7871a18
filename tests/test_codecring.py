"""The compressed ring: codec nodes (``NodeConfig(codec=True)``) on the fast engine, bit for bit.

Hosts push INCEPTIONN-compressed chunks (``allreduce(..., compression=k)``), every node
decompresses what arrives, adds its local values in fp32 and recompresses what leaves, and the
hosts decode the compressed results. Every result must equal
:func:`wirereduce.sim.golden.codec.ring_allreduce_compressed` with ``host_compressed=True`` bit for bit
(NaN payloads included), whatever the back-pressure. Three nodes, so rank 0 (first), rank 1 (a
middle rank that decompresses, adds and recompresses) and rank 2 (last, starts the broadcast) all
run.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from conftest import shared_tmp
from test_codec_hdl import gradients
from wirereduce.sim.engines.fastsim import FastSim
from wirereduce.sim.engines.runner import SimSetup
from wirereduce.sim.golden import codec as G
from wirereduce.sim.golden.allreduce import bit_mismatches, ring_allreduce

from wirereduce import codec
from wirereduce.config import NodeConfig

SETUP = SimSetup(nodes=3, config=NodeConfig(64, 1500, 4, codec=True))


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    # One build for both xdist workers: the session's shared temporary root (FastSim locks the build).
    return FastSim(SETUP, shared_tmp(tmp_path_factory, "codecring"))


def check(results, want):
    for k, r in enumerate(results):
        bad = bit_mismatches(r, want)
        assert bad.size == 0, f"node {k}: {bad.size} of {want.size} elements differ, first at {bad[:5]}"


@pytest.mark.verilator
@pytest.mark.parametrize("k,rx,tx", [(8, 1.0, 1.0), (12, 0.6, 0.4)])
def test_real_gradients(ring, k, rx, tx):
    """Real CNN gradients of consecutive training steps, 30 chunks (7.5 times the buffer)."""
    pytest.importorskip("torch")
    from wirereduce.sim.workloads.gradients import gradient_stream

    n = 30 * codec.max_elements_compressed(1500) - 17
    arrays = gradient_stream(3, n, seed=k)
    res = ring.allreduce(arrays, compression=k, rx_valid_prob=rx, tx_ready_prob=tx, seed=k)
    check(res.results, G.ring_allreduce_compressed(arrays, k, host_compressed=True))
    assert res.frames == 30


@pytest.mark.verilator
@pytest.mark.parametrize("k", [4, 13, 24])
def test_edge_values(ring, k):
    """Every tag, the tag boundaries, ±0, subnormals, ±Inf, NaN payloads and values ≥ 1."""
    rng = np.random.default_rng(k)
    arrays = [gradients(rng, 1000, k) for _ in range(3)]
    res = ring.allreduce(arrays, compression=k, rx_valid_prob=0.8, tx_ready_prob=0.7, seed=k)
    check(res.results, G.ring_allreduce_compressed(arrays, k, host_compressed=True))


@pytest.mark.verilator
def test_bound_travels_per_collective(ring):
    """One collective uncompressed, the next with k = 6, the next with k = 20: the codec nodes
    take each frame's k from its header, and an uncompressed collective passes them untouched."""
    rng = np.random.default_rng(5)
    arrays = [(rng.standard_normal(900) * 1e-2).astype(np.float32) for _ in range(3)]
    check(ring.allreduce(arrays, collective=11).results, ring_allreduce(arrays))
    for coll, k in ((12, 6), (13, 20)):
        res = ring.allreduce(arrays, compression=k, collective=coll)
        check(res.results, G.ring_allreduce_compressed(arrays, k, host_compressed=True))
    assert all(st["drop_codec"] == 0 for st in res.stats)


@pytest.mark.parametrize("kw,match", [
    ({"compression": 3}, "k must be"),
    ({"compression": 8, "setup": SimSetup(nodes=3)}, "codec=True"),
])
def test_bad_compression_raises_before_running(tmp_path, kw, match):
    setup = kw.pop("setup", None)
    sim = FastSim.__new__(FastSim)  # no build: the checks come first
    sim.setup = setup or SETUP
    with pytest.raises(ValueError, match=match):
        sim.allreduce([np.zeros(4, np.float32)] * 3, **kw)


def test_setup_link_rate():
    """A 512-bit core at 156.25 MHz behind 10G links: 8 bytes a cycle; bad values raise."""
    s = SimSetup(nodes=4, config=NodeConfig(512, 9000, codec=True), link_gbps=10.0, clock_mhz=156.25)
    assert s.link_rate == Fraction(8) and s.clock == 156.25 and "codec" in s.tag()
    assert SimSetup(nodes=4).link_rate is None and SimSetup(nodes=4).clock == 156.25
    with pytest.raises(ValueError, match="bytes a cycle"):
        SimSetup(nodes=4, config=NodeConfig(64), link_gbps=100.0)
    with pytest.raises(ValueError, match="link models"):
        SimSetup(nodes=4, config=NodeConfig(64), links="eth", link_gbps=10.0)
    assert "_eth_codec" in SimSetup(nodes=4, config=NodeConfig(64, codec=True), links="eth").tag()  # allowed now
    with pytest.raises(ValueError, match="clock_mhz"):
        SimSetup(nodes=4, clock_mhz=0)
