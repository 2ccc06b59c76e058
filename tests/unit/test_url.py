from __future__ import annotations

import pytest

import coord
from coord._core.url import parse_url


def test_etcd_url_with_several_hosts_and_namespace() -> None:
    url = parse_url("etcd://u%40x:p%3Aw@10.0.0.1:2379,host-b,[::1]:2380/app/jobs")
    assert url.scheme == "etcd"
    assert url.hosts == (("10.0.0.1", 2379), ("host-b", 2379), ("::1", 2380))
    assert url.namespace == "app/jobs"
    assert (url.username, url.password) == ("u@x", "p:w")


def test_memory_and_zk_urls() -> None:
    assert parse_url("memory://").namespace == ""
    assert parse_url("memory://tests").namespace == "tests"
    assert parse_url("zk://a:2181,b/chroot").hosts == (("a", 2181), ("b", 2181))


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("127.0.0.1:2379", "not a coordination URL"),
        ("redis://x", "unknown URL scheme"),
        ("etcd://", "not a valid host"),
        ("etcd://a:0", "out of range"),
        ("etcd://a:99999", "out of range"),
        ("etcd://a:b", "not a valid host"),
        ("etcd://a,,b", "not a valid host"),
        ("etcd://a/bad//ns", "empty segment"),
        ("etcd://a?x=1", "query strings"),
        ("etcd://:pw@a", "empty user name"),
    ],
)
def test_bad_urls_are_clear_errors(url: str, message: str) -> None:
    with pytest.raises(coord.ConfigurationError, match=message):
        parse_url(url)


def test_password_is_not_echoed() -> None:
    with pytest.raises(coord.ConfigurationError) as info:
        parse_url("etcd://user:secret@a:bad")
    assert "secret" not in str(info.value)


def test_connect_checks_everything_at_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COORD_URL", raising=False)
    with pytest.raises(coord.ConfigurationError, match="COORD_URL"):
        coord.connect()
    with pytest.raises(coord.ConfigurationError, match="ttl"):
        coord.connect("memory://", ttl=0)
    with pytest.raises(coord.ConfigurationError, match="ttl"):
        coord.connect("memory://", ttl=float("nan"))
    with pytest.raises(coord.ConfigurationError, match="no options"):
        coord.connect("memory://", colour="blue")
    monkeypatch.setenv("COORD_URL", "memory://from-env")
    assert isinstance(coord.connect(), coord.Client)
