"""Immutable containers whose updates copy a small part, not the whole.

The inventory keeps one immutable state and swaps it per change. With 10,000 nodes, copying a
flat dict of them (and later freeing the old one) on every report costs more than the report
itself, so:

- `ShardedMap` splits the keys into 256 shards by hash; `updated` copies the shard table and the
  touched shards only (about 40 keys each at 10,000 nodes).
- `ChunkedLog` keeps at least the newest `limit` items, in chunks of up to 64; `append` copies
  the last chunk and the chunk table only.

Iteration order is not meaningful (it follows hashing); callers sort where order matters.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar

__all__ = ["ChunkedLog", "ShardedMap"]

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")

_SHARDS = 256
_CHUNK = 64


class ShardedMap(Mapping[K, V], Generic[K, V]):
    __slots__ = ("_len", "_shards")

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        shards: list[dict[K, V]] = [{} for _ in range(_SHARDS)]
        pairs = items.items() if isinstance(items, Mapping) else items
        for key, value in pairs:
            shards[hash(key) % _SHARDS][key] = value
        self._shards: tuple[dict[K, V], ...] = tuple(shards)
        self._len = sum(len(s) for s in shards)

    def __getitem__(self, key: K) -> V:
        return self._shards[hash(key) % _SHARDS][key]

    def get(self, key: K, default: V | None = None) -> V | None:  # type: ignore[override]
        return self._shards[hash(key) % _SHARDS].get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._shards[hash(key) % _SHARDS]

    def __iter__(self) -> Iterator[K]:
        for shard in self._shards:
            yield from shard

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"ShardedMap({dict(self.items())!r})"

    def updated(self, changes: Mapping[K, V | None]) -> ShardedMap[K, V]:
        """A new map with `changes` applied: a value sets the key, None removes it."""
        shards = list(self._shards)
        copied: set[int] = set()
        size = self._len
        for key, value in changes.items():
            index = hash(key) % _SHARDS
            if index not in copied:
                shards[index] = dict(shards[index])
                copied.add(index)
            shard = shards[index]
            present = key in shard
            if value is None:
                if present:
                    del shard[key]
                    size -= 1
            else:
                shard[key] = value
                size += not present
        new = ShardedMap.__new__(ShardedMap)
        new._shards = tuple(shards)
        new._len = size
        return new


class ChunkedLog(Generic[T]):
    """The newest `limit` items (at least), oldest first."""

    __slots__ = ("_chunks", "_size", "limit")

    def __init__(self, limit: int, chunks: tuple[tuple[T, ...], ...] = ()) -> None:
        self.limit = limit
        self._chunks = chunks
        self._size = sum(len(c) for c in chunks)

    def append(self, item: T) -> ChunkedLog[T]:
        chunks = self._chunks
        if chunks and len(chunks[-1]) < min(_CHUNK, max(self.limit, 1)):
            chunks = (*chunks[:-1], (*chunks[-1], item))
        else:
            chunks = (*chunks, (item,))
        size = self._size + 1
        while len(chunks) > 1 and size - len(chunks[0]) >= self.limit:
            size -= len(chunks[0])
            chunks = chunks[1:]
        log: ChunkedLog[T] = ChunkedLog.__new__(ChunkedLog)
        log.limit, log._chunks, log._size = self.limit, chunks, size
        return log

    def __iter__(self) -> Iterator[T]:
        for chunk in self._chunks:
            yield from chunk

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return bool(self._chunks)

    def first(self) -> T:
        return self._chunks[0][0]

    def since(self, offset: int) -> tuple[T, ...]:
        """The items from position `offset` (0 = the oldest kept) on."""
        items: list[T] = []
        for chunk in self._chunks:
            if offset >= len(chunk):
                offset -= len(chunk)
                continue
            items.extend(chunk[offset:])
            offset = 0
        return tuple(items)
