"""``cuaderno ui``: the operator's web page for one journal (see :mod:`cuaderno.ui.app`).

::

    cuaderno ui [--journal PATH|sqlite:///PATH] [--host 127.0.0.1] [--port 8765] [--allow-decisions]
                [--allowed-host NAME]... [--auth-file FILE]
                [--trusted-proxy-header NAME --trusted-proxy ADDR...]
    cuaderno ui-passwd FILE USER      # the password from the terminal, or the first line of stdin

Needs the ``ui`` extra (``pip install 'cuaderno[ui]'``). Read-only unless ``--allow-decisions``;
bound to loopback unless ``--host`` says otherwise, with a warning then. Beyond loopback the page
answers only to the ``--allowed-host`` names, and decisions need ``--auth-file`` or a trusted
proxy header (the approver recorded is the authenticated user).
"""

from __future__ import annotations

import getpass
import ipaddress
import socket
import sys
from pathlib import Path
from typing import Annotated, Any, Final

import typer

from cuaderno.cli._common import fail

__all__ = ["DEFAULT_PORT", "allowed_hosts", "is_loopback", "ui_command", "ui_passwd_command"]

DEFAULT_PORT: Final = 8765
_ANY: Final = frozenset({"0.0.0.0", "::", ""})


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``127.0.0.1``, ``::1``, ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str, named: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The ``Host`` names requests may carry when the server listens on ``host``: the ``named``
    ones, the loopback names, and the address listened on when it is one address (an address
    typed in a browser's bar cannot be rebound; a name can).

    Raises:
        UsageError: listening on every address (``0.0.0.0``, ``::``) without naming a host, or a
            name that is not a host name (``*``, a URL, a port).
    """
    from cuaderno.errors import UsageError
    from cuaderno.ui.app import LOOPBACK_HOSTS

    for name in named:
        bare = name.removeprefix("*.")
        if not bare or "*" in bare or "/" in bare or (":" in bare and not bare.startswith("[")):
            raise UsageError(f"--allowed-host {name[:80]!r}: give a host name as the browser's address bar shows "
                             "it, without scheme or port (ops.example.com, *.example.com, 10.0.0.5)")
    if host in _ANY and not named:
        raise UsageError(f"listening on every address ({host or 'all'}): name the host names the page is reached "
                         "by with --allowed-host NAME (a server that answers to any name answers a "
                         "DNS-rebinding page)")
    extra = set() if host in _ANY else {host}
    return sorted({*LOOPBACK_HOSTS, *extra, *named})


def ui_command(
    ctx: typer.Context,
    journal: Annotated[str | None, typer.Option("--journal", metavar="URL", help=(
        "The run journal: an existing SQLite file, as a path or sqlite:///path (default: --db).")) ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on (loopback unless you say so).")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: any free one).")]
    = DEFAULT_PORT,
    allow_decisions: Annotated[bool, typer.Option(
        "--allow-decisions", help="Let the page approve, deny, resolve and cancel (read-only without it).")] = False,
    allowed_host: Annotated[list[str] | None, typer.Option(
        "--allowed-host", metavar="NAME", help="A host name the page is reached by (repeat for more); "
        "needed to listen on every address. Loopback names are always allowed.")] = None,
    auth_file: Annotated[Path | None, typer.Option(
        "--auth-file", metavar="FILE", help="Log in with the users of this credentials file (written by "
        "cuaderno ui-passwd); decisions record the user.")] = None,
    proxy_header: Annotated[str | None, typer.Option(
        "--trusted-proxy-header", metavar="NAME", help="Take the user from this header of an authenticating "
        "reverse proxy (oauth2-proxy: X-Auth-Request-User or X-Forwarded-User).")] = None,
    trusted_proxy: Annotated[list[str] | None, typer.Option(
        "--trusted-proxy", metavar="ADDR", help="The address (or network) the proxy connects from; the header "
        "is ignored from any other (repeat for more).")] = None,
) -> None:
    """Serve a web page for the journal's runs: list, timeline, approvals, uncertain effects."""
    try:
        import uvicorn

        from cuaderno.ui.app import create_app
    except ImportError as exc:
        fail(f"the web page needs the ui extra: pip install 'cuaderno[ui]' ({exc.name} is missing)")
    from cuaderno.errors import CuadernoError

    source: str | Path = journal if journal is not None else ctx.obj.db
    try:
        auth = _auth(auth_file, proxy_header, trusted_proxy or [])
        app = create_app(source, allow_decisions=allow_decisions, allowed_hosts=allowed_hosts(host, allowed_host or []),
                         auth=auth, public=not is_loopback(host), keys=ctx.obj.keys())
    except CuadernoError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))
    if not is_loopback(host):
        who = "anyone who can reach this address" + (" and log in" if auth is not None else "")
        typer.echo(f"warning: listening on {host}, not loopback: {who} sees every run in the journal"
                   + (" and can decide its approvals" if allow_decisions else ""), err=True)
    try:
        sock = _bind(host, port)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    bound_port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    mode = "decisions allowed" if allow_decisions else "read-only"
    if auth is not None:
        mode += ", login from " + " or ".join(
            ([str(auth_file)] if auth_file is not None else []) + ([f"{proxy_header} of the proxy"] if proxy_header else []))
    typer.echo(f"cuaderno ui: http://{shown}:{bound_port}/ ({mode}); Ctrl-C stops it", err=True)
    # proxy_headers off: the trusted-proxy check needs the peer's own address, never one a
    # client wrote in X-Forwarded-For.
    config: Any = uvicorn.Config(app, log_level="warning", lifespan="on", server_header=False, proxy_headers=False)
    uvicorn.Server(config).run(sockets=[sock])


def _auth(auth_file: Path | None, proxy_header: str | None, proxies: list[str]) -> Any:
    """The page's authentication from the options (``None``: none asked for)."""
    from cuaderno.errors import UsageError
    from cuaderno.ui.auth import Auth, CredentialsFile

    if proxies and proxy_header is None:
        raise UsageError("--trusted-proxy names a proxy whose header to trust: add --trusted-proxy-header NAME")
    if auth_file is None and proxy_header is None:
        return None
    return Auth(credentials=CredentialsFile(auth_file) if auth_file is not None else None,
                proxy_header=proxy_header, proxies=proxies)


def ui_passwd_command(
    file: Annotated[Path, typer.Argument(help="The credentials file (created with mode 0600 if missing).")],
    user: Annotated[str, typer.Argument(help="The user name recorded as approver.")],
) -> None:
    """Add a user to a credentials file of `cuaderno ui --auth-file`, or change their password."""
    from cuaderno.errors import CuadernoError
    from cuaderno.ui.auth import set_password

    if sys.stdin.isatty():
        password = getpass.getpass(f"password for {user}: ")
        if getpass.getpass("again: ") != password:
            fail("the two passwords differ; nothing was written")
    else:  # a script: the first line of stdin
        password = sys.stdin.readline().rstrip("\r\n")
    try:
        new = set_password(file, user, password)
    except CuadernoError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {file}: {exc.strerror or exc}")
    typer.echo(f"{'added' if new else 'changed the password of'} {user} in {file}", err=True)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock
