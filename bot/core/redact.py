"""Making log text safe to show: ANSI/control stripping, secret redaction, Slack escaping."""

from __future__ import annotations

import re
from typing import Iterable, NamedTuple

from bot.core.secret_names import key_values

MARK = "[redacted]"

# CSI (colours, cursor moves), OSC (titles, hyperlinks; ended by BEL or ST, or cut off by the
# end of the text), DCS/SOS/PM/APC strings, then any other two-byte (or nF) escape; a lone
# trailing ESC goes too. The 8-bit C1 forms of CSI/OSC are stripped whole, not just their
# introducer, so no "[32m" debris is left behind.
_OSC = r"(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
_ANSI = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    rf"|{_OSC}"
    r"|(?:\x1b[PX^_]|[\x90\x98\x9e\x9f])[^\x1b\x9c]*(?:\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
)
# C0 except \t and \n, DEL, C1; bidi overrides/isolates and marks, which can make a line display
# something other than what it says (the "Trojan Source" trick); and the line and paragraph
# separators, which break a line where a terminal or an editor shows none.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# What printable() deletes: colours (SGR) and OSC strings (titles, hyperlinks) are zero-width.
_ZERO_WIDTH = re.compile(rf"(?:\x1b\[|\x9b)[0-9;:]*m|{_OSC}")
# What it turns into one space: every other escape (a cursor move can display as a space) and
# control character. Deleting them could glue a key to its value (`--password\x07hunter2`) and
# defeat key=value redaction; a space keeps apart what the terminal showed apart.
_GAP = re.compile(f"(?:{_ANSI.pattern}|{_CONTROL.pattern})+")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def printable(text: str) -> str:
    """Colours and OSC strings deleted; other escapes and control characters other than tab and
    newline become a space, a run of them one space (U+FFFD stays)."""
    if text.isprintable():  # the common line: no escape, no control character; skip two regexes
        return text
    return _GAP.sub(" ", _ZERO_WIDTH.sub("", text))


class Rule(NamedTuple):
    """A credential with a recognisable shape: `keep` stays visible, so a reader still knows what
    leaked (`hf_[redacted]`); `secret` is replaced. Plain regexes, no capturing groups. A rule with
    `keywords` (gitleaks' prefilter) runs only on text holding one of them, lower-cased: a rule that
    starts with no literal costs every position of every text otherwise."""

    name: str
    keep: str
    secret: str
    keywords: tuple[str, ...] = ()


# A command-line argument: shell-quoted, or a word.
_ARG = r"(?:'[^'\n]*'|\"(?:[^\"\\\n]|\\.)*\"|[^\s'\"]+)"

