"""Slurm's GPU request syntax -> what one node of the job needs.

Read from sbatch/srun options, or from the job's environment in a prolog:

- `--gres=gpu[:type][:count]`, comma-separated with other GRES (`gpu:tesla:2,mps:400`): per node;
  non-GPU GRES (mps, shard, bandwidth, ...) are left to Slurm;
- `--gpus=[type:]count[,...]`: per job, split evenly over `--nodes` (it must divide);
- `--gpus-per-node=[type:]count[,...]`: per node;
- MIG devices by Slurm's own type naming, `<model>_<profile>` (`gpu:a100_3g.20gb:1`, as in
  Slurm's gres.shtml; AutoDetect names such as `nvidia_a100_3g.20gb` work too);
- in slurmd's Prolog only Slurm's GPU ids are known (SLURM_JOB_GPUS): their types come from the
  node's gres.conf lines, which `gpualloc-slurm gres-conf` generated (`with_types`);
- NVLink: the feature `nvlink` as an AND term of `--constraint` (`-C nvlink`,
  `-C "nvlink&ib"`), or GPUALLOC_NVLINK=1 in the prolog's environment. Slurm has no NVLink
  request of its own (its gres.conf `Links` only steer which GPUs it picks).

Types match exactly, as Slurm matches GRES types: a type names the GPUs whose gres.conf `Type`
(`gresconf.gpu_type` of the product name: `h100` for `NVIDIA H100 80GB HBM3`) is that type;
`a10` is not `a100`, `l4` is not `l40s`. The prolog checks a type against the inventory's
types and refuses an unknown one, listing the known ones.

Slurm's own GPU choice: the ids of the GPUs Slurm picked on a node come from SLURM_JOB_GPUS
(node Prolog, batch TaskProlog), SLURM_STEP_GPUS (a step's TaskProlog) or the `GRES=...(IDX:...)`
lines of `scontrol show job -d` (PrologSlurmctld; `gpu_ids_from_job_details`). Each id indexes
the node's GPU lines in gres.conf.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from services.bridges.slurm.hostlist import expand_hostlist
from services.client.specs import is_mig_profile
from services.common.errors import InvalidArgument

__all__ = [
    "GpuGres",
    "SlurmGpuRequest",
    "constraint_wants_nvlink",
    "gpu_ids_from_job_details",
    "submit_time_from_job_details",
    "parse_gpu_ids",
    "parse_gpus",
    "parse_gres",
    "request_from_environ",
    "request_from_options",
    "with_types",
]

_COUNT = re.compile(r"^(\d+)$")
_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_TRUE = frozenset({"1", "true", "yes", "on"})
_DETAIL_NODES = re.compile(r"^\s+Nodes=(\S+)(?:\s.*)?$", re.M)
_DETAIL_GPU = re.compile(r"(?:^|,)gpu(?::[^:(,]+)?:\d+\(IDX:([^)]*)\)")
_IDS = re.compile(r"^\d+(-\d+)?$")
_SUBMIT_TIME = re.compile(r"(?:^|\s)SubmitTime=(\S+)")


@dataclass(frozen=True)
class GpuGres:
    """`count` GPUs of one type (None: any GPU) on a node."""

    type: str | None
    count: int

    @property
    def mig_profile(self) -> str | None:
        """`3g.20gb` for the MIG type `a100_3g.20gb` (or a bare `3g.20gb`); None otherwise."""
        if self.type is None:
            return None
        tail = self.type.rsplit("_", 1)[-1]
        return tail.lower() if is_mig_profile(tail) else None

    @property
    def model(self) -> str | None:
        """The model part of the type (`a100` of `a100_3g.20gb`, `h100` of `h100`)."""
        if self.type is None:
            return None
        if self.mig_profile is None:
            return self.type.lower()
        head, _, _ = self.type.rpartition("_")
        return head.lower() or None

    def __str__(self) -> str:
        return f"gpu:{self.type}:{self.count}" if self.type else f"gpu:{self.count}"


@dataclass(frozen=True)
class SlurmGpuRequest:
    """What every node of the job needs (Slurm's GRES are per node), and on how many nodes."""

    per_node: tuple[GpuGres, ...]
    nodes: int = 1
    nvlink: bool = False
    gpu_ids: tuple[int, ...] = ()
    """Slurm's own GPU ids on this node (SLURM_JOB_GPUS), when that is all the prolog knows:
    indexes into the node's gres.conf GPU lines, which say their types (see with_types)."""

    @property
    def gpus_per_node(self) -> int:
        return sum(g.count for g in self.per_node)

    def __str__(self) -> str:
        shown = ",".join(str(g) for g in self.per_node) or "no GPUs"
        return f"{shown} x {self.nodes} node(s)" + (" nvlink" if self.nvlink else "")


def _bad(option: str, text: str, why: str) -> InvalidArgument:
    return InvalidArgument.at(option, f"{text!r}: {why}")


def _count(option: str, text: str, value: str) -> int:
    if not _COUNT.match(value) or int(value) < 1:
        raise _bad(option, text, f"count {value!r} must be a positive integer")
    return int(value)


def _type(option: str, text: str, value: str) -> str:
    if not _TYPE.match(value):
        raise _bad(option, text, f"{value!r} is not a GRES type")
    return value


def parse_gres(text: str, option: str = "--gres") -> tuple[GpuGres, ...]:
    """The GPU entries of a `--gres` value (`name[:type][:count]`, comma-separated)."""
    found = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        fields = item.split(":")
        if fields[0] != "gpu":
            continue  # mps, shard, nic, bandwidth...: Slurm's own business
        if len(fields) == 1:
            found.append(GpuGres(None, 1))
        elif len(fields) == 2:
            value = fields[1]
            if _COUNT.match(value):
                found.append(GpuGres(None, _count(option, text, value)))
            else:
                found.append(GpuGres(_type(option, text, value), 1))
        elif len(fields) == 3:
            found.append(GpuGres(_type(option, text, fields[1]), _count(option, text, fields[2])))
        else:
            raise _bad(option, text, "expected gpu[:type][:count]")
    return tuple(found)


def parse_gpus(text: str, option: str) -> tuple[GpuGres, ...]:
    """A `--gpus` / `--gpus-per-node` value: `[type:]count`, comma-separated."""
    found = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        kind, _, count = item.rpartition(":")
        found.append(
            GpuGres(_type(option, text, kind) if kind else None, _count(option, text, count))
        )
    return tuple(found)


def constraint_wants_nvlink(constraint: str) -> bool:
    """Whether every way of satisfying a `--constraint` expression includes the feature `nvlink`.

    Slurm reads the operators strictly left to right, without precedence (sbatch(1):
    `foo|bar&baz` is "(foo or bar) and baz"); `(...)` and `[...]` group, `*N` counts nodes.
    `nvlink` is required by `A&B` when required by A or by B, by `A|B` when by both.
    """
    tokens = [t.strip() for t in re.findall(r"[&|()\[\]]|[^&|()\[\]]+", constraint) if t.strip()]
    required, _ = _required(tokens, 0)
    return bool(required)


def _required(tokens: list[str], at: int) -> tuple[bool | None, int]:
    """(does the group starting at `at` require nvlink, the index after it)."""
    result: bool | None = None
    operator = "&"
    while at < len(tokens):
        token = tokens[at]
        if token in (")", "]"):
            return result, at + 1
        if token in ("&", "|"):
            operator, at = token, at + 1
            continue
        if token in ("(", "["):
            term, at = _required(tokens, at + 1)
        else:
            term, at = token.split("*")[0].strip().lower() == "nvlink", at + 1
        if result is None:
            result = bool(term)
        elif operator == "&":
            result = result or bool(term)
        else:
            result = result and bool(term)
    return result, at


def _per_node(gpus: tuple[GpuGres, ...], nodes: int, text: str) -> tuple[GpuGres, ...]:
    shares = []
    for gres in gpus:
        if gres.count % nodes:
            raise _bad(
                "--gpus",
                text,
                f"{gres.count} GPUs do not split evenly over {nodes} nodes; use --gpus-per-node",
            )
        shares.append(GpuGres(gres.type, gres.count // nodes))
    return tuple(shares)


def request_from_options(
    *,
    gres: str | None = None,
    gpus: str | None = None,
    gpus_per_node: str | None = None,
    nodes: int = 1,
    constraint: str | None = None,
    nvlink: bool = False,
) -> SlurmGpuRequest:
    """The request of sbatch-style options (the first of gres, gpus-per-node, gpus given)."""
    if nodes < 1:
        raise InvalidArgument.at("--nodes", f"must be >= 1, got {nodes}")
    if gres:
        per_node = parse_gres(gres)
    elif gpus_per_node:
        per_node = parse_gpus(gpus_per_node, "--gpus-per-node")
    elif gpus:
        per_node = _per_node(parse_gpus(gpus, "--gpus"), nodes, gpus)
    else:
        per_node = ()
    wants_nvlink = nvlink or (constraint is not None and constraint_wants_nvlink(constraint))
    return SlurmGpuRequest(per_node, nodes, wants_nvlink)


def _nodes(environ: Mapping[str, str]) -> int:
    for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        value = environ.get(name, "").strip()
        if value:
            return _count(name, value, value)
    return 1


def request_from_environ(environ: Mapping[str, str]) -> SlurmGpuRequest:
    """The request as a prolog sees it, from the first of these that is set:

    - SLURM_JOB_GRES (`gpu:h100:4`, the job's --gres, where the site exports it),
    - SLURM_GPUS_PER_NODE (--gpus-per-node; TaskProlog and batch environment),
    - SLURM_GPUS with SLURM_JOB_NUM_NODES (--gpus),
    - SLURM_JOB_GPUS (the Prolog's list of GPU ids Slurm gave the job on this node: a count
      of untyped GPUs);

    NVLink from SLURM_JOB_CONSTRAINTS (the Prolog's copy of --constraint) or GPUALLOC_NVLINK.
    """
    nodes = _nodes(environ)
    constraint = environ.get("SLURM_JOB_CONSTRAINTS") or None
    nvlink = environ.get("GPUALLOC_NVLINK", "").strip().lower() in _TRUE
    gres = environ.get("SLURM_JOB_GRES", "").strip()
    per_node_text = environ.get("SLURM_GPUS_PER_NODE", "").strip()
    gpus_text = environ.get("SLURM_GPUS", "").strip()
    job_gpus = environ.get("SLURM_JOB_GPUS", "").strip()
    if gres or per_node_text or gpus_text:
        return request_from_options(
            gres=gres or None,
            gpus_per_node=per_node_text or None,
            gpus=gpus_text or None,
            nodes=nodes,
            constraint=constraint,
            nvlink=nvlink,
        )
    ids = parse_gpu_ids(job_gpus)
    per_node = (GpuGres(None, len(ids)),) if ids else ()
    wants_nvlink = nvlink or bool(constraint and constraint_wants_nvlink(constraint))
    return SlurmGpuRequest(per_node, nodes, wants_nvlink, ids)


def with_types(request: SlurmGpuRequest, types: Sequence[str]) -> SlurmGpuRequest:
    """The request with Slurm's GPU ids turned into typed GRES: `types[i]` is the type of the
    node's i-th GPU line in gres.conf (as `gpualloc-slurm gres-conf` writes it). Unchanged when
    the request has no ids or an id is out of range (then the count alone is used)."""
    if not request.gpu_ids or any(i >= len(types) for i in request.gpu_ids):
        return request
    counts = Counter(types[i] for i in request.gpu_ids)
    per_node = tuple(GpuGres(t, n) for t, n in sorted(counts.items()))
    return replace(request, per_node=per_node)


def parse_gpu_ids(text: str, option: str = "SLURM_JOB_GPUS") -> tuple[int, ...]:
    """Slurm's GPU ids: `0,6,7` (SLURM_JOB_GPUS) or `0,6-7` (scontrol's IDX), in order."""
    ids: list[int] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if not _IDS.match(item):
            raise _bad(option, text, f"{item!r} is not a GPU id or id range")
        low, _, high = item.partition("-")
        ids.extend(range(int(low), int(high or low) + 1))
    if len(set(ids)) != len(ids):
        raise _bad(option, text, "a GPU id repeats")
    return tuple(ids)


def gpu_ids_from_job_details(text: str) -> dict[str, tuple[int, ...]]:
    """Per node, the GPU ids Slurm gave the job, from `scontrol show job -d` (what slurmctld
    knows when PrologSlurmctld runs): lines like
    `     Nodes=h100-node-[1-2] CPU_IDs=0-1 Mem=0 GRES=gpu:h100:3(IDX:0,6-7)`.
    Nodes without GPUs are left out."""
    found: dict[str, tuple[int, ...]] = {}
    for match in _DETAIL_NODES.finditer(text):
        hosts, line = match.group(1), match.group(0)
        _, _, gres = line.partition(" GRES=")
        ids = tuple(
            i
            for idx in _DETAIL_GPU.findall(gres.split()[0] if gres.strip() else "")
            for i in parse_gpu_ids(idx, "scontrol show job -d")
        )
        if ids:
            for host in expand_hostlist(hosts):
                found[host] = ids
    return found


def submit_time_from_job_details(text: str) -> float | None:
    """When the job was submitted (seconds since the epoch), from `scontrol show job -d`'s
    `SubmitTime=2026-12-06T09:41:45`: local time, to the second, as the process that printed
    it (scontrol, or this process's libslurm) reads the clock's zone. Slurm sets it anew when
    it requeues the job. None when the text has none (`Unknown`, or no such field)."""
    found = _SUBMIT_TIME.search(text)
    if found is None:
        return None
    try:
        return datetime.fromisoformat(found[1]).timestamp()
    except ValueError:
        return None
