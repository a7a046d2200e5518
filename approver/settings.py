"""One env-driven settings module.

Every setting that differs between the demo, the tests and production comes from the environment through
the helpers of `approver.env`, which fail loudly on a value they cannot read. Production is
`DJANGO_ENV=production`: it refuses to start without `SECRET_KEY` and `ALLOWED_HOSTS`, and turns on every
secure-cookie and HSTS setting that `manage.py check --deploy` asks for.
"""

import ipaddress
import os
import secrets
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from .env import env_bool, env_int, env_json, env_list, env_str
from .logging_config import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent


PRODUCTION = env_str("DJANGO_ENV", "development") == "production"
DEBUG = env_bool("DEBUG", not PRODUCTION)

# Where the demo keeps its database, broker folder and sample-server state. Never committed.
VAR_DIR = Path(env_str("VAR_DIR", str(BASE_DIR / "var")))


def _development_secret_key() -> str:
    # A per-checkout key kept in var/, so sessions survive a restart of the demo; never used in production.
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
    return path.read_text().strip()


SECRET_KEY = (
    env_str("SECRET_KEY") if PRODUCTION else os.environ.get("SECRET_KEY") or _development_secret_key()
)
ALLOWED_HOSTS = env_list(
    "ALLOWED_HOSTS", [] if PRODUCTION else ["localhost", "127.0.0.1", "[::1]", "testserver"]
)
if PRODUCTION and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("Set ALLOWED_HOSTS in production.")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "oauth2_provider",
    "axes",
    "mozilla_django_oidc",
    "journal",
    "approver",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "journal.zones.viewer_zone",
    "django.contrib.messages.middleware.MessageMiddleware",
    "journal.auth.oidc.ProviderGroups",  # the provider's word on roles and teams, again while people work
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "journal.auth.access.LoginRequiredMiddleware",
    # Last, as django-axes asks: it answers a locked-out login with the lock-out page.
    "axes.middleware.AxesMiddleware",
]

# Every page loads its script and style from this site only, and no page has inline script or style: an
# agent's or a server's words shown on a page can never run or restyle it, and no other site may frame it.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"], "script-src": ["'self'"], "style-src": ["'self'"],
        "img-src": ["'self'", "data:"], "connect-src": ["'self'"], "form-action": ["'self'"],
        "frame-ancestors": ["'none'"], "base-uri": ["'none'"], "object-src": ["'none'"],
    },
}

ROOT_URLCONF = "approver.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "approver.context_processors.roles",
                "approver.context_processors.held_calls",
                "approver.context_processors.plans_waiting",
                "journal.zones.zone",
            ],
        },
    },
]

ASGI_APPLICATION = "approver.asgi.application"
WSGI_APPLICATION = None

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'demo.sqlite3'}"),
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 0),
    )
}
# psycopg's pool (for the web processes): DATABASE_POOL connections for requests, on top of the one each
# long-lived thread keeps for the process's life (the journal's, the Recorder's sessions', each audit
# sink's), which a pool of the bare figure would leave the requests waiting behind.
if DATABASE_POOL := env_int("DATABASE_POOL", 0):
    if "postgresql" not in DATABASES["default"]["ENGINE"] or DATABASES["default"]["CONN_MAX_AGE"]:
        raise ImproperlyConfigured("DATABASE_POOL is for PostgreSQL, with DATABASE_CONN_MAX_AGE left at 0")
    kept = 2 + len(env_list("AUDIT_STREAM", []))
    DATABASES["default"]["OPTIONS"] = {**DATABASES["default"].get("OPTIONS", {}),
                                       "pool": {"min_size": kept, "max_size": kept + DATABASE_POOL}}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Tests use a file too: the Recorder under test and the worker process share it with the test itself.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
    # WAL and a busy timeout let the web process, the Recorder and the worker share one SQLite file.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# People's passwords: Django's default hasher, first. Last, the OAuth client secrets' (journal.auth.hashers).
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2SHA1PasswordHasher",
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.BCryptSHA256PasswordHasher",
    "django.contrib.auth.hashers.ScryptPasswordHasher",
    "journal.auth.hashers.ClientSecretHasher",
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

