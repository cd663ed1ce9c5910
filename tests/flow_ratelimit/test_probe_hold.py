"""After a pause the provider asked for, one request (the probe) goes and every other one waits
for its answer, on SQLite and PostgreSQL, across connections and processes; and a table of an
older version gets the probe's column with its rows kept."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from cuaderno import RateLimit, SqliteCheckpointer
from cuaderno.flow.ratelimit import PROBE_RECHECK, RateGate, SharedLimits, Turn, next_turn

# Far above what the tests send, with a burst that would let every waiting turn go at once.
LIMIT = RateLimit(requests_per_minute=600, burst_seconds=2, max_wait=30)


def test_the_first_turn_after_a_pause_is_the_probe_and_the_others_are_held() -> None:
    limit = RateLimit(requests_per_minute=600, burst_seconds=2, probe_timeout=5)
    armed = Turn(paused_until=10.0, probe_until=10.0)  # as a pause leaves the row
    probe = next_turn(armed, 9.0, limit, 0)
    assert probe.wait == 1.0 and probe.held == 0.0 and probe.row.probe_until == 15.0  # its turn + 5 s
    other = next_turn(probe.row, 9.0, limit, 0)
    # The burst would let it go at 10 s too; the probe holds it (no turn taken) up to 15 s.
    assert other.held == 6.0 and other.row is probe.row
    after = next_turn(Turn(probe.row.req_tat, 0.0, 10.0, 0.0), 10.01, limit, 0)  # the probe's answer lifted it
    assert after.held == 0.0 and after.wait == 0.0
    late = next_turn(probe.row, 15.0, limit, 0)  # nobody answered: past the bound, a new probe
    assert late.held == 0.0 and late.row.probe_until == 20.0
    unprobed = next_turn(armed, 9.0, RateLimit(requests_per_minute=600, burst_seconds=2, probe_timeout=0), 0)
    assert next_turn(unprobed.row, 9.0, RateLimit(requests_per_minute=600, burst_seconds=2, probe_timeout=0),
                     0).held == 0.0


async def _first_admitted(gates: list[RateGate]) -> tuple[RateGate, asyncio.Task[None], float]:
    """Both gates wait for their turn; the one admitted first, the other's task, and when."""
    tasks = [asyncio.create_task(g.admit()) for g in gates]
    done, _ = await asyncio.wait(tasks, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    admitted_at = time.monotonic()
    assert len(done) == 1, "both were admitted at once"
    first = tasks.index(next(iter(done)))
    return gates[first], tasks[1 - first], admitted_at


def test_after_a_pause_one_probe_goes_and_the_other_waits_for_its_answer(two_stores: Any) -> None:
    a, b = (SharedLimits.of(s) for s in two_stores)
    gates = [RateGate(a, "k", LIMIT, 0), RateGate(b, "k", LIMIT, 0)]

    async def go() -> tuple[float, float]:
        a.pause("k", 0.3)  # as a 429's Retry-After sets it: both turns fall due at its end
        probe, other, _ = await _first_admitted(gates)
        assert probe.probe > 0
        with probe.sending():  # the probe's request is out, its answer not yet back
            await asyncio.sleep(0.6)
            assert not other.done(), "a second request went before the probe's answer"
        released = time.monotonic()
        await asyncio.wait_for(other, 5)
        assert gates[1 - gates.index(probe)].probe == 0.0  # it went as an ordinary turn
        return released, time.monotonic()

    released, admitted = asyncio.run(go())
    # The probe's answer (a success, no new pause) lifts the hold: the other goes within a re-check.
    assert admitted - released < PROBE_RECHECK + 0.25, admitted - released


def test_a_turn_taken_before_a_pause_that_falls_after_it_waits_for_the_probe(two_stores: Any) -> None:
    """A queued turn reserved before the pause, due after the pause's end, does not go beside
    the probe: it asks again and becomes the probe itself (nobody else took it)."""
    a, b = (SharedLimits.of(s) for s in two_stores)
    limit = RateLimit(requests_per_minute=60, max_wait=30)
    assert a.reserve("k", limit, 0).wait <= 0
    queued = a.reserve("k", limit, 0)  # a second from now
    assert queued.wait > 0.5 and queued.probe == 0.0
    b.pause("k", 0.2)  # a 429 seen by another worker: its end comes before the queued turn
    time.sleep(queued.wait)
    assert not a.still_due("k", limit, queued.probe)
    assert a.reserve("k", limit, 0).probe > 0  # asked again, it is the probe
    assert not b.still_due("k", limit, 0.0)  # and a turn of another's waits for it


def test_a_probe_answered_429_pauses_again_and_the_next_turn_is_a_new_probe(two_stores: Any) -> None:
    a, b = (SharedLimits.of(s) for s in two_stores)
    gates = [RateGate(a, "k", LIMIT, 0), RateGate(b, "k", LIMIT, 0)]

    async def go() -> float:
        a.pause("k", 0.2)
        probe, other, _ = await _first_admitted(gates)
        with probe.sending():
            await asyncio.sleep(0.1)
        probe.limits.settle("k", 0.5, 0.0)  # what sending does with a 429's Retry-After of 0.5 s
        assert not other.done()
        settled = time.monotonic()
        await asyncio.wait_for(other, 5)
        return time.monotonic() - settled

    waited = asyncio.run(go())
    assert waited >= 0.45, waited  # held through the new pause
    assert max(g.probe for g in gates) > 0  # and admitted as the new pause's probe


def test_a_failed_or_cancelled_probe_lets_the_next_request_go_as_the_next_probe(two_stores: Any) -> None:
    a, b = (SharedLimits.of(s) for s in two_stores)
    gates = [RateGate(a, "k", LIMIT, 0), RateGate(b, "k", LIMIT, 0)]

    async def failed() -> float:
        a.pause("k", 0.2)
        probe, other, _ = await _first_admitted(gates)
        with pytest.raises(ConnectionError), probe.sending():
            raise ConnectionError("the connection dropped")
        failed_at = time.monotonic()
        await asyncio.wait_for(other, 5)
        assert gates[1 - gates.index(probe)].probe > 0  # the next probe, not a free turn
        return time.monotonic() - failed_at

    # Within a re-check of the failure, not after the probe's bound (10 s).
    assert asyncio.run(failed()) < PROBE_RECHECK + 0.25

    async def cancelled() -> None:
        a.pause("k", 0.3)
        waiter = asyncio.create_task(gates[0].admit())
        await asyncio.sleep(0.1)  # the probe's turn is taken, it sleeps until the pause's end
        assert b.reserve("k", LIMIT, 0).held > 0
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        # No hold left behind by a probe never sent: the next turn is the probe, at the pause's end.
        after = b.reserve("k", LIMIT, 0)
        assert after.held == 0.0 and after.probe > 0 and after.wait <= 0.25

    asyncio.run(cancelled())


def _journal_url(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'j.db'}"
    from _pg import new_schema, schema_url

    schemas: list[str] = request.getfixturevalue("pg_schemas")
    schemas.append(new_schema())
    return schema_url(schemas[-1])


def _probe_and_hang(url: str, timeout: float, out: Any) -> None:
    """Take the probe's turn, start its send, say so, and never answer (the test SIGKILLs it)."""
    from cuaderno import open_journal

    try:
        store = open_journal(url)  # kept: the limiter's connection lives as long as its store
        limits = SharedLimits(store)
        gate = RateGate(limits, "k", RateLimit(requests_per_minute=600, burst_seconds=2, probe_timeout=timeout), 0)

        async def go() -> None:
            await gate.admit()
            probe = gate.probe  # sending() takes it over
            with gate.sending():
                out.put(("probing", probe))
                await asyncio.sleep(3600)

        asyncio.run(go())
    except BaseException as exc:  # said to the test, which would otherwise wait for it in vain
        out.put(("error", f"{type(exc).__name__}: {exc}"))
        raise


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_probe_whose_process_is_killed_holds_the_others_only_until_its_bound(
        backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    from cuaderno import open_journal

    url = _journal_url(tmp_path, backend, request)
    store = open_journal(url)
    limits = SharedLimits.of(store)
    timeout = 1.5
    limit = RateLimit(requests_per_minute=600, burst_seconds=2, probe_timeout=timeout)
    limits.pause("k", 0.2)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_probe_and_hang, args=(url, timeout, out))
    proc.start()
    try:
        try:
            said = out.get(timeout=90)
        except queue.Empty:
            pytest.fail(f"the probe's process said nothing in 90 s (exit code {proc.exitcode})")
        assert said[0] == "probing" and said[1] > 0, said
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)  # mid-probe: its answer never comes
        proc.join(30)
        killed = time.monotonic()
        held = limits.reserve("k", limit, 0)
        assert held.held > 0.5, held  # the dead probe holds the others (no turn taken) ...
        gate = RateGate(limits, "k", limit, 0)
        asyncio.run(asyncio.wait_for(gate.admit(), timeout + 5))
        waited = time.monotonic() - killed
        # ... up to its bound, not for ever: then the next turn is a new probe.
        assert waited <= timeout + 1.0, waited
        assert gate.probe > 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(30)
        store.close()


