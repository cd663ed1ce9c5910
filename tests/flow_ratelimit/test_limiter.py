"""The shared limiter's algorithm and its rows on SQLite and PostgreSQL, across processes."""

from __future__ import annotations

import multiprocessing
import queue
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from cuaderno import JournalError, MemoryCheckpointer, RateLimit, RateLimitWaitTooLong, SqliteCheckpointer, UsageError
from cuaderno.flow.ratelimit import SharedLimits, Turn, next_turn
from cuaderno.gateway.rate import bucket_label, parse_duration, read_rate_headers


def test_turns_are_spaced_by_the_request_limit() -> None:
    limit = RateLimit(requests_per_minute=60)
    row, waits = Turn(), []
    for _ in range(4):
        wait, row, _ = next_turn(row, 100.0, limit, 0)
        waits.append(wait)
    assert waits == [0.0, 1.0, 2.0, 3.0]
    # Time passing frees the turns: at 110 s the next request goes at once.
    assert next_turn(row, 110.0, limit, 0)[0] == 0.0


def test_burst_lets_that_many_seconds_of_budget_go_at_once() -> None:
    limit = RateLimit(requests_per_minute=60, burst_seconds=2)
    row, waits = Turn(), []
    for _ in range(5):
        wait, row, _ = next_turn(row, 0.0, limit, 0)
        waits.append(wait)
    assert waits == [0.0, 0.0, 0.0, 1.0, 2.0]


def test_tokens_space_requests_by_their_cost_and_a_pause_holds_everyone() -> None:
    limit = RateLimit(tokens_per_minute=6000)  # 100 tokens a second
    wait, row, _ = next_turn(Turn(), 0.0, limit, 500)
    assert wait == 0.0 and row.tok_tat == 5.0
    assert next_turn(row, 0.0, limit, 100)[0] == 5.0
    paused = Turn(row.req_tat, row.tok_tat, paused_until=30.0)
    assert next_turn(paused, 0.0, limit, 100)[0] == 30.0


@pytest.mark.parametrize("bad", [
    {}, {"requests_per_minute": 0}, {"requests_per_minute": float("nan")}, {"tokens_per_minute": -1},
    {"requests_per_minute": True}, {"requests_per_minute": 1, "per": "user"}, {"requests_per_minute": 1, "max_wait": -1},
    {"requests_per_minute": 1, "output_tokens": 1.5},
])
def test_a_bad_rate_limit_is_a_usage_error(bad: dict[str, Any]) -> None:
    with pytest.raises(UsageError):
        RateLimit(**bad)


def test_headers_of_openai_and_anthropic_are_read() -> None:
    assert parse_duration("6m0s") == 360.0 and parse_duration("20ms") == 0.02 and parse_duration("1h2m3.5s") == 3723.5
    assert parse_duration("soon") is None
    sig = read_rate_headers({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1.5s",
                             "x-ratelimit-remaining-tokens": "900", "x-ratelimit-reset-tokens": "6ms"})
    assert sig is not None and sig.pause() == 1.5  # the whole reset: the budget's size is not given
    sig = read_rate_headers({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "6s",
                             "x-ratelimit-limit-requests": "60"})
    assert sig is not None and sig.pause() == pytest.approx(0.1)  # one request's refill, not the whole budget's
    sig = read_rate_headers({"retry-after-ms": "2500", "retry-after": "9"}, status=429)
    assert sig is not None and sig.retry_after == 2.5 and sig.pause() == 2.5
    assert read_rate_headers({"retry-after": "9"}, status=200) is None  # only a 429/503 asks to wait
    sig = read_rate_headers({"anthropic-ratelimit-requests-remaining": "0",
                             "anthropic-ratelimit-requests-reset": "2030-01-01T00:00:10Z"},
                            now=1893456000.0)  # 2030-01-01T00:00:00Z
    assert sig is not None and sig.pause() == pytest.approx(10.0)


def test_the_bucket_is_a_hash_never_the_key() -> None:
    limit = RateLimit(requests_per_minute=1)
    label = bucket_label(limit, endpoint="http://h/v1", api_key="sk-secret", model="m")
    assert "sk-secret" not in label and label.startswith("key:")
    assert label != bucket_label(limit, endpoint="http://h/v1", api_key="sk-other", model="m")
    by_model = RateLimit(requests_per_minute=1, per="model")
    assert bucket_label(by_model, endpoint="e", api_key="a", model="m") == bucket_label(
        by_model, endpoint="e", api_key="b", model="m")


