"""The command line's user errors: exit status 2, one clear message, nothing built or simulated."""

from __future__ import annotations

import numpy as np
import pytest

from wirereduce.cli import main

F32 = np.float32


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A scratch directory that is also the working directory, so stray default paths land here."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def _good(nodes=2, n=10, seed=0):
    rng = np.random.default_rng(seed)
    return {f"node{k}": rng.standard_normal(n).astype(F32) for k in range(nodes)}


def _sim(work, inp, nodes=2, *extra):
    return main(["sim", "allreduce", "--nodes", str(nodes), "--input", str(inp),
                 "--output", str(work / "out.npz"), "--build-dir", str(work / "b"), *extra])


def _assert_user_error(code, capsys, work, *needles):
    out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("wirereduce: error: ")
    assert len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    # nothing was built, simulated or written
    assert not (work / "b").exists()
    assert not (work / "out.npz").exists()
    assert not (work / "build").exists()
    return err


def test_missing_file(work, capsys):
    code = _sim(work, work / "nope.npz")
    _assert_user_error(code, capsys, work, "nope.npz", "does not exist")


def test_not_an_npz(work, capsys):
    bad = work / "bad.npz"
    bad.write_text("this is not a zip archive\n")
    code = _sim(work, bad)
    _assert_user_error(code, capsys, work, "bad.npz", "cannot read")


def test_npz_lacking_node1(work, capsys):
    inp = _npz(work / "in.npz", node0=np.ones(4, F32), nodeX=np.ones(4, F32))
    code = _sim(work, inp)
    _assert_user_error(code, capsys, work, "node1", "--nodes 2", "nodeX")


def test_npz_lacking_several(work, capsys):
    inp = _npz(work / "in.npz", **_good(nodes=2))
    code = _sim(work, inp, 4)
    _assert_user_error(code, capsys, work, "node2, node3")


def test_float64_arrays(work, capsys):
    arrays = _good(nodes=3)
    arrays["node1"] = arrays["node1"].astype(np.float64)
    inp = _npz(work / "in.npz", **arrays)
    code = _sim(work, inp, 3)
    _assert_user_error(code, capsys, work, "node1", "float64", "float32")


def test_unequal_lengths(work, capsys):
    arrays = _good(nodes=3, n=10)
    arrays["node2"] = arrays["node2"][:9]
    inp = _npz(work / "in.npz", **arrays)
    code = _sim(work, inp, 3)
    _assert_user_error(code, capsys, work, "node2", "length 9", "10")


def test_empty_arrays(work, capsys):
    inp = _npz(work / "in.npz", node0=np.zeros(0, F32), node1=np.zeros(0, F32))
    code = _sim(work, inp)
    _assert_user_error(code, capsys, work, "node0", "empty")


def test_two_dimensional(work, capsys):
    arrays = _good(nodes=2, n=6)
    arrays["node1"] = arrays["node1"].reshape(2, 3)
    inp = _npz(work / "in.npz", **arrays)
    code = _sim(work, inp)
    _assert_user_error(code, capsys, work, "node1", "1-D")


@pytest.mark.parametrize("nodes", [1, 0, -3])
def test_too_few_nodes(work, capsys, nodes):
    inp = _npz(work / "in.npz", **_good(nodes=2))
    code = _sim(work, inp, nodes)
    _assert_user_error(code, capsys, work, "--nodes", "ring size from 2 to 255")


def test_sim_bad_width(work, capsys):
    inp = _npz(work / "in.npz", **_good(nodes=2))
    code = _sim(work, inp, 2, "--width", "48")
    _assert_user_error(code, capsys, work, "width", "48")


def test_sim_bad_slots(work, capsys):
    inp = _npz(work / "in.npz", **_good(nodes=2))
    code = _sim(work, inp, 2, "--slots", "3")
    _assert_user_error(code, capsys, work, "slots")


def test_verilog_bad_width(work, capsys):
    out = work / "v" / "x.v"
    code = main(["verilog", "--width", "48", "-o", str(out)])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("wirereduce: error: ") and "width" in err and "48" in err
    assert not out.exists()


