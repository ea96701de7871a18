"""The PyTorch DDP communication hook (wirereduce.torch) and the `wirereduce train` launcher."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'wirereduce[torch]')")
pytest.importorskip("sklearn", reason="scikit-learn (the digits data set) is not installed")

import wirereduce.torch as wrt  # noqa: E402
from wirereduce import cli  # noqa: E402
from wirereduce.codec import decode, encode  # noqa: E402
from wirereduce.config import EngineConfig, NodeConfig  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --------------------------------------------------------------------------------------------------
# the hook alone: fake buckets, a fake backend


class FakeBucket:
    def __init__(self, index, values):
        self._index, self._buf = index, torch.from_numpy(np.asarray(values, np.float32).copy())

    def index(self):
        return self._index

    def buffer(self):
        return self._buf


class ScaleBackend:
    """Records what it is sent and answers ``sent * factor`` (an independent stand-in for a ring)."""

    def __init__(self, nodes=4, factor=3.0):
        self.nodes, self.rank, self.factor, self.sent = nodes, 0, np.float32(factor), []

    def allreduce(self, array, compression=None):
        self.sent.append((array.copy(), compression))
        return (array * self.factor).astype(np.float32)


def _grad(seed, n=1000):
    rng = np.random.default_rng(seed)
    g = (rng.standard_normal(n) * rng.choice([1e-5, 1e-3, 0.05, 2.0], n)).astype(np.float32)
    g[:3] = [0.0, -0.0, 1e-30]
    return g


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("overlap", [True, False])
def test_hook_divides_the_backend_sum(overlap):
    backend = ScaleBackend(nodes=4)
    state = wrt.State(backend, overlap=overlap)
    g = _grad(1)
    out = wrt.allreduce_hook(state, FakeBucket(0, g)).wait()
    state.close()
    assert out.dtype == torch.float32 and out.shape == (g.size,)
    np.testing.assert_array_equal(bits(backend.sent[0][0]), bits(g))
    assert backend.sent[0][1] is None
    want = (g * np.float32(3)).astype(np.float32) / np.float32(4)
    np.testing.assert_array_equal(bits(out.numpy()), bits(want))


def test_error_feedback_carries_exactly_what_compression_dropped():
    k = 10
    backend = ScaleBackend(nodes=2, factor=2.0)
    state = wrt.State(backend, compress_k=k, error_feedback=True)
    g1, g2 = _grad(2), _grad(3)
    wrt.allreduce_hook(state, FakeBucket(5, g1)).wait()
    # step 1 sends g1 unchanged (compressed by the node/driver with k) and keeps g1 - decode(encode(g1))
    sent1, k1 = backend.sent[0]
    assert k1 == k
    np.testing.assert_array_equal(bits(sent1), bits(g1))
    r1 = g1 - decode(encode(g1, k), g1.size, k)
    np.testing.assert_array_equal(bits(state.residual(5)), bits(r1))
    assert np.count_nonzero(r1) > 0  # k = 10 drops something of these gradients
    # step 2 sends g2 + r1 and keeps what compression drops from that
    wrt.allreduce_hook(state, FakeBucket(5, g2)).wait()
    sent2 = backend.sent[1][0]
    np.testing.assert_array_equal(bits(sent2), bits(g2 + r1))
    np.testing.assert_array_equal(bits(state.residual(5)), bits(sent2 - decode(encode(sent2, k), g2.size, k)))
    # another bucket index starts with no residual
    wrt.allreduce_hook(state, FakeBucket(6, g2)).wait()
    np.testing.assert_array_equal(bits(backend.sent[2][0]), bits(g2))
    state.close()


def test_without_error_feedback_nothing_is_carried():
    backend = ScaleBackend(nodes=2)
    state = wrt.State(backend, compress_k=8)
    g = _grad(4)
    for _ in range(2):
        wrt.allreduce_hook(state, FakeBucket(0, g)).wait()
    np.testing.assert_array_equal(bits(backend.sent[1][0]), bits(g))
    assert state.residual(0) is None
    state.close()


def test_backend_errors_reach_the_future():
    class Broken(ScaleBackend):
        def allreduce(self, array, compression=None):
            raise TimeoutError("node 0 sent no result in time")

    state = wrt.State(Broken())
    fut = wrt.allreduce_hook(state, FakeBucket(0, _grad(5)))
    with pytest.raises(TimeoutError, match="no result"):
        fut.wait()
    state.close()


@pytest.mark.parametrize("kwargs, match", [
    (dict(dtype="int8"), "not carried"),
    (dict(dtype="bfloat16", compress_k=8), "fp32-only"),
    (dict(compress_k=3), "k"),
    (dict(compress_k=25), "k"),
    (dict(error_feedback=True), "needs compress_k"),
])
def test_bad_state_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        wrt.State(ScaleBackend(), **kwargs)


def test_bad_backend_and_bucket_raise():
    with pytest.raises(TypeError, match="allreduce"):
        wrt.State(object())
    state = wrt.State(ScaleBackend())
    bucket = FakeBucket(0, _grad(6))
    bucket._buf = bucket._buf.double()
    with pytest.raises(TypeError, match="float64"):
        wrt.allreduce_hook(state, bucket)
    bf16 = FakeBucket(1, _grad(7))
    bf16._buf = bf16._buf.to(torch.bfloat16)
    with pytest.raises(TypeError, match="State.dtype='float32'|dtype='float32'"):
        wrt.allreduce_hook(wrt.State(ScaleBackend(), dtype="float32"), bf16)
    with pytest.raises(TypeError, match="fp32-only"):
        wrt.allreduce_hook(wrt.State(ScaleBackend(), compress_k=8), bf16)
    assert state.backend.sent == []


# --------------------------------------------------------------------------------------------------
# bf16 and fp16 buckets


def _typed_grad(dtype, seed, n=1000):
    """A gradient bucket of torch ``dtype``: mixed magnitudes, ±0, subnormals of the format."""
    g = torch.from_numpy(_grad(seed, max(n, 8))).to(dtype)
    tiny = torch.finfo(dtype).tiny
    g[3:7] = torch.tensor([tiny, -tiny / 4, 0.0, -0.0], dtype=torch.float64).to(dtype)
    return g[:n].clone()


class ReverseBackend:
    """Records the arrays it is sent and answers them reversed: another array of the same format,
    so the hook's answer must be exactly ``average(reversed(sent))``."""

    def __init__(self, nodes):
        self.nodes, self.rank, self.sent = nodes, 0, []

    def allreduce(self, array, compression=None):
        self.sent.append(array.copy())
        return array[::-1].copy()


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
@pytest.mark.parametrize("nodes", [3, 4, 6])
def test_average_is_the_correctly_rounded_quotient(name, nodes):
    """bf16/fp16 ``sum / N``: checked against exact rational division rounded to nearest-even."""
    from test_lanes import exact_round, exact_value

    from wirereduce.formats import FORMATS, format_of

    f = FORMATS[{"bfloat16": "bf16", "float16": "fp16"}[name]]
    rng = np.random.default_rng(nodes)
    bits16 = rng.integers(0, 1 << 16, 4000).astype(np.uint16)
    bits16[:4] = [0, 0x8000, 1, 0x8001]                      # zeros and the smallest subnormals
    total = bits16.view(f.numpy_dtype)
    got = wrt.average(total, nodes).view(np.uint16)
    assert format_of(wrt.average(total, nodes).dtype).name == f.name
    checked = 0
    for b, r in zip(bits16.tolist(), got.tolist()):
        x = exact_value(b, f)
        if x is None:      # Inf / NaN stay Inf / NaN
            assert (r >> f.frac_bits) & ((1 << f.exp_bits) - 1) == (1 << f.exp_bits) - 1
            continue
        assert r == exact_round(x / nodes, f, zero_negative=bool(b >> 15)), hex(b)
        checked += 1
    assert checked > 3000


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_hook_carries_bf16_and_fp16_natively(dtype):
    """The bucket's bits go to the backend unchanged, in the bucket's format (half the bytes of
    fp32), and the answer comes back ÷ N in that format and dtype."""
    tdt = getattr(torch, dtype)
    state = wrt.State(ReverseBackend(3), overlap=False)
    bucket = FakeBucket(0, np.zeros(1))
    bucket._buf = _typed_grad(tdt, 8, 1001)
    out = wrt.allreduce_hook(state, bucket).wait()
    sent = state.backend.sent[0]
    assert wrt._dtype_name(sent.dtype) == dtype and sent.nbytes == 2 * 1001
    assert np.array_equal(sent.view(np.uint16), bucket._buf.view(torch.int16).numpy().view(np.uint16))
    assert out.dtype == tdt and out.shape == bucket._buf.shape
    want = wrt.average(sent[::-1].copy(), 3).view(np.uint16)
    assert np.array_equal(out.view(torch.int16).numpy().view(np.uint16), want)


