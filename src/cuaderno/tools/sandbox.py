"""Read-only tools over one directory that the model cannot talk its way out of (seed 002).

A child episode may choose which files to open and in what order; it may not open anything
outside its snapshot, write, create, truncate, or run anything. :class:`ReadOnlyRoot` gives it two
tools, ``read_file(path)`` and ``list_dir(path)``, and resolves every path the model sends the
way ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`` would, by hand, because Python has no
binding for it:

- the path is text the model wrote: it must be relative, valid UTF-8, free of NUL, backslashes and
  ``..``, and short (``PATH_MAX`` bytes, ``NAME_MAX`` per component);
- it is walked one component at a time from a directory descriptor of the root, each component
  opened with ``O_NOFOLLOW`` relative to the previous descriptor: a symlink anywhere on the path,
  even one swapped in between two steps of the walk, makes the open fail instead of being
  followed, so there is no window between a check and an open;
- what is opened must be a directory or a regular file on the root's own device (no FIFO, device,
  socket or mount point), a regular file must have one link (a hard link to a file outside the
  root is the same inode as that file), and the descriptor's path in ``/proc/self/fd`` must still
  lie under the root: a directory renamed out of the root while it was being walked is refused;
- every descriptor is ``O_RDONLY``: nothing can be written through it.

A refusal is a :class:`~cuaderno.errors.ToolError` of class ``permanent``: journaled as the tool's
outcome and told to the model, never retried. Both tools are idempotent (reading twice costs
nothing), so a resumed episode may re-read a file whose result was not journaled yet.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cuaderno.errors import ErrorClass, ToolError, UsageError
from cuaderno.tools.definition import Tool

__all__ = ["PATH_MAX", "ReadOnlyRoot"]

PATH_MAX = 4096
NAME_MAX = 255
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer; it is refused after
# fstat anyway, and regular files ignore the flag.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)


def _refuse(path: object, why: str) -> ToolError:
    shown = path if isinstance(path, str) and len(path) <= 200 else f"{str(path)[:200]}…"
    return ToolError(f"refused path {shown!r}: {why}", error_class=ErrorClass.PERMANENT,
                     data={"refused": why})


class ReadOnlyRoot:
    """A directory, read-only, as the only world a child episode can see.

    Args:
        root: the snapshot's directory. It is opened once, here; renaming or replacing it later
            does not move what the tools read.
        max_file_bytes: larger files are returned cut at this size, and say so.
        max_entries: ``list_dir`` returns at most this many entries, and says how many there were.
    """

    def __init__(self, root: str | os.PathLike[str], *, max_file_bytes: int = 256_000,
                 max_entries: int = 1000) -> None:
        if max_file_bytes <= 0 or max_entries <= 0:
            raise UsageError("max_file_bytes and max_entries must be positive")
        self.root = Path(os.path.realpath(root))
        try:
            self._fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise UsageError(f"the snapshot root {str(root)!r} is not a readable directory: {exc.strerror}") from exc
        self._dev = os.fstat(self._fd).st_dev
        self.max_file_bytes = max_file_bytes
        self.max_entries = max_entries

    def close(self) -> None:
        """Close the root's descriptor (the tools refuse every path afterwards)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ReadOnlyRoot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the two tools --------------------------------------------------------------------------

    def read_file(self, path: str) -> dict[str, Any]:
        """The text of a file under the root (``path`` relative to it), cut at ``max_file_bytes``."""
        with self._open(path, directory=False) as fd:
            data = _read_up_to(fd, self.max_file_bytes + 1)
        cut = len(data) > self.max_file_bytes
        data = data[: self.max_file_bytes]
        return {"path": path, "text": data.decode("utf-8", errors="replace"), "bytes": len(data), "truncated": cut}

    def list_dir(self, path: str = ".") -> dict[str, Any]:
        """The entries of a directory under the root: name and kind (file, dir, link, other)."""
        with self._open(path, directory=True) as fd:
            entries: list[dict[str, str]] = []
            total = 0
            with os.scandir(fd) as it:
                for entry in it:
                    total += 1
                    if len(entries) < self.max_entries:
                        entries.append({"name": _printable(entry.name), "kind": _kind(entry)})
        entries.sort(key=lambda e: e["name"])
        return {"path": path, "entries": entries, "total": total, "truncated": total > len(entries)}

    def tools(self) -> list[Tool]:
        """``read_file`` and ``list_dir`` as effect-free tools for an agent: idempotent, and a read
        whose first run's outcome is unknown (a crash) and that fails when run again has simply
        failed, where a tool with an effect would stop uncertain."""

        def read_file(path: str) -> dict[str, Any]:
            """Read a text file of the repository. `path` is relative to the repository's root."""
            return self.read_file(path)

        def list_dir(path: str = ".") -> dict[str, Any]:
            """List a directory of the repository. `path` is relative to the repository's root ('.' for it)."""
            return self.list_dir(path)

        return [Tool(read_file, effect_free=True), Tool(list_dir, effect_free=True)]

    # -- resolution -----------------------------------------------------------------------------

    @contextmanager
    def _open(self, path: object, *, directory: bool) -> Iterator[int]:
        parts = self._components(path)
        fd = self._walk(path, parts, directory=directory)
        try:
            self._check_opened(path, fd, directory=directory)
            yield fd
        finally:
            os.close(fd)

    def _components(self, path: object) -> list[str]:
        if self._fd < 0:
            raise _refuse(path, "the snapshot is closed")
        if not isinstance(path, str):
            raise _refuse(path, "a path must be text")
        try:
            raw = path.encode("utf-8")
        except UnicodeEncodeError:
            raise _refuse(path, "not valid UTF-8") from None
        if "\x00" in path:
            raise _refuse(path, "contains a NUL byte")
        if len(raw) > PATH_MAX:
            raise _refuse(path, f"longer than {PATH_MAX} bytes")
        if "\\" in path:
            raise _refuse(path, "contains a backslash")
        if path.startswith("/") or path.startswith("~"):
            raise _refuse(path, "absolute: paths are relative to the snapshot's root")
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise _refuse(path, "'..' leaves the directory it names")
        if any(len(p.encode("utf-8")) > NAME_MAX for p in parts):
            raise _refuse(path, f"a component is longer than {NAME_MAX} bytes")
        return parts

    def _walk(self, path: object, parts: list[str], *, directory: bool) -> int:
        fd = os.open(".", _DIR_FLAGS, dir_fd=self._fd)
        try:
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                flags = _DIR_FLAGS if (not last or directory) else _FILE_FLAGS
                try:
                    nxt = os.open(part, flags, dir_fd=fd)
                except OSError as exc:
                    raise _refuse(path, _why(exc, directory=directory or not last)) from None
                os.close(fd)
                fd = nxt
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _check_opened(self, path: object, fd: int, *, directory: bool) -> None:
        st = os.fstat(fd)
        if st.st_dev != self._dev:
            raise _refuse(path, "on another file system (a mount point under the root)")
        if directory:
            if not stat.S_ISDIR(st.st_mode):
                raise _refuse(path, "not a directory")
        else:
            if not stat.S_ISREG(st.st_mode):
                raise _refuse(path, "not a regular file (a directory, FIFO, device or socket)")
            if st.st_nlink != 1:
                raise _refuse(path, "a file with more than one hard link (it may be a file outside the root)")
        # The walk never followed a symlink, but a directory on the way may have been renamed out
        # of the root while it was walked: the kernel's name for the descriptor says where it is now.
        where = os.readlink(f"/proc/self/fd/{fd}")
        root = str(self.root)
        if where != root and not where.startswith(root.rstrip("/") + "/"):
            raise _refuse(path, "moved outside the snapshot while it was opened")


def _read_up_to(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, min(65536, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _why(exc: OSError, *, directory: bool) -> str:
    if exc.errno == errno.ENOENT:
        return "no such file or directory"
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return "a symbolic link (links are not followed)"
    if exc.errno == errno.ENOTDIR:
        return "a symbolic link or a file where a directory was expected" if directory else "not a directory"
    if exc.errno == errno.EACCES:
        return "permission denied"
    if exc.errno == errno.ENAMETOOLONG:
        return "name too long"
    return exc.strerror or f"cannot be opened (errno {exc.errno})"


def _kind(entry: os.DirEntry[str]) -> str:
    if entry.is_symlink():
        return "link"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    if entry.is_file(follow_symlinks=False):
        return "file"
    return "other"


def _printable(name: str) -> str:
    # A name that is not UTF-8 comes back from the kernel with surrogate escapes; the model gets
    # a readable stand-in it cannot send back to open something else.
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")
