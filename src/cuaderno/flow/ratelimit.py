"""A provider's rate limit, shared by every worker on the journal.

A provider limits requests and tokens per minute **per API key**: N workers that each retry on
429 make a storm, and each one's retries make the others' 429s. So the budget lives in one row
per key (or model) of the journal's own database, in the limiter's own table
``cuaderno_rate_limits`` (created here on first use, on SQLite and PostgreSQL alike: it is not
part of the journal's schema and needs no migration; dropping it loses nothing but pacing), and
every worker takes its turn from that row.

The algorithm is GCRA ("virtual scheduling"): the row keeps, per budget, the *theoretical
arrival time* (TAT) of the next request, in the database's clock. A request of ``c`` tokens may
start at ``max(now, req_tat - burst, tok_tat - burst, paused_until)``; taking that turn moves
``req_tat`` on by ``60 / requests_per_minute`` and ``tok_tat`` by ``c * 60 / tokens_per_minute``.
One short transaction reserves a turn, and the caller then sleeps *outside* it until its turn:
no lock held while waiting, no thundering herd when a pause ends (the turns after it are handed
out one by one, in order), and no polling outside a probe's hold (below).

- **Probe after a pause**: a pause the provider's answers asked for says its budget is spent,
  and how long it takes to refill is the provider's guess: turns handed out back to back at the
  pause's end (as the limit, with its burst, allows) may find one request's budget there, and
  the second is refused. So the pause *arms a probe* (``probe_until`` := the pause's end): the
  first turn after it is the probe, one request across every worker and process on the journal,
  and taking it sets ``probe_until`` to the probe's turn + ``RateLimit.probe_timeout``. Every
  other turn that falls before ``probe_until`` is *held*: not taken (no budget spent), the
  caller asks again. The probe's answer ends the hold (:meth:`RateGate.sending`): a success
  clears ``probe_until`` at once (its own headers may pause again, which arms a new probe); a
  429 pauses again (a new probe after it); a failed or cancelled send (nothing said about the
  budget, maybe nothing sent) arms the probe again: the next turn goes at once, as the next
  probe. So does a probe whose turn is lost before its send (its intent's commit failed, the
  step raised or was cancelled: :meth:`RateGate.unsent`). A probe that never answers (its process SIGKILLed, its request
  slower than the bound) holds the others until ``probe_until`` at most: the next turn after it
  is a new probe. ``probe_until`` is also the probe's identity: an answer clears the hold only
  if it is still its own (a probe that timed out, and whose answer comes late, clears nothing).
- **Waiting out a hold polls**, every :data:`PROBE_RECHECK` seconds at most, with one plain read
  of the row (no write lock, no turn taken) until the hold is lifted, then takes its turn. The
  probe's answer comes from another process, maybe another host, and neither SQLite nor a
  PostgreSQL row lock can wake a sleeper: a bounded re-check keeps the wake-up within
  :data:`PROBE_RECHECK` of the answer (the hold's bound, seconds, would be the alternative), and
  it happens only while a probe is out, a request's latency after a pause. Its cost, measured on
  SQLite: 32 requests held for 2 s took 40 ms of CPU (2% of a core), and all went within 36 ms
  of the probe's answer.

- **Clock**: the database's (``julianday('now')`` on SQLite, ``clock_timestamp()`` on
  PostgreSQL). A turn comes back as a wait in seconds, which each host sleeps on its own
  monotonic clock: hosts whose clocks disagree still agree on the order and spacing of turns.
- **Transactions**: SQLite takes the row under ``BEGIN IMMEDIATE`` (the file's write lock, for
  the microseconds the row update takes: never while anyone waits); PostgreSQL under
  ``SELECT ... FOR UPDATE`` of the one row. The limiter's connection commits without a sync
  (``synchronous=NORMAL`` / ``synchronous_commit=off``): a turn lost to a power cut makes one
  request early, never a journal row wrong; the journal's own commits keep their durability.
- **Feedback** (:class:`RateGate.sending`): what the provider's answers report (a 429's
  ``Retry-After``, ``x-ratelimit-remaining-*`` at 0 with their reset) sets ``paused_until`` for
  everyone and arms a probe; a worker that reserved a turn before the pause (or before a probe
  was armed) checks it after its sleep and takes a new turn after the pause. It checks it once
  more after its intent's commit, before the send (:meth:`RateGate.ready`, one plain read): a
  pause learned of while the intent was being committed holds it there, not before a 429.
- **Table upgrades**: a table of an older version (no ``probe_until``) gets the column on first
  use, with its rows kept (SQLite: under the file's write lock; PostgreSQL: under the creators'
  advisory lock, after a look at the catalogue, so a table that has it takes no table lock).
- **Tokens**: counted before the call at an estimate (prompt characters / 3.6 + the output bound)
  and set right from the usage the answer reports (:meth:`RateGate.answered`).

What the wait holds: nothing of the journal. It happens before the step's intent is staged
(:meth:`cuaderno.durable.ModelCall.send`), so no idempotency key is used, nothing is counted as
possibly billed twice, and no journal transaction is open (the one exception, the hold of
:meth:`RateGate.ready` after the intent, is described in :mod:`cuaderno.durable.model_call`); the run's hold (the worker's lock on
the run) is kept, since the worker is in the middle of the run and will send as soon as its turn
comes. A wait longer than ``max_wait`` is refused at once (:class:`~cuaderno.RateLimitWaitTooLong`)
without taking the turn; a cancelled wait leaves its turn unused (one request's worth of budget
lost, never a request over the limit).
"""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

