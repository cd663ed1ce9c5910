"""Every example runs and proves what it prints (each exits 1 when its own check fails), and what
the examples and the README show a person is what they do."""

from __future__ import annotations

import functools
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples" / "propiedades").glob("[0-9]*.py"))
README = ROOT / "README.md"


def run_example(script: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("CUADERNO_CRASH_AT", "CUADERNO_KEEP")} | env
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=full,
                          cwd=ROOT)
    assert proc.returncode == 0, f"{script.name} failed:\n{proc.stdout}\n{proc.stderr}"
    assert "FAILED" not in proc.stderr
    return proc


@functools.cache
def output(prefix: str) -> str:
    """What the example numbered ``prefix`` prints, run once per test process."""
    return run_example(next(p for p in EXAMPLES if p.name.startswith(prefix))).stdout


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(script: Path) -> None:
    output(script.name[:2])


def test_transient_failure_and_its_retry_have_their_own_lines() -> None:
    """The retried 429 used to print nothing, so its backoff read as if it belonged to the
    invalid_input line above it (which is never retried)."""
    lines = [line.strip() for line in output("07").splitlines()]
    invalid = next(i for i, line in enumerate(lines) if "[invalid_input]" in line)
    transient = next(i for i, line in enumerate(lines) if "[transient]" in line)
    backoff = next(i for i, line in enumerate(lines) if "backoff" in line)
    assert invalid < transient == backoff - 1
    step = lines[transient].split()[0]
    assert step != lines[invalid].split()[0]
    assert lines[backoff].startswith(f"{step} pay") and lines[backoff + 1].startswith(f"{step} pay")
    assert lines[backoff + 1].endswith("-> ok")


def test_unpriced_cost_is_never_shown_as_zero() -> None:
    out = output("10")
    assert "$0.0000" not in out
    row = next(line for line in out.splitlines() if line.startswith("same "))
    assert row.endswith("unknown, unpriced: 4 call(s) carried no price (this is not $0)")


@pytest.mark.parametrize(("prefix", "slip"), [("08", "(1 model calls)"), ("09", "1 effects"),
                                              ("09", "1 cleanup actions")])
def test_counts_agree_in_number(prefix: str, slip: str) -> None:
    out = output(prefix)
    assert slip not in out
    assert re.search(r"\b1 (model call|effect|cleanup action)\b", out), out


def test_a_kept_journal_can_be_inspected_with_the_printed_command(tmp_path: Path) -> None:
    """With CUADERNO_KEEP=DIR the journal outlives the example, and the command it prints works."""
    assert "CUADERNO_KEEP" in output("03")  # without it, the example says how to keep the journal
    keep = tmp_path / "kept"
    out = run_example(next(p for p in EXAMPLES if p.name.startswith("03")), CUADERNO_KEEP=str(keep)).stdout
    shown = next(line for line in out.splitlines() if line.startswith("journal kept; look at it with: "))
    argv = shlex.split(shown.split(": ", 1)[1])
    assert argv[:2] == ["cuaderno", "--db"] and argv[-2:] == ["show", "nodedup"]
    assert Path(argv[2]).parent.parent == keep.resolve()
    proc = subprocess.run([sys.executable, "-m", "cuaderno", *argv[1:]], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "needs_human" in proc.stdout
    # The command `show` suggests pastes as is: it names the same journal, and it works.
    suggested = next(line.split("settle with", 1)[-1].split("(")[0].strip() for line in proc.stdout.splitlines()
                     if "resolve nodedup t0000.tool00 --not-happened" in line)
    words = shlex.split(suggested)
    assert words[:3] == ["cuaderno", "--db", argv[2]] and words[3:] == ["resolve", "nodedup", "t0000.tool00",
                                                                      "--not-happened"]
    settled = subprocess.run([sys.executable, "-m", "cuaderno", *words[1:]], capture_output=True, text=True, timeout=60)
    assert settled.returncode == 0, settled.stderr


# -- the README -----------------------------------------------------------------------------------------


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.S | re.M)


def test_readme_starts_with_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    first = text.split("```sh\n", 1)[1].split("```", 1)[0]
    assert text.startswith("# cuaderno\n\n```sh\nmake demo ")
    assert [line.split()[:2] for line in first.splitlines()] == [["make", "demo"], ["make", "test"]]


def test_readme_tour_runs_as_written(tmp_path: Path) -> None:
    """The tour is pasted into a file and run: twice, as a user might (the second run finds the run closed)."""
    tour = README.read_text(encoding="utf-8").split("## A tour", 1)[1].split("\n## ", 1)[0]
    code = "\n".join(_blocks(tour, "python"))
    assert code.strip()
    (tmp_path / "tour.py").write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("CUADERNO_CRASH_AT", "CUADERNO_DB")}
    runs = [subprocess.run([sys.executable, "tour.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                           env=env) for _ in range(2)]
    for proc in runs:
        assert proc.returncode == 0, proc.stderr
    assert "ApprovalStep t0000.tool00.approval" in runs[0].stdout and "FinalStep final" in runs[0].stdout
    assert runs[1].stdout.split() == ["FinalStep", "final", "FinalStep", "final"]
    # What the command line section says the tour leaves behind.
    with closing(sqlite3.connect(tmp_path / "runs.db")) as db:
        statuses = dict(db.execute("SELECT run_id, status FROM cuaderno_runs").fetchall())
    assert statuses == {"run-1": "completed", "run-2": "suspended", "run-3": "suspended", "run-4": "suspended"}
    # Every command line the README shows for that journal works as written (each exits 0).
    section = README.read_text(encoding="utf-8").split("### The command line", 1)[1].split("\n## ", 1)[0]
    lines = [line.split("  #")[0].strip() for line in _blocks(section, "sh")[0].splitlines() if line.strip()]
    assert [line.split()[3] for line in lines] == ["list", "show", "approve", "deny", "cancel"]
    for line in lines:
        argv = shlex.split(line)
        assert argv[0] == "cuaderno"
        proc = subprocess.run([sys.executable, "-m", "cuaderno.cli", *argv[1:]], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60, env=env)
        assert proc.returncode == 0, f"{line}\n{proc.stdout}\n{proc.stderr}"
    with closing(sqlite3.connect(tmp_path / "runs.db")) as db:
        statuses = dict(db.execute("SELECT run_id, status FROM cuaderno_runs").fetchall())
    assert statuses["run-4"] == "cancelled"


def test_readme_demo_table_is_the_real_output() -> None:
    # The README shows the English table `make demo` prints; the seed's own (Spanish) table
    # follows it in the demo's output, under its own heading.
    text = README.read_text(encoding="utf-8")
    table = next(block for block in _blocks(text, "") if "pass 1  model" in block)
    out = output("02").splitlines()
    printed = [re.sub(r"\s+\[.*\]$", "", line) for line in out if line.startswith("pass ") and " model ×" in line]
    assert table.splitlines() == printed
    assert [line for line in out if "ª vuelta" in line][0].startswith("1ª vuelta  modelo ×1 · herramienta ×1")


def test_gitignore_ignores_no_tracked_file() -> None:
    """A bare name in .gitignore (say ``run``) ignores that name in every directory, ``.ci/run``
    included: a tracked file that matches an ignore pattern is the sign of such a pattern."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    proc = subprocess.run(["git", "ls-files", "--cached", "--ignored", "--exclude-standard"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        pytest.skip(f"git unavailable: {proc.stderr.strip()}")
    assert proc.stdout.split() == []
