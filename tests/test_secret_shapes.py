"""Every credential shape runbot knows, on every surface that shows log text: a tail, a status headline
(from a crash line or the last line quoted), a crash alert, the CLI, doctor, and the host view's Slack
answer. And what must stay as it is: training lines full of `token`, `key` and numbers."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import pytest

from bot.core.alerts import Reply, RunState, Status
from bot.core.diagnose import diagnose
from bot.core.redact import clean_line, redact_lines, redact_secrets
from bot.core.verdict import Concern, Worry
from bot.render import alerts as render_alerts
from bot.render import slack as render_slack
from bot.render import text as render_text
from bot.render.doctor import Check, Outcome
from bot.render.doctor import report as doctor_report
from bot.render.doctor import slack_message as doctor_slack
from tests.builders import KEY_BODY, evidence
from tests.credential_shapes import ALNUM, B64, HEX, Shape, leaks, rnd, strings
from tests.test_diagnose import Run

T0 = 1_800_000_000.0


def _shapes() -> Iterator[Shape]:
    def s(name: str, template: str, secret: str, **kw) -> Shape:
        return Shape(name, template.format(s=secret), secret, **kw)

    a, h = (lambda n, k="": rnd(ALNUM, n, k)), (lambda n, k="": rnd(HEX, n, k))
    # -- providers: one per prefixed rule ------------------------------------------------------------
    yield s("slack-config-token", "refresh with xoxe.xoxp-1-{s}", "Mi0y" + a(140, "xoxe"))
    yield s("slack-bot-token", "export SLACK_BOT_TOKEN=xoxb-{s}", f"123456789012-1234567890123-{a(24, 'xoxb')}")
    yield s("slack-user-token", "token xoxp-{s} in text", f"111122223333-444455556666-{a(32, 'xoxp')}")
    yield s("slack-app-token", "SLACK_APP_TOKEN=xapp-{s}", f"1-A0123456789-1234567890123-{h(64, 'xapp')}")
    yield s("slack-webhook", "posting to https://hooks.slack.com/services/{s}", f"T0ABC1DEF/B0GHI2JKL/{a(24, 'hook')}")
    yield s("github-pat", "git clone https://ghp_{s}@github.com/org/repo", a(36, "ghp"))
    yield s("github-oauth", "GITHUB_TOKEN=gho_{s}", a(36, "gho"))
    yield s("github-app", "remote ghs_{s}", a(36, "ghs"))
    yield s("github-fine-grained", "pat github_pat_{s}", f"11ABCDEFG0_{a(59, 'ghfg')}")
    yield s("gitlab-pat", "CI_JOB glpat-{s}", a(20, "glpat"))
    yield s("huggingface", "huggingface-cli login --token hf_{s}", a(34, "hf"))
    yield s("huggingface-org", "org api_org_{s}", a(34, "api_org"))
    yield s("aws-access-key-id", "key id AKIA{s} region us-east-1", rnd("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16, "akia"))
    yield s("aws-secret-with-id", "AKIAQWERTYUIOPASDFGH {s}", rnd(B64, 40, "aws-secret"))
    yield s("google-api-key", "maps key AIza{s}", rnd(ALNUM + "_-", 35, "aiza"))
    yield s("google-oauth-access", "Authorization header ya29.{s}", a(120, "ya29"))
    yield s("google-oauth-client-secret", "client_secret GOCSPX-{s}", a(28, "gocspx"))
    yield s("anthropic", "ANTHROPIC_API_KEY sk-ant-{s}", "api03-" + rnd(ALNUM + "_-", 93, "ant") + "AA")
    yield s("openai-project", "OPENAI sk-proj-{s}", rnd(ALNUM + "_-", 156, "proj"))
    yield s("openai-legacy", "openai.api_key = 'sk-{s}'", a(48, "sk"))
    yield s("stripe-secret", "stripe sk_live_{s}", a(99, "sk_live"))
    yield s("stripe-restricted", "stripe rk_test_{s}", a(99, "rk_test"))
    yield s("npm-token", "//registry.npmjs.org/:_authToken=npm_{s}", a(36, "npm"))
    yield s("pypi-token", "twine upload -p pypi-{s}", "AgEIcHlwaS5vcmc" + rnd(ALNUM + "_-", 70, "pypi"))
    yield s("sendgrid", "mail via SG.{s}", f"{rnd(ALNUM + '_-', 22, 'sg1')}.{rnd(ALNUM + '_-', 43, 'sg2')}")
    yield s("twilio", "sms via SK{s}", h(32, "twilio"))
    yield s("digitalocean", "doctl auth init -t dop_v1_{s}", h(64, "do"))
    yield s("databricks", "DATABRICKS_TOKEN dapi{s}", h(32, "dapi"))
    yield s("shopify", "shop shpat_{s}", h(32, "shpat"))
    yield s("groq", "GROQ gsk_{s}", a(52, "gsk"))
    yield s("replicate", "REPLICATE r8_{s}", a(37, "r8"))
    yield s("nvidia", "NGC nvapi-{s}", rnd(ALNUM + "_-", 64, "nvapi"))
    yield s("xai", "XAI xai-{s}", a(80, "xai"))
    yield s("perplexity", "PPLX pplx-{s}", a(48, "pplx"))
    yield s("vault", "VAULT_TOKEN hvs.{s}", a(90, "hvs"))
    yield s("linear", "LINEAR lin_api_{s}", a(40, "linear"))
    yield s("postman", "POSTMAN PMAK-{s}", f"{h(24, 'pm1')}-{h(34, 'pm2')}")
    yield s("pulumi", "PULUMI pul-{s}", h(40, "pulumi"))
    yield s("doppler", "DOPPLER dp.st.{s}", a(43, "doppler"))
    yield s("grafana-service-account", "GRAFANA glsa_{s}", f"{a(32, 'glsa')}_{h(8, 'glsa2')}")
    yield s("grafana-cloud", "GRAFANA glc_{s}", a(64, "glc") + "==")
    yield s("age", "AGE AGE-SECRET-KEY-1{s}", rnd("QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L", 58, "age"))
    yield s("discord-webhook", "https://discord.com/api/webhooks/{s}", f"1234567890/{a(68, 'discord')}")
    yield s("jwt", "session eyJ{s}", "hbGciOiJIUzI1NiJ9.eyJzdWIiOiIx" + a(20, "jwt1") + "." + a(43, "jwt2"))
    yield s("authorization-basic", "curl -H 'Authorization: Basic {s}'", rnd(B64, 28, "basic") + "==")
    yield s("bearer", "curl -H 'Authorization: Bearer {s}'", a(40, "bearer"))
    yield s("wandb-login", "wandb login --relogin {s}", h(40, "wandb"))
    yield s("private-key-inline", "-----BEGIN RSA PRIVATE KEY-----{s}", "MIIEowIBAAKCAQEA" + rnd(B64, 64, "pem"))
    # -- generic: credentials that only their name announces ----------------------------------------
    yield s("password=", "db: password={s} port=5432", a(14, "pw1"))
    yield s("--password", "launch --password {s} --epochs 3", a(14, "pw2"))
    yield s("--hf-token=", "train.py --hf-token={s} --lr 3e-4", a(20, "pw3"))
    yield s("json-token", '{{"token": "{s}", "steps": 10}}', a(24, "json"))
    yield s("dict-api-key", "{{'api_key': '{s}', 'model': 'llama'}}", a(24, "dict"))
    yield s("WANDB_API_KEY", "WANDB_API_KEY={s}", h(40, "wbk"))
    yield s("AWS_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY={s}", rnd(B64, 40, "awssak"))
    yield s("SLACK_SIGNING_SECRET", "SLACK_SIGNING_SECRET={s}", h(32, "sss"))
    yield s("azure-account-key", "DefaultEndpointsProtocol=https;AccountName=ml;AccountKey={s};EndpointSuffix=core.windows.net",
            rnd(B64, 86, "acct") + "==")
    yield s("url-password", "pip install -i https://user:{s}@pypi.internal/simple x", a(16, "url"))
    yield s("query-token", "GET /api?token={s}&page=2", a(24, "query"))
    yield s("SECRET_KEY", "SECRET_KEY={s}", "django-insecure-" + rnd(ALNUM + "!@#%^*(-_=+)", 50, "django"))
    yield s("credentials=", "loaded credentials={s}", a(32, "creds"))
    yield s("private_key:", "private_key: {s}", rnd(B64, 44, "privk"))
    yield s("ENCRYPTION_KEY", "ENCRYPTION_KEY={s}", h(64, "enc"))
    yield s("kaggle-json", '{{"username":"ana","key":"{s}"}}', h(32, "kaggle"))
    yield s("PGPASSWORD", "PGPASSWORD={s} psql -h db -U ana", a(16, "pg"))
    yield s("DB_PASS", "export DB_PASS={s}", a(12, "dbpass"))
    yield s("MYSQL_PWD", "MYSQL_PWD={s} mysql -h db", a(12, "mysqlpwd"))
    yield s("npmrc-authToken", "//npm.pkg.github.com/:_authToken={s}", a(40, "npmrc"))
    yield s("docker-auth", '{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{s}"}}}}}}', rnd(B64, 32, "docker") + "==")
    yield s("wandb.login(key=)", 'wandb.login(key="{s}")', h(40, "wblogin"))
    yield s("netrc-machine", "machine api.wandb.ai login user password {s}", h(40, "netrc"))
    yield s("netrc-line", "  password {s}", h(40, "netrc2"), whole_line=True)
    yield s("wandb-local-key", "WANDB_API_KEY local-{s}", h(40, "wblocal"))
    yield s("wandb-local-key-bare", "wandb login --host http://wandb.lab:8080 local-{s}", h(40, "wblocal2"))
    yield s("azure-ad-client-secret", "AZURE_CLIENT_SECRET {s}", "Ab1" + "8Q~" + rnd(ALNUM + "_~.-", 34, "azad"))
    yield s("azure-sas-sig", "https://ml.blob.core.windows.net/ckpt/m.pt?sv=2022-11-02&sp=r&sig={s}&se=2025-01-01",
            rnd(ALNUM, 40, "sas") + "%2B" + rnd(ALNUM, 6, "sas2") + "%3D")
    yield s("stripe-webhook", "STRIPE_WEBHOOK_SECRET whsec_{s}", a(32, "whsec"))
    yield s("x-amz-signature", "GET https://b.s3.amazonaws.com/o?X-Amz-Expires=300&X-Amz-Signature={s}", h(64, "amzsig"))
    yield s("x-amz-security-token", "GET /o?X-Amz-Security-Token={s}&X-Amz-Date=20250101", "FwoGZXIvYXdzE" + a(60, "amztok"))
    yield s("url-password-slash", "redis at rediss://default:{s}@cache:6380/0", a(8, "u1") + "/" + a(8, "u2"))
    yield s("url-empty-user", "REDIS_URL=redis://:{s}@cache:6379/0", a(16, "redis"))
    yield s("mysql-p", "mysqldump -h db -uroot -p{s} train > dump.sql", a(14, "mysqlp"))
    yield s("sshpass-p", "sshpass -p {s} ssh node1 nvidia-smi", a(14, "sshpass"))
    yield s("password-space", "password: correct horse {s}", "battery " + a(10, "space"))
    yield s("password-semicolon", "password={s}", a(10, "semi1") + ";" + a(10, "semi2"))
    yield s("password-escaped-quote", 'password="{s}"', a(10, "eq1") + '\\"' + a(10, "eq2"))
    yield s("password-escaped-space", "export PASSWORD={s}; python train.py", a(10, "es1") + "\\ " + a(10, "es2"))
    yield s("password-json-in-json", '{{\\"db\\": {{\\"password\\": \\"{s}\\"}}}}', a(14, "jij"))
    yield s("password-unterminated", "PASSWORD='{s}", a(16, "unterm"))
    yield s("service-bus-key", "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=root;SharedAccessKey={s};EntityPath=q",
            rnd(B64, 43, "sbk") + "=")
    yield s("SECRET_KEY_BASE", "SECRET_KEY_BASE={s}", h(128, "rails"))
    yield s("API_KEY_PROD", "API_KEY_PROD={s}", a(32, "prod"))
    yield s("client-secret-camel", 'clientSecret: "{s}"', a(34, "camel"))


SHAPES = list(_shapes())


def test_the_table_covers_every_shape_the_review_counted() -> None:
    assert len(SHAPES) >= 71 and len({s.name for s in SHAPES}) == len(SHAPES)
    assert all(s.secret in s.line for s in SHAPES)


def _verdict(log: str, **probe):
    return diagnose(evidence(log, **probe), Run())


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_redacted_as_text(shape: Shape) -> None:
    out = redact_secrets(shape.line)
    assert not leaks(shape, out), out
    assert "[redacted]" in out
    assert not leaks(shape, clean_line(shape.line))


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_the_tail_never_shows_it(shape: Shape) -> None:
    v = _verdict(f"step=1 loss=2.0\n{shape.line}\nstep=2 loss=1.9\n")
    cli = render_text.tail(v, 20)
    posted = strings(render_slack.tail_message(v, 20))
    assert not leaks(shape, cli, *posted), cli
    assert "step=2 loss=1.9" in cli


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_a_headline_never_shows_it(shape: Shape) -> None:
    """The status headline, on the CLI and in Slack, where it quotes a crash (the error row says it in full)
    and where it quotes the last line of a log that stopped before its first step."""
    logs = [f"loading\n{shape.line}\n"]
    if not shape.whole_line:
        logs.append(f"step=1 loss=2.0\nTraceback (most recent call last):\n  File \"/w/train.py\", line 9, in <module>\n"
                    f"RuntimeError: could not log in with {shape.line}\n")
    for log in logs:
        v = _verdict(log, writers=())
        shown = [render_text.status(v), render_text.runs([("r", v)]),
                 *strings(render_slack.status_message(v, "r")), *strings(render_slack.runs_message([("r", v)]))]
        assert not leaks(shape, *shown), shown[0]


@pytest.mark.parametrize("shape", [s for s in SHAPES if not s.whole_line], ids=[s.name for s in SHAPES if not s.whole_line])
def test_a_crash_alert_never_shows_it(shape: Shape) -> None:
    log = (f"step=1 loss=2.0\nTraceback (most recent call last):\n  File \"/w/train.py\", line 9, in <module>\n"
           f"RuntimeError: could not log in with {shape.line}\n")
    v = _verdict(log, writers=())
    state = RunState(Status.OPEN, Concern(Worry.CRASHED), seq=1, announced=True, opened_at=T0, changed_at=T0,
                     headline=v.headline)
    posted = [*strings(render_alerts.parent("r", state, v, T0)),
              *strings(render_alerts.reply("r", Reply("changed", Concern(Worry.CRASHED)), state, T0)),
              *strings(render_alerts.parent("r", replace(state, status=Status.RESOLVED, closed_at=T0 + 60), None, T0 + 60))]
    assert not leaks(shape, *posted), posted[0]


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_doctor_and_the_host_view_never_show_it(shape: Shape) -> None:
    """A doctor check quotes what a host or CT printed (its nvidia-smi line), on the CLI and in Slack; the
    host view's Slack answer shows lines a CT printed."""
    shown = [*strings(render_slack.host_message("pve1", ["CT 200 ps:", shape.line]))]
    if not shape.whole_line:
        checks = [Check("CT 200: nvidia-smi answers", Outcome.FAIL, detail=shape.line, fix="see docs/probe.md")]
        shown += [doctor_report(checks), *strings(doctor_slack(checks)), *strings(render_slack.error_message(shape.line))]
    assert not leaks(shape, *shown), shown[-1]


