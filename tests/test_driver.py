"""Tests of wirereduce.host.driver: chunk planning, STATS parsing, collective ids, the loss report."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wirereduce.host.driver import (
    CollectiveIds,
    chunk_elements,
    gather_ranges,
    loss_report,
    parse_stats,
    plan_chunks,
    scatter_ranges,
)

from wirereduce import codec
from wirereduce.config import NodeConfig
from wirereduce.protocol import HEADER_BYTES, STATS_COUNTERS, Header, Opcode, ProtocolError, max_elements

F32 = np.float32
FIXED = settings(derandomize=True, database=None, max_examples=200, deadline=None)


def _missing_session(rank: int, chunks: int) -> SimpleNamespace:
    """What :func:`loss_report` reads of a host's session: one that received none of ``chunks``."""
    seqs = list(range(chunks))
    return SimpleNamespace(rank=rank, done=False, results_received=0, chunks=[None] * chunks, reported_lost=[],
                           never_arrived=seqs, missing=seqs)


def _stats_frame(values: dict[str, int], **hdr) -> bytes:
    """A STATS frame as a node sends it: header, then STATS_COUNTERS as little-endian u32."""
    h = Header(opcode=Opcode.STATS, count=len(STATS_COUNTERS), **hdr)
    return h.pack() + struct.pack(f"<{len(STATS_COUNTERS)}I", *(values.get(k, 0) for k in STATS_COUNTERS))


def test_plan_chunks_exact_tiling():
    assert plan_chunks(12, 4) == [(0, 4), (4, 4), (8, 4)]
    assert plan_chunks(371, 371) == [(0, 371)]


def test_plan_chunks_last_shorter():
    assert plan_chunks(10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert plan_chunks(3, 371) == [(0, 3)]
    assert plan_chunks(1, 1) == [(0, 1)]


@FIXED
@given(st.integers(1, 5000), st.integers(1, 600))
def test_plan_chunks_covers_in_order(n, epf):
    chunks = plan_chunks(n, epf)
    assert len(chunks) == -(-n // epf)
    pos = 0
    for k, (off, cnt) in enumerate(chunks):
        assert off == pos and 1 <= cnt <= epf
        if k < len(chunks) - 1:
            assert cnt == epf
        pos += cnt
    assert pos == n


@pytest.mark.parametrize("n,epf", [(0, 4), (-1, 4), (5, 0), (5, -3)])
def test_plan_chunks_errors(n, epf):
    with pytest.raises(ValueError):
        plan_chunks(n, epf)


def test_parse_stats_round_trip():
    values = {name: (k * 2654435761 + 17) % (1 << 32) for k, name in enumerate(STATS_COUNTERS)}
    got = parse_stats(_stats_frame(values, collective=7, src=2, hop=4, seq=9))
    assert got == values
    assert list(got) == list(STATS_COUNTERS)


def test_parse_stats_errors():
    ok = _stats_frame({})
    with pytest.raises(ProtocolError, match="expected"):
        parse_stats(ok[:-1])
    with pytest.raises(ProtocolError, match="not a STATS"):
        parse_stats(Header(opcode=Opcode.HOST_RESULT).pack() + ok[HEADER_BYTES:])
    with pytest.raises(ProtocolError):
        parse_stats(ok[:HEADER_BYTES - 1])


def test_ranges_gather_and_scatter():
    a = np.arange(10, dtype=F32)
    ranges = [(2, 3), (8, 2)]
    (g,) = gather_ranges([a], ranges)
    assert g.tolist() == [2, 3, 4, 8, 9]
    out = scatter_ranges(np.zeros(10, F32), ranges, g * 10)
    assert out.tolist() == [0, 0, 20, 30, 40, 0, 0, 0, 80, 90]


def test_loss_report_without_counters():
    s = _missing_session(0, 3)
    msg = loss_report([s], {0: None}, "the ring stalled")
    assert "node 0: 0/3 result chunks, missing [0, 1, 2]" in msg
    assert "node 0: did not answer a STATS_REQUEST" in msg and "no node's counters" in msg


def test_loss_report_names_an_engines_network_port():
    """An engine's STATS name its network ports (``link_drop_net{p}``): the report says which port's
    link spoilt frames, ports in numeric order, beside the node's own drop counters."""
    s = _missing_session(0, 3)
    msg = loss_report([s], {0: {"link_drop_net10": 1, "link_drop_net2": 3, "link_drop_net0": 0, "drop_seq": 2}},
                      "the engines stalled")
    assert "node 0: 3 frames spoilt on the link into network port 2" in msg
    assert "node 0: 1 frames spoilt on the link into network port 10" in msg
    assert msg.index("network port 2") < msg.index("network port 10") < msg.index("[drop_seq]")
    assert "network port 0" not in msg


def test_collective_ids_wrap():
    ids = CollectiveIds(0xFFFE)
    assert [ids.take() for _ in range(4)] == [0xFFFE, 0xFFFF, 1, 2]
    ids = CollectiveIds(0)
    assert [ids.take() for _ in range(2)] == [0, 1]
    for bad in (-1, 1 << 16, 1.0, True):
        with pytest.raises(ValueError, match="collective"):
            CollectiveIds(bad)


def test_chunk_elements_from_the_node_config():
    assert chunk_elements(NodeConfig(mtu=1500)) == max_elements(1500) == NodeConfig(mtu=1500).max_elements == 371
    assert chunk_elements(NodeConfig(mtu=9000), 10) == codec.max_elements_compressed(9000)
    with pytest.raises(ValueError, match="k must be"):
        chunk_elements(NodeConfig(), 3)


def test_parse_stats_of_an_engine():
    """A STATS frame whose ``count`` is a schedule engine's layout decodes under the engine's
    names (network ports ``net0`` …), and a short one is refused."""
    from wirereduce.protocol import engine_stats_counters

    names = engine_stats_counters(4)
    values = {name: (k * 40503 + 5) % (1 << 32) for k, name in enumerate(names)}
    data = (Header(opcode=Opcode.STATS, count=len(names)).pack()
            + struct.pack(f"<{len(names)}I", *(values[k] for k in names)))
    got = parse_stats(data)
    assert got == values and list(got) == list(names)
    assert got["link_drop_net3"] == values["link_drop_net3"]
    with pytest.raises(ProtocolError, match="expected"):
        parse_stats(data[:-4])
