"""Redaction: ``redact_secrets`` on each secret shape, and ``CompactionOptions(redact=...)`` end to end.

The secrets below are fakes built by concatenation, so that no secret scanner
mistakes this file for a leak; each has the exact shape of the real thing.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatResult
from pydantic import Field

from langchain_compaction import CompactionError, CompactionOptions, ExtractiveSummarizer, acompact, compact
from langchain_compaction._lc.convert import is_summary_message, summary_message
from langchain_compaction.core.redact import redact_secrets
from langchain_compaction.errors import SummarizationError

# -- the secret shapes -------------------------------------------------------------

PEM_BODY = "MIIEowIBAAKCAQEA" + "q7Xv3pLk9sT2" * 6
PEM = (
    "-----BEGIN RSA " + "PRIVATE KEY-----\n" + PEM_BODY + "\n" + PEM_BODY[::-1] + "\n-----END RSA " + "PRIVATE KEY-----"
)
SK_ANT = "sk-" + "ant-api03-" + "Zx81_QwErTy-uIoP12345678abcd"
SK = "sk-" + "proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3"
AWS = "AKIA" + "Q3EXAMPLEKEY7ZZZ"
GITHUB = "ghp_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3fG5"
GITHUB_PAT = "github_pat_" + "11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz"
SLACK = "xoxb-" + "123456789012-abcdefGHIJKL"
GOOGLE = "AIza" + "SyD3-example_Key0123456789abcdefghi"
JWT = "eyJ" + "hbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
BEARER_VALUE = "tok_" + "9f8e7d6c5b4a3210ZYXW"
BASIC_VALUE = "dXNlcjpw" + "YXNzd29yZDEyMw=="
URL_PASSWORD = "s3cr3t" + "Pa55word"
ASSIGNED_PASSWORD = "hunter" + "2hunter2"
ASSIGNED_KEY = "k3y_" + "0123456789abcdef"

# (name, text containing the secret, the secret itself, what must replace it)
SENDGRID = "SG." + "ngeVfQFYQlKU0ufo8x5d1A" + "." + "TwL2iGABf9DHoTf-09kqeF8tAmbihYzrnopKc-1s5cr"
TWILIO = "SK" + "0123456789abcdef0123456789abcdef"
PYPI = "pypi-" + "AgEIcHlwaS5vcmcCJDAwMDAwMDAwLTAwMDAtMDAwMC0wMDAwLTAwMDAwMDAwMDAwMAACJXsi"
GOOGLE_DASH = "AIza" + "SyD3-example_Key0123456789abcdefgh-"  # (39 characters, the last a "-")
HEX20 = "4f8a9b2c" + "1d3e4f5a6b7c"
HEX40 = "9944b09199c62bcf" + "9418ad846dd0e4bbdfc6ee4b"
CASES = [
    ("pem", f"here is the key:\n{PEM}\nkeep it safe", PEM_BODY, "[REDACTED PRIVATE KEY]"),
    ("sk-ant", f"export ANTHROPIC_KEY={SK_ANT}", SK_ANT, "[REDACTED API KEY]"),
    ("sk", f"the OpenAI key {SK} works", SK, "[REDACTED API KEY]"),
    ("aws", f"aws_access_key_id = {AWS}", AWS, "[REDACTED AWS KEY]"),
    ("github", f"git clone https://x:{GITHUB}@github.com/o/r", GITHUB, "[REDACTED"),
    ("github-pat", f"token {GITHUB_PAT}", GITHUB_PAT, "[REDACTED GITHUB TOKEN]"),
    ("slack", f"SLACK_BOT={SLACK}", SLACK, "[REDACTED SLACK TOKEN]"),
    ("google", f"maps key {GOOGLE} in config", GOOGLE, "[REDACTED GOOGLE KEY]"),
    ("jwt", f"cookie session={JWT}; path=/", JWT, "[REDACTED"),
    ("bearer", f"curl -H 'Authorization: Bearer {BEARER_VALUE}' https://api.local", BEARER_VALUE, "Bearer [REDACTED"),
    ("basic", f"Authorization: Basic {BASIC_VALUE}", BASIC_VALUE, "Basic [REDACTED TOKEN]"),
    ("url", f"DATABASE_URL=postgres://admin:{URL_PASSWORD}@db.internal:5432/app", URL_PASSWORD, "admin:[REDACTED]@"),
    ("password=", f"login with password={ASSIGNED_PASSWORD} today", ASSIGNED_PASSWORD, "password=[REDACTED]"),
    ("api_key:", f'{{"api_key": "{ASSIGNED_KEY}", "region": "eu"}}', ASSIGNED_KEY, '"api_key": "[REDACTED]"'),
]
# The shapes 0.2 missed (each leaked into a summary then).
DB_PASSWORD = "Qz8" + "vLm2pRt7"
AWS_SECRET = "wJalrXUtnFEMI" + "/K7MDENG/bPxRfiCYEXAMPLEKEY"
STRIPE = "sk_" + "live_" + "51HxYzAbCdEfGhIjKlMnOpQr"
WEBHOOK = "whsec_" + "AbCdEfGhIjKlMnOpQrStUv12"
HUGGING_FACE = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz012345"
NPM_AUTH = "npm_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
AZURE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6" + "IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
QUERY_TOKEN = "ya29" + "a0AfH6SMBx7Qz"
CASES += [
    ("DB_PASSWORD=", f"export DB_PASSWORD={DB_PASSWORD}", DB_PASSWORD, "DB_PASSWORD=[REDACTED]"),
    ("aws secret", f"aws_secret_access_key = {AWS_SECRET}", AWS_SECRET, "aws_secret_access_key = [REDACTED]"),
    ("stripe", f"STRIPE={STRIPE} for checkout", STRIPE, "[REDACTED API KEY]"),
    ("stripe webhook", f"signing secret {WEBHOOK}", WEBHOOK, "[REDACTED API KEY]"),
    ("hugging face", f"huggingface-cli login --token {HUGGING_FACE}", HUGGING_FACE, "[REDACTED"),
    ("npm", f"//registry.npmjs.org/:_authToken={NPM_AUTH}", NPM_AUTH, "_authToken=[REDACTED]"),
    (
        "azure",
        f"DefaultEndpointsProtocol=https;AccountName=acme;AccountKey={AZURE_KEY};EndpointSuffix=core.windows.net",
        AZURE_KEY,
        "AccountKey=[REDACTED]",
    ),
    ("url query", f"GET https://img.example/cat.png?size=2&token={QUERY_TOKEN}", QUERY_TOKEN, "token=[REDACTED]"),
]
# Shapes a second review found getting through (each reached a summary).
SLASHED = "Xy7/" + "kP9+qZ"
REDIS = "S3cr3t" + "RedisPass"
PG = "hunter" + "2pgpass"
DJANGO = "django-insecure-" + "q8#v2k9zt4lmx7"
SPACED = "correct horse " + "battery staple"
PGP_BODY = "lQOYBF0mZ5ABCACx" + "SECRETKEYMATERIALxQ"
GH_TOKEN = "9944b09199c62bcf" + "9418ad846dd0e4bbdfc6ee4b"
XAPP = "xapp-1-A0123456789-" + "1234567890123-abcdef0123456789abcdef"
HOOK = "T0AB12CD3/B0EF45GH6/" + "zX9yW8vU7tS6rQ5pO4nM3lK2"
GLPAT = "glpat-" + "xR3kT9vLm2QpZ8wYhN4c"
CLI_PASSWORD = "hunter" + "2cli"
CASES += [
    ("url password with /", f"postgresql://admin:{SLASHED}@db.example.com:5432/app", SLASHED, "admin:[REDACTED]@"),
    ("url password only", f"REDIS_URL=redis://:{REDIS}@cache.local:6379/0", REDIS, "redis://:[REDACTED]@"),
    ("PGPASSWORD=", f"PGPASSWORD={PG} psql -h db -U admin", PG, "PGPASSWORD=[REDACTED]"),
    ("SECRET_KEY =", f"SECRET_KEY = '{DJANGO}'", DJANGO, "SECRET_KEY = '[REDACTED]'"),
    ("json password with spaces", f'{{"password": "{SPACED}"}}', SPACED, '"password": "[REDACTED]"'),
    ("yaml password with spaces", f"db:\n  password: '{SPACED}'", SPACED, "password: '[REDACTED]'"),
    (
        "pgp",
        f"-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n{PGP_BODY}\n-----END PGP PRIVATE KEY BLOCK-----",
        PGP_BODY,
        "[REDACTED PRIVATE KEY]",
    ),
    ("authorization token", f"curl -H 'Authorization: token {GH_TOKEN}' https://api", GH_TOKEN, "token [REDACTED"),
    ("slack app token", f"SLACK_APP={XAPP}", XAPP, "[REDACTED SLACK TOKEN]"),
    ("slack webhook", f"post to https://hooks.slack.com/services/{HOOK}", HOOK, "services/[REDACTED]"),
    ("gitlab", f"echo {GLPAT} > ~/.token", GLPAT, "[REDACTED GITLAB TOKEN]"),
    ("mysql -p", f"mysql -u root -p{CLI_PASSWORD} app < dump.sql", CLI_PASSWORD, "-p[REDACTED]"),
    ("curl -u", f"curl -u admin:{CLI_PASSWORD} https://api.example.com", CLI_PASSWORD, "admin:[REDACTED]"),
    ("mysql -p in a tool call", f'{{"command": "mysql -uroot -p{CLI_PASSWORD} app"}}', CLI_PASSWORD, "-p[REDACTED]"),
    ("sshpass -p", f"sshpass -p '{CLI_PASSWORD}' ssh deploy@web1", CLI_PASSWORD, "-p '[REDACTED]'"),
    ("redis-cli -a", f"redis-cli -h cache -a {CLI_PASSWORD} ping", CLI_PASSWORD, "-a [REDACTED]"),
    ("openssl pass:", f"openssl pkcs12 -in a.p12 -passin pass:{CLI_PASSWORD}", CLI_PASSWORD, "pass:[REDACTED]"),
    ("--password X", f"pg_dump --db-password {CLI_PASSWORD} app", CLI_PASSWORD, "--db-password [REDACTED]"),
    (
        "--password 'a b'",
        f"tool --password '{CLI_PASSWORD} and more words' x",
        CLI_PASSWORD,
        "--password '[REDACTED]' x",
    ),
    ("pw: in prose", f"the staging pw: {CLI_PASSWORD}", CLI_PASSWORD, "pw: [REDACTED]"),
    ("a long name", f"MY_APP_PROD_EU_WEST_1_DB_PASSWORD={PG}", PG, "PASSWORD=[REDACTED]"),
    ("url password, host with a port", f"redis://:{SLASHED}@localhost:6379", SLASHED, "redis://:[REDACTED]@"),
    # (An "&" in a generated password is part of it; only a query string's "&name=" ends a value.)
    ("password with &", "DB_PASSWORD=Xk9&mQ2&zR7pL\nDB_USER=app", "Xk9&mQ2&zR7pL", "DB_PASSWORD=[REDACTED]\nDB_USER"),
    ("password with & and a tail", "set SMTP_PASSWORD=Tr0ub4dor&3x\n", "Tr0ub4dor&3x", "SMTP_PASSWORD=[REDACTED]\n"),
    ("a token before &&", "export API_TOKEN=abcd1234&&make build", "abcd1234", "API_TOKEN=[REDACTED]&&make build"),
    ("sendgrid", f"use the SendGrid key {SENDGRID} for mail", SENDGRID, "[REDACTED API KEY]"),
    ("twilio api key", f"the Twilio key {TWILIO} for SMS", TWILIO, "[REDACTED API KEY]"),
    ("pypi token", f"twine upload -u __token__ -p {PYPI} dist/*", PYPI, "[REDACTED API KEY]"),
    ("google key ending in -", f"the maps key {GOOGLE_DASH} in config.js", GOOGLE_DASH, "[REDACTED GOOGLE KEY]"),
    ("password with a comma", "export DB_PASSWORD=Xk9,mQ2zR7", "Xk9,mQ2zR7", "DB_PASSWORD=[REDACTED]"),
    ("password with a quote", "password=aB9'Qz7Lm2Pw", "aB9'Qz7Lm2Pw", "password=[REDACTED]"),
    ("password with a backslash", "ADMIN_PASSWORD=Kq2\\vN8pRt5w", "Kq2\\vN8pRt5w", "ADMIN_PASSWORD=[REDACTED]"),
    ("netrc", f"machine api.heroku.com\n  login me@example.com\n  password {HEX20}", HEX20, "password [REDACTED]"),
    (
        "token as a url's user",
        f"origin https://{HEX40}:x-oauth-basic@github.com/a/b (push)",
        HEX40,
        "https://[REDACTED]",
    ),
    ("token as a url's user alone", f"https://{HEX40}@github.com/a/b.git", HEX40, "https://[REDACTED]@"),
]
OPENROUTER = "sk-" + "or-v1-" + "8f7a6b5c4d3e2f10" * 4
DEEPSEEK = "sk-" + "3f9a8b7c6d5e4f30" * 2
GROQ = "gsk_" + "Zq8Wm3Xv7Nc2Lp5Kt9Hr4Gd6Fb1Sj0Ya7Uw2Ie5Ox3Qn8Tm6R"
XAI = "xai-" + "Lq7Ws2Ex9Rc4Tv1Yb6Un3Im8Ok5Pz0Aj7Sh2Dg4Fk9Gl6Hm1Jn3Kq8Lw5Ze2Xr7Ct4Vy9Bu6Ni1Mo0Pa3Sd8Fg5Hj2"
SESSION = "8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c"
CASES += [
    ("openrouter key", f"OPENROUTER_API_KEY={OPENROUTER}", OPENROUTER, "[REDACTED"),
    ("deepseek key", f"client = OpenAI(api_key='{DEEPSEEK}', base_url=url)", DEEPSEEK, "[REDACTED API KEY]"),
    ("groq key", f"the Groq key is {GROQ}", GROQ, "[REDACTED API KEY]"),
    ("xai key", f"XAI: {XAI}", XAI, "[REDACTED API KEY]"),
    (
        "cookie header",
        f"curl -H 'Cookie: sessionid={SESSION}' https://app",
        SESSION,
        "sessionid=[REDACTED]",
    ),
    (
        "set-cookie",
        f"HTTP/1.1 200 OK\nSet-Cookie: session={SESSION}; HttpOnly",
        SESSION,
        "session=[REDACTED]; HttpOnly",
    ),
    ("curl -b", f"curl -b 'connect.sid={SESSION}' https://app/me", SESSION, "-b 'connect.sid=[REDACTED]"),
]
SECRETS = [secret for _, _, secret, _ in CASES]


@pytest.mark.parametrize(("name", "text", "secret", "marker"), CASES, ids=[c[0] for c in CASES])
def test_each_secret_shape_is_replaced(name: str, text: str, secret: str, marker: str) -> None:
    redacted = redact_secrets(text)
    assert secret not in redacted
    assert marker in redacted
    # The text before the secret survives: only the secret goes.
    head = text.split(secret, maxsplit=1)[0].split("-----BEGIN", maxsplit=1)[0]
    assert redacted.startswith(head)


def test_pem_block_goes_whole_even_when_truncated() -> None:
    # A key cut off mid-way (a log line, a shortened message) has no END line.
    text = "-----BEGIN OPENSSH " + "PRIVATE KEY-----\n" + PEM_BODY
    assert redact_secrets(text) == "[REDACTED PRIVATE KEY]"


@pytest.mark.parametrize(
    "text",
    [
        "The password policy requires twelve characters and a symbol.",
        "password",
        "Reset your password.",
        "Use the api key from the vault, never a literal.",
        "/home/user/projects/sk-learn/setup.py",
        "src/auth/password_reset.py:42: def reset_password(user):",
        "see https://example.com:8080/docs@v2 and https://docs.python.org/3/library/re.html",
        "git checkout 3fa9c21e4b5d6a7f8e9d0c1b2a3f4e5d6c7b8a9f",
        "request id 123e4567-e89b-12d3-a456-426614174000",
        "task-management-system-refactor-plan-for-the-quarter",
        "Bearer of bad news; basic arithmetic",
        "Привет, мир! 数据库连接 مرحبا 🔑",
    ],
)
def test_non_secrets_are_left_alone(text: str) -> None:
    assert redact_secrets(text) == text


def test_redaction_is_idempotent() -> None:
    text = "\n".join(t for _, t, _, _ in CASES)
    once = redact_secrets(text)
    assert redact_secrets(once) == once


# -- redaction end to end ----------------------------------------------------------


def conversation() -> list[BaseMessage]:
    """Secrets everywhere a summarizer looks: prose, tool-call arguments, tool results, a previous summary."""
    previous = summary_message(f"## Goal\n- deploy\n\n## Critical Context\n- db {CASES[11][1]}\n- {CASES[1][1]}")
    return [
        SystemMessage("You are a deployment assistant.", id="sys"),
        previous,
        HumanMessage(f"Deploy with {CASES[2][1]} and {CASES[3][1]}. {CASES[12][1]}", id="u1"),
        AIMessage(
            [
                {"type": "thinking", "thinking": f"the user gave {SK_ANT}", "signature": "sig"},
                {"type": "text", "text": "Calling the deploy tool."},
            ],
            tool_calls=[
                {"name": "deploy", "args": {"token": GITHUB, "header": f"Bearer {BEARER_VALUE}"}, "id": "c1"},
                {"name": "configure", "args": {"region": "eu", "slack": SLACK}, "id": "c2"},
                {"name": "read_env", "args": {"path": ".env"}, "id": "c3"},
            ],
            id="a1",
        ),
        ToolMessage(f"deployed; credentials file:\n{PEM}\nJWT {JWT}", tool_call_id="c1", id="t1"),
        ToolMessage(
            f"configured with {GOOGLE} and {GITHUB_PAT}; {CASES[10][1]}\nconfig.json: {CASES[13][1]}",
            tool_call_id="c2",
            id="t2",
        ),
        ToolMessage("\n".join(text for _, text, _, _ in CASES[14:]), tool_call_id="c3", id="t3"),
        HumanMessage(
            [
                {"type": "text", "text": "This screenshot shows the failing page."},
                # Image URLs carry credentials too: user:password@ and ?token=.
                {
                    "type": "image_url",
                    "image_url": {"url": f"https://ops:{URL_PASSWORD}@img.example/a.png?token={QUERY_TOKEN}"},
                },
            ],
            id="u1b",
        ),
        AIMessage("Done: deployed and configured.", id="a2"),
        HumanMessage("Thanks, now check the logs.", id="u2"),
    ]


# Keep only the last message: everything with a secret is summarized.
OPTIONS = CompactionOptions(keep_recent_tokens=1, redact=redact_secrets)


def assert_no_secret(text: str) -> None:
    leaked = [s for s in SECRETS if s in text]
    assert not leaked, f"secrets reached the summarizer: {leaked}"


class RecordingChat(GenericFakeChatModel):
    """GenericFakeChatModel that records every request it receives."""

    requests: list[list[BaseMessage]] = Field(default_factory=list)

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.requests.append(list(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


def replies() -> Iterator[AIMessage]:
    return (AIMessage("## Goal\n- deploy") for _ in itertools.count())


def prompt_text(requests: Sequence[Sequence[BaseMessage]]) -> str:
    return "\n".join(str(m.content) for request in requests for m in request)


def test_secrets_are_really_in_the_input() -> None:
    # Guard for the tests below: without redaction the summarizer sees them all.
    prompts: list[str] = []
    compact(lambda p: prompts.append(p) or "## Goal\n- deploy", conversation(), CompactionOptions(keep_recent_tokens=1))
    assert all(secret in prompts[0] for secret in SECRETS)


def test_redact_is_off_by_default() -> None:
    assert CompactionOptions().redact is None
    prompts: list[str] = []
    compact(lambda p: prompts.append(p) or "## Goal\n- deploy", conversation(), CompactionOptions(keep_recent_tokens=1))
    assert SK in prompts[0]


def test_no_secret_reaches_a_callable_summarizer() -> None:
    prompts: list[str] = []
    messages = conversation()
    before = [m.model_copy(deep=True) for m in messages]
    result, out = compact(lambda p: prompts.append(p) or "## Goal\n- deploy", messages, OPTIONS)
    assert result is not None
    assert result.updated_previous_summary
    assert prompts
    for prompt in prompts:
        assert_no_secret(prompt)
    # The markers are what the summarizer reads instead, in each place.
    joined = "\n".join(prompts)
    for marker in ("[REDACTED PRIVATE KEY]", "[REDACTED API KEY]", "[REDACTED GITHUB TOKEN]", "Bearer [REDACTED"):
        assert marker in joined
    # The caller's messages are untouched, secrets and all.
    assert messages == before
    assert PEM in str(messages[4].content)
    assert out[-1] is messages[-1]


async def test_no_secret_reaches_a_chat_model_sync_and_async() -> None:
    for run in ("sync", "async"):
        model = RecordingChat(messages=replies())
        messages = conversation()
        before = [m.model_copy(deep=True) for m in messages]
        if run == "sync":
            result, _ = compact(model, messages, OPTIONS)
        else:
            result, _ = await acompact(model, messages, OPTIONS)
        assert result is not None
        assert model.requests
        assert_no_secret(prompt_text(model.requests))
        assert messages == before


def test_extractive_summary_holds_no_secret() -> None:
    messages = conversation()
    result, out = compact(ExtractiveSummarizer(), messages, OPTIONS)
    assert result is not None
    assert_no_secret(result.summary)
    (summary,) = [m for m in out if is_summary_message(m)]
    assert_no_secret(str(summary.content))
    # The extractive summary copies facts; the redacted ones come through as markers.
    assert "[REDACTED" in result.summary


def test_the_callers_instructions_are_redacted_too() -> None:
    # A "/compact keep the db password=..." a user typed goes to the summarizer as instructions.
    prompts: list[str] = []
    said = f"keep the db password=Zq9vXk7hunter2 and the key {SK} in the summary"
    compact(lambda p: prompts.append(p) or "## Goal\n- deploy", conversation(), OPTIONS, said)
    result, _ = compact(ExtractiveSummarizer(), conversation(), OPTIONS, said)
    assert result is not None
    for text in (*prompts, result.summary):
        assert "Zq9vXk7hunter2" not in text
        assert_no_secret(text)
    assert "keep the db password=" in prompts[0]  # the instructions themselves still go


def test_extractive_copies_secrets_without_redact() -> None:
    # Guard: the extractive summarizer would copy at least one secret verbatim.
    result, _ = compact(ExtractiveSummarizer(), conversation(), CompactionOptions(keep_recent_tokens=1))
    assert result is not None
    assert any(secret in result.summary for secret in SECRETS)


def test_custom_redactor_sees_every_text_and_can_replace_it() -> None:
    seen: list[str] = []

    def shout(text: str) -> str:
        seen.append(text)
        return text.replace("deploy", "DEPLOY")

    prompts: list[str] = []
    messages = conversation()
    compact(
        lambda p: prompts.append(p) or "## Goal\n- x", messages, CompactionOptions(keep_recent_tokens=1, redact=shout)
    )
    joined = "\n".join(seen)
    # Text, reasoning, tool-call arguments, tool results and the previous summary all went through it.
    for fragment in ("Deploy with", "the user gave", '"token"', "deployed; credentials", "configured with", "## Goal"):
        assert fragment in joined, fragment
    assert "Calling the DEPLOY tool" in prompts[0]  # what the redactor returned is what was sent
    assert "(tool call DEPLOY" not in prompts[0]  # names are labels, not text: not passed to the redactor
    assert "- DEPLOY" in prompts[0]  # the previous summary was redacted


def test_a_redactor_that_raises_is_a_compaction_error() -> None:
    # Documented: every error the library raises on purpose is a CompactionError,
    # and summarizing failures are SummarizationErrors chained to their cause.
    def broken(text: str) -> str:
        msg = "redactor bug"
        raise RuntimeError(msg)

    messages = conversation()
    before = [m.model_copy(deep=True) for m in messages]
    with pytest.raises(CompactionError) as info:
        compact(lambda p: "## Goal\n- x", messages, CompactionOptions(keep_recent_tokens=1, redact=broken))
    assert isinstance(info.value, SummarizationError)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert messages == before


def test_secret_in_a_json_string_inside_tool_arguments_is_redacted() -> None:
    # An agent writing a config file: the file's JSON is a string argument, so
    # in the arguments' JSON text its quotes are escaped (\"api_key\": \"...\").
    config = f'{{"api_key": "{ASSIGNED_KEY}", "password": "{ASSIGNED_PASSWORD}"}}'
    messages: list[BaseMessage] = [
        HumanMessage("write the config", id="u1"),
        AIMessage(
            "",
            tool_calls=[{"name": "write_file", "args": {"path": "config.json", "content": config}, "id": "w1"}],
            id="a1",
        ),
        ToolMessage("written", tool_call_id="w1", id="t1"),
        HumanMessage("now run it", id="u2"),
    ]
    prompts: list[str] = []
    compact(lambda p: prompts.append(p) or "## Goal\n- run", messages, OPTIONS)
    assert "config.json" in prompts[0]
    assert ASSIGNED_KEY not in prompts[0]
    assert ASSIGNED_PASSWORD not in prompts[0]


def test_redact_must_be_callable() -> None:
    with pytest.raises(ValueError, match="redact"):
        CompactionOptions(redact="yes")  # type: ignore[arg-type]


def test_the_chat_memory_recall_tool_redacts_with_the_memory_s_own_hook() -> None:
    """``recall_tool(history=...)`` returns archived text through the memory's ``redact`` unless told otherwise."""
    import warnings

    from langchain_core.chat_history import InMemoryChatMessageHistory

    from langchain_compaction import CompactingChatMessageHistory
    from langchain_compaction.archive import recall_tool

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        memory = CompactingChatMessageHistory(
            InMemoryChatMessageHistory(),
            lambda prompt: "## Goal\n- deploy",
            CompactionOptions(context_window=2_000, reserve_tokens=500, keep_recent_tokens=300, redact=redact_secrets),
            archive=InMemoryChatMessageHistory(),
        )
    memory.add_messages([HumanMessage(f"Deploy with DB_PASSWORD={DB_PASSWORD} please"), AIMessage("ok")])
    for i in range(40):
        memory.add_messages([HumanMessage(f"question {i} " * 10), AIMessage(f"answer {i} " * 10)])
    out = recall_tool(history=memory).invoke({"query": "Deploy"})
    assert "Deploy with DB_PASSWORD=[REDACTED]" in out
    assert DB_PASSWORD not in out
    # Told otherwise (a hook of the caller's), that one applies.
    shouted = recall_tool(history=memory, redact=str.upper).invoke({"query": "Deploy"})
    assert f"DEPLOY WITH DB_PASSWORD={DB_PASSWORD.upper()}" in shouted


