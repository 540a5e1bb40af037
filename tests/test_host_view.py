"""The host's view, pure: parsing the host's captures, mapping PIDs to CTs, and what the answers say."""

from __future__ import annotations

import html
from pathlib import Path

import pytest
import tomllib

from bot.core.host_view import (Container, CtScan, Cut, GpuApp, HostGpu, HostView, Proc, Smi, Unit, choose_log,
                                ct_of_cgroup, discovered, holders, host_view_from_output, parse_apps, parse_cgroups,
                                parse_gpus, parse_pct_list, parse_scans)
from bot.probe.host_script import build_host_script
from bot.render import host as render_host
from bot.render import slack as render_slack
from config.registry import ConfigError, parse_registry

CAPTURES = Path(__file__).resolve().parent / "fixtures" / "gpu-utilization"
UUID = "GPU-9cc0b41d-5783-a367-f41a-d066d06d1b93"  # the H200 the captures were taken on


def _capture(name: str) -> tuple[str, str]:
    """A capture's --query-gpu rows and its --query-compute-apps rows (README: one file, split by a comment)."""
    gpus, _, apps = (CAPTURES / f"{name}.query-gpu.csv").read_text().partition("# --query-compute-apps\n")
    return gpus, apps


@pytest.mark.parametrize("name, used, util, pid", [("steady", 883, 100, 441), ("duty50", 883, 75, 517),
                                                    ("idle", 0, 0, None)])
def test_the_real_h200_captures_parse(name, used, util, pid):
    gpus_text, apps_text = _capture(name)
    [gpu] = parse_gpus(gpus_text)
    assert gpu == HostGpu(0, "00000000:00:06.0", UUID, used, 143771, util)
    apps = parse_apps(apps_text)
    assert [a.pid for a in apps] == ([pid] if pid else [])
    if pid:
        assert apps[0] == GpuApp(pid, UUID, 874)


@pytest.mark.parametrize("name", ["steady", "duty50"])
def test_a_real_cgroup_outside_any_ct_names_none(name):
    # The capture's machine is no Proxmox node: its process sits in a cgroup v2 path without lxc.
    text = (CAPTURES / f"{name}.cgroup.txt").read_text()
    assert text.startswith("0::/")
    assert ct_of_cgroup(text) is None


@pytest.mark.parametrize("text, vmid", [
    ("0::/lxc/200/ns/user.slice/user-0.slice/session-1.scope\n", 200),  # Proxmox, cgroup v2
    ("0::/lxc/200\n", 200),
    ("12:memory:/lxc/201/ns\n11:cpu,cpuacct:/lxc/201/ns\n0::/\n", 201),  # cgroup v1
    ("4:memory:/lxc/202\n", 202),
    ("0::/lxc.payload.203/init.scope\n", 203),  # plain LXC 4+
    ("0::/lxc.monitor.204\n", None),  # LXC's monitor is not the CT
    ("0::/lxc/2050x/ns\n", None),
    ("0::/system.slice/pvedaemon.service\n", None),
    ("", None),
    ("garbage without colons\n", None),
])
def test_the_cgroup_spellings(text, vmid):
    assert ct_of_cgroup(text) == vmid


def test_pct_list_with_and_without_a_lock():
    text = ("VMID       Status     Lock         Name\n"
            "200        running                 llama-train\n"
            "201        stopped    backup       eval\n")
    assert parse_pct_list(text) == (Container(200, "running", "llama-train"), Container(201, "stopped", "eval"))


def test_cgroup_blocks_map_each_pid():
    text = "# pid 441\n0::/lxc/200/ns\n# pid 517\n0::/user.slice\n# pid 9\n"
    assert parse_cgroups(text) == {441: 200, 517: None, 9: None}


def _view(apps, containers=(Container(200, "train", ""), Container(201, "eval", "")), gpus=6) -> HostView:
    mib = 1024
    return HostView("pve1", tuple(Container(c.vmid, "running", c.status) for c in containers),
                    gpus=tuple(HostGpu(i, f"b{i}", f"GPU-{i}", 0, 140 * mib, 50) for i in range(gpus)),
                    apps=tuple(GpuApp(pid, f"GPU-{i}", gib * mib, vmid) for pid, i, gib, vmid in apps))


