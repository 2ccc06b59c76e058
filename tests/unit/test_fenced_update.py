"""coord.fenced_update: the SQL ``UPDATE ... WHERE fence <= :fence`` pattern, on sqlite3."""

from __future__ import annotations

import sqlite3

import pytest

import coord


@pytest.fixture
def db() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT, fence INTEGER NOT NULL)")
    db.execute("INSERT INTO orders VALUES (42, 'new', 0)")
    return db


def row(db: sqlite3.Connection) -> tuple[str, int]:
    return db.execute("SELECT status, fence FROM orders WHERE id = 42").fetchone()  # type: ignore[no-any-return]


def test_a_newer_fence_wins_and_a_stale_one_is_refused(db: sqlite3.Connection) -> None:
    def write(status: str, fence: int) -> int:
        return coord.fenced_update(
            db.cursor(), "orders", {"status": status}, where={"id": 42}, fence=fence
        )

    assert write("paid", fence=5 << 16) == 1
    assert write("shipped", fence=5 << 16) == 1  # the same holder writes again
    assert write("late", fence=7 << 16) == 1  # the next holder
    assert write("zombie", fence=5 << 16) == 0  # the paused first holder: refused
    assert row(db) == ("late", 7 << 16)


def test_the_statement_in_every_paramstyle() -> None:
    build = coord.fenced_update_sql
    sql, params = build("t", {"a": 1, "b": 2}, where={"id": 3}, fence=9)
    assert sql == "UPDATE t SET a = ?, b = ?, fence = ? WHERE id = ? AND fence <= ?"
    assert params == [1, 2, 9, 3, 9]
    sql, params = build("s.t", {"a": 1}, where={"id": 3}, fence=9, paramstyle="pyformat")
    assert sql == (
        "UPDATE s.t SET a = %(p1)s, fence = %(p2)s WHERE id = %(p3)s AND fence <= %(p4)s"
    )
    assert params == {"p1": 1, "p2": 9, "p3": 3, "p4": 9}
    sql, _ = build("t", {"a": 1}, where={"id": 3}, fence=9, paramstyle="numeric")
    assert sql == "UPDATE t SET a = :1, fence = :2 WHERE id = :3 AND fence <= :4"
    sql, _ = build("t", {}, where={"id": 3}, fence=9, fence_column="tok", paramstyle="format")
    assert sql == "UPDATE t SET tok = %s WHERE id = %s AND tok <= %s"


def test_named_params_run_on_sqlite(db: sqlite3.Connection) -> None:
    # A dotted column name once made the parameter name ":where_orders.id" (review).
    sql, params = coord.fenced_update_sql(
        "orders", {"status": "paid"}, where={"orders.id": 42}, fence=3, paramstyle="named"
    )
    assert db.execute(sql, params).rowcount == 1
    assert row(db) == ("paid", 3)


@pytest.mark.parametrize(
    ("table", "values", "where", "style"),
    [
        ("orders; DROP TABLE orders", {"a": 1}, {"id": 1}, "qmark"),
        ("orders", {"a b": 1}, {"id": 1}, "qmark"),
        ("orders", {"a": 1}, {}, "qmark"),
        ("orders", {"fence": 1}, {"id": 1}, "qmark"),
        ("orders", {"a": 1}, {"id": 1}, "dollar"),
    ],
)
def test_bad_requests_are_refused(
    table: str, values: dict[str, object], where: dict[str, object], style: str
) -> None:
    with pytest.raises(coord.ConfigurationError):
        coord.fenced_update_sql(table, values, where=where, fence=1, paramstyle=style)  # type: ignore[arg-type]
