"""cuaderno's promises under agents written with other frameworks.

Each integration is an optional extra and a subpackage that puts the framework's model requests
through the model-call protocol and its tool calls through the effect protocol
(:mod:`cuaderno.durable`): journaled, keyed, counted, resumable in another process by calling
the same thing again with the same run id. Nothing here is a second copy of those protocols.

- :mod:`cuaderno.integrations.pydantic_ai` (``pip install 'cuaderno[pydantic-ai]'``)
- :mod:`cuaderno.integrations.openai_agents` (``pip install 'cuaderno[openai-agents]'``)

A crashed wrapped run resumes by calling the wrapper again with its run id, or in a worker that
knows the wrapped agent (:class:`IntegrationWorker`; ``cuaderno worker --agent module:attr`` where
``attr`` is a :class:`Resumable`: a ``DurableAgent``, or what either integration's ``resumable``
returns).
"""

from cuaderno.integrations._budget import RunBudget
from cuaderno.integrations._compensate import Compensation
from cuaderno.integrations._worker import IntegrationWorker, Resumable

__all__ = ["Compensation", "IntegrationWorker", "Resumable", "RunBudget"]