# Prefixes and lengths as gitleaks' default rules have them (lengths as lower bounds where a
# provider may lengthen its tokens), then credentials announced by their context.
RULES = (
    Rule("slack-config-token", r"xoxe\.xox[a-z]-", r"[A-Za-z0-9-]{8,}"),
    Rule("slack-token", r"xox[a-z]-", r"[A-Za-z0-9-]{8,}"),
    Rule("slack-app-token", r"xapp-", r"[A-Za-z0-9-]{8,}"),
    Rule("slack-webhook", r"hooks\.slack\.com/(?:services|workflows|triggers)/", r"[A-Za-z0-9/_-]+"),
    Rule("github-token", r"gh[pousr]_", r"[A-Za-z0-9]{30,}"),
    Rule("github-fine-grained-pat", r"github_pat_", r"[A-Za-z0-9_]{20,}"),
    Rule("gitlab-token", r"gl(?:pat|ptt|rt|dt|ft|imt|agent|soat|cbt|oas)-", r"[A-Za-z0-9_.-]{20,}"),
    Rule("huggingface-token", r"hf_", r"[A-Za-z0-9]{30,}"),
    Rule("huggingface-org-token", r"api_org_", r"[A-Za-z0-9]{30,}"),
    Rule("aws-access-key-id", r"(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)", r"[A-Z0-9]{16}"),
    Rule("google-api-key", r"AIza", r"[A-Za-z0-9_-]{35}"),
    Rule("google-oauth-access-token", r"ya29\.", r"[A-Za-z0-9_-]{20,}"),
    Rule("google-oauth-client-secret", r"GOCSPX-", r"[A-Za-z0-9_-]{28}"),
    Rule("anthropic-key", r"sk-ant-", r"[A-Za-z0-9_-]{20,}"),
    Rule("openai-key", r"sk-(?:proj-|svcacct-|admin-)?", r"[A-Za-z0-9_-]{20,}"),
    Rule("stripe-key", r"(?:sk|rk)_(?:live|test|prod)_", r"[A-Za-z0-9]{10,}"),
    Rule("npm-token", r"npm_", r"[A-Za-z0-9]{36}"),
    Rule("pypi-token", r"pypi-", r"AgE(?:IcHlwaS5vcmc|NdGVzdC5weXBpLm9yZw)[A-Za-z0-9_-]{50,}"),
    Rule("sendgrid-key", r"SG\.", r"[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}"),
    Rule("twilio-api-key", r"SK", r"[0-9a-fA-F]{32}"),
    Rule("digitalocean-token", r"do[opr]_v1_", r"[a-f0-9]{64}"),
    Rule("databricks-token", r"dapi", r"[a-f0-9]{32}(?:-\d)?"),
    Rule("shopify-token", r"shp(?:at|ca|pa|ss)_", r"[a-fA-F0-9]{32}"),
    Rule("groq-key", r"gsk_", r"[A-Za-z0-9]{48,}"),
    Rule("replicate-token", r"r8_", r"[A-Za-z0-9]{30,}"),
    Rule("nvidia-api-key", r"nvapi-", r"[A-Za-z0-9_-]{60,}"),
    Rule("xai-key", r"xai-", r"[A-Za-z0-9]{70,}"),
    Rule("perplexity-key", r"pplx-", r"[A-Za-z0-9]{40,}"),
    Rule("vault-token", r"hv[sb]\.", r"[A-Za-z0-9_-]{24,}"),
    Rule("linear-key", r"lin_api_", r"[A-Za-z0-9]{40}"),
    Rule("postman-key", r"PMAK-", r"[a-f0-9]{24}-[a-f0-9]{34}"),
    Rule("pulumi-token", r"pul-", r"[a-f0-9]{40}"),
    Rule("doppler-token", r"dp\.(?:pt|st|sa|ct|scim|audit)\.", r"[A-Za-z0-9]{40,}"),
    Rule("grafana-service-account-token", r"glsa_", r"[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}"),
    Rule("grafana-cloud-token", r"glc_", r"[A-Za-z0-9+/]{32,}={0,2}"),
    Rule("age-secret-key", r"AGE-SECRET-KEY-1", r"[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}"),
    Rule("discord-webhook", r"discord(?:app)?\.com/api/webhooks/", r"[0-9]+/[A-Za-z0-9_-]+"),
    Rule("jwt", r"eyJ", r"[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]*"),
    Rule("authorization-header", r"(?i:authorization)[ \t]*[:=][ \t]*['\"]?[ \t]*(?i:bearer|basic|token|bot)[ \t]+",
         r"[^\s'\",;]+"),
    Rule("bearer-token", r"(?i:bearer)[ \t]+(?=[A-Za-z0-9._~+/=-]{12,})", r"[^\s'\",;]+"),
    Rule("wandb-login", r"(?i:wandb)[ \t]+login(?>(?:[ \t]+--?[\w-]+(?:=\S+)?)*)[ \t]+", r"[A-Za-z0-9_-]{32,}"),
    Rule("stripe-webhook-secret", r"whsec_", r"[A-Za-z0-9]{24,}", ("whsec_",)),
    Rule("wandb-local-key", r"local-", r"[A-Za-z0-9]{40,}", ("local-",)),  # a W&B server's API key
    # No prefix to keep: `abc8Q~` is already part of the secret (gitleaks' azure-ad-client-secret).
    Rule("azure-ad-client-secret", r"", r"[a-zA-Z0-9_~.]{3}\dQ~[a-zA-Z0-9_~.-]{31,34}", ("q~",)),
    Rule("azure-sas-signature", r"(?<=[?&])sig=", r"[A-Za-z0-9%+/=_-]{16,}", ("sig=",)),
    Rule("aws-presigned-signature", r"(?i:x-amz-signature)=", r"[0-9a-fA-F]{64}", ("x-amz-signature",)),
    # Credentials that only a command line's shape announces: `mysql -pPW` (glued: `-p PW` prompts and
    # names a database), `sshpass -p PW`, a .netrc's `machine H login U password PW`, or its lone
    # `password PW` line. Values quoted as a shell quotes them.
    Rule("mysql-password", r"(?:mysql(?:dump|admin|import|check|sh)?|mariadb)(?:[ \t]+\S+)*?[ \t]+-p", _ARG,
         ("mysql", "mariadb")),
    Rule("sshpass-password", r"sshpass(?:[ \t]+-[a-oq-zA-Z]\S*)*[ \t]+-p[ \t]*", _ARG, ("sshpass",)),
    Rule("netrc-password", r"machine[ \t]+\S+(?:[ \t]+(?:login|account)[ \t]+\S+)*[ \t]+password[ \t]+", r"\S+",
         ("machine",)),
    Rule("netrc-password-line", r"(?m:^)[ \t]*password[ \t]+", r"\S+(?=[ \t]*(?:\r?\n|\Z))", ("password",)),
    # A URL's password may hold `/` and its user may be empty (`redis://:pw@h`); a port is no password
    # (`http://host:8080/a@b`).
    Rule("url-password", r"(?<![a-z0-9+.-])[a-z][a-z0-9+.-]{0,30}://[^\s:/@]*:",
         r"(?!\d{1,5}(?:[/@]|$))(?:(?!://)[^\s@])++(?=@)",
         ("://",)),
)
# The rules without keywords in one pass. No rule starts inside a word (a lookbehind, not \b, which would miss a
# token glued to an underscore: `MY_hf_…`), nor ends inside one. Written without capturing
# groups, the alternation runs ~7x faster (re skips a branch on its first literal); which rule
# matched is found afterwards, on the rare match.
_EDGE_L, _EDGE_R = r"(?<![A-Za-z0-9])", r"(?![A-Za-z0-9])"
_SHAPED = re.compile(_EDGE_L + "(?:" + "|".join(r.keep + r.secret for r in RULES if not r.keywords) + ")" + _EDGE_R)
_EACH = [re.compile(f"(?P<keep>{r.keep}){r.secret}{_EDGE_R}") for r in RULES if not r.keywords]
# The prefiltered rules, each on its own after the others (what they keep may hold a token already redacted).
_GATED = [(r.keywords, re.compile(f"{_EDGE_L}(?P<keep>{r.keep}){r.secret}{_EDGE_R}")) for r in RULES if r.keywords]
# A bare AWS secret access key has no prefix: 40 base64 characters on the line of its key id.
_AWS_ID_REDACTED = re.compile(r"(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)" + re.escape(MARK))
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{40}(?![A-Za-z0-9+/=])")

