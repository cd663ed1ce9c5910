"""The error classes themselves (issue 19 item 7): bounded messages, a complete ``__all__`` and tree."""

from __future__ import annotations

import inspect
import pickle
import re
from pathlib import Path
from typing import Any

import pytest

import cuaderno
from cuaderno import SqliteCheckpointer, StepEvent, approve, deny, errors, resolve
from cuaderno.errors import CuadernoError, clipped, quoted

MB = 1_048_576
HUGE = "x" * MB
MARK = f"...({MB} chars)"
LIMIT = 10_000
"""No message built from a megabyte of input may be longer than this."""


def _public_exceptions() -> dict[str, type[BaseException]]:
    return {name: cls for name, cls in vars(errors).items()
            if inspect.isclass(cls) and issubclass(cls, BaseException) and cls.__module__ == errors.__name__
            and not name.startswith("_")}


# -- 7c: every public error is exported and drawn in the tree ---------------------------------------------


def test_all_names_every_public_exception_class() -> None:
    classes = _public_exceptions()
    assert {"RunBusy", "RunChanged", "ToolResultInvalid"} <= set(classes)  # the check looks at real classes
    missing = sorted(set(classes) - set(errors.__all__))
    assert missing == [], f"missing from cuaderno.errors.__all__: {missing}"
    missing_top = sorted(set(classes) - set(cuaderno.__all__))
    assert missing_top == [], f"missing from cuaderno.__all__: {missing_top}"


def _tree(text: str) -> dict[str, int]:
    """Each class drawn in an error tree (``├── Name``), with its depth."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r"^\s*((?:│   |    )*)(?:├── |└── )(\w+)", line)
        if match:
            found[match.group(2)] = len(match.group(1)) // 4 + 1
        elif re.match(r"^\s*CuadernoError\s*$", line):
            found["CuadernoError"] = 0
    return found


def test_the_error_tree_draws_every_public_error_under_its_real_base() -> None:
    tree = _tree(errors.__doc__ or "")
    classes = {name: cls for name, cls in _public_exceptions().items() if issubclass(cls, CuadernoError)}
    missing = sorted(set(classes) - set(tree))
    assert missing == [], f"missing from the tree in cuaderno.errors' docstring: {missing}"
    for name, cls in classes.items():  # drawn one level below its base: the tree is not just a list
        base = cls.__mro__[1]
        if base is not Exception:
            assert tree[name] == tree[base.__name__] + 1, name
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    drawn = _tree(readme)
    if drawn:  # a README that draws the tree draws all of it
        assert sorted(set(classes) - set(drawn)) == []


# -- 7b: a long input is cut, and its length given ---------------------------------------------------------


def test_clipped_and_quoted() -> None:
    assert clipped("abc") == "abc" and quoted("abc") == "'abc'"
    assert clipped("a" * 50, 10) == "a" * 10 + "...(50 chars)"
    assert quoted("é" * 300) == repr("é" * 200) + "...(300 chars)"
    assert quoted({"k": "v" * 500}).endswith(f"...({len(repr({'k': 'v' * 500}))} chars)")
    assert quoted(HUGE).isascii() and len(quoted(HUGE)) < 300


@pytest.mark.parametrize("error", [
    errors.JournalConflict(HUGE, HUGE, HUGE), errors.RunChanged(HUGE, 1, 2), errors.FencedOut(HUGE, 1, 2),
    errors.RunBusy(HUGE, HUGE), errors.RunNotFound(HUGE), errors.RunClosed(HUGE, HUGE),
    errors.RunCancelled(HUGE, {"reason": HUGE}), errors.ReplayDivergence(HUGE, HUGE, HUGE, HUGE),
    errors.UncertainEffect(HUGE, HUGE, {"tool": HUGE}), errors.VersionMismatch(HUGE, {"agent": HUGE}, {"agent": "b"}),
    errors.BudgetExceeded(HUGE, HUGE, 3), errors.SchemaTooNew(2, 1, what=HUGE),
    errors.ToolResultInvalid(HUGE, HUGE, HUGE, HUGE),
], ids=lambda e: type(e).__name__)
def test_a_megabyte_of_input_makes_a_short_message_that_says_how_long_it_was(error: CuadernoError) -> None:
    text = str(error)
    assert len(text) < LIMIT and f"({MB} chars)" in text, text[:300]
    assert getattr(error, "run_id", HUGE) == HUGE  # the field keeps the whole value; only the message is cut
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == text


def test_short_input_is_quoted_whole() -> None:
    assert str(errors.RunNotFound("run-1")) == "no run 'run-1' in this journal"
    text = str(errors.ReplayDivergence("r", "t0001.model", "a model call", "a tool call"))
    assert "the journal recorded a model call, but the code now asks for a tool call" in text


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = SqliteCheckpointer(tmp_path / "runs.db")
    yield s
    s.close()


def test_the_harness_quotes_long_ids_short(store: Any) -> None:
    store.append([StepEvent(run_id="r", step_id="run", phase="start", kind="run", fingerprint="f",
                            payload={"task": "t", "versions": {}})])
    store.append([StepEvent(run_id="r", step_id="t0000.tool00.approval", phase="request", kind="approval",
                            name="pay", decision="require_approval", fingerprint="fp-1",
                            payload={"tool_step": "t0000.tool00", "arguments": {"to": "a"}})])
    calls = [lambda: approve(store, HUGE, "t0000.tool00"), lambda: deny(store, "r", HUGE),
             lambda: approve(store, "r", "t0000.tool00", fingerprint=HUGE),
             lambda: resolve(store, "r", HUGE, happened=False)]
    for call in calls:
        with pytest.raises(CuadernoError) as caught:
            call()
        text = str(caught.value)
        assert len(text) < LIMIT and "chars)" in text, text[:300]
    assert len(store.load("r")) == 2  # and nothing was written
