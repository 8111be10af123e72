"""The project's own machinery: the suite runs from an sdist, and CI cleans up after itself."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_the_suite_runs_without_the_shared_transcripts(tmp_path: Path) -> None:
    """The suite runs without the shared transcripts, as it does from an sdist."""
    checkout = tmp_path / "checkout"  # no ../shared beside it
    shutil.copytree(ROOT / "tests", checkout / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", checkout / "pyproject.toml")
    shutil.copytree(ROOT / "bench", checkout / "bench", ignore=shutil.ignore_patterns("__pycache__", "*.png"))
    env = {k: v for k, v in os.environ.items() if k != "LANGCHAIN_COMPACTION_TRANSCRIPTS"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/test_formats.py"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "passed" in done.stdout


def test_ci_removes_its_virtual_environment() -> None:
    """CI removes the virtual environment it made, even when a step fails."""
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "trap" in script
    assert 'rm -rf "$scratch"' in script