def test_two_stores_on_one_journal_share_the_turns(two_stores: Any) -> None:
    a, b = (SharedLimits.of(s) for s in two_stores)
    limit = RateLimit(requests_per_minute=600, max_wait=5)
    waits = [a.reserve("k", limit, 0).wait, b.reserve("k", limit, 0).wait, a.reserve("k", limit, 0).wait]
    assert waits[0] <= 0.0
    # The turns are 0.1 s apart in the database's clock; each wait is its turn less the time the
    # calls before it took (milliseconds, more on a busy machine).
    assert 0.05 < waits[1] <= 0.101 and 0.15 < waits[2] <= 0.201
    assert a.reserve("other", limit, 0).wait <= 0.0  # another key, another budget


def test_a_wait_past_max_wait_is_refused_and_takes_no_turn(two_stores: Any) -> None:
    a, b = (SharedLimits.of(s) for s in two_stores)
    limit = RateLimit(requests_per_minute=60, max_wait=1.5)
    a.reserve("k", limit, 0)
    a.reserve("k", limit, 0)
    with pytest.raises(RateLimitWaitTooLong) as caught:
        b.reserve("k", limit, 0)
    # Two turns taken, a second apart: the third is at most 2 s away (less by the time the calls
    # took on a busy machine), and more than max_wait, or it would not be refused.
    assert 1.5 < caught.value.wait <= 2.05 and "max_wait=1.5" in str(caught.value)
    with pytest.raises(RateLimitWaitTooLong) as again:
        b.reserve("k", limit, 0)
    # The refusal took nothing: had it taken the turn, the next would be a whole second further.
    assert again.value.wait < caught.value.wait + 0.5


def test_a_pause_seen_by_one_holds_the_other_and_tokens_are_set_right(two_stores: Any) -> None:
    # The waits shrink by the time that passes between the calls (a loaded machine can take tens
    # of milliseconds over them), so each is checked against the time measured around it.
    a, b = (SharedLimits.of(s) for s in two_stores)
    started = time.monotonic()
    a.pause("k", 3.0)
    _waits_about(b.paused_for("k"), 3.0, started)
    _waits_about(b.reserve("k", RateLimit(requests_per_minute=600), 0).wait, 3.0, started)
    limit = RateLimit(tokens_per_minute=60_000, max_wait=60)  # 1000 tokens a second
    started = time.monotonic()
    assert a.reserve("t", limit, 5000).wait <= 0.0
    b.add_tokens("t", limit, -4000)  # the answer used 1000 of the 5000 reserved
    _waits_about(a.reserve("t", limit, 100).wait, 1.0, started)


def _waits_about(wait: float, expected: float, since: float) -> None:
    """``wait`` is what was ``expected`` at ``since``, less the time passed since (and a little
    for clocks: the limiter's time may be the server's)."""
    passed = time.monotonic() - since
    assert expected - passed - 0.05 <= wait <= expected + 0.05, (wait, expected, passed)


def test_a_memory_journal_gets_a_limiter_of_its_own_and_other_stores_are_refused() -> None:
    store = MemoryCheckpointer()
    limits = SharedLimits.of(store)
    assert limits.reserve("k", RateLimit(requests_per_minute=60), 0).wait <= 0.0
    with pytest.raises(UsageError):
        SharedLimits(object())


def test_a_sqlite_journal_in_memory_gets_a_limiter_of_its_own_too() -> None:
    """It has no file a second connection could open (side_connection refuses it), and no second
    process to share with."""
    store = SqliteCheckpointer(":memory:")
    with pytest.raises(UsageError, match="in memory"):
        store.side_connection()
    limits = SharedLimits.of(store)
    limit = RateLimit(requests_per_minute=60)
    assert limits.reserve("k", limit, 0).wait <= 0.0
    assert limits.reserve("k", limit, 0).wait > 0.5  # the second turn waits: the row is kept
    store.close()


def test_the_table_holds_no_key_and_the_journal_still_opens(tmp_path: Path) -> None:
    store = SqliteCheckpointer(tmp_path / "j.db")
    SharedLimits.of(store).reserve(bucket_label(RateLimit(requests_per_minute=1), endpoint="e", api_key="sk-secret",
                                                model=None), RateLimit(requests_per_minute=1), 0)
    store.close()
    assert b"sk-secret" not in (tmp_path / "j.db").read_bytes() + (tmp_path / "j.db-wal").read_bytes()
    rows = sqlite3.connect(tmp_path / "j.db").execute("SELECT bucket FROM cuaderno_rate_limits").fetchall()
    assert len(rows) == 1
    SqliteCheckpointer(tmp_path / "j.db").close()  # the journal's own checks accept the extra table


