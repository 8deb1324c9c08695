"""The GPU kit: everything ``tune`` needs on a PyTorch machine with Python 3.12 and no network.

Two steps, on two machines:

    # here (network, pip): the project and its cp312 wheels, installed into a staging
    # folder, slimmed, packed into one xz stream and cut into parts with a manifest
    nice -n 19 python benchmarks/gpu_kit.py build --out build/gpu_kit
    # there (Python 3.12 stdlib only, no network, no index): check, join, unpack, smoke-import
    python3 benchmarks/gpu_kit.py install --kit build/gpu_kit --target /tmp/kit
    export PYTHONPATH=/tmp/kit/site PATH=/tmp/kit/bin:$PATH   # as `install` prints it

Design: ``build`` installs every wheel here with ``pip install --target --no-deps`` for
cp312/manylinux (pip does the wheel-to-tree work, ``.data`` folders and all), slims that tree
(Ray's jar, UI and libraries, stripped binaries; every RECORD rewritten to what remains), and
ships the tree itself. Installing on the GPU machine is then untar, ``compileall`` (with that
machine's Python and cores) and ``PYTHONPATH``: no pip, no wheel repacking, no resolver that
could go looking for an index. ``PYTHONPATH`` puts the kit
ahead of site-packages, which is what we want for the pinned packages (apache-tvm-ffi
0.1.14.post1 above all); the machine's own packages fill in what the kit leaves out.

What the kit leaves out is explicit (``ASSUMED``): the packages a PyTorch machine has, per
profile, each with its reason; ``install`` checks that every one the kit's packages require is
importable there and satisfies their specifiers, and names any that is not. Compression is xz
(with the x86 filter, which shrinks machine code), because Python's ``lzma`` reads it: the
other side needs no ``xz`` or ``zstd`` binary. ``--codec zstd`` exists for comparison; its
kit needs the ``zstd`` binary where it is installed.

A device call carries at most 64 MiB *including the working tree* (about 16 MiB here), so the
default part is 44 MiB: one part per call with room for the tree to grow.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import datetime
import hashlib
import io
import json
import logging
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

logger = logging.getLogger("gpu_kit")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MANIFEST = "manifest.json"
FORMAT = 1
PYTHON_VERSION = "3.12"
PYTHON_TAG = "cp312"
# pip matches each manylinux tag exactly, so every one a wheel of our closure uses is listed;
# the PyTorch machine has glibc >= 2.28 (CUDA 13 requires it).
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_12_x86_64", "manylinux2010_x86_64", "manylinux_2_5_x86_64",
             "manylinux1_x86_64")  # fmt: skip
# Extras of our requirements that pull dependencies (pyproject: ray[default], psycopg[binary]);
# their Requires-Dist lines are evaluated with these extras set.
EXTRAS = {"ray": ("default",), "psycopg": ("binary",)}
# The default part: 64 MiB per call minus the working tree that travels with it (~16 MiB).
DEFAULT_PART_MIB = 44.0
DEFAULT_LEVEL = {"xz": "9", "zstd": "19"}

#: Packages the GPU machine already has, by profile. ``pytorch``: what any PyTorch 2.x install
#: brings (torch's own Requires-Dist) plus numpy, which every PyTorch machine in practice has.
#: ``h200-image``: the verification H200's image ('cuda', read 2026-11-17 from the device
#: tool's package list), which also has SciPy, gRPC, aiohttp, protobuf, rich... Only names that
#: the kit's packages require matter; ``install`` checks each of those on the machine.
_PYTORCH = {
    "torch": "the machine's PyTorch (never shipped: GBs, and built for its CUDA)",
    "numpy": "every PyTorch machine has it; tvm, xgboost and optuna take any numpy 2",
    "filelock": "torch requires it", "typing-extensions": "torch requires it", "sympy": "torch requires it",
    "mpmath": "torch requires it (via sympy)", "networkx": "torch requires it", "jinja2": "torch requires it",
    "markupsafe": "torch requires it (via jinja2)", "fsspec": "torch requires it", "setuptools": "torch requires it",
    "triton": "torch's CUDA build requires it",
}  # fmt: skip
_H200_IMAGE = {
    **_PYTORCH,
    **{name: "in the H200 image" for name in (
        "aiohappyeyeballs", "aiohttp", "aiosignal", "attrs", "certifi", "charset-normalizer", "click",
        "cloudpickle", "frozenlist", "grpcio", "idna", "markdown-it-py", "mdurl", "ml-dtypes", "msgpack",
        "multidict", "packaging", "prometheus-client", "propcache", "protobuf", "psutil", "pygments", "pyyaml",
        "requests", "rich", "scipy", "six", "tqdm", "urllib3", "wrapt", "yarl")},
}  # fmt: skip
ASSUMED: dict[str, dict[str, str]] = {"pytorch": _PYTORCH, "h200-image": _H200_IMAGE}
#: Prefixes of distributions a PyTorch machine has in any profile: CUDA's libraries as wheels.
ASSUMED_PREFIXES = ("nvidia-", "cuda-")

#: Distributions `tune` never imports, left out although something requires them.
DROPPED = {
    "psycopg-binary": "libpq for PostgreSQL; the GPU machine's database is SQLite (psycopg itself stays)",
    "py-spy": "a profiler binary for the Ray dashboard's stack view; the dashboard is off in `tune`",
}
#: Paths inside the installed tree that `tune` never uses, removed with the reason.
SLIM_PATHS = {
    "ray/jars": "Java workers (ray_dist.jar, 34 MB)",
    "ray/dashboard/client/build": "the dashboard's web UI; `tune` starts Ray without a dashboard",
    "ray/rllib": "Ray's libraries: `tune` uses Ray core only",
    "ray/data": "Ray's libraries: `tune` uses Ray core only",
    "ray/serve": "Ray's libraries: `tune` uses Ray core only",
    "ray/train": "Ray's libraries: `tune` uses Ray core only",
    "ray/tune": "Ray's libraries: `tune` uses Ray core only",
}
#: Trees whose ELF files get `strip --strip-unneeded` (Ray ships its binaries with symbols;
#: TVM's libraries are already stripped).
STRIP_UNDER = ("ray",)
#: What `install` imports to call the kit good, where the kit holds them.
SMOKE = ("tvm_ffi", "tvm", "ray", "xgboost", "optuna", "sqlalchemy", "alembic", "tuner", "search_spaces",
         "cost_models")  # fmt: skip


class KitError(Exception):
    """A kit that cannot be built or installed, with the reason a person acts on."""


def canonical(name: str) -> str:
    """PEP 503 name: ``Apache_TVM`` and ``apache.tvm`` are ``apache-tvm``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name_version(path: Path) -> tuple[str, str]:
    """Distribution name and version from a wheel's file name."""
    name, version = path.name.split("-")[:2]
    return canonical(name), version


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# ----- build (here: pip, network, packaging) --------------------------------------------------


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    logger.info("$ %s", " ".join(cmd))
    done = subprocess.run(cmd, text=True, capture_output=True, **kwargs)
    if done.returncode != 0:
        raise KitError(f"{cmd[0]} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return done


def project_wheel(project: Path, into: Path) -> tuple[Path, dict[str, Any]]:
    """Build the project's wheel from its last commit (``git archive HEAD``), not from a working
    tree that others may be editing, so that the kit says which commit it carries."""
    commit = _run(["git", "-C", str(project), "rev-parse", "HEAD"]).stdout.strip()
    dirty = bool(_run(["git", "-C", str(project), "status", "--porcelain", "--untracked-files=no"]).stdout.strip())
    with tempfile.TemporaryDirectory(prefix="gpu_kit_src_") as tmp:
        archive = subprocess.run(["git", "-C", str(project), "archive", "HEAD"], capture_output=True, check=True)
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        # No build isolation: setuptools comes from this environment, so no index is needed.
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(into), tmp])
    wheels = sorted(into.glob("nightshift-*.whl"))
    if not wheels:
        raise KitError(f"pip wheel wrote no nightshift wheel into {into}")
    return wheels[-1], {"commit": commit, "working_tree_had_changes": dirty}


