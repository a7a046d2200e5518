// The official TypeScript SDK's client with its OAuth provider, given only a server URL, as a desktop client
// would be: node ts_oauth_client.mjs URL REDIRECT_URL TOOL ARGUMENTS_JSON.
// When a person must sign in it prints {"authorize": URL} on a line of its own and reads, from stdin, the URL
// the browser was redirected to (with the code); then it connects again, calls TOOL and prints
// {"result": ..., "accessToken": ...}.
import { createInterface } from "node:readline";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [serverUrl, redirectUrl, tool, args] = process.argv.slice(2);

class MemoryProvider {
  constructor() {
    this.saved = {};
  }
  get redirectUrl() {
    return redirectUrl;
  }
  get clientMetadata() {
    return {
      client_name: "TS Assistant", redirect_uris: [redirectUrl], grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"], token_endpoint_auth_method: "none",
    };
  }
  clientInformation() { return this.saved.client; }
  saveClientInformation(client) { this.saved.client = client; }
  tokens() { return this.saved.tokens; }
  saveTokens(tokens) { this.saved.tokens = tokens; }
  saveCodeVerifier(verifier) { this.saved.verifier = verifier; }
  codeVerifier() { return this.saved.verifier; }
  redirectToAuthorization(url) {
    process.stdout.write(JSON.stringify({ authorize: url.toString() }) + "\n");
  }
}

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const provider = new MemoryProvider();
const connect = async () => {
  const transport = new StreamableHTTPClientTransport(new URL(serverUrl), { authProvider: provider });
  const client = new Client({ name: "ts-oauth", version: "1.0.0" });
  await client.connect(transport);
  return { client, transport };
};

let connected;
try {
  connected = await connect();
} catch (error) {
  if (!(error instanceof UnauthorizedError)) throw error;
  const { value: redirected } = await lines.next();
  const transport = new StreamableHTTPClientTransport(new URL(serverUrl), { authProvider: provider });
  await transport.finishAuth(new URL(redirected).searchParams.get("code"));
  connected = await connect();
}
const result = await connected.client.callTool({ name: tool, arguments: JSON.parse(args) });
process.stdout.write(JSON.stringify({ result, accessToken: provider.saved.tokens?.access_token ?? null }) + "\n");
await connected.client.close();
process.exit(0);
