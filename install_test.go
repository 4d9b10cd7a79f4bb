// Tests of what installs and runs mcp-quota outside Go: the MCP Registry
// entry (server.json), the Claude Desktop bundle's manifest, the container
// image's Containerfile, and the systemd and Kubernetes examples. Each
// artefact is also built and checked by .ci/run (GoReleaser, podman, the
// MCP Bundle CLI, systemd-analyze); these tests check what can be checked
// from the files alone, and the release files .ci/run builds when
// MCP_QUOTA_DIST names them.
package mcpquota_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// serverName is the name the MCP Registry knows mcp-quota by; the image's
// io.modelcontextprotocol.server.name label must say the same.
const serverName = "io.github.mcp-quota/mcp-quota"

// registrySchema compiles the MCP Registry's server.json schema, committed
// as published (testdata/registry/server.schema.json, its $id the
// published URL), so that nothing is fetched.
func registrySchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	f, err := os.Open("testdata/registry/server.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		t.Fatalf("the schema is not JSON: %v", err)
	}
	id, _ := doc.(map[string]any)["$id"].(string)
	if !strings.HasPrefix(id, "https://static.modelcontextprotocol.io/schemas/") {
		t.Fatalf("schema $id = %q; want the registry's published URL", id)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource(id, doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile(id)
	if err != nil {
		t.Fatalf("compile the registry's schema: %v", err)
	}
	return s
}

// serverJSON is what the tests read of a server.json.
type serverJSON struct {
	Schema   string `json:"$schema"`
	Name     string `json:"name"`
	Version  string `json:"version"`
	Packages []struct {
		RegistryType string `json:"registryType"`
		Identifier   string `json:"identifier"`
		Version      string `json:"version"`
		FileSha256   string `json:"fileSha256"`
		Transport    struct {
			Type string `json:"type"`
		} `json:"transport"`
	} `json:"packages"`
	Remotes []struct {
		Type string `json:"type"`
		URL  string `json:"url"`
	} `json:"remotes"`
}

// checkServerJSON validates a server.json against the registry's schema and
// returns it decoded.
func checkServerJSON(t *testing.T, schema *jsonschema.Schema, file string) serverJSON {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s is not JSON: %v", file, err)
	}
	if err := schema.Validate(doc); err != nil {
		t.Fatalf("%s does not follow the registry's schema: %v", file, err)
	}
	var s serverJSON
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if s.Schema != registrySchemaID(t) {
		t.Errorf("%s: $schema = %q; want the committed schema's $id %q", file, s.Schema, registrySchemaID(t))
	}
	if s.Name != serverName {
		t.Errorf("%s: name = %q; want %q", file, s.Name, serverName)
	}
	kinds := map[string]int{}
	for _, p := range s.Packages {
		kinds[p.RegistryType]++
		if p.Transport.Type != "stdio" {
			t.Errorf("%s: package %s has transport %q; want stdio", file, p.Identifier, p.Transport.Type)
		}
		switch p.RegistryType {
		case "oci":
			if !strings.HasSuffix(p.Identifier, ":"+s.Version) {
				t.Errorf("%s: image %s is not tagged with the version %s", file, p.Identifier, s.Version)
			}
		case "mcpb":
			if !strings.HasPrefix(p.Identifier, "https://github.com/mcp-quota/mcp-quota/releases/download/v"+s.Version+"/") ||
				!strings.HasSuffix(p.Identifier, ".mcpb") {
				t.Errorf("%s: bundle %s is not a .mcpb asset of release v%s", file, p.Identifier, s.Version)
			}
		}
	}
	if kinds["oci"] != 1 || kinds["mcpb"] == 0 {
		t.Errorf("%s: packages by type = %v; want one oci and at least one mcpb", file, kinds)
	}
	if len(s.Remotes) != 1 || s.Remotes[0].Type != "streamable-http" || !strings.HasSuffix(s.Remotes[0].URL, "/mcp") {
		t.Errorf("%s: remotes = %+v; want one streamable-http endpoint at …/mcp", file, s.Remotes)
	}
	return s
}

