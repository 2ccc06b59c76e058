"""Real coordination servers as local processes, for tests.

Each server runs on free loopback ports in a temporary directory and can be stopped,
restarted (same ports, same data), paused with SIGSTOP and resumed. These are blocking,
synchronous helpers meant for (session-scoped) pytest fixtures, not for the event loop.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from ._metrics import parse_metric

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import TracebackType

__all__ = ["EtcdCluster", "EtcdServer", "ServerNotFound", "ServerTLS", "free_port"]


class ServerNotFound(RuntimeError):
    """The server binary is not installed."""


_given_ports: set[int] = set()
_port_choice = random.Random()


def _ephemeral_range_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_EPHEMERAL_START = _ephemeral_range_start()  # read once, at import: not on an event loop


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, never the same one twice in a
    process, and below the kernel's ephemeral range when it can be.

    (``bind(0)`` hands out ephemeral ports: the kernel may give the same one twice in a
    row — a server then got the same port for its client and peer listeners — and any
    outgoing connection may take it before the server binds it.)
    """
    low, high = _worker_range(20000 if _EPHEMERAL_START > 21001 else 1024, _EPHEMERAL_START - 1)
    for _ in range(200):
        port = _port_choice.randint(low, high)
        if port in _given_ports:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given_ports.add(port)
        return port
    while True:  # the range is crowded: let the kernel choose
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _given_ports:
            _given_ports.add(port)
            return port


def _worker_range(low: int, high: int) -> tuple[int, int]:
    """The share of ports ``low..high`` of this pytest-xdist worker (``gw3`` of 4 gets the
    fourth quarter), so that parallel workers never pick the same port at the same moment;
    the whole range outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        index, count = int(worker.removeprefix("gw")), int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    except (KeyError, ValueError):
        return low, high
    share = (high - low + 1) // max(count, 1)
    if not 0 <= index < count or share < 100:
        return low, high
    return low + index * share, low + (index + 1) * share - 1


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of process *pid* is stopped (Linux /proc)."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        for task in tasks.iterdir():
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state not in ("T", "t"):
                return False
    except (FileNotFoundError, ProcessLookupError):
        return False
    return True


class _Process:
    """A server process with a log file, started and stopped by subclasses."""

    name = "server"

    def __init__(self, directory: str | os.PathLike[str] | None) -> None:
        self._own_dir = directory is None
        self.directory: Path = Path(directory or tempfile.mkdtemp(prefix=f"coord-{self.name}-"))
        self.log_path: Path = self.directory / f"{self.name}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def _env(self) -> dict[str, str] | None:
        return None

    @property
    def endpoint(self) -> str:
        """``host:port`` that clients connect to."""
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def cpu_seconds(self) -> float:
        """The CPU time (user and system) the server's process and its children have
        used so far (Linux: ``/proc``): for benchmarks that report the store's cost per
        operation.

        :raises RuntimeError: if the server is not running
        """
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError("the server is not running")
        pids = [self._proc.pid]
        total = 0
        while pids:
            pid = pids.pop()
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{pid}/task/{pid}/children") as children:
                    pids.extend(int(child) for child in children.read().split())
            except FileNotFoundError:  # it ended meanwhile
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
        return total / os.sysconf("SC_CLK_TCK")

    def start(self, *, timeout: float = 60.0) -> Self:
        """Start the server and wait until it serves requests."""
        if self.running:
            return self
        self.launch()
        return self.wait_ready(timeout=timeout)

    def launch(self) -> None:
        """Start the process without waiting (members of a cluster start together)."""
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self._command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                env=self._env(),
                start_new_session=True,
            )

    def wait_ready(self, *, timeout: float = 60.0) -> Self:
        """Wait until the launched server serves requests."""
        assert self._proc is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self._proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} not ready after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.05)
        return self

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server (SIGTERM, or SIGKILL with ``kill=True``). Data is kept."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        if self._paused:
            self.resume_process(proc)
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self, *, kill: bool = False) -> Self:
        """Stop and start again on the same ports with the same data."""
        self.stop(kill=kill)
        return self.start()

    def pause(self, *, timeout: float = 5.0) -> None:
        """SIGSTOP the server: connections stay open, nothing is answered.

        Returns once every thread of the server has stopped (a signal takes effect
        asynchronously: a request sent right after ``kill`` could still be answered).
        Blocking: from async code, call it through ``anyio.to_thread.run_sync``.
        """
        if self._proc is None:
            return
        os.killpg(self._proc.pid, signal.SIGSTOP)
        self._paused = True
        deadline = time.monotonic() + timeout
        while not _all_threads_stopped(self._proc.pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not stop within {timeout}s")
            time.sleep(0.001)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self._proc is not None:
            self.resume_process(self._proc)

    def resume_process(self, proc: subprocess.Popen[bytes]) -> None:
        os.killpg(proc.pid, signal.SIGCONT)
        self._paused = False

    def log_tail(self, lines: int = 60) -> str:
        """The last lines of the server's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        """Stop the server and remove its directory (if we made it)."""
        self.stop(kill=True)
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.close()


