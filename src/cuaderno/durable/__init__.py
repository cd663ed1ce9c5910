"""The durable step, once: the protocols every loop writes model calls and effects through.

- :mod:`cuaderno.durable.model_call`: :class:`ModelCall`, intent with the provider key → send →
  result; a send of unknown fate sent again with the same key, counted.
- :mod:`cuaderno.durable.effect`: :class:`Effect`, intent with the effect key → body → result; an
  unknown outcome settled by a lookup or stopped as ``uncertain``, never guessed.
- :mod:`cuaderno.durable.opening`: :func:`open_run`, what every loop does before it goes on with
  a run (start it, or check it against the caller and take it over at a new epoch).
- :mod:`cuaderno.durable.approval`: :class:`Approval`, a person's decision on one tool call,
  requested bound to the fingerprint of its exact arguments, read back before the call runs.
- :mod:`cuaderno.durable.log`: :class:`StepLog`, what they write through, and :class:`JournalLog`,
  the one a caller that is not cuaderno's runner uses (one ``append`` per commit).

The runner, the Temporal activities and the episode parent write model and tool intents and
results only through these modules (a test reads every module of the package to keep it so).
"""

from cuaderno.durable.approval import Approval, Decided
from cuaderno.durable.effect import BodyBug, Effect, Settled
from cuaderno.durable.log import JournalLog, StepLog
from cuaderno.durable.model_call import FrameworkPayload, Gate, ModelCall, Retrying, Sent
from cuaderno.durable.opening import Opened, open_run

__all__ = ["Approval", "BodyBug", "Decided", "Effect", "FrameworkPayload", "Gate", "JournalLog", "ModelCall", "Opened", "Retrying", "Sent", "Settled", "StepLog",
           "open_run"]
