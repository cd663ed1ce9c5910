"""Read-only tools over one directory that the model cannot talk its way out of (seed 002).

A child episode may choose which files to open and in what order; it may not open anything
outside its snapshot, write, create, truncate, or run anything. :class:`ReadOnlyRoot` gives it two
tools, ``read_file(path)`` and ``list_dir(path, after, limit)``, and resolves every path the model
sends the way ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV)`` would, by hand,
because Python has no binding for it (and container seccomp filters often refuse the syscall):

- the path is text the model wrote: it must be relative, valid UTF-8, free of NUL, backslashes and
  ``..``, and short (``PATH_MAX`` bytes, ``NAME_MAX`` per component);
- it is walked one component at a time from a descriptor of the root, each component opened with
  ``O_PATH | O_NOFOLLOW`` relative to the previous descriptor. An ``O_PATH`` open only names the
  file: it runs no driver's open, does not wake a writer blocked on a FIFO and reads nothing. A
  symlink anywhere on the path, even one swapped in between two steps of the walk, is refused
  instead of followed, so there is no window between a check and an open;
- every component must lie on the root's own **mount** (its mount id, read from
  ``/proc/self/fdinfo`` for the descriptor just opened): a mount point under the root is refused,
  a bind mount of another directory of the same file system included (same device, other mount);
- what is named must be a directory (``list_dir``) or a regular file (``read_file``): a FIFO,
  socket, character or block device is refused from the ``O_PATH`` descriptor's type, before
  anything opens it. A regular file must have one link (a hard link to a file outside the root is
  the same inode as that file), and the descriptor's path in ``/proc/self/fd`` must still lie under
  the root: a directory renamed out of the root while it was being walked is refused;
- only then is the checked descriptor reopened ``O_RDONLY`` through ``/proc/self/fd`` (the same
  inode, no second lookup by name): nothing can be written through it.

``list_dir`` returns entries sorted by name (byte order of the name, which is code-point order for
UTF-8), one page at a time: at most ``limit`` (≤ ``max_entries``) entries strictly after the
cursor ``after``, the directory's ``total``, ``more`` and the ``next_after`` cursor to pass for the
next page. Each page is one pass over the directory keeping only the ``limit`` smallest names, so
memory stays bounded by the page, not by the directory (100,000 entries cost one page's worth).

A refusal is a :class:`PathRefused` (a :class:`~cuaderno.errors.ToolError` of class
``permanent``, with ``data["refused"]`` saying why and ``data["reason"]`` a stable code):
journaled as the tool's outcome and told to the model, never retried. Both tools are idempotent
(reading twice costs nothing), so a resumed episode may re-read a file whose result was not
journaled yet.
"""

from __future__ import annotations

import errno
import heapq
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypedDict

from cuaderno.errors import ErrorClass, ToolError, UsageError
from cuaderno.tools.definition import Tool

__all__ = ["PATH_MAX", "PathRefused", "ReadOnlyRoot"]

PATH_MAX = 4096
NAME_MAX = 255
# O_PATH: the walk names files without opening them (no FIFO wakes, no driver open, no atime).
_WALK_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_WALK_LAST = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FILE = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
_READ_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# A cursor for a name that is not UTF-8: "/" and hex. No name contains "/", so it is unambiguous.
_HEX_CURSOR = "/"


class FileText(TypedDict):
    """What ``read_file`` returns (the tool's result, journaled and shown to the model)."""

    path: str
    text: str
    """UTF-8, undecodable bytes replaced."""
    bytes: int
    """Bytes read (after the cut)."""
    truncated: bool
    """The file is longer than ``max_file_bytes``: ``text`` is its beginning."""


class DirEntry(TypedDict):
    name: str
    """Printable: control characters escaped."""
    kind: str
    """``file``, ``dir``, ``link`` or ``other``."""


