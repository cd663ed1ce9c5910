"""MCP tools through the official ``mcp`` SDK (``pip install 'cuaderno[mcp]'``).

:class:`McpServer` connects to one MCP server over stdio and wraps each tool it lists as a
cuaderno :class:`~cuaderno.tools.definition.Tool`, so an MCP tool goes through the loop like any
other: a policy decision, an intent committed before the call, an effect key, a journaled result.

An MCP server cannot say whether running a tool twice is safe, so every MCP tool is **not
idempotent** unless the user declares it (``effects={"search": Effect(idempotent=True)}``): an
intent without a result on resume is then an :class:`~cuaderno.errors.UncertainEffect`, never a
silent second call, unless a ``lookup`` settles it. The effect key travels in the request's
``_meta`` (``cuaderno/effect_key``, with ``cuaderno/run_id`` and ``cuaderno/step_id``) so a
server can deduplicate: the same intent carries the same key in every retry and every resume.

How a call ends, as the loop sees it:

- a result: journaled (``structuredContent`` when the server gives one, else the text of its
  content blocks, else the blocks as JSON);
- ``isError`` from the server: the tool ran and reported a failure, a known outcome
  (``ToolError``, permanent, ``sent=True``);
- the connection lost or a timeout after the request was sent (the server died mid-call): nobody
  knows if the tool ran (``ToolError``, ambiguous, ``sent=True``), which the loop reconciles or
  stops on as for any tool;
- a call on a connection already known dead is not sent (``ToolError``, permanent, ``sent=False``).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Final

from cuaderno import faults
from cuaderno.errors import ErrorClass, ToolArgumentsInvalid, ToolError, UsageError
from cuaderno.tools.definition import Lookup, Tool, ToolContext

try:
    import jsonschema
    from mcp import ClientSession, StdioServerParameters
    from mcp import types as mcp_types
    from mcp.client.stdio import stdio_client
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("cuaderno.tools.mcp needs the MCP SDK: pip install 'cuaderno[mcp]'") from exc

__all__ = ["META_EFFECT_KEY", "Effect", "McpServer", "McpTool"]

META_EFFECT_KEY: Final = "cuaderno/effect_key"
"""The ``_meta`` key that carries the call's effect key to the server."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Effect:
    """The side-effect class the user declares for one MCP tool (the server cannot).

    Attributes:
        idempotent: running it twice has the effect of running it once. Default ``False``.
        effect_type: names the effect in its effect key (default: the tool's name).
        lookup: reconciliation: find an effect by its key when nobody knows if it happened.
    """

    idempotent: bool = False
    effect_type: str | None = None
    lookup: Lookup | None = None


IDEMPOTENT: Final = Effect(idempotent=True)
NON_IDEMPOTENT: Final = Effect()


class McpTool(Tool):
    """One tool of an MCP server, as a cuaderno tool: the server's schema, the user's effect class."""

    def __init__(self, server: McpServer, spec: mcp_types.Tool, effect: Effect) -> None:
        # Not Tool.__init__: the schema is the server's JSON schema, not a Python signature.
        self.server = server
        self.fn = self._unused
        self.compensation = None
        self.name = spec.name
        if not self.name.replace("_", "").replace("-", "").isalnum() or len(self.name) > 64:
            raise UsageError(f"MCP tool name {self.name!r} must be 1-64 letters, digits, '_' or '-' to be "
                             "offered to a model")
        self.description = (spec.description or "").strip()
        self.idempotent = effect.idempotent
        self.effect_free = False  # an MCP tool may have an effect: its failed re-run stays uncertain
        self.effect_type = effect.effect_type or self.name
        self.lookup = effect.lookup
        self.business_id = None
        self.is_async = True
        self._ctx_param = None
        schema = dict(spec.inputSchema)
        schema.pop("title", None)
        self.parameters = schema
        self._validator = jsonschema.Draft202012Validator(schema)

    @staticmethod
    def _unused(**_: Any) -> None:  # pragma: no cover - McpTool overrides invoke
        raise AssertionError("an MCP tool runs through invoke")

    def validate(self, arguments: Mapping[str, object]) -> dict[str, object]:
        """Check arguments against the server's input schema (before any intent is written).

        Raises:
            ToolArgumentsInvalid: the arguments do not fit the schema (the tool is not called).
        """
        errors = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        if errors:
            problems = [{"loc": list(e.absolute_path), "msg": e.message, "type": str(e.validator)} for e in errors]
            raise ToolArgumentsInvalid(f"arguments for {self.name!r} do not match its schema: "
                                       + "; ".join(f"{'.'.join(map(str, p['loc'])) or '(root)'}: {p['msg']}"
                                                   for p in problems), data={"errors": problems})
        return dict(arguments)

    async def invoke(self, kwargs: Mapping[str, object], ctx: ToolContext) -> Any:
        """Call the tool on the server, with the effect key in ``_meta``; classify how it ended."""
        return await self.server.call(self.name, kwargs, ctx)


