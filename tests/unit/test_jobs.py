"""A job's header as stored: its failure message is cut by bytes as stored (after JSON
escaping), its room is that of the widest header coord writes, and a failure whose
header still does not fit parks the job with a shortened error (issue 17, item 3)."""

from __future__ import annotations

import json
import re

import anyio
import pytest

import coord
from coord._jobs import records as _jobs
from coord.abc import Entry, Update
from coord.testing.pytest_plugin import fresh_namespace

pytestmark = pytest.mark.anyio

MESSAGES = [
    "plain ascii " * 1000,
    "错" * 1000,  # 6 bytes each as stored
    "\U0001f600" * 1000,  # 12 bytes each as stored (a surrogate pair)
    '\x00\x1f"\\' * 1000,  # control characters and escapes
    "x" * 10_000_000,
]


@pytest.mark.parametrize("message", MESSAGES, ids=["ascii", "cjk", "astral", "escapes", "10MB"])
def test_a_failure_message_is_cut_by_bytes_as_stored(message: str) -> None:
    cut = _jobs.cut_error(message)
    stored = len(json.dumps(cut))
    assert _jobs.MAX_ERROR_SIZE - 12 < stored <= _jobs.MAX_ERROR_SIZE
    assert message.startswith(cut.removesuffix("..."))
    assert cut.endswith("...")
    assert _jobs.cut_error(cut) == cut  # a rewrite of the header changes nothing


def test_a_short_message_is_kept_as_it_is() -> None:
    assert _jobs.cut_error("ValueError: 错") == "ValueError: 错"


def test_the_widest_header_fits_its_room() -> None:
    state = _jobs.State(
        id="f" * 32,
        key="\U0010ffff" * _jobs.MAX_KEY_LENGTH,
        attempt=10**18,
        not_before=1e300,
        parked=True,
        claim="f" * 32,
        error="\U0001f600" * 10_000,
    )
    assert len(_jobs.encode(state, b"")) <= _jobs.HEADER_ROOM


@pytest.mark.parametrize(
    "header",
    [b"[]", b'"text"', b"null", b'{"id": "j", "key": ["k"]}', b'{"id": "j", "claim": 7}'],
    ids=["a list", "a string", "null", "a list for key", "a number for claim"],
)
def test_a_header_of_the_wrong_shape_decodes_as_a_parked_foreign_entry(header: bytes) -> None:
    """Not a job (a header that is valid JSON but not a job's object): parked with the
    reason, never handed out, never an exception out of a look (a list raised
    AttributeError from every look at the queue)."""
    entry = Entry("q/_jobs/@jabc", _headed(header), 1, 1, 0)
    state, payload = _jobs.decode(entry)
    assert (state.id, state.parked, state.claim) == ("abc", True, None)
    assert state.error is not None
    assert state.error.startswith("not a job: ")
    assert payload == entry.value


def test_a_job_decodes_as_it_was_encoded() -> None:
    state = _jobs.State(
        id="j",
        key="k",
        attempt=2,
        not_before=5.5,
        parked=True,
        claim="c",
        error="e",
        priority=-3,
        timeout=1.5,
        extra={"later": [1]},
    )
    entry = Entry("q/_jobs/@jj", _jobs.encode(state, b"body"), 1, 1, 0)
    assert _jobs.decode(entry) == (state, b"body")
    assert _jobs.decode(entry)[0].extra == {"later": [1]}


@pytest.mark.parametrize(
    "header",
    [
        b'{"id": "j"}  ',  # whitespace after: json.loads takes it
        b' {"id": "j"}',  # and before
        b"\xef\xbb\xbf" + b'{"id": "j"}',  # a UTF-8 byte order mark
        '{"id": "j"}'.encode("utf-16"),  # another encoding json.loads detects
        b'{"id": "j"} {}',  # more after it: not JSON
        b'{"id": "\xff"}',  # not UTF-8
        rb'{"id": "j", "key": "\u00e9"}',
    ],
    ids=["space after", "space before", "a BOM", "UTF-16", "extra data", "not UTF-8", "escaped"],
)
def test_a_header_reads_as_json_loads_reads_it(header: bytes) -> None:
    """decode's header reader (json.loads' fast path for what coord writes) takes what
    json.loads takes and refuses what it refuses."""
    try:
        expected = json.loads(header)
    except ValueError as refused:
        with pytest.raises(type(refused), match=re.escape(str(refused))):
            _jobs._header(header)
        state, _ = _jobs.decode(Entry("q/_jobs/@jabc", _headed(header), 1, 1, 0))
        assert state.parked
        assert state.error is not None
        assert state.error.startswith("not a job: ")
        return
    assert _jobs._header(header) == expected
    state, _ = _jobs.decode(Entry("q/_jobs/@jabc", _headed(header), 1, 1, 0))
    assert (state.id, state.key, state.parked) == ("j", expected.get("key"), False)


