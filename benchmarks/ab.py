"""Two versions of coord, one run: a contended coord.Mutex (coord's own layout) from each
source tree in turn, against the same servers, alternated so that the machine's drift hits
both alike.

Each round runs, per store and per tree, one child process: N contenders over min(N, 8)
clients looping acquire/release for a fixed time (benchmarks/suite.py's ``coord_run``, in
coord's default layout), and prints acquisitions/s and the child's CPU per acquisition.
The servers run as production runs them (etcd's default fsync; ZooKeeper
``forceSync=yes``). Under the rounds: the median of each column per tree, and after/before.

    git worktree add /tmp/before 506ce9a
    python benchmarks/ab.py --before /tmp/before --after . --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from coord.testing import EtcdServer, ZooKeeperServer

CHILD = """
import json, sys, time, anyio
sys.path.insert(0, {bench!r})
from suite import coord_run
waits = []
t0, cpu0 = time.perf_counter(), time.process_time()
anyio.run(coord_run, {url!r}, {n}, t0 + {seconds}, waits)
elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
print(json.dumps({{"rate": len(waits) / elapsed, "cpu_ms": cpu / max(len(waits), 1) * 1e3}}))
"""


def child(tree: Path, url: str, n: int, seconds: float) -> dict[str, float]:
    """One run of the contended loop with coord imported from ``tree``."""
    # cwd is the tree: python -c puts the working directory first on sys.path.
    code = CHILD.format(bench=str(tree / "benchmarks"), url=url, n=n, seconds=seconds)
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
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    for store in args.stores:
        with EtcdServer() if store == "etcd" else ZooKeeperServer(force_sync=True) as server:
            for n in args.contenders:
                runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
                for i in range(args.rounds):
                    order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
                    for label in order:
                        url = f"{server.url}/ab{i}{label}{n}"
                        result = child(trees[label], url, n, args.seconds)
                        runs[label].append(result)
                        print(
                            f"{store} n={n} round {i} {label:6}: {result['rate']:8,.0f} acq/s "
                            f"{result['cpu_ms']:.3f} ms CPU/acq",
                            flush=True,
                        )
                medians = {
                    label: {k: statistics.median(r[k] for r in rs) for k in ("rate", "cpu_ms")}
                    for label, rs in runs.items()
                }
                b, a = medians["before"], medians["after"]
                print(
                    f"== {store} n={n}: before {b['rate']:,.0f} acq/s {b['cpu_ms']:.3f} ms; "
                    f"after {a['rate']:,.0f} acq/s {a['cpu_ms']:.3f} ms; "
                    f"after/before rate {a['rate'] / b['rate']:.2f}, "
                    f"CPU {a['cpu_ms'] / b['cpu_ms']:.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
