"""The fast engine's frame-player pieces (:mod:`wirereduce.sim.engines.fastsim`): the Verilog
clean-ups it compiles with and the checks made before any build."""

from __future__ import annotations

import pytest
from wirereduce.sim.engines.fastsim import check_late, check_options, strip_zero_memory_init


def test_strip_zero_memory_init_keeps_nonzero_init():
    text = ("  reg [7:0] \\buf  [1:0];\n  initial begin\n    \\buf [0] = 8'h00;\n    \\buf [1] = 8'h00;\n  end\n"
            "  reg [7:0] rom [1:0];\n  initial begin\n    rom[0] = 8'h00;\n    rom[1] = 8'h2a;\n  end\n")
    out = strip_zero_memory_init(text)
    assert "\\buf [0]" not in out
    assert "rom[1] = 8'h2a;" in out and "rom[0] = 8'h00;" in out


def _counter_verilog() -> str:
    from amaranth import Module
    from amaranth.back import verilog
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    class Counter(wiring.Component):
        def __init__(self):
            super().__init__({"en": In(1), "count": Out(8)})

        def elaborate(self, platform):
            m = Module()
            with m.If(self.en):
                m.d.sync += self.count.eq(self.count + 1)
            return m

    return verilog.convert(Counter(), name="wirereduce_net", emit_src=False)


def test_internal_reset_replaces_the_rst_port(tmp_path):
    """The top's ``rst`` input becomes a register-driven power-on reset: gone from the port list,
    high for the first RESET_CYCLES edges; the rest of the text is untouched; Verilator accepts it."""
    import re
    import shutil
    import subprocess

    from wirereduce.sim.engines.fastsim import RESET_CYCLES, internal_reset
    from wirereduce.sim.engines.verilator import setup_verilator_env

    text = _counter_verilog()
    out = internal_reset(text)
    head = re.search(r"module wirereduce_net\(([^)]*)\);", out).group(1)
    ports = [p.strip() for p in head.split(",")]
    assert "rst" not in ports and {"clk", "en", "count"} <= set(ports)
    assert "input rst;" not in out and f"wire rst = wirereduce_por != 3'd{RESET_CYCLES};" in out
    assert out.replace(" ", "").count("rst") >= text.replace(" ", "").count("rst") - 3   # the uses stay
    with pytest.raises(ValueError, match="no `input rst`"):
        internal_reset(out)
    with pytest.raises(ValueError, match="not found"):
        internal_reset(text, top="other")
    setup_verilator_env()
    if shutil.which("verilator"):
        src = tmp_path / "net.v"
        src.write_text(out)
        proc = subprocess.run(["verilator", "--lint-only", "-Wno-fatal", "-Wno-lint", "-Wno-style", str(src)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("threads", [0, 65, 1.5])
def test_engine_sim_threads_checked_before_any_build(tmp_path, threads):
    from wirereduce.sim.engines.fastengine import FastEngineSim

    from wirereduce.config import EngineConfig

    with pytest.raises(ValueError, match="threads"):
        FastEngineSim("ring:4", EngineConfig(ports=2), build_root=tmp_path / "b", threads=threads)
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("opts, match", [
    ({"window": -1}, "window"), ({"rx_valid_prob": 0.0}, "rx_valid_prob"), ({"tx_ready_prob": 2}, "tx_ready_prob"),
    ({"seed": 1.5}, "seed"), ({"timeout_cycles": 0}, "timeout"), ({"collective": 1 << 16}, "collective"),
])
def test_options_are_checked(opts, match):
    with pytest.raises(ValueError, match=match):
        check_options(**opts)
    check_options()   # the defaults pass


def test_late_is_checked():
    class Setup:
        nodes = 4

    assert check_late(None, Setup) == (0, 0) and check_late((3, 100), Setup) == (3, 100)
    for bad, match in (((4, 1), "rank"), ((0, -1), "cycles"), ((0,), "pair"), ((True, 5), "rank")):
        with pytest.raises(ValueError, match=match):
            check_late(bad, Setup)
