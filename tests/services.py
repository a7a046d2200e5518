"""Outside services some tests need. On a laptop such a test skips and says which service is missing;
in CI (REQUIRE_SERVICES=1, set by .ci/run) a missing service fails the test instead."""

import os
import shutil

import pytest


def unavailable(what: str) -> None:
    if os.environ.get("REQUIRE_SERVICES") == "1":
        pytest.fail(f"{what} is required in CI but not available")
    pytest.skip(f"{what} is not available on this machine")


def redis_url() -> str:
    url = os.environ.get("TEST_REDIS_URL", "")
    if not url:
        unavailable("Redis (set TEST_REDIS_URL)")
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except redis.RedisError:
        unavailable(f"Redis at {url}")
    return url


def chromium_path() -> str:
    path = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
    if not shutil.which(path):
        unavailable(f"Chromium ({path})")
    return path
