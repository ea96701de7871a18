"""cocotb testbench of the Si5324 start-up's Verilog (boards/si5324.py) against cocotbext-i2c target models.

:class:`I2cTop` puts a :class:`~wirereduce.boards.si5324.Si5324Init` on an open-drain bus: the lines
``scl``/``sda`` are the wired AND of the DUT (``*_oe`` = 1 pulls low) and of three targets'
``*_scl_o``/``*_sda_o`` inputs, which cocotbext-i2c's ``I2cDevice`` models drive: the two I2C
switches (0x74, 0x75) and an ``I2cMemory`` standing in for the Si5324 (0x68; it also stretches
the clock after every byte it receives). Every write is recorded as (address, data bytes); the
testbench writes them, the Si5324 model's memory and the cycle counts to a JSON file.

:func:`build` makes the Verilator model (once per parameter set), :func:`run_case` runs the
testbench. ``python -m tb_i2c --clk-hz 200000000 --i2c-hz 100000`` measures
the whole start-up (datasheet reset and ready times) at board parameters.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import cocotb
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from cocotb.clock import Clock
from cocotb.simtime import get_sim_time
from cocotb.triggers import ClockCycles, First, ReadOnly, RisingEdge, Timer
from wirereduce.boards.si5324 import MUX2_ADDR, MUX_ADDR, READY_S, RESET_PULSE_S, SI5324_ADDR, Si5324Init

__all__ = ["I2cTop", "build", "run_case", "measure", "TARGETS"]

TOP = "i2c_top"
#: target models on the bus: port prefix → 7-bit address
TARGETS = {"mux0": MUX_ADDR, "mux1": MUX2_ADDR, "si5324": SI5324_ADDR}
#: how long the Si5324 model holds SCL low after each byte it receives in the test (clock stretching), ns
STRETCH_NS = 3000


class I2cTop(wiring.Component):
    """:class:`Si5324Init` with the open-drain bus resolved in gateware for the cocotb target models.

    Ports: ``scl``/``sda`` (the lines), ``<target>_scl_o``/``<target>_sda_o`` for each of
    :data:`TARGETS` (0 pulls the line low), and the DUT's ``si5324_rst_n``, ``mux_rst_n``,
    ``done``, ``error``.
    """

    def __init__(self, clk_hz: int, i2c_hz: int, **kwargs):
        self.init = Si5324Init(clk_hz, i2c_hz, **kwargs)
        members = {"scl": Out(1), "sda": Out(1), "si5324_rst_n": Out(1), "mux_rst_n": Out(1), "done": Out(1),
                   "error": Out(1)}
        for name in TARGETS:
            members[f"{name}_scl_o"] = In(1, init=1)
            members[f"{name}_sda_o"] = In(1, init=1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.init = init = self.init
        scl = ~init.scl_oe
        sda = ~init.sda_oe
        for name in TARGETS:
            scl = scl & getattr(self, f"{name}_scl_o")
            sda = sda & getattr(self, f"{name}_sda_o")
        m.d.comb += [
            self.scl.eq(scl), self.sda.eq(sda), init.scl_i.eq(self.scl), init.sda_i.eq(self.sda),
            self.si5324_rst_n.eq(init.si5324_rst_n), self.mux_rst_n.eq(init.mux_rst_n),
            self.done.eq(init.done), self.error.eq(init.error),
        ]
        return m


def build(build_dir: str | Path, clk_hz: int = 10_000_000, i2c_hz: int = 400_000, reset_s: float = 2e-6,
          ready_s: float = 20e-6, stretch_ns: int = STRETCH_NS, waves: bool = False):
    """Build the Verilator model of :class:`I2cTop` in ``build_dir``; returns what :func:`run_case` needs.

    The defaults keep the simulation short (a quarter SCL period of 7 cycles, a 20 µs ready wait);
    ``stretch_ns`` is how long the Si5324 model stretches SCL after each byte (0: never).
    """
    from amaranth.back import verilog
    from wirereduce.sim.engines.runner import build_block_model

    top = I2cTop(clk_hz, i2c_hz, reset_s=reset_s, ready_s=ready_s, retries=0)
    params = {"clk_hz": clk_hz, "i2c_hz": i2c_hz, "reset_cycles": top.init.reset_cycles,
              "ready_cycles": top.init.ready_cycles, "stretch_ns": stretch_ns}
    runner, build_dir = build_block_model(verilog.convert(top, name=TOP, emit_src=False), TOP, build_dir, waves)
    return runner, build_dir, waves, params


def run_case(sim, case: str = "startup") -> tuple[int, Path, Path]:
    """Run the cocotb test ``case`` of this module on a model from :func:`build`.

    Returns the number of failed tests (1 if the simulator did not report), the log file and the
    JSON result file (``writes``: [[address, [bytes]], …], ``si5324_memory``: {register: value},
    ``reset_cycles``, ``startup_cycles``: clock cycles from reset to ``done``).
    """
    from wirereduce.sim.engines.runner import run_block_case

    runner, build_dir, waves, params = sim
    result = build_dir / case / "result.json"
    result.unlink(missing_ok=True)
    fails, log = run_block_case(runner, build_dir, TOP, "tb_i2c", case, waves=waves,
                                extra_env={"I2C_RESULT": str(result), "I2C_PARAMS": json.dumps(params)})
    return fails, log, result


# --- target models ------------------------------------------------------------------------------

def _recording(base):
    """An I2cDevice subclass of ``base`` that appends every write to a shared list as [address, [bytes]]."""
    class Recording(base):
        def __init__(self, *args, addr: int, writes: list, stretch_ns: int = 0, **kwargs):
            super().__init__(*args, **kwargs)
            self.addr = addr  # I2cDevice's bus loop matches this 7-bit address
            self.writes = writes
            self.stretch_ns = stretch_ns
            self.current = None

        def handle_start(self):
            super().handle_start()
            self.current = None

        async def handle_write(self, data):
            if self.current is None:
                self.current = [self.addr, []]
                self.writes.append(self.current)
            self.current[1].append(data)
            await super().handle_write(data)
            if self.stretch_ns:   # SCL is held low while this runs: clock stretching
                await Timer(self.stretch_ns, unit="ns")

    return Recording


# --- testbench ----------------------------------------------------------------------------------

@cocotb.test()
async def startup(dut):
    """Reset, then every write of the start-up recorded by the target models, until ``done``."""
    from cocotbext.i2c import I2cDevice, I2cMemory

    params = json.loads(os.environ["I2C_PARAMS"])
    period_ps = round(1e12 / params["clk_hz"])
    writes: list = []
    device = _recording(I2cDevice)
    for name in ("mux0", "mux1"):
        device(dut.sda, getattr(dut, f"{name}_sda_o"), dut.scl, getattr(dut, f"{name}_scl_o"), addr=TARGETS[name],
               writes=writes)
    si5324 = _recording(I2cMemory)(dut.sda, dut.si5324_sda_o, dut.scl, dut.si5324_scl_o, addr=TARGETS["si5324"],
                                   size=256, writes=writes, stretch_ns=params["stretch_ns"])

    dut.rst.value = 1
    cocotb.start_soon(Clock(dut.clk, period_ps, unit="ps").start())
    await ClockCycles(dut.clk, 2)
    dut.rst.value = 0
    await RisingEdge(dut.clk)
    start = get_sim_time("ps")
    assert not int(dut.si5324_rst_n.value) and not int(dut.mux_rst_n.value), "both resets must start low"
    await RisingEdge(dut.si5324_rst_n)
    rst_low = int(get_sim_time("ps") - start) // period_ps
    assert int(dut.mux_rst_n.value), "the switch reset must rise with the Si5324 reset"
    # generous bound: 12 SCL periods per byte (9 + START/STOP + stretching) plus the reset and the ready wait
    nbytes = 3 * 23
    bound_ps = ((params["reset_cycles"] + params["ready_cycles"]) * period_ps
                + nbytes * 12 * round(1e12 / params["i2c_hz"]) + nbytes * params["stretch_ns"] * 1000)
    await First(RisingEdge(dut.done), RisingEdge(dut.error), Timer(bound_ps, unit="ps"))
    await ReadOnly()
    assert int(dut.done.value) or int(dut.error.value), f"no done/error after {bound_ps} ps"
    cycles = int(get_sim_time("ps") - start) // period_ps
    assert int(dut.done.value) and not int(dut.error.value), "the start-up stopped with error"
    await ClockCycles(dut.clk, 10)
    Path(os.environ["I2C_RESULT"]).write_text(json.dumps({
        "writes": [[addr, list(data)] for addr, data in writes],
        "si5324_memory": {str(reg): si5324.mem[reg] for addr, data in writes if addr == SI5324_ADDR
                          for reg in data[:1]},
        "reset_cycles": rst_low,
        "startup_cycles": cycles,
        "clk_hz": params["clk_hz"], "i2c_hz": params["i2c_hz"],
    }))


# --- measurement --------------------------------------------------------------------------------

def measure(clk_hz: int = 200_000_000, i2c_hz: int = 100_000, build_dir: str | Path = "build/i2c_measure",
            reset_s: float = RESET_PULSE_S, ready_s: float = READY_S) -> dict:
    """Simulate the whole start-up with the given parameters; returns the result JSON as a dict.

    Raises
    ------
    RuntimeError
        If the testbench failed (the message names the log).
    """
    sim = build(build_dir, clk_hz, i2c_hz, reset_s, ready_s, stretch_ns=0)
    fails, log, result = run_case(sim, "startup")
    if fails:
        raise RuntimeError(f"the start-up testbench failed; see {log}")
    return json.loads(result.read_text())


def main(argv=None):
    ap = argparse.ArgumentParser(description="Measure the Si5324 start-up time in simulation (Verilator).")
    ap.add_argument("--clk-hz", type=int, default=200_000_000)
    ap.add_argument("--i2c-hz", type=int, default=100_000)
    ap.add_argument("--build-dir", default="build/i2c_measure")
    args = ap.parse_args(argv)
    r = measure(args.clk_hz, args.i2c_hz, args.build_dir)
    ms = r["startup_cycles"] / args.clk_hz * 1e3
    print(f"startup_cycles={r['startup_cycles']} ({ms:.3f} ms at {args.clk_hz / 1e6:g} MHz, "
          f"I2C {args.i2c_hz / 1e3:g} kHz), writes={len(r['writes'])}")


if __name__ == "__main__":
    main()
