"""Who is deciding: the operator page's identities (a credentials file, or a trusted proxy's header).

A page that approves money-moving calls records who approved, so the name must come from an
authentication, never from a field the client types. Two choices, either or both:

- a **credentials file** (``--auth-file``): one ``user:scrypt$N$r$p$SALT$HASH`` line per person,
  written by ``cuaderno ui-passwd FILE USER``. The hash is the standard library's
  :func:`hashlib.scrypt` (salted, memory-hard); a login form checks it and sets a session cookie
  signed with HMAC-SHA256 (a key drawn at start, so a restart logs everyone out), ``HttpOnly``
  and ``SameSite=Strict``. After :data:`FREE_TRIES` wrong passwords in a row for one user name,
  each further try waits a doubling delay (up to :data:`MAX_DELAY` seconds) since the last one. The file is read again when it changes: a removed user or a changed
  password ends that user's sessions at their next request.
- a **trusted proxy header** (``--trusted-proxy-header X-Auth-Request-User`` with
  ``--trusted-proxy ADDR``): the name a reverse proxy that authenticated the person put in a
  header (oauth2-proxy's ``X-Auth-Request-User`` or ``X-Forwarded-User``). The header is taken
  only from a connection whose peer address is one of the configured proxies; from any other
  address it is ignored, as if absent.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cuaderno.errors import UsageError

__all__ = ["COOKIE", "Auth", "CredentialsFile", "Identity", "Throttle", "hash_password", "set_password",
           "valid_user"]

COOKIE: Final = "cuaderno_session"
SESSION_SECONDS: Final = 12 * 3600
"""A login lasts a working day; then the person logs in again."""

# scrypt's cost: N=2**15, r=8 takes 32 MiB and about 0.1 s per check on a laptop core. The
# parameters are stored with each hash, so raising them later leaves old entries readable.
_N: Final = 2**15
_R: Final = 8
_P: Final = 1
_MAXMEM: Final = 128 * 1024 * 1024
_MAX_USER: Final = 64
FREE_TRIES: Final = 5
"""Wrong passwords in a row for one user name before each further try must wait."""
MAX_DELAY: Final = 60.0
"""The longest wait between tries, in seconds (the delay doubles from 1 s up to it)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated person: the name recorded as approver, and how it was established."""

    user: str
    source: str
    """``"login"`` (the credentials file) or ``"proxy"`` (the trusted header)."""


def valid_user(user: str) -> bool:
    """A user name fit for the file and the journal: printable ASCII, no ``:`` and no space."""
    return 0 < len(user) <= _MAX_USER and user.isascii() and user.isprintable() and not any(
        ch in user for ch in ": \t")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_password(password: str, *, n: int = _N, r: int = _R, p: int = _P) -> str:
    """``scrypt$N$r$p$SALT$HASH`` for ``password``, with a fresh 16-byte salt."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=32)
    return f"scrypt${n}${r}${p}${_b64(salt)}${_b64(digest)}"


def _check(password: str, stored: str) -> bool:
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        if kind != "scrypt":
            return False
        expected = _unb64(digest)
        got = hashlib.scrypt(password.encode(), salt=_unb64(salt), n=int(n), r=int(r), p=int(p),
                             maxmem=_MAXMEM, dklen=len(expected))
    except (ValueError, TypeError):  # a malformed entry matches no password
        return False
    return hmac.compare_digest(got, expected)


def _parse(text: str, path: Path) -> dict[str, str]:
    users: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, stored = line.partition(":")
        if not sep or not valid_user(user) or not stored.startswith("scrypt$") or stored.count("$") != 5:
            raise UsageError(f"{str(path)!r} line {number}: not 'user:scrypt$N$r$p$SALT$HASH' "
                             "(write entries with: cuaderno ui-passwd FILE USER)")
        users[user] = stored
    return users


