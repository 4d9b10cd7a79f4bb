package main

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/state"
)

// What a new user types and what they get back: each command's output,
// errors that say what is wrong and which flag changes it.

func noEnv(string) string { return "" }

// runCmd runs the program with args and returns its stdout, stderr and error.
func runCmd(t *testing.T, getenv func(string) string, args ...string) (string, string, error) {
	t.Helper()
	if getenv == nil {
		getenv = noEnv
	}
	var out, errOut strings.Builder
	err := run(t.Context(), args, strings.NewReader(""), &out, &errOut, getenv)
	return out.String(), errOut.String(), err
}

func TestBuildVersion(t *testing.T) {
	settings := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i+1 < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	tests := []struct {
		name              string
		bi                *debug.BuildInfo
		version, revision string
	}{
		{"go install @version", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.0"}}, "v1.2.0", ""},
		{"go build in a clone", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261201083700-3699fcf1ab12"},
			Settings: settings("vcs.revision", "3699fcf1ab12aa55bb66cc77dd88ee99ff001122", "vcs.modified", "false")},
			"v0.0.0-20261201083700-3699fcf1ab12", "3699fcf1ab12aa55bb66cc77dd88ee99ff001122"},
		{"devel with a revision, modified", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: settings("vcs.revision", "3699fcf1ab12aa55bb66cc77dd88ee99ff001122", "vcs.modified", "true")},
			"devel-3699fcf1ab12+dirty", "3699fcf1ab12aa55bb66cc77dd88ee99ff001122+dirty"},
		{"no VCS stamping", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel", ""},
		{"no build info", nil, "devel", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, r := buildVersion(tt.bi)
			if v != tt.version || r != tt.revision {
				t.Errorf("buildVersion = %q, %q; want %q, %q", v, r, tt.version, tt.revision)
			}
		})
	}
}

// TestVersion: --version and version print the same line, from the build
// info, and /healthz and serverInfo carry the same version.
func TestVersion(t *testing.T) {
	if version == "" || version == "dev" {
		t.Fatalf("version = %q; want it from the build info", version)
	}
	for _, args := range [][]string{{"--version"}, {"version"}, {"-version"}} {
		out, _, err := runCmd(t, nil, args...)
		if err != nil || !strings.HasPrefix(out, "mcp-quota "+version+" (revision ") {
			t.Errorf("%v: %q, %v; want the version line", args, out, err)
		}
	}
	_, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	base, _ := s.serve(t)
	resp := get(t, base+"/healthz", "")
	var health struct{ Status, Version string }
	decode(t, resp, &health)
	if health.Status != "ok" || health.Version != version {
		t.Errorf("/healthz = %+v; want ok and version %q", health, version)
	}
	sess := s.stdioSession(t, nil)
	if info := sess.InitializeResult().ServerInfo; info.Version != binaryVersion(t) || info.Version == "dev" {
		t.Errorf("serverInfo.version = %q, want %q", info.Version, binaryVersion(t))
	}
}

// binaryVersion is the version the built binary reports.
func binaryVersion(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(binary(t), "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	v, _, _ := strings.Cut(strings.TrimPrefix(string(out), "mcp-quota "), " ")
	return v
}

// TestHelp: -h and help CMD exit 0 and show the command's flags on stdout;
// a wrong flag shows them on stderr and fails.
func TestHelp(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "-h"}, "-listen"},
		{[]string{"help", "serve"}, "-demo-listen"},
		{[]string{"stdio", "--help"}, "-caller"},
		{[]string{"help", "status"}, "-json"},
		{[]string{"activity", "-h"}, "-limit"},
		{[]string{"help", "init"}, "-config"},
		{[]string{"help", "demo-upstream"}, "-mode"},
		{[]string{"help", "bench"}, "bench quota"},
		{[]string{"help"}, "Usage:"},
		{[]string{"-h"}, "mcp-quota init"},
	} {
		out, errOut, err := runCmd(t, nil, tt.args...)
		if err != nil || !strings.Contains(out, tt.want) || errOut != "" {
			t.Errorf("%v: err %v, stdout %q, stderr %q; want exit 0 and %q on stdout", tt.args, err, out, errOut, tt.want)
		}
	}
	out, errOut, err := runCmd(t, nil, "status", "--nope")
	if !errors.Is(err, errUsage) || out != "" || !strings.Contains(errOut, "flag provided but not defined: -nope") || !strings.Contains(errOut, "-json") {
		t.Errorf("status --nope: err %v, stdout %q, stderr %q; want the usage on stderr and a failure", err, out, errOut)
	}
}

