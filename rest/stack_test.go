package rest_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/gateway"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/rest"
	"github.com/mcp-quota/mcp-quota/state"
	"github.com/mcp-quota/mcp-quota/tools"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// The credentials every stack is configured with. Each is recognisable,
// so that a scan of an output finds it wherever it leaked.
const (
	upstreamSecret = "sk-live-UPSTREAM-7f3a9c1e5b2d4086"
	syncToken      = "caller-SYNC-token-2b8e6f0a4c1d"
	agentToken     = "caller-AGENT-token-9d1c3e5f7a0b"
	strangerToken  = "caller-STRANGER-token-4a6c8e0b2d"
)

// stackConfig describes a stack. Its zero value is the demo upstream in
// its seed mode behind a key "demo" with the reference API's documented policy.
type stackConfig struct {
	Demo demo.Config
	// Upstream, when set, replaces the demo upstream.
	Upstream http.Handler
	// Keys is the [[keys]] part of the configuration, with %[1]s standing
	// for the upstream's base URL; "" means the key "demo" (bearer auth,
	// 120 calls per 60 s) and a key "other" for the same upstream.
	Keys string
	// Callers is the [[callers]] part; "" means callers.
	Callers string
	Limits  rest.Limits
	// Gateway changes the gateway's configuration before it is built.
	Gateway func(*gateway.Config)
	// Client changes the upstream client before it is used.
	Client func(*upstream.Client)
	// QuietLog logs at Info; otherwise every Debug line is kept too.
	QuietLog bool
	// Secret is the key's credential (UPSTREAM_SECRET); "" means
	// upstreamSecret.
	Secret string
	// StateDir holds the state file, new and migrated by the stack; ""
	// means a copy of a migrated one (testkit.StateFile).
	StateDir string
	// AnswerTimeout bounds each fetch's answer (tools.Deps.AnswerTimeout).
	AnswerTimeout time.Duration
	// Fetch bounds the fetch tool (tools.Deps.Fetch).
	Fetch tools.FetchLimits
	// Clock is the time the pacer, the upstream client, the REST side,
	// the tools and the gateway read; nil means real time. The upstream
	// and the state file keep real time.
	Clock clock.Clock
	// Postgres, when set, is the PostgreSQL database that holds the
	// state (its password in PGPASSWORD), in place of a state file: the
	// stack then has a journal of its own and its pacer reads the
	// database's clock unless Clock is set, as serve wires a PostgreSQL
	// state; the stack's DB is nil.
	Postgres string
}

var defaultKeys = defaultKeysWith(120, time.Minute)

// defaultKeysWith is the [[keys]] tables of the stack's keys: demo
// (bearer auth, the ietf profile, quota calls per window) and other,
// for the same upstream.
func defaultKeysWith(quota int64, window time.Duration) string {
	return testkit.Keys(
		testkit.Key{Name: "demo", BaseURL: "%[1]s", SecretEnv: "UPSTREAM_SECRET", Auth: "bearer", Profile: "ietf", MaxRate: 1000,
			Policies: []testkit.Policy{{Name: "default", Quota: quota, Window: window}}},
		testkit.Key{Name: "other", BaseURL: "%[1]s", SecretEnv: "UPSTREAM_SECRET"},
	)
}

var callers = callersWith(nil)

// callersWith is the [[callers]] tables of the stack's callers — sync
// and agent on key demo, stranger on other — each caller that keys names
// given the keys there instead.
func callersWith(keys map[string][]string) string {
	cs := []testkit.Caller{
		{Name: "sync", TokenEnv: "SYNC_TOKEN", Keys: []string{"demo"}},
		{Name: "agent", TokenEnv: "AGENT_TOKEN", Keys: []string{"demo"}},
		{Name: "stranger", TokenEnv: "STRANGER_TOKEN", Keys: []string{"other"}},
	}
	for i, c := range cs {
		if k, ok := keys[c.Name]; ok {
			cs[i].Keys = k
		}
	}
	return testkit.Config{Callers: cs}.TOML()
}

// stack is mcp-quota's HTTP side wired as `mcp-quota serve` wires it —
// a real state file, pacer, upstream client, REST handler, MCP tools and
// gateway on a loopback listener — in front of an upstream on another.
type stack struct {
	URL         string // the gateway, http://127.0.0.1:PORT
	UpstreamURL string
	API         *demo.API // nil when stackConfig.Upstream was given
	Keys        *keystore.Store
	DB          *state.DB // nil on PostgreSQL
	DBPath      string    // the state file, or the PostgreSQL database's URL
	Pacer       *pacer.Pacer
	Client      *upstream.Client
	REST        *rest.Handler
	Log         *testkit.Buffer // every log line, JSON
}

