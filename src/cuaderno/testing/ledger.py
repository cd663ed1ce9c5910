"""The fake external service ("ledger") that the crash tests use as ground truth (RELIABILITY.md H2).

Why receipts are the ground truth: cuaderno promises that a side effect happens exactly once or the
run stops ``uncertain``. Its own journal cannot prove that. After a crash at K3/K4 the journal holds
an intent and no result, and only the service on the other side knows whether the effect happened.
So the ledger is a separate process with its own SQLite file (WAL, ``synchronous=FULL``). In ONE
committed transaction, before it replies, it writes a *receipt* (idempotency key, request hash,
business id, applied, response) and applies the effect. Whatever the runtime believes,
the receipts say what happened: one applied receipt per key is exactly once (invariant I1), two is
a duplicate, none means it never happened. This is Jepsen's method: the history is checked against
an independent observer, never against the system's own log.

Run it as ``python -m cuaderno.testing.ledger --db PATH --port 0 --mode dedup|nodedup
[--drop-after-apply N] [--delay-reply S] [--crash-after-receipt N]``; it prints
``LEDGER READY port=<port> pid=<pid>`` when it serves. ``dedup`` replays the stored response for a
repeated key and answers 409 when the body differs (Stripe semantics); ``nodedup`` applies every
request again. ``--drop-after-apply N`` and ``--crash-after-receipt N`` count *accepted* requests
(answered 200: applied or replayed) since this process started.

A lookup (``GET /effects?key=K``) is an answer the runtime may act on: 404 must mean "provably
absent". So every GET first waits until each connection the ledger accepted *before* it has been
decided (committed, refused or closed): a request written just before the client was SIGKILLed
(K3) cannot race a later lookup. Each connection carries one request (``Connection: close``).

:class:`LedgerClient` (stdlib ``http.client``) passes the crash points ``tool.K3`` (request fully
written) and ``tool.K4`` (reply arrived, so the ledger has committed, but not read).
:class:`LedgerProcess` starts and stops a ledger for tests and scripts.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlencode, urlsplit

from cuaderno.testing import crash
from cuaderno.testing._ledger_server import JSONDict, Mode, canonical_json, main, read_receipts, request_hash
from cuaderno.testing._process import StartedProcess

__all__ = [
    "LedgerClient",
    "LedgerConflict",
    "LedgerError",
    "LedgerHTTPError",
    "LedgerProcess",
    "LedgerReplyLost",
    "LedgerReplyTimeout",
    "LedgerUnavailable",
    "Mode",
    "canonical_json",
    "main",
    "read_receipts",
    "request_hash",
]

_LOOPBACK = frozenset({"127.0.0.1", "localhost"})


# --------------------------------------------------------------------------------------------- client


class LedgerError(Exception):
    """Base of the client's errors."""


class LedgerUnavailable(LedgerError):
    """The connection failed before a byte of the request was sent: the effect provably did not happen."""


class LedgerReplyLost(LedgerError):
    """The request may have arrived but no reply was read: the effect may or may not have happened."""


class LedgerReplyTimeout(LedgerReplyLost):
    """The request was sent and no reply arrived in time: the effect may or may not have happened."""


