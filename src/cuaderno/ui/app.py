"""The operator's web page: runs, a run's timeline, and (when allowed) the decisions a person takes.

A client of the public API, like the command line: it reads through the store's ``checkpoint``
and the chain-checked ``checkpoint.verified``, and writes nothing but what
:func:`cuaderno.approve`, :func:`cuaderno.deny`, :func:`cuaderno.resolve` and
:func:`cuaderno.cancel` append, with the same checks and the same typed refusals.

Safe by construction:

- every value reaches the page through Jinja with autoescape on, and a ``finalize`` hook that
  escapes control, format and bidirectional characters (``\\u202e`` and the like) first, as the
  command line does: a tool name a model wrote shows as the characters it is;
- the Content-Security-Policy admits no script at all (the page has none), so even a value that
  escaped escaping could not run;
- without ``allow_decisions`` the app has no route that writes (the store is opened read-only);
  with it, every decision is a POST carrying the CSRF token of the person's pages, whose
  ``Origin`` (or, when a browser sent none, ``Referer``) names this page on one of the allowed
  host names; a request that says neither, or that another site sent (``Sec-Fetch-Site``), is
  refused;
- every request must name one of an explicit list of host names (``allowed_hosts``; never "any"):
  a page of another site that rebinds its own name to this server's address arrives with its own
  ``Host`` and is refused, so it can neither read a token nor post one;
- with an :class:`~cuaderno.ui.auth.Auth` (a credentials file and its login form, or a trusted
  proxy's header) every page needs an identity and the approver recorded is that identity, never
  a typed field; the app refuses to offer decisions beyond loopback (``public``) without one;
- the run page draws a bounded number of steps (a long run is paged), and at most
  :data:`HEAVY_AT_ONCE` run pages are built at once, so a crowd of readers of a long run cannot
  exhaust the server's memory;
- a journal file deleted or replaced since the server opened it is said on every page, and no
  decision is written to it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sqlite3
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode, urlsplit

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cuaderno import operations, render
from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import (
    ApprovalMismatch,
    CuadernoError,
    JournalCorrupt,
    NotUncertain,
    NotWaitingForApproval,
    RunClosed,
    RunNotFound,
    UsageError,
    clipped,
)
from cuaderno.events import StepEvent, shown_payload
from cuaderno.events.payloads import RunStart, shown_as
from cuaderno.flow import queued_state
from cuaderno.journal.keys import KeyProvider
from cuaderno.journal.sqlite import SqliteCheckpointer
from cuaderno.operations import STATUSES
from cuaderno.ui import _timeline
from cuaderno.ui._index import RunIndex
from cuaderno.ui._journal import journal_path, open_journal
from cuaderno.ui.auth import COOKIE, SESSION_SECONDS, Auth, Identity

__all__ = ["HEAVY_AT_ONCE", "LOOPBACK_HOSTS", "STATUSES", "Auth", "create_app", "journal_path"]

LOOPBACK_HOSTS: Final = ("127.0.0.1", "localhost", "::1", "[::1]")
PAGE_SIZE: Final = 50
HEAVY_AT_ONCE: Final = 2
"""Run pages (and whole payloads) built at once; more requests wait their turn. Each reads and
chain-checks the run's whole journal: 8 at once of a 10,000-step run took the server to 1 GB."""
_OPEN_PATHS: Final = frozenset({"/login", "/favicon.ico"})
_HERE: Final = Path(__file__).resolve().parent
_CSP: Final = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
               "frame-ancestors 'none'; base-uri 'none'")


# -- templates ------------------------------------------------------------------------------------------


def _finalize(value: Any) -> Any:
    """Every ``{{ value }}``: text a model or a person wrote is shown as the characters it is
    (control, format and bidi characters as ``\\uXXXX``), then HTML-escaped by autoescape.
    Markup (a template's own HTML) is left alone."""
    if isinstance(value, Markup):
        return value
    if value is None:
        return ""
    return render.clean(value if isinstance(value, str) else str(value), keep_newlines=True)


