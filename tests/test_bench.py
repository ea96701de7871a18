"""The benchmark's bounds, records, outputs and command line, with a fake simulation engine."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from wirereduce.sim.bench import algbw as bench
from wirereduce.sim.bench.algbw import BenchConfig, BenchError
from wirereduce.sim.golden import codec as G
from wirereduce.sim.golden.allreduce import ring_allreduce

from wirereduce import codec
from wirereduce.cli import build_parser, main

# Ethernet constants, written out here (IEEE 802.3), not taken from the code under test.
ETH_HDR = 14          # destination, source, EtherType
PREAMBLE_SFD = 8
FCS = 4
IFG = 12
MIN_PAYLOAD = 46
WR_HDR = 16           # the wirereduce header


def _wire(frame_bytes):
    return ETH_HDR + max(frame_bytes, MIN_PAYLOAD) + PREAMBLE_SFD + FCS + IFG


# ------------------------------------------------------------------------------------------
# Bounds, by hand


def test_frame_bound_mtu1500_full_frames_10g():
    # (1500 - 16) / 4 = 371 elements = 1484 payload bytes in 14 + 1500 + 24 = 1538 wire bytes
    assert _wire(1500) == 1538
    got = bench.frame_bound_gbps(371 * 20, 1500, 64)
    assert got == pytest.approx(10 * 1484 / 1538, rel=1e-12)
    assert round(got, 3) == 9.649


def test_frame_bound_mtu9000_full_frames_10g_and_100g():
    # (9000 - 16) / 4 = 2246 elements = 8984 payload bytes in 9038 wire bytes: docs/background.md's "≥ 9.9 Gbit/s"
    assert bench.frame_bound_gbps(2246 * 3, 9000, 64) == pytest.approx(10 * 8984 / 9038, rel=1e-12)
    assert bench.frame_bound_gbps(2246 * 3, 9000, 64) > 9.9
    assert bench.frame_bound_gbps(2246 * 3, 9000, 512) == pytest.approx(100 * 8984 / 9038, rel=1e-12)


def test_frame_bound_short_last_chunk():
    # 381 elements at MTU 1500: one full frame (371) and one of 10 elements (16 + 40 = 56 B frame)
    want = 10 * (381 * 4) / (1538 + (ETH_HDR + 56 + 24))
    assert bench.frame_bound_gbps(381, 1500, 64) == pytest.approx(want, rel=1e-12)
    assert bench.chunk_sizes(381, 1500) == [371, 10]


def test_frame_bound_padded_runt():
    # 2 elements: a 24-byte frame, padded to the 46-byte minimum payload: 14 + 46 + 24 = 84 wire bytes
    assert bench.frame_bound_gbps(2, 1500, 64) == pytest.approx(10 * 8 / 84, rel=1e-12)


def test_ring_bound():
    b = bench.frame_bound_gbps(2246 * 8, 9000, 64)
    # host ring time 2(N-1)/N · M/B, so algbw = B · N / (2(N-1))
    assert bench.ring_bound_gbps(2, 2246 * 8, 9000, 64) == pytest.approx(b)
    assert bench.ring_bound_gbps(4, 2246 * 8, 9000, 64) == pytest.approx(b * 4 / 6)
    assert bench.ring_bound_gbps(8, 2246 * 8, 9000, 64) == pytest.approx(b * 8 / 14)
    assert bench.ring_time_target(4) == pytest.approx(4 / 6 + 0.02)
    assert bench.ring_time_target(2) == pytest.approx(1.02)


def test_bound_arguments():
    with pytest.raises(ValueError, match="line rate"):
        bench.frame_bound_gbps(100, 1500, 128)
    with pytest.raises(ValueError, match="elements"):
        bench.frame_bound_gbps(0, 1500, 64)
    with pytest.raises(ValueError, match="nodes"):
        bench.ring_bound_gbps(1, 100, 1500, 64)


@pytest.mark.parametrize("text, n", [("8192", 8192), ("8K", 8192), ("8k", 8192), ("8KiB", 8192),
                                     ("512K", 512 * 1024), ("16M", 16 << 20), ("16MiB", 16 << 20),
                                     ("1G", 1 << 30)])
def test_parse_size(text, n):
    assert bench.parse_size(text) == n
    assert bench.parse_size(bench.format_size(n)) == n


@pytest.mark.parametrize("text", ["", "abc", "8X", "-8K", "6", "0", "1.5M"])
def test_parse_size_bad(text):
    with pytest.raises(ValueError):
        bench.parse_size(text)


# ------------------------------------------------------------------------------------------
# The benchmark with a fake engine


def _fake_runner(efficiency=0.995, fill=200, corrupt=None):
    """A stand-in for algbw.run_ring: golden results, cycles from the bound and a fill time."""
    calls = []

    def run(setup, arrays, *, build_root, progress, compression=None):
        calls.append((setup, len(arrays), arrays[0].size, build_root, progress, compression))
        n = arrays[0].size
        if compression is None:
            want = ring_allreduce(arrays)
        else:
            want = G.ring_allreduce_compressed(arrays, compression, host_compressed=True)
        results = [want.copy() for _ in arrays]
        if corrupt is not None:
            results[corrupt][n // 2] = np.nextafter(results[corrupt][n // 2], np.float32(np.inf))
        cfg = setup.config
        bound = bench.frame_bound_gbps(n, cfg.mtu, cfg.width)
        mhz = {64: 156.25, 512: 322.265625}[cfg.width] if setup.clock_mhz is None else setup.clock_mhz
        if setup.link_gbps is not None:
            bound *= setup.link_gbps / bench.line_rate_gbps(cfg.width)
        if compression is not None:  # a codec that pays off: 3/4 of its compression ratio
            bound *= 0.75 * codec.compression_ratio(np.concatenate(arrays), compression)
        cycles = math.ceil(4 * n * 8 / (efficiency * bound) * mhz / 1e3) + fill
        return {"results": results, "cycles": cycles, "bytes": 4 * n, "elements": n,
                "frames": len(bench.chunk_sizes(n, cfg.mtu)), "sim_cycles": cycles + 50, "wall_s": 0.5,
                "build_s": 1.0}

    run.calls = calls
    return run


def _fake_latency(width, mtu, path):
    return {"reduce": 9, "broadcast": 6}[path] + (width == 512)


ALLREDUCE_FIELDS = {"nodes", "bytes", "mtu", "width_bits", "clock_mhz", "cycles", "algbw_gbps", "bound_gbps",
                    "ring_bound_gbps", "count", "type", "time_us", "busbw_gbps", "efficiency",
                    "ring_time_ratio", "ring_time_target", "bitexact", "sim_cycles_per_s", "wall_s"}


def test_run_bench_records_json_png(tmp_path, capsys):
    run = _fake_runner()
    configs = [(64, 1500, 4), BenchConfig(512, 9000, 2)]
    records = bench.run_bench(configs, [8192, 65536], name="t", runner=run, latency=_fake_latency,
                              out_dir=tmp_path / "res", build_root=tmp_path / "b", progress=False)
    assert len(run.calls) == 4
    assert {c[3] for c in run.calls} == {tmp_path / "b"}

    on_disk = json.loads((tmp_path / "res" / "t.json").read_text())
    assert isinstance(on_disk, list)
    assert [r["kind"] for r in on_disk] == ["meta"] + ["allreduce"] * 4 + ["hop_latency"] * 4
    assert on_disk == json.loads(json.dumps(records))
    assert on_disk[0]["complete"] is True
    png = (tmp_path / "res" / "t.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"

    rows = [r for r in on_disk if r["kind"] == "allreduce"]
    assert all(ALLREDUCE_FIELDS <= set(r) for r in rows)
    # sorted by width, MTU, ring size; sizes ascending
    assert [(r["width_bits"], r["mtu"], r["nodes"], r["bytes"]) for r in rows] == [
        (64, 1500, 4, 8192), (64, 1500, 4, 65536), (512, 9000, 2, 8192), (512, 9000, 2, 65536)]
    for r in rows:
        assert r["bitexact"] is True and r["wrong"] == 0
        assert r["type"] == "float" and r["count"] == r["bytes"] // 4
        mhz = 156.25 if r["width_bits"] == 64 else 322.265625
        assert r["clock_mhz"] == mhz
        t_s = r["cycles"] / (mhz * 1e6)
        assert r["time_us"] == pytest.approx(t_s * 1e6)
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] * 8 / t_s / 1e9)
        n = r["nodes"]
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * (n - 1) / n)
        assert r["efficiency"] == pytest.approx(r["algbw_gbps"] / r["bound_gbps"])
        assert r["ring_bound_gbps"] == pytest.approx(r["bound_gbps"] * n / (2 * (n - 1)))
        # our time / host-ring time
        t_ring = 2 * (n - 1) / n * r["bytes"] * 8 / (r["bound_gbps"] * 1e9)
        assert r["ring_time_ratio"] == pytest.approx(t_s / t_ring)
        assert r["sim_cycles_per_s"] == pytest.approx(r["sim_cycles"] / 0.5)
        assert 0 < r["efficiency"] < 1

    lat = [r for r in on_disk if r["kind"] == "hop_latency"]
    assert {(r["width_bits"], r["path"], r["cycles"]) for r in lat} == {
        (64, "reduce", 9), (64, "broadcast", 6), (512, "reduce", 10), (512, "broadcast", 7)}
    assert all(r["meets_target"] and r["target_cycles"] == 16 for r in lat)

    out = capsys.readouterr().out
    assert "algbw" in out and "busbw" in out and "Gbit/s" in out and "%bound" in out
    assert "added latency per hop" in out and "simulation speed" in out
    assert "      8192       2048  float" in out


def test_wrong_result_stops_the_bench(tmp_path, capsys):
    run = _fake_runner(corrupt=2)
    with pytest.raises(BenchError, match="not bit-exact") as e:
        bench.run_bench([(64, 1500, 4)], [8192, 16384], name="bad", runner=run, latency=_fake_latency,
                        out_dir=tmp_path)
    assert "node2" in str(e.value) and "4 nodes, 64 bit, MTU 1500" in str(e.value)
    assert len(run.calls) == 1  # stopped at the first wrong row
    recs = json.loads((tmp_path / "bad.json").read_text())
    assert recs[0]["complete"] is False
    assert recs[1]["bitexact"] is False and recs[1]["wrong"] == 1


def test_engine_reporting_other_size_is_an_error(tmp_path):
    inner = _fake_runner()

    def run(setup, arrays, **kw):
        rec = inner(setup, arrays, **kw)
        rec["bytes"] += 4
        return rec

    with pytest.raises(BenchError, match="asked for 8192 B"):
        bench.run_bench([(64, 1500, 2)], [8192], runner=run, latency=_fake_latency, out_dir=tmp_path)


def test_missing_latency_module_records_none(tmp_path, monkeypatch, capsys):
    def no_module():
        raise ImportError("No module named 'wirereduce.sim.bench.latency'")

    monkeypatch.setattr(bench, "_default_latency", no_module)
    with pytest.warns(RuntimeWarning, match="hop latency not measured"):
        records = bench.run_bench([(64, 9000, 2)], [8192], runner=_fake_runner(), out_dir=tmp_path)
    lat = [r for r in records if r["kind"] == "hop_latency"]
    assert len(lat) == 2 and all(r["cycles"] is None and r["meets_target"] is None for r in lat)
    assert "not measured" in capsys.readouterr().out


def test_bad_arguments_before_running(tmp_path):
    run = _fake_runner()
    for configs, sizes, match in [([(64, 1500, 1)], [8192], "nodes"), ([(128, 1500, 2)], [8192], "line rate"),
                                  ([(64, 10, 2)], [8192], "mtu"), ([(64, 1500, 2)], [6], "multiple of 4"),
                                  ([], [8192], "no configurations"), ([(64, 1500, 2)], [], "no message sizes")]:
        with pytest.raises(ValueError, match=match):
            bench.run_bench(configs, sizes, runner=run, out_dir=tmp_path / "out")
    assert run.calls == []
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------
# Command line


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _plan(*argv):
    from wirereduce.cli import _bench_plan

    return _bench_plan(build_parser().parse_args(["bench", *argv]))


def test_cli_plans():
    configs, sizes, name = _plan("--quick")
    assert configs == [BenchConfig(64, 1500, 4), BenchConfig(64, 9000, 4), BenchConfig(512, 9000, 4)]
    assert sizes == [8 << 10, 512 << 10, 4 << 20] and name == "bench-quick"

    configs, sizes, name = _plan()
    assert len(configs) == 12 and {c.nodes for c in configs} == {2, 4, 8}
    assert min(sizes) == 8 << 10 and max(sizes) >= 16 << 20 and 4 << 20 in sizes and name == "bench"

    configs, _, _ = _plan("--quick", "--nodes", "2", "8")
    assert len(configs) == 6 and {c.nodes for c in configs} == {2, 8}
    configs, _, _ = _plan("--quick", "--widths", "512")
    assert configs == [BenchConfig(512, 1500, 4), BenchConfig(512, 9000, 4)]
    configs, sizes, name = _plan("--widths", "64", "--mtus", "9000", "--nodes", "4", "--sizes", "8K", "1M",
                                 "--name", "mine")
    assert configs == [BenchConfig(64, 9000, 4)] and sizes == [8192, 1 << 20] and name == "mine"


@pytest.mark.parametrize("argv, needle", [
    (["--widths", "128"], "--widths: 128"),
    (["--nodes", "1"], "--nodes: 1"),
    (["--mtus", "10"], "mtu"),
    (["--sizes", "8K", "7"], "--sizes"),
    (["--sizes", "lots"], "--sizes"),
    (["--slots", "3"], "slots"),
    (["--name", "../x"], "--name"),
])
def test_cli_errors(work, capsys, monkeypatch, argv, needle):
    def never():
        raise AssertionError("the engine must not be reached")

    monkeypatch.setattr(bench, "_default_runner", never)
    code = main(["bench", "--quick", *argv])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("wirereduce: error: ") and len(err.strip().splitlines()) == 1, err
    assert needle in err
    assert not (work / "bench").exists() and not (work / "build").exists()


def test_cli_unknown_option(work, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--frobnicate"])
    assert e.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_cli_runs_with_fake_engine(work, capsys, monkeypatch):
    run = _fake_runner()
    monkeypatch.setattr(bench, "_default_runner", lambda: run)
    monkeypatch.setattr(bench, "_default_latency", lambda: _fake_latency)
    code = main(["bench", "--quick", "--sizes", "8K", "16K", "--no-progress", "--no-codec"])
    assert code == 0
    recs = json.loads((work / "bench" / "results" / "bench-quick.json").read_text())
    assert sum(r["kind"] == "allreduce" and r["links"] == "model" for r in recs) == 6
    # and the Ethernet-link subset of --quick: 4 nodes, 64 bit, MTU 1500, at the sizes asked for
    eth = [r for r in recs if r["kind"] == "allreduce" and r["links"] == "eth"]
    assert sorted((r["nodes"], r["width_bits"], r["mtu"], r["bytes"]) for r in eth) == [(4, 64, 1500, 8192),
                                                                                        (4, 64, 1500, 16384)]
    assert {c[0].links for c in run.calls} == {"model", "eth"}
    assert (work / "bench" / "results" / "bench-quick.png").exists()
    assert {c[3] for c in run.calls} == {"build/fastsim"} and not any(c[4] for c in run.calls)


def test_cli_engine_failure_is_exit_1(work, capsys, monkeypatch):
    def missing():
        raise BenchError("the simulation engine wirereduce.sim.engines.fastsim cannot be imported: nope")

    monkeypatch.setattr(bench, "_default_runner", missing)
    assert main(["bench", "--quick"]) == 1
    assert "fastsim cannot be imported" in capsys.readouterr().err


def test_cli_wrong_result_is_exit_1(work, capsys, monkeypatch):
    monkeypatch.setattr(bench, "_default_runner", lambda: _fake_runner(corrupt=0))
    monkeypatch.setattr(bench, "_default_latency", lambda: _fake_latency)
    assert main(["bench", "--quick", "--sizes", "8K", "--no-progress", "--no-codec"]) == 1
    assert "not bit-exact" in capsys.readouterr().err


def test_codec_rows_with_fake_engine(work, capsys):
    """Compressed rows: one uncompressed and one run per k on codec nodes with a 512-bit core at
    156.25 MHz behind 10G links; speed-up, ratio and their quotient recorded; bit-exactness
    checked against the golden compressed ring."""
    pytest.importorskip("torch")
    run = _fake_runner(fill=0)
    records = []
    out = bench.run_codec_rows([16 * 1024], run=run, records=records, json_path=work / "c.json", ks=(8, 12))
    assert [r["compression"] for r in out] == [None, 8, 12] and all(r["bitexact"] for r in out)
    setup = run.calls[0][0]
    assert setup.config.codec and setup.config.width == 512 and setup.clock == 156.25 and setup.link_gbps == 10.0
    assert [c[5] for c in run.calls] == [None, 8, 12]
    for r in out[1:]:
        assert r["ratio"] > 2 and r["speedup"] > 1
        assert r["speedup"] == pytest.approx(out[0]["time_us"] / r["time_us"])
        assert r["speedup_ratio"] == pytest.approx(r["speedup"] / r["ratio"])
        assert r["clock_mhz"] == 156.25 and r["line_rate_gbps"] == 10.0
        assert r["link_bound_ratio"] == pytest.approx(r["link_bound_speedup"] / r["ratio"])
        assert 1 < r["link_bound_speedup"] < r["ratio"]   # framing and the busiest link cost something
    assert json.loads((work / "c.json").read_text())[-1]["compression"] == 12
    assert "sp/ratio" in capsys.readouterr().out


def test_codec_rows_wrong_result_raises(work):
    pytest.importorskip("torch")
    with pytest.raises(BenchError, match="not bit-exact"):
        bench.run_codec_rows([8192], run=_fake_runner(corrupt=1), records=[], json_path=work / "c.json", ks=(8,))


def test_codec_rows_bad_k_raises_before_running(work):
    run = _fake_runner()
    with pytest.raises(ValueError, match="k must be"):
        bench.run_codec_rows([8192], run=run, records=[], json_path=work / "c.json", ks=(3,))
    assert run.calls == []


def _tag_block(m: int) -> int:
    """Bytes of the 2-bit tag block of m values, padded to 8 bytes (docs/codec.md)."""
    return 8 * -(-m // 32)


@pytest.mark.parametrize("value, code_bytes", [(0.0, 0), (3.0, 4)])
def test_codec_link_bound_by_hand(value, code_bytes):
    """Every value tag 0 (zeros: tags only) or tag 3 (|g| >= 1: raw 32 bits), so every link carries
    the same bytes and the bound is raw frames' wire bytes over compressed frames' wire bytes, with
    the chunking worked out here: 371 raw / 349 compressed values a frame at MTU 1500."""
    from wirereduce.protocol import wire_bytes

    n = 1000
    arrays = [np.full(n, value, np.float32), np.full(n, value if value == 0 else 1.0, np.float32)]
    raw = sum(wire_bytes(16 + 4 * m) for m in (371, 371, 258))
    comp = sum(wire_bytes(16 + _tag_block(m) + code_bytes * m) for m in (349, 349, 302))
    assert bench.codec_link_bound(arrays, 8, 1500) == pytest.approx(raw / comp)


def test_codec_link_bound_busiest_link():
    """The bound is set by the link that compresses worst: one host's gradient of ones (tag 3)
    against zeros elsewhere makes its push link carry raw-sized codes."""
    from wirereduce.protocol import wire_bytes

    n = 349
    arrays = [np.zeros(n, np.float32), np.full(n, 2.0, np.float32)]
    worst = wire_bytes(16 + _tag_block(n) + 4 * n)
    assert bench.codec_link_bound(arrays, 8, 1500) == pytest.approx(wire_bytes(16 + 4 * n) / worst)
