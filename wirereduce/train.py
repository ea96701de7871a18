"""``wirereduce train``: data-parallel training, one process per rank, gradients through the hook.

Each rank is a process (``torch.multiprocessing`` spawn) with a gloo process group on localhost
for DDP's broadcast and barriers; its DDP model registers :func:`wirereduce.torch.allreduce_hook`,
so every gradient bucket is summed by the ring (the loopback backend: the golden model after a
gloo exchange; the sim backend: ``wirereduce sim serve --unix`` with one
:class:`~wirereduce.host.rank.EngineRankDriver` per rank) and averaged; the gloo backend is the
baseline, DDP's own allreduce without the hook. The data set is scikit-learn's
handwritten digits (:func:`wirereduce.sim.workloads.gradients.digits_data`), each rank training
on its own shard of every epoch's permutation.

Models: ``digits``, the demo CNN (3,818 parameters, one bucket); ``mlp``, 64 → 1024 → 1024 → 10
(1,125,386 parameters; with ``BUCKET_CAP_MB`` DDP makes 2 buckets after its first step, 66,560 and
1,059,850 elements, so the first layer's allreduce overlaps the rest of back-propagation).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import numpy as np

from wirereduce.codec import check_k

__all__ = ["TrainConfig", "train", "make_mlp", "MODELS", "BACKENDS"]

MODELS = ("digits", "mlp")
BACKENDS = ("loopback", "sim", "gloo")
#: DDP bucket cap (MB); the MLP's 1024 × 1024 weight alone is 4 MB, one bucket.
BUCKET_CAP_MB = 1.0
MLP_HIDDEN = 1024


@dataclass
class TrainConfig:
    """``wirereduce train``'s options (checked by :meth:`check`, before any process starts).

    nodes: ranks (2 … 16); epochs ≥ 1; model in MODELS; backend in BACKENDS; compress: INCEPTIONN
    k (4 … 24) or None; error_feedback needs compress; batch: images per rank and step; lr: SGD
    step; seed ≥ 0; steps: stop each epoch after this many steps (None: the whole shard); golden_check: with
    the sim backend, compare every bucket's sum bit for bit with the golden model (loopback).
    """

    nodes: int = 2
    epochs: int = 1
    model: str = "digits"
    backend: str = "loopback"
    compress: int | None = None
    error_feedback: bool = False
    batch: int = 32
    lr: float = 0.1
    seed: int = 0
    steps: int | None = None
    progress: bool = True
    golden_check: bool = False
    #: With the sim backend: schedule engines on this topology (``sim serve --topology``) running
    #: ``algorithm``; None: a ring of ``nodes`` engines running the NTT ring schedule (``ring:N``,
    #: ``ring``). With loopback: the golden model in that schedule's order (None: rank order).
    topology: str | None = None
    algorithm: str | None = None
    #: "bfloat16"/"float16": float32 gradients travel in that format (State(wire_dtype=…), PyTorch's
    #: bf16_compress_hook).
    wire_dtype: str | None = None
    #: With the sim backend: the socket directory of a ``wirereduce sim serve --unix DIR`` already
    #: running (built with its defaults for this --nodes/--topology and --compress), instead of
    #: starting one.
    serve_dir: str | None = None
    #: With ``algorithm="multiring"``: R roots per Hamiltonian ring and direction (``sim allreduce
    #: --multiring-roots``; WIREREDUCE_MULTIRING_ROOTS for the hook); None: every node a root.
    multiring_roots: int | None = None
    #: With the sim backend: chunk size in payload bytes, or a chunk profile ``"B,B,..."`` (one size
    #: per round of chunks, ``rank allreduce --chunk-bytes``; WIREREDUCE_CHUNK_BYTES for the hook);
    #: uncompressed buckets only. None: full frames.
    chunk_bytes: str | None = None
    #: With the sim backend: each rank reaches its node through the node's DMA socket (raw frames,
    #: as over the VC709 PCIe top's XDMA streams; WIREREDUCE_DMA=1 for the hook) instead of raw
    #: Ethernet.
    dma: bool = False

    def schedule_options(self) -> dict:
        """The options :func:`wirereduce.schedule.build` takes for this run's schedule."""
        return {} if self.multiring_roots is None else {"roots": self.multiring_roots}

    def check(self) -> TrainConfig:
        """Raises ValueError on any bad option."""
        def integer(name, lo, hi=None):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
                rng = f"{lo} … {hi}" if hi is not None else f"≥ {lo}"
                raise ValueError(f"{name} must be an integer {rng}, not {v!r}")
        integer("nodes", 2, 16)
        integer("epochs", 1)
        integer("batch", 1)
        integer("seed", 0)
        if self.steps is not None:
            integer("steps", 1)
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, not {self.model!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        if self.compress is not None:
            self.compress = check_k(self.compress)
        if self.backend == "gloo" and self.compress is not None:
            raise ValueError("the gloo baseline does not compress: --compress needs --backend loopback or sim")
        if self.golden_check and self.backend != "sim":
            raise ValueError("--check compares the simulated boards with the golden model: it needs --backend sim")
        if self.error_feedback and self.compress is None:
            raise ValueError("error feedback needs compression (--compress K)")
        if (self.topology is None) != (self.algorithm is None):
            raise ValueError("--topology and --algorithm go together (the schedule the engines run)")
        if self.backend == "sim" and self.topology is None:
            # a ring of --nodes schedule engines running the NTT ring schedule (sim serve --nodes N)
            self.topology, self.algorithm = f"ring:{self.nodes}", "ring"
        if self.topology is not None:
            from wirereduce import schedule as sched

            if self.multiring_roots is not None:
                integer("multiring_roots", 1)
                if self.algorithm != "multiring":
                    raise ValueError(f"--multiring-roots sets the multiring schedule's roots: it needs "
                                     f"--algorithm multiring, not {self.algorithm}")
            s = sched.build(self.topology, self.algorithm, **self.schedule_options())   # ValueError: bad name, roots
            if s.nodes != self.nodes:
                raise ValueError(f"{s.topology.name} has {s.nodes} nodes, not --nodes {self.nodes}")
            if self.backend == "gloo":
                raise ValueError("--topology runs the wirereduce hook: it needs --backend sim or loopback")
        if self.wire_dtype is not None:
            names = {"bf16": "bfloat16", "fp16": "float16"}
            self.wire_dtype = names.get(self.wire_dtype, self.wire_dtype)
            if self.wire_dtype not in ("bfloat16", "float16"):
                raise ValueError(f"wire_dtype must be bf16 or fp16, not {self.wire_dtype!r}")
            if self.backend == "gloo" or self.compress is not None:
                raise ValueError("--wire-dtype needs the wirereduce hook without --compress")
        if self.multiring_roots is not None and self.topology is None:
            raise ValueError("--multiring-roots needs --topology and --algorithm multiring")
        if self.chunk_bytes is not None:
            if self.backend != "sim":
                raise ValueError("--chunk-bytes sizes the simulated boards' frames: it needs --backend sim")
            from wirereduce.host.engine import chunk_words_of_bytes, parse_chunk_bytes

            try:
                sizes = parse_chunk_bytes(self.chunk_bytes)
                chunk_words_of_bytes(sizes, _sim_config(self).mtu, compressed=self.compress is not None)
            except ValueError as e:
                raise ValueError(f"--chunk-bytes: {e}") from None
            self.chunk_bytes = ",".join(str(b) for b in ((sizes,) if isinstance(sizes, int) else sizes))
        if self.dma and self.backend != "sim":
            raise ValueError("--dma reaches the simulated boards' DMA sockets: it needs --backend sim")
        if self.serve_dir is not None:
            if self.backend != "sim":
                raise ValueError("--unix names a running `sim serve --unix DIR`: it needs --backend sim")
            if not os.path.isdir(self.serve_dir):
                raise ValueError(f"--unix {self.serve_dir}: no such directory (start `wirereduce sim serve --unix "
                                 f"{self.serve_dir}` first)")
        if not isinstance(self.lr, (int, float)) or not 0 < self.lr < 100:
            raise ValueError(f"lr must be a positive step, not {self.lr!r}")
        return self


def make_mlp(seed: int = 0):
    """The larger model: Flatten → Linear(64, 1024) → ReLU → Linear(1024, 1024) → ReLU →
    Linear(1024, 10), float32, on (batch, 1, 8, 8) images; 1,125,386 parameters."""
    import torch
    nn = torch.nn
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Flatten(), nn.Linear(64, MLP_HIDDEN), nn.ReLU(),
                             nn.Linear(MLP_HIDDEN, MLP_HIDDEN), nn.ReLU(), nn.Linear(MLP_HIDDEN, 10))


