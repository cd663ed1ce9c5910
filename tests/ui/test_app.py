"""The web app through Starlette's TestClient: escaping, CSRF, read-only mode, stale decisions, bad ids."""

from __future__ import annotations

import html
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from _runs import HOSTILE_RUN, HOSTILE_TOOL
from starlette.testclient import TestClient

from cuaderno import SqliteCheckpointer, StepEvent
from cuaderno.errors import UsageError
from cuaderno.ui import _timeline
from cuaderno.ui._journal import journal_path
from cuaderno.ui.app import create_app

APPROVAL = "t0001.tool00.approval"


def events(db: Path, run_id: str) -> list[StepEvent]:
    with SqliteCheckpointer(db) as store:
        return store.load(run_id)


def status(db: Path, run_id: str) -> str:
    with SqliteCheckpointer(db) as store:
        cp = store.checkpoint(run_id)
    assert cp is not None
    return cp.status


def form_of(page: str, action: str = "/approve") -> dict[str, str]:
    """The hidden fields of the first form posting to ``action``, as the browser would send them."""
    start = page.index(f'action="{action}"')
    chunk = page[start:page.index("</form>", start)]
    return {m[0]: html.unescape(m[1]) for m in re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', chunk)}


def decide(client: TestClient, run_id: str, action: str = "/approve", **extra: str) -> Any:
    fields = form_of(client.get("/run", params={"id": run_id}).text, "/approve")
    return client.post(action, data={**fields, "by": "ana", "reason": "ok", **extra}, follow_redirects=False)


# -- escaping -------------------------------------------------------------------------------------------


def test_hostile_text_is_escaped_and_bidi_shown_as_escapes(client: TestClient) -> None:
    for page in (client.get("/run", params={"id": "r-hostile"}).text, client.get("/").text,
                 client.get("/run", params={"id": HOSTILE_RUN}).text):
        assert "<script>" not in page and "<img" not in page and "<b>bold" not in page
        # Bidi overrides and isolates are shown as escapes, never given to the browser to apply.
        for ch in ("\u202e", "\u200f", "\u2066"):
            assert ch not in page
    page = client.get("/run", params={"id": "r-hostile"}).text
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;\\u202egnp.exe\\u200f" in page
    assert "&lt;/pre&gt;&lt;script&gt;window.__pwned=3" in page  # the arguments, inside their <pre>
    assert "<script" not in client.get("/").text.lower()


def test_hostile_run_id_is_sent_back_exactly_and_can_be_decided(client: TestClient, db: Path) -> None:
    page = client.get("/run", params={"id": HOSTILE_RUN}).text
    fields = form_of(page)
    assert fields["run"] == HOSTILE_RUN and fields["step"] == "t0000.tool00.approval"
    reply = client.post("/deny", data={**fields, "by": "ana"}, follow_redirects=True)
    assert reply.status_code == 200 and "rejected by ana" in reply.text
    decision = events(db, HOSTILE_RUN)[-1]
    assert (decision.phase, decision.decision, decision.name) == ("decision", "rejected", HOSTILE_TOOL)


def test_security_headers_forbid_script(client: TestClient) -> None:
    headers = client.get("/").headers
    assert "default-src 'none'" in headers["content-security-policy"]
    assert "script-src" not in headers["content-security-policy"]  # so no script at all
    assert headers["x-frame-options"] == "DENY"


def test_a_foreign_host_header_is_refused(client: TestClient) -> None:
    # A page of another site whose name was rebound to 127.0.0.1 arrives with its own Host.
    assert client.get("/", headers={"host": "evil.example"}).status_code == 400


# -- CSRF and read-only -----------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["no token", "wrong token", "other origin", "cross-site fetch"])
def test_decisions_without_a_valid_csrf_token_are_refused(client: TestClient, db: Path, case: str) -> None:
    before = [e.row_hash for e in events(db, "pay-1")]
    fields = form_of(client.get("/run", params={"id": "pay-1"}).text)
    headers: dict[str, str] = {}
    if case == "no token":
        del fields["csrf"]
    elif case == "wrong token":
        fields["csrf"] = fields["csrf"][:-1] + ("A" if fields["csrf"][-1] != "A" else "B")
    elif case == "other origin":
        headers["origin"] = "http://evil.example"
    else:
        headers["sec-fetch-site"] = "cross-site"
    reply = client.post("/approve", data={**fields, "by": "ana"}, headers=headers, follow_redirects=False)
    assert reply.status_code == 403 and "nothing was written" in reply.text
    assert [e.row_hash for e in events(db, "pay-1")] == before


def test_read_only_mode_has_no_decision_endpoint_and_never_writes(db: Path) -> None:
    before = db.read_bytes()
    with TestClient(create_app(db, allowed_hosts=["testserver"])) as client:
        page = client.get("/run", params={"id": "pay-1"}).text
        assert "<form" not in page and "read-only" in page and "--allow-decisions" in page
        for action in ("/approve", "/deny", "/resolve", "/cancel"):
            reply = client.post(action, data={"run": "pay-1", "step": APPROVAL, "by": "x"})
            assert reply.status_code in (404, 405), action
        assert client.get("/").status_code == 200
    # The file is as it was, and nothing waits in a write-ahead log (a reader's -shm index is SQLite's own).
    assert db.read_bytes() == before
    wal = db.with_name("runs.db-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    assert status(db, "pay-1") == "suspended"


# -- deciding -------------------------------------------------------------------------------------------


def test_approve_binds_the_arguments_shown_and_records_who(client: TestClient, db: Path) -> None:
    page = client.get("/run", params={"id": "pay-1"}).text
    assert "&#34;amount&#34;: 100" in page and "&#34;to&#34;: &#34;ana&#34;" in page
    reply = decide(client, "pay-1")
    assert reply.status_code == 303
    shown = client.get(reply.headers["location"]).text
    assert f"{APPROVAL} approved by ana" in shown
    decision = events(db, "pay-1")[-1]
    assert decision.decision == "approved" and decision.payload["approver"] == "ana"
    assert decision.payload["reason"] == "ok"
    # The message is shown once: the same address reloaded does not say it again.
    assert "approved by ana" not in client.get(reply.headers["location"]).text


def test_a_stale_page_is_refused_and_nothing_is_written_twice(client: TestClient, db: Path) -> None:
    fields = form_of(client.get("/run", params={"id": "pay-1"}).text)
    first = client.post("/approve", data={**fields, "by": "ana"}, follow_redirects=False)
    assert first.status_code == 303
    n = len(events(db, "pay-1"))
    # The same page submitted again (a double click), and a second person's deny from the old page.
    for action in ("/approve", "/deny"):
        again = client.post(action, data={**fields, "by": "bea"}, follow_redirects=False)
        assert again.status_code == 409 and "out of date" in again.text, again.text
        assert '<a href="/run?id=pay-1">Reload the run</a>' in again.text
    assert len(events(db, "pay-1")) == n


def test_arguments_changed_since_the_page_was_shown_are_refused(client: TestClient, db: Path) -> None:
    fields = form_of(client.get("/run", params={"id": "pay-2"}).text)
    fields["fingerprint"] = "0" * len(fields["fingerprint"])  # the call waiting now has other arguments
    reply = client.post("/approve", data={**fields, "by": "ana"}, follow_redirects=False)
    assert reply.status_code == 409 and "out of date" in reply.text and "the decision names arguments" in reply.text
    assert status(db, "pay-2") == "suspended" and events(db, "pay-2")[-1].phase == "request"


@pytest.mark.parametrize("missing", ["by", "fingerprint", "run", "step"])
def test_a_decision_missing_a_field_is_refused(client: TestClient, db: Path, missing: str) -> None:
    fields = {**form_of(client.get("/run", params={"id": "pay-1"}).text), "by": "ana"}
    del fields[missing]
    reply = client.post("/approve", data=fields, follow_redirects=False)
    assert reply.status_code == 400 and "nothing was written" in reply.text
    assert status(db, "pay-1") == "suspended"


def test_resolve_an_uncertain_effect(client: TestClient, db: Path) -> None:
    page = client.get("/run", params={"id": "r-uncertain"}).text
    assert "eff-123" in page and "timeout after sending" in page
    fields = form_of(page, "/resolve")
    bad = client.post("/resolve", data={**fields, "by": "ana", "happened": "not_happened", "receipt": '{"id": 1}'})
    assert bad.status_code == 400 and "only with" in bad.text
    bad = client.post("/resolve", data={**fields, "by": "ana", "happened": "happened", "receipt": "{nope"})
    assert bad.status_code == 400 and "not JSON" in bad.text
    assert status(db, "r-uncertain") == "needs_human"
    ok = client.post("/resolve", data={**fields, "by": "ana", "happened": "happened", "receipt": '{"id": "rcpt-9"}'},
                     follow_redirects=False)
    assert ok.status_code == 303 and status(db, "r-uncertain") == "running"
    settled = events(db, "r-uncertain")[-1]
    assert settled.decision == "resolved" and settled.payload["value"] == {"id": "rcpt-9"}
    assert settled.payload["resolved"]["by"] == "ana"


def test_cancel_a_waiting_run(client: TestClient, db: Path) -> None:
    fields = form_of(client.get("/run", params={"id": "pay-2"}).text, "/cancel")
    reply = client.post("/cancel", data={**fields, "by": "ana", "reason": "wrong payee"}, follow_redirects=True)
    assert reply.status_code == 200 and "run cancelled by ana" in reply.text
    assert status(db, "pay-2") == "cancelled"
    # Ended: nothing to decide or cancel any more.
    assert 'action="/approve"' not in reply.text and 'action="/cancel"' not in reply.text


# -- reading ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("query", "code"), [
    ({}, 400), ({"id": ""}, 400), ({"id": "nope"}, 404), ({"id": "a\x00b"}, 404), ({"id": "x" * 5000}, 404),
    ("%ED%B3%BF", 404), ("%FF%FE", 404),
])
def test_bad_run_ids_get_a_clear_page(client: TestClient, query: dict[str, str] | str, code: int) -> None:
    reply = client.get("/run?id=" + query) if isinstance(query, str) else client.get("/run", params=query)
    assert reply.status_code == code
    assert "refusal" in reply.text and "Traceback" not in reply.text


