"""cuaderno: durable LLM agent runs.

Every step of a run (model call, tool call, policy decision, human approval, final answer) is
journaled, so a run that crashes resumes in another process without paying any inference twice
and without running any side effect twice; where nobody can know whether an effect happened, it
stops and says so (:class:`UncertainEffect`).
"""

from cuaderno.budgets import Budgets
from cuaderno.cancellation import cancel
from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import (
    ApprovalError,
    ApprovalMismatch,
    BudgetExceeded,
    ConnectionLost,
    ConversationClosed,
    ConversationDivergence,
    CuadernoError,
    DrainOnOldWorker,
    ErrorClass,
    FencedOut,
    GatewayError,
    IdempotencyKeyReuse,
    JournalConflict,
    JournalCorrupt,
    JournalError,
    JournalLinked,
    JournalLocked,
    JournalReplaced,
    JournalRolledBack,
    KeyInvalid,
    KeyMissing,
    LadderExhausted,
    MessageUnfinished,
    MigrationFailed,
    NotUncertain,
    NotWaitingForApproval,
    PayloadTooLarge,
    RateLimitWaitTooLong,
    ReplayDivergence,
    ResponseTooLarge,
    RunBusy,
    RunCancelled,
    RunChanged,
    RunClosed,
    RunErased,
    RunNotFound,
    RunStillOpen,
    SchemaTooNew,
    StreamInterrupted,
    SubmitConflict,
    ToolArgumentsInvalid,
    ToolError,
    ToolResultInvalid,
    UncertainEffect,
    UsageError,
    VersionMismatch,
)
from cuaderno.events import StepEvent
from cuaderno.gateway.base import ModelGateway, ModelRequest, ModelResponse, ToolCall, Usage
from cuaderno.gateway.empty import classify_response
from cuaderno.gateway.ladder import Escalate, FittingTools, Ladder, NamedTool, RelaxToolChoice, Resend
from cuaderno.gateway.pricing import PriceTable
from cuaderno.gateway.rate import RateLimit
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.gateway.tiered import TieredGateway
from cuaderno.journal import Checkpointer, GroupCommit, MemoryCheckpointer, SqliteCheckpointer, open_journal
from cuaderno.loop import (
    Agent,
    ApprovalStep,
    FinalStep,
    ModelStep,
    RetryPolicy,
    RunResult,
    Session,
    Step,
    Token,
    TokenStream,
    ToolStep,
)
from cuaderno.loop.cleanup import compensate
from cuaderno.loop.conversation import Conversation
from cuaderno.loop.versions import Migration
from cuaderno.operations import approve, deny, export_lines, fork, pending_approvals, rebuild_summary, resolve
from cuaderno.tools import Compensation, Policy, PolicyDecision, Tool, ToolContext, tool
from cuaderno.worker import Worker, WorkerStats

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # The real-provider gateways import their SDKs: load them only when asked for.
    if name in ("OpenAIGateway", "AnthropicGateway"):
        from cuaderno import gateway

        return getattr(gateway, name)
    raise AttributeError(f"module 'cuaderno' has no attribute {name!r}")

__all__ = [
    "Agent",
    "AnthropicGateway",
    "ApprovalError",
    "ApprovalMismatch",
    "ApprovalStep",
    "BudgetExceeded",
    "Budgets",
    "Checkpoint",
    "Checkpointer",
    "Compensation",
    "ConnectionLost",
    "Conversation",
    "ConversationClosed",
    "ConversationDivergence",
    "CuadernoError",
    "DrainOnOldWorker",
    "ErrorClass",
    "Escalate",
    "FencedOut",
    "FinalStep",
    "FittingTools",
    "GatewayError",
    "GroupCommit",
    "IdempotencyKeyReuse",
    "JournalConflict",
    "JournalCorrupt",
    "JournalError",
    "JournalLinked",
    "JournalLocked",
    "JournalReplaced",
    "JournalRolledBack",
    "KeyInvalid",
    "KeyMissing",
    "Ladder",
    "LadderExhausted",
    "MemoryCheckpointer",
    "MessageUnfinished",
    "Migration",
    "MigrationFailed",
    "ModelGateway",
    "ModelRequest",
    "ModelResponse",
    "ModelStep",
    "NamedTool",
    "NotUncertain",
    "NotWaitingForApproval",
    "OpenAIGateway",
    "PayloadTooLarge",
    "Policy",
    "PolicyDecision",
    "PriceTable",
    "RateLimit",
    "RateLimitWaitTooLong",
    "RelaxToolChoice",
    "ReplayDivergence",
    "Resend",
    "ResponseTooLarge",
    "RetryPolicy",
    "RunBusy",
    "RunCancelled",
    "RunChanged",
    "RunClosed",
    "RunErased",
    "RunNotFound",
    "RunResult",
    "RunStillOpen",
    "SchemaTooNew",
    "ScriptedGateway",
    "Session",
    "SqliteCheckpointer",
    "Step",
    "StepEvent",
    "StreamInterrupted",
    "SubmitConflict",
    "TieredGateway",
    "Token",
    "TokenStream",
    "Tool",
    "ToolArgumentsInvalid",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolResultInvalid",
    "ToolStep",
    "UncertainEffect",
    "Usage",
    "UsageError",
    "VersionMismatch",
    "Worker",
    "WorkerStats",
    "__version__",
    "approve",
    "cancel",
    "classify_response",
    "compensate",
    "deny",
    "export_lines",
    "fork",
    "open_journal",
    "pending_approvals",
    "rebuild_summary",
    "resolve",
    "tool",
]