# Failed logins are throttled by django-axes (approver.lockouts): after LOGIN_FAILURE_LIMIT failures on one
# account from one address, LOGIN_ACCOUNT_FAILURE_LIMIT on one account from anywhere, or
# LOGIN_ADDRESS_FAILURE_LIMIT from one address on any accounts, the login page refuses (HTTP 429) for
# LOGIN_LOCKOUT_MINUTES, after which the lock clears by itself. Admins see every lock-out under "Axes" in the
# Django admin, and clear one there or with `manage.py axes_reset_username NAME`. A successful login clears
# the account's failures. Behind a proxy, run uvicorn with --forwarded-allow-ips naming exactly the proxy, so
# the address is the client's (docs/production.md).
# Sign-in through the company's identity provider (OpenID Connect, `journal.auth.oidc`), on when OIDC_ISSUER
# is set: the provider's endpoints come from its discovery document; OIDC_GROUPS maps its groups to roles and
# teams ({"okta-group": ["approver", "team:payments"]}); PASSWORD_LOGIN=off leaves only the provider's
# sign-in.
OIDC_ISSUER = env_str("OIDC_ISSUER", "").rstrip("/")
OIDC_PROVIDER_NAME = env_str("OIDC_PROVIDER_NAME", "your company's sign-in")
OIDC_RP_CLIENT_ID = env_str("OIDC_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = env_str("OIDC_CLIENT_SECRET", "")
OIDC_RP_SCOPES = env_str("OIDC_SCOPES", "openid email profile groups offline_access")
OIDC_RP_SIGN_ALGO = env_str("OIDC_SIGN_ALGO", "RS256")
OIDC_GROUPS_CLAIM = env_str("OIDC_GROUPS_CLAIM", "groups")
OIDC_GROUPS = env_json("OIDC_GROUPS", {})
if not isinstance(OIDC_GROUPS, dict) or not all(
        isinstance(v, list) and all(isinstance(i, str) for i in v) for v in OIDC_GROUPS.values()):
    raise ImproperlyConfigured('OIDC_GROUPS maps a group to a list of roles and teams: {"g": ["approver", '
                               '"team:payments"]}.')
OIDC_RECHECK_SECONDS = env_int("OIDC_RECHECK_SECONDS", 60)  # reads; every write asks the provider first
OIDC_TIMEOUT = env_int("OIDC_TIMEOUT", 10)
OIDC_USE_PKCE = OIDC_USE_NONCE = OIDC_STORE_ACCESS_TOKEN = OIDC_STORE_ID_TOKEN = True
OIDC_AUTHENTICATE_CLASS = "journal.auth.oidc.SignInStart"
OIDC_CALLBACK_CLASS = "journal.auth.oidc.SignInReturn"
PASSWORD_LOGIN = env_bool("PASSWORD_LOGIN", True)
if not PASSWORD_LOGIN and not OIDC_ISSUER:
    raise ImproperlyConfigured("PASSWORD_LOGIN=off needs OIDC_ISSUER: nobody could sign in.")
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    *(["django.contrib.auth.backends.ModelBackend"] if PASSWORD_LOGIN else []),
    *(["journal.auth.oidc.CompanySignIn"] if OIDC_ISSUER else []),
]
AXES_HANDLER = "approver.lockouts.PerAccountAndAddress"
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5)
LOGIN_ACCOUNT_FAILURE_LIMIT = env_int("LOGIN_ACCOUNT_FAILURE_LIMIT", 25)
LOGIN_ADDRESS_FAILURE_LIMIT = env_int("LOGIN_ADDRESS_FAILURE_LIMIT", 25)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOGIN_LOCKOUT_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "username", "ip_address"]  # approver.lockouts
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "approver.views.site.locked_out"
AXES_VERBOSE = False

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
# WhiteNoise serves static files from the same process (uvicorn serves no files itself). Without a
# `collectstatic` run it finds them in place, which is all the demo and the tests need.
WHITENOISE_USE_FINDERS = not PRODUCTION or env_bool("WHITENOISE_USE_FINDERS", False)
if not PRODUCTION:
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns when it is missing

