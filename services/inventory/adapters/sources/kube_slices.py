"""The cluster's ResourceSlices, mirrored into the inventory by list+watch (GPUALLOC_KUBE_WATCH).

`KubeSliceWatch` runs a reflector loop in a daemon thread, as client-go's does:

1. **List** `resource.k8s.io/v1` resourceslices (`v1beta2` when the API server does not serve
   v1: a 404), in pages of `page_size`, and make the inventory hold exactly the listed slices
   in one generation (`InventoryService.sync_slices`): listed slices are created or replaced,
   slices the watch owned that are no longer listed are removed.
2. **Watch** from the list's resourceVersion with `allowWatchBookmarks`: ADDED and MODIFIED
   apply the slice, DELETED removes it, BOOKMARK only advances the resourceVersion. Each event
   is one generation. The server ends a watch after `timeoutSeconds` (5-10 min, randomized);
   the loop then watches again from the last resourceVersion.
3. **410 Gone** ("too old resource version", as an ERROR event or an HTTP status, also for an
   expired list `continue` token): list again and apply the difference (slices deleted while
   the watch was away disappear). Any other failure (connection refused or dropped, 5xx, 429,
   401/403, a garbled stream, a failed save): log, wait a jittered, capped exponential backoff
   and resume the watch from the last resourceVersion that was applied.

**Ownership.** The inventory does not record where a slice came from, so the watch owns the
names it has listed or seen in events, plus the slices restored from the repository at start
(`adopt`): with the watch on, the cluster is their source, and a slice deleted from the cluster
while gpualloc was down is removed at the first list. Slices applied during this run by
ApplyResourceSlices or `GPUALLOC_SEED` under names the cluster does not publish are never
touched; a name the cluster publishes is the cluster's (its events overwrite or delete it).

**Malformed slices** (the API server accepted them, gpualloc's parser does not: a newer field
shape, a rule gpualloc checks more strictly) are logged and counted, never applied: the
inventory holds the cluster's *valid* slices, so a slice that turns malformed is removed, the
same whether a list or an event brings it. Nothing is half-applied: each list and each event
is one atomic `sync_slices` call.

The Kubernetes client (the `kube` extra) is imported only here and only when the watch is
built; objects travel as the JSON dicts the API server sends (no client model round trip, so
fields newer than the client survive) and become `ResourceSlice`s through the same parser as
`kubectl get -o yaml` output. State — resourceVersion, last list, counts, last error — is in
`status()`, in the logs and in the health service (`on_serving`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from services.common.dra.model import ResourceSlice
from services.common.dra.parse import decode_object
from services.common.errors import FailedPrecondition, GpuallocError, InvalidArgument
from services.inventory.app.service import InventoryService
from services.inventory.core.state import rfc3339

__all__ = [
    "GROUP",
    "PLURAL",
    "VERSIONS",
    "Backoff",
    "Expired",
    "KubeSliceWatch",
    "KubeWatchStatus",
    "NotServed",
    "ResourceSliceApi",
    "SliceListing",
    "api_client_from_settings",
    "slice_from_object",
]

log = logging.getLogger("gpualloc.inventory.kube")

GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2")  # preferred first
PLURAL = "resourceslices"
KIND = "ResourceSlice"

KubeObject = dict[str, Any]


# --- the Kubernetes client ------------------------------------------------------------------


def _import_kubernetes() -> Any:
    try:
        return importlib.import_module("kubernetes")
    except ModuleNotFoundError:
        raise FailedPrecondition(
            "GPUALLOC_KUBE_WATCH needs the kubernetes Python client: pip install 'gpualloc[kube]'"
        ) from None


def api_client_from_settings(mode: str, kubeconfig: str = "", context: str = "") -> Any:
    """A `kubernetes.client.ApiClient` for `mode` `in-cluster` (the pod's service account) or
    `kubeconfig` (`kubeconfig` or $KUBECONFIG or ~/.kube/config, `context` or the current one).
    A configuration that cannot be loaded is InvalidArgument naming the setting."""
    k8s = _import_kubernetes()
    configuration = k8s.client.Configuration()
    try:
        if mode == "in-cluster":
            k8s.config.load_incluster_config(client_configuration=configuration)
        elif mode == "kubeconfig":
            k8s.config.load_kube_config(
                config_file=kubeconfig or None,
                context=context or None,
                client_configuration=configuration,
                persist_config=False,
            )
        else:
            raise InvalidArgument.at("GPUALLOC_KUBE_WATCH", f"no client for mode {mode!r}")
    except GpuallocError:
        raise
    except Exception as error:  # ConfigException, OSError, YAML errors: all say "bad config"
        setting = "GPUALLOC_KUBE_WATCH" if mode == "in-cluster" else "GPUALLOC_KUBECONFIG"
        raise InvalidArgument.at(setting, f"{mode} configuration not loaded: {error}") from None
    # TCP keepalive with client-go's timings: a watch on a connection that a load balancer
    # dropped, or whose API server vanished, fails within minutes instead of after the watch's
    # read timeout (timeoutSeconds + 60 s).
    configuration.keep_alive = True
    return k8s.client.ApiClient(configuration)


class Expired(Exception):
    """410 Gone: the resourceVersion (or list continue token) is older than the server keeps."""


class NotServed(Exception):
    """404: the API server does not serve resourceslices at this version."""


class WatchError(Exception):
    """An ERROR event other than 410, or a line that is not a watch event."""


@dataclass(frozen=True)
class SliceListing:
    api_version: str  # "resource.k8s.io/v1"
    resource_version: str
    items: list[KubeObject]


class WatchStream:
    """The events of one watch response, one JSON object per line; `close()` from another
    thread ends a blocked read (shuts the socket down)."""

    def __init__(self, response: Any) -> None:
        self._response = response

    def __iter__(self) -> Iterator[KubeObject]:
        buffer = b""
        ended = False
        try:
            for chunk in self._response.stream(2**16, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield _event(line)
            ended = True
            if buffer.strip():
                yield _event(buffer)
        finally:
            if ended:
                self._release()  # read to the end: the connection may serve another request
            else:
                self._discard()  # abandoned mid-stream: never hand it back to the pool

    def close(self) -> None:
        shutdown = getattr(self._response, "shutdown", None)  # urllib3 >= 2.3
        try:
            if shutdown is not None:
                shutdown()
            else:
                sock = getattr(getattr(self._response, "connection", None), "sock", None)
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed

    def _release(self) -> None:
        with contextlib.suppress(Exception):  # best effort: the connection is dropped anyway
            self._response.release_conn()

    def _discard(self) -> None:
        """Close the connection of a stream left unread (its watch would stay open on the
        server until timeoutSeconds if it went back to the pool)."""
        with contextlib.suppress(Exception):  # urllib3 refuses once it released it itself
            self.close()
        with contextlib.suppress(Exception):
            self._response.close()


def _event(line: bytes) -> KubeObject:
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json can go
        raise WatchError(f"not a watch event: {line[:200]!r}") from None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise WatchError(f"not a watch event: {line[:200]!r}")
    return event


class ResourceSliceApi:
    """resource.k8s.io resourceslices through the official client's `CustomObjectsApi`, read as
    raw JSON (`_preload_content=False`)."""

    def __init__(
        self,
        api_client: Any,
        *,
        versions: Iterable[str] = VERSIONS,
        page_size: int = 500,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
    ) -> None:
        k8s = _import_kubernetes()
        self._custom = k8s.client.CustomObjectsApi(api_client)
        self._api_exception: type[Exception] = k8s.client.ApiException
        self._versions = tuple(versions)
        self._page_size = page_size
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout

    def list(self) -> SliceListing:
        """Every slice, from the first version in `versions` that the server serves."""
        for version in self._versions:
            try:
                return self._list(version)
            except NotServed:
                log.info("%s/%s %s not served, trying the next version", GROUP, version, PLURAL)
        served = ", ".join(f"{GROUP}/{v}" for v in self._versions)
        raise NotServed(f"the API server serves {PLURAL} at none of {served}")

    def _list(self, version: str) -> SliceListing:
        items: list[KubeObject] = []
        token: str | None = None
        while True:
            with self._translated(version):
                response = self._custom.list_cluster_custom_object(
                    GROUP,
                    version,
                    PLURAL,
                    limit=self._page_size,
                    _continue=token,
                    _preload_content=False,
                    _request_timeout=(self._connect_timeout, self._read_timeout),
                )
                try:
                    body = json.loads(response.data)
                finally:
                    response.release_conn()
            if not isinstance(body, dict) or not isinstance(body.get("items", []), list):
                raise WatchError(f"{GROUP}/{version} {PLURAL}: the list is not a List object")
            items.extend(body.get("items") or [])
            metadata = body.get("metadata") or {}
            token = metadata.get("continue") or None
            if token is None:
                return SliceListing(
                    f"{GROUP}/{version}", str(metadata.get("resourceVersion", "")), items
                )

    def watch(self, version: str, resource_version: str, timeout_seconds: int) -> WatchStream:
        """The events after `resource_version`; the server ends the stream after
        `timeout_seconds`. A read that waits longer than that (plus the read timeout) fails."""
        with self._translated(version):
            response = self._custom.list_cluster_custom_object(
                GROUP,
                version,
                PLURAL,
                watch=True,
                allow_watch_bookmarks=True,
                resource_version=resource_version,
                timeout_seconds=timeout_seconds,
                _preload_content=False,
                _request_timeout=(self._connect_timeout, timeout_seconds + self._read_timeout),
            )
        return WatchStream(response)

    def _translated(self, version: str) -> _Translate:
        return _Translate(self._api_exception, f"{GROUP}/{version} {PLURAL}")


class _Translate:
    """Turns the client's ApiException 410 and 404 into Expired and NotServed."""

    def __init__(self, api_exception: type[Exception], what: str) -> None:
        self._api_exception = api_exception
        self._what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, error: BaseException | None, traceback: object) -> None:
        if isinstance(error, self._api_exception):
            status = getattr(error, "status", None)
            reason = getattr(error, "reason", "")
            if status == 410:
                raise Expired(f"{self._what}: 410 {reason}") from None
            if status == 404:
                raise NotServed(f"{self._what}: 404 {reason}") from None


