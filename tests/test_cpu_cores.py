"""Threads follow the cores the process is given: its CPU affinity, capped by a container's CPU quota (cgroup v2's
cpu.max, v1's cfs quota), which ``os.cpu_count()`` does not see."""

from __future__ import annotations

import os

import pytest

from ppd_core.cpu_cores import cpu_quota, usable_cores


def cgroup(folder, v2: str | None = None, v1: tuple[str, str] | None = None):
    if v2 is not None:
        (folder / "cpu.max").write_text(v2 + "\n")
    if v1 is not None:
        (folder / "cpu").mkdir()
        (folder / "cpu" / "cpu.cfs_quota_us").write_text(v1[0] + "\n")
        (folder / "cpu" / "cpu.cfs_period_us").write_text(v1[1] + "\n")
    return folder


@pytest.mark.parametrize(("v2", "v1", "quota", "cores"), [
    ("max 100000", None, None, 8),  # no quota: the affinity's eight
    ("150000 100000", None, 1.5, 2),  # docker --cpus 1.5: two threads
    ("50000 100000", None, 0.5, 1),  # half a core: one thread
    ("3200000 100000", None, 32.0, 8),  # a quota above the affinity: the affinity
    (None, ("-1", "100000"), None, 8),  # cgroup v1, no quota
    (None, ("200000", "100000"), 2.0, 2),  # cgroup v1, two cores
    ("garbage", None, None, 8),  # unreadable: no quota
    (None, None, None, 8),  # no cgroup files (another OS, no /sys)
])
def test_threads_follow_the_affinity_capped_by_the_cgroup_quota(tmp_path, monkeypatch, v2, v1, quota, cores):
    folder = cgroup(tmp_path, v2, v1)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 64)  # the host's cores: never the answer
    monkeypatch.setattr("ppd_core.cpu_cores.CGROUP", folder)
    assert cpu_quota(folder) == quota
    assert usable_cores() == cores


def test_this_process_gets_at_most_its_affinity_and_a_gguf_runs_on_that_many_threads(monkeypatch):
    from ppd_core.backends.llamacpp.loading import load_gguf
    from ppd_core.loading import default_model_file

    here = usable_cores()
    assert 1 <= here <= (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    monkeypatch.setattr("ppd_core.backends.llamacpp.decoder.usable_cores", lambda: 1)  # a one-core container
    loaded = load_gguf(default_model_file(), "default", "cpu", 0, 0)
    try:
        assert loaded.info.threads == 1
    finally:
        loaded.backend.close()


def test_torch_threads_are_lowered_to_the_usable_cores_never_raised(monkeypatch):
    import torch

    from ppd_core.backends.torch.device import fit_threads_to_cores

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        monkeypatch.setattr("ppd_core.backends.torch.device.usable_cores", lambda: 2)  # torch counted 4: a 2-CPU quota
        fit_threads_to_cores()
        assert torch.get_num_threads() == 2
        monkeypatch.setattr("ppd_core.backends.torch.device.usable_cores", lambda: 8)
        fit_threads_to_cores()
        assert torch.get_num_threads() == 2  # a thread count the user set lower stays
    finally:
        torch.set_num_threads(before)
