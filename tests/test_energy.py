"""The package energy counter (sdk.powercap) against fake powercap trees, and `bench --energy` through the CLI."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from apps.main import app
from sdk import powercap, runtime
from sdk.errors import EnergyCounterUnavailable
from sdk.session import Session

from .conftest import FIXTURES
from .test_npu_backend import build, fake_npu  # noqa: F401  (a fixture)

runner = CliRunner()
MAX_RANGE = 65_535_999_984  # a 32-bit counter in units of 2^-16 J (the energy unit AMD Zen reports)


def zone(root: Path, folder: str, name: str, uj: int, max_range: int = MAX_RANGE) -> Path:
    z = root / folder
    z.mkdir(parents=True)
    (z / "name").write_text(name + "\n")
    (z / "energy_uj").write_text(f"{uj}\n")
    (z / "max_energy_range_uj").write_text(f"{max_range}\n")
    return z


def set_uj(z: Path, uj: int) -> None:
    (z / "energy_uj").write_text(f"{uj}\n")


def add_uj(z: Path, uj: int) -> None:
    set_uj(z, int((z / "energy_uj").read_text()) + uj)


def test_counter_sums_package_zones_only(tmp_path):
    p0 = zone(tmp_path, "intel-rapl:0", "package-0", 5_000_000)
    p1 = zone(tmp_path, "intel-rapl:1", "package-1", 7_000_000)
    core = zone(tmp_path, "intel-rapl:0:0", "core", 1_000)             # a sub-domain inside package 0
    mmio = zone(tmp_path, "intel-rapl-mmio:0", "package-0", 5_000_000)  # Intel's second view of package 0
    (tmp_path / "intel-rapl").mkdir()                                   # the control type itself has no counter
    counter = powercap.PackageEnergy(tmp_path)
    assert [d.name for d in counter.domains] == ["package-0", "package-1"]
    assert counter.domains[0].max_range_uj == MAX_RANGE
    with counter.measure() as interval:
        add_uj(p0, 1_500_000)
        add_uj(p1, 500_000)
        add_uj(core, 99_000_000)
        add_uj(mmio, 99_000_000)
    assert interval.joules == pytest.approx(2.0)
    assert interval.seconds > 0 and interval.watts == pytest.approx(2.0 / interval.seconds)


def test_a_counter_that_wraps_to_zero_counts_across_the_wrap(tmp_path):
    assert powercap.elapsed_uj(100, 350, 1000) == 250
    assert powercap.elapsed_uj(900, 50, 1000) == 150
    p0 = zone(tmp_path, "intel-rapl:0", "package-0", MAX_RANGE - 300_000)
    counter = powercap.PackageEnergy(tmp_path)
    with counter.measure() as interval:
        set_uj(p0, 200_000)  # wrapped: 0.3 J up to the top, 0.2 J after it
    assert interval.joules == pytest.approx(0.5)


def test_missing_counter_says_how_to_load_the_driver(tmp_path):
    with pytest.raises(EnergyCounterUnavailable) as e:
        powercap.PackageEnergy(tmp_path / "powercap")
    assert "does not exist" in e.value.message and "modprobe intel_rapl_msr" in e.value.fix
    zone(tmp_path, "intel-rapl:0:0", "core", 0)  # a tree with no package zone
    with pytest.raises(EnergyCounterUnavailable) as e:
        powercap.PackageEnergy(tmp_path)
    assert "no RAPL package zone" in e.value.message


def deny_reading(monkeypatch, path: Path) -> None:
    """energy_uj as the kernel ships it: mode 0400, root only. Root ignores file modes, so as root the open
    is made to fail the way it fails for everyone else."""
    path.chmod(0o400)
    if os.geteuid() != 0:
        return
    real_open = open

    def open_as_user(file, *args, **kwargs):
        if Path(file) == path:
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)
    monkeypatch.setattr(powercap, "open", open_as_user, raising=False)


def test_an_unreadable_counter_gives_the_commands_that_allow_it(tmp_path, monkeypatch):
    p0 = zone(tmp_path, "intel-rapl:0", "package-0", 0)
    deny_reading(monkeypatch, p0 / "energy_uj")
    with pytest.raises(EnergyCounterUnavailable) as e:
        powercap.PackageEnergy(tmp_path)
    assert "readable by root only" in e.value.message
    assert f"chmod o+r {p0 / 'energy_uj'}" in e.value.fix
    assert "/etc/udev/rules.d/" in e.value.fix and 'RUN+="/bin/chmod o+r /sys%p/energy_uj"' in e.value.fix


def test_a_counter_that_is_not_a_number_is_unavailable_not_a_crash(tmp_path):
    p0 = zone(tmp_path, "intel-rapl:0", "package-0", 0)
    (p0 / "energy_uj").write_text("n/a\n")
    with pytest.raises(EnergyCounterUnavailable, match="not a count of microjoules"):
        powercap.PackageEnergy(tmp_path)


@pytest.fixture
def no_npu(monkeypatch):
    monkeypatch.setattr(runtime, "npu_problem", lambda: "no NPU device node (faked by the test)")


def bench_energy(*extra):
    return runner.invoke(app, ["bench", str(FIXTURES / "bert"), "--device", "cpu", "--length", "8", "--runs", "4",
                               "--energy", *extra])


def test_bench_energy_reports_joules_per_run_against_the_idle_baseline(tmp_path, monkeypatch, no_npu):
    p0 = zone(tmp_path, "intel-rapl:0", "package-0", MAX_RANGE - 250_000)  # wraps during the measured runs
    monkeypatch.setattr(powercap, "ROOT", tmp_path)
    real_run = Session.run

    def run_costing_a_tenth_of_a_joule(self, *args, **kwargs):
        out = real_run(self, *args, **kwargs)
        current = int((p0 / "energy_uj").read_text())
        set_uj(p0, (current + 100_000) % MAX_RANGE)
        return out
    monkeypatch.setattr(Session, "run", run_costing_a_tenth_of_a_joule)
    r = bench_energy("--json")
    assert r.exit_code == 0, r.output
    energy = json.loads(r.stdout)["energy"]
    assert energy["counter"] == {"available": True, "domains": ["package-0"]}
    assert energy["idle"]["joules"] == 0 and energy["idle"]["seconds"] > 0  # nothing ran while idle
    (row,) = energy["cpu"]["entries"].values()
    assert row["runs"] == 4 and row["joules_per_run"] == pytest.approx(0.1)
    assert row["joules_per_run_above_idle"] == pytest.approx(0.1)
    assert row["package_watts"] == pytest.approx(0.4 / row["seconds"], rel=1e-3)
    assert energy["cpu"]["device"]["device_effective"] == "cpu"
    assert "faked by the test" in energy["npu"]["unavailable"]

    text = bench_energy()
    assert text.exit_code == 0, text.output
    assert "energy per run (package-0 energy counter; idle baseline 0.00 W" in text.stdout
    assert "0.1 J per run (0.1 J above idle)" in text.stdout
    assert "npu: unavailable: the NPU cannot be used: no NPU device node (faked by the test)" in text.stdout


def test_bench_energy_without_a_counter_still_prints_the_timings(tmp_path, monkeypatch, no_npu):
    monkeypatch.setattr(powercap, "ROOT", tmp_path / "no-powercap")
    r = bench_energy()
    assert r.exit_code == 0, r.output
    assert f"energy counter unavailable: {tmp_path / 'no-powercap'} does not exist" in r.stdout
    assert re.search(r"^  cpu forward_b1_t16: [\d.]+ (ms|us) per run$", r.stdout, re.M)
    assert "npu: unavailable" in r.stdout
    assert "modprobe intel_rapl_msr" in r.stderr and "Traceback" not in r.output

    p0 = zone(tmp_path, "intel-rapl:0", "package-0", 0)
    deny_reading(monkeypatch, p0 / "energy_uj")
    monkeypatch.setattr(powercap, "ROOT", tmp_path)
    r = bench_energy("--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    counter = report["energy"]["counter"]
    assert not counter["available"] and "readable by root only" in counter["reason"]
    assert f"chmod o+r {p0 / 'energy_uj'}" in counter["fix"]
    (row,) = report["energy"]["cpu"]["entries"].values()
    assert row["joules_per_run"] is None and row["ms_per_run"] > 0
    assert report["energy"]["idle"] is None


def test_energy_with_estimate_only_is_a_usage_error():
    r = runner.invoke(app, ["bench", str(FIXTURES / "bert"), "--estimate-only", "--energy"])
    assert r.exit_code == 2 and "--estimate-only" in r.stderr


def test_bench_energy_puts_the_npu_row_beside_the_cpu_row(tmp_path, monkeypatch, fake_npu):
    """With a (fake) Ryzen AI machine: both devices measured, each run charged its own energy. EMULATED."""
    from apps import bench
    prebuilt = fake_npu("npu2")
    family, cfg, weights, folder = bench._load(str(FIXTURES / "bert"))
    build(bench._graphs(family, cfg, 8, folder)[0], "npu2", prebuilt)
    p0 = zone(tmp_path / "powercap", "intel-rapl:0", "package-0", 0)
    monkeypatch.setattr(powercap, "ROOT", tmp_path / "powercap")
    real_run = Session.run
    cost_uj = {"cpu": 100_000, "npu": 40_000}

    def run_charged_by_device(self, *args, **kwargs):
        out = real_run(self, *args, **kwargs)
        add_uj(p0, cost_uj[self.device_effective])
        return out
    monkeypatch.setattr(Session, "run", run_charged_by_device)
    r = bench_energy("--json")
    assert r.exit_code == 0, r.output
    energy = json.loads(r.stdout)["energy"]
    assert energy["npu"]["device"]["device_effective"] == "npu"
    for device, uj in cost_uj.items():
        (row,) = energy[device]["entries"].values()
        assert row["joules_per_run"] == pytest.approx(uj / 1e6)
    text = bench_energy()
    assert re.search(r"^  npu forward_b1_t16: .* per run, 0\.04 J per run \(", text.stdout, re.M), text.stdout