@pytest.mark.parametrize("wire", ["bfloat16", "float16"])
def test_wire_dtype_rounds_reduces_and_widens(wire):
    """State(wire_dtype=…): an fp32 bucket goes to the backend rounded to the wire format (numpy /
    ml_dtypes astype: round-to-nearest-even), the backend's answer in that format is averaged in it
    and widened back to fp32 exactly."""
    import ml_dtypes

    np_wire = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}[wire]
    state = wrt.State(ReverseBackend(4), wire_dtype=wire, overlap=False)
    g = _grad(11, 1001)
    g[3:6] = [1 + 2.0 ** -8, 1 + 3 * 2.0 ** -9, 65520.0]   # a bf16 tie, a bf16 round-up, fp16 overflow
    out = wrt.allreduce_hook(state, FakeBucket(2, g)).wait()
    sent = state.backend.sent[0]
    assert sent.dtype == np_wire and sent.nbytes == 2 * g.size
    with np.errstate(over="ignore"):
        want_sent = g.astype(np_wire)
    assert np.array_equal(sent.view(np.uint16), want_sent.view(np.uint16))
    assert out.dtype == torch.float32 and out.shape == (g.size,)
    want = wrt.average(want_sent[::-1].copy(), 4).astype(np.float32)
    np.testing.assert_array_equal(bits(out.numpy()), bits(want))
    if wire == "bfloat16":   # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to even, 1
        assert float(sent[3]) == 1.0 and float(sent[4]) == 1 + 2.0 ** -7
    else:
        assert np.isinf(float(sent[5]))


