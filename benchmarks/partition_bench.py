"""Ordered dispatch, two ways, in one run on one etcd: the coord queue (a claim and an ack
per job, each a consensus write) against dispatch by partition
(``examples/partition_dispatch.py``: a partitioner shares 8 Kafka partitions among 3
workers, each owner consuming its partitions in order and committing batches to a SQLite
sink fenced per partition; one worker leaves halfway). Both keep per-key order and
refuse a stale worker's writes; the second moves the jobs through Kafka and writes the
store only when ownership changes.

    python benchmarks/partition_bench.py                   # throwaway etcd and broker
    python benchmarks/partition_bench.py --queue-jobs 500 --jobs 20000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import anyio

from coord.testing import EtcdServer, TansuBroker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from partition_dispatch import main as partitioned  # noqa: E402
from queue_bench import queue_claims  # noqa: E402


async def both(url: str, bootstrap: str, queue_jobs: int, jobs: int, directory: Path) -> None:
    print("-- the coord queue:")
    claims = await queue_claims(f"{url}/queue", queue_jobs, 8, 16)  # on 4 clients
    print("-- dispatch by partition:")
    rate = await partitioned(f"{url}/partitions", bootstrap, directory, jobs)
    print(
        f"queue claim+ack {claims:.0f} jobs/s; dispatch by partition {rate:.0f} jobs/s: "
        f"{rate / claims:.0f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queue-jobs", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=20_000)
    args = parser.parse_args()
    with EtcdServer() as etcd, TansuBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        anyio.run(
            both,
            etcd.url,
            broker.bootstrap,
            args.queue_jobs,
            args.jobs,
            Path(tmp),
            backend="asyncio",
        )


if __name__ == "__main__":
    main()
