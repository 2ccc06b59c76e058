"""The partitioner's assignment: who owns which partition, and the key hash.

The assignment is a pure function of the previous assignment and the live members, so
that its properties can be checked on their own (``tests/unit/test_assign.py``):

* **Balanced.** With M members, every member is given ⌊P/M⌋ or ⌈P/M⌉ of the P partitions.
* **Sticky.** A member keeps every partition it was given, up to its share; the ⌈P/M⌉
  shares go to the members that already hold the most, so a join or a leave moves only
  the partitions that the balance needs: those of members that left, those nobody had,
  and a member's excess over its share.

It is stored as one small record (:class:`Record`, JSON) which the coordinator writes and
every member reads; its generation is the store's revision of the write, so it strictly
increases from record to record.

:func:`partition_of` is the key hash, the same in every process and every language: the
first 8 bytes of the key's SHA-256 (UTF-8 for a str), read as a big-endian unsigned
integer, modulo the number of partitions.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._core.checks import check_int
from .._core.exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["MAX_PARTITIONS", "Record", "assign", "check_partitions", "partition_of"]

#: The most partitions a partitioner takes: each is a lock a member holds, and the record
#: names the owner of each.
MAX_PARTITIONS = 10_000


def check_partitions(partitions: object) -> int:
    """Return *partitions* if it is a valid partition count.

    :raises TypeError: if it is not an int
    :raises ConfigurationError: if it is not between 1 and :data:`MAX_PARTITIONS`
    """
    count = check_int(partitions, "partitions")
    if not 1 <= count <= MAX_PARTITIONS:
        raise ConfigurationError(f"partitions must be between 1 and {MAX_PARTITIONS}, not {count}")
    return count


def partition_of(key: str | bytes, partitions: int) -> int:
    """The partition of *key* among *partitions*: SHA-256 of the key (UTF-8 for a str),
    its first 8 bytes as a big-endian unsigned integer, modulo *partitions*.

    :raises TypeError: if *key* is neither str nor bytes
    """
    if isinstance(key, str):
        key = key.encode()
    elif not isinstance(key, (bytes, bytearray, memoryview)):
        raise TypeError(f"a partition key must be str or bytes, not {type(key).__name__}")
    digest = hashlib.sha256(key).digest()
    return int.from_bytes(digest[:8], "big") % partitions


def assign(previous: Mapping[int, str], members: Sequence[str], partitions: int) -> dict[int, str]:
    """The owner of each partition (absent: none, when there is no member), given the
    *previous* owners and the live *members* in join order. Balanced and sticky (see
    the module's docstring); the same inputs always give the same result."""
    if not members:
        return {}
    rank = {member: index for index, member in enumerate(members)}
    owned: dict[str, list[int]] = {member: [] for member in members}
    free: list[int] = []
    for partition in range(partitions):
        owner = previous.get(partition)
        if owner in owned:
            owned[owner].append(partition)
        else:
            free.append(partition)
    share, extra = divmod(partitions, len(members))
    # The larger shares go to those who hold the most (the earlier joined on a tie).
    by_holding = sorted(members, key=lambda member: (-len(owned[member]), rank[member]))
    quota = {member: share + (index < extra) for index, member in enumerate(by_holding)}
    for member in members:
        mine = owned[member]
        free.extend(mine[quota[member] :])  # the excess: the highest numbers go
        del mine[quota[member] :]
    free.sort()
    for member in members:
        need = quota[member] - len(owned[member])
        owned[member].extend(free[:need])
        del free[:need]
    return {partition: member for member, mine in owned.items() for partition in mine}


@dataclass(frozen=True)
class Record:
    """One assignment as stored: the partition count, the members it was made for (their
    waiter ids, in join order) and each partition's owner.

    :ivar generation: the store's revision of the record's write (0 before it is stored):
        strictly increasing from record to record
    """

    partitions: int
    members: tuple[str, ...]
    owners: Mapping[int, str]
    generation: int = 0

    def of(self, member: str) -> frozenset[int]:
        """The partitions given to *member*."""
        return frozenset(p for p, owner in self.owners.items() if owner == member)

    def encode(self) -> bytes:
        index = {member: i for i, member in enumerate(self.members)}
        table = [index.get(self.owners.get(p, ""), -1) for p in range(self.partitions)]
        return json.dumps(
            {"partitions": self.partitions, "members": list(self.members), "owners": table},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, value: bytes, generation: int) -> Record:
        """The record stored as *value*.

        :raises ValueError: if *value* is not a record
        """
        data = json.loads(value)
        partitions, members, table = data["partitions"], data["members"], data["owners"]
        if not (
            isinstance(partitions, int)
            and isinstance(members, list)
            and all(isinstance(m, str) for m in members)
            and isinstance(table, list)
            and len(table) == partitions
            and all(isinstance(i, int) and -1 <= i < len(members) for i in table)
        ):
            raise ValueError("not an assignment record")
        owners = {p: members[i] for p, i in enumerate(table) if i >= 0}
        return cls(partitions, tuple(members), owners, generation)