// TestExplicitConfigMustExist: a --config or MCP_QUOTA_CONFIG naming a
// missing file is an error naming the path and where it came from; only
// the default location may be absent.
func TestExplicitConfigMustExist(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "nope.toml")
	state := filepath.Join(dir, "state.db")
	_, _, err := runCmd(t, nil, "status", "--config", missing, "--state", state)
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "--config") || !strings.Contains(err.Error(), "mcp-quota init") {
		t.Errorf("status --config missing: %v; want an error naming the path, --config and init", err)
	}
	env := func(k string) string {
		return map[string]string{"MCP_QUOTA_CONFIG": missing, "MCP_QUOTA_STATE": state}[k]
	}
	_, _, err = runCmd(t, env, "status")
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "MCP_QUOTA_CONFIG") {
		t.Errorf("status with MCP_QUOTA_CONFIG missing: %v; want an error naming the path and the variable", err)
	}
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "config-home"))
	out, _, err := runCmd(t, nil, "status", "--state", state)
	if err != nil || !strings.Contains(out, "no keys are configured") {
		t.Errorf("status with no configuration at the default place: %q, %v; want it to say there are no keys", out, err)
	}
}

// TestStateURLRefused: a state URL of a scheme with no back end, or a
// PostgreSQL URL with a password in it, is refused before anything is
// made, naming where it came from and hiding the password.
func TestStateURLRefused(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	configs := t.TempDir()
	withPassword := filepath.Join(configs, "config.toml")
	if err := os.WriteFile(withPassword, []byte("# the shared state\nstate = \"postgres://mcp:hunter2@db.example/quota\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		args   []string
		env    map[string]string
		source string
		says   string
	}{
		{"flag", []string{"status", "--state", "postgres://mcp:hunter2@db.example/quota"}, nil, "--state", "carries a password"},
		{"variable", []string{"stdio"}, map[string]string{"MCP_QUOTA_STATE": "postgresql://mcp:hunter2@db.example/quota"}, "MCP_QUOTA_STATE", "carries a password"},
		{"in the query", []string{"activity", "--state", "postgres://db.example/quota?password=hunter2"}, nil, "--state", "PGPASSWORD"},
		{"other scheme", []string{"activity", "--state", "s3://bucket/state.db"}, nil, "--state", "no state back end for s3://"},
		{"keyword/value", []string{"activity", "--state", "host=127.0.0.1 port=15432 user=mq password=hunter2 dbname=mq"}, nil,
			"--state", "carries a password"},
		{"keyword/value in the variable", []string{"status"}, map[string]string{"MCP_QUOTA_STATE": "dbname=mq password='hunter2 x'"},
			"MCP_QUOTA_STATE", "PGPASSWORD"},
		{"config file", []string{"status", "--config", withPassword}, nil, withPassword + ":2: state", "carries a password"},
		{"config file, served", []string{"serve", "--config", withPassword}, nil, withPassword + ":2: state", "PGPASSWORD"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"XDG_STATE_HOME": dir}
			maps.Copy(env, tt.env)
			out, errOut, err := runCmd(t, func(k string) string { return env[k] }, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.source) || !strings.Contains(err.Error(), tt.says) ||
				strings.Contains(err.Error(), "hunter2") {
				t.Errorf("%v: %v; want a refusal naming %s that says %q, without the password", tt.args, err, tt.source, tt.says)
			}
			if strings.Contains(out+errOut, "hunter2") {
				t.Errorf("%v printed the password: stdout %q, stderr %q", tt.args, out, errOut)
			}
		})
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a refused URL left %v behind", entries)
	}
}

