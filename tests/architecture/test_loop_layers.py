"""Imports inside ``cuaderno.loop`` go one way, and no module of it writes another's private fields.

The layers are the loop package's docstring's (:mod:`cuaderno.loop`): a module may import only
modules of a lower layer, at module level, under ``TYPE_CHECKING`` or inside a function alike.
The one declared exception is :mod:`cuaderno.loop.agent`'s entry points (``Agent.run`` and its
siblings build a runner, a stream or a conversation when called): listed below by name.

The check reads the source (``ast``); the mutant tests below prove it finds a back edge and a
write of a private field.
"""

from __future__ import annotations

import ast
from pathlib import Path

LOOP = Path(__file__).resolve().parents[2] / "src" / "cuaderno" / "loop"

LAYERS: list[set[str]] = [
    {"executor", "holds", "model_calls", "runtime", "steps", "versions"},
    {"ownership"},
    {"agent"},
    {"_state"},  # the run's state: a plain record
    {"_snapshots"},  # receives the state
    {"_log"},  # the run's journal as the steps write it (uses _snapshots for the snapshot row)
    {"_model_steps", "_tool_steps"},  # siblings: neither imports the other
    {"runner", "cleanup"},
    {"result"},
    {"streaming"},
    {"conversation"},
    {"__init__"},
]
ENTRY_POINTS = {("agent", "runner"), ("agent", "result"), ("agent", "streaming"), ("agent", "conversation")}
"""``Agent.run``/``run_to_end``/``run_sync``/``stream``/``conversation`` import what they build when
called: the agent is the package's front door, below what it builds."""


def _layer(module: str) -> int:
    for n, layer in enumerate(LAYERS):
        if module in layer:
            return n
    raise AssertionError(f"cuaderno.loop.{module} is in no layer of {__file__}: add it to LAYERS")


def _loop_imports(tree: ast.Module) -> list[tuple[str, int]]:
    """Every ``cuaderno.loop`` module ``tree`` imports, with the line (anywhere in the file)."""
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "cuaderno.loop":
                out += [(a.name, node.lineno) for a in node.names if (LOOP / f"{a.name}.py").exists()]
                if not any((LOOP / f"{a.name}.py").exists() for a in node.names):
                    out.append(("__init__", node.lineno))
            elif node.module.startswith("cuaderno.loop."):
                out.append((node.module.split(".")[2], node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name.split(".")[2], node.lineno) for a in node.names if a.name.startswith("cuaderno.loop.")]
    return out


def back_edges(sources: dict[str, str]) -> list[str]:
    """Each import of a module at the same or a higher layer, as ``module:line -> imported``."""
    found = []
    for module, text in sorted(sources.items()):
        for imported, line in _loop_imports(ast.parse(text)):
            if imported == module or (module, imported) in ENTRY_POINTS:
                continue
            if _layer(imported) >= _layer(module):
                found.append(f"{module}:{line} -> {imported}")
    return found


def foreign_private_writes(sources: dict[str, str]) -> list[str]:
    """Each assignment to ``x._name`` (or ``x._name[...]``) where ``x`` is not ``self``/``cls``:
    a module writing the private fields of an object it does not own."""
    found = []
    for module, text in sorted(sources.items()):
        for node in ast.walk(ast.parse(text)):
            targets: list[ast.expr]
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            else:
                continue
            while targets:
                target = targets.pop()
                if isinstance(target, (ast.Tuple, ast.List)):
                    targets.extend(target.elts)
                    continue
                while isinstance(target, ast.Subscript):
                    target = target.value  # the container written into
                if (isinstance(target, ast.Attribute) and target.attr.startswith("_")
                        and not target.attr.startswith("__")
                        and not (isinstance(target.value, ast.Name) and target.value.id in ("self", "cls"))):
                    found.append(f"{module}:{node.lineno} writes {ast.unparse(target)}")
    return found


def _sources() -> dict[str, str]:
    return {f.stem: f.read_text(encoding="utf-8") for f in LOOP.glob("*.py")}


def test_every_loop_module_has_a_layer() -> None:
    for module in _sources():
        _layer(module)


def test_imports_inside_the_loop_go_one_way() -> None:
    assert back_edges(_sources()) == []


def test_no_loop_module_writes_another_objects_private_fields() -> None:
    assert foreign_private_writes(_sources()) == []


def test_the_layer_check_finds_a_back_edge() -> None:
    """Mutants: the state importing the runner (even lazily), snapshots importing tool steps."""
    sources = _sources()
    sources["_state"] += "\n\ndef f() -> None:\n    from cuaderno.loop.runner import Runner\n"
    sources["_snapshots"] += "\nfrom cuaderno.loop import _tool_steps\n"
    sources["_model_steps"] += "\nfrom cuaderno.loop._tool_steps import ToolSteps\n"
    found = back_edges(sources)
    assert any(e.startswith("_state:") and e.endswith("-> runner") for e in found)
    assert any(e.startswith("_snapshots:") and e.endswith("-> _tool_steps") for e in found)
    assert any(e.startswith("_model_steps:") and e.endswith("-> _tool_steps") for e in found)


def test_the_private_write_check_finds_one() -> None:
    sources = {"_snapshots": "def opened(state):\n    state._snaps = 1\n    state._journal['k'] = 2\n"
                             "    self._ok = 3\n    a, state._b = 4, 5\n"}
    assert foreign_private_writes(sources) == ["_snapshots:2 writes state._snaps", "_snapshots:3 writes state._journal",
                                              "_snapshots:5 writes state._b"]


def test_the_run_state_is_a_plain_record() -> None:
    """``RunState`` declares fields only (no method, no property): the behaviour lives in the
    collaborators that receive it. A slots dataclass: a misspelt field write fails at once."""
    import dataclasses

    from cuaderno.loop._state import RunState

    tree = ast.parse((LOOP / "_state.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RunState")
    assert [n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))] == []
    assert dataclasses.is_dataclass(RunState) and "__slots__" in vars(RunState)
    assert {f.name for f in dataclasses.fields(RunState)} >= {"journal", "pending", "messages", "chain", "snaps"}