def download(requirement: Path, into: Path) -> None:
    """``pip download`` the closure of ``requirement`` for CPython 3.12 on manylinux x86-64."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", PYTHON_VERSION,
           "--implementation", "cp", "-d", str(into)]  # fmt: skip
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    _run([*cmd, str(requirement)])


def _requires(wheel: Path) -> list[str]:
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        text = z.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def requirements_of(wheels: Iterable[Path]) -> dict[str, list[dict[str, str]]]:
    """Who requires what, for CPython 3.12 on Linux: canonical name -> [{by, specifier}]."""
    from packaging.requirements import Requirement

    env = {"python_version": PYTHON_VERSION, "python_full_version": f"{PYTHON_VERSION}.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython"}  # fmt: skip
    needs: dict[str, list[dict[str, str]]] = {}
    for wheel in wheels:
        by, _ = wheel_name_version(wheel)
        for line in _requires(wheel):
            req = Requirement(line)
            extras = ("", *EXTRAS.get(by, ()))
            if req.marker is not None and not any(req.marker.evaluate({**env, "extra": e}) for e in extras):
                continue
            needs.setdefault(canonical(req.name), []).append({"by": by, "specifier": str(req.specifier)})
    return needs


def _is_elf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"\x7fELF"


def slim(site: Path) -> list[dict[str, Any]]:
    """Remove what `tune` never uses and strip Ray's binaries; returns what was done."""
    done: list[dict[str, Any]] = []
    for rel, why in SLIM_PATHS.items():
        path = site / rel
        if path.exists():
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
            done.append({"removed": rel, "bytes": size, "why": why})
    if shutil.which("strip") is None:
        logger.warning("no `strip` here: Ray's binaries keep their symbols")
        return done
    for top in STRIP_UNDER:
        saved = 0
        for f in sorted((site / top).rglob("*")) if (site / top).exists() else []:
            if f.is_file() and not f.is_symlink() and _is_elf(f):
                before = f.stat().st_size
                subprocess.run(["strip", "--strip-unneeded", str(f)], check=True, capture_output=True)
                saved += before - f.stat().st_size
        done.append({"stripped": top, "bytes": saved, "why": "debug symbols; `strip --strip-unneeded`"})
    return done


