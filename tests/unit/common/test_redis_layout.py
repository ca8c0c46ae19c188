"""Store URLs: which layout each scheme asks for, and the errors for malformed ones."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument
from services.common.redis_layout import StoreLayout, parse_layout


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        pytest.param(
            "redis://h:6379/0", StoreLayout("standalone", "redis://h:6379/0"), id="standalone"
        ),
        pytest.param(
            "rediss://u:p@h:6380/1", StoreLayout("standalone", "rediss://u:p@h:6380/1"), id="tls"
        ),
        pytest.param(
            "redis+sentinel://a:26379,b:26380/gpualloc",
            StoreLayout(
                "sentinel",
                "redis+sentinel://a:26379,b:26380/gpualloc",
                (("a", 26379), ("b", 26380)),
                "gpualloc",
            ),
            id="sentinel-default-db",
        ),
        pytest.param(
            "rediss+sentinel://u:s%40c@a:26379/svc/3?sentinel_password=x",
            StoreLayout(
                "sentinel",
                "rediss+sentinel://u:s%40c@a:26379/svc/3?sentinel_password=x",
                (("a", 26379),),
                "svc",
                3,
                "u",
                "s@c",
                True,
                (("sentinel_password", "x"),),
            ),
            id="sentinel-tls-auth-db",
        ),
        pytest.param(
            "redis+cluster://a:7000,b:7001,[::1]:7002",
            StoreLayout(
                "cluster",
                "redis+cluster://a:7000,b:7001,[::1]:7002",
                (("a", 7000), ("b", 7001), ("::1", 7002)),
            ),
            id="cluster-seeds",
        ),
        pytest.param(
            "redis+cluster://:pw@a:7000",
            StoreLayout("cluster", "redis+cluster://:pw@a:7000", (("a", 7000),), password="pw"),
            id="cluster-password",
        ),
    ],
)
def test_layouts_by_scheme(url: str, expected: StoreLayout) -> None:
    assert parse_layout(url) == expected


@pytest.mark.parametrize(
    ("url", "message"),
    [
        pytest.param("redis+cluster:///", "no host:port", id="cluster-no-hosts"),
        pytest.param("redis+cluster://a:7000/0", "one database", id="cluster-with-db"),
        pytest.param("redis+sentinel://a:26379", "service name", id="sentinel-no-service"),
        pytest.param("redis+sentinel://a:26379/s/x", "not a number", id="sentinel-bad-db"),
        pytest.param("redis+sentinel://a/s", "not host:port", id="sentinel-no-port"),
        pytest.param("redis+cluster://u:secret@a", "***@a", id="password-redacted"),
    ],
)
def test_malformed_urls_name_the_problem(url: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        parse_layout(url)
    assert raised.value.field_path == "redis_url"
    assert message in raised.value.message
    assert "secret" not in raised.value.message
