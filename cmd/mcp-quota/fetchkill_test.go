package main

import (
	"fmt"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// TestServeKilledLosesNoFetch has an agent call fetch through a `serve`
// process, one call after another, each on a URL of its own and answered
// 200 at once, then kills the process with SIGKILL the moment the last
// result arrives: the next process to open the state file finds every
// call the agent was answered, confirmed, with its answer's observation,
// and every answer kept for the next request of its URL. Outcomes and
// kept answers went through the process's journal.
func TestServeKilledLosesNoFetch(t *testing.T) {
	const calls = 60
	_, url := upstreamAPI(t, demo.Config{Quota: 1_000_000, Window: time.Hour})
	key := demoKey(url, 1000000, time.Hour)
	key.MaxRate, key.MaxConcurrency = 1000000, 1000
	s := newSetup(t, key)
	cmd, base, _ := s.serveProcess(t)
	session := httpSession(t, base, agentToken, nil)
	target := func(n int) string { return fmt.Sprintf("/v1/echo?n=%d", n) }
	for n := range calls {
		res, err := session.CallTool(t.Context(), &gomcp.CallToolParams{Name: "fetch", Arguments: map[string]any{"path": target(n)}})
		if err != nil {
			t.Fatal(err)
		}
		if res.IsError {
			t.Fatalf("fetch %d: %s", n, text(res))
		}
	}
	db := killAndRecover(t, cmd, s.state, calls)
	kept := 0
	if err := db.View(t.Context(), func(tx ledger.ReadTx) error {
		for n := range calls {
			_, ok, err := tx.Response("demo", target(n))
			if err != nil {
				return err
			}
			if ok {
				kept++
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if kept != min(calls, 32) { // the fetch tool keeps 32 answers a key
		t.Errorf("after SIGKILL %d answers are kept; want %d, the latest", kept, min(calls, 32))
	}
}