# Private-key blocks span lines, so they are matched over the whole text (as gitleaks and
# trufflehog do): BEGIN, then the body, then END or the end of what we have. The body is lines
# of base64 (or PEM headers), which may carry torchrun prefixes or be joined by an escaped \n
# inside a JSON string (a GCP service-account file); on BEGIN's own line, base64 words separated
# by spaces (`echo $KEY` turns newlines into spaces). Whole lines only, so a header quoted in an
# error message does not swallow the lines after it. A body with no BEGIN (the window starts
# inside the block) goes too, up to its END line.
_BREAK = r"(?:\r?\n|(?:\\r)?\\n)"
_RANK = r"(?:[ \t]*(?:\[(?:rank|default)\d+\]:|\[\d+,\d+\]<std(?:out|err)>:))*+[ \t]*+"
_B64 = r"[A-Za-z0-9+/=]++"
_PEM_HEADER = r"(?:Proc-Type|DEK-Info|Comment|Version|Hash):[^\n\\]*+"
_PEM_LINE = rf"(?:{_BREAK}{_RANK})++(?:{_B64}|{_PEM_HEADER})[ \t]*+(?={_BREAK}|\Z|-----END)"
_END = r"-----END[ A-Z0-9_]{0,100}PRIVATE KEY(?: BLOCK)?-----"
_PEM = re.compile(
    rf"(?P<p>(?>-----BEGIN[ A-Z0-9_]{{0,100}}PRIVATE KEY(?: BLOCK)?-----))(?!{re.escape(MARK)})"
    rf"(?:[ \t]*+{_B64})*+(?:{_PEM_LINE})*+(?:[ \t]*+(?:{_BREAK}{_RANK})*+{_END})?"
    # Runs of base64 lines are taken whole, END or not, so that each is scanned once (linear).
    rf"|(?m:^)(?P<p2>{_RANK}){_B64}(?:{_BREAK}{_RANK}{_B64})*+(?P<end>(?={_BREAK}{_RANK}{_END}))?"
)
def _pem(m: re.Match[str]) -> str:
    if m["p"] is not None:
        return m["p"] + MARK
    return m["p2"] + MARK if m["end"] is not None else m[0]  # no BEGIN: a key's body if END follows


