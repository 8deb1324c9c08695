"""docker/: the compose file parses and refers to files that exist; the Dockerfiles pass a lint.

No container runtime runs on the CI machines (the docker client is there, no daemon and no
compose plugin), so these checks are static: every build context, Dockerfile and COPY source
must exist, the Dockerfiles follow the usual rules (pinned base images, no apt caches or pip
caches left, exec-form commands, a non-root user), every image pins the Ray, TVM and Python
that ``pyproject.toml`` pins, and compose requires its secrets and publishes on 127.0.0.1
only. The same topology runs for real with ``ray start`` processes in test_remote_driver.py.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "docker-compose.yml"
_VAR = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")


def _interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}``; a missing required one raises."""

    def sub(m: re.Match) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if env.get(name):
            return env[name]
        if op == "?":
            raise KeyError(f"{name}: {arg}")
        return arg if op == "-" else ""

    return _VAR.sub(sub, text)


def _pins() -> dict[str, str]:
    """``pyproject.toml``'s exact pins (name -> version) of Ray, TVM and TVM-FFI."""
    text = (REPO / "pyproject.toml").read_text()
    pins = dict(re.findall(r'"(ray|apache-tvm|apache-tvm-ffi)(?:\[[\w,]+\])?==([\w.]+)"', text))
    assert set(pins) == {"ray", "apache-tvm", "apache-tvm-ffi"}, pins
    return pins


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


def test_compose_requires_its_secrets_and_listens_on_localhost_only():
    text = COMPOSE.read_text()
    secrets = {"POSTGRES_PASSWORD": "pw-from-env", "NIGHTSHIFT_DB_PASSWORD": "app-pw-from-env",
               "RAY_AUTH_TOKEN": "token-from-env"}  # fmt: skip
    for missing in secrets:
        with pytest.raises(KeyError, match=missing):
            _interpolate(text, {k: v for k, v in secrets.items() if k != missing})
    compose = yaml.safe_load(_interpolate(text, secrets))
    services = compose["services"]
    pg = services["postgres"]["environment"]
    assert pg["POSTGRES_PASSWORD"] == "pw-from-env" and pg["NIGHTSHIFT_DB_PASSWORD"] == "app-pw-from-env"
    # Nightshift connects as the role the init script makes (not the superuser), with its password.
    url = services["ray-head"]["environment"]["NIGHTSHIFT_DB"]
    assert url.startswith("postgresql+psycopg://nightshift:app-pw-from-env@") and "pw-from-env@" not in url.replace(
        "app-pw-from-env@", "")
    assert pg["POSTGRES_USER"] != "nightshift"
    init = [v for v in services["postgres"]["volumes"] if v.split(":")[1] == "/docker-entrypoint-initdb.d"]
    assert init and (COMPOSE.parent / init[0].split(":")[0] / "10-nightshift-role.sh").is_file()
    published = [(name, str(port)) for name, svc in services.items() for port in svc.get("ports", [])]
    assert published
    for name, port in published:
        assert re.fullmatch(r"127\.0\.0\.1:\d+:\d+", port), (name, port)
        assert not port.endswith(":6379"), "6379 is Redis's port on the team's machines"
    # Ray's GCS and dashboard, the ports that run code, want the cluster's token.
    for name in ("ray-head", "cpu-worker"):
        env = services[name]["environment"]
        assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"] == "token-from-env", name
    head = services["ray-head"]["command"]
    assert head[head.index("--port") + 1] == "6380"
    assert services["cpu-worker"]["environment"]["RAY_HEAD"] == "ray-head:6380"
    opened = yaml.safe_load(_interpolate(text, secrets | {"NIGHTSHIFT_BIND": "10.1.2.3"}))
    assert str(opened["services"]["ray-head"]["ports"][0]).startswith("10.1.2.3:")


def test_images_pin_the_ray_tvm_and_python_of_pyproject():
    import ray

    pins = _pins()
    assert ray.__version__ == pins["ray"], "the installed Ray is not the pinned one"
    bounds = re.search(r'requires-python = ">=3\.(\d+),<3\.(\d+)"', (REPO / "pyproject.toml").read_text())
    assert bounds, "requires-python is not a >=3.x,<3.y range"
    lowest, above = int(bounds[1]), int(bounds[2])
    cpu = " ".join(a for _, a in _instructions(DOCKER / "cpu-worker.Dockerfile"))
    cuda = " ".join(a for _, a in _instructions(DOCKER / "cuda-worker.Dockerfile"))
    assert "pip install --no-cache-dir '.[postgres]'" in cpu  # pins from pyproject
    # Ray wants one Python minor version on every node: both images run the same one, in range.
    minor = re.search(r"python:3\.(\d+)-", cpu)
    assert minor and f"python3.{minor[1]}" in cuda
    assert lowest <= int(minor[1]) < above
    for name, version in pins.items():
        assert re.search(rf'"{re.escape(name)}(\[[\w,]+\])?=={re.escape(version)}"', cuda), (name, version)
    assert not re.search(r"ray\[default\]>=", cpu + cuda)


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
    from tuner.measure.base import device_resource
    from tuner.measure.worker import start_command

    cmd = start_command("head:6380", num_cpus=2, cpu_device=True, block=True)
    assert cmd[:4] == ["ray", "start", "--address", "head:6380"]
    assert json.loads(cmd[cmd.index("--resources") + 1]) == {device_resource(cpu_device): 1.0}
    assert "--block" in cmd