@pytest.mark.parametrize("kwargs, match", [
    (dict(wire_dtype="int32"), "bfloat16' or 'float16"),
    (dict(wire_dtype="bfloat16", compress_k=10), "do not combine"),
    (dict(wire_dtype="float16", dtype="bfloat16"), "float32 buckets"),
])
def test_bad_wire_dtype_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        wrt.State(ScaleBackend(), **kwargs)


def test_wire_dtype_refuses_a_bf16_bucket():
    state = wrt.State(ReverseBackend(2), wire_dtype="bfloat16", overlap=False)
    bucket = FakeBucket(0, np.zeros(1))
    bucket._buf = torch.zeros(8, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="carries float32 buckets"):
        wrt.allreduce_hook(state, bucket)
    assert not state.backend.sent


def test_import_wirereduce_needs_no_torch():
    code = "import sys; sys.modules['torch'] = None; import wirereduce, wirereduce.torch, wirereduce.train, " \
           "wirereduce.cli; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_backend_from_env_errors():
    with pytest.raises(ValueError, match="exactly one"):
        wrt.backend_from_env({})
    with pytest.raises(ValueError, match="exactly one.*WIREREDUCE_XDMA"):
        wrt.backend_from_env({"WIREREDUCE_UNIX": "/x", "WIREREDUCE_XDMA": "/dev/xdma0"})
    with pytest.raises(ValueError, match="WIREREDUCE_DMA=1 reaches"):
        wrt.backend_from_env({"WIREREDUCE_XDMA": "/dev/xdma0", "WIREREDUCE_DMA": "1"})
    with pytest.raises(ValueError, match="WIREREDUCE_DMA must be 0 or 1"):
        wrt.backend_from_env({"WIREREDUCE_UNIX": "/x", "WIREREDUCE_DMA": "yes"})
    xdma = {"WIREREDUCE_XDMA": "/nonexistent/xdma9", "WIREREDUCE_RANK": "0", "WIREREDUCE_NODES": "2"}
    with pytest.raises(FileNotFoundError, match="no XDMA device /nonexistent/xdma9_h2c_0: load Xilinx's xdma"):
        wrt.backend_from_env(xdma)
    with pytest.raises(FileNotFoundError, match="no simulated DMA port"):
        wrt.backend_from_env({"WIREREDUCE_UNIX": "/nonexistent", "WIREREDUCE_DMA": "1", "WIREREDUCE_RANK": "0",
                              "WIREREDUCE_NODES": "2"})
    with pytest.raises(ValueError, match="WIREREDUCE_RANK"):
        wrt.backend_from_env({"WIREREDUCE_UNIX": "/nonexistent", "WIREREDUCE_RANK": "x", "WIREREDUCE_NODES": "2"})
    with pytest.raises(FileNotFoundError, match="sim serve"):
        wrt.backend_from_env({"WIREREDUCE_UNIX": "/nonexistent", "WIREREDUCE_RANK": "0", "WIREREDUCE_NODES": "2"})
    engine = {"WIREREDUCE_UNIX": "/nonexistent", "WIREREDUCE_RANK": "0"}
    with pytest.raises(ValueError, match="set both"):
        wrt.backend_from_env({**engine, "WIREREDUCE_TOPOLOGY": "ring:4"})
    with pytest.raises(ValueError, match="has 4 nodes"):
        wrt.backend_from_env({**engine, "WIREREDUCE_TOPOLOGY": "ring:4", "WIREREDUCE_ALGORITHM": "biring",
                              "WIREREDUCE_NODES": "3"})
    with pytest.raises(ValueError, match="EngineConfig"):
        wrt.backend_from_env({**engine, "WIREREDUCE_TOPOLOGY": "ring:4", "WIREREDUCE_ALGORITHM": "biring"},
                             config=NodeConfig())
    with pytest.raises(FileNotFoundError, match="sim serve"):   # the nodes default to the topology's
        wrt.backend_from_env({**engine, "WIREREDUCE_TOPOLOGY": "ring:4", "WIREREDUCE_ALGORITHM": "biring"})
    with pytest.raises(ValueError, match="needs torch.distributed"):   # retries agree over a gloo group
        wrt.backend_from_env({**engine, "WIREREDUCE_TOPOLOGY": "ring:4", "WIREREDUCE_ALGORITHM": "biring",
                              "WIREREDUCE_RETRIES": "1"})
    with pytest.raises(ValueError, match="ring size from 2 to 255"):   # no topology: a ring of NODES engines
        wrt.backend_from_env({**engine, "WIREREDUCE_NODES": "1"})
    with pytest.raises(ValueError, match="≥ 0"):
        wrt.backend_from_env({**engine, "WIREREDUCE_TOPOLOGY": "ring:4", "WIREREDUCE_ALGORITHM": "biring",
                              "WIREREDUCE_RETRIES": "-2"})
    multiring = {**engine, "WIREREDUCE_TOPOLOGY": "ring:4", "WIREREDUCE_ALGORITHM": "multiring"}
    for extra, message in (({"WIREREDUCE_ALGORITHM": "biring", "WIREREDUCE_MULTIRING_ROOTS": "2"}, "=multiring"),
                           ({"WIREREDUCE_MULTIRING_ROOTS": "3"}, "divisor"),
                           ({"WIREREDUCE_MULTIRING_ROOTS": "two"}, "integer"),
                           ({"WIREREDUCE_CHUNK_BYTES": "2000"}, "WIREREDUCE_CHUNK_BYTES: 2000 is not a chunk size"),
                           ({"WIREREDUCE_CHUNK_BYTES": "256,510"}, "multiples of 4"),
                           ({"WIREREDUCE_CHUNK_BYTES": "256,,768"}, "comma-separated")):
        with pytest.raises(ValueError, match=message):
            wrt.backend_from_env({**multiring, **extra})