@dataclass(frozen=True)
class ServerTLS:
    """PEM files for a server with TLS on its client port: an :class:`EtcdServer`, or a
    :class:`~coord.testing.ZooKeeperServer` (on its ``secureClientPort``).

    :ivar ca_file: the CA that signed the server (and client) certificates
    :ivar cert_file: the server's certificate
    :ivar key_file: its private key
    :ivar client_cert_auth: require clients to present a certificate signed by the CA;
        then *client_cert* and *client_key* are used for the server's own health checks
    :ivar client_cert: a client certificate signed by the CA
    :ivar client_key: its private key
    """

    ca_file: str
    cert_file: str
    key_file: str
    client_cert_auth: bool = False
    client_cert: str | None = None
    client_key: str | None = None

    def args(self) -> list[str]:
        args = [
            f"--cert-file={self.cert_file}",
            f"--key-file={self.key_file}",
            f"--trusted-ca-file={self.ca_file}",
        ]
        return [*args, "--client-cert-auth"] if self.client_cert_auth else args

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.client_cert and self.client_key:
            context.load_cert_chain(self.client_cert, self.client_key)
        return context


class EtcdServer(_Process):
    """A single-member etcd cluster on loopback.

    Example::

        with EtcdServer() as etcd:
            async with coord.connect(etcd.url + "/myapp") as client: ...

    :param binary: the ``etcd`` executable; default ``$COORD_ETCD_BIN`` or ``etcd`` on PATH
    :param directory: where data and log go; a fresh temporary directory by default
    :param election_timeout_ms: short by default so that restarts recover quickly and
        leases as short as 1 s are allowed
    :raises ServerNotFound: if the binary is not installed
    """

    name = "etcd"

    def __init__(
        self,
        *,
        binary: str | None = None,
        directory: str | os.PathLike[str] | None = None,
        election_timeout_ms: int = 500,
        heartbeat_ms: int = 50,
        tls: ServerTLS | None = None,
        extra_args: Sequence[str] = (),
        member: str = "coord-test",
        cluster: dict[str, int] | None = None,
    ) -> None:
        found = binary or os.environ.get("COORD_ETCD_BIN") or shutil.which("etcd")
        if not found or not Path(found).exists():
            raise ServerNotFound(
                "etcd not found: install Debian's etcd-server package "
                "(apt-get install etcd-server) or set COORD_ETCD_BIN"
            )
        super().__init__(directory)
        self.binary: str = found
        self.client_port: int = free_port()
        self.peer_port: int = free_port()
        self._election = election_timeout_ms
        self._heartbeat = heartbeat_ms
        self.tls = tls
        self._extra = list(extra_args)
        self.member = member
        self._cluster = cluster  # member name -> peer port, for a multi-member cluster

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        """``etcd://127.0.0.1:<port>``; append ``/namespace`` to isolate a test."""
        return f"etcd://{self.endpoint}"

    def _command(self) -> list[str]:
        client = f"{self._scheme}://{self.endpoint}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        tls = self.tls.args() if self.tls else []
        return [
            self.binary,
            *tls,
            *self._extra,
            f"--name={self.member}",
            f"--data-dir={self.directory / 'data'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={self._initial_cluster(peer)}",
            f"--election-timeout={self._election}",
            f"--heartbeat-interval={self._heartbeat}",
            "--logger=zap",
            "--log-outputs=stderr",
        ]

    def _initial_cluster(self, peer: str) -> str:
        if not self._cluster:
            return f"{self.member}={peer}"
        return ",".join(f"{m}=http://127.0.0.1:{p}" for m, p in self._cluster.items())

    @property
    def _scheme(self) -> str:
        return "https" if self.tls else "http"

    def _get(self, path: str, timeout: float) -> bytes:
        context = self.tls.client_context() if self.tls else None
        url = f"{self._scheme}://{self.endpoint}{path}"
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:
            return bytes(resp.read())

    def _ready(self) -> bool:
        with contextlib.suppress(OSError, ValueError):
            return b'"true"' in self._get("/health", 1)
        return False

    def metrics(self) -> str:
        """The Prometheus text from ``/metrics``."""
        return self._get("/metrics", 5).decode()

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of metric *name* whose labels include *labels*."""
        return parse_metric(self.metrics(), name, **labels)


M = TypeVar("M", bound="_Process")


class _Cluster(Generic[M]):
    """Several members of one replicated store on loopback: what an etcd cluster and a
    ZooKeeper ensemble have in common. Subclasses set ``members``, ``scheme`` and
    :meth:`leader`."""

    scheme = ""
    members: list[M]

    @property
    def url(self) -> str:
        return f"{self.scheme}://" + ",".join(m.endpoint for m in self.members)

    def start(self, *, timeout: float = 60.0) -> Self:
        """Start every member, then wait until all serve (they need a leader first)."""
        for member in self.members:
            member.launch()
        for member in self.members:
            member.wait_ready(timeout=timeout)
        return self

    def leader(self) -> M | None:
        """The member that leads now, or None while there is none."""
        raise NotImplementedError

    def wait_for_leader(self, *, timeout: float = 30.0) -> M:
        """The leader, once one is elected (polls the members: test support)."""
        deadline = time.monotonic() + timeout
        while (leader := self.leader()) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no leader after {timeout}s\n{self._report()}")
            time.sleep(0.05)
        return leader

    def _report(self) -> str:
        """Each member's state and log tail, for a failure message."""
        parts = []
        for i, member in enumerate(self.members, 1):
            parts.append(f"--- member {i} ({member.endpoint}): {self._state(member)}")
            parts += self._log(member)[-40:]
        return "\n".join(parts)

    def _state(self, member: M) -> str:
        return "running" if member.running else "stopped"

    def _log(self, member: M) -> list[str]:
        return member.log_tail(40).splitlines()

    def close(self) -> None:
        for member in self.members:
            member.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class EtcdCluster(_Cluster["EtcdServer"]):
    """Several etcd members forming one cluster on loopback (3 by default).

    Example::

        with EtcdCluster() as cluster:
            url = cluster.url + "/test"      # etcd://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3
            cluster.members[0].stop()        # the others keep the quorum

    :raises ServerNotFound: if etcd is not installed
    """

    def __init__(self, size: int = 3, **options: Any) -> None:
        ports = {f"member{i}": free_port() for i in range(size)}
        self.members: list[EtcdServer] = [
            EtcdServer(member=name, cluster=ports, **options) for name in ports
        ]
        for member, port in zip(self.members, ports.values(), strict=True):
            member.peer_port = port

    scheme = "etcd"

    def leader(self) -> EtcdServer | None:
        """The member that leads now, or None while there is none."""
        for member in self.members:
            if member.running:
                with contextlib.suppress(OSError, ValueError):
                    if member.metric("etcd_server_is_leader") == 1:
                        return member
        return None
