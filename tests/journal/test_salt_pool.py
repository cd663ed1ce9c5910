"""The random digest keys of new rows come from a pool filled by one ``os.urandom`` call: a forked
child must never take the keys its parent's copy of the pool still holds."""

from __future__ import annotations

import os

import pytest

from cuaderno.events import SALT_BYTES, StepEvent
from cuaderno.journal import _append


def _salt() -> bytes:
    ev = StepEvent(run_id="r", step_id="s", phase="result", kind="tool", payload={"a": 1})
    salt = _append._salt_for(ev, keyed=True)
    assert salt is not None
    return salt


def test_keys_are_distinct_and_of_their_size() -> None:
    salts = [_salt() for _ in range(3 * _append._SALTS_AT_ONCE)]  # across refills
    assert all(len(s) == SALT_BYTES for s in salts)
    assert len(set(salts)) == len(salts)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_take_its_parents_next_keys() -> None:
    _append._SALTS.clear()  # whatever earlier appends of this worker left: it may be one key
    _salt()  # the pool is filled now: the parent holds keys it has not taken yet
    assert _append._SALTS
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first keys, sent to the parent
        try:
            os.write(write, b"".join(_salt() for _ in range(4)))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    parent = b"".join(_salt() for _ in range(4))
    assert len(child) == len(parent) == 4 * SALT_BYTES
    assert child != parent
    child_keys = {child[i:i + SALT_BYTES] for i in range(0, len(child), SALT_BYTES)}
    assert not child_keys & {parent[i:i + SALT_BYTES] for i in range(0, len(parent), SALT_BYTES)}


def test_an_unkeyed_store_stamps_no_key() -> None:
    ev = StepEvent(run_id="r", step_id="s", phase="result", kind="tool", payload={})
    assert _append._salt_for(ev, keyed=False) is None
