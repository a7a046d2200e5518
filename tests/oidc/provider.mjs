// A real OpenID Connect provider for the tests: panva's certified `oidc-provider`, with its development
// sign-in pages. Usage: node provider.mjs PORT CONFIG.json
//
// CONFIG.json: {"issuer": "http://localhost:PORT", "clients": [{client_id, client_secret, redirect_uris}],
//               "accounts": "/path/to/accounts.json"}
// accounts.json is read again on every sign-in and every userinfo call, so a test changes someone's groups
// by rewriting it, as an administrator changes them in Okta or Entra ID:
//   {"ana": {"email": "ana@acme.example", "name": "Ana", "groups": ["undo-payments-approvers"]}}
import fs from "node:fs";
import Provider from "oidc-provider";

const [port, configPath] = process.argv.slice(2);
const config = JSON.parse(fs.readFileSync(configPath, "utf8"));
const accounts = () => JSON.parse(fs.readFileSync(config.accounts, "utf8"));

const provider = new Provider(config.issuer, {
  clients: config.clients.map((client) => ({
    grant_types: ["authorization_code", "refresh_token"],
    response_types: ["code"],
    token_endpoint_auth_method: "client_secret_post",
    ...client,
  })),
  pkce: { required: () => true },
  scopes: ["openid", "email", "profile", "groups", "offline_access"],
  claims: {
    openid: ["sub"],
    email: ["email", "email_verified"],
    profile: ["name", "preferred_username"],
    groups: ["groups"],
  },
  async findAccount(ctx, sub) {
    const account = accounts()[sub];
    if (!account) return undefined;
    return {
      accountId: sub,
      async claims() {
        return {
          sub,
          email: account.email,
          email_verified: true,
          name: account.name || sub,
          preferred_username: sub,
          groups: account.groups || [],
        };
      },
    };
  },
  // The development sign-in and consent pages: any login name that is in accounts.json, any password.
  features: { devInteractions: { enabled: true } },
  issueRefreshToken: async () => true,
  ttl: { AccessToken: 600, IdToken: 600, RefreshToken: 3600, Grant: 3600, Session: 3600, Interaction: 600 },
  cookies: { keys: ["agent-undo-tests-only"] },
  // Claims in the ID token too, as Entra ID and Okta put groups there when asked.
  conformIdTokenClaims: false,
});
provider.listen(Number(port), "127.0.0.1", () => console.log(`oidc provider at ${config.issuer}`));