func registrySchemaID(t *testing.T) string {
	t.Helper()
	var s struct {
		ID string `json:"$id"`
	}
	b, err := os.ReadFile("testdata/registry/server.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s.ID
}

// TestServerJSON: the committed server.json follows the registry's schema,
// names the image and the bundles of its version and a Streamable HTTP
// remote, and has the version of the bundle's manifest.
func TestServerJSON(t *testing.T) {
	schema := registrySchema(t)
	s := checkServerJSON(t, schema, "server.json")
	if m := readManifest(t); m.Version != s.Version {
		t.Errorf("server.json version %s, mcpb/manifest.json version %s; want them equal", s.Version, m.Version)
	}
}

// TestRegistrySchemaRefuses: the committed schema does refuse what the
// registry refuses, so TestServerJSON's pass means something.
func TestRegistrySchemaRefuses(t *testing.T) {
	schema := registrySchema(t)
	b, err := os.ReadFile("server.json")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		change func(m map[string]any)
	}{
		{"no description", func(m map[string]any) { delete(m, "description") }},
		{"a name without a namespace", func(m map[string]any) { m["name"] = "mcp-quota" }},
		{"a package version of latest", func(m map[string]any) {
			m["packages"].([]any)[1].(map[string]any)["version"] = "latest"
		}},
		{"a bundle hash that is not SHA-256", func(m map[string]any) {
			m["packages"].([]any)[1].(map[string]any)["fileSha256"] = "abc"
		}},
		{"a remote that is not a URL", func(m map[string]any) {
			m["remotes"].([]any)[0].(map[string]any)["url"] = "localhost:8787/mcp"
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			tt.change(m)
			changed, _ := json.Marshal(m)
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(changed))
			if err != nil {
				t.Fatal(err)
			}
			if err := schema.Validate(doc); err == nil {
				t.Errorf("the schema accepted server.json with %s", tt.name)
			}
		})
	}
}

// mcpbManifest is what the tests read of the bundle's manifest.
type mcpbManifest struct {
	ManifestVersion string `json:"manifest_version"`
	Name            string `json:"name"`
	Version         string `json:"version"`
	Server          struct {
		Type       string `json:"type"`
		EntryPoint string `json:"entry_point"`
		MCPConfig  struct {
			Command string            `json:"command"`
			Args    []string          `json:"args"`
			Env     map[string]string `json:"env"`
		} `json:"mcp_config"`
	} `json:"server"`
	UserConfig map[string]struct {
		Type      string `json:"type"`
		Required  bool   `json:"required"`
		Sensitive bool   `json:"sensitive"`
	} `json:"user_config"`
}

func readManifest(t *testing.T) mcpbManifest {
	t.Helper()
	b, err := os.ReadFile("mcpb/manifest.json")
	if err != nil {
		t.Fatal(err)
	}
	var m mcpbManifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("mcpb/manifest.json: %v", err)
	}
	return m
}

// TestMCPBManifest: the Claude Desktop bundle runs the bundled binary's
// stdio server with the configuration and state the user picks, and every
// field that carries a secret is marked sensitive (the MCP Bundle CLI
// validates the rest in .ci/run).
func TestMCPBManifest(t *testing.T) {
	m := readManifest(t)
	if m.ManifestVersion != "0.3" || m.Server.Type != "binary" {
		t.Errorf("manifest_version %q, server.type %q; want 0.3, binary", m.ManifestVersion, m.Server.Type)
	}
	if want := "${__dirname}/" + m.Server.EntryPoint; m.Server.MCPConfig.Command != want {
		t.Errorf("command = %q; want the entry point %q", m.Server.MCPConfig.Command, want)
	}
	args := strings.Join(m.Server.MCPConfig.Args, " ")
	if want := "stdio --config ${user_config.config_file} --state ${user_config.state}"; args != want {
		t.Errorf("args = %q; want %q", args, want)
	}
	if c := m.UserConfig["config_file"]; c.Type != "file" || !c.Required {
		t.Errorf("user_config.config_file = %+v; want a required file", c)
	}
	if _, ok := m.UserConfig["state"]; !ok {
		t.Error("no user_config.state")
	}
	// Every user_config value that reaches the environment is a secret
	// (API keys, the PostgreSQL password); the paths are not.
	used := map[string]bool{}
	ref := regexp.MustCompile(`\$\{user_config\.([a-z0-9_]+)\}`)
	for name, v := range m.Server.MCPConfig.Env {
		for _, r := range ref.FindAllStringSubmatch(v, -1) {
			used[r[1]] = true
			if !m.UserConfig[r[1]].Sensitive {
				t.Errorf("env %s takes user_config.%s, which is not marked sensitive", name, r[1])
			}
		}
	}
	for _, a := range m.Server.MCPConfig.Args {
		for _, r := range ref.FindAllStringSubmatch(a, -1) {
			used[r[1]] = true
		}
	}
	for name, c := range m.UserConfig {
		if !used[name] {
			t.Errorf("user_config.%s is asked for but never passed to the server", name)
		}
		if c.Sensitive && !strings.Contains(name, "key") && !strings.Contains(name, "password") {
			t.Errorf("user_config.%s is sensitive but is no key or password", name)
		}
	}
}

