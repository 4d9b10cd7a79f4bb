package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/report"
)

// The harness of TestHostsShareOneBudget: hosts with processes of their
// own, the callers that load them, the upstream's log, and a database
// that hangs.

// hostsConfig is the configuration every host of the test reads: the
// state in db, state_timeout, the demo key at upstream with its
// documented policy, and the callers agent and sync.
func hostsConfig(db, upstream string, quota int, window, stateTimeout time.Duration) string {
	key := demoKey(upstream, int64(quota), window)
	key.MaxRate, key.MaxConcurrency = 1000, 16
	cfg := demoConfig(key)
	cfg.State, cfg.StateTimeout = db, stateTimeout
	return cfg.TOML()
}

// A host is one machine of the test: a directory of its own holding its
// HOME, its state directory (XDG_STATE_HOME), its configuration and the
// working directory its processes run in, and an environment naming its
// instance and giving the database's password in PGPASSWORD.
type host struct {
	name   string
	dir    string
	config string
	env    []string

	cmd    *exec.Cmd // its serve process, once started
	base   string    // serve's base URL
	stderr *testkit.Buffer
	killed atomic.Bool // its serve process was killed on purpose
}

// serveThreeHosts starts serve for the hosts host-a, host-b and host-c,
// each with cfg and its own directory; host-c's clock runs 7 s ahead, so
// that admissions follow the database's clock and not a host's.
func serveThreeHosts(t *testing.T, cfg, password string) []*host {
	t.Helper()
	hosts := []*host{
		newHost(t, "host-a", cfg, password),
		newHost(t, "host-b", cfg, password),
		newHost(t, "host-c", cfg, password, "MCP_QUOTA_CLOCK_SKEW=7s"),
	}
	for _, h := range hosts {
		h.serve(t)
	}
	return hosts
}

// newHost makes the host name with the configuration cfg; env adds to
// its environment.
func newHost(t *testing.T, name, cfg, password string, env ...string) *host {
	t.Helper()
	dir := t.TempDir()
	h := &host{name: name, dir: dir, config: filepath.Join(dir, "config.toml")}
	for _, sub := range []string{"home", "state", "config", "work"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(h.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "HOME" || strings.HasPrefix(k, "XDG_") || strings.HasPrefix(k, "MCP_QUOTA_") || strings.HasPrefix(k, "PG") {
			continue
		}
		h.env = append(h.env, kv)
	}
	h.env = append(h.env, "HOME="+filepath.Join(dir, "home"), "XDG_STATE_HOME="+filepath.Join(dir, "state"),
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"), "PGPASSWORD="+password, "MCP_QUOTA_INSTANCE="+name,
		"DEMO_SECRET="+upstreamSecret, "AGENT_TOKEN="+agentToken, "SYNC_TOKEN="+syncToken)
	h.env = append(h.env, env...)
	return h
}

// command returns mcp-quota with args and the host's configuration, run
// in its working directory with its environment; stderr is collected in
// the returned buffer.
func (h *host) command(t *testing.T, args ...string) (*exec.Cmd, *testkit.Buffer) {
	t.Helper()
	cmd := exec.Command(binary(t), append(args, "--config", h.config)...)
	cmd.Dir = filepath.Join(h.dir, "work")
	cmd.Env = h.env
	var stderr testkit.Buffer
	cmd.Stderr = &stderr
	return cmd, &stderr
}

// run runs mcp-quota with args on h and returns its output.
func (h *host) run(t *testing.T, args ...string) string {
	t.Helper()
	cmd, stderr := h.command(t, args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: mcp-quota %s: %v\n%s", h.name, strings.Join(args, " "), err, stderr.String())
	}
	return out.String()
}

// serve starts `mcp-quota serve` on a free loopback port on h.
func (h *host) serve(t *testing.T) {
	t.Helper()
	cmd, stderr := h.command(t, "serve", "--listen", "127.0.0.1:0", "--drain-delay", "0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h.cmd, h.stderr = cmd, stderr
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("%s's log, its end:\n%s", h.name, logEnd(stderr.String()))
		}
	})
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
	select {
	case h.base = <-base:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: serve did not start:\n%s", h.name, stderr.String())
	}
}