# Celery: Redis when REDIS_URL is set, otherwise kombu's filesystem transport, which needs no server and
# still runs a real worker process (and supports the fanout that `control.ping` needs for the health page).
REDIS_URL = os.environ.get("REDIS_URL", "")
BROKER_DIR = VAR_DIR / "broker"
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS = {}
else:
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "control_folder": str(BROKER_DIR / "control"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "store_processed": False,
    }
    # The filesystem transport expects its folders to exist.
    for _folder in ("queue", "control", "processed"):
        (BROKER_DIR / _folder).mkdir(parents=True, exist_ok=True)
# The cache holds the per-address counts of the OAuth endpoints (journal.auth.throttling): in Redis, shared by
# every process, when REDIS_URL is set; else in each process's memory (the demo runs one process).
if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
                          "KEY_PREFIX": "agent-undo"}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
RATELIMIT_FAIL_OPEN = True  # a cache that answers nothing lets requests on (journal.auth.throttling)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# A pool child that died (killed, out of memory) has its task sent back to the queue after this many seconds
# (Celery waits 10 by default for a result the child may have sent before dying). Every task here is safe to
# run twice, so a plan resumes after 2 seconds rather than 10 (tests/faults/test_killed_worker.py).
CELERY_WORKER_LOST_WAIT = 2.0
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
# The demo turns this off so the emails its worker prints read as emails, not as warning lines of a log.
CELERY_WORKER_REDIRECT_STDOUTS = env_bool("CELERY_WORKER_REDIRECT_STDOUTS", True)
# Celery beat (run it with `celery -A approver beat`, or `worker --beat` for a single worker as the demo
# does).
CELERY_BEAT_SCHEDULE = {
    "checkpoint-quiet-runs": {"task": "journal.checkpoint_quiet_runs", "schedule": 15.0},
    "reconcile-stale-steps": {"task": "journal.reconcile_stale_steps", "schedule": 60.0},
    "requeue-stalled-checks": {"task": "approver.requeue_stalled_checks", "schedule": 60.0},
    "expire-held-calls": {"task": "approver.expire_held_calls", "schedule": 60.0},
    "reconcile-execution": {"task": "approver.reconcile_execution", "schedule": 60.0},
    "notify-saga-plans": {"task": "approver.notify_saga_plans", "schedule": 60.0},
    "forget-idle-sessions": {"task": "journal.forget_idle_sessions", "schedule": 300.0},
    "forget-unused-oauth-clients": {"task": "journal.forget_unused_oauth_clients", "schedule": 3600.0},
    "prune-captures": {"task": "journal.prune_captures", "schedule": 3600.0},
    "sweep-webhooks": {"task": "approver.sweep_webhooks", "schedule": 60.0},
}