func newStack(t testing.TB, sc stackConfig) *stack {
	t.Helper()
	s := &stack{Log: &testkit.Buffer{}}
	up := sc.Upstream
	if up == nil {
		if sc.Demo.Tokens == nil {
			sc.Demo.Tokens = []string{upstreamSecret}
		}
		s.API = demo.New(sc.Demo)
		up = s.API
	}
	us := httptest.NewServer(up)
	t.Cleanup(us.Close)
	s.UpstreamURL = us.URL

	keys := sc.Keys
	if keys == "" {
		keys = defaultKeys
	}
	secret := sc.Secret
	if secret == "" {
		secret = upstreamSecret
	}
	env := map[string]string{"UPSTREAM_SECRET": secret, "SYNC_TOKEN": syncToken,
		"AGENT_TOKEN": agentToken, "STRANGER_TOKEN": strangerToken}
	cs := sc.Callers
	if cs == "" {
		cs = callers
	}
	store, err := keystore.Parse([]byte(fmt.Sprintf(keys, us.URL)+cs), keystore.Env{Getenv: func(k string) string { return env[k] }})
	if err != nil {
		t.Fatal(err)
	}
	s.Keys = store

	level := slog.LevelDebug
	if sc.QuietLog {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewJSONHandler(s.Log, &slog.HandlerOptions{Level: level}))
	db, pacerClock := openState(t, s, sc)
	s.Pacer = pacer.New(db, pacer.WithClock(pacerClock))
	s.Client = upstream.New(s.Pacer, log)
	s.Client.Clock = sc.Clock
	if sc.Client != nil {
		sc.Client(s.Client)
	}
	s.REST = &rest.Handler{Keys: store, Client: s.Client, Pacer: s.Pacer, DB: db, Log: log, Limits: sc.Limits, Clock: sc.Clock}
	mcp := tools.NewServer(&tools.Deps{Keys: store, Client: s.Client, Pacer: s.Pacer, DB: db, Log: log, Transport: "mcp-http",
		AnswerTimeout: sc.AnswerTimeout, Fetch: sc.Fetch, Clock: sc.Clock}, "test")
	gc := gateway.Config{Keys: store, REST: s.REST, MCP: mcp, DB: db, Log: log, Loopback: true, Clock: sc.Clock}
	if sc.Gateway != nil {
		sc.Gateway(&gc)
	}
	gs := httptest.NewUnstartedServer(gateway.New(gc))
	gs.Config = gateway.NewServer("", gs.Config.Handler, log)
	gs.Start()
	// Closed before the state, so no request is left writing to it.
	t.Cleanup(func() {
		if sc.Postgres != "" {
			s.Pacer.Close(context.Background()) // what waits in memory and in the journal
		}
		db.Close()
	})
	t.Cleanup(gs.Close)
	s.URL = gs.URL
	return s
}

// openState opens the state of the stack sc describes, and returns it
// with the clock its pacer reads.
func openState(t testing.TB, s *stack, sc stackConfig) (state.Store, clock.Clock) {
	t.Helper()
	if sc.Postgres != "" {
		s.DBPath = sc.Postgres
		pg, err := state.OpenPostgres(context.Background(), sc.Postgres, state.PostgresOptions{JournalDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		if sc.Clock == nil {
			return pg, clock.Source(pg.Now)
		}
		return pg, sc.Clock
	}
	if sc.StateDir != "" {
		s.DBPath = filepath.Join(sc.StateDir, "state.db")
	} else {
		s.DBPath = testkit.StateFile(t, state.Open)
	}
	db, err := state.Open(context.Background(), s.DBPath)
	if err != nil {
		t.Fatal(err)
	}
	s.DB = db
	return db, sc.Clock
}

// request is a request to the gateway with token as the caller's bearer
// token ("" sends none).
func (s *stack) request(t testing.TB, method, path, token string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, s.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return req
}

// do sends a request to the gateway with token as the caller's bearer
// token ("" sends none) and returns the answer with its body read.
func (s *stack) do(t testing.TB, method, path, token string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req := s.request(t, method, path, token, body)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// doOnClock sends a request as do does, while moving clk (the stack's
// clock) to the end of every wait of up to pacer.BackoffCap the call sets
// on it (a key held back after a refusal, a retry's backoff): a call
// that waits for the pacer answers without waiting in real time.
func (s *stack) doOnClock(t testing.TB, clk *testkit.Clock, method, path, token string, body io.Reader) *http.Response {
	t.Helper()
	req := s.request(t, method, path, token, body)
	answered, done := context.WithCancel(context.Background())
	var (
		resp *http.Response
		err  error
	)
	go func() {
		defer done()
		if resp, err = http.DefaultClient.Do(req); err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	// WaitTimer fails once the answer is in, and only then. The clock
	// moves to each wait's end, no further: a call gives up a retry
	// whose wait would pass what its caller waits.
	for {
		d, err := clk.WaitTimer(answered, 0, pacer.BackoffCap)
		if err != nil {
			break
		}
		clk.Advance(d)
	}
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// upstreamRequests is how many requests the demo upstream got with the
// key's credential.
func (s *stack) upstreamRequests() int {
	return s.API.Stats(upstreamSecret).Requests
}

// rateLimitFields are the fields every answer about a key carries.
var rateLimitFields = []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}

// missingRateLimitFields returns the rate-limit fields h lacks.
func missingRateLimitFields(h http.Header) []string {
	var out []string
	for _, f := range rateLimitFields {
		if h.Get(f) == "" {
			out = append(out, f)
		}
	}
	return out
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// raw sends one HTTP/1.1 request with exactly the request target given
// (no client cleans or escapes it) and the header lines given, and
// returns the answer with its body read.
func (s *stack) raw(t testing.TB, method, target string, lines ...string) (*http.Response, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\n", method, target)
	host := false
	for _, l := range lines {
		host = host || hasPrefixFold(l, "Host:")
		b.WriteString(l + "\r\n")
	}
	if !host {
		b.WriteString("Host: " + strings.TrimPrefix(s.URL, "http://") + "\r\n")
	}
	b.WriteString("Connection: close\r\n\r\n")
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: method})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// demoRecords is the reference API's demo upstream with n participants.
func demoRecords(n int) demo.Config { return demo.Config{Records: n} }