// stdioSession starts `mcp-quota stdio` on h and connects the official
// go-sdk client to it.
func (h *host) stdioSession(t *testing.T) *gomcp.ClientSession {
	t.Helper()
	cmd, stderr := h.command(t, "stdio")
	client := gomcp.NewClient(&gomcp.Implementation{Name: "e2e", Version: "1"}, nil)
	sess, err := client.Connect(t.Context(), &gomcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("%s: connect over stdio: %v\nstderr:\n%s", h.name, err, stderr.String())
	}
	t.Cleanup(func() {
		sess.Close()
		if t.Failed() {
			t.Logf("%s's log, its end:\n%s", h.name, logEnd(stderr.String()))
		}
	})
	return sess
}

// logEnd returns the last 200 lines of log.
func logEnd(log string) string {
	lines := strings.SplitAfter(log, "\n")
	return strings.Join(lines[max(len(lines)-200, 0):], "")
}

// The results a caller sees.
const (
	callAnswered    = "answered"    // the upstream's answer, 200
	callRefused     = "refused"     // refused locally for the budget: nothing sent
	callUnavailable = "unavailable" // stateUnavailable: REST 503, MCP isError
)

// A hostCall is one call a caller made, and how it ended.
type hostCall struct {
	who        string // the host, or "agent"
	id         string // the call's ID, in its query: who.worker.n
	start, end time.Time
	kind       string
	detail     string // what a failed call was told
}

