"""The optional extras: the one-line hint for a feature whose extra is not installed."""

from __future__ import annotations

__all__ = ["missing_extra", "needs_extra"]


def needs_extra(what: str, extra: str) -> str:
    """The hint, e.g. ``coord.kafka needs the 'kafka' extra: pip install 'coord[kafka]'``."""
    return f"{what} needs the {extra!r} extra: pip install 'coord[{extra}]'"


def missing_extra(what: str, extra: str, exc: ModuleNotFoundError) -> ModuleNotFoundError:
    """The error to raise instead of *exc*, a failed import of a module of the extra: the
    hint first, then the module that is missing (the same ``name``)."""
    return ModuleNotFoundError(f"{needs_extra(what, extra)} ({exc})", name=exc.name)
