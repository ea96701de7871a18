"""Tests of wirereduce.schedule (topologies, ring / biring / MULTITREE schedules, checks, bounds)
and of the schedule golden model wirereduce.sim.golden.schedule.

Expected values come from the published MULTITREE facts (docs/background.md "MULTITREE"), from running the authors'
simulator (farabimahmud/accelerator ``multitree_allreduce.py``, ``compute_trees(5, sort=True)``)
or are worked out by hand below; none is read back from this code's output.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from wirereduce.sim.golden.allreduce import bit_mismatches, ring_allreduce
from wirereduce.sim.golden.schedule import allreduce

from wirereduce.schedule import (
    Schedule,
    ScheduleError,
    build,
    describe,
    frame_efficiency,
    hamiltonian_cycles,
    hypercube,
    lower_bound,
    mesh,
    multitree_trees,
    parse_topology,
    ring,
    ring_order,
    torus,
    validate,
)

F32 = np.float32


def _grads(nodes, n=97, seed=1):
    """Gradients over a wide range of magnitudes, so a different summation order changes bits."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 6, n)).astype(F32) for _ in range(nodes)]


def _add(*xs):
    """Left-to-right float32 sum of the arguments."""
    acc = xs[0].copy()
    for x in xs[1:]:
        acc = np.add(acc, x, dtype=F32)
    return acc


def _same_bits(a, b):
    return np.array_equal(np.asarray(a, F32).view(np.uint32), np.asarray(b, F32).view(np.uint32))


# ------------------------------------------------------------------------------------------------
# topologies
# ------------------------------------------------------------------------------------------------


def test_torus_neighbour_order_is_n_s_w_e_with_wrap_around():
    t = torus(4, 4)
    # node = row * 4 + col; N, S, W, E (kncube.py), wrapping around the edges
    assert t.neighbours(0) == (12, 4, 3, 1)
    assert t.neighbours(5) == (1, 9, 4, 6)
    assert t.neighbours(15) == (11, 3, 14, 12)
    assert t.port_names[0] == ("N", "S", "W", "E")
    assert t.peer(0, 0) == (1, 12)   # 0's N cable arrives on 12's S port
    assert t.nodes == 16 and t.degree == 4 and t.cables == 32
    g = t.graph
    assert g.number_of_nodes() == 16 and g.number_of_edges() == 32
    assert g.nodes[5]["ports"] == [(1, 1), (9, 0), (4, 3), (6, 2)]


def test_small_and_odd_topologies():
    assert torus(2, 2).neighbours(0) == (2, 1)         # size-2 dimensions have no second cable
    assert torus(2, 2).degree == 2
    assert mesh(3, 3).neighbours(0) == (3, 1) and mesh(3, 3).neighbours(4) == (1, 7, 3, 5)
    assert torus(3, 4).neighbours(0) == (8, 4, 3, 1)
    r2 = ring(2)                                        # two cables, cw and ccw, as the NTT ring
    assert r2.links == (((1, 1), (1, 0)), ((0, 1), (0, 0)))
    assert ring(4).neighbours(0) == (3, 1) and ring(4).port_names[0] == ("ccw", "cw")
    assert hypercube(8).links == torus(2, 2, 2).links
    assert hypercube(8).neighbours(0) == (4, 2, 1) and hypercube(8).neighbours(5) == (1, 7, 4)
    assert parse_topology("hypercube:8").name == "hypercube:8"
    assert parse_topology(" Torus : 4x4 ").name == "torus:4x4"
    assert parse_topology("mesh:3x3").links == mesh(3, 3).links
    assert parse_topology("torus:2x2x2").dims == (2, 2, 2)


@pytest.mark.parametrize("spec", [
    "", "ring", "ring:", "ring:1", "ring:x", "ring:-3", "ring:4x4", "ring:256", "torus:4", "torus:4x1",
    "torus:4x4x4x4", "mesh:0x3", "mesh:3xx3", "torus:16x16", "hypercube:6", "hypercube:1", "hypercube:2x2",
    "cube:8", "torus 4x4", 42, None,
])
def test_bad_topology_strings_raise(spec):
    with pytest.raises(ValueError):
        parse_topology(spec)


def test_ring_order_is_the_simulators_snake_on_a_torus():
    # kncube.py build_graph(): ring of a 4x4 torus
    assert [u for u, _ in ring_order("torus:4x4")] == [0, 1, 2, 3, 7, 11, 15, 14, 10, 6, 5, 9, 13, 12, 8, 4]
    with pytest.raises(ValueError):
        ring_order("mesh:3x3")   # both sides odd: no ring through every node


