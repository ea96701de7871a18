"""Tests of the engine's slot model (``sim/bench/slotmodel.py``, ``wirereduce slot-model``).

The expected slot counts are derived by hand from the schedules' geometry (each test says how), not
read off the model."""

from __future__ import annotations

import json
from itertools import product

import pytest
from wirereduce.sim.bench.slotmodel import (
    PRIORITIES,
    link_frames_per_round,
    run_drift_model,
    run_slot_model,
    slot_model,
)

from wirereduce import schedule as sched


def test_link_frames_per_round_counts_every_edge_twice():
    # every tree edge carries the partial sum up and the result down: 2·(N-1) frames per flow
    for topo, alg in (("ring:4", "biring"), ("torus:4x4", "multitree"), ("hypercube:8", "multitree")):
        s = sched.build(topo, alg)
        load = link_frames_per_round(s)
        assert sum(load.values()) == 2 * (s.nodes - 1) * len(s.flows)
        assert all(p < len(s.topology.links[u]) for u, p in load)


def test_ring_one_chunk_per_slot():
    # The NTT ring is one flow whose chain runs cut-through in one slot: K chunks take K slots; stored and
    # forwarded at every hop the K-th chunk ends 2(N-1) - 1 slots after it starts: K + 2N - 3 slots.
    s = sched.build("ring:4", "ring")
    for k in (1, 5, 12):
        assert slot_model(s, k).slots == k
        assert slot_model(s, k, cut_through=False).slots == k + 2 * 4 - 3


def test_biring_ring4_in_order_is_the_ring_rate():
    # ring:4 biring, per direction: 4 reduce chains and 4 gather chains of 3 links each on 4 links. Cut-through,
    # a chain holds its 3 links in one slot, and any two 3-link paths on a 4-link cycle share a link, so one
    # chain per direction per slot: 8 slots per round of 8 chunks (the ring's one chunk per slot), against the
    # links' bound of 6 (each link carries 3 reduce + 3 gather frames per round).
    s = sched.build("ring:4", "biring")
    k = 16
    r = slot_model(s, k)
    assert r.bound_slots == 6 * k
    assert r.slots == 8 * k
    # Units free to take any ready chunk fill the links: the bound is reached exactly; a lookahead of two
    # (the engine's) is enough here.
    assert slot_model(s, k, in_order=False).slots == 6 * k
    assert slot_model(s, k, in_order=False, lookahead=2).slots == 6 * k


@pytest.mark.parametrize("topo,alg", [("ring:3", "biring"), ("torus:2x2", "multitree"), ("mesh:3x3", "multitree"),
                                      ("hypercube:8", "multitree"), ("torus:4x4", "multitree-balanced")])
def test_never_below_the_bound(topo, alg):
    s = sched.build(topo, alg)
    for in_order, ct, prio in product((True, False), (True, False), PRIORITIES):
        r = slot_model(s, 6, in_order=in_order, cut_through=ct, priority=prio)
        assert r.slots >= r.bound_slots, (in_order, ct, prio, r)
        assert 0 < r.of_bound <= 1


def test_bad_arguments():
    s = sched.build("ring:4", "biring")
    with pytest.raises(ValueError, match="rounds"):
        slot_model(s, 0)
    with pytest.raises(ValueError, match="lookahead"):
        slot_model(s, 2, in_order=False, lookahead=0)
    with pytest.raises(ValueError, match="priority"):
        slot_model(s, 2, priority="fifo")
    with pytest.raises(ValueError, match="window"):
        slot_model(s, 2, window=0)


@pytest.mark.parametrize("topo,alg", [("torus:4x4", "multitree-balanced"), ("ring:8", "biring")])
def test_window(topo, alg):
    """A window no smaller than a node's chunks changes nothing; one chunk per host serialises the
    round trips; every run stays at or above the bound. (A smaller window is not always slower in
    a greedy model: on ring:8 a window of 4 takes longer than a window of 1.)"""
    s = sched.build(topo, alg)
    k = 6
    chunks = k * len(s.flows)
    kw = dict(in_order=False, lookahead=3, priority="broadcast")
    free = slot_model(s, k, **kw)
    slots = [slot_model(s, k, window=w, **kw).slots for w in (chunks, 16, 8, 4, 1)]
    assert slots[0] == free.slots and slots[-1] > free.slots
    assert all(x >= free.bound_slots for x in slots)


