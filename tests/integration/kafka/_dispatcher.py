"""A dispatcher process for the zombie test: runs ``coord.kafka.Dispatcher`` on a queue
and, with ``--stop-before PAYLOAD``, stops itself (SIGSTOP) right before it sends that
payload the first time: a leader paused mid-publish, as a GC pause or a stalled VM
would. Prints ``leading <fence>`` and ``sending <payload> <fence>`` lines.

    python _dispatcher.py URL BOOTSTRAP TOPIC NAME [--transactions] [--stop-before P]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

import anyio
from aiokafka import AIOKafkaProducer

import coord
import coord.kafka


def pause_before(payload: bytes) -> None:
    original = AIOKafkaProducer.send
    done = False

    async def send(
        self: AIOKafkaProducer, topic: str, value: Any = None, *a: Any, **kw: Any
    ) -> Any:
        nonlocal done
        headers = kw.get("headers") or (a[3] if len(a) > 3 else None) or ()
        fence = dict(headers).get("coord-fence", b"?").decode()
        print(f"sending {value.decode()} {fence}", flush=True)
        if payload and value == payload and not done:
            done = True
            print(f"stopping before {value.decode()} {fence}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)  # resumes here on SIGCONT
            print(f"resumed, sending {value.decode()} {fence}", flush=True)
        return await original(self, topic, value, *a, **kw)

    AIOKafkaProducer.send = send


async def main(args: argparse.Namespace) -> None:
    pause_before(args.stop_before.encode())  # b"": only print what is sent
    async with coord.connect(args.url, ttl=2, identity=args.name) as client:
        dispatcher = coord.kafka.Dispatcher(
            client,
            "zombie",
            queue=client.queue("zombie"),
            topic=args.topic,
            bootstrap_servers=args.bootstrap,
            transactions=args.transactions or None,
            cooldown=0.2,
        )
        await dispatcher.run()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("url", "bootstrap", "topic", "name"):
        parser.add_argument(name)
    parser.add_argument("--transactions", action="store_true")
    parser.add_argument("--stop-before", default="")
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    anyio.run(main, parser.parse_args(), backend="asyncio")
    sys.exit(0)
