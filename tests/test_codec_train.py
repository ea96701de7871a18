"""Tests of wirereduce.sim.workloads.codec_train: training the demo CNN through the compressed golden ring."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from wirereduce.sim.golden import codec as GC  # noqa: E402
from wirereduce.sim.golden.allreduce import ring_allreduce  # noqa: E402
from wirereduce.sim.workloads import codec_train as CT  # noqa: E402
from wirereduce.sim.workloads import gradients as G  # noqa: E402

from wirereduce import codec as C  # noqa: E402

RECORD_FIELDS = {
    "k", "seed", "workers", "epochs", "batch", "lr", "steps", "final_accuracy", "best_accuracy",
    "baseline_final_accuracy", "delta_vs_baseline", "epochs_to_reach_baseline", "accuracy_curve", "loss_curve",
    "mean_compression_ratio", "ratio_curve", "tag_fractions", "max_abs_error", "seconds",
}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _manual_weights(allreduce, epochs: int, workers: int = 4, seed: int = 0, batch: int = 64) -> np.ndarray:
    """Final weights of the plain data-parallel loop of sim.gradients with the given allreduce."""
    run = G._DataParallel(workers, seed, batch)
    for _ in range(epochs * run.steps_per_epoch):
        grads, _losses = run.gradients()
        run.apply_sum(allreduce(grads), G.DEFAULT_LR)
    return torch.cat([p.detach().reshape(-1) for p in run.model.parameters()]).numpy()


@pytest.fixture(scope="module")
def baseline2():
    return CT.train_compressed(None, epochs=2)


def test_uncompressed_is_the_plain_training_path_bit_for_bit(baseline2):
    res = baseline2
    ref = G.train_data_parallel(4, 2, ring_allreduce)
    assert res["accuracy_curve"] == [r["test_accuracy"] for r in ref]
    assert res["loss_curve"] == [r["train_loss"] for r in ref]
    want = _manual_weights(ring_allreduce, epochs=2)
    assert res["weights"].dtype == np.float32 and res["weights"].shape == (3818,)
    assert np.array_equal(res["weights"].view(np.uint32), want.view(np.uint32))
    assert res["k"] is None and res["steps"] == 12 and res["epochs"] == 2 and res["workers"] == 4
    assert res["mean_compression_ratio"] == 1.0 and res["tag_fractions"] is None and res["max_abs_error"] == 0.0
    assert res["final_accuracy"] == res["accuracy_curve"][-1] and res["best_accuracy"] == max(res["accuracy_curve"])


def test_compressed_run_sums_with_the_golden_compressed_ring(monkeypatch):
    calls = []
    golden = GC.ring_allreduce_compressed

    def spy(arrays, k):
        calls.append(k)
        return golden(arrays, k)

    monkeypatch.setattr(GC, "ring_allreduce_compressed", spy)
    res = CT.train_compressed(8, epochs=1)
    assert calls == [8] * res["steps"] and res["steps"] == 6
    monkeypatch.undo()
    want = _manual_weights(lambda g: GC.ring_allreduce_compressed(g, 8), epochs=1)
    assert np.array_equal(res["weights"].view(np.uint32), want.view(np.uint32))
    # every hop quantizes with error < 2**-k, so the N-hop sum is off by less than N * 2**-k
    assert 0 < res["max_abs_error"] < 4 * 2.0**-8
    assert sum(res["tag_fractions"]) == pytest.approx(1.0)


def test_large_k_stays_very_close_to_uncompressed(baseline2):
    res = CT.train_compressed(24, epochs=2)
    diff = np.abs(res["weights"].astype(np.float64) - baseline2["weights"])
    assert 0 < diff.max() < 1e-4
    assert np.allclose(res["loss_curve"], baseline2["loss_curve"], rtol=1e-4)
    assert np.allclose(res["accuracy_curve"], baseline2["accuracy_curve"], atol=2 / 359)
    assert res["max_abs_error"] < 4 * 2.0**-24


def test_compression_ratio_is_the_ring_ratio_of_the_real_gradients():
    # a batch as large as the shard (359 samples) makes one step per epoch
    res = CT.train_compressed(10, epochs=1, batch=1000)
    assert res["steps"] == 1 and res["batch"] == 359
    grads = G.shard_gradients(nodes=4, steps=0, seed=0, batch=359)
    payloads = GC.ring_payloads(grads, 10)
    raw = sum(4 * p.size for p in payloads)
    comp = sum(C.encoded_size(p, 10) for p in payloads)
    assert res["mean_compression_ratio"] == pytest.approx(raw / comp, rel=1e-12)
    assert res["ratio_curve"] == [res["mean_compression_ratio"]]


def test_epochs_to_reach():
    assert CT.epochs_to_reach([0.5, 0.9, 0.95, 0.93], 0.93) == 3
    assert CT.epochs_to_reach([0.5, 0.9], 0.9) == 2
    assert CT.epochs_to_reach([0.5, 0.9], 0.95) is None


def test_run_experiment_writes_json_and_png(tmp_path, capsys):
    records = CT.run_experiment(ks=(8, 12), epochs=2, out_dir=tmp_path / "out", name="ct", seeds=(0,))
    out = capsys.readouterr().out
    json_path, png_path = tmp_path / "out" / "ct.json", tmp_path / "out" / "ct.png"
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(json_path.read_text())
    assert [r["k"] for r in data] == [None, 8, 12] == [r["k"] for r in records]
    base = data[0]["final_accuracy"]
    for r in data:
        assert set(r) == RECORD_FIELDS
        assert r["epochs"] == 2 and r["workers"] == 4 and r["seed"] == 0
        assert len(r["accuracy_curve"]) == len(r["loss_curve"]) == len(r["ratio_curve"]) == 2
        assert r["final_accuracy"] == r["accuracy_curve"][-1]
        assert r["baseline_final_accuracy"] == base
        assert r["delta_vs_baseline"] == pytest.approx(r["final_accuracy"] - base)
        assert r["epochs_to_reach_baseline"] == CT.epochs_to_reach(r["accuracy_curve"], base)
    assert data[0]["epochs_to_reach_baseline"] is not None and data[0]["mean_compression_ratio"] == 1.0
    assert data[1]["mean_compression_ratio"] > data[2]["mean_compression_ratio"] > 1.0  # coarser k, smaller
    for word in ("fp32", "2^-8", "2^-12", "epochs to fp32 final", str(json_path)):
        assert word in out


def test_run_experiment_several_seeds_prints_a_summary(tmp_path, capsys):
    records = CT.run_experiment(ks=(10,), epochs=1, out_dir=tmp_path, name="s", seeds=(0, 1))
    assert [(r["seed"], r["k"]) for r in records] == [(0, None), (0, 10), (1, None), (1, 10)]
    assert records[3]["baseline_final_accuracy"] == records[2]["final_accuracy"]
    out = capsys.readouterr().out
    assert "mean over 2 seeds" in out and "sd Δ" in out
    assert (tmp_path / "s.png").exists()


@pytest.mark.parametrize("ks", [(8, 3), (25,), (None,), (8.5,), (True,), (8, 8)])
def test_bad_k_raises_before_training(tmp_path, monkeypatch, ks):
    def boom(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(CT, "train_compressed", boom)
    with pytest.raises(ValueError):
        CT.run_experiment(ks=ks, epochs=1, out_dir=tmp_path / "out", verbose=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("k", [3, 25, 10.0, True, "8"])
def test_train_compressed_bad_k_raises_before_training(monkeypatch, k):
    def boom(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(G, "_DataParallel", boom)
    with pytest.raises(ValueError, match="k"):
        CT.train_compressed(k, epochs=1)


@pytest.mark.parametrize("kwargs", [{"workers": 1}, {"epochs": 0}, {"seed": -1}, {"batch": 0}, {"lr": -0.1}])
def test_train_compressed_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        CT.train_compressed(8, **kwargs)


def test_run_experiment_bad_name(tmp_path):
    with pytest.raises(ValueError, match="name"):
        CT.run_experiment(epochs=1, out_dir=tmp_path, name="a/b", verbose=False)


def test_workload_codec_train_command(tmp_path, capsys):
    """``wirereduce workload codec-train``: run_experiment's JSON and PNG; a bad k is a one-line user error."""
    from wirereduce.cli import main

    assert main(["workload", "codec-train", "--epochs", "1", "--k", "12", "--seeds", "3",
                 "--out-dir", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "codec-training.json").read_text())
    assert [(r["seed"], r["k"]) for r in data] == [(3, None), (3, 12)] and (tmp_path / "codec-training.png").exists()
    assert main(["workload", "codec-train", "--k", "3", "--out-dir", str(tmp_path / "x")]) == 2
    assert "wirereduce: error:" in capsys.readouterr().err and not (tmp_path / "x").exists()