def test_backend_from_env_chunk_profile_and_roots(monkeypatch):
    """WIREREDUCE_MULTIRING_ROOTS and WIREREDUCE_CHUNK_BYTES reach the rank's EngineRankDriver: the
    multiring schedule with 2 roots (4 flows on ring:4) and the profile in 32-bit words, checked
    against the served engines' MTU (a jumbo chunk is refused at MTU 1500)."""
    from wirereduce.host.transports import packet

    class Dummy:
        def close(self):
            pass

    monkeypatch.setattr(packet.PacketTransport, "unix", classmethod(lambda cls, *a, **k: Dummy()))
    env = {"WIREREDUCE_UNIX": "/nonexistent", "WIREREDUCE_RANK": "1", "WIREREDUCE_TOPOLOGY": "ring:4",
           "WIREREDUCE_ALGORITHM": "multiring"}
    d = wrt.backend_from_env(env).driver
    assert len(d.schedule.flows) == 8 and d.chunk_words is None
    profile = {"WIREREDUCE_MULTIRING_ROOTS": "2", "WIREREDUCE_CHUNK_BYTES": "256,768,1484"}
    d = wrt.backend_from_env({**env, **profile}).driver
    assert len(d.schedule.flows) == 4 and d.chunk_words == (64, 192, 371) and d.rank == 1
    assert wrt.backend_from_env({**env, "WIREREDUCE_CHUNK_BYTES": "512"}).driver.chunk_words == 128
    with pytest.raises(ValueError, match="8984"):
        wrt.backend_from_env({**env, "WIREREDUCE_CHUNK_BYTES": "9000"},
                             config=EngineConfig(ports=2, mtu=9000))


