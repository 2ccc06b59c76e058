"""A real ZooKeeper (Debian's ``zookeeper`` package, on Java) as a local process, for tests.

It runs ``org.apache.zookeeper.server.ZooKeeperServerMain`` (a standalone server) with a
generated ``zoo.cfg`` on a free loopback port, in a temporary directory:

* a short ``tickTime`` (100 ms), so that session timeouts from 0.2 s up are allowed
  (ZooKeeper accepts 2 to 20 ticks unless told otherwise; the maximum is raised here) and
  sessions expire close to their timeout;
* the four-letter words allowed (``mntr`` gives the server-side counters the tests
  read), the admin web server off, no fsync by default (a test server does not need
  durability across power loss, and fsync makes every write cost milliseconds;
  ``force_sync=True`` for benchmarks, as production runs it);
* containers checked every second instead of every minute, so that tests see empty
  lock parents removed;
* with ``tls=``, a ``secureClientPort`` too (Netty's connection factory, the PEM files
  given as its key and trust stores), with client certificates required if the
  :class:`ServerTLS` says so. The plain ``clientPort`` stays (the four-letter words
  the harness reads go there).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ._servers import ServerNotFound, ServerTLS, _Cluster, _Process, free_port

__all__ = ["Quorum", "ZooKeeperEnsemble", "ZooKeeperServer"]

_DEFAULT_JARS = ("/usr/share/java/zookeeper.jar", "/usr/share/zookeeper/zookeeper.jar")
# slf4j's simple binding logs to stderr (our log file); without a binding ZooKeeper is
# silent, and a failed test would have no server log to show.
_LOG_BINDINGS = ("/usr/share/java/slf4j-simple.jar",)
# Netty's TLS handler needs netty-codec, which Debian's zookeeper.jar manifest leaves
# out of its class path (the server fails every TLS connection without it).
_NETTY_CODEC = ("/usr/share/java/netty-codec.jar",)


def _find_jar() -> str | None:
    configured = os.environ.get("COORD_ZOOKEEPER_JAR")
    if configured:
        return configured if Path(configured).exists() else None
    return next((jar for jar in _DEFAULT_JARS if Path(jar).exists()), None)


@dataclass(frozen=True)
class Quorum:
    """A member's place in an ensemble: its id and every member's (peer, election) ports.

    :ivar myid: this member's id (1, 2, ...)
    :ivar ports: member id -> (quorum port, leader-election port)
    """

    myid: int
    ports: dict[int, tuple[int, int]]

    def config(self) -> list[str]:
        # Ticks are 100 ms: give a slow machine 10 s to sync, 4 s to answer the leader.
        lines = ["initLimit=100", "syncLimit=40"]
        return lines + [
            f"server.{i}=127.0.0.1:{peer}:{election}"
            for i, (peer, election) in sorted(self.ports.items())
        ]


def _accepts(host: str, port: int) -> bool:
    """Whether a TCP connection to *host*:*port* is accepted now."""
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return False
    return True


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
    :param force_sync: fsync the transaction log before each write is acknowledged, as
        production ensembles do (``forceSync=yes``); off by default, for tests
    :param jvm: ``"quick"`` (the default, for tests): a small JVM that starts quickly
        (its first compiler only, the serial collector, a 256 MB heap), whose server is
        slower per request; ``"production"``: the JVM's own defaults (both compilers,
        its default collector and heap), as production runs ZooKeeper: for benchmarks
    :param tls: also serve TLS, on :attr:`secure_port`, with these PEM files
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
        quorum: Quorum | None = None,
        force_sync: bool = False,
        jvm: Literal["quick", "production"] = "quick",
        tls: ServerTLS | None = None,
    ) -> None:
        if jvm not in ("quick", "production"):
            raise ValueError(f"jvm must be 'quick' or 'production', not {jvm!r}")
        found_java = java or os.environ.get("COORD_ZOOKEEPER_JAVA") or shutil.which("java")
        found_jar = jar or _find_jar()
        found = [found_java, found_jar]
        if not all(path and Path(path).exists() for path in found):
            raise ServerNotFound(
                "ZooKeeper not found: install Debian's zookeeper package (apt-get install "
                "zookeeper; it brings Java) or set COORD_ZOOKEEPER_JAR / COORD_ZOOKEEPER_JAVA"
            )
        super().__init__(directory)
        self.java: str = str(found_java)
        self.jar: str = str(found_jar)
        self.port: int = free_port()
        self.tick_ms = tick_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.container_check_ms = container_check_ms
        self.quorum = quorum
        self.force_sync = force_sync
        self.jvm = jvm
        self.tls = tls
        #: The TLS port (0 without ``tls``).
        self.secure_port: int = free_port() if tls is not None else 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """``zk://127.0.0.1:<port>``; append ``/chroot`` to isolate a test."""
        return f"zk://{self.endpoint}"

    @property
    def tls_endpoint(self) -> str:
        """``127.0.0.1:<secure port>`` (with ``tls``)."""
        return f"127.0.0.1:{self.secure_port}"

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
                    f"forceSync={'yes' if self.force_sync else 'no'}",
                    "preAllocSize=1024",
                    *(self.quorum.config() if self.quorum else []),
                    *self._tls_config(),
                    "",
                ]
            )
        )
        if self.quorum is not None:
            (self.directory / "data").mkdir(exist_ok=True)
            (self.directory / "data" / "myid").write_text(f"{self.quorum.myid}\n")
        return path

    def _tls_config(self) -> list[str]:
        if self.tls is None:
            return []
        # ZooKeeper reads a PEM key store as the certificate and its key in one file.
        keystore = self.directory / "keystore.pem"
        keystore.write_text(
            Path(self.tls.cert_file).read_text() + Path(self.tls.key_file).read_text()
        )
        return [
            f"secureClientPort={self.secure_port}",
            "secureClientPortAddress=127.0.0.1",
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
            f"ssl.keyStore.location={keystore}",
            "ssl.keyStore.type=PEM",
            f"ssl.trustStore.location={self.tls.ca_file}",
            "ssl.trustStore.type=PEM",
            f"ssl.clientAuth={'need' if self.tls.client_cert_auth else 'none'}",
        ]

    def _command(self) -> list[str]:
        jars = (*_LOG_BINDINGS, *(_NETTY_CODEC if self.tls else ()))
        classpath = [self.jar, *(jar for jar in jars if Path(jar).exists())]
        # A small, quickly started JVM: the server's start-up is what tests wait for.
        quick = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xms32m", "-Xmx256m"]
        return [
            self.java,
            *(quick if self.jvm == "quick" else []),
            "-Dzookeeper.jmx.log4j.disable=true",
            f"-Dznode.container.checkIntervalMs={self.container_check_ms}",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-cp",
            os.pathsep.join(classpath),
            (
                "org.apache.zookeeper.server.quorum.QuorumPeerMain"
                if self.quorum
                else "org.apache.zookeeper.server.ZooKeeperServerMain"
            ),
            str(self._config()),
        ]

    def _ready(self) -> bool:
        if self.state() not in ("standalone", "leader", "follower"):
            return False
        # The TLS port is bound after the plain one, which may answer mntr first.
        return self.tls is None or _accepts("127.0.0.1", self.secure_port)

    def state(self) -> str | None:
        """``zk_server_state`` from ``mntr`` (standalone, leader, follower), or None if
        the server does not serve (yet, or any more)."""
        with contextlib.suppress(OSError):
            for line in self.four_letter_word("mntr", timeout=2).splitlines():
                name, _, value = line.partition("\t")
                if name == "zk_server_state":
                    return value.strip()
        return None

    def four_letter_word(self, command: str, *, timeout: float = 2.0) -> str:
        """Send a four-letter word (``mntr``, ``srvr``, ``cons``...) to the server."""
        return four_letter_word("127.0.0.1", self.port, command, timeout=timeout)

    def mntr(self) -> dict[str, str]:
        """The server's ``mntr`` counters (``zk_packets_sent``, ...), as strings."""
        pairs = (line.split("\t", 1) for line in self.four_letter_word("mntr").splitlines())
        return {pair[0]: pair[1] for pair in pairs if len(pair) == 2}


