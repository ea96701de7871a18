"""Constructor parameter checks of the gateware: one way to reject a component's parameters.

Amaranth registers every :class:`~amaranth.hdl.Elaboratable` (and so every
:class:`~amaranth.lib.wiring.Component`) as it is created, and warns "created but never used"
(:class:`~amaranth.hdl.UnusedElaboratable`) when one is garbage-collected without having been
elaborated. A component whose constructor raises on a bad parameter is such an object: the caller
never got it, yet the warning would name it, after the real error. Every component that checks
its parameters therefore does so inside :func:`rejecting`::

    def __init__(self, width):
        with rejecting(self):
            check_width(width)
        super().__init__(...)

Amaranth 0.5 has no public switch for this; :func:`silence_unused` sets the private flag its
``MustUse`` base class reads (``_MustUse__silence``), here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

__all__ = ["silence_unused", "rejecting", "reject"]


def silence_unused(elaboratable) -> None:
    """Turn off the "created but never used" warning for ``elaboratable`` (a component whose
    constructor is failing). Objects that are not Amaranth elaboratables are left alone."""
    if hasattr(type(elaboratable), "_MustUse__silence"):
        elaboratable._MustUse__silence = True


@contextmanager
def rejecting(elaboratable) -> Iterator[None]:
    """Context manager for a constructor's parameter checks: an exception raised inside goes on
    unchanged, and ``elaboratable`` (the object being constructed) will not be reported as
    created but never used."""
    try:
        yield
    except BaseException:
        silence_unused(elaboratable)
        raise


def reject(elaboratable, exc: BaseException) -> NoReturn:
    """Raise ``exc`` from the constructor of ``elaboratable``, without the "created but never
    used" warning; for checks that are not a ``with`` block (:func:`rejecting`)."""
    silence_unused(elaboratable)
    raise exc
