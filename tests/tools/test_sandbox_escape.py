"""R11 ``sandbox_path_attacks``: the read-only tools of a child episode never read outside the root.

Every attack below is a path a model could send (or a file layout someone could plant in the
snapshot). The ground truth is the content: every file outside the root holds ``SECRET``, and no
tool result may ever contain it. The race cases run the attacker in another process, swapping a
directory for a symlink (and moving a directory out of the root) while the tools resolve paths
through it. The figure: "N attempts, 0 escapes".
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cuaderno import Agent, ScriptedGateway, Session, ToolStep
from cuaderno.errors import ErrorClass, ToolError, UsageError
from cuaderno.journal import MemoryCheckpointer
from cuaderno.tools.sandbox import PATH_MAX, ReadOnlyRoot

SECRET = "SECRET"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Path, Path, ReadOnlyRoot]]:
    root, outside, evil = tmp_path / "root", tmp_path / "outside", tmp_path / "root-evil"
    for d in (root / "src" / "deep", outside, evil):
        d.mkdir(parents=True)
    (root / "README.md").write_text("inside\n")
    (root / "src" / "main.py").write_text("print('inside')\n")
    (root / "src" / "deep" / "secret.txt").write_text("inside\n")
    (outside / "secret.txt").write_text(SECRET)
    (evil / "secret.txt").write_text(SECRET)
    # Planted layouts: links out, chains, loops, a hard link, special files.
    (root / "etc").symlink_to("/etc")
    (root / "out").symlink_to(outside)
    (root / "out_file").symlink_to(outside / "secret.txt")
    (root / "chain1").symlink_to("chain2")
    (root / "chain2").symlink_to(outside / "secret.txt")
    (root / "loop1").symlink_to("loop2")
    (root / "loop2").symlink_to("loop1")
    (root / "fd").symlink_to("/proc/self/fd")
    (root / "relup").symlink_to("../outside")
    os.link(outside / "secret.txt", root / "hard")
    os.mkfifo(root / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "sock"))
    (root / os.fsdecode(b"bad\xffname")).write_text("inside\n")
    sandbox = ReadOnlyRoot(root)
    try:
        yield root, outside, sandbox
    finally:
        sandbox.close()
        sock.close()


ATTACKS = [
    "../outside/secret.txt", "../root-evil/secret.txt", "src/../../outside/secret.txt", "./../outside/secret.txt",
    "/etc/passwd", str(Path("/") / "etc" / "shadow"), "//etc/passwd", "~/.ssh/id_rsa", "~root/.bashrc",
    "..\\outside\\secret.txt", "src\\..\\..\\outside\\secret.txt",
    "%2e%2e/outside/secret.txt", "..%2foutside%2fsecret.txt", "%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "README.md\x00../outside/secret.txt", "\x00",
    "a/" * (PATH_MAX // 2 + 1), "x" * 300, "src/" + "y" * 256,
    "etc/passwd", "etc", "out/secret.txt", "out", "out_file", "chain1", "loop1", "loop1/x", "relup/secret.txt",
    "fd/0", "fd/3", "fd", "hard", "fifo", "sock",
    "/proc/self/root/etc/passwd", "/proc/self/cwd/README.md", "/dev/zero", "/dev/stdin",
    "src/\udcff", "\udc80\udc80", "bad\ufffdname",
]


def _attempt(sandbox: ReadOnlyRoot, path: str, tool: str) -> str:
    """What the tool returned, as text, or "" when it refused."""
    try:
        result = sandbox.read_file(path) if tool == "read_file" else sandbox.list_dir(path)
    except ToolError as exc:
        assert exc.error_class is ErrorClass.PERMANENT
        assert exc.data["refused"]
        return ""
    return json.dumps(result)


def test_every_path_attack_is_refused_or_stays_inside(world: tuple[Path, Path, ReadOnlyRoot],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    root, outside, sandbox = world
    before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in (outside / "secret.txt", root / "README.md")}
    attempts = escapes = refused = 0
    for path in ATTACKS:
        for tool in ("read_file", "list_dir"):
            attempts += 1
            started = time.monotonic()
            got = _attempt(sandbox, path, tool)
            assert time.monotonic() - started < 5, f"{tool}({path!r}) blocked (a FIFO opened for reading?)"
            refused += got == ""
            escapes += SECRET in got or "root:" in got
    with capsys.disabled():
        print(f"\nR11 sandbox_path_attacks: {attempts} attempts, {refused} refused, {escapes} escapes")
    assert escapes == 0
    # Nothing was created, written or truncated by any attempt.
    assert {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in before} == before
    assert not (root / "..%2foutside%2fsecret.txt").exists()


def test_what_is_inside_is_readable(world: tuple[Path, Path, ReadOnlyRoot]) -> None:
    _, _, sandbox = world
    assert sandbox.read_file("src/main.py")["text"] == "print('inside')\n"
    assert sandbox.read_file("./src//deep/secret.txt")["text"] == "inside\n"
    listing = {e["name"]: e["kind"] for e in sandbox.list_dir(".")["entries"]}
    assert listing["src"] == "dir" and listing["README.md"] == "file" and listing["out"] == "link"
    assert listing["fifo"] == "other" and "bad\ufffdname" in listing  # a non-UTF-8 name, shown readably
    with pytest.raises(ToolError, match="no such file"):
        sandbox.read_file("bad\ufffdname")  # ...which cannot be sent back to open another file


def test_a_special_device_under_the_root_is_refused(tmp_path: Path) -> None:
    try:
        os.mknod(tmp_path / "zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    except PermissionError:
        if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
            pytest.fail("mknod needs CAP_MKNOD (CI=true: this proof must run)")
        pytest.skip("mknod needs CAP_MKNOD")
    with ReadOnlyRoot(tmp_path) as sandbox, pytest.raises(ToolError, match="not a regular file"):
        sandbox.read_file("zero")


def test_large_files_are_cut_and_say_so(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"a" * 5000)
    with ReadOnlyRoot(tmp_path, max_file_bytes=1000) as sandbox:
        got = sandbox.read_file("big")
    assert (got["bytes"], got["truncated"], len(got["text"])) == (1000, True, 1000)


def test_bad_configuration_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        ReadOnlyRoot(tmp_path / "missing")
    with pytest.raises(UsageError):
        ReadOnlyRoot(tmp_path, max_file_bytes=0)


# -- races from another process ------------------------------------------------------------------


def _swap_dir_for_symlink(root: str, outside: str, stop: str) -> None:
    """Flip root/sw between a real directory (holding an inside file) and a symlink to outside."""
    real, link, parked = os.path.join(root, "sw"), os.path.join(root, "sw.link"), os.path.join(root, "sw.real")
    os.symlink(os.path.join(outside, "race"), link)
    while not os.path.exists(stop):
        os.rename(real, parked)
        os.rename(link, real)       # now root/sw -> outside
        os.rename(real, link)
        os.rename(parked, real)     # back to the real directory


def _move_dir_out(root: str, outside: str, stop: str) -> None:
    """Move root/mv out of the root and back again, over and over."""
    inside, away = os.path.join(root, "mv"), os.path.join(outside, "mv")
    while not os.path.exists(stop):
        os.rename(inside, away)
        os.rename(away, inside)


@pytest.mark.parametrize("attacker", [_swap_dir_for_symlink, _move_dir_out], ids=["symlink-swap", "rename-out"])
def test_no_escape_while_another_process_swaps_the_path(world: tuple[Path, Path, ReadOnlyRoot], attacker: object,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    root, outside, sandbox = world
    (root / "sw").mkdir()
    (root / "sw" / "secret.txt").write_text("inside\n")
    (root / "mv" / "a").mkdir(parents=True)
    (root / "mv" / "a" / "secret.txt").write_text("inside\n")
    # Outside, the same name holds the secret (a file with one link: only the walk can refuse it).
    (outside / "race").mkdir()
    (outside / "race" / "secret.txt").write_text(SECRET)
    stop = root.parent / "stop"
    proc = multiprocessing.get_context("spawn").Process(target=attacker, args=(str(root), str(outside), str(stop)))
    proc.start()
    attempts = escapes = reads = 0
    deadline = time.monotonic() + 3.0
    try:
        while time.monotonic() < deadline or attempts < 500:
            for path in ("sw/secret.txt", "mv/a/secret.txt"):
                got = _attempt(sandbox, path, "read_file")
                attempts += 1
                reads += got != ""
                escapes += SECRET in got
            got = _attempt(sandbox, "sw", "list_dir")
            attempts += 1
            escapes += SECRET in got
    finally:
        stop.touch()
        proc.join(10)
    with capsys.disabled():
        print(f"\nR11 race ({proc.name}): {attempts} attempts, {reads} inside reads, {escapes} escapes")
    assert proc.exitcode == 0
    assert escapes == 0
    assert reads > 0  # the race left windows where the inside file was there, and it was read


def test_a_directory_moved_out_while_open_is_refused(world: tuple[Path, Path, ReadOnlyRoot]) -> None:
    # The rename race made deterministic: the descriptor was opened inside, the directory then
    # left the root; what the tool would read through it is no longer in the snapshot.
    root, outside, sandbox = world
    fd = os.open(root / "src", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rename(root / "src", outside / "src")
        with pytest.raises(ToolError, match="moved outside"):
            sandbox._check_opened("src", fd, directory=True)
    finally:
        os.close(fd)


# -- journaled as a terminal tool error ----------------------------------------------------------


async def test_a_refused_path_is_journaled_as_a_permanent_tool_error_and_told_to_the_model(
        world: tuple[Path, Path, ReadOnlyRoot]) -> None:
    _, _, sandbox = world
    agent = Agent(instructions="Read the repository.", tools=sandbox.tools())
    gateway = ScriptedGateway([ScriptedGateway.call("read_file", path="../outside/secret.txt"),
                               ScriptedGateway.call("read_file", path="README.md"),
                               ScriptedGateway.text("done")])
    store = MemoryCheckpointer()
    steps = [s async for s in agent.run("look", session=Session("r11", gateway, store))]
    tools = [s for s in steps if isinstance(s, ToolStep)]
    assert tools[0].error is not None and tools[0].error["error_class"] == "permanent"
    assert SECRET not in json.dumps(tools[0].error)
    assert tools[1].result["text"] == "inside\n"
    cp = store.checkpoint("r11")
    assert cp is not None and cp.status == "completed"
