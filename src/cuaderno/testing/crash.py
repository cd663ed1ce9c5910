"""The fault points, under the name tests and the crash harness have always used: this module
*is* :mod:`cuaderno.faults` (one module object, one armed state), so ``crash.arm(...)`` here arms
the points production code names there."""

import sys

from cuaderno import faults
from cuaderno.faults import ENV_VAR, arm, armed, in_txn, on, point, set_txn_points

__all__ = ["ENV_VAR", "arm", "armed", "in_txn", "on", "point", "set_txn_points"]

sys.modules[__name__] = faults  # the same module object: arming here arms the points there
