"""The stages: one module each, every one the same shape.

=================  ==========================================  ===============================
module             reads                                       writes
=================  ==========================================  ===============================
``generate``       a policy + a prompt dataset                 ``samples/`` shards
``score``          ``samples/``                                ``scored/`` shards
``curate``         one or more ``scored/``                     one training set (``.parquet``)
``train``          a policy + a training set                   a policy dir + metrics
``eval``           a policy + a test dataset                   ``eval.json`` + scored samples
``warmstart``      a dataset's gold solutions                  a training set (SFT data)
``verifier_data``  ``scored/`` dirs                            a verification dataset
=================  ==========================================  ===============================

The shape: ``run(cfg, *, progress=None, ...) -> StageResult``. A config in
(``toprcli.config``), files out (through :mod:`toprcli.shards`, so each output
is complete or absent), a :class:`StageResult` back, and progress reported by
calling ``progress(task, done, total, **info)`` (:mod:`toprcli.progress`);
only ``cli/`` draws bars. Every check a user's input can fail runs before
anything is written and raises :class:`~toprcli.errors.UserError`. A stage
re-run on a complete output returns its earlier result (``skipped``); on a
partial one it resumes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StageResult:
    """What every stage returns.

    ``summary`` holds the stage's counts and settings (what the CLI prints and
    ``--json`` emits; JSON-able); ``result["key"]`` reads it.
    """

    stage: str  # generate | score | curate | train | eval | warmstart | verifier-data
    out: str  # the directory or file written
    summary: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False  # the output was already complete: nothing ran
    wall_time_s: float = 0.0

    def __getitem__(self, key: str) -> Any:
        return self.summary[key]

    def __contains__(self, key: object) -> bool:
        return key in self.summary

    def get(self, key: str, default: Any = None) -> Any:
        return self.summary.get(key, default)

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "out": self.out, "skipped": self.skipped, "wall_time_s": round(self.wall_time_s, 3), **self.summary}

