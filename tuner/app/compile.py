"""Compiling a model with the database's best schedules into an artifact, checked first:
``nightshift compile`` and :func:`tuner.api.compile_model` run :func:`compile_artifact`.
Nothing here prints; the caller shows the result.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.app.model import Status, no_status

if TYPE_CHECKING:
    from tuner.app.model import LoadedModel
    from tuner.artifact import Verification
    from tuner.compile import Compiled
    from tuner.db import TuningDatabase

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class CompiledArtifact:
    """A compiled model and what became of it.

    Attributes:
        compiled: the build (its ``decisions``: what each operator got).
        verification: its output checked against the untuned build, or None (not checked).
        artifact: the artifact written, or None when the check failed (nothing is written then).
        metadata: the artifact's metadata file, or None.
        stale: tasks tuned in another form than the one compiled (:meth:`Compiled.tuned_in_another_form`).
        rejected: records the trace allow-list refused, by id.
    """

    compiled: Compiled
    verification: Verification | None
    artifact: Path | None
    metadata: Path | None
    stale: list[str] = field(default_factory=list)
    rejected: dict[int, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether the output was not checked or passed the check (and the artifact is written)."""
        return self.verification is None or self.verification.ok

    def counts(self) -> dict[str, int]:
        """How many operators got each kind of schedule (``tuned``, ``same-arch``, ``foreign``, ...)."""
        kinds = [d.kind for d in self.compiled.decisions.values()]
        return {k: kinds.count(k) for k in ("tuned", "same-arch", "foreign", "fallback", "tvm-default")}


def compile_artifact(loaded: LoadedModel, db: TuningDatabase, output: Path, *, policy: str = "same-arch",
                     verify: str = "auto", status: Status = no_status) -> CompiledArtifact:  # fmt: skip
    """Compile ``loaded`` with ``db``'s best schedules (``policy``), check its output against
    the untuned build (``verify``: ``auto`` where that build is cheap, ``on``, ``off``) and
    write the artifact to ``output``, unless the check fails.

    The caller checks ``output`` first (:func:`tuner.app.inputs.check_output`): a compile is
    minutes of work to lose.
    """
    from tuner.artifact import Verification, write_artifact
    from tuner.compile import VERIFY_TOLERANCE, compile_model, max_difference, verify_wanted

    spec, device = loaded.spec, loaded.device
    plan = loaded.plan(db)
    with status("compiling"):
        compiled = compile_model(spec, device, db, policy=policy, plan=plan, precision=loaded.precision)
    stale = compiled.tuned_in_another_form(db)
    checked = None
    if verify_wanted(verify, spec, device):
        with status("checking the output against the untuned build"):
            worst = max_difference(spec, device, compiled, plan=plan)
        checked = Verification("untuned TVM build", worst, VERIFY_TOLERANCE)
        if not checked.ok:
            return CompiledArtifact(compiled=compiled, verification=checked, artifact=None, metadata=None,
                                    stale=stale, rejected=dict(db.rejected))  # fmt: skip
    # The same artifact as `tune -o` writes: `nightshift run` needs its metadata.
    meta = write_artifact(output, compiled, spec, device, latency_s=None, verification=checked,
                          source=loaded.source)  # fmt: skip
    return CompiledArtifact(compiled=compiled, verification=checked, artifact=output, metadata=meta, stale=stale,
                            rejected=dict(db.rejected))  # fmt: skip
