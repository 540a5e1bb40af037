"""config.registry: the TOML file -> validated hosts and runs, or one clear message."""

from __future__ import annotations

import json
import os
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from config.registry import (
    LOCAL,
    Access,
    BotConfig,
    ConfigError,
    ConfigFaults,
    Host,
    Registry,
    Run,
    UnknownRun,
    config_warnings,
    faults_of,
    format_duration,
    load_registry,
    parse_duration,
    parse_registry,
)

PATH = Path("config/runs.toml")
CONFIG_DIR = os.path.abspath("config")
EXAMPLE = Path(__file__).resolve().parent.parent / "config" / "runs.example.toml"

HOSTS = """
[hosts.pve1]
address = "10.1.2.6"
"""


def parse(text: str, env_state_db: str | None = None) -> Registry:
    return parse_registry(text, PATH, env_state_db)


def run_toml(**keys: object) -> str:
    """A file with host pve1 and one run `x`, its keys given as TOML literals."""
    body = {"host": '"pve1"', "log": '"/w/train.log"', **keys}
    lines = [f"{k} = {v}" for k, v in body.items() if v is not None]
    return HOSTS + "[runs.x]\n" + "\n".join(lines) + "\n"


# --- faults: one row each: TOML, the key the message must name, what it must say -----------

