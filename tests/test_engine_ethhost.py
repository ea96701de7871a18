"""Schedule engines reached by their hosts over 10G Ethernet, as on the VC709 SFP top
(``boards/vc709_top.py``: the engine with P = 2, its host port on SFP+ cage 0): each host behind a
NIC port and a cable to the engine's host port, an ``EthPort10G`` with ``role="host"`` (store and
forward, PAUSE, the source filter of docs/protocol.md "Source filter"), the network cables 10G
Ethernet too (``ScheduleNetwork(links="eth", host_links="eth")``), on the fast engine.

The host loads the engine's table with SCHEDULE frames *before* the CONTROL that locks the host
port to its address, so the port must take SCHEDULE from any source as it takes CONTROL: without
that no collective starts (each SCHEDULE is dropped as ``host_rx_source_drops`` and its STATS
answer never comes). Results bit for bit against the golden model in table order.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from helpers import edge_arrays, ring_steady_state
from wirereduce.sim.cluster.schednet import ScheduleNetwork
from wirereduce.sim.engines.fastengine import FastEngineSim, golden_check

from wirereduce import schedule as sched
from wirereduce.config import EngineConfig
from wirereduce.protocol import STATS_COUNTERS

pytestmark = pytest.mark.verilator
ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "sim-engine-ethhost"
#: The VC709 SFP top's engine (P = 2, 64 bit, MTU 1500, 8 slots) with the flows a ring of 3 needs.
CFG = EngineConfig(64, 1500, slots=8, ports=2, max_flows=8)
DROPS = tuple(name for name in STATS_COUNTERS if name.startswith("drop_"))


@pytest.fixture(scope="module")
def ring3():
    return FastEngineSim("ring:3", CFG, 4, links="eth", host_links="eth", build_root=BUILD)


def test_host_links_eth_refused_where_they_cannot_run():
    """Before any build: host Ethernet without Ethernet cables, or with a host link that is not 10G."""
    with pytest.raises(ValueError, match="host_links='eth'.*links='eth'"):
        ScheduleNetwork("ring:3", CFG, host_links="eth")
    with pytest.raises(ValueError, match="host_links='eth'"):
        ScheduleNetwork("ring:3", CFG, links="eth", host_links="eth", host_rate=Fraction(4))
    with pytest.raises(ValueError, match="host_links must be"):
        ScheduleNetwork("ring:3", CFG, links="eth", host_links="pcie")


@pytest.mark.parametrize("alg,n", [("ring", 2001), ("biring", 1), ("multitree", 777)])
def test_engine_behind_an_ethernet_host_port_is_bitexact(ring3, alg, n):
    """Every schedule of a ring, loaded over the host's Ethernet link and run: every host's result is
    the golden model's, no frame dropped anywhere, the host ports' counters in STATS (every frame
    the host sent arrived: SCHEDULE, CONTROL, pushes; none dropped by the source filter)."""
    s = sched.build("ring:3", alg)
    arrays = edge_arrays(3, n, seed=n + 11)
    r = ring3.allreduce(arrays, s, final_stats=True)
    assert golden_check(arrays, s, r.results) == [0, 0, 0]
    for k, st in enumerate(r.final_stats):
        assert st["result_frames"] == st["chunks"], k
        assert not {name: st[name] for name in DROPS if st[name]}, (k, st)
        assert st["host_rx_source_drops"] == 0 and st["link_drop_host"] == 0, k
        assert st["host_rx_frames"] >= 2 + st["chunks"], (k, st["host_rx_frames"])   # SCHEDULE, CONTROL, pushes
        assert st["host_rx_fcs_errors"] == 0 and st["host_rx_overflow"] == 0, k


def test_same_bits_with_host_gaps_and_back_pressure(ring3):
    """Gaps in what the hosts send and back-pressure on what they take (PAUSE on the host cable):
    the same bits as without. (Before the simulated NIC sent whole frames only, a host's gaps
    underran its MAC and a SCHEDULE frame was lost on the host cable; the driver then saw a STATS
    answer to another request and stopped: ``DriverError``, never a wrong sum.)"""
    s = sched.build("ring:3", "biring")
    arrays = edge_arrays(3, 3000, seed=2)
    runs = [ring3.allreduce(arrays, s, rx_valid_prob=p, tx_ready_prob=q, seed=7) for p, q in ((1.0, 1.0), (0.6, 0.5))]
    assert golden_check(arrays, s, runs[0].results) == [0, 0, 0]
    assert np.array_equal(np.concatenate(runs[0].results).view(np.uint32),
                          np.concatenate(runs[1].results).view(np.uint32))
    assert runs[1].cycles > runs[0].cycles


def test_no_pause_on_an_unhurried_host_cable(ring3):
    """The NTT ring behind Ethernet host cables whose hosts take every beat: no PAUSE frame either
    way, and in the steady state a chunk costs one 1,500-byte frame's wire time (192.25 cycles, the
    difference of a 16- and a 48-chunk run). Both ends of a host cable are store and forward, so each
    full-size frame fills the receive FIFO to a frame; with the XOFF mark at one frame
    (``pause_budget`` before ``store_and_forward``) every chunk sent an XOFF each way and a chunk
    cost 319.5 cycles (0.60 of the line rate)."""
    cost, runs = ring_steady_state(ring3, 3, seed=5, final_stats=True)
    for r in runs:
        for k, st in enumerate(r.final_stats):
            assert st["host_tx_pause_frames"] == 0 and st["host_rx_pause_frames"] == 0, (k, st)
    assert cost <= 192.25 + 0.5, f"{cost:.2f} cycles a chunk on a 10G host cable (192.25 a frame)"
