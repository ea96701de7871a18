"""One process per rank: the allreduce as ONE host sees it, against its own engine only.

On a real cluster every training host runs its own process with its own gradient and knows
nothing of the others' memory. :class:`EngineRankDriver` runs that host's part of the collective
over a transport that reaches its engine only (:class:`wirereduce.host.transports.packet.PacketTransport`)
with the same planning every simulator uses (:class:`wirereduce.host.engine.EngineSession`: flows,
chunks, collective ids, window): every rank computes the same plan and the same collective ids
from the same call sequence, so no id travels between hosts.

Two things a one-process-per-rank run cannot get from the driver alone:

- **The start barrier.** No rank pushes before every engine has acknowledged its CONTROL frame, so
  no engine sees a REDUCE frame of a collective it was not told about (it would drop it:
  ``drop_collective``). One rank cannot see the other nodes, so
  ``barrier`` (any callable, e.g. ``torch.distributed.barrier`` of the gloo group DDP keeps, or
  :class:`FileBarrier`) is called between the acknowledgement and the first push. Without one the
  ranks must start within the ring's slack.
- **Retries.** Which chunks were lost is known only to the rank that misses them; re-running them
  needs every rank to agree on the lost set. Without ``retries`` :class:`EngineRankDriver` raises
  :class:`ChunksLost` (or ``TimeoutError``) and the caller decides; with ``retries`` and an
  ``exchange`` (an all-gather of a small list: ``torch.distributed.all_gather_object`` of the gloo
  group DDP keeps, or :class:`FileExchange`) has every rank hand in the chunks it misses after each
  round; the union is summed again, each chunk in its own flow
  (:func:`~wirereduce.host.engine.plan_retry`), so the result is the loss-free run's bit for bit.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from wirereduce.host.driver import (
    ChunksLost,
    CollectiveIds,
    loss_report,
    parse_stats,
)

from wirereduce.config import EngineConfig
from wirereduce.protocol import Header, Opcode, ProtocolError

__all__ = ["EngineRankDriver", "FileBarrier", "FileExchange", "served_engine_config",
           "SERVED_ENGINE_SLOTS"]

#: Chunk slots of the engines ``wirereduce sim serve --topology`` builds by default (the host window
#: the engine needs for full bandwidth; ``sim allreduce --topology`` uses the same).
SERVED_ENGINE_SLOTS = 16


def served_engine_config(topology, **overrides) -> EngineConfig:
    """The :class:`~wirereduce.config.EngineConfig` ``wirereduce sim serve --topology`` builds unless
    told otherwise: ports = the topology's degree (at least 2), :data:`SERVED_ENGINE_SLOTS` slots, the
    rest EngineConfig's defaults; ``overrides`` (``width=``, ``mtu=``, ``slots=``, ``ports=``,
    ``max_flows=``, ``codec=``) replace them. Raises ValueError on a bad topology or value."""
    from wirereduce.schedule import parse_topology

    topo = parse_topology(topology)
    kw = {"ports": max(2, topo.degree), "slots": SERVED_ENGINE_SLOTS}
    kw.update({k: v for k, v in overrides.items() if v is not None})
    return EngineConfig(**kw)

_DEFAULT = object()


class FileBarrier:
    """A barrier of ``nodes`` processes that share a directory (one file per rank and round).

    For ranks on one machine (the simulated cluster's tests, in separate network namespaces) with
    no IP between them; on real hosts use the training framework's barrier (gloo).

    Parameters
    ----------
    directory : path
        Shared by every rank (created if missing).
    rank, nodes : int
    timeout : float
        Seconds to wait for the others before ``TimeoutError``.
    """

    def __init__(self, directory: str | os.PathLike, rank: int, nodes: int, timeout: float = 30.0):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rank, self.nodes, self.timeout = rank, nodes, timeout
        self.round = 0

    def __call__(self) -> None:
        r = self.round
        self.round += 1
        (self.dir / f"round{r}.rank{self.rank}").touch()
        _wait_for_ranks([self.dir / f"round{r}.rank{k}" for k in range(self.nodes)], self.rank, self.timeout,
                        f"barrier round {r}", "a rank stopped or started late")


def _wait_for_ranks(paths, rank: int, timeout: float, what: str, why: str) -> None:
    """Poll (every 2 ms) until every rank's file in ``paths`` exists (:class:`FileBarrier`,
    :class:`FileExchange`); TimeoutError after ``timeout`` seconds naming how many ranks reached
    ``what``, and ``why`` that may be."""
    deadline = time.monotonic() + timeout
    while True:
        here = sum(p.exists() for p in paths)
        if here == len(paths):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: only {here} of {len(paths)} ranks reached {what} in {timeout:g} s "
                               f"({why})")
        time.sleep(0.002)


class FileExchange:
    """An all-gather of small JSON values between ``nodes`` processes that share a directory (one
    file per rank and round): what :class:`EngineRankDriver`'s retries use to agree on the lost
    chunks when the ranks have no other channel (the simulated cluster's tests, ``wirereduce rank
    allreduce --retries``); on real hosts use the training framework's
    (``torch.distributed.all_gather_object`` on a gloo group).

    ``exchange(value)`` writes this rank's ``value`` (anything ``json`` writes; a list of chunk
    numbers for the retries), waits for every rank's of the same round and returns them, rank by
    rank. A file is written under a temporary name and renamed, so no rank reads half of one.

    Parameters
    ----------
    directory : path
        Shared by every rank (created if missing); use a fresh one per job.
    rank, nodes : int
    timeout : float
        Seconds to wait for the others before ``TimeoutError``.

    Raises
    ------
    ValueError
        ``rank`` not in 0 … nodes − 1, or a timeout that is not positive.
    """

    def __init__(self, directory: str | os.PathLike, rank: int, nodes: int, timeout: float = 30.0):
        if not isinstance(nodes, int) or nodes < 1 or not isinstance(rank, int) or not 0 <= rank < nodes:
            raise ValueError(f"rank must be 0 … nodes − 1 (nodes ≥ 1), not rank {rank!r} of {nodes!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, not {timeout!r}")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rank, self.nodes, self.timeout = rank, nodes, timeout
        self.round = 0

    def __call__(self, value) -> list:
        import json

        r = self.round
        self.round += 1
        mine = self.dir / f"xround{r}.rank{self.rank}.json"
        tmp = mine.with_suffix(".tmp")
        tmp.write_text(json.dumps(value))
        tmp.replace(mine)
        paths = [self.dir / f"xround{r}.rank{k}.json" for k in range(self.nodes)]
        _wait_for_ranks(paths, self.rank, self.timeout, f"exchange round {r}",
                        "a rank stopped, or one is still waiting for results: give the exchange a timeout longer "
                        "than a receive's")
        return [json.loads(p.read_text()) for p in paths]


async def _maybe_await(r):
    return (await r) if inspect.isawaitable(r) else r


async def push_and_collect(transport, rank: int, pushes, session, skip_stats: bool = False) -> bool:
    """Send ``pushes`` (each with ``after`` and ``frame``: sent once the session holds ``after``
    results, the window) while collecting results into ``session`` (``receive``, ``done``,
    ``results_received``) until it is done or a receive times out. ``skip_stats``: a STATS frame
    among the results (a late answer to an earlier request) is passed over. Returns True if the
    results stopped coming (a receive timed out), False when every result arrived."""
    stalled = False

    async def push():
        for p in pushes:
            while session.results_received < p.after and not stalled:
                await transport.idle(1)
            if stalled:
                return
            await transport.send(rank, p.frame)

    async def collect():
        nonlocal stalled
        while not session.done:
            try:
                data = await transport.recv(rank)
            except TimeoutError:
                stalled = True
                return
            if skip_stats and Header.unpack(data).opcode == Opcode.STATS:
                continue
            session.receive(data)

    await transport.gather([push(), collect()])
    return stalled


async def _barrier_push_collect(driver, session, pushes, skip_stats: bool = False) -> None:
    """What a rank's driver does once its node took the CONTROL: call ``driver.barrier`` (awaited
    if it returns an awaitable), :func:`push_and_collect`, and on a stall raise
    :class:`~wirereduce.host.driver.ChunksLost` with the node's counters (``driver.stats()``)."""
    rank = driver.rank
    if driver.barrier is not None:
        r = driver.barrier()
        if inspect.isawaitable(r):
            await r
    if await push_and_collect(driver.transport, rank, pushes, session, skip_stats=skip_stats):
        try:
            stats = {rank: await driver.stats()}
        except (TimeoutError, ProtocolError):
            stats = {rank: None}
        what = f"rank {rank}: node {rank} sent no result in time (a frame was lost or another rank stopped)"
        raise ChunksLost(loss_report([session], stats, what), [session], stats)


