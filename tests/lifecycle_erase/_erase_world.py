"""Runs with a secret planted in their task, a tool's result and their answer, and a grep of the
bytes every file of a journal holds (issue 35: erasure must leave 0 occurrences)."""

from __future__ import annotations

import uuid
from pathlib import Path

from cuaderno import Agent, ScriptedGateway, Session, tool
from cuaderno.journal.base import Checkpointer

__all__ = ["grep_files", "run_with_secret", "secret"]


def secret() -> str:
    """A string nothing else in a journal contains (random, so no compression shares it)."""
    return f"SECRET-{uuid.uuid4().hex}"


async def run_with_secret(store: Checkpointer, run_id: str, token: str) -> None:
    """A completed run: the task holds ``token``, the tool's result ``token``-tool, the answer
    ``token``-answer (with some prose, so that a payload is compressed where the store compresses)."""

    @tool
    def lookup(customer: str) -> dict[str, str]:
        """Look a customer up."""
        return {"record": f"{token}-tool " + "the customer asked about the invoice. " * 20}

    agent = Agent(instructions="answer", tools=[lookup])
    script = [ScriptedGateway.call("lookup", customer="c1"), ScriptedGateway.text(f"the answer is {token}-answer")]
    async for _ in agent.run(f"find {token}", session=Session(run_id, ScriptedGateway(script), store)):
        pass


def grep_files(files: list[Path], needle: str) -> dict[str, int]:
    """Occurrences of ``needle`` (UTF-8) in each file, by name; a missing file counts 0."""
    raw = needle.encode()
    return {f.name: (f.read_bytes().count(raw) if f.exists() else 0) for f in files}