@pytest.mark.parametrize(("seq", "code"), [("0", 400), ("-1", 400), ("x", 400), ("99999", 404), ("9" * 40, 400)])
def test_bad_event_numbers(client: TestClient, seq: str, code: int) -> None:
    assert client.get("/run/event", params={"id": "pay-1", "seq": seq}).status_code == code


def test_unpriced_is_never_zero_and_long_payloads_are_cut_with_a_link(client: TestClient) -> None:
    row = next(r for r in client.get("/").text.split("<tr>") if "r-unpriced" in r)
    assert "unpriced: 1" in row and "$0" not in row
    page = client.get("/run", params={"id": "r-unpriced"}).text
    assert "unknown, unpriced: 1 call(s) carried no price (this is not $0)" in page
    link = re.search(r'href="(/run/event\?id=r-unpriced&amp;seq=3)"', page)
    assert link is not None and "x" * 9000 not in page
    whole = client.get(html.unescape(link.group(1))).text
    assert "x" * 9000 in whole


def test_run_page_draws_every_step_with_cost_and_details(client: TestClient, db: Path) -> None:
    page = client.get("/run", params={"id": "pay-1"}).text
    steps = {e.step_id for e in events(db, "pay-1")}
    assert page.count('<rect class="bar') == len(steps) and page.count('<details id="s') == len(steps)
    assert "$0.002100" in page and "$0.003400" in page  # cost per model step
    assert "waiting for a person" in page
    effect_key = next(e.payload["effect_key"] for e in events(db, "pay-1") if e.payload.get("effect_key"))
    assert effect_key in page and "request fingerprint" in page


