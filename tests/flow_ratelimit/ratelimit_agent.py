"""The agent the rate-limit fleet test starts runs of and points ``cuaderno worker`` at.

Each run asks a person to approve a ``hold`` (the application's first turn, answered by a scripted
gateway, so the provider sees nothing of it), then, once approved, one model turn that a worker
sends to the fake rate-limited provider and that ends the run. So every request the provider logs
is a worker's, one per run (plus what a 429 makes it send again).

Configured from the environment, the same in every process: ``RL_PROVIDER`` (the provider's
base URL), ``RL_RPM`` / ``RL_TPM`` (the shared limit the workers keep; unset: none).
"""

from __future__ import annotations

import os

from cuaderno import Agent, OpenAIGateway, Policy, RateLimit, ScriptedGateway, tool


@tool
def hold(amount: int) -> dict[str, int]:
    """Hold an amount (a person approves it first)."""
    return {"held": amount}


agent = Agent(instructions="hold, then answer", tools=[hold], name="limited",
              policy=Policy({"hold": "require_approval"}, version="rl-1"), max_output_tokens=20)


def first_turn() -> ScriptedGateway:
    return ScriptedGateway([ScriptedGateway.call("hold", amount=5)])


def limit() -> RateLimit | None:
    rpm, tpm = os.environ.get("RL_RPM"), os.environ.get("RL_TPM")
    if not rpm and not tpm:
        return None
    return RateLimit(requests_per_minute=float(rpm) if rpm else None, tokens_per_minute=float(tpm) if tpm else None,
                     max_wait=600)


def gateway() -> OpenAIGateway:
    return OpenAIGateway("m", base_url=os.environ["RL_PROVIDER"], api_key="sk-fleet", rate_limit=limit())
