"""ANSI stripping, control characters, secret redaction and Slack escaping."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.builders import KEY_BODY
from bot.core.redact import MARK, RULES, clean_line, printable, redact_lines, redact_secrets, slack_escape, strip_ansi

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
    ("DefaultEndpointsProtocol=https;AccountName=ml;AccountKey=Zm9vYmFy+/==;EndpointSuffix=core.windows.net",
     "DefaultEndpointsProtocol=https;AccountName=ml;AccountKey=[redacted];EndpointSuffix=core.windows.net"),
    ("https://user:pa55word@pypi.internal/simple", "https://user:[redacted]@pypi.internal/simple"),
    (f"git clone https://{GHP}:x-oauth-basic@github.com/o/r", "git clone https://ghp_[redacted]:[redacted]@github.com/o/r"),
    ("url?token=abc123&page=2", "url?token=[redacted]&page=2"),
    ("\u017fecret=hunter2 to\u212aen=abc", "\u017fecret=[redacted] to\u212aen=[redacted]"),  # what re's IGNORECASE takes for s, k
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


# One row per rule in bot.core.redact.RULES: (rule, a line with the secret, what is left of it, a
# near miss from ordinary text that must stay as it is). Made-up tokens of the right shape.
A36, H32, H64 = "aB3dE6gH9jK2mN5pQ8rS1tV4wX7yZ0bC3dE6", "0123456789abcdef" * 2, "0123456789abcdef" * 4
B64_40 = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
AZ = "Abc8Q~" + "dEf.gHi_jKl~mNo-pQrStUvWxYz0123456"[:34]  # an Azure AD client secret's shape
SAS = "Zm9vYmFyYmF6cXV4%2Bcm9vdA%3D%3D"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
RULE_CASES = [
    ("slack-config-token", "refresh xoxe.xoxp-1-" + A36, "refresh xoxe.xoxp-[redacted]", "xoxe.xoxp-1 in the docs"),
    ("slack-token", "SLACK_BOT=xoxb-123456789012-" + A36, "SLACK_BOT=xoxb-[redacted]", "a xoxb-token goes here"),
    ("slack-app-token", "app xapp-1-A0123456789-" + A36, "app xapp-[redacted]", "use an xapp-1 token"),
    ("slack-webhook", "post https://hooks.slack.com/services/T000/B000/" + A36[:24], "post https://hooks.slack.com/services/[redacted]",
     "see https://hooks.slack.com/docs"),
    ("github-token", "remote ghs_" + A36, "remote ghs_[redacted]", "ghp_" + A36[:20] + " too short"),
    ("github-fine-grained-pat", "pat github_pat_11ABCDEFG0_" + A36, "pat github_pat_[redacted]", "github_pat_short"),
    ("gitlab-token", "CI glpat-" + A36[:20], "CI glpat-[redacted]", "glpat-1234 is not one"),
    ("huggingface-token", "using hf_" + A36, "using hf_[redacted]", "hf_hub_download(repo_id='meta-llama/Llama-3.1-8B')"),
    ("huggingface-org-token", "org api_org_" + A36, "org api_org_[redacted]", "api_org_name=research"),
    ("aws-access-key-id", "key id AKIAIOSFODNN7EXAMPLE region", "key id AKIA[redacted] region", "AKIAIOSFODNN7EXAMPLEX has 17"),
    ("google-api-key", "maps AIza" + A36[:35], "maps AIza[redacted]", "AIzaSy is how they start"),
    ("google-oauth-access-token", "tok ya29." + A36, "tok ya29.[redacted]", "ya29.short"),
    ("google-oauth-client-secret", "GOCSPX-" + A36[:28], "GOCSPX-[redacted]", "GOCSPX-short"),
    ("anthropic-key", "ANTHROPIC_KEY sk-ant-api03-" + A36, "ANTHROPIC_KEY sk-ant-[redacted]", "sk-ant-short"),
    ("openai-key", "OPENAI sk-proj-" + A36, "OPENAI sk-proj-[redacted]", "task-" + A36),
    ("stripe-key", "pay sk_live_" + A36, "pay sk_live_[redacted]", "mask_test_" + A36),
    ("npm-token", "//registry.npmjs.org/:_authToken=npm_" + A36, "//registry.npmjs.org/:_authToken=npm_[redacted]",
     "npm_config_cache=/root/.npm"),
    ("pypi-token", "upload pypi-AgEIcHlwaS5vcmc" + A36 * 2, "upload pypi-[redacted]", "pypi-AgEIcHlwaS5vcmc" + A36[:10]),
    ("sendgrid-key", "mail SG." + A36[:22] + "." + (A36 * 2)[:43], "mail SG.[redacted]", "SG.1234.5678"),
    ("twilio-api-key", "sms SK" + H32, "sms SK[redacted]", "TASK" + H32),
    ("digitalocean-token", "do dop_v1_" + H64, "do dop_v1_[redacted]", "doo_v1_" + H32),
    ("databricks-token", "db dapi" + H32, "db dapi[redacted]", "dapi_version=2.0 dapi" + H32[:31]),
    ("shopify-token", "shop shpat_" + H32, "shop shpat_[redacted]", "shpat_" + H32[:20]),
    ("groq-key", "GROQ gsk_" + A36 + A36[:16], "GROQ gsk_[redacted]", "gsk_short"),
    ("replicate-token", "r8_" + A36, "r8_[redacted]", "lr8_" + A36),
    ("nvidia-api-key", "ngc nvapi-" + A36 * 2, "ngc nvapi-[redacted]", "nvapi-short"),
    ("xai-key", "xai-" + A36 * 3, "xai-[redacted]", "model=xai-grok-2"),
    ("perplexity-key", "pplx-" + A36 + A36[:12], "pplx-[redacted]", "model=pplx-7b-online"),
    ("vault-token", "VAULT hvs." + A36, "VAULT hvs.[redacted]", "hvs.short"),
    ("linear-key", "lin_api_" + A36 + "abcd", "lin_api_[redacted]", "lin_api_short"),
    ("postman-key", "PMAK-" + H32[:24] + "-" + H32 + "ab", "PMAK-[redacted]", "PMAK-1234"),
    ("pulumi-token", "pul-" + H32 + H32[:8], "pul-[redacted]", "pul-abc"),
    ("doppler-token", "dp.st." + A36 + "abcdefg", "dp.st.[redacted]", "dp.st.dev"),
    ("grafana-service-account-token", "glsa_" + A36[:32] + "_" + H32[:8], "glsa_[redacted]", "glsa_short"),
    ("grafana-cloud-token", "glc_" + A36 + "==", "glc_[redacted]", "glc_short"),
    ("age-secret-key", "AGE-SECRET-KEY-1" + ("QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L" * 2)[:58], "AGE-SECRET-KEY-1[redacted]",
     "AGE-SECRET-KEY-1QPZRY"),
    ("discord-webhook", "https://discord.com/api/webhooks/1234567890/" + A36, "https://discord.com/api/webhooks/[redacted]",
     "https://discord.com/api/webhooks"),
    ("jwt", "session " + JWT, "session eyJ[redacted]", "header eyJhbGciOiJIUzI1NiJ9 alone"),
    ("authorization-header", "authorization: token abcdef123456", "authorization: token [redacted]", "authorization: required"),
    ("bearer-token", "Bearer " + A36, "Bearer [redacted]", "Bearer token"),
    ("wandb-login", "wandb login --relogin " + H32 + "01234567", "wandb login --relogin [redacted]", "wandb login --relogin"),
    ("stripe-webhook-secret", "STRIPE_WEBHOOK whsec_" + A36, "STRIPE_WEBHOOK whsec_[redacted]", "whsec_short"),
    ("wandb-local-key", "wandb login --host http://wandb.lab local-" + H32 + "01234567",
     "wandb login --host http://wandb.lab local-[redacted]", "local-rank 3 local-" + H32),
    ("azure-ad-client-secret", "AZURE_CLIENT_SECRET " + AZ, "AZURE_CLIENT_SECRET [redacted]", "vQ~ and 8Q~short"),
    ("azure-sas-signature", "https://ml.blob.core.windows.net/c/x.pt?sv=2022-11-02&sp=r&sig=" + SAS + "&se=2025",
     "https://ml.blob.core.windows.net/c/x.pt?sv=2022-11-02&sp=r&sig=[redacted]&se=2025", "config=sig=1 x?sig=short"),
    ("aws-presigned-signature", "GET /o.bin?X-Amz-Expires=300&X-Amz-Signature=" + H64, "GET /o.bin?X-Amz-Expires=300&X-Amz-Signature=[redacted]",
     "X-Amz-SignedHeaders=host"),
    ("mysql-password", "mysqldump -h db -uroot -pS3cr3t!x train > dump.sql", "mysqldump -h db -uroot -p[redacted] train > dump.sql",
     "mysql -h db -u root -p train"),
    ("sshpass-password", "sshpass -p 'hunter 2' ssh node1", "sshpass -p [redacted] ssh node1", "sshpass -f ~/.pw ssh node1"),
    ("netrc-password", "machine api.wandb.ai login user password " + H32, "machine api.wandb.ai login user password [redacted]",
     "machine learning models need a password reset"),
    ("netrc-password-line", "  password " + H32, "  password [redacted]", "password is required"),
    ("url-password", "https://user:pa55word@pypi.internal/simple", "https://user:[redacted]@pypi.internal/simple",
     "http://localhost:8080/v1 and git@github.com:org/repo"),
]


def test_every_rule_has_examples() -> None:
    assert [name for name, *_ in RULE_CASES] == [rule.name for rule in RULES]


def test_rules_have_no_capturing_groups() -> None:
    """The rules run as one alternation, and which one matched is found from its own `keep` group."""
    for rule in RULES:
        assert re.compile(rule.keep + rule.secret).groups == 0, rule.name


@pytest.mark.parametrize(("name", "raw", "expected", "near_miss"), RULE_CASES, ids=[c[0] for c in RULE_CASES])
def test_rule(name: str, raw: str, expected: str, near_miss: str) -> None:
    assert redact_secrets(raw) == expected
    assert redact_secrets(near_miss) == near_miss


AWS = [
    (f"AKIAIOSFODNN7EXAMPLE {B64_40}", "AKIA[redacted] [redacted]"),  # `aws configure list`, a credentials CSV
    (f"alice,,ASIAY34FZKBOKMUTVV7A,{B64_40}", "alice,,ASIA[redacted],[redacted]"),
    (f"secret {B64_40} for AKIAIOSFODNN7EXAMPLE", "secret [redacted] for AKIA[redacted]"),
    (f"aws_secret_access_key: {B64_40}", "aws_secret_access_key: [redacted]"),
    (f'{{"aws_secret_access_key": "{B64_40}"}}', '{"aws_secret_access_key": "[redacted]"}'),
    (f"aws configure set --aws-secret-access-key {B64_40}", "aws configure set --aws-secret-access-key [redacted]"),
    (f'"SecretAccessKey": "{B64_40}", "SessionToken": "FwoGZXIvYXdzEBY{A36}"',
     '"SecretAccessKey": "[redacted]", "SessionToken": "[redacted]"'),  # `aws sts get-session-token`
]


@pytest.mark.parametrize(("raw", "expected"), AWS)
def test_aws_secret_keys(raw: str, expected: str) -> None:
    assert redact_secrets(raw) == expected


def test_a_40_character_word_without_an_aws_key_id_is_no_secret() -> None:
    line = f"HEAD is now at 3f1c2b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a; saved {B64_40[:20]}/{B64_40[20:]}"
    assert redact_secrets(line) == line


# Ordinary training output, as it comes: nothing in it is a secret, so nothing may change.
TRAINING_LOG = """\
[rank0]:[W1201 09:43:12.123456 ProcessGroupNCCL.cpp:1234] NCCL INFO Channel 00/32 : 0 1 2 3 4 5 6 7
[rank3]:step=120 loss=2.3121 grad_norm=1.21 lr=3.0e-04 tok/s=41230 tokens/s=41230 elapsed=96.4s
{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.12, 'num_input_tokens_seen': 1048576}
generation config: max_new_tokens=512 temperature=0.7 top_p=0.95 pad_token=<pad> eos_token=</s> bos_token_id=1
Setting `pad_token_id` to `eos_token_id`:2 for open-end generation.
tokenizer: added_tokens=3 special_tokens_map.json tokenizer_config.json chat_template.jinja
Downloading shards: model-00001-of-00004.safetensors sha256=9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
Fetching 4 files: 100%|██████████| 4/4 [00:12<00:00,  3.01s/it] blob 5f2c8a9e0d1b3c4a5e6f7a8b9c0d1e2f3a4b5c6d
HEAD is now at 3f1c2b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a Merge pull request #412 from org/fix-eval
wandb: Run data is saved locally in /workspace/wandb/run-20241201_094312-a1b2c3d4
wandb: 🚀 View run sweet-sky-42 at https://wandb.ai/team/proj/runs/a1b2c3d4e5 run_id=7d9f0c1e-2b3a-4c5d-8e9f-0a1b2c3d4e5f
Saving model checkpoint to /workspace/out/checkpoint-1000/model.safetensors
INFO 12-01 09:43:12 [engine.py:310] Avg prompt throughput: 1234.5 tokens/s, Avg generation throughput: 98.7 tokens/s
torch.distributed: world_size=8 rank=3 local_rank=3 master_addr=10.0.0.12 master_port=29500 MASTER_PORT=29500
docker: image=nvcr.io/nvidia/pytorch:24.10-py3@sha256:4f1d2c3b5a6978e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708
eval: task-accuracy=0.71 disk-usage=82% mask_token=<mask> sk_learn_version=1.5.2 npm_config_cache=/root/.npm
loading /root/.cache/huggingface/hub/models--meta-llama--Llama-3.1-8B/snapshots/0e9e39f249a16976918f6564b8830bc894c89659
Epoch 3/10: 45%|████▌     | 450/1000 [01:02<01:15,  7.31it/s, loss=1.93, tokens_per_second=41200]
job 8c1f0c7e-5a1b-4d2e-9f3a-6b7c8d9e0f1a on node gpu-h200-07 (slurm job 123456, array 3)
base64 sample: aGVsbG8gd29ybGQ= config hash 6f1ed002ab5595859014ebf0951522d9
"""


def test_ordinary_training_output_is_left_alone() -> None:
    lines = TRAINING_LOG.splitlines()
    assert redact_lines(lines) == lines
    for line in lines:
        assert redact_secrets(line) == line


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


def test_base64_lines_with_no_end_line_after_them_are_no_key() -> None:
    lines = ["loading PRIVATE KEY from the vault", *BODY, AFTER, *BODY]
    assert redact_lines(lines) == lines


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
                     "MIIEowIBAAKCAQEA", "Proc-Type: 4,ENCRYPTED", "\u017fecret", "to\u212aen", "AKIAIOSFODNN7EXAMPLE",
                     "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "eyJhbGciOiJIUzI1NiJ9.", "SG.", "sk-ant-"]),
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