@pytest.mark.parametrize(
    "text",
    [
        '{"password": "", "user": "bob"}',
        'const password = "";  const user = "admin";',
        "apt install mysql-server && rsync -pav src/ dst/",
        "curl -s https://x.com/a | docker run -u 1000:1000 alpine",
        "connect to ws://game:abc/room@lobby",
        "http://[::1]:8080/@scope/pkg",
        'api_key: "is passed in the header, see docs"',
        "mysql -u root -p app",
        "ls -a /tmp && mytool --password --user bob && mytool --password-file /run/secrets/db",
        "createdb --no-password billing && ansible-playbook --ask-pass deploy.yml",
        "sshpass -e ssh -p 2222 deploy@web1 && sshpass -f pw.txt ssh -p 22 deploy@web2",
        # Prose about a password that says none, and code that names where a secret comes from.
        "The password was reset yesterday by your team, and the password is correct but login fails.",
        "The passcode was sent to my phone.",
        'api_key = os.environ["API_KEY"]',
        "POSTGRES_PASSWORD: ${POSTGRES_PASSWORD}",
        "def login(username: str, password: str) -> Session:",
        "client = Client(api_key=api_key, base_url=BASE_URL)",
        "the bug: token=None was passed on",
        # A branch and a pod whose names start like a key's prefix.
        "git checkout sk-add-retry-to-payment-client",
        "kubectl logs rk-payments-worker-7d9f8c6b5-x2x9z",
        # A line that reads "password" then a word, a column listing, a long hyphenated URL user.
        "Settings:\npassword reset\nremember_me",
        " Column\n password\n created_at",
        "git clone https://contoso-payments-platform-team-org@dev.azure.com/contoso/_git/payments",
    ],
)
def test_what_only_looks_like_a_secret_is_left_alone(text: str) -> None:
    """An empty value, another command's flag, a path after a port, a phrase after a key's name."""
    assert redact_secrets(text) == text


