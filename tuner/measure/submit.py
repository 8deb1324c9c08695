"""Running a job's driver on a remote Ray cluster through Ray's Jobs API.

Ray Client (``ray://``) cannot carry Nightshift's streaming builds (``num_returns="streaming"``
is refused there), and Ray's own guidance for long jobs on a remote cluster is to submit
them: the driver then runs on the head, next to the cluster, and survives the laptop that
submitted it going to sleep. ``tune --ray-address http://HEAD:8265`` does so: the same
command runs on the head with ``--ray-address auto``, its output is streamed back, and its
exit status becomes this command's.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Sequence

from tuner.errors import UserInputError

logger = logging.getLogger(__name__)

_TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def check_address(address: str | None) -> None:
    """Refuse a Ray Client address with the command that works instead.

    Raises:
        UserInputError: ``address`` is a ``ray://`` (Ray Client) address.
    """
    if address and address.startswith("ray://"):
        host = address.removeprefix("ray://").split(":")[0] or "HEAD"
        raise UserInputError(
            f"--ray-address {address}: Ray Client cannot run Nightshift's streaming builds; submit the job "
            f"to the cluster with --ray-address http://{host}:8265 (Ray's Jobs API), or run tune on the head "
            "with --ray-address auto"
        )


def is_jobs_address(address: str | None) -> bool:
    """Whether ``address`` is a Ray dashboard (Jobs API) address: ``http(s)://host:port``."""
    return bool(address) and address.startswith(("http://", "https://"))


def driver_command(argv: Sequence[str]) -> str:
    """The command the head runs: ``argv`` (a ``nightshift`` command line) with the cluster
    joined from inside (``--ray-address auto``)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--ray-address":
            skip = True
            continue
        if arg.startswith("--ray-address="):
            continue
        out.append(arg)
    return shlex.join(["python", "-m", "tuner.cli", *out, "--ray-address", "auto"])


def submit(address: str, argv: Sequence[str], *, token: str | None = None, poll_s: float = 1.0) -> int:
    """Submit ``argv`` as a job to the cluster whose dashboard is ``address``; stream its
    output here until it ends. Returns 0 if the job succeeded, 1 otherwise.

    ``token`` is the cluster's Ray authentication token (``RAY_AUTH_TOKEN``), sent as a
    bearer token; without it Ray's own lookup applies (``RAY_AUTH_MODE=token`` and
    ``~/.ray/auth_token``).

    Raises:
        UserInputError: nothing answers at ``address`` as a Ray dashboard.
    """
    from rich.console import Console

    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError as err:  # ray without its [default] extra
        raise UserInputError("submitting a job needs ray[default] (pip install 'ray[default]')") from err
    console = Console(highlight=False)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        client = JobSubmissionClient(address, headers=headers)
    except Exception as err:  # Ray raises ConnectionError, RuntimeError, ValueError here
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserInputError(f"--ray-address {address}: the Ray Jobs API did not accept us: {first} "
                             "(a token-authenticated cluster needs RAY_AUTH_TOKEN)") from err
    entrypoint = driver_command(argv)
    job_id = client.submit_job(entrypoint=entrypoint)
    console.print(f"submitted job {job_id} to {address}: {entrypoint}")
    console.print(f"(follow it elsewhere with: ray job logs -f {job_id} --address {address})")
    shown = 0
    while True:
        status = str(client.get_job_status(job_id)).rsplit(".", 1)[-1]
        logs = client.get_job_logs(job_id)
        if len(logs) > shown:
            console.out(logs[shown:], end="")
            shown = len(logs)
        if status in _TERMINAL:
            break
        time.sleep(poll_s)
    info = client.get_job_info(job_id)
    console.print(f"job {job_id}: {status}{': ' + info.message if info.message and status != 'SUCCEEDED' else ''}")
    return 0 if status == "SUCCEEDED" else 1