# The Recorder's Ed25519 signing keys live outside the repository. Public keys are also kept in the
# database (RecorderKey), so rotating a key never loses the ability to verify old checkpoints.
RECORDER_KEY_DIR = Path(
    env_str(
        "RECORDER_KEY_DIR",
        str(
            Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share"))
            / "agent-undo"
            / "recorder-keys"
        ),
    )
)
# A checkpoint is signed every N chain entries and whenever a run goes quiet.
RECORDER_CHECKPOINT_EVERY = env_int("RECORDER_CHECKPOINT_EVERY", 20)
# On PostgreSQL, a call's intent and its outcome are each journaled as one statement (one round trip).
RECORDER_ONE_STATEMENT = env_bool("RECORDER_ONE_STATEMENT", True)
# Every call to a tool server has a timeout (seconds); a slow server is a failed call, never a hung agent.
TOOL_SERVER_TIMEOUT = float(env_str("TOOL_SERVER_TIMEOUT", "30"))
# A plan's checks run concurrently, at most this many at a time on any one tool server.
PLAN_CHECKS_PER_SERVER = env_int("PLAN_CHECKS_PER_SERVER", 64)
# Each agent session has its own upstream sessions (a stdio server, its own process): closed after this many
# idle seconds, and at most this many open in one Recorder process.
RECORDER_UPSTREAM_IDLE_SECONDS = env_int("RECORDER_UPSTREAM_IDLE_SECONDS", 300)
RECORDER_MAX_UPSTREAM_SESSIONS = env_int("RECORDER_MAX_UPSTREAM_SESSIONS", 256)
# A tool server's answer over this many bytes is not relayed: the agent gets a tool error naming the limit and
# the step keeps the answer's size and SHA-256. A result over the inline size is kept in the run's record
# only.
RECORDER_MAX_RESULT_BYTES = env_int("RECORDER_MAX_RESULT_BYTES", 32 * 1024 * 1024)
RECORDER_INLINE_RESULT_BYTES = env_int("RECORDER_INLINE_RESULT_BYTES", 64 * 1024)
# The rows of a database call the run's record keeps (journal.upstream.windows): past it, the record keeps
# their count and digest, and the rows stay in the database's capture for the undo.
RECORDER_DATABASE_ROWS_KEPT = env_int("RECORDER_DATABASE_ROWS_KEPT", 10_000)
# How old a captured row must be before the hourly sweep judges whether a call's window holds it (a call in
# flight has not closed its window yet): rows outside every window are changes no recorded call made.
RECORDER_CAPTURE_SWEEP_LAG_SECONDS = env_int("RECORDER_CAPTURE_SWEEP_LAG_SECONDS", 600)
# How long a database's window waits, after a call that may have acted went unanswered (a timeout), for its
# statement to end on the database, so that its rows are its own and no later call's.
RECORDER_DATABASE_SETTLE_SECONDS = env_int("RECORDER_DATABASE_SETTLE_SECONDS", 60)
# A run bundle or audit log over this many bytes is refused before it is parsed (`import_run`).
RECORDER_IMPORT_MAX_BYTES = env_int("RECORDER_IMPORT_MAX_BYTES", 256 * 1024 * 1024)
# The stdio tool server commands an admin may pick in the web admin (a command runs as the Recorder's user, so
# none is ever typed there); `manage.py add_tool_server --command` is the other way in, from a shell.
RECORDER_STDIO_COMMANDS = env_list("RECORDER_STDIO_COMMANDS", [])
# Plain 2026-07-28 tools/call requests skip the SDK's per-request machinery (journal.mcp.fast_calls).
RECORDER_FAST_CALLS = env_bool("RECORDER_FAST_CALLS", True)
# Without a runId or an MCP session id, an agent's calls join its latest run unless it has been idle this
# long.
RECORDER_RUN_IDLE_SECONDS = env_int("RECORDER_RUN_IDLE_SECONDS", 1800)
# How long an agent's held call waits inside its request for a decision before the agent is told it awaits
# approval, and where (a policy's shorter time wins). Well under the agent frameworks' own timeouts (the
# OpenAI Agents SDK gives up after 5 s), so the agent hears it, not a timeout of its own.
RECORDER_HOLD_WAIT_SECONDS = env_int("RECORDER_HOLD_WAIT_SECONDS", 4)
# How long a failed call's answer may wait while a saga policy unwinds the run (the worker finishes what is
# left).
RECORDER_UNWIND_SECONDS = env_int("RECORDER_UNWIND_SECONDS", 60)
# Saga policies: at most this many undo plans open at once for one agent's failed calls, and their approvers
# told at most once every this many minutes (one message listing what became ready meanwhile).
SAGA_OPEN_PLANS_PER_AGENT = env_int("SAGA_OPEN_PLANS_PER_AGENT", 3)
SAGA_NOTIFY_MINUTES = env_int("SAGA_NOTIFY_MINUTES", 10)
# Held calls: how many one agent may have waiting on approvers at once (one more is refused, not held), and
# how often approvers are emailed about new ones at most (one message for all that came meanwhile).
HELD_CALLS_PER_AGENT = env_int("HELD_CALLS_PER_AGENT", 20)
HELD_CALL_NOTIFY_MINUTES = env_int("HELD_CALL_NOTIFY_MINUTES", 2)
# A plan's lease on a record lapses this long after it was asked for if the plan is not executing then (one
# approval of two, an approved plan not started yet, a paused plan); an executing plan keeps its leases.
RECORD_LEASE_MINUTES = env_int("RECORD_LEASE_MINUTES", 60)
# The team an agent joins when nobody chose one (made on first use, counting everyone with a role as a
# member).
DEFAULT_TEAM = env_str("DEFAULT_TEAM", "everyone")
# The longest a person's API token may last (they choose, from 1 day up to this).
API_TOKEN_MAX_DAYS = env_int("API_TOKEN_MAX_DAYS", 90)
# A webhook delivery is sent this many times at most (10 s, 30 s, 90 s, … apart, up to an hour) before it
# is given up.
WEBHOOK_MAX_ATTEMPTS = env_int("WEBHOOK_MAX_ATTEMPTS", 8)
# How Recorder processes reach each other (an agent's cancellation heard by one, for a call another makes):
# Redis pub/sub. Without it, each process hears only itself, which is all a single process needs.
RECORDER_BUS_URL = env_str("RECORDER_BUS_URL", REDIS_URL)
# An agent's MCP session on the handshake unused this long is gone, in every Recorder process.
RECORDER_SESSION_IDLE_SECONDS = env_int("RECORDER_SESSION_IDLE_SECONDS", 1800)
# The public base URL, used in links printed by commands and sent in notifications.
PUBLIC_URL = env_str("PUBLIC_URL", "http://localhost:8000")
# The Recorder's public URL: the audience of the OAuth tokens it accepts and the `resource` of its RFC 9728
# metadata. Empty: the URL each request came to, which is right on one host; behind a load balancer (or in
# production, where it defaults to PUBLIC_URL + "/mcp") every process must agree on one.
RECORDER_URL = env_str("RECORDER_URL", f"{PUBLIC_URL.rstrip('/')}/mcp" if PRODUCTION else "")
# MCP authorization for clients that take only a URL (journal.auth.oauth): this app is their OAuth 2.1
# authorization server, with dynamic client registration and PKCE; the person who signs in picks the agent.
OAUTH2_PROVIDER = {
    "SCOPES": {"mcp": "Call tools through the Recorder as an agent acting for you"},
    "DEFAULT_SCOPES": ["mcp"],
    "ACCESS_TOKEN_EXPIRE_SECONDS": env_int("OAUTH_ACCESS_TOKEN_SECONDS", 3600),
    "REFRESH_TOKEN_EXPIRE_SECONDS": env_int("OAUTH_REFRESH_TOKEN_SECONDS", 30 * 24 * 3600),
    "AUTHORIZATION_CODE_EXPIRE_SECONDS": 120,
    "ROTATE_REFRESH_TOKEN": True,
    "REFRESH_TOKEN_REUSE_PROTECTION": True,
    "PKCE_REQUIRED": True,
    # The toolkit's validator, and a replayed authorization code ends every token it gave.
    "OAUTH2_VALIDATOR_CLASS": "journal.auth.oauth_validator.RecorderValidator",
    "DCR_ENABLED": True,
    # MCP clients register themselves before anyone signs in (RFC 7591 open registration); a registration
    # nobody authorises is removed after a day (journal.forget_unused_oauth_clients).
    "DCR_REGISTRATION_PERMISSION_CLASSES": ("oauth2_provider.dcr.AllowAllDCRPermission",),
    "OAUTH2_RESPONSE_TYPES_SUPPORTED": ["code"],
    "OAUTH2_GRANT_TYPES_SUPPORTED": ["authorization_code", "refresh_token"],
    "OAUTH2_TOKEN_ENDPOINT_AUTH_METHODS_SUPPORTED": ["none", "client_secret_post", "client_secret_basic"],
    "OAUTH2_PROTECTED_RESOURCE_NAME": "Agent undo Recorder",
    "OAUTH2_PROTECTED_RESOURCE_BEARER_METHODS_SUPPORTED": ["header"],
    # https, and http only to the client's own machine (RFC 8252 loopback: desktop and command-line MCP
    # clients listen on 127.0.0.1 for the redirect); registration refuses any other http URI
    # (journal.auth.oauth).
    "ALLOWED_REDIRECT_URI_SCHEMES": ["http", "https"],
    # RFC 9700, the OAuth security best current practice: every gate but the http scheme one, above.
    **{f"COMPLIANT_BCP_RFC9700_{gate}": True for gate in (
        "IMPLICIT_GRANT", "PASSWORD_GRANT", "PKCE_METHOD", "ACCESS_TOKEN_TRANSPORT", "AUTHZ_RESPONSE_ISS",
        "TOKEN_STORAGE", "REFRESH_TOKEN", "REDIRECT_URI_MATCHING", "PKCE_REQUIRED")},
}
# The toolkit keeps client secrets hashed; a generated secret needs no slow password hash
# (journal.auth.hashers).
OAUTH2_PROVIDER["CLIENT_SECRET_HASHER"] = "sha256-client-secret"
# Anyone may register a client and ask for tokens, unsigned-in: both are limited per address
# (journal.auth.throttling), and registrations nobody authorised are kept to a number (the oldest go first).
OAUTH_REGISTRATIONS_PER_HOUR = env_int("OAUTH_REGISTRATIONS_PER_HOUR", 20)
OAUTH_TOKEN_REQUESTS_PER_MINUTE = env_int("OAUTH_TOKEN_REQUESTS_PER_MINUTE", 30)
OAUTH_MAX_PENDING_CLIENTS = env_int("OAUTH_MAX_PENDING_CLIENTS", 500)
# That gate's warning: http redirect URIs are allowed, for loopback only (see ALLOWED_REDIRECT_URI_SCHEMES).
SILENCED_SYSTEM_CHECKS = ["oauth2_provider.W008"]
# The toolkit's own models (named, because migrations that refer to them ask for the setting).
OAUTH2_PROVIDER_APPLICATION_MODEL = "oauth2_provider.Application"
if PRODUCTION:
    OAUTH2_PROVIDER["OIDC_ISS_ENDPOINT"] = PUBLIC_URL.rstrip("/")