def refresh_records(site: Path) -> None:
    """Rewrite every RECORD to the tree as it now is: rows of removed files go, a changed
    file gets its new hash and size, so `pip` there would still see a consistent install."""
    for record in site.glob("*.dist-info/RECORD"):
        rows = list(csv.reader(record.read_text().splitlines()))
        kept = []
        for row in rows:
            if not row:
                continue
            path = site / row[0]
            if not path.is_file():
                continue
            if len(row) >= 3 and row[2] and int(row[2]) != path.stat().st_size:
                digest = base64.urlsafe_b64encode(bytes.fromhex(sha256_file(path))).rstrip(b"=").decode()
                row = [row[0], f"sha256={digest}", str(path.stat().st_size)]
            kept.append(row)
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(kept)
        record.write_text(out.getvalue())


def stage(wheels: list[Path], into: Path) -> None:
    """Install ``wheels`` (no dependencies) into ``into/site`` as CPython 3.12 would see them."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
           "--no-warn-script-location", "--only-binary=:all:", "--python-version", PYTHON_VERSION,
           # pip checks Requires-Python against the Python it runs on, not --python-version:
           # the closure was resolved for 3.12 (xgboost-cpu 3.4 requires it) by `download`.
           "--ignore-requires-python",
           "--implementation", "cp", "--target", str(into / "site")]  # fmt: skip
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    _run([*cmd, *map(str, wheels)])
    # Console scripts: their shebang names this machine's Python; `install` rewrites it.
    if (into / "site" / "bin").is_dir():
        shutil.move(into / "site" / "bin", into / "bin")


def compress_command(codec: str, level: str, threads: int) -> list[str]:
    """The compressor, niced: it is the expensive step on a shared machine."""
    if codec == "xz":
        # --x86: the BCJ filter, which makes machine code (most of the bytes) compress better.
        return ["nice", "-n", "19", "xz", "--x86", f"--lzma2=preset={level}", f"-T{threads}", "-c"]
    return ["nice", "-n", "19", "zstd", f"-{level}", "--ultra", "--long=27", f"-T{threads}", "-c", "-q"]


def split_stream(stream: IO[bytes], out: Path, stem: str, part_bytes: int) -> list[dict[str, Any]]:
    """Write ``stream`` into parts of at most ``part_bytes``; each with its size and sha256."""
    parts: list[dict[str, Any]] = []
    buf = b""
    eof = False
    while not eof or buf:
        while not eof and len(buf) < part_bytes:
            chunk = stream.read(min(1 << 20, part_bytes - len(buf)))
            eof = not chunk
            buf += chunk
        if not buf:
            break
        name = f"{stem}.{len(parts):03d}"
        part, buf = buf[:part_bytes], buf[part_bytes:]
        (out / name).write_bytes(part)
        parts.append({"name": name, "bytes": len(part), "sha256": hashlib.sha256(part).hexdigest()})
    return parts


def build(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("nightshift-kit-*"), out / MANIFEST]:
        old.unlink(missing_ok=True)
    timings: dict[str, float] = {}
    # Staging and downloads live beside the parts folder, not in it: that folder is what
    # travels to the GPU machine.
    work: Path = args.work or out.with_name(out.name + "_work")
    shutil.rmtree(work, ignore_errors=True)
    (work / "project").mkdir(parents=True)

    t = time.perf_counter()
    wheel, project = project_wheel(args.project, work / "project")
    timings["project_wheel_s"] = round(time.perf_counter() - t, 1)
    wheel_dir: Path = args.wheels or work / "wheels"
    if args.wheels is None:
        t = time.perf_counter()
        wheel_dir.mkdir(parents=True, exist_ok=True)
        download(wheel, wheel_dir)
        timings["download_s"] = round(time.perf_counter() - t, 1)
    candidates = {wheel_name_version(w)[0]: w for w in sorted(wheel_dir.glob("*.whl"))}
    candidates["nightshift"] = wheel

    assumed = ASSUMED[args.assume]
    only = {canonical(n) for n in args.only} if args.only else None
    if only is not None and (unknown := only - set(candidates)):
        raise KitError(f"--only names wheels that are not in {wheel_dir}: {', '.join(sorted(unknown))}")
    chosen: list[Path] = []
    left_out: list[dict[str, str]] = []
    for name, w in sorted(candidates.items()):
        version = wheel_name_version(w)[1]
        if only is not None and name not in only:
            continue
        if name in assumed or name.startswith(ASSUMED_PREFIXES):
            left_out.append({"name": name, "version": version, "why": assumed.get(name, "CUDA library wheels")})
        elif name in DROPPED:
            left_out.append({"name": name, "version": version, "why": "dropped: " + DROPPED[name]})
        else:
            chosen.append(w)
    needs = requirements_of(chosen)
    kit_names = {wheel_name_version(w)[0] for w in chosen}
    # What the kit's packages require but do not carry: `install` checks these on the machine.
    expected = {name: needs[name] for name in sorted(needs) if name not in kit_names and name not in DROPPED}

    t = time.perf_counter()
    stage(chosen, work)
    timings["stage_s"] = round(time.perf_counter() - t, 1)
    site = work / "site"
    installed_bytes = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
    slimmed = [] if args.no_slim else slim(site)
    refresh_records(site)
    smoke = [m for m in (args.smoke or SMOKE) if (site / m).is_dir()]

    t = time.perf_counter()
    tar_path = work / "kit.tar"
    tar_bytes = tar_kit(work, tar_path)
    timings["tar_s"] = round(time.perf_counter() - t, 1)

    t = time.perf_counter()
    level = args.level or DEFAULT_LEVEL[args.codec]
    stem = f"nightshift-kit-{PYTHON_TAG}.tar.{'xz' if args.codec == 'xz' else 'zst'}"
    with tar_path.open("rb") as src:
        proc = subprocess.Popen(compress_command(args.codec, level, args.threads), stdin=src, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        parts = split_stream(proc.stdout, out, stem, int(args.part_mib * 2**20))
        if proc.wait() != 0:
            raise KitError(f"{args.codec} exited with {proc.returncode}")
    timings["compress_s"] = round(time.perf_counter() - t, 1)
    if not args.keep_work:
        shutil.rmtree(work)

    manifest = {
        "format": FORMAT,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": PYTHON_VERSION, "python_tag": PYTHON_TAG, "platforms": list(PLATFORMS),
        "project": {"wheel": wheel.name, **project},
        "codec": args.codec, "level": level, "threads": args.threads,
        "part_bytes_max": int(args.part_mib * 2**20),
        "parts": parts,
        "total_bytes": sum(p["bytes"] for p in parts),
        "uncompressed_bytes": tar_bytes,
        "installed_bytes_before_slimming": installed_bytes,
        "assume": args.assume,
        "packages": [{"name": wheel_name_version(w)[0], "version": wheel_name_version(w)[1], "wheel": w.name}
                     for w in chosen],
        "left_out": left_out,
        "expected_on_machine": expected,
        "slimmed": slimmed,
        "smoke_imports": smoke,
        "timings": timings,
        "build_seconds": round(time.perf_counter() - t0, 1),
    }  # fmt: skip
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    mib = manifest["total_bytes"] / 2**20
    print(f"kit: {len(parts)} parts, {mib:.1f} MiB ({tar_bytes / 2**20:.0f} MiB unpacked), "
          f"{len(chosen)} packages, {manifest['build_seconds']:.0f} s -> {out}")  # fmt: skip
    return 0


def tar_kit(work: Path, out: Path) -> int:
    """A reproducible tar of ``site/`` and ``bin/`` of the staging folder (sorted, owner 0,
    time 0; the downloads and the project wheel stay out); returns its size."""

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for top in ("site", "bin"):
            if not (work / top).exists():
                continue
            tar.add(work / top, arcname=top, recursive=False, filter=clean)
            for path in sorted((work / top).rglob("*")):
                tar.add(path, arcname=path.relative_to(work).as_posix(), recursive=False, filter=clean)
    return out.stat().st_size


# ----- install and verify (there: Python's standard library only) ----------------------------


def load_manifest(kit_dirs: list[Path]) -> dict[str, Any]:
    for d in kit_dirs:
        if (d / MANIFEST).is_file():
            return json.loads((d / MANIFEST).read_text())
    raise KitError(f"no {MANIFEST} in {', '.join(map(str, kit_dirs))}")


def locate_parts(manifest: dict[str, Any], kit_dirs: list[Path]) -> list[Path]:
    """Each part's path, checked against the manifest's size and sha256 (the parts may arrive
    in several folders, one per device call)."""
    found: list[Path] = []
    for part in manifest["parts"]:
        path = next((d / part["name"] for d in kit_dirs if (d / part["name"]).is_file()), None)
        if path is None:
            raise KitError(f"part {part['name']} is missing (looked in {', '.join(map(str, kit_dirs))})")
        size = path.stat().st_size
        if size != part["bytes"]:
            raise KitError(f"part {part['name']} has {size} bytes, the manifest says {part['bytes']}: "
                           "incomplete or corrupt, copy it again")  # fmt: skip
        if sha256_file(path) != part["sha256"]:
            raise KitError(f"part {part['name']} is corrupt: its sha256 differs from the manifest's; copy it again")
        found.append(path)
    return found


class _Joined(io.RawIOBase):
    """The parts read back to back as one stream."""

    def __init__(self, paths: list[Path]) -> None:
        self._paths = iter(paths)
        self._f: IO[bytes] | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while True:
            if self._f is None:
                nxt = next(self._paths, None)
                if nxt is None:
                    return 0
                self._f = nxt.open("rb")
            n = self._f.readinto(b)
            if n:
                return n
            self._f.close()
            self._f = None


@contextlib.contextmanager
def payload(manifest: dict[str, Any], parts: list[Path]) -> Iterator[IO[bytes]]:
    """The joined parts, decompressed, as one stream."""
    joined = io.BufferedReader(_Joined(parts), buffer_size=1 << 20)
    if manifest["codec"] == "xz":
        with lzma.open(joined) as stream:
            yield stream  # type: ignore[misc]
        return
    # Python 3.12 has no zstd in its standard library: the binary must be there.
    if shutil.which("zstd") is None:
        raise KitError("this kit is zstd-compressed and there is no `zstd` binary here; build it with --codec xz")
    proc = subprocess.Popen(["zstd", "-d", "-c", "-q", "--long=27"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    stdin = proc.stdin

    def feed() -> None:
        with stdin:
            shutil.copyfileobj(joined, stdin, 1 << 20)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    yield proc.stdout
    feeder.join()
    if proc.wait() != 0:
        raise KitError(f"zstd -d exited with {proc.returncode}")


def smoke_test(manifest: dict[str, Any], target: Path) -> dict[str, Any]:
    """Import the kit's main modules in a fresh interpreter that sees the kit as `tune` will,
    and check each required package the kit does not carry against its specifiers."""
    code = r"""
