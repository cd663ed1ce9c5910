"""Keys for the encryption tests, and the bytes of a journal's files (to prove a refusal left them
byte-identical)."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import Any

from cuaderno.journal.keys import MasterKey, StaticKeys, master_key

__all__ = ["file_digests", "key_text", "keys_of", "new_key", "raw_tables", "sqlite_files", "write_key_file"]


def new_key() -> MasterKey:
    return master_key(os.urandom(32))


def key_text(key: MasterKey) -> str:
    """The key as ``CUADERNO_KEY`` and a key file hold it."""
    return base64.b64encode(key.secret).decode()


def write_key_file(path: Path, *keys: MasterKey) -> Path:
    path.write_text("".join(key_text(k) + "\n" for k in keys))
    path.chmod(0o600)
    return path


def sqlite_files(path: Path) -> list[Path]:
    """The database, its -wal, -shm, anchor and holds files, and anything else beside it by name."""
    named = {path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-anchor")}
    return sorted(named | set(path.parent.glob(path.name + "*")))


def file_digests(files: list[Path]) -> dict[str, str | None]:
    """Each file's SHA-256 (``None``: absent)."""
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() if f.exists() else None for f in files}


def keys_of(current: MasterKey, *older: MasterKey) -> StaticKeys:
    return StaticKeys(current, older)


def raw_tables(url: str) -> dict[str, list[Any]]:
    """Every row of the journal's tables as stored, read without cuaderno (a SQLite path or a
    PostgreSQL URL naming its schema)."""
    names = ("cuaderno_meta", "cuaderno_runs", "cuaderno_events", "cuaderno_keys")
    if url.startswith("postgresql://"):
        import psycopg
        from psycopg import sql

        schema = url.split("schema=")[1]
        with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
            return {n: sorted(map(tuple, conn.execute(sql.SQL("SELECT * FROM {}.{}").format(
                sql.Identifier(schema), sql.Identifier(n))).fetchall())) for n in names}
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(f"file:{url}?mode=ro", uri=True)) as db:
        return {n: sorted(db.execute("SELECT * FROM " + n).fetchall()) for n in names}  # noqa: S608 - our names