_OLD_TABLE = ("CREATE TABLE cuaderno_rate_limits (bucket TEXT PRIMARY KEY, req_tat {real} NOT NULL DEFAULT 0, "
              "tok_tat {real} NOT NULL DEFAULT 0, paused_until {real} NOT NULL DEFAULT 0)")


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_table_of_the_older_shape_gets_the_probe_column_and_keeps_its_rows(
        backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    from cuaderno import open_journal

    url = _journal_url(tmp_path, backend, request)
    store = open_journal(url)
    far = time.time() + 3600.0  # a turn an hour ahead: only the kept row can say so
    if backend == "sqlite":
        db = sqlite3.connect(tmp_path / "j.db", isolation_level=None)
        db.execute(_OLD_TABLE.format(real="REAL"))
        db.execute("INSERT INTO cuaderno_rate_limits (bucket, req_tat) VALUES ('k', ?)", (far,))
        db.close()
    else:
        db = store.side_connection()
        db.execute(_OLD_TABLE.format(real="DOUBLE PRECISION"))
        db.execute("INSERT INTO cuaderno_rate_limits (bucket, req_tat) VALUES ('k', %s)", (far,))
        db.close()
    try:
        limits = SharedLimits.of(store)
        turn = limits.reserve("k", RateLimit(requests_per_minute=60, max_wait=7200), 0)
        assert 3500 < turn.wait <= 3600, turn  # the old row's turn, kept
        limits.pause("k", 0.2)  # the new column is written ...
        assert limits.reserve("k", RateLimit(requests_per_minute=60, max_wait=7200), 0).probe > 0  # ... and read
        SharedLimits(store).close()  # a second opener finds the column there
    finally:
        store.close()
    if backend == "sqlite":
        SqliteCheckpointer(tmp_path / "j.db").close()  # the journal's own checks accept the upgraded table
