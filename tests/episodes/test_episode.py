"""Child episodes in one process: budgets per episode, typed proposals, the parent's journal.

Every bad input of issue 23 has its test here: a proposal that fails validation, a path outside
the snapshot, a child tool that raises, a budget of zero or a negative one. Each checks that
nothing was applied (the apply callback's own calls) and nothing was lost from the parent's
journal (the events before are a prefix of the events after).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from cuaderno import (
    ErrorClass,
    ModelRequest,
    ModelResponse,
    ReplayDivergence,
    RunCancelled,
    RunClosed,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
    ToolError,
    UncertainEffect,
    UsageError,
    cancel,
    resolve,
    tool,
)
from cuaderno.episodes import Decision, Episode, EpisodeBudgets

RUN = "parent"


class Died(BaseException):
    """The process dies here (not an Exception: nothing in cuaderno catches it as a tool error)."""


TASK = "find the answer"


class Answer(BaseModel):
    value: int
    why: str


def good(value: int = 42) -> ModelResponse:
    return ScriptedGateway.text(json.dumps({"value": value, "why": "it says so"}))


def by_pass(passes: dict[int, list[ModelResponse]]) -> ScriptedGateway:
    """A model answering pass N from ``passes[N]`` by turn (the last pass's script repeats)."""

    def answer(request: ModelRequest) -> ModelResponse:
        first = next(m["content"] for m in request.messages if m.get("role") == "user")
        found = re.search(r"\(pass (\d+) of", first)
        n = min(int(found.group(1)) if found else 1, max(passes))
        turn = sum(1 for m in request.messages if m.get("role") == "assistant")
        return passes[n][min(turn, len(passes[n]) - 1)]

    return ScriptedGateway(answer)


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    root = tmp_path / "snapshot"
    root.mkdir()
    (root / "notes.txt").write_text("the answer is 42\n")
    (tmp_path / "secret.txt").write_text("TOP-SECRET outside the snapshot\n")
    return root


class Effects:
    """The apply callback and its own record of what it did (the test's truth)."""

    def __init__(self) -> None:
        self.applied: list[tuple[int, str]] = []

    def apply(self, proposal: Answer, key: str) -> dict[str, Any]:
        self.applied.append((proposal.value, key))
        return {"applied": proposal.value, "key": key}

    def lookup(self, proposal: Answer, key: str) -> dict[str, Any] | None:
        return next(({"applied": v, "key": k} for v, k in self.applied if k == key), None)


def accept(_: Answer) -> Decision:
    return Decision.apply("ok")


async def run(store: SqliteCheckpointer, gateway: ScriptedGateway, snapshot: Path, effects: Effects,
              budgets: EpisodeBudgets | None = None, decide: Any = accept, **kw: Any) -> Any:
    episode = Episode(name="find", instructions="Read and answer.", output=Answer,
                      budgets=budgets or EpisodeBudgets(turns_per_pass=4, passes=3, rejected_responses=2), **kw)
    return await episode.run(TASK, session=Session(RUN, gateway, store), snapshot=snapshot, decide=decide,
                             apply=effects.apply, lookup=effects.lookup)


def keys(store: SqliteCheckpointer, run_id: str = RUN) -> list[tuple[str, str, str | None]]:
    return [(e.step_id, e.phase, e.decision) for e in store.load(run_id)]


@pytest.mark.parametrize("bad", [{"turns_per_pass": 0}, {"passes": -1}, {"rejected_responses": 0},
                                 {"rejected_responses": -3}, {"passes": 1.5}, {"turns_per_pass": True},
                                 {"passes": None}])
def test_a_budget_of_zero_or_a_negative_one_is_a_usage_error(bad: dict[str, Any]) -> None:
    with pytest.raises(UsageError, match=next(iter(bad))):
        EpisodeBudgets(**bad)


def test_a_child_gets_no_tool_that_writes() -> None:
    @tool
    def write(path: str) -> str:
        """Write."""
        return path

    with pytest.raises(UsageError, match="not idempotent"):
        Episode(name="x", instructions="i", output=Answer, tools=[write])


async def test_an_answer_that_fails_validation_is_a_counted_rejection_asked_again_with_its_errors(
        tmp_path: Path, snapshot: Path) -> None:
    gw = by_pass({1: [ScriptedGateway.call("read_file", path="notes.txt"),
                      ScriptedGateway.text('{"value": "forty-two"}')],
                  2: [good()]})
    effects = Effects()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        result = await run(store, gw, snapshot, effects)
        assert (result.status, result.rejected, len(result.passes), result.turns) == ("applied", 1, 2, 3)
        assert [p.outcome for p in result.passes] == ["rejected", "proposal"]
        assert effects.applied == [(42, effects.applied[0][1])]
        # The second pass was asked again with the validation errors as feedback.
        second = next(m["content"] for m in gw.requests[-1].messages if m["role"] == "user")
        assert "(pass 2 of at most 3)" in second and "value" in second and "why" in second
        journal = keys(store)
        assert ("find.pass01", "decision", "another_pass") in journal
        assert store.checkpoint(RUN).status == "completed"  # type: ignore[union-attr]


async def test_rejections_are_capped_per_episode_not_per_round(tmp_path: Path, snapshot: Path) -> None:
    # Every pass answers prose. With 5 passes and a cap of 2 rejections the episode ends at the
    # third rejection: 3 model calls in all, not 5 passes of retries.
    gw = by_pass({1: [ScriptedGateway.text("I think it is forty-two.")]})
    effects = Effects()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        result = await run(store, gw, snapshot, effects,
                           EpisodeBudgets(turns_per_pass=4, passes=5, rejected_responses=2))
        before = store.load(RUN)
        assert (result.status, result.reason, result.rejected, len(result.passes)) == (
            "exhausted", "rejected_responses", 3, 3)
        assert gw.billed == 3 and effects.applied == []
        cp = store.checkpoint(RUN)
        assert cp is not None and cp.status == "failed" and cp.outcome["budget"] == "rejected_responses"  # type: ignore[index]
        # A closed parent is answered from its journal: no call, nothing written.
        again = await run(store, gw, snapshot, effects, EpisodeBudgets(turns_per_pass=4, passes=5,
                                                                       rejected_responses=2))
        assert again.replayed and again.status == "exhausted" and gw.billed == 3
        assert [e.row_hash for e in store.load(RUN)] == [e.row_hash for e in before]


async def test_a_model_that_rereads_forever_ends_on_the_turn_limit(tmp_path: Path, snapshot: Path) -> None:
    gw = by_pass({1: [ScriptedGateway.call("read_file", path="notes.txt")]})
    effects = Effects()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        result = await run(store, gw, snapshot, effects, EpisodeBudgets(turns_per_pass=5, passes=3,
                                                                         rejected_responses=2))
        assert (result.status, result.reason, result.turns, len(result.passes)) == (
            "exhausted", "turns_per_pass", 5, 1)
        assert gw.billed == 5 and effects.applied == []
        assert store.checkpoint(RUN).outcome["budget"] == "turns_per_pass"  # type: ignore[index,union-attr]


async def test_a_path_outside_the_snapshot_is_refused_and_told_to_the_child(tmp_path: Path, snapshot: Path) -> None:
    gw = by_pass({1: [ScriptedGateway.call("read_file", path="../secret.txt"),
                      ScriptedGateway.call("read_file", path=str(tmp_path / "secret.txt")), good()]})
    effects = Effects()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        result = await run(store, gw, snapshot, effects)
        assert result.status == "applied" and len(effects.applied) == 1
        child = store.load(result.passes[0].child_run_id)
        refused = [e.payload for e in child if e.kind == "tool" and e.phase == "result"]
        assert [r["outcome"] for r in refused] == ["error", "error"]
        assert all("refused path" in r["error"]["message"] for r in refused)
        assert not any("TOP-SECRET" in json.dumps(r.messages) for r in gw.requests)


async def test_a_child_tool_that_raises_ends_the_episode_failed_and_nothing_is_applied(
        tmp_path: Path, snapshot: Path) -> None:
    @tool(idempotent=True)
    def lookup_index(term: str) -> str:
        """Look a term up in the index."""
        raise RuntimeError("index corrupted")

    gw = by_pass({1: [ScriptedGateway.call("lookup_index", term="answer"), good()]})
    effects = Effects()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        result = await run(store, gw, snapshot, effects, tools=[lookup_index])
        assert (result.status, result.reason) == ("failed", "child_failed") and effects.applied == []
        assert result.passes[0].outcome == "ended"
        cp = store.checkpoint(RUN)
        assert cp is not None and cp.status == "failed" and cp.outcome["child"]["reason"] == "bug"  # type: ignore[index]
        assert ("find.pass01", "result", None) in keys(store)


async def test_a_child_tool_error_is_told_to_the_model_and_the_pass_goes_on(tmp_path: Path, snapshot: Path) -> None:
    @tool(idempotent=True)
    def lookup_index(term: str) -> str:
        """Look a term up in the index."""
        raise ToolError("no such term", error_class=ErrorClass.INVALID_INPUT)

    gw = by_pass({1: [ScriptedGateway.call("lookup_index", term="answer"), good(7)]})
    effects = Effects()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        result = await run(store, gw, snapshot, effects, tools=[lookup_index])
        assert result.status == "applied" and [v for v, _ in effects.applied] == [7]
        child = store.checkpoint(result.passes[0].child_run_id)
        assert child is not None and child.count("tool_errors") == 1


async def test_discard_closes_the_episode_without_applying(tmp_path: Path, snapshot: Path) -> None:
    gw = by_pass({1: [good()]})
    effects = Effects()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        result = await run(store, gw, snapshot, effects, decide=lambda p: Decision.discard("not needed"))
        assert (result.status, result.reason, effects.applied) == ("discarded", "not needed", [])
        assert store.checkpoint(RUN).status == "completed"  # type: ignore[union-attr]


async def test_another_pass_within_the_pass_budget_then_exhausted(tmp_path: Path, snapshot: Path) -> None:
    gw = by_pass({1: [good(1)], 2: [good(2)]})
    effects = Effects()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        result = await run(store, gw, snapshot, effects, EpisodeBudgets(turns_per_pass=2, passes=2,
                                                                         rejected_responses=1),
                           decide=lambda p: Decision.another_pass(f"{p.value} is wrong"))
        assert (result.status, result.reason, len(result.passes), gw.billed) == ("exhausted", "passes", 2, 2)
        assert "1 is wrong" in next(m["content"] for m in gw.requests[-1].messages if m["role"] == "user")
        assert result.proposal is not None and result.proposal.value == 2 and effects.applied == []


async def test_a_decide_that_returns_no_decision_is_a_usage_error_and_nothing_is_decided(
        tmp_path: Path, snapshot: Path) -> None:
    gw = by_pass({1: [good()]})
    effects = Effects()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        with pytest.raises(UsageError, match="Decision"):
            await run(store, gw, snapshot, effects, decide=lambda p: True)
        assert not any(phase == "decision" for _, phase, _ in keys(store)) and effects.applied == []
        # Resumed with a decide that works: the child pass is not run again (0 model calls).
        billed = gw.billed
        result = await run(store, gw, snapshot, effects)
        assert result.status == "applied" and gw.billed == billed and len(effects.applied) == 1


async def test_a_resumed_parent_never_redecides_a_pass_nor_reruns_a_child(tmp_path: Path, snapshot: Path) -> None:
    gw = by_pass({1: [ScriptedGateway.call("read_file", path="notes.txt"), good(1)], 2: [good(2)]})
    effects = Effects()
    decided: list[int] = []

    def decide(p: Answer) -> Decision:
        decided.append(p.value)
        if p.value == 2 and decided.count(2) == 1:
            raise Died  # the parent dies while deciding pass 2
        return Decision.another_pass("no") if p.value == 1 else Decision.apply("yes")

    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        with pytest.raises(Died):
            await run(store, gw, snapshot, effects, decide=decide)
        assert gw.billed == 3
        result = await run(store, gw, snapshot, effects, decide=decide)
        assert result.status == "applied" and gw.billed == 3  # no child pass ran again
        assert decided == [1, 2, 2]  # pass 1's decision was read from the journal
        assert len(effects.applied) == 1


async def test_an_apply_of_unknown_fate_stops_needs_human_and_a_person_settles_it(
        tmp_path: Path, snapshot: Path) -> None:
    gw = by_pass({1: [good()]})
    calls: list[str] = []

    def apply(p: Answer, key: str) -> dict[str, Any]:
        calls.append(key)
        raise OSError("connection reset while writing")

    episode = Episode(name="find", instructions="Read and answer.", output=Answer)
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        session = Session(RUN, gw, store)
        with pytest.raises(UncertainEffect):
            await episode.run(TASK, session=session, snapshot=snapshot, decide=accept, apply=apply)
        cp = store.checkpoint(RUN)
        assert cp is not None and cp.status == "needs_human" and list(cp.uncertain) == ["find.pass01.apply"]
        before = store.load(RUN)
        # Without a lookup, a resume refuses to guess again: nothing runs, nothing is written.
        with pytest.raises(UncertainEffect):
            await episode.run(TASK, session=session, snapshot=snapshot, decide=accept, apply=apply)
        assert len(calls) == 1 and [e.row_hash for e in store.load(RUN)] == [e.row_hash for e in before]
        # A person checked: it happened. The resume closes the episode with that receipt.
        resolve(store, RUN, "find.pass01.apply", happened=True, result={"found": "by hand"}, by="ana")
        result = await episode.run(TASK, session=session, snapshot=snapshot, decide=accept, apply=apply)
        assert (result.status, result.receipt, len(calls), gw.billed) == ("applied", {"found": "by hand"}, 1, 1)
        assert store.checkpoint(RUN).status == "completed"  # type: ignore[union-attr]


async def test_an_apply_refused_with_a_tool_error_ends_failed_with_nothing_applied(
        tmp_path: Path, snapshot: Path) -> None:
    gw = by_pass({1: [good()]})

    def apply(p: Answer, key: str) -> dict[str, Any]:
        raise ToolError("the file changed since the snapshot", error_class=ErrorClass.CONFLICT)

    episode = Episode(name="find", instructions="Read and answer.", output=Answer)
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        result = await episode.run(TASK, session=Session(RUN, gw, store), snapshot=snapshot, decide=accept,
                                   apply=apply)
        assert (result.status, result.reason) == ("failed", "apply_failed")
        cp = store.checkpoint(RUN)
        assert cp is not None and cp.status == "failed" and cp.count("tool_errors") == 1


async def test_bad_arguments_are_usage_errors_and_nothing_is_written(tmp_path: Path, snapshot: Path) -> None:
    episode = Episode(name="find", instructions="i", output=Answer)
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        session = Session(RUN, by_pass({1: [good()]}), store)
        with pytest.raises(UsageError):
            await episode.run(TASK, session=session, snapshot=tmp_path / "missing", decide=accept)
        with pytest.raises(UsageError):
            await episode.run(TASK, session=session, snapshot=snapshot, decide="apply")  # type: ignore[arg-type]
        assert store.checkpoint(RUN) is None
    with pytest.raises(UsageError):
        Episode(name="../x", instructions="i", output=Answer)
    with pytest.raises(UsageError):
        Episode(name="x", instructions="i", output=dict)  # type: ignore[type-var]


async def test_a_cancelled_parent_starts_no_other_pass_and_applies_nothing(tmp_path: Path, snapshot: Path) -> None:
    gw = by_pass({1: [good(1)], 2: [good(2)]})
    effects = Effects()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:

        def decide(p: Answer) -> Decision:
            cancel(store, RUN, "the user changed their mind", by="ana")  # while the parent decides
            return Decision.another_pass("try again")

        with pytest.raises(RunCancelled):
            await run(store, gw, snapshot, effects, decide=decide)
        cp = store.checkpoint(RUN)
        assert cp is not None and cp.status == "cancelled" and gw.billed == 1 and effects.applied == []
        assert ("find.pass02", "intent", None) not in keys(store)
        with pytest.raises(RunClosed):  # a cancelled parent is not reopened
            await run(store, gw, snapshot, effects)
        assert gw.billed == 1


async def test_a_cancellation_found_on_opening_closes_the_parent_and_its_open_child(
        tmp_path: Path, snapshot: Path) -> None:
    @tool(idempotent=True)
    def peek(term: str) -> str:
        """Peek."""
        raise Died  # the process dies inside the child pass

    gw = by_pass({1: [ScriptedGateway.call("peek", term="x"), good()]})
    effects = Effects()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        with pytest.raises(Died):
            await run(store, gw, snapshot, effects, tools=[peek])
        child = "parent/find.pass01"
        assert store.checkpoint(child).is_open  # type: ignore[union-attr]
        cancel(store, RUN, "stop", by="ana")
        with pytest.raises(RunCancelled):
            await run(store, gw, snapshot, effects, tools=[peek])
        assert store.checkpoint(RUN).status == "cancelled" and effects.applied == []  # type: ignore[union-attr]
        assert store.checkpoint(child).cancel_requested is not None and gw.billed == 1  # type: ignore[union-attr]


async def test_an_apply_a_person_says_did_not_happen_is_applied_again_once(tmp_path: Path, snapshot: Path) -> None:
    gw = by_pass({1: [good()]})
    effects = Effects()
    attempts: list[str] = []

    def apply(p: Answer, key: str) -> dict[str, Any]:
        attempts.append(key)
        if len(attempts) == 1:
            raise OSError("timed out")  # nobody knows whether it happened
        return effects.apply(p, key)

    episode = Episode(name="find", instructions="Read and answer.", output=Answer)
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        session = Session(RUN, gw, store)
        with pytest.raises(UncertainEffect):
            await episode.run(TASK, session=session, snapshot=snapshot, decide=accept, apply=apply)
        resolve(store, RUN, "find.pass01.apply", happened=False, by="ana", note="checked: not there")
        result = await episode.run(TASK, session=session, snapshot=snapshot, decide=accept, apply=apply)
        assert result.status == "applied" and len(effects.applied) == 1 and attempts[0] == attempts[1]
        assert ("find.pass01.apply", "intent.2", None) in keys(store) and gw.billed == 1


async def test_a_child_cancelled_alone_ends_the_episode_failed_not_the_parent_cancelled(
        tmp_path: Path, snapshot: Path) -> None:
    @tool(idempotent=True)
    def peek(term: str) -> str:
        """Peek."""
        raise Died

    gw = by_pass({1: [ScriptedGateway.call("peek", term="x"), good()]})
    effects = Effects()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        with pytest.raises(Died):
            await run(store, gw, snapshot, effects, tools=[peek])
        cancel(store, "parent/find.pass01", "wrong snapshot", by="ana")
        result = await run(store, gw, snapshot, effects, tools=[peek])
        assert (result.status, result.reason, effects.applied, gw.billed) == ("failed", "child_cancelled", [], 1)
        cp = store.checkpoint(RUN)
        assert cp is not None and cp.status == "failed" and cp.cancel_requested is None


async def test_an_apply_whose_receipt_the_journal_cannot_hold_is_still_recorded_as_applied(
        tmp_path: Path, snapshot: Path) -> None:
    gw = by_pass({1: [good()]})
    applied: list[str] = []

    def apply(p: Answer, key: str) -> Any:
        applied.append(key)
        return {"nan": float("nan")}

    episode = Episode(name="find", instructions="Read and answer.", output=Answer)
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        session = Session(RUN, gw, store)
        result = await episode.run(TASK, session=session, snapshot=snapshot, decide=accept, apply=apply)
        assert result.status == "applied" and "receipt_not_journalable" in result.receipt and len(applied) == 1
        again = await episode.run(TASK, session=session, snapshot=snapshot, decide=accept, apply=apply)
        assert again.replayed and len(applied) == 1


async def test_empty_generations_and_invalid_answers_share_one_cap_per_episode(tmp_path: Path, snapshot: Path) -> None:
    # Pass 1: an empty 200 (the child's loop rejects it and asks again), then prose (the parent
    # rejects it): 2 rejections. Pass 2: an empty 200 again is the third: over the cap of 2, the
    # episode ends there, whatever budget of its own the child's loop would have had.
    answers = [ScriptedGateway.empty(), ScriptedGateway.text("forty-two"), ScriptedGateway.empty(), good()]
    gw = ScriptedGateway(lambda request: answers.pop(0))  # in call order: a rejected turn is asked again
    effects = Effects()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        result = await run(store, gw, snapshot, effects, EpisodeBudgets(turns_per_pass=4, passes=3,
                                                                         rejected_responses=2))
        assert (result.status, result.reason, result.rejected, len(result.passes)) == (
            "exhausted", "rejected_responses", 3, 2)
        assert [p.rejected for p in result.passes] == [2, 1] and gw.calls == 3 and effects.applied == []


class Canned:
    """A runner that answers every pass without a model: the seam's contract, nothing else."""

    def __init__(self, answers: list[str | None]) -> None:
        self.answers = answers
        self.asked: list[Any] = []

    async def run(self, episode: Any, child: Any) -> Any:
        from cuaderno.episodes import ChildOutcome

        self.asked.append(child)
        output = self.answers[child.number - 1]
        return ChildOutcome(status="completed" if output is not None else "failed", output=output,
                            outcome={} if output is not None else {"reason": "bug"}, turns=1)

    def cancel(self, child_run_id: str, reason: str, *, by: str) -> None:
        pass


async def test_a_child_runner_is_asked_for_each_pass_and_its_outcome_journaled(tmp_path: Path) -> None:
    runner = Canned(['{"value": "x"}', json.dumps({"value": 7, "why": "canned"})])
    effects = Effects()
    episode = Episode(name="find", instructions="Read and answer.", output=Answer)
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        result = await episode.run(TASK, session=Session(RUN, by_pass({1: [good()]}), store), decide=accept,
                                   apply=effects.apply, runner=runner)  # no snapshot: the runner has its own
        assert (result.status, [p.outcome for p in result.passes], result.turns) == ("applied", ["rejected", "proposal"], 2)
        assert [c.run_id for c in runner.asked] == ["parent/find.pass01", "parent/find.pass02"]
        assert "(pass 2 of at most 3)" in runner.asked[1].task and "value" in runner.asked[1].task
        assert [c.rejected_left for c in runner.asked] == [2, 1] and [v for v, _ in effects.applied] == [7]


async def test_an_episode_without_snapshot_or_runner_is_a_usage_error(tmp_path: Path) -> None:
    episode = Episode(name="find", instructions="i", output=Answer)
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        with pytest.raises(UsageError, match="snapshot"):
            await episode.run(TASK, session=Session(RUN, by_pass({1: [good()]}), store), decide=accept)
        assert store.checkpoint(RUN) is None


class LostReply(Effects):
    """The first call's reply is lost (an ambiguous ToolError) after it applied (``applies``) or
    before it did (the receiver then holds nothing); later calls apply."""

    def __init__(self, applies: bool) -> None:
        super().__init__()
        self.applies, self.calls = applies, 0

    def apply(self, proposal: Answer, key: str) -> dict[str, Any]:
        self.calls += 1
        if self.calls == 1:
            if self.applies:
                super().apply(proposal, key)
            raise ToolError("the reply was lost", error_class=ErrorClass.AMBIGUOUS, sent=True)
        return super().apply(proposal, key)


@pytest.mark.parametrize("applied_first", [True, False])
async def test_an_ambiguous_apply_is_settled_by_the_lookup(tmp_path: Path, snapshot: Path, applied_first: bool) -> None:
    gw = by_pass({1: [good()]})
    effects = LostReply(applied_first)
    episode = Episode(name="find", instructions="Read and answer.", output=Answer)
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        result = await episode.run(TASK, session=Session(RUN, gw, store), snapshot=snapshot, decide=accept,
                                   apply=effects.apply, lookup=effects.lookup)
        assert result.status == "applied" and len(effects.applied) == 1
        journal = {(e.step_id, e.phase): e for e in store.load(RUN)}
        done = journal[("find.pass01.apply", "result")].payload
        if applied_first:  # found by the lookup: adopted, never applied again
            assert effects.calls == 1 and done["counters"] == {"reconciled": 1}
            assert ("find.pass01.apply", "intent.2") not in journal
        else:  # absence proven: applied again, same key
            again = journal[("find.pass01.apply", "intent.2")].payload
            assert effects.calls == 2 and (again["attempt"], again["after"]) == (2, "absent")
            assert again["effect_key"] == journal[("find.pass01.apply", "intent")].payload["effect_key"]
        assert ("find.pass01.apply", "uncertain") not in journal


async def test_the_apply_key_is_an_effect_key_and_its_intent_says_not_idempotent(tmp_path: Path, snapshot: Path) -> None:
    from cuaderno.episodes.episode import EPISODE_VERSION
    from cuaderno.loop.runner import effect_key

    effects = Effects()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        result = await run(store, by_pass({1: [good()]}), snapshot, effects)
        key = effect_key("default", RUN, "apply", {"value": 42, "why": "it says so"}, EPISODE_VERSION)
        assert result.receipt == {"applied": 42, "key": key} and effects.applied == [(42, key)]
        intent = next(e for e in store.load(RUN) if (e.step_id, e.phase) == ("find.pass01.apply", "intent"))
        assert intent.payload == {"effect_key": key, "idempotent": False}


@pytest.mark.parametrize("choice", ["refuse", "drain", "resume", "cancel"])
async def test_a_parent_resumed_under_other_versions_follows_on_version_mismatch(
        tmp_path: Path, snapshot: Path, choice: Any) -> None:
    from cuaderno import DrainOnOldWorker, VersionMismatch

    gw = by_pass({1: [good()]})
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        await Episode(name="find", instructions="Read and answer.", output=Answer).run(
            TASK, session=Session(RUN, gw, store), snapshot=snapshot, decide=accept, apply=Effects().apply)
        before = [e.row_hash for e in store.load(RUN)]
        changed = Episode(name="find", instructions="Read it all and answer.", output=Answer)
        expected: Any = {"refuse": VersionMismatch, "drain": DrainOnOldWorker}.get(choice, UsageError)
        with pytest.raises(expected) as raised:
            await changed.run(TASK, session=Session(RUN, gw, store, on_version_mismatch=choice), snapshot=snapshot,
                              decide=accept, apply=Effects().apply)
        if expected is UsageError:  # named, never silently ignored
            assert repr(choice) in str(raised.value) and "on_version_mismatch" in str(raised.value)
        assert [e.row_hash for e in store.load(RUN)] == before and gw.billed == 1


async def test_the_parent_takes_and_releases_the_run_through_the_sessions_ownership(
        tmp_path: Path, snapshot: Path) -> None:
    from cuaderno.loop.ownership import ProcessOwnership

    class Recording(ProcessOwnership):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[str, str]] = []

        def acquire(self, store: Any, run_id: str, owner: str, *, force: bool, open_only: bool = False) -> int:
            self.calls.append(("acquire", run_id))
            assert open_only
            return super().acquire(store, run_id, owner, force=force, open_only=open_only)

        def release(self, store: Any, run_id: str, epoch: int) -> None:
            self.calls.append(("release", run_id))
            super().release(store, run_id, epoch)

    own = Recording()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        session = Session(RUN, by_pass({1: [good()]}), store, ownership=own)
        result = await Episode(name="find", instructions="Read and answer.", output=Answer).run(
            TASK, session=session, snapshot=snapshot, decide=accept, apply=Effects().apply)
        assert result.status == "applied"
        parent = [c for c in own.calls if c[1] == RUN]
        assert parent == [("acquire", RUN), ("release", RUN)]


async def test_a_parent_resumed_under_another_tenant_is_refused_and_nothing_is_written(
        tmp_path: Path, snapshot: Path) -> None:
    """The parent checks what the runner checks before it goes on (durable.opening): every effect
    key holds the tenant, so a run started under one is never resumed under another."""
    def apply(p: Answer, key: str) -> dict[str, Any]:
        raise OSError("connection reset while writing")  # the run stops needs_human, open

    episode = Episode(name="find", instructions="Read and answer.", output=Answer)
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        with pytest.raises(UncertainEffect):
            await episode.run(TASK, session=Session(RUN, by_pass({1: [good()]}), store, tenant="acme"),
                              snapshot=snapshot, decide=accept, apply=apply)
        before = [e.row_hash for e in store.load(RUN)]
        with pytest.raises(ReplayDivergence, match="tenant"):
            await episode.run(TASK, session=Session(RUN, by_pass({1: [good()]}), store, tenant="globex"),
                              snapshot=snapshot, decide=accept, apply=apply)
        assert [e.row_hash for e in store.load(RUN)] == before
