"""``list_dir`` is sorted by name and paged: every entry of a large directory is reachable.

Issue 32, part 4: a directory of 100,000 entries listed its first 1,000 *in directory order* (then
sorted those), and nothing let the model see the rest. Now each page holds the ``limit`` entries
whose names sort first after the cursor ``after``, with ``total``, ``more`` and ``next_after``; a
page is one pass over the directory keeping only the page's entries, so memory is the page's.
"""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from cuaderno import Agent, ScriptedGateway, Session, ToolStep
from cuaderno.errors import ErrorClass
from cuaderno.journal import MemoryCheckpointer
from cuaderno.tools.sandbox import PathRefused, ReadOnlyRoot

ENTRIES = 100_000


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """100,000 empty files (and a few directories), created in an order unrelated to their names."""
    root = tmp_path_factory.mktemp("big")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(ENTRIES - 10):
            # A multiplicative shuffle: creation order (roughly directory order) is not name order.
            os.close(os.open(f"f{(i * 7919) % (ENTRIES - 10):06d}", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
        for i in range(10):
            os.mkdir(f"d{i}", dir_fd=fd)
    finally:
        os.close(fd)
    return root


def _names_by_paging(sandbox: ReadOnlyRoot, **kw: int) -> tuple[list[str], int]:
    names: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        page = sandbox.list_dir(".", after=after, **kw)
        pages += 1
        assert page["total"] == ENTRIES
        names += [e["name"] for e in page["entries"]]
        if not page["more"]:
            assert page["next_after"] is None
            return names, pages
        after = page["next_after"]
        assert after == page["entries"][-1]["name"]


def test_a_hundred_thousand_entries_are_sorted_and_all_reachable_by_paging(big: Path) -> None:
    expected = sorted(os.listdir(big))
    assert len(expected) == ENTRIES
    # The directory's own order is not the sorted one (otherwise this would prove nothing).
    assert os.listdir(big)[:1000] != expected[:1000]
    with ReadOnlyRoot(big) as sandbox:
        first = sandbox.list_dir(".")
        assert [e["name"] for e in first["entries"]] == expected[:1000]  # the global first 1,000
        assert (first["total"], first["more"], first["next_after"]) == (ENTRIES, True, expected[999])
        second = sandbox.list_dir(".", after=first["next_after"])
        assert [e["name"] for e in second["entries"]] == expected[1000:2000]
    # The whole walk in pages of 5,000 (one pass over the directory each: 20 passes, not 100).
    with ReadOnlyRoot(big, max_entries=5000) as sandbox:
        names, pages = _names_by_paging(sandbox)
    assert names == expected  # every entry, once, in order
    assert pages == ENTRIES // 5000


def test_a_page_holds_memory_for_the_page_not_the_directory(big: Path) -> None:
    with ReadOnlyRoot(big, max_entries=100) as sandbox:
        sandbox.list_dir(".")  # warm up (imports, caches)
        tracemalloc.start()
        try:
            page = sandbox.list_dir(".", after="f050000")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert [e["name"] for e in page["entries"]][:2] == ["f050001", "f050002"]
    assert page["more"] and page["total"] == ENTRIES
    # Holding every name of the directory (let alone its stat results) would take megabytes;
    # a page of 100 takes tens of kilobytes.
    assert peak < 1_000_000, f"listing one page of {ENTRIES} entries peaked at {peak} bytes"


def test_limit_and_kinds(big: Path) -> None:
    with ReadOnlyRoot(big, max_entries=50) as sandbox:
        page = sandbox.list_dir(".", limit=5)
        assert [(e["name"], e["kind"]) for e in page["entries"]] == [(f"d{i}", "dir") for i in range(5)]
        assert len(sandbox.list_dir(".", limit=10_000)["entries"]) == 50  # capped at max_entries
        last = sandbox.list_dir(".", after="f099989")
        assert (last["entries"], last["more"], last["next_after"]) == ([], False, None)
        for bad in (0, -1):
            with pytest.raises(PathRefused) as caught:
                sandbox.list_dir(".", limit=bad)
            assert caught.value.data["reason"] == "bad_argument"
        with pytest.raises(PathRefused, match="next_after"):
            sandbox.list_dir(".", after="/not-hex")


def test_a_name_that_is_not_utf8_pages_through_its_cursor(tmp_path: Path) -> None:
    # Names whose stand-in (U+FFFD) would sort elsewhere than their bytes: the cursor keeps the
    # bytes, so paging one entry at a time neither repeats nor skips any.
    raw = [b"a", b"b\x80", b"b\xef", b"b\xff", b"c"]
    for name in raw:
        (tmp_path / os.fsdecode(name)).write_text("x")
    with ReadOnlyRoot(tmp_path) as sandbox:
        seen: list[str] = []
        cursors: list[str | None] = []
        after: str | None = None
        while True:
            page = sandbox.list_dir(".", after=after, limit=1)
            seen += [e["name"] for e in page["entries"]]
            after = page["next_after"]
            cursors.append(after)
            if not page["more"]:
                break
    assert seen == ["a", "b\ufffd", "b\ufffd", "b\ufffd", "c"]
    assert cursors == ["a", "/6280", "/62ef", "/62ff", None]


async def test_the_model_pages_through_a_directory(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"file{i}").write_text("x")
    with ReadOnlyRoot(tmp_path, max_entries=2) as sandbox:
        agent = Agent(instructions="List the repository.", tools=sandbox.tools())
        gateway = ScriptedGateway([ScriptedGateway.call("list_dir", path="."),
                                   ScriptedGateway.call("list_dir", path=".", after="file1"),
                                   ScriptedGateway.call("list_dir", path=".", after="/zz"),
                                   ScriptedGateway.text("done")])
        steps = [s async for s in agent.run("look", session=Session("pages", gateway, MemoryCheckpointer()))]
    tools = [s for s in steps if isinstance(s, ToolStep)]
    assert [e["name"] for e in tools[0].result["entries"]] == ["file0", "file1"]
    assert tools[0].result["next_after"] == "file1" and tools[0].result["total"] == 5
    assert [e["name"] for e in tools[1].result["entries"]] == ["file2", "file3"]
    assert tools[2].error is not None and tools[2].error["error_class"] == ErrorClass.PERMANENT.value
    assert tools[2].error["data"]["reason"] == "bad_argument"