FAULTS = [
    # unknown keys and sections, at every level
    ("[bogus]\n", "bogus", "unknown section (allowed: bot, access, defaults, hosts, runs)"),
    ("check_every = 5\n", "check_every", "it belongs under [bot]"),
    ("[bot]\nbogus = 1\n", "bot.bogus", "unknown key (allowed: check_every,"),
    ("[bot]\ncheck_evry = 1\n", "bot.check_evry", 'did you mean "check_every"?'),
    ("[access]\nadmin = []\n", "access.admin", 'unknown key (did you mean "admins"?'),
    ('[defaults]\nlog = "/x"\n', "defaults.log", "unknown key"),
    (HOSTS + 'hostname = "x"\n', "hosts.pve1.hostname", "unknown key"),
    (run_toml(bogus=1), "runs.x.bogus", "unknown key (allowed: host, container, log, step_pattern,"),
    (run_toml(silence=1), "runs.x.silence", 'did you mean "silence_after"?'),
    ("bot = 3\n", "bot", "must be a table, not an integer"),
    ("runs = 3\n", "runs", "must be a table"),
    ("[runs]\nx = 3\n", "runs.x", "must be a table"),
    ("hosts = []\n", "hosts", "must be a table, not a list"),
    # TOML syntax, duplicate tables and keys
    ("[runs.x]\nhost = \n", "line 2, column 8", "invalid TOML"),
    (run_toml() + "[runs.x]\n", "line", "invalid TOML: Cannot declare ('runs', 'x') twice"),
    ("[bot]\ncheck_every = 1\ncheck_every = 2\n", "line 3", "invalid TOML"),
    ("x = [" + "[" * 3000, "", "invalid TOML"),
    # hosts
    ('[hosts.local]\naddress = "1.2.3.4"\n', "hosts.local", '"local" is reserved'),
    ('[hosts.LOCAL]\naddress = "1.2.3.4"\n', "hosts.LOCAL", '"local" is reserved'),
    ('[hosts."-evil"]\naddress = "1.2.3.4"\n', "hosts.-evil", "bad host name"),
    ('[hosts."a b"]\naddress = "1.2.3.4"\n', 'hosts."a b"', "bad host name"),
    ('[hosts.h]\nuser = "root"\n', "hosts.h.address", "missing"),
    ('[hosts.h]\naddress = ""\n', "hosts.h.address", "is empty"),
    ('[hosts.h]\naddress = "10.0.0.1; rm -rf /"\n', "hosts.h.address", "bad address"),
    ('[hosts.h]\naddress = "a b"\n', "hosts.h.address", "bad address"),
    ('[hosts.h]\naddress = "$(reboot)"\n', "hosts.h.address", "bad address"),
    ('[hosts.h]\naddress = "-oProxyCommand=x"\n', "hosts.h.address", "bad address"),
    ('[hosts.h]\naddress = "root@10.0.0.1"\n', "hosts.h.address", "no spaces, user@ or shell characters"),
    ('[hosts.h]\naddress = "x\\ny"\n', "hosts.h.address", "control character"),
    ("[hosts.h]\naddress = 10\n", "hosts.h.address", "must be a string, not an integer"),
    ('[hosts.h]\naddress = "h"\nport = 0\n', "hosts.h.port", "bad port 0 (a whole number from 1 to 65535)"),
    ('[hosts.h]\naddress = "h"\nport = 65536\n', "hosts.h.port", "bad port 65536"),
    ('[hosts.h]\naddress = "h"\nport = "22"\n', "hosts.h.port", 'bad port "22"'),
    ('[hosts.h]\naddress = "h"\nport = true\n', "hosts.h.port", "bad port true"),
    ('[hosts.h]\naddress = "h"\nuser = "ro ot"\n', "hosts.h.user", "bad user name"),
    ('[hosts.h]\naddress = "h"\nuser = "-x"\n', "hosts.h.user", "bad user name"),
    ('[hosts.h]\naddress = "h"\njump = "a b"\n', "hosts.h.jump", "bad jump host"),
    ('[hosts.h]\naddress = "h"\njump = "u@h:99999"\n', "hosts.h.jump", "bad jump host"),
    ('[hosts.h]\naddress = "h"\njump = "-J x"\n', "hosts.h.jump", "bad jump host"),
    ('[hosts.h]\naddress = "h"\nkey = ""\n', "hosts.h.key", "is empty"),
    ('[hosts.h]\naddress = "h"\nconnect_timeout = "soon"\n', "hosts.h.connect_timeout", "bad duration"),
    ('[hosts.h]\naddress = "h"\nkeepalive = -1\n', "hosts.h.keepalive", "must be zero or more"),
    ('[hosts.h]\naddress = "h"\nmax_channels = 0\n', "hosts.h.max_channels", "(a whole number from 1 to 64)"),
    ('[hosts.h]\naddress = "h"\nmax_channels = 65\n', "hosts.h.max_channels", "bad max_channels 65"),
    # runs: names, host, container, log
    ('[runs."a b"]\nhost = "local"\nlog = "/x"\n', 'runs."a b"', "bad run name"),
    ('[runs."_x"]\nhost = "local"\nlog = "/x"\n', "runs._x", "bad run name"),
    (
        '[runs.Ab]\nhost = "local"\nlog = "/x"\n[runs.ab]\nhost = "local"\nlog = "/y"\n',
        "runs.ab",
        "duplicate run name",
    ),
    (run_toml(host='"pve9"'), "runs.x.host", 'unknown host "pve9" (known: pve1, local)'),
    ('[runs.x]\nhost = "pve9"\nlog = "/x"\n', "runs.x.host", 'unknown host "pve9" (known: local)'),
    ('[defaults]\nhost = "pve9"\n', "defaults.host", 'unknown host "pve9"'),
    (run_toml(host=None), "runs.x.host", "missing"),
    (run_toml(log=None), "runs.x.log", "missing"),
    (run_toml(log='""'), "runs.x.log", "is empty"),
    (run_toml(log='"  "'), "runs.x.log", "is empty"),
    (run_toml(log='"train.log"'), "runs.x.log", 'relative path "train.log" on host "pve1"'),
    (run_toml(log='"~/train.log"'), "runs.x.log", "absolute path"),
    (run_toml(log='"/w/a\\nb"'), "runs.x.log", "control character"),
    (run_toml(log="[]"), "runs.x.log", "must be a string, not a list"),
    (run_toml(container="0"), "runs.x.container", "bad CT id 0"),
    (run_toml(container="-5"), "runs.x.container", "bad CT id -5"),
    (run_toml(container='"200"'), "runs.x.container", 'bad CT id "200"'),
    (run_toml(container="true"), "runs.x.container", "bad CT id true"),
    (run_toml(container="200.0"), "runs.x.container", "bad CT id 200.0"),
    (run_toml(container="1000000000"), "runs.x.container", "positive whole number"),
    ("[defaults]\ncontainer = 0\n", "defaults.container", "bad CT id 0"),
    # durations
    (
        run_toml(silence_after='"10 minutes"'),
        "runs.x.silence_after",
        'bad duration "10 minutes" (use e.g. "90s", "10m", "2h")',
    ),
    (run_toml(silence_after='"0s"'), "runs.x.silence_after", "must be more than zero"),
    (run_toml(silence_after="-1"), "runs.x.silence_after", "must be more than zero"),
    (run_toml(silence_after='"-5m"'), "runs.x.silence_after", "must be more than zero"),
    (run_toml(silence_after="true"), "runs.x.silence_after", "bad duration true"),
    (run_toml(silence_after="nan"), "runs.x.silence_after", "bad duration nan"),
    (run_toml(silence_after="inf"), "runs.x.silence_after", "bad duration inf"),
    (run_toml(silence_after='"Auto"'), "runs.x.silence_after", 'bad duration "Auto"'),
    (run_toml(silence_after='"30m1h"'), "runs.x.silence_after", "each unit once, largest first"),
    (run_toml(silence_after='"400d"'), "runs.x.silence_after", "at most 365d"),
    (run_toml(loading_grace='"0"'), "runs.x.loading_grace", "must be more than zero"),
    (run_toml(loading_grace="45"), "runs.x.loading_grace", 'no unit (write "45s" for seconds or "45m" for minutes)'),
    ("[bot]\ncheck_every = 30\n", "bot.check_every", 'no unit (write "30s"'),
    ('[defaults]\nsilence_after = "ten"\n', "defaults.silence_after", "bad duration"),
    ('[bot]\ncheck_every = "1 minute"\n', "bot.check_every", "bad duration"),
    ("[bot]\ncheck_every = 0\n", "bot.check_every", "must be more than zero"),
    ('[bot]\nremind_every = "x"\n', "bot.remind_every", "bad duration"),
    ("[bot]\nprobe_timeout = []\n", "bot.probe_timeout", "bad duration a list"),
    # gpu_samples and gpus
    (run_toml(gpu_samples="0"), "runs.x.gpu_samples", "bad gpu_samples 0 (a whole number from 1 to 20)"),
    (run_toml(gpu_samples="21"), "runs.x.gpu_samples", "bad gpu_samples 21"),
    (run_toml(gpu_samples="2.5"), "runs.x.gpu_samples", "bad gpu_samples 2.5"),
    ("[defaults]\ngpu_samples = true\n", "defaults.gpu_samples", "bad gpu_samples true"),
    (run_toml(gpus="{a = [-1]}"), "runs.x.gpus.a", "bad GPU index -1"),
    (run_toml(gpus='{a = ["0"]}'), "runs.x.gpus.a", 'bad GPU index "0"'),
    (run_toml(gpus="{a = [true]}"), "runs.x.gpus.a", "bad GPU index true"),
    (run_toml(gpus="{a = [1.0]}"), "runs.x.gpus.a", "bad GPU index 1.0"),
    (run_toml(gpus="{a = [0, 1, 0]}"), "runs.x.gpus.a", "GPU 0 listed twice"),
    (run_toml(gpus="{a = [0, 1], b = [2, 1]}"), "runs.x.gpus.b", 'GPU 1 is already in role "a"'),
    (run_toml(gpus="{a = []}"), "runs.x.gpus.a", "is empty"),
    (run_toml(gpus="{a = 3}"), "runs.x.gpus.a", "must be a list of GPU indices"),
    (run_toml(gpus='{"my role" = [0]}'), "runs.x.gpus", 'bad role name "my role"'),
    (run_toml(gpus="[0, 1]"), "runs.x.gpus", "must be a table, not a list"),
    ("[defaults.gpus]\nt = [0, 0]\n", "defaults.gpus.t", "GPU 0 listed twice"),
    # step_pattern: Python re and grep -E must read it alike
    (run_toml(step_pattern='"step=("'), "runs.x.step_pattern", "is not a regular expression"),
    (run_toml(step_pattern=r"'step=\q+'"), "runs.x.step_pattern", r"grep -E has no \q"),
    (run_toml(step_pattern=r"'\Zstep'"), "runs.x.step_pattern", r"grep -E has no \Z"),
    (run_toml(step_pattern=r"'\Astep'"), "runs.x.step_pattern", r"grep -E has no \A"),
    (run_toml(step_pattern=r"'(\w+)=\1'"), "runs.x.step_pattern", r"grep -E has no \1"),
    (run_toml(step_pattern=r"'x\B'"), "runs.x.step_pattern", r"grep -E has no \B"),
    (run_toml(step_pattern='"a{"'), "runs.x.step_pattern", "repeat count"),
    (run_toml(step_pattern='"a|{x}"'), "runs.x.step_pattern", "repeat count"),
    (run_toml(step_pattern='"(?i)step"'), "runs.x.step_pattern", "no (?...) groups"),
    (run_toml(step_pattern='"(?P<n>step)"'), "runs.x.step_pattern", "no (?...) groups"),
    (run_toml(step_pattern='"step.*?loss"'), "runs.x.step_pattern", "lazy or possessive"),
    (run_toml(step_pattern='"step.+?loss"'), "runs.x.step_pattern", "lazy or possessive"),
    (run_toml(step_pattern='"steps??"'), "runs.x.step_pattern", "lazy or possessive"),
    (run_toml(step_pattern='"s{1,2}?x"'), "runs.x.step_pattern", "lazy or possessive"),
    (run_toml(step_pattern='"s*+x"'), "runs.x.step_pattern", "lazy or possessive"),
    (run_toml(step_pattern=r"'step[\.=]'"), "runs.x.step_pattern", "inside [...]"),
    (run_toml(step_pattern='"[[:digit:]]+"'), "runs.x.step_pattern", "POSIX classes"),
    (run_toml(step_pattern='"x*"'), "runs.x.step_pattern", "matches every line"),
    (run_toml(step_pattern='"^"'), "runs.x.step_pattern", "matches every line"),
    (run_toml(step_pattern='""'), "runs.x.step_pattern", "is empty"),
    (run_toml(step_pattern='"a\\nb"'), "runs.x.step_pattern", "control character"),
    # what the linear-time engine cannot promise is refused when the config loads, not on a log line
    (run_toml(step_pattern='"(x{200}){200}"'), "runs.x.step_pattern", "RE2, the linear-time engine"),
    (
        run_toml(step_pattern=json.dumps("s" * 501)),
        "runs.x.step_pattern",
        "too long (501 characters; at most 500)",
    ),
    # channels and users
    (run_toml(alert_channel='"general"'), "runs.x.alert_channel", 'bad channel "general"'),
    (run_toml(alert_channel='"#General"'), "runs.x.alert_channel", "lower case"),
    (run_toml(alert_channel='"U0123ABCD"'), "runs.x.alert_channel", "bad channel"),
    (run_toml(alert_channel='"c0123abcd"'), "runs.x.alert_channel", "bad channel"),
    ('[bot]\nalert_channel = "#a b"\n', "bot.alert_channel", "bad channel"),
    (
        '[access]\nusers = ["bob"]\n',
        "access.users",
        'bad user id "bob" (Slack user ids look like "U0123ABCD")',
    ),
    ('[access]\nusers = "U0123ABCD"\n', "access.users", "must be a list of Slack user ids"),
    ("[access]\nusers = [1]\n", "access.users", "bad user id 1"),
    ('[access]\nchannels = ["#ops"]\n', "access.channels", "use the id"),
    ('[access]\nchannels = ["U0123ABCD"]\n', "access.channels", "bad channel id"),
    (run_toml(users='["C0123ABCD"]'), "runs.x.users", "bad user id"),
    (run_toml(channels='["general"]'), "runs.x.channels", "bad channel id"),
    ('[defaults]\nusers = ["x"]\n', "defaults.users", "bad user id"),
]


