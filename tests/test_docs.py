"""The docs (README.md and the user guide, docs/ with mkdocs.yml): the guide builds
without a warning, and every code block either runs as copied or is accounted for.

Blocks, by the language of their fence and the HTML comment right before them:

* ``python``: a whole program, run as a script in a subprocess of its own. Examples call
  ``coord.connect()`` with no URL, so they read ``COORD_URL``: such a block runs three
  times, on a fresh ``memory://`` store and on a fresh namespace of the test session's
  etcd and ZooKeeper (what a user copies must work on the store they run), unless the
  comment before it says otherwise:

  * ``<!-- needs: etcd -->`` or ``<!-- needs: zookeeper -->``: only on that server (a
    block about that store alone: its options, its test server);
  * ``<!-- needs: kafka -->``: ``KAFKA_BOOTSTRAP`` is the test session's broker too;
  * ``<!-- no-run -->``: a fragment on purpose (a piece of a larger program). They
    are counted (:data:`FRAGMENTS`) so that none is added silently, and compiled.

* ``sh``: run as copied by ``bash -eu`` in a temporary directory; the URLs a block
  exports must be accepted by ``coord.connect``. Only commands known to be harmless here
  (:data:`SAFE`) are run: a block that installs or serves says so with
  ``<!-- no-run: why -->`` (counted in :data:`NOT_RUN`, like any other block the comment
  marks) and what covers it instead.
* ``sh`` or ``console`` blocks of ``coord ...`` commands are left to the CLI's tests:
  ``tests/cli/test_docs_output.py`` runs the console blocks (output shown) and
  ``tests/cli/test_walkthrough.py`` the sh walkthroughs (``coord dev``, its export
  lines, then each terminal's commands); this test only recognizes them.
* ``text``: not code (a layout, a tree).
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

#: The python fragments (``<!-- no-run -->``) the docs have on purpose, per page.
FRAGMENTS = {"kafka.md": 1, "partitions.md": 1, "interop.md": 1}
#: The other blocks that are not run (``<!-- no-run: why -->``), per page.
NOT_RUN = {"README.md": 2, "index.md": 2, "fencing.md": 1, "interop.md": 2}

#: The commands a shell block may run here.
SAFE = {"export", "echo", "cat", "ls", "mkdir", "cd", "python", "python3"}

_FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<code>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_MARK = re.compile(r"<!--\s*(?P<mark>no-run|needs:\s*\w+)(?::\s*(?P<why>[^>]*?))?\s*-->\s*\Z")
_EXPORT = re.compile(r"^export (COORD_URL|COORD_ZK_URL)=(\S+)", re.MULTILINE)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    code: str
    mark: str  # "", "no-run", "etcd", "zookeeper", "kafka"
    why: str  # what a "no-run: why" says

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def cli(self) -> bool:
        """A block of ``coord ...`` commands: the CLI output test's."""
        commands = [line.lstrip("$ ") for line in self.code.splitlines()]
        return self.language in ("sh", "console") and any(
            c.split()[:1] == ["coord"] for c in commands
        )


def blocks() -> list[Block]:
    """Every fenced block of the docs, with the mark of the comment before it."""
    found = []
    for path in PAGES:
        text = path.read_text()
        for match in _FENCE.finditer(text):
            mark = _MARK.search(text[: match.start()].rstrip() + "\n")
            line = text.count("\n", 0, match.start()) + 1
            found.append(
                Block(
                    path.name,
                    line,
                    match["info"].strip(),
                    match["code"],
                    mark["mark"].removeprefix("needs:").strip() if mark else "",
                    (mark["why"] or "") if mark else "",
                )
            )
    return found


BLOCKS = blocks()
PYTHON = [b for b in BLOCKS if b.language == "python" and b.mark != "no-run"]
SHELL = [b for b in BLOCKS if b.language == "sh" and not b.cli and b.mark != "no-run"]


