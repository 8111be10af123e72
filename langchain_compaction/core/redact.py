"""Redaction: keep secrets out of everything sent to the summarizer.

``CompactionOptions(redact=...)`` takes any function from text to text; it is
applied to every message the summarizer is shown (text, reasoning, tool-call
arguments, tool results), to the previous summary, and to what the extractive
summarizer copies. ``redact_secrets`` is a ready one for common secret shapes.
Redaction is off by default: it changes what the summary can quote, and only
the application knows what counts as secret.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import replace

from langchain_compaction.core.types import Fact, Message, ToolCall
from langchain_compaction.errors import SummarizationError

Redactor = Callable[[str], str]
"""A function from text to the same text with secrets replaced."""

# A name that says secret, alone or at the end of a longer one (DB_PASSWORD,
# PGPASSWORD, aws_secret_access_key, GITHUB_TOKEN, SECRET_KEY).
_SECRET_NAME = (
    r"\b(?:[A-Za-z0-9]+[_-]){0,16}(?:[A-Za-z0-9]{0,40}?(?:password|passwd)|pwd|secret|secret[_-]?(?:access[_-]?)?key"
    r"|api[_-]?key|access[_-]?key|access[_-]?token|auth[_-]?token|client[_-]?secret|private[_-]?key|token"
    r"|credentials?)\b"
)
# A name for a password, whose value may be a phrase (spaces and all) when quoted.
# ("pw" is also power's and pulse width's: group "pw" says the name is that abbreviation, see _MEASUREMENT.)
_PASSWORD_NAME = r"\b(?:[A-Za-z0-9]+[_-]){0,16}[A-Za-z0-9]{0,40}?(?:password|passwd|passphrase|pwd|(?P<pw>pw)|secret)\b"
# A quantity: a number of up to five digits and a unit of measure as it is written (its case: "W", "kW", "ms",
# "MiB", "%"), and nothing after them but the end of the value ("250W", "12.5 kW", "300ms"; not "1234abc",
# "250Wx9", "123456a"). After "pw", which also abbreviates power and pulse width, a quantity is that ("gpu pw:
# 250W"); after a name that can only mean a password it is one.
_MEASUREMENT = (
    r"(?-i:\d{1,5}(?:[.,]\d{1,3})?[^\S\n]?(?:%|°[CF]|[kKMGTmµun]?(?:Wh?|VA?|Ah?|Hz|J|Ω|ohm|i?B|b|bps|s|g|Pa)"
    r"|[cmk]?m|min|h|hrs?|sec|dB[mi]?|rpm|psi|bar|fps|px|pt)"
    r"(?=[.,;]?(?:[\s'\"\\)\]}]|$)))"
)
# A value that names where a secret comes from, or none, rather than holding one: code reads and passes
# secrets without holding them (os.environ["API_KEY"], ${POSTGRES_PASSWORD}, api_key=api_key, password: str).
_NO_SECRET = (
    r"(?!(?:None|null|nil|true|false|undefined|required|str|bytes|SecretStr|Optional)\b|\$[{(A-Z_]|os\.|getenv\("
    r"|env\(|<|(?-i:[a-z_][a-z0-9_]{0,40}[,)]))"
)
# A word that looks made up (a digit, a symbol, or a capital past its first letter), as a password said in prose does.
_SECRETISH = r"(?=[^\s'\"]{0,256}?(?:[0-9!@#$%^&*+=~?_\-]|(?-i:[^\s'\"][A-Z])))"
# A token that looks made up, read within the token alone: a digit, a "+" or "/" (base64), or a capital after a small
# letter. (Punctuation after a word of prose is no sign: "basic authentication?", "**Bearer authentication**".)
_TOKENISH = r"(?=[^\s'\"\\`,;(){}<>\[\]]{0,256}?(?:[0-9+/]|(?-i:[a-z][A-Z])))"


def _masked_keeping_quotes(found: re.Match[str]) -> str:
    """A value masked after what leads to it (group 1), inside its quotes (group 2) when it had them."""
    quote = found.group(2) or ""
    return f"{found.group(1)}{quote}[REDACTED]{quote}"


# Where a command's name starts a word of a command line (at its start, after a space, a quote, a "(" or a
# path's "/"), and the rest of that command up to one of its options.
_COMMAND_START = r"(?<![^\s;&|(\"'`/])"
_IN_COMMAND = r"(?=\s)[^\n;&|]{0,300}?\s"
# An option's value: in quotes, whole (group 2 is the quote); else a word, which starts with no "-" (the next
# option), no punctuation (a shell's "|" or ">", a Markdown "`" or ", " after the option's name in prose) and
# is no "..." (a placeholder).
_ARGUMENT = r"(?:(['\"])(?!\[REDACTED)[^'\"\n]{1,256}\2|(?=[^\s'\"`,;|&<>()\[\]{}-])(?!\[REDACTED|\.\.\.|…)[^\s'\"`]+)"
# The commands whose option takes a user and a password in one value: curl's -u user:password, HTTPie's -a,
# Samba's -U user%password.
_USER_PASSWORD_COMMANDS = "|".join(
    (
        r"curl" + _IN_COMMAND + r"(?:-u|--user)",
        r"https?" + _IN_COMMAND + r"(?:-a|--auth)",
        r"(?:smbclient|rpcclient|smbcacls|smbget)" + _IN_COMMAND + r"(?:-U|--user)",
    )
)
# The commands whose option takes a password there only ("-p" is a port to ssh, a database to mysql with a
# space after it).
_PASSWORD_COMMANDS = "|".join(
    (
        # Written against the option: mysql -pSECRET, 7-Zip's -pSECRET.
        r"mysql(?:dump|admin)?" + _IN_COMMAND + r"-p",
        r"7z[ar]?" + _IN_COMMAND + r"-p",
        # sshpass's -p (among its own options, before the command it runs: "ssh -p 2222" is a port),
        # redis-cli's -a, sqlcmd's and bcp's -P, the LDAP tools' -w, zip's -P, openssl's -k (enc) and -K,
        # keytool's -new (keytool -storepasswd).
        # (The value is on the option's line: "-P" that ends a line is followed by prose, not a password.)
        r"sshpass(?:\s+-[a-oq-zA-Z]\S*)*\s+-p[^\S\n]*",
        r"redis-cli" + _IN_COMMAND + r"-a[^\S\n]*",
        r"(?:sqlcmd|bcp)" + _IN_COMMAND + r"-P[^\S\n]*",
        r"ldap(?:search|add|modify|delete|modrdn|compare|passwd|whoami)" + _IN_COMMAND + r"-w[^\S\n]*",
        r"(?:un)?zip" + _IN_COMMAND + r"-P[^\S\n]+",
        r"openssl" + _IN_COMMAND + r"-[kK][^\S\n]+",
        r"keytool" + _IN_COMMAND + r"-new[^\S\n]+",
        # A login's -p / --password (registries, OpenShift, Azure, Cloud Foundry), the MongoDB and Cassandra shells'.
        r"(?:(?:docker|podman|helm|buildah|skopeo)\s+(?:registry\s+)?login|(?:oc|az|cf)\s+login"
        r"|mongo(?:sh|dump|restore|export|import)?|cqlsh)" + _IN_COMMAND + r"(?:-p|--password)(?:\s+|=)",
        # PowerShell's ConvertTo-SecureString "X" -AsPlainText (a quoted string: the cmdlet named in prose is none).
        r"(?i:ConvertTo-SecureString(?:\s+-(?:AsPlainText|Force))*\s+(?:-String\s+)?)(?=['\"])",
    )
)
# The options that take a password whatever their command (after their "-"): openssl's -passin pass:X, Java's
# keytool and jarsigner (-storepass, -keypass, -srcstorepass, -destkeypass ...), and any option named for a
# password given a value (--password X, --db-pass=X, --passphrase X, a single-dash -password X; not
# --no-password, --ask-pass or --password-file).
_PASSWORD_OPTIONS = "|".join(
    (
        r"(?:pass|passin|passout)\s+pass:",
        r"(?:src|dest)?(?:store|key)pass\s+",
        r"-(?!no-|ask-)(?:[a-z0-9]+-){0,4}(?:password|passwd|passphrase|pass)(?:\s+|=)",
        r"(?:password|passwd)(?:\s+|=)",
    )
)


# (Every repetition below is bounded, or stops at what ends it: a long line of
# look-alikes, which tool output may be, costs linear time.)
_COOKIE_VALUE = re.compile(r"(=[^\S\n]*)(?!\[REDACTED)[^;\s]+")
_PATTERNS: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    # PEM private keys, whole blocks.
    (
        re.compile(
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
            re.S,
        ),
        "[REDACTED PRIVATE KEY]",
    ),
    # Provider keys with a recognizable prefix.
    (re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{16,}"), "[REDACTED API KEY]"),
    # (Random, so they hold a digit and a capital: a branch "sk-add-retry-to-payment-client" is no key.)
    (
        re.compile(
            r"\b(?:sk|pk|rk)-(?:proj-|live-|test-)?(?=[A-Za-z0-9_\-]{0,200}?[0-9])(?=[A-Za-z0-9_\-]{0,200}?[A-Z])"
            r"[A-Za-z0-9_\-]{20,}"
        ),
        "[REDACTED API KEY]",
    ),
    # OpenRouter's (sk-or-v1-) and DeepSeek's: lowercase hex, no capital to tell them by.
    (re.compile(r"\bsk-(?:or-v1-)?[0-9a-f]{32,}\b"), "[REDACTED API KEY]"),
    # Groq, xAI, Replicate, DigitalOcean, Shopify, Perplexity, Linear, Notion, Google OAuth, Telegram bots.
    (
        re.compile(
            r"\b(?:gsk_[A-Za-z0-9]{40,}|xai-[A-Za-z0-9]{40,}|r8_[A-Za-z0-9]{30,}|dop_v1_[a-f0-9]{64}"
            r"|shp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}|pplx-[A-Za-z0-9]{40,}|lin_api_[A-Za-z0-9]{30,}"
            r"|secret_[A-Za-z0-9]{43}|ya29\.[A-Za-z0-9_\-]{30,}|\d{8,10}:AA[A-Za-z0-9_\-]{33})(?![A-Za-z0-9_\-])"
        ),
        "[REDACTED API KEY]",
    ),
    # Session cookies: whoever holds one is logged in. Each value of a Cookie or Set-Cookie header (its
    # names stay), and curl's -b / --cookie.
    (re.compile(r"(?i)\b(?:set-)?cookie:[^\n'\"]+"), lambda found: _COOKIE_VALUE.sub(r"\1[REDACTED]", found.group())),
    (
        re.compile(
            r"(\bcurl(?=\s)[^\n;&|]{0,300}?\s(?:-b|--cookie)\s+['\"]?(?:[^\s=;'\"]+=)?)(?![^\s;'\"]*\[REDACTED)[^\s;'\"]+"
        ),
        r"\1[REDACTED]",
    ),
    # Stripe's live and test keys (sk_live_, rk_test_, whsec_ ...), Hugging Face and npm tokens.
    (re.compile(r"\b(?:sk|pk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"), "[REDACTED API KEY]"),
    (re.compile(r"\bwhsec_[A-Za-z0-9]{16,}"), "[REDACTED API KEY]"),
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"), "[REDACTED API KEY]"),
    (re.compile(r"(_authToken\s*=\s*)(?!\[REDACTED)\S+"), r"\1[REDACTED]"),
    (re.compile(r"\bnpm_[A-Za-z0-9]{30,}\b"), "[REDACTED API KEY]"),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "[REDACTED AWS KEY]"),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b"), "[REDACTED GITHUB TOKEN]"),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{30,}\b"), "[REDACTED GITHUB TOKEN]"),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b"), "[REDACTED SLACK TOKEN]"),
    (re.compile(r"\bxapp-[A-Za-z0-9-]{10,}\b"), "[REDACTED SLACK TOKEN]"),
    (re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}"), "[REDACTED GITLAB TOKEN]"),
    # Webhook URLs whose path is the secret (Slack, Discord).
    (re.compile(r"(hooks\.slack\.com/services/|discord(?:app)?\.com/api/webhooks/)[A-Za-z0-9/_\-]+"), r"\1[REDACTED]"),
    # (Its last character may be a "-", after which no word boundary follows.)
    (re.compile(r"\bAIza[0-9A-Za-z_\-]{35}(?![0-9A-Za-z_\-])"), "[REDACTED GOOGLE KEY]"),
    # SendGrid (SG.<id>.<secret>), Twilio API keys (SK and 32 hex), PyPI upload tokens.
    (re.compile(r"\bSG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}"), "[REDACTED API KEY]"),
    (re.compile(r"\bSK[0-9a-fA-F]{32}\b"), "[REDACTED API KEY]"),
    (re.compile(r"\bpypi-[A-Za-z0-9_\-]{40,}"), "[REDACTED API KEY]"),
    (re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"), "[REDACTED JWT]"),
    # Authorization headers and bearer tokens: the whole token, to the space, quote or bracket that ends it (a
    # "|", "@", "#" or ":" in it is part of it), in quotes of its own or not; never a word of prose ("basic
    # authentication": a token looks made up), where one comes from ("Bearer ${TOKEN}", "<token>") nor a
    # challenge's realm ("Basic realm=...").
    (  # (In an Authorization header the value is a credential, however it looks.)
        re.compile(
            r"(?i)(\bauthorization:[ \t]*(?:bearer|basic|token)[ \t]+)((?:\\?['\"])?)"
            r"(?!\[REDACTED|\$[{(\w]|%|<|realm=)[^\s'\"\\`,;(){}<>\[\]]{12,}(?<![.:])"
        ),
        r"\1\2[REDACTED TOKEN]",
    ),
    (
        re.compile(
            r"(?i)(\b(?:bearer|basic|(?<=authorization: )token)\s+)((?:\\?['\"])?)"
            r"(?!\[REDACTED|\$[{(\w]|%|realm=)" + _TOKENISH + r"[^\s'\"\\`,;(){}<>\[\]]{12,}(?<![.:])"
        ),
        r"\1\2[REDACTED TOKEN]",
    ),
    # Passwords in URLs: scheme://user:password@host (the user may be empty).
    # A slash ends the part before the host, unless a host name follows the "@"
    # (dotted, or with a port: an unescaped slash in a password):
    # "host:8080/path@v2" is a port and a path, "ws://game:abc/room@lobby" a path.
    (
        re.compile(
            r"(\b[a-zA-Z][a-zA-Z0-9+.\-]{0,20}://[^\s:/@]{0,64}:)(?!\[REDACTED|\d+/)"
            r"(?:[^\s@/]{1,256}|(?:(?!://)[^\s@]){1,256}(?=@[A-Za-z0-9-]+(?:(?:\.[A-Za-z0-9-]+)+|:\d)))@"
        ),
        r"\1[REDACTED]@",
    ),
    # A token as a URL's user (git's https://<token>@github.com, https://<token>:x-oauth-basic@...): a user
    # name is not 32 letters, digits and underscores with a digit among them (a hyphenated name is a name).
    (
        re.compile(
            r"(\b[a-zA-Z][a-zA-Z0-9+.\-]{0,20}://)(?!\[REDACTED)(?=[A-Za-z0-9_]{0,64}?[0-9])[A-Za-z0-9_]{32,}"
            r"(?=(?::[^\s@/]{0,256})?@)"
        ),
        r"\1[REDACTED]",
    ),
    # Passwords on command lines (in the same command: a pipe, ";" or "&&" ends it). A user:password given
    # to one option (_USER_PASSWORD_COMMANDS; a quoted one goes whole).
    (
        re.compile(
            r"(" + _COMMAND_START + r"(?:" + _USER_PASSWORD_COMMANDS + r")(?:\s+|=)(['\"])?[^\s:%'\"]{1,64}[:%])"
            r"(?!\[REDACTED)(?(2)[^'\"\n]{1,256}(?=\2)|[^\s'\"`]+)"
        ),
        r"\1[REDACTED]",
    ),
    # A password after the option its command takes it by, or an option named for one (_PASSWORD_COMMANDS,
    # _PASSWORD_OPTIONS). A quoted value goes whole.
    (
        re.compile(
            r"(" + _COMMAND_START + r"(?:" + _PASSWORD_COMMANDS + r")|\s-(?:" + _PASSWORD_OPTIONS + r"))" + _ARGUMENT
        ),
        _masked_keeping_quotes,
    ),
    # htpasswd -b takes its password as its last argument: "htpasswd -b[c] FILE USER PASSWORD", "htpasswd -nb USER
    # PASSWORD".
    (
        re.compile(
            r"(" + _COMMAND_START + r"htpasswd(?=(?:\s+-(?:C\s+\d+|[A-Za-z]+)){0,5}?\s+-[A-Za-z]*b)"
            r"(?:\s+-(?:C\s+\d+|[A-Za-z]+)){1,6}(?:\s+[^\s'\"<>|&;-]\S*){1,2}\s+)"
            + _ARGUMENT
            + r"(?=[^\S\n]*(?:[\n;&|<>)`]|$)|['\"\\])"  # (the last argument, or the end of a quoted command)
        ),
        _masked_keeping_quotes,
    ),
    # A password echoed into a login that reads it from its input: echo X | docker login --password-stdin
    # (not where it comes from: echo "$CR_PAT").
    (
        re.compile(
            r"(" + _COMMAND_START + r"echo\s+(?:-[neE]{1,3}\s+)?)"
            r"(?:(['\"])(?!\[REDACTED|\$)[^'\"\n]{1,256}\2|(?=[^\s'\"$-])(?!\[REDACTED|\.\.\.|…)[^\s'\"|;&]+)"
            r"(?=[^\S\n]*\|(?!\|)[^\n;&|]{0,200}?\s--password-stdin\b)"
        ),
        _masked_keeping_quotes,
    ),
    # A password said in prose: "the admin password is Hunter2Secret!" (a word that looks made up: "the
    # password was reset yesterday" and "the password is correct" say nothing secret).
    # ("The password for the staging db is now: X" too), and a .netrc's "password X" (a line of its own,
    # or after its machine and login).
    # (Quoted, it is taken whole whatever it looks like: "the password is "correct horse battery staple"".)
    (
        re.compile(
            r"(?i)(\b(?:password|passphrase|passcode|passwd)(?:\s{1,8}for\s{1,8}[^\n.:;]{1,60}?)?\s{1,8}(?:is|was)"
            r"(?:\s{1,8}now)?(?:\s{0,8}:)?\s{1,8})(?:(['\"])(?!\[REDACTED)[^'\"\n]{4,256}\2|(?!\[REDACTED)"
            + _SECRETISH
            + r"[^\s'\"]{4,})"
        ),
        _masked_keeping_quotes,
    ),
    (
        re.compile(
            r"(?m)(^[ \t]{0,16}password[ \t]{1,16}|\bmachine[ \t]+\S+[ \t]+login[ \t]+\S+[ \t]+password[ \t]+)"
            r"(?!\[REDACTED)" + _SECRETISH + r"\S+(?=[ \t]*$)"
        ),
        r"\1[REDACTED]",
    ),
    # Credentials in a URL's query string (?token=..., &sig=..., &X-Amz-Signature=...).
    (
        re.compile(
            r"(?i)([?&](?:token|access_token|api_key|apikey|key|sig|signature|x-amz-signature|x-amz-credential"
            r"|password|secret|client_secret|auth)=)[^&#\s\"']+"
        ),
        r"\1[REDACTED]",
    ),
    # Connection strings: Azure's AccountKey= / SharedAccessKey=, and Password= in ADO/ODBC strings.
    (re.compile(r"(?i)\b((?:AccountKey|SharedAccessKey|SharedAccessSignature)=)[^;\s\"']+"), r"\1[REDACTED]"),
    # key=value and "key": "value" for names that say secret, alone or at the end
    # of a longer name (DB_PASSWORD=, aws_secret_access_key = , GITHUB_TOKEN: ...).
    # (the quotes may be JSON-escaped: tool-call arguments are JSON text). A
    # password's quoted value is taken whole, spaces and all (a passphrase);
    # any other value to the next space. An empty value is left alone.
    (
        re.compile(
            rf"(?i)({_PASSWORD_NAME}\\?[\"']?\s*[:=]\s*(?P<quote>\\?[\"']))(?!\[REDACTED)"
            rf"(?(pw)(?!{_MEASUREMENT}(?P=quote)))(?:(?!(?P=quote))[^\n]){{1,256}}(?=(?P=quote))"
        ),
        r"\1[REDACTED]",
    ),
    # Another secret's quoted value is taken whole too when it looks made up ("x9Kp2 LmQ7vRt"): a phrase
    # after a key's name ("api_key": "is passed in the header") says what it is, not what it holds.
    (
        re.compile(
            rf"(?i)({_SECRET_NAME}\\?[\"']?\s*[:=]\s*(\\?[\"']))(?!\[REDACTED){_NO_SECRET}{_SECRETISH}"
            r"(?:(?!\2)[^\n]){1,256}(?=\2)"
        ),
        r"\1[REDACTED]",
    ),
    # A password's value unquoted runs to the next space, commas, quotes and backslashes in it
    # (DB_PASSWORD=Xk9,mQ2zR7 is one password), or to a connection string's next field (";Encrypt=true").
    (
        re.compile(
            rf"(?i)({_PASSWORD_NAME}\s*[:=]\s*)(?!\[REDACTED|\\?[\"']){_NO_SECRET}(?(pw)(?!{_MEASUREMENT}))"
            # (A short one too, when a connection string's next field follows it: "Password=abc;Encrypt=...".)
            r"(?:(?:[^\s;]|;(?![A-Za-z][A-Za-z ]{0,39}=)){4,256}|[^\s;]{1,3}(?=;[A-Za-z][A-Za-z ]{0,39}=))"
        ),
        r"\1[REDACTED]",
    ),
    (
        # (An "&" is part of a value ("Xk9&mQ2" is one password) but where a query string's next name=, an
        # escaped "&amp;" or a shell's "&&" follows.)
        re.compile(
            rf"(?i)({_SECRET_NAME}\\?[\"']?\s*[:=]\s*\\?[\"']?)(?!\[REDACTED){_NO_SECRET}"
            r"((?:[^\s\"'\\,;&]|&(?![\w.-]+=|amp;|&)){4,})"
        ),
        r"\1[REDACTED]",
    ),
)


def redact_secrets(text: str) -> str:
    """Replace common secret shapes in ``text`` with ``[REDACTED ...]`` markers.

    Covers PEM and PGP private keys, Anthropic/OpenAI-style ``sk-`` keys,
    Stripe (``sk_live_``) and webhook keys, Hugging Face (``hf_``), npm and
    GitLab (``glpat-``) tokens, AWS access key ids, GitHub and Slack tokens,
    Slack and Discord webhook URLs, Google API keys, JWTs, bearer, basic and
    ``token`` authorization values (the whole token, quoted or not), passwords
    in URLs (``redis://:pw@`` too) and credentials in their query strings,
    passwords on command lines (``mysql -p``, ``curl -u``, HTTPie's ``-a``,
    Samba's ``-U user%pass``, a login's ``-p`` (docker, podman, helm, oc, az,
    cf), the MongoDB and Cassandra shells' ``-p``, ``sshpass -p``,
    ``redis-cli -a``, ``sqlcmd -P``, the LDAP tools' ``-w``, ``zip -P``,
    ``7z -p``, openssl's ``-k``, ``-K`` and ``pass:``, keytool's and
    jarsigner's ``-storepass`` and ``-keypass``, ``htpasswd -b``, a password
    echoed into ``--password-stdin``, ``ConvertTo-SecureString``, and any
    ``--password X`` or ``--passphrase X``), a password said in prose ("the
    password is ..."), Azure connection-string keys, and assignments to names that say
    secret (``password=``, ``PGPASSWORD=``, ``DB_PASSWORD=``,
    ``aws_secret_access_key =``, ``SECRET_KEY =``, ``api_key:``,
    ``GITHUB_TOKEN=``, ``_authToken=``), a password's quoted value whole. A
    quantity after ``pw`` (``gpu pw: 250W``) is a measurement and stays.

    Args:
        text: Any text.

    Returns:
        The text with each secret replaced.

    Example:
        >>> redact_secrets("curl -H 'Authorization: Bearer abcdef1234567890XYZ' https://bob:hunter22@db.local")
        "curl -H 'Authorization: Bearer [REDACTED TOKEN]' https://bob:[REDACTED]@db.local"
    """
    if not isinstance(text, str):
        msg = f"redact_secrets takes text (a str), not a {type(text).__name__}"
        raise TypeError(msg)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redact_message(message: Message, redactor: Redactor) -> Message:
    """A copy of ``message`` with ``redactor`` applied to all of its text.

    Args:
        message: The message.
        redactor: The redaction function.

    Returns:
        The redacted copy (the original is not changed).
    """
    # An image part's text is its description: its kind, media type and URL,
    # whose user:password@ or token= query redacts like any other text.
    parts = tuple(replace(p, text=apply_redactor(redactor, p.text)) if p.text else p for p in message.parts)
    calls = tuple(ToolCall(c.id, c.name, _redacted_arguments(c.arguments, redactor)) for c in message.tool_calls)
    results = tuple(redact_message(r, redactor) for r in message.results)  # (a user turn's tool_result blocks)
    return replace(message, parts=parts, tool_calls=calls, results=results)


def _redacted_arguments(arguments: str, redactor: Redactor) -> str:
    """A call's JSON arguments redacted value by value, then whole.

    JSON writes a line break as ``\\n``: a rule that reads a command's first
    word after a line break ("mysql -p...") would not see it in the text;
    read whole, a value keeps its key ("password": "...").
    """
    try:
        value = json.loads(arguments)
    except ValueError:
        return apply_redactor(redactor, arguments)
    return apply_redactor(redactor, json.dumps(_redacted_value(value, redactor), ensure_ascii=False))


def _redacted_value(value: object, redactor: Redactor) -> object:
    if isinstance(value, str):
        return apply_redactor(redactor, value)
    if isinstance(value, list):
        return [_redacted_value(item, redactor) for item in value]
    if isinstance(value, dict):
        return {key: _redacted_value(item, redactor) for key, item in value.items()}
    return value


def redact_facts(facts: Sequence[Fact], redactor: Redactor) -> list[Fact]:
    """``facts`` with ``redactor`` applied to their text, key and detail (carried facts are text too).

    Facts an earlier summary recorded before ``redact=`` was set (or under
    another redactor) would otherwise be written into every later summary.
    A value read out on its own (an identifier) has no context left to be
    recognized by: one that the redactor masked inside another fact's text
    ("DB_PASSWORD=Qz8vLm2pRt7") goes too.
    """
    out = [
        replace(
            fact,
            text=apply_redactor(redactor, fact.text),
            key=apply_redactor(redactor, fact.key) if fact.key else fact.key,
            detail=apply_redactor(redactor, fact.detail) if fact.detail else fact.detail,
        )
        for fact in facts
    ]
    changed = [(old.text, new.text) for old, new in zip(facts, out, strict=True) if old.text != new.text]
    return [
        fact for fact in out if not any(fact.text in before and fact.text not in after for before, after in changed)
    ]


def apply_redactor(redactor: Redactor, text: str) -> str:
    """``redactor(text)``; a hook that fails or returns no text is a summary failure.

    Raises:
        SummarizationError: The hook raised (chained to its error) or returned
            something other than a string.
    """
    try:
        result = redactor(text)
    except Exception as exc:
        msg = f"compaction summarisation failed: the redact hook raised {type(exc).__name__}: {exc}"
        raise SummarizationError(msg) from exc
    if not isinstance(result, str):
        msg = f"the redact hook returned {type(result).__name__}, not text; it must return the redacted string"
        raise SummarizationError(f"compaction summarisation failed: {msg}")
    return result
