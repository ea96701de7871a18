"""Collective state is guarded (issue 14): a CONTROL frame for a new collective while one is running
is refused unless it carries ``Flag.ABORT``, a CONTROL with an invalid field is refused, and every
refused CONTROL is counted (``control_refused``) and still answered with a STATS frame that shows the
unchanged configuration and echoes the request tag. Block tests of one node in amaranth.sim."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth_harness import simulate, stream_recv, stream_send
from wirereduce.hdl.core.node import Node
from wirereduce.host.driver import parse_stats

from wirereduce.codec import K_MAX, K_MIN
from wirereduce.config import NodeConfig
from wirereduce.protocol import Codec, Flag, Header, Opcode, frame

W = 64


def _control(collective, rank, nodes, chunks, tag, **fields) -> bytes:
    return Header(opcode=Opcode.CONTROL, collective=collective, src=rank, hop=nodes, seq=chunks, count=tag,
                  **fields).pack()


async def _ask(ctx, dut, request: bytes) -> dict:
    """Send ``request`` (CONTROL or STATS_REQUEST) to the host port; the STATS answer's counters."""
    await stream_send(ctx, dut.host_rx, request, W)
    return parse_stats(await stream_recv(ctx, dut.host_tx, W))


def _config(st: dict) -> tuple:
    return st["collective"], st["rank"], st["nodes"], st["chunks"]


def test_control_refused_while_running_until_the_node_finished():
    """Rank 1 of 3 (a middle rank: its results are the BROADCAST frames it takes in). While its
    one-chunk collective runs (before and after its local chunk is reduced), a CONTROL without
    ABORT is refused, counted and answered with the unchanged configuration and the refused
    request's tag; once the broadcast of the last chunk has gone to the host, the same CONTROL
    is taken; a CONTROL with ABORT is taken while a collective runs."""
    dut = Node(NodeConfig(W, 1500, slots=2))
    local = np.array([1.0, -2.5, 1e-45], dtype=np.float32)
    incoming = np.array([3.0, 0.5, 2.0], dtype=np.float32)
    seen = {}

    async def tb(ctx):
        ctx.set(dut.cw_out.ready, 1)   # what leaves on the ring falls on the floor
        ctx.set(dut.ccw_out.ready, 1)
        seen["first"] = await _ask(ctx, dut, _control(9, 1, 3, 1, tag=0x1111))
        seen["refused_idle"] = await _ask(ctx, dut, _control(10, 2, 4, 5, tag=0x2222))
        await stream_send(ctx, dut.host_rx, frame(Header(opcode=Opcode.HOST_PUSH, collective=9, seq=0, count=3),
                                                  local), W)
        await stream_send(ctx, dut.cw_in, frame(Header(opcode=Opcode.REDUCE, collective=9, seq=0, count=3, hop=1),
                                                incoming), W)
        seen["refused_reduced"] = await _ask(ctx, dut, _control(10, 2, 4, 5, tag=0x3333))
        total = (local + incoming).astype(np.float32)
        await stream_send(ctx, dut.ccw_in, frame(Header(opcode=Opcode.BROADCAST, collective=9, seq=0, count=3,
                                                        src=2, hop=3), total), W)
        seen["result"] = await stream_recv(ctx, dut.host_tx, W)
        seen["taken"] = await _ask(ctx, dut, _control(10, 2, 4, 5, tag=0x4444))
        seen["refused_new"] = await _ask(ctx, dut, _control(11, 0, 2, 1, tag=0x5555))
        seen["aborted"] = await _ask(ctx, dut, _control(12, 0, 2, 1, tag=0x6666, flags=Flag.ABORT))
        seen["stats"] = await _ask(ctx, dut, Header(opcode=Opcode.STATS_REQUEST, count=0x7777).pack())

    simulate(dut, [tb])
    assert _config(seen["first"]) == (9, 1, 3, 1) and seen["first"]["control_refused"] == 0
    assert seen["first"]["request_tag"] == 0x1111
    for name, tag, refused in (("refused_idle", 0x2222, 1), ("refused_reduced", 0x3333, 2)):
        st = seen[name]
        assert _config(st) == (9, 1, 3, 1), (name, st)      # unchanged
        assert st["request_tag"] == tag and st["control_refused"] == refused, (name, st)
    hdr = Header.unpack(seen["result"])
    assert (hdr.opcode, hdr.collective, hdr.seq) == (Opcode.HOST_RESULT, 9, 0)
    assert _config(seen["taken"]) == (10, 2, 4, 5) and seen["taken"]["control_refused"] == 2
    assert seen["taken"]["request_tag"] == 0x4444
    assert _config(seen["refused_new"]) == (10, 2, 4, 5) and seen["refused_new"]["control_refused"] == 3
    assert seen["refused_new"]["request_tag"] == 0x5555
    assert _config(seen["aborted"]) == (12, 0, 2, 1) and seen["aborted"]["control_refused"] == 3
    assert seen["stats"]["request_tag"] == 0x7777 and seen["stats"]["control_refused"] == 3