def test_the_list_pages_filters_and_refuses_unknown_statuses(tmp_path: Path) -> None:
    db = tmp_path / "many.db"
    with SqliteCheckpointer(db) as store:
        for i in range(120):
            store.append([StepEvent(run_id=f"r{i:04d}", step_id="run", phase="start", kind="run", fingerprint="f",
                                    payload={"task": f"task {i}", "versions": {}})])
            if i % 3 == 0:
                store.append([StepEvent(run_id=f"r{i:04d}", step_id="final", phase="result", kind="final",
                                        payload={"output": "ok"})])
    with TestClient(create_app(db, allowed_hosts=["testserver"], page_size=50)) as client:
        seen: list[str] = []
        for page in (1, 2, 3):
            text = client.get("/", params={"page": str(page)}).text
            seen += re.findall(r'href="/run\?id=(r\d{4})"', text)
        assert len(seen) == 120 and len(set(seen)) == 120
        assert seen[:2] == ["r0119", "r0118"]  # most recently updated first
        done = re.findall(r'href="/run\?id=(r\d{4})"', client.get("/", params={"status": "completed"}).text)
        assert len(done) == 40 and all(int(r[1:]) % 3 == 0 for r in done)
        assert "task 119" in client.get("/").text
        # Ordered by start: r0000 was updated last (its final came after everything), yet started first.
        with SqliteCheckpointer(db) as store:
            store.append([StepEvent(run_id="r0000", step_id="run", phase="counters", kind="run",
                                    payload={"counters": {"retries": 0}})])
        assert re.findall(r'href="/run\?id=(r\d{4})"', client.get("/").text)[0] == "r0000"
        by_start = client.get("/", params={"order": "started", "page": "3"}).text
        assert re.findall(r'href="/run\?id=(r\d{4})"', by_start)[-1] == "r0000"
        assert 'href="/?page=2&amp;order=started"' in by_start  # the order is kept page to page
        assert client.get("/", params={"order": "sideways"}).status_code == 400
        assert client.get("/", params={"status": "bogus"}).status_code == 400
        assert client.get("/", params={"page": "0"}).status_code == 400


