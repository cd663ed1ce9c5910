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
  with it, every decision is a POST carrying the app's CSRF token, and a request another site
  sent (its ``Origin`` or ``Sec-Fetch-Site`` says so) is refused;
- requests naming a host other than the ones the server was bound for are refused (a page of
  another site that rebinds its name to 127.0.0.1 cannot read the token).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
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

import cuaderno.harness as harness
from cuaderno import _cli_render as render
from cuaderno._json import MAX_DEPTH
from cuaderno.cancellation import cancel as cancel_run
from cuaderno.checkpoint import Checkpoint, verified
from cuaderno.errors import (
    ApprovalMismatch,
    CuadernoError,
    JournalCorrupt,
    NotUncertain,
    NotWaitingForApproval,
    RunClosed,
    RunNotFound,
)
from cuaderno.events import StepEvent
from cuaderno.journal._claims import state_of
from cuaderno.journal.base import SupportsClaims
from cuaderno.journal.sqlite import SqliteCheckpointer
from cuaderno.ui import _timeline
from cuaderno.ui._index import RunIndex
from cuaderno.ui._journal import journal_path, open_journal

__all__ = ["LOOPBACK_HOSTS", "STATUSES", "create_app", "journal_path"]

STATUSES: Final = ("running", "suspended", "completed", "failed", "cancelled", "needs_human")
LOOPBACK_HOSTS: Final = ("127.0.0.1", "localhost", "::1", "[::1]")
PAGE_SIZE: Final = 50
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
    def __init__(self, store: SqliteCheckpointer, *, allow_decisions: bool, page_size: int) -> None:
        self.store = store
        self.index = RunIndex(store.path)
        self.allow_decisions = allow_decisions
        self.page_size = page_size
        self.csrf = secrets.token_urlsafe(32)
        self.flash = _Flash()
        self.templates = _templates()

    def page(self, request: Request, name: str, code: int = 200, **context: Any) -> Response:
        context.update(allow_decisions=self.allow_decisions, csrf=self.csrf, journal=self.store.path)
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
        holders = _holders(self.store, run_ids)
        rows: list[dict[str, Any]] = []
        for run_id in run_ids:
            try:
                cp = self.store.checkpoint(run_id)
            except JournalCorrupt as exc:  # one damaged summary does not hide the other runs
                rows.append({"run_id": run_id, "damaged": str(exc)})
                continue
            if cp is None:  # removed between the two reads
                continue
            summary = render.run_summary(cp)
            rows.append({"run_id": run_id, "damaged": None, "cp": cp, "start": starts.get(run_id), "cost": render.cost_text(cp, short=True),
                         "state": _now(cp, holders.get(run_id)),
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
        every = request.query_params.get("steps") == "all"
        timeline = _timeline.build(events, last=None if every else _timeline.STEPS_SHOWN)
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
                         state=_now(cp, _holders(self.store, [run_id]).get(run_id)),
                         task=start.payload.get("task") if start is not None else None,
                         forked=_forked_from(start),
                         started=start.created_at if start is not None else None,
                         groups=_counter_groups(cp), cost=render.cost_text(cp, short=False),
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
        return self.page(request, "event.html", cp_run=run_id, ev=ev, payload=render.dumps(ev.payload, indent=2))

    # -- deciding -----------------------------------------------------------------------------------

    async def form(self, request: Request) -> dict[str, str]:
        """The POSTed form, after the CSRF checks; every field a string."""
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            raise _Refusal(403, "Refused", f"the request came from another site ({site}); nothing was written")
        origin = request.headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
            raise _Refusal(403, "Refused", "the request came from another origin; nothing was written")
        try:
            raw = await request.form(max_files=0, max_fields=20, max_part_size=1024 * 1024)
        except Exception as exc:  # a malformed body: starlette raises its own errors for it
            raise _Refusal(400, "Bad form", f"the form could not be read ({type(exc).__name__}); nothing was written") \
                from exc
        fields = {k: v for k, v in raw.items() if isinstance(v, str)}
        request.state.run_id = fields.get("run")
        token = fields.get("csrf", "")
        if not secrets.compare_digest(token.encode(), self.csrf.encode()):
            raise _Refusal(403, "Refused", "the form carries no valid CSRF token (it was not sent by this page, or "
                           "the server was restarted since the page was loaded): reload the page; nothing was written")
        return fields

    async def decide(self, request: Request, approved: bool) -> Response:
        fields = await self.form(request)
        run_id, step = _required(fields, "run"), _required(fields, "step")
        by = _required(fields, "by", "your name (who decides, for the record)")
        fingerprint = _required(fields, "fingerprint")
        reason = fields.get("reason") or None
        decide = harness.approve if approved else harness.deny
        event = await run_in_threadpool(_refusing, decide, self.store, run_id, step, fingerprint=fingerprint,
                                        approver=by, reason=reason)
        verb = "approved" if approved else "rejected"
        return self.done(run_id, f"{event.step_id} {verb} by {by}: journaled at seq {event.seq}. The next resume "
                         "of the run acts on it.")

    async def resolve(self, request: Request) -> Response:
        fields = await self.form(request)
        run_id, step = _required(fields, "run"), _required(fields, "step")
        by = _required(fields, "by", "your name (who checked, for the record)")
        happened = {"happened": True, "not_happened": False}.get(fields.get("happened", ""))
        if happened is None:
            raise _Refusal(400, "Bad form", "say whether the effect happened or not; nothing was written")
        receipt = _receipt(fields.get("receipt", ""), happened)
        event = await run_in_threadpool(_refusing, harness.resolve, self.store, run_id, step, happened=happened,
                                        result=receipt, by=by, note=fields.get("note") or None)
        said = "happened" if happened else "did not happen"
        return self.done(run_id, f"{step} recorded as {said} by {by} (seq {event.seq}).")

    async def cancel(self, request: Request) -> Response:
        fields = await self.form(request)
        run_id = _required(fields, "run")
        by = _required(fields, "by", "your name (who cancels, for the record)")
        cp = await run_in_threadpool(_refusing, cancel_run, self.store, run_id, fields.get("reason", ""), by=by)
        if cp.status == "cancelled":
            message = f"run cancelled by {by}."
        else:
            message = (f"cancellation requested by {by}: the process running it stops before its next step "
                       "(or its next resume finalizes it).")
        return self.done(run_id, message)

    def done(self, run_id: str, message: str) -> Response:
        token = self.flash.put(message)
        return RedirectResponse("/run?" + urlencode({"id": run_id, "flash": token}), status_code=303)


def _forked_from(start: StepEvent | None) -> dict[str, Any] | None:
    """Where a fork came from (``cuaderno fork`` records it in the run's start), if it is one."""
    origin = start.payload.get("forked_from") if start is not None else None
    return origin if isinstance(origin, dict) and isinstance(origin.get("run_id"), str) else None


def _counter_groups(cp: Checkpoint) -> list[tuple[str, list[tuple[str, int]]]]:
    groups = [(group, [(label, cp.count(name)) for name, label in names]) for group, names in render._GROUPS]
    others = [(name, n) for name, n in sorted(cp.counters.items()) if name not in render._GROUPED]
    return groups + ([("other", others)] if others else [])


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
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Refusal(400, "Bad form", f"the receipt is not JSON ({exc}); nothing was written") from None
    except RecursionError:
        raise _Refusal(400, "Bad form", f"the receipt nests more than {MAX_DEPTH} levels; nothing was written") \
            from None
    except ValueError:
        raise _Refusal(400, "Bad form", "the receipt holds an integer too long to read; nothing was written") from None


def _verified(store: SqliteCheckpointer, run_id: str) -> tuple[Checkpoint, list[StepEvent]]:
    found: tuple[Checkpoint, list[StepEvent]] = _refusing(verified, store, run_id)
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


def _handler(ui: _UI, fn: Callable[[Request], Any]) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            result = fn(request)
            if isinstance(result, Response):
                return result
            response: Response = await result
            return response
        except _Refusal as exc:
            return ui.refused(request, exc)
        except (CuadernoError, sqlite3.Error) as exc:  # a read outside _refusing (the list, its index)
            return ui.refused(request, _refusal(exc))
    return endpoint


def _sync_handler(ui: _UI, fn: Callable[[Request], Response]) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            response: Response = await run_in_threadpool(fn, request)
            return response
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
               allowed_hosts: Sequence[str] = LOOPBACK_HOSTS, page_size: int = PAGE_SIZE) -> Starlette:
    """The web app for one journal.

    Args:
        journal: a path or ``sqlite:///path``; the file must exist (it is never created).
        allow_decisions: add the routes that approve, deny, resolve and cancel. Without it the
            journal is opened read-only and the app has no route that writes.
        allowed_hosts: the ``Host`` names requests may carry (the names the server is reached by).
        page_size: runs per page of the list.

    Raises:
        UsageError, JournalError: the journal cannot be opened (nothing was created or written).
    """
    store = open_journal(journal, readonly=not allow_decisions)
    try:
        ui = _UI(store, allow_decisions=allow_decisions, page_size=page_size)
    except BaseException:
        store.close()
        raise
    routes: list[BaseRoute] = [
        Route("/", _sync_handler(ui, ui.runs), methods=["GET"]),
        Route("/run", _sync_handler(ui, ui.run), methods=["GET"]),
        Route("/run/event", _sync_handler(ui, ui.event), methods=["GET"]),
        Route("/favicon.ico", lambda request: Response(status_code=204), methods=["GET"]),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
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
                                Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))])
    return app


def _holders(store: Any, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Who holds each run now. The stored status says ``running`` for a run whose process died or
    that waits for a worker after an approval; the page says ``running`` only while a live process
    holds the run (the same rule as ``cuaderno status``). A store that cannot tell names nobody."""
    if not run_ids or not isinstance(store, SupportsClaims):
        return {}
    return dict(store.holders(list(run_ids)))


def _now(cp: Checkpoint, holder: dict[str, Any] | None) -> dict[str, Any]:
    """:func:`state_of` plus ``shown``, the badge: the stored status, except that a stored
    ``running`` becomes ``waiting`` while no live process holds the run."""
    state = state_of(cp, holder)
    return {**state, "shown": state["state"] if cp.status == "running" else cp.status}
