"""Shared by the integrations' tests: this folder is on ``sys.path`` (pytest puts a conftest's
folder there), so ``_runner_end``, the reference both integrations' end states are compared with,
is one module for both."""
