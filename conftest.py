"""Collection rules for the doctests under camkit/ (the tests' own conftest is tests/conftest.py)."""

from __future__ import annotations

import importlib.util

# The MONAI family rules' examples build MONAI networks; MONAI is a test dependency, but a
# machine without it (a GPU machine given only the anchors' wheels) skips them instead of failing.
collect_ignore = [] if importlib.util.find_spec("monai") else ["camkit/layers/families/monai.py"]
