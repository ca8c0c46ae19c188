"""GPU health -> DRA device taints.

Two taint keys, at most one taint each, carrying the most severe finding:

- `gpu.nvidia.com/xid`: from XID events. Application XIDs (13 graphics engine exception, 31 GPU
  memory page fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor
  exception) leave the GPU healthy, exactly as NVIDIA's k8s-device-plugin skips them
  (internal/rm/health.go `applicationErrorXids`). The others, from NVIDIA's Xid catalog
  (docs.nvidia.com/deploy/xid-errors, "Resolution Bucket"), as `XID_TAINTS` lists them:

  ====  ===========  ===============================================================
  XID   effect       why
  ====  ===========  ===============================================================
  48    NoExecute    double-bit ECC error: memory contents are lost
  62    NoExecute    internal micro-controller halt: GPU reset required
  63    NoSchedule   row remap / page retirement recorded: takes effect on reset
  64    NoExecute    row remap / page retirement failed
  74    NoExecute    NVLink error: the link is down, peers see corrupt traffic
  79    NoExecute    GPU has fallen off the bus
  92    NoSchedule   high single-bit ECC rate: drain before it becomes uncorrectable
  94    NoSchedule   contained ECC error: the faulting process was killed, reset soon
  95    NoExecute    uncontained ECC error: every process on the GPU is affected
  119   NoExecute    GSP RPC timeout: the GPU system processor stopped answering
  120   NoExecute    GSP error
  140   NoExecute    unrecovered ECC error
  ====  ===========  ===============================================================

  Any other XID taints NoSchedule (the device plugin marks it unhealthy; we keep running work).
- `gpu.nvidia.com/ecc`: row-remap failure and volatile uncorrectable errors -> NoExecute;
  a pending row remap or page retirement (needs a reset) -> NoSchedule. Aggregate counts alone
  are history, already handled by retirement/remapping, and do not taint.

Values are valid label values of at most 63 characters, e.g. `79-fell-off-bus`.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.dra.model import DeviceTaint, TaintEffect
from services.inventory.core.report import Gpu, GpuHealth

__all__ = [
    "APPLICATION_XIDS",
    "ECC_TAINT_KEY",
    "XID_TAINT_KEY",
    "XID_TAINTS",
    "taints_from_health",
]

XID_TAINT_KEY = "gpu.nvidia.com/xid"
ECC_TAINT_KEY = "gpu.nvidia.com/ecc"
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68})

_NO_EXECUTE, _NO_SCHEDULE = TaintEffect.NO_EXECUTE, TaintEffect.NO_SCHEDULE
XID_TAINTS: dict[int, tuple[TaintEffect, str]] = {
    48: (_NO_EXECUTE, "double-bit-ecc"),
    62: (_NO_EXECUTE, "microcontroller-halt"),
    63: (_NO_SCHEDULE, "row-remap-pending"),
    64: (_NO_EXECUTE, "row-remap-failure"),
    74: (_NO_EXECUTE, "nvlink-error"),
    79: (_NO_EXECUTE, "fell-off-bus"),
    92: (_NO_SCHEDULE, "high-sbe-rate"),
    94: (_NO_SCHEDULE, "contained-ecc"),
    95: (_NO_EXECUTE, "uncontained-ecc"),
    119: (_NO_EXECUTE, "gsp-rpc-timeout"),
    120: (_NO_EXECUTE, "gsp-error"),
    140: (_NO_EXECUTE, "unrecovered-ecc"),
}
_UNCLASSIFIED = (_NO_SCHEDULE, "unclassified")


@dataclass(frozen=True)
class _Finding:
    effect: TaintEffect
    value: str
    time_added: str | None

    @property
    def severity(self) -> int:
        return 1 if self.effect is _NO_EXECUTE else 0


def _xid_findings(health: GpuHealth) -> list[_Finding]:
    findings = []
    for event in health.xid_events:
        if event.code in APPLICATION_XIDS:
            continue
        effect, reason = XID_TAINTS.get(event.code, _UNCLASSIFIED)
        findings.append(_Finding(effect, f"{event.code}-{reason}", event.timestamp))
    return findings


def _ecc_findings(health: GpuHealth, timestamp: str | None) -> list[_Finding]:
    findings = []
    rows, pages = health.remapped_rows, health.retired_pages
    if rows is not None and rows.failure:
        findings.append(_Finding(_NO_EXECUTE, "row-remap-failure", timestamp))
    volatile = health.ecc.volatile_uncorrectable
    if volatile:
        findings.append(_Finding(_NO_EXECUTE, f"volatile-uncorrectable-{volatile}", timestamp))
    if rows is not None and rows.pending:
        findings.append(_Finding(_NO_SCHEDULE, "row-remap-pending", timestamp))
    if pages is not None and pages.pending:
        findings.append(_Finding(_NO_SCHEDULE, "page-retirement-pending", timestamp))
    return findings


def _worst(key: str, findings: list[_Finding]) -> tuple[DeviceTaint, ...]:
    if not findings:
        return ()
    # max() keeps the first of equals: the table's / the list's order breaks ties.
    worst = max(findings, key=lambda f: f.severity)
    return (DeviceTaint(key, worst.effect, worst.value[:63], worst.time_added),)


def taints_from_health(gpu: Gpu, timestamp: str | None = None) -> tuple[DeviceTaint, ...]:
    """The taints a GPU's health calls for; `timestamp` (the report's) dates the ECC taint,
    an XID taint carries its event's time."""
    return _worst(XID_TAINT_KEY, _xid_findings(gpu.health)) + _worst(
        ECC_TAINT_KEY, _ecc_findings(gpu.health, timestamp)
    )
