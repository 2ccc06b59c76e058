"""The client: one backend connection and one session on it; the recipe factory."""

from __future__ import annotations

import asyncio
import importlib
import os
from typing import TYPE_CHECKING, Any

from anyio.abc import AsyncResource

from ._exceptions import ClosedError, ConfigurationError
from ._mutex import Mutex
from ._session import Session
from ._url import SCHEMES, parse_url

if TYPE_CHECKING:
    from types import TracebackType

    from .abc import Backend

__all__ = ["Client", "connect"]

_EXTRAS = {"etcd": "etcd", "zk": "zookeeper", "memory": ""}


class Client(AsyncResource):
    """A connection to a coordination store with one session (lease) on it.

    Use :func:`coord.connect` to make one from a URL, or inject a backend::

        async with Client(MemoryBackend(), ttl=5) as client:
            async with client.mutex("jobs/lock") as hold:
                ...

    Every recipe object made by the client shares its session: when the session is lost,
    every lock held through this client is lost, and new acquires raise
    :exc:`coord.SessionExpiredError`.

    :param backend: an unopened backend; the client opens and closes it
    :param ttl: the session's lease TTL in seconds
    """

    def __init__(self, backend: Backend, *, ttl: float = 10.0) -> None:
        self._backend = backend
        self._session = Session(backend, ttl=ttl)
        self._entered = False

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def session(self) -> Session:
        return self._session

    def mutex(self, name: str) -> Mutex:
        """A :class:`coord.Mutex` called *name* on this client's session. Not a checkpoint.

        :raises ConfigurationError: if *name* is not a valid name
        """
        return Mutex(self._session, name)

    async def __aenter__(self) -> Client:
        if self._entered:
            raise ClosedError("a Client can be opened only once")
        self._entered = True
        if not self._backend.any_event_loop and not _on_asyncio():
            raise ConfigurationError(
                f"{type(self._backend).__name__} runs on asyncio only (its client library "
                "is asyncio-only); run it with anyio.run(..., backend='asyncio')"
            )
        await self._backend.__aenter__()
        try:
            await self._session.__aenter__()
        except BaseException:
            await self._backend.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the session (revoking its lease) and the connection. Shielded."""
        try:
            await self._session.aclose()
        finally:
            await self._backend.aclose()


def connect(url: str | None = None, *, ttl: float = 10.0, **options: Any) -> Client:
    """Make a client for the store at *url*; use it with ``async with``.

    Example::

        async with coord.connect("etcd://10.0.0.1:2379,10.0.0.2:2379/myapp") as client:
            ...

    URLs: ``etcd://[user:password@]host:port[,host:port...][/namespace]``,
    ``zk://host:port[,host:port...][/chroot]``, ``memory://[name]``. The URL and every
    option are checked here, before anything connects. Not a checkpoint.

    :param url: the store's URL; default: the ``COORD_URL`` environment variable
    :param ttl: seconds the store keeps this client's keys after its last keepalive
    :param options: backend options (see the backend classes, e.g. TLS files for etcd)
    :raises ConfigurationError: for a bad URL, TTL or option, or a missing extra
    """
    if url is None:
        url = os.environ.get("COORD_URL")
        if not url:
            raise ConfigurationError("no URL given and COORD_URL is not set")
    parsed = parse_url(url)
    module_name, class_name = SCHEMES[parsed.scheme]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = _EXTRAS[parsed.scheme]
        raise ConfigurationError(
            f"{parsed.scheme}:// needs the {extra!r} extra: pip install 'coord[{extra}]' ({exc})"
        ) from exc
    backend: Backend = getattr(module, class_name).from_url(parsed, **options)
    return Client(backend, ttl=ttl)


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
