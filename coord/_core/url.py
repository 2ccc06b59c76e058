"""Parsing of coordination URLs: ``etcd://``, ``zk://``, ``memory://``.

Checked completely before anything connects, so that a bad URL is a clear error at the
``coord.connect`` call and not a failure deep inside gRPC or kazoo.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

from .checks import check_str
from .exceptions import ConfigurationError
from .keys import check_name

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["SCHEMES", "ParsedURL", "format_url", "parse_url"]

#: scheme -> (module, class); modules are imported lazily, only when used.
SCHEMES = {
    "etcd": ("coord.backends.etcd", "EtcdBackend"),
    "zk": ("coord.backends.zookeeper", "ZooKeeperBackend"),
    "memory": ("coord.backends.memory", "MemoryBackend"),
}
DEFAULT_PORTS = {"etcd": 2379, "zk": 2181}

_HOST = re.compile(
    r"(?:\[(?P<ipv6>[0-9a-fA-F:.]+)\]|(?P<name>[A-Za-z0-9._-]+))(?::(?P<port>\d+))?\Z"
)


@dataclass(frozen=True)
class ParsedURL:
    """A parsed coordination URL.

    :ivar scheme: ``etcd``, ``zk`` or ``memory``
    :ivar hosts: ``(host, port)`` pairs, in the order given (empty for memory)
    :ivar namespace: the path, without slashes: a key prefix (etcd), a chroot (zk), a
        store name (memory); ``""`` if none
    """

    scheme: str
    hosts: tuple[tuple[str, int], ...] = ()
    namespace: str = ""
    username: str | None = None
    password: str | None = None


def parse_url(url: object) -> ParsedURL:
    """Parse and check *url*. Raises ConfigurationError saying what is wrong (TypeError
    if it is not a str)."""
    url = check_str(url, "the URL")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigurationError(
            f"{url!r} is not a coordination URL: expected e.g. 'etcd://127.0.0.1:2379', "
            "'zk://127.0.0.1:2181' or 'memory://'"
        )
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigurationError(
            f"unknown URL scheme {scheme!r} in {url!r}: use one of {', '.join(sorted(SCHEMES))}"
        )
    if "?" in rest or "#" in rest:
        raise ConfigurationError(
            f"{url!r}: query strings and fragments are not supported; pass options as "
            "keyword arguments to coord.connect()"
        )
    if scheme == "memory":
        name = rest.strip("/")
        return ParsedURL(
            scheme,
            namespace=check_name(name, what="memory store name", internal=True) if name else "",
        )
    netloc, _, path = rest.partition("/")
    username = password = None
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user, _, pw = userinfo.partition(":")
        username, password = unquote(user), unquote(pw)
        if not username:
            raise ConfigurationError(f"{_redact(url)}: empty user name")
    hosts = tuple(_parse_host(h, scheme, url) for h in netloc.split(","))
    path = path.strip("/")
    namespace = check_name(path, what="namespace", internal=True) if path else ""
    return ParsedURL(scheme, hosts, namespace, username, password)


def _parse_host(text: str, scheme: str, url: str) -> tuple[str, int]:
    match = _HOST.match(text)
    if not text or match is None:
        raise ConfigurationError(f"{_redact(url)}: {text!r} is not a valid host[:port]")
    host = match["ipv6"] or match["name"]
    port = int(match["port"]) if match["port"] else DEFAULT_PORTS[scheme]
    if not 0 < port < 65536:
        raise ConfigurationError(f"{_redact(url)}: port {port} is out of range")
    return host, port


def format_url(
    scheme: str,
    hosts: Sequence[tuple[str, int]],
    namespace: str = "",
    username: str | None = None,
) -> str:
    """The URL of a store, for reprs and logs: the user name but never a password
    (``***`` stands for it)."""
    user = f"{quote(username, safe='')}:***@" if username else ""
    where = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in hosts)
    return f"{scheme}://{user}{where}" + (f"/{namespace.strip('/')}" if namespace else "")


def _redact(url: str) -> str:
    return re.sub(r"//[^/@]*@", "//***@", url)