from cuaderno.errors import JournalError, RateLimitWaitTooLong, UsageError
from cuaderno.gateway import rate
from cuaderno.gateway.base import ModelRequest, ModelResponse
from cuaderno.gateway.rate import RateLimit
from cuaderno.journal.memory import MemoryCheckpointer

__all__ = ["PROBE_RECHECK", "NextTurn", "RateGate", "Reserved", "SharedLimits", "Turn", "estimate_tokens",
           "framework_gate", "next_turn", "probe_hold", "rate_gate"]

TABLE = "cuaderno_rate_limits"
PROBE_RECHECK = 0.05
"""Seconds a request held by a probe sleeps, at most, before it looks at the row again."""
_T = TypeVar("_T")

# Every statement is a constant: only bound parameters reach the SQL (R12). The clock is the
# database's: julianday('now') on SQLite (the host's), clock_timestamp() on PostgreSQL (the
# server's, read when the statement runs, after the row lock: now() is the transaction's start).
_SQLITE = {
    "table": "CREATE TABLE IF NOT EXISTS cuaderno_rate_limits (bucket TEXT PRIMARY KEY, "
             "req_tat REAL NOT NULL DEFAULT 0, tok_tat REAL NOT NULL DEFAULT 0, paused_until REAL NOT NULL DEFAULT 0, "
             "probe_until REAL NOT NULL DEFAULT 0)",
    "columns": "SELECT name FROM pragma_table_info('cuaderno_rate_limits')",
    "add_probe": "ALTER TABLE cuaderno_rate_limits ADD COLUMN probe_until REAL NOT NULL DEFAULT 0",
    "now": "SELECT (julianday('now') - 2440587.5) * 86400.0",
    "row": "SELECT req_tat, tok_tat, paused_until, probe_until FROM cuaderno_rate_limits WHERE bucket = ?",
    "take": "INSERT INTO cuaderno_rate_limits (bucket, req_tat, tok_tat, paused_until, probe_until) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (bucket) DO UPDATE SET req_tat = excluded.req_tat, "
            "tok_tat = excluded.tok_tat, probe_until = excluded.probe_until",
    # A pause arms a probe at its end (SET's right-hand sides read the row as it was).
    "pause": "INSERT INTO cuaderno_rate_limits (bucket, paused_until, probe_until) "
             "VALUES (?, (julianday('now') - 2440587.5) * 86400.0 + ?, (julianday('now') - 2440587.5) * 86400.0 + ?) "
             "ON CONFLICT (bucket) DO UPDATE SET paused_until = MAX(paused_until, excluded.paused_until), "
             "probe_until = MAX(paused_until, excluded.paused_until)",
    "release": "UPDATE cuaderno_rate_limits SET probe_until = 0 WHERE bucket = ? AND probe_until = ?",
    "rearm": "UPDATE cuaderno_rate_limits SET probe_until = paused_until WHERE bucket = ? AND probe_until = ?",
    "look": "SELECT (julianday('now') - 2440587.5) * 86400.0, paused_until, probe_until FROM cuaderno_rate_limits "
            "WHERE bucket = ?",
    "tokens": "UPDATE cuaderno_rate_limits SET tok_tat = tok_tat + ? WHERE bucket = ?",
}
_PG = {
    "table": "CREATE TABLE IF NOT EXISTS cuaderno_rate_limits (bucket TEXT PRIMARY KEY, "
             "req_tat DOUBLE PRECISION NOT NULL DEFAULT 0, tok_tat DOUBLE PRECISION NOT NULL DEFAULT 0, "
             "paused_until DOUBLE PRECISION NOT NULL DEFAULT 0, probe_until DOUBLE PRECISION NOT NULL DEFAULT 0)",
    "create_lock": "SELECT pg_advisory_xact_lock(1918989413)",  # 0x72617465, "rate": the table's creators take turns
    # The table as the search path finds it (the one every statement here names).
    "has_probe": "SELECT 1 FROM pg_attribute WHERE attrelid = 'cuaderno_rate_limits'::regclass "
                 "AND attname = 'probe_until' AND NOT attisdropped",
    "add_probe": "ALTER TABLE cuaderno_rate_limits ADD COLUMN probe_until DOUBLE PRECISION NOT NULL DEFAULT 0",
    "now": "SELECT extract(epoch from clock_timestamp())::double precision",
    "row": "SELECT req_tat, tok_tat, paused_until, probe_until FROM cuaderno_rate_limits WHERE bucket = %s FOR UPDATE",
    "new": "INSERT INTO cuaderno_rate_limits (bucket) VALUES (%s) ON CONFLICT DO NOTHING",
    "take": "UPDATE cuaderno_rate_limits SET req_tat = %s, tok_tat = %s, probe_until = %s WHERE bucket = %s",
    # A pause arms a probe at its end (SET's right-hand sides read the row as it was).
    "pause": "INSERT INTO cuaderno_rate_limits (bucket, paused_until, probe_until) "
             "VALUES (%s, extract(epoch from clock_timestamp())::double precision + %s, "
             "extract(epoch from clock_timestamp())::double precision + %s) "
             "ON CONFLICT (bucket) DO UPDATE SET "
             "paused_until = GREATEST(cuaderno_rate_limits.paused_until, excluded.paused_until), "
             "probe_until = GREATEST(cuaderno_rate_limits.paused_until, excluded.paused_until)",
    "release": "UPDATE cuaderno_rate_limits SET probe_until = 0 WHERE bucket = %s AND probe_until = %s",
    "rearm": "UPDATE cuaderno_rate_limits SET probe_until = paused_until WHERE bucket = %s AND probe_until = %s",
    "look": "SELECT extract(epoch from clock_timestamp())::double precision, paused_until, probe_until "
            "FROM cuaderno_rate_limits WHERE bucket = %s",
    "tokens": "UPDATE cuaderno_rate_limits SET tok_tat = tok_tat + %s WHERE bucket = %s",
}