@pytest.mark.parametrize(
    ("text", "key", "fault"), FAULTS, ids=[f"{k or 'toml'}:{f[:30]}" for _, k, f in FAULTS]
)
def test_fault_is_one_line_naming_file_key_and_fault(text: str, key: str, fault: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(text)
    message = str(caught.value)
    assert message.startswith(f"{PATH}: {key}"), message
    assert fault in message, message
    assert len(message.splitlines()) == 1
    assert caught.value.key == key or key in caught.value.key


def test_the_briefs_example_messages_verbatim() -> None:
    cases = [
        (
            run_toml(silence_after='"10 minutes"'),
            'config/runs.toml: runs.x.silence_after: bad duration "10 minutes" (use e.g. "90s", "10m", "2h")',
        ),
        (run_toml(host='"pve9"'), 'config/runs.toml: runs.x.host: unknown host "pve9" (known: pve1, local)'),
    ]
    for text, expected in cases:
        with pytest.raises(ConfigError) as caught:
            parse(text)
        assert str(caught.value) == expected


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "runs.toml"
    with pytest.raises(ConfigError) as caught:
        load_registry(path)
    assert str(caught.value) == f"{path}: file not found (`runbot init {path}` writes a commented example there)"


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        load_registry(tmp_path)  # a directory
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe[bot]")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_registry(binary)


def test_key_paths_quote_odd_names() -> None:
    with pytest.raises(ConfigError) as caught:
        parse('[runs."v1.2"]\nhost = "local"\nlog = "/x"\nbogus = 1\n')
    assert caught.value.key == 'runs."v1.2".bogus'


def test_control_characters_in_messages_are_escaped() -> None:
    with pytest.raises(ConfigError) as caught:
        parse('[runs."a\\u2028b"]\nhost = "local"\nlog = "/x"\n')
    assert len(str(caught.value).splitlines()) == 1
    assert "\\u2028" in str(caught.value)


# --- good files ---------------------------------------------------------------------------

INTERFACE_EXAMPLE = """
[bot]
check_every = "60s"
alert_channel = "C0123456789"
state_db = "runbot.sqlite3"

[access]
users = []
channels = []

[defaults]
silence_after = "10m"
loading_grace = "45m"
gpu_samples = 5

[hosts.pve1]
address = "10.1.2.6"
user = "root"
port = 22

[runs.dflash]
host = "pve1"
container = 200
log = "/workspace/train_opt.log"
[runs.dflash.gpus]
target = [0, 1, 2, 3, 4]
drafter = [5, 6, 7]
"""


def test_interface_example_parses_to_the_expected_values() -> None:
    registry = parse(INTERFACE_EXAMPLE)
    assert registry.path == PATH
    assert registry.bot == BotConfig(
        check_every=60.0, alert_channel="C0123456789", state_db=os.path.join(CONFIG_DIR, "runbot.sqlite3")
    )
    assert registry.access == Access(frozenset(), frozenset())
    assert dict(registry.hosts) == {"pve1": Host(name="pve1", address="10.1.2.6")}
    assert dict(registry.runs) == {
        "dflash": Run(
            name="dflash",
            host="pve1",
            container=200,
            log="/workspace/train_opt.log",
            alert_channel="C0123456789",  # from [bot]
            silence_after=600.0,
            loading_grace=2700.0,
            gpu_samples=5,
            gpus=(("target", (0, 1, 2, 3, 4)), ("drafter", (5, 6, 7))),
        )
    }
    run = registry.runs["dflash"]
    assert run.roles == {"target": (0, 1, 2, 3, 4), "drafter": (5, 6, 7)}
    assert list(run.roles) == ["target", "drafter"]  # file order
    assert not run.is_local
    assert registry.host_of(run) == registry.hosts["pve1"]
    assert registry.names() == ["dflash"]


def test_empty_file_gives_built_in_defaults() -> None:
    registry = parse("")
    assert registry.bot == BotConfig(state_db=os.path.join(CONFIG_DIR, "runbot.sqlite3"))
    assert registry.access == Access()
    assert registry.runs == {} and registry.hosts == {}


def test_every_host_key() -> None:
    registry = parse(
        """
        [hosts.h]
        address = "gpu-7.example.com"
        user = "ops"
        port = 2222
        key = "~/.ssh/id_ed25519"
        known_hosts = "keys/known_hosts"
        jump = "jump@bastion.example.com:2200"
        connect_timeout = "5s"
        command_timeout = "2m"
        keepalive = 0
        max_channels = 64
        """
    )
    assert registry.hosts["h"] == Host(
        name="h",
        address="gpu-7.example.com",
        user="ops",
        port=2222,
        key=os.path.expanduser("~/.ssh/id_ed25519"),
        known_hosts=os.path.join(CONFIG_DIR, "keys/known_hosts"),
        jump="jump@bastion.example.com:2200",
        connect_timeout=5.0,
        command_timeout=120.0,
        keepalive=0.0,
        max_channels=64,
    )


@pytest.mark.parametrize("address", ["10.1.2.6", "pve1", "pve1.lan", "fe80::1", "fe80::1%eth0", "my-host_2"])
def test_good_addresses(address: str) -> None:
    assert parse(f'[hosts.h]\naddress = "{address}"\n').hosts["h"].address == address


@pytest.mark.parametrize(
    "jump", ["bastion", "u@bastion", "u@bastion:22", "bastion:2222", "u@[fe80::1]:22", "10.0.0.1"]
)
def test_good_jump_hosts(jump: str) -> None:
    assert parse(f'[hosts.h]\naddress = "h"\njump = "{jump}"\n').hosts["h"].jump == jump


def test_every_run_key() -> None:
    registry = parse(
        run_toml(
            container="101",
            step_pattern=r"'tok/s|step[ =][0-9]+|\w+_loss\s'",
            alert_channel='"#ml-alerts"',
            silence_after='"1h30m"',
            loading_grace='"1s"',
            gpu_samples="1",
            gpus="{a = [1], b = [0]}",
            users='["U0123ABCD", "W0123ABCD"]',
            channels='["C0123ABCD", "G0123ABCD", "D0123ABCD"]',
        )
    )
    assert registry.runs["x"] == Run(
        name="x",
        host="pve1",
        container=101,
        log="/w/train.log",
        step_pattern=r"tok/s|step[ =][0-9]+|\w+_loss\s",
        alert_channel="#ml-alerts",
        silence_after=5400.0,
        loading_grace=1.0,
        gpu_samples=1,
        gpus=(("a", (1,)), ("b", (0,))),
        users=frozenset({"U0123ABCD", "W0123ABCD"}),
        channels=frozenset({"C0123ABCD", "G0123ABCD", "D0123ABCD"}),
    )


def test_silence_after_auto_is_none() -> None:
    assert parse(run_toml(silence_after='"auto"')).runs["x"].silence_after is None
    assert parse('[defaults]\nsilence_after = "auto"\n' + run_toml()).runs["x"].silence_after is None


def test_timings_are_honoured_as_written() -> None:
    registry = parse('[bot]\ncheck_every = "1s"\n' + run_toml(silence_after='"5s"'))
    assert registry.bot.check_every == 1.0
    assert registry.runs["x"].silence_after == 5.0


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        ("logs/train.log", os.path.join(CONFIG_DIR, "logs/train.log")),
        ("../demo/./train.log", os.path.normpath(os.path.join(CONFIG_DIR, "../demo/train.log"))),
        ("/var/log//train.log", "/var/log/train.log"),
        ("~/train.log", os.path.expanduser("~/train.log")),
    ],
)
def test_local_log_paths_resolve_against_the_config_directory(log: str, expected: str) -> None:
    run = parse(f'[runs.x]\nhost = "local"\nlog = "{log}"\n').runs["x"]
    assert run.log == expected and os.path.isabs(run.log)
    assert run.is_local and run.host == LOCAL
    assert parse(f'[runs.x]\nhost = "local"\nlog = "{log}"\n').host_of(run) is None