# --- objects --------------------------------------------------------------------------------


def slice_from_object(obj: Mapping[str, Any], api_version: str) -> ResourceSlice:
    """A ResourceSlice from the API server's JSON (list items carry no apiVersion/kind, so they
    default to the listing's); InvalidArgument/ParseError when gpualloc cannot use it."""
    data = dict(obj)
    data.setdefault("apiVersion", api_version)
    data.setdefault("kind", KIND)
    name = _name(data) or "<unnamed>"
    decoded = decode_object(data, f"{PLURAL}/{name}")
    if not isinstance(decoded, ResourceSlice):
        raise InvalidArgument.at(f"{PLURAL}/{name}: kind", f"expected {KIND}, got {data['kind']}")
    return decoded


def _metadata(obj: object) -> Mapping[str, Any]:
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    return metadata if isinstance(metadata, Mapping) else {}


def _name(obj: object) -> str | None:
    name = _metadata(obj).get("name")
    return name if isinstance(name, str) and name else None


def _resource_version(obj: object) -> str | None:
    version = _metadata(obj).get("resourceVersion")
    return version if isinstance(version, str) and version else None


# --- the loop -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Backoff:
    """Exponential from `initial` to `maximum` seconds, each delay drawn from [d/2, d]."""

    initial: float = 0.5
    maximum: float = 30.0

    def delay(self, failures: int, draw: Callable[[], float] = random.random) -> float:
        ceiling = min(self.maximum, self.initial * 2.0 ** max(failures - 1, 0))
        return ceiling / 2 + draw() * ceiling / 2


