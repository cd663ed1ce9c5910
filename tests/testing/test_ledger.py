"""The fake ledger (RELIABILITY.md H2): receipts are the ground truth the crash tests count on."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cuaderno.testing.ledger import (
    LedgerClient,
    LedgerConflict,
    LedgerHTTPError,
    LedgerProcess,
    LedgerReplyLost,
    LedgerReplyTimeout,
    LedgerUnavailable,
    canonical_json,
    read_receipts,
    request_hash,
)

ARGS = {"from": "alice", "to": "bob", "amount": 5}

# A child that sends one effect and would print if it survived; run with CUADERNO_CRASH_AT set.
CHILD = """
import sys
from cuaderno.testing.ledger import LedgerClient
LedgerClient(sys.argv[1], timeout=10).post_effect(sys.argv[2], "transfer", {"from": "alice", "to": "bob", "amount": 5})
print("survived")
"""


def run_child(url: str, key: str, crash_at: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUADERNO_CRASH_AT": crash_at}
    return subprocess.run(
        [sys.executable, "-c", CHILD, url, key], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_dedup_replays_the_stored_receipt(tmp_path: Path) -> None:
    with LedgerProcess(tmp_path / "ledger.db", mode="dedup") as ledger:
        client = ledger.client()
        first = client.post_effect("k1", "transfer", ARGS, business_id="inv-1")
        assert first["applied"] is True and first["replayed"] is False and first["key"] == "k1"
        second = client.post_effect("k1", "transfer", ARGS, business_id="inv-1")
        assert second["replayed"] is True
        assert second["receipt_id"] == first["receipt_id"]
        assert ledger.applied_count("k1") == 1
        (receipt,) = ledger.receipts("k1")
        assert receipt["replays"] == 1
        assert ledger.balances() == {"alice": -5, "bob": 5}


def test_dedup_same_key_other_body_is_409_and_applies_nothing(tmp_path: Path) -> None:
    with LedgerProcess(tmp_path / "ledger.db", mode="dedup") as ledger:
        client = ledger.client()
        client.post_effect("k1", "transfer", ARGS)
        with pytest.raises(LedgerConflict) as info:
            client.post_effect("k1", "transfer", {**ARGS, "amount": 6})
        assert info.value.status == 409
        assert ledger.applied_count() == 1
        assert ledger.balances() == {"alice": -5, "bob": 5}


def test_nodedup_applies_every_request(tmp_path: Path) -> None:
    with LedgerProcess(tmp_path / "ledger.db", mode="nodedup") as ledger:
        client = ledger.client()
        first = client.post_effect("k1", "transfer", ARGS)
        second = client.post_effect("k1", "transfer", ARGS)
        assert first["replayed"] is second["replayed"] is False
        assert first["receipt_id"] != second["receipt_id"]
        assert ledger.applied_count("k1") == 2
        assert ledger.balances() == {"alice": -10, "bob": 10}


def test_lookup_found_and_provably_absent(tmp_path: Path) -> None:
    with LedgerProcess(tmp_path / "ledger.db") as ledger:
        client = ledger.client()
        reply = client.post_effect("k1", "transfer", ARGS, business_id="inv-1")
        by_key = client.lookup(key="k1")
        assert by_key is not None and [r["receipt_id"] for r in by_key] == [reply["receipt_id"]]
        assert by_key[0]["response"]["receipt_id"] == reply["receipt_id"]
        assert client.lookup(business_id="inv-1") == by_key
        assert client.lookup(key="k1", business_id="inv-1") == by_key
        assert client.lookup(key="k2") is None
        assert client.lookup(business_id="inv-2") is None
        assert client.lookup(key="k1", business_id="inv-2") is None
        with pytest.raises(ValueError):
            client.lookup()


def test_receipt_records_the_request_hash_and_the_db_is_wal_full(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    with LedgerProcess(db) as ledger:
        client = ledger.client()
        health = client.health()
        assert health["journal_mode"] == "wal" and health["synchronous"] == 2  # 2 = FULL
        assert health["pid"] == ledger.pid
        client.post_effect("k1", "transfer", ARGS, business_id="inv-1")
        body = {"key": "k1", "effect": "transfer", "args": ARGS, "business_id": "inv-1"}
        (receipt,) = ledger.receipts()
        assert receipt["request_hash"] == request_hash(body)
        assert receipt["request"] == body
        assert canonical_json(body) == canonical_json(dict(reversed(list(body.items()))))
        assert read_receipts(db) == [receipt]  # the file agrees with the live ledger
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_invalid_body_is_400_and_writes_nothing(tmp_path: Path) -> None:
    with LedgerProcess(tmp_path / "ledger.db") as ledger:
        with pytest.raises(LedgerHTTPError) as info:
            ledger.client().post_effect("", "transfer", ARGS)
        assert info.value.status == 400
        assert ledger.receipts() == []


def test_drop_after_apply_loses_the_reply_but_the_receipt_exists(tmp_path: Path) -> None:
    with LedgerProcess(tmp_path / "ledger.db", mode="dedup", drop_after_apply=1) as ledger:
        client = ledger.client()
        with pytest.raises(LedgerReplyLost) as info:
            client.post_effect("k1", "transfer", ARGS)
        assert not isinstance(info.value, LedgerReplyTimeout)
        found = client.lookup(key="k1")
        assert found is not None and len(found) == 1 and found[0]["applied"] is True
        # Reconciliation by re-sending the same key gets the stored response (the second accept is answered).
        replay = client.post_effect("k1", "transfer", ARGS)
        assert replay["replayed"] is True and replay["receipt_id"] == found[0]["receipt_id"]
        assert ledger.applied_count() == 1


def test_delay_reply_times_out_after_the_commit(tmp_path: Path) -> None:
    with LedgerProcess(tmp_path / "ledger.db", delay_reply=1.5) as ledger:
        with pytest.raises(LedgerReplyTimeout):
            LedgerClient(ledger.url, timeout=0.3).post_effect("k1", "transfer", ARGS)
        assert ledger.applied_count("k1") == 1  # committed before the (slow) reply
        slow = LedgerClient(ledger.url, timeout=10).post_effect("k2", "transfer", ARGS)
        assert slow["replayed"] is False


def test_crash_after_receipt_survives_on_disk_and_a_restart_serves_it(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    with LedgerProcess(db, mode="dedup", crash_after_receipt=1) as ledger:
        with pytest.raises(LedgerReplyLost):
            ledger.client().post_effect("k1", "transfer", ARGS, business_id="inv-1")
        assert ledger.wait(timeout=10) == -signal.SIGKILL
        port = ledger.port
        (receipt,) = read_receipts(db, key="k1")
        assert receipt["applied"] is True
        with pytest.raises(LedgerUnavailable):
            ledger.client().post_effect("k2", "transfer", ARGS)
    with LedgerProcess(db, mode="dedup", port=port) as restarted:
        client = restarted.client()
        assert client.lookup(key="k1") == [receipt]
        assert client.lookup(business_id="inv-1") == [receipt]
        replay = client.post_effect("k1", "transfer", ARGS, business_id="inv-1")
        assert replay["replayed"] is True and replay["receipt_id"] == receipt["receipt_id"]
        assert restarted.applied_count() == 1


def test_unavailable_means_nothing_was_sent(tmp_path: Path) -> None:
    ledger = LedgerProcess(tmp_path / "ledger.db").start()
    url = ledger.url
    assert ledger.stop() is not None
    with pytest.raises(LedgerUnavailable):
        LedgerClient(url, timeout=2).post_effect("k1", "transfer", ARGS)
    with pytest.raises(LedgerUnavailable):
        LedgerClient(url, timeout=2).lookup(key="k1")
    assert read_receipts(tmp_path / "ledger.db") == []


def test_client_refuses_non_loopback_urls() -> None:
    with pytest.raises(ValueError):
        LedgerClient("http://10.0.0.1:8080")


@pytest.mark.parametrize("mode", ["dedup", "nodedup"])
def test_sigkill_at_k4_leaves_exactly_one_receipt(tmp_path: Path, mode: Any) -> None:
    with LedgerProcess(tmp_path / "ledger.db", mode=mode) as ledger:
        child = run_child(ledger.url, "k4-key", "tool.K4:1")
        assert child.returncode == -signal.SIGKILL, child.stderr
        assert "survived" not in child.stdout
        (receipt,) = ledger.receipts("k4-key")
        assert receipt["applied"] is True and receipt["key"] == "k4-key"
        client = ledger.client()
        found = client.lookup(key="k4-key")  # what a resumed run reconciles with
        assert found == [receipt]
        if mode == "dedup":
            replay = client.post_effect("k4-key", "transfer", ARGS)
            assert replay["replayed"] is True and replay["receipt_id"] == receipt["receipt_id"]
        assert ledger.applied_count("k4-key") == 1
        assert ledger.balances() == {"alice": -5, "bob": 5}


def test_sigkill_at_k3_the_request_still_lands_and_a_lookup_sees_it(tmp_path: Path) -> None:
    with LedgerProcess(tmp_path / "ledger.db", mode="nodedup") as ledger:
        child = run_child(ledger.url, "k3-key", "tool.K3:1")
        assert child.returncode == -signal.SIGKILL, child.stderr
        found = ledger.client().lookup(key="k3-key")
        assert found is not None and len(found) == 1
        assert ledger.applied_count() == 1


def test_child_without_crash_point_completes(tmp_path: Path) -> None:
    with LedgerProcess(tmp_path / "ledger.db") as ledger:
        child = run_child(ledger.url, "k-ok", "tool.K9:1")
        assert child.returncode == 0 and "survived" in child.stdout, child.stderr
        assert ledger.applied_count("k-ok") == 1


@pytest.mark.parametrize("finish", [True, False])
def test_lookup_waits_for_an_earlier_request_in_flight(tmp_path: Path, finish: bool) -> None:
    with LedgerProcess(tmp_path / "ledger.db") as ledger:
        body = canonical_json({"key": "k1", "effect": "transfer", "args": ARGS, "business_id": None}).encode()
        head = f"POST /effects HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        sock = socket.create_connection(("127.0.0.1", ledger.port), timeout=10)
        try:
            # The request is on its way, not complete. The lookup connects after this one, so the
            # server accepts it later (the kernel's accept queue is in order): no wait needed here.
            sock.sendall(head + body[:10])
            result: list[Any] = []
            waiter = threading.Thread(target=lambda: result.append(ledger.client().lookup(key="k1")))
            waiter.start()
            time.sleep(0.5)
            assert waiter.is_alive(), "the lookup answered while an earlier request was undecided"
            if finish:
                sock.sendall(body[10:])
                assert b"200 OK" in sock.recv(4096)
        finally:
            sock.close()
        waiter.join(timeout=15)
        assert not waiter.is_alive()
        if finish:
            assert result[0] is not None and len(result[0]) == 1
        else:
            assert result == [None]  # the half-sent request was never applied, so absence is proven


def test_ledger_process_cleans_its_temporary_db() -> None:
    with LedgerProcess() as ledger:
        db = ledger.db_path
        ledger.client().post_effect("k1", "noop", {})
        assert ledger.applied_count() == 1
        assert db.exists()
    assert ledger.returncode is not None
    assert not db.exists()
