"""The state's persistent containers behave like a dict and a bounded log (property tests)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.inventory.core.persistent import ChunkedLog, ShardedMap

keys = st.text(alphabet="abcdef", max_size=3)
updates = st.lists(st.dictionaries(keys, st.one_of(st.none(), st.integers())), max_size=8)


@given(st.dictionaries(keys, st.integers()), updates)
def test_sharded_map_updates_like_a_dict(
    initial: dict[str, int], steps: list[dict[str, int | None]]
) -> None:
    sharded = ShardedMap(initial)
    plain = dict(initial)
    for step in steps:
        before = dict(sharded.items())
        updated = sharded.updated(step)
        assert dict(sharded.items()) == before  # the old map is untouched
        for key, value in step.items():
            if value is None:
                plain.pop(key, None)
            else:
                plain[key] = value
        sharded = updated
        assert dict(sharded.items()) == plain
        assert len(sharded) == len(plain)
        assert all(sharded.get(k) == v and k in sharded for k, v in plain.items())


@given(st.integers(min_value=1, max_value=200), st.integers(min_value=0, max_value=500))
def test_chunked_log_keeps_at_least_the_newest_limit_items_in_order(limit: int, count: int) -> None:
    log: ChunkedLog[int] = ChunkedLog(limit)
    for item in range(count):
        log = log.append(item)
    kept = list(log)
    assert kept == list(range(count - len(kept), count))
    assert len(kept) >= min(limit, count) and len(log) == len(kept)
    assert len(kept) < limit + 64 or count < limit + 64
    if kept:
        assert log.first() == kept[0]
        assert log.since(len(kept) // 2) == tuple(kept[len(kept) // 2 :])