def test_a_header_with_changes_is_a_new_header_and_the_old_stays() -> None:
    old = _jobs.State(id="j", key="k", attempt=1, extra={"later": 1})
    new = old.with_(claim="c", attempt=2)
    assert new == _jobs.State(id="j", key="k", attempt=2, claim="c")
    assert (old.claim, old.attempt) == (None, 1)
    assert new.extra == {"later": 1}
    with pytest.raises(TypeError, match="claimed"):
        old.with_(claimed="c")
    with pytest.raises(AttributeError):
        new.claim = "d"  # type: ignore[misc]


async def test_a_header_written_by_something_else_parks_with_a_short_error() -> None:
    """A header with fields this version does not know (so not cut by it) leaves no room
    for the failure message: the job is parked with a shortened error, and its claim
    goes, rather than an ending refused on size that would leave the claim."""
    async with coord.connect(f"memory://{fresh_namespace()}") as client:
        limit = client.backend.max_value_size
        queue = client.queue("q", max_attempts=5)
        ref = await queue.put(b"x")
        (entry,) = (await client.backend.entries("q/_jobs/")).entries
        state = _jobs.State(id=ref.id, extra={"pad": ""})
        room = limit - len(_jobs.encode(state, b"x")) - 100
        foreign = _jobs.encode(_jobs.State(id=ref.id, extra={"pad": "p" * room}), b"x")
        assert await client.backend.transact([Update(entry, foreign)]) is not None
        with anyio.fail_after(10), pytest.raises(ValueError, match="boom"):
            async with queue.claim():
                raise ValueError("boom " * 1000)
        (entry,) = (await client.backend.entries("q/_jobs/")).entries
        parked, _ = _jobs.decode(entry)
        assert (parked.parked, parked.attempt) == (True, 1)
        assert parked.error == "ValueError (message dropped)"
        assert (await client.backend.entries("q/_claims/")).entries == ()


@pytest.mark.parametrize(
    "header",
    [
        b'{"id": "j", "attempt": 1e999}',
        b'{"id": "j", "priority": Infinity}',
        b'{"id": "j", "not_before": 1' + b"0" * 400 + b"}",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"id": "j", "timeout": NaN}',
    ],
    ids=[
        "an infinite attempt",
        "an infinite priority",
        "a huge not_before",
        "deep nesting",
        "a NaN timeout",
    ],
)
def test_a_header_of_valid_json_out_of_range_decodes_as_a_parked_foreign_entry(
    header: bytes,
) -> None:
    """Valid JSON that no job has (numbers out of range, nesting too deep) is no job
    either: OverflowError and RecursionError escaped decode, out of every look."""
    entry = Entry("q/_jobs/@jabc", _headed(header), 1, 1, 0)
    state, payload = _jobs.decode(entry)
    assert (state.id, state.parked, state.claim) == ("abc", True, None)
    assert payload == entry.value


@pytest.mark.parametrize(
    "header",
    [b'{"id": "j", "attempt": 1e999}', b'{"id": "j", "timeout": NaN}'],
    ids=["an infinite attempt", "a NaN timeout"],
)
async def test_a_foreign_header_is_passed_over_and_the_next_job_claimed(header: bytes) -> None:
    """A foreign entry is parked, and the next job is claimed: an infinite attempt raised
    OverflowError out of the looker into every waiting worker; a NaN timeout (Python's
    json reads it) decoded as a job, whose claim().__aenter__ failed setting the body
    scope's deadline after entering that scope, leaving the cancel-scope stack corrupt."""
    async with coord.connect(f"memory://{fresh_namespace()}") as client:
        queue = client.queue("q")
        await queue.put(b"bad")
        (entry,) = (await client.backend.entries("q/_jobs/")).entries
        assert await client.backend.transact([Update(entry, _headed(header))]) is not None
        good = await queue.put(b"good")
        with anyio.fail_after(10):
            async with queue.claim() as job:
                assert job.id == good.id


def _headed(header: bytes) -> bytes:
    """A job entry's value with *header* as its header, and no payload."""
    return b"cq1" + len(header).to_bytes(4, "big") + header
