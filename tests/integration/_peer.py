"""A peer process (etcdctl, a kazoo or Curator service) whose stdout is read line by
line, and whose stdin takes commands."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anyio.streams.text import TextReceiveStream

if TYPE_CHECKING:
    from anyio.abc import Process

__all__ = ["Peer"]


class Peer:
    """One peer process: :meth:`send` a command, read its answers with :meth:`line`."""

    def __init__(self, process: Process) -> None:
        self.process = process
        assert process.stdout is not None
        self._lines = TextReceiveStream(process.stdout)
        self._buffer = ""

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(line.encode() + b"\n")

    async def line(self) -> str:
        while "\n" not in self._buffer:
            self._buffer += await self._lines.receive()
        line, self._buffer = self._buffer.split("\n", 1)
        return line

    async def ask(self, line: str) -> str:
        await self.send(line)
        return await self.line()

    def running(self) -> bool:
        return self.process.returncode is None

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: its session is left to expire
