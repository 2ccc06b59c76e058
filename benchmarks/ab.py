"""Two versions of coord, one run: the same benchmark from each source tree in turn,
against the same servers, alternated so that the machine's drift hits both alike.

Each round runs, per store and per tree, one child process: with ``--bench mutex`` (the
default) N contenders over min(N, 8) clients looping acquire/release of one coord.Mutex
for a fixed time (benchmarks/suite.py's ``coord_run``, in coord's default layout); with
``--bench queue``, *jobs* put, then claimed and acked by N workers over 4 clients
(benchmarks/queue_bench.py's ``queue_claims``). It prints the rate and the child's CPU
per acquisition or job, and the store's (its server's process) per acquisition or job.
The servers run as production runs them (etcd's default fsync; ZooKeeper
``forceSync=yes`` on the JVM's defaults). Under the rounds: the median of each column
per tree, and after/before.

    git worktree add /tmp/before 506ce9a
    python benchmarks/ab.py --before /tmp/before --after . --rounds 5
    python benchmarks/ab.py --before /tmp/before --bench queue --stores zk --contenders 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _stores import production_server

MUTEX = """
import json, sys, time, anyio
sys.path.insert(0, {bench!r})
from suite import coord_run
waits = []
t0, cpu0 = time.perf_counter(), time.process_time()
anyio.run(coord_run, {url!r}, {n}, t0 + {seconds}, waits)
elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
print(json.dumps({{
    "rate": len(waits) / elapsed, "cpu_ms": cpu / max(len(waits), 1) * 1e3, "ops": len(waits)
}}))
"""

# The queue: *jobs* put (untimed), then claimed and acked by n workers over 4 clients;
# the CPU is the whole child's (puts included) per job, and so is the store's.
QUEUE = """
import asyncio, json, sys, time
sys.path.insert(0, {bench!r})
from queue_bench import queue_claims
cpu0 = time.process_time()
rate = asyncio.run(queue_claims({url!r}, {jobs}, {n}, {keys}))
cpu = time.process_time() - cpu0
print(json.dumps({{"rate": rate, "cpu_ms": cpu / {jobs} * 1e3, "ops": {jobs}}}))
"""


def child(tree: Path, url: str, n: int, args: argparse.Namespace) -> dict[str, float]:
    """One run of the benchmark with coord imported from ``tree``."""
    # cwd is the tree: python -c puts the working directory first on sys.path.
    code = (MUTEX if args.bench == "mutex" else QUEUE).format(
        bench=str(tree / "benchmarks"),
        url=url,
        n=n,
        seconds=args.seconds,
        jobs=args.jobs,
        keys=args.keys,
    )
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tree, capture_output=True, text=True
    )
    if out.returncode:
        raise SystemExit(f"the run from {tree} failed:\n{out.stderr}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="source tree of before")
    parser.add_argument("--after", type=Path, default=Path(), help="source tree of after")
    parser.add_argument("--stores", nargs="+", choices=["etcd", "zk"], default=["etcd", "zk"])
    parser.add_argument("--contenders", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--bench", choices=["mutex", "queue"], default="mutex")
    parser.add_argument("--seconds", type=float, default=4.0, help="per mutex run")
    parser.add_argument("--jobs", type=int, default=2000, help="per queue run")
    parser.add_argument("--keys", type=int, default=0, help="per queue run: jobs' keys")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    for store in args.stores:
        with production_server(store) as server:
            for n in args.contenders:
                runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
                for i in range(args.rounds):
                    order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
                    for label in order:
                        url = f"{server.url}/ab{i}{label}{n}"
                        store_cpu = server.cpu_seconds()
                        result = child(trees[label], url, n, args)
                        ops = max(result["ops"], 1)
                        result["store_ms"] = (server.cpu_seconds() - store_cpu) / ops * 1e3
                        runs[label].append(result)
                        print(
                            f"{store} n={n} round {i} {label:6}: {result['rate']:8,.0f}/s "
                            f"{result['cpu_ms']:.3f} ms CPU each, "
                            f"the store's {result['store_ms']:.3f} ms",
                            flush=True,
                        )
                columns = ("rate", "cpu_ms", "store_ms")
                medians = {
                    label: {k: statistics.median(r[k] for r in rs) for k in columns}
                    for label, rs in runs.items()
                }
                b, a = medians["before"], medians["after"]
                print(
                    f"== {args.bench} {store} n={n}: "
                    f"before {b['rate']:,.0f}/s {b['cpu_ms']:.3f} ms {b['store_ms']:.3f} ms; "
                    f"after {a['rate']:,.0f}/s {a['cpu_ms']:.3f} ms {a['store_ms']:.3f} ms; "
                    f"after/before rate {a['rate'] / b['rate']:.2f}, "
                    f"CPU {a['cpu_ms'] / b['cpu_ms']:.2f}, "
                    f"the store's CPU {a['store_ms'] / b['store_ms']:.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
