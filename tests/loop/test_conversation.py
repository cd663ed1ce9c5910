"""Multi-turn conversations: one journal, a run per message, earlier answers replayed and never re-paid."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
from _pg import pg_schemas  # noqa: F401 - the fixture

from cuaderno import (
    Agent,
    Conversation,
    ConversationClosed,
    ConversationDivergence,
    MessageUnfinished,
    ModelRequest,
    ModelResponse,
    Policy,
    ReplayDivergence,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
    UsageError,
    approve,
    tool,
)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = SqliteCheckpointer(tmp_path / "runs.db")
    yield s
    s.close()


def echo(request: ModelRequest) -> ModelResponse:
    """Answers the last user message, saying how many earlier answers it was shown."""
    last = [m for m in request.messages if m["role"] == "user"][-1]["content"]
    seen = sum(1 for m in request.messages if m["role"] == "assistant")
    return ScriptedGateway.text(f"re: {last} (after {seen})")


AGENT = Agent(instructions="chat")


def chat(store: Any, gw: ScriptedGateway, cid: str = "c1") -> Conversation:
    return AGENT.conversation(session=Session(cid, gw, store))


def rows(store: Any, run_id: str) -> int:
    cp = store.checkpoint(run_id)
    return 0 if cp is None else cp.last_seq


def test_messages_are_runs_of_one_journal_and_each_sees_the_earlier_answers(store: Any) -> None:
    gw = ScriptedGateway(echo)
    conv = chat(store, gw)
    first = conv.send_sync("hola")
    second = conv.send_sync("¿qué tal?")
    assert (first.run_id, second.run_id) == ("c1/m0001", "c1/m0002")
    assert first.output == "re: hola (after 0)" and second.output == "re: ¿qué tal? (after 1)"
    assert gw.billed == 2
    # The second message's request starts with the first exchange, then the new message.
    assert list(gw.requests[-1].messages) == [
        {"role": "user", "content": "hola"}, {"role": "assistant", "content": "re: hola (after 0)"},
        {"role": "user", "content": "¿qué tal?"}]
    assert [(m["role"], m["content"]) for m in conv.messages] == [
        ("user", "hola"), ("assistant", "re: hola (after 0)"),
        ("user", "¿qué tal?"), ("assistant", "re: ¿qué tal? (after 1)")]
    head = store.load("c1")
    assert [(e.step_id, e.phase, e.kind) for e in head] == [
        ("run", "start", "run"), ("m0001", "message", "conversation"), ("m0002", "message", "conversation")]
    assert head[1].payload == {"text": "hola", "run_id": "c1/m0001"}


def test_another_process_replays_the_recorded_answers_without_paying_them(store: Any) -> None:
    gw = ScriptedGateway(echo)
    conv = chat(store, gw)
    answers = [conv.send_sync(t).output for t in ("a", "b", "c")]

    fresh = ScriptedGateway(echo)  # a new process: a new gateway object, the same journal
    again = chat(store, fresh)
    replayed = [again.send_sync(t) for t in ("a", "b", "c")]
    assert [r.output for r in replayed] == answers
    assert all(r.replayed for r in replayed)
    assert fresh.calls == 0, "an earlier answer was paid again"
    more = again.send_sync("d")  # and the conversation goes on after them
    assert more.output == "re: d (after 3)" and fresh.billed == 1


def test_a_different_message_at_a_recorded_position_is_a_divergence_and_writes_nothing(store: Any) -> None:
    conv = chat(store, ScriptedGateway(echo))
    conv.send_sync("a")
    conv.send_sync("b")
    before = (rows(store, "c1"), rows(store, "c1/m0001"), rows(store, "c1/m0002"))
    other = chat(store, ScriptedGateway(echo))
    other.send_sync("a")
    with pytest.raises(ConversationDivergence) as info:
        other.send_sync("B?")
    assert isinstance(info.value, ReplayDivergence)
    assert info.value.number == 2 and info.value.step_id == "m0002" and "'b'" in str(info.value)
    assert (rows(store, "c1"), rows(store, "c1/m0001"), rows(store, "c1/m0002")) == before
    assert store.checkpoint("c1/m0003") is None
    err = pickle.loads(pickle.dumps(info.value))
    assert type(err) is ConversationDivergence and str(err) == str(info.value)


def test_two_writers_at_one_position_one_wins_the_other_diverges(store: Any) -> None:
    one, two = chat(store, ScriptedGateway(echo)), chat(store, ScriptedGateway(echo))
    one.send_sync("first")
    with pytest.raises(ConversationDivergence):
        two.send_sync("second")
    assert [m["content"] for m in one.messages if m["role"] == "user"] == ["first"]


def test_a_writer_that_lost_the_race_between_its_read_and_its_write_diverges(store: Any) -> None:
    from cuaderno.testing import crash

    one, two = chat(store, ScriptedGateway(echo)), chat(store, ScriptedGateway(echo))
    # Between one's read of the head and its write, two records its own first message (the hook
    # runs once, inside one's append, before its transaction).
    crash.on("append.W0", lambda: two._place("from two"))
    try:
        with pytest.raises(ConversationDivergence):
            one.send_sync("from one")
    finally:
        crash.on("append.W0", None)
    head = [e.payload["text"] for e in store.load("c1") if e.phase == "message"]
    assert head == ["from two"], "both writers recorded a message at one position"
    assert store.checkpoint("c1/m0001") is None  # one never started a run for its message


def test_resume_finishes_the_last_message_and_places_the_next_after_it(store: Any) -> None:
    conv = chat(store, ScriptedGateway(echo))
    conv.send_sync("a")
    conv.send_sync("b")
    fresh = ScriptedGateway(echo)
    later = chat(store, fresh)
    last = asyncio.run(later.resume())
    assert last is not None and last.output == "re: b (after 1)" and last.replayed and fresh.calls == 0
    assert later.position == 2
    assert later.send_sync("c").output == "re: c (after 2)"
    assert asyncio.run(chat(store, fresh, "empty").resume()) is None


@tool(idempotent=False)
def pay(amount: int) -> str:
    """Pay."""
    return f"paid {amount}"


def test_a_message_waiting_for_a_person_blocks_the_next_until_it_is_decided(store: Any) -> None:
    agent = Agent(instructions="chat", tools=[pay], policy=Policy({"pay": "require_approval"}, version="p1"))

    def script(request: ModelRequest) -> ModelResponse:
        last = request.messages[-1]
        if last["role"] == "user" and last["content"] == "pay 5":
            return ScriptedGateway.call("pay", amount=5)
        return ScriptedGateway.text(f"ok after {len(request.messages)} messages")

    gw = ScriptedGateway(script)
    conv = agent.conversation(session=Session("c2", gw, store))
    waiting = conv.send_sync("pay 5")
    assert waiting.status == "suspended"
    before = rows(store, "c2")
    with pytest.raises(MessageUnfinished) as info:
        conv.send_sync("and now?")
    assert info.value.status == "suspended" and info.value.message_run_id == "c2/m0001"
    assert rows(store, "c2") == before, "the refused message was recorded"
    with pytest.raises(MessageUnfinished):
        conv.close()

    approve(store, "c2/m0001", next(iter(waiting.pending)))
    done = asyncio.run(agent.conversation(session=Session("c2", gw, store)).resume())
    assert done is not None and done.status == "completed"
    conv = agent.conversation(session=Session("c2", gw, store))
    asyncio.run(conv.resume())
    # The next message follows the first exchange (question and final answer; the tool call
    # and its result stay in the first message's run).
    assert conv.send_sync("and now?").output == "ok after 3 messages"


def test_close_refuses_new_messages_in_any_process_and_keeps_the_record(store: Any) -> None:
    conv = chat(store, ScriptedGateway(echo))
    conv.send_sync("a")
    conv.close()
    conv.close()  # idempotent
    assert conv.closed
    with pytest.raises(ConversationClosed):
        conv.send_sync("b")
    other = chat(store, ScriptedGateway(echo))
    assert other.send_sync("a").replayed  # the recorded message still replays
    with pytest.raises(ConversationClosed):
        other.send_sync("b")
    assert [m["content"] for m in other.messages] == ["a", "re: a (after 0)"]
    assert store.checkpoint("c1").status == "completed"


def test_bad_input_is_refused_before_anything_is_written(store: Any) -> None:
    gw = ScriptedGateway(echo)
    conv = chat(store, gw)
    for bad in ("", None, 3):
        with pytest.raises(UsageError):
            conv.send_sync(bad)  # type: ignore[arg-type]
    assert store.checkpoint("c1") is None
    with pytest.raises(UsageError):
        AGENT.conversation(session="nope")  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        AGENT.conversation(session=Session("x", gw, store), id="")
    # An agent run's id is not a conversation.
    AGENT.run_sync("task", session=Session("plain", gw, store))
    with pytest.raises(UsageError, match="not a conversation"):
        chat(store, gw, "plain").send_sync("hi")


def test_a_conversation_id_other_than_the_sessions(store: Any) -> None:
    conv = AGENT.conversation(session=Session("ignored", ScriptedGateway(echo), store), id="chat-9")
    assert conv.send_sync("x").run_id == "chat-9/m0001"
    assert store.checkpoint("ignored") is None


def test_a_conversation_streams_its_answers(store: Any) -> None:
    conv = chat(store, ScriptedGateway(echo))

    async def go() -> list[str]:
        stream = conv.stream("hola")
        texts = [t.text async for t in stream]
        assert stream.result is not None and stream.result.output == "re: hola (after 0)"
        return texts

    assert asyncio.run(go()) == ["re: hola (after 0)"]
    shown: list[str] = []
    again = chat(store, ScriptedGateway(echo))
    result = again.stream("hola", on_token=lambda t: shown.append(t.text)).run_sync()
    assert result.replayed and shown == ["re: hola (after 0)"]  # replayed: one token, from the journal


def test_the_guides_first_example_runs_as_written(tmp_path: Path) -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "guide" / "conversations.md"
    code = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)[0]
    expected = [line.split("# ", 1)[1] for line in code.splitlines() if line.startswith("print(")]
    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(page), "exec"), {})
    finally:
        os.chdir(cwd)
    assert out.getvalue().splitlines() == expected


@pytest.mark.postgres
def test_a_conversation_on_postgres_replays_without_paying_and_refuses_a_second_writer(
        pg_schemas: list[str]) -> None:  # noqa: F811
    from _pg import new_schema, schema_url, server_or_skip

    from cuaderno import open_journal

    server_or_skip()
    schema = new_schema()
    pg_schemas.append(schema)
    store = open_journal(schema_url(schema))
    try:
        gw = ScriptedGateway(echo)
        conv = chat(store, gw)
        assert [conv.send_sync(t).output for t in ("a", "b")] == ["re: a (after 0)", "re: b (after 1)"]
        fresh = ScriptedGateway(echo)
        again = chat(store, fresh)
        assert [again.send_sync(t).replayed for t in ("a", "b")] == [True, True] and fresh.calls == 0
        with pytest.raises(ConversationDivergence):
            chat(store, fresh).send_sync("not a")
        assert again.send_sync("c").output == "re: c (after 2)"
    finally:
        store.close()


HUGE = "x" * 1_048_576


@pytest.mark.parametrize("error", [
    ConversationDivergence(HUGE, 3, HUGE, HUGE), MessageUnfinished(HUGE, HUGE, HUGE), ConversationClosed(HUGE),
], ids=lambda e: type(e).__name__)
def test_the_new_errors_quote_a_megabyte_short_and_pickle(error: Exception) -> None:
    text = str(error)
    assert len(text) < 10_000 and "(1048576 chars)" in text
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == text
    assert again.conversation_id == HUGE  # the field keeps the whole value
