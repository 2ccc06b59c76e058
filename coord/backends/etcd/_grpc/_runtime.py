"""Which :class:`~._pipe.Runtime` the etcd transport runs on: anyio's generic one
(streams, ``anyio.Event``, ``anyio.current_time``) on every event loop but asyncio, and on
asyncio its fast path (``_asyncio``), which does the same for less CPU.

The choice is made once per channel, in the event loop that runs it. :data:`fast_path`
turns asyncio's off, so that tests and benchmarks run the generic path on asyncio too.
"""

from __future__ import annotations

import anyio

from . import _asyncio
from ._pipe import Runtime
from ._stream import dial

__all__ = ["GENERIC", "current_runtime", "fast_path"]

#: anyio's runtime: what trio (and any loop but asyncio) runs.
GENERIC = Runtime(anyio.current_time, anyio.Event, anyio.Event, dial)

#: Whether asyncio takes its fast path (tests and benchmarks set it False to measure or
#: test the generic path on asyncio).
fast_path = True


def current_runtime() -> Runtime:
    """The runtime for the running event loop."""
    if fast_path and _library() == "asyncio":
        return _asyncio.runtime()
    return GENERIC


def _library() -> str:
    try:
        import sniffio
    except ImportError:  # trio needs sniffio: without it, only asyncio can be running
        return "asyncio"
    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:  # made outside an event loop (a test's)
        return ""
