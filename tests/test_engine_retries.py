"""Retries on the schedule engine: chunks lost at a round's deadline are summed again, each in its
own flow, and the result is the loss-free run's bit for bit.

The retry planner (:class:`wirereduce.host.engine.EngineAllreduce`, :func:`~wirereduce.host.engine.plan_retry`)
is checked in pure Python first, against the golden model standing in for the engines; then on the
fast engine with a bit flipped on a 10G Ethernet cable. One build serves every simulated test here:
tests/test_engine_eth.py's (ring:4, codec engines, 16 slots), which is also what ``wirereduce sim
allreduce --topology ring:4 --links eth --codec`` builds, the CLI's run included.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers import edge_arrays
from test_engine_eth import BUILD, CFG
from wirereduce.host.driver import ChunksLost, CollectiveIds, lost_chunks
from wirereduce.host.engine import EngineAllreduce, plan_retry
from wirereduce.sim.golden import schedule as golden

from wirereduce import schedule as sched
from wirereduce.formats import from_words, to_words
from wirereduce.protocol import Flag, Header, Opcode
from wirereduce.table import plan

#: The cable the simulated tests spoil: the 40th 66-bit block node 0 sends out of its port 0 falls
#: in its first frame on that cable, which is then dropped at the far end (bad FCS).
CORRUPT = (0, 0, 40)
#: Deadline of every round, cycles from the start of its simulation: a loss-free round of 2,000
#: elements takes about 2,000 (tables, CONTROL and all; simulated time, so no flakiness under load).
#: The default (200,000 more) would make each stall minutes of simulation at -O0 (~1,200 cycles/s).
TIMEOUT = 6_000


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint16)


def _same_bits(got, want) -> bool:
    return all(np.array_equal(_bits(g), _bits(w)) for g, w in zip(got, want))


# -- the planner, pure Python ------------------------------------------------------------------------

def _deliver(job: EngineAllreduce, skip: dict[int, set[int]] | None = None) -> None:
    """Play the engines of ``job``'s current round with the golden model: every host gets the
    HOST_RESULT of every chunk of its round, except the chunks ``skip[rank]`` (lost on the way)."""
    sessions = job.sessions
    want = golden.allreduce([s.array for s in sessions], job.schedule, job.op)
    for s, w in zip(sessions, want):
        words = to_words(w, s.format)
        for c in s.chunks:
            if c.seq in (skip or {}).get(s.rank, ()):
                continue
            hdr = Header(opcode=Opcode.HOST_RESULT, collective=s.collective, seq=c.seq, hop=c.flow, count=c.count,
                         dtype=s.dtype)
            s.receive(hdr.pack() + words[c.start:c.start + c.count].astype("<u4").tobytes())


def _lose(job: EngineAllreduce, skip: dict[int, set[int]]) -> ChunksLost:
    """Play ``job``'s round losing ``skip``; the ChunksLost a driver raises at the deadline."""
    _deliver(job, skip)
    assert not all(s.done for s in job.sessions)
    return ChunksLost("deadline", job.sessions, {})


def _word_flows(n: int, schedule) -> np.ndarray:
    """The flow of every payload word of an n-word message (``Schedule.split``), numbered from 1."""
    out = np.zeros(n, dtype=np.uint32)
    for f, sl in enumerate(schedule.split(n)):
        out[sl] = f + 1
    return out


def _check_flows_kept(job: EngineAllreduce, before, rp) -> None:
    """Every word of the retry round is padding or a lost word of the flow its retry chunk is in;
    each lost chunk of ``before`` (the sessions of the round that lost it) is there whole."""
    chunks = before[0].chunks
    origin = rp.gather(_word_flows(before[0].words.size, job.schedule))   # 0: padding
    place = rp.gather(np.arange(1, before[0].words.size + 1, dtype=np.uint32))   # 1 + the word's index
    for c in job.sessions[0].chunks:   # the retry round's chunks, by the engines' numbering
        assert set(np.unique(origin[c.start:c.start + c.count])) <= {0, c.flow + 1}, c
    for g in rp.chunks:
        c = chunks[g]
        at = np.flatnonzero((place >= c.start + 1) & (place <= c.start + c.count))
        assert at.size == c.count
        assert np.all(_word_flows(rp.words, job.schedule)[at] == c.flow + 1), (g, c.flow)
        for s_old, s_new in zip(before, job.sessions):
            assert np.array_equal(s_new.words[at], s_old.words[c.start:c.start + c.count])


