"""Every conformance case against an encrypted SQLite journal: sealing is how rows and summaries
rest, and changes nothing a store promises (dedup, fencing, chain checks, damage refused, two
handles on one file, rebuilds)."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import cast

import pytest
from _encrypt_world import keys_of, new_key

from cuaderno.journal import SqliteCheckpointer
from cuaderno.testing.conformance import CASES, Case, TwoHandles, capabilities

KEYS = keys_of(new_key())


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_conformance_encrypted(case: Case, tmp_path: Path) -> None:
    base = Path(tempfile.mkdtemp(dir=tmp_path))
    names = (base / f"journal{i}.db" for i in itertools.count())
    factory = TwoHandles(lambda: SqliteCheckpointer(next(names), keys=KEYS),
                         lambda store: SqliteCheckpointer(cast(SqliteCheckpointer, store).path, keys=KEYS))
    missing = case.needs - capabilities(factory)
    assert not missing
    case.check(factory)
