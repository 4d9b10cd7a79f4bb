package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
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

// heldUpstream is an API that answers every authorized GET with 200, and,
// once hold is set, keeps its answers until release is closed: the calls
// then are in flight for as long as the test wants.
type heldUpstream struct {
	arrived atomic.Int64
	held    atomic.Int64 // answers waiting for release now
	hold    atomic.Bool
	release chan struct{}
}

func (u *heldUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+upstreamSecret {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	u.arrived.Add(1)
	if u.hold.Load() {
		u.held.Add(1)
		select {
		case <-u.release:
		case <-r.Context().Done():
		}
		u.held.Add(-1)
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"path":%q}`+"\n", r.URL.Path)
}

// eventually polls cond every 10 ms until it holds, failing the test
// when it does not within limit.
func eventually(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s did not happen", limit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// legacySession connects the go-sdk client at the 2025-11-25 revision,
// which opens a session and its GET event stream.
func legacySession(t *testing.T, base string) *gomcp.ClientSession {
	t.Helper()
	client := gomcp.NewClient(&gomcp.Implementation{Name: "e2e", Version: "1"}, nil)
	sess, err := client.Connect(t.Context(), &gomcp.StreamableClientTransport{Endpoint: base + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{agentToken, http.DefaultTransport}}, MaxRetries: -1},
		&gomcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("connect over HTTP at 2025-11-25: %v", err)
	}
	if sess.ID() == "" {
		t.Fatalf("the handshake (%s) opened no session", sess.InitializeResult().ProtocolVersion)
	}
	t.Cleanup(func() { sess.Close() })
	return sess
}

// answered collects the targets of the calls answered 2xx.
type answered struct {
	mu      sync.Mutex
	targets map[string]string // target → transport
	late    int               // answered after SIGTERM
}

// TestServeDrainsOnSIGTERM sends REST and MCP calls through a `serve`
// process from several clients at once and SIGTERMs it while calls are in
// flight: /readyz turns 503 while the listener still answers, the listener
// then closes, the calls in flight finish and are answered, the process
// exits 0, and its state holds every call answered 2xx as confirmed,
// every attempt in a final state, nothing reserved, no journal left over.
func TestServeDrainsOnSIGTERM(t *testing.T) {
	t.Parallel()
	drainUnderLoad(t, true)
}

// TestServeShutdownTimeoutCancelsCalls is TestServeDrainsOnSIGTERM with
// calls that outlast --shutdown-timeout: they are cancelled, none of
// them is answered 2xx (a REST call's exchange is aborted, not answered
// with an empty 200), and the process still exits 0 with each of their
// attempts recorded as ended.
func TestServeShutdownTimeoutCancelsCalls(t *testing.T) {
	t.Parallel()
	drainUnderLoad(t, false)
}

// drainUnderLoad runs the calls and the SIGTERM of the tests above; with
// finish, the calls in flight are let finish once the listener closed,
// otherwise they outlast the shutdown timeout.
func drainUnderLoad(t *testing.T, finish bool) {
	up := &heldUpstream{release: make(chan struct{})}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	released := sync.OnceFunc(func() { close(up.release) })
	t.Cleanup(released)
	key := demoKey(srv.URL, 1000000, time.Hour)
	key.MaxRate, key.MaxConcurrency = 1000000, 1000
	s := newSetup(t, key)
	timeout := "60s"
	if !finish {
		timeout = "1s"
	}
	cmd, base, stderr := s.serveProcess(t, "--drain-delay", "3s", "--shutdown-timeout", timeout)

	readyz := func() int {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return 0
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var problem struct{ Code string }
		if resp.StatusCode == http.StatusServiceUnavailable && (json.Unmarshal(b, &problem) != nil || problem.Code != "draining") {
			t.Errorf("/readyz answered 503 with %s; want the code draining", b)
		}
		return resp.StatusCode
	}
	if code := readyz(); code != http.StatusOK {
		t.Fatalf("/readyz while serving: %d, want 200", code)
	}

	got := &answered{targets: map[string]string{}}
	var signalled atomic.Bool
	ok := func(target, transport string) {
		got.mu.Lock()
		defer got.mu.Unlock()
		got.targets[target] = transport
		if signalled.Load() {
			got.late++
		}
	}
	var clients sync.WaitGroup
	for c := range 3 { // REST clients: each call a target of its own, until the listener is gone
		hc := &http.Client{Timeout: 2 * time.Minute}
		clients.Go(func() {
			for n := 0; ; n++ {
				target := fmt.Sprintf("/v1/participants/rest-%d-%06d", c, n)
				req, _ := http.NewRequest(http.MethodGet, base+"/k/demo"+target, nil)
				req.Header.Set("Authorization", "Bearer "+syncToken)
				resp, err := hc.Do(req)
				if err != nil {
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode/100 == 2 {
					ok(target, "rest")
				}
			}
		})
	}
	for c := range 2 { // MCP clients over Streamable HTTP: one at 2025-11-25, with its session and event stream, one at the newest revision
		sess := httpSession(t, base, agentToken, nil)
		if c == 0 {
			sess = legacySession(t, base)
		}
		clients.Go(func() {
			for n := 0; ; n++ {
				target := fmt.Sprintf("/v1/participants/mcp-%d-%06d", c, n)
				res, err := sess.CallTool(t.Context(), &gomcp.CallToolParams{Name: "fetch", Arguments: map[string]any{"path": target}})
				if err != nil {
					return
				}
				if !res.IsError {
					ok(target, "mcp")
				}
			}
		})
	}

	eventually(t, 30*time.Second, "40 calls reaching the upstream", func() bool { return up.arrived.Load() >= 40 })
	up.hold.Store(true)
	eventually(t, 30*time.Second, "calls held in flight", func() bool { return up.held.Load() >= 3 })
	signalled.Store(true)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "/readyz answering 503 after SIGTERM", func() bool { return readyz() == http.StatusServiceUnavailable })
	addr := strings.TrimPrefix(base, "http://")
	eventually(t, 30*time.Second, "the listener closing after the drain delay", func() bool {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if finish {
		if up.held.Load() == 0 {
			t.Fatal("no call was in flight when the listener closed")
		}
		select {
		case err := <-exited:
			t.Fatalf("serve exited (%v) while calls were still in flight\n%s", err, stderr.String())
		default:
		}
		released()
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("serve after SIGTERM: %v, want exit status 0\n%s", err, stderr.String())
		}
	case <-time.After(45 * time.Second): // less than the 60 s bound: a shutdown that waits for it fails

		t.Fatalf("serve did not exit after its calls finished\n%s", stderr.String())
	}
	clients.Wait()
	if !finish && !strings.Contains(stderr.String(), "did not finish within the shutdown timeout") {
		t.Errorf("no call outlasted the shutdown timeout:\n%s", stderr.String())
	}
	if finish && got.late == 0 {
		t.Errorf("no call in flight at SIGTERM was answered 2xx")
	}
	byTransport := map[string]int{}
	for _, tr := range got.targets {
		byTransport[tr]++
	}
	if byTransport["rest"] == 0 || byTransport["mcp"] == 0 {
		t.Fatalf("answered 2xx: %v; want calls of both transports", byTransport)
	}

	if journals, _ := filepath.Glob(s.state + ".outcomes/*.log"); len(journals) != 0 {
		t.Errorf("journals left after a clean shutdown: %v", journals)
	}
	if _, err := os.Stat(s.state); err != nil {
		t.Fatal(err)
	}
	db, err := state.Open(t.Context(), s.state)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var attempts []ledger.Attempt
	var sends []ledger.Send
	if err := db.View(t.Context(), func(tx ledger.ReadTx) error {
		var err error
		if attempts, err = tx.Activity(ledger.ActivityFilter{Key: "demo", Limit: 1_000_000}); err != nil {
			return err
		}
		sends, err = tx.Sends("demo", time.Time{}, 1_000_000)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	confirmed := map[string]bool{}
	states := map[ledger.State]int{}
	recorded := map[string][]string{} // target → how its attempts ended
	for _, a := range attempts {
		states[a.State]++
		recorded[a.Target] = append(recorded[a.Target], fmt.Sprintf("%s %d (%v)", a.State, a.Status, a.Reason))
		if a.State == ledger.Confirmed && a.Status/100 == 2 {
			confirmed[a.Target] = true
		}
		if a.State == ledger.Admitted || a.State == ledger.Reserved || a.State == ledger.Interrupted || !a.InFlightUntil.IsZero() {
			t.Errorf("attempt %d (%s) ended %s, in flight until %v: want a final state", a.ID, a.Target, a.State, a.InFlightUntil)
		}
	}
	var missing []string
	for target, transport := range got.targets {
		if !confirmed[target] {
			missing = append(missing, fmt.Sprintf("%s over %s, recorded %v", target, transport, recorded[target]))
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d of %d calls answered 2xx have no confirmed record in the activity (%v): %q",
			len(missing), len(got.targets), states, missing)
	}
	for _, sd := range sends {
		if sd.State == ledger.Reserved || sd.State == ledger.Admitted {
			t.Errorf("slot %d left %s after serve stopped", sd.ID, sd.State)
		}
	}
	t.Logf("answered 2xx: %v (%d after SIGTERM); activity: %v", byTransport, got.late, states)
}

// TestLoopbackServeHasNoDrainDelay: no load balancer reaches a loopback
// listener, so Ctrl-C stops it without the drain delay unless one is
// given.
func TestLoopbackServeHasNoDrainDelay(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "drain_delay=0s"},
		{[]string{"--drain-delay", "1ms"}, "drain_delay=1ms"},
	} {
		ctx, cancel := context.WithCancel(t.Context())
		var logs testkit.Buffer
		args := append([]string{"serve", "--listen", "127.0.0.1:0", "--config", s.config, "--state", s.state}, tt.args...)
		done := make(chan error, 1)
		pr, pw := io.Pipe()
		go func() { done <- run(ctx, args, strings.NewReader(""), pw, &logs, s.getenv); pw.Close() }()
		// serve has started once it printed where it serves.
		if _, err := bufio.NewReader(pr).ReadString('\n'); err != nil {
			t.Fatalf("serve %v: %v\n%s", tt.args, err, logs.String())
		}
		go io.Copy(io.Discard, pr)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("serve %v: %v", tt.args, err)
		}
		if !strings.Contains(logs.String(), tt.want) {
			t.Errorf("serve %v on loopback logged no %s:\n%s", tt.args, tt.want, logs.String())
		}
	}
}