@pytest.mark.parametrize("topology,alg,dtype,n,chunk_words", [
    ("torus:2x2", "multitree", np.float32, 1999, None),
    ("ring:4", "biring", ml_dtypes.bfloat16, 3001, None),   # two elements a word, an odd tail
    ("ring:4", "multitree", np.int32, 700, 64),
])
def test_planner_keeps_each_lost_chunk_in_its_flow(topology, alg, dtype, n, chunk_words):
    """Two rounds of losses (hosts missing different chunks, then a chunk of the retry round):
    every retried chunk is summed in its own flow's share of the retry message, the retried count
    is the union of what the hosts missed, and the results put together are the golden model's
    loss-free allreduce bit for bit. Summing the lost elements in a message of their own, as the
    ring node does, gives other bits for these inputs: the flows' orders differ."""
    s = sched.build(topology, alg)
    arrays = [a.astype(dtype) for a in edge_arrays(s.nodes, n, seed=n)] if dtype != np.int32 else \
        [np.random.default_rng(k).integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32) for k in range(s.nodes)]
    want = golden.allreduce(arrays, s)
    job = EngineAllreduce(s, CFG, arrays, retries=2, chunk_words=chunk_words, ids=CollectiveIds(9))
    c = job.chunks
    first = job.sessions
    assert [x.collective for x in first] == [9] * s.nodes and not first[0].abort
    skip = {0: {1, c - 1}, 2: {1, 2}, 3: {c // 2}}   # lost on different links: each host misses others
    err = _lose(job, skip)
    assert lost_chunks(err) == sorted({1, 2, c // 2, c - 1})
    assert job.retry(err) and job.retried == 4
    rp = plan_retry(first[0].chunks, lost_chunks(err), len(s.flows))
    _check_flows_kept(job, first, rp)
    assert [x.collective for x in job.sessions] == [10] * s.nodes
    assert all(Header.unpack(x.control_frame()).flags == Flag.ABORT for x in job.sessions)
    # The retry round loses its first chunk at host 1: a third round.
    second = job.sessions
    err2 = _lose(job, {1: {0}})
    assert job.retry(err2) and job.retried == 5
    _check_flows_kept(job, second, plan_retry(second[0].chunks, [0], len(s.flows)))
    _deliver(job)
    got = job.results()
    assert all(g.dtype == np.dtype(dtype) and g.shape == (n,) for g in got)
    assert _same_bits(got, want)
    # The ring node's way (the lost words concatenated) sums them in other flows: other bits.
    if dtype == np.float32:
        words = [to_words(a) for a in arrays]
        ranges = [first[0].chunks[g] for g in lost_chunks(err)]
        naive = [np.concatenate([w[r.start:r.start + r.count] for r in ranges]) for w in words]
        sums = golden.allreduce([from_words(w, "fp32") for w in naive], s)
        assert not np.array_equal(_bits(sums[0]), np.concatenate([_bits(want[0])[r.start:r.start + r.count]
                                                                  for r in ranges]))


def test_planner_without_retries_left_and_bad_arguments():
    """``retries`` used up: :meth:`EngineAllreduce.retry` says so; a bad ``retries`` (or nothing
    lost) raises ValueError before anything is sent."""
    s = sched.build("ring:4", "biring")
    arrays = edge_arrays(4, 500, seed=2)
    job = EngineAllreduce(s, CFG, arrays)
    err = _lose(job, {0: {3}})
    assert not job.retry(err) and job.retried == 0
    for bad in (-1, True, 1.0, "1", None):
        with pytest.raises(ValueError, match="retries"):
            EngineAllreduce(s, CFG, arrays, retries=bad)
    with pytest.raises(ValueError, match="nothing to retry"):
        plan_retry(job.sessions[0].chunks, [], len(s.flows))
    with pytest.raises(ValueError, match="outside"):
        plan_retry(job.sessions[0].chunks, [len(job.sessions[0].chunks)], len(s.flows))


def test_retry_plan_layout():
    """One chunk lost in flow 2 of 4: the retry message is four shares of that chunk's length,
    flow 2's holding it and the others zeros; scatter puts its sums back and nothing else."""
    s = sched.build("torus:2x2", "multitree")
    chunks = plan(4000, s, 371)
    g = next(c.seq for c in chunks if c.flow == 2 and c.count == 371)
    rp = plan_retry(chunks, [g], 4)
    assert (rp.chunks, rp.per_flow, rp.share, rp.words) == ((g,), (0, 0, 371, 0), 371, 4 * 371)
    words = np.arange(1, 4001, dtype=np.uint32)
    msg = rp.gather(words)
    c = chunks[g]
    assert np.array_equal(msg[2 * 371:3 * 371], words[c.start:c.start + 371])
    assert not msg[:2 * 371].any() and not msg[3 * 371:].any()
    back = rp.scatter(np.zeros(4000, np.uint32), msg + np.uint32(7))
    assert np.array_equal(back[c.start:c.start + 371], words[c.start:c.start + 371] + 7)
    assert np.count_nonzero(back) == 371


# -- on the fast engine -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def eth_ring4():
    from wirereduce.sim.engines.fastengine import FastEngineSim

    return FastEngineSim("ring:4", CFG, 4, links="eth", build_root=BUILD)


@pytest.mark.verilator
def test_lost_frame_retried_bitexact(eth_ring4):
    """A frame spoilt on a cable with ``retries=1``: the first round stalls (its STATS count the
    drop at the far end of the cable), a second collective sums just the missing chunks, each in
    its own flow, and every host's result is the golden model's loss-free allreduce bit for bit."""
    s = sched.build("ring:4", "multitree")
    arrays = edge_arrays(4, 2000, seed=41)
    r = eth_ring4.allreduce(arrays, s, corrupt=CORRUPT, timeout_cycles=TIMEOUT, retries=1)
    assert r.retried >= 1
    assert _same_bits(r.results, golden.allreduce(arrays, s))
    v, q = s.topology.links[0][0]
    assert r.stats[v][f"link_drop_net{q}"] == 1   # the first round's counters, read after its stall
    assert r.cycles > TIMEOUT and r.chunks == len(plan(2000, s, CFG.max_elements))


@pytest.mark.verilator
def test_lost_frame_without_retries_is_chunks_lost(eth_ring4):
    """The same loss with ``retries=0``: ChunksLost (the fast engine's EngineStalled) naming the
    chunks each host misses, all never arrived (an engine sends no LOST placeholders); every chunk
    that did arrive holds the golden sum."""
    from wirereduce.sim.engines.fastengine import EngineStalled

    s = sched.build("ring:4", "multitree")
    arrays = edge_arrays(4, 2000, seed=41)
    with pytest.raises(ChunksLost, match="first missing chunks per node") as info:
        eth_ring4.allreduce(arrays, s, corrupt=CORRUPT, timeout_cycles=TIMEOUT)
    err = info.value
    assert isinstance(err, EngineStalled)
    lost = lost_chunks(err)
    assert lost and err.never_arrived == err.missing and not any(err.reported_lost.values())
    want = golden.allreduce(arrays, s)
    for rank, res in enumerate(err.results):
        for c in err.chunks:
            if c.seq not in err.missing[rank]:
                sl = slice(c.start, c.start + c.count)
                assert np.array_equal(_bits(res)[sl], _bits(want[rank])[sl]), (rank, c)
    v, q = s.topology.links[0][0]
    assert err.stats[v][f"link_drop_net{q}"] == 1


@pytest.mark.verilator
def test_bad_retries_refused_before_anything_runs(eth_ring4):
    s = sched.build("ring:4", "biring")
    arrays = edge_arrays(4, 10, seed=1)
    for bad in (-1, True, 0.5):
        with pytest.raises(ValueError, match="retries"):
            eth_ring4.allreduce(arrays, s, retries=bad)


@pytest.mark.verilator
def test_cli_retries_on_the_engine(eth_ring4, tmp_path, capsys):
    """``sim allreduce --topology ring:4 --links eth --codec --corrupt 0 40 --retries 1 --check``:
    the lost chunks are summed again and the results are the golden model's (exit 0)."""
    from wirereduce.cli import main

    inp = tmp_path / "in.npz"
    np.savez(inp, **{f"node{k}": a for k, a in enumerate(edge_arrays(4, 1500, seed=5))})
    code = main(["sim", "allreduce", "--topology", "ring:4", "--algorithm", "biring", "--links", "eth", "--codec",
                 "--input", str(inp), "--output", str(tmp_path / "out.npz"), "--build-dir", str(BUILD),
                 "--timeout", str(TIMEOUT), "--corrupt", "0", "40", "--retries", "1", "--check"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "lost chunk(s) summed again (--retries)" in out
    assert out.count("bit-exact vs the golden biring allreduce") == 4, out
