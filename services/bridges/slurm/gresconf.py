"""gres.conf for a node from the gpualloc inventory, so Slurm counts what gpualloc places.

Slurm's gres.conf (doc/man/man5/gres.conf.5, doc/html/gres.shtml) describes a node's GPUs:

    NodeName=h100-node-1 AutoDetect=off Name=gpu Type=h100 File=/dev/nvidia0 Links=-1,18,...

- `Type`: the short model name users request (`--gres=gpu:h100:4`), taken from the product
  name: the first word that is letters then digits (`H100`, `A100`, `L40S`, `T4`), lower-cased;
  otherwise the whole name as Slurm's AutoDetect writes it (lower case, spaces as `_`).
- `File=/dev/nvidia<N>`: N is the GPU's minor number, which is how the NVIDIA DRA driver names
  the device (`gpu-<N>`).
- `Links`: per GPU, the NVLink count to each GPU of the node in PCI bus id order (Slurm's
  device index), -1 for itself; written only when the inventory knows the node's NVLinks.
- MIG: Slurm supports pre-partitioned MIG only, typed `<model>_<profile>` (`a100_3g.20gb`).
  MIG devices that exist (the inventory saw them in a node report) are written with
  `MultipleFiles=` (the parent GPU and the two nvidia-caps access files) when the node's
  `/proc/driver/nvidia-caps/mig-minors` table is given; otherwise the node gets
  `AutoDetect=nvml`, which is how Slurm's MIG guide configures MIG, and the expected MIG types
  are listed in the comment. A GPU with MIG devices is not also listed whole.

The comment at the top carries the matching `slurm.conf` `Gres=` value.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.client.inventory import InventoryDevice, NodeInventory
from services.common.errors import InvalidArgument

__all__ = ["GresEntry", "gpu_type", "gres_entries", "parse_mig_minors", "render_gres_conf"]

_WHOLE = re.compile(r"^gpu-(\d+)$")
_MIG = re.compile(r"^gpu-(\d+)-mig-")
_CI = re.compile(r"-ci(\d+)$")
_MODEL_WORD = re.compile(r"^[a-z]+\d+[a-z]*$")
_MINOR_LINE = re.compile(r"^(\S+)\s+(\d+)$")
CREATED_ATTRIBUTE = "gpualloc.io/migCreated"
GPU_INSTANCE_ATTRIBUTE = "gpualloc.io/gpuInstanceId"


def gpu_type(product_name: str) -> str:
    """`NVIDIA H100 80GB HBM3` -> `h100`; `NVIDIA GeForce RTX 2060` -> `nvidia_geforce_rtx_2060`."""
    lowered = product_name.lower()
    for word in re.split(r"[\s\-_]+", lowered):
        if _MODEL_WORD.match(word) and not word.endswith("gb"):
            return word
    return lowered.replace(" ", "_")


def parse_mig_minors(text: str) -> dict[str, int]:
    """`/proc/driver/nvidia-caps/mig-minors`: `gpu0/gi1/access 12` lines -> {name: minor}."""
    minors = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        match = _MINOR_LINE.match(line)
        if match is None:
            raise InvalidArgument.at(f"mig-minors:{number}", f"expected `name minor`, got {line!r}")
        minors[match[1]] = int(match[2])
    return minors


@dataclass(frozen=True)
class GresEntry:
    """One gres.conf line's content (without NodeName)."""

    type: str
    files: tuple[str, ...]
    links: tuple[int, ...] = ()
    mig: bool = False
    device: str = ""
    """The inventory device the line is (`gpu-3`): what Slurm's GPU id of this line names."""

    def render(self, node: str) -> str:
        key = "MultipleFiles" if self.mig else "File"
        line = (
            f"NodeName={node} AutoDetect=off Name=gpu Type={self.type} {key}={','.join(self.files)}"
        )
        if self.links:
            line += " Links=" + ",".join(str(n) for n in self.links)
        return line


def _product(device: InventoryDevice) -> str:
    return str(device.attribute("productName") or "")


def _created_migs(node: NodeInventory) -> list[InventoryDevice]:
    return [
        d
        for d in node.devices
        if d.type == "mig" and (d.uuid is not None or d.attribute(CREATED_ATTRIBUTE) is True)
    ]


def _minor(device: InventoryDevice) -> int:
    """The minor number of a whole GPU named `gpu-<minor>` by the NVIDIA DRA driver."""
    return int(device.id.device.removeprefix("gpu-"))


