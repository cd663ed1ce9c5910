"""What the test kit's servers (the ledger, the llama.cpp server) say alike of the child process
they started."""

from __future__ import annotations

import subprocess
from typing import Any

__all__ = ["StartedProcess"]


class StartedProcess:
    """A server run as a child process of this one; ``_proc`` is ``None`` until it is started."""

    _proc: subprocess.Popen[Any] | None

    def _not_started(self) -> Exception:
        """The error to raise where the process is needed and was not started."""
        raise NotImplementedError

    def _started(self) -> subprocess.Popen[Any]:
        """The process; raises :meth:`_not_started` when there is none."""
        if self._proc is None:
            raise self._not_started()
        return self._proc

    @property
    def pid(self) -> int:
        """The server process id."""
        return self._started().pid

    @property
    def running(self) -> bool:
        """The process is started and has not exited."""
        return self._proc is not None and self._proc.poll() is None
