"""Where the web view listens: GPUALLOC_WEB_LISTEN, `--web-listen`, and `serve --demo`'s default."""

from __future__ import annotations

import argparse

import pytest

from services.allocator.__main__ import _parser, _settings
from services.allocator.config import AllocatorSettings
from services.serve import DEMO_WEB_LISTEN, _with_web_listen

SERVE = {
    "off-by-default": (False, None, {}, ""),
    "the-variable": (False, None, {"GPUALLOC_WEB_LISTEN": "127.0.0.1:9000"}, "127.0.0.1:9000"),
    "the-flag-wins": (False, "127.0.0.1:9001", {"GPUALLOC_WEB_LISTEN": "x:1"}, "127.0.0.1:9001"),
    "on-with-demo": (True, None, {}, DEMO_WEB_LISTEN),
    "demo-turned-off-by-the-variable": (True, None, {"GPUALLOC_WEB_LISTEN": ""}, ""),
    "demo-turned-off-by-the-flag": (True, "", {}, ""),
}


@pytest.mark.parametrize("demo, flag, env, expected", SERVE.values(), ids=SERVE.keys())
def test_serve_chooses_the_web_address(demo, flag, env, expected):
    args = argparse.Namespace(demo=demo, web_listen=flag)
    settings = AllocatorSettings.from_env(env)
    assert _with_web_listen(settings, args, env).web_listen_address == expected


ALLOCATOR = {
    "off-by-default": ([], {}, ""),
    "the-variable": ([], {"GPUALLOC_WEB_LISTEN": "127.0.0.1:9000"}, "127.0.0.1:9000"),
    "the-flag-wins": (
        ["--web-listen", "127.0.0.1:9001"],
        {"GPUALLOC_WEB_LISTEN": "x:1"},
        "127.0.0.1:9001",
    ),
}


@pytest.mark.parametrize("argv, env, expected", ALLOCATOR.values(), ids=ALLOCATOR.keys())
def test_the_allocator_reads_the_web_address(monkeypatch, argv, env, expected):
    monkeypatch.delenv("GPUALLOC_WEB_LISTEN", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = _parser().parse_args(["--seed", "examples/cluster", *argv])
    assert _settings(args).web_listen_address == expected
