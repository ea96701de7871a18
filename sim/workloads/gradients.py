"""Real deep-learning gradients for the demo: a small CNN trained data-parallel on handwritten digits.

The demo allreduces gradients that a real model produces, not random vectors. This module trains a
small convolutional network (:func:`make_model`, 3,818 float32 parameters) on scikit-learn's
handwritten-digits set (:func:`digits_data`, 1,797 8x8 grey-scale images, shipped with the package,
no download) with synchronous data-parallel SGD over ``N`` simulated workers:

* the training set is shuffled once (seeded) and split into ``N`` disjoint, equal-size shards
  (the ``n_train % N`` left-over samples are not used);
* at every step each worker computes the gradient of the mean cross-entropy loss over the next
  mini-batch of its own shard (each worker walks its shard in a fresh seeded order every pass);
* the ``N`` float32 gradients are summed (by numpy, or by the allreduce under test), divided by
  ``N`` in float32 and applied as one plain SGD step, identical on every worker, so one model
  stands for all replicas.

:func:`shard_gradients` returns the ``N`` per-worker gradients of one such step (the payload the
allreduce sums); :func:`train_data_parallel` runs whole epochs through a caller-supplied allreduce
and reports test accuracy, so an allreduce implementation can be judged by what training does
with its results.

Determinism: the same arguments give the same bits. The model is initialised under
``torch.manual_seed`` (inside :func:`torch.random.fork_rng`, so the caller's global RNG is left
alone), shuffles come from seeded :class:`numpy.random.Generator` objects, and the torch work runs
with deterministic algorithms and **one intra-op thread**: with several threads a reduction (the
mean of the loss, a convolution's weight gradient) may be split differently on machines with a
different core count, changing the last bits. Both settings are restored on return.

torch and scikit-learn are optional (``pip install -e '.[demo]'``); they are imported inside the
functions that need them, so ``import wirereduce.sim.workloads.gradients`` stays cheap.

Command line::

    wirereduce workload gradients --nodes 4 --steps 0 --seed 0 --output grads.npz

writes arrays ``node0`` .. ``node{N-1}`` (float32, 1-D) to the ``.npz`` file and prints one line
with the parameter count, node count, steps and a summary of the per-node L2 norms.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = [
    "DEFAULT_LR",
    "TEST_FRACTION",
    "digits_data",
    "make_model",
    "parameter_count",
    "flat_gradients",
    "apply_flat_gradient",
    "evaluate",
    "shard_gradients",
    "gradient_stream",
    "train_data_parallel",
]

#: Default SGD learning rate (applied to the mean of the workers' gradients).
DEFAULT_LR = 0.5
#: Fraction of the 1,797 digit images held out as the test set (stratified): 359 test, 1,438 train.
TEST_FRACTION = 0.2

_INSTALL_HINT = "pip install -e '.[demo]'"


# --------------------------------------------------------------------------------------------------
# helpers


def _require_torch() -> Any:
    """Import and return :mod:`torch`, or raise a RuntimeError that says how to install it."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            f"wirereduce.sim.workloads.gradients needs PyTorch for the demo model: {_INSTALL_HINT}"
        ) from exc
    return torch


def _require_sklearn_digits() -> Callable[..., Any]:
    """Import and return :func:`sklearn.datasets.load_digits`, or raise a RuntimeError."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            f"wirereduce.sim.workloads.gradients needs scikit-learn for the digits data set: {_INSTALL_HINT}"
        ) from exc
    return load_digits


def _check_int(name: str, value: Any, minimum: int) -> int:
    """Return ``value`` as an int, raising ValueError unless it is an integer >= ``minimum``."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_lr(lr: Any) -> float:
    """Return ``lr`` as a float, raising ValueError unless it is finite and >= 0."""
    try:
        lr = float(lr)
    except (TypeError, ValueError):
        raise ValueError(f"lr must be a real number, got {lr!r}") from None
    if not math.isfinite(lr) or lr < 0:
        raise ValueError(f"lr must be finite and >= 0, got {lr}")
    return lr


@contextlib.contextmanager
def _deterministic(torch: Any) -> Iterator[None]:
    """Run torch with one intra-op thread and deterministic algorithms; restore both afterwards."""
    threads = torch.get_num_threads()
    det = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(det, warn_only=warn_only)
        torch.set_num_threads(threads)


