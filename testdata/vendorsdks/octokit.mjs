// octokit with its throttling and retry plugins, used as their README
// says, looping GET /user through mcp-quota's REST side until a deadline,
// one octokit per caller token, all at once. It prints one JSON line: per
// caller, the calls that went, what the plugins were told and every
// status met. Usage: node octokit.mjs BASE_URL DURATION_MS TOKEN...
import { Octokit } from "@octokit/core";
import { throttling } from "@octokit/plugin-throttling";
import { retry } from "@octokit/plugin-retry";

const [base, durationMs, ...tokens] = process.argv.slice(2);
const deadline = Date.now() + Number(durationMs);
const MyOctokit = Octokit.plugin(throttling, retry);

async function loop(token) {
  const run = { ok: 0, rateLimits: [], secondaryLimits: [], errors: [], statuses: {}, rates: [] };
  const fetchCounting = async (url, init) => {
    const resp = await fetch(url, init);
    run.statuses[resp.status] = (run.statuses[resp.status] ?? 0) + 1;
    return resp;
  };
  const octokit = new MyOctokit({
    auth: token, // sent as "Authorization: token <token>", GitHub's scheme
    baseUrl: base,
    request: { fetch: fetchCounting },
    throttle: {
      onRateLimit: (retryAfter, options, _octokit, retryCount) => {
        run.rateLimits.push({ retryAfter, retryCount });
        return true;
      },
      onSecondaryRateLimit: (retryAfter) => {
        run.secondaryLimits.push({ retryAfter });
        return true;
      },
    },
  });
  while (Date.now() < deadline) {
    try {
      const resp = await octokit.request("GET /user");
      run.ok++;
      run.rates.push({
        at: Date.now(),
        limit: Number(resp.headers["x-ratelimit-limit"]),
        remaining: Number(resp.headers["x-ratelimit-remaining"]),
        reset: Number(resp.headers["x-ratelimit-reset"]),
        used: Number(resp.headers["x-ratelimit-used"]),
        resource: resp.headers["x-ratelimit-resource"],
      });
    } catch (err) {
      run.errors.push({ status: err.status, message: String(err.message) });
      if (run.errors.length > 20) break;
    }
  }
  return run;
}

const runs = await Promise.all(tokens.map(loop));
console.log(JSON.stringify({ runs }));