def _links(node: NodeInventory, whole: Sequence[InventoryDevice]) -> dict[str, tuple[int, ...]]:
    """Per device name, its Links list (empty when the node has no NVLink)."""
    if not node.nvlinks:
        return {}
    bus = {g.uuid: g.pci_bus_id for g in node.gpus}
    ordered = sorted(whole, key=lambda d: (bus.get(d.uuid or "", ""), d.id.device))
    return {
        d.id.device: tuple(
            -1 if other is d else node.nvlink_count(d.uuid or "", other.uuid or "")
            for other in ordered
        )
        for d in ordered
    }


def _mig_entry(device: InventoryDevice, minors: Mapping[str, int]) -> GresEntry | None:
    parent = _MIG.match(device.id.device)
    gi = device.attribute(GPU_INSTANCE_ATTRIBUTE)
    profile = device.attribute("profile")
    if parent is None or not isinstance(gi, int) or not isinstance(profile, str):
        return None
    ci_match = _CI.search(device.id.device)
    ci = int(ci_match[1]) if ci_match else 0
    gpu = int(parent[1])
    gi_key, ci_key = f"gpu{gpu}/gi{gi}/access", f"gpu{gpu}/gi{gi}/ci{ci}/access"
    if gi_key not in minors or ci_key not in minors:
        return None
    files = (
        f"/dev/nvidia{gpu}",
        f"/dev/nvidia-caps/nvidia-cap{minors[gi_key]}",
        f"/dev/nvidia-caps/nvidia-cap{minors[ci_key]}",
    )
    return GresEntry(
        f"{gpu_type(_product(device))}_{profile}", files, mig=True, device=device.id.device
    )


def gres_entries(
    node: NodeInventory, mig_minors: Mapping[str, int] | None = None
) -> tuple[list[GresEntry], list[str]]:
    """The node's entries, and the MIG types left to AutoDetect=nvml (when minors are missing)."""
    migs = _created_migs(node)
    split = {m.group(1) for d in migs if (m := _MIG.match(d.id.device))}
    whole = [
        d
        for d in node.devices
        if d.type == "gpu" and (w := _WHOLE.match(d.id.device)) and w.group(1) not in split
    ]
    links = _links(node, whole)
    entries = [
        GresEntry(
            gpu_type(_product(d)),
            (f"/dev/nvidia{_minor(d)}",),
            links.get(d.id.device, ()),
            device=d.id.device,
        )
        for d in sorted(whole, key=_minor)
    ]
    autodetected: list[str] = []
    for device in sorted(migs, key=lambda d: d.id.device):
        entry = _mig_entry(device, mig_minors or {})
        if entry is not None:
            entries.append(entry)
        else:
            autodetected.append(f"{gpu_type(_product(device))}_{device.attribute('profile')}")
    return entries, autodetected


def render_gres_conf(node: NodeInventory, mig_minors: Mapping[str, int] | None = None) -> str:
    """The gres.conf text for one node (see the module docstring)."""
    entries, autodetected = gres_entries(node, mig_minors)
    counts = Counter(e.type for e in entries) + Counter(autodetected)
    gres = ",".join(f"gpu:{t}:{n}" for t, n in sorted(counts.items()))
    lines = [
        f"# gres.conf for {node.name}, generated by `gpualloc-slurm gres-conf` from the gpualloc",
        "# inventory. slurm.conf must say the same:",
        f"#   NodeName={node.name} Gres={gres or 'gpu:0'}",
    ]
    if any(e.links for e in entries):
        lines.append("# Links: NVLinks to each GPU in PCI bus id order (-1: the GPU itself).")
    if autodetected:
        # Slurm's MIG support is AutoDetect=nvml, for the whole node: keep the explicit lines
        # as a record of what it should find.
        shown = ", ".join(f"gpu:{t}:{n}" for t, n in sorted(Counter(autodetected).items()))
        lines.append(f"# MIG devices, left to AutoDetect (pass --mig-minors to pin them): {shown}")
        lines.append(f"NodeName={node.name} AutoDetect=nvml")
        lines.extend(f"#   expected: {entry.render(node.name)}" for entry in entries)
    else:
        lines.extend(entry.render(node.name) for entry in entries)
    if not entries and not autodetected:
        lines.append(f"# {node.name} has no GPU in the inventory")
    return "\n".join(lines) + "\n"