# --------------------------------------------------------------------------------------------------
# data and model


def digits_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Load scikit-learn's handwritten digits as image tensors, split into train and test sets.

    Parameters
    ----------
    seed : int
        Seed of the stratified train/test split (``TEST_FRACTION`` of the images are held out).

    Returns
    -------
    X_train : numpy.ndarray, float32, shape (1438, 1, 8, 8)
        Training images, one channel, pixel intensities scaled from 0..16 to [0, 1].
    y_train : numpy.ndarray, int64, shape (1438,)
        Training labels, digits 0..9.
    X_test : numpy.ndarray, float32, shape (359, 1, 8, 8)
        Test images, same scaling.
    y_test : numpy.ndarray, int64, shape (359,)
        Test labels, digits 0..9.

    Raises
    ------
    ValueError
        If ``seed`` is not a non-negative integer.
    RuntimeError
        If scikit-learn is not installed.
    """
    seed = _check_int("seed", seed, 0)
    load_digits = _require_sklearn_digits()
    digits = load_digits()
    X = (np.asarray(digits.images, dtype=np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    y = np.asarray(digits.target, dtype=np.int64)
    # A stratified split by hand (numpy only): the same fraction of every class goes to test.
    rng = np.random.default_rng([seed, 0])
    test_mask = np.zeros(len(y), dtype=bool)
    for label in range(10):
        idx = np.flatnonzero(y == label)
        idx = idx[rng.permutation(len(idx))]
        test_mask[idx[: int(round(TEST_FRACTION * len(idx)))]] = True
    train_idx = np.flatnonzero(~test_mask)
    test_idx = np.flatnonzero(test_mask)
    train_idx = train_idx[rng.permutation(len(train_idx))]
    test_idx = test_idx[rng.permutation(len(test_idx))]
    return (
        np.ascontiguousarray(X[train_idx]),
        y[train_idx],
        np.ascontiguousarray(X[test_idx]),
        y[test_idx],
    )


def make_model(seed: int = 0) -> torch.nn.Module:
    """Build the demo CNN with deterministic initial weights.

    Architecture, on (batch, 1, 8, 8) float32 images: ``Conv2d(1, 8, 3)`` -> ReLU ->
    ``Conv2d(8, 16, 3)`` -> ReLU -> flatten (16 x 4 x 4 = 256) -> ``Linear(256, 10)`` logits.
    3,818 float32 parameters (80 + 1,168 + 2,570), PyTorch's default initialisation.

    Parameters
    ----------
    seed : int
        Seed for ``torch.manual_seed``; set inside :func:`torch.random.fork_rng`, so the caller's
        global torch RNG state is unchanged.

    Returns
    -------
    torch.nn.Module
        The model (a :class:`torch.nn.Sequential`), float32, on the CPU, in training mode.

    Raises
    ------
    ValueError
        If ``seed`` is not a non-negative integer.
    RuntimeError
        If PyTorch is not installed.
    """
    seed = _check_int("seed", seed, 0)
    torch = _require_torch()
    nn = torch.nn
    with torch.random.fork_rng(devices=[]), _deterministic(torch):
        torch.manual_seed(seed)
        model = nn.Sequential(
            nn.Conv2d(1, 8, kernel_size=3),
            nn.ReLU(),
            nn.Conv2d(8, 16, kernel_size=3),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(16 * 4 * 4, 10),
        )
    return model.to(dtype=torch.float32)


def parameter_count(model: torch.nn.Module) -> int:
    """Number of scalar parameters of ``model`` (the length of :func:`flat_gradients`)."""
    return int(sum(p.numel() for p in model.parameters()))


def flat_gradients(model: torch.nn.Module) -> np.ndarray:
    """Concatenate the gradients of all parameters into one flat vector.

    Parameters
    ----------
    model : torch.nn.Module
        A model after ``backward()``. A parameter whose ``.grad`` is None contributes zeros.

    Returns
    -------
    numpy.ndarray, float32, shape (P,)
        The gradients in ``model.parameters()`` order, each flattened in C order; ``P`` is
        :func:`parameter_count`. A fresh copy: later backward passes do not change it.
    """
    torch = _require_torch()
    parts = []
    for p in model.parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        parts.append(g.detach().reshape(-1).to(dtype=torch.float32, device="cpu"))
    if not parts:
        return np.zeros(0, dtype=np.float32)
    return torch.cat(parts).numpy().astype(np.float32, copy=True)


def apply_flat_gradient(model: torch.nn.Module, flat: np.ndarray, lr: float) -> None:
    """Take one plain SGD step ``param -= lr * grad`` with the gradient given as a flat vector.

    Parameters
    ----------
    model : torch.nn.Module
        The model to update in place.
    flat : numpy.ndarray, shape (P,)
        The gradient in :func:`flat_gradients` layout; converted to float32.
    lr : float
        Learning rate, finite and >= 0.

    Raises
    ------
    ValueError
        If ``flat`` is not 1-D, its length is not the parameter count, it holds non-finite values,
        or ``lr`` is negative or not finite.
    """
    torch = _require_torch()
    lr = _check_lr(lr)
    flat = np.asarray(flat)
    if flat.ndim != 1:
        raise ValueError(f"flat gradient must be 1-D, got shape {flat.shape}")
    count = parameter_count(model)
    if flat.shape[0] != count:
        raise ValueError(f"flat gradient has {flat.shape[0]} elements, the model has {count} parameters")
    flat = np.ascontiguousarray(flat, dtype=np.float32)
    if not np.all(np.isfinite(flat)):
        raise ValueError("flat gradient contains NaN or infinite values")
    vec = torch.from_numpy(flat.copy())
    offset = 0
    with torch.no_grad(), _deterministic(torch):
        for p in model.parameters():
            n = p.numel()
            p.add_(vec[offset : offset + n].view_as(p), alpha=-lr)
            offset += n


def evaluate(model: torch.nn.Module, X: np.ndarray, y: np.ndarray) -> float:
    """Classification accuracy of ``model`` on images ``X`` with labels ``y``.

    Parameters
    ----------
    model : torch.nn.Module
        The classifier (returns (n, 10) logits).
    X : numpy.ndarray, float32, shape (n, 1, 8, 8)
        Images, scaled as by :func:`digits_data`.
    y : numpy.ndarray, integer, shape (n,)
        Labels 0..9.

    Returns
    -------
    float
        Fraction of images whose arg-max logit equals the label, in [0, 1].

    Raises
    ------
    ValueError
        If ``X`` and ``y`` are empty or their lengths differ, or ``X`` is not 4-D.
    """
    torch = _require_torch()
    X = np.asarray(X, dtype=np.float32)
    y = np.asarray(y)
    if X.ndim != 4:
        raise ValueError(f"X must have shape (n, 1, 8, 8), got {X.shape}")
    if y.ndim != 1 or len(y) != len(X):
        raise ValueError(f"y must have shape ({len(X)},), got {y.shape}")
    if len(y) == 0:
        raise ValueError("cannot evaluate on an empty set")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), _deterministic(torch):
            pred = model(torch.from_numpy(np.ascontiguousarray(X))).argmax(dim=1).numpy()
    finally:
        model.train(was_training)
    return float(np.mean(pred == y))


# --------------------------------------------------------------------------------------------------
# data-parallel training


def _numpy_allreduce(grads: Sequence[np.ndarray]) -> np.ndarray:
    """Reference allreduce: the float32 sum of the workers' gradients, in worker order."""
    total = np.array(grads[0], dtype=np.float32, copy=True)
    for g in grads[1:]:
        total += g
    return total


