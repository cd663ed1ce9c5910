"""The old name of the decisions written while no loop runs: approvals, rejections, resolutions
and summary rebuilds now live in :mod:`cuaderno.operations`, with the rest of the operator's
actions; this module re-exports them for code that imports them from here."""

from cuaderno.operations import (
    SummaryRebuilt,
    approve,
    check_store,
    check_strings,
    deny,
    fingerprint_mismatch,
    pending_approvals,
    rebuild_summary,
    resolve,
)

__all__ = ["SummaryRebuilt", "approve", "check_store", "check_strings", "deny", "fingerprint_mismatch",
           "pending_approvals", "rebuild_summary", "resolve"]
