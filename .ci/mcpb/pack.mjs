// Packs mcp-quota's Claude Desktop bundle (.mcpb) for one platform from a
// built binary, with the pinned MCP Bundle CLI (package.json here):
// mcpb/manifest.json with this release's version, platform and entry point,
// the binary under server/, and the LICENSE; validated before and after
// packing. Prints the bundle's path and SHA-256.
//
//   node .ci/mcpb/pack.mjs BINARY GOOS GOARCH VERSION OUTDIR
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const [binary, goos, goarch, version, outDir] = process.argv.slice(2);
if (!outDir) {
  console.error("usage: node .ci/mcpb/pack.mjs BINARY GOOS GOARCH VERSION OUTDIR");
  process.exit(2);
}
const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "..", "..");
const mcpb = path.join(here, "node_modules", ".bin", "mcpb");
const platform = { darwin: "darwin", windows: "win32", linux: "linux" }[goos];
if (!platform) {
  console.error(`no Claude Desktop platform for GOOS ${goos}`);
  process.exit(2);
}
const exe = goos === "windows" ? "mcp-quota.exe" : "mcp-quota";

const manifest = JSON.parse(fs.readFileSync(path.join(root, "mcpb", "manifest.json"), "utf8"));
manifest.version = version;
manifest.compatibility.platforms = [platform];
manifest.server.entry_point = `server/${exe}`;
manifest.server.mcp_config.command = `\${__dirname}/server/${exe}`;

const stage = fs.mkdtempSync(path.join(os.tmpdir(), "mcp-quota-mcpb-"));
try {
  fs.mkdirSync(path.join(stage, "server"));
  fs.writeFileSync(path.join(stage, "manifest.json"), JSON.stringify(manifest, null, 2) + "\n");
  fs.copyFileSync(binary, path.join(stage, "server", exe));
  fs.chmodSync(path.join(stage, "server", exe), 0o755);
  fs.copyFileSync(path.join(root, "LICENSE"), path.join(stage, "LICENSE"));

  fs.mkdirSync(outDir, { recursive: true });
  const out = path.resolve(outDir, `mcp-quota_${version}_${goos}_${goarch}.mcpb`);
  const run = (...args) => execFileSync(mcpb, args, { stdio: "inherit" });
  run("validate", path.join(stage, "manifest.json"));
  run("pack", stage, out);
  run("info", out);
  const sum = createHash("sha256").update(fs.readFileSync(out)).digest("hex");
  console.log(`${out} sha256 ${sum}`);
} finally {
  fs.rmSync(stage, { recursive: true, force: true });
}
