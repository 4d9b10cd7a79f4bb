package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestActivityOfAnUnknownKey reads the activity resource of a key the
// agent cannot use, through serve, with the official go-sdk client: the
// error is a missing resource (not an internal error) that names the
// agent's own keys and the one a misspelling meant, and never a key of
// another caller's.
func TestActivityOfAnUnknownKey(t *testing.T) {
	dir := t.TempDir()
	s := &setup{dir: dir, config: filepath.Join(dir, "config.toml"), state: filepath.Join(dir, "state.db"),
		env: []string{"DEMO_SECRET=" + upstreamSecret, "AGENT_TOKEN=" + agentToken, "SYNC_TOKEN=" + syncToken}}
	var cfg strings.Builder
	for _, name := range []string{"github", "openai", "billing"} {
		fmt.Fprintf(&cfg, "[[keys]]\nname = %q\nbase_url = \"https://api.example.com/\"\nsecret_env = \"DEMO_SECRET\"\n\n", name)
	}
	cfg.WriteString("[[callers]]\nname = \"agent\"\ntoken_env = \"AGENT_TOKEN\"\nkeys = [\"github\", \"openai\"]\n\n")
	cfg.WriteString("[[callers]]\nname = \"sync\"\ntoken_env = \"SYNC_TOKEN\"\nkeys = [\"billing\"]\n")
	if err := os.WriteFile(s.config, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	base, _ := s.serve(t)
	agent := httpSession(t, base, agentToken, nil)

	for _, tt := range []struct {
		uri  string
		want string
	}{
		{"quota://activity/githbu", "no key of yours has this name. Did you mean quota://activity/github? Your keys: github, openai; read quota://activity/KEY with one of them"},
		{"quota://activity/nope", "no key of yours has this name. Your keys: github, openai; read quota://activity/KEY with one of them"},
		{"quota://activity/billing", "no key of yours has this name. Your keys: github, openai; read quota://activity/KEY with one of them"},
	} {
		res, err := agent.ReadResource(t.Context(), &gomcp.ReadResourceParams{URI: tt.uri})
		var werr *jsonrpc.Error
		if !errors.As(err, &werr) {
			t.Fatalf("read %s: %v, %v; want a JSON-RPC error", tt.uri, res, err)
		}
		// A missing resource: -32002, or -32602 from revision 2026-07-28 on.
		if (werr.Code != -32002 && werr.Code != jsonrpc.CodeInvalidParams) || !strings.Contains(werr.Message, tt.want) {
			t.Errorf("read %s: %d %q; want a missing resource saying %q", tt.uri, werr.Code, werr.Message, tt.want)
		}
		if strings.Contains(strings.TrimPrefix(werr.Message, "handler not found for resource URI '"+tt.uri), "billing") {
			t.Errorf("read %s: %q names another caller's key", tt.uri, werr.Message)
		}
	}
	if _, err := agent.ReadResource(t.Context(), &gomcp.ReadResourceParams{URI: "quota://activity/github"}); err != nil {
		t.Errorf("the agent's own key: %v", err)
	}
}
