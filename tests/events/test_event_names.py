"""Every kind and phase a module of ``src/`` writes is named in :mod:`cuaderno.events.names`.

The check reads the source (``ast``): every call that builds an event (``StepEvent(...)``, or a
helper called with the phase and kind: the loop's ``_event``, the conformance suite's ``_e``)
has its ``kind`` and ``phase`` arguments resolved to the strings they can be, where the source
says so: a literal, an f-string's leading text (``f"intent.{n}"`` is the ``intent`` family), either
branch of a conditional, a name assigned in the same module (``_KIND = "episode"``; ``phase =
"resolution" if ... else ...``) or a constant of another module (``PASS_PHASE``), ``Kind.X``.
A value the source cannot tell (a parameter passed through, a copied event's field) is not a new
name: it copies one already written. Mutant tests below prove the check finds an unnamed one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from cuaderno.events import names
from cuaderno.events.names import KINDS, NUMBERED, PHASES, Kind, Phase, family, nth

SRC = Path(__file__).resolve().parents[2] / "src" / "cuaderno"

FIXTURES = {SRC / "testing" / "conformance.py"}
"""Builds journals by hand to test the stores' contract: a store must keep any kind and phase
(``note``/``n``), so these are not names a run writes."""
WRITERS = {"StepEvent": (None, None), "_event": (1, 2), "_e": (2, 3)}
"""Calls that build an event, with the positions of their phase and kind arguments (when passed
positionally)."""


def _constants(tree: ast.Module) -> dict[str, list[ast.expr]]:
    """Every ``name = <expr>`` in a module, at any depth (a module constant or a local)."""
    out: dict[str, list[ast.expr]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out.setdefault(target.id, []).append(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out.setdefault(node.target.id, []).append(node.value)
    return out


def _global_constants() -> dict[str, list[ast.expr]]:
    """Module-level string constants of every module (what an imported name like ``PASS_PHASE`` is)."""
    out: dict[str, list[ast.expr]] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else (
                node.target if isinstance(node, ast.AnnAssign) else None)
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(target, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str):
                out.setdefault(target.id, []).append(value)
    return out


GLOBALS = _global_constants()


def values(node: ast.expr, local: dict[str, list[ast.expr]], depth: int = 0) -> Iterator[str]:
    """The strings ``node`` can evaluate to, where the source says so (see the module docstring)."""
    if depth > 8:
        return
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            yield first.value.rstrip(".") if first.value.endswith(".") else first.value
        elif isinstance(first, ast.FormattedValue):
            yield from values(first.value, local, depth + 1)
    elif isinstance(node, ast.IfExp):
        yield from values(node.body, local, depth + 1)
        yield from values(node.orelse, local, depth + 1)
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("Kind", "Phase"):
        yield getattr(Kind if node.value.id == "Kind" else Phase, node.attr)
    elif isinstance(node, ast.Name):
        for value in local.get(node.id) or GLOBALS.get(node.id) or ():
            yield from values(value, local, depth + 1)


def _callee(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def written(source: str) -> list[tuple[int, str, str]]:
    """``(line, "kind"|"phase", value)`` for every kind and phase ``source`` writes, where known."""
    tree = ast.parse(source)
    local = _constants(tree)
    out: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or _callee(node) not in WRITERS:
            continue
        phase_at, kind_at = WRITERS[_callee(node) or ""]
        args: dict[str, ast.expr] = {k.arg: k.value for k in node.keywords if k.arg in ("kind", "phase")}
        for field, at in (("phase", phase_at), ("kind", kind_at)):
            if field not in args and at is not None and len(node.args) > at:
                args[field] = node.args[at]
        for field, expr in args.items():
            out += [(node.lineno, field, value) for value in values(expr, local)]
    return out


def unnamed(source: str) -> list[str]:
    """What ``source`` writes that :mod:`cuaderno.events.names` does not name."""
    bad = []
    for line, field, value in written(source):
        if field == "kind" and value not in KINDS:
            bad.append(f"{line}: kind {value!r}")
        if field == "phase" and family(value) not in PHASES:
            bad.append(f"{line}: phase {value!r}")
    return bad


def test_every_kind_and_phase_written_is_named() -> None:
    found: list[str] = []
    seen: set[tuple[str, str]] = set()
    for path in sorted(set(SRC.rglob("*.py")) - FIXTURES):
        source = path.read_text()
        found += [f"{path.relative_to(SRC)}:{bad}" for bad in unnamed(source)]
        seen |= {(field, family(value)) for _, field, value in written(source)}
    assert found == [], "kinds or phases written but not named in cuaderno.events.names: " + ", ".join(found)
    # Not vacuous: the writers of every kind are found, and of the numbered phases.
    assert {value for field, value in seen if field == "kind"} == set(KINDS)
    assert {("phase", p) for p in ("start", "end", "intent", "result", "error", "uncertain", "resolution",
                                   "base", "migrate", "pass", "message", "decision", "request")} <= seen


def test_an_unnamed_kind_or_phase_is_found() -> None:
    mutants = {
        'StepEvent(run_id=r, step_id=s, phase="result", kind="widget", payload={})': ["kind 'widget'"],
        'StepEvent(run_id=r, step_id=s, phase=f"retry.{n}", kind="tool", payload={})': ["phase 'retry'"],
        'self._event(step_id, "verdict", "tool", payload={})': ["phase 'verdict'"],
        'StepEvent(run_id=r, step_id=s, phase="x" if n else "result", kind=KIND)': ["phase 'x'", "kind 'gadget'"],
    }
    for mutant, wanted in mutants.items():
        bad = unnamed(f'KIND = "gadget"\ndef f():\n    {mutant}\n')
        assert [b.split(": ", 1)[1] for b in bad] == wanted, mutant
    for fine in ('StepEvent(run_id=r, step_id="run", phase="start", kind="run")',
                 'StepEvent(run_id=r, step_id=s, phase=f"intent.{n}", kind=Kind.MODEL)',
                 "StepEvent(run_id=r, step_id=s, phase=ev.phase, kind=ev.kind)"):
        assert unnamed(f"def f():\n    {fine}\n") == [], fine


def test_names_and_numbers() -> None:
    assert family("intent.12") == "intent" and family("intent") == "intent" and family("base.7") == "base"
    assert family("t.x") == "t.x"  # only a trailing number is a number
    assert nth(Phase.INTENT, 1) == "intent" and nth(Phase.INTENT, 3) == "intent.3"
    assert NUMBERED <= PHASES
    assert set(names.__all__) == {"KINDS", "NUMBERED", "PHASES", "Kind", "Phase", "family", "nth"}