def test_another_ct_on_a_runs_gpu_is_named_with_its_run_and_memory():
    view = _view([(10, 4, 60, 200), (11, 5, 60, 200), (12, 5, 38, 201)])
    lines = render_host.ownership(view, [4, 5], 200, {200: ["train-7b"], 201: ["eval-7b"]})
    assert lines == ["GPU 4: held by CT 200 (run `train-7b`, 60 GiB)",
                     "GPU 5: held by CT 200 (run `train-7b`, 60 GiB)",
                     "GPU 5 is also used by CT 201 (run `eval-7b`, 38 GiB)"]


def test_a_ct_nobody_configured_and_the_host_itself_are_said_so():
    view = _view([(12, 1, 2, None), (13, 2, 3, 201)])
    assert render_host.ownership(view, [0, 1, 2, 9], 200, {}) == [
        "GPU 0: no process holds it", "GPU 1 is used by the host itself (2 GiB)", "GPU 2 is used by CT 201 (3 GiB)",
        "GPU 9: not on pve1 (the host lists 0, 1, 2, 3, 4, 5)"]


def test_processes_of_one_ct_on_one_gpu_add_up():
    view = _view([(10, 0, 10, 200), (11, 0, 5, 200)])
    [h] = holders(view)[0]
    assert (h.vmid, h.used_mib, h.pids) == (200, 15 * 1024, (10, 11))


@pytest.mark.parametrize("view, words", [
    (HostView("pve1", failure="authentication failed for root@10.0.0.5", failure_kind="auth"),
     "host view not permitted on pve1: authentication failed"),
    (HostView("pve1", smi=Smi.FAILED, smi_error="nvidia-smi failed (exit 4): Insufficient Permissions"),
     "host view not permitted on pve1: nvidia-smi failed (exit 4): Insufficient Permissions"),
    (HostView("pve1", smi=Smi.MISSING), "no nvidia-smi on pve1 itself"),
])
def test_a_view_that_cannot_answer_says_why_in_one_line(view, words):
    [line] = render_host.ownership(view, [0], 200, {})
    assert words in line


def test_the_off_line_says_how_to_turn_it_on():
    assert render_host.view_off("pve1") == ("host view: off for pve1 (set host_view = true under [hosts.pve1] "
                                            "to see which CT holds each GPU)")


def test_the_log_is_stdout_first_then_a_log_name_and_the_rest_listed():
    assert choose_log([(3, "/w/ckpt.pt"), (1, "/w/out.txt"), (4, "/w/train.log")]) == ("/w/out.txt", ("/w/train.log", "/w/ckpt.pt"))
    assert choose_log([(3, "/w/ckpt.pt"), (4, "/w/train.log")]) == ("/w/train.log", ("/w/ckpt.pt",))
    assert choose_log([]) == (None, ())


def _found_view() -> HostView:
    scans = {
        200: CtScan(200, (Proc(1, 90, "torchrun --nproc 2 train.py"),
                          Proc(7, 80, "python train.py", ((1, "/w/a \"b\"\\c.log"), (5, "/w/ckpt.pt"))),
                          Proc(8, 80, "python train.py", ((1, "/w/a \"b\"\\c.log"),)))),
        201: CtScan(201, (Proc(3, 10, "python eval.py", ((1, "/e/eval.log"),)),)),
        202: CtScan(202, (Proc(4, 10, "/usr/bin/python3 /usr/bin/networkd-dispatcher"),)),  # a daemon, no file
        203: CtScan(203, error="pct exec 203 failed (exit 255): container '203' not running!"),
    }
    return HostView("pve1", (Container(200, "running", "llama train"), Container(201, "running", "eval"),
                             Container(202, "running", "web"), Container(203, "running", "odd")),
                    gpus=(HostGpu(0, "b", "GPU-0", 1, 2, 3), HostGpu(1, "b", "GPU-1", 1, 2, 3)),
                    apps=(GpuApp(70, "GPU-0", 5, 200), GpuApp(71, "GPU-1", 5, 200)), scans=scans)


def test_discovery_finds_one_run_per_log_and_marks_the_configured_ones():
    found = discovered(_found_view(), [("eval-7b", "pve1", 201, "/e/eval.log"), ("llama-train", "pve2", 200, "/x")])
    assert [(f.name, f.vmid, f.log, f.gpus, f.configured_as) for f in found] == [
        ("llama-train-2", 200, '/w/a "b"\\c.log', (0, 1), None),  # the CT's name was taken (on another host)
        ("eval-7b", 201, "/e/eval.log", (), "eval-7b")]
    assert found[0].others == ("/w/ckpt.pt",)