# --------------------------------------------------------------------------------------------------
# real DDP, one process per rank, gloo on localhost


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank, nodes, port, out_dir):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from wirereduce.sim.workloads.gradients import digits_data, make_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=nodes)
    X, y, _, _ = digits_data(0)
    batch = 16

    def batch_of(step):
        lo = (step * nodes + rank) * batch
        return torch.from_numpy(X[lo:lo + batch]), torch.from_numpy(y[lo:lo + batch])

    # 1. one step: the local gradients (a plain model) and DDP's averaged gradients (through the hook)
    xb, yb = batch_of(0)
    plain = make_model(0)
    torch.nn.functional.cross_entropy(plain(xb), yb).backward()
    local = {f"local{i}": p.grad.numpy().copy() for i, p in enumerate(plain.parameters())}
    state = wrt.State(wrt.LoopbackBackend())
    model = DDP(make_model(0))
    model.register_comm_hook(state, wrt.allreduce_hook)
    torch.nn.functional.cross_entropy(model(xb), yb).backward()
    avg = {f"avg{i}": p.grad.numpy().copy() for i, p in enumerate(model.parameters())}

    # 2. a short training run with the hook, and the same with DDP's own gloo allreduce
    def run(hooked):
        m = DDP(make_model(0))
        if hooked:
            m.register_comm_hook(wrt.State(wrt.LoopbackBackend()), wrt.allreduce_hook)
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        losses = []
        for step in range(12):
            xb, yb = batch_of(step)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(xb), yb)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        return np.array(losses)

    hook_losses, gloo_losses = run(True), run(False)
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), hook=hook_losses, gloo=gloo_losses, **local, **avg)
    state.close()
    dist.destroy_process_group()


