"""`KubernetesKueueApi`: the KueueApi port over the official kubernetes Python client.

The client is imported when the adapter is built, not when gpualloc is imported, so it is an
optional dependency (`pip install kubernetes`; the sidecar's image installs it). Everything goes
through `CustomObjectsApi`, which reaches any API group by path: Kueue's kueue.x-k8s.io/v1beta2
objects and resource.k8s.io/v1 ResourceClaimTemplates alike.

Status writes are server-side apply, as Kueue's own admission-check controllers do
(pkg/workload/patching): `status.admissionChecks` is a list-map keyed by `name` in Kueue's CRD,
so applying one entry under our field manager leaves the other checks' entries alone; the
AdmissionCheck's `Active` condition is applied the same way.

Run against a real kube-apiserver v1.34.4 under a real Kueue v0.17.0 in
tests/e2e/test_kueue_real.py (docs/bridges.md, "Kueue"); the port's behaviour is also pinned by
MemoryKueueApi and the controller tests.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from services.bridges.kueue.objects import GROUP, VERSION
from services.common.errors import FailedPrecondition, Unavailable

__all__ = ["FIELD_MANAGER", "KubernetesKueueApi"]

FIELD_MANAGER = "gpualloc-admission"
_APPLY = "application/apply-patch+yaml"

log = logging.getLogger("gpualloc.kueue.k8s")

KubeObject = dict[str, Any]


def _import_kubernetes() -> Any:
    try:
        return importlib.import_module("kubernetes")
    except ModuleNotFoundError:
        raise FailedPrecondition(
            "the kubernetes Python client is not installed: pip install kubernetes"
        ) from None


class KubernetesKueueApi:
    """Talks to the cluster the process runs in (in-cluster config), else to ~/.kube/config."""

    def __init__(self, *, field_manager: str = FIELD_MANAGER, api_client: Any = None) -> None:
        self._k8s = _import_kubernetes()
        if api_client is None:
            configuration = self._k8s.client.Configuration()
            try:
                self._k8s.config.load_incluster_config(client_configuration=configuration)
            except self._k8s.config.ConfigException:
                self._load_kube_config(configuration)
            configuration.keep_alive = True  # a silently dropped watch fails within minutes
            api_client = self._k8s.client.ApiClient(configuration)
        self._custom = self._k8s.client.CustomObjectsApi(api_client)
        self._field_manager = field_manager
        self._resource_version = ""

    def _load_kube_config(self, configuration: Any) -> None:
        """~/.kube/config; without one (not in a pod either) the cluster is Unavailable, a
        message and an exit code, not the client library's traceback."""
        try:
            self._k8s.config.load_kube_config(client_configuration=configuration)
        except (self._k8s.config.ConfigException, OSError) as error:
            raise Unavailable(
                f"no Kubernetes cluster: not in a pod, and no usable kubeconfig ({error})"
            ) from None

    def _items(self, plural: str) -> list[KubeObject]:
        response = self._custom.list_cluster_custom_object(GROUP, VERSION, plural)
        self._resource_version = (
            response.get("metadata", {}).get("resourceVersion", "")
            if plural == "workloads"
            else self._resource_version
        )
        items: list[KubeObject] = response.get("items", [])
        return items

    def list_admission_checks(self) -> list[KubeObject]:
        return self._items("admissionchecks")

    def list_cluster_queues(self) -> list[KubeObject]:
        return self._items("clusterqueues")

    def list_workloads(self) -> list[KubeObject]:
        return self._items("workloads")

    def get_resource_flavor(self, name: str) -> KubeObject | None:
        try:
            found: KubeObject = self._custom.get_cluster_custom_object(
                GROUP, VERSION, "resourceflavors", name
            )
        except self._k8s.client.ApiException as error:
            if error.status == 404:
                return None
            raise
        return found

    def get_resource_claim_template(self, namespace: str, name: str) -> KubeObject | None:
        try:
            found: KubeObject = self._custom.get_namespaced_custom_object(
                "resource.k8s.io", "v1", namespace, "resourceclaimtemplates", name
            )
        except self._k8s.client.ApiException as error:
            if error.status == 404:
                return None
            raise
        return found

    def set_admission_check_state(
        self, namespace: str, workload: str, state: Mapping[str, Any]
    ) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Workload",
            "metadata": {"name": workload, "namespace": namespace},
            "status": {"admissionChecks": [dict(state)]},
        }
        self._custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            "workloads",
            workload,
            body,
            field_manager=self._field_manager,
            force=True,
            _content_type=_APPLY,
        )

    def set_admission_check_active(self, name: str, message: str) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {
            "type": "Active",
            "status": "True",
            "reason": "Active",
            "message": message,
            "lastTransitionTime": now,
        }
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AdmissionCheck",
            "metadata": {"name": name},
            "status": {"conditions": [condition]},
        }
        self._custom.patch_cluster_custom_object_status(
            GROUP,
            VERSION,
            "admissionchecks",
            name,
            body,
            field_manager=self._field_manager,
            force=True,
            _content_type=_APPLY,
        )

    def apply_namespaced(self, obj: Mapping[str, Any]) -> None:
        metadata = obj["metadata"]
        plural = {"Workload": "workloads", "LocalQueue": "localqueues"}[str(obj["kind"])]
        self._custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            metadata["namespace"],
            plural,
            metadata["name"],
            dict(obj),
            field_manager=self._field_manager,
            force=True,
            _content_type=_APPLY,
        )

    def delete_workload(self, namespace: str, name: str) -> None:
        try:
            self._custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, "workloads", name
            )
        except self._k8s.client.ApiException as error:
            if error.status != 404:
                raise

    def wait_for_change(self, timeout_seconds: float) -> bool:
        """Watch Workloads from the last list's resourceVersion; True on the first event."""
        watch = self._k8s.watch.Watch()
        try:
            for _event in watch.stream(
                self._custom.list_cluster_custom_object,
                GROUP,
                VERSION,
                "workloads",
                resource_version=self._resource_version or None,
                timeout_seconds=max(1, int(timeout_seconds)),
            ):
                return True
        except self._k8s.client.ApiException as error:
            if error.status != 410:  # 410 Gone: the version is too old; the next list renews it
                log.warning("watching workloads: %s", error)
        finally:
            watch.stop()
        return False