def test_timeline_marks_resends_escalations_rejections_and_denials() -> None:
    def ev(seq: int, step: str, phase: str, kind: str, t: float, **kw: Any) -> StepEvent:
        return StepEvent(run_id="r", step_id=step, phase=phase, kind=kind, seq=seq, created_at=t, **kw)

    timeline = _timeline.build([
        ev(1, "run", "start", "run", 100.0),
        ev(2, "t0000.model", "intent", "model", 100.0),
        ev(3, "t0000.model", "intent.2", "model", 101.0),
        ev(4, "t0000.model", "result", "model", 104.0, payload={
            "response": {"cost": 0.5, "escalations": [{"cost": None}]}, "counters": {"rejected_responses": 1}}),
        ev(5, "t0000.tool00", "decision", "tool", 104.0, name="rm", decision="deny"),
        ev(6, "t0000.tool00", "result", "tool", 104.0, name="rm", payload={"outcome": "denied"}),
    ])
    model = timeline.steps[1]
    labels = {m.label for m in model.markers}
    assert {"re-sent ×1", "escalated ×1", "rejected response ×1"} <= labels
    assert model.cost_text == "$0.500000 + 1 unpriced"
    assert model.width == pytest.approx((timeline.axis_x1 - timeline.axis_x0) * 4 / 4)
    assert any(m.css == "denied" for m in timeline.steps[2].markers)


def test_journal_urls() -> None:
    assert journal_path("runs.db") == Path("runs.db")
    assert journal_path("sqlite:///runs.db") == Path("runs.db")
    assert journal_path("sqlite:////tmp/runs.db") == Path("/tmp/runs.db")
    for bad in ("postgresql://localhost/test", "sqlite://", "sqlite:///", ""):
        with pytest.raises(UsageError):
            journal_path(bad)


