"""The command line: demo, inspect, compact; readable output, --json, exit status 2 on bad files."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import messages_from_dict

from langchain_compaction.cli import main
from langchain_compaction.formats import ConversationFileError, parse_conversation
from tests.conftest import transcript_path


@pytest.fixture
def ponyc() -> str:
    return str(transcript_path("openhands-ponyc-4588"))


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def test_demo_compacts_several_times_and_prints_the_figures():
    code, text = run("demo")
    assert code == 0
    assert "replaying 101 messages of a real OpenHands run" in text
    rows = [line for line in text.splitlines() if line[:3].strip().isdigit()]
    assert len(rows) >= 3, text
    assert "compactions; final context:" in text
    assert "## Goal" in text


def test_demo_prints_its_table_whole_and_warnings_as_notes(caplog):
    """The library's warnings come under the table as notes on a numbered compaction, not amid the rows."""
    code, text = run("demo")
    assert code == 0
    lines = text.splitlines()
    at = [i for i, line in enumerate(lines) if line[:3].strip().isdigit() and len(line.split()) == 7]
    assert at == list(range(at[0], at[-1] + 1))  # the rows, nothing between them
    notes = [line for line in lines if line.startswith("note on compaction ")]
    assert all(1 <= int(line.split()[3].rstrip(":")) <= len(at) for line in notes)
    assert not caplog.records  # said once, in the demo's own output
    # A harness's feedback on a call ("Parameter 'command' is expected ...") is no request to continue with.
    assert "Continue with the latest request: Parameter" not in text


def test_inspect_reports_tokens_by_type_and_the_cut(ponyc):
    code, text = run(
        "inspect", ponyc, "--context-window", "20000", "--reserve-tokens", "2000", "--keep-recent-tokens", "5000"
    )
    assert code == 0
    assert "101 messages" in text
    for kind in ("ai", "human", "system", "tool"):
        assert kind in text
    assert "would compact" in text
    assert "cut at message" in text


def test_inspect_json_is_machine_readable(ponyc):
    code, text = run("inspect", ponyc, "--json", "--keep-recent-tokens", "5000")
    assert code == 0
    report = json.loads(text)
    assert report["messages"] == 101
    assert report["would_compact"] is False  # no window given: automatic compaction is off
    # Messages before the cut, less the leading system prompt (never summarized).
    assert report["summarized"]["messages"] == report["cut_index"] - 1 > 0
    assert report["summarized"]["tokens"] + report["kept"]["tokens"] == report["tokens"]
    assert sum(report["tokens_by_type"].values()) == report["tokens"]


def test_compact_writes_the_input_format(tmp_path, ponyc):
    out_file = tmp_path / "out.json"
    code, text = run("compact", ponyc, "-o", str(out_file), "--keep-recent-tokens", "4000")
    assert code == 0
    assert "messages removed" in text
    messages = messages_from_dict(json.loads(out_file.read_text()))
    assert messages[0].type == "system"
    assert str(messages[1].content).startswith("[Conversation summary")
    assert len(messages) < 101


def test_compact_json_with_instructions(tmp_path, ponyc):
    code, text = run(
        "compact",
        ponyc,
        "--json",
        "--offline",
        "--instructions",
        "keep the match.c details",
        "--keep-recent-tokens",
        "4000",
    )
    assert code == 0
    payload = json.loads(text)
    assert payload["result"]["summarizer"] == "extractive"
    assert "keep the match.c details" in payload["result"]["summary"]
    assert payload["messages"][1]["type"] == "system"


def test_compact_shows_progress_when_chunked(capsys, ponyc):
    code, _ = run("compact", ponyc, "--keep-recent-tokens", "2000", "--summary-input-tokens", "3000", "-o", "/dev/null")
    assert code == 0
    err = capsys.readouterr().err
    # Not a terminal: each step on its own line, none overwritten.
    steps = [line for line in err.splitlines() if line.startswith("summarizing chunk")]
    assert len(steps) > 1
    assert "\r" not in err
    # The count is what is planned ("of about"); the last step's number is the last count said.
    assert steps[-1].split()[2] == steps[-1].split()[-1]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{bad", "invalid JSON at line 1"),
        ('[{"role": "user"', "invalid JSON"),
        ("[3]", "message 1"),
        # A number of more digits than Python reads (a ValueError that is no JSONDecodeError), whole file or a line.
        ('[{"role": "user", "content": "hi", "n": ' + "9" * 5_000 + "}]", "a number that long"),
        ('{"role": "user", "content": "a"}\n{"role": "user", "n": ' + "9" * 5_000 + "}", "line 2: a value cannot"),
    ],
)
def test_bad_file_gives_one_line_and_exit_2(tmp_path, capsys, content, needle):
    path = tmp_path / "bad.json"
    path.write_text(content)
    code, _ = run("inspect", str(path))
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(path) in err
    assert needle in err