class Reserved(NamedTuple):
    """A turn taken: seconds from now until it (``<= 0``: at once), and when it is, in the
    database's clock (what orders turns across hosts).

    ``probe``: this turn is the probe after a pause, and this is its hold's end (its identity:
    :meth:`SharedLimits.settle` lifts the hold only if it is still this one); 0 otherwise.
    ``held``: no turn was taken, a probe holds every other request for up to this many seconds
    (ask again, :meth:`SharedLimits.hold_left` says when); 0 otherwise."""

    wait: float
    at: float
    probe: float = 0.0
    held: float = 0.0


@dataclass(frozen=True, slots=True)
class Turn:
    """A budget's row: the next free turn for requests and for tokens, the pause, and the
    probe's hold (0: none; the pause's end: a probe is armed; else the probe's bound)."""

    req_tat: float = 0.0
    tok_tat: float = 0.0
    paused_until: float = 0.0
    probe_until: float = 0.0


class NextTurn(NamedTuple):
    """What :func:`next_turn` decided: seconds until the request's turn (``wait``), the row once
    it is taken, and ``held``: seconds a probe still holds it (``> 0``: nothing was taken and
    ``row`` is the row as it was)."""

    wait: float
    row: Turn
    held: float = 0.0


def next_turn(row: Turn, now: float, limit: RateLimit, tokens: int) -> NextTurn:
    """GCRA: the seconds until a request of ``tokens`` may start, and the row once it has taken
    that turn (pure; see the module docstring). Under an armed probe the turn is the probe (the
    row's ``probe_until`` becomes its turn + ``limit.probe_timeout``); a turn that falls before
    an outstanding probe's ``probe_until`` is held (not taken). ``probe_timeout=0``: no probes."""
    burst = limit.burst_seconds
    rpm, tpm = limit.requests_per_minute, limit.tokens_per_minute
    start = max(now, row.paused_until)
    if rpm is not None:
        start = max(start, row.req_tat - burst)
    if tpm is not None:
        start = max(start, row.tok_tat - burst)
    probe_until = row.probe_until
    if probe_until > 0 and limit.probe_timeout > 0:
        if start < probe_until:
            return NextTurn(start - now, row, probe_until - now)
        probe_until = start + limit.probe_timeout  # this turn is the probe
    req_tat = row.req_tat if rpm is None else max(row.req_tat, start) + 60.0 / rpm
    tok_tat = row.tok_tat if tpm is None else max(row.tok_tat, start) + tokens * 60.0 / tpm
    return NextTurn(start - now, Turn(req_tat, tok_tat, row.paused_until, probe_until))