class LedgerHTTPError(LedgerError):
    """The ledger answered with an error status (nothing was applied)."""

    def __init__(self, status: int, body: JSONDict) -> None:
        self.status, self.body = status, body
        super().__init__(f"ledger answered {status}: {body}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.status, self.body))


class LedgerConflict(LedgerHTTPError):
    """409: the key was already used for a different request (Stripe semantics); nothing was applied."""


class LedgerClient:
    """A synchronous client for one ledger; every call opens its own connection."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or url.hostname not in _LOOPBACK or url.port is None:
            raise ValueError(f"the ledger lives on http://127.0.0.1:<port>, not {base_url!r}")
        self.base_url, self.timeout = base_url.rstrip("/"), timeout
        self._host, self._port = url.hostname, url.port

    def post_effect(self, key: str, effect: str, args: JSONDict, business_id: str | None = None) -> JSONDict:
        """Ask the ledger to apply an effect under an idempotency key; return its reply.

        Raises :class:`LedgerUnavailable` (provably not applied), :class:`LedgerReplyLost` /
        :class:`LedgerReplyTimeout` (unknown: look it up), :class:`LedgerConflict` (409).
        """
        data = canonical_json({"key": key, "effect": effect, "args": args, "business_id": business_id}).encode()
        headers = {"Content-Type": "application/json", "Connection": "close"}
        conn = self._connect()
        try:
            try:
                conn.request("POST", "/effects", body=data, headers=headers)
            except OSError as exc:  # some bytes may have left; a partial request is never applied, but be safe
                raise LedgerReplyLost(f"sending key {key!r} failed: {exc!r}") from exc
            crash.point("tool.K3")
            readable, _, _ = select.select([conn.sock], [], [], self.timeout)
            if not readable:
                raise LedgerReplyTimeout(f"no reply for key {key!r} within {self.timeout}s")
            crash.point("tool.K4")
            status, payload = self._read(conn, f"key {key!r}")
        finally:
            conn.close()
        if status == 200:
            return payload
        if status == 409:
            raise LedgerConflict(status, payload)
        raise LedgerHTTPError(status, payload)

    def lookup(self, key: str | None = None, business_id: str | None = None) -> list[JSONDict] | None:
        """The receipts for a key and/or business id, or None when the ledger proves there are none."""
        if key is None and business_id is None:
            raise ValueError("lookup needs key or business_id")
        query = {name: v for name, v in (("key", key), ("business_id", business_id)) if v is not None}
        status, payload = self._get("/effects?" + urlencode(query))
        if status == 404 and payload.get("found") is False:
            return None
        if status == 200 and payload.get("found") is True:
            return list(payload["receipts"])
        raise LedgerHTTPError(status, payload)

    def receipts(self) -> list[JSONDict]:
        """Every receipt the ledger holds, oldest first."""
        status, payload = self._get("/receipts")
        if status != 200:
            raise LedgerHTTPError(status, payload)
        return list(payload["receipts"])

    def health(self) -> JSONDict:
        status, payload = self._get("/health")
        if status != 200:
            raise LedgerHTTPError(status, payload)
        return payload

    def _connect(self) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        try:
            conn.connect()
        except OSError as exc:
            conn.close()
            raise LedgerUnavailable(f"cannot connect to the ledger at {self.base_url}: {exc!r}") from exc
        return conn

    def _get(self, path: str) -> tuple[int, JSONDict]:
        conn = self._connect()
        try:
            try:
                conn.request("GET", path, headers={"Connection": "close"})
            except OSError as exc:
                raise LedgerReplyLost(f"GET {path} failed: {exc!r}") from exc
            return self._read(conn, f"GET {path}")
        finally:
            conn.close()

    @staticmethod
    def _read(conn: http.client.HTTPConnection, what: str) -> tuple[int, JSONDict]:
        try:
            resp = conn.getresponse()
            raw = resp.read()
            payload = json.loads(raw)
        except TimeoutError as exc:
            raise LedgerReplyTimeout(f"{what}: the reply did not complete: {exc!r}") from exc
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise LedgerReplyLost(f"{what}: the connection closed without a complete reply: {exc!r}") from exc
        if not isinstance(payload, dict):
            raise LedgerReplyLost(f"{what}: the reply is not a JSON object")
        return resp.status, payload


# --------------------------------------------------------------------------------------------- process


class LedgerProcess(StartedProcess):
    """A ledger subprocess for tests and scripts: ``with LedgerProcess(mode="nodedup") as ledger: ...``.

    ``db=None`` uses a temporary directory that is removed on exit. Start another ``LedgerProcess``
    on the same ``db`` (and ``port=old.port`` if the caller keeps its URL) to restart a ledger.
    """

    def __init__(
        self,
        db: str | os.PathLike[str] | None = None,
        *,
        mode: Mode = "dedup",
        port: int = 0,
        drop_after_apply: int = 0,
        delay_reply: float = 0.0,
        crash_after_receipt: int = 0,
        ready_timeout: float = 15.0,
    ) -> None:
        self._tmpdir = None if db is not None else tempfile.mkdtemp(prefix="cuaderno-ledger-")
        self.db_path = Path(db) if db is not None else Path(self._tmpdir or "") / "ledger.sqlite3"
        self.mode, self.ready_timeout = mode, ready_timeout
        self._args = ["--db", str(self.db_path), "--port", str(port), "--mode", mode,
                      "--drop-after-apply", str(drop_after_apply), "--delay-reply", str(delay_reply),
                      "--crash-after-receipt", str(crash_after_receipt)]
        self._proc: subprocess.Popen[str] | None = None
        self._port = 0

    def start(self) -> LedgerProcess:
        """Start the ledger and wait for its READY line."""
        if self._proc is not None:
            raise RuntimeError("this LedgerProcess was already started")
        env = {k: v for k, v in os.environ.items() if k != crash.ENV_VAR}
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        cmd = [sys.executable, "-m", "cuaderno.testing.ledger", *self._args]
        self._proc = proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        deadline = time.monotonic() + self.ready_timeout
        line = ""
        while time.monotonic() < deadline and not line:
            if select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
                line = proc.stdout.readline() or "EOF"
        match = re.fullmatch(r"LEDGER READY port=(\d+) pid=(\d+)\s*", line)
        if match is None:
            self.stop()
            raise RuntimeError(f"ledger did not start (got {line!r}, exit code {proc.returncode}): {cmd}")
        self._port = int(match.group(1))
        return self

    def _not_started(self) -> RuntimeError:
        return RuntimeError("the ledger is not started")

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        if not self._port:
            raise RuntimeError("the ledger is not started")
        return f"http://127.0.0.1:{self._port}"

    @property
    def alive(self) -> bool:
        """:attr:`running`, by the name the ledger's tests know it by."""
        return self.running

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def client(self, timeout: float = 10.0) -> LedgerClient:
        return LedgerClient(self.url, timeout=timeout)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the ledger to exit by itself (for example ``--crash-after-receipt``); its return code."""
        return self._started().wait(timeout)

    def stop(self, timeout: float = 10.0) -> int | None:
        """Terminate the ledger by its PID (SIGTERM, then SIGKILL) and reap it; its return code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        return proc.returncode

    def receipts(self, key: str | None = None, business_id: str | None = None) -> list[JSONDict]:
        """Committed receipts, oldest first: via the live ledger (after in-flight requests settle) or the file."""
        if self.alive:
            everything = self.client(timeout=30.0).receipts()
            return [r for r in everything if key in (None, r["key"]) and business_id in (None, r["business_id"])]
        return read_receipts(self.db_path, key, business_id)

    def applied_count(self, key: str | None = None) -> int:
        """How many receipts (for ``key``, or in all) record an applied effect."""
        return sum(1 for r in self.receipts(key) if r["applied"])

    def balances(self) -> dict[str, int | float]:
        """Account balances moved by ``transfer`` effects, read from the ledger's file."""
        conn = sqlite3.connect(self.db_path)
        try:
            return dict(conn.execute("SELECT account, amount FROM balances ORDER BY account").fetchall())
        finally:
            conn.close()

    def close(self) -> None:
        self.stop()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    def __enter__(self) -> LedgerProcess:
        return self.start() if self._proc is None else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(main())
