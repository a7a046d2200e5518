"""A client that takes only the Recorder's URL: the `mcp` SDK's OAuth client finds the authorization server
from the Recorder's 401, registers itself, opens the sign-in page in Chromium, where Dana signs in and picks
the agent it acts as; the client exchanges the code (PKCE), calls a tool, and the call is journaled under
that agent. Then Dana revokes the client from the agent's page and its token stops working at once."""

import json
import subprocess
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from playwright.async_api import async_playwright
from playwright.sync_api import sync_playwright

from journal import services
from journal.models import ClientAuthorization, Step
from tests.browser.conftest import CHROMIUM_ARGS, sign_in
from tests.journal.helpers import register_samples, settle
from tests.services import CHROMIUM, NODE_MODULES, needs_chromium, needs_node

pytestmark = [pytest.mark.browser, needs_chromium, pytest.mark.django_db(transaction=True)]

REDIRECT = "http://127.0.0.1:53682/callback"


class Storage:
    """The client's token store, in memory (a desktop client keeps it on disk)."""

    def __init__(self):
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client_info

    async def set_client_info(self, client_info):
        self.client_info = client_info


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_url_only_client_signs_in_in_the_browser_acts_as_the_picked_agent_and_is_revoked(
        mode, recorder, sample_servers, dana):
    register_samples(sample_servers, names=("crm",))
    services.create_agent(name="dana-laptop", on_behalf_of=dana)
    services.create_agent(name="dana-desk", on_behalf_of=dana)
    server_url = f"{recorder.base}/mcp"
    storage = Storage()
    seen = {}

    async def main():
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
            page = await browser.new_page(viewport={"width": 390, "height": 844})  # signing in from a phone
            redirected = anyio.Event()

            async def on_redirect(route):
                seen["redirect"] = route.request.url
                await route.fulfill(body="Signed in: you can close this window.", content_type="text/plain")
                redirected.set()

            await page.route(f"{REDIRECT}*", on_redirect)

            async def redirect_handler(authorization_url: str) -> None:
                seen["authorization_url"] = authorization_url
                await page.goto(authorization_url)
                await page.fill("input[name=username]", "dana")
                await page.fill("input[name=password]", "dana-password-1")
                await page.click("button[type=submit]")
                await page.wait_for_selector("#authorizationForm")
                seen["consent"] = await page.inner_text("main")
                seen["consent width"] = await page.evaluate("document.documentElement.scrollWidth")
                await page.check("input[name=agent][value=dana-desk]")
                await page.click("button[name=allow]")

            async def callback_handler() -> AuthorizationCodeResult:
                with anyio.fail_after(20):
                    await redirected.wait()
                query = parse_qs(urlsplit(seen["redirect"]).query)
                return AuthorizationCodeResult(code=query["code"][0], state=query["state"][0],
                                               iss=query.get("iss", [None])[0])

            auth = OAuthClientProvider(
                server_url,
                OAuthClientMetadata(
                    client_name="Desk Assistant",
                    redirect_uris=[REDIRECT],
                    grant_types=["authorization_code", "refresh_token"],
                    response_types=["code"],
                    token_endpoint_auth_method="none",
                ),
                storage,
                redirect_handler=redirect_handler,
                callback_handler=callback_handler,
            )
            async with httpx2.AsyncClient(auth=auth, timeout=30) as http:
                async with Client(streamable_http_client(server_url, http_client=http), mode=mode,
                                  cache=None) as client:
                    tools = await client.list_tools()
                    seen["tools"] = [tool.name for tool in tools.tools]
                    seen["result"] = await client.call_tool("crm__get_deal", {"deal_id": "D-881"})
            await browser.close()

    anyio.run(main)
    settle(recorder)

    # The client found everything from the bare URL, asked for this Recorder, and used PKCE S256.
    asked = parse_qs(urlsplit(seen["authorization_url"]).query)
    assert asked["resource"] == [server_url] and asked["code_challenge_method"] == ["S256"]
    assert "Desk Assistant" in seen["consent"] and server_url in seen["consent"]
    assert seen["consent width"] <= 390  # nothing wider than the phone
    assert "dana-laptop" in seen["consent"] and "dana-desk" in seen["consent"]
    assert "crm__get_deal" in seen["tools"] and not seen["result"].is_error
    step = Step.objects.select_related("run__agent").get(tool="get_deal")
    assert step.run.agent.name == "dana-desk"
    authorization = ClientAuthorization.objects.select_related("application").get()
    assert authorization.agent.name == "dana-desk" and authorization.application.name == "Desk Assistant"

    token = storage.tokens.access_token
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}

    def call_with_token():
        return httpx.post(f"{server_url}/", json=listing, headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-11-25"})

    assert call_with_token().status_code != 401

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(f"{recorder.base}/agents/dana-desk/")
        sign_in(page, "dana")
        page.wait_for_url(f"{recorder.base}/agents/dana-desk/")
        row = page.locator("table.clients tbody tr")
        assert "Desk Assistant" in row.inner_text() and "dana" in row.inner_text()
        row.locator("button", has_text="Revoke").click()
        page.wait_for_url(f"{recorder.base}/agents/dana-desk/")
        assert "Revoked Desk Assistant" in page.inner_text("main")
        assert "No client has signed in as dana-desk" in page.inner_text("main")
        browser.close()

    refused = call_with_token()
    assert refused.status_code == 401
    assert refused.json()["error_description"].startswith("The token is not known here (revoked")


@needs_node
def test_the_typescript_sdks_oauth_client_signs_in_from_a_bare_url_too(recorder, sample_servers, dana):
    """The official TypeScript SDK's client and its `OAuthClientProvider`: discovery from the 401,
    registration, the browser sign-in where Dana creates the agent it acts as, the code exchange (PKCE), a
    tool call journaled under that agent."""
    register_samples(sample_servers, names=("crm",))
    script = NODE_MODULES.parent / "ts_oauth_client.mjs"
    server_url = f"{recorder.base}/mcp"
    node = subprocess.Popen(
        ["node", str(script), server_url, REDIRECT, "crm__get_deal", json.dumps({"deal_id": "D-881"})],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        asked = json.loads(node.stdout.readline())
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.route(
                f"{REDIRECT}*", lambda route: route.fulfill(body="Signed in.", content_type="text/plain")
            )
            page.goto(asked["authorize"])
            sign_in(page, "dana")
            page.wait_for_selector("#authorizationForm")
            assert "TS Assistant" in page.inner_text("main")
            page.check("input[name=agent][value=__new__]")
            page.fill("input[name=new_agent_name]", "dana-ts")
            page.click("button[name=allow]")
            page.wait_for_url(f"{REDIRECT}*")  # the client's loopback callback, answered by the route above
            redirected = page.url
            browser.close()
        node.stdin.write(redirected + "\n")
        node.stdin.flush()
        answer = json.loads(node.stdout.readline())
        assert node.wait(timeout=60) == 0
    finally:
        node.kill()
    settle(recorder)
    assert parse_qs(urlsplit(asked["authorize"]).query)["resource"] == [server_url]
    assert not answer["result"].get("isError") and answer["accessToken"]
    step = Step.objects.select_related("run__agent__on_behalf_of").get(tool="get_deal")
    assert step.run.agent.name == "dana-ts" and step.run.agent.on_behalf_of == dana
