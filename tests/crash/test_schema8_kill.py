"""A SIGKILL around the first write that takes a schema-7 journal to schema 8.

The first row with a keyed BLAKE2b digest raises the file's schema to 8 in the same transaction
(so that a cuaderno of schema 7, which cannot verify such a row, refuses the file from that commit
on). Killed before the commit, the file must be as it was: schema 7, its rows byte-identical,
readable by a schema-7 cuaderno. Killed after it: schema 8 with the row. Never a row of the new
digest under schema 7, nor schema 8 without it. The file is read with plain ``sqlite3``, not
through cuaderno, and then opened and verified (the whole chain) by a new process's store."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from cuaderno import SqliteCheckpointer
from cuaderno.events import HMAC_SALT_BYTES, SALT_BYTES

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "journals"
RUN = "golden-support"

_CHILD = """
import sys
from cuaderno import SqliteCheckpointer, StepEvent
with SqliteCheckpointer(sys.argv[1]) as store:
    store.append([StepEvent(run_id=sys.argv[2], step_id="note", phase="result", kind="tool", payload={"v": 1})])
print("appended", flush=True)
"""


def _file(path: Path) -> tuple[str, list[tuple[object, ...]]]:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        schema = db.execute("SELECT value FROM cuaderno_meta WHERE key='schema_version'").fetchone()[0]
        rows = db.execute("SELECT * FROM cuaderno_events ORDER BY rowid").fetchall()
    return schema, rows


@pytest.mark.parametrize("point", ["append.W0", "append.W1", "append.W2"])
def test_a_kill_around_the_first_schema_8_row(tmp_path: Path, point: str) -> None:
    path = tmp_path / "v7.db"
    shutil.copyfile(GOLDEN / "schema_v7.sqlite", path)
    schema0, rows0 = _file(path)
    assert schema0 == "7"
    env = {**os.environ, "CUADERNO_CRASH_AT": point}
    child = subprocess.run([sys.executable, "-c", _CHILD, str(path), RUN], env=env, capture_output=True,
                           text=True, timeout=120)
    assert child.returncode == -9, child.stderr  # SIGKILL at the point, not an error
    schema, rows = _file(path)
    if point == "append.W2":  # committed: the row and schema 8 together
        assert schema == "8"
        assert rows[:len(rows0)] == rows0 and len(rows) == len(rows0) + 1
    else:  # not committed: the file as a schema-7 cuaderno left it
        assert (schema, rows) == ("7", rows0)
    with SqliteCheckpointer(path) as store:  # a new process's store verifies the whole chain
        events = store.load(RUN)
        _, differ = store.rebuild_checkpoint(RUN)  # the chain checked row by row against its summary
        assert differ == []
    salts = [len(e.salt or b"") for e in events]
    if point == "append.W2":
        assert events[-1].step_id == "note" and salts[-1] == SALT_BYTES
        assert set(salts[:-1]) == {HMAC_SALT_BYTES}
    else:
        assert "note" not in [e.step_id for e in events] and set(salts) == {HMAC_SALT_BYTES}