@dataclass(frozen=True)
class KubeWatchStatus:
    api_version: str | None = None  # the resourceslices version in use
    resource_version: str | None = None  # the last one applied (list, event or bookmark)
    synced: bool = False  # a list was applied and no failure happened since
    last_list_at: float | None = None  # epoch seconds of the last applied list
    last_event_at: float | None = None
    lists: int = 0
    events: int = 0
    slices: int = 0  # slices the watch owns
    malformed: int = 0  # slices skipped because gpualloc cannot parse them
    errors: int = 0  # failures that made the loop back off
    expired: int = 0  # 410 Gone answers (each followed by a list)
    last_error: str | None = None


class KubeSliceWatch:
    """The reflector loop (module docstring). `start()` runs it in a daemon thread, `stop()`
    ends it; `status()` is safe from any thread."""

    def __init__(
        self,
        service: InventoryService,
        api: ResourceSliceApi,
        *,
        adopt: Iterable[str] = (),
        on_serving: Callable[[bool], None] | None = None,
        backoff: Backoff | None = None,
        watch_timeout: tuple[int, int] = (300, 600),
        min_watch_seconds: float = 1.0,
        draw: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._service = service
        self._api = api
        self._owned: set[str] = set(adopt)
        self._on_serving = on_serving
        self._backoff = backoff or Backoff()
        self._watch_timeout = watch_timeout
        self._min_watch_seconds = min_watch_seconds
        self._draw = draw
        self._clock = clock
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._status = KubeWatchStatus(slices=len(self._owned))
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None
        self._synced = threading.Condition(self._lock)

    # --- control --------------------------------------------------------------------------

    def start(self) -> KubeSliceWatch:
        if self._thread is None:
            self._serving(False)
            self._thread = threading.Thread(target=self._run, name="inventory-kube", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        with self._lock:
            stream = self._stream
            self._synced.notify_all()
        if stream is not None:
            stream.close()
        if self._thread is not None:
            self._thread.join(timeout)

    def status(self) -> KubeWatchStatus:
        with self._lock:
            return self._status

    def wait_synced(self, timeout: float) -> bool:
        """Wait until a list has been applied (True), or `timeout` / stop (False)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not self._status.synced and not self._stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._synced.wait(left)
            return self._status.synced

    # --- the loop -------------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0  # in a row, without progress in between: sets the backoff
        version: str | None = None  # the group version of the last list; None: list first
        while not self._stopping.is_set():
            before = self.status()
            try:
                if version is None:
                    version = self._relist()
                self._watch(version)
                failures = 0  # the server ended the watch (timeoutSeconds): watch again
            except Expired as error:
                if self._stopping.is_set():
                    break
                self._update(expired=self.status().expired + 1)
                log.info("kube watch: %s; listing again", error)
                version = None
                if not self._progressed(before):
                    failures += 1  # expired again at once: do not spin
                    self._fail(error, failures)
            except Exception as error:
                if self._stopping.is_set():
                    break
                failures = 1 if self._progressed(before) else failures + 1
                self._fail(error, failures)
        self._serving(False)
        log.info("kube watch stopped", extra={"kube": _fields(self.status())})

    def _progressed(self, before: KubeWatchStatus) -> bool:
        """Whether events arrived since `before` (a list alone is not progress: a watch that
        expires right after every list must back off, as client-go's does)."""
        return self.status().events > before.events

    def _relist(self) -> str:
        listing = self._api.list()
        parsed: dict[str, ResourceSlice] = {}
        malformed = 0
        for item in listing.items:
            resource_slice = self._parse(item, listing.api_version)
            if resource_slice is None:
                malformed += 1
            else:
                parsed[resource_slice.name] = resource_slice
        gone = sorted(self._owned - parsed.keys())
        generation = self._service.sync_slices(list(parsed.values()), gone)
        self._owned = set(parsed)
        status = self._update(
            api_version=listing.api_version,
            resource_version=listing.resource_version,
            synced=True,
            last_list_at=self._clock(),
            lists=self.status().lists + 1,
            slices=len(self._owned),
            malformed=self.status().malformed + malformed,
        )
        self._serving(True)
        log.info(
            "kube watch: listed %d ResourceSlices of %s (%d malformed, %d owned ones gone) at "
            "resourceVersion %s; inventory generation %d",
            len(listing.items),
            listing.api_version,
            malformed,
            len(gone),
            listing.resource_version,
            generation,
            extra={"kube": _fields(status)},
        )
        return listing.api_version.rsplit("/", 1)[1]

    def _watch(self, version: str) -> None:
        resource_version = self.status().resource_version
        assert resource_version is not None
        low, high = self._watch_timeout
        timeout = low + int(self._draw() * (high - low))
        stream = self._api.watch(version, resource_version, timeout)
        with self._lock:
            self._stream = stream
        if self._stopping.is_set():
            stream.close()
        self._update(synced=True)  # caught up from a list, or resumed where it stopped
        self._serving(True)
        started, events = time.monotonic(), 0
        try:
            for event in stream:
                if self._stopping.is_set():
                    return
                self._handle(event, f"{GROUP}/{version}")
                events += 1
        finally:
            with self._lock:
                self._stream = None
        if events == 0 and time.monotonic() - started < self._min_watch_seconds:
            raise WatchError("the watch closed at once without an event")  # client-go's check

    def _handle(self, event: KubeObject, api_version: str) -> None:
        kind, obj = event["type"], event.get("object")
        if kind == "ERROR":
            code = obj.get("code") if isinstance(obj, Mapping) else None
            message = obj.get("message", "") if isinstance(obj, Mapping) else ""
            if code == 410:
                raise Expired(f"watch: 410 {message}")
            raise WatchError(f"watch ERROR event: {code} {message}")
        resource_version = _resource_version(obj)
        if kind in ("ADDED", "MODIFIED"):
            self._upsert(obj, api_version)
        elif kind == "DELETED":
            self._remove(_name(obj))
        elif kind != "BOOKMARK":
            log.warning("kube watch: unknown event type %r ignored", kind)
        changes: dict[str, Any] = {}
        if kind != "BOOKMARK":
            changes.update(events=self.status().events + 1, last_event_at=self._clock())
        if resource_version is not None:
            changes["resource_version"] = resource_version
        self._update(**changes)

    def _upsert(self, obj: object, api_version: str) -> None:
        resource_slice = self._parse(obj, api_version)
        if resource_slice is not None:
            try:
                self._service.sync_slices([resource_slice])
            except InvalidArgument as error:  # the parser validates the same: never expected
                log.warning("kube watch: skipped ResourceSlice %s: %s", resource_slice.name, error)
                resource_slice = None
        if resource_slice is None:
            self._update(malformed=self.status().malformed + 1)
            self._remove(_name(obj))  # the inventory holds the cluster's valid slices only
            return
        self._owned.add(resource_slice.name)
        self._update(slices=len(self._owned))

    def _remove(self, name: str | None) -> None:
        if name is not None and name in self._owned:
            self._service.sync_slices([], [name])
            self._owned.discard(name)
            self._update(slices=len(self._owned))

    def _parse(self, obj: object, api_version: str) -> ResourceSlice | None:
        name = _name(obj) or "<unnamed>"
        if not isinstance(obj, Mapping):
            log.warning("kube watch: skipped %s: not an object", name)
            return None
        try:
            return slice_from_object(obj, api_version)
        except GpuallocError as error:
            log.warning("kube watch: skipped malformed ResourceSlice %s: %s", name, error)
            return None

    # --- state ----------------------------------------------------------------------------

    def _update(self, **changes: Any) -> KubeWatchStatus:
        with self._lock:
            self._status = replace(self._status, **changes)
            if self._status.synced:
                self._synced.notify_all()
            return self._status

    def _fail(self, error: Exception, failures: int) -> None:
        text = f"{type(error).__name__}: {error}"
        status = self._update(errors=self.status().errors + 1, last_error=text, synced=False)
        self._serving(False)
        delay = self._backoff.delay(failures, self._draw)
        log.warning(
            "kube watch: %s; retrying in %.2fs (failure %d)",
            text,
            delay,
            failures,
            extra={"kube": _fields(status)},
        )
        self._stopping.wait(delay)

    def _serving(self, serving: bool) -> None:
        if self._on_serving is not None:
            self._on_serving(serving and not self._stopping.is_set())


def _fields(status: KubeWatchStatus) -> dict[str, Any]:
    return {
        "apiVersion": status.api_version,
        "resourceVersion": status.resource_version,
        "synced": status.synced,
        "lastListAt": None if status.last_list_at is None else rfc3339(status.last_list_at),
        "lastEventAt": None if status.last_event_at is None else rfc3339(status.last_event_at),
        "lists": status.lists,
        "events": status.events,
        "slices": status.slices,
        "malformed": status.malformed,
        "errors": status.errors,
        "expired": status.expired,
        "lastError": status.last_error,
    }
