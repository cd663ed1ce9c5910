"""The docs a stranger follows: they build strictly, they name every error, the quickstart runs."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import cuaderno.errors

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)


def test_every_public_error_says_what_it_means_and_what_to_do() -> None:
    table = (DOCS / "guide" / "errors.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(\w+)` \|", table, flags=re.M))
    public = {name for name, cls in inspect.getmembers(cuaderno.errors, inspect.isclass)
              if issubclass(cls, cuaderno.errors.CuadernoError) and cls.__module__ == cuaderno.errors.__name__}
    assert public - documented == set(), "errors missing from docs/guide/errors.md"
    assert documented - public == set(), "docs/guide/errors.md names errors that do not exist"


@pytest.mark.parametrize("page", ["openai.md", "anthropic.md", "openai-compatible.md"])
def test_quickstart_code_compiles_and_imports_what_exists(page: str) -> None:
    # Each snippet's imports must resolve against the installed package (a renamed export breaks
    # the quickstart before the stranger reaches the model).
    for code in _python_blocks(DOCS / "quickstart" / page):
        compile(code, page, "exec")
        imports = "\n".join(line for line in code.splitlines() if line.startswith(("from ", "import ")))
        exec(compile(imports, page, "exec"), {})


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    if not mkdocs.exists():
        if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
            pytest.fail("mkdocs is not installed: CI must build the docs (the 'docs' extra)", pytrace=False)
        pytest.skip("mkdocs is not installed (the 'docs' extra)")
    proc = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "loop" / "index.html").exists()


def test_the_results_guide_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _python_blocks(DOCS / "guide" / "results.md")
    monkeypatch.chdir(tmp_path)  # the example writes runs.db where it runs
    exec(compile(blocks[0], "results.md", "exec"), {})
    for code in blocks[1:]:
        imports = "\n".join(line for line in code.splitlines() if line.startswith(("from ", "import ")))
        exec(compile(imports, "results.md", "exec"), {})


def test_product_docs_speak_of_the_product_not_the_tracker() -> None:
    # The README, the docs site and the public docstrings are read by users, who have no access to
    # the project's tracker: "the ladder (issue 25)" tells them nothing.
    pages = [ROOT / "README.md", *DOCS.rglob("*.md"), *(ROOT / "src").rglob("*.py")]
    found = [f"{page.relative_to(ROOT)}:{n}: {line.strip()}"
             for page in pages
             for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bissues? #?\d+\b", line, flags=re.I)]
    assert found == [], "tracker issue numbers in the product's docs:\n" + "\n".join(found)
