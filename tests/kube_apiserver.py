"""A protocol-level stand-in for kube-apiserver's cluster-scoped resourceslices endpoints.

A real HTTP/1.1 server on a free loopback port, for the real `kubernetes` client to talk to
(`Configuration(host=...)` or a kubeconfig naming `server`). It implements what a reflector
uses, the way kube-apiserver answers it:

- `GET /apis/resource.k8s.io/<version>/resourceslices?limit=&continue=`: a `ResourceSliceList`
  whose items carry no apiVersion/kind, `metadata.resourceVersion` of the snapshot, pages with
  `continue` tokens (a token older than the compaction answers 410);
- `...?watch=true&resourceVersion=N&allowWatchBookmarks=true&timeoutSeconds=T`: a chunked stream
  of `{"type", "object"}` lines for every change after N, then the changes as they happen, and
  a clean end after T seconds; a resourceVersion older than the compaction gets an `ERROR` event
  with a 410 `Expired` Status, as the real server sends;
- versions not in `versions`: 404 with a `NotFound` Status.

Test hooks: `create/update/delete` (each bumps the resourceVersion and is an event),
`bookmark()`, `compact()` (forget the history so far), `drop_watches()` (cut open watch
connections without the closing chunk), `stop()` / `start()` (the whole server goes away and
comes back on the same port), and `requests` (what was asked).
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

GROUP = "resource.k8s.io"
PLURAL = "resourceslices"

KubeObject = dict[str, Any]


@dataclass(frozen=True)
class Request:
    version: str
    watch: bool
    query: dict[str, str]


class FakeKubeApiServer:
    def __init__(self, versions: tuple[str, ...] = ("v1",)) -> None:
        self.versions = versions
        self.requests: list[Request] = []
        self._cond = threading.Condition()
        self._rv = 100
        self._objects: dict[str, KubeObject] = {}
        self._history: list[tuple[int, str, KubeObject]] = []  # (rv, type, object)
        self._compacted = 0  # watches from a resourceVersion below this get 410
        self._pages: dict[str, tuple[int, list[KubeObject]]] = {}
        self._sockets: dict[socket.socket, bool] = {}  # open connections -> is a watch
        self._generation = 0  # bumped by drop_watches/stop: open streams end
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeKubeApiServer:
        server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.05,), name="fake-kube-api"
        )
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every open connection; `start()` comes back on the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._cut(watches_only=False)
        if self._thread is not None:
            self._thread.join(5)

    def drop_watches(self) -> None:
        """Cut the open watch connections mid-stream (no closing chunk)."""
        self._cut(watches_only=True)

    def _cut(self, *, watches_only: bool) -> None:
        with self._cond:
            self._generation += 1
            sockets = [s for s, watch in self._sockets.items() if watch or not watches_only]
            self._cond.notify_all()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    # --- objects --------------------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        with self._cond:
            return str(self._rv)

    def open_watches(self) -> int:
        with self._cond:
            return sum(self._sockets.values())

    def create(self, obj: KubeObject) -> str:
        return self._change("ADDED", obj)

    def update(self, obj: KubeObject) -> str:
        return self._change("MODIFIED", obj)

    def delete(self, name: str) -> str:
        with self._cond:
            obj = self._objects.pop(name)
            self._rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self._rv)
            self._history.append((self._rv, "DELETED", obj))
            self._cond.notify_all()
            return str(self._rv)

    def bookmark(self) -> str:
        """A BOOKMARK at a new resourceVersion (as if other resources changed meanwhile)."""
        with self._cond:
            self._rv += 1
            marker: KubeObject = {
                "kind": "ResourceSlice",
                "apiVersion": f"{GROUP}/{self.versions[0]}",
                "metadata": {"resourceVersion": str(self._rv)},
            }
            self._history.append((self._rv, "BOOKMARK", marker))
            self._cond.notify_all()
            return str(self._rv)

    def expire_every_watch(self) -> None:
        """Answer 410 Gone to every watch from now on (a server whose watch cache lags)."""
        with self._cond:
            self._compacted = 10**18

    def compact(self) -> None:
        """Forget the history up to now: older resourceVersions are too old to watch from."""
        with self._cond:
            self._compacted = self._rv
            self._history = []
            self._pages.clear()

    def _change(self, kind: str, obj: KubeObject) -> str:
        with self._cond:
            name = obj["metadata"]["name"]
            if (kind == "ADDED") == (name in self._objects):
                raise AssertionError(f"{kind} {name}: exists={name in self._objects}")
            self._rv += 1
            stored = copy.deepcopy(obj)
            metadata = stored.setdefault("metadata", {})
            metadata["resourceVersion"] = str(self._rv)
            metadata.setdefault("uid", f"uid-{name}")
            self._objects[name] = stored
            self._history.append((self._rv, kind, stored))
            self._cond.notify_all()
            return str(self._rv)

    # --- serving --------------------------------------------------------------------------

    def list_page(self, version: str, query: dict[str, str]) -> tuple[int, KubeObject]:
        limit = int(query.get("limit", "0") or 0)
        with self._cond:
            token = query.get("continue")
            if token:
                if token not in self._pages:
                    return 410, _status(
                        410, "Expired", "The provided continue parameter is too old"
                    )
                rv, rest = self._pages.pop(token)
            else:
                rv, rest = self._rv, [self._objects[n] for n in sorted(self._objects)]
            page, rest = (rest[:limit], rest[limit:]) if limit else (rest, [])
            metadata: dict[str, Any] = {"resourceVersion": str(rv)}
            if rest:
                next_token = f"{rv}-{len(self._pages)}-{page[-1]['metadata']['name']}"
                self._pages[next_token] = (rv, rest)
                metadata["continue"] = next_token
            items = []
            for obj in page:
                item = copy.deepcopy(obj)
                item.pop("apiVersion", None)  # list items carry neither, as the real server's
                item.pop("kind", None)
                items.append(item)
        return 200, {
            "kind": "ResourceSliceList",
            "apiVersion": f"{GROUP}/{version}",
            "metadata": metadata,
            "items": items,
        }

    def watch_events(
        self, version: str, since: int, bookmarks: bool, deadline: float
    ) -> Iterator[KubeObject]:
        """Events after `since`, as they happen, until `deadline`; ConnectionAbortedError when
        watches are dropped (the handler then leaves without the closing chunk)."""
        with self._cond:
            generation = self._generation
            if since < self._compacted:
                message = f"too old resource version: {since} ({self._compacted})"
                yield {"type": "ERROR", "object": _status(410, "Expired", message)}
                return
        sent = since
        while True:
            with self._cond:
                while True:
                    if self._generation != generation:
                        raise ConnectionAbortedError("watch dropped")
                    pending = [e for e in self._history if e[0] > sent]
                    left = deadline - time.monotonic()
                    if pending or left <= 0:
                        break
                    self._cond.wait(left)
            if not pending:
                return
            for rv, kind, obj in pending:
                sent = rv
                if kind == "BOOKMARK" and not bookmarks:
                    continue
                event = copy.deepcopy(obj)
                event["apiVersion"] = f"{GROUP}/{version}"
                event["kind"] = "ResourceSlice"
                yield {"type": kind, "object": event}

    def register(self, sock: socket.socket, *, watch: bool) -> None:
        with self._cond:
            self._sockets[sock] = watch

    def unregister(self, sock: socket.socket) -> None:
        with self._cond:
            self._sockets.pop(sock, None)


def _status(code: int, reason: str, message: str) -> KubeObject:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _handler(api: FakeKubeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            api.register(self.connection, watch=False)

        def finish(self) -> None:
            api.unregister(self.connection)
            super().finish()

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            parts = url.path.strip("/").split("/")
            if len(parts) != 4 or parts[0] != "apis" or parts[1] != GROUP or parts[3] != PLURAL:
                self._json(404, _status(404, "NotFound", f"no handler for {url.path}"))
                return
            version = parts[2]
            watch = query.get("watch", "").lower() in ("true", "1")
            api.requests.append(Request(version, watch, query))
            if version not in api.versions:
                self._json(404, _status(404, "NotFound", "the server could not find the resource"))
            elif watch:
                self._watch(version, query)
            else:
                self._json(*api.list_page(version, query))

        def _json(self, code: int, body: KubeObject) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _watch(self, version: str, query: dict[str, str]) -> None:
            since = int(query.get("resourceVersion") or 0)
            timeout = float(query.get("timeoutSeconds") or 1800)
            bookmarks = query.get("allowWatchBookmarks", "").lower() == "true"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            api.register(self.connection, watch=True)
            try:
                deadline = time.monotonic() + timeout
                for event in api.watch_events(version, since, bookmarks, deadline):
                    line = json.dumps(event).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                pass  # dropped
            self.close_connection = True

    return Handler
