"""R26, the rekey part: a ``rekey`` process SIGKILLed at each of its named points (``rekey.K0``
before the first batch, ``K1`` a batch re-wrapped before its COMMIT, ``K2`` after the first batch's
COMMIT, ``K3`` every key done), on SQLite and PostgreSQL, while two worker processes (holding the
new key as current and the old one as older) drive their own encrypted runs through the ledger
service.

Proved from records the journal does not keep: the ledger's receipts (every transfer of every
worker's run exactly once) and, for the keys, a store that holds only the new master key: after
the next ``rekey`` it opens every run's data key (so every one was re-wrapped, none lost or
damaged by the kill). The killed batch is all or nothing: after ``K1`` no key moved, after
``K2`` exactly one batch did."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _encrypt_world import key_text, keys_of, new_key, raw_tables
from _erase_world import run_with_secret, secret
from _pg import new_schema, pg_schemas, schema_url  # noqa: F401 - the fixture
from test_erase_kill import _env, _workers, ledger, workers_finished_each_transfer_once  # noqa: F401 - the fixture

from cuaderno.journal import open_journal
from cuaderno.journal.keys import MasterKey
from cuaderno.operations import rekey
from cuaderno.testing.ledger import LedgerProcess

POINTS = ("rekey.K0", "rekey.K1", "rekey.K2", "rekey.K3")
OLD_RUNS = 5
BATCH = 2


def _killed_rekey(url: str, point: str) -> None:
    code = textwrap.dedent(f"""
        from cuaderno.journal import open_journal
        from cuaderno.operations import rekey
        store = open_journal({url!r})  # the keys: CUADERNO_KEY (new) and CUADERNO_OLD_KEYS (old)
        rekey(store, batch={BATCH})
        store.close()
    """)
    done = subprocess.run([sys.executable, "-c", code], env={**_env(), "CUADERNO_CRASH_AT": f"{point}:1"},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == -9, done.stderr[-2000:]


async def _world(url: str, old: MasterKey, new: MasterKey, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Runs journaled under the old key, then the environment the workers and the rekey see."""
    tokens = {f"old{i}": secret() for i in range(OLD_RUNS)}
    with open_journal(url, keys=keys_of(old)) as store:
        for run_id, token in tokens.items():
            await run_with_secret(store, run_id, token)
    monkeypatch.setenv("CUADERNO_KEY", key_text(new))
    monkeypatch.setenv("CUADERNO_OLD_KEYS", key_text(old))
    return tokens


def _rewrapped(url: str, old: MasterKey, new: MasterKey, tokens: dict[str, str]) -> int:
    """How many of the old runs' data keys the new key wraps now; each run reads whole meanwhile."""
    with open_journal(url, keys=keys_of(new, old)) as store:
        for run_id, token in tokens.items():
            assert f"find {token}" in str(store.load(run_id)[0].payload)
    stored = {row[0]: row[1] for row in raw_tables(url)["cuaderno_keys"]}  # read without cuaderno
    assert all(stored[run_id] in (old.key_id, new.key_id) for run_id in tokens)
    moved = sum(stored[run_id] == new.key_id for run_id in tokens)
    return moved


def _check(url: str, point: str, old: MasterKey, new: MasterKey, tokens: dict[str, str],
           workers: list[subprocess.Popen[str]], runs: list[str], ledger: LedgerProcess) -> None:  # noqa: F811
    moved = _rewrapped(url, old, new, tokens)
    assert moved == {"rekey.K0": 0, "rekey.K1": 0, "rekey.K2": BATCH, "rekey.K3": OLD_RUNS}[point]
    with open_journal(url, keys=keys_of(new, old)) as store:
        rekey(store, batch=BATCH)  # the re-run finishes what the kill left
    workers_finished_each_transfer_once(workers, runs, ledger)
    with open_journal(url, keys=keys_of(new)) as store:  # the old key gone: every data key still opens
        for run_id, token in tokens.items():
            assert f"find {token}" in str(store.load(run_id)[0].payload)
        for run_id in runs:
            cp = store.checkpoint(run_id)
            assert cp is not None and cp.status == "completed" and len(store.load(run_id)) == cp.last_seq


async def _killed_while_workers_run(url: str, point: str, tmp_path: Path, ledger: LedgerProcess,  # noqa: F811
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = new_key(), new_key()
    tokens = await _world(url, old, new, monkeypatch)
    runs = [f"worker-{point}-{i}" for i in range(2)]
    workers = _workers(url, runs, tmp_path / "work", ledger)
    _killed_rekey(url, point)
    _check(url, point, old, new, tokens, workers, runs, ledger)


@pytest.mark.parametrize("point", POINTS)
async def test_rekey_killed_on_sqlite(tmp_path: Path, point: str, ledger: LedgerProcess,  # noqa: F811
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    await _killed_while_workers_run(str(tmp_path / "j.db"), point, tmp_path, ledger, monkeypatch)


@pytest.mark.postgres
@pytest.mark.parametrize("point", POINTS)
async def test_rekey_killed_on_postgres(tmp_path: Path, point: str, ledger: LedgerProcess,  # noqa: F811
                                        pg_schemas: list[str], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    schema = new_schema()
    pg_schemas.append(schema)
    await _killed_while_workers_run(schema_url(schema), point, tmp_path, ledger, monkeypatch)
