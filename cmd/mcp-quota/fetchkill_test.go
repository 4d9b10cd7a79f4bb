package main

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
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
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	journals, _ := filepath.Glob(s.state + ".outcomes/*.log")

	db, err := state.Open(t.Context(), s.state) // it records what the journal holds
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var sends []ledger.Send
	var obs []ledger.ObservationRecord
	kept := 0
	if err := db.View(t.Context(), func(tx ledger.Tx) error {
		var err error
		if sends, err = tx.Sends("demo", time.Time{}, 10*calls); err != nil {
			return err
		}
		if obs, err = tx.(*state.Tx).Observations("demo", 10*calls); err != nil {
			return err
		}
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
	byState := checkConfirmedObserved(t, sends, obs, calls)
	if kept != min(calls, 32) { // the fetch tool keeps 32 answers a key
		t.Errorf("after SIGKILL %d answers are kept; want %d, the latest", kept, min(calls, 32))
	}
	t.Logf("%d journal file(s) left by the killed process; the log after recovery: %v", len(journals), byState)
}
