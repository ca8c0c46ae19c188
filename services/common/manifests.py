"""Reading Kubernetes manifests from the command line's `-f` arguments: files, directories, stdin.

Like `kubectl -f`: a directory contributes its `*.yaml`, `*.yml` and `*.json` files (recursively,
sorted by path), `-` is standard input (once: a second `-` would read nothing). Objects come
back in argument order. Each file and stdin is bounded by `DocumentLimits` (dra/limits.py).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from services.common.dra.limits import DocumentLimits
from services.common.dra.parse import KubeObject, Where, load_located_objects, read_stdin, read_text
from services.common.errors import InvalidArgument

__all__ = [
    "MANIFEST_SUFFIXES",
    "VALIDATE_CHOICES",
    "add_validate_flag",
    "expand_paths",
    "load_located_manifests",
    "load_manifests",
    "refuse_second_stdin",
]

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


def expand_paths(paths: Iterable[str]) -> Iterator[str]:
    """Each argument as files: `-` stays `-`, a directory becomes its manifest files."""
    stdin_seen = False
    for raw in paths:
        if raw == "-":
            stdin_seen = refuse_second_stdin(stdin_seen)
            yield raw
            continue
        path = Path(raw)
        if path.is_dir():
            found = sorted(
                p for p in path.rglob("*") if p.suffix in MANIFEST_SUFFIXES and p.is_file()
            )
            if not found:
                raise InvalidArgument(f"{raw}: directory holds no .yaml, .yml or .json files")
            yield from (str(p) for p in found)
        elif path.exists():
            yield raw
        else:
            raise InvalidArgument(f"{raw}: no such file or directory")


def refuse_second_stdin(seen: bool) -> bool:
    """True (stdin is now taken), or InvalidArgument when it already was."""
    if seen:
        raise InvalidArgument.at("-f", "`-` (standard input) can be given only once")
    return True


def load_manifests(
    paths: Iterable[str], stdin: TextIO | None = None, limits: DocumentLimits | None = None
) -> list[KubeObject]:
    """Every object of every path, in order; errors name the file (and line, field path)."""
    return [obj for obj, _ in load_located_manifests(paths, stdin, limits)]


def load_located_manifests(
    paths: Iterable[str],
    stdin: TextIO | None = None,
    limits: DocumentLimits | None = None,
    *,
    strict: bool = True,
) -> list[tuple[KubeObject, Where]]:
    """`load_manifests`, each object with where it is (parse.load_located_objects); `strict`
    as there."""
    located: list[tuple[KubeObject, Where]] = []
    for path in expand_paths(paths):
        source = "<stdin>" if path == "-" else path
        text = read_stdin(stdin or sys.stdin, limits) if path == "-" else read_text(path, limits)
        located.extend(load_located_objects(text, source, limits, strict=strict))
    return located


VALIDATE_CHOICES = ("strict", "ignore")


def add_validate_flag(parser: Any) -> None:
    """`--validate strict|ignore`, as kubectl's: unknown fields refused (default) or ignored."""
    parser.add_argument(
        "--validate",
        choices=VALIDATE_CHOICES,
        default="strict",
        help="strict (default): a field the Kubernetes 1.34 API lacks is an error; ignore: "
        "such fields are skipped (objects from a newer cluster)",
    )