def test_redaction_is_linear_on_long_lines_of_look_alikes() -> None:
    """Tool output may be one long line: a pattern that rescans the line from every match takes minutes here.

    Run in a process of its own with a deadline sixty times what it takes
    (about a second): a hang detector, not a speed target.
    """
    import subprocess
    import sys

    code = (
        "from langchain_compaction.core.redact import redact_secrets\n"
        "for text in ('mysql ' * 50_000, 'curl -u ' * 40_000, 'x://' * 80_000, 'http://a:' * 35_000,\n"
        '             \'a-\' * 150_000, \'{"name":"mysql-N","cmd":"curl http://x/health"}\' * 5_000,\n'
        "             'The password is' + ' ' * 40_000, chr(10) * 40_000 + 'password', 'sshpass ' * 50_000,\n"
        "             ' --password' * 40_000, 'redis-cli -h' * 40_000):\n"
        "    assert redact_secrets(text).count('[REDACTED') == 0\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize(
    ("said", "secret"),
    [
        ("the admin password is Hunter2Secret!", "Hunter2Secret"),
        ("docker login -u bob -p s3cr3tPass registry.io", "s3cr3tPass"),
        ("podman login --password=abcd1234 ghcr.io", "abcd1234"),
        ("the password is: Hunter2zzq", "Hunter2zzq"),
        ("The password for the staging db is Wq7Lm2xPr", "Wq7Lm2xPr"),
        ("Heads-up: the admin password is now Zt5Kp9qWe", "Zt5Kp9qWe"),
    ],
)
def test_a_password_said_in_prose_or_given_to_a_registry_login_is_masked(said: str, secret: str) -> None:
    masked = redact_secrets(said)
    assert secret not in masked
    assert "[REDACTED]" in masked