def test_remote_log_paths_are_kept_as_written() -> None:
    assert parse(run_toml(log='"/workspace//x/../train.log"')).runs["x"].log == "/workspace//x/../train.log"


def test_state_db_relative_to_config_file_and_env_override(tmp_path: Path) -> None:
    assert parse('[bot]\nstate_db = "state/a.db"\n').bot.state_db == os.path.join(CONFIG_DIR, "state/a.db")
    assert parse('[bot]\nstate_db = "/var/lib/runbot.db"\n').bot.state_db == "/var/lib/runbot.db"
    assert parse('[bot]\nstate_db = ":memory:"\n').bot.state_db == ":memory:"
    env = str(tmp_path / "env.db")
    assert parse('[bot]\nstate_db = "state/a.db"\n', env_state_db=env).bot.state_db == env
    assert parse("", env_state_db="rel.db").bot.state_db == os.path.abspath("rel.db")


def test_a_postgresql_state_db_is_kept_as_written() -> None:
    # A URL is no path: resolved against the config's folder it would read "config/postgresql:/db.example/runbot".
    url = "postgresql://runbot@db.example:5432/runbot"
    assert parse(f'[bot]\nstate_db = "{url}"\n').bot.state_db == url
    assert parse("", env_state_db="postgres://u@h/db").bot.state_db == "postgres://u@h/db"


