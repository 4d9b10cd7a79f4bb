// The OpenAI Node client, used as its README says (its own retries on
// 429, waiting Retry-After), looping chat completions through mcp-quota's
// REST side until a deadline, one client per caller token, all at once.
// A RateLimitError the client gives up on is waited out for its
// Retry-After before the loop goes on. It prints one JSON line: per
// caller, the calls that went, the rate-limit fields of every answer and
// every error. Usage: node openai.mjs BASE_URL DURATION_MS MAX_TOKENS TOKEN...
import OpenAI from "openai";

const [base, durationMs, maxTokens, ...tokens] = process.argv.slice(2);
const deadline = Date.now() + Number(durationMs);

async function loop(token) {
  const fields = (h) => ({
    at: Date.now(),
    limitRequests: h.get("x-ratelimit-limit-requests"),
    remainingRequests: h.get("x-ratelimit-remaining-requests"),
    resetRequests: h.get("x-ratelimit-reset-requests"),
    limitTokens: h.get("x-ratelimit-limit-tokens"),
    remainingTokens: h.get("x-ratelimit-remaining-tokens"),
    resetTokens: h.get("x-ratelimit-reset-tokens"),
    retryAfter: h.get("retry-after"),
  });
  const run = { ok: 0, rateLimitErrors: [], refusals: [], errors: [], statuses: {}, rates: [] };
  // Counts every status, and keeps each 429 the client retries on its
  // own as it would read it: the body's error object (the client parses
  // any JSON body) and the rate-limit fields.
  const fetchCounting = async (url, init) => {
    const resp = await fetch(url, init);
    run.statuses[resp.status] = (run.statuses[resp.status] ?? 0) + 1;
    if (resp.status === 429) {
      let error = {};
      try {
        error = JSON.parse(await resp.clone().text())?.error ?? {};
      } catch {}
      run.refusals.push({ message: error.message, code: error.code, type: error.type, ...fields(resp.headers) });
    }
    return resp;
  };
  const client = new OpenAI({ apiKey: token, baseURL: base, fetch: fetchCounting });
  while (Date.now() < deadline) {
    try {
      const { response } = await client.chat.completions
        .create({ model: "gpt-test", messages: [{ role: "user", content: "hi" }], max_completion_tokens: Number(maxTokens) })
        .withResponse();
      run.ok++;
      run.rates.push(fields(response.headers));
    } catch (err) {
      if (err instanceof OpenAI.RateLimitError) {
        run.rateLimitErrors.push({ message: err.message, code: err.code, type: err.type, ...fields(err.headers) });
        const wait = Number(err.headers.get("retry-after") ?? "1");
        await new Promise((r) => setTimeout(r, wait * 1000));
        continue;
      }
      run.errors.push({ status: err.status, message: String(err.message) });
      if (run.errors.length > 20) break;
    }
  }
  return run;
}

const runs = await Promise.all(tokens.map(loop));
console.log(JSON.stringify({ runs }));
