"""The fast engine's frame player: what every Verilator model with a C++ frame player shares.

The cocotb testbench (:mod:`wirereduce.sim.engines.runner`) drives every beat from Python through
cocotbext-axi, a few thousand simulated cycles a second: fine for tests, far too slow for a
16 MiB allreduce. In the fast engine (:class:`~wirereduce.sim.engines.fastengine.FastEngineSim`)
the host side (:class:`~wirereduce.host.engine.EngineAllreduce`) still builds every frame and checks
every result, but the frames are handed over in one *script* to a compiled testbench
(``tb_fast.cpp``) that plays them on the host ports cycle by cycle and records what comes back
with cycle stamps. This module holds the pieces of that: the script's gates (:func:`_gated`: a
push waits for its window, every host's CONTROL answer for the start barrier), the rounds of an
allreduce with retries (:func:`play_rounds`, :func:`rounds_cycles`), reading the result and the
10G tap (:func:`write_pcap`), the Verilog clean-ups (:func:`strip_zero_memory_init`,
:func:`internal_reset`) and the option checks.
"""

from __future__ import annotations

import re
import struct
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from wirereduce.host.driver import (
    ChunksLost,
    check_timeout,
)
from wirereduce.sim.engines.runner import SimulationError

__all__ = ["FastSim", "check_options", "check_late", "play_rounds", "rounds_cycles",
           "strip_zero_memory_init", "internal_reset", "write_pcap"]

_SCRIPT_MAGIC = 0x34535257  # "WRS4"
_STALL_GATE = 0xFFFFFFFF    # a script frame sent only once the run stalls (tb_fast.cpp)
_RESULT_MAGIC = 0x31525257  # "WRR1"


@dataclass
class _Run:
    """What one played round of an allreduce gave
    (:meth:`~wirereduce.sim.engines.fastengine.FastEngineSim.allreduce`)."""

    sim_cycles: int
    first_push: int
    wall_s: float
    #: Rank → STATS read after a stall; None if the round completed.
    stall_stats: dict | None = None
    #: How the loss showed (a stall, or chunks reported lost).
    what: str = ""
    #: Each node's CONTROL acknowledgement (a completed round).
    acks: list = field(default_factory=list)
    #: Cycle of the last HOST_RESULT beat (a completed round).
    last_result: int = 0
    #: Each node's STATS after its last result (a completed round with ``final_stats``).
    final: list = field(default_factory=list)


def play_rounds(job, play: Callable[[bool], _Run], lost: Callable[[_Run], ChunksLost]) -> list[_Run]:
    """Play the rounds of ``job`` (a driver :class:`~wirereduce.host.driver.Allreduce` or a
    :class:`~wirereduce.host.engine.EngineAllreduce`) until one completes; their runs, in order.

    ``play(first)`` plays the round ``job`` holds now in a fresh simulation (``first``: the first
    round, the only one with the fault injection, the tap and a late host). A run with
    ``stall_stats`` lost chunks: ``lost(run)`` is the :class:`~wirereduce.host.driver.ChunksLost`
    that ``job.retry`` takes; it is raised when no retries are left.
    """
    runs = [play(True)]
    while runs[-1].stall_stats is not None:
        err = lost(runs[-1])
        if not job.retry(err):
            raise err
        runs.append(play(False))
    return runs


def rounds_cycles(runs: list[_Run], nodes: int) -> tuple[int, list]:
    """An allreduce's cycles and STATS from the runs of its rounds (:func:`play_rounds`). One round:
    from its first push to its last result beat, and the CONTROL acknowledgements. After retries:
    from the first push of the first round to the end of the last (stall detection and the new
    CONTROLs included), and the first round's STATS read after its stall (None where a node did
    not answer)."""
    first, last = runs[0], runs[-1]
    if len(runs) == 1:
        return last.last_result - first.first_push + 1, last.acks
    return (first.sim_cycles - first.first_push + sum(r.sim_cycles for r in runs[1:]),
            [first.stall_stats.get(k) for k in range(nodes)])


def _gated(data: bytes, own_gate: int, all_gate: int) -> bytes:
    return struct.pack("<3I", len(data), own_gate, all_gate) + data