@pytest.mark.parametrize("nodes", [2, 4])
def test_ddp_hook_is_the_golden_ring_sum_over_n(nodes, tmp_path):
    from wirereduce.sim.golden.allreduce import ring_allreduce

    torch.multiprocessing.spawn(_ddp_worker, args=(nodes, _free_port(), str(tmp_path)), nprocs=nodes, join=True)
    ranks = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(nodes)]
    params = sorted(k for k in ranks[0] if k.startswith("local"))
    assert len(params) == 6
    for key in params:
        i = key[len("local"):]
        shape = ranks[0][key].shape
        want = ring_allreduce([r[key].reshape(-1) for r in ranks]) / np.float32(nodes)
        for r in ranks:  # every rank holds the same averaged gradient, bit for bit
            np.testing.assert_array_equal(bits(r[f"avg{i}"].reshape(-1)), bits(want.reshape(-1)))
            assert r[f"avg{i}"].shape == shape
    # the loss falls, and follows DDP's own gloo allreduce (another summation order) to 1e-4
    hook, gloo = ranks[0]["hook"], ranks[0]["gloo"]
    assert hook[-3:].mean() < hook[:3].mean() - 0.1, hook
    np.testing.assert_allclose(hook, gloo, rtol=1e-4, atol=0)


# --------------------------------------------------------------------------------------------------
# the launcher


