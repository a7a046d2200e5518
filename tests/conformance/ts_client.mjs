// The official TypeScript SDK's client, as an agent built on it would call the Recorder (or a server
// directly): node ts_client.mjs TARGET TOKEN CALLS_JSON, where TARGET is a streamable HTTP URL or
// "stdio:COMMAND ARG..." and CALLS_JSON is [[tool, arguments], ...].
// A call named "#read" reads the resource {uri}; "#prompt" gets the prompt {name, arguments};
// "#progress" calls {name, arguments} asking for progress, and gives {result, progress: [...]};
// "#cancel" calls {name, arguments}, cancels it after {afterMs} and stays a second, and gives {cancelled: message}.
// Prints {"protocolVersion", "results": [...]} as JSON; a JSON-RPC error is {"error": {code, message, data}}.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [target, token, calls] = process.argv.slice(2);
let transport;
if (target.startsWith("stdio:")) {
  const [command, ...args] = target.slice("stdio:".length).split(" ");
  transport = new StdioClientTransport({ command, args, stderr: "ignore" });
} else {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  transport = new StreamableHTTPClientTransport(new URL(target), { requestInit: { headers } });
}
const client = new Client({ name: "ts-conformance", version: "1.0.0" });
await client.connect(transport);
const results = [];
for (const [name, args] of JSON.parse(calls)) {
  try {
    if (name === "#read") results.push(await client.readResource({ uri: args.uri }));
    else if (name === "#prompt") results.push(await client.getPrompt(args));
    else if (name === "#progress") {
      const progress = [];
      const onprogress = (p) => progress.push([p.progress, p.total ?? null, p.message ?? null]);
      const result = await client.callTool({ name: args.name, arguments: args.arguments }, undefined, { onprogress });
      results.push({ result, progress });
    } else if (name === "#cancel") {
      const signal = AbortSignal.timeout(args.afterMs);
      try {
        await client.callTool({ name: args.name, arguments: args.arguments }, undefined, { signal });
        results.push({ cancelled: null });
      } catch (error) {
        results.push({ cancelled: String(error.message ?? error) });
      }
      await new Promise((resolve) => setTimeout(resolve, 1000)); // still connected while the cancel goes through
    }
    else results.push(await client.callTool({ name, arguments: args }));
  } catch (error) {
    results.push({ error: { code: error.code, message: error.message, data: error.data ?? null } });
  }
}
process.stdout.write(JSON.stringify({ protocolVersion: transport.protocolVersion ?? null, results }));
await client.close();
