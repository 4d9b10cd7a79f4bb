package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// TestTwoProcessesShareOneBudget runs a stdio agent and a serve instance
// taking REST calls as two processes on one key and one state file, and
// drives 300 calls through them within two windows: the upstream must
// receive no more than the quota in any window and answer no 429, and
// every local refusal must be in the activity with caller, time and reason.
func TestTwoProcessesShareOneBudget(t *testing.T) {
	t.Parallel()
	const (
		quota  = 120
		window = 4 * time.Second
		calls  = 300
	)
	api, url := upstreamAPI(t, demo.Config{Quota: quota, Window: window})
	key := demoKey(url, 120, 4*time.Second)
	key.MaxRate, key.MaxConcurrency = 1000, 8
	s := newSetup(t, key)

	// The serve process.
	_, rest, _ := s.serveProcess(t)

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
	var list []ledger.Attempt
	if err := db.View(t.Context(), func(tx ledger.ReadTx) error {
		var err error
		list, err = tx.Activity(ledger.ActivityFilter{Key: "demo", Limit: 10000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	byCaller := map[string]int64{}
	for _, a := range list {
		if a.State != ledger.RejectedLocal {
			continue
		}
		byCaller[a.Caller]++
		if a.Reason.IsZero() || a.At.Before(start.Add(-time.Second)) || a.At.After(start.Add(elapsed+time.Second)) {
			t.Errorf("refusal without reason or with a wrong time: %+v", a)
		}
	}
	if byCaller["sync"] != refusedREST.Load() || byCaller["stdio"] != refusedMCP.Load() {
		t.Errorf("activity has refusals %v; callers saw sync %d, stdio %d", byCaller, refusedREST.Load(), refusedMCP.Load())
	}
}

// TestServeGivesBackLeasedSlots drives a busy sync job through a `serve`
// process, which admits it from leases, then stops the process with
// SIGTERM at once: every call is recorded with its outcome, and no slot
// the process held is left reserved (counted and in flight for every
// other process until the sweep).
func TestServeGivesBackLeasedSlots(t *testing.T) {
	const calls = 300
	s, cmd, stderr := busySyncJob(t, calls)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve after SIGTERM: %v\n%s", err, stderr.String())
	}

	db, err := state.Open(t.Context(), s.state)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var sends []ledger.Send
	if err := db.View(t.Context(), func(tx ledger.ReadTx) error {
		var err error
		sends, err = tx.Sends("demo", time.Time{}, 10*calls)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	byState := map[ledger.State]int{}
	at := map[time.Time]bool{}
	for _, s := range sends {
		byState[s.State]++
		at[s.At] = true
	}
	if byState[ledger.Reserved] != 0 {
		t.Errorf("%d slots left reserved after serve stopped", byState[ledger.Reserved])
	}
	if byState[ledger.Confirmed] != calls {
		t.Errorf("the log holds %v, want %d confirmed calls", byState, calls)
	}
	if len(at) > calls/4 {
		t.Errorf("%d calls were admitted at %d different times: want most from leases", calls, len(at))
	}
}

// TestServeKilledLosesNoOutcome drives a busy sync job through a `serve`
// process, which admits it from leases and records their outcomes
// through its journal, then kills it with SIGKILL the moment the last
// answer arrives: the next process to open the state file finds every
// call the job was answered, confirmed, with its answer's observation.
func TestServeKilledLosesNoOutcome(t *testing.T) {
	const calls = 300
	s, cmd, _ := busySyncJob(t, calls)
	killAndRecover(t, cmd, s.state, calls)
}

// busySyncJob starts a `serve` process on a key far from its limits
// (a million calls an hour, no rate or concurrency cap it meets) and sends
// it that many REST calls one after another, each answered 200: a pace
// that admits them from leases. It returns the setup, the process and its
// stderr.
func busySyncJob(t *testing.T, calls int) (*setup, *exec.Cmd, *testkit.Buffer) {
	t.Helper()
	_, url := upstreamAPI(t, demo.Config{Quota: 1_000_000, Window: time.Hour})
	key := demoKey(url, 1000000, time.Hour)
	key.MaxRate, key.MaxConcurrency = 1000000, 1000
	s := newSetup(t, key)
	cmd, rest, stderr := s.serveProcess(t)
	for n := range calls {
		resp := get(t, fmt.Sprintf("%s/k/demo/v1/participants/p-%06d", rest, n+1), syncToken)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("call %d: %d", n, resp.StatusCode)
		}
	}
	return s, cmd, stderr
}

// serveProcess starts `mcp-quota serve` on a free loopback port as a
// process of its own (with args) and returns it, its base URL and its
// stderr.
func (s *setup) serveProcess(t *testing.T, args ...string) (*exec.Cmd, string, *testkit.Buffer) {
	t.Helper()
	cmd, stderr := s.command(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--drain-delay", "0"}, args...)...)
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
		re := regexp.MustCompile(`(https?://127\.0\.0\.1:\d+)/mcp`)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				base <- m[1]
			}
		}
	}()
	select {
	case u := <-base:
		return cmd, u, stderr
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not start:\n%s", stderr.String())
	}
	return nil, "", nil
}

// killAndRecover kills the `serve` process cmd with SIGKILL and opens its
// state file at statePath as the next process would, which records what
// the killed process's journal holds; it checks that the log then holds
// calls confirmed calls, each with its observation, and no journal is
// left. It returns the state, open until the test ends.
func killAndRecover(t *testing.T, cmd *exec.Cmd, statePath string, calls int) *state.DB {
	t.Helper()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	journals, _ := filepath.Glob(statePath + ".outcomes/*.log")

	db, err := state.Open(t.Context(), statePath) // it records what the journal holds
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var sends []ledger.Send
	var obs []ledger.ObservationRecord
	if err := db.View(t.Context(), func(tx ledger.ReadTx) error {
		var err error
		if sends, err = tx.Sends("demo", time.Time{}, 10*calls); err != nil {
			return err
		}
		obs, err = tx.(*state.Tx).Observations("demo", 10*calls)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	byState := checkConfirmedObserved(t, sends, obs, calls)
	if left, _ := filepath.Glob(statePath + ".outcomes/*.log"); len(left) > 0 {
		t.Errorf("journals left after recovery: %v", left)
	}
	t.Logf("%d journal file(s) left by the killed process; the log after recovery: %v", len(journals), byState)
	return db
}

// checkConfirmedObserved checks that a log recovered after a SIGKILL,
// sends with their observations obs, holds calls confirmed calls, each
// with its observation, and returns the log's count by state.
func checkConfirmedObserved(t *testing.T, sends []ledger.Send, obs []ledger.ObservationRecord, calls int) map[ledger.State]int {
	t.Helper()
	observed := map[int64]bool{}
	for _, o := range obs {
		observed[o.AttemptID] = true
	}
	byState := map[ledger.State]int{}
	unobserved := 0
	for _, s := range sends {
		byState[s.State]++
		if s.State == ledger.Confirmed && !observed[s.ID] {
			unobserved++
		}
	}
	if byState[ledger.Confirmed] != calls || unobserved > 0 {
		t.Errorf("after SIGKILL the log holds %v with %d confirmed calls lacking their observation; want %d confirmed, each observed",
			byState, unobserved, calls)
	}
	return byState
}
