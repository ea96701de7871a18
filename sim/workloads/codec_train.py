"""Training with the compressed allreduce: does the INCEPTIONN-style codec hurt accuracy?

INCEPTIONN (Li et al., MICRO 2018) reports that training with its lossy in-NIC gradient
compression reaches the uncompressed model's accuracy with 1–2 extra epochs. This module runs the
same kind of experiment on the project's real model: the demo CNN of
:mod:`wirereduce.sim.workloads.gradients` (3,818 parameters, scikit-learn digits) trained with synchronous
data-parallel SGD over ``workers`` simulated nodes, where every step's gradients are summed by

* :func:`wirereduce.sim.golden.codec.ring_allreduce_compressed` (codec v1, error bound ``2**-k``: each ring
  hop decompresses, adds its local gradient in fp32 and recompresses; bit-exact to the hardware), or
* :func:`wirereduce.sim.golden.ring_allreduce` for the uncompressed baseline (``k=None``: the exact
  fp32 sum in rank order, bit-exact to the uncompressed hardware ring).

Everything else is identical for every ``k`` — data split, shards, mini-batch order, initial
weights (same ``seed``) — so the allreduce is the only difference between runs. The training loop
is the one of :func:`wirereduce.sim.workloads.gradients.train_data_parallel` (sum divided by ``workers`` in
float32, plain SGD, test accuracy after every epoch); with ``k=None`` it gives the same bits.

:func:`run_experiment` trains the baseline and each ``k``, prints a table (compression ratio, final
accuracy, difference to the baseline, epochs to reach the baseline's final accuracy) and writes
``<out_dir>/<name>.json`` and ``<out_dir>/<name>.png`` (test accuracy and training loss against
epoch). Command line::

    wirereduce workload codec-train [--epochs N] [--k 8 10 12] [--seeds 0 1 2 3 4] [--out-dir D]

With several seeds (the default is 5) every seed trains the baseline and every ``k`` and is compared
with its own baseline; the table then ends with means over seeds and the plot shows mean curves.

The compression ratio is the one of :func:`wirereduce.sim.workloads.compression.compression_table`'s ``ring``
column: raw fp32 payload bytes over compressed payload bytes (headers and framing not counted) of
all ``2(N-1)`` hops of the ring — ``N-1`` reduce hops carrying the growing partial sums, ``N-1``
broadcast hops carrying the final sum — summed over every step of the run (a byte-weighted mean).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from wirereduce.sim.golden import codec as GC  # noqa: E402
from wirereduce.sim.golden.allreduce import ring_allreduce
from wirereduce.sim.workloads import gradients as G
from wirereduce.sim.workloads.gradients import _check_int

from wirereduce import codec as C

__all__ = [
    "DEFAULT_KS",
    "DEFAULT_EPOCHS",
    "DEFAULT_WORKERS",
    "DEFAULT_SEEDS",
    "train_compressed",
    "epochs_to_reach",
    "run_experiment",
    "format_table",
    "write_plot",
]

#: Error-bound exponents of the experiment (error bound 2**-k).
DEFAULT_KS = (8, 10, 12)
#: Epochs per run. The uncompressed baseline levels off at ~96.5 % test accuracy after ~40 epochs
#: (one epoch = 6 steps of 4 x 64 samples); a run takes about 2.5 s on one core.
DEFAULT_EPOCHS = 60
#: Data-parallel workers (ring nodes).
DEFAULT_WORKERS = 4
#: Seeds of the experiment. One seed is not enough: plain SGD at lr 0.5 on 359 test images is noisy
#: (one image is 0.28 points, and the final accuracy of the same configuration varies by ~1 point
#: from seed to seed; a seed also draws another train/test split), so the table ends with means over
#: seeds. 5 seeds x 4 runs take about a minute on one core.
DEFAULT_SEEDS = (0, 1, 2, 3, 4)

_CODE_BYTES = np.array(C.CODE_BYTES, dtype=np.int64)




def _check_k_or_none(k: Any) -> int | None:
    return None if k is None else C.check_k(k)


def _flat_weights(model: Any) -> np.ndarray:
    """All parameters of ``model`` as one float32 vector (``model.parameters()`` order, C order)."""
    import torch

    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().astype(np.float32, copy=True)


# --------------------------------------------------------------------------------------------------
# one training run


def train_compressed(
    k: int | None,
    workers: int = DEFAULT_WORKERS,
    epochs: int = DEFAULT_EPOCHS,
    seed: int = 0,
    batch: int = 64,
    lr: float = G.DEFAULT_LR,
) -> dict[str, Any]:
    """Train the demo CNN data-parallel with the gradients summed by the (compressed) golden ring.

    Parameters
    ----------
    k : int or None
        Error-bound exponent of codec v1, 4 ≤ k ≤ 24 (error bound ``2**-k``): the gradients are
        summed by :func:`~wirereduce.sim.golden.codec.ring_allreduce_compressed`. ``None``: uncompressed,
        :func:`~wirereduce.sim.golden.ring_allreduce`. Checked before anything else.
    workers : int
        Data-parallel workers = ring nodes, >= 2. The training set is split into ``workers``
        disjoint shards (:func:`wirereduce.sim.workloads.gradients.shard_gradients`).
    epochs : int
        Epochs, >= 1; one epoch is ``ceil((1438 // workers) / batch)`` steps.
    seed : int
        Seed (>= 0) of the data split, initial weights, sharding and mini-batch order; the same for
        every ``k`` means the runs differ only by the allreduce.
    batch : int
        Mini-batch size per worker, >= 1.
    lr : float
        SGD learning rate applied to ``sum / workers``, finite and >= 0.

    Returns
    -------
    dict
        ``k``, ``workers``, ``epochs``, ``seed``, ``batch``, ``lr``, ``steps`` (total), and

        * ``accuracy_curve`` / ``loss_curve``: per epoch, test accuracy (fraction of the 359 test
          images) after the epoch and mean training cross-entropy over its steps and workers
          (measured before each update), as in :func:`~wirereduce.sim.workloads.gradients.train_data_parallel`;
        * ``final_accuracy``, ``best_accuracy``;
        * ``mean_compression_ratio``: raw over compressed payload bytes of every ring hop of every
          step (1.0 when uncompressed); ``ratio_curve``: the same per epoch;
        * ``tag_fractions``: fraction of tags 0..3 over all hops' elements (None when uncompressed);
        * ``max_abs_error``: largest ``|compressed sum - exact fp32 ring sum|`` over all steps and
          elements (0.0 when uncompressed; below ``workers * 2**-k`` by construction);
        * ``seconds``: wall-clock time of the run;
        * ``weights``: the final parameters as one float32 vector (not JSON; for comparisons).

    Raises
    ------
    ValueError
        On an out-of-range argument (``k`` first, before any data is loaded or trained).
    RuntimeError
        If PyTorch or scikit-learn is not installed.
    """
    k = _check_k_or_none(k)
    workers = _check_int("workers", workers, 2)
    epochs = _check_int("epochs", epochs, 1)
    seed = _check_int("seed", seed, 0)
    batch = _check_int("batch", batch, 1)
    lr = G._check_lr(lr)

    t0 = time.perf_counter()
    run = G._DataParallel(workers, seed, batch)
    acc_curve: list[float] = []
    loss_curve: list[float] = []
    ratio_curve: list[float] = []
    tag_counts = np.zeros(4, dtype=np.int64)
    raw_total = comp_total = 0
    max_err = 0.0
    for _epoch in range(epochs):
        losses: list[float] = []
        raw_epoch = comp_epoch = 0
        for _ in range(run.steps_per_epoch):
            grads, step_losses = run.gradients()
            losses.extend(step_losses)
            if k is None:
                summed = ring_allreduce(grads)
            else:
                summed = GC.ring_allreduce_compressed(grads, k)
                # what the 2(N-1) ring hops carry (N-1 partial sums, N-1 copies of the final sum)
                for payload in GC.ring_payloads(grads, k):
                    t = C.tags(payload, k)
                    comp_epoch += C.tag_bytes(t.size) + int(_CODE_BYTES[t].sum())
                    raw_epoch += 4 * t.size
                    tag_counts += np.bincount(t, minlength=4)
                exact = ring_allreduce(grads)
                max_err = max(max_err, float(np.max(np.abs(summed.astype(np.float64) - exact))))
            run.apply_sum(summed, lr)
        acc_curve.append(G.evaluate(run.model, run.X_test, run.y_test))
        loss_curve.append(float(np.mean(losses)))
        ratio_curve.append(raw_epoch / comp_epoch if k is not None else 1.0)
        raw_total += raw_epoch
        comp_total += comp_epoch
    return {
        "k": k,
        "workers": workers,
        "epochs": epochs,
        "seed": seed,
        "batch": run.batch,
        "lr": lr,
        "steps": run.step,
        "accuracy_curve": acc_curve,
        "loss_curve": loss_curve,
        "final_accuracy": acc_curve[-1],
        "best_accuracy": max(acc_curve),
        "mean_compression_ratio": raw_total / comp_total if k is not None else 1.0,
        "ratio_curve": ratio_curve,
        "tag_fractions": None if k is None else (tag_counts / tag_counts.sum()).tolist(),
        "max_abs_error": max_err,
        "seconds": time.perf_counter() - t0,
        "weights": _flat_weights(run.model),
    }


# --------------------------------------------------------------------------------------------------
# the experiment


def epochs_to_reach(curve: Sequence[float], target: float) -> int | None:
    """First epoch (1-based) whose accuracy is ``>= target``, or None if none is."""
    for epoch, acc in enumerate(curve, start=1):
        if acc >= target:
            return epoch
    return None


def _label(k: int | None) -> str:
    return "fp32" if k is None else f"k={k}"


def format_table(records: Sequence[dict[str, Any]]) -> str:
    """Render :func:`run_experiment` records as a fixed-width text table (one row per run).

    With several seeds a summary per ``k`` follows: means over seeds of ratio, final accuracy and
    difference to the baseline (and the population standard deviation of that difference), how many
    seeds reached their own baseline's final accuracy, and the mean epochs to it over those seeds.
    """
    head = (f"{'seed':>4} {'k':>4} {'eb':>6} {'ratio':>7} {'final acc':>9} {'Δ vs fp32':>9} {'best acc':>8} "
            f"{'epochs to fp32 final':>20}")
    lines = [head, "-" * len(head)]
    for r in records:
        reach = r["epochs_to_reach_baseline"]
        lines.append(
            f"{r['seed']:>4} {'fp32' if r['k'] is None else r['k']:>4} "
            f"{'-' if r['k'] is None else '2^-' + str(r['k']):>6} {r['mean_compression_ratio']:>6.2f}x "
            f"{r['final_accuracy']:>9.2%} {100 * r['delta_vs_baseline']:>+8.2f}p {r['best_accuracy']:>8.2%} "
            f"{'never' if reach is None else str(reach) + ' / ' + str(r['epochs']):>20}"
        )
    seeds = sorted({r["seed"] for r in records})
    if len(seeds) > 1:
        head2 = (f"{'k':>4} {'ratio':>7} {'mean final':>10} {'mean Δ':>8} {'sd Δ':>6} {'reached':>8} "
                 f"{'mean epochs to fp32 final (seeds that reach it)':>47}")
        lines += ["", f"mean over {len(seeds)} seeds:", head2, "-" * len(head2)]
        for k in dict.fromkeys(r["k"] for r in records):
            mine = [r for r in records if r["k"] == k]
            reached = [r["epochs_to_reach_baseline"] for r in mine if r["epochs_to_reach_baseline"] is not None]
            lines.append(
                f"{'fp32' if k is None else k:>4} {np.mean([r['mean_compression_ratio'] for r in mine]):>6.2f}x "
                f"{np.mean([r['final_accuracy'] for r in mine]):>10.2%} "
                f"{100 * np.mean([r['delta_vs_baseline'] for r in mine]):>+7.2f}p "
                f"{100 * np.std([r['delta_vs_baseline'] for r in mine]):>5.2f}p "
                f"{f'{len(reached)}/{len(mine)}':>8} "
                f"{(f'{np.mean(reached):.1f}' if reached else '-'):>47}"
            )
    return "\n".join(lines)


def write_plot(path: str | Path, records: Sequence[dict[str, Any]], title: str = "") -> Path:
    """Test accuracy and training loss against epoch, one line per ``k`` and the fp32 baseline.

    With several seeds each line is the mean over seeds. Returns the path written (PNG, Agg).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = list(dict.fromkeys(r["k"] for r in records))
    fig, (ax_acc, ax_zoom, ax_loss) = plt.subplots(1, 3, figsize=(16, 4.6))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    base_final = None
    for i, k in enumerate(ks):
        mine = [r for r in records if r["k"] == k]
        acc = 100 * np.mean([r["accuracy_curve"] for r in mine], axis=0)
        loss = np.mean([r["loss_curve"] for r in mine], axis=0)
        epochs = np.arange(1, len(acc) + 1)
        if k is None:
            style = {"color": "black", "lw": 2.0, "label": "fp32 (uncompressed ring)", "zorder": 3}
            base_final = float(acc[-1])
        else:
            ratio = np.mean([r["mean_compression_ratio"] for r in mine])
            style = {"color": colours[i % len(colours)], "lw": 1.3, "label": f"k={k} (eb 2^-{k}, {ratio:.2f}x)"}
        ax_acc.plot(epochs, acc, **style)
        ax_zoom.plot(epochs, acc, **style)
        ax_loss.plot(epochs, loss, **style)
    for ax in (ax_acc, ax_zoom):
        if base_final is not None:
            ax.axhline(base_final, color="black", ls="--", lw=0.8, alpha=0.6)
        ax.set_xlabel("epoch")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    ax_acc.set_ylim(0, 100)
    ax_acc.set_title("test accuracy (dashed: fp32 final)")
    top = base_final if base_final is not None else 100 * max(r["best_accuracy"] for r in records)
    ax_zoom.set_ylim(top - 6, min(100.0, top + 2))
    ax_zoom.set_title("test accuracy, zoomed")
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("training cross-entropy (nats)")
    ax_loss.grid(True, alpha=0.3, which="both")
    ax_loss.legend(fontsize=8, loc="upper right")
    ax_loss.set_title("training loss")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {key: _jsonable(v) for key, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def run_experiment(
    ks: Sequence[int] = DEFAULT_KS,
    epochs: int = DEFAULT_EPOCHS,
    out_dir: str | Path = "bench/results",
    name: str = "codec-training",
    workers: int = DEFAULT_WORKERS,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    batch: int = 64,
    lr: float = G.DEFAULT_LR,
    verbose: bool = True,
) -> list[dict[str, Any]]:
    """Train the uncompressed baseline and one run per ``k``; write JSON and PNG; print the table.

    Parameters
    ----------
    ks : sequence of int
        Error-bound exponents, each 4 ≤ k ≤ 24, no repeats (the baseline is always run too).
    epochs, workers, batch, lr
        As :func:`train_compressed`.
    out_dir : str or Path
        Directory of the outputs (created if missing).
    name : str
        Base name: writes ``<out_dir>/<name>.json`` and ``<out_dir>/<name>.png``.
    seeds : sequence of int
        Seeds; for each, the baseline and every ``k`` are trained with that seed, and compared with
        that seed's baseline.
    verbose : bool
        Print the table (and one progress line per run) to stdout.

    Returns
    -------
    list of dict
        One record per (seed, run), the baseline first: ``k`` (None for the baseline), ``seed``,
        ``workers``, ``epochs``, ``batch``, ``lr``, ``steps``, ``final_accuracy``,
        ``best_accuracy``, ``baseline_final_accuracy``, ``delta_vs_baseline`` (final minus the
        baseline's final, a fraction), ``epochs_to_reach_baseline`` (first epoch whose accuracy is
        ≥ the baseline's final accuracy, None if never), ``accuracy_curve``, ``loss_curve``,
        ``mean_compression_ratio``, ``ratio_curve``, ``tag_fractions``, ``max_abs_error``,
        ``seconds``. The JSON file holds this list (``k`` null for the baseline).

    Raises
    ------
    ValueError
        On a bad argument, before anything is trained or written.
    """
    ks = [C.check_k(k) for k in ks]
    if len(set(ks)) != len(ks):
        raise ValueError(f"ks has repeated values: {ks}")
    epochs = _check_int("epochs", epochs, 1)
    workers = _check_int("workers", workers, 2)
    seeds = [_check_int("seed", s, 0) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be non-empty without repeats, got {seeds}")
    batch = _check_int("batch", batch, 1)
    lr = G._check_lr(lr)
    if not name or Path(name).name != name or name in (".", ".."):
        raise ValueError(f"name must be a plain file name without directories, got {name!r}")
    out_dir = Path(out_dir)
    # warm-up (torch and the data set load lazily), so that the first run's "seconds" is comparable
    n_params = G.parameter_count(G.make_model(0))
    G.digits_data(seeds[0])

    records: list[dict[str, Any]] = []
    for seed in seeds:
        runs = []
        for k in [None, *ks]:
            res = train_compressed(k, workers=workers, epochs=epochs, seed=seed, batch=batch, lr=lr)
            res.pop("weights")
            runs.append(res)
            if verbose:
                print(f"  seed {seed} {_label(k):>5}: final {res['final_accuracy']:.2%}, "
                      f"ratio {res['mean_compression_ratio']:.2f}x, {res['seconds']:.1f} s", flush=True)
        base = runs[0]["final_accuracy"]
        for res in runs:
            res["baseline_final_accuracy"] = base
            res["delta_vs_baseline"] = res["final_accuracy"] - base
            res["epochs_to_reach_baseline"] = epochs_to_reach(res["accuracy_curve"], base)
            records.append(res)

    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{name}.json"
    tmp = json_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_jsonable(records), indent=1) + "\n")
    os.replace(tmp, json_path)
    seed_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"mean of {len(seeds)} seeds"
    title = (f"demo CNN ({n_params:,} parameters) on digits, {workers} workers, "
             f"golden ring allreduce, fp32 vs codec v1 (eb 2^-k); batch {batch}/worker, lr {lr:g}, {seed_text}")
    png_path = write_plot(out_dir / f"{name}.png", records, title)
    if verbose:
        print(f"codec training: {title}; {epochs} epochs")
        print("ratio = raw / compressed payload bytes over all ring hops of the run; "
              "Δ in percentage points of test accuracy")
        print(format_table(records))
        print(f"wrote {json_path} and {png_path}")
    return records
