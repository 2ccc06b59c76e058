"""First contact: does a member of the store answer, and in the store's own protocol?

Client libraries retry a refused connection until their whole timeout has passed, and
take a server that speaks another protocol, or none, for a slow one: a typo in a port, a
store that is not running, or ``zk://`` pointed at etcd would be reported only after
seconds of silence, in the client library's words. So before a backend connects,
:func:`first_contact` opens one TCP connection to every member at once, sends the first
bytes of the store's protocol and reads the first answer:

* an answer in the store's protocol, from any member: go on (the client library
  connects, on its own connections);
* refused, unknown host, no route, from every member: :exc:`BackendUnavailable` at once,
  naming each one;
* an answer in another protocol, or a close: the openings of the other stores coord
  knows are tried on that member, so that the error names what listens there ("it
  answers as an HTTP/2 (gRPC) server: etcd?");
* a member silent for a moment: the other openings are tried on it meanwhile, and one
  that is answered (a Kafka broker, which waits for the rest of what it reads as a long
  request) fails the contact at once, naming that server;
* a member that accepts and never answers: the error says so once the timeout passed;
* TLS: a failed handshake is named with the option that may be wrong (``ca_file``, a
  client certificate), and a member whose TLS handshake fails but that speaks the
  store's protocol in plain text, or that closes on a plain opening but answers a TLS
  handshake, is named as such (one option away from working).

The openings cost a server nothing: no session, no request. ZooKeeper's is its ``isro``
four-letter word (ZooKeeper's own clients send it to find a read-write server), followed
by a line end so that an HTTP server (etcd's client port serves HTTP/1 too) closes at
once instead of waiting for the rest of a request line. etcd's is the HTTP/2 client
preface with an empty SETTINGS frame, which every HTTP/2 server answers with its own.
"""

from __future__ import annotations

import os
import ssl
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from ..._core.exceptions import BackendUnavailable

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["GRPC", "KAFKA", "ZOOKEEPER", "WireProtocol", "first_contact"]

# A member that answered in another protocol answers the others' openings as quickly.
_IDENTIFY_TIMEOUT = 1.0
# A member silent this long after the opening is asked in the other protocols too.
_SILENCE = 0.25
_MAX_ANSWER = 4096


@dataclass(frozen=True)
class WireProtocol:
    """How to tell a store's servers: the bytes a client sends first, and whether an
    answer is theirs.

    :ivar name: the protocol, for messages
    :ivar server: what a server that answers in it is, for messages
    :ivar hello: the first bytes a client sends
    :ivar need: bytes of the answer to read before judging it (None: until the server
        closes the connection)
    :ivar recognise: whether an answer is in this protocol
    """

    name: str
    server: str
    hello: bytes
    need: int | None
    recognise: Callable[[bytes], bool]


def _settings_frame(answer: bytes) -> bool:
    # An HTTP/2 frame header: 3 bytes length, type 4 (SETTINGS), flags, stream 0.
    return len(answer) >= 9 and answer[3] == 4 and answer[5:9] == b"\0\0\0\0"


def _zookeeper_answer(answer: bytes) -> bool:
    return answer in (b"rw", b"ro", b"null") or b"is not executed because" in answer


_KAFKA_CORRELATION = 0x636F6F72  # "coor"
_KAFKA_API_VERSIONS = struct.pack(">hhih", 18, 0, _KAFKA_CORRELATION, 5) + b"coord"

GRPC = WireProtocol(
    "etcd's protocol (gRPC over HTTP/2)",
    "an HTTP/2 (gRPC) server: etcd?",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\0\0\0\x04\0\0\0\0\0",
    9,
    _settings_frame,
)
ZOOKEEPER = WireProtocol(
    "the ZooKeeper protocol", "a ZooKeeper server", b"isro\r\n", None, _zookeeper_answer
)
KAFKA = WireProtocol(
    "the Kafka protocol",
    "a Kafka broker",
    struct.pack(">i", len(_KAFKA_API_VERSIONS)) + _KAFKA_API_VERSIONS,
    8,
    lambda answer: answer[4:8] == struct.pack(">i", _KAFKA_CORRELATION),
)
_KNOWN = (GRPC, ZOOKEEPER, KAFKA)