class CredentialsFile:
    """The users of a credentials file, read again whenever the file changes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._users: dict[str, str] = {}
        self._load()
        if not self._users:
            raise UsageError(f"{str(self.path)!r} names no user: add one with cuaderno ui-passwd "
                             f"{self.path} USER")

    def _load(self) -> None:
        try:
            st = self.path.stat()
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return
            users = _parse(self.path.read_text(encoding="utf-8"), self.path)
        except OSError as exc:
            if self._stamp is None:
                raise UsageError(f"cannot read the credentials file {str(self.path)!r}: "
                                 f"{exc.strerror or exc}") from None
            users, stamp = {}, (0, 0, 0)  # gone since: nobody can log in, every session ends
        except UnicodeDecodeError:
            raise UsageError(f"{str(self.path)!r} is not a UTF-8 text file of credentials") from None
        self._users, self._stamp = users, stamp

    def stored(self, user: str) -> str | None:
        """The stored hash of ``user`` (``None``: no such user), after re-reading a changed file."""
        with self._lock:
            try:
                self._load()
            except UsageError:  # a file broken by an edit in progress: nobody until it is fixed
                self._users = {}
            return self._users.get(user)

    def verify(self, user: str, password: str) -> bool:
        """Whether ``password`` is ``user``'s. An unknown user costs one hash too, so the time
        taken does not say which user names exist."""
        stored = self.stored(user)
        if stored is None:
            _check(password, _DUMMY)
            return False
        return _check(password, stored)


_DUMMY: Final = "scrypt$32768$8$1$AAAAAAAAAAAAAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"


def set_password(path: str | Path, user: str, password: str) -> bool:
    """Add ``user`` to the credentials file at ``path`` or replace its password (the file is
    created with mode 0600). Written to a temporary file and renamed over the old one, so a
    running page never reads half a file. Whether the user was new.

    Raises:
        UsageError: a bad user name, an empty password, or a file that is not a credentials file.
    """
    if not valid_user(user):
        raise UsageError(f"user name {user[:80]!r}: use 1 to {_MAX_USER} printable ASCII characters, "
                         "without ':' or spaces")
    if not password:
        raise UsageError("the password is empty; nothing was written")
    target = Path(path)
    text = target.read_text(encoding="utf-8") if target.exists() else ""
    users = _parse(text, target)
    new = user not in users
    users[user] = hash_password(password)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write("# cuaderno ui credentials: user:scrypt$N$r$p$salt$hash (write with cuaderno ui-passwd)\n")
            out.writelines(f"{name}:{stored}\n" for name, stored in users.items())
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return new


def _networks(addresses: Sequence[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    networks = []
    for text in addresses:
        try:
            networks.append(ipaddress.ip_network(text.strip("[]"), strict=False))
        except ValueError:
            raise UsageError(f"--trusted-proxy {text!r} is not an IP address or network (e.g. 127.0.0.1, "
                             "10.0.0.0/24)") from None
    return networks


class Throttle:
    """Wrong passwords per user name: after :data:`FREE_TRIES` in a row, the next try waits
    ``2**(n - FREE_TRIES)`` seconds (at most :data:`MAX_DELAY`) after the last wrong one. A name
    is never locked out for good (that would let anyone lock a person out), only slowed."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def wait(self, user: str) -> float:
        """Seconds before ``user`` may try again (0: now)."""
        with self._lock:
            count, last = self._failures.get(user, (0, 0.0))
        if count < FREE_TRIES:
            return 0.0
        return max(0.0, last + min(MAX_DELAY, 2.0 ** (count - FREE_TRIES)) - self._clock())

    def failed(self, user: str) -> None:
        with self._lock:
            count, _ = self._failures.pop(user, (0, 0.0))
            self._failures[user] = (count + 1, self._clock())
            while len(self._failures) > 10_000:  # bounded: names nobody has are tried too
                self._failures.popitem(last=False)

    def succeeded(self, user: str) -> None:
        with self._lock:
            self._failures.pop(user, None)


class Auth:
    """The authentication a page was started with: a credentials file, a trusted proxy header,
    or both. Sessions are signed with a key of this process."""

    def __init__(self, *, credentials: CredentialsFile | None = None, proxy_header: str | None = None,
                 proxies: Sequence[str] = (), clock: Callable[[], float] = time.monotonic) -> None:
        if credentials is None and proxy_header is None:
            raise UsageError("authentication needs a credentials file or a trusted proxy header")
        if proxy_header is not None and not proxies:
            raise UsageError(f"--trusted-proxy-header {proxy_header} needs --trusted-proxy ADDR: the address "
                             "the proxy connects from (the header is taken from no one else)")
        if proxy_header is not None and not (proxy_header.isascii() and proxy_header.replace("-", "").isalnum()):
            raise UsageError(f"--trusted-proxy-header {proxy_header[:80]!r} is not a header name")
        self.credentials = credentials
        self.proxy_header = proxy_header.lower() if proxy_header else None
        self.proxy_header_shown = proxy_header
        self.proxies = _networks(proxies)
        self.throttle = Throttle(clock)
        self._key = secrets.token_bytes(32)

    # -- the proxy ------------------------------------------------------------------------------

    def from_proxy(self, peer: str | None, headers: Mapping[str, str]) -> Identity | None:
        """The header's user, if the connection comes from a configured proxy; else ``None``."""
        if self.proxy_header is None or peer is None:
            return None
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return None
        if not any(address in net for net in self.proxies):
            return None  # anyone can send the header; only the proxy's is believed
        user = headers.get(self.proxy_header, "").strip()
        if not user or len(user) > 200 or not user.isprintable():
            return None
        return Identity(user, "proxy")

    # -- sessions -------------------------------------------------------------------------------

    def _sign(self, body: str) -> str:
        return _b64(hmac.new(self._key, body.encode(), hashlib.sha256).digest())

    def session(self, user: str, *, now: float | None = None) -> str:
        """A cookie value naming ``user``, valid for :data:`SESSION_SECONDS`, bound to the user's
        current password hash (a changed password ends it)."""
        assert self.credentials is not None
        stored = self.credentials.stored(user) or ""
        body = _b64(json.dumps({"u": user, "e": int((now or time.time()) + SESSION_SECONDS),
                                "h": hashlib.sha256(stored.encode()).hexdigest()[:16]}).encode())
        return f"{body}.{self._sign(body)}"

    def from_cookie(self, value: str | None, *, now: float | None = None) -> Identity | None:
        """The user a session cookie names, if it is one this process signed, unexpired, and the
        user's entry is unchanged since; else ``None``."""
        if self.credentials is None or not value or value.count(".") != 1:
            return None
        body, signature = value.split(".")
        if not hmac.compare_digest(signature, self._sign(body)):
            return None
        try:
            data = json.loads(_unb64(body))
            user, expires, bound = str(data["u"]), int(data["e"]), str(data["h"])
        except (ValueError, KeyError, TypeError):
            return None
        if expires < (now or time.time()):
            return None
        stored = self.credentials.stored(user)
        if stored is None or not hmac.compare_digest(hashlib.sha256(stored.encode()).hexdigest()[:16], bound):
            return None
        return Identity(user, "login")

    def csrf(self, identity: Identity | None, fallback: str) -> str:
        """The CSRF token of ``identity``'s pages (each person's own), or the app's token."""
        if identity is None:
            return fallback
        return self._sign(f"csrf:{identity.source}:{identity.user}")
