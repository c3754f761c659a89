"""A worker's pool fitted to its GPU as it is when the worker starts (plugins/rmm/setup.py: fit).

The arithmetic runs here; the NVML read and the allocation run on the GPU machine
(lab/device-runs/2026-12-01-shapes-h200-sequential.json.gz, docs/memory.md)."""

from __future__ import annotations

import pytest

from gpudask.errors import GpudaskError
from gpudask.plugins.rmm.setup import fit

GiB = 2**30
TOTAL = 140 * GiB


def section(initial, default=True, maximum=None, allocator="pool"):
    return {"allocator": allocator, "initial_pool_size": initial, "maximum_pool_size": maximum,
            "gpu": "GPU-0000", "fit_to_free": default}


def test_a_pool_that_fits_is_left_alone():
    memory = section(70 * GiB)
    assert fit(memory, 139 * GiB, TOTAL, "worker 0") == (memory, None)


def test_a_default_pool_that_no_longer_fits_starts_at_half_of_what_is_free():
    fitted, line = fit(section(70 * GiB), 69 * GiB, TOTAL, "worker 0")
    assert fitted["initial_pool_size"] == int(34.5 * GiB) // 256 * 256
    assert line.startswith("worker 0: the default RMM pool planned at 70.0 GiB does not fit on GPU GPU-0000 "
                           "(69.0 GiB of 140.0 GiB free now, other processes hold 71.0 GiB): it starts at 34.5 GiB")
    assert "\n" not in line


def test_a_maximum_equal_to_the_initial_size_follows_it_down():
    fitted, _ = fit(section(70 * GiB, maximum=70 * GiB), 20 * GiB, TOTAL, "worker 1")
    assert fitted["maximum_pool_size"] == fitted["initial_pool_size"] == 10 * GiB


def test_an_explicit_size_that_does_not_fit_is_one_line():
    with pytest.raises(GpudaskError) as e:
        fit(section(70 * GiB, default=False), 60 * GiB, TOTAL, "worker 0")
    text = str(e.value)
    assert "\n" not in text and text.startswith("gpudask.rmm.pool-size: the pool of")
    assert "60.0 GiB of 140.0 GiB free now" in text and "accepted: at most" in text


def test_no_room_at_all_is_one_line():
    with pytest.raises(GpudaskError) as e:
        fit(section(70 * GiB), 1 * GiB, TOTAL, "worker 3")
    assert "no room for worker 3's default pool" in str(e.value) and "pool-size: false" in str(e.value)


def test_no_pool_nothing_to_fit():
    memory = section(None, allocator="managed")
    assert fit(memory, 0, TOTAL, "worker 0") == (memory, None)
