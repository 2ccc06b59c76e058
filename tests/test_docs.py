"""The user guide (docs/, mkdocs.yml): it builds without a warning, and every ```python
block in it runs.

Each block is a whole program, run as a script in a subprocess of its own. The guide's
convention: examples call ``coord.connect()`` with no URL, so they read ``COORD_URL``;
here that is a fresh ``memory://`` store, unless an HTML comment right before the block
asks for a real server:

* ``<!-- needs: etcd -->`` or ``<!-- needs: zookeeper -->``: ``COORD_URL`` is a fresh
  namespace on the test session's server;
* ``<!-- needs: kafka -->``: ``KAFKA_BOOTSTRAP`` is the test session's broker too;
* ``<!-- no-run -->``: a fragment on purpose. They are counted (:data:`FRAGMENTS`) so
  that none is added silently.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"

#: The fragments (``<!-- no-run -->`` blocks) the guide has on purpose, per page.
FRAGMENTS = {"kafka.md": 1}

_FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<code>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_MARK = re.compile(r"<!--\s*(?P<mark>no-run|needs:\s*\w+)\s*-->\s*\Z")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    code: str
    mark: str  # "", "no-run", "etcd", "zookeeper", "kafka"

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks() -> list[Block]:
    """Every ```python block of the guide, with the mark of the comment before it."""
    found = []
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text()
        for match in _FENCE.finditer(text):
            language = match["info"].split()[0] if match["info"].strip() else ""
            if language != "python":
                assert "py" not in language, f"{path.name}: fence {language!r}: use python"
                continue
            mark = _MARK.search(text[: match.start()].rstrip() + "\n")
            mark_text = mark["mark"] if mark else ""
            line = text.count("\n", 0, match.start()) + 1
            found.append(
                Block(path.name, line, match["code"], mark_text.removeprefix("needs:").strip())
            )
    return found


BLOCKS = blocks()
RUNNABLE = [b for b in BLOCKS if b.mark != "no-run"]


def test_every_block_runs_or_is_a_counted_fragment() -> None:
    fragments: dict[str, int] = {}
    for block in BLOCKS:
        assert block.mark in ("", "no-run", "etcd", "zookeeper", "kafka"), block.id
        if block.mark == "no-run":
            fragments[block.page] = fragments.get(block.page, 0) + 1
    assert fragments == FRAGMENTS
    assert len(RUNNABLE) >= 20, "the guide lost its examples"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "block",
    [
        pytest.param(b, id=b.id, marks=[getattr(pytest.mark, b.mark)] if b.mark else [])
        for b in RUNNABLE
    ],
)
def test_block_runs(block: Block, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    from coord.testing.pytest_plugin import fresh_namespace

    env = {**os.environ, "COORD_URL": f"memory://{fresh_namespace()}"}
    if block.mark in ("etcd", "zookeeper"):
        env["COORD_URL"] = request.getfixturevalue(f"{block.mark}_url")
    if block.mark == "kafka":
        env["KAFKA_BOOTSTRAP"] = request.getfixturevalue("kafka_broker").bootstrap
    script = tmp_path / "example.py"
    script.write_text(block.code)
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=45,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, f"{block.id}:\n{result.stdout}{result.stderr}"


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
