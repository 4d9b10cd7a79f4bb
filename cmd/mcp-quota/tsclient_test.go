package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// tsClient is the official TypeScript SDK client pinned in
// testdata/tsclient (installed there by `npm ci`, as .ci/run does). It
// skips the test when node or the installed client is missing, unless
// CI is set: there it must run.
func tsClient(t *testing.T) (node, script string) {
	t.Helper()
	testkit.SkipShort(t, "runs the TypeScript client on Node.js")
	dir, err := filepath.Abs("../../testdata/tsclient")
	if err != nil {
		t.Fatal(err)
	}
	node, err = exec.LookPath("node")
	missing := ""
	switch {
	case err != nil:
		missing = "node is not installed"
	case !exists(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")):
		missing = "the TypeScript SDK client is not installed: run `npm ci --prefix testdata/tsclient`"
	}
	if missing != "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and %s", missing)
		}
		t.Skip(missing)
	}
	return node, filepath.Join(dir, "client.mjs")
}

// tsCall is one call the TypeScript client makes, and what it must hand
// back: an isError result with the code and a sentence that says says
// (code "" for a pause, which keeps the schema's full shape).
type tsCall struct {
	Name string         `json:"name"`
	Tool string         `json:"tool"`
	Args map[string]any `json:"args"`
	code string
	says string
}

type tsAnswer struct {
	Name          string  `json:"name"`
	IsError       bool    `json:"isError"`
	Text          string  `json:"text"`
	Code          string  `json:"code"`
	Structured    bool    `json:"structured"`
	ProtocolError *string `json:"protocolError"`
}

