"""The company's identity provider, for the tests that sign in through it: a real OpenID Connect provider
(tests/oidc/provider.mjs) on a port of its own, whose people and groups a test changes as an administrator
would, and the settings that point this site at it."""

import contextlib
import json
from pathlib import Path

from tests.services import NODE_22, OIDC_PROVIDER, serving

CLIENT_ID, CLIENT_SECRET = "agent-undo", "a-client-secret-for-the-tests-only"
GROUPS = {
    "undo-payments-approvers": ["approver", "team:payments"],
    "undo-payments-oncall": ["on-call", "team:payments"],
    "undo-search-approvers": ["approver", "team:search"],
}


class Provider:
    def __init__(self, issuer: str, accounts: Path, process):
        self.issuer, self.accounts, self.process = issuer, accounts, process

    def stop(self) -> None:
        """The provider goes down (its discovery document stays where this site keeps it)."""
        self.process.terminate()
        self.process.wait(timeout=10)

    def people(self, **people: dict) -> None:
        """Who the provider knows now: login name -> {"email", "groups"}; read again at every sign-in and
        every userinfo call."""
        self.accounts.write_text(json.dumps(people))


@contextlib.contextmanager
def identity_provider(tmp_path: Path, *, port: int, site: str, settings):
    """The provider at http://localhost:PORT, with this site (`site`, its base URL) as its one client, and the
    site's settings pointed at it (discovery from the issuer, PKCE, the groups above)."""
    issuer = f"http://localhost:{port}"
    accounts = tmp_path / "accounts.json"
    accounts.write_text("{}")
    config = tmp_path / "oidc.json"
    config.write_text(json.dumps({"issuer": issuer, "accounts": str(accounts), "clients": [{
        "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
        "redirect_uris": [f"{site}/oidc/callback/"]}]}))
    node = str(NODE_22) if NODE_22.exists() else "node"
    with serving([node, str(OIDC_PROVIDER / "provider.mjs"), str(port), str(config)], port,
                 "the OIDC provider") as process:
        settings.OIDC_ISSUER, settings.OIDC_PROVIDER_NAME = issuer, "Acme SSO"
        settings.OIDC_RP_CLIENT_ID, settings.OIDC_RP_CLIENT_SECRET = CLIENT_ID, CLIENT_SECRET
        settings.OIDC_GROUPS, settings.OIDC_RECHECK_SECONDS = GROUPS, 0
        settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS,
                                            "journal.auth.oidc.CompanySignIn"]
        yield Provider(issuer, accounts, process)
