"""Join a Ray cluster as a Nightshift worker: ``python -m tuner.measure.worker --address HEAD:PORT``.

Runs ``ray start`` with the custom resources Nightshift's device actors ask for: one
``nightshift_cpu_<llvm mcpu>`` for the host CPU (when TVM's compiler is installed, which a
build/CPU-timing node has) and one ``nightshift_cuda_<sm_XX>`` per GPU, found with TVM's
runtime alone, so a runtime-only GPU worker can compute it too.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import subprocess
import sys

from tuner.cuda_runtime import gpu_archs

logger = logging.getLogger(__name__)


def worker_resources(*, cpu: bool = True) -> dict[str, float]:
    """The device resources of this machine, without needing TVM's compiler for GPUs.

    TVM's CUDA runtime library is loaded first (a runtime-only import leaves it out, and
    without it TVM sees no GPU); a machine without the driver or CUDA 13's runtime has none.
    """
    from tvm import base

    resources = gpu_resources(gpu_archs())
    if cpu and not base._RUNTIME_ONLY:
        from tuner.device import parse_device
        from tuner.measure.base import device_resource

        resources[device_resource(parse_device("cpu"))] = 1.0
    return resources


def gpu_resources(archs: list[str]) -> dict[str, float]:
    """One unit of ``nightshift_cuda_<sm_XX>`` per GPU, from each GPU's ``sm_XX``."""
    resources: dict[str, float] = {}
    for arch in archs:
        name = f"nightshift_cuda_{arch}"
        resources[name] = resources.get(name, 0.0) + 1.0
    return resources


def start_command(address: str, *, num_cpus: int | None, cpu_device: bool, block: bool,
                  resources: dict[str, float] | None = None) -> list[str]:
    """The ``ray start`` command line for this machine (``resources``: as found here by default).

    GPUs are offered to Ray as many as there are device resources for them, since the device
    actor asks for one GPU beside its ``nightshift_cuda_*`` unit.
    """
    resources = worker_resources(cpu=cpu_device) if resources is None else resources
    cmd = ["ray", "start", "--address", address, "--resources", json.dumps(resources)]
    if num_cpus is not None:
        cmd += ["--num-cpus", str(num_cpus)]
    gpus = sum(int(v) for k, v in resources.items() if k.startswith("nightshift_cuda_"))
    if gpus:
        cmd += ["--num-gpus", str(gpus)]
    if block:
        cmd.append("--block")
    return cmd


def main(argv: list[str] | None = None) -> int:
    """Print, then run, the ``ray start`` command that makes this machine a Nightshift worker."""
    parser = argparse.ArgumentParser(prog="python -m tuner.measure.worker", description=__doc__)
    parser.add_argument("--address", required=True, help="the Ray head, HOST:PORT (its GCS port, e.g. 6380)")
    parser.add_argument("--num-cpus", type=int, default=None,
                        help="CPUs offered for builds (0 on a runtime-only GPU worker: it cannot build)")
    parser.add_argument("--no-cpu-device", action="store_true", help="do not time CPU candidates here")
    parser.add_argument("--block", action="store_true", help="stay in the foreground (containers)")
    parser.add_argument("--dry-run", action="store_true", help="only print the command")
    args = parser.parse_args(argv)
    cmd = start_command(args.address, num_cpus=args.num_cpus, cpu_device=not args.no_cpu_device, block=args.block)
    sys.stdout.write(shlex.join(cmd) + "\n")
    if args.dry_run:
        return 0
    return subprocess.run(cmd, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
