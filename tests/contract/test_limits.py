"""The store's limits, run on every backend: one task's bad input fails that call only.

Every value that can reach the store is checked at the call, in bytes as stored, and
refused with ConfigurationError with nothing written; a job's failure message is cut to
fit, so that no ending of a claim is refused on size (issue 17, items 3 and 4).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.lowlevel
import pytest

import coord
from coord.abc import Create, Put, Update

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from coord.abc import Op

pytestmark = pytest.mark.anyio

#: A job key whose every character JSON escapes as 12 bytes (a surrogate pair).
WIDEST_KEY = "\U0001f600" * 256
#: A failure message whose every character JSON escapes as 6 bytes.
WIDE_MESSAGE = "错" * 1000


async def claims_of(client: coord.Client, name: str) -> list[str]:
    return [e.key for e in (await client.backend.entries(f"{name}/_claims/")).entries]


@pytest.mark.parametrize("on_exhausted", ["park", "dead_letter"])
async def test_a_failure_message_never_wedges_its_key(
    clients: list[coord.Client], on_exhausted: Literal["park", "dead_letter"]
) -> None:
    """The largest job put takes, with the widest key and job id (so its marker too),
    under the longest name, fails twice with a message that grows sixfold in JSON: the
    retry, then the park or dead letter, are written (the message cut to fit) and the
    claim goes; the key is not blocked."""
    a, b, _, _ = clients
    name = "wedge/" + "错" * 500  # about the longest name (its lock adds "/_turn")
    queue = a.queue(name, max_attempts=2, on_exhausted=on_exhausted, retry_delay=0)
    size = queue.max_payload_size
    await queue.put(b"\xab" * size, key=WIDEST_KEY, job_id=WIDEST_KEY)
    await queue.put(b"next", key=WIDEST_KEY)
    worker = b.queue(name, max_attempts=2, on_exhausted=on_exhausted, retry_delay=0)
    with anyio.fail_after(20):
        for attempt in (0, 1):  # a retry in place, then the last attempt
            with pytest.raises(ValueError, match="错"):
                async with worker.claim() as job:
                    assert (job.attempt, len(job.payload)) == (attempt, size)
                    raise ValueError(WIDE_MESSAGE)
        assert await claims_of(a, name) == []
        if on_exhausted == "park":
            assert (await queue.stats()).parked == 1
            assert await queue.unpark(WIDEST_KEY) == 1
            async with worker.claim() as job:
                assert (job.attempt, len(job.payload)) == (0, size)
        else:
            (letter,) = await queue.dead_letters()
            assert (letter.attempts, len(letter.payload)) == (2, size)
            assert letter.error is not None
            assert letter.error.startswith("ValueError: 错错")
            assert letter.error.endswith("...")
        async with worker.claim() as job:  # the next job of the key
            assert job.payload == b"next"


@pytest.mark.parametrize("on_exhausted", ["park", "dead_letter"])
async def test_the_largest_job_with_every_option_at_its_widest_ends_every_way(
    clients: list[coord.Client], on_exhausted: Literal["park", "dead_letter"]
) -> None:
    """A payload of exactly max_payload_size, with the widest key and job id, the
    widest priority, timeout and not_before as stored, put (and by put_many), fails
    with a message that grows sixfold in JSON: retried, then parked or dead-lettered."""
    a, b, _, _ = clients
    options: dict[str, Any] = {
        "key": WIDEST_KEY,
        "priority": -(2**31 - 1),
        "timeout": 1.7976931348623157e308,
        "not_before": -1.7976931348623157e308,
    }
    queue = a.queue("widest", max_attempts=2, on_exhausted=on_exhausted, priorities=True)
    size = queue.max_payload_size
    await queue.put(b"\xab" * size, job_id=WIDEST_KEY, **options)
    await queue.put_many([coord.NewJob(b"\xcd" * size, **options)])
    worker = b.queue(
        "widest", max_attempts=2, on_exhausted=on_exhausted, retry_delay=0, priorities=True
    )
    with anyio.fail_after(20):
        for attempt in (0, 1):
            with pytest.raises(ValueError, match="错"):
                async with worker.claim() as job:
                    assert (job.attempt, len(job.payload)) == (attempt, size)
                    raise ValueError(WIDE_MESSAGE)
        assert await claims_of(a, "widest") == []
        if on_exhausted == "park":
            assert (await queue.stats()).parked == 1
        else:
            (letter,) = await queue.dead_letters()
            assert (letter.attempts, len(letter.payload)) == (2, size)


async def test_put_takes_max_payload_size_and_not_a_byte_more(
    clients: list[coord.Client],
) -> None:
    """The docs' figure: 991,591 bytes on every store, with the widest key."""
    queue = clients[0].queue("largest")
    assert queue.max_payload_size == 991_591
    await queue.put(b"\xab" * queue.max_payload_size, key=WIDEST_KEY)
    with pytest.raises(coord.ConfigurationError, match="at most 991,591"):
        await queue.put(b"\xab" * (queue.max_payload_size + 1))
    assert (await queue.stats()).depth == 1