def _shaped(m: re.Match[str]) -> str:
    # The first rule that matches here is the branch the alternation took. What it keeps may
    # hold a token of its own (`https://ghp_…:x-oauth-basic@`): redacted too, it is shorter.
    keep = next(mm["keep"] for rx in _EACH if (mm := rx.match(m.string, m.start())))
    return _SHAPED.sub(_shaped, keep) + MARK


def _gated(text: str) -> str:
    """The prefiltered rules, on the lines that hold one of their keywords (none spans lines)."""
    lowered = text.lower()
    wanted = [(keywords, rx) for keywords, rx in _GATED if any(k in lowered for k in keywords)]
    if not wanted:
        return text
    lines = text.split("\n")
    for i, low in enumerate(lowered.split("\n")):  # lower() keeps the newlines where they were
        for keywords, rx in wanted:
            if any(k in low for k in keywords):
                lines[i] = rx.sub(_kept, lines[i])
    return "\n".join(lines)


def _kept(m: re.Match[str]) -> str:
    return m["keep"] + MARK


def _aws_secrets(text: str) -> str:
    lines = text.split("\n")
    return "\n".join(_AWS_SECRET.sub(MARK, line) if _AWS_ID_REDACTED.search(line) else line for line in lines)


def redact_secrets(text: str) -> str:
    """Replace credentials with a marker that keeps a recognisable prefix (`hf_[redacted]`)."""
    if "PRIVATE KEY" in text:
        text = _PEM.sub(_pem, text)
    text = _gated(_SHAPED.sub(_shaped, text))
    if _AWS_ID_REDACTED.search(text):
        text = _aws_secrets(text)
    return key_values(text, MARK)


def redact_lines(lines: Iterable[str]) -> list[str]:
    """Redact lines shown together as one text, so that a secret spanning lines (a private-key
    block) goes whole. A redacted block leaves one line where it had several."""
    lines = list(lines)
    return redact_secrets("\n".join(lines)).split("\n") if lines else []


def slack_escape(text: str) -> str:
    """Slack's rule: only &, < and > are special; escaping them defuses <!channel> and <@U1>."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def clean_line(text: str) -> str:
    """What the CLI shows for a log line: printable, with secrets redacted."""
    return redact_secrets(printable(text))
