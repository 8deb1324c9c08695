"""docker/: the compose file parses and refers to files that exist; the Dockerfiles pass a lint.

Docker cannot run on the CI machines, so these checks are static: every build context,
Dockerfile and COPY source must exist, and the Dockerfiles follow the usual rules (pinned
base images, no apt caches or pip caches left, exec-form commands, a non-root user).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"
COMPOSE = DOCKER / "docker-compose.yml"


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _dockerfiles() -> list[tuple[Path, Path]]:
    """(Dockerfile, build context) of every service, plus every Dockerfile in docker/."""
    found = {}
    for svc in _compose()["services"].values():
        build = svc.get("build")
        if build:
            context = (COMPOSE.parent / build["context"]).resolve()
            found[(context / build.get("dockerfile", "Dockerfile")).resolve()] = context
    for f in DOCKER.glob("*Dockerfile*"):
        found.setdefault(f.resolve(), DOCKER.parent.resolve())
    return sorted(found.items())


def test_compose_has_the_team_services_and_existing_build_contexts():
    compose = _compose()
    services = compose["services"]
    assert {"postgres", "ray-head", "cpu-worker"} <= set(services)
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        build = svc.get("build")
        if build:
            context = (COMPOSE.parent / build["context"]).resolve()
            assert context.is_dir(), (name, context)
            assert (context / build["dockerfile"]).is_file(), (name, build["dockerfile"])
        for dep in svc.get("depends_on", []):
            assert dep in services, (name, dep)
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0]
            if source.startswith((".", "/")):
                assert (COMPOSE.parent / source).exists(), (name, source)
            else:
                assert source in compose.get("volumes", {}), (name, source)
        for port in svc.get("ports", []):
            assert re.fullmatch(r"\d+:\d+", str(port)), (name, port)


@pytest.mark.parametrize(("dockerfile", "context"), _dockerfiles(), ids=lambda p: p.name)
def test_dockerfile_lint_and_copy_sources_exist(dockerfile: Path, context: Path):
    steps = _instructions(dockerfile)
    kinds = [k for k, _ in steps]
    assert kinds[0] in ("FROM", "ARG") and "FROM" in kinds
    for kind, args in steps:
        if kind == "FROM":
            image = args.split()[0]
            assert ":" in image and not image.endswith(":latest"), f"unpinned base image {image}"
        elif kind in ("COPY", "ADD"):
            assert kind == "COPY", "use COPY, not ADD"
            parts = [p for p in shlex.split(args) if not p.startswith("--")]
            for src in parts[:-1]:
                assert (context / src).exists(), f"{dockerfile.name}: COPY source {src} missing in {context}"
        elif kind == "RUN":
            if "apt-get install" in args:
                assert "--no-install-recommends" in args and "rm -rf /var/lib/apt/lists" in args, args
                assert "apt-get update" in args, "update and install in one layer"
            if "pip install" in args:
                assert "--no-cache-dir" in args, args
        elif kind in ("CMD", "ENTRYPOINT"):
            assert isinstance(json.loads(args), list), f"{kind} must use the exec (JSON) form"
    assert any(k == "USER" and a not in ("root", "0") for k, a in steps), "run as a non-root user"


def test_cuda_worker_is_runtime_only():
    steps = _instructions(DOCKER / "cuda-worker.Dockerfile")
    text = " ".join(a for _, a in steps)
    assert "rm -f" in text and "libtvm_compiler.so" in text
    assert "TVM_USE_RUNTIME_LIB=1" in text
    assert "--num-cpus 0" in text  # never receives a build: it has no compiler


def test_worker_entrypoint_offers_the_resource_nightshift_expects(cpu_device):
    from tuner.measure.ray_measure import device_resource
    from tuner.measure.worker import start_command

    cmd = start_command("head:6379", num_cpus=2, cpu_device=True, block=True)
    assert cmd[:4] == ["ray", "start", "--address", "head:6379"]
    assert json.loads(cmd[cmd.index("--resources") + 1]) == {device_resource(cpu_device): 1.0}
    assert "--block" in cmd