def test_load_registry_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "runs.toml"
    path.write_text('[runs.x]\nhost = "local"\nlog = "train.log"\n', encoding="utf-8")
    registry = load_registry(path, env_state_db=None)
    assert registry.path == path
    assert registry.runs["x"].log == str(tmp_path / "train.log")
    assert registry.bot.state_db == str(tmp_path / "runbot.sqlite3")


def test_the_shipped_example_loads() -> None:
    registry = load_registry(EXAMPLE)
    assert registry.names() == ["dflash", "laptop"]
    dflash, laptop = registry.runs["dflash"], registry.runs["laptop"]
    assert (dflash.host, dflash.container, dflash.log) == ("pve1", 200, "/workspace/train_opt.log")
    assert dflash.roles == {"target": (0, 1, 2, 3, 4), "drafter": (5, 6, 7)}
    assert laptop.is_local and laptop.log == str(EXAMPLE.parent / "logs" / "train.log")
    assert laptop.silence_after is None


def test_the_shipped_example_shows_every_key() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    from config import registry as module

    for name in (*module._BOT_CHECKS, *module._ACCESS_CHECKS, *module._HOST_CHECKS, *module._RUN_CHECKS):
        assert f"{name} =" in text or f".{name}]" in text, name


# --- [defaults] ---------------------------------------------------------------------------


def test_runs_inherit_defaults_and_override_them() -> None:
    registry = parse(
        HOSTS
        + """
[bot]
alert_channel = "C0000000001"

[defaults]
host = "pve1"
container = 300
step_pattern = "tok/s"
alert_channel = "#train"
silence_after = "5m"
loading_grace = "1h"
gpu_samples = 3
users = ["U0000000001"]
channels = ["C0000000002"]
[defaults.gpus]
all = [0, 1]

[runs.a]
log = "/a.log"

[runs.b]
host = "local"
container = 301
log = "/b.log"
step_pattern = "it/s"
alert_channel = "C0000000003"
silence_after = "auto"
loading_grace = "2m"
gpu_samples = 10
users = []
channels = []
gpus = { t = [2] }
"""
    )
    a, b = registry.runs["a"], registry.runs["b"]
    assert a == Run(
        name="a", host="pve1", container=300, log="/a.log", step_pattern="tok/s", alert_channel="#train",
        silence_after=300.0, loading_grace=3600.0, gpu_samples=3, gpus=(("all", (0, 1)),),
        users=frozenset({"U0000000001"}), channels=frozenset({"C0000000002"}),
    )  # fmt: skip
    assert b == Run(
        name="b", host="local", container=301, log="/b.log", step_pattern="it/s", alert_channel="C0000000003",
        silence_after=None, loading_grace=120.0, gpu_samples=10, gpus=(("t", (2,)),),
        users=frozenset(), channels=frozenset(),
    )  # fmt: skip


