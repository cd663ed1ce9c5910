"""The page in a real browser: Debian's Chromium driven by Playwright, against ``cuaderno ui``
served by uvicorn on 127.0.0.1 (a subprocess, as a person starts it).

Under CI (``CI=true``) these tests never skip: a missing Chromium or Playwright fails them.
Screenshots go to ``$CUADERNO_ARTIFACTS`` (default ``tests/ui/artifacts/``, ignored by git).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _runs import HOSTILE_TOOL, run_agent

from cuaderno import SqliteCheckpointer

pytestmark = pytest.mark.xdist_group("browser")  # one Chromium at a time on a 2-core machine

ARTIFACTS = Path(os.environ.get("CUADERNO_ARTIFACTS") or Path(__file__).resolve().parent / "artifacts")
IN_CI = os.environ.get("CI", "").lower() == "true"


def _unavailable(why: str) -> None:
    if IN_CI:
        pytest.fail(f"browser tests must run in CI: {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = shutil.which("chromium")
    if chromium is None:
        _unavailable("Debian's chromium is not installed (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install playwright)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


def serve(db: Path, *options: str) -> Iterator[str]:
    """``cuaderno ui --allow-decisions OPTIONS`` on a free port of 127.0.0.1; its base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "cuaderno", "--db", str(db), "ui", "--port", "0",
                             "--allow-decisions", *options], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # printed once the socket listens
        match = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert match, f"the server did not start: {line}{proc.stderr.read() if proc.poll() is not None else ''}"
        yield match.group(0).rstrip("/")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.fixture
def server(db: Path) -> Iterator[str]:
    """``cuaderno ui --allow-decisions`` on a free port of 127.0.0.1; its base URL."""
    yield from serve(db)


@pytest.fixture
def login_server(db: Path, tmp_path: Path) -> Iterator[str]:
    """The same with a login: user ana, password "correct horse"."""
    from cuaderno.ui.auth import set_password

    users = tmp_path / "users"
    set_password(users, "ana", "correct horse")
    yield from serve(db, "--auth-file", str(users))


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    p = context.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda exc: errors.append(str(exc)))
    p.on("dialog", lambda dialog: errors.append(f"dialog: {dialog.message}"))
    yield p
    context.close()
    assert errors == []  # no script ran, so none failed and none opened a dialog


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def open_run(page: Any, server: str, run_id: str) -> None:
    page.goto(server + "/")
    page.get_by_role("link", name=run_id, exact=True).click()
    page.wait_for_selector("h1 .id")
    assert page.inner_text("h1 .id") == run_id


def decide(page: Any, button: str, who: str, reason: str = "") -> None:
    form = page.locator("form.decide").first
    form.locator("input[name=by]").fill(who)
    form.locator("input[name=reason]").fill(reason)
    form.get_by_role("button", name=button).click()
    page.wait_for_load_state()


def test_list_open_approve_and_watch_the_run_continue(page: Any, server: str, db: Path) -> None:
    page.goto(server + "/")
    row = page.locator("tr", has=page.get_by_role("link", name="pay-1", exact=True))
    assert "suspended" in row.inner_text() and "$0.005500" in row.inner_text()
    shot(page, "01-runs")

    open_run(page, server, "pay-1")
    assert page.locator("svg.timeline rect.bar").count() >= 6
    assert '"amount": 100' in page.inner_text("article.approval pre.arguments")
    page.locator("details.step").nth(1).locator("summary").click()  # the first model step opens
    assert "request fingerprint" in page.locator("details.step").nth(1).inner_text()
    shot(page, "02-run-waiting")

    decide(page, "Approve", "ana", "invoice checked")
    assert "approved by ana" in page.inner_text(".flash")
    assert page.locator("form.decide").count() == 0

    # A worker resumes the run (another thread, its own connection); the page shows where it got.
    assert run_agent(db, "pay-1") == "completed"
    page.reload()
    assert page.inner_text("h1 .status") == "completed"
    assert '"output": "Paid."' in page.inner_text("section.outcome")
    with SqliteCheckpointer(db) as store:
        transfers = [e for e in store.load("pay-1") if e.name == "transfer" and e.phase == "result"]
    assert len(transfers) == 1 and transfers[0].payload["value"]["paid"] == 100  # ran once, as approved
    shot(page, "03-run-completed")


def test_deny_then_a_stale_tab_is_refused(page: Any, browser: Any, server: str, db: Path) -> None:
    open_run(page, server, "pay-2")
    other = page.context.new_page()  # the same run open in a second tab, before anyone decides
    other.goto(page.url)

    decide(page, "Deny", "ana", "wrong payee")
    assert "rejected by ana" in page.inner_text(".flash")

    decide(other, "Approve", "bea")  # the old tab still offers the decision
    assert "out of date" in other.inner_text(".refusal")
    assert "already" in other.inner_text(".refusal") or "not waiting" in other.inner_text(".refusal")
    shot(other, "04-stale-approval-refused")
    other.close()

    assert run_agent(db, "pay-2", 250) == "completed"
    page.reload()
    assert "rejected by a person" in page.inner_text("section.steps")
    with SqliteCheckpointer(db) as store:
        decisions = [e for e in store.load("pay-2") if e.phase == "decision" and e.kind == "approval"]
        transfers = [e for e in store.load("pay-2") if e.name == "transfer" and e.phase == "result"]
    assert [d.decision for d in decisions] == ["rejected"]
    assert [t.payload["outcome"] for t in transfers] == ["denied"]  # the transfer never ran


def test_hostile_tool_name_renders_as_text(page: Any, server: str) -> None:
    open_run(page, server, "r-hostile")
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.locator("main script, main img").count() == 0
    shown = page.inner_text("article.approval h3 .tool")
    # The markup is shown as the characters it is; the bidi override as an escape, not applied.
    assert shown == HOSTILE_TOOL.replace("\u202e", "\\u202e").replace("\u200f", "\\u200f")
    assert "</pre><script>window.__pwned=3</script>" in page.inner_text("article.approval pre.arguments")
    shot(page, "05-hostile-run")
    page.goto(server + "/")
    assert page.evaluate("typeof window.__pwned") == "undefined"


def test_log_in_then_approve_records_the_user(page: Any, login_server: str, db: Path) -> None:
    page.goto(login_server + "/run?id=pay-1")
    assert page.url.startswith(login_server + "/login")  # no page before a login
    page.fill("input[name=user]", "ana")
    page.fill("input[name=password]", "wrong")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_load_state()
    assert "Wrong user name or password" in page.inner_text("main")
    page.fill("input[name=user]", "ana")
    page.fill("input[name=password]", "correct horse")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_selector("h1 .id")
    assert page.url == login_server + "/run?id=pay-1" and "signed in as ana" in page.inner_text("header")
    cookie = next(c for c in page.context.cookies() if c["name"] == "cuaderno_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    form = page.locator("form.decide").first
    assert form.locator("input[name=by]").count() == 0  # nobody types who they are
    form.locator("input[name=reason]").fill("checked")
    form.get_by_role("button", name="Approve").click()  # Chromium sends its Origin; the page takes it
    page.wait_for_load_state()
    assert "approved by ana" in page.inner_text(".flash")
    shot(page, "06-approved-after-login")
    with SqliteCheckpointer(db) as store:
        decision = store.load("pay-1")[-1]
    assert (decision.decision, decision.payload["approver"]) == ("approved", "ana")
    page.get_by_role("button", name="Log out").click()
    page.wait_for_load_state()
    page.goto(login_server + "/")
    assert page.url.startswith(login_server + "/login")
