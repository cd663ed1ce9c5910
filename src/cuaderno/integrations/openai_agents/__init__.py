"""cuaderno under the OpenAI Agents SDK: ``DurableRunner`` in place of ``Runner``.

::

    from cuaderno.integrations.openai_agents import DurableRunner, lookup, effect_key

    runner = DurableRunner(SqliteCheckpointer("runs.db"), effects={"transfer": lookup(find_transfer)})
    result = await runner.run(agent, "pay 42 to ana", run_id="invoice-17")

Model calls go through the model-call protocol (journaled, keyed with ``Idempotency-Key`` through
the SDK's own client, counted), function tools through the effect protocol (with the effect
class declared per tool), ``needs_approval`` tools become cuaderno approvals. A crashed run goes
on in another process by calling ``run`` again with the same run id. ``run_streamed`` is the
same run through the SDK's ``Runner.run_streamed`` (each model step still journaled whole). See
``docs/integrations/openai-agents.md``.
"""

from cuaderno.integrations import Compensation, RunBudget
from cuaderno.integrations.openai_agents._effects import (
    EffectCall,
    EffectKind,
    Lookup,
    ToolEffect,
    current_effect,
    effect_key,
    lookup,
)
from cuaderno.integrations.openai_agents._model import KEY_HEADERS, DurableModel, DurableModelProvider
from cuaderno.integrations.openai_agents._runner import DurableResult, DurableRunner, DurableStream

__all__ = ["KEY_HEADERS", "Compensation", "DurableModel", "DurableModelProvider", "DurableResult", "DurableRunner", "DurableStream",
           "EffectCall",
           "EffectKind", "Lookup", "RunBudget", "ToolEffect", "current_effect", "effect_key", "lookup"]