def test_the_bridge_that_repeats_the_request_repeats_it_redacted() -> None:
    """A mid-loop compaction's bridge repeats the user's request: through ``redact=`` like the summary."""
    key = "sk-proj-" + "Q7x2" * 10
    messages: list[BaseMessage] = [
        SystemMessage("You are a coding agent.", id="sys"),
        HumanMessage(f"Deploy with OPENAI_API_KEY={key} and check the logs.", id="h1"),
    ]
    for step in range(6):
        call = {"name": "bash", "args": {"cmd": f"deploy --step {step}"}, "id": f"c{step}"}
        messages += [AIMessage("", id=f"a{step}", tool_calls=[call])]
        messages += [ToolMessage("deployed\n" * 40, tool_call_id=f"c{step}", id=f"t{step}")]
    options = CompactionOptions(keep_recent_tokens=200, redact=redact_secrets)
    result, out = compact(ExtractiveSummarizer(), messages, options)
    assert result is not None
    bridge = next(m for m in out if isinstance(m, HumanMessage))
    assert "Deploy with OPENAI_API_KEY=" in str(bridge.content)  # the request is repeated ...
    assert key not in str(bridge.content)  # ... redacted
    assert key not in str(bridge.additional_kwargs)


def test_facts_carried_from_a_summary_made_before_redact_was_set_are_redacted_too() -> None:
    """A password a summary's checked facts held is not written into every later summary once redact= is on.

    The value read out on its own (an identifier) goes with it: nothing is
    left to recognize it by but the fact it was masked in.
    """
    from langchain_compaction import compact
    from langchain_compaction._lc.convert import is_summary_message

    secret = "Qz8" + "vLm2pRt7"
    poor = "## Goal\n- Continue the task."
    messages: list[BaseMessage] = [
        HumanMessage(f"Deploy the api. Never commit the .env, it has DB_PASSWORD={secret} in it.", id="h1"),
        AIMessage("ok", id="a1"),
        HumanMessage("thanks, carry on", id="h2"),
        AIMessage("On it.", id="a2"),
    ]
    _, messages = compact(lambda p: poor, messages, CompactionOptions(keep_recent_tokens=10))
    assert secret in str(messages)  # (recorded before redaction was on)
    messages += [HumanMessage("now check the logs", id="h3"), AIMessage("clean", id="a3")]
    messages += [HumanMessage("next step please", id="h4"), AIMessage("ok", id="a4")]
    _, messages = compact(lambda p: poor, messages, CompactionOptions(keep_recent_tokens=10, redact=redact_secrets))
    summary = next(m for m in messages if is_summary_message(m))
    assert secret not in str(summary.content)
    assert secret not in str(summary.additional_kwargs)
    assert "DB_PASSWORD=[REDACTED]" in str(summary.content)  # (the rule itself stays)


