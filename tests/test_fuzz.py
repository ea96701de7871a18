"""The fuzz suite (wirereduce.sim.fuzz): a bounded, seeded subset in the test suite; ``make fuzz``
runs the long one (three configurations, 72 cases each)."""

from __future__ import annotations

import pytest
from wirereduce.sim.fuzz.cases import EXPECTED, KINDS, FuzzCase, build_frame, make_cases

from wirereduce.protocol import HEADER_BYTES, Header, Opcode


def test_cases_cover_every_kind_and_are_seeded():
    a, b = make_cases(len(KINDS), 3, seed=5), make_cases(len(KINDS), 3, seed=5)
    assert a == b
    assert {c.kind for c in a} == set(KINDS)
    assert all(c.port == "host" for c in a if c.kind in ("control_mid", "stats_request"))
    assert not any(c.bad for c in a if c.port == "host")
    for bad, needle in (((0, 3), "n must"), ((3, 1), "nodes must"), ((3, 3, 0, ("nope",)), "unknown")):
        with pytest.raises(ValueError, match=needle):
            make_cases(*bad)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("port", ["host", "cw", "ccw"])
def test_each_frame_is_wrong_in_the_way_its_kind_says(kind, port):
    """Each built frame breaks exactly the rule its kind names (so the oracle's expected counter
    is right), for every port."""
    if kind in ("control_mid", "stats_request") and port != "host":
        return
    case = FuzzCase(0, kind, 1, port, 0, seed=1234)
    params = dict(collective=7, chunks=3, count=10, nodes=3, max_elements=371, mtu=1500)
    data = build_frame(case, **params)
    good_op = {"host": Opcode.HOST_PUSH, "cw": Opcode.REDUCE, "ccw": Opcode.BROADCAST}[port]
    if kind == "short":
        assert len(data) < HEADER_BYTES
        return
    h = Header.unpack(data)
    body = len(data) - HEADER_BYTES
    checks = {
        "version": h.version != 1, "opcode": h.opcode != good_op, "collective": h.collective != 7,
        "flags": h.flags not in (0, 2), "dtype": h.dtype != 1, "codec": h.codec != 0,
        "seq_far": h.seq >= 3, "count_zero": h.count == 0, "count_big": h.count > 371,
        "payload_short": body < 4 * h.count, "payload_long": body > 4 * h.count,
        "header_only": body == 0 and h.count > 0, "oversize": len(data) > 1500,
        "lost_forged": h.flags == 2 and h.count == 0, "control_mid": h.opcode == Opcode.CONTROL,
        "stats_request": h.opcode == Opcode.STATS_REQUEST, "garbage": len(data) != HEADER_BYTES + 4 * h.count,
    }
    assert checks[kind], (kind, h, body)
    assert kind in EXPECTED


@pytest.mark.verilator
def test_fuzz_subset_link_models(tmp_path_factory):
    """One case of every kind, seeded, on 3 link-model nodes: no hang, no silent wrong value,
    every frame counted where it must be, and a fresh allreduce after each is bit-exact."""
    from wirereduce.sim.engines.runner import SimSetup
    from wirereduce.sim.fuzz.run import format_table, run_fuzz

    from wirereduce.config import NodeConfig

    setup = SimSetup(nodes=3, config=NodeConfig(64, 1500, slots=4))
    verdicts = run_fuzz(setup, len(KINDS), seed=3, build_root=tmp_path_factory.mktemp("fuzz"))
    table = format_table(verdicts)
    assert all(v.ok for v in verdicts), table
    assert table.splitlines()[-1].startswith(f"FUZZ cases={len(KINDS)} silent_wrong=0 hangs=0")
