"""The repository passes its own lint configuration (``[tool.ruff]`` in pyproject.toml), as CI runs it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff() -> list[str]:
    try:
        import ruff  # noqa: F401  (the package ships the binary)
    except ImportError:
        exe = shutil.which("ruff")
        if exe is None:
            pytest.skip("ruff is not installed (pip install '.[test]')")
        return [exe]
    return [sys.executable, "-m", "ruff"]


def test_ruff_check_passes() -> None:
    done = subprocess.run([*_ruff(), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"ruff check found problems:\n{done.stdout}{done.stderr}"
