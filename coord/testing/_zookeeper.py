"""A real ZooKeeper (Debian's ``zookeeper`` package, on Java) as a local process, for tests.

It runs ``org.apache.zookeeper.server.ZooKeeperServerMain`` (a standalone server) with a
generated ``zoo.cfg`` on a free loopback port, in a temporary directory:

* a short ``tickTime`` (100 ms), so that session timeouts from 0.2 s up are allowed
  (ZooKeeper accepts 2 to 20 ticks unless told otherwise; the maximum is raised here) and
  sessions expire close to their timeout;
* the four-letter words allowed (``mntr`` gives the server-side counters the tests
  read), the admin web server off, no fsync (a test server does not need durability
  across power loss, and fsync makes every write cost milliseconds);
* containers checked every second instead of every minute, so that tests see empty
  lock parents removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from pathlib import Path

from ._servers import ServerNotFound, _Process, free_port

__all__ = ["ZooKeeperServer"]

_DEFAULT_JARS = ("/usr/share/java/zookeeper.jar", "/usr/share/zookeeper/zookeeper.jar")
# slf4j's simple binding logs to stderr (our log file); without a binding ZooKeeper is
# silent, and a failed test would have no server log to show.
_LOG_BINDINGS = ("/usr/share/java/slf4j-simple.jar",)


def _find_jar() -> str | None:
    configured = os.environ.get("COORD_ZOOKEEPER_JAR")
    if configured:
        return configured if Path(configured).exists() else None
    return next((jar for jar in _DEFAULT_JARS if Path(jar).exists()), None)


def four_letter_word(host: str, port: int, command: str, *, timeout: float = 2.0) -> str:
    """Send a four-letter word (``mntr``, ``srvr``, ``cons``...) and return the answer."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(command.encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


class ZooKeeperServer(_Process):
    """A standalone ZooKeeper on loopback.

    Example::

        with ZooKeeperServer() as zk:
            async with coord.connect(zk.url + "/myapp", ttl=5) as client: ...

    :param java: the ``java`` executable; default ``$COORD_ZOOKEEPER_JAVA`` or ``java``
        on PATH
    :param jar: ZooKeeper's jar; default ``$COORD_ZOOKEEPER_JAR`` or Debian's
        ``/usr/share/java/zookeeper.jar`` (its manifest lists its dependencies)
    :param directory: where data, configuration and log go; a fresh temporary directory
        by default
    :param tick_ms: ZooKeeper's tickTime; sessions may be 2 ticks to
        *max_session_timeout_ms* long
    :raises ServerNotFound: if Java or ZooKeeper is not installed
    """

    name = "zookeeper"

    def __init__(
        self,
        *,
        java: str | None = None,
        jar: str | None = None,
        directory: str | os.PathLike[str] | None = None,
        tick_ms: int = 100,
        max_session_timeout_ms: int = 120_000,
        container_check_ms: int = 1_000,
    ) -> None:
        found_java = java or os.environ.get("COORD_ZOOKEEPER_JAVA") or shutil.which("java")
        found_jar = jar or _find_jar()
        found = [found_java, found_jar]
        if not all(path and Path(path).exists() for path in found):
            raise ServerNotFound(
                "ZooKeeper not found: install Debian's zookeeper package (apt-get install "
                "zookeeper; it brings Java) or set COORD_ZOOKEEPER_JAR / COORD_ZOOKEEPER_JAVA"
            )
        super().__init__(directory)
        self.java, self.jar = str(found_java), str(found_jar)
        self.port = free_port()
        self.tick_ms = tick_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.container_check_ms = container_check_ms

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """``zk://127.0.0.1:<port>``; append ``/chroot`` to isolate a test."""
        return f"zk://{self.endpoint}"

    def _config(self) -> Path:
        path = self.directory / "zoo.cfg"
        path.write_text(
            "\n".join(
                [
                    f"dataDir={self.directory / 'data'}",
                    f"clientPort={self.port}",
                    "clientPortAddress=127.0.0.1",
                    f"tickTime={self.tick_ms}",
                    f"minSessionTimeout={2 * self.tick_ms}",
                    f"maxSessionTimeout={self.max_session_timeout_ms}",
                    "maxClientCnxns=0",
                    "4lw.commands.whitelist=*",
                    "admin.enableServer=false",
                    "forceSync=no",
                    "preAllocSize=1024",
                    "",
                ]
            )
        )
        return path

    def _command(self) -> list[str]:
        classpath = [self.jar, *(jar for jar in _LOG_BINDINGS if Path(jar).exists())]
        return [
            self.java,
            # A small, quickly started JVM: the server's start-up is what tests wait for.
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Xms32m",
            "-Xmx256m",
            "-Dzookeeper.jmx.log4j.disable=true",
            f"-Dznode.container.checkIntervalMs={self.container_check_ms}",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-cp",
            os.pathsep.join(classpath),
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            str(self._config()),
        ]

    def _ready(self) -> bool:
        with contextlib.suppress(OSError):
            return "zk_server_state" in self.four_letter_word("mntr", timeout=0.5)
        return False

    def four_letter_word(self, command: str, *, timeout: float = 2.0) -> str:
        """Send a four-letter word (``mntr``, ``srvr``, ``cons``...) to the server."""
        return four_letter_word("127.0.0.1", self.port, command, timeout=timeout)

    def mntr(self) -> dict[str, str]:
        """The server's ``mntr`` counters (``zk_packets_sent``, ...), as strings."""
        pairs = (line.split("\t", 1) for line in self.four_letter_word("mntr").splitlines())
        return {pair[0]: pair[1] for pair in pairs if len(pair) == 2}