def test_a_long_run_is_paged_never_drawn_whole(client: TestClient, db: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_timeline, "STEPS_SHOWN", 3)
    order = list(dict.fromkeys(e.step_id for e in events(db, "pay-1")))
    steps = len(order)
    assert steps > 3
    page = client.get("/run", params={"id": "pay-1"}).text
    assert page.count('<rect class="bar') == 3 and f"of {steps} are drawn" in page
    assert "t0001.tool00.approval" in page and 'id="s0"' not in page  # the last ones, not the first
    assert "later steps" not in page and "earlier steps" in page
    # The old "show all" link opens the first page, with the way on; no page draws more than 3.
    first = client.get("/run", params={"id": "pay-1", "steps": "all"}).text
    assert first.count('<rect class="bar') == 3 and 'id="s0"' in first and "earlier steps" not in first
    seen: list[str] = []
    start: str | None = "1"
    while start is not None:
        page = client.get("/run", params={"id": "pay-1", "from": start}).text
        assert page.count('<rect class="bar') <= 3
        seen += re.findall(r'<details id="s\d+" class="step">\s*<summary>\s*<span class="mono">([^<]+)</span>', page)
        found = re.search(r'rel="next" href="/run\?id=pay-1&amp;from=(\d+)"', page)
        start = found.group(1) if found else None
    assert seen == order  # every step, once, in order, page by page
    assert client.get("/run", params={"id": "pay-1", "from": "0"}).status_code == 400
    monkeypatch.setattr(_timeline, "INLINE_EVENTS", 2)  # past it, payloads are links
    page = client.get("/run", params={"id": "pay-1"}).text
    assert '<pre class="payload">' not in page.split('<section class="steps">')[1].split("</section>")[0]
    assert "payloads are one click away" in page


def test_a_hostile_step_id_in_a_decision_is_refused_and_shown_escaped(client: TestClient, db: Path) -> None:
    fields = form_of(client.get("/run", params={"id": "pay-1"}).text)
    reply = client.post("/approve", data={**fields, "step": "<script>x</script>\u202e", "by": "ana"})
    assert reply.status_code == 409 and "&lt;script&gt;x&lt;/script&gt;" in reply.text
    assert "<script>" not in reply.text and "\u202e" not in reply.text
    assert status(db, "pay-1") == "suspended"


def test_a_journal_gone_under_the_server_is_a_page_not_a_traceback(db: Path) -> None:
    with TestClient(create_app(db, allowed_hosts=["testserver"]), raise_server_exceptions=False) as client:
        app_state = client.get("/")
        assert app_state.status_code == 200
        with sqlite3.connect(db) as raw:
            raw.execute("DROP TABLE cuaderno_runs")
        for reply in (client.get("/"), client.get("/run", params={"id": "pay-1"})):
            assert reply.status_code == 500 and "refusal" in reply.text and "Traceback" not in reply.text


def test_an_approved_run_nobody_drives_is_shown_waiting_for_a_worker_never_running(client: TestClient, db: Path) -> None:
    assert decide(client, "pay-1").status_code == 303
    assert status(db, "pay-1") == "running"  # what the journal stores after a decision
    page = client.get("/run", params={"id": "pay-1"}).text
    assert '<span class="status st-waiting">waiting</span>' in page and "waiting for a worker" in page
    assert "st-running" not in page
    listing = client.get("/").text
    row = listing[listing.index('id=pay-1"'):]
    row = row[:row.index("</tr>")]
    assert ">waiting</span>" in row and "waiting for a worker" in row and "running" not in row
    # A run waiting for its approval keeps its stored status, with what it waits for.
    page = client.get("/run", params={"id": "pay-2"}).text
    assert '<span class="status st-suspended">suspended</span>' in page and "waits for approval of" in page


def test_run_pages_are_built_at_most_heavy_at_once(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run page reads its whole run; more requests than the limit wait their turn. Every
    reader waits (up to a second) for one more to come in: without the limit all four would be
    inside together; with it, never more than HEAVY_AT_ONCE."""
    import threading

    from cuaderno.ui import app as ui_app

    inside, most = [0], [0]
    lock = threading.Condition()
    real = ui_app._verified

    def counting(store: Any, run_id: str) -> Any:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            lock.notify_all()
            lock.wait_for(lambda: inside[0] > ui_app.HEAVY_AT_ONCE, timeout=1.0)
        try:
            return real(store, run_id)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(ui_app, "_verified", counting)
    codes: list[int] = []
    readers = [threading.Thread(target=lambda: codes.append(client.get("/run", params={"id": "pay-1"}).status_code))
               for _ in range(4)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    assert codes == [200] * 4 and most[0] == ui_app.HEAVY_AT_ONCE