def _probe(taken: Turn, before: Turn) -> float:
    """The probe's bound when the turn that made ``taken`` of ``before`` is a probe, else 0."""
    return taken.probe_until if taken.probe_until != before.probe_until else 0.0


def probe_hold(now: float, probe_until: float, limit: RateLimit) -> float:
    """Seconds until a request held by a probe should ask for its turn again (0: now). An armed
    probe's ``probe_until`` is the pause's end; an outstanding one's is its bound."""
    if probe_until <= 0 or limit.probe_timeout <= 0:
        return 0.0
    return max(probe_until - now, 0.0)


class _Store(Protocol):
    def reserve(self, bucket: str, limit: RateLimit, tokens: int, max_wait: float) -> Reserved: ...

    def pause(self, bucket: str, seconds: float) -> None: ...

    def release(self, bucket: str, probe: float, rearm: bool) -> None:
        """End the hold of ``probe`` if it is still its own: cleared, or (``rearm``) armed again."""
        ...

    def look(self, bucket: str) -> tuple[float, float, float]:
        """The database's now, and ``bucket``'s ``paused_until`` and ``probe_until`` (a plain read)."""
        ...

    def add_tokens(self, bucket: str, seconds: float) -> None: ...

    def close(self) -> None: ...

    def failure(self, exc: BaseException) -> bool:
        """Whether ``exc`` is this database's own error."""
        ...

    def reconnect(self) -> bool:
        """Open a new connection if the last one was lost; whether it did."""
        ...