def _endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _Member:
    """One member's first contact: its address, how far it got, and what was wrong."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.accepted = False
        self.problem: str | None = None

    def __str__(self) -> str:
        return _endpoint(self.host, self.port)


class _TLSFailed(OSError):
    """The TLS handshake failed, or the server ended the connection with a TLS alert."""


async def _exchange(
    member: _Member, protocol: WireProtocol, tls: ssl.SSLContext | None = None
) -> bytes:
    """Send *protocol*'s opening to *member*; its answer (b"" if it closed without one).

    :raises OSError: if the connection fails (:class:`_TLSFailed`: its TLS)
    """
    try:
        if tls is None:
            stream: anyio.abc.ByteStream = await anyio.connect_tcp(member.host, member.port)
        else:
            stream = await anyio.connect_tcp(
                member.host, member.port, ssl_context=tls, tls_standard_compatible=False
            )
    except ssl.SSLError as exc:
        raise _TLSFailed(_tls_failure(exc)) from exc
    except (anyio.EndOfStream, anyio.BrokenResourceError) as exc:
        raise _TLSFailed("the connection was closed during the TLS handshake") from exc
    member.accepted = True
    answer = b""
    async with stream:
        try:
            await stream.send(protocol.hello)
            while len(answer) < (protocol.need or _MAX_ANSWER):
                answer += await stream.receive()
        except ssl.SSLError as exc:  # an alert after the handshake (TLS 1.3)
            raise _TLSFailed(_tls_failure(exc)) from exc
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            pass  # closed (or reset) by the server: judge what came before
    return answer


def _tls_failure(exc: ssl.SSLError) -> str:
    """What a TLS error says to the user, with the option that may be wrong."""
    reason = exc.reason or type(exc).__name__
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"the server's certificate was not verified ({exc.verify_message}; "
            "is ca_file the CA that signed it?)"
        )
    if "ALERT" in reason:
        hint = ": does it want a client certificate it trusts (cert_file=, key_file=)?"
        return f"the server refused the TLS connection ({reason})" + (
            hint if "CERTIFICATE" in reason else ""
        )
    return f"TLS handshake failed ({reason})"


async def _check(member: _Member, protocol: WireProtocol, tls: ssl.SSLContext | None) -> bool:
    """Whether *member* speaks *protocol*; else ``member.problem`` says why not."""
    answer: bytes | None = None
    failure: OSError | None = None
    async with anyio.create_task_group() as tg:

        async def talk() -> None:
            nonlocal answer, failure
            try:
                answer = await _exchange(member, protocol, tls)
            except OSError as exc:
                member.problem, failure = f"{member}: {_reason(exc)}", exc
            tg.cancel_scope.cancel()

        async def meanwhile() -> None:
            # A store answers its opening at once; one that keeps silent may be a server
            # of another kind waiting for the rest of what it took for a long request
            # (a Kafka broker reads "PRI " or "isro" as a length of over a gigabyte).
            await anyio.sleep(_SILENCE)
            found = await _identify(member, protocol)
            if found is not None:
                member.problem = _speaks_other(member, protocol, found)
                tg.cancel_scope.cancel()

        tg.start_soon(talk)
        tg.start_soon(meanwhile)
    if answer is None:
        if isinstance(failure, _TLSFailed) and await _speaks_plain(member, protocol):
            member.problem = (
                f"{member} does not speak TLS (it speaks {protocol.name} in plain text: "
                "leave out the TLS options)"
            )
        return False
    return await _judge(member, protocol, answer, tls)


async def _judge(
    member: _Member, protocol: WireProtocol, answer: bytes, tls: ssl.SSLContext | None
) -> bool:
    """Whether *answer* is in *protocol*; else ``member.problem`` names what answered."""
    if protocol.recognise(answer):
        return True
    what = f"it answered {answer[:24]!r}" if answer else "it closed the connection unanswered"
    member.problem = f"{member} does not speak {protocol.name} ({what})"
    found = await _identify(member, protocol)
    if found is not None:
        member.problem = _speaks_other(member, protocol, found)
    elif tls is None and await _speaks_tls(member):
        member.problem = (
            f"{member} does not speak {protocol.name} in plain text (it expects TLS: "
            "give ca_file=, or tls=True)"
        )
    return False


async def _speaks_plain(member: _Member, protocol: WireProtocol) -> bool:
    """Whether *member*, whose TLS handshake failed, answers *protocol* in plain text."""
    with anyio.move_on_after(_IDENTIFY_TIMEOUT):
        try:
            return protocol.recognise(await _exchange(_Member(member.host, member.port), protocol))
        except OSError:
            pass
    return False


async def _speaks_tls(member: _Member) -> bool:
    """Whether *member* answers a TLS handshake: completes it, or refuses it with an
    alert (a server that wants a client certificate); a plain server closes, or
    answers what is no TLS record."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with anyio.move_on_after(_IDENTIFY_TIMEOUT):
        try:
            stream = await anyio.connect_tcp(
                member.host, member.port, ssl_context=context, tls_standard_compatible=False
            )
        except ssl.SSLError as exc:
            return "ALERT" in (exc.reason or "")
        except (OSError, anyio.EndOfStream, anyio.BrokenResourceError):
            return False
        await stream.aclose()
        return True
    return False


