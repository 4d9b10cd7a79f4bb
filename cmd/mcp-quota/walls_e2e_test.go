package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/internal/leaktest"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// wallsSecret needs percent-encoding in a query and is changed by form
// encoding and JSON escaping.
const wallsSecret = "zqx+9/8=x&y-e2e-UPSTREAM-5d0b"

// TestWallsEndToEnd runs the real binary — `stdio` as its own process,
// `serve`, and the `activity` and `status` commands — against an
// upstream that repeats its query credential in a Link, a percent-encoded
// field, its body and a redirect that keeps the query, then scans every
// output channel and every file mcp-quota wrote (the state file, its WAL,
// the journals) for the credential in every encoding.
func TestWallsEndToEnd(t *testing.T) {
	leaky := httptest.NewServer(&testkit.LeakyUpstream{})
	t.Cleanup(leaky.Close)
	dir := t.TempDir()
	s := &setup{dir: dir, config: filepath.Join(dir, "config.toml"), state: filepath.Join(dir, "state.db"),
		env: []string{"LEAKY_SECRET=" + wallsSecret, "AGENT_TOKEN=" + agentToken, "SYNC_TOKEN=" + syncToken}}
	cfg := testkit.Config{
		Keys: []testkit.Key{{Name: "leaky", BaseURL: leaky.URL + "/", SecretEnv: "LEAKY_SECRET", Auth: "query:api_key", MaxRate: 1000,
			Policies: testkit.Window(1000, time.Minute)}},
		Callers: []testkit.Caller{
			{Name: "agent", TokenEnv: "AGENT_TOKEN", Keys: []string{"leaky"}},
			{Name: "sync", TokenEnv: "SYNC_TOKEN", Keys: []string{"leaky"}},
		},
	}.TOML()
	if err := os.WriteFile(s.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}

	var out strings.Builder
	record := func(what string, v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(&out, "== %s\n%s\n", what, b)
	}
	fetches := []map[string]any{
		{"key": "leaky", "path": "/v1/items?limit=5"},
		{"key": "leaky", "path": "/v1/items?limit=5"}, // conditional, against the kept answer
		{"key": "leaky", "path": "/v1/items?limit=5", "start_index": 5},
		{"key": "leaky", "path": "/slash?limit=5"},
		{"key": "leaky", "path": "/gz?limit=5", "headers": map[string]any{"Accept-Encoding": "gzip"}},
		{"key": "leaky", "path": "/gz?limit=5", "headers": map[string]any{"Accept-Encoding": "gzip"}}, // against the kept copy
		{"key": "leaky", "path": "/range", "headers": map[string]any{"Range": "bytes=10-17"}},
	}

	// stdio, as its own process.
	cmd, stdioErr := s.command(t, "stdio", "--log-level", "debug")
	client := gomcp.NewClient(&gomcp.Implementation{Name: "walls", Version: "1"}, nil)
	sess, err := client.Connect(t.Context(), &gomcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect over stdio: %v\n%s", err, stdioErr.String())
	}
	for _, args := range fetches {
		res, sc := call(t, sess, "fetch", args)
		record(fmt.Sprintf("stdio fetch %v", args), map[string]any{"structured": sc, "text": text(res)})
	}
	_, sc := call(t, sess, "fetch", fetches[0])
	if next, _ := sc["next"].(map[string]any); next["path"] != "/v1/items?limit=5&page=2" {
		t.Errorf("next %v; want the next page without the credential", sc["next"])
	}
	sess.Close()
	cmd.Wait()
	if !strings.Contains(stdioErr.String(), "level=DEBUG") && !strings.Contains(stdioErr.String(), `"level":"DEBUG"`) {
		t.Logf("stdio logged no debug lines: %q", stdioErr.String())
	}

	// serve: REST and MCP over HTTP.
	base, logs := s.serve(t)
	for _, p := range []string{"/k/leaky/v1/items?limit=5", "/k/leaky/slash?limit=5", "/k/leaky/v1/items?limit=5&page=2"} {
		req, _ := http.NewRequest("GET", base+p, nil)
		req.Header.Set("Authorization", "Bearer "+syncToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Fprintf(&out, "== REST %s\n%s %v\n%s\n", p, resp.Status, resp.Header, b)
	}
	// Compressed and ranged answers: the caller asks for gzip and decodes
	// nothing itself (the scan decodes what it finds); three ranges that
	// would each hold a piece of the key are put back together.
	var pieces strings.Builder
	for _, c := range []struct{ path, field, value string }{{"/k/leaky/gz?limit=5", "Accept-Encoding", "gzip"},
		{"/k/leaky/range", "Range", "bytes=10-17"}, {"/k/leaky/range", "Range", "bytes=18-25"}, {"/k/leaky/range", "Range", "bytes=26-33"}} {
		req, _ := http.NewRequest("GET", base+c.path, nil)
		req.Header.Set("Authorization", "Bearer "+syncToken)
		req.Header.Set(c.field, c.value)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Fprintf(&out, "== REST %s (%s: %s)\n%s %v\n%s\n", c.path, c.field, c.value, resp.Status, resp.Header, b)
		if c.field == "Range" {
			pieces.Write(b)
		}
		if resp.StatusCode != 200 || resp.Header.Get("Content-Encoding") != "" {
			t.Errorf("REST %s with %s: %s: %s, Content-Encoding %q; want 200, whole and decoded", c.path, c.field, c.value, resp.Status, resp.Header.Get("Content-Encoding"))
		}
	}
	hs := httpSession(t, base, agentToken, nil)
	for _, args := range fetches {
		res, sc := call(t, hs, "fetch", args)
		record(fmt.Sprintf("http fetch %v", args), map[string]any{"structured": sc, "text": text(res)})
	}
	for _, p := range []string{"/v1/activity?key=leaky&limit=1000", "/v1/quota"} {
		req, _ := http.NewRequest("GET", base+p, nil)
		req.Header.Set("Authorization", "Bearer "+syncToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Fprintf(&out, "== REST %s\n%s\n", p, b)
	}

	// The CLI's own views of the state file.
	for _, args := range [][]string{{"activity", "--json", "--limit", "1000"}, {"activity"}, {"status"}, {"status", "--json"}} {
		c, stderr := s.command(t, args...)
		b, err := c.Output()
		if err != nil {
			t.Errorf("mcp-quota %v: %v\n%s", args, err, stderr.String())
		}
		fmt.Fprintf(&out, "== mcp-quota %v\n%s\n%s\n", args, b, stderr.String())
	}

	channels := map[string]string{"answers and CLI output": out.String(), "serve log": logs.String(), "stdio stderr": stdioErr.String(),
		"REST ranges, reassembled": pieces.String()}
	maps.Copy(channels, leaktest.StateFiles(t, s.state))
	if !strings.Contains(channels["answers and CLI output"], "/slash/") || !strings.Contains(channels["state file"]+channels["state file-wal"], "/slash/") {
		t.Fatalf("the redirect's attempt is not in the activity and the state file: the scan would prove nothing")
	}
	leaktest.Scan(t, wallsSecret, channels)
}