def test_the_blocks_paste_into_a_valid_config_and_say_what_else_they_saw(tmp_path):
    lines = render_host.discover_lines(_found_view(), discovered(_found_view(), [("eval-7b", "pve1", 201, "/e/eval.log")]),
                                       visible=set())
    text = "\n".join(lines)
    assert "# CT 201: already configured" in text and "eval-7b" not in text  # hidden from this asker: unnamed
    assert "# CT 202 web: no training process found" in text
    assert "# CT 203 odd: pct exec 203 failed (exit 255): container '203' not running!" in text
    pasted = f'[hosts.pve1]\naddress = "10.0.0.5"\n{text}\n'
    runs = parse_registry(pasted, tmp_path / "runs.toml").runs
    assert list(runs) == ["llama-train"]
    assert runs["llama-train"].log == '/w/a "b"\\c.log' and runs["llama-train"].roles == {"train": (0, 1)}
    assert tomllib.loads(pasted)["runs"]["llama-train"]["container"] == 200


def test_host_view_is_off_by_default_and_must_be_a_boolean(tmp_path):
    base = '[hosts.pve1]\naddress = "10.0.0.5"\n'
    assert parse_registry(base, tmp_path / "r.toml").hosts["pve1"].host_view is False
    assert parse_registry(base + "host_view = true\n", tmp_path / "r.toml").hosts["pve1"].host_view is True
    with pytest.raises(ConfigError, match="hosts.pve1.host_view.*true or false"):
        parse_registry(base + 'host_view = "yes"\n', tmp_path / "r.toml")


def test_output_that_is_not_the_scripts_never_raises():
    view = host_view_from_output("pve1", b"\x00\xff garbage @@RB:x@@ pct\n", "abcdefgh12")
    assert view.containers == () and view.apps == () and view.failure is None


def test_only_quoted_assignments_precede_the_constant_body():
    a = build_host_script("abcdefgh12", "skiptoken1", discover=True, proc_root="/tmp/it's here")
    b = build_host_script("abcdefgh34", "skiptoken2", discover=False)
    assert a.split("\nexport LC_ALL=C\nmark()")[1] == b.split("\nexport LC_ALL=C\nmark()")[1]
    assert "PROC_ROOT='/tmp/it'\"'\"'s here'" in a
    with pytest.raises(ValueError):
        build_host_script("bad nonce!", "skiptoken1", discover=True)


# -- a CT's root prints what it likes: it changes its own block, nothing else --------------------------------

NONCE = "abcdefgh12"


def _framed(vmid: int, body: bytes, rc: int = 0, cut: str = "-") -> bytes:
    """A CT's answer as the host frames it: its header, then exactly its bytes."""
    return f"@@CT:{NONCE}@@ {vmid} rc={rc} len={len(body)} cut={cut}\n".encode() + body


def test_a_cts_answer_is_read_by_its_length_as_that_cts_alone():
    # The worst case: CT 200 knows the nonce (it never gets it) and prints CT 201's header and block.
    forged = _framed(201, b"p\t1\t9\tpython steal.py\nf\t1\t1\t/root/.ssh/id_rsa\n")
    raw = (_framed(200, b"p\t4\t5\tpython train.py\nf\t4\t1\t/w/a.log\n" + forged)
           + _framed(201, b"p\t3\t9\tpython eval.py\nf\t3\t1\t/e/eval.log\n")
           + _framed(207, b"p\t1\t5\tpython flood.py\n", rc=141, cut="bytes:1048576")
           + _framed(208, b"p\t1\t5\tpython cut.py\n")[:-3])  # the bot stopped reading inside CT 208's answer
    scans = parse_scans(raw, NONCE)
    assert sorted(scans) == [200, 201, 207]
    assert [f for p in scans[201].procs for f in p.files] == [(1, "/e/eval.log")]
    assert scans[207].cut == Cut(Unit.BYTES, 1 << 20) and scans[207].error is None  # cut: not "exit 141"
    assert {p.pid: p.files for p in scans[200].procs} == {4: ((1, "/w/a.log"),), 1: ((1, "/root/.ssh/id_rsa"),)}
    # ...what it forged stays in its own block: its own CT's file, which it could point at anyway


def test_a_line_separator_in_a_path_is_inside_its_line():
    [proc] = parse_scans(_framed(200, "p\t1\t5\tpython a\u2028b\x85c\nf\t1\t1\t/w/x\u2028y.log\n".encode()),
                         NONCE)[200].procs
    assert proc.args == "python a\u2028b\x85c" and proc.files == ((1, "/w/x\u2028y.log"),)


