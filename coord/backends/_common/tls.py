"""TLS options of a backend: the PEM files, checked at the call, and the contexts made
from them.

Every store is given TLS the same way (``ca_file``, ``cert_file``, ``key_file``, any of
which turns TLS on, or ``tls=True`` for the system's roots), so the checks and the
contexts live here. The files are checked when ``coord.connect`` is called (a missing
file is a configuration error then, not a connection failure later) and read when the
backend opens, in a worker thread (reading files would block the event loop).
"""

from __future__ import annotations

import os
import ssl
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from ..._core.checks import check_bool, check_type
from ..._core.exceptions import ConfigurationError

if TYPE_CHECKING:
    from anyio.abc import ByteStream

__all__ = ["TLSFiles", "open_stream", "tls_files"]

_FIELDS = ("ca_file", "cert_file", "key_file")


@dataclass(frozen=True)
class TLSFiles:
    """Paths of PEM files for TLS; all optional (no CA: the system's roots).

    :ivar alpn: the application protocols offered in the handshake (etcd's gRPC needs
        ``h2``; ZooKeeper none)
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    alpn: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for field in _FIELDS:
            value = getattr(self, field)
            if value is not None:
                check_type(value, str, field, "a path (str)")
        if (self.cert_file is None) != (self.key_file is None):
            raise ConfigurationError("cert_file and key_file must be given together")
        for field in _FIELDS:
            _check_readable(field, getattr(self, field))

    async def client_context(self) -> ssl.SSLContext:
        """The TLS context of our connections: the server verified against the CA (the
        system's roots without one) and its name, our certificate presented if there is
        one. The files are read in a worker thread.

        :raises ConfigurationError: a file is not PEM, or the key is not the
            certificate's
        """
        return await self._context(verify=True)

    async def probe_context(self) -> ssl.SSLContext:
        """A TLS context that verifies nothing (for a first contact that only asks what
        answers: the connections that follow verify), our certificate presented if
        there is one."""
        return await self._context(verify=False)

    async def _context(self, *, verify: bool) -> ssl.SSLContext:
        def make() -> ssl.SSLContext:
            if verify:
                context = ssl.create_default_context(cafile=self.ca_file)
            else:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if self.alpn:
                context.set_alpn_protocols(list(self.alpn))
            if self.cert_file is not None:
                context.load_cert_chain(self.cert_file, self.key_file)
            return context

        try:
            return await anyio.to_thread.run_sync(make)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(f"cannot load the TLS files: {exc}") from exc


def tls_files(
    *,
    tls: object = False,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    alpn: tuple[str, ...] = (),
) -> TLSFiles | None:
    """The TLS files of a backend's options, or None for plain text: TLS is on with
    ``tls=True`` or any file given.

    :raises ConfigurationError: for files that are missing, or a certificate without
        its key
    :raises TypeError: for an option of the wrong type
    """
    if not check_bool(tls, "tls") and ca_file is None and cert_file is None and key_file is None:
        return None
    return TLSFiles(ca_file, cert_file, key_file, alpn)


def _check_readable(field: str, path: str | None) -> None:
    """A missing TLS file is a configuration error at the call, not a failure when the
    client connects. One stat of a local file: done at once, even on an event loop."""
    if path is None:
        return
    try:
        info = os.stat(path)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read TLS file {path!r} ({field}): {exc.strerror}"
        ) from exc
    if not stat.S_ISREG(info.st_mode):
        raise ConfigurationError(f"TLS file {path!r} ({field}) is not a regular file")


async def open_stream(host: str, port: int, ssl_context: ssl.SSLContext | None) -> ByteStream:
    """A TCP connection to *host*, over TLS with *ssl_context* if given. Not bounded in
    time: the caller bounds the attempt.

    The TLS stream is not "standard compatible": a server that closes without TLS's
    goodbye (``close_notify``) ends the stream as a plain close does, and our own close
    does not wait for the server's answer to ours. Both stores' servers close that way.

    :raises OSError: the connection or the TLS handshake (``ssl.SSLError``) failed
    """
    if ssl_context is None:
        return await anyio.connect_tcp(host, port)
    return await anyio.connect_tcp(
        host, port, ssl_context=ssl_context, tls_standard_compatible=False
    )