async def test_a_too_large_proclaim_beside_other_holds_fails_only_that_call(
    clients: list[coord.Client],
) -> None:
    """One task leads, another holds a mutex, a third a claim, all on one client. Too
    large a value or request fails that call only, with ConfigurationError and nothing
    written: ZooKeeper dropped the connection of a packet over jute.maxbuffer, and with
    it every hold of the client; etcd answered BackendError (issue 17, item 4)."""
    a = clients[0]
    backend = a.backend
    await a.queue("beside").put(b"job")
    done = anyio.Event()
    holds: list[coord.Hold | coord.Job] = []

    async def hold_mutex() -> None:
        async with a.mutex("beside/mutex") as hold:
            holds.append(hold)
            await done.wait()

    async def hold_claim() -> None:
        async with a.queue("beside").claim() as job:
            holds.append(job)
            await done.wait()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_mutex)
            tg.start_soon(hold_claim)
            async with a.election("beside/leader").campaign(b"v") as term:
                while len(holds) < 2:  # noqa: ASYNC110  (a test waiting for its tasks)
                    await anyio.sleep(0.01)
                room = a.election("beside/leader").max_value_size
                assert backend.max_value_size - 200 < room < backend.max_value_size
                for size in (2_000_000, backend.max_value_size + 1, room + 200):
                    with pytest.raises(coord.ConfigurationError, match="store takes at most"):
                        await term.proclaim(b"p" * size)
                three: list[Op] = [Put(f"beside/big{i}", b"b" * 600_000) for i in range(3)]
                with pytest.raises(coord.ConfigurationError, match="per request"):
                    await backend.transact(three)
                with pytest.raises(coord.ConfigurationError, match="keys take at most"):
                    await backend.get("k" * 2_000_000)
                await anyio.sleep(1)  # a dropped connection would void the holds by now
                assert not term.lost
                assert [hold.lost for hold in holds] == [False, False]
                assert (await a.election("beside/leader").leader()).value == b"v"  # type: ignore[union-attr]
                assert await backend.get("beside/big0") is None
            done.set()  # the mutex is released and the job acked: no LockLost, no ClaimLost
    assert (await a.queue("beside").stats()).depth == 0


async def test_every_call_writes_a_value_of_max_value_size(clients: list[coord.Client]) -> None:
    """The largest value a store takes goes through every write: etcd sent a put's value
    twice (once per branch of its transaction) and refused it as too large."""
    a = clients[0]
    backend = a.backend
    value = b"v" * backend.max_value_size
    assert (await backend.put("big/put", value)).value == value
    assert (await backend.put("big/put", value)).value == value  # an existing key
    assert await backend.compare_and_set("big/cas", value, version=None) is not None
    position = await backend.register("big/queue/", "@wbig", None, value=value)
    assert await backend.transact([Update(position.entry, value)]) is not None
    assert await backend.transact([Create("big/queue/", "@wnew", value)]) is not None
    election = a.election("big/leader")
    leader = value[: election.max_value_size]  # less the candidate's record (who, when)
    async with election.campaign(leader) as term:
        await term.proclaim(leader[1:])
        assert (await election.leader()).value == leader[1:]  # type: ignore[union-attr]
        await coord.fenced_put(term, "big/fenced", value)
    assert (await backend.get("big/fenced")).value == value  # type: ignore[union-attr]


async def test_a_value_a_byte_too_large_is_refused_at_the_call(
    clients: list[coord.Client],
) -> None:
    """campaign() and run() refuse it when called (not when entered), as proclaim,
    fenced_put and every backend write do, with nothing written."""
    a = clients[0]
    backend = a.backend
    over = b"v" * (backend.max_value_size + 1)
    election = a.election("over/leader")
    with pytest.raises(coord.ConfigurationError, match="a leader's value is 1,000,001 bytes"):
        election.campaign(over)
    with pytest.raises(coord.ConfigurationError, match="a leader's value"):
        await election.run(lambda term: anyio.lowlevel.checkpoint(), over)
    async with a.mutex("over/lock") as hold:
        with pytest.raises(coord.ConfigurationError, match="fenced_put value"):
            await coord.fenced_put(hold, "over/fenced", over)
    writes: list[Callable[[], Awaitable[object]]] = [
        lambda: backend.put("over/put", over),
        lambda: backend.compare_and_set("over/cas", over, version=None),
        lambda: backend.register("over/queue/", "@wover", None, value=over),
        lambda: backend.transact([Create("over/queue/", "@wnew", over)]),
    ]
    for write in writes:
        with pytest.raises(coord.ConfigurationError, match="at most 1,000,000"):
            await write()
    assert await backend.names("over") == []
    assert await backend.get("over/put") is None


async def test_keys_and_transactions_past_the_limits_are_refused(
    clients: list[coord.Client],
) -> None:
    backend = clients[0].backend
    longest = "k/" + "é" * 2047  # 4,096 bytes in UTF-8
    await backend.put(longest, b"x")
    assert await backend.get(longest) is not None
    with pytest.raises(coord.ConfigurationError, match="4,097 bytes; keys take at most"):
        await backend.put(longest + "x", b"x")
    many: list[Op] = [Create("ops/", f"@w{i}", b"x") for i in range(65)]
    with pytest.raises(coord.ConfigurationError, match="at most 64"):
        await backend.transact(many)
    assert await backend.transact(many[:64]) is not None


async def test_the_widest_identity_fits_every_waiter_record(coord_url: str) -> None:
    """A client's identity (128 characters, each escaped as 12 bytes) is recorded in each
    of its waiter keys and claims: they are always far below the store's limit."""
    async with coord.connect(coord_url, identity="\U0001f600" * 128) as client:
        await client.queue("who").put(b"job")
        with anyio.fail_after(10):
            async with client.mutex("who/lock"), client.queue("who").claim():
                (waiter,) = await client.mutex("who/lock").holders()
                assert waiter.identity["name"] == "\U0001f600" * 128
