"""The CPUs a process may use: its cores capped by its cgroup's quota (cgroup trees written
into a temporary folder, as a container would see them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.config import cpus


def tree(tmp_path: Path, files: dict[str, str], own: str = "") -> tuple[Path, Path]:
    for name, text in files.items():
        path = tmp_path / "cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    proc = tmp_path / "proc-cgroup"
    proc.write_text(f"0::/{own}\n")
    return tmp_path / "cgroup", proc


def test_v2_quota_in_cpus(tmp_path: Path) -> None:
    root, proc = tree(tmp_path, {"cpu.max": "150000 100000\n"})
    assert cpus.cgroup_cpu_limit(root, proc) == 1.5


def test_no_limit_is_none(tmp_path: Path) -> None:
    root, proc = tree(tmp_path, {"cpu.max": "max 100000\n"})
    assert cpus.cgroup_cpu_limit(root, proc) is None
    assert cpus.cgroup_cpu_limit(tmp_path / "nothing", proc) is None


def test_v2_takes_the_tightest_of_its_cgroup_and_ancestors(tmp_path: Path) -> None:
    root, proc = tree(
        tmp_path,
        {"kubepods/cpu.max": "400000 100000", "kubepods/pod1/cpu.max": "max 100000", "cpu.max": "max 100000"},
        own="kubepods/pod1",
    )
    assert cpus.cgroup_cpu_limit(root, proc) == 4.0


def test_v1_quota_and_period(tmp_path: Path) -> None:
    root, proc = tree(tmp_path, {"cpu/cpu.cfs_quota_us": "200000", "cpu/cpu.cfs_period_us": "100000"})
    assert cpus.cgroup_cpu_limit(root, proc) == 2.0
    root, proc = tree(
        tmp_path / "unlimited", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}
    )
    assert cpus.cgroup_cpu_limit(root, proc) is None


def test_usable_cpus_is_the_cores_capped_by_the_quota_rounded_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpus, "affinity_count", lambda: 64)
    root, proc = tree(tmp_path, {"cpu.max": "150000 100000"})
    assert cpus.usable_cpus(root, proc) == 2
    root, proc = tree(tmp_path / "tiny", {"cpu.max": "10000 100000"})
    assert cpus.usable_cpus(root, proc) == 1
    root, proc = tree(tmp_path / "none", {"cpu.max": "max 100000"})
    assert cpus.usable_cpus(root, proc) == 64
