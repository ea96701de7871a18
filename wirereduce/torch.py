"""PyTorch DDP communication hook: every gradient bucket allreduced through the rank's node.

::

    import wirereduce.torch as wrt
    state = wrt.State(wrt.LoopbackBackend())        # or wrt.backend_from_env() against a node
    ddp_model.register_comm_hook(state, wrt.allreduce_hook)

DDP (``torch.nn.parallel.DistributedDataParallel``) keeps its gloo process group for the initial
broadcast of the parameters and its barriers; only the gradient allreduce goes through the hook.
DDP calls the hook once per bucket, in bucket order, as soon as back-propagation has filled the
bucket; :func:`allreduce_hook` hands the bucket to one worker thread per :class:`State` and returns
at once, so the allreduce of bucket *i* runs while autograd computes the gradients of bucket *i+1*
(NTT's layer-wise overlap). DDP waits for every bucket's future at the end of ``backward()``.

A backend is any object with ``nodes`` (the ring size), ``rank`` and
``allreduce(array, compression=None) -> numpy.ndarray``: the SUM over ranks in the array's own
format, bit for bit the node's order: the ring node's ``((g0 + g1) + g2) + …``
(:func:`wirereduce.sim.golden.allreduce.ring_allreduce`), or a schedule's table order on the
schedule engine (:func:`wirereduce.sim.golden.schedule.allreduce`).

Number formats: the hook reduces a bucket in its own dtype, float32, bfloat16 or float16 (a
``model.to(torch.bfloat16)`` DDP model hands over bf16 buckets), so a bf16 bucket puts half the
bytes of an fp32 one on the wire. Every add is rounded once to the format with round-to-nearest-
even (``docs/arithmetic.md`` "Other formats and operations"). INCEPTIONN compression is fp32-only.
Every backend takes float32, bf16 and fp16 buckets (the engines are built with every format by
default, :class:`wirereduce.config.EngineConfig`).

- :class:`LoopbackBackend` needs no network: every rank's bucket is exchanged through a gloo
  ``all_gather`` of its own process group and summed with the golden model, in rank order (with
  compression: :func:`wirereduce.sim.golden.codec.ring_allreduce_compressed`, host-compressed).
- :class:`EngineGroup` runs every rank of one process (threads) on a simulated network of
  schedule engines (:class:`wirereduce.sim.engines.fastengine.FastEngineSim`, Verilator): the
  gateware's own sums, in any format, for single-process tests of the hook.
- :class:`RankBackend` drives the rank's engine with :class:`wirereduce.host.rank.EngineRankDriver` over
  a raw-Ethernet :class:`~wirereduce.host.transports.packet.PacketTransport` (a real board, or a
  TAP of ``wirereduce sim serve``), the PCIe top's XDMA devices
  (:class:`~wirereduce.host.transports.xdma.XdmaTransport`) or ``sim serve --unix``;
  :func:`backend_from_env` builds one from ``WIREREDUCE_IFACE`` / ``WIREREDUCE_XDMA`` /
  ``WIREREDUCE_UNIX``, ``WIREREDUCE_RANK``, ``WIREREDUCE_NODES``.

Averaging: the hook returns ``sum / N`` (one division of the node's sum, rounded once to the
bucket's format: bf16 and fp16 quotients are computed in fp32 and rounded to the format, which is
the correctly rounded quotient because fp32 has at least 2p + 2 bits for p = 8 and 11, Figueroa's
double-rounding condition). DDP's default gloo
hook divides each rank's bucket by N *before* its allreduce and sums the quotients. For N a power
of two both divisions are exact (a change of exponent; unless the quotient is subnormal), so the
hook's result is the node's sum ÷ N exactly and differs from gloo's only by gloo's summation
order; for other N each way rounds differently (one rounding here, N before gloo's sum).

This module imports torch only when a hook, backend or state is used: ``import wirereduce`` never
needs it.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wirereduce.codec import check_k, quantize

__all__ = ["State", "allreduce_hook", "LoopbackBackend", "EngineGroup", "RankBackend", "CheckedBackend",
           "backend_from_env", "SUPPORTED_DTYPES", "average", "golden_sum",
           "require_torch", "ENV_IFACE", "ENV_UNIX", "ENV_XDMA", "ENV_DMA", "ENV_RANK", "ENV_NODES", "ENV_NODE_MAC",
           "ENV_TIMEOUT"]

#: Environment of :func:`backend_from_env` (what ``wirereduce train --backend sim`` sets per rank).
ENV_IFACE = "WIREREDUCE_IFACE"
ENV_UNIX = "WIREREDUCE_UNIX"
ENV_XDMA = "WIREREDUCE_XDMA"
ENV_DMA = "WIREREDUCE_DMA"
ENV_RANK = "WIREREDUCE_RANK"
ENV_NODES = "WIREREDUCE_NODES"
ENV_NODE_MAC = "WIREREDUCE_NODE_MAC"
ENV_TIMEOUT = "WIREREDUCE_TIMEOUT"
ENV_TOPOLOGY = "WIREREDUCE_TOPOLOGY"
ENV_ALGORITHM = "WIREREDUCE_ALGORITHM"
ENV_RETRIES = "WIREREDUCE_RETRIES"
ENV_CHUNK_BYTES = "WIREREDUCE_CHUNK_BYTES"
ENV_MULTIRING_ROOTS = "WIREREDUCE_MULTIRING_ROOTS"

#: Number formats the hook carries (torch dtype names), and their wirereduce format names.
SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")
_FORMAT_OF = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _numpy_dtype(name: str):
    """The numpy dtype of a carried format name (``"float32"``, ``"bfloat16"``, ``"float16"``)."""
    import ml_dtypes

    return {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
            "float16": np.dtype(np.float16)}[name]


def _dtype_name(dtype) -> str:
    """``"float32"``, ``"bfloat16"``, ``"float16"`` for a torch or numpy dtype (or its name); else the name."""
    name = str(dtype).removeprefix("torch.")
    return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(name, name)


def _to_numpy(t) -> np.ndarray:
    """A 1-D CPU copy of tensor ``t`` as numpy: float32, ml_dtypes.bfloat16 or float16."""
    import ml_dtypes

    torch = require_torch()
    t = t.detach().to("cpu").contiguous().view(-1)
    if t.dtype == torch.bfloat16:   # numpy has no bf16: go through the bits
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return t.numpy().copy()


def _to_torch(a: np.ndarray):
    """Tensor of numpy array ``a`` (float32, ml_dtypes.bfloat16 or float16), sharing nothing with it."""
    torch = require_torch()
    a = np.ascontiguousarray(a)
    if _dtype_name(a.dtype) == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _bits(a: np.ndarray) -> np.ndarray:
    """The bit patterns of a 4- or 2-byte float array (uint32 / uint16)."""
    return a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint16)


def _as_format(array: np.ndarray, what: str) -> tuple[str, np.ndarray]:
    """(torch dtype name, 1-D contiguous array) of a backend's input; TypeError on another dtype."""
    a = np.ascontiguousarray(array).reshape(-1)
    name = _dtype_name(a.dtype)
    if name not in SUPPORTED_DTYPES:
        raise TypeError(f"{what}: {a.dtype} arrays are not carried; use one of {', '.join(SUPPORTED_DTYPES)}")
    return name, a