def _exact(value: Any) -> Markup:
    """A value sent back exactly as journaled (a run or step id in a hidden field): HTML-escaped
    for the attribute, but not rewritten, or the decision would name another step. Control,
    format and bidi characters go as character references, which the browser reads back as the
    same characters: the page's bytes never hold one."""
    text = str(Markup.escape("" if value is None else str(value)))
    if not (text.isascii() and text.isprintable()):
        text = "".join(f"&#x{ord(ch):X};" if render.clean(ch) != ch else ch for ch in text)
    return Markup(text)


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _templates() -> Jinja2Templates:
    env = Environment(loader=FileSystemLoader(_HERE / "templates"), autoescape=True, finalize=_finalize,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["exact"] = _exact
    env.filters["when"] = _when
    env.filters["dumps"] = render.dumps
    env.filters["duration"] = _timeline.duration_text
    env.globals["url"] = lambda path, **query: path + ("?" + urlencode(query) if query else "")
    return Jinja2Templates(env=env)


# -- the app --------------------------------------------------------------------------------------------


class _Flash:
    """What a decision did, shown once on the page the POST redirects to (never taken from the URL:
    a link someone sends cannot make the page say that a call was approved)."""

    def __init__(self) -> None:
        self._messages: OrderedDict[str, str] = OrderedDict()

    def put(self, message: str) -> str:
        token = secrets.token_urlsafe(12)
        self._messages[token] = message
        while len(self._messages) > 200:
            self._messages.popitem(last=False)
        return token

    def take(self, token: str | None) -> str | None:
        return self._messages.pop(token, None) if token else None


class _Refusal(Exception):
    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


class _UI:
    def __init__(self, store: SqliteCheckpointer, *, allow_decisions: bool, page_size: int,
                 allowed_hosts: Sequence[str], auth: Auth | None) -> None:
        self.store = store
        self.index = RunIndex(store.path, store.stored_content)
        self.allow_decisions = allow_decisions
        self.page_size = page_size
        self.allowed_hosts = list(allowed_hosts)
        self.auth = auth
        self.csrf = secrets.token_urlsafe(32)
        self.flash = _Flash()
        self.templates = _templates()
        self.heavy = asyncio.Semaphore(HEAVY_AT_ONCE)
        self.stamp = _stamp(store.path)

    def identity(self, request: Request) -> Identity | None:
        """Who sent the request, as the configured authentication establishes it (``None``: nobody
        authenticated, or no authentication configured)."""
        if self.auth is None:
            return None
        peer = request.client.host if request.client is not None else None
        return self.auth.from_proxy(peer, request.headers) or self.auth.from_cookie(request.cookies.get(COOKIE))

    def gate(self, request: Request) -> Response | None:
        """With authentication on, a request without an identity gets the login form (a GET) or a
        refusal (anything else); ``None`` lets it through. The identity goes to ``request.state``."""
        request.state.identity = self.identity(request)
        if self.auth is None or request.state.identity is not None or request.url.path in _OPEN_PATHS:
            return None
        if request.method == "GET" and self.auth.credentials is not None:
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse("/login?" + urlencode({"next": target}), status_code=303)
        how = ("log in first" if self.auth.credentials is not None else
               f"this page takes its users from the proxy's {self.auth.proxy_header_shown} header, and this "
               "request did not come through the proxy")
        return self.refused(request, _Refusal(401, "Who are you?", f"{how}; nothing was written"))

    def journal_gone(self) -> str | None:
        """What happened to the journal file since the server opened it, if anything: the page
        shows what the server still holds open, and says so."""
        now = _stamp(self.store.path)
        if now == self.stamp:
            return None
        what = "deleted" if now is None else "replaced by another file"
        return (f"The journal file {self.store.path} was {what} after this server opened it. What is shown is "
                "the old file the server still holds open, and no decision can be written to it: restart "
                "cuaderno ui to see the journal at that path now.")

    def page(self, request: Request, name: str, code: int = 200, **context: Any) -> Response:
        identity: Identity | None = getattr(request.state, "identity", None)
        token = self.auth.csrf(identity, self.csrf) if self.auth is not None else self.csrf
        context.update(allow_decisions=self.allow_decisions, csrf=token, journal=self.store.path,
                       identity=identity, auth=self.auth is not None,
                       login=self.auth is not None and self.auth.credentials is not None,
                       journal_gone=self.journal_gone())
        return self.templates.TemplateResponse(request, name, context, status_code=code)

    def refused(self, request: Request, exc: _Refusal) -> Response:
        # A refused decision links back to its run (the POST named it in its form).
        run_id = getattr(request.state, "run_id", None) or request.query_params.get("id")
        return self.page(request, "error.html", exc.status, title=exc.title, message=exc.message, run_id=run_id)

    # -- reading ------------------------------------------------------------------------------------

    def runs(self, request: Request) -> Response:
        status = request.query_params.get("status") or None
        if status is not None and status not in STATUSES:
            raise _Refusal(400, "Unknown status", f"{status!r} is not a run status; use one of: {', '.join(STATUSES)}")
        page = _positive(request.query_params.get("page"), "page", default=1)
        order = request.query_params.get("order") or "updated"
        if order not in ("updated", "started"):
            raise _Refusal(400, "Bad request", f"order must be 'updated' or 'started', got {order[:40]!r}")
        run_ids, total = self.index.page(status, (page - 1) * self.page_size, self.page_size,
                                         by_start=order == "started")
        starts = self.index.starts(run_ids)
        read: dict[str, Checkpoint | str] = {}  # a run's summary, or why it could not be read
        for run_id in run_ids:
            try:
                cp = self.store.checkpoint(run_id)
            except JournalCorrupt as exc:  # one damaged summary does not hide the other runs
                read[run_id] = str(exc)
                continue
            if cp is not None:  # None: removed between the two reads
                read[run_id] = cp
        states = operations.run_states(self.store, [c for c in read.values() if isinstance(c, Checkpoint)])
        rows: list[dict[str, Any]] = []
        for run_id, found in read.items():
            if isinstance(found, str):
                rows.append({"run_id": run_id, "damaged": found})
                continue
            cp = found
            summary = render.run_summary(cp)
            rows.append({"run_id": run_id, "damaged": None, "cp": cp, "start": starts.get(run_id),
                         "cost": render.cost_text(cp, short=True), "state": _badged(cp, states[run_id]),
                         "pending": summary["pending_approvals"], "uncertain": summary["uncertain"]})
        pages = max(1, -(-total // self.page_size))
        if page > pages:
            raise _Refusal(404, "No such page", f"there are {pages} page(s) of runs{' with status ' + status if status else ''}")
        # The filters and the order every link of the list keeps.
        keep = {k: v for k, v in (("status", status), ("order", order if order != "updated" else None)) if v}
        return self.page(request, "runs.html", rows=rows, status=status, statuses=STATUSES, page=page, pages=pages,
                         total=total, order=order, keep=keep)

    def run(self, request: Request) -> Response:
        run_id = _run_id(request)
        cp, events = _verified(self.store, run_id)
        # A long run is paged: ``from`` is the first step drawn (by default the last page). The
        # old "show all" link (``steps=all``) opens the first page.
        first = request.query_params.get("from")
        begin = (_positive(first, "from") - 1 if first else 0 if request.query_params.get("steps") == "all"
                 else None)
        timeline = _timeline.build(events, start=begin, count=_timeline.STEPS_SHOWN)
        shown = [ev for step in timeline.steps for ev in step.events]
        # A long run's payloads stay behind their links: every one inline would make a page of
        # megabytes (a 1000-turn run: 3 MB, 2 s) where the picture and the facts are what is read.
        inline = len(shown) <= _timeline.INLINE_EVENTS
        payloads = {ev.seq: _timeline.payload_text(ev) for ev in shown} if inline else {}
        start = next((ev for ev in events if ev.step_id == "run" and ev.phase == "start"), None)
        detail = render.run_detail(cp, events)
        outcome = render.dumps(cp.outcome, indent=2) if cp.outcome is not None else None
        # The outcome is the payload of the run's last final answer or end record: cut like a
        # step's payload, with the link to that event.
        outcome_seq = next((ev.seq for ev in reversed(events)
                            if (ev.kind, ev.phase) in (("final", "result"), ("run", "end"))), None)
        return self.page(request, "run.html", cp=cp, detail=detail, timeline=timeline, payloads=payloads,
                         state=_badged(cp, queued_state(self.store, operations.run_state(self.store, cp), cp.run_id)),
                         task=shown_as(start, RunStart).get("task") if start is not None else None,
                         forked=_forked_from(start),
                         started=start.created_at if start is not None else None,
                         groups=render.counter_groups(cp), cost=render.cost_text(cp, short=False),
                         outcome=outcome if outcome is None else outcome[:_timeline.PAYLOAD_SHOWN],
                         outcome_cut=outcome is not None and len(outcome) > _timeline.PAYLOAD_SHOWN,
                         outcome_seq=outcome_seq, decidable=cp.is_open, ended=cp.status in render.ENDED_STATUSES,
                         flash=self.flash.take(request.query_params.get("flash")))

    def event(self, request: Request) -> Response:
        run_id = _run_id(request)
        seq = _positive(request.query_params.get("seq"), "seq")
        _, events = _verified(self.store, run_id)
        if seq > len(events):
            raise _Refusal(404, "No such event", f"run {run_id!r} has {len(events)} events; there is no seq {seq}")
        ev = events[seq - 1]
        return self.page(request, "event.html", cp_run=run_id, ev=ev, payload=render.dumps(shown_payload(ev), indent=2))

    # -- deciding -----------------------------------------------------------------------------------

    async def form(self, request: Request) -> dict[str, str]:
        """The POSTed form, after the checks that it came from this page: the origin, the journal
        file still being the one opened, and the CSRF token; every field a string."""
        _same_origin(request, self.allowed_hosts)
        gone = self.journal_gone()
        if gone is not None and request.url.path != "/login":
            raise _Refusal(409, "Journal gone", gone + " Nothing was written.")
        try:
            raw = await request.form(max_files=0, max_fields=20, max_part_size=1024 * 1024)
        except Exception as exc:  # a malformed body: starlette raises its own errors for it
            raise _Refusal(400, "Bad form", f"the form could not be read ({type(exc).__name__}); nothing was written") \
                from exc
        fields = {k: v for k, v in raw.items() if isinstance(v, str)}
        request.state.run_id = fields.get("run")
        token = fields.get("csrf", "")
        identity: Identity | None = getattr(request.state, "identity", None)
        expected = self.auth.csrf(identity, self.csrf) if self.auth is not None else self.csrf
        if not secrets.compare_digest(token.encode(), expected.encode()):
            raise _Refusal(403, "Refused", "the form carries no valid CSRF token (it was not sent by this page, or "
                           "the server was restarted since the page was loaded): reload the page; nothing was written")
        return fields

    def who(self, request: Request, fields: dict[str, str], what: str) -> str:
        """The name recorded for a decision: the authenticated identity when the page has
        authentication (a ``by`` field is ignored, whatever it says); else the typed name."""
        identity: Identity | None = getattr(request.state, "identity", None)
        if identity is not None:
            return identity.user
        if self.auth is not None:  # the gate lets no such request through; never record a typed name
            raise _Refusal(401, "Who are you?", "log in first; nothing was written")
        return _required(fields, "by", what)

    async def decide(self, request: Request, approved: bool) -> Response:
        fields = await self.form(request)
        run_id, step = _required(fields, "run"), _required(fields, "step")
        by = self.who(request, fields, "your name (who decides, for the record)")
        fingerprint = _required(fields, "fingerprint")
        reason = fields.get("reason") or None
        decide = operations.approve if approved else operations.deny
        event = await run_in_threadpool(_refusing, decide, self.store, run_id, step, fingerprint=fingerprint,
                                        approver=by, reason=reason)
        verb = "approved" if approved else "rejected"
        return self.done(run_id, f"{event.step_id} {verb} by {by}: journaled at seq {event.seq}. The next resume "
                         "of the run acts on it.")

    async def resolve(self, request: Request) -> Response:
        fields = await self.form(request)
        run_id, step = _required(fields, "run"), _required(fields, "step")
        by = self.who(request, fields, "your name (who checked, for the record)")
        happened = {"happened": True, "not_happened": False}.get(fields.get("happened", ""))
        if happened is None:
            raise _Refusal(400, "Bad form", "say whether the effect happened or not; nothing was written")
        receipt = _receipt(fields.get("receipt", ""), happened)
        event = await run_in_threadpool(_refusing, operations.resolve, self.store, run_id, step, happened=happened,
                                        result=receipt, by=by, note=fields.get("note") or None)
        said = "happened" if happened else "did not happen"
        return self.done(run_id, f"{step} recorded as {said} by {by} (seq {event.seq}).")

    async def cancel(self, request: Request) -> Response:
        fields = await self.form(request)
        run_id = _required(fields, "run")
        by = self.who(request, fields, "your name (who cancels, for the record)")
        cp, _ = await run_in_threadpool(_refusing, operations.cancel_run, self.store, run_id, fields.get("reason", ""),
                                        by=by)
        if cp.status == "cancelled":
            message = f"run cancelled by {by}."
        else:
            message = (f"cancellation requested by {by}: the process running it stops before its next step "
                       "(or its next resume finalizes it).")
        return self.done(run_id, message)

    # -- logging in ---------------------------------------------------------------------------------

    def login_form(self, request: Request) -> Response:
        return self.page(request, "login.html", next=_next(request.query_params.get("next")), failed=False)

    async def login(self, request: Request) -> Response:
        """Check a user name and password against the credentials file; a session cookie on success.
        The form is checked like a decision's (origin and token), so another site cannot log a
        browser in under its own account."""
        assert self.auth is not None and self.auth.credentials is not None
        fields = await self.form(request)
        user, password = fields.get("user", "").strip(), fields.get("password", "")
        target = _next(fields.get("next"))
        wait = self.auth.throttle.wait(user)
        if wait > 0:
            raise _Refusal(429, "Too many wrong passwords", f"too many wrong passwords for this user name in a row: "
                           f"try again in {wait:.0f} s")
        # scrypt takes tens of megabytes for a moment: checks share the heavy pages' limit.
        async with self.heavy:
            ok = bool(user and password) and await run_in_threadpool(self.auth.credentials.verify, user, password)
        if not ok:
            self.auth.throttle.failed(user)
            return self.page(request, "login.html", 401, next=target, failed=True)
        self.auth.throttle.succeeded(user)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, self.auth.session(user), max_age=SESSION_SECONDS, httponly=True,
                            samesite="strict", secure=request.url.scheme == "https", path="/")
        return response

    async def logout(self, request: Request) -> Response:
        await self.form(request)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    def done(self, run_id: str, message: str) -> Response:
        token = self.flash.put(message)
        return RedirectResponse("/run?" + urlencode({"id": run_id, "flash": token}), status_code=303)


def _stamp(path: str) -> tuple[int, int] | None:
    """The identity of the file at ``path`` now (``None``: no file there)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _host_allowed(host: str, allowed: Sequence[str]) -> bool:
    """``host`` (no port) matches an allowed name, as ``TrustedHostMiddleware`` matches them."""
    host = host.lower()
    return any(host == name.lower() or (name.startswith("*.") and host.endswith(name[1:].lower()))
               for name in allowed)


def _same_origin(request: Request, allowed: Sequence[str]) -> None:
    """Refuse a state-changing request that does not say it came from this page.

    Browsers send ``Origin`` with every POST; when one is absent (an old browser, a privacy
    extension), the ``Referer`` must name this page instead. A request that names neither is
    refused too: no browser sends such a form, and a script that holds a valid token can send
    ``Origin: http://HOST:PORT`` like a browser. Either header must name an allowed host and the
    ``Host`` the request was sent to (a page on another port of the same machine is another site).
    """
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise _Refusal(403, "Refused", f"the request came from another site ({site[:40]}); nothing was written")
    origin = request.headers.get("origin")
    source, what = (origin, "origin") if origin is not None else (request.headers.get("referer"), "referring page")
    if source is None:
        raise _Refusal(403, "Refused", "the request says neither its Origin nor its Referer, so it cannot be told "
                       "from a form another site sent; a script must send 'Origin: http://HOST:PORT' as a browser "
                       "does; nothing was written")
    try:
        parts = urlsplit(source)
        scheme, hostname, netloc = parts.scheme, parts.hostname, parts.netloc
    except ValueError:  # "http://[x" and the like
        scheme, hostname, netloc = "", None, ""
    if (scheme not in ("http", "https") or hostname is None or netloc != request.headers.get("host")
            or not _host_allowed(hostname, allowed)):
        raise _Refusal(403, "Refused", f"the request came from another {what} ({clipped(source, 80)}); "
                       "nothing was written")


def _next(target: str | None) -> str:
    """Where the login form goes after: a path of this page only (``//host`` is another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _forked_from(start: StepEvent | None) -> Mapping[str, object] | None:
    """Where a fork came from (``cuaderno fork`` records it in the run's start), if it is one."""
    origin = shown_as(start, RunStart).get("forked_from") if start is not None else None
    return origin if isinstance(origin, dict) and isinstance(origin.get("run_id"), str) else None


def _positive(text: str | None, name: str, *, default: int | None = None) -> int:
    if text is None or text == "":
        if default is not None:
            return default
        raise _Refusal(400, "Bad request", f"{name} is missing")
    if not text.isdigit() or len(text) > 12 or int(text) < 1:
        raise _Refusal(400, "Bad request", f"{name} must be a positive number, got {text[:40]!r}")
    return int(text)


def _run_id(request: Request) -> str:
    run_id = request.query_params.get("id")
    if not run_id:
        raise _Refusal(400, "Bad request", "which run? (the address has no ?id=RUN)")
    return run_id


def _required(fields: dict[str, str], name: str, what: str | None = None) -> str:
    value = fields.get(name, "")
    if not value.strip():
        raise _Refusal(400, "Bad form", f"{what or name} is missing; nothing was written")
    return value.strip() if name == "by" else value


def _receipt(text: str, happened: bool) -> Any:
    if not text.strip():
        return None
    if not happened:
        raise _Refusal(400, "Bad form", "a receipt goes only with 'it happened': 'it did not happen' makes the next "
                       "resume send the effect again; nothing was written")
    try:
        return operations.read_receipt(text, what="the receipt")
    except UsageError as exc:
        raise _Refusal(400, "Bad form", str(exc)) from None


def _verified(store: SqliteCheckpointer, run_id: str) -> tuple[Checkpoint, list[StepEvent]]:
    # operations.shown: an erased run shows its structure, its payloads as erased.
    found: tuple[Checkpoint, list[StepEvent]] = _refusing(operations.shown, store, run_id)
    return found


_STALE: Final = ("The page you decided on is out of date (someone else decided, or the run moved on): "
                 "reload the run to see where it stands. ")


def _refusing(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with cuaderno's typed errors turned into a refusal shown on the page."""
    try:
        return fn(*args, **kwargs)
    except (CuadernoError, sqlite3.Error) as exc:
        raise _refusal(exc) from exc


def _refusal(exc: CuadernoError | sqlite3.Error) -> _Refusal:
    if isinstance(exc, RunNotFound):
        return _Refusal(404, "No such run", str(exc))
    if isinstance(exc, (ApprovalMismatch, NotWaitingForApproval, NotUncertain, RunClosed)):
        return _Refusal(409, "Refused", _STALE + str(exc))
    if isinstance(exc, JournalCorrupt):
        return _Refusal(500, "Journal damaged", str(exc))
    if isinstance(exc, sqlite3.Error):  # the file went away or was replaced under the server
        return _Refusal(500, "Journal error", f"the journal refused the operation: {exc}")
    return _Refusal(409, "Refused", str(exc) or type(exc).__name__)


def _handler(ui: _UI, fn: Callable[[Request], Any], *, heavy: bool = False,
             sync: bool = False) -> Callable[[Request], Awaitable[Response]]:
    """``fn`` as an endpoint: behind the authentication gate, its refusals and cuaderno's typed
    errors shown as a page. ``sync``: ``fn`` reads the journal and runs in a worker thread;
    ``heavy``: it reads a whole run, and waits for one of :data:`HEAVY_AT_ONCE` turns."""
    async def call(request: Request) -> Response:
        if sync:
            result: Response = await run_in_threadpool(fn, request)
            return result
        outcome = fn(request)
        if isinstance(outcome, Response):
            return outcome
        response: Response = await outcome
        return response

    async def endpoint(request: Request) -> Response:
        try:
            gated = ui.gate(request)
            if gated is not None:
                return gated
            if heavy:
                async with ui.heavy:
                    return await call(request)
            return await call(request)
        except _Refusal as exc:
            return ui.refused(request, exc)
        except (CuadernoError, sqlite3.Error) as exc:  # a read outside _refusing (the list, its index)
            return ui.refused(request, _refusal(exc))
    return endpoint


class _SecurityHeaders:
    """Headers on every response: no script, no framing, no sniffing, no referrer to other sites
    (``same-origin``, not ``no-referrer``: with the latter a browser sends ``Origin: null`` on
    the page's own forms, which the CSRF check refuses as another origin)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(b"content-security-policy", _CSP.encode()), (b"x-content-type-options", b"nosniff"),
                            (b"referrer-policy", b"same-origin"), (b"x-frame-options", b"DENY"),
                            (b"cache-control", b"no-store")]
                message["headers"] = headers
            await send(message)
        await self.app(scope, receive, sending)


def create_app(journal: str | Path, *, allow_decisions: bool = False,
               allowed_hosts: Sequence[str] = LOOPBACK_HOSTS, page_size: int = PAGE_SIZE,
               auth: Auth | None = None, public: bool = False, keys: KeyProvider | None = None) -> Starlette:
    """The web app for one journal.

    Args:
        journal: a path or ``sqlite:///path``; the file must exist (it is never created).
        allow_decisions: add the routes that approve, deny, resolve and cancel. Without it the
            journal is opened read-only and the app has no route that writes.
        allowed_hosts: the ``Host`` names requests may carry (the names the server is reached
            by; ``*.example.com`` matches its subdomains). Never ``*``: a server that answers to
            any name answers a DNS-rebinding page.
        page_size: runs per page of the list.
        auth: who may use the page (a credentials file, a trusted proxy header); every page
            then needs an identity, and decisions record it as the approver.
        public: the server listens beyond loopback. Decisions are then refused without ``auth``.
        keys: the master keys of a journal encrypted at rest (else the environment's).

    Raises:
        UsageError, JournalError: the journal cannot be opened, the host list is empty or holds
            ``*``, or decisions were asked for beyond loopback without authentication (nothing
            was created or written).
    """
    hosts = [h.strip() for h in allowed_hosts if h.strip()]
    if not hosts or any(h == "*" or "*" in h.removeprefix("*.") for h in hosts):
        raise UsageError("the page needs an explicit list of the host names it is reached by (--allowed-host "
                         "NAME), not '*': a server that answers to any name answers a DNS-rebinding page")
    if public and allow_decisions and auth is None:
        raise UsageError("decisions beyond loopback need an identity for the record: start with --auth-file FILE "
                         "(a login) or --trusted-proxy-header NAME --trusted-proxy ADDR (an authenticating "
                         "proxy), or listen on loopback")
    store = open_journal(journal, readonly=not allow_decisions, keys=keys)
    try:
        ui = _UI(store, allow_decisions=allow_decisions, page_size=page_size, allowed_hosts=hosts, auth=auth)
    except BaseException:
        store.close()
        raise
    routes: list[BaseRoute] = [
        Route("/", _handler(ui, ui.runs, sync=True), methods=["GET"]),
        Route("/run", _handler(ui, ui.run, sync=True, heavy=True), methods=["GET"]),
        Route("/run/event", _handler(ui, ui.event, sync=True, heavy=True), methods=["GET"]),
        Route("/favicon.ico", lambda request: Response(status_code=204), methods=["GET"]),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    if auth is not None and auth.credentials is not None:
        routes += [Route("/login", _handler(ui, ui.login_form), methods=["GET"]),
                   Route("/login", _handler(ui, ui.login), methods=["POST"]),
                   Route("/logout", _handler(ui, ui.logout), methods=["POST"])]
    if allow_decisions:
        routes += [
            Route("/approve", _handler(ui, lambda r: ui.decide(r, True)), methods=["POST"]),
            Route("/deny", _handler(ui, lambda r: ui.decide(r, False)), methods=["POST"]),
            Route("/resolve", _handler(ui, ui.resolve), methods=["POST"]),
            Route("/cancel", _handler(ui, ui.cancel), methods=["POST"]),
        ]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            ui.index.close()
            store.close()

    app = Starlette(routes=routes, lifespan=lifespan,
                    middleware=[Middleware(_SecurityHeaders),
                                Middleware(TrustedHostMiddleware, allowed_hosts=hosts, www_redirect=False)])
    return app


class _Badged(operations.RunState):
    """A run's state as the pages show it: :class:`~cuaderno.operations.RunState` and its badge."""

    shown: str


def _badged(cp: Checkpoint, state: operations.RunState) -> _Badged:
    """:func:`cuaderno.operations.run_state` plus ``shown``, the badge: the stored status, except
    that a stored ``running`` becomes ``waiting`` while no live process holds the run."""
    return {**state, "shown": state["state"] if cp.status == "running" else cp.status}
