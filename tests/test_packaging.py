"""cuaderno installs beside an application's own pinned packages (issue 22, part 1).

Runtime dependencies and extras declare compatible ranges; exact versions live only in
requirements.lock, which `make test` and CI install from. These tests fail when a `==` pin creeps
back into pyproject.toml, or when the lock and the ranges drift apart.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements() -> list[Requirement]:
    reqs = [Requirement(r) for r in PROJECT["dependencies"]]
    for extra in PROJECT["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return reqs


def _lock() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[_norm(name)] = Version(version)
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_no_dependency_is_pinned_to_one_version() -> None:
    pinned = [str(r) for r in _requirements() if any(s.operator in ("==", "===") for s in r.specifier)]
    assert pinned == []


def test_every_dependency_has_an_upper_bound_below_its_next_major() -> None:
    # A range with no upper bound lets a breaking major release into every application at once.
    unbounded = [str(r) for r in _requirements() if not any(s.operator == "<" for s in r.specifier)]
    assert unbounded == []


def test_the_lock_pins_every_dependency_inside_its_range() -> None:
    lock = _lock()
    missing = [r.name for r in _requirements() if _norm(r.name) not in lock]
    outside = [f"{r.name}=={lock[_norm(r.name)]} not in {r.specifier}" for r in _requirements()
               if _norm(r.name) in lock and lock[_norm(r.name)] not in r.specifier]
    assert (missing, outside) == ([], [])


def test_the_core_install_carries_no_sdk_and_no_dev_tool() -> None:
    # `make demo` installs only these: the SDKs, the database drivers and the test tools are extras.
    core = {_norm(Requirement(r).name) for r in PROJECT["dependencies"]}
    assert core == {"rfc8785", "pydantic", "typer", "rich", "opentelemetry-api", "zstandard"}