def test_the_cli_tail_of_a_log_holding_every_shape(tmp_path) -> None:
    """`runbot tail` itself, over a log with all of them (and a private-key block across lines)."""
    from tests.test_cli import runbot

    log = tmp_path / "train.log"
    body = ["step=1 loss=2.0", *(s.line for s in SHAPES), "-----BEGIN OPENSSH PRIVATE KEY-----", *KEY_BODY,
            "-----END OPENSSH PRIVATE KEY-----", "step=2 loss=1.9"]
    log.write_text("\n".join(body) + "\n")
    config = tmp_path / "runs.toml"
    config.write_text(f'[runs.r]\nhost = "local"\nlog = "{log}"\ngpu_samples = 1\n')
    out = runbot("--config", str(config), "tail", "r", "200", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert [s.name for s in SHAPES if leaks(s, out.stdout)] == []
    assert not any(line[:8] in out.stdout for line in KEY_BODY)
    assert out.stdout.splitlines()[-1] == "step=2 loss=1.9"


# -- what is not a secret stays readable ----------------------------------------------------------

NOT_SECRETS = [
    "loss=0.31", "step=1200", "eval_key_accuracy: 0.9", "token/s", "tok/s 14.2K", "num_tokens=1024",
    "tokenizer_config.json", "/workspace/out/checkpoint-1000/model.safetensors", "tokens_per_second=41200",
    "{'eval_loss': 0.31, 'eval_token_accuracy': 0.912, 'eval_runtime': 12.1}", "Tokens: 1024 | Loss: 0.31 | lr: 3e-4",
    "tokenizer: meta-llama/Llama-3.1-8B", "tokenizer_name_or_path=meta-llama/Llama-3.1-8B", "key_padding_mask=None",
    "monkey_patch: true", "token_type_ids: [0, 0, 0]", "keypoints=17 keyframes=240", "passes=3 pass@1: 0.42 pass@10: 0.71",
    "bypass_cache=True", "secret_name=my-secret", "[INFO] auth: ok", "key=value", "sort_key=eval_loss",
    "password_file=/run/secrets/db", "--api-key-file /etc/runbot/key", "kv_cache_key=torch.Size([1, 8, 4096])",
    "Loading tokenizer from /models/llama/tokenizer.json", "auth_type=oauth auth: hf-cli", "keys: ['lm_head.weight']",
    "missing_keys=['a', 'b'] unexpected_keys=[]", "token_budget=4096 max_tokens=2048 token_count=12000",
    "key_dim=128 num_key_value_heads=8 key_len=64", "api_version=2024-02-01 api_base=http://localhost:8000/v1",
    "lr_scheduler_key=cosine_with_restarts", "tokenized 1,024,000 tokens in 12.3s (83.2K tok/s)",
    "dataset_key=train-v2 checkpoint_key=step_1200", "secrets: 0 found", "passkey retrieval acc=0.98",
    "tokens_seen=1.2B", "use_auth_token: True push_to_hub=False hub_token: <HUB_TOKEN>", "token=${HF_TOKEN}",
    "pad_token=<pad> eos_token=</s> bos_token_id=1 mask_token=[MASK]", "max_new_tokens=512 temperature=0.7",
    "http://localhost:8080/v1/models and git@github.com:org/repo.git@v1.2", "machine learning needs data, not a password",
    "The password field is empty", "mysql -h db -u root -p train", "sshpass -f /run/pw ssh node1",
    "saved to local-checkpoints/step-1200", "x?sig=short config=sig=1", "whsec_short",
    "sha256=9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "auth=None credentials=none",
    "Epoch 3/10: 45%|████▌     | 450/1000 [01:02<01:15,  7.31it/s, loss=1.93, tokens_per_second=41200]",
]


@pytest.mark.parametrize("line", NOT_SECRETS)
def test_training_lines_stay_readable(line: str) -> None:
    assert redact_secrets(line) == line
    assert clean_line(line) == line
    assert redact_lines(["step=1", line]) == ["step=1", line]