#: (what is wrong, CONTROL fields, refused by a node without the codec, refused by a codec node).
#: A node that runs no collective yet: only the fields decide.
CONTROL_CASES = [
    ("valid, uncompressed", {}, False, False),
    ("valid, with ABORT", {"flags": Flag.ABORT}, False, False),
    ("flag LOST", {"flags": Flag.LOST}, True, True),
    ("flag 0x80", {"flags": 0x80}, True, True),
    ("dtype 0", {"dtype": 0}, True, True),
    ("dtype 2", {"dtype": 2}, True, True),
    ("codec 2", {"codec": 2, "eb_k": 10}, True, True),
    ("codec 1, k = 10", {"codec": Codec.INCEPTIONN_V1, "eb_k": 10}, True, False),
    ("codec 1, k = K_MIN", {"codec": Codec.INCEPTIONN_V1, "eb_k": K_MIN}, True, False),
    ("codec 1, k = K_MAX", {"codec": Codec.INCEPTIONN_V1, "eb_k": K_MAX}, True, False),
    ("codec 1, k = K_MIN - 1", {"codec": Codec.INCEPTIONN_V1, "eb_k": K_MIN - 1}, True, True),
    ("codec 1, k = K_MAX + 1", {"codec": Codec.INCEPTIONN_V1, "eb_k": K_MAX + 1}, True, True),
    ("codec 0, k = 5", {"eb_k": 5}, True, True),
    ("nodes 0", {"hop": 0, "src": 0}, True, True),
    ("rank = nodes", {"hop": 3, "src": 3}, True, True),
    ("rank > nodes", {"hop": 2, "src": 200}, True, True),
    ("chunks 0", {"seq": 0}, True, True),
]


@pytest.mark.parametrize("codec", [False, True], ids=["plain", "codec"])
def test_invalid_control_fields_are_refused(codec):
    """Each CONTROL of :data:`CONTROL_CASES` goes to a fresh-state node (the valid ones carry ABORT
    after the first, so that only the fields decide): a refused one changes nothing but
    ``control_refused`` and its answer echoes its tag; a valid one is applied."""
    dut = Node(NodeConfig(W, 1500, slots=2, codec=codec))
    answers = []

    async def tb(ctx):
        for k, (_, fields, _, _) in enumerate(CONTROL_CASES):
            h = dict(collective=100 + k, src=1, hop=3, seq=4, count=0x100 + k)
            h.update(fields)
            # After the first, every CONTROL carries ABORT (on top of the case's own flags, so an
            # invalid bit stays invalid): never refused because a collective runs.
            flags = h.pop("flags", 0) | (Flag.ABORT if k else 0)
            answers.append(await _ask(ctx, dut, Header(opcode=Opcode.CONTROL, flags=flags, **h).pack()))

    simulate(dut, [tb])
    refused = 0
    config = (0, 0, 0, 0)
    for k, ((what, fields, plain_refuses, codec_refuses), st) in enumerate(zip(CONTROL_CASES, answers)):
        refuses = codec_refuses if codec else plain_refuses
        refused += refuses
        if not refuses:
            h = {"src": 1, "hop": 3, "seq": 4, **fields}
            config = (100 + k, h["src"], h["hop"], h["seq"])
        assert st["request_tag"] == 0x100 + k, what
        assert st["control_refused"] == refused, (what, st["control_refused"], refused)
        assert _config(st) == config, (what, _config(st), config)


# --- --timeout: validated before anything is built or simulated -----------------------------------


@pytest.mark.parametrize("command", ["sim", "demo"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_timeout_flag_refused_before_any_simulation(tmp_path, monkeypatch, capsys, command, value):
    from wirereduce.cli import main

    monkeypatch.chdir(tmp_path)
    np.savez(tmp_path / "in.npz", node0=np.ones(4, np.float32), node1=np.ones(4, np.float32))
    if command == "sim":
        argv = ["sim", "allreduce", "--nodes", "2", "--input", str(tmp_path / "in.npz"),
                "--output", str(tmp_path / "out.npz")]
    else:
        argv = ["demo", "--nodes", "2"]
    code = main([*argv, "--build-dir", str(tmp_path / "b"), "--timeout", value])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("wirereduce: error: --timeout:") and "≥ 1 cycles" in err, err
    assert not (tmp_path / "b").exists() and not (tmp_path / "out.npz").exists() and not (tmp_path / "build").exists()


def test_timeout_flag_in_help():
    from wirereduce.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices
    for parser in (sub["sim"]._subparsers._group_actions[0].choices["allreduce"], sub["demo"]):
        text = parser.format_help()
        text = " ".join(text.split())
        assert "--timeout CYCLES" in text and "cycles of the node clock" in text


def test_run_jobs_refuses_a_bad_timeout_before_building(tmp_path):
    from wirereduce.sim.engines.fastsim import run_allreduce
    from wirereduce.sim.engines.runner import SimSetup, run_jobs

    arrays = [np.ones(4, np.float32)] * 2
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="timeout"):
            run_jobs(SimSetup(nodes=2), [{"op": "allreduce", "arrays": arrays}], build_root=tmp_path / "b",
                     timeout_cycles=bad)
        with pytest.raises(ValueError, match="timeout"):
            run_allreduce(SimSetup(nodes=2), arrays, build_root=tmp_path / "f", timeout_cycles=bad)
    assert not (tmp_path / "b").exists() and not (tmp_path / "f").exists()


# --- the guard on a simulated ring (cocotb + Verilator, through the host driver) ------------------


@pytest.mark.cocotb
def test_guard_on_a_simulated_ring(tmp_path):
    """tests/cocotb/tb_guard.py: an intruding CONTROL mid-collective is refused and counted and the
    collective completes bit-exact; a collective left running refuses the next allreduce (the
    driver's ControlRefused says to pass abort=True); with abort=True it runs bit-exact."""
    from wirereduce.sim.engines.runner import available_simulators

    if "verilator" not in available_simulators():
        pytest.skip("verilator is not installed")
    from tb_guard import build, run_case

    failures, log = run_case(build(tmp_path / "guard"), "guard")
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.exists() else "(no log)"
    assert failures == 0, f"cocotb test guard failed; log {log}:\n{tail}"