def test_run_writes_records(tmp_path, capsys):
    out = tmp_path / "m.json"
    recs = run_slot_model((("ring:4", "biring", 4),), out=str(out))
    assert len(recs) == 12 and json.loads(out.read_text()) == recs
    assert {r["vs_ring"] for r in recs if r["in_order"] and r["cut_through"]} == {1.0}
    assert "biring" in capsys.readouterr().out


@pytest.mark.parametrize("argv,msg", [(["--topologies", "torus:4x4/foo"], "ALGORITHM one of"),
                                      (["--topologies", "torus:9/multitree"], "torus:9"),
                                      (["--rounds", "0"], "--rounds"), (["--window", "0"], "--window"),
                                      (["--drift", "--topologies", "ring:4/biring"], "--drift")])
def test_cli_errors(argv, msg, tmp_path, capsys):
    from wirereduce.cli import main

    assert main(["slot-model", "--out-dir", str(tmp_path), *argv]) == 2
    assert msg in capsys.readouterr().err
    assert not (tmp_path / "slot-model.json").exists()


def test_cli_runs(tmp_path, capsys):
    from wirereduce.cli import main

    assert main(["slot-model", "--topologies", "ring:4/biring", "--rounds", "4", "--out-dir", str(tmp_path)]) == 0
    assert len(json.loads((tmp_path / "slot-model.json").read_text())) == 12


TORUS_KW = dict(in_order=False, lookahead=2, priority="broadcast", window=32)


@pytest.mark.parametrize("topo, alg", [("ring:4", "biring"), ("torus:4x4", "multitree-balanced"),
                                       ("hypercube:8", "multitree")])
def test_ticks_on_the_grid_are_the_slot_model(topo, alg):
    """Frames of ``ticks`` ticks with no hop latency never leave the slot grid: the same slots."""
    s = sched.build(topo, alg)
    for mc in ("all", "each"):
        grid = slot_model(s, 6, multicast=mc, **TORUS_KW)
        assert slot_model(s, 6, ticks=8, latency=0, multicast=mc, **TORUS_KW).slots == grid.slots


def test_one_port_multicast_is_the_same_either_way():
    """On a ring every broadcast goes out on one port: output queues change nothing on the grid."""
    s = sched.build("ring:4", "biring")
    a = slot_model(s, 8, in_order=False, lookahead=2, ticks=16, latency=1, multicast="all")
    b = slot_model(s, 8, in_order=False, lookahead=2, ticks=16, latency=1, multicast="each")
    assert a.slots == b.slots and a.slots >= a.bound_slots


def test_drift_costs_the_all_or_nothing_multicast():
    """Off the grid (a hop latency of 1/16 frame) the 4x4 torus's balanced trees lose over a tenth
    with the engine's all-or-nothing multicast and keep within a few percent with output queues
    (docs/architecture.md "Multicast off the slot grid")."""
    s = sched.build("torus:4x4", "multitree-balanced")
    grid = slot_model(s, 12, **TORUS_KW)
    drift_all = slot_model(s, 12, ticks=16, latency=1, multicast="all", **TORUS_KW)
    drift_each = slot_model(s, 12, ticks=16, latency=1, multicast="each", **TORUS_KW)
    assert drift_all.slots > 1.1 * grid.slots
    assert drift_each.slots < 1.03 * grid.slots
    assert min(drift_all.slots, drift_each.slots) >= grid.bound_slots


def test_drift_arguments():
    s = sched.build("ring:4", "biring")
    for kw, msg in [({"ticks": 0}, "ticks"), ({"ticks": 4, "latency": 5}, "latency"),
                    ({"multicast": "some"}, "multicast")]:
        with pytest.raises(ValueError, match=msg):
            slot_model(s, 2, **kw)


def test_drift_records(tmp_path, capsys):
    out = tmp_path / "d.json"
    recs = run_drift_model((("ring:4", "biring", 16),), rounds=4, ticks=8, latencies=(0, 1), out=str(out))
    assert len(recs) == 4 and json.loads(out.read_text()) == recs
    assert {(r["latency"], r["multicast"]) for r in recs} == {(0, "all"), (0, "each"), (1, "all"), (1, "each")}
