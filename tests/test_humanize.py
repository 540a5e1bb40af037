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
