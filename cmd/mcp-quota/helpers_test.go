package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/state"
)

// Secrets the end-to-end tests configure; no output may contain them.
const (
	upstreamSecret = "upstream-secret-3f9c2a7be41d"
	agentToken     = "agent-token-7d1e44b0c2a95f13"
	syncToken      = "sync-token-0a8e3c61f27db490"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// binary builds mcp-quota once per test binary, as the release is built
// (releaseCommand: its environment, flags and -ldflags, stamped with
// stampVersion and stampCommit), and returns its path. TestReleaseStamp
// checks this build too.
func binary(t testing.TB) string {
	t.Helper()
	testkit.SkipShort(t, "runs the mcp-quota binary")
	path, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// buildBinary builds mcp-quota as binary says, once per test binary.
// TestMain calls it before the first test starts (see there).
func buildBinary() (string, error) {
	buildOnce.Do(func() {
		r, err := readRelease()
		if err != nil {
			buildErr = err
			return
		}
		ldflags, err := stampedLdflags(r)
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "mcp-quota-e2e")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "mcp-quota")
		if out, err := releaseCommand(r, binPath, ldflags).CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	return binPath, buildErr
}

// wallClock is the wall clock without the monotonic reading time.Now
// also carries: the clock the database's now() and the state's times are
// on. The tests' upstreams count their windows on it, so that their
// counts and mcp-quota's admissions are on one clock. On the monotonic
// one, a virtual machine paused or its clock stepped (seen once: the
// wall clock 8.9 s ahead of the monotonic one within a second of
// TestHostsShareOneBudget) put the admissions on either side of the jump
// a window apart for the database and seconds apart for the upstream,
// which then counted both windows' calls in one.
var wallClock = clock.Source(func() time.Time { return time.Now().Round(0) })

// testUpstream is the demo upstream of the tests: it accepts only
// upstreamSecret and, unless cfg names a clock, counts on wallClock.
func testUpstream(cfg demo.Config) *demo.API {
	cfg.Tokens = []string{upstreamSecret}
	if cfg.Clock == nil {
		cfg.Clock = wallClock
	}
	return demo.New(cfg)
}

// upstreamAPI starts testUpstream on loopback.
func upstreamAPI(t testing.TB, cfg demo.Config) (*demo.API, string) {
	t.Helper()
	api := testUpstream(cfg)
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return api, srv.URL
}

// setup is one configuration and state file shared by the processes of a test.
type setup struct {
	dir    string
	config string
	state  string
	env    []string
}

// openKeyConfig is a configuration of one key, "open", without a
// credential, whose upstream is never called.
var openKeyConfig = testkit.Keys(testkit.Key{Name: "open", BaseURL: "https://api.example", Auth: "none"})

// noSecretKey is a key "nosecret" of the upstream at url whose
// credential's variable is not set.
func noSecretKey(url string) testkit.Key {
	return testkit.Key{Name: "nosecret", BaseURL: url, SecretEnv: "UNSET_VARIABLE_FOR_TEST"}
}

// tinyKey is a key "tiny" of the upstream at url with the demo's
// credential and one call a minute.
func tinyKey(url string) testkit.Key {
	return testkit.Key{Name: "tiny", BaseURL: url, SecretEnv: "DEMO_SECRET",
		Policies: []testkit.Policy{{Name: "default", Quota: 1, Window: time.Minute}}}
}

// demoKey is key "demo" of the upstream at baseURL: the demo's credential
// as a bearer token, the ietf profile, and quota calls per window.
func demoKey(baseURL string, quota int64, window time.Duration) testkit.Key {
	return testkit.Key{Name: "demo", BaseURL: baseURL, SecretEnv: "DEMO_SECRET", Auth: "bearer", Profile: "ietf",
		Policies: testkit.Window(quota, window)}
}

// demoConfig is the configuration newSetup writes: the keys, demo first,
// and the callers "agent" and "sync", who may use demo.
func demoConfig(demo testkit.Key, others ...testkit.Key) testkit.Config {
	return testkit.Config{
		Keys: append([]testkit.Key{demo}, others...),
		Callers: []testkit.Caller{
			{Name: "agent", TokenEnv: "AGENT_TOKEN", Keys: []string{demo.Name}},
			{Name: "sync", TokenEnv: "SYNC_TOKEN", Keys: []string{demo.Name}},
		},
	}
}

// newSetup is setupOf(demoConfig(demo, others...)).
func newSetup(t testing.TB, demo testkit.Key, others ...testkit.Key) *setup {
	t.Helper()
	return setupOf(t, demoConfig(demo, others...))
}

// setupOf writes cfg, with the environment that holds the demo's
// credential (DEMO_SECRET) and the callers' tokens (AGENT_TOKEN,
// SYNC_TOKEN). Its state is a new migrated state file
// (testkit.StateFile); a test whose subject is creating one sets
// s.state to a path where there is none yet.
func setupOf(t testing.TB, cfg testkit.Config) *setup {
	t.Helper()
	dir := t.TempDir()
	s := &setup{dir: dir, config: filepath.Join(dir, "config.toml"), state: testkit.StateFile(t, state.Open),
		env: []string{"DEMO_SECRET=" + upstreamSecret, "AGENT_TOKEN=" + agentToken, "SYNC_TOKEN=" + syncToken}}
	s.write(t, cfg)
	return s
}

// write replaces the setup's configuration with cfg.
func (s *setup) write(t testing.TB, cfg testkit.Config) {
	t.Helper()
	if err := os.WriteFile(s.config, []byte(cfg.TOML()), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (s *setup) getenv(name string) string {
	for _, kv := range s.env {
		if k, v, _ := strings.Cut(kv, "="); k == name {
			return v
		}
	}
	return ""
}

// command returns mcp-quota with args, the setup's config and state and
// its environment; stderr is collected in the returned buffer.
func (s *setup) command(t *testing.T, args ...string) (*exec.Cmd, *testkit.Buffer) {
	t.Helper()
	args = append(args, "--config", s.config, "--state", s.state)
	cmd := exec.Command(binary(t), args...)
	cmd.Env = append(os.Environ(), s.env...)
	var stderr testkit.Buffer
	cmd.Stderr = &stderr
	return cmd, &stderr
}

// stdioSession starts `mcp-quota stdio` and connects the official go-sdk
// client to it.
func (s *setup) stdioSession(t *testing.T, opts *gomcp.ClientOptions, args ...string) *gomcp.ClientSession {
	t.Helper()
	cmd, stderr := s.command(t, append([]string{"stdio"}, args...)...)
	client := gomcp.NewClient(&gomcp.Implementation{Name: "e2e", Version: "1"}, opts)
	sess, err := client.Connect(t.Context(), &gomcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect over stdio: %v\nstderr:\n%s", err, stderr.String())
	}
	t.Cleanup(func() {
		sess.Close()
		if strings.Contains(stderr.String(), upstreamSecret) {
			t.Errorf("stdio stderr contains the upstream secret")
		}
	})
	return sess
}

// serve runs `mcp-quota serve` in this process on a free loopback port
// and returns its base URL and collected logs.
func (s *setup) serve(t testing.TB, args ...string) (string, *testkit.Buffer) {
	t.Helper()
	base, logs, stop := startServe(t, s.getenv, append([]string{"--config", s.config, "--state", s.state}, args...)...)
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return base, logs
}

// startServe runs `mcp-quota serve` in this process on a free loopback
// port with getenv as its environment, and returns its base URL, its
// collected logs and a function that stops it and returns its error
// (called at the test's end too).
func startServe(t testing.TB, getenv func(string) string, args ...string) (string, *testkit.Buffer, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	var logs testkit.Buffer
	done := make(chan error, 1)
	args = append([]string{"serve", "--listen", "127.0.0.1:0", "--drain-delay", "0", "--log-level", "debug"}, args...)
	go func() { done <- run(ctx, args, strings.NewReader(""), pw, &logs, getenv); pw.Close() }()
	var once sync.Once
	var err error
	stop := func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	t.Cleanup(func() { stop() })
	base := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		re := regexp.MustCompile(`(http://127\.0\.0\.1:\d+)/mcp`)
		sent := false
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil && !sent {
				base <- m[1]
				sent = true
			}
		}
	}()
	select {
	case u := <-base:
		return u, &logs, stop
	case err := <-done:
		t.Fatalf("serve ended: %v\n%s", err, logs.String())
	case <-time.After(20 * time.Second):
		t.Fatalf("serve did not start\n%s", logs.String())
	}
	return "", nil, nil
}

// httpSession connects the go-sdk client to base/mcp with token.
func httpSession(t testing.TB, base, token string, opts *gomcp.ClientOptions) *gomcp.ClientSession {
	t.Helper()
	hc := &http.Client{Transport: bearer{token, http.DefaultTransport}}
	client := gomcp.NewClient(&gomcp.Implementation{Name: "e2e", Version: "1"}, opts)
	sess, err := client.Connect(t.Context(), &gomcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connect over HTTP: %v", err)
	}
	t.Cleanup(func() { sess.Close() })
	return sess
}

type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

// call calls a tool and returns its structured content as a map.
func call(t *testing.T, sess *gomcp.ClientSession, tool string, args map[string]any) (*gomcp.CallToolResult, map[string]any) {
	t.Helper()
	res, err := sess.CallTool(t.Context(), &gomcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s(%v): %v", tool, args, err)
	}
	return res, structured(t, res)
}

// errorCode returns the stable code an error result carries in _meta.
func errorCode(res *gomcp.CallToolResult) string {
	e, _ := res.Meta["mcp-quota/error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

func structured(t *testing.T, res *gomcp.CallToolResult) map[string]any {
	t.Helper()
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
	return m
}

func text(res *gomcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*gomcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// get sends a REST request as token.
func get(t *testing.T, url, token string, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}
