"""One process per rank over real Linux interfaces: the raw-Ethernet transport, the per-rank driver
(:class:`~wirereduce.host.rank.EngineRankDriver`) and ``wirereduce sim serve`` bridging simulated
schedule engines (``--nodes 4``: ring:4 running the NTT ring schedule) to TAP interfaces.

The system test puts each rank's TAP interface in its own network namespace (as separate
machines would be) and runs one ``wirereduce rank allreduce`` process per rank; it needs root
(network namespaces, TAP) and is skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import RECEIVE_TIMEOUT, sim_serve
from wirereduce.host.transports import packet
from wirereduce.host.transports.packet import PacketTransport, eth_frame, parse_eth_frame, strip_padding

from wirereduce.protocol import ETH_MIN_PAYLOAD_BYTES, Codec, Header, Opcode, frame

ROOT = Path(__file__).resolve().parent.parent


# ---- frames on the wire ----

def _pad(payload: bytes) -> bytes:
    return payload + bytes(max(0, ETH_MIN_PAYLOAD_BYTES - len(payload)))


@pytest.mark.parametrize("payload", [
    Header(opcode=Opcode.CONTROL, count=0xBEEF, seq=3).pack(),
    Header(opcode=Opcode.STATS_REQUEST, count=7).pack(),
    frame(Header(opcode=Opcode.HOST_RESULT, count=1), np.array([1.5], np.float32)),
    frame(Header(opcode=Opcode.HOST_RESULT, count=7), np.arange(7, dtype=np.float32)),  # 44 bytes
    frame(Header(opcode=Opcode.HOST_PUSH, count=8), np.arange(8, dtype=np.float32)),    # 48 bytes: no padding
])
def test_padding_round_trip(payload):
    """What goes out padded to the 46-byte minimum comes back as it was sent."""
    f = eth_frame(packet.node_mac(1), b"\x02\0\0\0\0\x09", payload)
    assert len(f) == 14 + max(len(payload), ETH_MIN_PAYLOAD_BYTES)
    dst, src, etype, got = parse_eth_frame(f)
    assert (dst, src, etype) == (packet.node_mac(1), b"\x02\0\0\0\0\x09", 0x88B5)
    assert got == _pad(payload)
    assert strip_padding(got) == payload


@pytest.mark.parametrize("values", [[0.0, 0.0, 0.0], [1e-3, -2.0, 0.0, 7.5], [3e38] * 7, [0.0] * 90])
def test_padding_compressed(values):
    """A compressed frame is cut back to the length its tags announce (codec.encode computes it
    independently)."""
    from wirereduce.codec import encode

    x = np.array(values, np.float32)
    payload = frame(Header(opcode=Opcode.HOST_RESULT, count=x.size, codec=Codec.INCEPTIONN_V1, eb_k=10),
                    encode(x, 10))
    assert strip_padding(_pad(payload)) == payload


def test_padding_only_genuine():
    """Only a 46-byte payload is cut."""
    long = frame(Header(opcode=Opcode.HOST_RESULT, count=1), np.array([1.0], np.float32)) + bytes(40)
    assert strip_padding(long) == long  # 60 bytes: not padding, the node's problem (drop_length)


def test_node_mac_is_the_simulated_one():
    from wirereduce.sim.cluster.network import eth_mac

    for k in (0, 3, 200):
        assert packet.node_mac(k) == eth_mac(k, 2).to_bytes(6, "big")
    assert packet.parse_mac("02:77:72:00:05:02") == packet.node_mac(5)
    with pytest.raises(ValueError, match="MAC"):
        packet.parse_mac("02:77:72")


def test_errors_before_anything_is_sent(monkeypatch):
    with pytest.raises(ValueError, match="no network interface"):
        PacketTransport("wr-no-such-if", 0, 4, mtu=1500)
    with pytest.raises(ValueError, match="rank"):
        PacketTransport("lo", 4, 4)
    with pytest.raises(ValueError, match="MTU 1500 bytes, smaller than the nodes' 9000"):
        monkeypatch.setattr(packet, "interface_mtu", lambda name: 1500)
        PacketTransport("lo", 0, 4, mtu=9000)

    def refuse(*a, **k):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(packet.socket, "socket", refuse)
    with pytest.raises(PermissionError, match=r"needs root or CAP_NET_RAW: run with sudo or setcap"):
        PacketTransport("lo", 0, 4)


@pytest.mark.parametrize("argv, message", [
    (["sim", "serve", "--nodes", "4", "--tap", "a", "b"], "2 TAP names for 4 nodes"),
    (["sim", "serve", "--nodes", "4", "--tap", "a", "b", "c", "a"], "must differ"),
    (["sim", "serve", "--nodes", "2", "--tap", "x" * 16, "b"], "not an interface name"),
    (["sim", "serve", "--nodes", "4", "--unix", "/tmp/x", "--engine", "fast"], "cannot answer frames live"),
    (["sim", "serve", "--nodes", "4"], "--tap IF0 IF1"),
    (["rank", "allreduce", "--nodes", "4", "--rank", "4", "--unix", "/tmp", "--input", "x", "--output", "y"],
     "--rank must be"),
])
def test_cli_errors_before_simulation(argv, message, capsys, tmp_path, monkeypatch):
    """Wrong arguments exit 2 with the reason before anything is built or simulated."""
    from wirereduce.sim.engines import runner

    from wirereduce.cli import main

    monkeypatch.setattr(runner, "_build", lambda *a, **k: pytest.fail("built despite a bad argument"))
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_cli_rank_bad_collective(tmp_path, capsys):
    from wirereduce.cli import main

    np.savez(tmp_path / "in.npz", **{f"node{k}": np.ones(8, np.float32) for k in range(2)})
    node = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    node.bind(str(tmp_path / "node0.sock"))
    try:
        assert main(["rank", "allreduce", "--nodes", "2", "--rank", "0", "--unix", str(tmp_path), "--input",
                     str(tmp_path / "in.npz"), "--output", str(tmp_path / "o.npy"), "--collective", "70000"]) == 2
    finally:
        node.close()
    assert "--collective" in capsys.readouterr().err


def test_unix_port_waits_for_a_slow_rank(tmp_path):
    """The server's UNIX socket to a rank that does not read for a while (its queue holds
    net.unix.max_dgram_qlen frames, 10 by default): every frame still arrives, in order, none is
    dropped and the server does not stop on EAGAIN (a loaded CI machine once lost a whole run)."""
    import threading

    from wirereduce.sim.engines.bridge import UnixPort

    port = UnixPort(0, str(tmp_path))
    rank = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rank.bind(str(tmp_path / "rank.sock"))
    rank.sendto(eth_frame(packet.node_mac(0), b"\x02\x77\x72\x00\x00\x03", b"hello"), port.path)
    assert port.read().startswith(b"hello")  # the server learns the rank's address
    frames = 60
    got = []

    def slow_reader():
        time.sleep(0.5)
        rank.settimeout(10)
        for _ in range(frames):
            got.append(parse_eth_frame(rank.recv(65536))[3])

    t = threading.Thread(target=slow_reader)
    t.start()
    for i in range(frames):
        port.write(i.to_bytes(4, "big") * 16)
    t.join()
    port.close()
    rank.close()
    assert port.dropped == 0 and port.frames_out == frames
    assert [g[:4] for g in got] == [i.to_bytes(4, "big") for i in range(frames)]


# ---- the simulated cluster behind TAP interfaces, one namespace and one process per rank ----

NODES = 4


def _run(cmd: str) -> None:
    subprocess.run(cmd, shell=True, check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """``wirereduce sim serve --nodes 4 --codec`` with 4 TAPs, each moved into its own network namespace
    (codec engines pass uncompressed frames untouched: the build tests/test_engine_deploy.py's served
    ring:4 engines use, so one build serves both)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces and TAP interfaces")
    if not shutil.which("ip") or not os.path.exists("/dev/net/tun"):
        pytest.skip("needs iproute2 (`ip`) and /dev/net/tun")
    from wirereduce.sim.engines.runner import available_simulators

    if "verilator" not in available_simulators():
        pytest.skip("needs Verilator")
    tag = f"wr{os.getpid() % 100000}"
    taps = [f"{tag}t{k}" for k in range(NODES)]
    spaces = [f"{tag}ns{k}" for k in range(NODES)]
    try:
        _run(f"ip netns add {spaces[0]}-probe && ip netns del {spaces[0]}-probe")
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot create network namespaces here: {e.stderr.decode().strip()}")
    tmp = tmp_path_factory.mktemp("deploy")
    made = []
    try:
        with sim_serve(["--nodes", str(NODES), "--codec", "--tap", *taps]) as (serve, _):
            for tap, ns in zip(taps, spaces):
                _run(f"ip netns add {ns}")
                made.append(ns)
                _run(f"ip link set {tap} netns {ns} && ip netns exec {ns} sysctl -qw net.ipv6.conf.all.disable_ipv6=1 "
                     f"&& ip -n {ns} link set {tap} up")
            yield {"taps": taps, "spaces": spaces, "tmp": tmp, "serve": serve}
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for tap in taps:  # gone with the simulator's file descriptors; make sure
            subprocess.run(["ip", "link", "del", tap], capture_output=True)


