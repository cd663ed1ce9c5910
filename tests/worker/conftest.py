"""The worker tests' fixtures (see ``_world.py``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _world import world  # noqa: F401 - the fixture