def test_a_connection_string_keeps_the_fields_after_its_password() -> None:
    # The password's unquoted value ran to the next space, masking ";Encrypt=true;..." with it.
    text = "Server=db1;Database=app;User Id=bob;Password=Xk9;mQ2zR7;Encrypt=true;TrustServerCertificate=yes"
    masked = redact_secrets(text)
    assert masked == "Server=db1;Database=app;User Id=bob;Password=[REDACTED];Encrypt=true;TrustServerCertificate=yes"
    assert redact_secrets("Server=db1;Password=abc;Encrypt=true") == "Server=db1;Password=[REDACTED];Encrypt=true"


def _block_form_session(command: str, output: str, *, error: bool = False) -> list[BaseMessage]:
    """A bash call and its result in Anthropic's block form, then enough turns to compact them away."""
    from langchain_core.messages import convert_to_messages

    def call(n: int, text: str) -> dict[str, Any]:
        use = {"type": "tool_use", "id": f"t{n}", "name": "bash", "input": {"command": text}}
        return {"role": "assistant", "content": [{"type": "text", "text": f"Step {n}."}, use]}

    def result(n: int, text: str, failed: bool = False) -> dict[str, Any]:
        block = {"type": "tool_result", "tool_use_id": f"t{n}", "content": text, "is_error": failed}
        return {"role": "user", "content": [block]}

    history: list[Any] = [{"role": "user", "content": "Restore the db from dump.sql."}]
    history += [call(1, command), result(1, output, error)]
    for n in range(2, 30):
        history += [call(n, f"echo {n}"), result(n, "ok " * 100)]
    history.append({"role": "assistant", "content": "Done."})
    return convert_to_messages(history)


