"""The wrapped agent ``cuaderno worker --agent _oai_worker_target:resumable`` resumes: the agent,
effects and run context of ``_oai_agent.py`` (so the runs it started are of the same versions), on
the journal (a SQLite file or a PostgreSQL URL), provider and ledger named by ``OAI_JOURNAL``, ``OAI_PROVIDER``, ``OAI_LEDGER``."""

from __future__ import annotations

import os

import _oai_agent
from agents import set_tracing_disabled

from cuaderno.integrations.openai_agents import DurableRunner
from cuaderno.journal import open_journal

set_tracing_disabled(True)
_oai_agent.LEDGER_URL = os.environ["OAI_LEDGER"]
agent = _oai_agent.build(os.environ["OAI_PROVIDER"], approval=False, structured=True)
runner = DurableRunner(open_journal(os.environ["OAI_JOURNAL"]), effects=_oai_agent.EFFECTS)
resumable = runner.resumable(agent, context=_oai_agent.Bank("treasury", os.environ["OAI_LEDGER"]))