def _model(name: str, seed: int):
    from wirereduce.sim.workloads.gradients import make_model
    return make_model(seed) if name == "digits" else make_mlp(seed)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, cfg: dict, port: int, env: dict, out: str | None) -> None:
    """One rank's training process (spawned)."""
    os.environ.update(env)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import wirereduce.torch as wrt
    from wirereduce.sim.workloads.gradients import digits_data, evaluate

    cfg = TrainConfig(**cfg)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=cfg.nodes)
    try:
        model = DDP(_model(cfg.model, cfg.seed), bucket_cap_mb=BUCKET_CAP_MB)
        backend = state = None
        if cfg.backend != "gloo":
            schedule = None
            if cfg.topology is not None:
                from wirereduce import schedule as sched

                schedule = sched.build(cfg.topology, cfg.algorithm, **cfg.schedule_options())
            if cfg.backend == "loopback":
                backend = wrt.LoopbackBackend(schedule=schedule)
            else:
                backend = wrt.backend_from_env(config=_sim_config(cfg))
                if cfg.golden_check:
                    backend = wrt.CheckedBackend(backend, wrt.LoopbackBackend(schedule=schedule))
            state = wrt.State(backend, compress_k=cfg.compress, error_feedback=cfg.error_feedback,
                              wire_dtype=cfg.wire_dtype)
            model.register_comm_hook(state, wrt.allreduce_hook)
        backward_s = blocked_s = 0.0
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
        X, y, Xt, yt = digits_data(cfg.seed)
        shard = len(y) // cfg.nodes
        steps = shard // cfg.batch if cfg.steps is None else min(cfg.steps, shard // cfg.batch)
        history = []
        bar = None
        if rank == 0 and cfg.progress:
            from tqdm import tqdm
            bar = tqdm(total=cfg.epochs * steps, unit="step", file=sys.stdout, dynamic_ncols=True, leave=False)
        t_start = time.perf_counter()
        for epoch in range(cfg.epochs):
            perm = np.random.default_rng([cfg.seed, epoch]).permutation(len(y))
            mine = perm[rank * shard:(rank + 1) * shard]
            losses = []
            for s in range(steps):
                idx = mine[s * cfg.batch:(s + 1) * cfg.batch]
                xb, yb = torch.from_numpy(X[idx]), torch.from_numpy(y[idx])
                opt.zero_grad(set_to_none=True)
                loss = torch.nn.functional.cross_entropy(model(xb), yb)
                t0 = time.perf_counter()
                loss.backward()
                t1 = time.perf_counter()
                backward_s += t1 - t0
                if state is not None and state.last_call is not None:
                    # from the last bucket handed to the hook to backward()'s return: DDP waiting for the ring
                    blocked_s += t1 - max(state.last_call, t0)
                opt.step()
                losses.append(float(loss.detach()))
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(epoch=epoch + 1, loss=f"{losses[-1]:.4f}")
            # the mean training loss over every rank's steps (gloo, DDP's group)
            t = torch.tensor([sum(losses), len(losses)], dtype=torch.float64)
            dist.all_reduce(t)
            acc = evaluate(model.module, Xt, yt)
            history.append({"epoch": epoch + 1, "loss": float(t[0] / t[1]), "accuracy": acc})
            if rank == 0:
                msg = f"epoch {epoch + 1}/{cfg.epochs}: loss {history[-1]['loss']:.4f}  test accuracy {acc:.4f}"
                (bar.write(msg) if bar is not None else print(msg, flush=True))
        if bar is not None:
            bar.close()
        timings = [] if state is None else state.timings
        if state is not None:
            state.close()
        if rank == 0:
            wall = time.perf_counter() - t_start
            print(f"{wall:.2f} s of training ({cfg.nodes} ranks, {cfg.backend} backend); rank 0: "
                  f"{backward_s:.2f} s in backward()", flush=True)
            if timings:
                sizes = {}
                for _, n, sec in timings:
                    sizes.setdefault(n, []).append(sec)
                comm = sum(sec for _, _, sec in timings)
                print(f"  {'bucket (elements)':>18} {'allreduces':>10} {'ms in backend':>14}")
                for n in sorted(sizes):
                    v = sizes[n]
                    print(f"  {n:>18,} {len(v):>10} {1e3 * sum(v) / len(v):>14.3f}")
                overlap = 1 - blocked_s / comm if comm > 0 else 0.0
                if cfg.golden_check:
                    print(f"  every bucket's sum bit-identical to the golden model ({backend.checked} checked "
                          f"at rank 0)")
                print(f"  backend {comm:.2f} s, backward() blocked after its last bucket {blocked_s:.2f} s: "
                      f"overlap fraction {overlap:.2f}", flush=True)
            if out:
                import json
                with open(out, "w") as f:
                    json.dump({"config": asdict(cfg), "history": history, "backward_s": backward_s,
                           "blocked_s": blocked_s, "timings": [list(t) for t in timings]}, f)
        if backend is not None and hasattr(backend, "close"):
            backend.close()
    finally:
        dist.destroy_process_group()