def test_train_cli_runs():
    r = subprocess.run([sys.executable, "-m", "wirereduce.cli", "train", "--nodes", "2", "--epochs", "1",
                        "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "epoch 1/1: loss" in r.stdout and "test accuracy" in r.stdout
    assert "             3,818 " in r.stdout and "overlap fraction" in r.stdout


@pytest.mark.parametrize("argv, match", [
    (["--nodes", "1"], "nodes"),
    (["--nodes", "17"], "nodes"),
    (["--epochs", "0"], "epochs"),
    (["--compress", "99"], "k"),
    (["--error-feedback"], "compression"),
    (["--batch", "0"], "batch"),
    (["--steps", "0"], "steps"),
    (["--backend", "gloo", "--compress", "10"], "gloo baseline"),
    (["--check"], "--backend sim"),
    (["--topology", "ring:4"], "go together"),
    (["--topology", "ring:4", "--algorithm", "biring", "--nodes", "2"], "has 4 nodes"),
    (["--topology", "ring:4", "--algorithm", "biring", "--backend", "gloo"], "--backend sim or loopback"),
    (["--topology", "ring:4", "--algorithm", "biring", "--wire-dtype", "bf16", "--compress", "10"],
     "without --compress"),
    (["--wire-dtype", "bf16", "--backend", "gloo"], "needs the wirereduce hook"),
    (["--topology", "ring:1", "--algorithm", "ring"], "--topology"),
    (["--unix", "/tmp"], "needs --backend sim"),
    (["--unix", "/nonexistent-wr", "--backend", "sim"], "no such directory"),
    (["--multiring-roots", "2"], "--multiring-roots needs --topology"),
    (["--topology", "ring:4", "--algorithm", "biring", "--multiring-roots", "2"], "needs --algorithm multiring"),
    (["--topology", "ring:4", "--algorithm", "multiring", "--multiring-roots", "3"], "divisor"),
    (["--topology", "ring:4", "--algorithm", "multiring", "--multiring-roots", "0"], "multiring_roots"),
    (["--chunk-bytes", "256"], "needs --backend sim"),
    (["--dma"], "--dma reaches the simulated boards' DMA sockets: it needs --backend sim"),
    (["--backend", "sim", "--chunk-bytes", "1400", "--compress", "10"], "1396 (the fp32 bytes a compressed frame"),
    (["--backend", "sim", "--chunk-bytes", "2000"], "--chunk-bytes: 2000"),
    (["--backend", "sim", "--chunk-bytes", "256,x"], "--chunk-bytes"),
])
def test_train_bad_arguments_fail_before_any_process(argv, match, monkeypatch, capsys):
    import wirereduce.train

    def no(*a, **k):
        raise AssertionError("a training process was started")

    monkeypatch.setattr(wirereduce.train, "train", no)
    monkeypatch.setattr(torch.multiprocessing, "spawn", no)
    assert cli.main(["train", *argv]) == 2
    assert match in capsys.readouterr().err


def test_train_passes_roots_and_chunk_profile_to_every_rank(monkeypatch):
    """``train --multiring-roots R --chunk-bytes …`` reach every rank's hook: the environment
    ``hook_env`` builds gives ``backend_from_env`` the 2-root multiring (4 flows on ring:4) and the
    profile in words; the loopback backend builds the same schedule (its golden order)."""
    from wirereduce.host.transports import packet

    from wirereduce.train import TrainConfig, hook_env

    class Dummy:
        def close(self):
            pass

    monkeypatch.setattr(packet.PacketTransport, "unix", classmethod(lambda cls, *a, **k: Dummy()))
    cfg = TrainConfig(nodes=4, backend="sim", topology="ring:4", algorithm="multiring", multiring_roots=2,
                      chunk_bytes="256, 768,1484").check()
    env = hook_env(cfg, "/nonexistent")
    assert env["WIREREDUCE_MULTIRING_ROOTS"] == "2" and env["WIREREDUCE_CHUNK_BYTES"] == "256,768,1484"
    d = wrt.backend_from_env({**env, "WIREREDUCE_RANK": "3"}).driver
    assert len(d.schedule.flows) == 4 and d.chunk_words == (64, 192, 371) and d.rank == 3
    plain = hook_env(TrainConfig(nodes=4, backend="sim").check(), "/nonexistent")
    assert "WIREREDUCE_MULTIRING_ROOTS" not in plain and "WIREREDUCE_CHUNK_BYTES" not in plain
    assert (plain["WIREREDUCE_TOPOLOGY"], plain["WIREREDUCE_ALGORITHM"]) == ("ring:4", "ring")
    loop = TrainConfig(nodes=4, topology="ring:4", algorithm="multiring", multiring_roots=2).check()
    assert loop.schedule_options() == {"roots": 2}


def test_train_bad_choice_is_an_argparse_error():
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--model", "resnet"])
    assert e.value.code == 2


def test_checked_backend_names_a_difference():
    class Off(ScaleBackend):
        def allreduce(self, array, compression=None):
            out = super().allreduce(array, compression)
            out[7] = np.nextafter(out[7], np.float32(np.inf))
            return out

    checked = wrt.CheckedBackend(Off(nodes=2), ScaleBackend(nodes=2))
    with pytest.raises(RuntimeError, match="1 of 1000 elements differ from the reference \\(first at 7\\)"):
        checked.allreduce(_grad(7))
    ok = wrt.CheckedBackend(ScaleBackend(nodes=2), ScaleBackend(nodes=2))
    ok.allreduce(_grad(7))
    assert ok.checked == 1


@pytest.mark.verilator
def test_hook_bf16_fp16_through_the_engine_gateware():
    """Four ranks in one process, each with its own State and worker thread, their bf16 and fp16
    buckets summed by four simulated schedule engines (Verilator, ``biring`` on ring:4): every rank's
    averaged bucket is the golden model's sum in the schedule's order, ÷ 4, bit for bit."""
    from fractions import Fraction

    from wirereduce.sim.engines.fastengine import FastEngineSim

    from wirereduce import schedule as sched
    from wirereduce.config import EngineConfig

    cfg = EngineConfig(64, 1500, slots=8, ports=2, max_flows=64)   # the build tests/test_engine_system.py uses
    sim = FastEngineSim("ring:4", cfg, 4, link_rate=Fraction(8, 5), host_rate=8, jitter=5, seed=3)
    schedule = sched.build("ring:4", "biring")
    group = wrt.EngineGroup(sim, schedule)
    states = [wrt.State(group.backend(k)) for k in range(4)]
    buckets = [(tdt, n) for tdt in (torch.bfloat16, torch.float16) for n in (1, 777, 3001)]
    grads = {(k, i): _typed_grad(tdt, 100 * k + i, n) for k in range(4) for i, (tdt, n) in enumerate(buckets)}
    futures = {}
    for i in range(len(buckets)):          # DDP's order: bucket by bucket, each rank on its own thread
        for k in range(4):
            b = FakeBucket(i, np.zeros(1))
            b._buf = grads[k, i]
            futures[k, i] = wrt.allreduce_hook(states[k], b)
    for i, (tdt, n) in enumerate(buckets):
        arrays = [wrt._to_numpy(grads[k, i]) for k in range(4)]
        for k in range(4):
            got = futures[k, i].wait()
            want = wrt.average(wrt.golden_sum(arrays, k, schedule), 4)
            assert got.dtype == tdt and got.shape == (n,)
            np.testing.assert_array_equal(got.view(torch.int16).numpy().view(np.uint16), want.view(np.uint16),
                                          err_msg=f"rank {k} bucket {i} ({tdt}, {n})")
    assert len(group.runs) == len(buckets)
    # half the bytes of fp32 on the wire: the 3001-element bf16 bucket is 1501 payload words
    assert group.runs[2].bytes == 2 * 3001 and group.runs[2].element_bytes == 2
    for s in states:
        s.close()


def _ddp_bf16_worker(rank, nodes, port, out_dir):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from wirereduce.sim.workloads.gradients import digits_data, make_model

    from wirereduce import schedule as sched

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=nodes)
    X, y, _, _ = digits_data(0)
    lo = rank * 16
    xb, yb = torch.from_numpy(X[lo:lo + 16]).to(torch.bfloat16), torch.from_numpy(y[lo:lo + 16])
    plain = make_model(0).to(torch.bfloat16)
    torch.nn.functional.cross_entropy(plain(xb).float(), yb).backward()
    local = {f"local{i}": p.grad.view(torch.int16).numpy().copy() for i, p in enumerate(plain.parameters())}
    # the engine's "ring" schedule: one flow, every element summed in the same order, so each
    # parameter's golden sum does not depend on where DDP put it in its bucket (biring's would)
    state = wrt.State(wrt.LoopbackBackend(schedule=sched.build(f"ring:{nodes}", "ring")))
    model = DDP(make_model(0).to(torch.bfloat16))
    model.register_comm_hook(state, wrt.allreduce_hook)
    torch.nn.functional.cross_entropy(model(xb).float(), yb).backward()
    avg = {f"avg{i}": p.grad.view(torch.int16).numpy().copy() for i, p in enumerate(model.parameters())}
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **local, **avg)
    state.close()
    dist.destroy_process_group()


def test_ddp_bf16_hook_is_the_golden_bf16_allreduce(tmp_path):
    """Real DDP on a bf16 model, 4 processes: DDP hands bf16 buckets to the hook, and every rank's
    gradient is the golden bf16 allreduce (the ring schedule's order, each add rounded to bf16) ÷ 4,
    bit for bit."""
    import ml_dtypes

    from wirereduce import schedule as sched

    nodes = 4
    torch.multiprocessing.spawn(_ddp_bf16_worker, args=(nodes, _free_port(), str(tmp_path)), nprocs=nodes, join=True)
    ranks = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(nodes)]
    schedule = sched.build(f"ring:{nodes}", "ring")
    params = sorted(k for k in ranks[0] if k.startswith("local"))
    assert len(params) == 6
    for key in params:
        i = key[len("local"):]
        arrays = [r[key].reshape(-1).view(ml_dtypes.bfloat16) for r in ranks]
        for k, r in enumerate(ranks):
            want = wrt.average(wrt.golden_sum(arrays, k, schedule), nodes)
            np.testing.assert_array_equal(r[f"avg{i}"].reshape(-1).view(np.uint16), want.view(np.uint16))
