"""A kazoo service for the layout tests: run as a process, so that a test can SIGKILL it.

``python _kazoo_peer.py HOST:PORT TIMEOUT`` connects with kazoo's threaded client (a
session of TIMEOUT seconds), prints ``ready``, then runs one command per line of stdin,
in turn, and answers on stdout:

* ``lock PATH ID`` / ``read PATH ID`` / ``write PATH ID`` / ``elect PATH ID``: kazoo's
  ``Lock``, ``ReadLock``, ``WriteLock``, ``Election`` (its lock) acquired, blocking:
  ``locked PATH NODE`` once held (``elect`` answers ``leader PATH ID``);
* ``try PATH ID``: ``Lock.acquire(blocking=False)``: ``locked PATH NODE`` or ``busy PATH``;
* ``unlock``: releases what the last command took: ``unlocked``;
* ``leader-of PATH``: ``leader-of PATH ID`` (``Election.contenders()[0]``, ``-`` if none);
* ``contenders PATH``: ``contenders PATH`` and the identifiers, space-separated.
"""

from __future__ import annotations

import sys
from typing import Any

from kazoo.client import KazooClient


def main() -> None:
    hosts, timeout = sys.argv[1], float(sys.argv[2])
    zk = KazooClient(hosts=hosts, timeout=timeout)
    zk.start()
    say("ready")
    held: Any = None
    for line in sys.stdin:
        verb, *args = line.split()
        if verb in ("lock", "read", "write", "elect", "try"):
            path, ident = args
            kinds = {"read": zk.ReadLock, "write": zk.WriteLock}
            if verb == "elect":
                held = zk.Election(path, ident).lock
            else:
                held = kinds.get(verb, zk.Lock)(path, ident)
            if not held.acquire(blocking=verb != "try"):
                say(f"busy {path}")
                continue
            say(f"leader {path} {ident}" if verb == "elect" else f"locked {path} {held.node}")
        elif verb == "unlock":
            held.release()
            say("unlocked")
        elif verb == "leader-of":
            contenders = zk.Election(args[0]).contenders()
            say(f"leader-of {args[0]} {contenders[0] if contenders else '-'}")
        elif verb == "contenders":
            say(" ".join(["contenders", args[0], *zk.Election(args[0]).contenders()]))


def say(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    main()
