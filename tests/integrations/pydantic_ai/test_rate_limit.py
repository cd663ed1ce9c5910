"""``DurableAgent(rate_limit=...)``: the provider's limit shared through the journal, through
Pydantic AI's own openai client, against the fake rate-limited provider on loopback (its log is
the truth)."""

from __future__ import annotations

from pathlib import Path

from _rate_cases import (
    KEY,
    a_429_pauses_the_other_runs,
    a_spent_budget_in_a_success_answer_pauses_the_others,
    after_a_pause_one_probe_goes_before_the_others,
    runs_sharing_a_key_take_turns,
)
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from cuaderno import RateLimit, SqliteCheckpointer
from cuaderno.integrations.pydantic_ai import DurableAgent


async def _one(journal: Path, base_url: str, limit: RateLimit | None, run_id: str) -> list[str]:
    client = AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0)
    agent = Agent(OpenAIChatModel("m", provider=OpenAIProvider(openai_client=client)), instructions="answer")
    try:
        with SqliteCheckpointer(journal) as store:
            result = await DurableAgent(agent, journal=store, rate_limit=limit).run("q", run_id=run_id)
            assert result.output == "done"
            return [e.phase for e in store.load(run_id) if e.kind == "model"]
    finally:
        await client.close()


def test_runs_sharing_a_key_take_turns_before_their_intents(tmp_path: Path) -> None:
    runs_sharing_a_key_take_turns(_one, tmp_path)


def test_a_429_one_run_meets_pauses_the_others_before_their_intents(tmp_path: Path) -> None:
    a_429_pauses_the_other_runs(_one, tmp_path)


def test_a_success_answer_saying_the_budget_is_spent_pauses_the_others(tmp_path: Path) -> None:
    a_spent_budget_in_a_success_answer_pauses_the_others(_one, tmp_path)


def test_after_a_pause_one_probe_goes_and_the_others_wait_for_its_answer(tmp_path: Path) -> None:
    after_a_pause_one_probe_goes_before_the_others(_one, tmp_path)
