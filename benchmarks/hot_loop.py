"""A contended coord.Mutex for a profiler: N contenders over min(N, 8) clients looping
acquire/release on one throwaway server, as in suite.py, for a fixed time. Prints the
rate, this process's CPU per acquisition, and the server process's (from ``/proc``).

    py-spy record -r 250 -f raw -o /tmp/etcd.txt -- python benchmarks/hot_loop.py --store etcd
    python benchmarks/hot_loop.py --store zk --contenders 32 --seconds 10 --local-handoff 16
    python benchmarks/profile_summary.py /tmp/etcd.txt    # where the time goes
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from _stores import production_server

sys.path.insert(0, str(Path(__file__).parent))
from suite import coord_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["etcd", "zk"], default="etcd")
    parser.add_argument("--contenders", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--local-handoff", type=int, default=None)
    args = parser.parse_args()
    with production_server(args.store) as server:
        waits: list[float] = []
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        server0 = server_cpu(server)
        anyio.run(
            coord_run,
            server.url + "/hot",
            args.contenders,
            t0 + args.seconds,
            waits,
            args.local_handoff,
        )
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        served = server_cpu(server) - server0
        count = max(len(waits), 1)
        print(
            f"{args.store}: {len(waits) / elapsed:,.0f} acq/s, "
            f"{cpu / count * 1000:.2f} ms CPU/acq, {cpu / elapsed:.0%} of one core; "
            f"the server {served / count * 1000:.2f} ms CPU/acq, {served / elapsed:.0%}"
        )


def server_cpu(server: Any) -> float:
    """The CPU seconds the server's process has used (Linux: ``/proc/<pid>/stat``)."""
    pid = server._proc.pid
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
