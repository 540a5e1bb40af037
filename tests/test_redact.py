"""ANSI stripping, control characters, secret redaction and Slack escaping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.builders import KEY_BODY
from bot.redact import MARK, clean_line, printable, redact_lines, redact_secrets, slack_escape, strip_ansi

ANSI = [
    ("\x1b[32mstep=1\x1b[0m", "step=1"),
    ("\x1b[1;31;40mred\x1b[39;49m", "red"),
    ("\x1b[38;5;208morange\x1b[38;2;1;2;3mrgb\x1b[m", "orangergb"),
    ("a\x1b[2Kb\x1b[1Ac\x1b[?25ld", "abcd"),  # erase line, cursor up, hide cursor
    ("\x1b]0;title\x07text", "text"),  # OSC ended by BEL
    ("\x1b]8;;https://x.y\x1b\\link\x1b]8;;\x1b\\", "link"),  # OSC 8 hyperlink, ended by ST
    ("\x1b(Bplain\x1b7\x1b8\x1b=", "plain"),  # charset, save/restore cursor, keypad
    ("\x9b31mc1 csi", "c1 csi"),
    ("cut off \x1b[3", "cut off "),
    ("trailing escape \x1b", "trailing escape "),
    ("no codes at all: 45%|██| [00:01<00:02]", "no codes at all: 45%|██| [00:01<00:02]"),
]


@pytest.mark.parametrize(("raw", "expected"), ANSI)
def test_strip_ansi(raw: str, expected: str) -> None:
    assert strip_ansi(raw) == expected


PRINTABLE = [
    ("a\x00b", "a b"),
    ("tab\tand\nnewline", "tab\tand\nnewline"),
    ("bar 10%\rbar 20%", "bar 10% bar 20%"),
    ("bell\x07 del\x7f c1\x85", "bell  del  c1 "),
    ("\x1b[31mred\x1b[0m\x08", "red "),
    ("no\x1b[1;32mgap\x1b[m here", "nogap here"),  # colours are zero-width: deleted, never a space
    ("\x1b]8;;https://x.y\x1b\\link\x1b]8;;\x1b\\ text", "link text"),  # so are OSC titles and hyperlinks
    ("a\x1b[2Kb\x1b[1Cc\x1b[?25ld", "a b c d"),  # other escapes may move the cursor: a space
    ("one\x00\x00\x07\x1b[1Ctwo", "one two"),  # a run of them is one space
    ("bad bytes \ufffd\ufffd kept", "bad bytes \ufffd\ufffd kept"),
    ("unicode ✓ █▌ ok", "unicode ✓ █▌ ok"),
    ("bidi \u202eevil\u202c", "bidi  evil "),
]


@pytest.mark.parametrize(("raw", "expected"), PRINTABLE)
def test_printable(raw: str, expected: str) -> None:
    assert printable(raw) == expected


HF = "hf_" + "a1B2c3D4e5" * 3 + "xyz"
GHP = "ghp_" + "A" * 36
SECRETS = [
    (f"export SLACK_BOT_TOKEN=xoxb-123456789012-1234567890123-{'a' * 24}", "export SLACK_BOT_TOKEN=xoxb-[redacted]"),
    ("token xoxp-1111-2222-3333-abcdef in text", "token xoxp-[redacted] in text"),
    ("app xapp-1-A0123456789-1234567890123-abcdef0123", "app xapp-[redacted]"),
    ("post https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX done",
     "post https://hooks.slack.com/services/[redacted] done"),
    (f"huggingface-cli login --token {HF}", "huggingface-cli login --token hf_[redacted]"),
    (f"using {HF} for download", "using hf_[redacted] for download"),
    ("WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567", "WANDB_API_KEY=[redacted]"),
    ("wandb login 0123456789abcdef0123456789abcdef01234567", "wandb login [redacted]"),
    ("wandb login --relogin 0123456789abcdef0123456789abcdef01234567", "wandb login --relogin [redacted]"),
    ("key id AKIAIOSFODNN7EXAMPLE region", "key id AKIA[redacted] region"),
    ("session ASIAY34FZKBOKMUTVV7A", "session ASIA[redacted]"),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws_secret_access_key = [redacted]"),
    ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "AWS_SECRET_ACCESS_KEY=[redacted]"),
    (f"git clone https://{GHP}@github.com/org/repo", "git clone https://ghp_[redacted]@github.com/org/repo"),
    ("GITHUB_TOKEN=gho_" + "b" * 36, "GITHUB_TOKEN=gho_[redacted]"),
    ("pat github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "pat github_pat_[redacted]"),
    ("curl -H 'Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig'", "curl -H 'Authorization: Bearer [redacted]'"),
    ("authorization: token abcdef123456", "authorization: token [redacted]"),
    ("password=hunter2", "password=[redacted]"),
    ("db passwd: s3cr3t!", "db passwd: [redacted]"),
    ("--password hunter2 --epochs 3", "--password [redacted] --epochs 3"),
    ("--hf-token=abc123 --lr 3e-4", "--hf-token=[redacted] --lr 3e-4"),
    ('{"token": "abc", "steps": 10}', '{"token": "[redacted]", "steps": 10}'),
    ("{'api_key': 'sk-live-0123', 'model': 'llama'}", "{'api_key': '[redacted]', 'model': 'llama'}"),
    ("Secret=top APIKEY: k1 Access_Key=k2", "Secret=[redacted] APIKEY: [redacted] Access_Key=[redacted]"),
    ("SLACK_SIGNING_SECRET=8f742231b10e8888abcd99yyyzzz85a5", "SLACK_SIGNING_SECRET=[redacted]"),
    ("https://user:pa55word@pypi.internal/simple", "https://user:[redacted]@pypi.internal/simple"),
    ("url?token=abc123&page=2", "url?token=[redacted]&page=2"),
    ("OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwx", "OPENAI_API_KEY=sk-proj-[redacted]"),
    ("-----BEGIN RSA PRIVATE KEY-----MIIEowIBAAKCAQEA", "-----BEGIN RSA PRIVATE KEY-----[redacted]"),
]
ORDINARY = [
    "step=10 loss=2.3 tok/s=41000",
    "tokens=1024 max_new_tokens=256 num_tokens: 12",
    "{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.12}",
    "Setting `pad_token_id` to `eos_token_id`:2 for open-end generation.",
    "pad_token=<pad> eos_token=</s>",
    "Loading weights:  15%|█▌        | 131/851 [00:00<00:03, 199.62it/s]",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 372.53 GiB.",
    "  Total optimization steps = 1,000",
    "save_steps=500 secrets_dir unset",
    "hf_hub_download(repo_id='gpt2') checkpoint-1000",
    "The password field is empty",
]


@pytest.mark.parametrize(("raw", "expected"), SECRETS)
def test_redact_secrets(raw: str, expected: str) -> None:
    assert redact_secrets(raw) == expected


@pytest.mark.parametrize("line", ORDINARY)
def test_redact_leaves_training_lines_alone(line: str) -> None:
    assert redact_secrets(line) == line


# -- private-key blocks span lines: redacted over the whole text ---------------------------

BODY = KEY_BODY
BEFORE, AFTER = "step=1 loss=2.0 tok/s=900", "step=2 loss=1.9 tok/s=905"
KINDS = ["RSA PRIVATE KEY", "EC PRIVATE KEY", "DSA PRIVATE KEY", "OPENSSH PRIVATE KEY", "ENCRYPTED PRIVATE KEY",
         "PRIVATE KEY", "PGP PRIVATE KEY BLOCK"]


def assert_no_key_material(out: list[str]) -> None:
    text = "\n".join(out)
    for line in BODY:
        assert line[:8] not in text and line[-8:] not in text, out


@pytest.mark.parametrize("kind", KINDS)
def test_a_key_block_goes_whole(kind: str) -> None:
    lines = [BEFORE, f"-----BEGIN {kind}-----", *BODY, f"-----END {kind}-----", AFTER]
    assert redact_lines(lines) == [BEFORE, f"-----BEGIN {kind}-----{MARK}", AFTER]


def test_a_legacy_encrypted_block_with_headers_goes_whole() -> None:
    lines = [BEFORE, "-----BEGIN RSA PRIVATE KEY-----", "Proc-Type: 4,ENCRYPTED",
             "DEK-Info: AES-128-CBC,3F17F5316E2BAC89E1F5A3C2D4B6E8F0", "", *BODY, "-----END RSA PRIVATE KEY-----", AFTER]
    assert redact_lines(lines) == [BEFORE, f"-----BEGIN RSA PRIVATE KEY-----{MARK}", AFTER]


def test_a_block_cut_off_by_the_window_goes_to_the_end() -> None:
    lines = [BEFORE, "-----BEGIN OPENSSH PRIVATE KEY-----", *BODY[:2], BODY[2][:5]]
    assert redact_lines(lines) == [BEFORE, f"-----BEGIN OPENSSH PRIVATE KEY-----{MARK}"]


def test_a_key_in_a_json_string_with_escaped_newlines() -> None:
    key = "-----BEGIN PRIVATE KEY-----\\n" + "\\n".join(BODY) + "\\n-----END PRIVATE KEY-----\\n"
    lines = ["{", '  "type": "service_account",', f'  "private_key": "{key}",', '  "client_id": "1234567890"', "}"]
    out = redact_lines(lines)
    assert out[:2] == lines[:2] and out[3:] == lines[3:]
    assert out[2] == f'  "private_key": "-----BEGIN PRIVATE KEY-----{MARK}\\n",'
    assert redact_secrets(lines[2]) == out[2]  # on one line too


def test_a_block_whose_lines_carry_rank_prefixes() -> None:
    lines = [f"[rank0]:{x}" for x in [BEFORE, "-----BEGIN EC PRIVATE KEY-----", *BODY, "-----END EC PRIVATE KEY-----", AFTER]]
    assert redact_lines(lines) == [f"[rank0]:{BEFORE}", f"[rank0]:-----BEGIN EC PRIVATE KEY-----{MARK}", f"[rank0]:{AFTER}"]


@pytest.mark.parametrize("prefix", ["", "[rank1]:", "[default0]: "])
def test_a_window_that_starts_inside_a_block(prefix: str) -> None:
    """The BEGIN line fell before the window: the body lines before an END line go too."""
    lines = [prefix + x for x in [*BODY, "-----END RSA PRIVATE KEY-----", AFTER]]
    out = redact_lines(lines)
    assert out == [prefix + MARK, prefix + "-----END RSA PRIVATE KEY-----", prefix + AFTER]
    assert_no_key_material(out)


def test_a_block_interrupted_by_another_ranks_line_still_goes() -> None:
    lines = ["-----BEGIN RSA PRIVATE KEY-----", BODY[0], "[rank1]:step=7 loss=2.0", *BODY[1:], "-----END RSA PRIVATE KEY-----"]
    out = redact_lines(lines)
    assert "[rank1]:step=7 loss=2.0" in out
    assert_no_key_material(out)


def test_a_header_quoted_in_an_error_does_not_swallow_the_lines_after_it() -> None:
    lines = ["ValueError: expected '-----BEGIN PRIVATE KEY-----' in key.pem", AFTER]
    assert redact_lines(lines) == [f"ValueError: expected '-----BEGIN PRIVATE KEY-----{MARK}' in key.pem", AFTER]


def test_redact_lines_keeps_ordinary_lines_as_they_are() -> None:
    assert redact_lines([]) == []
    assert redact_lines(["", BEFORE, "", AFTER, ""]) == ["", BEFORE, "", AFTER, ""]
    assert redact_lines([BEFORE, "password=hunter2"]) == [BEFORE, "password=[redacted]"]


ESCAPES = [
    ("<!channel> deploy", "&lt;!channel&gt; deploy"),
    ("<@U123> & <#C1|x>", "&lt;@U123&gt; &amp; &lt;#C1|x&gt;"),
    ("a &amp; b", "a &amp;amp; b"),
    ("loss < 2 > 1", "loss &lt; 2 &gt; 1"),
    ("*bold* _it_ `code`", "*bold* _it_ `code`"),
]


@pytest.mark.parametrize(("raw", "expected"), ESCAPES)
def test_slack_escape(raw: str, expected: str) -> None:
    assert slack_escape(raw) == expected


def test_clean_line_strips_then_redacts() -> None:
    assert clean_line("\x1b[33mtoken=\x1b[0mabc\x00 step=1\r") == "token=[redacted]  step=1 "


# A control character deleted outright would glue a key to its value and defeat key=value
# redaction; one that becomes a space keeps them apart, as the terminal showed them.
GLUED = [
    ("--password\x07hunter2", "--password [redacted]"),
    ("password=\x00hunter2", "password= [redacted]"),
    ("token\x0b=\x0bsecret", "token = [redacted]"),
    ("API_KEY:\x1b[1Cabcdef123456", "API_KEY: [redacted]"),  # cursor forward: displays as a space
    ("--hf-token\x9b1Cabc123", "--hf-token [redacted]"),  # the same move, as an 8-bit C1 CSI
    ("--password\u2066hunter2", "--password [redacted]"),  # a bidi isolate is no glue either
]


@pytest.mark.parametrize(("raw", "expected"), GLUED)
def test_controls_cannot_glue_a_key_to_its_value(raw: str, expected: str) -> None:
    assert clean_line(raw) == expected


secretish = st.lists(
    st.sampled_from(["password", "token", "=", ":", " ", "'", '"', "--", "hf_", "xoxb-", "AKIA", "ghp_", "[redacted]",
                     "Bearer ", "Authorization: ", "wandb login ", "abcdefghij" * 4, "0123456789", "-", "_", "@", "://",
                     "-----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY-----", "\n", "\\n", "[rank0]:",
                     "MIIEowIBAAKCAQEA", "Proc-Type: 4,ENCRYPTED"]),
    max_size=20,
).map("".join)


@given(st.text())
def test_functions_never_raise(text: str) -> None:
    for f in (strip_ansi, printable, redact_secrets, slack_escape, clean_line):
        assert isinstance(f(text), str)
    assert isinstance(redact_lines(text.split("\n")), list)


@given(st.one_of(st.text(), secretish))
def test_redaction_is_idempotent(text: str) -> None:
    once = redact_secrets(text)
    assert redact_secrets(once) == once


@given(st.text())
def test_slack_escape_leaves_no_angle_brackets(text: str) -> None:
    out = slack_escape(text)
    assert "<" not in out and ">" not in out


@given(st.text())
def test_printable_leaves_no_controls(text: str) -> None:
    out = printable(text)
    assert all(c in "\t\n" or (ord(c) >= 0x20 and not 0x7F <= ord(c) <= 0x9F) for c in out)