class _Sqlite:
    """The row on SQLite: one host, every process on the journal file."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._db.execute("PRAGMA synchronous=NORMAL")  # this connection's commits only (see the module docstring)
        self._lock = threading.Lock()
        with self._txn():
            self._db.execute(_SQLITE["table"])
            if "probe_until" not in {name for (name,) in self._db.execute(_SQLITE["columns"])}:
                self._db.execute(_SQLITE["add_probe"])  # a table of an older version: its rows are kept

    @contextmanager
    def _txn(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def reserve(self, bucket: str, limit: RateLimit, tokens: int, max_wait: float) -> Reserved:
        with self._txn() as db:
            now = db.execute(_SQLITE["now"]).fetchone()[0]
            got = db.execute(_SQLITE["row"], (bucket,)).fetchone()
            before = Turn(*got) if got else Turn()
            wait, row, held = next_turn(before, now, limit, tokens)
            if wait > max_wait:
                raise RateLimitWaitTooLong(bucket, wait, max_wait)
            if held > 0:
                return Reserved(wait, now + wait, held=held)
            db.execute(_SQLITE["take"], (bucket, row.req_tat, row.tok_tat, row.paused_until, row.probe_until))
            return Reserved(wait, now + wait, _probe(row, before))

    def pause(self, bucket: str, seconds: float) -> None:
        with self._txn() as db:
            db.execute(_SQLITE["pause"], (bucket, seconds, seconds))

    def release(self, bucket: str, probe: float, rearm: bool) -> None:
        with self._txn() as db:
            db.execute(_SQLITE["rearm" if rearm else "release"], (bucket, probe))

    def look(self, bucket: str) -> tuple[float, float, float]:
        with self._lock:
            got = self._db.execute(_SQLITE["look"], (bucket,)).fetchone()
            if got is None:
                return float(self._db.execute(_SQLITE["now"]).fetchone()[0]), 0.0, 0.0
        return float(got[0]), float(got[1]), float(got[2])

    def add_tokens(self, bucket: str, seconds: float) -> None:
        with self._txn() as db:
            db.execute(_SQLITE["tokens"], (seconds, bucket))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def failure(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.Error)

    def reconnect(self) -> bool:
        return False  # a local file's connection is not lost while the process lives


class _Postgres:
    """The row on PostgreSQL: workers on several hosts, the server's clock."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        import psycopg

        self._error = psycopg.Error
        self._connect = connect
        self._conn = self._open()
        self._lock = threading.Lock()
        # CREATE ... IF NOT EXISTS is not safe against itself: two sessions that both find no table
        # both create one, and the second fails on the catalogue (a duplicate row type, a duplicate
        # key in pg_type or pg_class). Creators therefore take turns, under a lock of this table's
        # own held to the end of the transaction, and the second finds the table there.
        with self._conn.transaction():
            self._conn.execute(_PG["create_lock"])
            self._conn.execute(_PG["table"])
            if self._conn.execute(_PG["has_probe"]).fetchone() is None:
                self._conn.execute(_PG["add_probe"])  # a table of an older version: its rows are kept

    def _open(self) -> Any:
        conn = self._connect()
        conn.execute("SET synchronous_commit TO off")  # this session only (see the module docstring)
        return conn

    def failure(self, exc: BaseException) -> bool:
        return isinstance(exc, self._error)

    def reconnect(self) -> bool:
        with self._lock:
            if not (self._conn.closed or self._conn.broken):
                return False
            self._conn.close()
            self._conn = self._open()
            return True

    def reserve(self, bucket: str, limit: RateLimit, tokens: int, max_wait: float) -> Reserved:
        with self._lock, self._conn.transaction():
            before = self._locked_row(bucket)
            now = float(self._conn.execute(_PG["now"]).fetchone()[0])  # read once the row is ours
            wait, row, held = next_turn(before, now, limit, tokens)
            if wait > max_wait:
                raise RateLimitWaitTooLong(bucket, wait, max_wait)
            if held > 0:
                return Reserved(wait, now + wait, held=held)
            self._conn.execute(_PG["take"], (row.req_tat, row.tok_tat, row.probe_until, bucket))
            return Reserved(wait, now + wait, _probe(row, before))

    def _locked_row(self, bucket: str) -> Turn:
        got = self._conn.execute(_PG["row"], (bucket,)).fetchone()
        if got is None:
            self._conn.execute(_PG["new"], (bucket,))
            got = self._conn.execute(_PG["row"], (bucket,)).fetchone()
        return Turn(*(float(v) for v in got))

    def pause(self, bucket: str, seconds: float) -> None:
        with self._lock:
            self._conn.execute(_PG["pause"], (bucket, seconds, seconds))

    def release(self, bucket: str, probe: float, rearm: bool) -> None:
        with self._lock:
            self._conn.execute(_PG["rearm" if rearm else "release"], (bucket, probe))

    def look(self, bucket: str) -> tuple[float, float, float]:
        with self._lock:
            got = self._conn.execute(_PG["look"], (bucket,)).fetchone()
            if got is None:
                return float(self._conn.execute(_PG["now"]).fetchone()[0]), 0.0, 0.0
        return float(got[0]), float(got[1]), float(got[2])

    def add_tokens(self, bucket: str, seconds: float) -> None:
        with self._lock:
            self._conn.execute(_PG["tokens"], (seconds, bucket))

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class SharedLimits:
    """The limiter's rows on one journal's database, with this process's connection to them.

    One per store and process (:meth:`of`): SQLite opens the journal's file again (its own
    connection: the limiter never waits on, or holds, the journal's writer); PostgreSQL opens one
    connection of its own to the journal's database and schema. A memory journal gets a
    per-process table (it has no second process to share with).
    """

    def __init__(self, store: object) -> None:
        side = getattr(store, "side_connection", None)
        path = getattr(store, "path", None)
        if isinstance(store, MemoryCheckpointer) or path == ":memory:":
            # No second process to share with: a table of this process's own.
            self._rows: _Store = _Sqlite(sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False))
        elif isinstance(path, str) and path and callable(side):
            # The store's own way to a writable connection: one opened plainly could share a
            # read-only index of the -wal with the store (see cuaderno.journal._shm).
            self._rows = _Sqlite(side())
        elif callable(side):
            self._rows = _Postgres(side)
        else:
            raise UsageError(f"a shared rate limit needs a SQLite or PostgreSQL journal, not a {type(store).__name__}")
        # The connection lives as long as the store: closed when the store is collected.
        self._finalizer = weakref.finalize(store, self._rows.close)

    def close(self) -> None:
        """Close this process's connection to the rows (a later use of this object fails)."""
        self._finalizer()

    _of: weakref.WeakKeyDictionary[object, SharedLimits] = weakref.WeakKeyDictionary()
    _of_lock = threading.Lock()

    @classmethod
    def of(cls, store: object) -> SharedLimits:
        """The limits on ``store``'s database (opened, and the table created, on first use)."""
        with cls._of_lock:
            found = cls._of.get(store)
            if found is None:
                found = cls._of[store] = cls(store)
            return found

    def reserve(self, bucket: str, limit: RateLimit, tokens: int, *, bounded: bool = True) -> Reserved:
        """Take the next turn of ``bucket`` for a request of ``tokens``.

        Raises:
            RateLimitWaitTooLong: ``bounded`` and the turn is more than ``limit.max_wait`` away;
                it was not taken.
        """
        return self._guard(lambda: self._rows.reserve(bucket, limit, tokens, limit.max_wait if bounded else math.inf))

    def pause(self, bucket: str, seconds: float) -> None:
        """Nobody sends on ``bucket`` for ``seconds`` from now (the database's now), and the first
        turn after that is a probe (see the module docstring)."""
        self._guard(lambda: self._rows.pause(bucket, seconds))

    def settle(self, bucket: str, pause: float, probe: float, *, answered: bool = True) -> None:
        """What one send's answer says: ``pause > 0`` pauses ``bucket`` (and arms a new probe);
        otherwise the hold of the probe ``probe`` (:attr:`Reserved.probe`; 0: the send was no
        probe) ends, if it is still that probe's: cleared when it was ``answered``, else (it
        failed, was cancelled, or never left) armed again, so the next turn, at once, is the
        next probe. One statement either way."""
        if pause > 0:
            self.pause(bucket, pause)
        elif probe:
            self._guard(lambda: self._rows.release(bucket, probe, not answered))

    def hold_left(self, bucket: str, limit: RateLimit) -> float:
        """Seconds until a request a probe holds should ask for its turn again: 0 when the probe's
        answer lifted the hold, or its bound passed (a plain read, no turn taken)."""
        now, _, probe_until = self._guard(lambda: self._rows.look(bucket))
        return probe_hold(now, probe_until, limit)

    def still_due(self, bucket: str, limit: RateLimit, probe: float) -> bool:
        """Whether a turn taken earlier (``probe``: its :attr:`Reserved.probe`) still stands once
        its caller has slept until it: no pause began meanwhile, and no probe but itself is armed
        or out (a plain read)."""
        now, paused_until, probe_until = self._guard(lambda: self._rows.look(bucket))
        if probe_until > 0 and limit.probe_timeout > 0:
            # A probe's time: only the probe goes. Its own pause is not read again (a pause since
            # would have armed a new probe): SQLite's clock has milliseconds, and a sleep to the
            # turn may end a little before it says the pause is over.
            return probe_until == probe
        return paused_until <= now

    def paused_for(self, bucket: str) -> float:
        """Seconds left of ``bucket``'s pause (0: none)."""
        now, paused_until, _ = self._guard(lambda: self._rows.look(bucket))
        return max(paused_until - now, 0.0)

    def add_tokens(self, bucket: str, limit: RateLimit, tokens: int) -> None:
        """Count ``tokens`` more (or fewer, when negative) than a request reserved."""
        if limit.tokens_per_minute is not None and tokens:
            per_minute = limit.tokens_per_minute
            self._guard(lambda: self._rows.add_tokens(bucket, tokens * 60.0 / per_minute))

    def _guard(self, op: Callable[[], _T]) -> _T:
        """``op``, with the database's errors as :class:`~cuaderno.errors.JournalError`; a lost
        PostgreSQL connection (a server restart) is opened again and ``op`` tried once more (a
        turn taken twice that way costs one request's budget, never a request over it)."""
        try:
            return op()
        except Exception as exc:
            if not self._rows.failure(exc):
                raise
            if self._rows.reconnect():
                try:
                    return op()
                except Exception as again:
                    if not self._rows.failure(again):
                        raise
                    exc = again
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise JournalError(f"the rate-limit table on the journal's database: {first[:300]}; "
                               "nothing was sent for this request") from None


