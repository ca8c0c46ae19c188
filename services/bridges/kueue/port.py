"""`KueueApi`: everything the admission controller asks of Kubernetes, and nothing more.

The controller's logic is tested against `MemoryKueueApi` (memory_api.py) with real Kueue
manifests; `KubernetesKueueApi` (k8s_adapter.py) is the same port over the official kubernetes
client, imported lazily so that gpualloc does not depend on it. Objects cross the port as the
JSON the API server returns (dicts), so a manifest from Kueue's documentation can be fed in
as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["KueueApi"]

KubeObject = dict[str, Any]


class KueueApi(Protocol):
    def list_admission_checks(self) -> list[KubeObject]:
        """Every AdmissionCheck (cluster-scoped)."""
        ...

    def list_cluster_queues(self) -> list[KubeObject]:
        """Every ClusterQueue (cluster-scoped)."""
        ...

    def list_workloads(self) -> list[KubeObject]:
        """Every Workload of every namespace."""
        ...

    def get_resource_flavor(self, name: str) -> KubeObject | None:
        """A ResourceFlavor (cluster-scoped), None when it does not exist."""
        ...

    def get_resource_claim_template(self, namespace: str, name: str) -> KubeObject | None:
        """A resource.k8s.io/v1 ResourceClaimTemplate, None when it does not exist."""
        ...

    def set_admission_check_state(
        self, namespace: str, workload: str, state: Mapping[str, Any]
    ) -> None:
        """Write one entry of the Workload's status.admissionChecks (keyed by name), leaving
        the other checks' entries alone (server-side apply of a list-map)."""
        ...

    def set_admission_check_active(self, name: str, message: str) -> None:
        """Mark an AdmissionCheck Active, so ClusterQueues using it become active."""
        ...

    def apply_namespaced(self, obj: Mapping[str, Any]) -> None:
        """Create or update a namespaced Kueue object (server-side apply): the mirrors'
        LocalQueues and Workloads (mirror.py)."""
        ...

    def delete_workload(self, namespace: str, name: str) -> None:
        """Delete a Workload; one already gone is no error."""
        ...

    def wait_for_change(self, timeout_seconds: float) -> bool:
        """Block until a Workload changes (True) or the timeout passes (False)."""
        ...
