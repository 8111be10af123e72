"""The project's own machinery: the suite runs from an sdist, and CI cleans up after itself."""

from __future__ import annotations

import json
import os
import re
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
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "tests/unit/test_formats.py"],
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


def test_no_package_code_names_a_term_of_the_hand_written_fact_lists() -> None:
    """The fidelity figures come from general rules: no term the bench checks for is written into the package."""
    lists = json.loads((ROOT / "bench" / "transcript_facts.json").read_text(encoding="utf-8"))
    terms = [term for name, facts in lists.items() if not name.startswith("_") for term in facts]
    assert len(terms) > 30
    named = [
        (str(path.relative_to(ROOT)), term)
        for path in sorted((ROOT / "langchain_compaction").rglob("*.py"))
        for term in terms
        if re.search(rf"(?<![\w-]){re.escape(term)}(?![\w-])", path.read_text(encoding="utf-8"), re.IGNORECASE)
    ]
    assert named == []


def test_every_name_a_benchmark_imports_from_another_is_defined_there() -> None:
    """A benchmark that imports a helper another one dropped fails only when run on demand: caught here instead.

    (``bench/archive.py`` imported ``summary_seconds`` for a round after ``bench/stall.py`` let it go.)
    The benchmarks' own peers (langmem, matplotlib) are not in the test extra, so the names are read, not imported.
    """
    import ast

    defined: dict[str, set[str]] = {}
    imports: list[tuple[str, str, str]] = []
    for path in sorted((ROOT / "bench").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = defined.setdefault(path.stem, set())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bench."):
                imports += [(path.name, node.module.removeprefix("bench."), alias.name) for alias in node.names]
    assert imports  # (the benchmarks do share helpers)
    missing = [
        f"{user}: bench.{module}.{name}" for user, module, name in imports if name not in defined.get(module, ())
    ]
    assert missing == []


def test_the_package_keeps_its_size_limits() -> None:
    """No module over 500 lines and no function over 60 (issue 19's limits; bench/structure.py reports them)."""
    from bench.structure import source_figures

    figures = source_figures()
    largest = str(figures["largest_module"])
    assert int(largest.rsplit("(", 1)[1].rstrip(")")) <= 500, largest
    assert figures["functions_over_60_lines"] == []


def test_every_typed_dict_of_the_package_is_typing_extensions() -> None:
    """A state type must give pydantic a JSON schema, which it refuses for typing.TypedDict below Python 3.12."""
    pattern = re.compile(r"^from typing import [^\n]*\bTypedDict\b|\btyping\.TypedDict\b", re.MULTILINE)
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "langchain_compaction").rglob("*.py"))
        if pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
