"""The fuzz suite (wirereduce.sim.fuzz): a bounded, seeded subset in the test suite; ``make fuzz``
runs the long one (three configurations, 72 cases each)."""

from __future__ import annotations

import pytest
from wirereduce.sim.fuzz.cases import EXPECTED, KINDS, FuzzCase, build_frame, make_cases

from wirereduce.protocol import HEADER_BYTES, Header, Opcode

PORTS3 = [("host", "net0", "net1")] * 3   # engine_ports of ring:3


def test_cases_cover_every_kind_and_are_seeded():
    a, b = make_cases(len(KINDS), 3, seed=5, ports=PORTS3), make_cases(len(KINDS), 3, seed=5, ports=PORTS3)
    assert a == b
    assert {c.kind for c in a} == set(KINDS)
    assert all(c.port == "host" for c in a if c.kind in ("control_mid", "abort_mid", "stats_request"))
    assert all(c.port in PORTS3[c.node] for c in a)
    assert not any(c.bad for c in a if c.port == "host")
    for bad, needle in (((0, 3), "n must"), ((3, 1), "nodes must"), ((3, 3, 0, ("nope",)), "unknown")):
        with pytest.raises(ValueError, match=needle):
            make_cases(*bad, ports=PORTS3)
    with pytest.raises(ValueError, match="host"):
        make_cases(3, 3, ports=[("net0",)] * 3)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("port", ["host", "net0", "net1"])
def test_each_frame_is_wrong_in_the_way_its_kind_says(kind, port):
    """Each built frame breaks exactly the rule its kind names (so the oracle's expected counter
    is right), on every port of a ring:3 biring engine (six flows, 18 chunks, the last short)."""
    from wirereduce.sim.fuzz.cases import engine_routes

    from wirereduce import schedule as sched

    if kind in ("control_mid", "abort_mid", "stats_request") and port != "host":
        return
    s = sched.build("ring:3", "biring")
    routes = engine_routes(s, 1, int(port[3:])) if port != "host" else None
    counts = [371] * 17 + [100]
    case = FuzzCase(0, kind, 1, port, 0, seed=1234)
    data = build_frame(case, collective=7, chunks=18, nodes=3, max_elements=371, mtu=1500, flows=6, counts=counts,
                       routes=routes)
    good_ops = {int(Opcode.HOST_PUSH)} if port == "host" else {op for op, _ in routes}
    if kind == "short":
        assert len(data) < HEADER_BYTES
        return
    h = Header.unpack(data)
    body = len(data) - HEADER_BYTES
    checks = {
        "version": h.version != 1, "opcode": h.opcode not in good_ops, "collective": h.collective != 7,
        "flags": h.flags not in (0, 2), "dtype": h.dtype != 1, "codec": h.codec != 0,
        "seq_far": h.seq >= 18, "count_zero": h.count == 0, "count_big": h.count > 371,
        "payload_short": body < 4 * h.count, "payload_long": body > 4 * h.count,
        "header_only": body == 0 and h.count > 0, "oversize": len(data) > 1500,
        "lost_forged": h.flags == 2 and h.count == 0, "control_mid": h.opcode == Opcode.CONTROL,
        "abort_mid": h.opcode == Opcode.CONTROL and h.flags == 1 and h.src == 1 and h.hop == 6 and h.seq == 18,
        "stats_request": h.opcode == Opcode.STATS_REQUEST, "garbage": len(data) != HEADER_BYTES + 4 * h.count,
    }
    assert checks[kind], (kind, h, body)
    assert kind in EXPECTED


def test_build_frame_refuses_what_it_cannot_route():
    case = FuzzCase(0, "version", 1, "net0", 0, seed=1)
    with pytest.raises(ValueError, match="routes"):
        build_frame(case, collective=7, chunks=2, nodes=3, max_elements=371, mtu=1500, flows=6, counts=[371, 9])
    with pytest.raises(ValueError, match="counts"):
        build_frame(case, collective=7, chunks=3, nodes=3, max_elements=371, mtu=1500, flows=6, counts=[371, 9],
                    routes=[])


