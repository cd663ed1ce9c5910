"""Master keys for encryption at rest: the key provider seam.

A journal encrypted at rest keeps one random *data key* per run, stored wrapped (encrypted) by a
*master key* that never enters the journal (:mod:`cuaderno.journal._crypto`). Where master keys
come from is a :class:`KeyProvider`: an environment variable (:func:`env_keys`) or a key file
(:func:`file_keys`) by default; a KMS is one more provider (``current`` asks it for the key to
wrap with, ``find`` for the one a stored data key names).

A key is 32 random bytes, written as base64 (``python -c "import base64, os;
print(base64.b64encode(os.urandom(32)).decode())"``). Its id (:attr:`MasterKey.key_id`) is
derived from the key itself, so a journal records which key wrapped each data key without
recording anything that helps to guess it, and a wrong key is told from a damaged row
(:class:`~cuaderno.errors.KeyInvalid` names the id it needed).

Rotation: the provider's current key wraps new data keys; older keys stay in the provider
(``CUADERNO_OLD_KEYS``, the key file's later lines) until every data key they wrapped has been
wrapped again under the current one.

The stores take a provider as ``keys=`` (:class:`~cuaderno.journal.sqlite.SqliteCheckpointer`,
:class:`~cuaderno.journal.postgres.PostgresCheckpointer`); :func:`~cuaderno.journal.open_journal`
and the CLI take the environment's (:func:`environment_keys`) or ``--key-file``. See
``docs/guide/erasure-and-encryption.md``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from cuaderno.errors import KeyInvalid, KeyMissing

__all__ = ["KEY_BYTES", "KeyProvider", "MasterKey", "StaticKeys", "env_keys", "environment_keys", "file_keys", "master_key",
           "parse_key"]

KEY_BYTES = 32
"""Bytes of a master key (AES-256)."""


@dataclass(frozen=True)
class MasterKey:
    """One master key and its id (derived from it; never the key)."""

    key_id: str
    secret: bytes = field(repr=False)


def master_key(secret: bytes) -> MasterKey:
    """A master key from its 32 bytes, with its id.

    Raises:
        KeyInvalid: not 32 bytes.
    """
    if not isinstance(secret, bytes) or len(secret) != KEY_BYTES:
        raise KeyInvalid(f"a master key is {KEY_BYTES} bytes; this one is not")
    digest = hashlib.sha256(b"cuaderno master key id\x00" + secret).hexdigest()
    return MasterKey(f"k1-{digest[:16]}", secret)


def parse_key(text: str, where: str) -> MasterKey:
    """A master key written as base64 (standard or URL-safe alphabet), read from ``where``.

    Raises:
        KeyInvalid: not base64 of 32 bytes; the message names ``where``, never the text.
    """
    cleaned = text.strip()
    try:
        raw = base64.b64decode(cleaned.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise KeyInvalid(f"the key in {where} is not base64") from None
    if len(raw) != KEY_BYTES:
        raise KeyInvalid(f"the key in {where} is {len(raw)} bytes; a master key is {KEY_BYTES}")
    return master_key(raw)


@runtime_checkable
class KeyProvider(Protocol):
    """Where master keys come from (an environment variable, a file, a KMS)."""

    def current(self) -> MasterKey:
        """The key new data keys are wrapped with.

        Raises:
            KeyMissing: the provider has none.
        """
        ...

    def find(self, key_id: str) -> MasterKey | None:
        """The key with id ``key_id`` (the current one or an older one), or ``None``."""
        ...


class StaticKeys:
    """A provider holding its keys in memory: the current one first, then older ones."""

    def __init__(self, current: MasterKey, older: Sequence[MasterKey] = ()) -> None:
        self._current = current
        self._by_id = {k.key_id: k for k in (*older, current)}

    def current(self) -> MasterKey:
        return self._current

    def find(self, key_id: str) -> MasterKey | None:
        return self._by_id.get(key_id)


def env_keys(var: str = "CUADERNO_KEY", older_var: str = "CUADERNO_OLD_KEYS",
             environ: Mapping[str, str] | None = None) -> StaticKeys:
    """The keys in the environment: ``var`` the current key, ``older_var`` older ones separated
    by commas.

    Raises:
        KeyMissing: ``var`` is unset or empty.
        KeyInvalid: a key that is not base64 of 32 bytes.
    """
    env = os.environ if environ is None else environ
    text = env.get(var, "")
    if not text.strip():
        raise KeyMissing(f"no master key: set {var} (base64 of 32 random bytes)")
    older = [parse_key(part, f"{older_var} (item {i + 1})")
             for i, part in enumerate(env.get(older_var, "").split(",")) if part.strip()]
    return StaticKeys(parse_key(text, var), older)


def file_keys(path: str | os.PathLike[str]) -> StaticKeys:
    """The keys in a file: one base64 key a line, the current one first, older ones after it;
    blank lines and lines starting with ``#`` are skipped. The file must not be readable by group
    or others (a key file anyone can read protects nothing).

    Raises:
        KeyMissing: no such file, or no key in it.
        KeyInvalid: a line that is not a key, or a file others can read.
    """
    p = Path(path)
    try:
        mode = p.stat().st_mode
        lines = p.read_text(encoding="ascii").splitlines()
    except FileNotFoundError:
        raise KeyMissing(f"no key file at {str(p)!r}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyInvalid(f"the key file {str(p)!r} cannot be read ({type(exc).__name__})") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyInvalid(f"the key file {str(p)!r} is readable by others (mode {stat.filemode(mode)}); "
                         f"chmod 600 it")
    keys = [parse_key(line, f"{str(p)!r} line {n}") for n, line in enumerate(lines, 1)
            if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise KeyMissing(f"the key file {str(p)!r} holds no key")
    return StaticKeys(keys[0], keys[1:])


def environment_keys(environ: Mapping[str, str] | None = None) -> StaticKeys | None:
    """The keys the environment names, or ``None`` when it names none: ``CUADERNO_KEY`` (with
    ``CUADERNO_OLD_KEYS``, see :func:`env_keys`), else a key file at ``CUADERNO_KEY_FILE`` (see
    :func:`file_keys`). What :func:`~cuaderno.journal.open_journal` (so the CLI, a worker, a
    Temporal activity) uses when it is given no provider.

    Raises:
        KeyMissing, KeyInvalid: as :func:`env_keys` and :func:`file_keys`.
    """
    env = os.environ if environ is None else environ
    if env.get("CUADERNO_KEY", "").strip():
        return env_keys(environ=env)
    if env.get("CUADERNO_KEY_FILE", "").strip():
        return file_keys(env["CUADERNO_KEY_FILE"])
    return None
