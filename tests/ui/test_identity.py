"""R27 ``operator_identity``: who may decide on the operator's page, and under what name.

DNS rebinding (Host and Origin both foreign) on a non-loopback bind, cross-site forms, a foreign
Referer without Origin, approvals without a login: all refused, the journal byte-identical. The
approver recorded is the authenticated identity (a login from a credentials file, or a trusted
proxy's header from the proxy's address only), never a typed field. Also: a journal deleted or
replaced under the open page is said, and nothing is written to it.
"""

from __future__ import annotations

import html
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from test_cli_ui import cli, refused

from cuaderno import SqliteCheckpointer, StepEvent
from cuaderno.cli._ui import allowed_hosts
from cuaderno.errors import UsageError
from cuaderno.ui.app import create_app
from cuaderno.ui.auth import COOKIE, Auth, CredentialsFile, set_password

APPROVAL = "t0001.tool00.approval"
OPS = "ops.example.com"


def events(db: Path, run_id: str) -> list[StepEvent]:
    with SqliteCheckpointer(db) as store:
        return store.load(run_id)


def journal_bytes(db: Path) -> tuple[bytes, ...]:
    """The journal's files as they are (a refusal must leave every one unchanged)."""
    return tuple(p.read_bytes() if p.exists() else b"" for p in (db, db.with_name(db.name + "-wal")))


