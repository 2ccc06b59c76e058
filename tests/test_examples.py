"""The examples run as tests (like etcd's example_*_test.go)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"


def run_example(name: str, *args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.etcd
def test_mutex_demo_against_etcd(etcd_url: str) -> None:
    out = run_example("mutex_demo.py", etcd_url)
    assert "12 acquisitions, fences strictly increasing" in out
    assert out.count("holds demo/printer with fence") == 12


@pytest.mark.etcd
def test_mutex_demo_starts_its_own_etcd(etcd_server: object) -> None:
    # The README's first command: no URL, so the demo starts a throwaway etcd.
    del etcd_server  # only for the skip/fail policy when etcd is not installed
    out = run_example("mutex_demo.py", env={"COORD_URL": ""})
    assert "started a throwaway etcd" in out
    assert "fences strictly increasing" in out


def test_mutex_demo_on_memory() -> None:
    out = run_example("mutex_demo.py", "memory://demo")
    assert "fences strictly increasing" in out


@pytest.mark.etcd
def test_leader_example_takes_over_after_sigkill_on_etcd(etcd_url: str) -> None:
    out = run_example("leader.py", etcd_url)
    assert "-- SIGKILL worker-" in out
    assert "another worker took over in" in out
    assert out.count("leads, term") == 2


@pytest.mark.zookeeper
def test_leader_example_takes_over_after_sigkill_on_zookeeper(zookeeper_url: str) -> None:
    out = run_example("leader.py", zookeeper_url)
    assert "another worker took over in" in out


@pytest.mark.etcd
def test_partitions_example_rebalances_after_sigkill_on_etcd(etcd_url: str) -> None:
    out = run_example("partitions.py", etcd_url)
    assert "-- SIGKILL worker-" in out
    assert "4 partitions moved" in out
    assert "the dead worker's 4" in out


@pytest.mark.zookeeper
def test_partitions_example_rebalances_after_sigkill_on_zookeeper(zookeeper_url: str) -> None:
    out = run_example("partitions.py", zookeeper_url)
    assert "4 partitions moved" in out


@pytest.mark.etcd
def test_dispatch_example_keeps_per_key_order_on_etcd(etcd_url: str) -> None:
    # 8 workers in 3 processes: per-customer order and one job of a customer at a time.
    out = run_example("dispatch.py", etcd_url)
    assert "40 jobs done by 8 workers; per-customer order kept" in out


@pytest.mark.zookeeper
def test_dispatch_example_keeps_per_key_order_on_zookeeper(zookeeper_url: str) -> None:
    out = run_example("dispatch.py", zookeeper_url)
    assert "40 jobs done by 8 workers; per-customer order kept" in out


def test_dispatch_example_on_memory() -> None:
    out = run_example("dispatch.py", "memory://dispatch")
    assert "per-customer order kept" in out


@pytest.mark.etcd
@pytest.mark.kafka
def test_kafka_dispatch_example(etcd_server: object, kafka_broker: object) -> None:
    # It starts its own etcd and broker (the fixtures only apply the skip/fail policy).
    del etcd_server, kafka_broker
    out = run_example("kafka_dispatch.py")
    assert "12 records, per-key order kept, 2 leaders' fences" in out


@pytest.mark.etcd
@pytest.mark.kafka
def test_partition_dispatch_example(etcd_server: object, kafka_broker: object) -> None:
    # It starts its own etcd and broker (the fixtures only apply the skip/fail policy).
    del etcd_server, kafka_broker
    out = run_example("partition_dispatch.py")
    assert "each exactly once, per-customer order kept" in out
    assert "moved: " in out
