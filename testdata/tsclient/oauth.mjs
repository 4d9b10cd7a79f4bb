// The official MCP TypeScript SDK client's own OAuth flow, as an assistant
// runs it against a remote server: connect to MCP_URL without a token, get
// the 401, let the SDK discover the protected resource metadata and the
// authorization server, register dynamically, and start authorization
// code + PKCE with the resource parameter. The "browser" here follows the
// authorization server's redirects (its sign-in page signs in and consents
// at once) to the redirect URI, and hands the code back to the SDK, which
// exchanges it. Then it makes the calls in the file given as the first
// argument and prints one JSON object on stdout:
//
//   MCP_URL=http://127.0.0.1:8787/mcp node oauth.mjs calls.json
//
// {"registered": client_id, "scope": granted scopes, "resource": the
//  resource the authorization request named, "answers": [...]}, with each
// answer shaped as client.mjs prints them, plus the structured caller.
import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";

const calls = JSON.parse(readFileSync(process.argv[2], "utf8"));
const redirectUrl = "http://127.0.0.1:1/callback";
const seen = { registered: null, scope: null, resource: null };

let code = null;
// follow plays the browser: it follows redirects with cookies until the
// authorization server sends it to the redirect URI, and returns the code.
async function follow(start) {
  const jar = new Map();
  let url = new URL(start);
  for (let i = 0; i < 20; i++) {
    if (url.href.startsWith(redirectUrl)) {
      if (url.searchParams.get("error")) throw new Error(`authorization failed: ${url.search}`);
      return url.searchParams.get("code");
    }
    const cookie = [...jar].map(([k, v]) => `${k}=${v}`).join("; ");
    const res = await fetch(url, { redirect: "manual", headers: cookie ? { cookie } : {} });
    for (const c of res.headers.getSetCookie()) {
      const [pair] = c.split(";");
      const eq = pair.indexOf("=");
      jar.set(pair.slice(0, eq), pair.slice(eq + 1));
    }
    const next = res.headers.get("location");
    if (!next) throw new Error(`the authorization server answered ${res.status} at ${url}: ${await res.text()}`);
    url = new URL(next, url);
  }
  throw new Error("too many redirects");
}

const provider = {
  info: undefined,
  tok: undefined,
  verifier: undefined,
  get redirectUrl() { return redirectUrl; },
  get clientMetadata() {
    return { client_name: "mcp-quota e2e", redirect_uris: [redirectUrl], grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"], token_endpoint_auth_method: "none" };
  },
  clientInformation() { return this.info; },
  saveClientInformation(info) { this.info = info; seen.registered = info.client_id; },
  tokens() { return this.tok; },
  saveTokens(t) { this.tok = t; seen.scope = t.scope ?? null; },
  async redirectToAuthorization(url) {
    seen.resource = url.searchParams.get("resource");
    code = await follow(url);
  },
  saveCodeVerifier(v) { this.verifier = v; },
  codeVerifier() { return this.verifier; },
};

const serverUrl = new URL(process.env.MCP_URL);
let client = new Client({ name: "mcp-quota-e2e-ts-oauth", version: "1.0.0" });
let transport = new StreamableHTTPClientTransport(serverUrl, { authProvider: provider });
try {
  await client.connect(transport);
} catch (e) {
  if (!(e instanceof UnauthorizedError) || !code) throw e;
  await transport.finishAuth(code);
  client = new Client({ name: "mcp-quota-e2e-ts-oauth", version: "1.0.0" });
  transport = new StreamableHTTPClientTransport(serverUrl, { authProvider: provider });
  await client.connect(transport);
}
await client.listTools();
const answers = [];
for (const c of calls) {
  const a = { name: c.name, isError: false, text: "", code: "", structured: false, protocolError: null };
  try {
    const res = await client.callTool({ name: c.tool, arguments: c.args });
    a.isError = res.isError === true;
    a.text = (res.content ?? []).filter((b) => b.type === "text").map((b) => b.text).join("");
    a.code = res._meta?.["mcp-quota/error"]?.code ?? "";
    a.structured = res.structuredContent !== undefined;
    a.caller = res.structuredContent?.caller ?? "";
  } catch (e) {
    a.protocolError = String(e?.message ?? e);
  }
  answers.push(a);
}
process.stdout.write(JSON.stringify({ ...seen, answers }));
await client.close();