// containerfile reads the Containerfile's instructions, continuation lines
// joined.
func containerfile(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open("Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ins := map[string][]string{}
	var cur string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if cur == "" && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if more, ok := strings.CutSuffix(line, "\\"); ok {
			cur += more + " "
			continue
		}
		cur += line
		word, rest, _ := strings.Cut(cur, " ")
		ins[strings.ToUpper(word)] = append(ins[strings.ToUpper(word)], strings.TrimSpace(rest))
		cur = ""
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return ins
}

// TestContainerfile: the image is the binary alone, run as a non-root user,
// labelled with the registry name, serving on 0.0.0.0 inside the container
// with its state on a volume. .ci/run builds it and checks the same with
// podman image inspect.
func TestContainerfile(t *testing.T) {
	ins := containerfile(t)
	want := map[string]string{
		"FROM":       "scratch",
		"USER":       "65532:65532",
		"EXPOSE":     "8787",
		"ENTRYPOINT": `["/usr/local/bin/mcp-quota"]`,
		"CMD":        `["serve", "--listen", "0.0.0.0:8787"]`,
		"VOLUME":     `["/var/lib/mcp-quota"]`,
	}
	for word, v := range want {
		if got := ins[word]; len(got) != 1 || got[0] != v {
			t.Errorf("%s = %q; want exactly %q", word, got, v)
		}
	}
	label := `io.modelcontextprotocol.server.name="` + serverName + `"`
	if l := strings.Join(ins["LABEL"], " "); !strings.Contains(l, label) {
		t.Errorf("LABEL %s; want %s", l, label)
	}
	if env := strings.Join(ins["ENV"], " "); !strings.Contains(env, "XDG_STATE_HOME=/var/lib ") {
		t.Errorf("ENV %s; want the state directory on the volume (XDG_STATE_HOME=/var/lib)", env)
	}
}

// TestSystemdUnit: the unit runs serve as an unprivileged user of its own,
// on loopback, with the state in its state directory and secrets from a
// root-only environment file. .ci/run runs systemd-analyze verify on it.
func TestSystemdUnit(t *testing.T) {
	b, err := os.ReadFile("examples/mcp-quota.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := map[string][]string{}
	section := ""
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("line %q is no key=value", line)
			}
			unit[section+"."+k] = append(unit[section+"."+k], v)
		}
	}
	want := map[string]string{
		"Service.ExecStart":       "/usr/local/bin/mcp-quota serve --listen 127.0.0.1:8787 --config /etc/mcp-quota/config.toml",
		"Service.DynamicUser":     "yes",
		"Service.StateDirectory":  "mcp-quota",
		"Service.EnvironmentFile": "-/etc/mcp-quota/secrets.env",
		"Service.NoNewPrivileges": "yes",
		"Service.ProtectSystem":   "strict",
		"Install.WantedBy":        "multi-user.target",
	}
	for k, v := range want {
		if got := unit[k]; len(got) != 1 || got[0] != v {
			t.Errorf("%s = %q; want %q", k, got, v)
		}
	}
	if env := strings.Join(unit["Service.Environment"], " "); !strings.Contains(env, "XDG_STATE_HOME=/var/lib") {
		t.Errorf("Environment %s; want XDG_STATE_HOME=/var/lib, so the state is in the StateDirectory", env)
	}
}

// TestReleaseArtifacts checks what .ci/run built from a GoReleaser
// snapshot (MCP_QUOTA_DIST names the folder): the server.json written for
// the release follows the registry's schema and each bundle's SHA-256 in
// it is the hash of the bundle beside it.
func TestReleaseArtifacts(t *testing.T) {
	dist := os.Getenv("MCP_QUOTA_DIST")
	if dist == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("MCP_QUOTA_DIST is not set: .ci/run builds the release files and names their folder")
		}
		t.Skip("MCP_QUOTA_DIST is not set (.ci/run sets it after building a snapshot)")
	}
	s := checkServerJSON(t, registrySchema(t), filepath.Join(dist, "mcpb", "server.json"))
	for _, p := range s.Packages {
		if p.RegistryType != "mcpb" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dist, "mcpb", path.Base(p.Identifier)))
		if err != nil {
			t.Errorf("bundle of %s: %v", p.Identifier, err)
			continue
		}
		sum := sha256.Sum256(b)
		if got := hex.EncodeToString(sum[:]); got != p.FileSha256 {
			t.Errorf("%s: fileSha256 %s; the bundle's SHA-256 is %s", p.Identifier, p.FileSha256, got)
		}
	}
	if len(s.Packages) < 2 {
		t.Errorf("packages = %d; want the image and at least one bundle", len(s.Packages))
	}
	t.Logf("checked %s: version %s, %d packages", dist, s.Version, len(s.Packages))
}
