"""A private PostgreSQL cluster for the tests that restart or reconfigure the server.

The machine's server on port 5432 is shared and must never be restarted; this one is created with
``initdb`` in a temporary directory and run with ``pg_ctl`` on a free loopback port, its socket in
its own directory, trust authentication, and removed when the test ends. Binaries are looked for
under ``/usr/lib/postgresql/*/bin`` (newest version) or on ``PATH``. ``initdb`` refuses to run as
root: there it runs as the ``postgres`` user (``runuser``), which then owns the directory.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["PrivateCluster", "private_cluster"]


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).parent if on_path else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateCluster:
    """One cluster: :meth:`start`, :meth:`restart`, :meth:`stop`; :attr:`url` names its database."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="cuaderno-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = _free_port()
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 120) -> None:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self.as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(args[:2])} failed: {done.stderr[-2000:]}{done.stdout[-1000:]}\n{log}")

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")

    def start(self) -> None:
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root} "
                   "-c fsync=on -c synchronous_commit=on -c max_connections=60")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "fast") -> None:
        """Stop (``fast``: every connection is ended, as a crash of the server ends them) and
        start again on the same port."""
        self.stop(mode)
        self.start()

    def remove(self) -> None:
        try:
            self.stop("immediate")
        except (RuntimeError, subprocess.TimeoutExpired):
            pass  # not running
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def private_cluster() -> Iterator[PrivateCluster]:
    """A running private cluster, removed after the test (skipped where PostgreSQL is not installed)."""
    bin_dir = _bin_dir()
    if bin_dir is None or not (bin_dir / "initdb").exists():
        pytest.skip("PostgreSQL's initdb/pg_ctl are not installed here")
    cluster = PrivateCluster(bin_dir)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.remove()
