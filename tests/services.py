"""Outside services some tests need, as skip markers.

On a laptop without the service such a test is skipped, and the reason names the service. In CI
(REQUIRE_SERVICES=1, set by .ci/run) the markers never skip: the test runs and fails if the service is missing.
"""

import os
import shutil

import pytest

REQUIRED = os.environ.get("REQUIRE_SERVICES") == "1"
REDIS_URL = os.environ.get("TEST_REDIS_URL", "")
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")


def _redis_answers() -> bool:
    if not REDIS_URL:
        return False
    import redis

    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


needs_redis = pytest.mark.skipif(
    not REQUIRED and not _redis_answers(), reason="Redis is not available here (set TEST_REDIS_URL)"
)
needs_chromium = pytest.mark.skipif(
    not REQUIRED and not shutil.which(CHROMIUM), reason=f"Chromium is not available here ({CHROMIUM})"
)
