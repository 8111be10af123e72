"""Every Python snippet in the README runs, and its two commands are the real ones."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_snippets():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_snippet_runs(number, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    # As a user would paste it: no future import of this test module leaks in.
    code = compile(BLOCKS[number], f"README.md snippet {number + 1}", "exec", dont_inherit=True)
    exec(code, {"__name__": f"readme_snippet_{number + 1}"})


def test_the_two_commands_are_the_ones_ci_runs():
    text = README.read_text(encoding="utf-8")
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    test_command = 'python -m pip install -e ".[test]" && python -m pytest'
    assert test_command in text
    assert test_command in ci
    assert "python -m pip install -e . && python -m langchain_compaction demo" in text
