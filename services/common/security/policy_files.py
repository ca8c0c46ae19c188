"""The access policy file and the Kueue files it names, read at the edge and watched together.

`spec.quota.kueue.files` (kueue_quota/) names files or directories, relative to the policy
file's directory: a directory stands for its `*.yaml`, `*.yml` and `*.json` files in name order
(not its subdirectories), as `kubectl apply -f <dir>` reads it. Each file may hold several YAML
documents. `load_policy` reads them all with the stamp each had before it was read, so a
`WatchedFiles` that follows those stamps reloads the policy when any of them changes, is added
or removed — as it does for the policy file itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from services.common.errors import InvalidArgument
from services.common.security.kueue_quota import kueue_file_entries
from services.common.security.policy import AccessPolicy, parse_policy
from services.common.security.tls import Stamp, file_stamp

__all__ = ["LoadedPolicy", "load_policy"]

_SUFFIXES = (".yaml", ".yml", ".json")
_MAX_FILE_BYTES = 4 * 2**20
_MAX_FILES = 256


@dataclass(frozen=True)
class LoadedPolicy:
    """A parsed policy and the files beyond the policy file it was made from, with the stamps
    they had when read (what a reload watches)."""

    policy: AccessPolicy
    followed: Mapping[str, Stamp]


def load_policy(path: str, contents: bytes) -> LoadedPolicy:
    """Parse an AccessPolicy file (YAML) and the Kueue files it names; InvalidArgument naming
    the file and the field."""
    try:
        document = yaml.safe_load(contents.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise InvalidArgument.at(path, f"not valid YAML: {error}") from None
    followed: dict[str, Stamp] = {}
    files: dict[str, list[tuple[str, object]]] = {}
    base = Path(path).parent
    for i, entry in enumerate(kueue_file_entries(document)):
        where = f"{path}: spec.quota.kueue.files[{i}]"
        files[entry] = _read_entry(base / entry, entry, where, followed)
    return LoadedPolicy(parse_policy(document, source=path, kueue_files=files), followed)


def _read_entry(
    target: Path, entry: str, where: str, followed: dict[str, Stamp]
) -> list[tuple[str, object]]:
    """The documents of one `files` entry (a file, or a directory's files), each with its
    origin (`<entry>[<document>]`, `<entry>/<file>[<document>]`)."""
    try:
        followed[str(target)] = file_stamp(str(target))
        if not target.is_dir():
            return _documents(target, entry, where, followed)
        names = sorted(p.name for p in target.iterdir() if p.suffix in _SUFFIXES and p.is_file())
    except OSError as error:
        raise InvalidArgument.at(where, f"cannot read {target}: {error.strerror}") from None
    if len(names) > _MAX_FILES:
        raise InvalidArgument.at(where, f"{target} holds more than {_MAX_FILES} files")
    documents: list[tuple[str, object]] = []
    for name in names:
        documents.extend(_documents(target / name, f"{entry.rstrip('/')}/{name}", where, followed))
    return documents


def _documents(
    file: Path, origin: str, where: str, followed: dict[str, Stamp]
) -> list[tuple[str, object]]:
    try:
        followed[str(file)] = file_stamp(str(file))
        if os.path.getsize(file) > _MAX_FILE_BYTES:
            raise InvalidArgument.at(where, f"{file} is larger than {_MAX_FILE_BYTES} bytes")
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else str(error)
        raise InvalidArgument.at(where, f"cannot read {file}: {reason}") from None
    try:
        documents: Sequence[object] = list(yaml.safe_load_all(text))
    except yaml.YAMLError as error:
        raise InvalidArgument.at(where, f"{file} is not valid YAML: {error}") from None
    return [(f"{origin}[{i}]", document) for i, document in enumerate(documents)]
