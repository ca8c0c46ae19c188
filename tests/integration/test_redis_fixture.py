"""The Redis fixtures run the real redis-server: commands work, data is flushed, AOF survives.

Later store tests rely on these fixtures; these tests prove the fixtures themselves.
"""

from __future__ import annotations

import re
import subprocess

import pytest
import redis

from tests.conftest import (
    REDIS_MISSING,
    RedisServer,
    RedisServerFactory,
    redis_binary,
)


def test_redis_url_talks_to_the_real_redis_server(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        assert client.set("gpualloc:test", "hello")
        assert client.get("gpualloc:test") == "hello"
        version = client.info("server")["redis_version"]
    printed = subprocess.run(
        [redis_binary(), "--version"], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r"v=(\S+)", printed)
    assert match is not None
    assert version == match[1]


def test_redis_url_is_flushed_before_each_test(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as client:
        assert client.dbsize() == 0  # the previous test's key is gone
        client.set("left-behind", "1")


def test_redis_server_url_names_its_port(redis_server: RedisServer) -> None:
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"


def test_session_server_stops_and_restarts_on_the_same_port(redis_server: RedisServer) -> None:
    port = redis_server.port
    redis_server.stop()
    assert not redis_server.running
    assert not redis_server.ping()
    redis_server.start()
    assert (redis_server.port, redis_server.ping()) == (port, True)


@pytest.mark.parametrize(
    "kill",
    [pytest.param(False, id="clean-stop"), pytest.param(True, id="killed")],
)
def test_append_only_server_keeps_data_across_restart(
    redis_server_factory: RedisServerFactory, kill: bool
) -> None:
    server = redis_server_factory(appendonly=True, extra_args=("--appendfsync", "always"))
    with server.client() as client:
        client.set("reservation:r-1", "gpu-0")
    server.stop(kill=kill)
    assert not server.ping()
    server.start()
    with server.client() as client:
        assert client.get("reservation:r-1") == "gpu-0"


def test_server_without_persistence_loses_data_on_restart(
    redis_server_factory: RedisServerFactory,
) -> None:
    server = redis_server_factory()
    with server.client() as client:
        client.set("reservation:r-1", "gpu-0")
    server.stop()
    server.start()
    with server.client() as client:
        assert client.get("reservation:r-1") is None


def test_server_that_cannot_start_fails_with_its_log(
    redis_server_factory: RedisServerFactory,
) -> None:
    with pytest.raises(pytest.fail.Exception, match="redis-server exited at start") as caught:
        redis_server_factory(extra_args=("--no-such-option", "1"))
    assert "no-such-option" in str(caught.value)


def test_missing_binary_fails_with_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    with pytest.raises(pytest.fail.Exception) as caught:
        redis_binary()
    assert str(caught.value) == REDIS_MISSING