_CHARS_PER_TOKEN = 3.6
"""A little under the usual 4 characters a token: the wire form a provider counts (roles, tool
call wrappers, schemas) is longer than the neutral request measured here. An estimate below the
provider's count lets a request through early (a 429); one above it only slows the pace until
the answer's usage sets the count right."""


def estimate_tokens(request: ModelRequest, limit: RateLimit) -> int:
    """What a request is counted at before it is sent: its prompt's characters (as JSON, tools
    included) / 3.6, plus the output it may generate."""
    prompt = len(json.dumps([request.instructions, request.messages, request.tools], ensure_ascii=False,
                            default=str))
    output = request.max_output_tokens if request.max_output_tokens is not None else limit.output_tokens
    return math.ceil(prompt / _CHARS_PER_TOKEN) + output


class RateGate:
    """One model request's turn under a shared :class:`~cuaderno.RateLimit` (the gate
    :meth:`cuaderno.durable.ModelCall.send` passes before the intent and around each send)."""

    __slots__ = ("bucket", "limit", "limits", "probe", "sleep", "tokens")

    def __init__(self, limits: SharedLimits, bucket: str, limit: RateLimit, tokens: int,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.limits, self.bucket, self.limit, self.tokens, self.sleep = limits, bucket, limit, tokens, sleep
        self.probe = 0.0
        """The probe's bound when the turn :meth:`admit` took is the probe after a pause (its
        :meth:`sending` lifts the hold), else 0."""

    async def admit(self, *, bounded: bool = True) -> None:
        """Wait for this request's turn (before its intent is written). While a probe is out,
        the request takes no turn: it looks at the row every :data:`PROBE_RECHECK` seconds at
        most until the probe's answer lifts the hold (or its bound passes), then asks again.

        Raises:
            RateLimitWaitTooLong: ``bounded`` and its turn is further than ``max_wait`` (a
                probe's hold is not counted: it is bounded by ``probe_timeout``).
        """
        limits, bucket, limit = self.limits, self.bucket, self.limit
        self.probe = 0.0
        while True:
            turn = limits.reserve(bucket, limit, self.tokens, bounded=bounded)
            if turn.held > 0:
                held = turn.held
                while held > 0:
                    await self.sleep(min(held, PROBE_RECHECK))
                    held = limits.hold_left(bucket, limit)
                continue  # to take a turn: maybe the next probe's
            if turn.wait > 0:
                try:
                    await self.sleep(turn.wait)
                    # Another worker may have been told to back off while this one slept: its turn
                    # was handed out before the pause (and its probe), so it takes a new one after it.
                    due = limits.still_due(bucket, limit, turn.probe)
                except BaseException:
                    if turn.probe:  # a probe cancelled before it was sent: the next turn is the probe
                        _release(limits, bucket, turn.probe)
                    raise
                if not due:
                    continue
            self.probe = turn.probe
            return

    async def ready(self, *, bounded: bool = True) -> None:
        """Between the intent's commit and the send: one plain read of the row. A turn
        :meth:`admit` took stands unless a pause began since (another worker's 429, or a spent
        budget its answer reported, while this one's intent was being committed) or another
        probe is out or armed: then the request is held as :meth:`admit` holds it (a new turn
        after the pause, maybe the next probe; a probe's hold until its answer) and goes after.

        Raises:
            RateLimitWaitTooLong: ``bounded`` and the new turn is further than ``max_wait``; the
                request was not sent (``after_intent``: its intent is journaled).
        """
        if not self.limits.still_due(self.bucket, self.limit, self.probe):
            # The turn taken is void: a pause since armed a probe of its own, so this one's
            # probe (if it was one) is not the row's any more, and nothing is left to release.
            try:
                await self.admit(bounded=bounded)
            except RateLimitWaitTooLong as exc:  # said again: the intent is journaled by now
                raise RateLimitWaitTooLong(exc.bucket, exc.wait, exc.max_wait, after_intent=True) from None

    def unsent(self) -> None:
        """The turn :meth:`admit` took will not be sent (the intent's commit failed, the call
        raised or was cancelled before its send): a probe's hold ends at once, armed again, so
        the next waiting request goes as the next probe (not after ``probe_timeout``). Nothing
        to do for an ordinary turn, or once :meth:`sending` has begun (it settles the probe).
        Never raises: a failure to say so leaves the hold to its bound, as a killed probe does."""
        probe, self.probe = self.probe, 0.0
        if probe:
            _release(self.limits, self.bucket, probe)

    @contextmanager
    def sending(self) -> Iterator[None]:
        """Around one send: what its answer says about the limit pauses every worker. A probe's
        send ends its hold whichever way it ends: answered, the others go; failed or cancelled
        (nothing said about the budget), the next request goes as the next probe."""
        probe, self.probe = self.probe, 0.0
        answered = False
        with rate.watching() as watch:
            try:
                yield
                answered = True
            finally:
                pause = max((s.pause() for s in watch.signals), default=0.0)
                if pause > 0 or probe:
                    self.limits.settle(self.bucket, pause, probe, answered=answered)

    def answered(self, response: ModelResponse) -> None:
        """Set the reserved token count right from the usage the answer reports (when it does)."""
        used = response.usage.input_tokens + response.usage.output_tokens
        if used:
            self.limits.add_tokens(self.bucket, self.limit, used - self.tokens)


def _release(limits: SharedLimits, bucket: str, probe: float) -> None:
    """Arm ``probe``'s hold again (it was never sent), on a path that is already raising: the
    limiter's own error is not raised over the caller's (the hold then ends at its bound)."""
    try:
        limits.settle(bucket, 0.0, probe, answered=False)
    except JournalError:
        pass


def rate_gate(store: object, gateway: object, request: ModelRequest,
              sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> RateGate | None:
    """The gate a model request of ``gateway`` passes on ``store``'s database, or ``None`` when
    the gateway declares no :class:`~cuaderno.RateLimit` (its ``rate_limit`` attribute)."""
    limit = getattr(gateway, "rate_limit", None)
    if not isinstance(limit, RateLimit):
        return None
    label = getattr(gateway, "rate_bucket", None)
    bucket = label(request) if callable(label) else rate.bucket_label(
        limit, endpoint=type(gateway).__name__, api_key=None, model=request.model)
    return RateGate(SharedLimits.of(store), bucket, limit, estimate_tokens(request, limit), sleep)


def framework_gate(store: object, limit: RateLimit, *, client: object, model: str | None, prompt: object,
                   max_output_tokens: int | None,
                   sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> RateGate:
    """The gate of a model request an agent framework sends through its own ``openai`` client
    (the Pydantic AI and OpenAI Agents integrations), on ``store``'s database.

    Its budget is the one an :class:`~cuaderno.OpenAIGateway` with the same endpoint and API key
    (or model, ``per="model"``) counts against, so a fleet mixing both shares one limit; a client
    without ``base_url`` and ``api_key`` counts under the model alone. ``prompt`` (the
    conversation as the framework holds it, any JSON-able value) is counted as a gateway's
    request is: its characters / 3.6, plus ``max_output_tokens`` (else the limit's
    ``output_tokens``)."""
    base_url, api_key = getattr(client, "base_url", None), getattr(client, "api_key", None)
    bucket = rate.bucket_label(limit, endpoint=str(base_url) if base_url is not None else "framework",
                               api_key=api_key if isinstance(api_key, str) else None, model=model)
    chars = len(json.dumps(prompt, ensure_ascii=False, default=str))
    output = max_output_tokens if max_output_tokens is not None else limit.output_tokens
    return RateGate(SharedLimits.of(store), bucket, limit, math.ceil(chars / _CHARS_PER_TOKEN) + output, sleep)