@pytest.mark.parametrize("kind", KINDS)
def test_engine_frames_are_routed_and_wrong_in_one_way(kind):
    """On schedule engines (ring:3 biring, six flows) a network frame carries a (opcode, flow) its
    port takes (:func:`engine_routes`, from the node's table), ``seq`` a chunk of that flow and
    ``hop`` the flow, and an ``opcode`` kind never REDUCE or BROADCAST (either may be valid there):
    so the one thing wrong with it is the kind's, not a misrouting the gate would count first."""
    from wirereduce.sim.fuzz.cases import engine_ports, engine_routes

    from wirereduce import schedule as sched
    from wirereduce.protocol import Opcode as Op

    s = sched.build("ring:3", "biring")
    flows = len(s.flows)
    assert engine_ports(s.topology) == [("host", "net0", "net1")] * 3
    for node in range(3):
        for port in range(2):
            routes = engine_routes(s, node, port)
            assert routes, (node, port)   # biring: every port carries REDUCE and BROADCAST frames
            for op, f in routes:
                t = s.tables[node].entries[f]
                if op == Op.REDUCE:
                    assert any(c is not None and c.port == port for c in t.terms()), (node, port, f)
                else:
                    assert t.parent is not None and t.parent.port == port, (node, port, f)
    counts = [371] * 17 + [100]
    for port in ("net0", "net1", "host"):
        if kind in ("control_mid", "abort_mid", "stats_request") and port != "host":
            continue
        case = FuzzCase(0, kind, 1, port, 0, seed=99)
        routes = engine_routes(s, 1, int(port[3:])) if port != "host" else None
        data = build_frame(case, collective=7, chunks=18, nodes=3, max_elements=371, mtu=1500,
                           flows=flows, counts=counts, routes=routes)
        if kind == "short":
            assert len(data) < HEADER_BYTES
            continue
        h = Header.unpack(data)
        if kind in ("control_mid", "abort_mid", "stats_request", "garbage", "opcode", "seq_far"):
            if kind == "opcode":
                assert h.opcode not in (Op.REDUCE, Op.BROADCAST, Op.CONTROL, Op.STATS_REQUEST)
            if kind in ("control_mid", "abort_mid"):
                assert h.hop == flows and h.seq == 18 and h.flags == (kind == "abort_mid")
            continue
        assert h.hop == h.seq % flows, (kind, port, h)
        if port != "host":
            assert (h.opcode, h.hop) in routes, (kind, port, h)
        if kind not in ("count_zero", "count_big", "lost_forged"):
            assert h.count == counts[h.seq], (kind, h)


@pytest.mark.verilator
def test_engine_fuzz_subset(tmp_path_factory):
    """One case of every kind, seeded, on schedule engines (ring:3 biring: six flows, every port
    carrying both REDUCE and BROADCAST frames), every rank an EngineRankDriver: no hang, no silent
    wrong value, every frame counted where it must be, a fresh allreduce after each bit-exact. Its
    ``abort_mid`` and ``control_mid`` cases stopped the whole network before 2026-11-29
    (docs/protocol.md "When the answer comes")."""
    from wirereduce.sim.engines.runner import EngineSetup
    from wirereduce.sim.fuzz.run import format_table, run_fuzz

    from wirereduce.config import EngineConfig

    # fp32 lanes only: the fuzz suite's collectives are fp32 (a frame of another dtype is dropped as
    # drop_dtype either way), and the model builds in less time than with every format's lanes
    setup = EngineSetup(topology="ring:3", config=EngineConfig(64, 1500, slots=4, ports=2, formats=("fp32",)))
    verdicts = run_fuzz(setup, len(KINDS), seed=3, algorithm="biring", build_root=tmp_path_factory.mktemp("fuzz"))
    table = format_table(verdicts)
    assert all(v.ok for v in verdicts), table
    assert table.splitlines()[-1].startswith(f"FUZZ cases={len(KINDS)} silent_wrong=0 hangs=0")


def test_engine_fuzz_refuses_bad_arguments():
    from wirereduce.sim.engines.runner import EngineSetup
    from wirereduce.sim.fuzz.run import run_fuzz

    from wirereduce.config import EngineConfig

    # fp32 lanes only: the fuzz suite's collectives are fp32 (a frame of another dtype is dropped as
    # drop_dtype either way), and the model builds in less time than with every format's lanes
    setup = EngineSetup(topology="ring:3", config=EngineConfig(64, 1500, slots=4, ports=2, formats=("fp32",)))
    for kw, needle in (({}, "needs the schedule"), ({"algorithm": "nope"}, "unknown schedule algorithm"),
                       ({"algorithm": "biring", "compression": 10}, "codec")):
        with pytest.raises(ValueError, match=needle):
            run_fuzz(setup, 2, **kw)
    with pytest.raises(TypeError, match="EngineSetup"):
        run_fuzz(object(), 2, algorithm="ring")
    with pytest.raises(ValueError, match="ports must list"):
        make_cases(3, 3, ports=[("net0",)] * 3)