#: What the run's first line says with ``dma``.
DMA_NOTE = ", hosts on the boards' DMA sockets"


def hook_env(cfg: TrainConfig, sock_dir: str) -> dict:
    """The environment every rank's hook reads (``wirereduce.torch.backend_from_env``) with
    ``--backend sim``: the served boards' socket directory (and with ``dma`` their DMA sockets),
    the nodes, the schedule (topology, algorithm, multiring roots) and the chunk sizes, the same at
    every rank."""
    from wirereduce import torch as wrt  # the names the hook reads (no PyTorch needed for them)

    env = {wrt.ENV_UNIX: sock_dir, wrt.ENV_NODES: str(cfg.nodes),
           wrt.ENV_TIMEOUT: os.environ.get(wrt.ENV_TIMEOUT, "30")}
    if cfg.topology is not None:
        env.update({wrt.ENV_TOPOLOGY: cfg.topology, wrt.ENV_ALGORITHM: cfg.algorithm})
    if cfg.multiring_roots is not None:
        env[wrt.ENV_MULTIRING_ROOTS] = str(cfg.multiring_roots)
    if cfg.chunk_bytes is not None:
        env[wrt.ENV_CHUNK_BYTES] = cfg.chunk_bytes
    if cfg.dma:
        env[wrt.ENV_DMA] = "1"
    return env


