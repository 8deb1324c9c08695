"""benchmarks/gpu_kit.py end to end on a small real kit: the project's own wheel, built from the
checkout's HEAD, packed into 100 KiB parts, installed through the real command into a fresh
target and imported from there; a corrupt and a missing part each stop the install, named."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from bench_scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_kit.py"
STEM = "nightshift-kit-cp312.tar.xz"


def _kit_module():
    return load_script("gpu_kit")


def _run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=cwd)


@pytest.fixture(scope="module")
def kit(tmp_path_factory) -> Path:
    """A kit of the project's wheel alone (no download: an empty wheel folder), in 100 KiB parts."""
    if shutil.which("xz") is None or shutil.which("git") is None:
        pytest.skip("building a kit needs the xz and git binaries")
    base = tmp_path_factory.mktemp("gpu_kit")
    (base / "wheels").mkdir()
    done = _run("build", "--out", base / "kit", "--wheels", base / "wheels", "--only", "nightshift",
                "--part-mib", "0.1", "--level", "6", "--smoke", "tuner")  # fmt: skip
    assert done.returncode == 0, done.stderr
    return base / "kit"


def _copy(kit: Path, to: Path) -> Path:
    shutil.copytree(kit, to)
    return to


@pytest.mark.slow
def test_build_splits_into_checked_parts(kit):
    manifest = json.loads((kit / "manifest.json").read_text())
    parts = manifest["parts"]
    assert len(parts) >= 3, "a 0.1 MiB part size should split the project wheel's tree"
    assert [p["name"] for p in parts] == [f"{STEM}.{i:03d}" for i in range(len(parts))]
    assert all(p["bytes"] <= manifest["part_bytes_max"] for p in parts)
    assert sum((kit / p["name"]).stat().st_size for p in parts) == manifest["total_bytes"]
    assert [p["name"] for p in manifest["packages"]] == ["nightshift"]
    assert manifest["python_tag"] == "cp312" and manifest["smoke_imports"] == ["tuner"]
    # What the project requires and this kit leaves out is listed for install's check.
    assert "apache-tvm-ffi" in manifest["expected_on_machine"]
    assert _run("verify", "--kit", kit).returncode == 0


@pytest.mark.slow
def test_install_unpacks_and_imports_from_the_target(kit, tmp_path):
    target = tmp_path / "target"
    # The suite may run on 3.11: the project wheel is pure Python, so the kit imports there too.
    done = _run("install", "--kit", kit, "--target", target, "--any-python", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "smoke test ok" in done.stdout
    assert f"export PYTHONPATH={target / 'site'}" in done.stdout
    probe = subprocess.run([sys.executable, "-c", "import tuner; print(tuner.__file__)"], capture_output=True,
                           text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target / "site")})  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert Path(probe.stdout.strip()).is_relative_to(target / "site")
    # The console scripts now start this machine's Python, not the builder's.
    script = target / "bin" / "nightshift"
    assert script.read_text().splitlines()[0] == f"#!{sys.executable}"
    # A second install into the same target needs --force.
    again = _run("install", "--kit", kit, "--target", target, "--any-python", "--no-smoke")
    assert again.returncode == 1 and "--force" in again.stderr


@pytest.mark.slow
def test_a_corrupt_part_is_named_and_nothing_is_unpacked(kit, tmp_path):
    broken = _copy(kit, tmp_path / "kit")
    part = broken / f"{STEM}.001"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    part.write_bytes(bytes(data))
    done = _run("install", "--kit", broken, "--target", tmp_path / "target", "--any-python")
    assert done.returncode == 1
    assert f"part {STEM}.001 is corrupt" in done.stderr
    assert not (tmp_path / "target" / "site").exists()
    assert _run("verify", "--kit", broken).returncode == 1


@pytest.mark.slow
def test_a_missing_part_is_named(kit, tmp_path):
    broken = _copy(kit, tmp_path / "kit")
    (broken / f"{STEM}.002").unlink()
    done = _run("install", "--kit", broken, "--target", tmp_path / "target", "--any-python")
    assert done.returncode == 1
    assert f"part {STEM}.002 is missing" in done.stderr


@pytest.mark.slow
def test_parts_may_arrive_in_several_folders(kit, tmp_path):
    """One device call per part: each lands in a folder of its own."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    manifest = json.loads((kit / "manifest.json").read_text())
    shutil.copy(kit / "manifest.json", first)
    for i, p in enumerate(manifest["parts"]):
        shutil.copy(kit / p["name"], first if i % 2 else second)
    done = _run("install", "--kit", first, second, "--target", tmp_path / "target", "--any-python", "--no-smoke")
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
@pytest.mark.skipif(sys.version_info[:2] == (3, 12), reason="this Python is the kit's")
def test_install_refuses_another_python(kit, tmp_path):
    done = _run("install", "--kit", kit, "--target", tmp_path / "target")
    assert done.returncode == 1 and "this kit is for Python 3.12" in done.stderr


def test_records_follow_the_slimmed_tree(tmp_path):
    """After slimming, RECORD lists what is there: removed files go, changed files get their hash."""
    gpu_kit = _kit_module()
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg-1.0.dist-info").mkdir()
    (site / "pkg" / "kept.py").write_text("x = 1\n")
    (site / "pkg" / "changed.so").write_bytes(b"a" * 10)
    rows = [["pkg/kept.py", "sha256=abc", "6"], ["pkg/changed.so", "sha256=old", "100"],
            ["pkg/removed.py", "sha256=def", "3"], ["pkg-1.0.dist-info/RECORD", "", ""]]  # fmt: skip
    with (site / "pkg-1.0.dist-info" / "RECORD").open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    gpu_kit.refresh_records(site)
    after = list(csv.reader((site / "pkg-1.0.dist-info" / "RECORD").read_text().splitlines()))
    assert [r[0] for r in after] == ["pkg/kept.py", "pkg/changed.so", "pkg-1.0.dist-info/RECORD"]
    assert after[0] == rows[0]
    assert after[1][2] == "10" and after[1][1] != "sha256=old"


def test_parts_join_back_to_the_stream(tmp_path):
    """split_stream's parts, read back with their checks, give the bytes that went in."""
    import io

    gpu_kit = _kit_module()
    data = os.urandom(250_000)
    parts = gpu_kit.split_stream(io.BytesIO(data), tmp_path, "x", 100_000)
    assert [p["bytes"] for p in parts] == [100_000, 100_000, 50_000]
    manifest = {"parts": parts}
    paths = gpu_kit.locate_parts(manifest, [tmp_path])
    assert gpu_kit._Joined(paths).read() == data
