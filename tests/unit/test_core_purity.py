"""The core imports nothing from LangChain, LangGraph or Anthropic."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import langchain_compaction

PACKAGE = Path(langchain_compaction.__file__).resolve().parent
CORE = PACKAGE / "core"
FORBIDDEN = ("langchain", "langgraph", "anthropic")
OWN = "langchain_compaction"


def _imports(source: str) -> list[str]:
    """Every absolute module an import statement names, anywhere in the file."""
    modules: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.append(node.module)
    return modules


def _forbidden(module: str) -> bool:
    top = module.split(".", maxsplit=1)[0]
    if top == OWN:
        return False
    return any(top.startswith(prefix) for prefix in FORBIDDEN)


def _core_files() -> list[Path]:
    return sorted(CORE.rglob("*.py"))


def _in_package_closure(start: list[Path]) -> set[Path]:
    """The core files plus every project module they import, transitively (not the package __init__)."""
    seen: set[Path] = set()
    todo = list(start)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in _imports(path.read_text(encoding="utf-8")):
            if module.split(".")[0] != OWN or module == OWN:
                continue
            relative = Path(*module.split(".")[1:])
            for candidate in (PACKAGE / relative.with_suffix(".py"), PACKAGE / relative / "__init__.py"):
                if candidate.exists():
                    todo.append(candidate)
    return seen


def test_core_has_files() -> None:
    names = {p.name for p in _core_files()}
    assert {"types.py", "tokens.py", "cut.py", "transcript.py", "prompts.py", "engine.py", "options.py"} <= names


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: p.name)
def test_core_file_imports_no_framework(path: Path) -> None:
    bad = [m for m in _imports(path.read_text(encoding="utf-8")) if _forbidden(m)]
    assert bad == [], f"{path.relative_to(PACKAGE)} imports {bad}"


def test_project_modules_the_core_uses_import_no_framework() -> None:
    closure = _in_package_closure(_core_files())
    outside = {p.relative_to(PACKAGE).as_posix() for p in closure} - {
        p.relative_to(PACKAGE).as_posix() for p in _core_files()
    }
    assert outside == {"errors.py"}  # the only project module the core leans on
    for path in closure:
        bad = [m for m in _imports(path.read_text(encoding="utf-8")) if _forbidden(m)]
        assert bad == [], f"{path.relative_to(PACKAGE)} imports {bad}"


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ("import langchain_core", True),
        ("import langchain", True),
        ("from langgraph.constants import TAG_NOSTREAM", True),
        ("import anthropic as a", True),
        ("from langchain_core.messages import BaseMessage", True),
        ("def f():\n    import langgraph.graph", True),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from anthropic import Anthropic", True),
        ("from langchain_compaction.errors import CompactionError", False),
        ("import langchain_compaction.core.types", False),
        ("from . import types", False),
        ("import json, re", False),
    ],
)
def test_the_checker_itself(source: str, caught: bool) -> None:
    assert any(_forbidden(m) for m in _imports(source)) is caught


def test_core_runs_with_the_frameworks_blocked() -> None:
    # Load the core without the package __init__ (which imports the adapters)
    # and with langchain*/langgraph/anthropic made unimportable, then plan and
    # drive a compaction with a plain summarizer.
    script = textwrap.dedent(
        f"""
        import importlib.abc, json, sys, types

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                top = name.split(".")[0]
                if top != "langchain_compaction" and top.startswith(("langchain", "langgraph", "anthropic")):
                    raise ImportError("blocked: " + name)
                return None

        sys.meta_path.insert(0, Block())
        package = types.ModuleType("langchain_compaction")
        package.__path__ = [{str(PACKAGE)!r}]
        sys.modules["langchain_compaction"] = package

        from langchain_compaction.core.flow import compaction_flow
        from langchain_compaction.core.plan import plan_compaction
        from langchain_compaction.core.types import SummaryReply
        from langchain_compaction.core.options import CompactionOptions
        from langchain_compaction.core.tokens import estimate_message
        from langchain_compaction.core.types import Message, Part

        messages = [Message("system", (Part("text", "app"),))] + [
            Message("user" if i % 2 == 0 else "assistant", (Part("text", f"turn {{i}} " * 50),)) for i in range(8)
        ]
        counts = [estimate_message(m) for m in messages]
        plan = plan_compaction(messages, counts, 100)
        flow = compaction_flow(messages, plan, CompactionOptions())
        request = next(flow)
        try:
            flow.send(SummaryReply("## Goal\\n- done"))
        except StopIteration as stop:
            outcome = stop.value
        loaded = sorted(m for m in sys.modules if m.split(".")[0].startswith(("langchain", "langgraph", "anthropic")))
        print(json.dumps({{"cut": plan.cut, "summary": outcome.summary, "labelled": "[User]" in request.prompt,
                          "loaded": loaded}}))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["cut"] > 1
    assert report["summary"] == "## Goal\n- done"
    assert report["labelled"] is True
    # Only the project's own modules were loaded: no framework slipped in.
    assert report["loaded"]
    assert all(name.split(".")[0] == "langchain_compaction" for name in report["loaded"])