# ------------------------------------------------------------------------------------------------
# MULTITREE: published figures and the authors' simulator
# ------------------------------------------------------------------------------------------------


def test_multitree_4x4_torus_five_steps():
    s = build("torus:4x4", "multitree")
    assert s.levels == 5
    assert s.level_links() == (64, 64, 48, 48, 16)
    # edge added in construction step t: reduce step T-1-t, gather step T+1+t
    assert s.step_links() == (16, 48, 48, 64, 64, 0, 64, 64, 48, 48, 16)
    validate(s)
    # lock-step 5 steps each way against the bound's 3.75 (75 %)
    assert lower_bound(16, 4) * 16 / 2 == pytest.approx(3.75)
    assert float(s.lockstep_time()) == pytest.approx(2 * 5 / 16)
    assert lower_bound(16, 4) / float(s.lockstep_time()) == pytest.approx(0.75)


def test_multitree_4x4_torus_tree_0_as_the_simulator_builds_it():
    # (child, parent, step) of tree 0, in insertion order, from the authors' compute_trees(5, sort=True)
    want = [(12, 0, 0), (4, 0, 0), (3, 0, 0), (1, 0, 0), (8, 12, 1), (15, 12, 1), (13, 12, 1), (7, 3, 1),
            (5, 4, 2), (2, 3, 2), (11, 15, 2), (9, 8, 3), (14, 15, 3), (6, 2, 3), (10, 11, 4)]
    T, trees = multitree_trees("torus:4x4")
    assert T == 5
    assert [(c, p, t) for c, p, _, _, t in trees[0]] == want


def test_multitree_8x8_torus_seventeen_steps():
    s = build("torus:8x8", "multitree")
    assert s.levels == 17
    # per construction step, from the authors' simulator
    assert s.level_links() == (256,) * 14 + (192, 192, 64)
    assert sum(s.level_links()) == 64 * 63
    validate(s)
    assert lower_bound(64, 4) * 64 / 2 == pytest.approx(15.75)


def test_multitree_mesh_quirks_and_their_fixes():
    s = build("mesh:3x3")                                 # published behaviour (simulator)
    assert s.levels == 6 and s.level_links() == (24, 21, 15, 8, 3, 1)
    validate(s)
    assert build("mesh:3x3", full_round=True).levels == 5
    # the fixes change nothing on a torus
    for opts in ({"full_round": True}, {"mesh_distance_fix": True}):
        assert build("torus:4x4", **opts).level_links() == (64, 64, 48, 48, 16)


def test_multitree_2x2_torus_worked_by_hand():
    # Node ports: 0 (S=2, E=1), 1 (S=3, W=0), 2 (N=0, E=3), 3 (N=1, W=2); budget P = 2.
    # Step 0, round 1 (roots 0,1,2,3): each tree takes its root's first port: 0->2, 1->3, 2->0, 3->1.
    # Round 2 (roots 3,2,1,0): second ports, all free with receive budget: 3->2, 2->3, 1->0, 0->1.
    # Round 3: no send budget left; step 1 completes each tree through a member added in step 0.
    T, trees = multitree_trees("torus:2x2")
    assert T == 2
    assert [[(c, p, t) for c, p, _, _, t in tr] for tr in trees] == [
        [(2, 0, 0), (1, 0, 0), (3, 2, 1)],
        [(3, 1, 0), (0, 1, 0), (2, 3, 1)],
        [(0, 2, 0), (3, 2, 0), (1, 0, 1)],
        [(1, 3, 0), (2, 3, 0), (0, 1, 1)],
    ]
    s = build("torus:2x2")
    validate(s)
    # root 0: local first, then children 2 (port 0) and 1 (port 1), both in reduce step 1; 2 holds g2 + g3
    assert s.flows[0].order[0] == (0, 2, 1) and s.flows[0].order[2] == (2, 3)
    e = s.tables[0].entries[0]
    assert e.parent is None and [c.node for c in e.children] == [2, 1] and e.local_index == 0
    assert [(c.node, st) for c, st in zip(e.forward, e.forward_steps)] == [(2, 3), (1, 3)]


