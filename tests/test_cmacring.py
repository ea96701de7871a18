"""A ring of 512-bit nodes cabled with the 100G CMAC glue (hdl/xilinx/cmac.py).

``SimSetup(links="cmac")``: every ring link is CmacTxGlue → CmacCable → CmacRxGlue(cut_through=True),
:class:`~wirereduce.sim.cluster.network.CmacCable` standing in for the two CMACs' AXI4-Stream user
sides (the hard IP cannot be simulated): frames pass with latency at 100 Gbit/s, and a flipped bit
makes the receiving side raise ``tuser`` on the frame's last beat, as the CMAC does on a bad FCS.
The fast engine (Verilator + the C++ frame player) runs the allreduce; results are compared bit for
bit (``view(np.uint32)``) with the golden model.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_ethring import check_bitexact
from test_node import edge_arrays
from wirereduce.sim.engines.fastsim import FastSim
from wirereduce.sim.engines.runner import SimSetup
from wirereduce.sim.golden.allreduce import ring_allreduce

from wirereduce.config import NodeConfig
from wirereduce.protocol import max_elements

SETUP = SimSetup(nodes=3, config=NodeConfig(512, 1500, 8), links="cmac")
# 6 chunks, the last one short (5 elements: its frames are padded to 60 bytes by the glue and the
# padding is carried to the node, which reads `count` elements).
N = 5 * max_elements(1500) + 5
#: Beats a full REDUCE frame takes on the cable: 14 + 16 + 4·max_elements bytes in 64-byte beats.
FRAME_BEATS = -(-(14 + 16 + 4 * max_elements(1500)) // 64)


@pytest.fixture(scope="module")
def cmac_sim(tmp_path_factory):
    return FastSim(SETUP, tmp_path_factory.mktemp("cmacring"))


def test_setup_checks_cmac_links_before_any_build():
    with pytest.raises(ValueError, match="512-bit"):
        SimSetup(config=NodeConfig(width=64), links="cmac")
    assert SimSetup(config=NodeConfig(width=512), links="cmac").tag() != SimSetup(config=NodeConfig(width=512)).tag()


@pytest.mark.verilator
def test_cmac_ring_is_bitexact(cmac_sim):
    arrays = edge_arrays(3, N, seed=21)
    res = cmac_sim.allreduce(arrays, timeout_cycles=20_000)
    check_bitexact(arrays, res.results)
    assert res.retried == 0


@pytest.mark.verilator
def test_bit_error_on_a_100g_cable_loses_one_chunk_and_is_reported(cmac_sim):
    """One bit flipped on the cable rank 1 → rank 2 inside its third REDUCE frame. The CMAC
    model raises ``tuser`` on that frame's last beat; rank 2's cut-through glue passes it on marked
    ``bad`` (counted in ``cw_rx_fcs_errors``, so ``link_drop_cw`` of rank 2 is 1), rank 2 adds its
    chunk and sends the sum on with ``tuser`` set (stomped, ``tx_stomped``), and every later hop
    sees a stomped frame (``rx_stomped``, not a link error); each host's side drops it whole. No
    host receives that chunk; the run ends in RingStalled naming it; every chunk that arrived is
    the golden sum, bit for bit; with ``retries=1`` the whole result is exact."""
    from wirereduce.host.driver import ChunksLost
    from wirereduce.sim.engines.fastsim import RingStalled

    arrays = edge_arrays(3, N, seed=22)
    beat = 2 * FRAME_BEATS + FRAME_BEATS // 2 + 1
    with pytest.raises(RingStalled) as info:
        cmac_sim.allreduce(arrays, corrupt=(1, beat), timeout_cycles=20_000)
    err = info.value
    assert isinstance(err, ChunksLost)
    st = err.stats
    assert all(st[k] is not None for k in range(3)), "every node answers its STATS_REQUEST after the stall"
    drops = {(k, name): st[k][name] for k in range(3) for name in ("link_drop_host", "link_drop_cw", "link_drop_ccw")}
    assert drops.pop((2, "link_drop_cw")) == 1
    assert set(drops.values()) == {0}
    assert "node 2: 1 frames spoilt on the link from rank − 1" in str(err)
    assert st[2]["cw_rx_fcs_errors"] == 1
    assert sum(st[k][f"{p}_rx_fcs_errors"] for k in range(3) for p in ("cw", "ccw")) == 1
    # Rank 2 sends the spoilt sum on marked: every stomped frame a ring port sends arrives stomped.
    tx_stomped = sum(st[k][f"{p}_tx_stomped"] for k in range(3) for p in ("cw", "ccw"))
    rx_stomped = sum(st[k][f"{p}_rx_stomped"] for k in range(3) for p in ("cw", "ccw"))
    assert tx_stomped >= 1 and rx_stomped == tx_stomped
    lost = err.missing[0]
    assert len(lost) == 1 and 1 <= lost[0] < 6
    assert all(err.missing[k] == lost for k in range(3))
    want_f = ring_allreduce(arrays)
    want = want_f.view(np.uint32)
    for k in range(3):
        for seq, (off, n) in enumerate(err.chunks):
            if err.received[k][seq]:
                got = err.results[k][off:off + n].view(np.uint32)
                bad = (got != want[off:off + n]) & ~np.isnan(want_f[off:off + n])
                assert not bad.any(), f"node {k} chunk {seq} differs"

    res = cmac_sim.allreduce(arrays, corrupt=(1, beat), timeout_cycles=20_000, retries=1)
    assert res.retried == 1 and res.stats[2]["link_drop_cw"] == 1
    check_bitexact(arrays, res.results)
