"""``cuaderno ui``: the operator's web page for one journal (see :mod:`cuaderno.ui.app`).

::

    cuaderno ui [--journal PATH|sqlite:///PATH] [--host 127.0.0.1] [--port 8765] [--allow-decisions]

Needs the ``ui`` extra (``pip install 'cuaderno[ui]'``). Read-only unless ``--allow-decisions``;
bound to loopback unless ``--host`` says otherwise, with a warning then.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Annotated, Any, Final

import typer

__all__ = ["DEFAULT_PORT", "allowed_hosts", "is_loopback", "ui_command"]

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


def allowed_hosts(host: str) -> list[str]:
    """The ``Host`` names requests may carry when the server listens on ``host``."""
    from cuaderno.ui.app import LOOPBACK_HOSTS

    if host in _ANY:
        return ["*"]  # reachable by any name: the warning said so
    return sorted({*LOOPBACK_HOSTS, host})


def _error(message: str) -> typer.Exit:
    from cuaderno.cli import ERROR_EXIT, _say_error

    _say_error(message)
    return typer.Exit(ERROR_EXIT)


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
) -> None:
    """Serve a web page for the journal's runs: list, timeline, approvals, uncertain effects."""
    try:
        import uvicorn

        from cuaderno.ui.app import create_app
    except ImportError as exc:
        raise _error(f"the web page needs the ui extra: pip install 'cuaderno[ui]' ({exc.name} is missing)") from None
    from cuaderno.errors import CuadernoError

    source: str | Path = journal if journal is not None else ctx.obj.db
    try:
        app = create_app(source, allow_decisions=allow_decisions, allowed_hosts=allowed_hosts(host))
    except CuadernoError as exc:
        raise _error(str(exc)) from None
    except OSError as exc:
        raise _error(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc)) from None
    if not is_loopback(host):
        typer.echo(f"warning: listening on {host}, not loopback: anyone who can reach this address sees every run "
                   "in the journal" + (" and can decide its approvals" if allow_decisions else ""), err=True)
    try:
        sock = _bind(host, port)
    except OSError as exc:
        raise _error(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound_port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    mode = "decisions allowed" if allow_decisions else "read-only"
    typer.echo(f"cuaderno ui: http://{shown}:{bound_port}/ ({mode}); Ctrl-C stops it", err=True)
    config: Any = uvicorn.Config(app, log_level="warning", lifespan="on", server_header=False)
    uvicorn.Server(config).run(sockets=[sock])


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
