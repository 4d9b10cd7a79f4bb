package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestActivityOfAnUnknownKey reads the activity resource of a key the
// agent cannot use, through serve, with the official go-sdk client: the
// error is a missing resource (not an internal error) that names the
// agent's own keys and the one a misspelling meant, and never a key of
// another caller's.
func TestActivityOfAnUnknownKey(t *testing.T) {
	var cfg testkit.Config
	for _, name := range []string{"github", "openai", "billing"} {
		cfg.Keys = append(cfg.Keys, testkit.Key{Name: name, BaseURL: "https://api.example.com/", SecretEnv: "DEMO_SECRET"})
	}
	cfg.Callers = []testkit.Caller{
		{Name: "agent", TokenEnv: "AGENT_TOKEN", Keys: []string{"github", "openai"}},
		{Name: "sync", TokenEnv: "SYNC_TOKEN", Keys: []string{"billing"}},
	}
	s := setupOf(t, cfg)
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
