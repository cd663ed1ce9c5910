"""The operator's web page (``cuaderno ui``): runs, a run's timeline, approvals, uncertain effects.

Needs the ``ui`` extra (``pip install 'cuaderno[ui]'``): Starlette, Jinja and uvicorn, no
front-end build step and no script on the page. :func:`cuaderno.ui.app.create_app` builds the
ASGI app for one journal; the ``cuaderno ui`` command serves it on loopback.
"""