def test_verilog_bad_mtu(work, capsys):
    code = main(["verilog", "--mtu", "10", "-o", str(work / "x.v")])
    _, err = capsys.readouterr()
    assert code == 2 and "mtu" in err
    assert not (work / "x.v").exists()


def test_verilog_writes_file(work, capsys):
    out = work / "tmp" / "x.v"
    code = main(["verilog", "-o", str(out)])
    printed, _ = capsys.readouterr()
    assert code == 0
    assert out.exists()
    assert "module wirereduce_engine" in out.read_text()
    assert str(out) in printed


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["verilog", "--help"],
    ["sim", "--help"],
    ["sim", "allreduce", "--help"],
    ["demo", "--help"],
])
def test_help_exits_zero(argv, work, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    out, _ = capsys.readouterr()
    assert "usage:" in out
    assert not (work / "build").exists()


@pytest.mark.parametrize("argv", [
    [],
    ["sim"],
    ["verilog", "--width", "wide"],
])
def test_usage_errors_exit_two(argv, work, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    _, err = capsys.readouterr()
    assert "usage:" in err


@pytest.mark.parametrize("extra,needle", [(["--simulator", "icarus"], "--simulator icarus"),
                                          (["--waves"], "--waves")])
@pytest.mark.parametrize("engine", [[], ["--engine", "fast"]])
def test_fast_engine_rejects_cocotb_only_options(work, capsys, extra, needle, engine):
    inp = _npz(work / "in.npz", **_good())
    code = _sim(work, inp, 2, *engine, *extra)
    _assert_user_error(code, capsys, work, needle, "--engine cocotb")


@pytest.mark.parametrize("extra,needles", [
    (["--compress", "3"], ["--compress", "4..24"]),
    (["--compress", "25", "--engine", "fast"], ["--compress", "4..24"]),
    (["--compress", "8", "--links", "cmac", "--width", "512"], ["--compress", "--links cmac"]),
])
def test_bad_compress(work, capsys, extra, needles):
    inp = _npz(work / "in.npz", **_good(nodes=2))
    code = _sim(work, inp, 2, *extra)
    _assert_user_error(code, capsys, work, *needles)


def test_bench_codec_flags_contradict(work, capsys):
    code = main(["bench", "--no-codec", "--codec-only", "--build-dir", str(work / "b")])
    _assert_user_error(code, capsys, work, "--no-codec", "--codec-only")


def test_bench_codec_only_bad_slots(work, capsys):
    code = main(["bench", "--codec-only", "--slots", "24", "--build-dir", str(work / "b")])
    _assert_user_error(code, capsys, work, "slots", "24")


def test_bench_codec_only_takes_sizes_and_slots(work, monkeypatch):
    """--codec-only runs the compressed rows at the --sizes and --slots asked for (they were
    silently ignored before: always 1 MiB and 4 MiB with 32 slots)."""
    from wirereduce.sim.bench import algbw

    seen = {}

    def fake_rows(sizes, **kw):
        seen.update(sizes=list(sizes), slots=kw["slots"])
        return []

    monkeypatch.setattr(algbw, "run_codec_rows", fake_rows)
    assert main(["bench", "--codec-only", "--sizes", "256K", "--slots", "64", "--out-dir", str(work / "r"),
                 "--build-dir", str(work / "b")]) == 0
    assert seen == {"sizes": [256 * 1024], "slots": 64}
    assert main(["bench", "--codec-only", "--out-dir", str(work / "r"), "--build-dir", str(work / "b")]) == 0
    assert seen == {"sizes": list(algbw.CODEC_SIZES), "slots": algbw.CODEC_SLOTS}


@pytest.mark.parametrize("extra,needles", [
    (["--links", "cmac"], ["--links cmac", "--width 512"]),                         # default width 64
    (["--width", "512", "--links", "cmac", "--engine", "fast", "--corrupt", "2", "5"], ["corrupt node"]),
    (["--width", "512", "--links", "cmac", "--compress", "8"], ["--compress", "--links cmac"]),
    (["--width", "512", "--links", "cmac", "--codec"], ["--codec", "--links cmac"]),
])
def test_cmac_links_are_checked_before_any_build(work, capsys, extra, needles):
    inp = _npz(work / "in.npz", **_good(nodes=2))
    code = _sim(work, inp, 2, *extra)
    _assert_user_error(code, capsys, work, *needles)
    assert not (work / "b").exists(), "nothing is built for a wrong argument"


def test_cli_links_choices_are_the_networks():
    import argparse

    from wirereduce.sim.cluster.network import LINKS

    from wirereduce.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sim = next(a for a in sub.choices["sim"]._actions if isinstance(a, argparse._SubParsersAction))
    links = next(a for a in sim.choices["allreduce"]._actions if a.dest == "links")
    assert tuple(links.choices) == LINKS


def test_sim_allreduce_needs_nodes_or_topology(work, capsys):
    code = main(["sim", "allreduce", "--input", "x.npz", "--output", "y.npz"])
    _assert_user_error(code, capsys, work, "--nodes N", "--topology")


@pytest.mark.parametrize("extra,needles", [
    (["--topology", "ring:4"], ["--algorithm"]),
    (["--topology", "ring:4", "--algorithm", "biring", "--compress", "3"], ["--compress", "4..24"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--links", "cmac"], ["--links cmac", "--width 512"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--links", "cmac", "--width", "512", "--compress", "8"],
     ["--compress", "--links cmac"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--links", "cmac", "--width", "512", "--engine", "cocotb"],
     ["--links cmac", "drop --engine cocotb"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--links", "eth", "--engine", "cocotb", "--host-link-gbps",
      "50"], ["links='eth'", "host link"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--links", "eth", "--host-link-gbps", "50"],
     ["links='eth'", "host link"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--engine", "cocotb", "--sim-threads", "2"], ["--sim-threads"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--pcap", "x.pcap"], ["--pcap", "--links eth"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--late", "4", "100"], ["--late", "rank"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--host-links", "eth"], ["host_links='eth'", "links='eth'"]),
    (["--nodes", "4", "--host-links", "eth"], ["host_links='eth'", "links='eth'"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--simulator", "icarus"],
     ["--simulator icarus", "--engine cocotb"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--late", "1", "-5"], ["--late", "cycles"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--engine", "cocotb", "--late", "1", "5"],
     ["--late", "--engine cocotb"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--links", "eth", "--engine", "cocotb", "--pcap", "x.pcap"],
     ["--pcap", "not --engine cocotb"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--nodes", "3"], ["disagrees", "ring:4"]),
    (["--topology", "cube:4", "--algorithm", "ring"], ["unknown topology"]),
    (["--topology", "torus:4x4", "--algorithm", "multitree", "--ports", "2"], ["ports"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--host-link-gbps", "-5"], ["positive"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--engine", "fast", "--sim-threads", "0"], ["threads"]),
    (["--nodes", "4", "--engine", "cocotb", "--sim-threads", "2"], ["--sim-threads"]),
    (["--nodes", "4", "--algorithm", "multitree", "--ports", "1"], ["ports"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--corrupt", "0", "5"], ["--corrupt", "--links eth|cmac"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--width", "512", "--links", "cmac", "--corrupt-header", "0",
      "3"], ["--corrupt", "links='eth'"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--width", "512", "--links", "cmac", "--corrupt", "4", "3"],
     ["corrupt node"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--links", "eth", "--corrupt", "0", "5", "--corrupt-port", "3"],
     ["corrupt port", "cabled port of node 0"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--links", "eth", "--corrupt-header", "4", "1"], ["corrupt node"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--retries", "-1"], ["--retries", "int ≥ 0", "-1"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--engine", "cocotb", "--corrupt", "0", "5"],
     ["--corrupt", "--links eth|cmac"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--engine", "cocotb", "--links", "eth", "--corrupt", "0", "5",
      "--corrupt-port", "3"], ["corrupt port", "cabled port of node 0"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--engine", "cocotb", "--retries", "-1"],
     ["--retries", "int ≥ 0", "-1"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--formats", "bf16"], ["--formats", "must include 'fp32'"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--formats", "fp32", "fp32"], ["--formats", "twice"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--formats", "fp32", "fp8"],
     ["--formats", "unknown format 'fp8'"]),
    (["--topology", "ring:4", "--algorithm", "ring", "--formats", "fp32", "--engine", "cocotb"],
     ["--formats", "--engine cocotb"]),
    (["--topology", "ring:4", "--algorithm", "biring", "--chunk-bytes", "6"], ["--chunk-bytes", "multiples of 4"]),
    (["--topology", "ring:4", "--algorithm", "biring", "--chunk-bytes", "2000"], ["--chunk-bytes", "1484", "MTU 1500"]),
    (["--topology", "ring:4", "--algorithm", "biring", "--chunk-bytes", "256,0"], ["--chunk-bytes", "0 is not"]),
    (["--topology", "ring:4", "--algorithm", "biring", "--mtu", "9000", "--chunk-bytes", "256,9000"],
     ["--chunk-bytes", "8984", "MTU 9000"]),
    (["--topology", "ring:4", "--algorithm", "biring", "--chunk-bytes", "256,,512"],
     ["--chunk-bytes", "comma-separated"]),
    (["--topology", "ring:4", "--algorithm", "biring", "--chunk-bytes", "1400", "--compress", "8"],
     ["--chunk-bytes", "1396", "compressed frame"]),
    (["--topology", "ring:4", "--algorithm", "biring", "--chunk-bytes", "512,1484", "--engine", "cocotb",
      "--compress", "8"], ["--chunk-bytes", "1484 is not", "1396"]),
    (["--topology", "ring:4", "--algorithm", "biring", "--chunk-bytes", "2000", "--engine", "cocotb"],
     ["--chunk-bytes", "1484"]),
    (["--topology", "ring:4", "--algorithm", "biring", "--multiring-roots", "2"],
     ["--multiring-roots", "biring", "--algorithm multiring"]),
    (["--topology", "ring:4", "--algorithm", "multiring", "--multiring-roots", "3"], ["--multiring-roots", "3"]),
    (["--topology", "ring:4", "--algorithm", "multiring", "--multiring-roots", "0"], ["--multiring-roots"]),
])
def test_schedule_engine_options_refused_before_building(work, capsys, extra, needles):
    nodes = 16 if "torus:4x4" in extra else 4
    inp = _npz(work / "in.npz", **_good(nodes))
    code = main(["sim", "allreduce", "--input", str(inp), "--output", str(work / "out.npz"),
                 "--build-dir", str(work / "b"), *extra])
    _assert_user_error(code, capsys, work, *needles)


def test_engine_refuses_mixed_formats_before_building(work, capsys):
    arrays = _good(4)
    arrays["node2"] = arrays["node2"].astype(np.float16)
    inp = _npz(work / "in.npz", **arrays)
    code = main(["sim", "allreduce", "--topology", "ring:4", "--algorithm", "ring", "--input", str(inp),
                 "--output", str(work / "out.npz"), "--build-dir", str(work / "b")])
    _assert_user_error(code, capsys, work, "node2", "float16")
    assert not (work / "b").exists()


def test_engine_lanes_must_carry_the_input_format(work, capsys):
    """``--formats`` builds the fast engine's lanes for those formats only: an input in another format
    is refused before anything is built (the engines would drop every frame as ``drop_dtype``)."""
    import ml_dtypes

    arrays = {k: v.astype(ml_dtypes.bfloat16) for k, v in _good(4).items()}
    inp = _npz(work / "in.npz", **arrays)
    code = main(["sim", "allreduce", "--topology", "ring:4", "--algorithm", "ring", "--input", str(inp),
                 "--output", str(work / "out.npz"), "--build-dir", str(work / "b"), "--formats", "fp32", "int32"])
    _assert_user_error(code, capsys, work, "input is bf16", "fp32 int32 only", "add bf16 to --formats")
    assert not (work / "b").exists()


@pytest.mark.parametrize("argv, needle", [
    (["--formats", "fp8"], "unknown format 'fp8'"),
    (["--topology", "ring:1"], "ring"),
    (["--elements", "0"], "--elements"),
])
def test_bench_formats_bad_arguments(work, capsys, argv, needle):
    code = main(["bench-formats", "--build-dir", str(work / "b"), "--out-dir", str(work / "out"), *argv])
    _assert_user_error(code, capsys, work, needle)
    assert not (work / "out").exists()


@pytest.mark.parametrize("argv,needles", [
    (["--lookahead", "7"], ["lookahead", "1 to 4"]),
    (["--slots", "24"], ["--slots", "power of two"]),
    (["--topologies", "torus:4x4/multitree,trees"], ["'trees'", "multitree-balanced"]),
    (["--topologies", "torus:4"], ["torus"]),
    (["--host-link-gbps", "0"], ["host-link-gbps"]),
    (["--sim-threads", "0"], ["--sim-threads", "from 1 to 64"]),
    (["--chunk-bytes", "6"], ["--chunk-bytes", "multiples of 4"]),
    (["--chunk-bytes", "2000"], ["--chunk-bytes", "1484"]),
    (["--chunk-bytes", "512", "--compress", "8"], ["--chunk-bytes", "--compress"]),
    (["--chunk-bytes", "256,510"], ["--chunk-bytes", "multiples of 4"]),
    (["--chunk-bytes", "256,2000"], ["--chunk-bytes", "1484"]),
    (["--chunk-bytes", "256,,512"], ["--chunk-bytes", "comma-separated"]),
    (["--width", "512"], ["--width", "compressed rows"]),
    (["--width", "256", "--compress", "8"], ["--width 256", "uncompressed rows"]),
])
def test_bench_schedules_bad_arguments(work, capsys, argv, needles):
    """Nothing is built: every argument is checked before the first engine."""
    code = main(["bench-schedules", "--out-dir", str(work / "r"), "--build-dir", str(work / "b"), *argv])
    _assert_user_error(code, capsys, work, *needles)
    assert not (work / "b").exists() and not (work / "r").exists()


def test_bench_schedules_width_256_builds_the_pcie_tops_engines(work, monkeypatch):
    """--width 256: the VC709 PCIe top's engines (256 bit, MTU 1500) at 156.25 MHz behind 10G links
    (8 bytes a cycle) with the 40G host link at the engine's full width (32 bytes a cycle)."""
    from wirereduce.sim.engines import fastengine

    seen = []

    class Fake:
        def __init__(self, topo, cfg, *a, link_rate=None, host_rate=None, **k):
            seen.append((str(topo), cfg.width, cfg.mtu, link_rate, host_rate))
            raise RuntimeError("stop")

    monkeypatch.setattr(fastengine, "FastEngineSim", Fake)
    with pytest.raises(RuntimeError, match="stop"):
        main(["bench-schedules", "--topologies", "ring:4/ring,biring", "--sizes", "64K", "--width", "256",
              "--host-link-gbps", "40", "--out-dir", str(work / "r"), "--build-dir", str(work / "b")])
    assert seen == [("ring:4", 256, 1500, 8, 32)]


def test_bench_schedules_compress_builds_the_engines_asked_for(work, monkeypatch):
    """--compress builds codec engines with the --lookahead, --priority and --slots given (the
    lookahead and priority were silently ignored before 2026-11-30: always 2 and auto), and the
    default rows' engines when they are left out (a codec engine's lookahead is 3; 32 slots)."""
    from wirereduce.sim.engines import fastengine

    seen = []

    class Fake:
        def __init__(self, topo, cfg, *a, **k):
            seen.append((str(topo), cfg.codec, cfg.lookahead, cfg.priority, cfg.slots))
            raise RuntimeError("stop")

    monkeypatch.setattr(fastengine, "FastEngineSim", Fake)
    for argv, want in (([], ("ring:4", True, 3, "unit", 32)),   # a codec engine's default lookahead; 32 slots
                       (["--lookahead", "4", "--priority", "broadcast", "--slots", "16"],
                        ("ring:4", True, 4, "broadcast", 16))):
        seen.clear()
        with pytest.raises(RuntimeError, match="stop"):
            main(["bench-schedules", "--compress", "8", "--out-dir", str(work / "r"), "--build-dir", str(work / "b"),
                  "--sizes", "32K", *argv])
        assert seen == [want], (argv, seen)


def test_bench_schedules_window_follows_the_flows(work, monkeypatch):
    """Without --slots every engine of a topology gets two slots per flow of its schedule with the
    most flows (at least 16): ring:8 biring's 16 flows reached 0.95 of the bound with 16 slots and
    1.00 with 32. The ring row of the same topology runs on the same engines."""
    from wirereduce.sim.bench import schedules
    from wirereduce.sim.engines import fastengine

    assert [schedules.window_slots(f) for f in (1, 4, 8, 9, 16, 17, 40)] == [16, 16, 16, 32, 32, 64, 128]
    seen = []

    class Fake:
        def __init__(self, topo, cfg, *a, **k):
            seen.append((str(topo), cfg.slots, cfg.max_flows))
            raise RuntimeError("stop")

    monkeypatch.setattr(fastengine, "FastEngineSim", Fake)
    for argv, want in ((["ring:8/ring,biring"], 32), (["ring:4/ring,biring"], 16),
                       (["ring:8/biring", "--slots", "64"], 64)):
        seen.clear()
        with pytest.raises(RuntimeError, match="stop"):
            main(["bench-schedules", "--out-dir", str(work / "r"), "--build-dir", str(work / "b"),
                  "--sizes", "32K", "--host-link-gbps", "50", "--topologies", *argv])
        assert seen and seen[0][1] == want, (argv, seen)
    # the ring of a 4x4 torus on the trees' engines (16 flows: max_flows 16), not a build of its own
    seen.clear()
    with pytest.raises(RuntimeError, match="stop"):
        main(["bench-schedules", "--out-dir", str(work / "r"), "--build-dir", str(work / "b"),
              "--sizes", "32K", "--host-link-gbps", "50", "--topologies", "torus:4x4/ring,multitree-balanced"])
    assert seen == [("torus:4x4", 32, 16)], seen


def test_sim_allreduce_chunk_bytes_and_roots_reach_the_engine(work, monkeypatch):
    """``sim allreduce --chunk-bytes`` gives the fast engine chunks of that many 32-bit words (a
    profile as a tuple, the MTU's frame as the limit) and ``--multiring-roots R`` the multiring
    schedule with R roots per ring and direction (2·R flows on a ring), built with room for its
    flows; without them, full frames and every node a root."""
    from wirereduce.sim.engines import fastengine

    from wirereduce import schedule as sched

    seen = []

    class Fake:
        def __init__(self, topo, cfg, *a, **k):
            self.cfg = cfg

        def allreduce(self, arrays, s, **kw):
            seen.append((len(s.flows), kw["chunk_words"], self.cfg.mtu, self.cfg.max_flows >= len(s.flows)))
            raise RuntimeError("stop")

    monkeypatch.setattr(fastengine, "FastEngineSim", Fake)
    inp = _npz(work / "in.npz", **_good(4))
    every_root = len(sched.build("ring:4", "multiring").flows)
    for extra, want in (([], (every_root, None, 1500, True)),
                        (["--chunk-bytes", "512"], (every_root, 128, 1500, True)),
                        (["--chunk-bytes", "256,768,1484", "--multiring-roots", "2"], (4, (64, 192, 371), 1500, True)),
                        (["--chunk-bytes", "8984", "--mtu", "9000", "--multiring-roots", "1"], (2, 2246, 9000, True))):
        seen.clear()
        with pytest.raises(RuntimeError, match="stop"):
            main(["sim", "allreduce", "--topology", "ring:4", "--algorithm", "multiring", "--input", str(inp),
                  "--output", str(work / "out.npz"), "--build-dir", str(work / "b"), *extra])
        assert seen == [want], (extra, seen)
    assert every_root == 8