class _DataParallel:
    """The shared state of a synchronous data-parallel run: model, shards and batch schedule."""

    def __init__(self, nodes: int, seed: int, batch: int) -> None:
        self.torch = _require_torch()
        self.nodes = nodes
        self.X_train, self.y_train, self.X_test, self.y_test = digits_data(seed)
        n_train = len(self.y_train)
        if nodes > n_train:
            raise ValueError(f"nodes must be <= {n_train} (the training-set size), got {nodes}")
        self.model = make_model(seed)
        self.shard_size = n_train // nodes
        order = np.random.default_rng([seed, 1]).permutation(n_train)
        self.shards = [order[i * self.shard_size : (i + 1) * self.shard_size] for i in range(nodes)]
        # A shard smaller than one batch is used whole at every step.
        self.batch = min(batch, self.shard_size)
        self.steps_per_epoch = math.ceil(self.shard_size / self.batch)
        self._rngs = [np.random.default_rng([seed, 2, i]) for i in range(nodes)]
        self._orders: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * nodes
        self.step = 0

    def _batch_indices(self, worker: int) -> np.ndarray:
        """Training-set indices of ``worker``'s mini-batch at the current step."""
        pos = self.step % self.steps_per_epoch
        if pos == 0:  # a new pass over the shard, in a fresh order
            self._orders[worker] = self.shards[worker][self._rngs[worker].permutation(self.shard_size)]
        return self._orders[worker][pos * self.batch : (pos + 1) * self.batch]

    def gradients(self) -> tuple[list[np.ndarray], list[float]]:
        """Every worker's flat gradient and mean loss at the current step (the model is unchanged)."""
        torch = self.torch
        grads, losses = [], []
        with _deterministic(torch):
            for worker in range(self.nodes):
                idx = self._batch_indices(worker)
                xb = torch.from_numpy(self.X_train[idx])
                yb = torch.from_numpy(self.y_train[idx])
                self.model.zero_grad(set_to_none=True)
                loss = torch.nn.functional.cross_entropy(self.model(xb), yb)
                loss.backward()
                grads.append(flat_gradients(self.model))
                losses.append(float(loss.detach()))
        self.model.zero_grad(set_to_none=True)
        self.step += 1
        return grads, losses

    def apply_sum(self, summed: Any, lr: float) -> None:
        """Divide an allreduced (summed) gradient by the node count and apply it."""
        count = parameter_count(self.model)
        summed = np.asarray(summed)
        if summed.shape != (count,):
            raise ValueError(f"allreduce returned shape {summed.shape}, expected ({count},)")
        mean = summed.astype(np.float32, copy=False) / np.float32(self.nodes)
        apply_flat_gradient(self.model, mean, lr)