def test_secrets_in_block_form_tool_results_and_multi_line_commands_are_masked() -> None:
    # A tool_result's text was never redacted (checked facts, the offline summary and the mark held a
    # token), and a multi-line command's passwords were not seen behind JSON's escaped line breaks.
    token = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    command = f"set -e\nmysql -u root -p{CLI_PASSWORD} app < dump.sql\nsshpass -p {CLI_PASSWORD}x ssh root@db"
    output = (
        f"fatal: could not read from https://{token}@github.com/acme/app.git\nmachine h login bob\npassword Zq9xWv3Lm"
    )
    messages = _block_form_session(command, output, error=True)
    prompts: list[str] = []
    options = CompactionOptions(
        context_window=6_000, reserve_tokens=1_000, keep_recent_tokens=500, redact=redact_secrets
    )
    compact(lambda prompt: prompts.append(prompt) or "## Goal\n- restore the db", messages, options)
    _, offline = compact(ExtractiveSummarizer(), messages, options)
    seen = "\n".join([*prompts, str(offline[0].content), str(offline[0].additional_kwargs)])
    for secret in (token, CLI_PASSWORD, "Zq9xWv3Lm"):
        assert secret not in seen
    assert "github.com/acme/app.git" in "\n".join(prompts)  # the rest of the output is shown


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ('SECRET_KEY = "x9Kp2 LmQ7vRt"', "LmQ7vRt"),
        ('AWS_SECRET_ACCESS_KEY = "wJalrXUtnFEMI K7MDENGbPxRfiCY"', "K7MDENGbPxRfiCY"),
        ('the password is "correct horse battery staple"', "battery staple"),
    ],
)
def test_a_quoted_secret_with_a_space_is_masked_whole(text: str, secret: str) -> None:
    # Only its first word was masked, or (a passphrase of plain words said in prose) none of it.
    assert secret not in redact_secrets(text)