@pytest.mark.parametrize("text", ['/w/a "b"\\c.log', "/w/\x1b[31mred\x1b[0m", "/w/\u202eevil", "/w/a\u2028b",
                                  "/w/\x85c1\x9b", "/w/tab\there", "/w/`x```", "/w/\U0001F600", "/w/\ufeffbom",
                                  "/w/\x00nul\x7f", "/w/\u200fmark\u061c"])
def test_a_toml_string_holds_any_path_exactly_and_prints_as_text(text):
    spelled = render_host.toml_string(text)
    assert spelled.isprintable() and "`" not in spelled
    assert tomllib.loads(f"k = {spelled}")["k"] == text


@pytest.mark.parametrize("name", ["train-7b", "train.lab.example", "a_b", "7b.v2"])
def test_a_run_name_is_one_toml_key(name):
    assert tomllib.loads(f"[runs.{render_host.toml_key(name)}]\nx = 1\n")["runs"] == {name: {"x": 1}}


SECRET = "hf_" + "Q7w8E9r0T1" * 4


def _hostile_view() -> HostView:
    args = "python train.py " + "x" * 90 + f" --hf_token {SECRET} \x1b]0;title\x07\x1b[2J\u202e\u2028\x9b31m"
    scans = {
        210: CtScan(210, (Proc(1, 5, "python train.py", ((1, "/w/train.log"),)),)),
        211: CtScan(211, (Proc(2, 5, args, ((1, "/w/ok `q` \"x\".log"),)),
                          Proc(3, 5, "python b.py", ((1, "/w/bad\u2028.log"),)),
                          Proc(4, 5, "python c.py", ((1, f"/w/{SECRET}/t.log"),)),
                          Proc(5, 5, "torchrun --nproc 8 d.py"))),
        212: CtScan(212, error="pct exec 212 failed (exit 1): \x1b[31m" + "z" * 3000 + f" token={SECRET}"),
        213: CtScan(213, cut=Cut(Unit.LINES, 20000)),
    }
    names = {210: "train.lab.example", 211: "ctl\x1b[2J\u202eevil", 212: "odd", 213: "flood"}
    return HostView("pve1", tuple(Container(v, "running", n) for v, n in names.items()), scans=scans)


def test_what_a_ct_sent_prints_as_text_bounded_redacted_and_pastes_into_a_valid_config(tmp_path):
    view = _hostile_view()
    lines = render_host.discover_lines(view, discovered(view, []))
    text = "\n".join(lines)
    assert all(line.isprintable() for line in lines), [line for line in lines if not line.isprintable()]
    assert all(len(line) <= 400 for line in lines if not line.startswith("log = "))
    assert SECRET not in text and SECRET[:8] not in text  # redacted before the cut: not a piece of it shows
    assert '[runs."train.lab.example"]  # CT 210 train.lab.example: python train.py' in text
    assert "# CT 213 flood: answer cut at 20000 lines (only what it printed before that was read)" in text
    assert "# CT 212 odd: pct exec 212 failed (exit 1): zzz" in text
    slack = slack_code(render_slack.discover_message("discovered on pve1", lines))
    for pasted in (text, slack):
        runs = parse_registry(f'[hosts.pve1]\naddress = "10.0.0.5"\n{pasted}\n', tmp_path / "runs.toml").runs
        assert {r.container: r.log for r in runs.values()} == {210: "/w/train.log", 211: '/w/ok `q` "x".log'}
        assert set(runs) == {"train.lab.example", "ctl-2J-evil"}


def slack_code(message: dict) -> str:
    """The code blocks of a Slack answer as a user copies them (entities read back)."""
    return html.unescape("\n".join(b["text"]["text"].removeprefix("```\n").removesuffix("\n```")
                                    for b in message["blocks"] if b["type"] == "section"
                                    and b["text"]["text"].startswith("```")))


def test_slack_leaves_out_whole_blocks_never_half_a_line():
    lines = ["# pve1: 300 found"] + [row for i in range(300)
                                     for row in ("", f"[runs.r{i}]", 'host = "pve1"', f'log = "/w/{i}/{"x" * 150}.log"')]
    message = render_slack.discover_message("discovered on pve1", lines)
    code = slack_code(message)
    assert tomllib.loads(code) and code.rstrip().endswith('.log"')
    kept = code.count("[runs.")
    assert 0 < kept < 300
    said = [b["elements"][0]["text"] for b in message["blocks"] if b["type"] == "context"]
    assert said == [f"… {300 - kept} more parts left out, whole (Slack's size limit): `runbot discover` prints them all"]
