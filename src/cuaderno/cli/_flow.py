"""``cuaderno flow limit|limits`` (see :mod:`cuaderno.flow`): the concurrency limits per key that
every worker of the journal keeps.

::

    cuaderno flow limit KEY N       # at most N runs of KEY in progress at once
    cuaderno flow limit KEY none    # no limit
    cuaderno flow limits [--json]
"""

from __future__ import annotations

from typing import Annotated

import typer

from cuaderno.cli._common import USAGE_EXIT, LinesJsonOption, fail, opened, print_listing, refusals, stdout

__all__ = ["flow_app"]

flow_app = typer.Typer(help="The queue's flow control: concurrency limits per key.", no_args_is_help=True)


@flow_app.command("limit")
def limit(
    ctx: typer.Context,
    key: Annotated[str, typer.Argument(help="The concurrency key (as runs are submitted with).")],
    value: Annotated[str, typer.Argument(metavar="N|none", help="At most N runs of the key in progress; none: no limit.")],
) -> None:
    """Set (or lift) the limit of a concurrency key."""
    from cuaderno.flow import set_limit

    if value == "none":
        n: int | None = None
    elif value.isdigit():
        n = int(value)
    else:
        fail(f"the limit must be a positive integer or 'none', got {value[:40]!r}", USAGE_EXIT)
    with refusals(), opened(ctx) as store:
        set_limit(store, key, n)
    stdout().print(f"concurrency key {key}: " + (f"at most {n} in progress" if n is not None else "no limit"),
                   soft_wrap=True)


@flow_app.command("limits")
def limits_command(ctx: typer.Context, as_json: LinesJsonOption = False) -> None:
    """List the concurrency limits."""
    from cuaderno.flow import limits

    print_listing(ctx, limits, as_json=as_json, jsonable=lambda found: dict(sorted(found.items())),
                  lines=lambda found: (f"{key}  {n}" for key, n in sorted(found.items())))
