"""One writer: only the durable-step protocols (:mod:`cuaderno.durable`) write a model or tool
step's intent, result, error or uncertainty. Any other module of ``src/`` that builds such an
event (a ``StepEvent``, or a helper called with the kind and phase) fails here, by name and line.

The check reads the source (``ast``): a call with a literal kind ``model``/``tool`` (keyword or
positional) and a literal phase that is, or starts, ``intent``, ``result``, ``error`` or
``uncertain`` (an f-string's leading text counts). A mutant test below proves it finds one.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "cuaderno"
PROTOCOL = SRC / "durable"
FIXTURES = {SRC / "testing" / "conformance.py"}
"""Builds journals by hand to test the stores' contract (what a store must accept or refuse): it
writes no run's steps."""
READERS = {"_recorded"}
"""Calls that name a step's kind and phase to read it (replay's check of a recorded event)."""
KINDS = {"model", "tool"}
PHASES = ("intent", "result", "error", "uncertain")


def _text(node: ast.expr) -> str | None:
    """A literal string, or an f-string's leading literal text."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
    return None


def _writes_a_step(call: ast.Call) -> bool:
    callee = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
    if callee in READERS:
        return False
    texts = [_text(a) for a in call.args] + [_text(k.value) for k in call.keywords if k.arg in ("kind", "phase")]
    kinds = {t for t in texts if t in KINDS}
    phases = [t for t in texts if t is not None and t.split(".")[0] in PHASES]
    return bool(kinds) and bool(phases)


def writers(source: str) -> list[int]:
    """Lines of ``source`` that build a model or tool intent/result/error/uncertainty."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and _writes_a_step(node)]


def test_only_the_protocol_modules_write_model_and_tool_steps() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if PROTOCOL in path.parents or path in FIXTURES:
            continue
        found += [f"{path.relative_to(SRC)}:{line}" for line in writers(path.read_text())]
    assert found == [], "model or tool steps written outside cuaderno.durable: " + ", ".join(found)


def test_the_protocol_modules_are_where_they_are_written() -> None:
    """The check is not vacuous: the protocol's own modules are found by it."""
    assert writers((PROTOCOL / "model_call.py").read_text())
    assert writers((PROTOCOL / "effect.py").read_text())


def test_a_second_writer_is_found() -> None:
    mutants = [
        'StepEvent(run_id=r, step_id=s, phase="result", kind="tool", payload={})',
        'StepEvent(run_id=r, step_id=s, phase=f"intent.{n}", kind="model", payload={})',
        'self._event(step_id, "uncertain", "tool", payload=evidence)',
        'self._event(step_id, f"error.{sends}", "model", payload={})',
    ]
    for mutant in mutants:
        assert writers(f"def f():\n    {mutant}\n") == [2], mutant
    # What the check leaves alone: other kinds, other phases of a tool step.
    for fine in ('StepEvent(run_id=r, step_id="run", phase="start", kind="run")',
                 'self._event(step_id, "decision", "tool", payload={})',
                 'StepEvent(run_id=r, step_id=s, phase="resolution", kind="tool")'):
        assert writers(f"def f():\n    {fine}\n") == [], fine


# -- approvals ------------------------------------------------------------------------------------

APPROVAL_PHASES = ("request", "decision")
APPROVAL_WRITERS = {
    "request": {PROTOCOL / "approval.py"},  # the loop's and every integration's request
    "decision": {SRC / "operations.py"},  # a person's decision: `cuaderno approve`/`deny`, the page
}
"""Who may build an approval event of each phase."""


def approval_writers(source: str) -> list[tuple[int, str]]:
    """Lines of ``source`` that build an approval request or decision, with the phase."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if callee in READERS:
            continue
        texts = [_text(a) for a in node.args] + [_text(k.value) for k in node.keywords if k.arg in ("kind", "phase")]
        if "approval" in texts:
            found += [(node.lineno, t) for t in texts if t in APPROVAL_PHASES]
    return found


def test_only_the_approval_protocol_the_loop_and_a_persons_decision_write_approvals() -> None:
    """An integration under another framework writes its approvals through
    :mod:`cuaderno.durable.approval`, never by hand in the loop's shape."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path in FIXTURES:
            continue
        for line, phase in approval_writers(path.read_text()):
            if path not in APPROVAL_WRITERS[phase]:
                found.append(f"{path.relative_to(SRC)}:{line} ({phase})")
    assert found == [], "approval events written outside their writers: " + ", ".join(found)
    assert approval_writers((PROTOCOL / "approval.py").read_text())  # not vacuous: the protocol is found


def test_a_hand_written_approval_is_found() -> None:
    mutant = ('StepEvent(run_id=r, step_id=a, phase="request", kind="approval", name=t, '
              'decision="require_approval", fingerprint=fp, payload={})')
    assert approval_writers(f"def f():\n    {mutant}\n") == [(2, "request")]
    assert approval_writers('def f():\n    self._recorded(a, "request", "approval", t, fp)\n') == []
