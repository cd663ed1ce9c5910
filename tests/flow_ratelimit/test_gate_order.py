"""Where the protocol passes the gate: before each intent, around each send, and the answer's
usage after it (ModelCall, as every loop uses it)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cuaderno import ErrorClass, GatewayError, RetryPolicy, SqliteCheckpointer
from cuaderno.durable import ModelCall, open_run
from cuaderno.gateway.base import ModelResponse, Usage


class RecordingGate:
    """A gate that writes down what the journal held each time it was asked."""

    def __init__(self, store: SqliteCheckpointer) -> None:
        self.store = store
        self.seen: list[tuple[str, list[str]]] = []

    def _phases(self) -> list[str]:
        return [e.phase for e in self.store.load("g") if e.kind == "model"]

    async def admit(self, *, bounded: bool = True) -> None:
        self.seen.append((f"admit bounded={bounded}", self._phases()))

    async def ready(self, *, bounded: bool = True) -> None:
        self.seen.append((f"ready bounded={bounded}", self._phases()))

    def unsent(self) -> None:
        self.seen.append(("unsent", self._phases()))

    @contextmanager
    def sending(self) -> Iterator[None]:
        self.seen.append(("send", self._phases()))
        yield

    def answered(self, response: ModelResponse) -> None:
        self.seen.append((f"answered {response.usage.input_tokens}", self._phases()))


def test_the_gate_is_passed_before_every_intent_and_a_retry_takes_a_new_turn(tmp_path: Path) -> None:
    with SqliteCheckpointer(tmp_path / "j.db") as store:
        opened = open_run(store, "g", task="t", task_fingerprint="fp", versions={}, tenant="default", owner="me")
        call = ModelCall(opened.log, "t0000.model", key="k", turn=0, fingerprint="req")
        gate = RecordingGate(store)
        answers: list[GatewayError | ModelResponse] = [
            GatewayError("429", error_class=ErrorClass.TRANSIENT, sent=True, retry_after=0.0, status=429),
            GatewayError("reset", error_class=ErrorClass.AMBIGUOUS, sent=True),
            ModelResponse(text="ok", usage=Usage(input_tokens=7, output_tokens=1)),
        ]

        async def provider() -> ModelResponse:
            answer = answers.pop(0)
            if isinstance(answer, GatewayError):
                raise answer
            return answer

        async def go() -> None:
            sent = await call.send(provider, retry=RetryPolicy(), sleep=lambda s: asyncio.sleep(0),
                                   rng=random.Random(0), gate=gate)
            call.finish(sent)
            call.log.commit()

        asyncio.run(go())
        opened.release()
        assert gate.seen == [
            ("admit bounded=True", []),  # the first turn: nothing of the step written yet
            ("ready bounded=True", ["intent"]),  # the intent committed: the row looked at again
            ("send", ["intent"]),
            ("admit bounded=False", ["intent"]),  # a 429 is retried under the same intent
            ("ready bounded=False", ["intent"]),
            ("send", ["intent"]),
            ("admit bounded=False", ["intent"]),  # an ambiguous failure: the turn before the new intent
            ("ready bounded=False", ["intent", "intent.2"]),
            ("send", ["intent", "intent.2"]),
            ("answered 7", ["intent", "intent.2"]),
        ]