def test_golden_2x2_multitree_is_the_hand_worked_order():
    s = build("torus:2x2")
    g = _grads(4, n=401, seed=7)
    sl = s.split(401)
    assert [x.stop - x.start for x in sl] == [101, 100, 100, 100]
    want = [
        _add(g[0], _add(g[2], g[3]), g[1]),
        _add(g[1], _add(g[3], g[2]), g[0]),
        _add(g[2], _add(g[0], g[1]), g[3]),
        _add(g[3], _add(g[1], g[0]), g[2]),
    ]
    got = allreduce(g, s)
    for node in range(4):
        for f in range(4):
            assert _same_bits(got[node][sl[f]], want[f][sl[f]]), (node, f)
    # the test data is order-sensitive: plain rank order gives other bits somewhere
    assert len(bit_mismatches(got[0], ring_allreduce(g))) > 0


# ------------------------------------------------------------------------------------------------
# ring and biring
# ------------------------------------------------------------------------------------------------


def test_ring_schedule_is_the_ntt_ring():
    s = build("ring:4", "ring")
    assert len(s.flows) == 1 and s.flows[0].root == 3
    for k in range(4):
        e = s.tables[k].entries[0]
        if k > 0:   # partial sum from rank k-1 on the ccw port, then the local chunk
            assert e.children == ((0, k - 1),) and e.local_index == 1
        else:
            assert e.children == () and e.local_index == 0
        if k < 3:   # on to rank k+1 clockwise; the result comes back on the same cable
            assert e.parent == (1, k + 1) and e.result_from == (1, k + 1)
        else:
            assert e.parent is None
        assert e.forward == (((0, k - 1),) if k > 0 else ())
    assert all(v == 1 for (u, p), v in s.link_load().items() if (u, p) not in ((3, 1), (0, 0)))


@pytest.mark.parametrize("spec", ["ring:2", "ring:3", "ring:8"])
def test_golden_ring_is_rank_order(spec):
    s = build(spec, "ring")
    n = s.nodes
    g = _grads(n, seed=n)
    want = g[0].copy()
    for k in range(1, n):
        want = np.add(want, g[k], dtype=F32)
    got = allreduce(g, s)
    for node in range(n):
        assert _same_bits(got[node], want)
        assert _same_bits(got[node], ring_allreduce(g))


def test_biring_loads_every_link_equally_and_sums_along_the_ring():
    s = build("ring:4", "biring")
    assert len(s.flows) == 8
    assert set(s.link_load().values()) == {Fraction(3, 4)}           # (N-1)/N: the 2-port bound
    assert float(s.pipelined_time()) == pytest.approx(lower_bound(4, 2))
    g = _grads(4, n=64, seed=3)
    got = allreduce(g, s)
    sl = s.split(64)
    for r in range(4):
        cw = _add(*[g[(r + 1 + k) % 4] for k in range(4)])            # r+1, r+2, …, r
        ccw = _add(*[g[(r - 1 - k) % 4] for k in range(4)])           # r-1, r-2, …, r
        for node in range(4):
            assert _same_bits(got[node][sl[r]], cw[sl[r]])
            assert _same_bits(got[node][sl[4 + r]], ccw[sl[4 + r]])


@pytest.mark.parametrize("spec", ["ring:2", "ring:5", "torus:3x3", "torus:4x4", "torus:3x4", "torus:8x8",
                                  "torus:3x3x3"])
def test_hamiltonian_cycles_split_every_cable_once(spec):
    topo = parse_topology(spec)
    rings = hamiltonian_cycles(topo)
    assert len(rings) == topo.degree // 2
    used = Counter()
    for cyc in rings:
        assert sorted(u for u, _ in cyc) == list(range(topo.nodes))          # every node once
        assert cyc[0][0] == 0
        for k, (u, port) in enumerate(cyc):
            v, far_port = topo.links[u][port]
            assert v == cyc[(k + 1) % len(cyc)][0]                           # the cw port leads to the next rank
            used[(u, port)] += 1
            used[(v, far_port)] += 1
    # every directed cable end exactly once over all rings (ring:2's two cables: one ring uses both)
    assert used == Counter({(u, p): 1 for u in range(topo.nodes) for p in range(len(topo.links[u]))})
    assert hamiltonian_cycles(spec) == rings                                 # deterministic


@pytest.mark.parametrize("spec", ["mesh:3x3", "hypercube:8", "torus:2x4", "torus:2x2x2"])
def test_multiring_refuses_topologies_without_hamiltonian_split(spec):
    with pytest.raises(ValueError, match="Hamiltonian rings"):
        build(spec, "multiring")


