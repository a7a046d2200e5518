"""What an anonymous client can make the Recorder's process spend through OAuth (issue 22, finding 2).

    .venv/bin/python bench/oauth_flood.py [--requests 20]

On a scratch SQLite database, through the real views (Django's test client, in this process), prints the
CPU time per request of: registering a public client, registering a confidential client, and a token request
with a wrong client secret; then how many registrations from one address were answered before the
per-address limit (429). With PBKDF2-hashed secrets each of the first three cost about 0.33 s.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plans import setup_django  # noqa: E402


def cpu_per_request(send, n: int) -> float:
    started = time.process_time()
    for _ in range(n):
        send()
    return (time.process_time() - started) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        setup_django(Path(scratch))
        import logging

        logging.getLogger("django.request").setLevel(logging.ERROR)  # the 401s and 429s are the point
        from django.core.cache import cache
        from django.test import Client, override_settings

        def register(method: str, address: str):
            body = {"redirect_uris": ["http://127.0.0.1:5000/cb"], "token_endpoint_auth_method": method}
            return Client(REMOTE_ADDR=address).post("/oauth/register/", body, content_type="application/json")

        with override_settings(ALLOWED_HOSTS=["testserver"], OAUTH_REGISTRATIONS_PER_HOUR=10**6,
                               OAUTH_TOKEN_REQUESTS_PER_MINUTE=10**6):
            addresses = iter(f"10.0.{n // 250}.{n % 250}" for n in range(10**5))
            public = cpu_per_request(lambda: register("none", next(addresses)), args.requests)
            confidential = cpu_per_request(lambda: register("client_secret_post", next(addresses)),
                                           args.requests)
            client_id = json.loads(register("client_secret_post", next(addresses)).content)["client_id"]
            wrong = cpu_per_request(lambda: Client().post("/oauth/token/", {
                "client_id": client_id, "client_secret": "wrong", "grant_type": "authorization_code",
                "code": "x", "redirect_uri": "http://127.0.0.1:5000/cb", "code_verifier": "v" * 43}),
                args.requests)
        cache.clear()
        from django.conf import settings

        statuses = [register("none", "203.0.113.7").status_code
                    for _ in range(settings.OAUTH_REGISTRATIONS_PER_HOUR + 5)]
        print(f"CPU per public registration:       {public * 1000:.1f} ms")
        print(f"CPU per confidential registration: {confidential * 1000:.1f} ms")
        print(f"CPU per wrong client secret:       {wrong * 1000:.1f} ms")
        print(f"registrations answered from one address before 429: {statuses.count(201)} of {len(statuses)}"
              f" (then {statuses.count(429)} refused)")


if __name__ == "__main__":
    main()