// runTSClient makes calls with the TypeScript client; env says where the
// server is (MCP_URL and MCP_TOKEN, or MCP_COMMAND).
func runTSClient(t *testing.T, s *setup, calls []tsCall, env ...string) []tsAnswer {
	t.Helper()
	node, script := tsClient(t)
	file := filepath.Join(t.TempDir(), "calls.json")
	raw, err := json.Marshal(calls)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), node, script, file)
	cmd.Env = append(append(os.Environ(), s.env...), env...)
	var stderr testkit.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("TypeScript client: %v\nstderr:\n%s", err, stderr.String())
	}
	var got struct {
		Tools   []string   `json:"tools"`
		Answers []tsAnswer `json:"answers"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("TypeScript client printed %q: %v", out, err)
	}
	if len(got.Tools) < 2 || len(got.Answers) != len(calls) {
		t.Fatalf("TypeScript client listed %v and answered %d of %d calls", got.Tools, len(got.Answers), len(calls))
	}
	if strings.Contains(string(out)+stderr.String(), upstreamSecret) {
		t.Error("the TypeScript client was handed the upstream secret")
	}
	return got.Answers
}

// TestTypeScriptClientSeesEveryError: the official TypeScript SDK client,
// which validates each result against the tool's outputSchema once it has
// listed the tools, hands every error mcp-quota gives to the assistant as
// an isError result with its sentence and code — never as the protocol
// error -32602 that hid them before — over stdio and over HTTP.
func TestTypeScriptClientSeesEveryError(t *testing.T) {
	t.Parallel()
	tsClient(t)
	_, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute), noSecretKey(url),
		testkit.Key{Name: "gone", BaseURL: "http://127.0.0.1:1", SecretEnv: "DEMO_SECRET"},
		testkit.Key{Name: "metadata", BaseURL: "http://169.254.169.254", SecretEnv: "DEMO_SECRET"},
		tinyKey(url))
	common := []tsCall{
		{Name: "unknown key", Tool: "fetch", Args: map[string]any{"key": "nope", "path": "/"}, code: "unknownKey", says: "nope"},
		{Name: "dot-dot path", Tool: "fetch", Args: map[string]any{"key": "demo", "path": "/v1/../../etc/passwd"}, code: "badPath", says: "'..'"},
		{Name: "absolute URL", Tool: "fetch", Args: map[string]any{"key": "demo", "path": "http://169.254.169.254/latest"}, code: "badPath", says: "absolute URLs"},
		{Name: "missing path", Tool: "fetch", Args: map[string]any{"key": "demo"}, code: "badArguments", says: "path is required"},
		{Name: "path of the wrong type", Tool: "fetch", Args: map[string]any{"key": "demo", "path": 5}, code: "badArguments", says: "path must be a string"},
		{Name: "negative max_wait_s", Tool: "fetch", Args: map[string]any{"key": "demo", "path": "/", "max_wait_s": -1}, code: "badArguments", says: "max_wait_s"},
		{Name: "method not open", Tool: "fetch", Args: map[string]any{"key": "demo", "path": "/", "method": "DELETE"}, code: "methodNotAllowed", says: "allows only"},
		{Name: "status of an unknown key", Tool: "quota_status", Args: map[string]any{"key": "nope"}, code: "unknownKey", says: "nope"},
		{Name: "status with a bad argument", Tool: "quota_status", Args: map[string]any{"key": 7}, code: "badArguments", says: "key must be a string"},
	}
	local := []tsCall{
		{Name: "no key of several", Tool: "fetch", Args: map[string]any{"path": "/"}, code: "unknownKey", says: "name one of"},
		{Name: "no credential", Tool: "fetch", Args: map[string]any{"key": "nosecret", "path": "/"}, code: "noCredential", says: "UNSET_VARIABLE_FOR_TEST"},
		{Name: "metadata address", Tool: "fetch", Args: map[string]any{"key": "metadata", "path": "/latest"}, code: "forbiddenAddress", says: "metadata"},
		{Name: "unreachable upstream", Tool: "fetch", Args: map[string]any{"key": "gone", "path": "/"}, code: "upstreamUnavailable", says: "unreachable"},
		{Name: "the only call of tiny", Tool: "fetch", Args: map[string]any{"key": "tiny", "path": "/v1/participants/p-000001"}},
		{Name: "tiny paused", Tool: "fetch", Args: map[string]any{"key": "tiny", "path": "/v1/participants/p-000002", "max_wait_s": 0}, says: "max_wait_s"},
	}
	check := func(t *testing.T, calls []tsCall, answers []tsAnswer) {
		t.Helper()
		for i, c := range calls {
			a := answers[i]
			if a.ProtocolError != nil {
				t.Errorf("%s: the client threw %q instead of handing over the result", c.Name, *a.ProtocolError)
				continue
			}
			if c.says == "" { // a plain success
				if a.IsError {
					t.Errorf("%s: isError: %s", c.Name, a.Text)
				}
				continue
			}
			if !a.IsError || a.Code != c.code || !strings.Contains(a.Text, c.says) {
				t.Errorf("%s: got isError=%v code=%q text %q; want isError, code %q, a sentence saying %q",
					c.Name, a.IsError, a.Code, a.Text, c.code, c.says)
			}
			if c.code != "" && a.Structured {
				t.Errorf("%s: an error result carries structuredContent", c.Name)
			}
		}
	}
	t.Run("stdio", func(t *testing.T) {
		command, _ := json.Marshal([]string{binary(t), "stdio", "--config", s.config, "--state", s.state})
		calls := append(append([]tsCall{}, common...), local...)
		check(t, calls, runTSClient(t, s, calls, "MCP_COMMAND="+string(command)))
	})
	t.Run("stdio with a state file it cannot use", func(t *testing.T) {
		dir := t.TempDir() // a directory where the state file should be
		command, _ := json.Marshal([]string{binary(t), "stdio", "--config", s.config, "--state", dir})
		calls := []tsCall{
			{Name: "fetch", Tool: "fetch", Args: map[string]any{"key": "demo", "path": "/"}, code: "stateUnavailable", says: "is a directory"},
			{Name: "quota_status", Tool: "quota_status", Args: map[string]any{}, code: "stateUnavailable", says: "--state"},
		}
		check(t, calls, runTSClient(t, s, calls, "MCP_COMMAND="+string(command)))
	})
	t.Run("http", func(t *testing.T) {
		base, _ := s.serve(t)
		calls := append(append([]tsCall{}, common...),
			tsCall{Name: "no key, one of the caller's own", Tool: "fetch", Args: map[string]any{"path": "/"}, code: "unknownKey", says: `key="demo" is the one you may use`},
			tsCall{Name: "another caller's key, answered as an unknown one", Tool: "fetch", Args: map[string]any{"key": "tiny", "path": "/"}, code: "unknownKey", says: `key "tiny"`},
			tsCall{Name: "status of another caller's key, answered as an unknown one", Tool: "quota_status", Args: map[string]any{"key": "tiny"}, code: "unknownKey", says: `key "tiny"`},
			tsCall{Name: "a call of its own key", Tool: "fetch", Args: map[string]any{"key": "demo", "path": "/v1/participants?limit=5"}})
		check(t, calls, runTSClient(t, s, calls, "MCP_URL="+base+"/mcp", "MCP_TOKEN="+agentToken))
	})
}
