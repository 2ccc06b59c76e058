"""A real Apache Curator peer for the tests: ``curator/CuratorPeer.java``, compiled once
per test run with ``javac`` against Debian's jars (``libcurator-recipes-java`` 5.4,
``default-jdk-headless``), run as ``java CuratorPeer <connect string> <session ms>`` and
driven line by line over its stdin and stdout.

The peer prints ``ready`` once connected. A chroot in the connect string becomes Curator's
namespace (created on first use), so the peer's ``/a`` is coord's ``a`` under the same
``zk://host:port/chroot``. Commands, one a line, and what the peer prints:

=============================  ============================================================
``lock <path>``                InterProcessMutex(path).acquire() (reentrant, per path);
                               ``locked <path> <node name>`` once held
``unlock <path>``              its release(); ``unlocked <path>``
``read <path>``                InterProcessReadWriteLock(path).readLock().acquire();
                               ``read-locked <path>``
``unread <path>``              ``read-unlocked <path>``
``write <path>``               the writeLock(); ``write-locked <path>``
``unwrite <path>``             ``write-unlocked <path>``
``semaphore <path> <n>``       InterProcessSemaphoreV2(path, n).acquire();
                               ``lease <path> <node name>``
``unsemaphore <path>``         the lease closed; ``unleased <path>``
``latch <path> <id>``          LeaderLatch(path, id).start(); its listener prints
                               ``leader <path> <id>`` and ``not-leader <path> <id>``
``unlatch <path>``             close() (silent: no ``not-leader``); ``unlatched <path>``
``leader-of <path> [kind]``    ``leader-of <path> <id>`` or ``leader-of <path> NONE``: the
                               getLeader() of a LeaderLatch (kind ``latch``, the default)
                               or a LeaderSelector (kind ``selector``) on *path*, not started
``selector <path> <id>``       LeaderSelector(path) with setId(id), autoRequeue off:
                               ``selected <path> <id>`` in takeLeadership, held until
                               ``unselect``; ``not-selected <path> <id>`` if Curator
                               interrupts the term (connection SUSPENDED or LOST)
``unselect <path>``            the term ends, close(); ``unselected <path>``
=============================  ============================================================

Any failure prints ``error <command>: <exception>`` (one line), never a hang. Connection
states print as ``state <CONNECTED|SUSPENDED|RECONNECTED|LOST|READ_ONLY>``; Curator's own
warnings (slf4j-simple) share stdout and are ignored. Commands on one (recipe, path) run in
order on one thread of their own (Curator's mutexes belong to the acquiring thread), so an
``unlock`` sent while its ``lock`` still waits runs after it; a blocked acquire on one path
never holds up commands on another.

Python side::

    peer = await curator_peers.start(zookeeper_url, session_timeout=4)
    await peer.send("lock /a")
    line = await peer.expect("locked /a", timeout=10)   # "locked /a _c_...-lock-0000000000"
    await peer.expect_none("locked /b", within=0.5)     # nothing of the kind meanwhile
    peer.kill()                                         # SIGKILL: its session times out

The ``curator_peers`` fixture kills every peer it started at teardown. A missing ``javac``
or jar is a loud skip on a laptop and a failure when ``CI`` is set (``scripts/bootstrap``
installs them).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn
from urllib.parse import urlsplit

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from types import TracebackType

    from anyio.abc import Process

__all__ = ["CuratorPeer", "CuratorPeers", "curator_classpath", "curator_peers"]

SOURCE = Path(__file__).parent / "curator" / "CuratorPeer.java"
JAVA_DIR = Path(os.environ.get("COORD_JAVA_DIR", "/usr/share/java"))
#: Debian's jars the peer needs (curator-recipes' manifest lists the same, less the
#: logger): libcurator-{recipes,framework,client}-java, libzookeeper-java,
#: libguava-java, libslf4j-java.
JARS = (
    "curator-recipes",
    "curator-framework",
    "curator-client",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
    "slf4j-simple",
)
#: The JVM starts faster and lighter on a shared 2-core machine with these.
JVM_FLAGS = (
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xss512k",
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
)


def _missing(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: a missing tool fails the run)", pytrace=False)
    pytest.skip(f"SKIPPED LOUDLY: {reason}")


def build_peer(directory: Path) -> str:
    """Compile the peer into *directory*; its class path (the jars, then *directory*)."""
    javac, java = shutil.which("javac"), shutil.which("java")
    if javac is None or java is None:
        _missing("javac/java not installed (Debian: apt-get install default-jdk-headless)")
    jars = [JAVA_DIR / f"{name}.jar" for name in JARS]
    absent = [jar.name for jar in jars if not jar.exists()]
    if absent:
        _missing(
            f"{', '.join(absent)} not in {JAVA_DIR} "
            "(Debian: apt-get install libcurator-recipes-java)"
        )
    classpath = os.pathsep.join(str(jar) for jar in jars)
    done = subprocess.run(
        [javac, "-Xlint:all,-path", "-Werror", "-cp", classpath, "-d", str(directory), SOURCE],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"javac failed on {SOURCE.name}:\n{done.stdout}{done.stderr}", pytrace=False)
    return os.pathsep.join([classpath, str(directory)])


def connect_string(url: str) -> str:
    """ZooKeeper's connect string (``host:port,...[/chroot]``) of a ``zk://`` URL; a
    connect string is returned as it is."""
    if "://" not in url:
        return url
    parts = urlsplit(url)
    return parts.netloc + parts.path.rstrip("/")


def _matches(line: str, prefix: str) -> bool:
    return line == prefix or line.startswith(prefix + " ")


class CuratorPeer:
    """One running peer. Use it from one task at a time."""

    def __init__(self, process: Process, name: str) -> None:
        assert process.stdout is not None
        self.process = process
        self.name = name
        #: Every line the peer printed, for failure messages.
        self.history: list[str] = []
        self._stdout = BufferedByteReceiveStream(process.stdout)
        self._unread: list[str] = []  # printed, not yet matched by an expect

    async def send(self, line: str) -> None:
        """Send one command line."""
        assert self.process.stdin is not None
        await self.process.stdin.send(line.encode() + b"\n")

    # The deadline is the assertion's (a failure names the line and shows the peer's
    # output), not a waiting API's: hence a timeout parameter here.
    async def expect(self, prefix: str, *, timeout: float = 10.0) -> str:  # noqa: ASYNC109
        """The next line that is *prefix* or starts with *prefix* and a space; lines
        printed before that are kept for later expects. An ``error`` line, or the peer
        exiting, fails at once (unless *prefix* is ``error``)."""
        if (line := self._take(prefix)) is not None:
            return line
        try:
            with anyio.fail_after(timeout):
                while True:
                    line = await self._line(prefix)
                    if _matches(line, prefix):
                        return line
                    self._unread.append(line)
        except TimeoutError:
            raise AssertionError(self._report(f"no {prefix!r} within {timeout} s")) from None

    async def expect_none(self, prefix: str, *, within: float) -> None:
        """Fail if a line matching *prefix* was or is printed in the next *within* s."""
        if (line := self._take(prefix)) is not None:
            raise AssertionError(self._report(f"unexpected {line!r}"))
        with anyio.move_on_after(within):
            while True:
                line = await self._line(prefix)
                if _matches(line, prefix):
                    raise AssertionError(self._report(f"unexpected {line!r}"))
                self._unread.append(line)

    def kill(self) -> None:
        """SIGKILL the peer: no goodbye to ZooKeeper, its session times out."""
        if self.process.returncode is None:
            self.process.kill()

    async def aclose(self) -> None:
        self.kill()
        with anyio.move_on_after(10, shield=True):
            await self.process.wait()
        await self.process.aclose()

    def _take(self, prefix: str) -> str | None:
        for i, line in enumerate(self._unread):
            if _matches(line, prefix):
                return self._unread.pop(i)
            if line.startswith("error ") and not prefix.startswith("error"):
                raise AssertionError(self._report(line))
        return None

    async def _line(self, prefix: str) -> str:
        try:
            raw = await self._stdout.receive_until(b"\n", 1 << 16)
        except (anyio.EndOfStream, anyio.IncompleteRead):
            code = await self.process.wait()
            raise AssertionError(self._report(f"exited ({code}) before {prefix!r}")) from None
        line = raw.decode(errors="replace").rstrip("\r")
        self.history.append(line)
        if line.startswith("error ") and not prefix.startswith("error"):
            raise AssertionError(self._report(line))
        return line

    def _report(self, what: str) -> str:
        shown = "\n  ".join(self.history[-40:])
        return f"Curator peer {self.name}: {what}; it printed:\n  {shown}"


class CuratorPeers:
    """Starts peers, and kills every one of them on exit."""

    def __init__(self, classpath: str) -> None:
        self.classpath = classpath
        self._peers: list[CuratorPeer] = []

    async def start(
        self, url: str, *, session_timeout: float = 4.0, ready_within: float = 30.0
    ) -> CuratorPeer:
        """A new peer (a ZooKeeper session of its own) on *url* (``zk://`` or a connect
        string), once it printed ``ready``."""
        argv = [
            "java",
            *JVM_FLAGS,
            "-cp",
            self.classpath,
            "CuratorPeer",
            connect_string(url),
            str(round(session_timeout * 1000)),
        ]
        process = await anyio.open_process(argv, stderr=subprocess.STDOUT)
        peer = CuratorPeer(process, f"#{len(self._peers) + 1}")
        self._peers.append(peer)
        await peer.expect("ready", timeout=ready_within)
        return peer

    async def __aenter__(self) -> CuratorPeers:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        for peer in self._peers:
            peer.kill()
        for peer in self._peers:
            await peer.aclose()


@pytest.fixture(scope="session")
def curator_classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The class path of the compiled peer, compiled once per test run: the xdist workers
    of a run share one build in the run's base temporary directory, made by the first
    that needs it while the others wait on a file lock (javac took about 4 s, once per
    worker). A build that failed is not kept: the next worker tries again, and fails."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's, shared by its workers
    directory = root / "curator-peer"
    with (root / "curator-peer.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            built = directory / "classpath.txt"
            if built.exists():
                return built.read_text()
            directory.mkdir(exist_ok=True)
            classpath = build_peer(directory)
            built.write_text(classpath)
            return classpath
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture
async def curator_peers(curator_classpath: str) -> AsyncIterator[CuratorPeers]:
    """Start Curator peers with ``await curator_peers.start(zookeeper_url)``; all are
    killed when the test ends."""
    async with CuratorPeers(curator_classpath) as peers:
        yield peers