def _sim_config(cfg: TrainConfig):
    """How ``_start_sim``'s ``sim serve`` builds the nodes (its defaults)."""
    from wirereduce.host.rank import served_engine_config

    return served_engine_config(cfg.topology, codec=cfg.compress is not None)


def _start_sim(cfg: TrainConfig, workdir: str):
    """``wirereduce sim serve --unix`` in a child process; returns (process, socket dir)."""
    try:
        import wirereduce.host.rank  # noqa: F401
        import wirereduce.sim.engines.runner  # noqa: F401
    except ImportError as e:
        raise RuntimeError("--backend sim is not available in this installation "
                           "(no wirereduce sim serve / per-rank driver)") from e
    sock_dir = os.path.join(workdir, "sockets")
    where = ["--topology", cfg.topology]
    cmd = [sys.executable, "-m", "wirereduce.cli", "sim", "serve", *where, "--unix", sock_dir]
    if cfg.compress is not None:
        cmd.append("--codec")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    print("starting the simulated boards (the first build takes minutes) …", flush=True)
    for line in proc.stdout:
        print(f"  sim serve: {line.rstrip()}", flush=True)
        if line.startswith("serving"):
            return proc, sock_dir
    proc.wait()
    raise RuntimeError(f"wirereduce sim serve stopped before serving (exit {proc.returncode})")


def train(cfg: TrainConfig, out: str | None = None) -> None:
    """Runs ``cfg.nodes`` training processes and waits for them.

    Raises
    ------
    ValueError
        On a bad option (:meth:`TrainConfig.check`), before any process starts.
    RuntimeError
        If PyTorch is missing or ``--backend sim`` is not available.
    torch.multiprocessing.ProcessRaisedException
        If a rank fails.
    """
    cfg.check()
    from wirereduce.torch import require_torch
    torch = require_torch()
    env = {}
    workdir = tempfile.mkdtemp(prefix="wr-train")
    sim = None
    try:
        if cfg.backend == "sim":
            if cfg.serve_dir is not None:
                sock_dir = os.path.abspath(cfg.serve_dir)
            else:
                sim, sock_dir = _start_sim(cfg, workdir)
            env = hook_env(cfg, sock_dir)
        port = _free_port()
        print(f"training {cfg.model} on {cfg.nodes} ranks ({cfg.backend} backend"
              f"{f', INCEPTIONN k={cfg.compress}' if cfg.compress else ''}"
              f"{', error feedback' if cfg.error_feedback else ''}"
              f"{f', {cfg.algorithm} on {cfg.topology}' if cfg.topology else ''}"
              f"{f', {cfg.wire_dtype} gradients on the wire' if cfg.wire_dtype else ''}"
              f"{DMA_NOTE if cfg.dma else ''}), {cfg.epochs} epoch(s)",
              flush=True)
        torch.multiprocessing.spawn(_worker, args=(asdict(cfg), port, env, out), nprocs=cfg.nodes, join=True)
    finally:
        if sim is not None:
            sim.terminate()
            sim.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