// TestStateFileErrors: a state file that cannot be used is said in words,
// with how to point elsewhere.
func TestStateFileErrors(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(config, []byte(openKeyConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	corrupt := filepath.Join(dir, "corrupt.db")
	if err := os.WriteFile(corrupt, []byte(strings.Repeat("not a database\n", 100)), 0o600); err != nil {
		t.Fatal(err)
	}
	aFile := filepath.Join(dir, "a-file")
	if err := os.WriteFile(aFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	aDir := filepath.Join(dir, "a-dir.db")
	if err := os.Mkdir(aDir, 0o700); err != nil {
		t.Fatal(err)
	}
	newer := filepath.Join(dir, "newer.db")
	newerVersion := writeNewerState(t, newer)
	tests := []struct {
		name, state, says string
	}{
		{"corrupt", corrupt, "is not an SQLite database (it is damaged, or another kind of file): move it away to start afresh"},
		{"newer", newer, "was written by a newer mcp-quota, and is left as it is: run the newer mcp-quota"},
		{"under a file", filepath.Join(aFile, "state.db"), "cannot be created: " + aFile + " is a file, not a directory"},
		{"a directory", aDir, "is a directory, not a file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, cmd := range []string{"status", "activity"} {
				_, _, err := runCmd(t, nil, cmd, "--config", config, "--state", tt.state)
				if err == nil || !strings.Contains(err.Error(), "the state file "+tt.state+" "+tt.says) ||
					!strings.Contains(err.Error(), "--state PATH or MCP_QUOTA_STATE") {
					t.Errorf("%s --state %s: %v\nwant it to say %q and how to point elsewhere", cmd, tt.state, err, tt.says)
				}
			}
		})
	}
	if v := userVersion(t, newer); v != newerVersion {
		t.Errorf("the newer file's schema version is %d after the refusals, want %d: it was written to", v, newerVersion)
	}
}

// writeNewerState makes a state file at path as a later mcp-quota would
// leave it: this version's schema, with a higher version number.
func writeNewerState(t *testing.T, path string) int {
	t.Helper()
	db, err := state.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	v := userVersion(t, path) + 1
	conn, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Exec(fmt.Sprintf("PRAGMA user_version = %d", v)); err != nil {
		t.Fatal(err)
	}
	return v
}

func userVersion(t *testing.T, path string) int {
	t.Helper()
	conn, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var v int
	if err := conn.QueryRow("PRAGMA user_version").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestStdioWithoutState: under stdio a state file that cannot be used
// does not end the process: it answers initialize, lists the tools, and
// every call is an isError result with the sentence, the code
// stateUnavailable and no structuredContent.
func TestStdioWithoutState(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	if err := os.WriteFile(s.state, []byte(strings.Repeat("garbage!", 512)), 0o600); err != nil {
		t.Fatal(err)
	}
	sess := s.stdioSession(t, nil)
	list, err := sess.ListTools(t.Context(), nil)
	if err != nil || len(list.Tools) != 2 {
		t.Fatalf("tools/list: %v, %v; want fetch and quota_status", list, err)
	}
	for tool, args := range map[string]map[string]any{"fetch": {"path": "/v1/participants"}, "quota_status": {}} {
		res, err := sess.CallTool(t.Context(), &gomcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		if !res.IsError || res.StructuredContent != nil || !strings.Contains(text(res), "The state file "+s.state+" is not an SQLite database") ||
			!strings.Contains(text(res), "MCP_QUOTA_STATE") {
			t.Errorf("%s: isError %v, structured %v, text %q; want the state file's problem", tool, res.IsError, res.StructuredContent, text(res))
		}
		code, _ := res.Meta["mcp-quota/error"].(map[string]any)
		if code["code"] != "stateUnavailable" {
			t.Errorf("%s: _meta %v; want code stateUnavailable", tool, res.Meta)
		}
	}
}

// TestInit: init writes a commented configuration that loads, and never
// overwrites one; examples/config.toml is the same file.
func TestInit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "config.toml")
	out, _, err := runCmd(t, nil, "init", "--config", path)
	if err != nil || !strings.Contains(out, "wrote "+path) {
		t.Fatalf("init: %q, %v", out, err)
	}
	s, err := keystore.Load(path, keystore.Env{Getenv: noEnv})
	if err != nil {
		t.Fatalf("the written configuration does not load: %v", err)
	}
	if got := s.KeyNames(); !cmp.Equal(got, []string{"example"}) {
		t.Errorf("keys = %v, want [example]", got)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	if err := os.WriteFile(path, []byte("# mine\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err = runCmd(t, nil, "init", "--config", path)
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("init over a file: %v; want a refusal", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "# mine\n" {
		t.Errorf("init overwrote the file: %q", b)
	}
	example, err := os.ReadFile("../../examples/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(starterConfig, string(example)); diff != "" {
		t.Errorf("examples/config.toml is not what init writes (-init +example):\n%s", diff)
	}
	if _, err := keystore.Load("../../examples/config.toml", keystore.Env{Getenv: noEnv}); err != nil {
		t.Errorf("examples/config.toml: %v", err)
	}
}

// TestListenErrors: an address in use names the flag that changes it; a
// non-loopback address without callers is refused before binding, as
// typed.
func TestListenErrors(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	_, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	_, _, err = runCmd(t, s.getenv, "serve", "--listen", busy.Addr().String(), "--config", s.config, "--state", s.state)
	if err == nil || !strings.Contains(err.Error(), "cannot listen on "+busy.Addr().String()+": the address is already in use") ||
		!strings.Contains(err.Error(), "--listen HOST:PORT") {
		t.Errorf("serve on a busy address: %v; want it to say so and name --listen", err)
	}
	_, _, err = runCmd(t, nil, "demo-upstream", "--listen", busy.Addr().String())
	if err == nil || !strings.Contains(err.Error(), "already in use") || !strings.Contains(err.Error(), "--listen") {
		t.Errorf("demo-upstream on a busy address: %v", err)
	}
	_, _, err = runCmd(t, nil, "serve", "--demo", "--demo-listen", busy.Addr().String(), "--state", filepath.Join(t.TempDir(), "state.db"))
	if err == nil || !strings.Contains(err.Error(), "already in use") || !strings.Contains(err.Error(), "--demo-listen") {
		t.Errorf("serve --demo with a busy --demo-listen: %v", err)
	}

	open := filepath.Join(t.TempDir(), "open.toml")
	if err := os.WriteFile(open, []byte(openKeyConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{":" + port(busy), "0.0.0.0:" + port(busy)} {
		_, _, err = runCmd(t, nil, "serve", "--listen", addr, "--config", open, "--state", filepath.Join(t.TempDir(), "state.db"))
		if err == nil || !strings.Contains(err.Error(), "refusing to listen on "+addr+" without caller tokens") {
			t.Errorf("serve --listen %s (busy, no callers): %v; want the refusal, naming %s as typed, before binding", addr, err, addr)
		}
	}
}

func port(ln net.Listener) string {
	_, p, _ := net.SplitHostPort(ln.Addr().String())
	return p
}

func decode(t *testing.T, resp *http.Response, v any) {
	t.Helper()
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("%s: %v", resp.Request.URL, err)
	}
}

// TestOneShotCommandsNeedNoCallerTokens: status and activity authenticate
// no caller, so an unset caller token variable does not stop them, and
// they log nothing that their own output does not already say (status
// shows a key without a credential in its table, and its error names it:
// TestStatusFailsOnAnUnusableKey).
func TestOneShotCommandsNeedNoCallerTokens(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	onlyKeySecret := func(name string) string { // the callers' token variables are unset
		if name == "DEMO_SECRET" {
			return upstreamSecret
		}
		return ""
	}
	out, errOut, err := runCmd(t, onlyKeySecret, "status", "--config", s.config, "--state", s.state)
	if err != nil || !strings.Contains(out, "demo") {
		t.Errorf("status with the callers' tokens unset: %v\n%s", err, out)
	}
	if errOut != "" {
		t.Errorf("status logged: %s", errOut)
	}
	out, errOut, err = runCmd(t, noEnv, "status", "--config", s.config, "--state", s.state)
	if err == nil || !strings.Contains(out, "demo: credential:") || errOut != "" {
		t.Errorf("status without the key's secret: %v; logged %q, want the table to say it, nothing logged, and an error", err, errOut)
	}
	_, errOut, err = runCmd(t, func(name string) string {
		if name == "XDG_CONFIG_HOME" {
			return t.TempDir()
		}
		return ""
	}, "activity", "--state", s.state)
	if err != nil || errOut != "" {
		t.Errorf("activity with no configuration file: %v; logged %q, want nothing", err, errOut)
	}
	// serve still needs the tokens of the callers it authenticates.
	_, _, err = runCmd(t, onlyKeySecret, "serve", "--listen", "127.0.0.1:0", "--config", s.config, "--state", s.state)
	if err == nil || !strings.Contains(err.Error(), "AGENT_TOKEN is not set") {
		t.Errorf("serve with the callers' tokens unset: %v; want the configuration refused", err)
	}
}

// TestDidYouMean: a misspelt command or flag is answered with the likely
// one.
func TestDidYouMean(t *testing.T) {
	tests := []struct {
		args []string
		says string
	}{
		{[]string{"sever"}, `unknown command "sever": did you mean serve?`},
		{[]string{"stauts"}, "did you mean status?"},
		{[]string{"serve", "--lsiten", "127.0.0.1:0"}, "unknown flag -lsiten: did you mean --listen?"},
		{[]string{"stdio", "-confg=x.toml"}, "unknown flag -confg: did you mean --config?"},
	}
	for _, tt := range tests {
		_, errOut, err := runCmd(t, nil, tt.args...)
		if err == nil || !strings.Contains(errOut, tt.says) {
			t.Errorf("%v: %v, stderr %q; want it to say %q", tt.args, err, errOut, tt.says)
		}
	}
	if _, errOut, _ := runCmd(t, nil, "serve", "--zzzzzzzz"); strings.Contains(errOut, "did you mean") {
		t.Errorf("a flag like no other got a suggestion: %q", errOut)
	}
}

// TestCommandsDocListsEveryFlag: docs/commands.md's line for each command
// names every flag its -h prints, and no flag it does not have.
func TestCommandsDocListsEveryFlag(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "commands.md"))
	if err != nil {
		t.Fatal(err)
	}
	flagName := regexp.MustCompile(`(?m)^  -([a-z-]+)`)
	docFlag := regexp.MustCompile(`--([a-z-]+)`)
	for _, cmd := range []string{"serve", "stdio", "status", "activity", "demo-upstream", "init"} {
		out, _, err := runCmd(t, nil, cmd, "-h")
		if err != nil {
			t.Fatalf("%s -h: %v", cmd, err)
		}
		has := map[string]bool{}
		for _, m := range flagName.FindAllStringSubmatch(out, -1) {
			has[m[1]] = true
		}
		var line string
		for l := range strings.Lines(string(doc)) {
			if strings.HasPrefix(l, "mcp-quota "+cmd+" ") {
				line, _, _ = strings.Cut(l, "#") // the comment after the flags
				break
			}
		}
		if line == "" || len(has) == 0 {
			t.Errorf("%s: no line in docs/commands.md, or no flags in its -h (%d)", cmd, len(has))
			continue
		}
		documented := map[string]bool{}
		for _, m := range docFlag.FindAllStringSubmatch(line, -1) {
			documented[m[1]] = true
			if !has[m[1]] {
				t.Errorf("docs/commands.md lists --%s for %s, which has no such flag", m[1], cmd)
			}
		}
		for name := range has {
			if !documented[name] {
				t.Errorf("%s -h has -%s, which docs/commands.md does not list", cmd, name)
			}
		}
	}
}

// TestStatusFailsOnAnUnusableKey: status after init, with the key's
// credential variable unset, shows the key and why, and exits with an
// error naming it (the check init tells you to run); with the variable
// set it passes. As JSON too.
func TestStatusFailsOnAnUnusableKey(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "config.toml")
	if _, _, err := runCmd(t, nil, "init", "--config", config); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state.db")
	for _, asJSON := range []bool{false, true} {
		args := []string{"status", "--config", config, "--state", state}
		if asJSON {
			args = append(args, "--json")
		}
		out, _, err := runCmd(t, nil, args...)
		if err == nil || !strings.Contains(err.Error(), "cannot be used") || !strings.Contains(err.Error(), "example") ||
			!strings.Contains(out, "EXAMPLE_API_KEY is not set") {
			t.Errorf("%v without the credential: err %v, stdout %q; want the key shown with why, and an error naming it", args, err, out)
		}
		withKey := func(name string) string {
			if name == "EXAMPLE_API_KEY" {
				return "a-secret-for-the-test"
			}
			return ""
		}
		if out, _, err := runCmd(t, withKey, args...); err != nil || !strings.Contains(out, "example") {
			t.Errorf("%v with the credential: err %v, stdout %q; want the key and no error", args, err, out)
		}
	}
}

// TestStatusWithoutKeysNamesTheDemosConfig: status finding no keys beside
// a demo's files says where the demo's key is, with a command to run.
func TestStatusWithoutKeysNamesTheDemosConfig(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir()) // no configuration at the default path
	dir := t.TempDir()
	state := filepath.Join(dir, "state.db")
	out, _, err := runCmd(t, nil, "status", "--state", state)
	if err != nil || !strings.Contains(out, "no keys are configured") || strings.Contains(out, "demo") {
		t.Errorf("status with no demo: err %v, stdout %q; want no keys and no hint", err, out)
	}
	d := startDemoServe(t, dir)
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	out, _, err = runCmd(t, nil, "status", "--state", state)
	want := "mcp-quota status --config " + shellQuote(filepath.Join(dir, "demo", "config.toml")) + " --state " + shellQuote(state)
	if err != nil || !strings.Contains(out, want) {
		t.Errorf("status beside a demo's files: err %v, stdout %q; want %q", err, out, want)
	}
}