def _take_turns(url: str, n: int, out: Any) -> None:
    from cuaderno import open_journal

    try:
        store = open_journal(url)
        limits = SharedLimits(store)
        limit = RateLimit(requests_per_minute=1200, max_wait=60)
        starts = []
        for _ in range(n):
            starts.append(limits.reserve("shared", limit, 0).at)
        out.put(("ok", starts))
        store.close()
    except BaseException as exc:  # said to the test, which would otherwise wait for it in vain
        out.put(("error", f"{type(exc).__name__}: {exc}"))
        raise


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_four_processes_never_get_turns_closer_than_the_limit(backend: str, tmp_path: Path,
                                                              request: pytest.FixtureRequest) -> None:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'j.db'}"
    else:
        from _pg import new_schema, schema_url

        schemas = request.getfixturevalue("pg_schemas")
        schemas.append(new_schema())
        url = schema_url(schemas[-1])
    from cuaderno import open_journal

    open_journal(url).close()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_take_turns, args=(url, 25, out)) for _ in range(4)]
    for p in procs:
        p.start()
    try:
        said = [out.get(timeout=90) for _ in procs]
    except queue.Empty:
        pytest.fail(f"a turn-taking process said nothing in 90 s (exit codes {[p.exitcode for p in procs]})")
    for p in procs:
        p.join(30)
    assert [what for what, _ in said] == ["ok"] * 4, said
    starts = sorted(s for _, turns in said for s in turns)
    assert len(starts) == 100
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    # 1200 a minute is one turn every 50 ms, in the database's clock: no two turns closer.
    assert min(gaps) >= 0.05 - 1e-6, sorted(gaps)[:5]


def test_a_broken_table_is_a_journal_error(tmp_path: Path) -> None:
    store = SqliteCheckpointer(tmp_path / "j.db")
    limits = SharedLimits.of(store)
    limits.reserve("k", RateLimit(requests_per_minute=60), 0)
    other = sqlite3.connect(tmp_path / "j.db", isolation_level=None)
    other.execute("DROP TABLE cuaderno_rate_limits")
    other.close()
    with pytest.raises(JournalError, match="rate-limit table.*no such table.*nothing was sent"):
        limits.reserve("k", RateLimit(requests_per_minute=60), 0)
    store.close()


def test_a_lost_postgres_connection_is_opened_again(tmp_path: Path, pg_schemas: list[str]) -> None:
    import psycopg
    from _pg import PG_URL, new_schema, schema_url

    from cuaderno.journal.postgres import PostgresCheckpointer

    pg_schemas.append(new_schema())
    store = PostgresCheckpointer.from_url(schema_url(pg_schemas[-1]))
    limits = SharedLimits.of(store)
    limit = RateLimit(requests_per_minute=60)
    assert limits.reserve("k", limit, 0).wait <= 0
    # A turn's transaction ends with COMMIT, then the session's last statement: a plain read
    # leaves one that names the table.
    assert limits.paused_for("k") == 0.0
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        # The limiter's session, as a server restart would end it (its last statement named the table).
        killed = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                               "AND query LIKE %s", (f"%{'cuaderno_rate_limits'}%",)).fetchall()
    assert killed
    # The row kept its turns: the next is a second after the first (less the time the kill took).
    assert limits.reserve("k", limit, 0).wait == pytest.approx(0.8, abs=0.2)
    store.close()


def test_workers_that_first_use_a_postgres_limit_at_once_all_get_the_table(pg_schemas: list[str]) -> None:
    """Six connections to one fresh schema make their limiter's rows at the same moment, 30 times:
    each creates the table if it is not there, and none fails on another's creation (CREATE TABLE
    IF NOT EXISTS alone failed in 3 of 30 such trials, on a duplicate row type)."""
    import threading

    from _pg import new_schema, schema_url

    from cuaderno import open_journal
    from cuaderno.flow.ratelimit import _Postgres

    failed: list[BaseException] = []
    for _ in range(30):
        pg_schemas.append(new_schema())
        store = open_journal(schema_url(pg_schemas[-1]))
        start = threading.Barrier(6)

        def make(connect: Any = store.side_connection, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                _Postgres(connect).close()
            except BaseException as exc:  # collected for the assertion below
                failed.append(exc)

        threads = [threading.Thread(target=make) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        store.close()
    assert failed == []