def shard_gradients(nodes: int = 4, steps: int = 0, seed: int = 0, batch: int = 64) -> list[np.ndarray]:
    """Per-worker gradients of one data-parallel training step of the demo CNN.

    The model (:func:`make_model`) is first trained ``steps`` synchronous data-parallel SGD steps
    (learning rate :data:`DEFAULT_LR`; each step every worker takes the gradient of the mean loss
    over the next ``batch`` samples of its own shard, the gradients are summed and divided by
    ``nodes`` in numpy float32 and applied). Then one more step's gradients are computed, worker
    ``i`` on shard ``i``, and returned without being applied.

    Parameters
    ----------
    nodes : int
        Number of workers ``N`` >= 1, at most the training-set size (1,438). The training set is
        shuffled (seeded) and split into ``N`` disjoint shards of ``1438 // N`` samples each.
    steps : int
        Training steps taken before the returned gradients, >= 0.
    seed : int
        Seed (>= 0) of the train/test split, the model initialisation, the sharding and the
        mini-batch order. The same arguments give bit-identical results.
    batch : int
        Mini-batch size per worker, >= 1 (samples). A shard smaller than ``batch`` is used whole.

    Returns
    -------
    list of numpy.ndarray, float32, each of shape (P,)
        ``N`` gradients, ``P`` = 3,818 (the model's parameter count), in
        :func:`flat_gradients` layout.

    Raises
    ------
    ValueError
        If an argument is not an integer in its range.
    RuntimeError
        If PyTorch or scikit-learn is not installed.
    """
    nodes = _check_int("nodes", nodes, 1)
    steps = _check_int("steps", steps, 0)
    seed = _check_int("seed", seed, 0)
    batch = _check_int("batch", batch, 1)
    return next(itertools.islice(_training_steps(nodes, seed, batch), steps, None))


def _training_steps(nodes: int, seed: int, batch: int) -> Iterator[list[np.ndarray]]:
    """The workers' gradients of step 0, 1, 2, …; each step is applied (numpy sum, then SGD) only
    when the next one is asked for, so the last gradients yielded are never applied."""
    run = _DataParallel(nodes, seed, batch)
    while True:
        grads, _losses = run.gradients()
        yield grads
        run.apply_sum(_numpy_allreduce(grads), DEFAULT_LR)


