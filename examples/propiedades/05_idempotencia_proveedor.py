"""Idempotencia hacia el proveedor: the step identity travels as the provider's idempotency key.

``key = hash(run_id, step_id, body_fingerprint)``. A child is SIGKILLed after the provider
accepted (and billed) a generation but before the answer was read (crash point ``model.K4``).
The resume re-sends the same request with the same key:

- a provider that deduplicates by key (Stripe semantics) returns the stored answer: billed once;
- a provider that does not bills it again: cuaderno cannot prevent that, but it is never silent:
  the checkpoint counts the re-send as *possibly billed twice*.

And the other half of Stripe semantics: the same key with a different body is a rejection, not a
replay — which is why the body fingerprint is part of the key.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _comun import check, cuaderno_cli, died, entry, example_dir, read_lines, run_pass

from cuaderno import (
    Agent,
    IdempotencyKeyReuse,
    ModelRequest,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
)


async def child(workdir: Path, run_id: str, stripe: str) -> None:
    print(f"pid={os.getpid()}", flush=True)
    gateway = ScriptedGateway([ScriptedGateway.text("42")], billing_log=workdir / f"billing-{run_id}.jsonl",
                              stripe=stripe == "1")
    store = SqliteCheckpointer(workdir / "runs.db")
    async for step in Agent(instructions="Answer.").run("how much?", session=Session(run_id, gateway, store)):
        print(f"  {type(step).__name__} key={getattr(step, 'idempotency_key', '-')}", flush=True)
    store.close()


def main() -> int:
    script = str(Path(__file__).resolve())
    print("cuaderno: idempotency towards the provider (seed 000)\n")
    with example_dir("cuaderno-keys-") as workdir:
        for run_id, stripe in (("con-dedup", "1"), ("sin-dedup", "0")):
            first = run_pass(script, workdir, run_id, stripe, crash_at="model.K4:1")
            second = run_pass(script, workdir, run_id, stripe)
            billing = read_lines(workdir / f"billing-{run_id}.jsonl")
            keys = {b["key"] for b in billing}
            store = SqliteCheckpointer(workdir / "runs.db")
            cp = store.checkpoint(run_id)
            store.close()
            assert cp is not None
            provider = "deduplicates by key" if stripe == "1" else "does not deduplicate"
            print(f"provider {provider:<22}: pass 1 {died(first)} after billing; pass 2 exit {second.returncode}; "
                  f"billed by the provider: {len(billing)} (distinct keys: {len(keys)}); checkpoint: sends "
                  f"{cp.count('model_sends')}, possibly billed twice {cp.count('possibly_billed_twice')}")
            check(first.returncode == -9 and len(keys) == 1, "the re-send must carry the same key")
            check(len(billing) == (1 if stripe == "1" else 2), "unexpected billing count")
            check(cp.count("possibly_billed_twice") == 1, "the re-send must be counted, never silent")

    async def reuse() -> str:
        gateway = ScriptedGateway([ScriptedGateway.text("a")], stripe=True)
        req = ModelRequest(instructions="v1", messages=({"role": "user", "content": "x"},))
        await gateway.complete(req, idempotency_key="k-1")
        try:
            await gateway.complete(ModelRequest(instructions="v2", messages=req.messages), idempotency_key="k-1")
        except IdempotencyKeyReuse as exc:
            return f"rejected: {exc}"
        return "accepted (wrong)"

    kept = cuaderno_cli(workdir, "list")
    if kept:
        print(f"journal kept; look at it with: {kept}")

    outcome = asyncio.run(reuse())
    print(f"\nsame key, different body: {outcome}")
    check(outcome.startswith("rejected"), "a reused key with another body must be rejected")
    return 0


if __name__ == "__main__":
    entry(main, child)
