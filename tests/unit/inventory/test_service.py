"""InventoryService: atomic applies, reports on the service clock, the staleness sweeper, watches
(deltas from reports, heartbeats) and persistence-before-publish."""

from __future__ import annotations

import gc
import itertools
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from services.common.dra.model import Node, ResourceSlice
from services.common.dra.parse import load_objects
from services.common.errors import InvalidArgument, Unavailable
from services.common.gc_policy import GcPolicy
from services.inventory.adapters.sources.nvidia_smi_xml import parse_nvidia_smi_xml
from services.inventory.adapters.store.redis_repository import RedisInventoryRepository
from services.inventory.app.service import InventoryService, WatchEvent
from services.inventory.core.report import NodeReport
from services.inventory.core.state import Change, InventoryState
from services.inventory.core.view import UNREACHABLE_TAINT_KEY

DATA = Path(__file__).parents[2] / "data"
T4_SLICE_FILE = DATA / "resourceslices" / "openshift-v1.35_2x-tesla-t4_condensed.yaml"
T4_XML = DATA / "nvidia-smi-xml" / "tesla-t4_turing_drv515_telegraf.xml"


def t4_slice() -> ResourceSlice:
    (loaded,) = load_objects(T4_SLICE_FILE.read_text(), str(T4_SLICE_FILE))
    assert isinstance(loaded, ResourceSlice)
    return loaded


class FakeClock:
    def __init__(self, now: float = 1_750_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def report(node: str = "gpu-node") -> NodeReport:
    return parse_nvidia_smi_xml(T4_XML.read_text(), node, str(T4_XML))


def test_an_invalid_slice_fails_the_whole_apply_nodes_included() -> None:
    service = InventoryService()
    bad = replace(t4_slice(), driver="Not A Driver")
    with pytest.raises(InvalidArgument) as info:
        service.apply([t4_slice(), bad], [Node("n1", {"zone": "a"})])
    assert info.value.field_path.startswith("slices[1].")
    assert service.generation == 0 and not service.snapshot().entries


def test_sync_slices_replaces_and_deletes_in_one_generation_or_not_at_all() -> None:
    service = InventoryService(max_objects_per_apply=1)
    other = replace(t4_slice(), name="other")
    assert service.sync_slices([t4_slice(), other]) == 1  # no request size limit
    bad = replace(t4_slice(), name="third", driver="Not A Driver")
    with pytest.raises(InvalidArgument) as info:
        service.sync_slices([t4_slice(), bad], delete=["other"])
    assert info.value.field_path.startswith("slices[1].")
    assert service.generation == 1
    assert sorted(service.snapshot().slices) == sorted(["other", t4_slice().name])
    assert service.sync_slices([], delete=["other", "never-there"]) == 2
    assert sorted(service.snapshot().slices) == [t4_slice().name]


def test_requests_over_the_size_limit_are_invalid() -> None:
    service = InventoryService(max_objects_per_apply=2)
    with pytest.raises(InvalidArgument) as info:
        service.apply([t4_slice()], [Node("a"), Node("b")])
    assert info.value.field_path == "slices"
    assert "at most 2" in str(info.value)


def test_a_dry_run_reports_what_would_change_and_changes_nothing() -> None:
    service = InventoryService()
    result = service.apply([t4_slice()], dry_run=True)
    assert (result.generation, result.applied) == (0, (t4_slice().name,))
    assert [p.complete for p in result.pools] == [True]
    assert service.generation == 0


def test_a_report_is_unchanged_only_when_it_repeats_the_last_fresh_one() -> None:
    """`gpualloc apply` prints `nodereport/NODE unchanged` from this: the same facts only
    refresh the TTL; a report ending a staleness clears the unreachable taint, a change."""
    clock = FakeClock()
    service = InventoryService(clock=clock, report_ttl=60.0)
    seen = [service.report(report())]
    clock.now += 30
    seen.append(service.report(replace(report(), timestamp="Thu Jan  1 00:00:30 2026")))
    clock.now += 61
    assert service.sweep() is not None  # stale: its synthesized devices get the taint
    seen.append(service.report(report()))
    assert [(r.unchanged, r.generation) for r in seen] == [(False, 1), (True, 1), (False, 3)]


def test_the_sweeper_taints_silent_nodes_and_a_new_report_clears_it() -> None:
    clock = FakeClock()
    service = InventoryService(clock=clock, report_ttl=60.0)
    changes: list[Change] = []
    stale = threading.Event()

    def listen(state: InventoryState, change: Change) -> None:
        changes.append(change)
        if change.reason == "stale":
            stale.set()

    service.subscribe(listen)
    service.report(report())
    clock.now += 61
    service.start_sweeper(0.01)
    try:
        assert stale.wait(5)
    finally:
        service.close()
    view = service.snapshot().view("gpu-node")
    assert view is not None
    assert [t.key for d in view.devices for t in d.device.taints] == [UNREACHABLE_TAINT_KEY]
    assert [c.reason for c in changes] == ["report", "stale"]


def test_watch_streams_report_changes_as_node_deltas() -> None:
    service = InventoryService()
    events = service.watch(wait_seconds=0.05)
    first = next(events)
    assert first.reset and first.nodes == frozenset()
    result = service.report(report())
    delta = next(events)
    assert (delta.reset, delta.nodes, delta.state.generation) == (
        False,
        frozenset({"gpu-node"}),
        result.generation,
    )
    service.close()
    assert list(events) == []


def test_an_idle_watch_gets_heartbeats() -> None:
    service = InventoryService()
    events = service.watch(wait_seconds=0.05, heartbeat_seconds=0.05)
    kinds = [(e.reset, e.heartbeat) for e in itertools.islice(events, 3)]
    assert kinds == [(True, False), (False, True), (False, True)]
    service.close()


def test_a_change_that_cannot_be_saved_is_not_published() -> None:
    repository = RedisInventoryRepository("redis://127.0.0.1:1/0", socket_timeout=0.5)
    service = InventoryService(repository=repository)
    seen: list[WatchEvent] = []
    with pytest.raises(Unavailable):
        service.apply([t4_slice()])
    seen.extend(itertools.islice(service.watch(wait_seconds=0.01), 1))
    assert service.generation == 0 and seen[0].state.generation == 0
    service.close()


def test_the_gc_policy_freezes_survivors_and_unfreezes_on_stop() -> None:
    policy = GcPolicy(freeze_every=0.01, full_every=0.02).start()
    try:
        assert gc.get_freeze_count() > 0
        kept = [object() for _ in range(100)]
        deadline = time.monotonic() + 5
        while gc.get_freeze_count() < len(kept) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        policy.stop()
    assert gc.get_freeze_count() == 0


def test_an_idle_watch_without_heartbeats_sends_nothing_until_a_change() -> None:
    service = InventoryService()
    events = service.watch(wait_seconds=0.01)
    assert next(events).reset
    timer = threading.Timer(0.2, lambda: service.report(report()))
    timer.start()
    event = next(events)  # twenty idle wake-ups pass first
    timer.join()
    assert (event.reset, event.heartbeat, event.nodes) == (False, False, frozenset({"gpu-node"}))
    service.close()
