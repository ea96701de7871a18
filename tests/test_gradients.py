"""Tests of wirereduce.sim.workloads.gradients: real CNN gradients of data-parallel training on digits."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from wirereduce.sim.workloads import gradients as G  # noqa: E402

PARAMS = 3818


def _bits(arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [a.view(np.uint32) for a in arrays]


def numpy_sum(grads: list[np.ndarray]) -> np.ndarray:
    return np.sum(np.stack(grads), axis=0, dtype=np.float32)


@pytest.fixture(scope="module")
def grads4() -> list[np.ndarray]:
    return G.shard_gradients(nodes=4, steps=0, seed=0)


def test_digits_data_shapes_and_scaling():
    X_train, y_train, X_test, y_test = G.digits_data(0)
    assert X_train.dtype == np.float32 and X_test.dtype == np.float32
    assert X_train.shape[1:] == (1, 8, 8) and X_test.shape[1:] == (1, 8, 8)
    assert len(X_train) == len(y_train) and len(X_test) == len(y_test)
    assert len(X_train) + len(X_test) == 1797
    assert 0.0 <= X_train.min() and X_train.max() <= 1.0 and X_train.max() == 1.0
    assert set(np.unique(y_train)) == set(range(10)) and set(np.unique(y_test)) == set(range(10))
    # a different seed gives a different split of the same images
    X2, _, _, _ = G.digits_data(1)
    assert X2.shape == X_train.shape and not np.array_equal(X2, X_train)


def test_model_parameter_count_and_seeded_init():
    m0, m0b, m1 = G.make_model(0), G.make_model(0), G.make_model(1)
    assert G.parameter_count(m0) == PARAMS < 20_000
    for a, b in zip(m0.parameters(), m0b.parameters(), strict=True):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(m0.parameters(), m1.parameters(), strict=True))
    out = m0(torch.zeros(2, 1, 8, 8))
    assert out.shape == (2, 10)


def test_make_model_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    G.make_model(7)
    assert torch.equal(torch.rand(3), expected)


def test_shard_gradients_shapes_finite_nonzero_distinct(grads4):
    assert len(grads4) == 4
    for g in grads4:
        assert g.dtype == np.float32 and g.shape == (PARAMS,)
        assert np.all(np.isfinite(g))
        assert np.linalg.norm(g) > 0
    for i in range(4):
        for j in range(i + 1, 4):
            assert not np.array_equal(grads4[i], grads4[j])


def test_shard_gradients_deterministic(grads4):
    again = G.shard_gradients(nodes=4, steps=0, seed=0)
    for a, b in zip(_bits(grads4), _bits(again), strict=True):
        np.testing.assert_array_equal(a, b)
    trained_a = G.shard_gradients(nodes=3, steps=2, seed=5, batch=32)
    trained_b = G.shard_gradients(nodes=3, steps=2, seed=5, batch=32)
    for a, b in zip(_bits(trained_a), _bits(trained_b), strict=True):
        np.testing.assert_array_equal(a, b)


def test_seed_and_steps_change_gradients(grads4):
    other_seed = G.shard_gradients(nodes=4, steps=0, seed=1)
    after = G.shard_gradients(nodes=4, steps=3, seed=0)
    for g0, g1, g3 in zip(grads4, other_seed, after, strict=True):
        assert not np.array_equal(g0, g1)
        assert not np.array_equal(g0, g3)
        assert g3.dtype == np.float32 and g3.shape == (PARAMS,) and np.all(np.isfinite(g3))


def test_single_node_and_small_shards():
    (g,) = G.shard_gradients(nodes=1)
    assert g.shape == (PARAMS,)
    many = G.shard_gradients(nodes=100, batch=64)  # shards of 14 samples < batch: used whole
    assert len(many) == 100 and all(x.shape == (PARAMS,) for x in many)


def test_flat_gradients_round_trip():
    model = G.make_model(0)
    X, y, _, _ = G.digits_data(0)
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(X[:32])), torch.from_numpy(y[:32]))
    loss.backward()
    flat = G.flat_gradients(model)
    assert flat.dtype == np.float32 and flat.shape == (PARAMS,)
    expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy()
    np.testing.assert_array_equal(flat.view(np.uint32), expected.view(np.uint32))

    before = [p.detach().clone() for p in model.parameters()]
    G.apply_flat_gradient(model, flat, lr=0.25)
    offset = 0
    for p, p0 in zip(model.parameters(), before, strict=True):
        n = p.numel()
        step = torch.from_numpy(flat[offset : offset + n]).view_as(p)
        torch.testing.assert_close(p.detach(), p0 - 0.25 * step, rtol=0, atol=1e-7)
        offset += n

    # a zero learning rate is an exact no-op
    after = [p.detach().clone() for p in model.parameters()]
    G.apply_flat_gradient(model, flat, lr=0.0)
    for p, a in zip(model.parameters(), after, strict=True):
        assert torch.equal(p, a)


def test_flat_gradients_missing_grad_is_zero():
    flat = G.flat_gradients(G.make_model(0))
    assert flat.shape == (PARAMS,) and not flat.any()


def test_evaluate_range():
    model = G.make_model(0)
    _, _, X_test, y_test = G.digits_data(0)
    acc = G.evaluate(model, X_test, y_test)
    assert 0.0 <= acc <= 1.0
    assert model.training
    with pytest.raises(ValueError):
        G.evaluate(model, X_test, y_test[:-1])


def test_train_data_parallel_learns():
    calls = []

    def allreduce(grads):
        calls.append(len(grads))
        assert all(g.dtype == np.float32 and g.shape == (PARAMS,) for g in grads)
        return numpy_sum(grads)

    records = G.train_data_parallel(nodes=4, epochs=2, allreduce=allreduce, seed=0, batch=16)
    assert [r["epoch"] for r in records] == [1, 2]
    assert set(calls) == {4} and len(calls) == 2 * -(-(1438 // 4) // 16)
    assert records[-1]["test_accuracy"] > 0.5
    assert records[-1]["train_loss"] < records[0]["train_loss"]
    again = G.train_data_parallel(nodes=4, epochs=2, allreduce=numpy_sum, seed=0, batch=16)
    assert again == records


def test_train_matches_shard_gradients():
    """The first step of training uses exactly the gradients shard_gradients reports."""
    seen = []

    def allreduce(grads):
        seen.append([g.copy() for g in grads])
        return numpy_sum(grads)

    G.train_data_parallel(nodes=3, epochs=1, allreduce=allreduce, seed=2, batch=64, lr=G.DEFAULT_LR)
    for step in (0, 2):
        expected = G.shard_gradients(nodes=3, steps=step, seed=2, batch=64)
        for a, b in zip(_bits(seen[step]), _bits(expected), strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"nodes": 0},
        {"nodes": -2},
        {"nodes": 10_000},
        {"steps": -1},
        {"seed": -1},
        {"batch": 0},
        {"nodes": 2.5},
        {"nodes": True},
    ],
)
def test_shard_gradients_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        G.shard_gradients(**kwargs)


def test_other_bad_arguments():
    model = G.make_model(0)
    with pytest.raises(ValueError, match="parameters"):
        G.apply_flat_gradient(model, np.zeros(PARAMS - 1, np.float32), lr=0.1)
    with pytest.raises(ValueError, match="1-D"):
        G.apply_flat_gradient(model, np.zeros((2, PARAMS), np.float32), lr=0.1)
    with pytest.raises(ValueError, match="lr"):
        G.apply_flat_gradient(model, np.zeros(PARAMS, np.float32), lr=-1.0)
    with pytest.raises(ValueError, match="lr"):
        G.apply_flat_gradient(model, np.zeros(PARAMS, np.float32), lr=float("nan"))
    with pytest.raises(ValueError):
        G.make_model(-1)
    with pytest.raises(ValueError):
        G.digits_data(-1)
    with pytest.raises(ValueError, match="epochs"):
        G.train_data_parallel(2, -1, numpy_sum)
    with pytest.raises(ValueError, match="nodes"):
        G.train_data_parallel(0, 1, numpy_sum)
    with pytest.raises(ValueError, match="callable"):
        G.train_data_parallel(2, 1, None)
    with pytest.raises(ValueError, match="shape"):
        G.train_data_parallel(2, 1, lambda grads: grads[0][:-1])


def test_workload_gradients_command_writes_npz(tmp_path, capsys):
    """``wirereduce workload gradients``: the arrays of shard_gradients in an .npz, one summary line."""
    from wirereduce.cli import main

    out = tmp_path / "grads.npz"
    assert main(["workload", "gradients", "--nodes", "3", "--steps", "1", "--seed", "0", "--output", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    assert f"parameters={PARAMS}" in line and "nodes=3" in line and "steps=1" in line
    with np.load(out) as npz:
        assert sorted(npz.files) == ["node0", "node1", "node2"]
        expected = G.shard_gradients(nodes=3, steps=1, seed=0)
        for i in range(3):
            assert npz[f"node{i}"].dtype == np.float32
            np.testing.assert_array_equal(npz[f"node{i}"].view(np.uint32), expected[i].view(np.uint32))
    assert main(["workload", "gradients", "--nodes", "0", "--output", str(tmp_path / "bad.npz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wirereduce: error: ") and "nodes" in err and not (tmp_path / "bad.npz").exists()


def test_import_is_cheap():
    code = "import sys, wirereduce.sim.workloads.gradients; print('torch' in sys.modules, 'sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_gradient_stream_is_consecutive_steps():
    """gradient_stream = each worker's gradients of steps 0, 1, … concatenated, cut to length."""
    P = 3818
    got = G.gradient_stream(2, 2 * P + 100, seed=1)
    assert len(got) == 2 and all(g.dtype == np.float32 and g.shape == (2 * P + 100,) for g in got)
    for step in range(3):
        want = G.shard_gradients(nodes=2, steps=step, seed=1)
        for g, w in zip(got, want):
            n = min(P, g.size - step * P)
            assert (g[step * P:step * P + n].view(np.uint32) == w[:n].view(np.uint32)).all()
    with pytest.raises(ValueError):
        G.gradient_stream(2, 0)
