"""Checks of the arguments of public calls, made at the call.

The rule (README, "Errors"): an argument of the wrong *type* raises :exc:`TypeError`; one
of the right type but a bad *value* raises :exc:`coord.ConfigurationError` (a
:exc:`ValueError`), as Python's builtins do (``int([])`` against ``int("x")``). Each
helper checks the type only and returns the value; the caller checks its range.
"""

from __future__ import annotations

import math

from .exceptions import ConfigurationError

__all__ = [
    "LAYOUTS",
    "check_bool",
    "check_bytes",
    "check_duration",
    "check_int",
    "check_layout",
    "check_seconds",
    "check_size",
    "check_str",
    "check_ttl",
    "check_type",
]


def check_type(value: object, kind: type | tuple[type, ...], what: str, expected: str) -> None:
    """Raise TypeError, saying that *what* must be *expected* (``"a str"``), unless
    *value* is an instance of *kind*."""
    if not isinstance(value, kind):
        raise TypeError(f"{what} must be {expected}, not {type(value).__name__}")


def check_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    return value


def check_bool(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{what} must be True or False, not {type(value).__name__}")
    return value


def check_bytes(value: object, what: str) -> bytes:
    """*value* as bytes (given as bytes, a bytearray or a memoryview)."""
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"{what} must be bytes, not {type(value).__name__}")
    return bytes(value)


def check_size(value: object, limit: int, what: str) -> bytes:
    """*value* as bytes (TypeError if it is not), if it takes at most *limit* bytes, the
    store's limit (else ConfigurationError): checked at the call, before any request."""
    data = check_bytes(value, what)
    if len(data) > limit:
        raise ConfigurationError(
            f"{what} is {len(data):,} bytes; this store takes at most {limit:,}"
        )
    return data


def check_int(value: object, what: str) -> int:
    """*value*, an int that is not a bool (``True`` is no count)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    return value


def check_seconds(value: object, what: str) -> float:
    """*value* as a float: a number of seconds (an int or a float, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    return float(value)


def check_supervisor(fn: object, cooldown: object) -> float:
    """A supervisor's (``Election.run``, ``Group.run``) function and cooldown, checked at
    the call: TypeError unless *fn* is callable and *cooldown* a number of seconds,
    ConfigurationError unless the cooldown is >= 0 and finite. Returns the cooldown."""
    if not callable(fn):
        raise TypeError(f"fn must be an async function, not {type(fn).__name__}")
    seconds = check_seconds(cooldown, "cooldown")
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ConfigurationError(f"cooldown must be >= 0 seconds, not {cooldown!r}")
    return seconds


def check_duration(value: object, what: str) -> float:
    """*value*, a protocol duration (a timeout), as a float: TypeError if it is not a
    number of seconds, ConfigurationError unless it is > 0 and finite."""
    seconds = check_seconds(value, what)
    if not 0 < seconds < math.inf:
        raise ConfigurationError(f"{what} must be > 0 seconds, not {value!r}")
    return seconds


def check_ttl(ttl: object, limit: float | None = None, store: str = "the store") -> float:
    """Return *ttl* as a float if it is a valid lease TTL (at most *limit*, what *store*
    allows), else raise ConfigurationError (TypeError if it is not a number)."""
    ttl = check_seconds(ttl, "ttl")
    if not math.isfinite(ttl) or ttl <= 0:
        raise ConfigurationError(f"ttl must be a positive number of seconds, not {ttl!r}")
    if limit is not None and ttl > limit:
        raise ConfigurationError(f"ttl={ttl:g}s is longer than {store} allows ({limit:g}s)")
    return ttl


#: The lock and election layouts coord speaks: its own, etcd's Go ``concurrency``, and
#: kazoo's and Curator's recipes on ZooKeeper.
LAYOUTS = ("coord", "etcd", "kazoo", "curator")

_PEERS = {
    "etcd": ("etcd's Go concurrency package", "an etcd:// store"),
    "kazoo": ("kazoo's lock and election recipes", "a zk:// store"),
    "curator": ("Apache Curator's lock and leader recipes", "a zk:// store"),
}


def check_layout(layout: object, spoken: frozenset[str] | None = None, store: str = "") -> str:
    """*layout* if it is a known layout (and, given *spoken*, one the store speaks), else
    ConfigurationError, at the call: a lock in the wrong layout would not exclude its
    peers, which is worse than no lock.

    :raises TypeError: if *layout* is not a str
    """
    layout = check_str(layout, "layout")
    if layout not in LAYOUTS:
        raise ConfigurationError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    if spoken is not None and layout not in spoken:
        peer, where = _PEERS[layout]
        raise ConfigurationError(
            f"the {layout!r} layout is {peer}: {store or 'this store'} does not speak it "
            f"(use layout='coord', or {where})"
        )
    return layout
