"""The test rig, imported from tests/ (one copy of the fake and its machines: see __init__)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"

if not (TESTS / "fakenvml.py").is_file():  # pragma: no cover - a broken checkout or image
    raise ImportError(f"the demo needs the test rig in {TESTS} (run it from a clone of the repository)")
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