def test_deeply_nested_json_is_one_clean_error(tmp_path, capsys):
    """Deeply nested JSON is one clean ConversationFileError, and one line and exit status 2 on the command line."""
    with pytest.raises(ConversationFileError, match="nested too deeply"):
        parse_conversation("[" * 100_000)
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000)
    assert main(["inspect", str(path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_missing_file_and_bad_options_exit_2(capsys, ponyc):
    assert run("inspect", "/nonexistent/conv.json")[0] == 2
    assert "cannot read the file" in capsys.readouterr().err
    assert run("inspect", ponyc, "--keep-recent-tokens", "-5")[0] == 2
    assert "keep_recent_tokens=-5" in capsys.readouterr().err
    # A model LangChain cannot place: one line (its own message lists every provider it knows).
    assert run("compact", ponyc, "--model", "nonsense", "--force", "-o", "/dev/null")[0] == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--model='nonsense'" in err
    assert "provider:model" in err


def test_console_entry_points_run():
    for cmd in ([sys.executable, "-m", "langchain_compaction", "--version"],):
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
        assert done.returncode == 0
        assert "langchain-compaction" in done.stdout


def test_inspect_agrees_with_compact_on_what_is_summarized(tmp_path):
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, messages_to_dict

    messages = [SystemMessage("a" * 4000), SystemMessage("b" * 4000)]
    for i in range(6):
        messages += [HumanMessage(f"q{i} " * 100), AIMessage(f"a{i} " * 100)]
    messages.append(HumanMessage("last"))
    path = tmp_path / "sys.json"
    path.write_text(json.dumps(messages_to_dict(messages)))
    _, text = run("inspect", str(path), "--keep-recent-tokens", "500", "--json")
    report = json.loads(text)
    _, out = run("compact", str(path), "--keep-recent-tokens", "500", "--json")
    result = json.loads(out)["result"]
    assert report["summarized"]["messages"] == result["messages_removed"]
    assert report["kept"]["messages"] == result["messages_kept"]
    # Everything within the keep budget: without a window, compact makes the manual cut, and inspect shows it.
    report = json.loads(run("inspect", str(path), "--json")[1])
    result = json.loads(run("compact", str(path), "--json")[1])["result"]
    assert result["forced"]
    assert report["summarized"]["messages"] == result["messages_removed"] > 0


def test_demo_replays_the_transcript_shipped_inside_the_package():
    from importlib import resources

    from langchain_compaction.demo import TRANSCRIPT, demo_session

    shipped = resources.files("langchain_compaction") / "data" / TRANSCRIPT
    assert shipped.is_file()
    assert (resources.files("langchain_compaction") / "data" / "LICENSE-openhands.txt").is_file()
    session = demo_session()
    assert len(session) == 101
    assert session[0].type == "system"


def test_demo_never_cuts_a_summary_line_mid_word():
    from langchain_compaction import CompactionOptions
    from langchain_compaction.demo import _replay, demo_session

    code, text = run("demo")
    assert code == 0
    printed = text.split("the summary message", 1)[1].splitlines()[1:]
    logical: list[str] = []
    for line in printed:
        if line.startswith("      ") and logical:  # a wrapped continuation
            logical[-1] += " " + line.strip()
        else:
            logical.append(line.strip())
    state = _replay(demo_session(), CompactionOptions(context_window=8_000), io.StringIO())
    summary = next(m for m in state if m.id and m.id.startswith("compaction-summary"))
    lines = [" ".join(line.split()) for line in str(summary.content).splitlines()]
    # Every printed line is a whole line of the summary, rejoined: nothing was cut.
    shown = [line for line in logical if not line.startswith("[... ")]
    assert shown == lines[: len(shown)]
    assert len(shown) == min(30, len(lines))


def test_compact_checks_the_output_path_before_any_work(tmp_path, capsys, ponyc):
    code, out = run("compact", ponyc, "-o", str(tmp_path / "no" / "such" / "dir" / "out.json"))
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "does not exist" in err
    assert "summarizing" not in err
    assert out == ""
    # A link to a folder that is not there, and a "folder" that is a file: said before any work too.
    (tmp_path / "link.json").symlink_to(tmp_path / "gone" / "out.json")
    (tmp_path / "notes.txt").write_text("x")
    for target, said in ((tmp_path / "link.json", "does not exist"), (tmp_path / "notes.txt" / "out.json", "a file")):
        code, out = run("compact", ponyc, "-o", str(target))
        err = capsys.readouterr().err.strip()
        assert code == 2
        assert said in err
        assert "summarizing" not in err


@pytest.mark.skipif(sys.platform == "win32", reason="file-size limits are POSIX")
def test_a_failed_write_leaves_the_input_it_would_replace_whole(tmp_path, ponyc):
    # ``-o`` naming the input compacts in place. A write that fails halfway (a
    # full disk; here a file-size limit of 4 KiB) must leave the file as it was.
    conversation = tmp_path / "conversation.json"
    conversation.write_bytes(Path(ponyc).read_bytes())
    before = conversation.read_bytes()
    assert len(before) > 4096
    limit = "import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
    limit += "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)); "
    limit += "from langchain_compaction.cli import main; sys.exit(main(sys.argv[1:]))"
    command = [sys.executable, "-c", limit, "compact", str(conversation), "-o", str(conversation), "--force"]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 2, done.stderr
    assert conversation.read_bytes() == before
    assert done.stderr.strip().splitlines()[-1].startswith("langchain-compaction: error: --output=")
    assert "Traceback" not in done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["conversation.json"]  # no temporary file left


def test_inspect_and_compact_agree_on_a_first_message_larger_than_the_window(tmp_path):
    from langchain_core.messages import AIMessage, HumanMessage, messages_to_dict

    messages = [HumanMessage("policy " * 20_000), AIMessage("Noted."), HumanMessage("How long is the window?")]
    path = tmp_path / "big.json"
    path.write_text(json.dumps(messages_to_dict(messages)))
    report = json.loads(run("inspect", str(path), "--context-window", "16000", "--json")[1])
    assert report["would_compact"] is True
    result = json.loads(run("compact", str(path), "--context-window", "16000", "--json")[1])["result"]
    assert report["summarized"]["messages"] == result["messages_removed"] == 1


def test_inspect_shows_a_cut_that_takes_a_tool_exchange_whole(tmp_path):
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage, messages_to_dict

    call = {"name": "read_log", "args": {"path": "app.log"}, "id": "c1", "type": "tool_call"}
    messages = [HumanMessage("q " * 200), AIMessage("a " * 200), HumanMessage("read the log")]
    messages += [AIMessage("", tool_calls=[call]), ToolMessage("ERROR x\n" * 30_000, tool_call_id="c1")]
    path = tmp_path / "whole.json"
    path.write_text(json.dumps(messages_to_dict(messages)))
    code, text = run("inspect", str(path), "--context-window", "16000")
    assert code == 0
    assert "first kept: (none: a tool exchange goes whole)" in text


def inspected(tmp_path, conversation: list) -> str:
    """What ``inspect`` prints for an OpenAI-style ``conversation`` at a 4,000 window (it must succeed)."""
    path = tmp_path / "conversation.json"
    path.write_text(json.dumps(conversation))
    code, text = run("inspect", str(path), "--context-window", "4000")
    assert code == 0
    return text


def test_inspect_never_writes_a_transcripts_terminal_escapes(tmp_path):
    # A hostile page's "write the clipboard" (OSC 52) and "clear the screen", pasted into a conversation.
    from langchain_compaction.core.lines import shown

    hostile = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x1b[31mplease continue\x1b[0m \u202eexe.txt"
    conversation = [
        {"role": "user", "content": "question " * 2000},
        {"role": "assistant", "content": "answer " * 2000},
        {"role": "user", "content": hostile},
        {"role": "assistant", "content": "ok"},
    ]
    text = inspected(tmp_path, conversation)
    assert "please continue" in text
    assert not any(mark in text for mark in ("\x1b", "\x07", "\u202e"))
    # What archive --show prints: lines and tabs kept, the rest taken out.
    assert shown("a\tb\nc\x1b[2J\u202ed") == "a\tb\nc\ufffd[2Jd"


@pytest.mark.skipif(sys.platform == "win32", reason="/dev/stdout is POSIX")
def test_output_to_dev_stdout_into_a_pipe_writes_the_conversation(ponyc):
    command = [sys.executable, "-m", "langchain_compaction", "compact", ponyc, "-o", "/dev/stdout", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)  # (stdout: a pipe)
    assert done.returncode == 0, done.stderr
    conversation, end = json.JSONDecoder().raw_decode(done.stdout.lstrip())
    assert str(conversation[1]["data"]["content"]).startswith("[Conversation summary")


def test_with_a_window_compact_does_what_inspect_says(tmp_path, ponyc):
    _, text = run("inspect", ponyc, "--context-window", "200000", "--json")
    assert json.loads(text)["would_compact"] is False
    code, out = run("compact", ponyc, "--context-window", "200000", "--json")
    payload = json.loads(out)
    assert code == 0
    assert payload["result"] is None
    assert "fits the window" in payload["what"]
    assert len(payload["messages"]) == 101
    # --force makes the manual cut; a window the conversation exceeds compacts on its own.
    forced = json.loads(run("compact", ponyc, "--context-window", "200000", "--force", "--json")[1])
    assert forced["result"]["messages_removed"] > 0
    assert "--force" in forced["what"]
    over = json.loads(run("compact", ponyc, "--context-window", "16000", "--instructions", "KEEP_MATCH_C", "--json")[1])
    assert over["result"] is not None
    assert "over the threshold" in over["what"]
    assert "KEEP_MATCH_C" in over["result"]["summary"]  # the instructions go with the window too


def test_inspect_fits_a_small_window_with_derived_budgets(ponyc):
    code, text = run("inspect", ponyc, "--context-window", "24000", "--json")
    assert code == 0
    report = json.loads(text)
    assert report["threshold"] == 21_000  # 24,000 less the derived reserve of 3,000
    # The derived keep (6,300) taken over what a compaction cannot remove (the system prompt): as compact plans.
    assert report["keep_budget"] < 6_300
    for window in ("8000", "16000"):
        inspected = json.loads(run("inspect", ponyc, "--context-window", window, "--json")[1])
        result = json.loads(run("compact", ponyc, "--context-window", window, "--json")[1])["result"]
        assert inspected["cut_index"] == result["cut_index"]
        assert inspected["summarized"]["messages"] == result["messages_removed"]


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["compact", "--help"])
    text = capsys.readouterr().out
    assert "(default: 0)" in text
    assert "16384" in text
    assert "20000" in text


def test_compact_says_that_nothing_was_done_once(tmp_path, ponyc):
    """A conversation that fits: one line says so (and how to compact anyway), nothing said twice."""
    code, out = run("compact", ponyc, "--context-window", "200000", "-o", str(tmp_path / "out.json"))
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "nothing done: the conversation fits the window (pass --force to compact anyway)"
    assert lines[1:] == ["wrote 101 messages to " + str(tmp_path / "out.json")]


def test_a_conversation_over_the_window_that_cannot_be_cut_is_not_said_to_fit(tmp_path, capsys):
    """One message far over the window: inspect and compact say nothing can be cut, not that it fits."""
    path = tmp_path / "one.json"
    path.write_text(json.dumps([{"role": "user", "content": "x " * 50_000}]))
    _, text = run("inspect", str(path), "--context-window", "3000")
    assert "would compact" in text
    assert "fits" not in text
    assert "message 0 (~25,004 tokens) is the newest, which is always kept, and nothing comes before it" in text
    assert text.rstrip().endswith("a larger --context-window is the fix")
    assert main(["compact", str(path), "--context-window", "3000", "-o", str(tmp_path / "out.json")]) == 0
    said = capsys.readouterr()
    assert "fits the window" not in said.out + said.err
    assert "over the threshold of 2,625" in said.out + said.err
    # A small one still fits.
    small = tmp_path / "small.json"
    small.write_text(json.dumps([{"role": "user", "content": "hello"}]))
    _, text = run("inspect", str(small), "--context-window", "3000")
    assert ": fits" in text
    assert "no cut: message 0 (~5 tokens) is the newest" in text
    assert "is the fix" not in text


def test_a_system_prompt_that_leaves_no_room_is_named_as_the_reason(tmp_path, capsys):
    """Over the threshold because of the fixed part: inspect and compact say so, not that nothing can be cut."""
    path = tmp_path / "prompt.json"
    messages = [{"role": "system", "content": "rule number one. " * 1200}]
    for i in range(10):
        messages += [{"role": "user", "content": f"q{i} " * 20}, {"role": "assistant", "content": f"a{i} " * 20}]
    path.write_text(json.dumps(messages))
    _, text = run("inspect", str(path), "--context-window", "5000")
    assert "but no automatic compaction: the system prompt and leading system messages take" in text
    # No compaction could make the request fit: compact refuses the window, before any work, and writes nothing.
    assert main(["compact", str(path), "--context-window", "5000", "-o", str(tmp_path / "out.json")]) == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1
    assert "the system prompt and leading system messages take" in said
    assert "a larger --context-window or a shorter system prompt is the fix" in said
    assert "nothing comes before" not in said
    assert not (tmp_path / "out.json").exists()


def _openai_chat(turns: int) -> list[dict[str, object]]:
    chat: list[dict[str, object]] = [{"role": "developer", "content": "Be terse."}]
    for i in range(turns):
        calls = [
            {"id": f"a{i}", "type": "function", "function": {"name": "f", "arguments": "{bad"}},
            {"id": f"b{i}", "type": "function", "function": {"name": "g", "arguments": "[1, 2]"}},
        ]
        chat += [
            {"role": "user", "name": "alice", "content": f"question {i} " * 60},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": f"a{i}", "content": f"result {i} " * 60},
            {"role": "tool", "tool_call_id": f"b{i}", "content": "2"},
            {"role": "assistant", "content": f"answer {i} " * 60},
        ]
    return chat


def test_compact_writes_the_messages_it_keeps_as_the_file_had_them(tmp_path):
    source, out_file = tmp_path / "chat.json", tmp_path / "out.json"
    for turns, window in ((2, "200000"), (40, "6000")):
        chat = _openai_chat(turns)
        source.write_text(json.dumps(chat))
        code, _ = run("compact", str(source), "--offline", "--context-window", window, "-o", str(out_file))
        assert code == 0
        written = json.loads(out_file.read_text())
        if turns == 2:  # nothing to compact: the file as it was
            assert written == chat
            continue
        # A developer prompt, a user's name and raw tool arguments are kept as
        # they were; the summary is the one new item.
        assert written[0] == chat[0]
        assert written[1]["role"] == "system"
        assert "[Conversation summary" in written[1]["content"]
        tail = written[2:]
        if tail[0]["role"] == "user" and "summary above" in str(tail[0]["content"]):
            tail = tail[1:]  # the user turn after the summary
        assert 0 < len(tail) < len(chat) - 1
        assert tail == chat[-len(tail) :]


def test_an_anthropic_file_without_tool_blocks_is_written_back_as_anthropic(tmp_path):
    picture = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    chat = []
    for i in range(40):
        chat += [
            {"role": "user", "content": [{"type": "text", "text": f"what is in picture {i}? " * 20}, picture]},
            {"role": "assistant", "content": [{"type": "text", "text": f"a cat, number {i} " * 30}]},
        ]
    source, out_file = tmp_path / "chat.json", tmp_path / "out.json"
    source.write_text(json.dumps(chat))
    code, _ = run("compact", str(source), "--offline", "--context-window", "30000", "-o", str(out_file))
    assert code == 0
    written = json.loads(out_file.read_text())
    assert "[Conversation summary" in written["system"][0]["text"]  # the summary goes to the top-level system
    blocks = [b["type"] for m in written["messages"] for b in m["content"] if isinstance(b, dict)]
    assert "image" in blocks
    assert "image_url" not in blocks
    assert written["messages"][-4:] == chat[-4:]


def test_a_lone_surrogate_escaped_in_the_file_is_written_back_escaped(tmp_path, capsys):
    source, out_file = tmp_path / "chat.json", tmp_path / "out.json"
    source.write_text(
        '[{"role":"user","content":"pasted bytes \\ud800 from a log"},{"role":"assistant","content":"ok"}]'
    )
    assert main(["compact", str(source), "-o", str(out_file)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert json.loads(out_file.read_text())[0]["content"] == "pasted bytes \ud800 from a log"
    assert main(["compact", str(source)]) == 0  # to standard output too


def test_a_console_that_cannot_write_every_character_gets_escapes_and_a_bad_demo_window_one_line(tmp_path):
    """cp1252 stdout (Windows): no UnicodeEncodeError from the summary's arrows; demo --context-window 0: exit 2."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONIOENCODING": "cp1252"}
    done = subprocess.run(
        [sys.executable, "-m", "langchain_compaction", "demo"], capture_output=True, env=env, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr.decode("cp1252", "replace")[-300:]
    zero = subprocess.run(
        [sys.executable, "-m", "langchain_compaction", "demo", "--context-window", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert zero.returncode == 2
    assert zero.stderr.count("\n") == 1
    assert "context_window=0" in zero.stderr


def test_compact_can_mask_secrets_in_what_the_summarizer_sees(tmp_path):
    """--redact-secrets passes redact_secrets: an API key in a compacted message is not copied into the summary."""
    key = "sk-ant-api03-abcdefghijklmnopqrstuvwxyz012345"
    path = tmp_path / "secret.json"
    messages = [{"role": "user", "content": f"deploy with key {key} now"}, {"role": "assistant", "content": "ok"}]
    path.write_text(json.dumps([*messages, {"role": "user", "content": "go"}]))
    plain = json.loads(run("compact", str(path), "--json")[1])
    masked = json.loads(run("compact", str(path), "--json", "--redact-secrets")[1])
    assert key in plain["result"]["summary"]
    assert key not in json.dumps(masked)


def test_inspect_says_would_compact_only_when_compact_would(tmp_path):
    """A system prompt over the threshold alone: over it, but held (no room), so compact refuses the window."""
    conversation = [{"role": "system", "content": "You are helpful. " * 700}]
    for i in range(30):
        conversation += [
            {"role": "user", "content": f"step {i} " * 10},
            {"role": "assistant", "content": f"ok {i} " * 10},
        ]
    path = tmp_path / "c.json"
    path.write_text(json.dumps(conversation))
    inspected = json.loads(run("inspect", str(path), "--context-window", "3000", "--json")[1])
    assert inspected["over_threshold"] is True
    assert inspected["held"]
    assert inspected["would_compact"] is False
    assert run("compact", str(path), "--context-window", "3000", "--json") == (2, "")


def test_compact_writes_to_standard_output_for_a_dash(tmp_path, ponyc, monkeypatch):
    """-o - is standard output, as - is standard input for the file (no file named "-")."""
    monkeypatch.chdir(tmp_path)
    code, text = run("compact", ponyc, "-o", "-", "--keep-recent-tokens", "4000")
    assert code == 0
    assert not (tmp_path / "-").exists()


def test_inspect_does_not_blame_a_long_system_prompt_on_the_newest_messages(tmp_path):
    # The system prompt (never summarized) was counted among "the newest messages that must stay
    # whole", and the fix named was a larger window.
    conversation = [
        {"role": "system", "content": "You are a careful agent. " + "Follow the house rules. " * 150},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    text = inspected(tmp_path, conversation)
    assert "fits" in text
    assert "must stay whole" not in text


def _no_cut(tmp_path: Path, conversation: list, *options: str) -> tuple[str, dict[str, Any]]:
    """``inspect``'s text and ``--json`` for ``conversation`` (OpenAI-style) at ``options``."""
    path = tmp_path / "conversation.json"
    path.write_text(json.dumps(conversation))
    code, text = run("inspect", str(path), *options)
    assert code == 0
    code, data = run("inspect", str(path), "--json", *options)
    assert code == 0
    return text, json.loads(data)


def _call(call_id: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": "{}"}}],
    }


WINDOW = ("--context-window", "16000")  # (keep budget 4,200; threshold 14,000)
CHAT = [{"role": "user", "content": "Build me a todo app please. " * 10}]
CHAT += [{"role": "assistant", "content": f"step {i}: " + "I did this and that. " * 152} for i in range(5)]
"""No tool calls: a short request and five long replies, ~4,200 tokens in all."""


def test_inspect_says_which_messages_the_keep_budget_holds_when_no_cut_falls(tmp_path):
    """No tool calls, and it fits: the keep budget holds all but the first message, one too few to summarize.

    It was told "nothing comes before the newest messages that must stay whole (the last message, a tool
    call with its results), and they take ~4,210 tokens ... a larger --context-window is the fix".
    """
    text, report = _no_cut(tmp_path, CHAT, *WINDOW)
    why = f"the keep budget of 4,200 tokens holds messages 1 to 5 (~{report['tokens'] - 75:,} tokens); "
    assert f"no cut: {why}only message 0 (~75 tokens) comes before them, too few to summarize\n" in text
    assert report["held"].startswith(why)
    assert f"no cut: {report['held']}\n" in text
    assert "tool" not in report["held"]
    assert "fix" not in report["held"]
    assert _no_cut(tmp_path, CHAT, "--context-window", "12000")[1]["cut_index"] == 3


def test_inspect_names_a_tool_exchange_only_when_it_is_what_must_stay_together(tmp_path):
    tools = [{"role": "user", "content": "read the log"}, _call("c1")]
    tools.append({"role": "tool", "tool_call_id": "c1", "content": "ERROR at x.py:10 " * 1_000})
    text, report = _no_cut(tmp_path, tools, *WINDOW)
    kept = report["tokens"] - report["tokens_by_role"]["user"]
    assert report["held"] == (
        f"messages 1 to 2 must stay together (a tool call is never separated from its results) and take "
        f"~{kept:,} tokens, over the keep budget of 4,200; only message 0 (~{report['tokens'] - kept:,} tokens) "
        "comes before them, too few to summarize"
    )
    assert f"no cut: {report['held']}\n" in text


def test_a_conversation_over_its_threshold_that_cannot_be_cut_is_told_the_fix_that_helps(tmp_path):
    """The keep budget holding everything calls for a smaller one; a tool exchange kept whole, for a larger window."""
    big = [{"role": "user", "content": "Here is the spec. " * 2_200}, *CHAT[1:]]
    text, report = _no_cut(tmp_path, big, *WINDOW)
    assert report["over_threshold"]
    assert not report["would_compact"]
    assert report["held"].startswith("the keep budget of 4,200 tokens holds messages 1 to 5")
    assert report["held"].endswith("; a smaller --keep-recent-tokens is the fix")
    assert f"but no automatic compaction: {report['held']}\n" in text
    assert _no_cut(tmp_path, big, *WINDOW, "--keep-recent-tokens", "3000")[1]["would_compact"]
    # (A larger window makes it fit, and holds all but the first message all the same.)
    assert _no_cut(tmp_path, big, "--context-window", "32000")[1]["held"].endswith("too few to summarize")

    over = [{"role": "user", "content": "Here is the spec. " * 700}, _call("c1")]
    over.append({"role": "tool", "tool_call_id": "c1", "content": "ERROR at x.py:10 " * 2_200})
    assert not _no_cut(tmp_path, over, "--context-window", "20000")[1]["over_threshold"]
    report = _no_cut(tmp_path, over, *WINDOW)[1]
    assert report["over_threshold"]
    assert report["cut_index"] == 0
    assert "messages 1 to 2 must stay together" in report["held"]
    assert report["held"].endswith("; a larger --context-window is the fix")
    said = run("compact", str(tmp_path / "conversation.json"), *WINDOW, "-o", str(tmp_path / "out.json"))
    assert said == (
        0,
        f"nothing done: the conversation (~{report['tokens']:,} tokens) is over the threshold of "
        f"14,000, but {report['held']}\nwrote 3 messages to {tmp_path / 'out.json'}\n",
    )


def test_ctrl_c_during_a_long_compaction_says_one_line_and_exits_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ponyc
) -> None:
    """An interrupted run ends as Unix tools end: one line on stderr, status 130, no traceback, nothing written.

    Ctrl-C comes while the first chunk is summarized (when its progress line is
    written), not at a set time: with the readings of an earlier test kept, the
    whole run can end before any timer fires.
    """
    import _thread

    class Terminal(io.StringIO):
        def write(self, text: str) -> int:
            if "summarizing chunk 1 " in text:
                _thread.interrupt_main()  # (raised in this thread at its next instruction: in the CLI's work)
            return super().write(text)

    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    messages = json.loads(Path(ponyc).read_text())
    big = tmp_path / "big.json"
    big.write_text(json.dumps(messages * 120))
    output = tmp_path / "out.json"
    code, _ = run("compact", str(big), "--context-window", "8000", "-o", str(output))
    assert code == 130
    assert err.getvalue().strip().splitlines()[-1] == "langchain-compaction: interrupted"
    assert "Traceback" not in err.getvalue()
    assert not output.exists()


# --- a saved request's tools: sent with every call, counted as the fixed part ----------------


def _tool(i: int) -> dict[str, Any]:
    """A tool's name, description and JSON-schema parameters (about 500 tokens)."""
    words = ("path", "file", "line", "value", "option", "mode", "flag", "count", "range", "encoding")
    properties = {
        f"arg_{j}": {
            "type": "string",
            "description": f"argument {j} of tool {i}: " + " ".join(words[(i * j + k) % 10] for k in range(25)),
        }
        for j in range(6)
    }
    description = f"Tool {i} does one thing and does it well. " * 12
    return {"name": f"tool_{i}", "description": description, "parameters": {"type": "object", "properties": properties}}


def _request(shape: str) -> dict[str, Any]:
    """A saved request whose 80 messages fit a 32,000 window alone (~24,000 tokens), and whose 20 tools do not."""
    words = ("alpha", "beta", "gamma", "delta", "fix", "the", "bug", "in", "module", "parser")
    chat = [
        {"role": role, "content": f"{role} {i}: " + " ".join(words[(i * 7 + k * 3) % 10] for k in range(230))}
        for i in range(40)
        for role in ("user", "assistant")
    ]
    schemas = [_tool(i) for i in range(20)]
    if shape == "openai":
        tools = [{"type": "function", "function": schema} for schema in schemas]
        system = [{"role": "system", "content": "You are a careful agent."}]
        return {"model": "gpt-4o", "tools": tools, "messages": [*system, *chat]}
    tools = [{"name": s["name"], "description": s["description"], "input_schema": s["parameters"]} for s in schemas]
    request = {"model": "claude-sonnet-4-5", "max_tokens": 1024, "tools": tools, "messages": chat}
    # (Without a "system", only the tools' input_schema says the request is Anthropic's: its messages are text.)
    return request if shape == "anthropic-no-system" else {**request, "system": "You are a careful agent."}


def _sent(request: dict[str, Any]) -> int:
    """The tokens a request sends with every call, counted afresh: its messages and its tools."""
    from langchain_compaction._lc.counting import counts_and_core
    from langchain_compaction._lc.schemas import ToolSchemas
    from langchain_compaction.core.options import CompactionOptions

    counts, _ = counts_and_core(parse_conversation(json.dumps(request)).messages, CompactionOptions())
    return sum(counts) + ToolSchemas().tokens(request.get("tools") or [])


SHAPES = ["openai", "anthropic", "anthropic-no-system"]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_request_files_tools_are_counted_so_the_compacted_request_fits_with_them(tmp_path, shape):
    """Window 32,000 (reserve 4,000): the messages fit alone; with the tools they go over, and come out under."""
    request = _request(shape)
    path, written = tmp_path / "request.json", tmp_path / "out.json"
    path.write_text(json.dumps(request))
    assert _sent({**request, "tools": []}) < 28_000 < 32_000 < _sent(request)
    inspected = json.loads(run("inspect", str(path), "--context-window", "32000", "--json")[1])
    assert inspected["overhead_tokens"] == _sent(request) - _sent({**request, "tools": []}) > 9_000
    assert inspected["would_compact"] is True
    code, text = run("compact", str(path), "--context-window", "32000", "-o", str(written))
    assert code == 0, text
    assert f"+ tool schemas, every request  {inspected['overhead_tokens']:>10,}" in text
    out = json.loads(written.read_text())
    assert out["tools"] == request["tools"]
    assert _sent(out) <= 28_000  # tools included, under the window less the reserve
    if shape != "openai":  # an Anthropic request: the summary in "system", no role the Messages API refuses
        assert parse_conversation(json.dumps(out)).format == "anthropic"
        assert {m["role"] for m in out["messages"]} == {"user", "assistant"}
        assert "summary" in json.dumps(out["system"])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("force", [False, True])
def test_tools_that_leave_the_window_no_room_are_one_line_with_the_figures_and_the_fix(tmp_path, capsys, shape, force):
    """Window 11,000 (reserve 1,375): the ~10,000 tokens of tools are over what a request may hold; nothing can fit."""
    from langchain_compaction._lc.schemas import ToolSchemas

    request = _request(shape)
    path, written = tmp_path / "request.json", tmp_path / "out.json"
    path.write_text(json.dumps(request))
    argv = ["compact", str(path), "--context-window", "11000", "-o", str(written), *(["--force"] * force)]
    assert main(argv) == 2
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err.count("\n") == 1
    assert "Traceback" not in said.err
    assert "the tool schemas sent with every request" in said.err
    assert f"~{ToolSchemas().tokens(request['tools']):,}" in said.err
    assert "of the 9,625 a request may hold (window 11,000 minus reserve 1,375)" in said.err
    assert said.err.endswith("a larger --context-window or fewer tools is the fix\n")
    assert not written.exists()
    inspected = json.loads(run("inspect", str(path), "--context-window", "11000", "--json")[1])
    assert inspected["held"]
    assert inspected["would_compact"] is False


def test_a_request_that_fits_with_little_room_left_goes_as_it_is(tmp_path, capsys):
    """Tools of ~6,800 tokens under a threshold of 7,000 and two short messages: it fits, so nothing is refused.

    The no-room refusal is for a request that must be compacted; it was made
    before anything asked whether one must, and refused this one with exit 2.
    """
    from langchain_compaction._lc.schemas import ToolSchemas

    tools: list[dict[str, object]] = []
    while ToolSchemas().tokens([*tools, tools[0] if tools else {}]) < 6_900:
        tools.append({"name": f"t{len(tools)}", "description": "word " * 40, "input_schema": {"type": "object"}})
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    path, written = tmp_path / "request.json", tmp_path / "out.json"
    path.write_text(json.dumps({"model": "m", "max_tokens": 100, "tools": tools, "messages": messages}))
    window = ["--context-window", "8000", "--reserve-tokens", "1000"]
    assert main(["compact", str(path), *window, "-o", str(written)]) == 0
    assert "nothing done: the conversation fits the window" in capsys.readouterr().out
    assert json.loads(written.read_text())["messages"] == messages


def test_a_request_files_tools_are_counted_without_the_agents_extra(tmp_path):
    """The tool estimate needs langchain-core alone: the CLI counts tools where ``langchain`` is not installed."""
    path = tmp_path / "request.json"
    path.write_text(json.dumps(_request("openai")))
    code = (
        "import sys\n"
        "sys.modules['langchain'] = None\n"  # (every ``import langchain...`` fails, as without the extra)
        "from langchain_compaction.cli import main\n"
        f"raise SystemExit(main(['inspect', {str(path)!r}, '--context-window', '32000', '--json']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-500:]
    assert json.loads(done.stdout)["overhead_tokens"] > 9_000


def test_a_structured_outputs_schema_and_instructions_are_sent_every_time_too(tmp_path):
    """Besides its tools, a request sends an output schema (not a bare JSON switch) and instructions given apart."""
    from langchain_compaction.tokens import estimate_tool_tokens

    path = tmp_path / "request.json"

    def overhead(**fields: object) -> int:
        path.write_text(json.dumps({"model": "m", **fields, "messages": [{"role": "user", "content": "hi"}]}))
        return json.loads(run("inspect", str(path), "--json")[1])["overhead_tokens"]

    schema = {"type": "object", "properties": {"answer": {"type": "string", "description": "the answer " * 50}}}
    openai_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    anthropic_format = {"type": "json_schema", "schema": schema}
    assert overhead() == 0
    assert overhead(response_format={"type": "json_object"}) == 0
    assert overhead(response_format=openai_format) == estimate_tool_tokens([openai_format]) > 100
    assert overhead(output_config={"format": anthropic_format}) == estimate_tool_tokens([anthropic_format])
    assert overhead(text={"format": anthropic_format}) == estimate_tool_tokens([anthropic_format])
    assert overhead(instructions="Answer in one line. " * 50) > 200


def test_no_cut_after_two_earlier_summaries_is_not_said_to_fit_everything() -> None:
    # A cut that falls where the region starts (after the earlier summaries) leaves nothing new to summarize:
    # the reason names what the keep budget holds, not "everything fits".
    from langchain_compaction._lc.no_cut import why_no_cut
    from langchain_compaction.core.options import CompactionOptions as Options
    from langchain_compaction.core.types import Message, Part

    summaries = [Message("user", (Part("text", "summary"),), is_summary=True) for _ in range(2)]
    messages, counts = [*summaries, Message("assistant", (Part("text", "done"),))], [800, 50, 3_000]
    budget = Options(context_window=4_000, keep_recent_tokens=1_000).budget
    said = why_no_cut(messages, counts, budget, over=True)
    assert "everything fits" not in said
    assert said.startswith("the last message (~3,000 tokens) is over the keep budget of 1,000")


def _anthropic_turns(count: int) -> list[dict[str, Any]]:
    """An Anthropic conversation whose user turns each hold a tool result and a text block (two LangChain messages)."""
    turns: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "question " * 30}]}]
    for i in range(count):
        call = {"type": "tool_use", "id": f"tu{i}", "name": "get", "input": {"q": i}}
        turns.append({"role": "assistant", "content": [{"type": "text", "text": f"ans {i}"}, call]})
        result = {"type": "tool_result", "tool_use_id": f"tu{i}", "content": f"out {i} " * 30}
        turns.append({"role": "user", "content": [result, {"type": "text", "text": f"q {i} " * 10}]})
    return turns


@pytest.mark.parametrize("jsonl", [False, True])
def test_cli_counts_and_numbers_messages_as_the_file_holds_them(tmp_path, jsonl):
    """An Anthropic file's figures are its own messages, not LangChain's (a tool result and text in a turn are two)."""
    turns = _anthropic_turns(30)
    body = {"model": "claude-x", "system": "sys", "max_tokens": 100, "messages": turns}
    path, out = tmp_path / "conv.json", tmp_path / "out.json"
    path.write_text("".join(json.dumps(t) + "\n" for t in turns) if jsonl else json.dumps(body))
    report = json.loads(run("inspect", str(path), "--context-window", "3000", "--json")[1])
    assert report["messages"] == len(turns) == 61 < report["langchain_messages"]
    assert 0 < report["cut_index"] < len(turns) < report["langchain_cut_index"]
    assert report["summarized"]["messages"] + report["kept"]["messages"] == len(turns) + report["cut_inside_message"]
    text = run("inspect", str(path), "--context-window", "3000")[1]
    assert f"{len(turns)} messages, ~" in text
    assert f"message {report['cut_index']}: summarize {report['summarized']['messages']} " in text
    assert run("compact", str(path), "-o", str(out), "--context-window", "3000")[0] == 0
    written = out.read_text()
    held = len(written.splitlines()) if jsonl else len(json.loads(written)["messages"])
    said = run("compact", str(path), "-o", str(out), "--context-window", "3000", "--json")[1]
    figures = json.loads(said)["file_messages"]
    assert figures["read"] == len(turns)
    assert figures["written"] == held > figures["kept"] > 0  # (the summary besides)
    assert run("compact", str(path), "-o", str(out), "--context-window", "3000")[1].endswith(
        f"wrote {held} messages to {out}\n"
    )
