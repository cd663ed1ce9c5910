"""The wrapped agent ``cuaderno worker --agent _pyd_worker_target:resumable`` resumes: the same
agent and effects as ``_program.py`` (so the runs it started are of the same versions), its
journal (a SQLite file or a PostgreSQL URL), provider and payment service named by ``PYD_JOURNAL``, ``PYD_PROVIDER``, ``PYD_RECEIPTS``.

The deps hold an HTTP client: ``deps_factory`` opens one for each drive and closes it after."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from _program import Deps, build_agent, compensations

from cuaderno.integrations.pydantic_ai import DurableAgent, Lookup
from cuaderno.journal import open_journal

RECEIPTS = os.environ["PYD_RECEIPTS"]


async def _find(key: str, arguments: dict[str, Any]) -> Any:
    async with httpx.AsyncClient() as http:
        reply = await http.get(f"{RECEIPTS}/transfers/{key}")
    if reply.status_code == 404:
        return None
    reply.raise_for_status()
    return reply.json()


@asynccontextmanager
async def _deps() -> AsyncIterator[Deps]:
    async with httpx.AsyncClient() as http:
        yield Deps(RECEIPTS, http)


durable = DurableAgent(build_agent(os.environ["PYD_PROVIDER"]), journal=open_journal(os.environ["PYD_JOURNAL"]),
                       effects={"transfer": Lookup(_find), "big_transfer": Lookup(_find)},
                       compensations=compensations(RECEIPTS))
resumable = durable.resumable(deps_factory=_deps)