def _count(kept: list[Block]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for block in kept:
        counts[block.page] = counts.get(block.page, 0) + 1
    return counts


def test_every_block_runs_or_is_accounted_for() -> None:
    for block in BLOCKS:
        assert block.language in ("python", "sh", "console", "text", "sql", "java"), block.id
        assert block.mark in ("", "no-run", "etcd", "zookeeper", "kafka"), block.id
        if block.language != "python":
            assert block.mark in ("", "no-run"), f"{block.id}: needs: is for python blocks"
        if block.language in ("console", "sql"):
            assert block.cli or block.mark == "no-run", f"{block.id}: run it or say why not"
    fragments = [b for b in BLOCKS if b.language == "python" and b.mark == "no-run"]
    assert _count(fragments) == FRAGMENTS
    assert all(not b.why for b in fragments)
    not_run = [b for b in BLOCKS if b.language != "python" and b.mark == "no-run"]
    assert _count(not_run) == NOT_RUN
    assert all(b.why for b in not_run), "say what covers a block that is not run"
    assert len(PYTHON) >= 20, "the docs lost their examples"
    assert any(b.page == "README.md" for b in PYTHON), "the README's first example runs"
    assert any(b.cli for b in BLOCKS), "the CLI blocks are recognized"


#: A block that connects to the store ``COORD_URL`` names (no URL given).
_READS_URL = re.compile(r"coord\.connect\((\)|[a-z_]+\s*=)")
_SERVERS = ("etcd", "zookeeper")


def stores_of(block: Block) -> list[str]:
    """The stores *block* runs on: its own server only, if it names one; all three if it
    reads ``COORD_URL``; else once (``COORD_URL`` is then a memory store)."""
    if block.mark in _SERVERS:
        return [block.mark]
    return ["memory", *_SERVERS] if _READS_URL.search(block.code) else ["memory"]


def _env(block: Block, request: pytest.FixtureRequest, store: str = "memory") -> dict[str, str]:
    from coord.testing.pytest_plugin import fresh_namespace

    env = {**os.environ, "COORD_URL": f"memory://{fresh_namespace()}"}
    env.pop("KAFKA_BOOTSTRAP", None)
    if store in _SERVERS:
        env["COORD_URL"] = request.getfixturevalue(f"{store}_url")
    if block.mark == "kafka":
        env["KAFKA_BOOTSTRAP"] = request.getfixturevalue("kafka_broker").bootstrap
    return env


def _run(block: Block, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "example.py"
    script.write_text(block.code)
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=45,
        env=env,
        cwd=tmp_path,
    )


def _marks(block: Block, store: str) -> list[pytest.MarkDecorator]:
    names = {store, block.mark} - {"memory", ""}
    return [getattr(pytest.mark, name) for name in sorted(names)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("block", "store"),
    [
        pytest.param(b, store, id=f"{b.id}-{store}", marks=_marks(b, store))
        for b in PYTHON
        for store in stores_of(b)
    ],
)
def test_block_runs(
    block: Block, store: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    result = _run(block, _env(block, request, store), tmp_path)
    assert result.returncode == 0, f"{block.id} on {store}:\n{result.stdout}{result.stderr}"


def test_every_block_that_reads_the_url_runs_on_both_servers() -> None:
    on_servers = [b for b in PYTHON if set(_SERVERS) <= set(stores_of(b))]
    assert len(on_servers) >= 25, "the docs' examples are run on etcd and ZooKeeper"
    assert all(b.mark in _SERVERS or b in on_servers for b in PYTHON if _READS_URL.search(b.code))


@pytest.mark.parametrize(
    "block",
    [b for b in BLOCKS if b.language == "python" and b.mark == "no-run"],
    ids=lambda b: b.id,
)
def test_fragment_is_python(block: Block) -> None:
    """A fragment does not run alone, but it is Python (``await`` in the open allowed)."""
    compile(block.code, block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.mark.timeout(60)
def test_shell_blocks_run(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Every sh block that is not ``coord ...`` commands (a loop, not a parametrization:
    the docs may have none, and an empty parametrization is a skip)."""
    for block in SHELL:
        _run_shell(block, request, tmp_path)


def _run_shell(block: Block, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    commands = [c.split()[0] for c in block.code.splitlines() if c.strip()[:1] not in ("", "#")]
    assert set(commands) <= SAFE, f"{block.id}: mark it <!-- no-run: why --> or extend SAFE"
    env = _env(block, request)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    result = subprocess.run(
        ["bash", "-euc", block.code],
        capture_output=True,
        text=True,
        timeout=45,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, f"{block.id}:\n{result.stdout}{result.stderr}"
    import coord

    for variable, url in _EXPORT.findall(block.code):
        coord.connect(url)  # raises for a URL coord does not take
        assert variable != "COORD_ZK_URL" or url.startswith("zk://"), block.id


def test_the_kafka_example_without_a_broker_fails_at_once_in_one_line(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Not 30 s of retries and 85 warning lines: one line that says what to set."""
    (block,) = [b for b in PYTHON if b.mark == "kafka"]
    result = _run(block, _env(dataclasses.replace(block, mark=""), request), tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert "KAFKA_BOOTSTRAP is not set" in result.stderr
    assert "coord dev" in result.stderr


@pytest.mark.timeout(120)
def test_docs_build_strict(tmp_path: Path) -> None:
    # --strict makes every warning (a broken link, a docstring mkdocstrings cannot read)
    # an error; the output is checked too, in case a plugin only logs.
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output, output
    assert (tmp_path / "site" / "reference" / "index.html").exists()
