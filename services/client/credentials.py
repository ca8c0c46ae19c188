"""Bearer tokens as gRPC call credentials: `authorization: Bearer <jwt>` on every call.

The token lives in a file because that is how Kubernetes hands one out: a projected
service-account token is rewritten by the kubelet well before it expires (an atomic symlink
swap), and OIDC helpers write theirs the same way. So the file is not read once: before each
call the plugin compares the file's identity (inode, mtime, size) with what it read last and
re-reads it only when that changed, which costs one `stat` per call.

A file that cannot be read (or is empty) when the client starts is an InvalidArgument naming
the file, so a misconfigured pod fails at start, not on its first RPC. Once a token was read, a
failed re-read (the moment of a swap, a transient error) keeps sending the last good token and
logs a warning: the server is the one that decides whether that token is still valid.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import grpc

from services.common.errors import InvalidArgument

__all__ = ["AUTHORIZATION_METADATA", "BearerTokenFile", "read_token"]

AUTHORIZATION_METADATA = "authorization"

log = logging.getLogger("gpualloc.client")

_FileVersion = tuple[int, int, int]  # (inode, mtime ns, size)


def read_token(path: Path) -> str:
    """The token in `path`, surrounding whitespace removed; InvalidArgument when there is none
    or it could not go into a metadata value (printable ASCII without spaces, as a JWT is)."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except OSError as error:
        raise InvalidArgument.at("token_file", f"cannot read {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise InvalidArgument.at("token_file", f"{path}: a token is ASCII text") from None
    if not text:
        raise InvalidArgument.at("token_file", f"{path} is empty")
    if not all("!" <= character <= "~" for character in text):
        raise InvalidArgument.at(
            "token_file", f"{path}: a bearer token has no spaces or control characters"
        )
    return text


def _version(path: Path) -> _FileVersion:
    status = os.stat(path)
    return (status.st_ino, status.st_mtime_ns, status.st_size)


class BearerTokenFile(grpc.AuthMetadataPlugin):
    """Sends the token in `path` as `authorization: Bearer …`, re-read when the file changes.

    Thread-safe: gRPC calls plugins from its own threads, one call at a time per channel is
    not guaranteed. `reads` counts the times the file was read (tests check rotation by it)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._seen = _version_or_none(self.path)
        self._token = read_token(self.path)
        self.reads = 1

    def token(self) -> str:
        """The current token: re-read when the file changed since the last read."""
        with self._lock:
            try:
                version = _version(self.path)
                if version != self._seen:
                    self._token = read_token(self.path)
                    self._seen = version
                    self.reads += 1
            except (OSError, InvalidArgument) as error:
                log.warning(
                    "token file %s unreadable, sending the last token: %s", self.path, error
                )
            return self._token

    def __call__(
        self,
        context: grpc.AuthMetadataContext,
        callback: grpc.AuthMetadataPluginCallback,
    ) -> None:
        callback(((AUTHORIZATION_METADATA, f"Bearer {self.token()}"),), None)


def _version_or_none(path: Path) -> _FileVersion:
    try:
        return _version(path)
    except OSError as error:
        raise InvalidArgument.at("token_file", f"cannot read {path}: {error.strerror}") from None
