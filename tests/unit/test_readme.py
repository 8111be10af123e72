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


def _names(requirement: str) -> tuple[str, set[str]]:
    """The distribution a requirement names (normalized) and the extras it asks for."""
    match = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[([^\]]*)\])?", requirement)
    assert match, requirement
    extras = {e.strip() for e in (match.group(2) or "").split(",") if e.strip()}
    return re.sub(r"[-_.]+", "-", match.group(1)).lower(), extras


def _installed_by(install_line: str) -> set[str]:
    """Every distribution ``pip install ...`` brings, dependencies included (as installed here)."""
    from importlib import metadata

    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later

    project = tomllib.loads((README.parent / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted: list[str] = []
    for token in re.findall(r'"[^"]+"|\S+', install_line.split("#", maxsplit=1)[0].split("install", 1)[1]):
        name, extras = _names(token.strip('"'))
        if name == "langchain-compaction":
            wanted += project["dependencies"]
            for extra in extras:
                wanted += project["optional-dependencies"][extra]
        elif not name.startswith("-"):
            wanted.append(name)
    seen: set[str] = {"langchain-compaction"}
    while wanted:
        name, _ = _names(wanted.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        # Dependencies every install gets (not those behind an extra).
        wanted += [r for r in requires if "extra ==" not in r]
    return seen


@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_snippet_imports_come_with_the_install_line_above_it(number):
    """A newcomer who runs the nearest ``pip install`` above a snippet can import everything it imports."""
    import sys
    from importlib import metadata

    text = README.read_text(encoding="utf-8")
    start = text.index(f"```python\n{BLOCKS[number]}")
    install = [line for line in text[:start].splitlines() if re.match(r"\s*(python -m )?pip install ", line)][-1]
    installed = _installed_by(install)
    providers = metadata.packages_distributions()
    for module in re.findall(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", BLOCKS[number], flags=re.M):
        if module in sys.stdlib_module_names or module == "langchain_compaction":
            continue
        dists = {_names(d)[0] for d in providers.get(module, [])}
        assert dists & installed, (
            f"README snippet {number + 1} imports {module!r} ({', '.join(sorted(dists)) or 'not installed'}), "
            f"which {install.strip()!r} does not install: name it on the install line above the snippet"
        )