def _speaks_other(member: _Member, protocol: WireProtocol, found: WireProtocol) -> str:
    return f"{member} does not speak {protocol.name} (it answers as {found.server})"


def _reason(exc: OSError) -> str:
    """Why a connection failed: "Connection refused" rather than anyio's "All connection
    attempts failed" (the refusals are its cause)."""
    cause = exc.__cause__
    if isinstance(cause, OSError) and not isinstance(cause, ssl.SSLError) and cause.errno:
        return os.strerror(cause.errno)
    return exc.strerror or str(exc)


async def _identify(member: _Member, wanted: WireProtocol) -> WireProtocol | None:
    """The other known protocol that *member* answers in, if any (asked all at once)."""
    found: list[WireProtocol] = []
    with anyio.move_on_after(_IDENTIFY_TIMEOUT):
        async with anyio.create_task_group() as tg:

            async def ask(protocol: WireProtocol) -> None:
                try:
                    answer = await _exchange(_Member(member.host, member.port), protocol)
                except OSError:
                    return
                if protocol.recognise(answer):
                    found.append(protocol)
                    tg.cancel_scope.cancel()

            for protocol in _KNOWN:
                if protocol is not wanted:
                    tg.start_soon(ask, protocol)
    return found[0] if found else None


async def first_contact(
    what: str,
    protocol: WireProtocol,
    endpoints: Sequence[tuple[str, int]],
    *,
    connect_timeout: float,
    tls: ssl.SSLContext | None = None,
) -> None:
    """Return once a member of *endpoints* answers in *protocol*; all are asked at once.
    A checkpoint.

    :param what: the store, for messages ("etcd")
    :param connect_timeout: how long to wait for an answer
    :param tls: wrap the connections in TLS with this context (the opening is sent
        after the handshake)
    :raises BackendUnavailable: if none does, at once when each has refused or answered
        otherwise, else after *connect_timeout*; the message says what each member did
    """
    members = [_Member(host, port) for host, port in endpoints]
    spoke = False
    with anyio.move_on_after(connect_timeout):
        async with anyio.create_task_group() as tg:

            async def check(member: _Member) -> None:
                nonlocal spoke
                if await _check(member, protocol, tls):
                    spoke = True
                    tg.cancel_scope.cancel()

            for member in members:
                tg.start_soon(check, member)
    if spoke:
        return
    problems = []
    for member in members:
        if member.problem is None:
            done = "accepted the connection but did not answer"
            member.problem = (
                f"{member} {done if member.accepted else 'did not accept a connection'}"
            )
            member.problem += f" within {connect_timeout:g}s"
        problems.append(member.problem)
    raise BackendUnavailable(f"cannot connect to {what}: " + "; ".join(problems))
