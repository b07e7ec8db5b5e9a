"""Fixtures for the sweep tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sweeptools import Guardctl, make_guardctl


@pytest.fixture
def gsweep(lab: Any, tmp_path: Path) -> Guardctl:
    """guardctl with a private store and fast sweep settings, pointed at the clean lab."""
    return make_guardctl(tmp_path, lab)