class ZooKeeperEnsemble(_Cluster["ZooKeeperServer"]):
    """Several ZooKeeper servers forming one ensemble on loopback (3 by default).

    Example::

        with ZooKeeperEnsemble() as ensemble:
            url = ensemble.url + "/test"      # zk://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3
            ensemble.leader().stop(kill=True)  # the others elect a new leader

    :param size: the number of servers (odd)
    :param options: passed to each :class:`ZooKeeperServer`
    :raises ServerNotFound: if Java or ZooKeeper is not installed
    """

    def __init__(self, size: int = 3, **options: Any) -> None:
        ports = {i: (free_port(), free_port()) for i in range(1, size + 1)}
        self.members: list[ZooKeeperServer] = [
            ZooKeeperServer(quorum=Quorum(i, ports), **options) for i in range(1, size + 1)
        ]

    scheme = "zk"

    def leader(self) -> ZooKeeperServer | None:
        """The member that leads now, or None while there is none."""
        return next((m for m in self.members if m.running and m.state() == "leader"), None)

    def _state(self, member: ZooKeeperServer) -> str:
        return (member.state() or "not serving") if member.running else "stopped"

    def _log(self, member: ZooKeeperServer) -> list[str]:
        # Without the lines our own mntr polling adds to it.
        lines = member.log_tail(400).splitlines()
        return [line for line in lines if "mntr" not in line and "four letter" not in line]
