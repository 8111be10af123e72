"""The ``langchain-compaction`` command line: demo, inspect, compact.

``demo`` replays a real agent run shipped in the package, compacting it offline.
``inspect`` shows where a conversation's tokens go and where the cut falls.
``compact`` writes the compacted conversation in the input's format.

Exit status: 0 on success, 2 for a bad file or bad arguments (one line on
stderr says what and where), 1 when the summarizer fails, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from langchain_compaction import __version__
from langchain_compaction._lc.advice import no_room
from langchain_compaction._lc.file_numbers import compacted_figures, inspected_figures, items_among
from langchain_compaction._lc.no_cut import why_no_cut
from langchain_compaction._terminal import Progress, Style, table
from langchain_compaction.core.context import needs_compaction
from langchain_compaction.core.lines import one_line
from langchain_compaction.core.options import Budget, CompactionOptions
from langchain_compaction.core.plan import Plan, leading_block, plan_compaction
from langchain_compaction.core.result import CompactionResult
from langchain_compaction.core.transcript import message_body
from langchain_compaction.core.types import Message
from langchain_compaction.errors import CompactionError, ConfigurationError, ConversationFileError
from langchain_compaction.summarizers.extractive import ExtractiveSummarizer

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from langchain_compaction.formats import Conversation

# LangChain is imported only by commands that read or write a conversation: ``--help`` loads none.


def _options(args: argparse.Namespace) -> CompactionOptions:
    from langchain_compaction.core.redact import redact_secrets

    return CompactionOptions(
        context_window=args.context_window,
        reserve_tokens=args.reserve_tokens,
        keep_recent_tokens=args.keep_recent_tokens,
        summary_input_tokens=getattr(args, "summary_input_tokens", None),
        redact=redact_secrets if getattr(args, "redact_secrets", False) else None,
    )


def _read(path: str) -> tuple[list[BaseMessage], Conversation]:
    from langchain_compaction.formats import parse_conversation

    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise ConversationFileError(f"cannot read the file: {exc.strerror or exc}", where=path) from exc
    conversation = parse_conversation(data, name=path)
    return conversation.messages, conversation


def _model(args: argparse.Namespace) -> Any:
    if args.offline or not args.model:
        return ExtractiveSummarizer()
    try:
        from langchain.chat_models import init_chat_model
    except ImportError as exc:
        msg = 'pip install "langchain-compaction[agents]" (and the provider package) to use --model'
        raise ConfigurationError("--model", args.model, msg) from exc
    try:
        return init_chat_model(args.model)
    except Exception as exc:
        first = str(exc).strip().split("\n", 1)[0]  # (LangChain's own message goes on with every provider it knows)
        raise ConfigurationError("--model", args.model, f"{first} Use provider:model, e.g. anthropic:...") from exc


def _inspect_report(
    args: argparse.Namespace,
    messages: list[BaseMessage],
    core: list[Message],
    counts: list[int],
    conversation: Conversation,
    *,
    overhead: int,
) -> dict[str, Any]:
    from langchain_compaction._lc.compactor import planning_options

    # The keep budget a compaction plans with: over what it cannot remove (the leading system prompt, the tools).
    options = planning_options(_options(args), core, counts, overhead)
    by_type: Counter[str] = Counter()
    number: Counter[str] = Counter()
    by_role: Counter[str] = Counter()
    for message, core_message, count in zip(messages, core, counts):
        by_role[core_message.role] += count
        by_type[message.type] += count
        number[message.type] += 1
    # Without a window, the manual cut ``compact`` makes (forced when everything fits the keep budget).
    budget = options.budget  # (``most``: a tool exchange in progress larger than that is summarized whole)
    plan = plan_compaction(core, counts, budget.keep, force=budget.threshold is None, most=budget.most_kept)
    # What a compaction would replace: the region before the cut and earlier
    # summaries; the leading system prompt and the provider's prefix stay.
    summarized = [] if plan is None else [*(i for i in plan.previous_summaries if i < plan.start), *plan.region]
    total, t_summarized = sum(counts), sum(counts[i] for i in summarized)
    over = needs_compaction(core, counts, options, overhead)
    # (The leading system prompt is never summarized: a part of every request, as the tool schemas are.)
    fixed = sum(counts[: leading_block(core)])
    held = _held(options, core, counts, plan, overhead=overhead, over=over)
    kept = set(range(len(messages))).difference(summarized)
    return {
        "file": args.file,
        "format": conversation.format + ("+jsonl" if conversation.jsonl else ""),
        **inspected_figures(conversation, plan.cut if plan else 0),  # (counted and numbered as the file holds them)
        "tokens": total,
        "tokens_by_role": dict(by_role),
        "tokens_by_type": dict(by_type),
        "count_by_type": dict(number),
        "context_window": options.context_window,
        "threshold": options.budget.threshold,
        "over_threshold": over,
        "would_compact": over and not held,  # what compact does with the same window
        "held": held,
        "keep_budget": options.budget.keep,
        "summarized": {"messages": items_among(conversation, summarized), "tokens": t_summarized},
        "kept": {"messages": items_among(conversation, kept), "tokens": total - t_summarized},
        "fixed_tokens": fixed,
        "overhead_tokens": overhead,  # what the request sends besides its messages (its tools), every time
    }


def _print_inspect(
    report: dict[str, Any], messages: list[BaseMessage], core: list[Message], args: argparse.Namespace, out: TextIO
) -> None:
    style = Style(out)
    total, by_type, number = report["tokens"], report["tokens_by_type"], report["count_by_type"]
    lc = report["langchain_messages"]  # (more when Anthropic turns hold tool results and text, or "system" is given)
    as_lc = f"; read as {lc} LangChain messages" if lc != report["messages"] else ""
    head = f"{args.file}: {report['messages']} messages, ~{total:,} tokens ({report['format']}{as_lc})"
    print(style.bold(head), file=out)
    if report["overhead_tokens"]:
        print(f"plus ~{report['overhead_tokens']:,} tokens of tool schemas sent with every request", file=out)
    rows = [[t, str(number[t]), f"{by_type[t]:,}", f"{by_type[t] / max(total, 1):.0%}"] for t in sorted(by_type)]
    print(table(rows, ["type", "LangChain messages" if as_lc else "messages", "tokens", "share"], style), file=out)
    if report["threshold"] is not None:
        verdict = style.yellow("would compact") if report["over_threshold"] else style.green("fits")
        reserve = args.context_window - report["threshold"]
        print(f"\nwindow {args.context_window:,} - reserve {reserve:,} = {report['threshold']:,}: {verdict}", file=out)
    else:
        print("\nno --context-window given: automatic compaction is off; the cut below is for a manual one", file=out)
    cut, summarized, kept = report["langchain_cut_index"], report["summarized"], report["kept"]
    if report["over_threshold"] and report["held"]:
        print(f"but no automatic compaction: {report['held']}", file=out)
    if not cut:
        if not report["over_threshold"]:
            print(f"no cut: {report['held']}", file=out)
        return
    at = f"{'inside' if report['cut_inside_message'] else 'at'} message {report['cut_index']}"
    print(
        f"cut {at}: summarize {summarized['messages']} (~{summarized['tokens']:,} tokens), "
        f"keep {kept['messages']} (~{kept['tokens']:,} tokens)",
        file=out,
    )
    first = message_body(core[cut]).strip().splitlines() if cut < len(core) else ["(none: a tool exchange goes whole)"]
    kind = f"[{messages[cut].type}] " if cut < len(core) else ""
    print(style.dim(f"first kept: {kind}{one_line(first[0] if first else '', 100)}"), file=out)


def _inspect(args: argparse.Namespace, out: TextIO) -> int:
    from langchain_compaction._lc.counting import counts_and_core
    from langchain_compaction._lc.request_file import request_overhead

    messages, conversation = _read(args.file)
    options = _options(args)
    counts, core = counts_and_core(messages, options)
    overhead = request_overhead(conversation.request, options)
    report = _inspect_report(args, messages, core, counts, conversation, overhead=overhead)
    if args.json:
        del report["count_by_type"]
        print(json.dumps(report, indent=2), file=out)
    else:
        _print_inspect(report, messages, core, args, out)
    return 0


def _print_result(result: CompactionResult, out: TextIO, style: Style, overhead: int, file: dict[str, int]) -> None:
    rows = [
        ["messages removed", str(file["removed"])],  # (the file's: ``result`` counts LangChain's)
        ["messages kept", str(file["kept"])],
        ["tokens before", f"{result.original_tokens:,}"],
        ["tokens after", f"{result.compacted_tokens:,}"],
        ["summarizer", result.summarizer + (" (fallback)" if result.fallback_used else "")],
        ["summarizer calls", str(result.summarizer_calls)],
        ["summarizer input tokens", f"{result.summarizer_input_tokens:,}"],
    ]
    if overhead:  # (the request's size is the messages' tokens after and these)
        rows.insert(4, ["+ tool schemas, every request", f"{overhead:,}"])
    print(table(rows, ["compaction", "value"], style), file=out)


def _writable(path: str | None) -> None:
    """Check the output path before any work is done: one clear line, not a traceback afterwards."""
    if not path:
        return
    target = Path(os.path.realpath(path))  # (a link is written where it points)
    if target.is_dir():
        raise ConfigurationError("--output", path, "it is a directory; name a file")
    if not target.parent.is_dir():
        what = "is a file, not a folder" if target.parent.exists() else "does not exist; create it first"
        raise ConfigurationError("--output", path, f"the folder {str(target.parent)!r} {what}")
    if not os.access(target.parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ConfigurationError("--output", path, "it cannot be written (permission denied)")


def _held(
    options: CompactionOptions,
    core: list[Message],
    counts: list[int],
    plan: Plan | None,
    *,
    overhead: int,
    over: bool,
) -> str:
    """Why the conversation is not compacted ("" when it would be): the fixed part leaves no room, or no cut falls.

    ``over``: whether it is over its threshold (only then is a fix named for a missing cut).
    """
    budget = options.budget
    if no_room(budget):
        return _no_room(budget, overhead)
    if plan is not None:
        return ""
    # (Without a window the cut is forced: a manual compaction, as ``compact`` makes.)
    return why_no_cut(core, counts, budget, over=over, forced=budget.threshold is None)


def _no_room(budget: Budget, overhead: int) -> str:
    """What the fixed part takes when it leaves a compaction no room (``advice.no_room``), and the fix."""
    head = budget.fixed - overhead
    taken = {
        "the system prompt and leading system messages": head,
        "the tool schemas sent with every request": overhead,
    }
    # (A part of a quarter of the whole or more is worth making smaller.)
    fixes = ["a larger --context-window", *(["a shorter system prompt"] * (head * 4 >= budget.fixed))]
    fixes += ["fewer tools"] * (overhead * 4 >= budget.fixed)
    parts = [(what, tokens) for what, tokens in taken.items() if tokens]
    return (
        " and ".join(f"{what} (~{tokens:,})" if len(parts) > 1 else what for what, tokens in parts)
        + f" take ~{budget.fixed:,} tokens of the {budget.threshold or 0:,} a request may hold (window "
        f"{budget.window:,} minus reserve {budget.reserve:,}): no room is left for the conversation, so no "
        f"compaction can make the request fit; {', '.join(fixes[:-1])} or {fixes[-1]} is the fix"
    )


def _what_happened(
    result: CompactionResult | None, args: argparse.Namespace, messages: list[BaseMessage], overhead: int
) -> str:
    if result is not None:
        kind = "a manual compaction (forced cut)" if result.forced else "a compaction"
        why = "--force" if args.force else "no --context-window" if not args.context_window else "over the threshold"
        return f"{kind} ({why})"
    if args.context_window and not args.force:
        from langchain_compaction._lc.compactor import planning_options
        from langchain_compaction._lc.counting import counts_and_core

        given = _options(args)
        counts, core = counts_and_core(messages, given)
        options = planning_options(given, core, counts, overhead)  # as the compaction plans
        if needs_compaction(core, counts, options, overhead):
            plan = plan_compaction(core, counts, options.budget.keep, force=False, most=options.budget.most_kept)
            why = _held(options, core, counts, plan, overhead=overhead, over=True) or "the compaction was not made"
            tools = f", and ~{overhead:,} of tool schemas with it" if overhead else ""
            threshold = options.budget.threshold or 0
            over = f"the conversation (~{sum(counts):,} tokens{tools}) is over the threshold of {threshold:,}"
            return f"nothing done: {over}, but {why}"
        return "nothing done: the conversation fits the window (pass --force to compact anyway)"
    return "nothing to compact"


def _checked_overhead(
    args: argparse.Namespace, options: CompactionOptions, messages: list[BaseMessage], conversation: Conversation
) -> int:
    """The tokens the request sends besides its messages (its tools); a window they leave no room is refused."""
    from langchain_compaction._lc.compactor import planning_options
    from langchain_compaction._lc.counting import counts_and_core
    from langchain_compaction._lc.request_file import request_overhead
    from langchain_compaction.functional import should_compact

    overhead = request_overhead(conversation.request, options)
    # (Only a request that needs compacting, or is told to compact, is refused: one that fits goes as it is,
    # and its room is not planned.)
    if args.context_window and (args.force or should_compact(messages, options=options, overhead_tokens=overhead)):
        counts, core = counts_and_core(messages, options)
        budget = planning_options(options, core, counts, overhead).budget
        if no_room(budget):
            raise ConfigurationError("--context-window", args.context_window, _no_room(budget, overhead))
    return overhead


def _compact(args: argparse.Namespace, out: TextIO) -> int:
    from langchain_compaction.formats import dump_conversation
    from langchain_compaction.functional import auto_compact, compact
    from langchain_compaction.history.stores import replace_file
    from langchain_compaction.summarizers.chat_model import as_summarizer

    if args.output == "-":
        args.output = None  # "-" is standard output, as it is standard input for the file
    _writable(args.output)
    messages, conversation = _read(args.file)
    options = _options(args)
    overhead = _checked_overhead(args, options, messages, conversation)  # (before any summary is paid for)
    summarizer = Progress(as_summarizer(_model(args)), sys.stderr, args.json)
    # With a window, compact only when over it (as the adapters do); without
    # one, or with --force, compact now.
    instructions = args.instructions or ""
    if args.context_window and not args.force:
        result, compacted = auto_compact(
            summarizer, messages, options, custom_instructions=instructions, overhead_tokens=overhead
        )
    else:
        result, compacted = compact(summarizer, messages, options, instructions, overhead_tokens=overhead)
    happened = _what_happened(result, args, messages, overhead)
    text = dump_conversation(compacted, conversation.format, jsonl=conversation.jsonl, read=conversation)
    file = compacted_figures(conversation, compacted, text)  # (in the files' terms)
    if args.output:  # (whole or not at all: ``-o`` may name the input, which a failed write must not cut)
        try:
            replace_file(args.output, text)
        except OSError as exc:
            raise ConfigurationError("--output", args.output, f"it could not be written ({exc.strerror})") from exc
    if args.json:
        payload = {"result": result.to_dict() if result else None, "what": happened, "output": args.output}
        payload["overhead_tokens"], payload["file_messages"] = overhead, file
        if not args.output:
            payload["messages"] = json.loads(dump_conversation(compacted, "langchain"))
        print(json.dumps(payload, indent=2, ensure_ascii=False), file=out)
        return 0
    # With the conversation on stdout, the figures go to stderr so a pipe
    # receives a clean file.
    report = out if args.output else sys.stderr
    print(happened, file=report)  # once: what happened, then the figures if anything did
    if result is not None:
        _print_result(result, report, Style(report), overhead, file)
    if args.output:
        print(f"wrote {file['written']} messages to {args.output}", file=out)
    else:
        out.write(text)
    return 0


def _demo(args: argparse.Namespace, out: TextIO) -> int:
    from langchain_compaction.demo import run_demo

    if args.context_window <= 0:
        # (An unknown window turns automatic compaction off: there would be nothing to show.)
        raise ConfigurationError(
            "context_window", args.context_window, "the demo compacts in a window: pass one, e.g. 8000"
        )
    return run_demo(out, window=args.context_window, reserve=args.reserve_tokens, keep=args.keep_recent_tokens)


def _archive(args: argparse.Namespace, out: TextIO) -> int:
    from langchain_compaction._lc.archive_cli import print_archive

    return print_archive(
        args.store, args.thread, out, prefix=args.prefix, show=args.show, as_json=args.json, subgraph=args.subgraph
    )


def _budgets(p: argparse.ArgumentParser, window: int, *, unknown: bool = True) -> None:
    p.add_argument(
        "--context-window",
        type=int,
        default=window,
        help="model window in tokens" + ("; 0: unknown" if unknown else "") + " (default: %(default)s)",
    )
    p.add_argument(
        "--reserve-tokens",
        type=int,
        default=None,
        help="tokens kept free for the reply (default: 16384, or the window / 8 when smaller)",
    )
    p.add_argument(
        "--keep-recent-tokens",
        type=int,
        default=None,
        help="recent tokens kept verbatim (default: 20000, or less in a small window)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="langchain-compaction",
        description="Compact long LangChain conversations into a summary plus recent messages.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text)

    demo = command("demo", "replay a real agent session shipped with the package, compacting it offline")
    _budgets(demo, 8_000, unknown=False)  # (the demo compacts in a window)
    demo.set_defaults(run=_demo)

    inspect = command("inspect", "show tokens by role and type, whether it would compact, and where the cut falls")
    inspect.add_argument(
        "file", help="conversation file (LangChain, OpenAI, Anthropic JSON, or JSON Lines); - for stdin"
    )
    _budgets(inspect, 0)
    inspect.add_argument("--json", action="store_true", help="print JSON for machines")
    inspect.set_defaults(run=_inspect)

    comp = command("compact", "write the compacted conversation in the input's format")
    comp.add_argument("file", help="conversation file; - for stdin")
    comp.add_argument(
        "-o", "--output", help="where to write the compacted conversation (default, or -: standard output)"
    )
    source = comp.add_mutually_exclusive_group()
    source.add_argument(
        "--model", help="summarize with provider:model (needs its package and API key; default: offline)"
    )
    source.add_argument("--offline", action="store_true", help="use the offline extractive summarizer (default)")
    comp.add_argument("--instructions", help="custom instructions for the summary (default: none)")
    comp.add_argument(
        "--redact-secrets",
        action="store_true",
        help="mask API keys, tokens and passwords in what the summarizer is shown (redact_secrets)",
    )
    comp.add_argument(
        "--summary-input-tokens", type=int, default=None, help="largest summarizer request (default: the threshold)"
    )
    comp.add_argument(
        "--force", action="store_true", help="with --context-window: compact even when the conversation fits"
    )
    _budgets(comp, 0)
    comp.add_argument("--json", action="store_true", help="print JSON for machines")
    comp.set_defaults(run=_compact)
    _archive_command(command("archive", "list a thread's archived messages in a LangGraph store (needs [stores])"))
    return parser


def _archive_command(arch: argparse.ArgumentParser) -> None:
    arch.add_argument("store", help="postgresql://user@host/db, or sqlite:///path/to/store.db")
    arch.add_argument("thread", help="the thread id (as in the run's config)")
    arch.add_argument("--show", help="print one message in full: its key or position")
    arch.add_argument("--prefix", default="compaction_archive", help="namespace prefix (default: %(default)s)")
    arch.add_argument(
        "--subgraph",
        action="append",
        default=[],
        metavar="NODE",
        help="a sub-agent's own archive: the node that runs it (repeat for deeper ones, outermost first)",
    )
    arch.add_argument("--json", action="store_true", help="print JSON for machines")
    arch.set_defaults(run=_archive)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command line.

    Args:
        argv: Arguments (``sys.argv[1:]`` when ``None``).
        out: Where normal output goes (stdout when ``None``).

    Returns:
        The exit status.
    """
    for console in (sys.stdout, sys.stderr):
        # A console that cannot write every character (cp1252 on Windows) gets escapes, not a traceback:
        # the summaries hold arrows and dashes whatever the input (``-o`` always writes UTF-8).
        encoding = (getattr(console, "encoding", None) or "utf-8").replace("_", "-").lower()
        if encoding not in ("utf-8", "utf8") and isinstance(console, io.TextIOWrapper):
            console.reconfigure(errors="backslashreplace")
    stream = out or sys.stdout
    args = _parser().parse_args(argv)
    try:
        return int(args.run(args, stream))
    except (ConversationFileError, ConfigurationError) as exc:
        print(f"langchain-compaction: error: {exc}", file=sys.stderr)
        return 2
    except CompactionError as exc:
        print(f"langchain-compaction: compaction failed: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (``... | head``): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:  # (Ctrl-C: one line and the shell's status, as Unix tools do)
        print("langchain-compaction: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
