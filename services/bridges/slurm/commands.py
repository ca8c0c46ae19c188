"""The Slurm commands the bridge runs on the controller: scontrol, squeue, sbatch, scancel.

Each is named in full (prologs run without PATH; GPUALLOC_SCONTROL, GPUALLOC_SQUEUE,
GPUALLOC_SBATCH, GPUALLOC_SCANCEL override the Debian paths), bounded by a timeout, and fails
as FailedPrecondition with the command's own message.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.common.errors import FailedPrecondition

__all__ = ["SlurmCommands", "SlurmJobRow", "SlurmNodeRow"]

TIMEOUT_SECONDS = 30.0
_PROGRAMS = {
    "scontrol": ("GPUALLOC_SCONTROL", "/usr/bin/scontrol"),
    "squeue": ("GPUALLOC_SQUEUE", "/usr/bin/squeue"),
    "sbatch": ("GPUALLOC_SBATCH", "/usr/bin/sbatch"),
    "scancel": ("GPUALLOC_SCANCEL", "/usr/bin/scancel"),
}
_SEPARATOR = "|"


@dataclass(frozen=True)
class SlurmJobRow:
    """One job as squeue lists it."""

    job_id: str
    name: str
    state: str
    user: str
    nodes: str
    """The nodes it runs on (empty while pending)."""


@dataclass(frozen=True)
class SlurmNodeRow:
    """One node as `scontrol show node -o` shows it."""

    name: str
    partitions: tuple[str, ...]
    state: str


@dataclass(frozen=True)
class SlurmCommands:
    """Runs Slurm's commands with `environ` (SLURM_CONF, the munge socket, ...)."""

    environ: Mapping[str, str]

    def run(self, program: str, *argv: str) -> str:
        """The command's standard output; FailedPrecondition when it fails or hangs."""
        variable, default = _PROGRAMS[program]
        command = [self.environ.get(variable) or default, *argv]
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_SECONDS,
                env=dict(self.environ),
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise FailedPrecondition(f"{' '.join(command)}: {error}") from None
        if done.returncode != 0:
            raise FailedPrecondition(
                f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()}"
            )
        return done.stdout

    def job_details(self, job_id: str) -> str:
        """`scontrol show job -d`: the GPU ids Slurm gave the job per node."""
        return self.run("scontrol", "show", "job", "-d", job_id)

    def set_comment(self, job_id: str, comment: str) -> None:
        self.run("scontrol", "update", f"JobId={job_id}", f"Comment={comment}")

    def jobs(self) -> list[SlurmJobRow]:
        """Every job slurmctld still lists (any state)."""
        fields = _SEPARATOR.join(("%A", "%j", "%T", "%u", "%N"))
        text = self.run("squeue", "-h", "-t", "all", "-o", fields)
        rows = []
        for line in text.splitlines():
            parts = line.split(_SEPARATOR)
            if len(parts) == 5 and parts[0].strip():
                rows.append(SlurmJobRow(*(p.strip() for p in parts)))
        return rows

    def nodes(self) -> list[SlurmNodeRow]:
        rows = []
        for line in self.run("scontrol", "show", "node", "-o").splitlines():
            fields = dict(_field(word) for word in line.split() if "=" in word)
            if fields.get("NodeName"):
                partitions = tuple(p for p in fields.get("Partitions", "").split(",") if p)
                rows.append(SlurmNodeRow(fields["NodeName"], partitions, fields.get("State", "")))
        return rows

    def submit(self, *options: str, wrap: str) -> str:
        """sbatch --parsable: the new job's id."""
        out = self.run("sbatch", "--parsable", *options, f"--wrap={wrap}")
        return out.strip().split(";")[0]

    def requeue(self, job_id: str) -> None:
        """`scontrol requeue`: back to pending (the job must be requeueable, as batch jobs are
        by default), to run again from the start when Slurm schedules it."""
        self.run("scontrol", "requeue", job_id)

    def cancel(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self.run("scancel", *job_ids)


def _field(word: str) -> tuple[str, str]:
    key, _, value = word.partition("=")
    return key, value
