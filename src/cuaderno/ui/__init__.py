"""The operator's web page (``cuaderno ui``): runs, a run's timeline, approvals, uncertain effects.

Needs the ``ui`` extra (``pip install 'cuaderno[ui]'``): Starlette, Jinja and uvicorn, no
front-end build step and no script on the page. :func:`cuaderno.ui.app.create_app` builds the
ASGI app for one journal; the ``cuaderno ui`` command serves it on loopback.

:func:`journal_path` and :func:`open_journal` (no web stack needed) read a ``--journal`` value and
open the SQLite journal it names only if it exists; ``cuaderno fork`` and ``export`` open theirs so.
"""

from cuaderno.ui._journal import journal_path, open_journal

__all__ = ["journal_path", "open_journal"]