def test_multiring_on_a_ring_is_biring_and_bad_roots_raise():
    assert build("ring:4", "multiring").tables == build("ring:4", "biring").tables
    for roots in (0, 3, 5, True, "4"):
        with pytest.raises(ValueError, match="roots must be a divisor"):
            build("torus:4x4", "multiring", roots=roots)


@pytest.mark.parametrize("roots,flows", [(None, 64), (4, 16)])
def test_multiring_4x4_loads_every_link_and_sums_along_each_ring(roots, flows):
    opts = {} if roots is None else {"roots": roots}
    s = build("torus:4x4", "multiring", **opts)
    assert len(s.flows) == flows
    load = s.link_load()
    assert len(load) == 64                                                   # every directed link carries flows
    if roots is None:   # each directed link: 15 of 16 cw chains' reduces + 15 of 16 ccw chains' gathers, of 64
        assert set(load.values()) == {Fraction(30, 64)}
        assert float(s.pipelined_time()) == pytest.approx(lower_bound(16, 4))
    else:               # links into a root's successor miss one chain in four: 7 or 8 flows of 16
        assert set(load.values()) == {Fraction(7, 16), Fraction(8, 16)}
    g = _grads(16, n=5 * flows + 3, seed=7)
    got = allreduce(g, s)
    rings = hamiltonian_cycles("torus:4x4")
    step = 16 // (roots or 16)
    expect = []
    for cyc in rings:   # each flow: the chain that ends at its root, summed in ring order from the far end
        nodes = [u for u, _ in cyc]
        for r in range(0, 16, step):
            expect.append(_add(*[g[nodes[(r + 1 + k) % 16]] for k in range(16)]))
        for r in range(0, 16, step):
            expect.append(_add(*[g[nodes[(r - 1 - k) % 16]] for k in range(16)]))
    for fl, sl, want in zip(s.flows, s.split(g[0].size), expect):
        for node in range(16):
            assert _same_bits(got[node][sl], want[sl]), (fl.index, node)


# ------------------------------------------------------------------------------------------------
# validate()
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec,algorithm", [
    ("ring:2", "ring"), ("ring:3", "ring"), ("ring:4", "ring"), ("ring:8", "ring"),
    ("ring:2", "biring"), ("ring:3", "biring"), ("ring:4", "biring"), ("ring:8", "biring"),
    ("torus:4x4", "biring"), ("torus:4x4", "ring"),
    ("ring:2", "multitree"), ("ring:8", "multitree"), ("torus:2x2", "multitree"), ("torus:4x4", "multitree"),
    ("mesh:3x3", "multitree"), ("hypercube:8", "multitree"), ("torus:3x4", "multitree"),
    ("mesh:2x3", "multitree"),
    ("ring:2", "multitree-balanced"), ("ring:3", "multitree-balanced"), ("ring:8", "multitree-balanced"),
    ("torus:2x2", "multitree-balanced"), ("torus:4x4", "multitree-balanced"), ("mesh:3x3", "multitree-balanced"),
    ("hypercube:8", "multitree-balanced"), ("torus:3x4", "multitree-balanced"), ("mesh:2x3", "multitree-balanced"),
    ("torus:3x3x3", "multitree-balanced"),
    ("ring:3", "multiring"), ("ring:8", "multiring"), ("torus:3x3", "multiring"), ("torus:4x4", "multiring"),
    ("torus:3x4", "multiring"), ("torus:3x3x3", "multiring"),
])
def test_validate_accepts(spec, algorithm):
    s = build(spec, algorithm)
    validate(s)
    assert Schedule.from_dict(json.loads(json.dumps(s.to_dict()))) == s


