"""Pure: credentials that only their name announces (`DB_PASS=…`, `"key": "…"`), after gitleaks' generic-api-key."""

from __future__ import annotations

import math
import re
from collections import Counter
from functools import lru_cache

# key=value, key: value, "key": "value", --key value: gitleaks' generic-api-key in its parts — a
# keyword with up to 64 characters glued before it (PGPASSWORD, _authToken) and 20 after it
# (SECRET_KEY_BASE), an assignment, a value. What the name says decides how sure we are:
_KEYWORDS = r"pass|pwd|secret|token|key|auth|cred"
# Every _KEYWORDS match contains one of these. _KV never crosses a line, and most log lines hold
# none of them: `in` on the casefolded text (which, like re's IGNORECASE, takes ſ for s and the
# Kelvin sign for k), first whole, then line by line, skips those for far less than the _KV scan
# costs (an IGNORECASE search for the words took 6 ms on a 64 KiB window, `in` 0.1 ms).
_KV_HINTS = tuple(_KEYWORDS.split("|"))  # the same words, so the two cannot drift apart
# One character of an unquoted value: `\x` escapes; a `;` ends it only before a space or another
# `Name=` (a connection string's next field).
_WORD_CHAR = r"(?:\\.|[^\s'\"\\,;&)}=]|;(?![\s;]|$|[A-Za-z][\w ]{0,40}=))"
_KV = re.compile(
    r"(?<![A-Za-z0-9_.-])(?P<key>(?P<dash>--?)?(?P<name>[A-Za-z0-9_.-]{0,64}?(?i:" + _KEYWORDS + r")[A-Za-z0-9_.-]{0,20}))"
    # `"key": `, `key = `, `key := `, `\"key\": ` (JSON inside a JSON string); `--password hunter2`: only
    # flags take a space.
    r"(?P<sep>(?:\\?['\"])?[ \t]*(?::=|=>|[:=])[ \t]*|(?(dash)[ \t]+|(?!)))"
    # Quoted (an escaped quote does not end it; nor does the end of a line cut the value short), or a
    # word up to an `=` that is not padding (`tokenizer: added_tokens=3` names a key, not a value).
    r"(?:(?P<q>\\?['\"])(?P<qv>(?:(?!(?P=q))(?:\\.|[^\\\n]))*)(?P<qe>(?P=q)|$)"
    rf"|(?P<v>{_WORD_CHAR}++(?:=+(?!{_WORD_CHAR}))?))"
)
# The rest of a credential's word (`password=abc=def`), and a password's further words after `: ` (a
# config's `password: correct horse`) up to the next `key:`.
_REST = re.compile(rf"(?:{_WORD_CHAR}|=)*+")
_MORE = re.compile(r"(?:[ \t]+(?![\w.-]*[:=])[^\s'\",;&)}]+)*+")
# Names that end in one of these hold a credential whatever its value looks like; a gap after the
# word is allowed only for a plain qualifier (DB_PASSWORD_PROD). `pass`, `pwd`, `auth` and the
# `…_key` names stand alone or after a separator or a camelCase hump (DB_PASS, dbAuth, not bypass);
# a bare `key` (kaggle.json, `wandb.login(key=…)`) and every other name leave it to the value.
_STRONG = re.compile(
    r"(?:(?:^|(?<=[_.-])|(?-i:(?<=[a-z0-9])(?=[A-Z])))(?:pass|pwd|auth|creds|credentials?|sshpass|"
    r"(?:private|secret|encryption|signing|access|account|master|session|client|app|service|storage|shared|admin|"
    r"deploy|license|subscription|webhook|hmac|jwt|auth|api|sas)[_.-]?key)"
    r"|password|passwd|passphrase|secret|token|apikey)"
    r"(?:[_.-](?:prod|production|dev|staging|test|live|base|value|raw|plain|b64|base64|hex|v?\d+))?$",
    re.I,
)
_PASSWORD = re.compile(r"(?i)(?:pass|pwd|passwd|password|passphrase)$")
# What a name says it is not: tokenizer vocabulary (pad_token=<pad>), counters, and names of keys
# rather than keys (gitleaks' allow-list: key_id, token_url, public_key, csrf_token…).
_NOT_SECRET = re.compile(
    r"(?i)(?:.*[_.-])?(?:pad|eos|bos|unk|sep|cls|mask|special|start|end|image|audio|video|max|min|num|n|"
    r"total|first|last|next|new|default|placeholder|chat|tool|decoder_start|csrf|xsrf|public|pub|primary|foreign|"
    r"sort|partition|hash|cache|dict|lookup|group|metric|hot)[_.-]?(?:token|key)s?"
    r"|(?:.*[_.-])?(?:key|token|secret|auth|password|credentials?)[_.-]?(?:ids?|names?|types?|size|len|length|"
    r"file|path|dir|url|uri|endpoint|count|dim|env|var|method|mode|alias|version|ring|store)"
)
# Values that are plainly not a credential, whatever the name: on/off words, placeholders for one
# (`${HF_TOKEN}`, `<token>`, `***`), the marker itself.
_CONFIG_WORD = re.compile(
    r"(?i)(?:true|false|yes|no|on|off|ok|none|null|nil|undefined|required|optional|disabled|enabled|unset|empty|"
    r"default|auto|basic|bearer|oauth2?|env|file|prompt|hidden|masked|redacted|x+)"
    r"|\$\{?(?:[A-Z_]+|[a-z_]+)\}?|<[^<>]*>|\[[A-Za-z_|]*\]|[{%].*|\*+"
)
# A name that only looks like a credential's (tokenizer, sort_key, eval_key_accuracy) needs a value
# shaped like one, as gitleaks' generic rule asks: 10 to 150 characters of [\w.=+~-] (so no path,
# no URL), not only letters (a word, an identifier), not a number or a version, and as random as a
# key is (Shannon entropy of 3.5 bits a character, gitleaks' threshold: `step_1200` has 2.9, 32 hex
# digits about 3.8).
_TOKENISH = re.compile(r"(?![A-Za-z_.-]+$)[\w.+~-]{10,150}={0,3}")
_NUMBERISH = re.compile(r"(?i)[-+]?[\d.,_:]*\d[\d.,_:]*(?:e[-+]?\d+)?[a-z%]{0,3}|v?\d+(?:\.\d+)+[\w.+-]*")
_MIN_ENTROPY = 3.5
# `auth: basic`, `auth=hf-cli`: a bare `auth` names a method as often as a credential; a lower-case word is the former.
_METHOD = re.compile(r"[a-z][a-z0-9_.-]*")


