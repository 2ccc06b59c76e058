"""Run inside a fresh virtualenv by the packaging tests: what a user of the installed wheel
meets. Standard library and coord only; prints one JSON object on stdout.

``python -I probe.py report``: where coord was imported from, its version, the installed
distributions, every module of the package imported in turn, the error of each entry
point of an extra (None where the extra is installed), and a mutex round trip on
``memory://``. ``python -I probe.py mutex URL``: a mutex round trip on a real store.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

import coord

if TYPE_CHECKING:
    from collections.abc import Callable

_Error = dict[str, str | None]

# An entry point per extra; each raises the extra's one-line hint when it is missing.
# (The cli extra's entry point, the `coord` script, is run by the tests themselves.)
_ENTRY_POINTS: dict[str, Callable[[], object]] = {
    "etcd": lambda: coord.connect("etcd://127.0.0.1:1"),
    "zookeeper": lambda: coord.connect("zk://127.0.0.1:1"),
    "kafka": lambda: importlib.import_module("coord.kafka"),
    "otel": lambda: importlib.import_module("coord.otel"),
    "cli": lambda: importlib.import_module("coord.cli").cli,
    "dev": lambda: _start_tansu(),
}


def _start_tansu() -> None:
    from coord.testing import TansuBroker

    with tempfile.TemporaryDirectory() as directory:
        TansuBroker(directory=directory).start(timeout=30).close()


def _modules() -> dict[str, _Error | None]:
    """Each module of the installed package: None if it imports, else the error."""
    root = Path(coord.__file__).parent
    result: dict[str, _Error | None] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name.endswith(".__main__"):
            continue  # runs the command
        result[name] = _error(functools.partial(importlib.import_module, name))
    return result


def _error(call: Callable[[], object]) -> _Error | None:
    """What *call* raised (its type's name, message and, for an import, the missing
    module), or None."""
    try:
        call()
    except Exception as exc:
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        return {"type": type(exc).__name__, "message": str(exc), "missing": missing}
    return None


async def _round_trip(url: str) -> list[int]:
    """Two holds of one mutex, one after the other: their fences."""
    fences = []
    async with coord.connect(url, ttl=5) as client:
        for _ in range(2):
            async with client.mutex("packaging") as hold:
                fences.append(hold.fence)
    return fences


def main(command: str, *args: str) -> object:
    if command == "mutex":
        return {"fences": anyio.run(_round_trip, args[0])}
    return {
        "coord_file": coord.__file__,
        "version": coord.__version__,
        "metadata_version": importlib.metadata.version("coord"),
        "distributions": sorted(d.metadata["Name"] for d in importlib.metadata.distributions()),
        "modules": _modules(),
        "entry_points": {extra: _error(call) for extra, call in _ENTRY_POINTS.items()},
        "memory_fences": anyio.run(_round_trip, "memory://packaging"),
    }


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