@pytest.mark.parametrize("spec,published,balanced", [
    # frames per round on the busiest directed link: the published trees' (counted from the trees
    # the authors' construction gives), and ceil(2 N (N-1) / links), the least any set of one
    # tree per root can have, which the balanced trees must reach
    ("torus:4x4", 9, 8), ("hypercube:8", 6, 5), ("mesh:3x3", 8, 6), ("torus:3x3", None, 4),
])
def test_multitree_balanced_shortest_paths_and_busiest_link(spec, published, balanced):
    import math

    import networkx as nx

    s = build(spec, "multitree-balanced")
    topo = s.topology
    g = nx.Graph([(u, v) for u in range(topo.nodes) for v, _ in topo.links[u]])
    assert math.ceil(2 * topo.nodes * (topo.nodes - 1) / len(topo.directed_links())) == balanced

    def busiest(sch):
        frames = {}
        for fl in sch.flows:
            for e in fl.edges:   # partial sum up on the child's port, result down on the parent's
                for lk in ((e.child, e.child_port), (e.parent, e.parent_port)):
                    frames[lk] = frames.get(lk, 0) + 1
        return max(frames.values())

    assert busiest(s) == balanced
    if published is not None:
        assert busiest(build(spec, "multitree")) == published
    for fl in s.flows:
        assert fl.root == fl.index
        depth = {fl.root: 0}
        parent = {e.child: e.parent for e in fl.edges}
        for u in nx.bfs_tree(g, fl.root):
            if u != fl.root:
                depth[u] = depth[parent[u]] + 1
        assert depth == nx.single_source_shortest_path_length(g, fl.root)
    assert build(spec, "multitree-balanced") == s                       # fixed by the seed
    other = build(spec, "multitree-balanced", seed=7)
    validate(other)
    with pytest.raises(ValueError, match="moves"):
        build(spec, "multitree-balanced", moves=-1)


def test_validate_mesh_fixes_and_small_port_budgets():
    validate(build("mesh:3x3", full_round=True, mesh_distance_fix=True))
    for p in (1, 2, 3):
        s = build("torus:4x4", ports=p)
        validate(s)
        assert s.levels >= 5


def _twice(s):
    """The schedule with its only flow doubled: both copies use the same links in the same steps."""
    f = s.flows[0]
    flows = (replace(f, share=Fraction(1, 2)), replace(f, index=1, share=Fraction(1, 2)))
    tables = tuple(replace(t, entries=(t.entries[0], replace(t.entries[0], flow=1))) for t in s.tables)
    return replace(s, flows=flows, tables=tables)


def _drop_child(s):
    t = s.tables[3]
    e = t.entries[0]
    tables = list(s.tables)
    tables[3] = replace(t, entries=(replace(e, children=(), receive_steps=(), local_index=0),))
    return replace(s, tables=tuple(tables))


def _drop_edge(s):
    f = s.flows[0]
    return replace(s, flows=(replace(f, edges=f.edges[1:]),))


def _late_send(s):
    f = s.flows[0]
    e0, e1 = f.edges[0], f.edges[1]   # e1's child sends to e0's child: make it arrive too late
    return replace(s, flows=(replace(f, edges=(e0, replace(e1, reduce_step=e0.reduce_step)) + f.edges[2:]),))


def _wrong_cable(s):
    f = s.flows[0]
    e = f.edges[0]
    return replace(s, flows=(replace(f, edges=(replace(e, child_port=1 - e.child_port),) + f.edges[1:]),))


def _no_deliver(s):
    t = s.tables[1]
    tables = list(s.tables)
    tables[1] = replace(t, entries=(replace(t.entries[0], deliver=False),))
    return replace(s, tables=tuple(tables))


@pytest.mark.parametrize("breaker,message", [
    (_twice, "carries flows"), (_drop_child, "children"), (_drop_edge, "edges"),
    (_late_send, "before its child"), (_wrong_cable, "not cabled"), (_no_deliver, "deliver"),
])
def test_validate_rejects(breaker, message):
    s = build("ring:4", "ring")
    with pytest.raises(ScheduleError, match=message):
        validate(breaker(s))


def test_validate_rejects_port_budget():
    s = build("ring:4", "biring")   # every node sends cw and ccw in each step
    with pytest.raises(ScheduleError, match="port budget"):
        validate(replace(s, ports=1))


# ------------------------------------------------------------------------------------------------
# golden model on the larger schedules, bounds, reports
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec,algorithm", [("torus:4x4", "multitree"), ("hypercube:8", "multitree"),
                                            ("mesh:3x3", "multitree"), ("torus:4x4", "multitree-balanced")])
def test_golden_multitree_same_result_everywhere_and_order_from_tables(spec, algorithm):
    s = build(spec, algorithm)
    g = _grads(s.nodes, n=3 * s.nodes + 5, seed=s.nodes)
    got = allreduce(g, s)
    for node in range(1, s.nodes):
        assert _same_bits(got[node], got[0])
    # an independent evaluation of each flow's Flow.order (node ids; a node's own id = its local chunk)
    for fl, sl in zip(s.flows, s.split(g[0].size)):
        def part(u, fl=fl, sl=sl):
            return _add(*[g[u][sl] if v == u else part(v) for v in fl.order[u]])
        assert _same_bits(got[0][sl], part(fl.root))