def _entropy(text: str) -> float:
    return -sum(n / len(text) * math.log2(n / len(text)) for n in Counter(text).values())


@lru_cache(maxsize=4096)  # a log repeats its names; a hostile line of 500 `key=` costs one look
def _named(name: str) -> bool | None:
    """What a name says: True, it holds a credential; None, it holds none; False, its value decides."""
    if _NOT_SECRET.fullmatch(name):
        return None
    return bool(_STRONG.search(name))


def _is_secret(name: str, value: str, mark: str) -> bool:
    named = _named(name)
    if named is None or not value.strip() or mark in value or _CONFIG_WORD.fullmatch(value):
        return False
    if named:
        return not (name.lower() == "auth" and _METHOD.fullmatch(value))
    return (bool(_TOKENISH.fullmatch(value)) and not _NUMBERISH.fullmatch(value)
            and _entropy(value) >= _MIN_ENTROPY)


def key_values(text: str, mark: str) -> str:
    """Each value of a credential's name replaced by `mark`."""
    folded = text.casefold()
    if not any(hint in folded for hint in _KV_HINTS):
        return text
    # casefold() never makes or removes a newline: the lines pair up.
    return "\n".join(_kv_line(line, mark) if any(hint in low for hint in _KV_HINTS) else line
                      for line, low in zip(text.split("\n"), folded.split("\n")))


def _kv_line(line: str, mark: str) -> str:
    """Each credential's value replaced. A value that is none is read again as text (it may name a key
    itself: `tokenizer: hf_token=…`); the scan moves on by at least a key each time, so it is linear."""
    out, pos = [], 0
    while (m := _KV.search(line, pos)) is not None:
        name, start, end = m["name"], m.end("sep"), m.end()
        if m["q"] is not None:
            value, shown = m["qv"], f"{m['q']}{mark}{m['qe']}"
        else:
            if _named(name):
                end = _REST.match(line, end).end()
                if ":" in m["sep"] and _PASSWORD.search(name):  # `password: correct horse battery`
                    end = _MORE.match(line, end).end()
            value, shown = line[start:end], mark
        if _is_secret(name, value, mark):
            out.append(line[pos:start] + shown)
            pos = end
        else:
            out.append(line[pos:start])
            pos = start
    out.append(line[pos:])
    return "".join(out)