def test_built_in_run_defaults() -> None:
    run = parse(run_toml()).runs["x"]
    assert (run.silence_after, run.loading_grace, run.gpu_samples) == (600.0, 2700.0, 5)
    assert (run.container, run.step_pattern, run.alert_channel, run.gpus) == (None, None, None, ())
    assert (run.users, run.channels) == (None, None)


def test_alert_channel_falls_back_to_defaults_then_bot() -> None:
    assert (
        parse('[bot]\nalert_channel = "C0000000001"\n' + run_toml()).runs["x"].alert_channel == "C0000000001"
    )
    text = '[bot]\nalert_channel = "C0000000001"\n[defaults]\nalert_channel = "#d"\n' + run_toml()
    assert parse(text).runs["x"].alert_channel == "#d"


def test_a_defaults_fault_names_defaults_not_the_run() -> None:
    with pytest.raises(ConfigError) as caught:
        parse("[defaults]\ngpu_samples = 99\n" + run_toml())
    assert caught.value.key == "defaults.gpu_samples"


def test_relative_log_check_uses_the_inherited_host() -> None:
    with pytest.raises(ConfigError, match=r'runs\.x\.log: relative path "t.log" on host "pve1"'):
        parse(HOSTS + '[defaults]\nhost = "pve1"\n[runs.x]\nlog = "t.log"\n')
    run = parse(HOSTS + '[defaults]\nhost = "pve1"\n[runs.x]\nhost = "local"\nlog = "t.log"\n').runs["x"]
    assert run.log == os.path.join(CONFIG_DIR, "t.log")


# --- access -------------------------------------------------------------------------------

ACCESS_CASES = [
    # (global users, global channels, run users, run channels, user, channel, allowed)
    ((), (), None, None, "U1", "C1", True),
    (("U1",), (), None, None, "U1", "C9", True),
    (("U1",), (), None, None, "U2", "C9", False),
    ((), ("C1",), None, None, "U9", "C1", True),
    ((), ("C1",), None, None, "U9", "C2", False),
    (("U1",), ("C1",), None, None, "U1", "C2", False),
    (("U1",), (), ("U2",), None, "U2", "C1", True),  # the run's list replaces the global one
    (("U1",), (), ("U2",), None, "U1", "C1", False),
    (("U1",), (), (), None, "U7", "C1", True),  # an empty run list opens the run to everyone
    ((), ("C1",), None, ("C2",), "U1", "C2", True),
    ((), ("C1",), None, ("C2",), "U1", "C1", False),
]


@pytest.mark.parametrize(("gu", "gc", "ru", "rc", "user", "channel", "allowed"), ACCESS_CASES)
def test_access_allows(gu, gc, ru, rc, user, channel, allowed) -> None:  # noqa: ANN001
    access = Access(frozenset(gu), frozenset(gc))
    run = Run("x", LOCAL, None, "/x", users=None if ru is None else frozenset(ru),
              channels=None if rc is None else frozenset(rc))  # fmt: skip
    assert access.allows(user, channel, run) is allowed
    if ru is None and rc is None:
        assert access.allows(user, channel) is allowed


# --- resolving a run name -------------------------------------------------------------------

NAMES = ["dflash", "dpo", "eagle", "eagle-2", "Llama"]


@pytest.fixture(scope="module")
def registry() -> Registry:
    return parse("".join(f'[runs."{n}"]\nhost = "local"\nlog = "/{n}.log"\n' for n in NAMES))


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("dflash", "dflash"),
        ("df", "dflash"),
        ("dp", "dpo"),
        ("eagle", "eagle"),  # an exact name wins over being a prefix of eagle-2
        ("eagle-", "eagle-2"),
        ("DFLASH", "dflash"),  # case does not matter
        ("ll", "Llama"),
        (" dpo ", "dpo"),
    ],
)
def test_resolve(registry: Registry, query: str, expected: str) -> None:
    assert registry.resolve(query).name == expected


@pytest.mark.parametrize(
    ("query", "ambiguous", "message"),
    [
        ("d", ["dflash", "dpo"], '"d" matches several runs: dflash, dpo (say which)'),
        ("E", ["eagle", "eagle-2"], '"E" matches several runs: eagle, eagle-2 (say which)'),
        ("zzz", [], 'unknown run "zzz" (known: dflash, dpo, eagle, eagle-2, Llama)'),
        ("", [], "which run? (known: dflash, dpo, eagle, eagle-2, Llama)"),
        ("dflashx", [], 'unknown run "dflashx"'),
    ],
)
def test_resolve_refuses(registry: Registry, query: str, ambiguous: list[str], message: str) -> None:
    with pytest.raises(UnknownRun) as caught:
        registry.resolve(query)
    assert caught.value.query == query.strip()
    assert caught.value.known == NAMES
    assert caught.value.ambiguous == ambiguous
    assert message in str(caught.value)


def test_resolve_with_no_runs() -> None:
    with pytest.raises(UnknownRun, match="no runs are configured"):
        parse("").resolve("x")


# --- durations ----------------------------------------------------------------------------

DURATIONS = [
    ("90s", 90.0),
    ("10m", 600.0),
    ("2h", 7200.0),
    ("1d", 86400.0),
    ("1h30m", 5400.0),
    ("1d2h3m4s5ms", 93784.005),
    ("500ms", 0.5),
    ("1.5h", 5400.0),
    ("1s", 1.0),
    (" 10m ", 600.0),
    ("365d", 365 * 86400.0),
]


@pytest.mark.parametrize(("value", "seconds"), DURATIONS)
def test_parse_duration(value: object, seconds: float) -> None:
    assert parse_duration(value, "k") == pytest.approx(seconds)