def test_golden_rejects_bad_inputs():
    s = build("ring:3", "ring")
    with pytest.raises(ValueError, match="expected 3 arrays"):
        allreduce(_grads(4), s)


def test_lower_bound_and_frame_efficiency():
    assert lower_bound(16, 4) == pytest.approx(30 / 64)                # 0.469 M/B on a 4x4 torus
    assert 1 / lower_bound(16, 4) == pytest.approx(2.133, abs=1e-3)   # 2.13x the NTT ring's M/B
    assert lower_bound(4, 2) == pytest.approx(3 / 4)
    # MTU 9000: 16-byte header, 2246 fp32 = 8984 bytes; on the wire 14 + 9000 + 24 bytes
    assert frame_efficiency(9000) == pytest.approx(8984 / 9038)
    assert lower_bound(16, 4, mtu=9000) == pytest.approx(30 / 64 * 9038 / 8984)
    assert lower_bound(16, 4, 4e6, 1.25e9) == pytest.approx(30 / 64 * 4e6 / 1.25e9)
    # the host link bounds it too: with B_host = B, M/B dominates
    assert lower_bound(16, 4, host_bandwidth=1.0) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        frame_efficiency(10)


def test_describe():
    text = describe("torus:4x4", "multitree", mtu=9000)
    assert "T = 5" in text and "64, 64, 48, 48, 16" in text
    assert "0.4688 M/B" in text and "75.0 %" in text
    assert "MTU 9000" in text
    assert "biring" in describe("ring:4", "biring")
    with pytest.raises(ValueError, match="unknown schedule algorithm"):
        describe("ring:4", "allgather")
    with pytest.raises(ValueError, match="no options"):
        build("ring:4", "ring", ports=2)


def test_schedule_cli(tmp_path, capsys):
    from wirereduce.cli import CliError
    from wirereduce.schedule_cli import add_subcommand

    parser = argparse.ArgumentParser()
    add_subcommand(parser.add_subparsers())
    out = tmp_path / "s.json"
    args = parser.parse_args(["schedule", "--topology", "torus:4x4", "--json", str(out)])
    assert args.func(args) == 0
    assert "T = 5" in capsys.readouterr().out
    d = json.loads(out.read_text())
    assert d["levels"] == 5 and len(d["flows"]) == 16 and len(d["tables"]) == 16
    validate(Schedule.from_dict(d))
    args = parser.parse_args(["schedule", "--topology", "torus:4x4", "--algorithm", "multitree-balanced",
                              "--ports", "2"])
    assert args.func(args) == 0
    assert "port budget 2 per node" in capsys.readouterr().out
    # multiring with 4 roots per ring and direction: 16 flows, the busiest link 8/16 of M where the
    # bound is 2(N-1)/(N d) = 7.5/16 (what docs/architecture.md "Hamiltonian rings" states)
    args = parser.parse_args(["schedule", "--topology", "torus:4x4", "--algorithm", "multiring", "--roots", "4"])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "16 flows" in text and "(roots=4)" in text and "max 0.5000, mean 0.4688" in text, text
    for bad, message in ((["schedule", "--topology", "torus:4"], "torus"),
                         (["schedule", "--algorithm", "ring", "--ports", "2"], "--ports"),
                         (["schedule", "--topology", "mesh:3x3", "--algorithm", "biring"], "mesh"),
                         (["schedule", "--algorithm", "multitree-balanced", "--full-round"], "--full-round"),
                         (["schedule", "--algorithm", "multitree", "--roots", "4"], "multiring option"),
                         (["schedule", "--algorithm", "multiring", "--roots", "5"], "divisor")):
        args = parser.parse_args(bad)
        with pytest.raises(CliError, match=message):
            args.func(args)


