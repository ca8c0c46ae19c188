"""Slurm hostlist expressions (`SLURM_JOB_NODELIST`) -> host names, as `scontrol show hostnames`.

`h100-node-[1-2],a100-node-1` -> h100-node-1, h100-node-2, a100-node-1. Ranges keep their
zero padding (`gpu[08-10]` -> gpu08, gpu09, gpu10); several bracket groups multiply
(`r[1-2]n[1-2]` -> r1n1, r1n2, r2n1, r2n2). Prologs must not call Slurm commands (Slurm's
prolog guide), hence this small parser.
"""

from __future__ import annotations

import re

from services.common.errors import InvalidArgument

__all__ = ["expand_hostlist"]

_GROUP = re.compile(r"\[([^\]]*)\]")


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise InvalidArgument.at("hostlist", f"{text!r}: unbalanced ']'")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise InvalidArgument.at("hostlist", f"{text!r}: unbalanced '['")
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _range(item: str, text: str) -> list[str]:
    low, dash, high = item.partition("-")
    if not low.isdigit() or (dash and not high.isdigit()):
        raise InvalidArgument.at("hostlist", f"{text!r}: bad range {item!r}")
    if not dash:
        return [low]
    width = len(low)
    start, stop = int(low), int(high)
    if stop < start:
        raise InvalidArgument.at("hostlist", f"{text!r}: range {item!r} runs backwards")
    return [str(n).zfill(width) for n in range(start, stop + 1)]


def _expand_one(host: str, text: str) -> list[str]:
    match = _GROUP.search(host)
    if match is None:
        return [host]
    head, tail = host[: match.start()], host[match.end() :]
    values = [v for item in match.group(1).split(",") for v in _range(item.strip(), text)]
    return [name for value in values for name in _expand_one(f"{head}{value}{tail}", text)]


def expand_hostlist(text: str) -> list[str]:
    """Every host of the expression, in order."""
    return [name for host in _split_top(text) for name in _expand_one(host, text)]