class FastSim:
    """The frame player's side of a compiled Verilator model: :meth:`_play` runs the model's
    executable (``self.exe``, built by the subclass, :class:`~wirereduce.sim.engines.fastengine.FastEngineSim`)
    on one frame script and returns its wall-clock seconds, with a progress bar of result chunks.
    The subclass sets ``exe`` and ``setup`` (``nodes``, ``tag()``)."""

    def _play(self, script: Path, result: Path, progress: bool, total_chunks: int, tap: Path | None = None) -> float:
        t0 = time.perf_counter()
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=total_chunks, unit="chunk", desc=f"{self.setup.tag()}", leave=False)
        args = [str(self.exe), str(script), str(result)] + ([str(tap)] if tap is not None else [])
        proc = subprocess.Popen(args, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        done = 0
        for line in proc.stdout:
            if line.startswith("P ") and bar is not None:
                got = int(line.split()[2]) - self.setup.nodes  # minus the CONTROL answers
                bar.update(max(0, got - done))
                done = max(done, got)
        err = proc.stderr.read()
        proc.wait()
        if bar is not None:
            bar.update(total_chunks - done)
            bar.close()
        if proc.returncode != 0:
            raise SimulationError(f"the frame player failed (exit {proc.returncode}): {err.strip()}")
        return time.perf_counter() - t0


def _read_result(path: Path, nodes: int):
    buf = path.read_bytes()
    magic, cycles, status = struct.unpack_from("<IQI", buf, 0)
    if magic != _RESULT_MAGIC:
        raise SimulationError(f"{path}: not a frame player result file")
    off = 16
    per_node = []
    for _ in range(nodes):
        (ns,) = struct.unpack_from("<I", buf, off)
        off += 4
        sent = np.frombuffer(buf, dtype="<u8", count=2 * ns, offset=off).reshape(ns, 2)
        off += 16 * ns
        (nr,) = struct.unpack_from("<I", buf, off)
        off += 4
        received = []
        for _ in range(nr):
            ln, first, last = struct.unpack_from("<IQQ", buf, off)
            off += 20
            received.append((first, last, buf[off:off + ln]))
            off += ln
        per_node.append((sent, received))
    return cycles, status, per_node


def _read_tap(path: Path) -> list[tuple[int, bytes]]:
    """(first cycle, frame bytes) of every frame in a frame player tap file."""
    buf = path.read_bytes()
    out, off = [], 0
    while off < len(buf):
        ln, first = struct.unpack_from("<IQ", buf, off)
        off += 12
        out.append((first, buf[off:off + ln]))
        off += ln
    return out


def write_pcap(path: str | Path, frames, width: int = 64) -> Path:
    """Write tapped Ethernet frames to a pcap file (linktype 1, Ethernet), as the wire carried them.

    Each frame is written from its destination address to the end of its data, zero-padded to
    60 bytes as the MAC pads it (IEEE 802.3 clause 3.2.8), **without** the FCS, the usual
    capture convention (every frame alike). Timestamps are the cycle of the frame's first beat
    at the design clock (:func:`~wirereduce.sim.cluster.network.clock_mhz`), from 0 at reset.

    Parameters
    ----------
    path : path
    frames : iterable of (int, bytes)
        (first cycle, Ethernet frame without FCS).
    width : int
        Datapath width in bits, for the clock.
    """
    from scapy.layers.l2 import Ether
    from scapy.utils import PcapWriter
    from wirereduce.sim.cluster.network import clock_mhz

    hz = clock_mhz(width) * 1e6
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with PcapWriter(str(path), linktype=1, sync=False, nano=True) as w:
        for cycle, frame in frames:
            pkt = Ether(bytes(frame).ljust(60, b"\0"))
            pkt.time = cycle / hz
            w.write(pkt)
    return path


_ZERO_INIT = re.compile(r"^[ \t]*initial begin\n(?:[ \t]*\\?[\w$.]+ ?\[\d+\] = \d+'h0+;\n)+[ \t]*end\n", re.M)


def strip_zero_memory_init(text: str) -> str:
    """Drop yosys's ``initial`` blocks that only set memory words to zero.

    Every buffer word is written before it is read (a slot is read only after its push), so the
    all-zero initial contents of the local buffers and FIFOs carry no information, but at MTU
    9000 they are 65,536 lines of Verilog for four nodes, which Verilator turns into one huge
    start-up function that takes longer to compile than the rest of the model.
    """
    return _ZERO_INIT.sub("", text)


#: Cycles the frame player's models hold their reset after start-up (:func:`internal_reset`).
RESET_CYCLES = 4


def internal_reset(text: str, top: str = "wirereduce_net", cycles: int = RESET_CYCLES) -> str:
    """Replace the ``rst`` input of Verilog module ``top`` by a power-on reset: high for the first
    ``cycles`` rising edges of ``clk``, then low for good.

    Amaranth's Verilog computes every register's next value in an ``always @*`` block that reads
    ``rst``. While ``rst`` is an input of the top module, Verilator evaluates all that logic in its
    input-combinational region on every ``eval()`` (twice a cycle in the frame player) on top of
    the evaluation after the clock edge. From a register it is evaluated once a cycle: a 4-engine
    ring ran 1.87x faster (docs/architecture.md "Simulation speed"). The player then never drives
    ``rst``; what the model sees is what it saw when the player held ``rst`` for ``cycles`` edges.

    Raises
    ------
    ValueError
        If ``top`` or its ``rst`` input is not found where Amaranth's Verilog back-end puts them.
    """
    head = f"module {top}("
    start = text.find(head)
    decl = "  input rst;\n  wire rst;\n"
    end = text.find("endmodule", start)
    close = text.find(");", start)
    if start < 0 or end < 0 or not 0 <= close < end:
        raise ValueError(f"module {top} not found in the Verilog text")
    ports = [p.strip() for p in text[start + len(head):close].split(",")]
    body = text[close:end]
    if "rst" not in ports or decl not in body:
        raise ValueError(f"module {top} has no `input rst` the way Amaranth writes it")
    ports.remove("rst")
    bits = max(1, cycles.bit_length())
    por = (f"  reg [{bits - 1}:0] wirereduce_por = {bits}'d0;\n"
           f"  always @(posedge clk) if (wirereduce_por != {bits}'d{cycles})\n"
           f"    wirereduce_por <= wirereduce_por + {bits}'d1;\n"
           f"  wire rst = wirereduce_por != {bits}'d{cycles};\n")
    return text[:start] + head + ", ".join(ports) + body.replace(decl, por, 1) + text[end:]


def check_late(late, setup) -> tuple[int, int]:
    """Validate an allreduce's ``late=(rank, cycles)`` on ``setup`` (anything with ``nodes``);
    returns it (``(0, 0)``: none).

    Raises
    ------
    ValueError
        If ``late`` is not a pair, ``rank`` not a rank of the setup or ``cycles`` not an int
        from 0 to 2**40.
    """
    if late is None:
        return 0, 0
    try:
        rank, cycles = late
    except (TypeError, ValueError):
        raise ValueError(f"late must be a (rank, cycles) pair, not {late!r}") from None
    for name, v, lo, hi in (("rank", rank, 0, setup.nodes - 1), ("cycles", cycles, 0, 1 << 40)):
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise ValueError(f"late {name} must be an int from {lo} to {hi}, not {v!r}")
    return rank, cycles


def check_options(window=None, rx_valid_prob=1.0, tx_ready_prob=1.0, seed=1, timeout_cycles=None,
                  collective=1) -> None:
    """Validate the fast engine's allreduce options
    (:meth:`~wirereduce.sim.engines.fastengine.FastEngineSim.allreduce`); raises ValueError naming
    the bad one."""
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 0):
        raise ValueError(f"window must be an int ≥ 0 chunks (0: no window), not {window!r}")
    for name, p in (("rx_valid_prob", rx_valid_prob), ("tx_ready_prob", tx_ready_prob)):
        if not isinstance(p, (int, float)) or not 1e-6 <= p <= 1:
            raise ValueError(f"{name} must be a probability in [1e-6, 1], not {p!r}")
    if not isinstance(seed, int):
        raise ValueError(f"seed must be an int, not {seed!r}")
    check_timeout(timeout_cycles)
    if not isinstance(collective, int) or not 0 <= collective < 1 << 16:
        raise ValueError(f"collective must be 0 … 65535, not {collective!r}")