def hidden_fields(page: str, action: str = "/approve") -> dict[str, str]:
    start = page.index(f'action="{action}"')
    chunk = page[start:page.index("</form>", start)]
    return {m[0]: html.unescape(m[1]) for m in re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', chunk)}


@pytest.fixture(scope="module")
def users(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "users"
    set_password(path, "ana", "correct horse")
    set_password(path, "bo", "battery staple")
    return path


def login_app(db: Path, users: Path, **kwargs: Any) -> Any:
    """Decisions allowed, beyond loopback, reached as ops.example.com, with a login."""
    return create_app(db, allow_decisions=True, allowed_hosts=allowed_hosts("0.0.0.0", [OPS]),
                      auth=Auth(credentials=CredentialsFile(users)), public=True, **kwargs)


@pytest.fixture
def ops(db: Path, users: Path) -> Iterator[TestClient]:
    """A browser on http://ops.example.com:8765, not logged in yet."""
    with TestClient(login_app(db, users), base_url=f"http://{OPS}:8765",
                    headers={"origin": f"http://{OPS}:8765"}) as client:
        yield client


def log_in(client: TestClient, user: str = "ana", password: str = "correct horse") -> Any:
    form = hidden_fields(client.get("/login").text, "/login")
    return client.post("/login", data={**form, "user": user, "password": password}, follow_redirects=False)


# -- the host and the origin ---------------------------------------------------------------------------


def test_dns_rebinding_on_a_non_loopback_bind_is_refused(ops: TestClient, db: Path) -> None:
    assert log_in(ops).status_code == 303
    fields = hidden_fields(ops.get("/run", params={"id": "pay-1"}).text)
    before = journal_bytes(db)
    # evil.example now resolves to the server: the browser sends evil's name as Host and Origin.
    evil = {"host": "evil.example:8765", "origin": "http://evil.example:8765"}
    assert ops.get("/run", params={"id": "pay-1"}, headers=evil).status_code == 400  # no token to read
    reply = ops.post("/approve", data={**fields, "reason": "rebound"}, headers=evil, follow_redirects=False)
    assert reply.status_code == 400
    assert journal_bytes(db) == before
    # The page's own name still works.
    assert ops.post("/approve", data=fields, follow_redirects=False).status_code == 303


def test_a_server_never_answers_to_any_name(db: Path) -> None:
    with pytest.raises(UsageError, match="explicit list"):
        create_app(db, allowed_hosts=["*"])
    with pytest.raises(UsageError, match="--allowed-host"):
        allowed_hosts("0.0.0.0")
    refused(cli("--db", str(db), "ui", "--host", "0.0.0.0", "--port", "0"), "--allowed-host")


@pytest.mark.parametrize(("headers", "why"), [
    ({"origin": "http://evil.example"}, "another origin"),
    ({"origin": f"http://{OPS}:9999"}, "another origin"),  # another port of the same name is another site
    ({"origin": "null"}, "another origin"),
    ({"origin": f"http://{OPS}:8765", "sec-fetch-site": "cross-site"}, "another site"),
    ({"origin": "", "referer": "http://evil.example/page"}, "another referring page"),
    ({"origin": "", "referer": f"http://{OPS}.evil.example:8765/run"}, "another referring page"),
    ({"origin": ""}, "neither its Origin nor its Referer"),
])
def test_a_cross_site_form_is_refused(ops: TestClient, db: Path, headers: dict[str, str], why: str) -> None:
    assert log_in(ops).status_code == 303
    fields = hidden_fields(ops.get("/run", params={"id": "pay-1"}).text)
    before = journal_bytes(db)
    sent = {k: v for k, v in headers.items() if v}
    if headers.get("origin") == "":  # the client's default Origin is removed: a request without one
        ops.headers.pop("origin")
    reply = ops.post("/approve", data=fields, headers=sent, follow_redirects=False)
    assert reply.status_code == 403 and why in reply.text and "nothing was written" in reply.text
    assert journal_bytes(db) == before


def test_a_same_page_referer_without_origin_is_accepted(ops: TestClient, db: Path) -> None:
    assert log_in(ops).status_code == 303
    fields = hidden_fields(ops.get("/run", params={"id": "pay-1"}).text)
    ops.headers.pop("origin")
    reply = ops.post("/approve", data=fields, headers={"referer": f"http://{OPS}:8765/run?id=pay-1"},
                     follow_redirects=False)
    assert reply.status_code == 303 and events(db, "pay-1")[-1].decision == "approved"


# -- logging in -----------------------------------------------------------------------------------------


def test_decisions_beyond_loopback_need_an_authentication(db: Path) -> None:
    before = journal_bytes(db)
    with pytest.raises(UsageError, match="need an identity"):
        create_app(db, allow_decisions=True, allowed_hosts=[OPS], public=True)
    result = cli("--db", str(db), "ui", "--host", "192.0.2.1", "--port", "0", "--allow-decisions")
    refused(result, "need an identity")
    assert "warning" not in result.stderr  # refused before anything would listen
    assert journal_bytes(db) == before


def test_approvals_without_a_login_are_refused(ops: TestClient, db: Path, users: Path) -> None:
    before = journal_bytes(db)
    reply = ops.get("/run", params={"id": "pay-1"}, follow_redirects=False)
    assert reply.status_code == 303 and reply.headers["location"] == "/login?next=%2Frun%3Fid%3Dpay-1"
    assert "pay ana" not in ops.get("/").text  # the login form, not the runs
    # A form copied from a logged-in person's page, sent without their session:
    with TestClient(login_app(db, users), base_url=f"http://{OPS}:8765",
                    headers={"origin": f"http://{OPS}:8765"}) as other:
        assert log_in(other).status_code == 303
        fields = hidden_fields(other.get("/run", params={"id": "pay-1"}).text)
        page_token = fields["csrf"]
    for action in ("/approve", "/deny", "/resolve", "/cancel"):
        reply = ops.post(action, data={**fields, "by": "ana", "happened": "happened"}, follow_redirects=False)
        assert reply.status_code == 401 and "log in first" in reply.text, action
    # Nor does the login page's token (anyone's) open a decision.
    assert log_in(ops, "bo", "battery staple").status_code == 303
    bo_fields = hidden_fields(ops.get("/run", params={"id": "pay-1"}).text)
    assert bo_fields["csrf"] != page_token  # each person's pages carry their own token
    reply = ops.post("/approve", data={**bo_fields, "csrf": page_token}, follow_redirects=False)
    assert reply.status_code == 403
    assert journal_bytes(db) == before


def test_the_approver_recorded_is_the_logged_in_user_not_a_form_field(ops: TestClient, db: Path) -> None:
    assert log_in(ops).status_code == 303
    page = ops.get("/run", params={"id": "pay-1"}).text
    assert 'name="by"' not in page and "signed in as" in page and '<b class="user">ana</b>' in page
    fields = hidden_fields(page)
    reply = ops.post("/approve", data={**fields, "by": "mallory", "approver": "mallory"}, follow_redirects=True)
    assert reply.status_code == 200 and "approved by ana" in reply.text and "mallory" not in reply.text
    decision = events(db, "pay-1")[-1]
    assert (decision.phase, decision.decision, decision.payload["approver"]) == ("decision", "approved", "ana")
    # Resolutions and cancellations too.
    fields = hidden_fields(ops.get("/run", params={"id": "r-uncertain"}).text, "/resolve")
    assert ops.post("/resolve", data={**fields, "happened": "not_happened", "by": "mallory"}).status_code == 200
    fields = hidden_fields(ops.get("/run", params={"id": "pay-2"}).text, "/cancel")
    assert ops.post("/cancel", data={**fields, "by": "mallory"}).status_code == 200
    written = [e for run in ("r-uncertain", "pay-2") for e in events(db, run)]
    assert "mallory" not in repr([e.payload for e in written])
    assert any("ana" in repr(e.payload) for e in events(db, "r-uncertain") if e.phase.startswith("resolution")
               or e.decision == "resolved")


@pytest.mark.parametrize(("user", "password"), [("ana", "wrong"), ("ana", ""), ("nobody", "correct horse"),
                                                ("ana", "correct horse "), ("bo", "correct horse")])
def test_a_wrong_password_is_refused(ops: TestClient, db: Path, user: str, password: str) -> None:
    before = journal_bytes(db)
    reply = log_in(ops, user, password)
    assert reply.status_code == 401 and "Wrong user name or password" in reply.text
    assert COOKIE not in reply.headers.get("set-cookie", "") and COOKIE not in ops.cookies
    assert ops.get("/", follow_redirects=False).status_code == 303  # still not in
    assert journal_bytes(db) == before


def test_wrong_passwords_in_a_row_slow_the_next_tries(db: Path, users: Path) -> None:
    now = [1000.0]
    app = create_app(db, allow_decisions=True, allowed_hosts=[OPS], public=True,
                     auth=Auth(credentials=CredentialsFile(users), clock=lambda: now[0]))
    with TestClient(app, base_url=f"http://{OPS}", headers={"origin": f"http://{OPS}"}) as client:
        for _ in range(5):
            assert log_in(client, "ana", "guess").status_code == 401
        reply = log_in(client)  # the right password, too soon: not even checked
        assert reply.status_code == 429 and "try again in 1 s" in reply.text and COOKIE not in client.cookies
        assert log_in(client, "bo", "battery staple").status_code == 303  # another name is not slowed
        now[0] += 1.01
        assert log_in(client, "ana", "guess").status_code == 401
        now[0] += 1.01
        assert log_in(client).status_code == 429  # the delay doubled: 2 s
        now[0] += 1.0
        assert log_in(client).status_code == 303


@pytest.mark.parametrize(("target", "landing"), [("/run?id=pay-1", "/run?id=pay-1"), ("//evil.example/x", "/"),
                                                 ("http://evil.example/", "/"), ("/\\evil.example", "/")])
def test_the_login_goes_back_to_this_page_only(ops: TestClient, target: str, landing: str) -> None:
    form = hidden_fields(ops.get("/login").text, "/login")
    reply = ops.post("/login", data={**form, "next": target, "user": "ana", "password": "correct horse"},
                     follow_redirects=False)
    assert reply.status_code == 303 and reply.headers["location"] == landing


def test_the_session_cookie_is_signed_http_only_and_strict(ops: TestClient, users: Path) -> None:
    reply = log_in(ops)
    cookie = reply.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    value = ops.cookies[COOKIE]
    ops.cookies.clear()
    body, signature = value.split(".")
    for forged in (f"{body}.{signature[:-2]}AA", f"{body[:-4]}AAAA.{signature}", "ana", ""):
        ops.cookies.set(COOKIE, forged)
        assert ops.get("/", follow_redirects=False).status_code == 303, forged
    ops.cookies.set(COOKIE, value)
    assert ops.get("/", follow_redirects=False).status_code == 200
    # A changed password ends the sessions made with the old one.
    set_password(users, "ana", "a new one")
    try:
        assert ops.get("/", follow_redirects=False).status_code == 303
    finally:
        set_password(users, "ana", "correct horse")


# -- a trusted proxy ------------------------------------------------------------------------------------


def proxy_app(db: Path) -> Any:
    return create_app(db, allow_decisions=True, allowed_hosts=[OPS], public=True,
                      auth=Auth(proxy_header="X-Auth-Request-User", proxies=["127.0.0.1"]))


def test_the_trusted_header_counts_only_from_the_proxy(db: Path) -> None:
    before = journal_bytes(db)
    browser = {"origin": f"http://{OPS}", "x-auth-request-user": "mallory"}
    # Straight to the server, not through the proxy: the header is ignored.
    with TestClient(proxy_app(db), base_url=f"http://{OPS}", headers=browser, client=("10.0.0.9", 4242)) as direct:
        assert direct.get("/").status_code == 401
        reply = direct.post("/approve", data={"run": "pay-1", "step": APPROVAL, "csrf": "x", "by": "mallory"})
        assert reply.status_code == 401 and "did not come through the proxy" in reply.text
    assert journal_bytes(db) == before
    # Through the proxy (its address): the header's user is the approver, the typed one ignored.
    with TestClient(proxy_app(db), base_url=f"http://{OPS}", headers={**browser, "x-auth-request-user": "ana"},
                    client=("127.0.0.1", 4242)) as proxied:
        page = proxied.get("/run", params={"id": "pay-1"}).text
        assert "signed in as" in page and "(by the proxy)" in page and 'name="by"' not in page
        fields = hidden_fields(page)
        assert proxied.post("/approve", data={**fields, "by": "mallory"}, follow_redirects=False).status_code == 303
    decision = events(db, "pay-1")[-1]
    assert (decision.decision, decision.payload["approver"]) == ("approved", "ana")


def test_a_trusted_header_needs_the_proxy_address(db: Path) -> None:
    with pytest.raises(UsageError, match="--trusted-proxy ADDR"):
        Auth(proxy_header="X-Forwarded-User")
    refused(cli("--db", str(db), "ui", "--trusted-proxy-header", "X-Forwarded-User"), "--trusted-proxy ADDR")
    refused(cli("--db", str(db), "ui", "--trusted-proxy-header", "X-Forwarded-User", "--trusted-proxy", "proxy"),
            "not an IP address")


# -- loopback without a login ---------------------------------------------------------------------------


def test_on_loopback_without_a_login_the_page_says_the_typed_name_is_recorded(client: TestClient) -> None:
    page = client.get("/run", params={"id": "pay-1"}).text
    assert 'name="by"' in page and "decisions record the name typed" in page


# -- the credentials file -------------------------------------------------------------------------------


def test_ui_passwd_writes_a_salted_scrypt_hash_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "users"
    assert cli("ui-passwd", str(path), "ana", input="s3cret pass\n").exit_code == 0
    assert cli("ui-passwd", str(path), "bo", input="s3cret pass\n").exit_code == 0
    text = path.read_text()
    assert "s3cret" not in text and stat.S_IMODE(path.stat().st_mode) == 0o600
    entries = dict(line.split(":", 1) for line in text.splitlines() if not line.startswith("#"))
    assert set(entries) == {"ana", "bo"} and entries["ana"].startswith("scrypt$")
    assert entries["ana"] != entries["bo"]  # salted: one password, two hashes
    creds = CredentialsFile(path)
    assert creds.verify("ana", "s3cret pass") and not creds.verify("ana", "s3cret pas")
    before = path.read_bytes()
    refused(cli("ui-passwd", str(path), "bad:name", input="x\n"), "user name")
    refused(cli("ui-passwd", str(path), "carla", input="\n"), "password is empty")
    assert path.read_bytes() == before
    bad = tmp_path / "bad"
    bad.write_text("ana:plaintext\n")
    refused(cli("--db", str(tmp_path / "x.db"), "ui", "--auth-file", str(bad)), "line 1")


# -- the journal under the page -------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_journal_deleted_or_replaced_under_the_page_is_said(client: TestClient, db: Path, how: str) -> None:
    fields = hidden_fields(client.get("/run", params={"id": "pay-1"}).text)
    assert "was deleted" not in client.get("/").text
    before = journal_bytes(db)
    if how == "deleted":  # rm runs.db*
        for path in db.parent.glob(db.name + "*"):
            path.unlink()
    else:  # another journal moved over it (its own -wal folded in first, so the move is whole)
        other = db.with_name("other.db")
        with SqliteCheckpointer(other) as store:
            store.append([StepEvent(run_id="new", step_id="run", phase="start", kind="run", fingerprint="f",
                                    payload={"task": "another journal", "versions": {}})])
        other.replace(db)
        before = journal_bytes(db)
    for page in (client.get("/"), client.get("/run", params={"id": "pay-1"})):
        assert page.status_code == 200 and 'class="banner gone"' in page.text
        assert ("was deleted" if how == "deleted" else "was replaced by another file") in page.text
    reply = client.post("/approve", data={**fields, "by": "ana"}, follow_redirects=False)
    assert reply.status_code == 409 and "Nothing was written" in reply.text
    if how == "replaced":
        assert journal_bytes(db) == before  # the new file got nothing
    else:
        assert not db.exists()  # and no empty journal was made in its place
