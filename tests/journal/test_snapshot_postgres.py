"""Snapshots on PostgreSQL: the same proof as on SQLite (the requests the model gets, first pass
+ resumed pass, are those of the run never stopped; every tool body ran once), the tail read on
the ``(run_id, seq)`` index, and a damaged snapshot refused."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from _pg import new_schema, pg_schemas, schema_url  # noqa: F401 - the fixture
from _snapshot_world import TailSpy, World, bodies, drive

from cuaderno import open_journal
from cuaderno.checkpoint import verified
from cuaderno.errors import JournalCorrupt
from cuaderno.loop import _snapshots

pytestmark = pytest.mark.postgres

TURNS = 200


def _whole(url: str) -> list[Any]:
    world = World(TURNS)
    gateway = world.gateway()
    asyncio.run(drive(world, url, "base", gateway))
    return bodies(gateway)


@pytest.mark.parametrize("stop_after", [301, 380])
def test_resume_goes_on_from_the_snapshot_and_changes_nothing(pg_schemas: list[str],  # noqa: F811
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              stop_after: int) -> None:
    schema = new_schema()
    pg_schemas.append(schema)
    url = schema_url(schema)
    want = _whole(url)
    world = World(TURNS)
    first = world.gateway()
    asyncio.run(drive(world, url, "r", first, stop_after=stop_after))
    spy = TailSpy()
    monkeypatch.setattr(_snapshots, "tail_open", spy)
    second = world.gateway()
    assert asyncio.run(drive(world, url, "r", second)).output == "done"
    assert spy.used == [True]
    assert bodies(first) + bodies(second) == want
    assert all(n == 1 for n in world.ran.values())
    store = open_journal(url)
    try:
        cp, events = verified(store, "r")
        assert cp.status == "completed" and sum(e.kind == "snapshot" for e in events) == len(events) // 256
    finally:
        store.close()


def test_damaged_snapshot_is_journal_corrupt(pg_schemas: list[str]) -> None:  # noqa: F811
    schema = new_schema()
    pg_schemas.append(schema)
    url = schema_url(schema)
    world = World(TURNS)
    asyncio.run(drive(world, url, "r", world.gateway(), stop_after=333))
    with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute("UPDATE cuaderno_events SET codec='json', payload=%s WHERE run_id='r' AND seq=("
                     "SELECT max(seq) FROM cuaderno_events WHERE run_id='r' AND step_id='snapshot')",
                     (b'{"format":1,"turn":1,"chain":"x","first":"y","base":{}}',))
        before = conn.execute("SELECT count(*) FROM cuaderno_events").fetchone()
    gateway = world.gateway()
    with pytest.raises(JournalCorrupt):
        asyncio.run(drive(world, url, "r", gateway))
    with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        assert conn.execute("SELECT count(*) FROM cuaderno_events").fetchone() == before
    assert gateway.calls == 0
