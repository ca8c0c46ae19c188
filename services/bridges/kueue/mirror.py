"""Mirrors: Kueue's count sees the GPUs gpualloc grants a ClusterQueue's tenant outside Kueue.

Kueue counts only its own Workloads against a ClusterQueue's quota. When gpualloc grants a
Slurm job (or an API caller) GPUs charged to the tenant named as a ClusterQueue, Kueue does not
see them: it reserves the ClusterQueue's first flavor for a Workload, gpualloc's check answers
`Retry` (that flavor's quota is spent), Kueue evicts and requeues the Workload — and its requeue
forgets the assignment it tried (Kueue v0.17 rebuilds the queue's workload info,
pkg/cache/queue/manager.go), so flavor assignment starts again at the first flavor, which its
count still sees free: the Workload never reaches the next flavor
(tests/e2e/test_kueue_real.py::test_without_mirrors_a_real_kueue_retries_the_first_flavor_until_slurm_releases).

With a mirror namespace (GPUALLOC_KUEUE_MIRROR_NAMESPACE) and `cluster-queue` tenants, every
pass makes Kueue's count agree with gpualloc's: for each reservation of a ClusterQueue's tenant
that is not a Kueue Workload's, a Workload `gpualloc-mirror-<reservation>` in that namespace,
queued in the LocalQueue `gpualloc-<clusterqueue>` (applied when missing), with one pod set of
one pod asking for the reservation's device count of `nvidia.com/gpu` and, as its
nodeSelector, the nodeLabels of the flavor gpualloc charged (the first of the ClusterQueue's
flavors whose nodeLabels the reservation's node carries, as gpualloc's flavor search charges
devices). Kueue's flavor assigner skips a flavor whose nodeLabels the pod set's nodeSelector
does not match (pkg/scheduler/flavorassigner, checkFlavorForPodSets), so the mirror is
assigned the flavor gpualloc charged. The controller sets a mirror's check `Ready` at once,
placing nothing; Kueue admits it and counts it, and assigns the next Workload the next flavor.
A mirror is deleted when its reservation is gone (Kueue removes the finalizer of a Workload
without owners that is being deleted: pkg/controller/core/workload_controller.go).

gpualloc stays the authority: a mirror only informs Kueue's count. If Kueue preempts or evicts
a mirror, or it waits for quota Kueue's count does not have, the reservation is untouched; Kueue
requeues the mirror and admits it again when its count has room.

Pure: values in, values out (the controller reads and writes through its KueueApi).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.bridges.kueue.objects import GROUP, VERSION
from services.bridges.kueue.translate import GPU_RESOURCE
from services.client.results import Reservation

__all__ = [
    "MIRROR_ANNOTATION",
    "MIRROR_PRIORITY",
    "OWNER_ANNOTATION",
    "MIRROR_LABEL",
    "Mirror",
    "charged_flavor",
    "gpu_flavors",
    "is_mirror",
    "local_queue",
    "local_queue_name",
    "mirror_name",
    "wanted_mirrors",
]

MIRROR_LABEL = "gpualloc.io/mirror"  # "true" on every mirror Workload
MIRROR_ANNOTATION = "gpualloc.io/mirror-of"  # the reservation's id
OWNER_ANNOTATION = "gpualloc.io/mirror-owner"  # the reservation's owner
# A mirror's Workload priority: the highest a user's PriorityClass may have, so that a
# ClusterQueue whose preemption lets Kueue preempt by priority within it
# (`withinClusterQueue: LowerPriority`) evicts, to admit a mirror, a Workload Kueue reserved
# on quota gpualloc has already granted outside Kueue.
MIRROR_PRIORITY = 1_000_000_000
_NOT_NAME = re.compile(r"[^a-z0-9-]+")


def mirror_name(reservation_id: str) -> str:
    """`gpualloc-mirror-<id>`: the id up to its `@node`, as a DNS label (63 characters)."""
    head = _NOT_NAME.sub("-", reservation_id.partition("@")[0].lower()).strip("-")
    return f"gpualloc-mirror-{head}"[:63].rstrip("-")


def local_queue_name(cluster_queue: str) -> str:
    return f"gpualloc-{cluster_queue}"[:63].rstrip("-")


def is_mirror(workload: Mapping[str, Any]) -> bool:
    labels = (workload.get("metadata") or {}).get("labels") or {}
    return labels.get(MIRROR_LABEL) == "true"


def charged_flavor(
    node_labels: Mapping[str, str], flavors: Sequence[tuple[str, Mapping[str, str]]]
) -> tuple[str, Mapping[str, str]] | None:
    """The first (name, nodeLabels) of `flavors` whose nodeLabels the node carries."""
    for name, labels in flavors:
        if all(node_labels.get(k) == v for k, v in labels.items()):
            return name, labels
    return None


@dataclass(frozen=True)
class Mirror:
    """One mirror Workload wanted: of `reservation`, in ClusterQueue `cluster_queue`, on the
    flavor whose nodeLabels are `node_selector`."""

    cluster_queue: str
    reservation: Reservation
    flavor: str
    node_selector: Mapping[str, str]

    @property
    def name(self) -> str:
        return mirror_name(self.reservation.id)

    def workload(self, namespace: str) -> dict[str, Any]:
        pod = {
            "nodeSelector": dict(self.node_selector),
            "containers": [
                {
                    "name": "mirror",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {
                        "requests": {GPU_RESOURCE: str(len(self.reservation.devices))},
                        "limits": {GPU_RESOURCE: str(len(self.reservation.devices))},
                    },
                }
            ],
            "restartPolicy": "Never",
        }
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Workload",
            "metadata": {
                "namespace": namespace,
                "name": self.name,
                "labels": {MIRROR_LABEL: "true"},
                "annotations": {
                    MIRROR_ANNOTATION: self.reservation.id,
                    OWNER_ANNOTATION: self.reservation.owner,
                },
            },
            "spec": {
                "queueName": local_queue_name(self.cluster_queue),
                "priority": MIRROR_PRIORITY,
                "podSets": [{"name": "main", "count": 1, "template": {"spec": pod}}],
            },
        }


def local_queue(namespace: str, cluster_queue: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LocalQueue",
        "metadata": {"namespace": namespace, "name": local_queue_name(cluster_queue)},
        "spec": {"clusterQueue": cluster_queue},
    }


def gpu_flavors(
    cluster_queue: Mapping[str, Any], node_labels_of: Mapping[str, Mapping[str, str]]
) -> list[tuple[str, Mapping[str, str]]]:
    """The ClusterQueue's flavors for `nvidia.com/gpu`, in its order, with their nodeLabels
    (`node_labels_of`: ResourceFlavor name -> nodeLabels; a flavor not there is skipped)."""
    found = []
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        if GPU_RESOURCE not in (group.get("coveredResources") or []):
            continue
        for flavor in group.get("flavors") or []:
            name = str(flavor.get("name", ""))
            if name in node_labels_of:
                found.append((name, node_labels_of[name]))
    return found


def wanted_mirrors(
    grants: Mapping[str, Sequence[Reservation]],
    flavors_of: Mapping[str, Sequence[tuple[str, Mapping[str, str]]]],
    node_labels: Mapping[str, Mapping[str, str]],
) -> dict[str, Mirror]:
    """By mirror name, the mirrors `grants` (ClusterQueue -> its tenant's reservations that
    are not Kueue Workloads') want: each on the flavor its node is charged to (`flavors_of`:
    ClusterQueue -> its GPU flavors in order; `node_labels`: node -> labels). A reservation on
    a node none of its ClusterQueue's flavors covers is not mirrored: Kueue has no count of it."""
    wanted: dict[str, Mirror] = {}
    for cluster_queue, reservations in sorted(grants.items()):
        for reservation in reservations:
            charged = charged_flavor(
                node_labels.get(reservation.node_name, {}), flavors_of.get(cluster_queue, ())
            )
            if charged is None or not reservation.devices:
                continue
            mirror = Mirror(cluster_queue, reservation, charged[0], charged[1])
            wanted[mirror.name] = mirror
    return wanted