BAD_DURATIONS = [
    "10 minutes", "auto", "", "m", "10", "1h 30m", "10M", "1w", "5m5m", "30m1h", "1e3s", "0x10",
    "-5m", "-1", "0", "0s", "0ms", ".5s", "5.s", "٥s", "inf", "nan", True, False, -1, 0, 0.0,
    float("inf"), float("nan"), None, [1], {"s": 1}, 10**400, "366d", "45", 90, 0.25, " 7 ",
]  # fmt: skip


@pytest.mark.parametrize("value", BAD_DURATIONS, ids=repr)
def test_parse_duration_refuses(value: object) -> None:
    with pytest.raises(ValueError) as caught:
        parse_duration(value, "runs.x.silence_after")
    message = str(caught.value)
    assert message.startswith("runs.x.silence_after: bad duration ")
    assert len(message.splitlines()) == 1


@pytest.mark.parametrize(("value", "fix"), [(45, '"45s" for seconds or "45m" for minutes'), ("90", '"90s"'), (0.5, '"0.5s"')])
def test_a_duration_without_a_unit_is_refused_with_its_fix(value: object, fix: str) -> None:
    """`loading_grace = 45` was 45 seconds; whoever wrote it may have meant minutes (issue 22)."""
    with pytest.raises(ValueError, match="no unit") as caught:
        parse_duration(value, "k")
    assert fix in str(caught.value)


def test_zero_needs_no_unit() -> None:
    assert parse_duration(0, "k", allow_zero=True) == parse_duration("0", "k", allow_zero=True) == 0.0


def test_parse_duration_hint_and_zero() -> None:
    with pytest.raises(ValueError, match=r'^k: bad duration "10 minutes" \(use e\.g\. "90s", "10m", "2h"\)$'):
        parse_duration("10 minutes", "k")
    assert parse_duration("0s", "k", allow_zero=True) == 0.0
    assert parse_duration(0, "k", allow_zero=True) == 0.0
    with pytest.raises(ValueError, match="must be zero or more"):
        parse_duration(-1, "k", allow_zero=True)
    with pytest.raises(ValueError, match=r"^bad duration"):
        parse_duration("x", "")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(90, "1m30s"), (600, "10m"), (5400, "1h30m"), (0.5, "500ms"), (86401.25, "1d1s250ms")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.integers(min_value=1, max_value=365 * 86400 * 1000))
def test_format_duration_round_trips(millis: int) -> None:
    assert parse_duration(format_duration(millis / 1000), "k") == pytest.approx(millis / 1000)


@given(
    st.one_of(
        st.text(),
        st.text(alphabet="0123456789.dhms- auto", max_size=12),
        st.from_regex(r"-?[0-9]{1,4}(\.[0-9]{1,3})?(d|h|m|s|ms){1,3}", fullmatch=True),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.none(),
        st.lists(st.integers(), max_size=2),
    )
)
@settings(max_examples=500, deadline=None)
def test_parse_duration_only_raises_value_error(value: object) -> None:
    try:
        seconds = parse_duration(value, "k")
    except ValueError as exc:
        assert str(exc).startswith("k: bad duration ")
        assert len(str(exc).splitlines()) == 1
    else:
        assert 0 < seconds <= 365 * 86400


# --- fuzzing the whole file -----------------------------------------------------------------


@given(st.text())
@settings(max_examples=300, deadline=None)
def test_parse_registry_only_raises_config_error_on_arbitrary_text(text: str) -> None:
    try:
        parse(text)
    except ConfigError as exc:
        assert str(exc).startswith(f"{PATH}: ")
        assert len(str(exc).splitlines()) == 1


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # nan, inf, -inf and 1e+100 are TOML too
    if isinstance(value, (int, str)):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"


_KEYS = st.sampled_from(
    ["host", "container", "log", "step_pattern", "alert_channel", "silence_after", "loading_grace", "gpu_samples",
     "gpus", "users", "channels", "address", "user", "port", "key", "known_hosts", "jump", "connect_timeout",
     "command_timeout", "keepalive", "max_channels", "check_every", "state_db", "remind_every", "probe_timeout",
     "bogus"]
)  # fmt: skip
_SCALARS = st.one_of(
    st.sampled_from(["pve1", "local", "/w/t.log", "t.log", "10m", "auto", "C0123456789", "#ops", "U0123ABCD",
                     "step=[0-9]+", r"\d+", "(?i)x", "1.2.3.4", "u@h:22", "", "0s"]),
    st.text(alphabet=string.printable, max_size=8),
    st.integers(min_value=-3, max_value=70000),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
)  # fmt: skip
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(["t", "d", "my role", "0"]), inner, max_size=3),
    ),
    max_leaves=6,
)
_TABLES = st.dictionaries(_KEYS, _VALUES, max_size=6)
_NAMES = st.one_of(
    st.sampled_from(["pve1", "x", "local", "a.b", "-x"]), st.text(alphabet="ab. -_", min_size=1, max_size=4)
)
_FILES = st.fixed_dictionaries(
    {},
    optional={
        "bot": _TABLES,
        "access": _TABLES,
        "defaults": _TABLES,
        "hosts": st.dictionaries(_NAMES, _TABLES, max_size=2),
        "runs": st.dictionaries(_NAMES, _TABLES, max_size=3),
    },
)


@given(_FILES)
@settings(max_examples=500, deadline=None)
def test_parse_registry_only_raises_config_error_on_toml_like_files(data: dict) -> None:
    text = "\n".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in data.items())
    try:
        registry = parse(text)
    except ConfigError as exc:
        assert str(exc).startswith(f"{PATH}: ")
        assert len(str(exc).splitlines()) == 1
    else:
        for run in registry.runs.values():
            assert run.host == LOCAL or run.host in registry.hosts
            assert os.path.isabs(run.log)