class DirPage(TypedDict):
    """What ``list_dir`` returns: one page of a directory, sorted by name."""

    path: str
    entries: list[DirEntry]
    total: int
    """Entries in the directory."""
    more: bool
    """Entries remain after this page."""
    next_after: str | None
    """The cursor for the next page (``None`` at the end)."""

class PathRefused(ToolError):
    """A path the sandbox will not read: outside the root, a link, a mount point, a special file…

    ``data["refused"]`` is the sentence told to the model; ``data["reason"]`` a stable code
    (``syntax``, ``not_found``, ``symlink``, ``mount_point``, ``special_file``, ``hard_link``,
    ``moved_out``, ``wrong_kind``, ``bad_argument``, ``closed``, ``os_error``).
    """


def _refuse(path: object, why: str, reason: str) -> PathRefused:
    shown = path if isinstance(path, str) and len(path) <= 200 else f"{str(path)[:200]}…"
    return PathRefused(f"refused path {shown!r}: {why}", error_class=ErrorClass.PERMANENT,
                       data={"refused": why, "reason": reason})


def _mount_id(fd: int) -> int | None:
    """The id of the mount ``fd`` lies on, from ``/proc/self/fdinfo`` (Linux ≥ 3.15).

    Why this and not ``statx(STATX_MNT_ID)``: Python 3.11 has no ``os.statx``, and a ctypes
    ``statx`` needs the struct's layout and glibc ≥ 2.28; ``name_to_handle_at`` fails on file
    systems without file handles. ``fdinfo`` is text, describes exactly the descriptor held (no
    lookup by name, so no race), and works on ``O_PATH`` descriptors of any file type.
    """
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as info:
            for line in info:
                if line.startswith(b"mnt_id:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class ReadOnlyRoot:
    """A directory, read-only, as the only world a child episode can see.

    Args:
        root: the snapshot's directory. It is opened once, here; renaming or replacing it later
            does not move what the tools read. Its mount is the only one read: a mount point or
            bind mount under it is refused.
        max_file_bytes: larger files are returned cut at this size, and say so.
        max_entries: the largest page ``list_dir`` returns (its ``limit`` is capped at this).

    Raises:
        UsageError: the root is not a readable directory, a size is not positive, or the kernel
            does not say which mount a descriptor is on (``/proc`` not mounted): without it a
            bind mount under the root could not be told apart, so the sandbox does not start.
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
        # Held open for the sandbox's life, the root's mount cannot be freed, so its id cannot be
        # given to another mount while the tools compare against it.
        mount = _mount_id(self._fd)
        if mount is None:
            os.close(self._fd)
            self._fd = -1
            raise UsageError("cannot tell which mount a file is on (/proc/self/fdinfo has no mnt_id): "
                             "the sandbox needs it to refuse bind mounts under the root")
        self._mount = mount
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

    def read_file(self, path: str) -> FileText:
        """The text of a regular file under the root (``path`` relative to it), cut at ``max_file_bytes``.

        Raises:
            PathRefused: see the module's docstring for what is refused.
        """
        with self._open(path, directory=False) as fd:
            data = _read_up_to(fd, self.max_file_bytes + 1)
        cut = len(data) > self.max_file_bytes
        data = data[: self.max_file_bytes]
        return {"path": path, "text": data.decode("utf-8", errors="replace"), "bytes": len(data), "truncated": cut}

    def list_dir(self, path: str = ".", after: str | None = None, limit: int | None = None) -> DirPage:
        """One page of a directory under the root, sorted by name: name and kind (file, dir, link, other).

        Args:
            path: the directory, relative to the root.
            after: the ``next_after`` of the previous page (``None`` for the first page): the
                page holds the entries whose names sort strictly after it.
            limit: entries per page, at most (and by default) ``max_entries``.

        Returns:
            ``path``, ``entries``, ``total`` (entries in the directory), ``more`` (entries remain
            after this page) and ``next_after`` (the cursor for the next page, ``None`` at the end).
        """
        size = self._page_size(path, limit)
        start = _cursor_key(path, after)
        with self._open(path, directory=True) as fd:
            counts = [0, 0]  # entries in the directory, entries after the cursor
            page = heapq.nsmallest(size, _entries_after(fd, start, counts), key=lambda item: item[0])
            # Kinds while the descriptor is open: on file systems without d_type they need an
            # lstat relative to it (never an open).
            entries: list[DirEntry] = [{"name": _printable(entry.name), "kind": _kind(entry)} for _, entry in page]
        total, remaining = counts
        more = remaining > len(page)
        return {"path": path, "entries": entries, "total": total, "more": more,
                "next_after": _cursor(page[-1][0]) if more else None}

    def tools(self) -> list[Tool]:
        """``read_file`` and ``list_dir`` as effect-free tools for an agent: idempotent, and a read
        whose first run's outcome is unknown (a crash) and that fails when run again has simply
        failed, where a tool with an effect would stop uncertain."""

        def read_file(path: str) -> FileText:
            """Read a text file of the repository. `path` is relative to the repository's root."""
            return self.read_file(path)

        def list_dir(path: str = ".", after: str | None = None, limit: int | None = None) -> DirPage:
            """List a directory of the repository, sorted by name, one page at a time. `path` is
            relative to the repository's root ('.' for it). When the answer says `more`, call again
            with `after` set to its `next_after` for the next page; `total` counts all entries."""
            return self.list_dir(path, after, limit)

        list_dir.__doc__ = (list_dir.__doc__ or "") + f" At most {self.max_entries} entries per page."
        return [Tool(read_file, effect_free=True), Tool(list_dir, effect_free=True)]

    # -- resolution -----------------------------------------------------------------------------

    @contextmanager
    def _open(self, path: object, *, directory: bool) -> Iterator[int]:
        """A readable descriptor of ``path``, opened only after every check passed."""
        parts = self._components(path)
        named = self._walk(path, parts)
        try:
            checked = self._check_opened(path, named, directory=directory)
            try:
                # The checked inode itself, not a second lookup by name (a mount laid over it
                # since is not entered): a directory or a regular file, whose type cannot change,
                # so this open has no effect.
                fd = os.open(f"/proc/self/fd/{named}", _READ_DIR if directory else _READ_FILE)
            except OSError as exc:
                raise _refuse(path, _why(exc, directory=directory), "os_error") from None
        finally:
            os.close(named)
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (checked.st_dev, checked.st_ino):  # defence in depth
            os.close(fd)
            raise _refuse(path, "changed while it was opened", "moved_out")
        try:
            yield fd
        finally:
            os.close(fd)

    def _components(self, path: object) -> list[str]:
        if self._fd < 0:
            raise _refuse(path, "the snapshot is closed", "closed")
        if not isinstance(path, str):
            raise _refuse(path, "a path must be text", "syntax")
        try:
            raw = path.encode("utf-8")
        except UnicodeEncodeError:
            raise _refuse(path, "not valid UTF-8", "syntax") from None
        if "\x00" in path:
            raise _refuse(path, "contains a NUL byte", "syntax")
        if len(raw) > PATH_MAX:
            raise _refuse(path, f"longer than {PATH_MAX} bytes", "syntax")
        if "\\" in path:
            raise _refuse(path, "contains a backslash", "syntax")
        if path.startswith("/") or path.startswith("~"):
            raise _refuse(path, "absolute: paths are relative to the snapshot's root", "syntax")
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise _refuse(path, "'..' leaves the directory it names", "syntax")
        if any(len(p.encode("utf-8")) > NAME_MAX for p in parts):
            raise _refuse(path, f"a component is longer than {NAME_MAX} bytes", "syntax")
        return parts

    def _walk(self, path: object, parts: list[str]) -> int:
        """An ``O_PATH`` descriptor of the last component, every component on the root's mount."""
        fd = os.open(".", _WALK_DIR, dir_fd=self._fd)
        try:
            self._check_mount(path, fd)
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                try:
                    nxt = os.open(part, _WALK_LAST if last else _WALK_DIR, dir_fd=fd)
                except OSError as exc:
                    raise _refuse(path, _why(exc, directory=not last), _reason(exc, part, fd)) from None
                os.close(fd)
                fd = nxt
                # Per component: a lookup that crossed into a mount lands on that mount's root.
                self._check_mount(path, fd)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _check_mount(self, path: object, fd: int) -> None:
        if _mount_id(fd) != self._mount:
            raise _refuse(path, "a mount point: it is on another mount than the snapshot's root "
                                "(a bind mount or another file system)", "mount_point")

    def _check_opened(self, path: object, fd: int, *, directory: bool) -> os.stat_result:
        """Refuse what ``fd`` names unless it is the wanted kind, singly linked and still inside."""
        st = os.fstat(fd)
        kind = _file_type(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            raise _refuse(path, "a symbolic link (links are not followed)", "symlink")
        if directory:
            if not stat.S_ISDIR(st.st_mode):
                raise _refuse(path, f"not a directory (a {kind})", "wrong_kind")
        else:
            if stat.S_ISDIR(st.st_mode):
                raise _refuse(path, "not a regular file (a directory: list it with list_dir)", "wrong_kind")
            if not stat.S_ISREG(st.st_mode):
                raise _refuse(path, f"not a regular file (a {kind}); it was not opened", "special_file")
            if st.st_nlink != 1:
                raise _refuse(path, "a file with more than one hard link (it may be a file outside the root)",
                              "hard_link")
        # The walk never followed a symlink, but a directory on the way may have been renamed out
        # of the root while it was walked: the kernel's name for the descriptor says where it is now.
        where = os.readlink(f"/proc/self/fd/{fd}")
        root = str(self.root)
        if where != root and not where.startswith(root.rstrip("/") + "/"):
            raise _refuse(path, "moved outside the snapshot while it was opened", "moved_out")
        return st

    def _page_size(self, path: object, limit: object) -> int:
        if limit is None:
            return self.max_entries
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise _refuse(path, f"limit must be a whole number from 1 to {self.max_entries}", "bad_argument")
        return min(limit, self.max_entries)


def _entries_after(fd: int, start: bytes | None, counts: list[int]) -> Iterator[tuple[bytes, os.DirEntry[str]]]:
    """Every entry whose raw name sorts after ``start``, counting all entries and those yielded."""
    with os.scandir(fd) as it:
        for entry in it:
            counts[0] += 1
            key = os.fsencode(entry.name)
            if start is None or key > start:
                counts[1] += 1
                yield key, entry


def _cursor(key: bytes) -> str:
    """The ``next_after`` for a raw name: the name itself, or ``/`` and hex when it is not UTF-8."""
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return _HEX_CURSOR + key.hex()


def _cursor_key(path: object, after: object) -> bytes | None:
    if after is None:
        return None
    if not isinstance(after, str) or len(after) > 2 * NAME_MAX + 1:
        raise _refuse(path, "after must be the next_after of the previous page", "bad_argument")
    if after.startswith(_HEX_CURSOR):
        try:
            return bytes.fromhex(after[len(_HEX_CURSOR):])
        except ValueError:
            raise _refuse(path, "after must be the next_after of the previous page", "bad_argument") from None
    try:
        return after.encode("utf-8")
    except UnicodeEncodeError:
        raise _refuse(path, "after is not valid UTF-8", "bad_argument") from None


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


def _reason(exc: OSError, name: str, dir_fd: int) -> str:
    if exc.errno == errno.ENOENT:
        return "not_found"
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return "symlink"
    if exc.errno == errno.ENOTDIR:
        # O_DIRECTORY | O_NOFOLLOW says ENOTDIR for a symlink and for a file alike; an lstat
        # (no open) tells them apart, for the code only: the refusal stands either way.
        try:
            is_link = stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
        except OSError:
            is_link = False
        return "symlink" if is_link else "wrong_kind"
    return "os_error"


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISREG, "regular file"), (stat.S_ISLNK, "symbolic link"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "file of unknown type"


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
