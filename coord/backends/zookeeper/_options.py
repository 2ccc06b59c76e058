"""The ZooKeeper backend's options, checked at the call (``coord.connect``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kazoo.security import ACL, CREATOR_ALL_ACL, OPEN_ACL_UNSAFE

from ..._core.checks import check_bool, check_duration
from ..._core.exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..._core.url import ParsedURL
    from .._common.tls import TLSFiles

__all__ = ["ALLOWED", "Options", "check_hosts", "url_options"]

#: Keyword options of ``coord.connect("zk://...", **options)``.
ALLOWED = frozenset(
    {
        "auth",
        "acl",
        "suspended_is_lost",
        "connect_timeout",
        "ca_file",
        "cert_file",
        "key_file",
        "tls",
    }
)


@dataclass(frozen=True)
class Options:
    """Checked options. ``acl`` is the ACL of every node coord creates; ``tls`` the TLS
    files (None: plain text)."""

    auth_data: tuple[tuple[str, str], ...]
    acl: tuple[Any, ...]
    suspended_is_lost: bool
    connect_timeout: float
    tls: TLSFiles | None = None

    @classmethod
    def check(
        cls,
        *,
        auth: object = None,
        acl: object = None,
        suspended_is_lost: object = True,
        connect_timeout: object = 10.0,
        tls: TLSFiles | None = None,
    ) -> Options:
        auth_data = _check_auth(auth)
        lost = check_bool(suspended_is_lost, "suspended_is_lost")
        timeout = check_duration(connect_timeout, "connect_timeout")
        return cls(auth_data, _check_acl(acl, auth_data), lost, timeout, tls)


def url_options(url: ParsedURL, options: dict[str, Any]) -> dict[str, Any]:
    """The keyword options of a ``zk://`` URL: *options*, checked for unknown names,
    plus the URL's credentials as ``auth``."""
    unknown = set(options) - ALLOWED
    if unknown:
        raise ConfigurationError(
            f"unknown ZooKeeper option(s) {sorted(unknown)}; allowed: {sorted(ALLOWED)}"
        )
    if url.username is None:
        return options
    if options.get("auth") is not None:
        raise ConfigurationError("give the credentials in the URL or as auth=, not both")
    return {**options, "auth": (url.username, url.password or "")}


def _check_auth(auth: object) -> tuple[tuple[str, str], ...]:
    if auth is None:
        return ()
    if not isinstance(auth, tuple | list) or not all(isinstance(part, str) for part in auth):
        raise TypeError(f"auth must be a (user, password) pair of str, not {auth!r:.40}")
    if len(auth) != 2 or not auth[0]:
        raise ConfigurationError("auth must be a (user, password) pair of str (digest auth)")
    user, password = auth
    if ":" in user:
        raise ConfigurationError("a ZooKeeper digest user name cannot contain ':'")
    return (("digest", f"{user}:{password}"),)


def _check_acl(acl: object, auth_data: Sequence[tuple[str, str]]) -> tuple[Any, ...]:
    if acl is None:
        # With credentials, only this user may touch (read, delete, ...) our nodes.
        return tuple(CREATOR_ALL_ACL if auth_data else OPEN_ACL_UNSAFE)
    if not isinstance(acl, tuple | list) or not all(isinstance(entry, ACL) for entry in acl):
        raise TypeError("acl must be a list of kazoo.security.ACL")
    if not acl:
        raise ConfigurationError("acl must be a non-empty list of kazoo.security.ACL")
    if not auth_data and any(entry.id.scheme == "auth" for entry in acl):
        raise ConfigurationError("an ACL for the creator ('auth' scheme) needs auth=")
    return tuple(acl)


def check_hosts(hosts: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """The ensemble's ``(host, port)`` pairs, as a list; at least one."""
    if not hosts:
        raise ConfigurationError("at least one ZooKeeper host is needed")
    return list(hosts)
