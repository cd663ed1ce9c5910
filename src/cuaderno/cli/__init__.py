"""The ``cuaderno`` command line: look at runs and decide pending approvals.

::

    cuaderno [--db runs.db] list [--status S] [--limit N] [--json]
    cuaderno [--db runs.db] show RUN [--json] [--no-timeline]
    cuaderno [--db runs.db] approve RUN STEP [--fingerprint FP] [--by NAME] [--reason TEXT]
    cuaderno [--db runs.db] deny RUN STEP [--fingerprint FP] [--by NAME] [--reason TEXT]
    cuaderno [--db runs.db] status RUN [--json]
    cuaderno [--db runs.db] fork RUN --at STEP --as NEW_RUN
    cuaderno [--db runs.db] export RUN [--output FILE]
    cuaderno worker --journal URL --agent module:attr [--concurrency N]

The command line is a client of the public API only: it reads through the
:class:`~cuaderno.journal.base.Checkpointer` (``list_runs``, ``checkpoint``, ``load``) and writes
nothing but what :func:`cuaderno.harness.approve` and :func:`cuaderno.harness.deny` append.

A journal that does not exist is never created: every command needs an existing file. Every
cuaderno error prints one ``error: ...`` line on stderr and exits with status 2, as do usage errors
(an unknown option, a missing argument, a mistyped command: click's three lines are one here). A
long value is cut in that line and its length given. Text the terminal's encoding cannot show
(``PYTHONIOENCODING=ascii``, a run id with an accent) is printed as backslash escapes, never as a
traceback.

The modules, one per command group: :mod:`~cuaderno.cli._runs` (``list``, ``show``, ``status``,
``rebuild-summary``), :mod:`~cuaderno.cli._decide` (``approve``, ``deny``, ``cancel``, ``resolve``;
with ``--temporal``, :mod:`~cuaderno.cli._temporal`), :mod:`~cuaderno.cli._worker`,
:mod:`~cuaderno.cli._ui` (``ui``, ``ui-passwd``) and :mod:`~cuaderno.cli._fork` (``fork``,
``export``); what they share (exit statuses, the one refusal helper, the journal opened only if it
exists) is :mod:`~cuaderno.cli._common`, and :mod:`~cuaderno.cli._app` is the command group.
"""

from cuaderno.cli._app import app, main
from cuaderno.cli._common import ERROR_EXIT, NOT_FOUND_EXIT, STATUSES, USAGE_EXIT

__all__ = ["ERROR_EXIT", "NOT_FOUND_EXIT", "STATUSES", "USAGE_EXIT", "app", "main"]