def _rank(cluster, k: int, args: list[str], script: str | None = None) -> subprocess.Popen:
    cmd = ([sys.executable, "-c", script] if script else
           [sys.executable, "-m", "wirereduce.cli", "rank", "allreduce", *args])
    return subprocess.Popen(["ip", "netns", "exec", cluster["spaces"][k], *cmd], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.cocotb
def test_four_ranks_real_gradients_bit_exact(cluster):
    """4 processes, one per rank, each in its own namespace on its own TAP: every rank gets the
    golden ring sum of real CNN gradients, bit for bit (the engines' ``ring`` schedule sums in rank
    order, as the golden ring does)."""
    gradients = pytest.importorskip("wirereduce.sim.workloads.gradients")
    from wirereduce.sim.golden.allreduce import ring_allreduce

    tmp = cluster["tmp"]
    arrays = gradients.gradient_stream(NODES, 3000, seed=3)
    np.savez(tmp / "grads.npz", **{f"node{k}": a for k, a in enumerate(arrays)})
    want = ring_allreduce(arrays)
    procs = [_rank(cluster, k, ["--nodes", str(NODES), "--rank", str(k), "--interface", cluster["taps"][k],
                                "--input", str(tmp / "grads.npz"), "--output", str(tmp / f"out{k}.npy"),
                                "--barrier", str(tmp / "barrier1"), "--collective", "1",
                                "--timeout", str(RECEIVE_TIMEOUT)])
             for k in range(NODES)]
    for k, p in enumerate(procs):
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, f"rank {k}: {out}{err}"
    for k in range(NODES):
        got = np.load(tmp / f"out{k}.npy")
        assert got.dtype == np.float32 and got.shape == want.shape
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"rank {k} differs from the golden sum"


HANG = """
import sys, time, numpy as np
from wirereduce import schedule as sched
from wirereduce.host.rank import EngineRankDriver, FileBarrier, served_engine_config
from wirereduce.host.transports.packet import PacketTransport
rank, nodes, tap, bdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
topology = f"ring:{nodes}"
barrier = FileBarrier(bdir, rank, nodes, timeout=60)
def stop_after_barrier():
    barrier()
    time.sleep(600)  # the process is killed here, its node told of the collective, its chunks never pushed
tr = PacketTransport(tap, rank, nodes, timeout=20)
EngineRankDriver(tr, rank, sched.build(topology, "ring"), served_engine_config(topology), barrier=stop_after_barrier,
                 first_collective=2).allreduce(np.ones(3000, np.float32))
"""


@pytest.mark.cocotb
def test_killed_rank_others_fail_bounded(cluster):
    """A rank process killed mid-collective: every other rank raises ChunksLost or a timeout error
    within its receive timeout, and none hangs."""
    tmp = cluster["tmp"]
    np.savez(tmp / "ones.npz", **{f"node{k}": np.ones(3000, np.float32) for k in range(NODES)})
    bdir = tmp / "barrier2"
    victim = NODES - 1
    procs = [_rank(cluster, k, ["--nodes", str(NODES), "--rank", str(k), "--interface", cluster["taps"][k],
                                "--input", str(tmp / "ones.npz"), "--output", str(tmp / f"k{k}.npy"),
                                "--barrier", str(bdir), "--collective", "2", "--timeout", "4"])
             for k in range(NODES) if k != victim]
    hang = subprocess.Popen(["ip", "netns", "exec", cluster["spaces"][victim], sys.executable, "-c", HANG,
                             str(victim), str(NODES), cluster["taps"][victim], str(bdir)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not all((bdir / f"round0.rank{k}").exists() for k in range(NODES)):
            assert time.monotonic() < deadline, "the ranks never met at the barrier"
            assert hang.poll() is None, hang.communicate()
            time.sleep(0.05)
        hang.send_signal(signal.SIGKILL)
        start = time.monotonic()
        for k, p in zip([k for k in range(NODES) if k != victim], procs):
            out, err = p.communicate(timeout=60)  # bounded: a hang fails here
            assert p.returncode == 1, f"rank {k} should have failed: {out}{err}"
            assert "ChunksLost" in err or "TimeoutError" in err, err
        assert time.monotonic() - start < 60
    finally:
        for p in [*procs, hang]:
            if p.poll() is None:
                p.kill()
            p.communicate()


def test_cocotb_builds_of_one_model_take_turns(tmp_path, monkeypatch):
    """Two processes (here threads) asking for the same cocotb model build it one after the other
    under ``build_dir/.lock``: two ``sim serve``s (the namespace fixture and the UNIX-socket test
    on another xdist worker) once built into one directory at the same time and one of them failed."""
    import threading

    from wirereduce.sim.engines import runner

    inside, most, lock = [0], [0], threading.Lock()

    def fake_build(setup, build_dir, text, digest, opt, waves):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.5)
        with lock:
            inside[0] -= 1
        return None, build_dir

    monkeypatch.setattr(runner, "_build_locked", fake_build)
    monkeypatch.setattr(runner.EngineSetup, "verilog", lambda self, inject=False: "module wirereduce_net; endmodule\n")
    setup = runner.EngineSetup(topology="ring:2", simulator="verilator")
    threads = [threading.Thread(target=runner._build, args=(setup, tmp_path, False)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads)
    assert most[0] == 1, "both builds ran at once"
    assert (tmp_path / setup.tag() / ".lock").exists()
