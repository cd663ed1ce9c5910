"""The public surface: a sorted, complete ``__all__``, every name importable, errors picklable."""

from __future__ import annotations

import pickle

import pytest

import cuaderno
from cuaderno import errors


def test_all_is_sorted_and_importable() -> None:
    names = cuaderno.__all__
    upper = [n for n in names if n[0].isupper()]
    lower = [n for n in names if not n[0].isupper()]
    assert upper == sorted(upper) and lower == sorted(lower) and names == upper + lower
    for name in names:
        assert getattr(cuaderno, name) is not None


def test_the_seed_names_are_public() -> None:
    for name in ("Agent", "Session", "SqliteCheckpointer", "Checkpointer", "StepEvent", "ModelStep", "ToolStep",
                 "ApprovalStep", "FinalStep", "UncertainEffect", "Policy", "ScriptedGateway", "tool"):
        assert name in cuaderno.__all__


@pytest.mark.parametrize("error", [
    errors.JournalConflict("r", "s", "p"), errors.SchemaTooNew(9, 1), errors.FencedOut("r", 1, 2),
    errors.RunNotFound("r"), errors.RunClosed("r", "completed"), errors.ReplayDivergence("r", "s", "a", "b"),
    errors.UncertainEffect("r", "s", {"tool": "t", "effect_key": "k"}), errors.VersionMismatch("r", {"a": 1}, {"a": 2}),
    errors.ToolError("x", error_class=errors.ErrorClass.CONFLICT, sent=False, data={"v": 1}),
    errors.ToolArgumentsInvalid("bad", data={"errors": []}),
    errors.GatewayError("x", error_class=errors.ErrorClass.AMBIGUOUS, sent=True, retry_after=1.5, status=504),
    errors.BudgetExceeded("r", "retries", 3), errors.RunCancelled("r", {"reason": "x"}),
], ids=lambda e: type(e).__name__)
def test_errors_survive_a_round_trip(error: Exception) -> None:
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error)
