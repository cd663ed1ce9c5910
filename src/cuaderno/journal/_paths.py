"""What the file system says about a journal's files now, for the SQLite store and its holds: one
``os.stat`` whose absence (no file, no permission) is an answer, not an error."""

from __future__ import annotations

import os


def stat_or_none(path: str) -> os.stat_result | None:
    """``os.stat(path)``, or ``None`` when it cannot be read (no such file, most often)."""
    try:
        return os.stat(path)
    except OSError:
        return None


def file_size(path: str) -> int:
    """The file's size, 0 when it does not exist."""
    st = stat_or_none(path)
    return 0 if st is None else st.st_size
