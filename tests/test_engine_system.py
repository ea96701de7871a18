"""Schedule-engine networks in the fast engine (Verilator + frame player): every algorithm
bit-exact against the golden model in table order, and the same bits whatever the link latencies
and host back-pressure."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from test_node import edge_arrays
from wirereduce.host.driver import DriverError
from wirereduce.host.engine import EngineSession
from wirereduce.sim.engines.fastengine import FastEngineSim, golden_check

from wirereduce import schedule as sched
from wirereduce.config import EngineConfig
from wirereduce.protocol import Header, Opcode

pytestmark = pytest.mark.verilator

CFG2 = EngineConfig(64, 1500, slots=8, ports=2, max_flows=64)


@pytest.fixture(scope="module")
def ring4():
    """One build: four P = 2 engines in a ring, links at 10G, hosts at 50G (5x)."""
    return FastEngineSim("ring:4", CFG2, 4, link_rate=Fraction(8, 5), host_rate=8, jitter=5, seed=3)


@pytest.mark.parametrize("alg,n", [("ring", 1), ("ring", 3001), ("biring", 7), ("biring", 5000)])
def test_ring4_bitexact(ring4, alg, n):
    s = sched.build("ring:4", alg)
    arrays = edge_arrays(4, n, seed=n)
    r = ring4.allreduce(arrays, s)
    assert golden_check(arrays, s, r.results) == [0, 0, 0, 0]
    assert r.chunks == len(EngineSession(0, s, CFG2, 1, arrays[0], 8).chunks)
    for st in r.stats:
        assert st["chunks"] == r.chunks and st["nodes"] == len(s.flows)


def test_same_bits_any_timing(ring4):
    """Host back-pressure and gaps at three seeds (the links have per-link latency jitter): the
    results are the golden model's, bit for bit, every time."""
    s = sched.build("ring:4", "biring")
    arrays = edge_arrays(4, 2000, seed=11)
    runs = [ring4.allreduce(arrays, s, rx_valid_prob=0.7, tx_ready_prob=0.6, seed=seed) for seed in (1, 2, 3)]
    bits = [np.concatenate(r.results).view(np.uint32) for r in runs]
    assert golden_check(arrays, s, runs[0].results) == [0, 0, 0, 0]
    assert all(np.array_equal(b, bits[0]) for b in bits[1:])
    assert len({r.cycles for r in runs}) > 1  # the timing did change


def test_torus2x2_multitree_bitexact():
    s = sched.build("torus:2x2", "multitree")
    sim = FastEngineSim("torus:2x2", CFG2, 4, link_rate=Fraction(8, 5), host_rate=8)
    for n in (1, 777):
        arrays = edge_arrays(4, n, seed=n + 1)
        assert golden_check(arrays, s, sim.allreduce(arrays, s).results) == [0, 0, 0, 0]


def test_bad_arguments_raise_before_running(ring4):
    s = sched.build("ring:4", "ring")
    with pytest.raises(ValueError, match="window"):
        ring4.allreduce([np.zeros(4, np.float32)] * 4, s, window=9)
    with pytest.raises(ValueError, match="torus"):
        ring4.allreduce([np.zeros(4, np.float32)] * 4, sched.build("torus:2x2", "multitree"))
    with pytest.raises(ValueError, match="ports"):
        FastEngineSim("torus:4x4", CFG2)


def test_session_rejects_foreign_results():
    s = sched.build("ring:4", "biring")
    sess = EngineSession(0, s, CFG2, 9, np.arange(100, dtype=np.float32), 4)
    c = sess.chunks[1]
    good = Header(opcode=Opcode.HOST_RESULT, collective=9, seq=1, hop=c.flow, count=c.count).pack()
    good += bytes(4 * c.count)
    sess.receive(good)
    with pytest.raises(DriverError, match="twice"):
        sess.receive(good)
    with pytest.raises(DriverError, match="unexpected"):
        sess.receive(Header(opcode=Opcode.HOST_RESULT, collective=8, seq=2, hop=2, count=1).pack() + bytes(4))
    with pytest.raises(DriverError, match="does not match"):
        sess.receive(Header(opcode=Opcode.HOST_RESULT, collective=9, seq=2, hop=3, count=c.count).pack()
                     + bytes(4 * c.count))
    assert [p.after for p in sess.push_frames()][:6] == [0, 0, 0, 0, 1, 2]
