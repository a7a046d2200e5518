// The Vercel AI SDK 7's MCP client (@ai-sdk/mcp, pinned in package.json, on the Node 22 beside it) calling one
// tool through the Recorder as a ToolLoopAgent does: `node vercel_ai_probe.mjs URL TOKEN TOOL ARGUMENTS_JSON
// RUN_ID`, printing, as one JSON line, what the agent's model reads of the tool's return (the tool message the
// SDK hands the model on its next step) and how long the call took.
//
// The client is `createMCPClient` over its HTTP transport with its defaults (the 2026 stateless protocol where
// the server offers it), and the run is named by the `Hatp-Run-Id` header: the SDK sends no `_meta` of the
// agent's with a call. The model is the SDK's own mock (no model provider is called): it asks for the tool
// once, then reads what came back.
import { createMCPClient } from '@ai-sdk/mcp';
import { ToolLoopAgent } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';

const [url, token, toolName, argumentsJson, runId] = process.argv.slice(2);
const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 1, text: 1, reasoning: undefined },
};

const client = await createMCPClient({
  transport: { type: 'http', url, headers: { Authorization: `Bearer ${token}`, 'Hatp-Run-Id': runId } },
});
const model = new MockLanguageModelV4({
  doGenerate: [
    {
      content: [{ type: 'tool-call', toolCallId: 'call-1', toolName, input: argumentsJson }],
      finishReason: { unified: 'tool-calls', raw: undefined }, usage, warnings: [],
    },
    {
      content: [{ type: 'text', text: 'done' }],
      finishReason: { unified: 'stop', raw: undefined }, usage, warnings: [],
    },
  ],
});
let seen = '';
let failed = '';
const started = performance.now();
try {
  const tools = await client.tools();
  await new ToolLoopAgent({ model, tools: { [toolName]: tools[toolName] } }).generate({ prompt: 'go' });
  // What the model is handed on its second step: the tool message's output.
  const message = model.doGenerateCalls[1].prompt.find((part) => part.role === 'tool');
  const output = message.content[0].output;
  seen = output.type === 'content' ? output.value.map((part) => part.text ?? '').join('\n')
    : typeof output.value === 'string' ? output.value : JSON.stringify(output.value);
  failed = output.type.startsWith('error') ? output.type : '';
} catch (error) {
  failed = `${error.name}: ${error.message}`;
}
const seconds = (performance.now() - started) / 1000;
await client.close();
console.log(JSON.stringify({ seen, failed, seconds }));
