"""Production settings: `check --deploy` is clean, and missing secrets stop the start instead of
defaulting."""

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path


def run_manage(*args, **env):
    full = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "ALLOWED_HOSTS", "DJANGO_ENV"}}
    full.update(DJANGO_SETTINGS_MODULE="approver.settings", **env)
    return subprocess.run([sys.executable, "manage.py", *args], env=full, capture_output=True, text=True)


def test_check_deploy_is_clean_under_production_settings(tmp_path):
    result = run_manage("check", "--deploy", "--fail-level", "WARNING", DJANGO_ENV="production",
                        SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="undo.example.com",
                        VAR_DIR=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_refuses_to_start_without_a_secret_key(tmp_path):
    result = run_manage(
        "check", DJANGO_ENV="production", ALLOWED_HOSTS="undo.example.com", VAR_DIR=str(tmp_path)
    )
    assert result.returncode != 0 and "SECRET_KEY" in result.stderr


def test_a_malformed_setting_is_a_clear_error(tmp_path):
    result = run_manage("check", RECORDER_CHECKPOINT_EVERY="often", VAR_DIR=str(tmp_path))
    assert result.returncode != 0 and "RECORDER_CHECKPOINT_EVERY='often' is not an integer" in result.stderr


def test_no_secrets_are_committed():
    tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout.split()
    assert not [path for path in tracked if path.endswith((".ed25519", ".key", ".pem", "secret_key"))]


def test_every_setting_read_from_the_environment_is_in_the_settings_table():
    root = Path(__file__).resolve().parents[2]
    read = set(
        re.findall(
            r'(?:env_\w+|os\.environ\.get)\(\s*"([A-Z_]+)"', (root / "approver/settings.py").read_text()
        )
    )
    table = set(re.findall(r"^\| `([A-Z_]+)` \|", (root / "docs/settings.md").read_text(), re.M))
    assert read and read - table == set(), "docs/settings.md does not say what these do"
