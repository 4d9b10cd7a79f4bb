// The official MCP TypeScript SDK client, as an assistant uses it: connect,
// list the tools (from then on the client validates every result's
// structuredContent against the tool's outputSchema), then make the calls
// named in the file given as the first argument, and print what the client
// handed back for each one as one JSON array on stdout.
//
//   MCP_URL=http://127.0.0.1:8787/mcp MCP_TOKEN=… node client.mjs calls.json
//   MCP_COMMAND='["/path/mcp-quota","stdio","--config","…"]' node client.mjs calls.json
//
// calls.json: [{"name": "…", "tool": "fetch", "args": {…}}, …]
// Each answer: {"name", "isError", "text", "code", "structured", "protocolError"}.
import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const calls = JSON.parse(readFileSync(process.argv[2], "utf8"));

let transport;
if (process.env.MCP_URL) {
  transport = new StreamableHTTPClientTransport(new URL(process.env.MCP_URL), {
    requestInit: { headers: { Authorization: `Bearer ${process.env.MCP_TOKEN}` } },
  });
} else {
  const [command, ...args] = JSON.parse(process.env.MCP_COMMAND);
  transport = new StdioClientTransport({ command, args, env: process.env, stderr: "inherit" });
}

const client = new Client({ name: "mcp-quota-e2e-ts", version: "1.0.0" });
await client.connect(transport);
const { tools } = await client.listTools();
const answers = [];
for (const c of calls) {
  const a = { name: c.name, isError: false, text: "", code: "", structured: false, protocolError: null };
  try {
    const res = await client.callTool({ name: c.tool, arguments: c.args });
    a.isError = res.isError === true;
    a.text = (res.content ?? []).filter((b) => b.type === "text").map((b) => b.text).join("");
    a.code = res._meta?.["mcp-quota/error"]?.code ?? "";
    a.structured = res.structuredContent !== undefined;
    a.resultChars = JSON.stringify(res).length;
  } catch (e) {
    a.protocolError = String(e?.message ?? e);
  }
  answers.push(a);
}
process.stdout.write(JSON.stringify({ tools: tools.map((t) => t.name), answers }));
await client.close();
