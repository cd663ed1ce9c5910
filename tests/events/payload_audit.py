"""A pytest plugin that holds every event any test appends to its payload type, and counts them.

Usage (from the checkout root)::

    PYTHONPATH=src:tests/events pytest -p payload_audit tests/loop tests/episodes ... -n 2
    python tests/events/payload_audit.py          # sums what every process wrote

Every backend stamps each event it appends (:meth:`StepEvent.stamped`); the plugin wraps that
and runs :func:`cuaderno.events.payloads.check` on the event, counting ``(kind, phase family)``
and keeping each :class:`PayloadMalformed` message (it raises nothing: a test that builds a
journal by hand may write what no run writes). Each process writes its figures to
``$PAYLOAD_AUDIT_DIR`` (default: the system's temporary directory) when pytest ends.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from cuaderno import events as _events
from cuaderno.events.names import family
from cuaderno.events.payloads import PayloadMalformed, check

OUT = Path(os.environ.get("PAYLOAD_AUDIT_DIR", tempfile.gettempdir()))
_seen: collections.Counter[str] = collections.Counter()
_bad: list[str] = []
_stamped = _events.StepEvent.stamped


def _checked(self: _events.StepEvent, **fields: Any) -> _events.StepEvent:
    _seen[f"{self.kind}/{family(self.phase)}"] += 1
    try:
        check(self)
    except PayloadMalformed as exc:
        _bad.append(str(exc))
    return _stamped(self, **fields)


_events.StepEvent.stamped = _checked  # type: ignore[method-assign]


def pytest_unconfigure(config: Any) -> None:
    (OUT / f"payload_audit.{os.getpid()}.json").write_text(json.dumps({"seen": _seen, "bad": _bad}))


def main() -> int:
    seen: collections.Counter[str] = collections.Counter()
    bad: list[str] = []
    for path in OUT.glob("payload_audit.*.json"):
        data = json.loads(path.read_text())
        seen.update(data["seen"])
        bad += data["bad"]
    for pair, n in sorted(seen.items()):
        print(f"{n:8d}  {pair}")
    print(f"{sum(seen.values())} events, {len(seen)} (kind, phase) pairs, {len(bad)} not of their type")
    for message in bad:
        print("  ", message)
    return 0


if __name__ == "__main__":
    sys.exit(main())
