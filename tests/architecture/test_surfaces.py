"""The package's surfaces: what one part of ``src/cuaderno`` may import from another.

- **No private import across packages.** A module whose name starts with ``_`` (``journal._sql``,
  ``ui._timeline``, ``cuaderno._json``) belongs to the package that holds it: only that
  package's own modules (and, for a subpackage, the packages nested in it) import it. The root
  package's private modules are for the root's own modules: a subpackage that needs one of
  their names gets it from a public module. A name starting with ``_`` is not imported from
  another package's module either. What a package offers, it offers under a public name (its
  ``__init__`` or a public module).
- **No production import of the test machinery**: only :mod:`cuaderno.testing` itself imports
  ``cuaderno.testing``; production code names its fault points through :mod:`cuaderno.faults`.
- **No cycle among the command line's modules** (:mod:`cuaderno.cli`), counting imports made
  inside functions too.

The checks read the source (``ast``), every import wherever it stands; the mutant tests below
prove each one finds what it forbids.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "cuaderno"


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _package(rel: Path) -> list[str]:
    """The package a module belongs to, as parts below ``cuaderno`` (``[]``: the root)."""
    return list(rel.parent.parts)


def imports(source: str, rel: Path) -> Iterator[tuple[int, list[str], list[str]]]:
    """Every import of a ``cuaderno`` module in ``source`` (the module at ``rel`` below
    ``src/cuaderno``): its line, the module's parts below ``cuaderno``, and the names imported
    from it (``[]`` for a plain ``import``)."""
    here = _package(rel)
    if rel.name == "__init__.py":  # an __init__'s relative imports resolve against its own package
        here = list(rel.parent.parts)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "cuaderno":
                    yield node.lineno, parts[1:], []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                parts = base + (node.module.split(".") if node.module else [])
            elif node.module is not None and node.module.split(".")[0] == "cuaderno":
                parts = node.module.split(".")[1:]
            else:
                continue
            yield node.lineno, parts, [a.name for a in node.names]


def _may_see(importer: list[str], owner: list[str]) -> bool:
    """Whether a module of package ``importer`` may import what is private to package ``owner``."""
    if not owner:  # the root's private modules are the root's own
        return importer == []
    return importer[: len(owner)] == owner


def _owner(target: list[str]) -> list[str] | None:
    """The package that owns what ``target`` names privately (``None``: nothing private)."""
    private = [i for i, p in enumerate(target) if _private(p)]
    return None if not private else target[: private[0]]


def _name_owner(module: list[str], name: str) -> list[str] | None:
    """The package that owns private ``name`` imported from ``module``: a private submodule's
    package, or (a private name defined in a module) the package holding that module."""
    if (SRC.joinpath(*module, name)).is_dir() or (SRC.joinpath(*module, name + ".py")).exists():
        return _owner(module + [name])
    if not _private(name):
        return None
    is_package = SRC.joinpath(*module).is_dir()
    return module if is_package else module[:-1]


def private_imports(source: str, rel: Path) -> list[str]:
    """The imports in ``source`` of a private module or name that another package owns, one
    entry per import statement."""
    importer = _package(rel)
    found = []
    for line, parts, names in imports(source, rel):
        owners = [_owner(parts)] + [_name_owner(parts, n) for n in names]
        if any(owner is not None and not _may_see(importer, owner) for owner in owners):
            found.append(f"{rel}:{line} -> cuaderno.{'.'.join(parts)} import {', '.join(names) or '*'}")
    return found


def _module_at(parts: list[str]) -> bool:
    return SRC.joinpath(*parts).is_dir() or SRC.joinpath(*parts).with_suffix(".py").exists()


def private_attributes(source: str, rel: Path) -> list[str]:
    """Uses of a private name through an imported module of another package (``render._GROUPS``
    in the page): the same rule as :func:`private_imports`, for what an import cannot show."""
    modules: dict[str, list[str]] = {}  # local name -> the cuaderno module it is bound to
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "cuaderno" and alias.asname and _module_at(parts[1:]):
                    modules[alias.asname] = parts[1:]
    for _, parts, names in imports(source, rel):
        for name in names:
            if _module_at(parts + [name]):
                modules[name] = parts + [name]
    importer = _package(rel)
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and _private(node.attr)):
            parts = modules[node.value.id]
            owner = parts if SRC.joinpath(*parts).is_dir() else parts[:-1]  # the package holding the module
            if not _may_see(importer, owner):
                found.append(f"{rel}:{node.lineno} -> cuaderno.{'.'.join(parts)}.{node.attr}")
    return found


def _modules() -> Iterator[tuple[Path, str]]:
    for path in sorted(SRC.rglob("*.py")):
        yield path.relative_to(SRC), path.read_text()


def test_no_private_import_across_packages() -> None:
    found = [hit for rel, source in _modules() for hit in private_imports(source, rel)]
    assert found == [], "private modules or names imported from another package:\n" + "\n".join(found)


def test_no_private_name_used_through_another_package_s_module() -> None:
    found = [hit for rel, source in _modules() for hit in private_attributes(source, rel)]
    assert found == [], "private names used through another package's module:\n" + "\n".join(found)


def test_the_private_attribute_check_finds_one() -> None:
    cases = {
        ("ui/app.py", "from cuaderno import render\nrender._escape_char('x')"): 1,
        ("cli/_runs.py", "import cuaderno.worker as worker\nworker._x(1)"): 1,
        ("cli/_runs.py", "from cuaderno.journal import sqlite\nsqlite._COLUMNS"): 1,
        # allowed: the root's own modules among themselves, a package's own, public names
        ("operations.py", "from cuaderno import render\nrender._escape_char('x')"): 0,
        ("ui/app.py", "from cuaderno.ui import _timeline\n_timeline._WIDTH"): 0,
        ("ui/app.py", "from cuaderno import render\nrender.dumps(1)"): 0,
    }
    for (where, source), expected in cases.items():
        assert len(private_attributes(source + "\n", Path(where))) == expected, (where, source)


def test_the_private_import_check_finds_one() -> None:
    cases = {
        ("ui/app.py", "from cuaderno.journal._open import _masked"): 1,
        ("ui/app.py", "from cuaderno.render import _escape_char"): 1,
        ("loop/runner.py", "from cuaderno._json import not_plain"): 1,
        ("cli/_decide.py", "from cuaderno import _json"): 1,
        ("cli/_runs.py", "import cuaderno.journal._claims"): 1,
        ("ui/app.py", "from .. import _json"): 1,
        ("worker.py", "from cuaderno.ui._journal import open_journal"): 1,
        ("cli/_runs.py", "from cuaderno.worker import _load"): 1,
        # allowed: a package's own private modules, public names, and the root's among its own
        ("journal/sqlite.py", "from cuaderno.journal._sql import SqlJournal"): 0,
        ("ui/app.py", "from cuaderno.ui import _timeline"): 0,
        ("ui/app.py", "from . import _timeline"): 0,
        ("events.py", "from cuaderno._json import sorted_compact"): 0,
        ("cli/_app.py", "from cuaderno.cli._common import fail"): 0,
        ("ui/app.py", "from cuaderno.journal import state_of"): 0,
    }
    for (where, line), expected in cases.items():
        assert len(private_imports(line + "\n", Path(where))) == expected, (where, line)


def production_imports_of_testing(source: str, rel: Path) -> list[int]:
    if rel.parts[0] == "testing":
        return []
    return [line for line, parts, names in imports(source, rel)
            if parts[:1] == ["testing"] or (parts == [] and "testing" in names)]


def test_no_production_module_imports_the_test_machinery() -> None:
    found = [f"{rel}:{line}" for rel, source in _modules() for line in production_imports_of_testing(source, rel)]
    assert found == [], "production modules importing cuaderno.testing: " + ", ".join(found)


def test_the_testing_check_finds_one() -> None:
    for line in ("from cuaderno.testing import crash", "from cuaderno.testing.crash import point",
                 "import cuaderno.testing.crash", "from cuaderno import testing"):
        assert production_imports_of_testing(f"def f():\n    {line}\n", Path("loop/runner.py")) == [2], line
    assert production_imports_of_testing("from cuaderno.faults import point\n", Path("loop/runner.py")) == []
    assert production_imports_of_testing("from cuaderno.testing.records import read_records\n",
                                          Path("testing/ledger.py")) == []


def cli_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Which ``cuaderno.cli`` module imports which (by name below ``cli``; ``__init__`` is ``""``)."""
    graph: dict[str, set[str]] = {}
    for name, source in sources.items():
        rel = Path("cli") / (f"{name}.py" if name else "__init__.py")
        edges = graph.setdefault(name, set())
        for _, parts, names in imports(source, rel):
            if parts[:1] != ["cli"]:
                continue
            if len(parts) > 1:
                edges.add(parts[1])
            else:  # `from cuaderno.cli import x`: the module x if there is one, else the package
                edges.update(n if n in sources else "" for n in names)
    for edges in graph.values():
        edges &= set(sources)
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, as the modules in order, or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, set())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_no_cycle_among_the_cli_modules() -> None:
    sources = {("" if p.name == "__init__.py" else p.stem): p.read_text() for p in (SRC / "cli").glob("*.py")}
    graph = cli_graph(sources)
    assert "_common" in graph and graph["_app"], graph  # the graph is read, not empty
    found = cycle(graph)
    assert found is None, "import cycle among cuaderno.cli modules: " + " -> ".join(found or [])


def test_the_cycle_check_finds_one() -> None:
    sources = {"_a": "from cuaderno.cli._b import x\n", "_b": "def f():\n    from cuaderno.cli import _a\n",
               "_c": "from cuaderno.cli._a import y\n"}
    assert cycle(cli_graph(sources)) == ["_a", "_b", "_a"]
    sources["_b"] = "from cuaderno.cli._c import z\n"
    assert cycle(cli_graph(sources)) is not None
    sources["_b"] = "from cuaderno.render import clean\n"
    assert cycle(cli_graph(sources)) is None


def test_the_cli_has_one_fail() -> None:
    """Every refusal of the command line goes through one ``fail`` (``cli._common``)."""
    defined = [f"{rel}" for rel, source in _modules()
               for node in ast.walk(ast.parse(source))
               if isinstance(node, ast.FunctionDef) and node.name in ("fail", "_fail") and rel.parts[0] == "cli"]
    assert defined == ["cli/_common.py"]
