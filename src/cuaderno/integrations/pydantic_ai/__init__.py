"""cuaderno's promises under a Pydantic AI agent (``pip install 'cuaderno[pydantic-ai]'``).

Wrap the agent you have and run it with a run id::

    durable = DurableAgent(agent, journal=SqliteCheckpointer("runs.db"),
                           effects={"transfer": Lookup(find_transfer), "balance": "effect_free"})
    result = await durable.run("pay the invoices", run_id="invoices-2026-12")

Model requests go through the model-call protocol (journaled, keyed with the provider's
``Idempotency-Key`` through the agent's own OpenAI client, counted), tool calls through the effect
protocol with the effect class declared per tool (``non_idempotent`` by default), tools that
require approval become cuaderno approvals. Calling ``run`` again with the same run id resumes a
crashed run in any process; a finished one answers from its journal. See
``docs/integrations/pydantic-ai.md``.
"""

from cuaderno.integrations import Compensation, RunBudget
from cuaderno.integrations.pydantic_ai._agent import CuadernoJournal, DurableAgent, DurableResult, PendingApproval
from cuaderno.integrations.pydantic_ai._effects import EffectClass, Lookup, ToolEffect, current_effect_key

__all__ = ["Compensation", "CuadernoJournal", "DurableAgent", "DurableResult", "EffectClass", "Lookup", "PendingApproval",
           "RunBudget", "ToolEffect", "current_effect_key"]
