// A real OpenID provider (oidc-provider, pinned in package.json) for
// mcp-quota's OAuth tests, started by them on loopback:
//
//   node provider.mjs [count]
//
// starts `count` (default 1) independent issuers on free loopback ports and
// prints one JSON line {"issuers": ["http://127.0.0.1:…", …]} once they
// listen. It runs until stdin closes or it is killed.
//
// Each issuer has dynamic client registration, authorization code with
// PKCE, resource indicators (an access token is issued for the resource a
// client names, as a JWT — or opaque for the client "opaque-job"),
// client credentials, introspection and revocation. Its sign-in page signs
// in the account named by OIDC_USER (default "alice") and grants what was
// asked, so a client can complete the flow without a browser; with
// OIDC_USER set and empty, it is a login form instead, where a person (a
// browser test) enters an account's name and the password
// "test-password", and then grants what was asked. Accounts:
//   alice  email alice@example.com, groups ["team-a"]
//   bob    email bob@example.com,   groups []
// Static clients (secrets are test values):
//   sync-job    client_secret_basic "sync-job-secret", client_credentials, JWT
//   opaque-job  client_secret_basic "opaque-job-secret", client_credentials, opaque
//   mcp-quota   client_secret_basic "mcp-quota-secret" (introspects)
import { createServer } from "node:http";
import { once } from "node:events";
import { generateKeyPair, randomUUID } from "node:crypto";
import { promisify } from "node:util";
import Provider from "oidc-provider";

const accounts = {
  alice: { email: "alice@example.com", groups: ["team-a"] },
  bob: { email: "bob@example.com", groups: [] },
};
const user = process.env.OIDC_USER ?? "alice";
const password = "test-password";

// loginPage is the login form of interaction uid, with a message.
function loginPage(uid, message) {
  const esc = (v) => String(v).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Test IdP: sign in</title></head><body>
<h1>Test IdP</h1><p id="message">${esc(message)}</p>
<form id="login-form" method="post" action="/interaction/${esc(uid)}">
<label>Account <input id="login" name="login" autocomplete="username"></label>
<label>Password <input id="password" name="password" type="password" autocomplete="current-password"></label>
<button id="login-button" type="submit">Sign in</button>
</form></body></html>`;
}

// formBody reads an application/x-www-form-urlencoded request body.
async function formBody(req) {
  let raw = "";
  for await (const chunk of req) {
    raw += chunk;
    if (raw.length > 1 << 16) throw new Error("form too large");
  }
  return new URLSearchParams(raw);
}

// signingKey is a fresh RSA key of one issuer: no two issuers share one.
// It is made off the main thread: once, under the whole Go suite, the
// process stalled in a futex wait after its servers listened and before it
// printed its issuers, where the synchronous generation ran.
async function signingKey() {
  const { privateKey } = await promisify(generateKeyPair)("rsa", { modulusLength: 2048 });
  return { ...privateKey.export({ format: "jwk" }), kid: randomUUID(), alg: "RS256", use: "sig" };
}

function configuration(key) {
  return {
    jwks: { keys: [key] },
    clients: [
      { client_id: "sync-job", client_secret: "sync-job-secret", grant_types: ["client_credentials"], response_types: [], redirect_uris: [] },
      { client_id: "opaque-job", client_secret: "opaque-job-secret", grant_types: ["client_credentials"], response_types: [], redirect_uris: [] },
      { client_id: "mcp-quota", client_secret: "mcp-quota-secret", grant_types: ["client_credentials"], response_types: [], redirect_uris: [] },
    ],
    scopes: ["openid", "offline_access", "mcp", "demo:write"],
    claims: { openid: ["sub"], email: ["email"], groups: ["groups"] },
    cookies: { keys: ["mcp-quota-test-cookie-key"] },
    pkce: { required: () => true },
    findAccount: async (_ctx, id) => accounts[id] && {
      accountId: id,
      claims: async () => ({ sub: id, ...accounts[id] }),
    },
    extraTokenClaims: async (_ctx, token) => (token.accountId && accounts[token.accountId]) ? { ...accounts[token.accountId] } : undefined,
    features: {
      devInteractions: { enabled: false },
      registration: { enabled: true },
      clientCredentials: { enabled: true },
      introspection: { enabled: true, allowedPolicy: async () => true },
      revocation: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: async (_ctx, _client, oneOf) => oneOf,
        useGrantedResource: async () => true,
        getResourceServerInfo: async (_ctx, resource, client) => ({
          scope: "mcp demo:write",
          audience: resource,
          accessTokenTTL: 300,
          accessTokenFormat: client.clientId === "opaque-job" ? "opaque" : "jwt",
          jwt: { sign: { alg: "RS256" } },
        }),
      },
    },
    interactions: { url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
  };
}

// signIn finishes an interaction as the configured user: sign-in, then
// consent to every scope and resource asked for.
async function signIn(provider, req, res) {
  const details = await provider.interactionDetails(req, res);
  const { prompt, params } = details;
  let result;
  if (prompt.name === "login") {
    let accountId = user;
    if (!user) {
      const form = req.method === "POST" ? await formBody(req) : null;
      accountId = form?.get("login") ?? "";
      if (!form || !Object.hasOwn(accounts, accountId) || form.get("password") !== password) {
        res.setHeader("Content-Type", "text/html; charset=utf-8");
        res.end(loginPage(details.uid, form ? "Unknown account or wrong password." : ""));
        return;
      }
    }
    result = { login: { accountId } };
  } else {
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: details.session.accountId, clientId: params.client_id });
    if (prompt.details.missingOIDCScope) grant.addOIDCScope(prompt.details.missingOIDCScope.join(" "));
    if (prompt.details.missingOIDCClaims) grant.addOIDCClaims(prompt.details.missingOIDCClaims);
    for (const [indicator, scopes] of Object.entries(prompt.details.missingResourceScopes ?? {})) {
      grant.addResourceScope(indicator, scopes.join(" "));
    }
    result = { consent: { grantId: await grant.save() } };
  }
  await provider.interactionFinished(req, res, result, { mergeWithLastSubmission: true });
}

async function start() {
  let handler = null;
  const server = createServer((req, res) => handler(req, res));
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const issuer = `http://127.0.0.1:${server.address().port}`;
  const provider = new Provider(issuer, configuration(await signingKey()));
  const callback = provider.callback();
  handler = (req, res) => {
    if (req.url.startsWith("/interaction/")) {
      signIn(provider, req, res).catch((e) => {
        res.statusCode = 500;
        res.end(String(e));
      });
      return;
    }
    callback(req, res);
  };
  return issuer;
}

const count = Number(process.argv[2] || 1);
const issuers = [];
for (let i = 0; i < count; i++) issuers.push(await start());
process.stdout.write(JSON.stringify({ issuers }) + "\n");
process.stdin.resume();
process.stdin.on("end", () => process.exit(0));
