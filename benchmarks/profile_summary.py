"""Summarize a py-spy raw profile (``py-spy record -f raw``): the share of samples spent
under each of a few frames that say where a contended acquisition's time goes.

    python benchmarks/profile_summary.py /tmp/etcd.txt [--top 25]

Prints the inclusive share of the buckets below (a sample counts once per bucket, and
may count in several), then the functions with the most self time.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

#: bucket -> substrings of a frame ("function (file:line)") that put a sample in it
BUCKETS = {
    "event loop idle (selector wait)": ["select (selectors.py"],
    "gRPC unary calls (etcd txn/range/lease)": ["_UnaryUnaryMultiCallable", "unary_unary"],
    "etcd watch stream (coord/backends/etcd/_watch.py)": ["etcd/_watch.py"],
    "etcd connection wrappers (coord/backends/etcd/_connection.py)": ["etcd/_connection.py"],
    "ZooKeeper wire client (coord/backends/zookeeper/_wire)": ["zookeeper/_wire/"],
    "kazoo codec (records)": ["kazoo/protocol"],
    "anyio cancel scopes": ["anyio/_backends/_asyncio.py:4", "CancelScope"],
    "asyncio task creation": ["create_task", "start_soon"],
    "coord waiting algorithm (_turns.py)": ["coord/_turns.py"],
    "coord Hold (guard watch, release)": ["coord/_hold.py"],
    "coord Session (register, delete tasks)": ["coord/_session.py"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    total = 0
    inclusive: collections.Counter[str] = collections.Counter()
    self_time: collections.Counter[str] = collections.Counter()
    for line in args.path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        self_time[frames[-1]] += count
        for bucket, needles in BUCKETS.items():
            if any(needle in frame for frame in frames for needle in needles):
                inclusive[bucket] += count
    print(f"{total} samples")
    for bucket, count in inclusive.most_common():
        print(f"{count / total:6.1%}  {bucket}")
    print("\nself time:")
    for frame, count in self_time.most_common(args.top):
        print(f"{count / total:6.1%}  {frame[:150]}")


if __name__ == "__main__":
    main()
