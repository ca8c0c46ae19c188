"""The ResourceSlice mirror (adapters/sources/kube_slices.py) against a real kube-apiserver
v1.34.4 on etcd (tests/control_plane.py): resource.k8s.io/v1 slices created, changed and
deleted through the API server reach the inventory, and the watch resumes after the API server
restarts (a slice deleted and one added while it was down are both seen). The faults a real
server cannot be made to show on demand (410 on a compacted list token, a garbled stream,
dropped watches) stay with the stand-in (tests/integration/test_inventory_kube_watch.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import kubernetes  # the `kube` extra (make install): a real import, never a skip
import pytest

from services.inventory.adapters.sources.kube_slices import (
    Backoff,
    KubeSliceWatch,
    ResourceSliceApi,
)
from services.inventory.app.service import InventoryService
from tests.control_plane import ControlPlane, control_plane_in
from tests.integration.test_inventory_kube_watch import (
    DEADLINE_SECONDS,
    T4_NAME,
    eventually,
    slice_names,
    t4_slice,
)

pytestmark = pytest.mark.timeout(300)  # etcd, kube-apiserver and its restart

GROUP, VERSION, PLURAL = "resource.k8s.io", "v1", "resourceslices"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with control_plane_in(tmp_path_factory.mktemp("control-plane")) as started:
        yield started


def _custom(plane: ControlPlane):
    return kubernetes.client.CustomObjectsApi(plane.api_client())


def _create(plane: ControlPlane, doc: dict[str, Any]) -> None:
    body = {**doc, "metadata": {"name": doc["metadata"]["name"]}}
    _custom(plane).create_cluster_custom_object(GROUP, VERSION, PLURAL, body)


def test_slices_created_changed_and_deleted_through_the_api_server_are_mirrored(plane):
    _create(plane, t4_slice())
    service = InventoryService()
    api = ResourceSliceApi(plane.api_client(), page_size=500)
    watch = KubeSliceWatch(service, api, backoff=Backoff(0.05, 0.5)).start()
    try:
        assert watch.wait_synced(DEADLINE_SECONDS)
        assert slice_names(service) == [T4_NAME]
        assert watch.status().api_version == "resource.k8s.io/v1"

        _create(plane, t4_slice("t4-b", "node-b"))
        eventually(lambda: "t4-b" in service.snapshot().slices, "ADDED reaches the inventory")

        current = _custom(plane).get_cluster_custom_object(GROUP, VERSION, PLURAL, "t4-b")
        current["spec"]["devices"] = current["spec"]["devices"][:1]
        _custom(plane).replace_cluster_custom_object(GROUP, VERSION, PLURAL, "t4-b", current)
        eventually(
            lambda: len(service.snapshot().slices["t4-b"].devices) == 1, "MODIFIED replaces it"
        )

        _custom(plane).delete_cluster_custom_object(GROUP, VERSION, PLURAL, "t4-b")
        eventually(lambda: "t4-b" not in service.snapshot().slices, "DELETED removes it")

        plane.stop_apiserver()
        # while it is down the watch retries with backoff; etcd keeps what is changed after
        plane.start_apiserver()
        _create(plane, t4_slice("t4-c", "node-c"))
        _custom(plane).delete_cluster_custom_object(GROUP, VERSION, PLURAL, T4_NAME)
        eventually(lambda: slice_names(service) == ["t4-c"], "the watch resumed after the restart")
        assert watch.status().resource_version
    finally:
        watch.stop()
        for name in ("t4-c", T4_NAME, "t4-b"):
            with contextlib.suppress(kubernetes.client.ApiException):
                _custom(plane).delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