def average(total: np.ndarray, nodes: int) -> np.ndarray:
    """``total / nodes`` rounded once to ``total``'s format (float32, bfloat16 or float16), round-to-nearest-even.

    bf16 and fp16 go through fp32: ``total`` widens exactly, the fp32 quotient is then rounded to the
    format, and since fp32 carries p' = 24 >= 2p + 2 significand bits (p = 8, 11) that double
    rounding is the correctly rounded quotient (Figueroa, "When is double rounding innocuous?", 1995).
    """
    name = _dtype_name(total.dtype)
    with np.errstate(all="ignore"):
        if name == "float32":
            return np.divide(total, np.float32(nodes), dtype=np.float32)
        return np.divide(total.astype(np.float32), np.float32(nodes), dtype=np.float32).astype(total.dtype)


def require_torch():
    """``import torch``, or a RuntimeError that says how to get it."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the venv
        raise RuntimeError("wirereduce.torch needs PyTorch: pip install 'wirereduce[torch]'") from e
    return torch


def _check_backend(backend: Any) -> None:
    for name in ("allreduce", "nodes", "rank"):
        if not hasattr(backend, name):
            raise TypeError(f"backend must have .allreduce(array, compression=None), .nodes and .rank; "
                            f"{type(backend).__name__} has no {name!r}")


@dataclass
class State:
    """What :func:`allreduce_hook` keeps between calls, one per DDP model.

    Parameters
    ----------
    backend : object
        ``nodes``, ``rank`` and ``allreduce(array float32 (n,), compression=None) -> float32 (n,)``
        (the sum over ranks): :class:`LoopbackBackend`, :class:`RankBackend` or your own.
    compress_k : int or None
        INCEPTIONN error-bound exponent k (4 … 24): the buckets travel compressed
        (``allreduce(..., compression=k)``, :mod:`wirereduce.codec`); None: plain fp32.
    error_feedback : bool
        With ``compress_k``: each rank keeps, per bucket index, what compression dropped from its
        bucket, ``g − decode(encode(g))``, and adds it to the same bucket of the next step
        (small gradients are delayed rather than lost). Needs ``compress_k``.
    dtype : str or None
        Number format of the buckets and on the wire: ``"float32"``, ``"bfloat16"`` or
        ``"float16"``; a bucket of another dtype then raises TypeError. None (default): each
        bucket travels in its own dtype (one of those three).
    wire_dtype : str or None
        ``"bfloat16"`` or ``"float16"``: float32 buckets travel in that format, as PyTorch's
        ``bf16_compress_hook``/``fp16_compress_hook`` send them: each gradient is rounded to it
        (round-to-nearest-even, ``ml_dtypes``/numpy ``astype``), the ranks' buckets are reduced
        natively in it (half the bytes of fp32; the schedule engine's bf16/fp16 lanes), the sum is
        averaged in it (:func:`average`) and widened back to float32 exactly. Unlike PyTorch's hooks,
        which divide before the allreduce, the division comes after it (one rounding of the sum, no
        gradient pushed into the subnormals by the division). Needs float32 buckets; not with
        ``compress_k``. None (default): buckets travel in their own dtype.
    overlap : bool
        True (default): the backend runs in one worker thread, buckets in DDP's order, while
        back-propagation goes on; False: inside the hook (blocking autograd).

    Raises
    ------
    ValueError
        On a bad ``compress_k``, ``error_feedback`` without ``compress_k``, a ``dtype`` that is not
        carried, or ``compress_k`` with a ``dtype`` other than float32 (the codec is fp32-only);
        checked here, before any training step.
    TypeError
        If ``backend`` lacks ``allreduce``, ``nodes`` or ``rank``.

    Attributes
    ----------
    residuals : dict
        Error-feedback residuals (float32), per parameter of the model (or per bucket index for a
        bucket that does not list its parameters); :meth:`residual` gives a bucket's.
    timings : list[tuple[int, int, float]]
        (bucket index, elements, seconds in the backend) of every bucket allreduced.
    """

    backend: Any
    compress_k: int | None = None
    error_feedback: bool = False
    dtype: str | None = None
    wire_dtype: str | None = None
    overlap: bool = True
    residuals: dict = field(default_factory=dict, repr=False)
    timings: list = field(default_factory=list, repr=False)

    def __post_init__(self):
        _check_backend(self.backend)
        if self.compress_k is not None:
            self.compress_k = check_k(self.compress_k)
        if not isinstance(self.error_feedback, bool):
            raise ValueError(f"error_feedback must be a bool, not {self.error_feedback!r}")
        if self.error_feedback and self.compress_k is None:
            raise ValueError("error_feedback needs compress_k: without compression nothing is dropped")
        if self.dtype is not None:
            name = _dtype_name(self.dtype)
            if name not in SUPPORTED_DTYPES:
                raise ValueError(f"dtype {self.dtype!r} is not carried; use one of {', '.join(SUPPORTED_DTYPES)} "
                                 f"or None (each bucket's own)")
            if self.compress_k is not None and name != "float32":
                raise ValueError(f"compress_k needs float32 buckets: the INCEPTIONN codec is fp32-only, "
                                 f"dtype is {name}")
            self.dtype = name
        if self.wire_dtype is not None:
            name = _dtype_name(self.wire_dtype)
            if name not in ("bfloat16", "float16"):
                raise ValueError(f"wire_dtype must be 'bfloat16' or 'float16' (or None), not {self.wire_dtype!r}")
            if self.compress_k is not None:
                raise ValueError("wire_dtype and compress_k do not combine: the INCEPTIONN codec is fp32-only")
            if self.dtype not in (None, "float32"):
                raise ValueError(f"wire_dtype carries float32 buckets; dtype is {self.dtype}")
            self.wire_dtype = name
        self._executor = None
        self._lock = threading.Lock()
        self._layout = {}
        #: ``time.perf_counter()`` of the last hook call (when DDP handed over the last bucket).
        self.last_call = None

    @property
    def world_size(self) -> int:
        return int(self.backend.nodes)

    def residual(self, index: int) -> np.ndarray | None:
        """The error-feedback residual bucket ``index`` carries into the next step (float32, the
        bucket's length in its last layout), or None before its first compressed step."""
        segments = self._layout.get(index)
        if segments is None:
            return None
        return np.concatenate([self.residuals[key] for key, _ in segments]).astype(np.float32, copy=False)

    def prepare(self, index: int, grad: np.ndarray, segments=None) -> np.ndarray:
        """The array this rank sends for bucket ``index``: ``grad`` plus its residual (error
        feedback), and the new residual ``sent − decode(encode(sent))`` kept. float32 (n,) in and out.

        ``segments``: the bucket's layout, [(key, elements), …] of its parameters in buffer order;
        the residuals are kept per parameter, so they survive DDP rebuilding its buckets after the
        first step (the bucket's parameters then change). Default: one segment, the bucket index.
        """
        if not self.error_feedback:
            return grad
        if segments is None:
            segments = [(("bucket", index), grad.size)]
        if sum(n for _, n in segments) != grad.size:
            raise ValueError(f"bucket {index}: its parameters have {sum(n for _, n in segments)} elements, "
                             f"its buffer {grad.size}")
        prev = [self.residuals.get(key) for key, _ in segments]
        if any(r is not None for r in prev):
            carried = np.concatenate([np.zeros(n, np.float32) if r is None or r.size != n else r
                                      for r, (_, n) in zip(prev, segments)])
            with np.errstate(all="ignore"):
                grad = np.add(grad, carried, dtype=np.float32)
        with np.errstate(all="ignore"):
            res = np.subtract(grad, quantize(grad, self.compress_k), dtype=np.float32)
        at = 0
        for key, n in segments:
            self.residuals[key] = res[at:at + n]
            at += n
        self._layout[index] = list(segments)
        return grad

    def reduce(self, index: int, grad: np.ndarray, segments=None) -> np.ndarray:
        """Bucket ``index``'s averaged gradient: backend sum of :meth:`prepare` ÷ world size
        (:func:`average`), in ``grad``'s format (float32, ml_dtypes.bfloat16 or float16, shape (n,)).

        Raises RuntimeError if the backend answers another dtype or shape."""
        send = self.prepare(index, grad, segments)
        if self.wire_dtype is not None:
            if _dtype_name(grad.dtype) != "float32":
                raise TypeError(f"State(wire_dtype={self.wire_dtype!r}) carries float32 buckets, not {grad.dtype}")
            with np.errstate(all="ignore"):
                send = send.astype(_numpy_dtype(self.wire_dtype))   # round-to-nearest-even
        t0 = time.perf_counter()
        total = np.asarray(self.backend.allreduce(send, compression=self.compress_k))
        self.timings.append((index, int(grad.size), time.perf_counter() - t0))
        if total.dtype != send.dtype or total.shape != send.shape:
            raise RuntimeError(f"backend returned {total.dtype} {total.shape} for a {send.dtype} {send.shape} bucket")
        avg = average(total, self.world_size)
        return avg.astype(np.float32) if self.wire_dtype is not None else avg

    def executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                # one thread: the backend sees the buckets in the order DDP hands them over, the same at every rank
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wirereduce-hook")
            return self._executor

    def close(self) -> None:
        """Stops the worker thread (after the buckets in flight)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def allreduce_hook(state: State, bucket):
    """DDP communication hook: the bucket's gradients summed by the node, ÷ world size.

    Parameters
    ----------
    state : State
    bucket : torch.distributed.GradBucket
        ``bucket.buffer()``: the flattened gradients (1-D; float32, bfloat16 or float16; copied to
        the CPU); ``bucket.index()``.

    Returns
    -------
    torch.futures.Future[torch.Tensor]
        Completed with the averaged bucket (the buffer's dtype, shape and device) once the backend answers;
        with the backend's exception (``ChunksLost``, ``TimeoutError`` …) if it fails, which DDP
        raises from ``backward()``.

    Raises
    ------
    TypeError
        If the bucket's dtype is not carried, is not ``state.dtype``, or is not float32 with
        ``state.compress_k``; before anything is sent.
    """
    torch = require_torch()
    state.last_call = time.perf_counter()
    buf = bucket.buffer()
    name = _dtype_name(buf.dtype)
    if name not in SUPPORTED_DTYPES:
        raise TypeError(f"wirereduce hook: bucket {bucket.index()} is {buf.dtype}; the hook carries "
                        f"{', '.join(SUPPORTED_DTYPES)} buckets")
    if state.wire_dtype is not None and name != "float32":
        raise TypeError(f"wirereduce hook: bucket {bucket.index()} is {buf.dtype}; State(wire_dtype="
                        f"{state.wire_dtype!r}) carries float32 buckets")
    if state.dtype is not None and name != state.dtype:
        raise TypeError(f"wirereduce hook: bucket {bucket.index()} is {buf.dtype}, State(dtype={state.dtype!r})")
    if state.compress_k is not None and name != "float32":
        raise TypeError(f"wirereduce hook: bucket {bucket.index()} is {buf.dtype}; compress_k needs float32 "
                        f"buckets (the INCEPTIONN codec is fp32-only)")
    index = int(bucket.index())
    grad = _to_numpy(buf)
    segments = None
    if state.error_feedback and hasattr(bucket, "parameters"):
        segments = [(id(p), p.numel()) for p in bucket.parameters()]
        if sum(n for _, n in segments) != grad.size:  # a padded layout: keep the residual per bucket
            segments = None
    fut = torch.futures.Future()

    def run():
        try:
            avg = state.reduce(index, grad, segments)
            fut.set_result(_to_torch(avg).view(buf.shape).to(buf.device))
        except BaseException as e:  # noqa: B036 - handed to DDP, which raises it in backward()
            fut.set_exception(e)

    if state.overlap:
        state.executor().submit(run)
    else:
        run()
    return fut


def golden_sum(arrays, rank: int = 0, schedule=None) -> np.ndarray:
    """The golden SUM of ``arrays`` (one 1-D array per rank, all float32, ml_dtypes.bfloat16 or
    float16) that rank ``rank`` receives: with ``schedule`` (a :class:`wirereduce.schedule.Schedule`)
    its table order (:func:`wirereduce.sim.golden.schedule.allreduce`), else the ring node's rank
    order ``((g0 + g1) + g2) + …``, each add rounded to the format (:func:`wirereduce.formats.combine`).

    Raises ValueError on inputs :func:`wirereduce.formats.check_typed_inputs` refuses."""
    from wirereduce.formats import check_typed_inputs, combine
    from wirereduce.sim.golden import schedule as golden_schedule

    fmt, arrays = check_typed_inputs(arrays)
    if schedule is not None:
        return golden_schedule.allreduce(arrays, schedule)[rank]
    acc = arrays[0].copy()
    for a in arrays[1:]:
        acc = combine(acc, a, fmt)
    return acc


class LoopbackBackend:
    """The node's sum without a network: the ranks exchange their buckets with gloo.

    Every call all-gathers the ranks' arrays over a gloo process group of its own (DDP's group is
    left to DDP; the hook's worker thread is the only user of this one) and returns the golden
    model's sum (:func:`golden_sum`) in the array's format: in rank order, the ring node's
    (:func:`wirereduce.sim.golden.allreduce.ring_allreduce` for float32), or in ``schedule``'s table
    order, the schedule engine's; with ``compression`` (float32 only)
    :func:`wirereduce.sim.golden.codec.ring_allreduce_compressed` with ``host_compressed=True``
    (what the NTT ring schedule's codec engines return with ``compression=k``), or with ``schedule``
    :func:`wirereduce.sim.golden.schedule.allreduce` with ``compression`` (what codec engines return
    to ``EngineRankDriver.allreduce(..., compression=k)``).

    Parameters
    ----------
    group : torch.distributed.ProcessGroup, optional
        Default: a new gloo group of every rank (``torch.distributed`` must be initialised; every
        rank must build its backend at the same point, as any collective).
    schedule : wirereduce.schedule.Schedule, optional
        The schedule engine's schedule whose order to follow (its topology must have the world
        size's nodes); default: the ring node's rank order.

    Raises
    ------
    RuntimeError
        If ``torch.distributed`` is not initialised.
    ValueError
        If ``schedule`` is for another number of nodes.
    """

    def __init__(self, group=None, schedule=None):
        torch = require_torch()
        dist = torch.distributed
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("LoopbackBackend needs torch.distributed initialised (init_process_group('gloo', ...))")
        self.group = group if group is not None else dist.new_group(backend="gloo")
        self.nodes = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        if schedule is not None and schedule.topology.nodes != self.nodes:
            raise ValueError(f"the schedule is for {schedule.topology.nodes} nodes, the group has {self.nodes} ranks")
        self.schedule = schedule

    def allreduce(self, array: np.ndarray, compression: int | None = None) -> np.ndarray:
        """Sum over ranks of ``array`` (float32, ml_dtypes.bfloat16 or float16; 1-D) in its format;
        see the class. Raises TypeError on another dtype or on ``compression`` with a non-float32 array."""
        from wirereduce.sim.golden.codec import ring_allreduce_compressed

        torch = require_torch()
        name, array = _as_format(array, "LoopbackBackend")
        if compression is not None:
            compression = check_k(compression)
            if name != "float32":
                raise TypeError(f"LoopbackBackend: compression needs float32 arrays, not {name}")
        t = _to_torch(array)
        parts = [torch.empty_like(t) for _ in range(self.nodes)]
        torch.distributed.all_gather(parts, t, group=self.group)
        arrays = [_to_numpy(p) for p in parts]
        if compression is None:
            return golden_sum(arrays, self.rank, self.schedule)
        if self.schedule is not None:
            from wirereduce.sim.golden import schedule as golden_schedule

            return golden_schedule.allreduce(arrays, self.schedule, "sum", compression)[self.rank]
        return ring_allreduce_compressed(arrays, compression, host_compressed=True)


class EngineGroup:
    """Every rank of one process, summed by a simulated network of schedule engines.

    For single-process runs and tests of the hook against the gateware: ``backend(rank)`` gives
    rank ``rank``'s backend; each rank calls its backend from its own thread (each
    :class:`State` has one worker), the group waits until every rank has handed over its array,
    runs one allreduce of all of them on ``sim`` (:meth:`FastEngineSim.allreduce
    <wirereduce.sim.engines.fastengine.FastEngineSim.allreduce>`, Verilator) and gives each rank
    its own node's result. The arrays travel in their format (float32, bf16, fp16); with
    ``compression`` (every rank the same k, float32, engines built with the codec) compressed.

    Parameters
    ----------
    sim : wirereduce.sim.engines.fastengine.FastEngineSim
        The network (built once; its topology's nodes are the ranks).
    schedule : wirereduce.schedule.Schedule
        For ``sim``'s topology.
    timeout : float
        Seconds a rank waits for the others before raising ``threading.BrokenBarrierError``.

    Raises
    ------
    ValueError
        If ``schedule`` is for another topology.
    """

    def __init__(self, sim, schedule, timeout: float = 600.0):
        if schedule.topology.name != sim.topology.name:
            raise ValueError(f"the schedule is for {schedule.topology.name}, the network is {sim.topology.name}")
        self.sim, self.schedule = sim, schedule
        self.nodes = sim.topology.nodes
        self._inputs: list = [None] * self.nodes
        self._ks: list = [None] * self.nodes
        self._outputs: list = [None] * self.nodes
        self._error: BaseException | None = None
        self._barrier = threading.Barrier(self.nodes, action=self._run, timeout=timeout)
        #: :class:`~wirereduce.sim.engines.fastengine.EngineResult` of every allreduce run, in order.
        self.runs: list = []

    def _run(self) -> None:
        self._error = None
        try:
            if len(set(self._ks)) != 1:
                raise ValueError(f"the ranks asked for different compressions {self._ks}: every rank of one "
                                 f"allreduce must give the same k")
            r = self.sim.allreduce(list(self._inputs), self.schedule, compression=self._ks[0])
            self.runs.append(r)
            self._outputs = list(r.results)
        except BaseException as e:  # noqa: B036 - handed to every rank
            self._error = e

    def backend(self, rank: int) -> _GroupRank:
        """Rank ``rank``'s backend (``nodes``, ``rank``, ``allreduce``). Raises ValueError off the range."""
        if not 0 <= rank < self.nodes:
            raise ValueError(f"rank must be in 0 … {self.nodes - 1}, not {rank}")
        return _GroupRank(self, rank)


class _GroupRank:
    def __init__(self, group: EngineGroup, rank: int):
        self.group, self.rank, self.nodes = group, rank, group.nodes

    def allreduce(self, array: np.ndarray, compression: int | None = None) -> np.ndarray:
        """This rank's result of the group's next allreduce (blocks until every rank has called).
        Raises ValueError (every rank) if the ranks' ``compression`` differ, or one the engines cannot
        take (:meth:`FastEngineSim.allreduce <wirereduce.sim.engines.fastengine.FastEngineSim.allreduce>`)."""
        _name, array = _as_format(array, "EngineGroup")
        g = self.group
        g._inputs[self.rank] = array
        g._ks[self.rank] = compression
        g._barrier.wait()
        if g._error is not None:
            raise g._error
        return g._outputs[self.rank]


class RankBackend:
    """The rank's own schedule engine through :class:`wirereduce.host.rank.EngineRankDriver`.

    Parameters
    ----------
    driver : wirereduce.host.rank.EngineRankDriver
        Built on the rank's transport (its ``rank``/``nodes`` are used).
    transport : optional
        Closed by :meth:`close`.
    """

    def __init__(self, driver, transport=None):
        self.driver = driver
        self.transport = transport
        self.nodes = driver.nodes
        self.rank = driver.rank
        # one event loop for every bucket: the transport's asyncio objects are bound to the loop that
        # first used them (EngineRankDriver.allreduce's asyncio.run makes a new loop per call)
        self._loop = None

    def allreduce(self, array: np.ndarray, compression: int | None = None) -> np.ndarray:
        """``allreduce_async`` of the backend's driver on this backend's event loop: the schedule's
        reduction in its table order (:class:`~wirereduce.host.rank.EngineRankDriver`). Raises
        ChunksLost/TimeoutError/DriverError. Call from one thread at a time; TypeError for a bucket
        in no supported format."""
        import asyncio

        name, array = _as_format(array, "RankBackend")
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        array = np.ascontiguousarray(array).reshape(-1)
        return self._loop.run_until_complete(self.driver.allreduce_async(array, compression))

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None
        if self.transport is not None:
            self.transport.close()


class CheckedBackend:
    """``backend``'s sums, each compared bit for bit with ``reference``'s (e.g. a node's against
    :class:`LoopbackBackend`'s golden model); raises RuntimeError naming the differing elements.

    Both must be called at every rank in the same order (the reference's collectives too)."""

    def __init__(self, backend, reference):
        _check_backend(backend)
        _check_backend(reference)
        if (backend.nodes, backend.rank) != (reference.nodes, reference.rank):
            raise ValueError(f"backend is rank {backend.rank} of {backend.nodes}, "
                             f"reference rank {reference.rank} of {reference.nodes}")
        self.backend, self.reference = backend, reference
        self.nodes, self.rank = backend.nodes, backend.rank
        self.checked = 0

    def allreduce(self, array: np.ndarray, compression: int | None = None) -> np.ndarray:
        got = np.asarray(self.backend.allreduce(array, compression=compression))
        want = np.asarray(self.reference.allreduce(array, compression=compression))
        same = got.shape == want.shape and got.dtype == want.dtype
        bad = np.flatnonzero(_bits(got) != _bits(want)) if same else [0]
        if len(bad):
            raise RuntimeError(f"rank {self.rank}: allreduce {self.checked}: {len(bad)} of {want.size} elements "
                               f"differ from the reference (first at {bad[0]})")
        self.checked += 1
        return got

    def close(self) -> None:
        for b in (self.backend, self.reference):
            if hasattr(b, "close"):
                b.close()


def backend_from_env(env=None, *, barrier=None, config=None) -> RankBackend:
    """A :class:`RankBackend` on the rank's node, from the environment.

    ``WIREREDUCE_RANK``, ``WIREREDUCE_NODES`` (default: torch.distributed's rank and world size when
    initialised) and one of ``WIREREDUCE_IFACE`` (raw Ethernet on that interface: root or
    CAP_NET_RAW; ``WIREREDUCE_NODE_MAC`` optional), ``WIREREDUCE_XDMA`` (the XDMA device prefix of
    a VC709 running the PCIe top, e.g. ``/dev/xdma0``: Xilinx's ``xdma`` driver) or
    ``WIREREDUCE_UNIX`` (the socket directory of ``wirereduce sim serve --unix``; with
    ``WIREREDUCE_DMA=1`` its nodes' DMA sockets, raw frames as over PCIe); ``WIREREDUCE_TIMEOUT``
    seconds per receive (default 2).
    The driver is an :class:`~wirereduce.host.rank.EngineRankDriver` running ``WIREREDUCE_TOPOLOGY``'s
    ``WIREREDUCE_ALGORITHM`` (``sim serve --topology``; ``WIREREDUCE_NODES`` then defaults to the
    topology's nodes), or without them the NTT ring schedule on a ring of ``WIREREDUCE_NODES``
    engines (``sim serve --nodes N``); buckets may be fp32, bf16 or fp16. ``WIREREDUCE_RETRIES`` = N
    (torch.distributed initialised; default 0): a bucket whose results stop coming has its lost chunks summed again,
    up to N times, the ranks agreeing on them with ``all_gather_object`` on a gloo group
    (``EngineRankDriver(retries=N)``; bit-exact); set ``WIREREDUCE_TIMEOUT`` low enough that a
    stall is noticed in time, and the same N at every rank. ``WIREREDUCE_MULTIRING_ROOTS`` = R (with
    ``WIREREDUCE_ALGORITHM=multiring``): R roots per Hamiltonian ring and direction;
    ``WIREREDUCE_CHUNK_BYTES`` = ``B`` or ``B,B,...``: chunks of at most B payload bytes, or a chunk
    profile, one size per round of chunks (``EngineRankDriver(chunk_words=…)``; uncompressed buckets
    only: a compressed allreduce then raises ValueError before sending). Both the same at every rank,
    as ``rank allreduce --multiring-roots/--chunk-bytes`` (docs/architecture.md "Chunk profiles").

    Parameters
    ----------
    barrier : callable, optional
        The start barrier between CONTROL and the first push (``EngineRankDriver(barrier=…)``); default:
        ``torch.distributed.barrier`` on a gloo group of its own when torch.distributed is initialised.
    config : wirereduce.config.EngineConfig, optional
        How the engines were built (default: what ``sim serve`` builds by default,
        :func:`~wirereduce.host.rank.served_engine_config`; ``codec=True`` for compressed buckets).

    Raises
    ------
    ValueError
        If the variables are missing or malformed.
    RuntimeError
        If the per-rank driver (wirereduce.host.rank) is not in this installation.
    """
    env = os.environ if env is None else env
    try:
        from wirereduce.host.rank import EngineRankDriver
        from wirereduce.host.transports.base import open_transport
    except ImportError as e:  # pragma: no cover - before the per-rank driver existed
        raise RuntimeError("this wirereduce has no per-rank driver (wirereduce.host.rank)") from e
    iface, unix, xdma = env.get(ENV_IFACE), env.get(ENV_UNIX), env.get(ENV_XDMA)
    if sum(v is not None for v in (iface, unix, xdma)) != 1:
        raise ValueError(f"set exactly one of {ENV_IFACE} (raw Ethernet interface), {ENV_XDMA} (the PCIe top's "
                         f"XDMA devices, e.g. /dev/xdma0) or {ENV_UNIX} (wirereduce sim serve --unix DIR)")
    dma = env.get(ENV_DMA, "0")
    if dma not in ("0", "1"):
        raise ValueError(f"{ENV_DMA} must be 0 or 1, not {dma!r}")
    if dma == "1" and unix is None:
        raise ValueError(f"{ENV_DMA}=1 reaches the DMA sockets of `sim serve --unix DIR`: set {ENV_UNIX} too")
    dist = None
    try:
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            dist = None
    except ImportError:  # pragma: no cover
        pass

    def number(name, default):
        v = env.get(name)
        if v is None:
            if default is None:
                raise ValueError(f"set {name}")
            return default
        try:
            return int(v)
        except ValueError:
            raise ValueError(f"{name} must be an integer, not {v!r}") from None

    topology, algorithm = env.get(ENV_TOPOLOGY), env.get(ENV_ALGORITHM)
    if (topology is None) != (algorithm is None):
        raise ValueError(f"set both {ENV_TOPOLOGY} and {ENV_ALGORITHM} (the schedule the engines run), or neither "
                         f"(a ring of {ENV_NODES} engines running the NTT ring schedule)")
    from wirereduce import schedule as sched
    from wirereduce.config import EngineConfig

    schedule = None
    roots = env.get(ENV_MULTIRING_ROOTS)
    if roots is not None:
        if algorithm != "multiring":
            raise ValueError(f"{ENV_MULTIRING_ROOTS} sets the multiring schedule's roots: it needs "
                             f"{ENV_ALGORITHM}=multiring, not {algorithm!r}")
        roots = number(ENV_MULTIRING_ROOTS, None)
    if topology is not None:   # ValueError on a bad name or roots
        schedule = sched.build(topology, algorithm, **({} if roots is None else {"roots": roots}))
    rank = number(ENV_RANK, dist.get_rank() if dist else None)
    default_nodes = schedule.nodes if schedule is not None else (dist.get_world_size() if dist else None)
    nodes = number(ENV_NODES, default_nodes)
    if schedule is None:
        if not 2 <= nodes <= 255:
            raise ValueError(f"{ENV_NODES} must be a ring size from 2 to 255, not {nodes}")
        schedule = sched.build(f"ring:{nodes}", "ring")
    if nodes != schedule.nodes:
        raise ValueError(f"{ENV_NODES}={nodes} but {schedule.topology.name} has {schedule.nodes} nodes")
    if config is None:
        from wirereduce.host.rank import served_engine_config

        config = served_engine_config(schedule.topology.name)
    if not isinstance(config, EngineConfig):
        raise ValueError(f"the engines' config must be an EngineConfig, not {config!r}")
    try:
        timeout = float(env.get(ENV_TIMEOUT, "2"))
    except ValueError:
        raise ValueError(f"{ENV_TIMEOUT} must be seconds, not {env.get(ENV_TIMEOUT)!r}") from None
    chunk_words = None
    if (text := env.get(ENV_CHUNK_BYTES)) is not None:
        from wirereduce.host.engine import chunk_words_of_bytes, parse_chunk_bytes

        try:
            chunk_words = chunk_words_of_bytes(parse_chunk_bytes(text), config.mtu)
        except ValueError as e:
            raise ValueError(f"{ENV_CHUNK_BYTES}: {e}") from None
    retries = number(ENV_RETRIES, 0)
    if retries < 0:
        raise ValueError(f"{ENV_RETRIES} must be ≥ 0, not {retries}")
    if retries and dist is None:
        raise ValueError(f"{ENV_RETRIES} needs torch.distributed initialised: the ranks agree on the lost chunks "
                         f"with all_gather_object on a gloo group")
    group = None
    if dist is not None and (barrier is None or retries):
        group = dist.new_group(backend="gloo")
    if barrier is None and dist is not None:
        barrier = lambda: dist.barrier(group=group)  # noqa: E731

    def exchange(value):
        """Every rank's missing chunks (EngineRankDriver's retries), over the gloo group."""
        out = [None] * nodes
        dist.all_gather_object(out, value, group=group)
        return out
    transport = open_transport(rank, nodes, interface=iface, unix=unix, xdma=xdma, dma=dma == "1",
                               node_mac=env.get(ENV_NODE_MAC), mtu=config.mtu, timeout=timeout)
    try:
        driver = EngineRankDriver(transport, rank, schedule, config, barrier=barrier, retries=retries,
                                  exchange=exchange if retries else None, chunk_words=chunk_words)
    except ValueError:
        transport.close()
        raise
    return RankBackend(driver, transport)
