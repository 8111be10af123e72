"""Redaction of command-line credentials and bearer tokens, and of what only looks like them.

Each shape below was let through (or masked only in part) before: a Java keystore's
``-storepass``, openssl's ``-k``, a token in quotes after ``Bearer``, a quoted
``mysql -p'...'``, ``htpasswd -b`` ... And ``pw:`` masked a GPU's power figure.
The secrets are fakes built by concatenation, so that no secret scanner mistakes
this file for a leak.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import compaction_graph
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.store.memory import InMemoryStore

from langchain_compaction import CompactionNode, CompactionOptions, ExtractiveSummarizer, redact_secrets
from langchain_compaction._lc.convert import is_summary_message
from langchain_compaction.features import Archive, default_features
from langchain_compaction.graph import CompactionState

STORE_PASS = "S3cret" + "StorePass"
KEY_PASS = "S3cret" + "KeyPass2"
ENC_KEY = "MySecret" + "Key123"
HEX_KEY = "0011223344556677" + "8899aabbccddeeff"
BEARER = "eyAbc123" + ".def456"
BEARER_DICT = "abc123def456" + "ghi789"
SANCTUM = "5|Xk9QmLp2" + "Rt7vWz8"
PASSWORD = "Sup3r" + "S3cret9"
SPACED = "Sup3r " + "S3cret9"

# (name, text, the secret, what must stand in its place)
SHAPES = [
    (
        "keytool -storepass",
        f"keytool -genkey -alias app -keystore ks.jks -storepass {STORE_PASS} -keypass {KEY_PASS}",
        STORE_PASS,
        "-storepass [REDACTED] -keypass [REDACTED]",
    ),
    (
        "keytool -srcstorepass",
        f"keytool -importkeystore -srckeystore a.p12 -srcstorepass {STORE_PASS} -deststorepass x{STORE_PASS}",
        STORE_PASS,
        "-srcstorepass [REDACTED] -deststorepass [REDACTED]",
    ),
    ("keytool -new", f"keytool -storepasswd -new {PASSWORD} -keystore ks.jks", PASSWORD, "-new [REDACTED] -keystore"),
    ("jarsigner", f"jarsigner -keystore ks.jks -storepass {STORE_PASS} app.jar release", STORE_PASS, "[REDACTED] app"),
    ("openssl enc -k", f"openssl enc -aes-256-cbc -k {ENC_KEY} -in a.txt -out a.enc", ENC_KEY, "-k [REDACTED] -in"),
    ("openssl enc -K", f"openssl enc -d -aes-256-cbc -K {HEX_KEY} -iv 00ff -in a.enc", HEX_KEY, "-K [REDACTED] -iv"),
    ("openssl -passin", f"openssl rsa -in k.pem -passin pass:{PASSWORD} -out o.pem", PASSWORD, "pass:[REDACTED] -out"),
    (
        "bearer in a double-quoted header",
        f'curl -H "Authorization: Bearer {BEARER}" https://api.example.com',
        BEARER,
        '"Authorization: Bearer [REDACTED TOKEN]" https',
    ),
    (
        "bearer in a python dict",
        f"headers = {{'Authorization': 'Bearer {BEARER_DICT}'}}",
        BEARER_DICT,
        "{'Authorization': 'Bearer [REDACTED TOKEN]'}",
    ),
    ("bearer token quoted", f'Authorization: Bearer "{BEARER_DICT}"', BEARER_DICT, 'Bearer "[REDACTED TOKEN]"'),
    ("bearer token with a |", f"-H 'Authorization: Bearer {SANCTUM}'", SANCTUM, "Bearer [REDACTED TOKEN]'"),
    (
        "bearer in JSON text",
        json.dumps({"headers": f'-H "Authorization: Bearer {BEARER}"'}),
        BEARER,
        'Bearer [REDACTED TOKEN]\\""',
    ),
    ("mysql -p'quoted'", f"mysql -u root -p'{SPACED}' app", SPACED, "-p'[REDACTED]' app"),
    ("docker login -p 'quoted'", f"docker login -u bob -p '{PASSWORD}' reg.io", PASSWORD, "-p '[REDACTED]' reg"),
    ("curl -u 'user:a b'", f"curl -u 'bob:{SPACED}' https://x", SPACED, "-u 'bob:[REDACTED]' https"),
    ("htpasswd -b", f"htpasswd -b /etc/nginx/.htpasswd bob {PASSWORD}", PASSWORD, ".htpasswd bob [REDACTED]"),
    ("htpasswd -nb", f"htpasswd -nbB bob '{SPACED}' > .htpasswd", SPACED, "bob '[REDACTED]' >"),
    (
        "echo | --password-stdin",
        f"echo {PASSWORD} | docker login -u bob --password-stdin ghcr.io",
        PASSWORD,
        "echo [REDACTED] |",
    ),
    ("smbclient -U user%pass", f"smbclient //srv/share -U bob%{PASSWORD} -c ls", PASSWORD, "-U bob%[REDACTED] -c"),
    ("httpie -a", f"http -a bob:{PASSWORD} GET https://api.local", PASSWORD, "-a bob:[REDACTED] GET"),
    ("mongosh -p", f"mongosh -u admin -p {PASSWORD} --authenticationDatabase admin", PASSWORD, "-p [REDACTED] --"),
    ("cqlsh -p", f"cqlsh -u cassandra -p {PASSWORD} db1", PASSWORD, "-p [REDACTED] db1"),
    ("az login -p", f"az login --service-principal -u app -p {PASSWORD} --tenant t", PASSWORD, "-p [REDACTED] --"),
    ("oc login -p", f"oc login -u dev -p {PASSWORD} https://api.ocp:6443", PASSWORD, "-p [REDACTED] https"),
    ("ldapsearch -w", f"ldapsearch -x -D cn=admin -w {PASSWORD} -b dc=x", PASSWORD, "-w [REDACTED] -b"),
    ("sqlcmd -P", f"sqlcmd -S localhost -U SA -P '{PASSWORD}' -Q 'select 1'", PASSWORD, "-P '[REDACTED]' -Q"),
    ("zip -P", f"zip -P {PASSWORD} out.zip report.pdf", PASSWORD, "-P [REDACTED] out"),
    ("7z -p", f"7z a -p{PASSWORD} out.7z report.pdf", PASSWORD, "-p[REDACTED] out"),
    ("gpg --passphrase X", f"gpg --batch --passphrase {PASSWORD} -c notes.txt", PASSWORD, "--passphrase [REDACTED] -c"),
    ("influx -password", f"influx -username bob -password {PASSWORD} -database db", PASSWORD, "-password [REDACTED]"),
    (
        "ConvertTo-SecureString",
        f"$p = ConvertTo-SecureString '{PASSWORD}' -AsPlainText -Force",
        PASSWORD,
        "ConvertTo-SecureString '[REDACTED]' -AsPlainText",
    ),
    ("in Markdown", f"run `sqlcmd -S db -U sa -P {PASSWORD}` first", PASSWORD, "-P [REDACTED]` first"),
    # Shapes of the same family that were masked already: they stay so.
    ("mysql --password=", f"mysql --password={PASSWORD} -u root app", PASSWORD, "--password=[REDACTED] -u"),
    ("psql url", f"psql 'postgresql://bob:{PASSWORD}@db.local:5432/app'", PASSWORD, "bob:[REDACTED]@db"),
    ("docker login -p", f"docker login -u bob -p {PASSWORD} reg.io", PASSWORD, "-p [REDACTED] reg"),
    ("curl -u", f"curl -u bob:{PASSWORD} https://x", PASSWORD, "-u bob:[REDACTED] https"),
    ("git clone user:token", f"git clone https://bob:{PASSWORD}@github.com/o/r", PASSWORD, "bob:[REDACTED]@github"),
    ("pw:", f"the staging pw: {PASSWORD}", PASSWORD, "pw: [REDACTED]"),
    ("pw: hunter2", "pw: hunter2", "hunter2", "pw: [REDACTED]"),
    ("password: hunter2", "password: hunter2", "hunter2", "password: [REDACTED]"),
    # (A password that only ends like a unit is no measurement; after "password" nothing is.)
    ("pw: 123456a", "pw: 123456a", "123456a", "pw: [REDACTED]"),
    ("pw: 250Wx9", "pw: 250Wx9", "250Wx9", "pw: [REDACTED]"),
    ("password: 250W", "password: 250W", "250W", "password: [REDACTED]"),
]


@pytest.mark.parametrize(("name", "text", "secret", "marker"), SHAPES, ids=[s[0] for s in SHAPES])
def test_each_command_line_shape_is_masked(name: str, text: str, secret: str, marker: str) -> None:
    masked = redact_secrets(text)
    assert secret not in masked
    assert marker in masked
    # What leads to the secret stays as it was; the redaction is stable.
    assert masked.startswith(text.split(secret, maxsplit=1)[0])
    assert redact_secrets(masked) == masked


@pytest.mark.parametrize(
    "text",
    [
        # A measurement after "pw" (power, pulse width) is that, whole and as units are written.
        "gpu pw: 250W",
        "gpu_pw: 250 W, fan: 40%",
        "PW=12.5 kW.",
        '{"name": "laser", "pw": "300ms"}',
        "pulse pw: 1.5 µs",
        # Prose about authentication schemes, a challenge's realm, where a token comes from.
        "The API uses basic authentication; Bearer authentication is described in RFC 6750.",
        # The cmdlet named in prose; an option that ends its line (the password is asked for at the prompt).
        "Use ConvertTo-SecureString to turn text into a SecureString; the ConvertTo-SecureString cmdlet converts it.",
        "sqlcmd -S srv -U sa -P\nThen type the password at the prompt.",
        "ldapsearch -x -D cn=admin -w\nEnter LDAP Password:",
        # (Punctuation after the word is no sign of a token: the look is read within the token.)
        "Does the API use basic authentication? It supports **Basic authentication** and *bearer authentication*!",
        "Switch from basic authentication-based login; the server accepts Bearer authentication=required.",
        'WWW-Authenticate: Basic realm="Restricted", Basic realm=Restricted',
        'return f"Basic realm={realm}, charset={charset}"',
        "curl -H 'Authorization: Bearer ${GITHUB_TOKEN}' -H \"Authorization: Bearer <your-access-token>\"",
        "Authorization: Bearer {{ secrets.API_TOKEN }} and f'Bearer {self.access_token}'",
        # Other commands' options of the same letters, and options that name where a password is.
        "ssh -p 2222 deploy@web1 && psql -p 5432 -U bob && redis-cli -p 6380 ping",
        "openssl req -new -key k.pem -out r.csr && openssl s_client -connect x:443 -key k.pem",
        "keytool -list -keystore ks.jks -storepass:env STORE_PASS",
        "gpg --batch --passphrase-fd 0 -c f && unzip -p archive.zip f.txt && zip -r out.zip dir",
        'echo "$CR_PAT" | docker login ghcr.io -u bob --password-stdin',
        "echo done || docker login --password-stdin",
        "htpasswd -c .htpasswd bob && htpasswd -D .htpasswd bob",
        "ldapsearch -x -W -D cn=admin -b dc=x",
        "mongod --port 27017 && az login --use-device-code",
        # Documentation naming the options, a placeholder for the value.
        "the LDAP tools' `-w`, `sqlcmd -P`, `zip -P`, `7z -p`, `openssl -k`/`pass:` and `keytool -storepass`",
        "`echo ... | docker login --password-stdin`, or `htpasswd -b`",
    ],
)
def test_what_only_looks_like_a_credential_is_left_alone(text: str) -> None:
    assert redact_secrets(text) == text


def test_the_new_rules_are_linear_on_long_lines_of_look_alikes() -> None:
    """A hang detector, as in test_redact.py: a process of its own, a deadline far above what it takes."""
    import subprocess
    import sys

    code = (
        "from langchain_compaction.core.redact import redact_secrets\n"
        "for text in ('htpasswd -b ' * 40_000, 'htpasswd ' + '-b ' * 40_000, 'keytool -new ' * 40_000,\n"
        "             'echo x ' * 40_000, 'echo ' + 'x' * 100_000 + ' ' + '| a ' * 30_000,\n"
        "             'Bearer 1' + ':' * 200_000, 'Bearer ' * 50_000, 'smbclient -U ' * 40_000,\n"
        "             'pw: 1' * 50_000, 'pw: ' + '1' * 100_000, ' -storepass' * 50_000):\n"
        "    redact_secrets(text)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- end to end: a graph node, its summarizer, its summary's checked facts, the archive's recall --


def _session() -> list[BaseMessage]:
    """Each shape as the user says it, as a bash call's command, and echoed in the call's output."""
    messages: list[BaseMessage] = []
    for n, (_, text, _, _) in enumerate(SHAPES):
        call = {"name": "bash", "args": {"command": text}, "id": f"c{n}"}
        messages += [
            HumanMessage(f"Run this on the build box: {text}", id=f"h{n}"),
            AIMessage("", tool_calls=[call], id=f"a{n}"),
            ToolMessage(f"$ {text}\nexit 0", tool_call_id=f"c{n}", id=f"t{n}"),
        ]
    messages.append(HumanMessage("On the build box the gpu pw: 250W is the cap for the benchmark.", id="gpu"))
    return messages


def _run(summarizer: Any, redact: Any) -> tuple[str, str, str]:
    """The session through a CompactionNode with the archive: the summary, its mark, and what recall returns."""
    store = InMemoryStore()
    node = CompactionNode(
        summarizer, CompactionOptions(context_window=3_000, redact=redact), features=[*default_features(), Archive()]
    )
    graph = compaction_graph(node, checkpointer=InMemorySaver(), store=store)
    config = {"configurable": {"thread_id": "build"}}
    graph.invoke({"messages": _session()}, config)
    for n in range(12):
        turn = [HumanMessage(f"next step {n} " * 40, id=f"x{n}"), AIMessage("done " * 40, id=f"y{n}")]
        state = graph.invoke({"messages": turn}, config)
    summary = next(m for m in state["messages"] if is_summary_message(m))
    tool = node.recall_tool(max_chars=500_000)
    tools = StateGraph(CompactionState)
    tools.add_node("tools", ToolNode([tool]))
    tools.add_edge(START, "tools")
    tools.add_edge("tools", END)
    call = {"name": tool.name, "args": {"query": "build box", "limit": 200}, "id": "r1", "type": "tool_call"}
    out = tools.compile(store=store).invoke(
        {"messages": [*state["messages"], AIMessage("", tool_calls=[call])]}, config
    )
    return str(summary.content), json.dumps(summary.additional_kwargs), str(out["messages"][-1].content)


# (The keytool line's -keypass too; "password: 250W" is masked, "gpu pw: 250W" is not.)
SECRETS = sorted({secret for _, _, secret, _ in SHAPES} - {"250W"} | {KEY_PASS})


def test_the_shapes_really_reach_every_path_without_redaction() -> None:
    # Guard for the test below: unredacted, the summarizer, the checked facts and recall hold them.
    prompts: list[str] = []
    summary, mark, recalled = _run(lambda prompt: prompts.append(prompt) or "## Goal\n- build", None)
    assert all(secret in "\n".join(prompts) for secret in SECRETS)
    assert any(secret in mark for secret in SECRETS)
    assert all(secret in recalled for secret in SECRETS)


@pytest.mark.parametrize("kind", ["recording", "extractive"])
def test_no_new_shape_reaches_the_summarizer_the_summary_its_facts_or_recall(kind: str) -> None:
    prompts: list[str] = []
    summarizer = ExtractiveSummarizer() if kind == "extractive" else (lambda p: prompts.append(p) or "## Goal\n- build")
    summary, mark, recalled = _run(summarizer, redact_secrets)
    seen = {"summarizer input": "\n".join(prompts), "summary": summary, "checked facts": mark, "recall": recalled}
    for where, text in seen.items():
        leaked = [secret for secret in SECRETS if secret in text]
        assert not leaked, f"{where} holds {leaked}"
    # What was masked is still there to read around the marker, and the power figure is not masked.
    assert "-storepass [REDACTED]" in recalled
    assert "Bearer [REDACTED TOKEN]" in recalled
    assert "the gpu pw: 250W is the cap" in recalled
    if kind == "recording":
        assert "keytool -genkey -alias app -keystore ks.jks -storepass [REDACTED]" in prompts[0]
        assert "the gpu pw: 250W is the cap" in "\n".join(prompts)
    else:
        assert "[REDACTED" in summary


def test_an_authorization_header_s_value_is_masked_however_it_looks() -> None:
    # A header's value is a credential: masked though it has no digit or capital
    # (in prose, "bearer" is followed by a token only when the token looks made up).
    for token in ("abcdefghijklmnopqrstuvwx", "abcdefghijklmnop-qrstuvwx_yz"):
        for text in (f"Authorization: Bearer {token}", f'curl -H "authorization: basic {token}" https://x'):
            masked = redact_secrets(text)
            assert token not in masked
            assert "[REDACTED TOKEN]" in masked
    assert (
        redact_secrets("Authorization: Basic realm=CompanyIntranetRealm")
        == "Authorization: Basic realm=CompanyIntranetRealm"
    )


def test_a_secure_string_s_value_is_masked_after_its_switches_in_any_case() -> None:
    for text in (
        "$p = ConvertTo-SecureString -AsPlainText -Force -String 'P@ssw0rd1'",
        "$p = convertto-securestring -string 'P@ssw0rd1' -AsPlainText -Force",
    ):
        masked = redact_secrets(text)
        assert "P@ssw0rd1" not in masked
        assert "'[REDACTED]'" in masked