# Passkeys are bound to this relying party: the host name approvers see, and the origins their browsers send.
WEBAUTHN_RP_ID = env_str("WEBAUTHN_RP_ID", urlsplit(PUBLIC_URL).hostname or "localhost")
WEBAUTHN_RP_NAME = env_str("WEBAUTHN_RP_NAME", "Agent undo")
WEBAUTHN_ORIGINS = env_list("WEBAUTHN_ORIGINS", [PUBLIC_URL.rstrip("/")])

EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "Agent undo <undo@localhost>")
# A Slack-compatible incoming webhook ({"text": …}) told when a plan is ready for sign-off; empty for none.
APPROVAL_WEBHOOK_URL = env_str("APPROVAL_WEBHOOK_URL", "")

if PRODUCTION:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"

# Log lines: text (the default) or JSON with the trace and span ids, agent, run, step and plan
# (LOG_FORMAT=json); secrets are struck out of every line in both (journal.telemetry.logs).
LOG_FORMAT = env_str("LOG_FORMAT", "text")
if LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT={LOG_FORMAT}: it is text or json.")
LOGGING = logging_config(level=env_str("LOG_LEVEL", "INFO"), form=LOG_FORMAT)
# Prometheus metrics at /metrics (journal.telemetry.metrics, approver.observed): counted by every process
# into METRICS_DIR (one directory per host), read by a scraper that sends METRICS_TOKEN as a bearer token or
# comes from an address in METRICS_ALLOW (loopback by default). METRICS=off counts nothing.
METRICS = env_bool("METRICS", True)
METRICS_DIR = Path(env_str("METRICS_DIR", str(VAR_DIR / "metrics")))
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
METRICS_ALLOW = env_list("METRICS_ALLOW", ["127.0.0.1/32", "::1/128"])
# Every journal entry (approvals included), as it is committed, to each sink here: syslog+tcp://,
# syslog+tls://, syslog+udp://, https:// (signed with AUDIT_WEBHOOK_SECRET) or otlp (journal.audit).
AUDIT_STREAM = env_list("AUDIT_STREAM", [])
AUDIT_WEBHOOK_SECRET = env_str("AUDIT_WEBHOOK_SECRET", "")
try:
    [ipaddress.ip_network(entry, strict=False) for entry in METRICS_ALLOW]
except ValueError as exc:
    raise ImproperlyConfigured(f"METRICS_ALLOW: {exc}") from None