class McpServer:
    """One MCP server process over stdio, used as an async context manager.

    Example::

        async with McpServer(sys.executable, ["server.py"]) as server:
            tools = await server.tools(effects={"search": Effect(idempotent=True)})
            agent = Agent(instructions="...", tools=tools)
            result = await agent.run_to_end(task, session=session)

    Args:
        command: the program that runs the server.
        args: its arguments.
        env: its environment (default: the SDK's safe default environment).
        timeout: seconds to wait for a tool's reply; past it the call is ambiguous (it was sent).
    """

    def __init__(self, command: str, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None,
                 cwd: str | None = None, timeout: float | None = None) -> None:
        self.params = StdioServerParameters(command=command, args=list(args),
                                            env=dict(env) if env is not None else None, cwd=cwd)
        self.timeout = timeout
        self._stack: AsyncExitStack | None = None
        self._session: ClientSession | None = None
        self._lost: str | None = None
        """Why the connection is known dead (a call then is not sent)."""

    async def __aenter__(self) -> McpServer:
        stack = AsyncExitStack()
        try:
            read, write = await stack.enter_async_context(stdio_client(self.params))
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
        except BaseException:
            await stack.aclose()
            raise
        self._stack, self._session, self._lost = stack, session, None
        return self

    async def __aexit__(self, *exc: object) -> None:
        stack, self._stack, self._session = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def tools(self, effects: Mapping[str, Effect | bool] | None = None) -> list[Tool]:
        """The server's tools as cuaderno tools.

        Args:
            effects: tool name -> :class:`Effect` (or ``True`` for idempotent, ``False`` for not).
                Tools not named are not idempotent.

        Raises:
            UsageError: ``effects`` names a tool the server does not list (a misspelt name would
                leave the tool it meant with the default class silently).
        """
        session = self._live()
        listed = (await session.list_tools()).tools
        effects = dict(effects or {})
        unknown = sorted(set(effects) - {t.name for t in listed})
        if unknown:
            raise UsageError(f"effects names tools the MCP server does not list: {unknown}; "
                             f"it lists {sorted(t.name for t in listed)}")
        out: list[Tool] = []
        for spec in listed:
            declared = effects.get(spec.name, NON_IDEMPOTENT)
            if isinstance(declared, bool):
                declared = IDEMPOTENT if declared else NON_IDEMPOTENT
            if not isinstance(declared, Effect):
                raise UsageError(f"effects[{spec.name!r}] must be an Effect or a bool, got {declared!r:.60}")
            out.append(McpTool(self, spec, declared))
        return out

    async def call(self, name: str, arguments: Mapping[str, object], ctx: ToolContext) -> Any:
        """Call one tool; return its journalable result or raise a classified ToolError."""
        if self._lost is not None:
            raise ToolError(f"MCP tool {name!r} was not called: the server's connection is closed ({self._lost})",
                            error_class=ErrorClass.PERMANENT, sent=False, data={"server": self.params.command})
        session = self._live()
        meta = {META_EFFECT_KEY: ctx.effect_key, "cuaderno/run_id": ctx.run_id, "cuaderno/step_id": ctx.step_id}
        timeout = datetime.timedelta(seconds=self.timeout) if self.timeout is not None else None
        try:
            faults.point("tool.K3")  # about to write the request
            result = await session.call_tool(name, dict(arguments), read_timeout_seconds=timeout, meta=meta)
        except Exception as exc:
            # The request may have reached the server: whether the tool ran is unknown.
            self._lost = f"{type(exc).__name__}: {exc}"
            raise ToolError(f"MCP tool {name!r}: the call was sent and no reply came ({self._lost})",
                            error_class=ErrorClass.AMBIGUOUS, sent=True,
                            data={"server": self.params.command, "cause": self._lost}) from None
        faults.point("tool.K4")  # the reply arrived, not yet read
        if result.isError:
            text = _text(result.content)
            raise ToolError(f"MCP tool {name!r} reported an error: {text}", error_class=ErrorClass.PERMANENT,
                            sent=True, data={"content": text})
        return _value(result)

    def _live(self) -> ClientSession:
        if self._session is None:
            raise UsageError("the MCP server is not connected: use `async with McpServer(...) as server`")
        return self._session


def _text(content: Sequence[mcp_types.ContentBlock]) -> str:
    return "\n".join(c.text for c in content if isinstance(c, mcp_types.TextContent))


def _value(result: mcp_types.CallToolResult) -> Any:
    """What is journaled for a successful call (see the module docstring)."""
    if result.structuredContent is not None:
        return result.structuredContent
    if all(isinstance(c, mcp_types.TextContent) for c in result.content):
        return _text(result.content)
    return [c.model_dump(mode="json") for c in result.content]
