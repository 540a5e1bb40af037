"""bot.core.humanize: one size formatter, whose labels say the powers of 1024 it counts in."""

from __future__ import annotations

import pytest

from bot.core import humanize as hz


@pytest.mark.parametrize("nbytes, text", [
    (0, "0 B"), (980, "980 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536, "1.5 KiB"),
    (12_400_000, "12 MiB"), (3 * 2**30 + 2**29, "3.5 GiB"), (2**40, "1 TiB"), (None, "?"),
])
def test_size_names_the_powers_of_1024_it_divides_by(nbytes, text):
    assert hz.size(nbytes) == text


def test_a_size_that_rounds_to_1024_moves_up_a_unit():
    assert hz.size(1024 * 1024 - 100) == "1 MiB"  # not "1024 KiB"


@pytest.mark.parametrize("mib, text", [
    (43747, "43 GiB"), (96871, "95 GiB"), (10240, "10 GiB"), (3733, "3.6 GiB"), (4, "0 GiB"), (0, "0 GiB"),
])
def test_gpu_memory_is_mib_divided_by_1024_and_said_in_gib(mib, text):
    assert hz.gib(mib) == text


def test_gpu_memory_side_by_side_shares_one_unit():
    assert hz.gib(30000, 143771) == "29/140 GiB"
    assert hz.gib(43747, 77000, sep="–") == "43–75 GiB"


def test_no_size_is_labelled_in_decimal_units():
    """Both formatters divide by 1024: a "GB" or "KB" label would claim powers of 1000."""
    for n in (10**3, 10**6, 10**9, 10**12, 2**20, 2**30):
        assert hz.size(n).split()[-1] in ("B", "KiB", "MiB", "GiB", "TiB")


@pytest.mark.parametrize("cmdline, short", [
    ("/usr/bin/python3 -u /home/me/proj/job.py --config /home/me/proj/run.yaml", "job.py --config run.yaml"),
    ("python -X dev -W ignore train.py --lr 3e-4", "train.py --lr 3e-4"),
    ("env CUDA_VISIBLE_DEVICES=0,1 /opt/conda/bin/python3.11 train.py", "train.py"),
    ("/opt/conda/bin/python -m torch.distributed.run --nproc 8 /w/train.py", "python -m torch.distributed.run --nproc 8 train.py"),
    ("/usr/local/bin/torchrun --nproc_per_node 8 train.py --out=/ckpt/run7/", "torchrun --nproc_per_node 8 train.py --out=run7"),
    ("bash -c LOG=/tmp/a.log exec sleep", "bash -c LOG=a.log exec sleep"),  # a shell is the program, not an interpreter to drop
    ("/usr/bin/python3", "python3"),
    ("python3 -u", "python3 -u"),
    ("python fetch.py http://example.com/a/b", "fetch.py http://example.com/a/b"),
])
def test_a_command_line_is_its_script_and_arguments_shortened(cmdline, short):
    assert hz.command(cmdline) == short


def test_a_long_command_line_is_cut_at_a_word():
    out = hz.command("python train.py " + " ".join(f"--flag{i} {i}" for i in range(30)), 40)
    assert len(out) <= 40 and out.endswith("…") and out.startswith("train.py --flag0 0")
