"""Encryption at rest in a PostgreSQL journal, measured in a private cluster whose data directory
the test can read: a secret planted in a run's task, a tool's result and its answer, encryption
on from the start, a run driven to its end: after a CHECKPOINT, no table file holds it, nor any
file under ``base/``, nor the server's WAL (``pg_wal``): the server was only ever sent sealed
bytes. The same run unencrypted puts it in all three (the grep can fail)."""

from __future__ import annotations

import pytest
from _encrypt_world import keys_of, new_key
from _erase_world import run_with_secret, secret
from _pgcluster import PrivateCluster, private_cluster  # noqa: F401 - the fixture
from test_erase_postgres import _count, _table_files

from cuaderno.journal.postgres import PostgresCheckpointer

pytestmark = pytest.mark.postgres


def _everywhere(cluster: PrivateCluster, token: str) -> dict[str, int]:
    tables = _table_files(cluster)  # after a CHECKPOINT
    base = [p for p in (cluster.data / "base").rglob("*") if p.is_file()]
    wal = [p for p in (cluster.data / "pg_wal").rglob("*") if p.is_file()]
    return {"tables": _count(tables, token), "base": _count(base, token), "pg_wal": _count(wal, token)}


async def test_a_secret_reaches_no_file_of_the_server(private_cluster: PrivateCluster,  # noqa: F811
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    token, plain = secret(), secret()
    with PostgresCheckpointer(private_cluster.url, keys=keys_of(new_key())) as store:
        await run_with_secret(store, "sealed", token)
        events = store.load("sealed")
        cp = store.checkpoint("sealed")
        found = _everywhere(private_cluster, token)
    assert f"find {token}" in str(events[0].payload)  # with the key, everything reads
    assert cp is not None and cp.outcome is not None and f"{token}-answer" in cp.outcome["output"]
    # An unencrypted journal in another schema of the same cluster: the grep finds its secret.
    with PostgresCheckpointer(private_cluster.url, schema="plain") as store:
        await run_with_secret(store, "plain", plain)
    control = _everywhere(private_cluster, plain)
    with capsys.disabled():
        print(f"\n[encrypt postgres] occurrences after CHECKPOINT: encrypted {found}, unencrypted {control}")
    assert found == {"tables": 0, "base": 0, "pg_wal": 0}
    assert control["base"] > 0 and control["pg_wal"] > 0