def gradient_stream(nodes: int, elements: int, seed: int = 0, batch: int = 64) -> list[np.ndarray]:
    """``nodes`` real gradient vectors of ``elements`` float32 each, for messages larger than the model.

    The demo CNN has 3,818 parameters; a bandwidth benchmark wants megabytes. This trains the
    model data-parallel (as :func:`shard_gradients`, applying every step) and concatenates each
    worker's gradient of step 0, 1, 2, … until ``elements`` values are collected (the last
    step's gradient is cut short), so the message holds the gradients of consecutive training
    steps, in order: what a worker that buckets several steps' gradients would send.

    Returns
    -------
    list of numpy.ndarray, float32, shape (elements,)

    Raises
    ------
    ValueError
        If an argument is not an integer in its range.
    RuntimeError
        If PyTorch or scikit-learn is not installed.
    """
    nodes = _check_int("nodes", nodes, 1)
    elements = _check_int("elements", elements, 1)
    seed = _check_int("seed", seed, 0)
    batch = _check_int("batch", batch, 1)
    parts: list[list[np.ndarray]] = [[] for _ in range(nodes)]
    have = 0
    for grads in _training_steps(nodes, seed, batch):
        for k, g in enumerate(grads):
            parts[k].append(g)
        have += grads[0].size
        if have >= elements:
            break
    return [np.concatenate(p)[:elements].astype(np.float32) for p in parts]


def train_data_parallel(
    nodes: int,
    epochs: int,
    allreduce: Callable[[list[np.ndarray]], np.ndarray],
    seed: int = 0,
    batch: int = 64,
    lr: float = DEFAULT_LR,
) -> list[dict[str, float | int]]:
    """Train the demo CNN data-parallel, summing the workers' gradients with ``allreduce``.

    Each step every worker computes the float32 gradient of its mini-batch (as in
    :func:`shard_gradients`, the same shards and batch order), the list of ``N`` gradients is
    passed to ``allreduce``, its result (the sum) is divided by ``nodes`` in float32 and applied
    with plain SGD. One epoch is ``ceil(shard_size / batch)`` steps, one pass over every shard.

    Parameters
    ----------
    nodes : int
        Number of workers ``N`` >= 1 (at most 1,438).
    epochs : int
        Number of epochs, >= 0.
    allreduce : callable
        ``allreduce(grads) -> summed``: ``grads`` is a list of ``N`` float32 arrays of shape (P,)
        (fresh copies; the callee may modify them), ``summed`` an array of shape (P,) (cast to
        float32). ``lambda g: np.sum(g, axis=0)`` is an exact reference.
    seed : int
        Seed (>= 0) of split, initialisation, sharding and batch order.
    batch : int
        Mini-batch size per worker, >= 1 (samples).
    lr : float
        SGD learning rate, finite and >= 0.

    Returns
    -------
    list of dict
        One record per epoch: ``"epoch"`` (int, 1-based), ``"test_accuracy"`` (float in [0, 1],
        on the 359 held-out images after the epoch) and ``"train_loss"`` (float, mean
        cross-entropy in nats over the epoch's steps and workers, measured before each update).

    Raises
    ------
    ValueError
        If an argument is out of range, ``allreduce`` is not callable, or it returns an array of
        the wrong shape.
    RuntimeError
        If PyTorch or scikit-learn is not installed.
    """
    nodes = _check_int("nodes", nodes, 1)
    epochs = _check_int("epochs", epochs, 0)
    seed = _check_int("seed", seed, 0)
    batch = _check_int("batch", batch, 1)
    lr = _check_lr(lr)
    if not callable(allreduce):
        raise ValueError(f"allreduce must be callable, got {allreduce!r}")
    run = _DataParallel(nodes, seed, batch)
    records: list[dict[str, float | int]] = []
    for epoch in range(1, epochs + 1):
        losses: list[float] = []
        for _ in range(run.steps_per_epoch):
            grads, step_losses = run.gradients()
            losses.extend(step_losses)
            run.apply_sum(allreduce(grads), lr)
        records.append(
            {
                "epoch": epoch,
                "test_accuracy": evaluate(run.model, run.X_test, run.y_test),
                "train_loss": float(np.mean(losses)),
            }
        )
    return records
