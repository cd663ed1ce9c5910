"""The ledger server behind :mod:`cuaderno.testing.ledger` (see its docstring); stdlib only.

Also the helpers both sides share: canonical JSON, the request hash and reading receipts from the file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socketserver
import sqlite3
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

__all__ = ["JSONDict", "Mode", "canonical_json", "main", "read_receipts", "request_hash"]

Mode = Literal["dedup", "nodedup"]
JSONDict = dict[str, Any]

_IDLE_TIMEOUT = 5.0  # seconds a connection may stall while sending its request
_QUIESCE_TIMEOUT = 20.0  # seconds a lookup waits for earlier connections before answering 503

_SCHEMA = """
CREATE TABLE IF NOT EXISTS receipts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    business_id TEXT,
    effect TEXT NOT NULL,
    request TEXT NOT NULL,
    applied INTEGER NOT NULL CHECK (applied IN (0, 1)),
    response TEXT NOT NULL,
    replays INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS receipts_by_key ON receipts (key);
CREATE INDEX IF NOT EXISTS receipts_by_business_id ON receipts (business_id);
CREATE TABLE IF NOT EXISTS effects (
    receipt_id INTEGER PRIMARY KEY REFERENCES receipts (id),
    effect TEXT NOT NULL,
    args TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS balances (account TEXT PRIMARY KEY, amount NUMERIC NOT NULL);
"""
_SELECT_RECEIPTS = (
    "SELECT id, key, request_hash, business_id, effect, request, applied, response, replays, created_at"
    " FROM receipts WHERE (? IS NULL OR key = ?) AND (? IS NULL OR business_id = ?) ORDER BY id"
)


# --------------------------------------------------------------------------------------------- shared


def canonical_json(value: Any) -> str:
    """Canonical JSON: sorted keys, compact separators, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def request_hash(body: JSONDict) -> str:
    """sha256 (hex) of the canonical JSON of a ``POST /effects`` body."""
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def _receipt(row: tuple[Any, ...]) -> JSONDict:
    return {
        "receipt_id": row[0],
        "key": row[1],
        "request_hash": row[2],
        "business_id": row[3],
        "effect": row[4],
        "request": json.loads(row[5]),
        "applied": bool(row[6]),
        "response": json.loads(row[7]),
        "replays": row[8],
        "created_at": row[9],
    }


def _select(conn: sqlite3.Connection, key: str | None, business_id: str | None) -> list[JSONDict]:
    return [_receipt(r) for r in conn.execute(_SELECT_RECEIPTS, (key, key, business_id, business_id))]


def read_receipts(db: str | os.PathLike[str], key: str | None = None, business_id: str | None = None) -> list[JSONDict]:
    """Read committed receipts straight from a ledger's SQLite file (works while it is dead)."""
    conn = sqlite3.connect(os.fspath(db))
    try:
        return _select(conn, key, business_id)
    finally:
        conn.close()


def _parse_body(raw: bytes) -> JSONDict:
    body = json.loads(raw)
    if not isinstance(body, dict) or not set(body) <= {"key", "effect", "args", "business_id"}:
        raise ValueError("body must be an object with key, effect, args and optional business_id")
    key, effect, args, business_id = body.get("key"), body.get("effect"), body.get("args"), body.get("business_id")
    if not isinstance(key, str) or not key or not isinstance(effect, str) or not effect:
        raise ValueError("key and effect must be non-empty strings")
    if not isinstance(args, dict) or not (business_id is None or isinstance(business_id, str)):
        raise ValueError("args must be an object and business_id a string or null")
    return {"key": key, "effect": effect, "args": args, "business_id": business_id}


# --------------------------------------------------------------------------------------------- server


class _Ledger:
    """The ledger's state: one SQLite connection, every transaction serialized by a lock."""

    def __init__(self, db: str, mode: Mode, drop_after_apply: int, delay_reply: float, crash_after: int) -> None:
        self.mode, self.drop_after_apply, self.delay_reply = mode, drop_after_apply, delay_reply
        self.crash_after = crash_after
        self.accepted = 0
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        self.journal_mode = str(self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
        if self.journal_mode.lower() != "wal":
            raise RuntimeError(f"ledger db {db!r}: journal_mode is {self.journal_mode!r}, not wal")
        self._conn.execute("PRAGMA synchronous=FULL")
        self.synchronous = int(self._conn.execute("PRAGMA synchronous").fetchone()[0])
        self._conn.executescript(_SCHEMA)

    def post(self, body: JSONDict) -> tuple[int, JSONDict, int]:
        """Decide a request in one committed transaction: (status, reply, accepted ordinal or 0)."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                status, reply = self._decide(body)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            if status != 200:
                return status, reply, 0
            self.accepted += 1
            return status, reply, self.accepted

    def _decide(self, body: JSONDict) -> tuple[int, JSONDict]:
        key, digest, c = body["key"], request_hash(body), self._conn
        if self.mode == "dedup":
            row = c.execute("SELECT id, request_hash, response FROM receipts WHERE key = ? ORDER BY id LIMIT 1", (key,))
            found = row.fetchone()
            if found is not None:
                if found[1] != digest:
                    return 409, {"error": "idempotency key reused with a different request", "key": key,
                                 "receipt_id": found[0]}
                c.execute("UPDATE receipts SET replays = replays + 1 WHERE id = ?", (found[0],))
                return 200, {**json.loads(found[2]), "replayed": True}
        cur = c.execute(
            "INSERT INTO receipts (key, request_hash, business_id, effect, request, applied, response, created_at)"
            " VALUES (?, ?, ?, ?, ?, 1, '{}', ?)",
            (key, digest, body["business_id"], body["effect"], canonical_json(body), datetime.now(UTC).isoformat()),
        )
        rid = cur.lastrowid
        reply = {"receipt_id": rid, "key": key, "applied": True, "replayed": False, "effect": body["effect"],
                 "business_id": body["business_id"], "request_hash": digest}
        c.execute("UPDATE receipts SET response = ? WHERE id = ?", (canonical_json(reply), rid))
        c.execute("INSERT INTO effects (receipt_id, effect, args) VALUES (?, ?, ?)",
                  (rid, body["effect"], canonical_json(body["args"])))
        args = body["args"]
        amount = args.get("amount")
        if body["effect"] == "transfer" and isinstance(amount, int | float) and not isinstance(amount, bool):
            upsert = ("INSERT INTO balances (account, amount) VALUES (?, ?)"
                      " ON CONFLICT (account) DO UPDATE SET amount = amount + excluded.amount")
            for account, delta in ((args.get("to"), amount), (args.get("from"), -amount)):
                if isinstance(account, str):
                    c.execute(upsert, (account, delta))
        return 200, reply

    def find(self, key: str | None, business_id: str | None) -> list[JSONDict]:
        with self._lock:
            return _select(self._conn, key, business_id)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, ledger: _Ledger, port: int, verbose: bool) -> None:
        self.ledger, self.verbose = ledger, verbose
        self._cond = threading.Condition()
        self._pending: dict[object, int] = {}  # undecided connection -> accept order
        self._seq = 0
        super().__init__(("127.0.0.1", port), _Handler)

    def server_bind(self) -> None:  # skip HTTPServer's reverse DNS lookup
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", int(self.server_address[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._cond:  # in the accept thread, so the order is the kernel's accept order
            self._seq += 1
            self._pending[request] = self._seq
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        self.settle(request)
        super().shutdown_request(request)

    def settle(self, request: object) -> int:
        """Mark a connection's request decided; return its accept order (0 if already settled)."""
        with self._cond:
            seq = self._pending.pop(request, 0)
            self._cond.notify_all()
            return seq

    def wait_earlier(self, request: object) -> bool:
        """Wait until every connection accepted before this one is decided."""
        mine = self.settle(request)
        with self._cond:
            return self._cond.wait_for(lambda: all(s > mine for s in self._pending.values()), _QUIESCE_TIMEOUT)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = _IDLE_TIMEOUT
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    def _reply(self, status: int, payload: JSONDict) -> None:
        data = json.dumps(payload).encode()
        self.close_connection = True
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            pass  # the client is gone; what was committed stays committed

    def do_GET(self) -> None:
        url, ledger = urlsplit(self.path), self.server.ledger
        if url.path == "/health":
            self.server.settle(self.request)
            return self._reply(200, {"ok": True, "pid": os.getpid(), "mode": ledger.mode, "accepted": ledger.accepted,
                                     "journal_mode": ledger.journal_mode, "synchronous": ledger.synchronous})
        if url.path not in ("/effects", "/receipts"):
            return self._reply(404, {"error": f"no such path {url.path!r}"})
        if not self.server.wait_earlier(self.request):
            return self._reply(503, {"error": "earlier requests are still in flight; retry"})
        if url.path == "/receipts":
            return self._reply(200, {"receipts": ledger.find(None, None)})
        query = parse_qs(url.query, keep_blank_values=True)
        key, business_id = (query[name][-1] if name in query else None for name in ("key", "business_id"))
        if key is None and business_id is None:
            return self._reply(400, {"error": "give key or business_id"})
        found = ledger.find(key, business_id)
        self._reply(200 if found else 404, {"found": True, "receipts": found} if found else {"found": False})

    def do_POST(self) -> None:
        if urlsplit(self.path).path != "/effects":
            return self._reply(404, {"error": f"no such path {self.path!r}"})
        length_header = self.headers.get("Content-Length") or ""
        if not length_header.isdigit():
            return self._reply(411, {"error": "Content-Length is required"})
        length = int(length_header)
        raw = self.rfile.read(length)
        if len(raw) < length:  # the client died mid-body: nothing complete arrived, nothing to decide
            self.close_connection = True
            return
        try:
            body = _parse_body(raw)
        except ValueError as exc:
            return self._reply(400, {"error": str(exc)})
        ledger = self.server.ledger
        try:
            status, reply, ordinal = ledger.post(body)
        except sqlite3.Error as exc:
            return self._reply(500, {"error": f"ledger storage error: {exc}"})
        finally:
            self.server.settle(self.request)
        if ordinal and ordinal == ledger.crash_after:
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if ordinal and ordinal <= ledger.drop_after_apply:
            self.close_connection = True  # applied and committed; the reply is lost in transit
            return
        if ordinal and ledger.delay_reply > 0:
            time.sleep(ledger.delay_reply)
        self._reply(status, reply)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point: serve a ledger on 127.0.0.1 until killed."""
    p = argparse.ArgumentParser(prog="python -m cuaderno.testing.ledger", description="The fake ledger (H2).")
    p.add_argument("--db", required=True, help="the ledger's SQLite file")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--mode", choices=["dedup", "nodedup"], default="dedup")
    p.add_argument("--drop-after-apply", type=int, default=0, metavar="N")
    p.add_argument("--delay-reply", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--crash-after-receipt", type=int, default=0, metavar="N")
    p.add_argument("--verbose", action="store_true", help="log every request to stderr")
    a = p.parse_args(argv)
    ledger = _Ledger(a.db, a.mode, a.drop_after_apply, a.delay_reply, a.crash_after_receipt)
    with _Server(ledger, a.port, a.verbose) as server:
        print(f"LEDGER READY port={server.server_port} pid={os.getpid()}", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
    return 0
