"""What a tool call was about, read without a model: its key argument, the file it used, the program it ran.

``key_argument`` (the path, command, URL or query a call names),
``file_use`` (a file read or modified), ``command_target`` (a command's program
and what it ran on: an error is resolved by a clean run of the same pair).
The rules follow the real transcripts' tools: editors that name their
operation in ``command`` (``str_replace_editor view``), command-line tools that
name themselves (SWE-agent's ``open path 293``), shells.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left, insort
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Generic, NamedTuple, TypeVar

from langchain_compaction.core.identifiers import is_path
from langchain_compaction.core.lines import MAX_KEY_CHARS, clip
from langchain_compaction.core.types import ToolCall

_SHORT_ARGUMENT = 80

# Which argument says what a call was about, most telling first.
_PATH_KEYS = ("file_path", "path", "filename", "file", "target_file", "notebook_path")
_KEY_ARGS = (*_PATH_KEYS, "command", "cmd", "url", "query", "pattern", "expression")

_WRITES = re.compile(r"write|edit|create|patch|replace|insert|append|apply|undo|rename|move|delete", re.I)
_READS = re.compile(r"read|view|open|show|cat\b|load", re.I)
SHELL = re.compile(r"bash|shell|terminal|exec|run|command|console|python|cmd", re.I)

# How a command is run, before the program: environment assignments and runners.
# (A package manager runs its scripts with or without "run": "npm test" is "npm run test", and runs
# the script that pnpm's and yarn's do.)
_RUNNERS = frozenset(
    {"sudo", "env", "time", "nice", "uv", "run", "poetry", "pipenv", "npx", "npm", "pnpm", "yarn", "bunx"}
)
_INTERPRETERS = re.compile(r"^python[0-9.]*$|^node$|^ruby$|^bash$|^sh$")
# aider's report of an edit it applied, on a line of its own: its edits are
# written in the assistant's text, not in a call's arguments, so this line is
# the only place the file is named. (Other harnesses' reports, "File created
# successfully at: PATH", come from calls ``file_use`` already reads.)
_APPLIED = re.compile(r"^Applied edit to (\S+)$", re.MULTILINE)
_REPORT_CHARS = 2_000
"""How far into a result the report may be (past it is the file's content)."""


_QUOTED = re.compile(r"\"[^\"]*\"|'[^']*'")
_CHAIN = re.compile(r"&&|\|\||;")
_PIPE = re.compile(r"(?<!\|)\|(?!\|)")
# What runs another command given in quotes ("bash -c '...'", "ssh host '...'"): the work is inside.
_WRAPPERS = frozenset({"bash", "sh", "zsh", "ssh", "docker", "podman", "kubectl", "su"})
# The quoted command such a wrapper runs: a shell's "-c", or ssh's last word ("docker run -e "X=1" img pytest"
# runs pytest, "psql -c "select 1"" runs psql).
_INNER = re.compile(
    r"""(?:^|[\s/])(?:bash|sh|zsh|su)(?:\s+-\w+)*?\s+-[A-Za-z]*c\s+("[^"]*"|'[^']*')|^\s*ssh\s.*?\s("[^"]*"|'[^']*')\s*$"""
)
# What only feeds a pipeline its input ("cat in.txt | python solve.py" ran solve.py).
_FEEDERS = frozenset({"cat", "echo", "printf", "yes", "seq"})
# A redirection ("2>&1", ">out.log", "2>/dev/null"): no argument; a bare one takes the next word.
_REDIRECT = re.compile(r"^(?:\d|&)?(?:>>?|<)")


def command_target(command: str) -> tuple[str, str]:
    """A command's program and what it ran on, flags aside: ``("pytest", "tests/test_a.py")``.

    The command is the chain's last (``cd repo && pytest``), and of a pipeline
    the first that does more than feed it (``pytest | tail``, ``cat in | python
    solve.py``); one a shell or ``ssh`` runs from quotes is read inside them.
    The target is the first argument that names a path (``a/b``, ``x.py``,
    ``tests/t.py::test_x``: a run of the file holds that test, one of another
    test of it does not), else the first plain argument; ``python -m pytest``
    is ``pytest``; redirections are no arguments.
    The target is written one way (``run_on``): ``./tests/`` is ``tests``, ``.`` no target.

    Example:
        >>> command_target("cd repo && python -m pytest -q tests/test_a.py::test_x -k boom")
        ('pytest', 'tests/test_a.py::test_x')
        >>> command_target("make build")
        ('make', 'build')
        >>> command_target('pytest tests/test_a.py 2>&1 | grep -E "FAIL|Error" | tail -20')
        ('pytest', 'tests/test_a.py')
        >>> command_target('bash -c "cd /repo && make test"'), command_target("cat in.txt | python solve.py")
        (('make', 'test'), ('solve.py', ''))
        >>> command_target("python -m pytest -q 2>&1 | tail -20"), command_target('docker run -e "K=1" img pytest t.py')
        (('pytest', ''), ('docker', 't.py'))
        >>> command_target("pytest ./tests/test_a.py"), command_target("pytest ."), command_target("npm run test")
        (('pytest', 'tests/test_a.py'), ('pytest', ''), ('test', ''))
    """
    return _program_and_target(_stage_words(command))


def _stage_words(command: str) -> list[str]:
    """The words of the stage of ``command`` that does the work (``command_target``'s), its runners left out."""
    # (Separators inside quotes separate nothing: ``grep -E "FAIL|Error"``. Most commands hold
    # no quote, chain or pipe: plain substring scans say so, and their patterns are not run.)
    quoted = '"' in command or "'" in command
    bare = _QUOTED.sub(lambda quote: "x" * len(quote.group()), command) if quoted else command
    chained = "&" in bare or "|" in bare or ";" in bare
    start = max((separator.end() for separator in _CHAIN.finditer(bare)), default=0) if chained else 0
    stages = [(m.start(), m.end()) for m in _PIPE.finditer(bare, start)] if "|" in bare else []
    bounds = list(zip([start] + [e for _, e in stages], [s for s, _ in stages] + [len(command)], strict=True))
    words: list[str] = []
    for low, high in bounds:
        raw = command[low:high].split()
        if next((w.rsplit("/", 1)[-1] for w in raw if w not in _RUNNERS), "") in _WRAPPERS:
            inner = _INNER.search(command[low:high])
            if inner:
                return _stage_words((inner.group(1) or inner.group(2))[1:-1])
        words = _arguments(raw)
        if words and words[0].rsplit("/", 1)[-1] not in _FEEDERS:
            break
    return words


def _program_and_target(words: list[str]) -> tuple[str, str]:
    """``command_target`` of a stage's words (``_stage_words``)."""
    if not words:
        return "", ""
    program = words[0].rsplit("/", 1)[-1]
    plain = [w for w in words[1:] if not w.startswith("-")]
    pathlike = [w for w in plain if "/" in w or "." in w]
    return program, run_on((pathlike or plain or [""])[0])


def run_on(target: str) -> str:
    """A command's target as runs on it are compared: relative to the project, without a closing slash.

    A run of the whole project (``pytest .``, ``go test ./...``) has no target,
    as ``pytest`` alone has none: it holds every target (``holds``); Go's
    ``pkg/...`` is ``pkg`` and what is under it.

    Example:
        >>> run_on("./tests/"), run_on("."), run_on("../lib"), run_on("/"), run_on("./..."), run_on("./api/...")
        ('tests', '', '../lib', '/', '', 'api')
    """
    while target.startswith("./"):
        target = target[2:]
    target = target.removesuffix("/...") if target != "/..." else target
    return "" if target in (".", "", "...") else target.rstrip("/") or target


def _arguments(segment: list[str]) -> list[str]:
    """A command's words past its runners (``sudo``, ``python -m``), without settings and redirections."""
    words: list[str] = []
    skip = False
    for word in segment:
        if skip:
            skip = False
        elif ("<" in word or ">" in word) and _REDIRECT.match(word):
            skip = _REDIRECT.sub("", word).lstrip("&") == ""  # ("> out.log": the file is the next word)
        elif "=" not in word or word.startswith("-"):
            words.append(word)
    while words and (words[0] in _RUNNERS or _INTERPRETERS.match(words[0].rsplit("/", 1)[-1])):
        words = words[2:] if words[0].rsplit("/", 1)[-1].startswith("python") and words[1:2] == ["-m"] else words[1:]
    return words


# What a harness answers for a call that did not run as the model wrote it: LangChain's
# HumanInTheLoopMiddleware (a rejection; an edit's note naming the call that ran instead) and
# ToolCallLimitMiddleware (a call past the limit, and the others of its batch).
_NOT_RUN = re.compile(
    r"(?:User rejected the tool call\b|Tool call limit exceeded\b|Execution stopped before this tool call could run\b)"
)
_RAN_INSTEAD = re.compile(r"Executed instead: (\S+) with arguments (?=\{)")


def ran_as(call: ToolCall, result: str) -> ToolCall | None:
    """The call that ran, as its result tells: ``call``; the one a reviewer put instead; ``None`` if none ran.

    Example:
        >>> call = ToolCall("c1", "deploy", '{"target": "prod"}')
        >>> ran_as(call, "User rejected the tool call for `deploy` with reason: no") is None
        True
        >>> ran_as(call, 'Note: ... Executed instead: deploy with arguments {"target": "staging"}.').arguments
        '{"target": "staging"}'
    """
    if _NOT_RUN.match(result):
        return None
    # (Read at every compaction for every result: a plain find first, the note opens the result.)
    at = result.find("Executed instead: ", 0, 4_000)
    instead = _RAN_INSTEAD.match(result, at) if at >= 0 else None
    if instead is None:
        return call
    try:
        arguments, _ = json.JSONDecoder().raw_decode(result, instead.end())
    except ValueError:
        return call
    return ToolCall(call.id, instead.group(1), json.dumps(arguments))


def call_arguments(call: ToolCall) -> dict[str, object]:
    """A tool call's arguments as a dict (empty when they are not a JSON object)."""
    try:
        value = json.loads(call.arguments) if call.arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def key_argument(call: ToolCall, arguments: dict[str, object] | None = None) -> str:
    """What a call was about: its path, command, URL or query, else an id or its first text argument."""
    args = call_arguments(call) if arguments is None else arguments
    for key in _KEY_ARGS:
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return clip(value.strip().splitlines()[0], MAX_KEY_CHARS)
    for key, value in args.items():
        if (key == "id" or key.endswith("_id")) and isinstance(value, (str, int)) and not isinstance(value, bool):
            return clip(str(value), MAX_KEY_CHARS)
    # Else a short text argument; a long one is prose (a "think" tool's thought).
    text = next((v.strip() for v in args.values() if isinstance(v, str) and v.strip()), "")
    return text if len(text) <= _SHORT_ARGUMENT and "\n" not in text else ""


def holds(target: str, path: str) -> bool:
    """Whether a run on ``target`` covers ``path``: it is ``target`` or lies under it.

    Example:
        >>> holds("tests/api", "tests/api/test_a.py"), holds("tests/api", "tests/api_v2")
        (True, False)
    """
    if not path.startswith(target):
        return False
    return len(path) == len(target) or not target or target[-1] in "/\\:" or path[len(target)] in "/\\:"


_V = TypeVar("_V")


@dataclass
class Unresolved(Generic[_V]):
    """Failed calls not resolved yet, each with a value, by program and target.

    A later clean run of the same program on a target that holds the failed
    one resolves it (the same suite, flags aside; the same tool on the same
    target). Targets are kept sorted by program: a clean run looks only at the
    targets that start with its own, so resolving stays cheap with thousands held.

    Example:
        >>> held = Unresolved[str]()
        >>> held.add("pytest", "tests/api/test_a.py", "boom"); held.add("pytest", "tests/api_v2", "other")
        >>> held.resolve("pytest", "tests/api"), held.resolve("pytest", "tests/api")
        (['boom'], [])
    """

    held: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    values: dict[int, _V] = field(default_factory=dict)
    _count: int = 0

    def add(self, program: str, target: str, value: _V) -> None:
        """Hold ``value`` for a failure of ``program`` on ``target``."""
        self._count += 1
        insort(self.held.setdefault(program, []), (target, self._count))
        self.values[self._count] = value

    def resolve(self, program: str, target: str, keep: Callable[[_V], bool] | None = None) -> list[_V]:
        """A clean run of ``program`` on ``target``: the failures it resolves (those ``keep`` does not), taken out."""
        held = self.held.get(program)
        if not held:
            return []
        start = end = bisect_left(held, (target,))
        while end < len(held) and held[end][0].startswith(target):
            end += 1
        # Of the targets that start with it, the ones it holds: itself and what
        # lies under it ("tests/api" holds "tests/api/test_a.py", not "tests/api_v2").
        gone, left = [], []
        for entry in held[start:end]:
            if holds(target, entry[0]) and not (keep and keep(self.values[entry[1]])):
                gone.append(self.values.pop(entry[1]))
            else:
                left.append(entry)
        held[start:end] = left
        return gone

    def copy(self) -> Unresolved[_V]:
        """An independent copy (the values themselves are shared: they are not changed)."""
        return Unresolved({program: list(held) for program, held in self.held.items()}, dict(self.values), self._count)


def written_files(result: str) -> list[str]:
    """The paths a successful result reports the harness applied edits to, in order (aider's report).

    Example:
        >>> written_files("Tokens: 11k sent\\nApplied edit to src/app.py\\nCommit 6a478b4 feat: bars")
        ['src/app.py']
    """
    paths: list[str] = []
    if result.find("Applied edit to ", 0, _REPORT_CHARS) < 0:
        return paths  # (most results: a plain scan says so, the line-anchored pattern is not run)
    for path in _APPLIED.findall(result[:_REPORT_CHARS]):
        if is_path(path) and path not in paths:
            paths.append(path)
    return paths


def file_use(call: ToolCall, args: dict[str, object], last_opened: str | None) -> tuple[str, str] | None:
    """``("read" | "modified", path)`` when ``call`` reads or changes a file."""
    return _used(*_file_action(call, args), last_opened)


def _used(action: str, path: str | None, own_command: bool, last_opened: str | None) -> tuple[str, str] | None:
    """``file_use`` of a call read by ``_file_action``."""
    if action == "modified":
        if path is None and own_command:
            path = last_opened  # SWE-agent's "edit 1:1" edits the file it opened last
        return ("modified", path) if path else None
    if path and action == "read":
        return "read", path
    return None


def _file_action(call: ToolCall, args: dict[str, object]) -> tuple[str, str | None, bool]:
    """What ``call`` does to a file (``_action``), the path it names, and whether its command names the tool itself."""
    command = args.get("command")
    # An editor tool names its operation in "command" (str_replace_editor view/create);
    # a command-line tool (SWE-agent's "open path 293") names itself and the path.
    verb = command if isinstance(command, str) and command.isidentifier() else call.name
    path = None
    for key in _PATH_KEYS:  # (a loop, not ``next`` over a generator: read for every call)
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            path = value
            break
    own_command = isinstance(command, str) and command.split(None, 1)[:1] == [call.name]
    if path is None and own_command:
        words = str(command).split()
        path = words[1] if len(words) >= 2 and is_path(words[1]) else None
    return _action(verb), path, own_command


class CallReading(NamedTuple):
    """What one tool call was about, read once (``read_call``).

    (A named tuple: made for every call, at a third of a frozen dataclass's
    cost, and of strings and flags alone, which the garbage collector stops following.)

    Attributes:
        use: ``file_use`` of the call with no file opened before.
        edits_last_opened: The call modifies the file opened last (SWE-agent's
            ``edit 1:1``): its ``use`` depends on that file.
        key: Its key argument (``key_argument``).
        command: The key argument, else the tool's name.
        shell: The tool runs commands (its errors are in its whole output).
        program: The program the command ran (the tool's name for other tools).
        target: What it ran on (the command, for other tools).
        narrowed: The command may have left out part of its target (``pytest -k``,
            ``--deselect``, ``--collect-only``, ``--dry-run``): a clean run of it
            resolves only the failures of the very same command.
    """

    use: tuple[str, str] | None
    edits_last_opened: bool
    key: str
    command: str
    shell: bool
    program: str
    target: str
    narrowed: bool = False

    def file_use(self, last_opened: str | None) -> tuple[str, str] | None:
        """``file_use`` of the call, given the file opened last."""
        if self.edits_last_opened and last_opened:
            return "modified", last_opened
        return self.use


_TEST_RUNNERS = frozenset({"pytest", "py.test"})
# pytest's options that leave tests out, or run none, as the stage's words (``python -m`` is a runner, gone already).
_NARROWING = re.compile(r"(?:-[A-Za-z]*[km]|--deselect|--collect-only|--co|--ignore(?:-glob)?)(?:=\S*)?|-k\S+")
# Any program's options that run nothing (a version, a help text, a dry run, a build or a listing of the tests alone).
_RUNS_NOTHING = frozenset({"--version", "--help", "-h", "--dry-run", "--no-run", "--listtests", "--list-tests"})


def _narrowed(program: str, words: Sequence[str]) -> bool:
    """Whether a command may leave out part of its target: a test filter, or a run of nothing (``CallReading``)."""
    rest = words[1:]
    if any(word.partition("=")[0].lower() in _RUNS_NOTHING for word in rest):
        return True
    if program in _TEST_RUNNERS:
        return any(map(_NARROWING.fullmatch, rest))
    if program == "make":
        return any(word in ("-n", "--just-print", "--recon") for word in rest)
    if program == "go":  # go test -run TestX
        return any(word == "-run" or word.startswith("-run=") for word in rest)
    if program == "cargo":  # cargo test add: a filter
        return rest[:1] == ["test"] and any(not word.startswith("-") for word in rest[1:])
    return program in ("jest", "vitest") and any(word.partition("=")[0] in ("-t", "--testNamePattern") for word in rest)


def read_call(call: ToolCall) -> CallReading:
    """What ``call`` was about, read once and kept on it (a call is read at every compaction that holds it)."""
    known = call.known_reading
    if isinstance(known, CallReading):
        return known
    args = call_arguments(call)
    key = key_argument(call, args)
    command = key or call.name
    shell = SHELL.search(call.name) is not None
    words = _stage_words(command) if shell else []
    program, target = _program_and_target(words) if shell else (call.name, command)
    action = _file_action(call, args)  # (read once for both)
    use = _used(*action, None)
    edits_last_opened = use is None and _used(*action, "\x00") is not None
    narrowed = _narrowed(program, words)
    reading = CallReading(use, edits_last_opened, key, command, shell, program, target, narrowed)
    object.__setattr__(call, "known_reading", reading)
    return reading


@lru_cache(maxsize=1024)
def _action(verb: str) -> str:
    """What a tool or operation named ``verb`` does to a file: "modified", "read" or "" (tools are few: kept)."""
    if _WRITES.search(verb):
        return "modified"
    return "read" if _READS.search(verb) else ""
