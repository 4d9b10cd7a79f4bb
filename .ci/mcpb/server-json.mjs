// Writes the server.json of one release: the committed server.json with the
// release's version, the image tag, and one MCPB package per bundle given,
// each with the download URL of the release asset and its SHA-256 (the
// official registry requires it for MCPB packages). install_test.go
// validates the result against the registry's schema and checks each hash
// against the bundle beside it.
//
//   node .ci/mcpb/server-json.mjs VERSION OUT BUNDLE.mcpb...
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const [version, out, ...bundles] = process.argv.slice(2);
if (!out || bundles.length === 0) {
  console.error("usage: node .ci/mcpb/server-json.mjs VERSION OUT BUNDLE.mcpb...");
  process.exit(2);
}
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const server = JSON.parse(fs.readFileSync(path.join(root, "server.json"), "utf8"));
const repo = server.repository.url;

server.version = version;
const oci = server.packages.filter((p) => p.registryType === "oci");
for (const p of oci) {
  p.identifier = p.identifier.replace(/:[^:/]+$/, `:${version}`);
}
const mcpb = bundles.map((file) => ({
  registryType: "mcpb",
  identifier: `${repo}/releases/download/v${version}/${path.basename(file)}`,
  version,
  fileSha256: createHash("sha256").update(fs.readFileSync(file)).digest("hex"),
  transport: { type: "stdio" },
}));
server.packages = [...oci, ...mcpb];
fs.writeFileSync(out, JSON.stringify(server, null, 2) + "\n");
console.log(`${out}: version ${version}, ${oci.length} OCI and ${mcpb.length} MCPB packages`);