import importlib, importlib.metadata as md, json, sys, time
mods, expected, kit = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
out = {"python": sys.version.split()[0], "imports": {}, "missing": {}, "mismatched": {}}
for m in mods:
    t = time.perf_counter()
    try:
        mod = importlib.import_module(m)
        f = getattr(mod, "__file__", "") or ""
        out["imports"][m] = {"ok": True, "from_kit": f.startswith(kit), "s": round(time.perf_counter() - t, 2),
                             "version": str(getattr(mod, "__version__", ""))}
    except Exception as e:
        out["imports"][m] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
try:
    from packaging.specifiers import SpecifierSet
except ImportError:
    SpecifierSet = None
for name, needs in expected.items():
    try:
        v = md.version(name)
    except md.PackageNotFoundError:
        out["missing"][name] = [n["by"] + " " + (n["specifier"] or "(any)") for n in needs]
        continue
    if SpecifierSet is not None:
        bad = [n["by"] + " needs " + n["specifier"] for n in needs
               if not SpecifierSet(n["specifier"]).contains(v, prereleases=True)]
        if bad:
            out["mismatched"][name] = {"version": v, "needs": bad}
print(json.dumps(out))
"""
    env = {**os.environ, "PYTHONPATH": str(target / "site")}
    # tvm_ffi builds its torch DLPack add-on on import where torch is present; not needed to import.
    env.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(manifest["smoke_imports"]),
                           json.dumps(manifest.get("expected_on_machine", {})), str(target / "site")],
                          capture_output=True, text=True, cwd=target, env=env)  # fmt: skip
    if done.returncode != 0 or not done.stdout.strip():
        raise KitError(f"the smoke test's interpreter failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fix_scripts(target: Path) -> None:
    """Point the console scripts' shebangs at this machine's Python."""
    for script in sorted((target / "bin").glob("*")) if (target / "bin").is_dir() else []:
        data = script.read_bytes()
        if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
            script.write_bytes(b"#!" + sys.executable.encode() + b"\n" + data.split(b"\n", 1)[1])


def verify(args: argparse.Namespace) -> int:
    manifest = load_manifest(args.kit)
    parts = locate_parts(manifest, args.kit)
    print(f"ok: {len(parts)} parts, {manifest['total_bytes'] / 2**20:.1f} MiB, sha256 as in the manifest")
    return 0


def install(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    manifest = load_manifest(args.kit)
    if manifest.get("format") != FORMAT:
        raise KitError(f"kit format {manifest.get('format')} is not {FORMAT}: use the gpu_kit.py that built it")
    want = tuple(int(x) for x in manifest["python"].split("."))
    if sys.version_info[:2] != want and not args.any_python:
        raise KitError(
            f"this kit is for Python {manifest['python']} ({manifest['python_tag']}); this is "
            f"{sys.version.split()[0]} ({sys.executable}): run install with python{manifest['python']}"
        )
    parts = locate_parts(manifest, args.kit)
    t_check = time.perf_counter() - t0
    target: Path = args.target
    if (target / "site").exists():
        if not args.force:
            raise KitError(f"{target / 'site'} exists: pass --force to replace it")
        shutil.rmtree(target / "site")
        shutil.rmtree(target / "bin", ignore_errors=True)
    target.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    with payload(manifest, parts) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
        tar.extractall(target, filter="data")
    t_unpack = time.perf_counter() - t
    report: dict[str, Any] = {"target": str(target), "check_s": round(t_check, 1), "unpack_s": round(t_unpack, 1)}
    _fix_scripts(target)
    if not args.no_compile:
        # Bytecode now, with this Python and all its cores, as pip does on install: otherwise the
        # first `tune` compiles Ray's agents from source while the raylet waits for them (it
        # gives up after seconds), and where PYTHONDONTWRITEBYTECODE is set, every start does.
        t = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(target / "site")],
                              capture_output=True, text=True)  # fmt: skip
        report["compile_s"] = round(time.perf_counter() - t, 1)
        if done.returncode != 0:  # a file that does not compile (a template, a test) is not an error here
            logger.info("compileall: %s", done.stdout.strip().splitlines()[-1:] or done.returncode)
    (target / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    env_line = f"export PYTHONPATH={target / 'site'}${{PYTHONPATH:+:$PYTHONPATH}} PATH={target / 'bin'}:$PATH"
    status = 0
    if not args.no_smoke:
        t = time.perf_counter()
        smoke = smoke_test(manifest, target)
        report["smoke_s"] = round(time.perf_counter() - t, 1)
        report["smoke"] = smoke
        failed = [m for m, r in smoke["imports"].items() if not r["ok"]]
        for m, r in smoke["imports"].items():
            where = "" if r.get("from_kit") else " (NOT from the kit)"
            print(
                f"  import {m:<14} "
                + (f"ok {r['s']:5.2f} s {r['version']}{where}" if r["ok"] else f"FAILED {r['error']}")
            )
        for name, by in smoke["missing"].items():
            print(f"  missing here: {name}, required by {'; '.join(by)}")
        for name, m in smoke["mismatched"].items():
            print(f"  wrong version here: {name} {m['version']}: {'; '.join(m['needs'])}")
        if failed or smoke["missing"]:
            status = 1
            print(f"smoke test FAILED: {len(failed)} imports failed, {len(smoke['missing'])} packages missing")
        else:
            print(f"smoke test ok: {len(smoke['imports'])} imports on Python {smoke['python']}"
                  + (f", {len(smoke['mismatched'])} version warnings" if smoke["mismatched"] else ""))  # fmt: skip
    report["install_s"] = round(time.perf_counter() - t0, 1)
    (target / "install.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"installed {manifest['total_bytes'] / 2**20:.1f} MiB in {len(parts)} parts into {target} "
          f"in {report['install_s']:.1f} s (unpack {report['unpack_s']:.1f} s)")  # fmt: skip
    print(env_line)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="gather, slim, compress and split the kit (here, with network)")
    b.add_argument("--out", type=Path, default=ROOT / "build" / "gpu_kit", help="folder for the parts and manifest")
    b.add_argument("--project", type=Path, default=ROOT, help="the git checkout whose HEAD is packed")
    b.add_argument("--wheels", type=Path, help="take the wheels from this folder instead of downloading them")
    b.add_argument("--only", nargs="+", metavar="NAME", help="pack only these distributions (nightshift is one)")
    b.add_argument(
        "--assume",
        choices=sorted(ASSUMED),
        default="h200-image",
        help="what the GPU machine already has (default: the H200 image)",
    )
    b.add_argument("--codec", choices=("xz", "zstd"), default="xz")
    b.add_argument("--level", help="compression preset (xz: 0-9 with an optional e, default 9; zstd: 1-22, default 19)")
    b.add_argument("--threads", type=int, default=2)
    b.add_argument(
        "--part-mib",
        type=float,
        default=DEFAULT_PART_MIB,
        help=f"largest part (default {DEFAULT_PART_MIB:g}: a 64 MiB call minus the working tree)",
    )
    b.add_argument("--smoke", nargs="+", metavar="MODULE", help=f"what install imports (default: {' '.join(SMOKE)})")
    b.add_argument("--no-slim", action="store_true", help="keep Ray's libraries, jars, UI and symbols")
    b.add_argument("--work", type=Path, help="staging folder (default: OUT_work beside --out)")
    b.add_argument("--keep-work", action="store_true", help="keep the staging folder (downloads, tree, tar)")
    for name, helptext in (("install", "check, join and unpack the kit, then smoke-import it (stdlib only)"),
                           ("verify", "check the parts against the manifest")):  # fmt: skip
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--kit", type=Path, nargs="+", required=True, help="folder(s) holding the manifest and parts")
        if name == "install":
            p.add_argument("--target", type=Path, required=True, help="where to unpack (site/ and bin/ inside)")
            p.add_argument("--force", action="store_true", help="replace an earlier install in --target")
            p.add_argument("--no-smoke", action="store_true", help="skip the import check")
            p.add_argument("--no-compile", action="store_true", help="skip compiling the bytecode")
            p.add_argument("--any-python", action="store_true", help="install although this is not the kit's Python")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    try:
        return {"build": build, "install": install, "verify": verify}[args.cmd](args)
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
