package main

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// TestServeLeavesNoGoroutine: once serve has returned, no goroutine it
// started (the sweep, the configuration reloader, the pacer's timers, the
// state's work) is left, after calls over MCP and REST and a reload.
func TestServeLeavesNoGoroutine(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	base, logs, stop := startServe(t, s.getenv, "--config", s.config, "--state", s.state)
	sess := httpSession(t, base, agentToken, nil)
	res, err := sess.CallTool(context.Background(), &gomcp.CallToolParams{Name: "fetch", Arguments: map[string]any{"key": "demo", "path": "/items"}})
	if err != nil || res.IsError {
		t.Fatalf("fetch: %v %+v", err, res)
	}
	sess.Close()
	resp := get(t, base+"/k/demo/items", syncToken)
	resp.Body.Close()
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil { // a reload
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the reload", func() bool { return strings.Contains(logs.String(), "configuration reloaded") })
	if err := stop(); err != nil {
		t.Fatalf("serve: %v\n%s", err, logs.String())
	}
	if g := testkit.Goroutines("mcp-quota/cmd/mcp-quota.", "mcp-quota/pacer.", "mcp-quota/state.", "mcp-quota/gateway.",
		"mcp-quota/dashboard.", "mcp-quota/metrics.", "mcp-quota/upstream."); g != "" {
		t.Errorf("goroutines left after serve returned:\n%s", g)
	}
}
