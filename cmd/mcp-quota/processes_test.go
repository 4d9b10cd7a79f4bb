package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/state"
)

// TestTwoProcessesShareOneBudget runs a stdio agent and a serve instance
// taking REST calls as two processes on one key and one state file, and
// drives 300 calls through them within two windows: the upstream must
// receive no more than the quota in any window and answer no 429, and
// every local refusal must be in the activity with caller, time and reason.
func TestTwoProcessesShareOneBudget(t *testing.T) {
	const (
		quota  = 120
		window = 4 * time.Second
		calls  = 300
	)
	api, url := upstreamAPI(t, demo.Config{Quota: quota, Window: window})
	s := newSetup(t, url, `name = "default"
  quota = 120
  window = "4s"`, "max_rate = 1000\nmax_concurrency = 8")

	// The serve process.
	cmd, stderr := s.command(t, "serve", "--listen", "127.0.0.1:0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	base := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		re := regexp.MustCompile(`(http://127\.0\.0\.1:\d+)/mcp`)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				base <- m[1]
			}
		}
	}()
	var rest string
	select {
	case rest = <-base:
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not start:\n%s", stderr.String())
	}

	// The stdio agent process.
	agent := s.stdioSession(t, nil)

	var sent, refusedREST, refusedMCP, accepted atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	// Every call asks for another participant: identical requests would
	// meet the agent's loop guard and its conditional requests instead.
	worker := func(do func(n int64) (ok bool)) {
		defer wg.Done()
		for n := sent.Add(1); n <= calls; n = sent.Add(1) {
			if do(n) {
				accepted.Add(1)
			}
		}
	}
	restCall := func(n int64) bool {
		resp := get(t, fmt.Sprintf("%s/k/demo/v1/participants/p-%06d", rest, n), syncToken, "Prefer", "wait=1")
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		switch resp.StatusCode {
		case http.StatusOK:
			return true
		case http.StatusTooManyRequests:
			var p struct{ Code string }
			json.Unmarshal(body, &p)
			if p.Code != "rateLimited" || resp.Header.Get("Retry-After") == "" || resp.Header.Get("RateLimit") == "" || resp.Header.Get("X-RateLimit-Remaining") == "" {
				t.Errorf("local refusal without problem code, Retry-After or both header forms: %v %s", resp.Header, body)
			}
			refusedREST.Add(1)
			return false
		}
		t.Errorf("REST status %d: %s", resp.StatusCode, body)
		return false
	}
	mcpCall := func(n int64) bool {
		res, err := agent.CallTool(context.Background(), &gomcp.CallToolParams{Name: "fetch",
			Arguments: map[string]any{"path": fmt.Sprintf("/v1/participants/p-%06d", n), "max_wait_s": 1}})
		if err != nil {
			t.Errorf("fetch: %v", err)
			return false
		}
		st := structured(t, res)
		if res.IsError {
			if a, _ := st["advice"].(map[string]any); a == nil || a["action"] != "pause" || st["sent"] != false {
				t.Errorf("fetch error that is not a pause: %s", text(res))
			}
			refusedMCP.Add(1)
			return false
		}
		return st["status"] == float64(200)
	}
	for range 4 {
		wg.Add(2)
		go worker(restCall)
		go worker(mcpCall)
	}
	wg.Wait()
	elapsed := time.Since(start)

	stats := api.Stats(upstreamSecret)
	t.Logf("%d calls in %v: %d accepted, %d refused locally over REST, %d over MCP; upstream accepted %d, most in a %v window %d",
		calls, elapsed.Round(time.Millisecond), accepted.Load(), refusedREST.Load(), refusedMCP.Load(),
		len(stats.Accepted), window, stats.MaxInWindow(window))
	if stats.Rejected != 0 {
		t.Errorf("the upstream refused %d calls with 429; want 0", stats.Rejected)
	}
	if got := stats.MaxInWindow(window); got > quota {
		t.Errorf("the upstream received %d calls in one %v window; want at most %d", got, window, quota)
	}
	if int64(len(stats.Accepted)) != accepted.Load() {
		t.Errorf("the upstream accepted %d calls, the callers saw %d accepted", len(stats.Accepted), accepted.Load())
	}
	refused := refusedREST.Load() + refusedMCP.Load()
	if accepted.Load()+refused != calls {
		t.Errorf("%d accepted + %d refused != %d calls", accepted.Load(), refused, calls)
	}
	if refused == 0 || refusedREST.Load() == 0 || refusedMCP.Load() == 0 {
		t.Errorf("refused over REST %d, over MCP %d: 300 calls in two windows of 120 must be refused on both sides",
			refusedREST.Load(), refusedMCP.Load())
	}

	// Every local refusal is in the activity, with caller, time and reason.
	db, err := state.Open(t.Context(), s.state)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var list []state.Attempt
	if err := db.View(t.Context(), func(tx *state.Tx) error {
		var err error
		list, err = tx.Activity(state.ActivityFilter{Key: "demo", Limit: 10000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	byCaller := map[string]int64{}
	for _, a := range list {
		if a.State != state.RejectedLocal {
			continue
		}
		byCaller[a.Caller]++
		if a.Reason == "" || a.At.Before(start.Add(-time.Second)) || a.At.After(start.Add(elapsed+time.Second)) {
			t.Errorf("refusal without reason or with a wrong time: %+v", a)
		}
	}
	if byCaller["sync"] != refusedREST.Load() || byCaller["agent"] != refusedMCP.Load() {
		t.Errorf("activity has refusals %v; callers saw sync %d, agent %d", byCaller, refusedREST.Load(), refusedMCP.Load())
	}
}
