"""The two dialects of the one SQL algorithm (journal/_sql.py) differ only where they must.

Every statement both stores run is written out twice, once with ``?`` and once with ``%s``; this
test keeps the copies from drifting apart: with the placeholders made equal they are the same
text, except for the few statements listed here with the reason each one differs.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from cuaderno.journal._sql import POSTGRES, SQLITE

SRC = Path(__file__).resolve().parents[2] / "src" / "cuaderno"

DIFFERENT = {
    "run_events": "PostgreSQL sorts in SQL (SQLite's rows come in insertion order, sorted by the reader)",
    "list_runs": "PostgreSQL must be told the type of a NULL parameter",
    "open_runs": "LIKE with % in a %s-style statement would need escaping; strpos says the same",
    "insert": "SQLite's driver binds '' at once where it looks None up in its adapters: its insert stores '' as NULL",
    "summaries": "a list of ids as one parameter: a PostgreSQL array, a JSON array SQLite's json_each reads",
    "upsert_run": "PostgreSQL returns the row version (xmin) its summary cache is keyed on",
    "rebuild_head": "SQLite reads the summary as bytes; PostgreSQL locks the row",
    "tail_index_found": "each catalogue is its own",
    "create_tail_index": "PostgreSQL serialises creators with the migrations' advisory lock",
    "duplicate": "each driver's error class",
    "insert_many": "PostgreSQL inserts several rows from arrays (unnest) in one statement; SQLite has none",
}


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(SQLITE)])
def test_the_statements_are_the_same_but_for_the_placeholders(name: str) -> None:
    mine, theirs = getattr(SQLITE, name), getattr(POSTGRES, name)
    if name in DIFFERENT:
        assert mine != theirs.replace("%s", "?") if isinstance(theirs, str) else mine != theirs
    else:
        assert mine == theirs.replace("%s", "?")


def test_the_tail_index_is_created_under_the_migrations_lock() -> None:
    from cuaderno.journal._pg_server import _MIGRATE_LOCK

    assert POSTGRES.create_tail_index[0] == f"SELECT pg_advisory_xact_lock({_MIGRATE_LOCK})"
    assert POSTGRES.create_tail_index[1:] == SQLITE.create_tail_index


def test_the_backends_write_no_statement_of_the_shared_algorithm() -> None:
    """The events table is written only through the dialect: no backend file inserts into it."""
    for name in ("sqlite.py", "postgres.py", "_sqlite_file.py", "_pg_server.py"):
        tree = ast.parse((SRC / "journal" / name).read_text(encoding="utf-8"))
        texts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        assert not [t for t in texts if "INSERT INTO cuaderno_events" in t], name