@pytest.mark.parametrize("pattern", [r"step=\d+", r"iter\D+\d+", r"\w+_loss=\S+", r"\bepoch\s\d"])
def test_python_class_escapes_are_accepted_in_step_pattern(pattern):
    """The probe rewrites \\d \\D \\w \\W \\s \\S as bracket classes for grep, so they are fine."""
    text = f"[runs.x]\nhost = \"local\"\nlog = \"/x.log\"\nstep_pattern = '{pattern}'\n"
    assert parse_registry(text, Path("runs.toml")).runs["x"].step_pattern == pattern


# -- every fault at once (issue 15 #5) -----------------------------------------------------------

SEVERAL = """
[bot]
check_every = "1 minute"
alert_chanel = "C0123456789"
[hosts.pve1]
address = "10.1.2.6"
port = 99999
[runs.a]
host = "pve1"
log = "relative.log"
[runs.b]
host = "pve9"
log = "/x.log"
[runs.c]
host = "local"
log = "/x.log"
gpu_samples = 0
"""


def test_every_fault_is_reported_at_once_in_file_order() -> None:
    with pytest.raises(ConfigFaults) as caught:
        parse(SEVERAL)
    assert [(f.key, f.fault.split(" (")[0]) for f in faults_of(caught.value)] == [
        ("bot.check_every", 'bad duration "1 minute"'),
        ("bot.alert_chanel", "unknown key"),
        ("hosts.pve1.port", "bad port 99999"),
        ("runs.a.log", 'relative path "relative.log" on host "pve1"'),
        ("runs.b.host", 'unknown host "pve9"'),
        ("runs.c.gpu_samples", "bad gpu_samples 0"),
    ]
    assert all(str(f).startswith(f"{PATH}: {f.key}: ") for f in faults_of(caught.value))


def test_several_faults_still_read_as_one_line_naming_the_first() -> None:
    with pytest.raises(ConfigError) as caught:
        parse(SEVERAL)
    message = str(caught.value)
    assert message.startswith(f'{PATH}: bot.check_every: bad duration "1 minute"') and "(and 5 more: " in message
    assert len(message.splitlines()) == 1 and caught.value.key == "bot.check_every"


@pytest.mark.parametrize("text, key", [
    # a refused value is one fault, not also "missing"
    ('[runs.x]\nhost = 3\nlog = "/x.log"\n', "runs.x.host"),
    ('[runs.x]\nhost = "local"\nlog = ""\n', "runs.x.log"),
    ('[defaults]\nhost = 3\n[runs.x]\nlog = "/x.log"\n[runs.y]\nlog = "/y.log"\n', "defaults.host"),
    ('[hosts.pve1]\naddress = "a b"\n', "hosts.pve1.address"),
    # a host with a fault is still a host its runs may name: no "unknown host" on top
    ('[hosts.pve1]\naddress = "10.0.0.1"\nport = 0\n[runs.x]\nhost = "pve1"\nlog = "/x.log"\n', "hosts.pve1.port"),
    ('[hosts]\npve1 = 3\n[runs.x]\nhost = "pve1"\nlog = "/x.log"\n', "hosts.pve1"),
    ('[runs]\nx = 3\n', "runs.x"),
    ('[defaults]\nbogus = 1\nhost = "local"\n[runs.x]\nlog = "/x.log"\n', "defaults.bogus"),
])
def test_one_mistake_is_one_fault_not_a_cascade(text, key) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(text)
    assert [f.key for f in faults_of(caught.value)] == [key]


@pytest.mark.parametrize("text, faults", [
    # a run whose host is unknown still has its relative log named (issue 22 #3)
    ('[runs.x]\nhost = "pve9"\nlog = "rel/x.log"\n', [("runs.x.host", 'unknown host "pve9"'), ("runs.x.log", 'relative path "rel/x.log"')]),
    # every bad role, and a GPU in two roles behind a bad first role
    (run_toml(gpus='{a = [-1], b = ["x"], c = [0], d = [0]}'), [
        ("runs.x.gpus.a", "bad GPU index -1"), ("runs.x.gpus.b", 'bad GPU index "x"'),
        ("runs.x.gpus.d", 'GPU 0 is already in role "c"')]),
])
def test_faults_behind_other_faults_are_reported_too(text, faults) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(text)
    assert [(f.key, f.fault.split(" (")[0]) for f in faults_of(caught.value)] == faults


def test_a_backslash_in_a_double_quoted_pattern_says_how_to_write_it() -> None:
    with pytest.raises(ConfigError) as caught:
        parse('[runs.x]\nhost = "local"\nlog = "/x.log"\nstep_pattern = "step=\\d+"\n')
    assert caught.value.key == "line 4, column 24"
    assert "single quotes, 'step=\\d+'" in caught.value.fault


def test_a_lone_fault_is_exactly_the_one_line_it_always_was() -> None:
    with pytest.raises(ConfigError) as caught:
        parse(run_toml(silence_after='"10 minutes"'))
    assert str(caught.value) == 'config/runs.toml: runs.x.silence_after: bad duration "10 minutes" (use e.g. "90s", "10m", "2h")'
    assert len(faults_of(caught.value)) == 1


def test_a_file_with_no_runs_is_valid_but_warned_about() -> None:
    assert [w.split(":")[0] for w in config_warnings(parse(""))] == ["no runs configured"]
    assert config_warnings(parse('[bot]\nalert_channel = "C0123456789"\n' + run_toml())) == []
    assert "no alert channel for x" in config_warnings(parse(run_toml()))[0]
