"""Building request records: create flags, ACLs, and a multi's operations.

The operations of :meth:`WireClient.multi <._client.WireClient.multi>` are kazoo
records naming the caller's paths (the client adds the chroot when it sends them):

* :func:`create_op`: kazoo's ``Create2``, or :class:`~._records.CreateContainer`
  (a multi answers both with ``(path, stat)``);
* :func:`delete_op`, :func:`set_data_op`, :func:`check_op`: kazoo's ``Delete``,
  ``SetData``, ``CheckVersion``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kazoo.protocol.serialization import CheckVersion, Create2, Delete, SetData
from kazoo.security import OPEN_ACL_UNSAFE

from ._records import CONTAINER, EPHEMERAL, SEQUENCE, CreateContainer

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["check_op", "create_op", "delete_op", "set_data_op", "with_path"]


def create_op(
    path: str,
    data: bytes = b"",
    acl: Sequence[Any] | None = None,
    *,
    ephemeral: bool = False,
    sequence: bool = False,
    container: bool = False,
) -> Any:
    """A create (answered with the node's path and stat).

    :param acl: kazoo ``ACL`` objects; default: open to all (``OPEN_ACL_UNSAFE``)
    :param container: a container node (the server removes it once it has had
        children and has none left); neither ephemeral nor sequential
    :raises ValueError: for a container that is also ephemeral or sequential
    """
    if container and (ephemeral or sequence):
        raise ValueError("a container node is neither ephemeral nor sequential")
    acl = list(OPEN_ACL_UNSAFE if acl is None else acl)
    if container:
        return CreateContainer(path, data, acl, CONTAINER)
    flags = (EPHEMERAL if ephemeral else 0) | (SEQUENCE if sequence else 0)
    return Create2(path, data, acl, flags)


def delete_op(path: str, version: int = -1) -> Any:
    """A delete (of *version* only, unless -1)."""
    return Delete(path, version)


def set_data_op(path: str, data: bytes, version: int = -1) -> Any:
    """A set data (of *version* only, unless -1), answered with the new stat."""
    return SetData(path, data, version)


def check_op(path: str, version: int = -1) -> Any:
    """A check that the node exists (at *version*, unless -1)."""
    return CheckVersion(path, version)


def with_path(record: Any, path: str) -> Any:
    """*record* (a kazoo namedtuple record) for *path* instead."""
    return record._replace(path=path)