// restCalls sends REST calls through h as the sync caller, each with an
// ID of its own, one after another as fast as answers come, until ctx
// ends or h's serve process is killed. A call that is not answered pauses
// the loop for a tenth of a second, so that refusals and failures do not
// spin.
func (h *host) restCalls(ctx context.Context, t *testing.T, client *http.Client, worker, wait int, log *testkit.List[hostCall]) {
	for n := 1; ctx.Err() == nil; n++ {
		c := hostCall{who: h.name, id: fmt.Sprintf("%s.%d.%d", h.name, worker, n), start: time.Now()}
		// Not ctx: a call under way when the load stops ends as it would.
		req, err := http.NewRequest(http.MethodGet, h.base+"/k/demo/v1/echo?call="+c.id, nil)
		if err != nil {
			t.Error(err)
			return
		}
		req.Header.Set("Authorization", "Bearer "+syncToken)
		req.Header.Set("Prefer", fmt.Sprintf("wait=%d", wait))
		resp, err := client.Do(req)
		if err != nil {
			if !h.killed.Load() {
				t.Errorf("%s: call %s: %v", h.name, c.id, err)
			}
			return
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		c.end = time.Now()
		if err != nil && h.killed.Load() {
			return
		}
		var p struct{ Code, Detail string }
		json.Unmarshal(body, &p)
		switch {
		case resp.StatusCode == http.StatusOK && err == nil:
			c.kind = callAnswered
		case resp.StatusCode == http.StatusTooManyRequests && p.Code == "rateLimited" && bytes.Contains(body, []byte("Nothing was sent upstream")):
			c.kind = callRefused
		case resp.StatusCode == http.StatusServiceUnavailable && p.Code == "stateUnavailable" &&
			resp.Header.Get("Content-Type") == "application/problem+json":
			c.kind, c.detail = callUnavailable, p.Detail
		default:
			t.Errorf("%s: call %s: %d %v: %s", h.name, c.id, resp.StatusCode, err, body)
			return
		}
		log.Add(c)
		if c.kind != callAnswered {
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// agentCalls has the agent call fetch, each call for an ID of its own,
// one after another, until ctx ends.
func agentCalls(ctx context.Context, t *testing.T, sess *gomcp.ClientSession, wait int, log *testkit.List[hostCall]) {
	for n := 1; ctx.Err() == nil; n++ {
		c := hostCall{who: "agent", id: fmt.Sprintf("agent.1.%d", n), start: time.Now()}
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := sess.CallTool(cctx, &gomcp.CallToolParams{Name: "fetch",
			Arguments: map[string]any{"path": "/v1/echo?call=" + c.id, "max_wait_s": wait}})
		cancel()
		c.end = time.Now()
		if err != nil {
			t.Errorf("agent: call %s: %v", c.id, err)
			return
		}
		var out struct {
			Status int
			Sent   *bool
			Advice struct{ Action string }
		}
		if b, err := json.Marshal(res.StructuredContent); err == nil {
			json.Unmarshal(b, &out)
		}
		switch {
		case !res.IsError && out.Status == http.StatusOK:
			c.kind = callAnswered
		case res.IsError && out.Advice.Action == "pause" && out.Sent != nil && !*out.Sent:
			c.kind = callRefused
		case res.IsError && errorCode(res) == "stateUnavailable":
			c.kind, c.detail = callUnavailable, text(res)
		default:
			t.Errorf("agent: call %s: %s", c.id, text(res))
			return
		}
		log.Add(c)
		if c.kind != callAnswered {
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// later returns the later of two times.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// upstreamLog is the demo upstream with a log of every request it got:
// the call ID in its query, and the status it answered.
type upstreamLog struct {
	api *demo.API
	url string

	mu       sync.Mutex
	arrivals []arrival
}

type arrival struct {
	call   string
	at     time.Time // when it arrived
	status int
}

// newUpstreamLog starts testUpstream with cfg on loopback, and logs what
// it receives.
func newUpstreamLog(t *testing.T, cfg demo.Config) *upstreamLog {
	t.Helper()
	u := &upstreamLog{api: testUpstream(cfg)}
	srv := httptest.NewServer(u)
	t.Cleanup(srv.Close)
	u.url = srv.URL
	return u
}

func (u *upstreamLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := wallClock.Now()
	sw := &statusWriter{ResponseWriter: w}
	u.api.ServeHTTP(sw, r)
	u.mu.Lock()
	defer u.mu.Unlock()
	u.arrivals = append(u.arrivals, arrival{call: r.URL.Query().Get("call"), at: at, status: sw.status})
}

func (u *upstreamLog) log() []arrival {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.arrivals)
}

// fullest returns the arrivals in the window of length w that holds the
// most (not refused with 429) of them.
func fullest(arrivals []arrival, w time.Duration) []arrival {
	var ok []arrival
	for _, r := range arrivals {
		if r.status != http.StatusTooManyRequests {
			ok = append(ok, r)
		}
	}
	slices.SortFunc(ok, func(a, b arrival) int { return a.at.Compare(b.at) })
	var best []arrival
	j := 0
	for i := range ok {
		for j < len(ok) && ok[j].at.Before(ok[i].at.Add(w)) {
			j++
		}
		if j-i > len(best) {
			best = ok[i:j]
		}
	}
	return best
}

// logFullest logs the arrivals of the fullest window of length w (see
// fullest), each with its call's attempts in the activity: their state,
// host and admission time, since start, and how long before the arrival.
func logFullest(t *testing.T, arrivals []arrival, w time.Duration, attempts map[string][]report.Activity, start time.Time) {
	t.Helper()
	since := func(at time.Time) time.Duration { return at.Sub(start).Round(time.Millisecond) }
	t.Logf("the fullest %v window at the upstream:", w)
	for _, r := range fullest(arrivals, w) {
		var adm []string
		for _, at := range attempts[r.call] {
			when, _ := time.Parse(time.RFC3339Nano, at.At)
			adm = append(adm, fmt.Sprintf("%s by %s at %v (%v before)", at.State, at.Instance, since(when), r.at.Sub(when).Round(time.Millisecond)))
		}
		t.Logf("  %s arrived at %v, answered %d; attempts: %s", r.call, since(r.at), r.status, strings.Join(adm, ", "))
	}
}

// statusWriter remembers the status written through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// readActivity reads key demo's whole activity from base, as token,
// following GET /v1/activity's cursor; newest first.
func readActivity(t *testing.T, base, token string) []report.Activity {
	t.Helper()
	var all []report.Activity
	cursor := ""
	for {
		resp := get(t, base+"/v1/activity?key=demo&limit=1000"+cursor, token)
		var page struct {
			Activity   []report.Activity `json:"activity"`
			NextCursor string            `json:"next_cursor"`
		}
		err := json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || err != nil {
			t.Fatalf("GET /v1/activity: %d %v", resp.StatusCode, err)
		}
		all = append(all, page.Activity...)
		if page.NextCursor == "" {
			return all
		}
		cursor = "&cursor=" + url.QueryEscape(page.NextCursor)
	}
}

// goroutines returns the go_goroutines that base's /metrics reports.
func goroutines(t *testing.T, base string) int {
	t.Helper()
	f := scrape(t, base, syncToken)["go_goroutines"]
	if f == nil || len(f.GetMetric()) != 1 {
		t.Fatalf("no go_goroutines in %s/metrics", base)
	}
	return int(f.GetMetric()[0].GetGauge().GetValue())
}

// A pgFreeze holds a PostgreSQL server's processes stopped (SIGSTOP):
// the server keeps its connections and its port but answers nothing —
// a database that hangs, which only a timeout ends — until thawed. It
// finds the processes in /proc: Linux only.
type pgFreeze struct {
	admin string // the server's URL, with the password

	mu      sync.Mutex
	stopped []int
}

// newPGFreeze returns a pgFreeze for the server admin (a URL with the
// password) names, once it has found its processes. Thaw runs at the end
// of t whatever happens, before the server is stopped.
func newPGFreeze(t *testing.T, admin string) (*pgFreeze, error) {
	t.Helper()
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("freezing PostgreSQL needs Linux's /proc, not %s", runtime.GOOS)
	}
	f := &pgFreeze{admin: admin}
	if _, err := f.postmaster(t.Context()); err != nil {
		return nil, err
	}
	t.Cleanup(f.thaw)
	return f, nil
}

// postmaster returns the server's postmaster: the parent of the backend
// serving a connection. (A restart starts another.)
func (f *pgFreeze) postmaster(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, f.admin)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var backend int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return 0, err
	}
	return parentPID(backend)
}

// freeze stops the postmaster, so that it forks no more, then every
// process it has.
func (f *pgFreeze) freeze(ctx context.Context) error {
	pm, err := f.postmaster(ctx)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := syscall.Kill(pm, syscall.SIGSTOP); err != nil {
		return err
	}
	f.stopped = append(f.stopped, pm)
	pids, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return err
	}
	for _, dir := range pids {
		pid, err := strconv.Atoi(filepath.Base(dir))
		if err != nil {
			continue
		}
		if ppid, err := parentPID(pid); err == nil && ppid == pm && syscall.Kill(pid, syscall.SIGSTOP) == nil {
			f.stopped = append(f.stopped, pid)
		}
	}
	return nil
}

// thaw lets every process freeze stopped go on.
func (f *pgFreeze) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, pid := range f.stopped {
		syscall.Kill(pid, syscall.SIGCONT) // one that ended meanwhile needs nothing
	}
	f.stopped = nil
}

// parentPID reads pid's parent from /proc/pid/stat: "pid (comm) state
// ppid …", where comm may hold spaces and parentheses.
func parentPID(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command in %q", pid, b)
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: no parent in %q", pid, b)
	}
	return strconv.Atoi(fields[1])
}
