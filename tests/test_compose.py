"""compose/compose.yaml stays consistent: no Docker engine runs here, so the file is
checked by reading it (the members name each other, the ports the README gives are the
ones published)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

import coord._core.url

COMPOSE = Path(__file__).parent.parent / "compose"


def services() -> dict[str, Any]:
    loaded = yaml.safe_load((COMPOSE / "compose.yaml").read_text())
    found: dict[str, Any] = loaded["services"]
    return found


def host_port(service: dict[str, Any]) -> int:
    (mapping,) = service["ports"]
    host, port, _inside = mapping.split(":")
    assert host == "127.0.0.1", "published on loopback only"
    return int(port)


def test_etcd_members_form_one_cluster() -> None:
    etcd = {name: s for name, s in services().items() if name.startswith("etcd")}
    assert sorted(etcd) == ["etcd1", "etcd2", "etcd3"]
    for name, service in etcd.items():
        cluster = service["environment"]["ETCD_INITIAL_CLUSTER"]
        assert sorted(m.split("=")[0] for m in cluster.split(",")) == sorted(etcd)
        args = dict(a.split("=", 1) for a in service["command"][1:])
        assert args["--name"] == name
        assert args["--initial-advertise-peer-urls"] == f"http://{name}:2380"
        assert f"{name}=http://{name}:2380" in cluster
        assert args["--advertise-client-urls"] == f"http://127.0.0.1:{host_port(service)}"


def test_zookeeper_servers_form_one_ensemble() -> None:
    zk = {name: s for name, s in services().items() if name.startswith("zk")}
    assert sorted(zk) == ["zk1", "zk2", "zk3"]
    for name, service in zk.items():
        env = service["environment"]
        assert env["ZOO_MY_ID"] == int(name[2:])
        servers = env["ZOO_SERVERS"].split()
        assert servers == [f"server.{i}=zk{i}:2888:3888;2181" for i in (1, 2, 3)]


def test_kafka_runs_in_kraft_mode() -> None:
    env = services()["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    assert env["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://127.0.0.1:9092"
    assert host_port(services()["kafka"]) == 9092


def test_the_urls_in_the_readme_are_the_published_ports() -> None:
    published = {host_port(s) for s in services().values()}
    text = (COMPOSE / "README.md").read_text() + (COMPOSE / "compose.yaml").read_text()
    urls = set(re.findall(r"(?:etcd|zk)://[0-9.:,]+/\w+", text))
    assert len(urls) == 2, urls
    for url in urls:
        parsed = coord._core.url.parse_url(url)
        assert len(parsed.hosts) == 3
        assert {port for _, port in parsed.hosts} <= published
