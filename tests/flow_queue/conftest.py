"""The queue tests' fixtures (see ``_flowq_world.py``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _flowq_world import fq_journal, fq_world, store  # noqa: F401 - the fixtures