def test_plot_trees(tmp_path):
    pytest.importorskip("matplotlib")
    from wirereduce.schedule import plot_trees

    path = tmp_path / "trees.png"
    plot_trees(build("torus:2x2"), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("spec,alg", [("ring:4", "biring"), ("torus:2x2", "multitree"), ("ring:3", "ring")])
@pytest.mark.parametrize("n", [1, 5, 371, 1000, 4099])
@pytest.mark.parametrize("profile", [(371,), (64,), (16, 48, 371), (7, 3), (100, 1, 50)])
def test_chunk_plan_profiles(spec, alg, n, profile):
    """``plan`` with a chunk profile: chunk k of flow f is g = k·F + f, covers the next
    ``profile[k]`` (the last size repeated) elements of the flow's range or what is left of it;
    every element is in exactly one chunk; a one-size profile is the plain size."""
    from wirereduce import schedule as sched
    from wirereduce.table import plan

    s = sched.build(spec, alg)
    F = len(s.flows)
    chunks = plan(n, s, profile)
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    for f, r in enumerate(s.split(n)):
        mine = [c for c in chunks if c.flow == f]
        pos = r.start
        for k, c in enumerate(mine):
            assert c.seq % F == f and c.seq // F == k
            size = profile[min(k, len(profile) - 1)]
            assert c.start == pos and c.count == min(size, r.stop - pos) >= 1
            pos += c.count
        assert pos == r.stop
    if len(profile) == 1:
        assert chunks == plan(n, s, profile[0])
    for bad in ((), (0,), (16, -1), (16, 2.0), (True,)):
        with pytest.raises(ValueError, match="elements_per_frame"):
            plan(n, s, bad)


def test_bench_chunk_profiles_bound_and_plot(tmp_path):
    """bench-schedules with a chunk profile: the sizes are checked (a profile is a tuple), the
    bound counts each planned frame's framing (a profile of one size is that size), and the plot
    labels profiles beside plain sizes."""
    from wirereduce.sim.bench import schedules as sb

    from wirereduce import schedule as sched
    from wirereduce.config import EngineConfig
    from wirereduce.protocol import wire_bytes
    from wirereduce.table import plan

    assert sb.check_chunk_bytes([None, 512, [256, 512, 768]]) == (None, 512, (256, 512, 768))
    for bad in ([6], [[256, 6]], [[]], [[256, 2000]], [(256, True)]):
        with pytest.raises(ValueError, match="chunk profiles"):
            sb.check_chunk_bytes(bad)
    assert sb.profile_label((256, 512)) == "256,512" and sb.profile_label(512) == "512"
    s, cfg = sched.build("ring:4", "biring"), EngineConfig(64, 1500, ports=2)
    prof = (64, 128, 192)
    wire = sum(wire_bytes(16 + 4 * c.count) for c in plan(5000, s, prof))
    assert sb._wire(s, 5000, cfg, prof) == wire > sb._wire(s, 5000, cfg, 192) > sb._wire(s, 5000, cfg)
    assert sb.lower_bound_gbps(s, 5000, cfg, 10, 50, (128,)) == sb.lower_bound_gbps(s, 5000, cfg, 10, 50, 128)
    recs = [{"topology": "ring:4", "algorithm": a, "host_link_gbps": 50.0, "bytes": b, "algbw_gbps": 1.0 + b / 1e6,
             "chunk_bytes": cb, "chunk_profile": pr}
            for a, cb, pr in (("ring", 1484, None), ("biring", 512, None), ("biring", 768, [256, 512, 768]))
            for b in (32768, 131072)]
    sb._plot(tmp_path / "p.png", recs)
    assert (tmp_path / "p.png").stat().st_size > 0


def test_build_names_an_option_the_algorithm_does_not_take():
    """``build`` refuses an option of another algorithm with a ValueError naming it and the ones the
    algorithm takes (a bare TypeError from the builder before), and passes the right ones on."""
    from wirereduce import schedule as sched

    for alg, opts, needle in (("multitree", {"roots": 2}, "takes the options ports, sort, full_round, "
                                                          "mesh_distance_fix, not roots (roots is multiring's)"),
                              ("multitree-balanced", {"roots": 1}, "ports, seed, moves, not roots"),
                              ("multiring", {"seed": 3}, "takes the options roots, not seed"),
                              ("ring", {"roots": 2}, "takes no options, got roots"),
                              ("biring", {"ports": 2}, "takes no options, got ports")):
        with pytest.raises(ValueError, match=re.escape(needle)):
            sched.build("torus:4x4" if alg.startswith("multi") else "ring:4", alg, **opts)
    assert len(sched.build("torus:4x4", "multiring", roots=2).flows) == 8
    assert sched.build("torus:4x4", "multitree", ports=3).steps > sched.build("torus:4x4", "multitree").steps
