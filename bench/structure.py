"""How big and how tangled the package is: the figures the refactor is judged by.

python bench/structure.py [--json]

- package lines (every .py file under langchain_compaction/), the largest module;
- functions and methods longer than 60 lines (by their source span);
- ``len(langchain_compaction.__all__)``;
- what ``import langchain_compaction`` loads (langchain_core, langgraph, langchain,
  anthropic) and how long it takes, in a fresh interpreter (best of 5);
- what ``langchain-compaction --help`` loads;
- how many of the package's functions one compaction through ``CompactionNode``
  passes through, and in how many files (a profiler hook counts each distinct
  function entered while the node compacts a state over its budget): plain (the
  default features: checked facts, pins), and with every feature on (prepared
  summaries, the archive, pins, clearing; the turn that applies a prepared
  compaction at the threshold, in a graph with a store). The summarizer is the
  offline ``ExtractiveSummarizer``; its own functions are counted too, and
  reported apart.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "langchain_compaction"
FRAMEWORKS = ("langchain_core", "langgraph", "langchain", "anthropic")


def source_figures() -> dict[str, object]:
    files = sorted(PACKAGE.rglob("*.py"))
    lines = {str(f.relative_to(ROOT)): len(f.read_text(encoding="utf-8").splitlines()) for f in files}
    long_functions = []
    for file in files:
        tree = ast.parse(file.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                span = (node.end_lineno or node.lineno) - node.lineno + 1
                if span > 60:
                    long_functions.append(f"{file.relative_to(ROOT)}:{node.name} ({span})")
    largest = max(lines, key=lambda k: lines[k])
    return {
        "package_lines": sum(lines.values()),
        "modules": len(lines),
        "largest_module": f"{largest} ({lines[largest]})",
        "functions_over_60_lines": sorted(long_functions),
    }


_IMPORT_PROBE = """
import sys, time
start = time.perf_counter()
import langchain_compaction
elapsed = time.perf_counter() - start
names = getattr(langchain_compaction, "__all__", [])
print({"seconds": elapsed, "all": len([n for n in names if n != "__version__"]),
       "loaded": sorted(m for m in %r if m in sys.modules)})
"""

_HELP_PROBE = """
import sys, io, contextlib
from langchain_compaction import cli
with contextlib.redirect_stdout(io.StringIO()):
    try:
        cli.main(["--help"])
    except SystemExit:
        pass
print(sorted(m for m in %r if m in sys.modules))
"""

_WALK_PROBE = """
import sys, time
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.store.memory import InMemoryStore
from langchain_compaction import CompactionNode, CompactionOptions, ExtractiveSummarizer
from langchain_compaction.features import Archive, ClearToolOutputs, PrepareAhead, default_features
from langchain_compaction.graph import CompactionState

package, every = %r, %r
options = CompactionOptions(context_window=4_000, reserve_tokens=500, keep_recent_tokens=1_000)
features = [*default_features(), ClearToolOutputs(), PrepareAhead(at=0.7, wait=5.0), Archive()] if every else None
node = CompactionNode(ExtractiveSummarizer(), options, features=features, result_key="compaction")
turn = [0]
def agent(state):
    turn[0] += 1
    return {"messages": [AIMessage(f"answer {turn[0]} " * 40, id=f"a{turn[0]}")]}
builder = StateGraph(CompactionState)
builder.add_node("compact", node)
builder.add_node("agent", agent)
builder.add_edge(START, "compact")
builder.add_edge("compact", "agent")
graph = builder.compile(checkpointer=InMemorySaver(), store=InMemoryStore())
config = {"configurable": {"thread_id": "probe"}}
seen = set()
def hook(frame, event, arg):
    if event == "call" and frame.f_code.co_filename.startswith(package) and not frame.f_code.co_name.startswith("<"):
        seen.add((frame.f_code.co_filename, frame.f_code.co_qualname))
for i in range(60):
    message = HumanMessage(f"question {i} about src/app_{i}.py " * 12, id=f"h{i}")
    seen.clear()
    sys.setprofile(hook)
    state = graph.invoke({"messages": [message]}, config)
    sys.setprofile(None)
    if state.get("compaction"):
        break
    time.sleep(0.05)  # a background preparation finishes meanwhile, as during an agent's model call
assert state.get("compaction"), "the probe should compact"
if every:
    assert state["compaction"]["parts"]["prepared"]["applied"], "the probe should apply a prepared compaction"
summarizer = {(f, q) for f, q in seen if f.endswith("summarizers/extractive.py")}
print({"functions": len(seen), "files": len({f for f, _ in seen}),
       "without_the_summarizer": {"functions": len(seen - summarizer), "files": len({f for f, _ in seen - summarizer})},
       "by_file": sorted(((f[len(package) + 1:], len([1 for g, _ in seen if g == f])) for f in {f for f, _ in seen}),
                         key=lambda item: -item[1])})
"""


def _probe(code: str) -> object:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def runtime_figures() -> dict[str, object]:
    imports = [_probe(_IMPORT_PROBE % (FRAMEWORKS,)) for _ in range(5)]
    best = min(imports, key=lambda r: r["seconds"])  # type: ignore[index]
    return {
        "all_names": best["all"],  # type: ignore[index]
        "import_seconds_best_of_5": round(best["seconds"], 3),  # type: ignore[index]
        "import_loads": best["loaded"],  # type: ignore[index]
        "cli_help_loads": _probe(_HELP_PROBE % (FRAMEWORKS,)),
        "node_compaction_path": _probe(_WALK_PROBE % (str(PACKAGE), False)),
        "node_compaction_path_every_feature": _probe(_WALK_PROBE % (str(PACKAGE), True)),
    }


def main() -> None:
    figures = {**source_figures(), **runtime_figures()}
    if "--json" in sys.argv:
        print(json.dumps(figures, indent=2))
        return
    for key, value in figures.items():
        if isinstance(value, list) and value and key == "functions_over_60_lines":
            print(f"{key}: {len(value)}")
            for item in value:
                print(f"    {item}")
        else:
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