class EngineRankDriver:
    """Rank ``rank``'s host on a network of schedule engines: any schedule, any format, one process per rank.

    It drives its :mod:`wirereduce.hdl.core.engine` with the same planning every simulator uses
    (:class:`~wirereduce.host.engine.EngineSession`: chunks, flows, window, dtype byte): every rank
    computes the same plan and collective ids from the same call sequence. Per allreduce it reads the
    node's counters (STATS_REQUEST: the baseline the acknowledgements are checked against), loads the
    node's table (SCHEDULE frames, each acknowledged; on the first call, then only after a table load
    failed), starts the collective (CONTROL), calls ``barrier``, pushes within the window and collects
    the results.

    Parameters
    ----------
    transport : Transport
        Reaches node ``rank`` (:class:`~wirereduce.host.transports.packet.PacketTransport`).
    rank : int
        This host's rank, a node of ``schedule``'s topology.
    schedule : wirereduce.schedule.Schedule
        What every rank runs (:func:`wirereduce.schedule.build`; the same at every rank).
    config : EngineConfig
        How the engines were built (``wirereduce sim serve --topology``: ports, MTU, slots,
        max_flows, formats).
    window : int, optional
        Chunks pushed ahead of the results received, 1 … ``config.slots`` (default ``slots``).
    barrier : callable, optional
        Called (awaited if it returns an awaitable) after the node took the CONTROL frame and
        before the first push, at every rank (:class:`FileBarrier`, or the training framework's
        barrier, e.g. ``torch.distributed.barrier`` of a gloo group).
    first_collective : int
        Collective id of the first allreduce (the same at every rank).
    retries : int
        Rounds over lost chunks allowed after an allreduce's first round (the same at every rank;
        default 0: a loss raises :class:`~wirereduce.host.driver.ChunksLost`). An engine sends no
        LOST placeholders, so a loss shows as results that stop coming (a receive timeout). With
        retries, after every round each rank hands the chunks it misses to ``exchange``; if any rank
        misses any, every rank runs a new collective (CONTROL with ABORT) of just those chunks,
        each in its own flow's share (:func:`~wirereduce.host.engine.plan_retry`), and puts the sums
        in place: the result is the loss-free run's bit for bit. With the retries used up and
        chunks still missing somewhere, every rank raises ChunksLost (the collective failed as a
        whole; a rank that holds all its results says so in the message).
    exchange : callable, optional
        Needed with ``retries``: ``exchange(value)`` returns every rank's ``value`` in rank order (a
        list of ints here; awaited if it returns an awaitable), e.g. :class:`FileExchange` or
        ``lambda v: (out := [None] * n, dist.all_gather_object(out, v, group=gloo))[0]``. Its
        timeout must outlast a receive's: a rank that stalled arrives a receive timeout later.
    chunk_words : int or sequence of int, optional
        At most this many 32-bit payload words per chunk, or a chunk profile, one size per round of
        chunks, the last repeated (:class:`~wirereduce.host.engine.EngineSession`; the same at every
        rank; uncompressed allreduces only). Default: full frames. The result bits do not depend on it.

    Raises
    ------
    ValueError
        A rank outside the topology, a bad window or collective id, a schedule with more flows
        than the engines hold, bad ``retries``, ``retries`` without ``exchange``, or a
        ``chunk_words`` size outside 1 … ``config.max_elements``.
    TypeError
        ``config`` is not an :class:`~wirereduce.config.EngineConfig`.
    """

    def __init__(self, transport, rank: int, schedule, config: EngineConfig, *, window=_DEFAULT,
                 barrier: Callable | None = None, first_collective: int = 1, retries: int = 0,
                 exchange: Callable | None = None, chunk_words=None):
        from wirereduce.host.driver import RequestTags, check_retries
        from wirereduce.host.engine import check_chunk_words
        from wirereduce.host.engine import check_window as check_engine_window

        if not isinstance(config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig (how the engines were built), not {config!r}")
        nodes = schedule.nodes
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < nodes:
            raise ValueError(f"rank must be 0 … {nodes - 1} ({schedule.topology.name}), not {rank!r}")
        if len(schedule.flows) > config.max_flows:
            raise ValueError(f"the schedule has {len(schedule.flows)} flows; the engines hold {config.max_flows} "
                             f"(built with max_flows={config.max_flows})")
        self.transport = transport
        self.rank = rank
        self.nodes = nodes
        self.schedule = schedule
        self.config = config
        self.window = config.slots if window is _DEFAULT else check_engine_window(window, config)
        self.barrier = barrier
        self.retries = check_retries(retries)
        if self.retries and exchange is None:
            raise ValueError("retries need exchange (every rank's missing chunks, e.g. FileExchange or "
                             "torch.distributed.all_gather_object): one rank alone does not know what the others lost")
        self.exchange = exchange
        if chunk_words is not None:
            check_chunk_words(chunk_words, config.max_elements)
        self.chunk_words = chunk_words
        #: Lost chunks summed again by the last allreduce (0: none were lost).
        self.retried = 0
        self.ids = CollectiveIds(first_collective)
        self.tags = RequestTags(1)
        #: The node holds this driver's table (loaded and acknowledged).
        self.table_loaded = False
        #: The last allreduce did not finish: the next CONTROL carries ``Flag.ABORT``.
        self.unfinished = False

    def session(self, array: np.ndarray, op: str = "sum", compression: int | None = None):
        """The :class:`~wirereduce.host.engine.EngineSession` of the next allreduce of ``array``
        (checked, nothing sent; takes a collective id and request tags)."""
        from wirereduce.host.engine import EngineSession

        s = EngineSession(self.rank, self.schedule, self.config, self.ids.next, np.asarray(array), self.window,
                          tag=self.tags.next, op=op, abort=self.unfinished, compression=compression,
                          chunk_words=self.chunk_words)
        self.ids.take()
        for _ in range(1 + len(s.schedule_frames())):
            self.tags.take()
        return s

    def allreduce(self, bucket: np.ndarray, compression: int | None = None, op: str = "sum") -> np.ndarray:
        """The reduction over every rank of ``bucket`` in the schedule's order, as this rank's node
        returns it (blocking).

        Parameters
        ----------
        bucket : numpy.ndarray, shape (n,), float32, ml_dtypes.bfloat16, float16 or int32
            This rank's array; every rank passes the same length and dtype.
        compression : int, optional
            Error-bound exponent k (4 … 24) of INCEPTIONN-compressed pushes and results (fp32,
            engines built with ``EngineConfig(codec=True)``; anything else raises ValueError).
        op : {"sum", "max", "min"}

        Returns
        -------
        numpy.ndarray, shape (n,), the bucket's dtype
            Bit for bit :func:`wirereduce.sim.golden.schedule.allreduce` of every rank's array
            (with ``compression``, its compressed form).

        Raises
        ------
        ValueError
            A bad array, dtype, op or compression, before anything is sent.
        ChunksLost
            Results stopped coming (a frame was lost, a rank died), and no retries were left
            (``retries``: then every rank raises it).
        TimeoutError
            The node did not answer, or the barrier timed out.
        DriverError
            The node refused the table or the CONTROL, or a result is malformed.
        """
        return asyncio.run(self.allreduce_async(bucket, compression, op))

    async def allreduce_async(self, bucket: np.ndarray, compression: int | None = None,
                              op: str = "sum") -> np.ndarray:
        """:meth:`allreduce` in a running event loop."""
        s = self.session(bucket, op, compression)
        self.retried = 0
        if not self.retries:
            try:
                await self._run(s)
            except BaseException:
                self.unfinished = True
                raise
            self.unfinished = False
            return s.result
        return await self._run_with_retries(s, op, compression)

    async def _run_with_retries(self, s, op, compression) -> np.ndarray:
        """:meth:`allreduce_async` with :attr:`retries`: after each round every rank's missing
        chunks go through :attr:`exchange`; their union is summed again (each in its own flow) until
        none is missing or the retries are used up (class docstring)."""
        from wirereduce.host.engine import plan_retry

        from wirereduce.formats import from_words

        elements, fmt = np.asarray(s.array).size, s.format
        lost_rounds = []   # (this rank's result words of the round that lost chunks, its RetryPlan)
        while True:
            err = None
            try:
                await self._run(s)
            except ChunksLost as e:
                err = e
            except BaseException:
                self.unfinished = True
                raise
            mine = [int(g) for g in s.missing]
            try:
                everyone = await _maybe_await(self.exchange(mine))
            except BaseException:
                self.unfinished = True
                raise
            if len(everyone) != self.nodes:
                self.unfinished = True
                raise ValueError(f"exchange returned {len(everyone)} values, not one per rank ({self.nodes})")
            lost = sorted(set().union(*map(set, everyone)))
            if not lost:
                break
            self.unfinished = True
            if len(lost_rounds) == self.retries:
                who = [k for k, m in enumerate(everyone) if m]
                tries = f"{self.retries} retr{'y' if self.retries == 1 else 'ies'}"
                numbering = (f" (chunk numbers of retry round {len(lost_rounds)}, collective {s.collective}: a "
                             f"message of the lost chunks only)" if lost_rounds else "")
                if err is None:
                    raise ChunksLost(f"rank {self.rank}: every result arrived here, but ranks {who} still miss "
                                     f"chunks {lost}{numbering} after {tries}: the collective failed", [s],
                                     {self.rank: None})
                raise ChunksLost(f"{err}\nStill lost after {tries}{numbering}; ranks {who} miss chunks {lost}.",
                                 [s], err.stats)
            rp = plan_retry(s.chunks, lost, len(self.schedule.flows))
            lost_rounds.append((s.result_words.copy(), rp))
            self.retried += len(rp.chunks)
            s = self.session(from_words(rp.gather(s.words), fmt), op, compression)
        self.unfinished = False
        words = s.result_words
        for received, rp in reversed(lost_rounds):
            words = rp.scatter(received, words)
        return from_words(words, fmt, elements)

    async def stats(self) -> dict[str, int]:
        """This rank's node's status and drop counters (a STATS_REQUEST round trip)."""
        return parse_stats(await self._request(Header(opcode=Opcode.STATS_REQUEST, count=self.tags.take()).pack()))

    async def _request(self, frame: bytes, tag: int | None = None) -> bytes:
        """Send ``frame`` and return the STATS answer with request tag ``tag`` (the frame's
        ``count`` by default); answers to other requests and stray results are skipped."""
        t = self.transport
        want = (Header.unpack(frame).count if tag is None else tag) & 0xFFFF
        await t.send(self.rank, frame)
        while True:
            data = await t.recv(self.rank)
            if Header.unpack(data).opcode == Opcode.STATS and parse_stats(data)["request_tag"] == want:
                return data

    async def _run(self, s) -> None:
        s.last_stats = await self.stats()   # the baseline the acknowledgements are checked against
        if not self.table_loaded:
            for i, fr in enumerate(s.schedule_frames()):
                s.check_ack(await self._request(fr, s.schedule_tag(i)), s.schedule_tag(i))
            self.table_loaded = True
        s.check_ack(await self._request(s.control_frame(), s.tag), s.tag)
        await _barrier_push_collect(self, s, s.push_frames(), skip_stats=True)
