package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// runningDemo is a "serve --demo" run in this process.
type runningDemo struct {
	base   string // http://127.0.0.1:port
	output string // everything it printed up to "Press Ctrl-C to stop."
	logs   *testkit.Buffer
	stop   func() error
}

// startDemoServe runs "serve --demo" with its state in dir and returns
// once it has printed its instructions; stop ends it.
func startDemoServe(t *testing.T, dir string, args ...string) *runningDemo {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	logs := &testkit.Buffer{}
	done := make(chan error, 1)
	args = append([]string{"serve", "--demo", "--listen", "127.0.0.1:0", "--drain-delay", "0", "--state", filepath.Join(dir, "state.db")}, args...)
	go func() {
		done <- run(ctx, args, strings.NewReader(""), pw, logs, func(string) string { return "" })
		pw.Close()
	}()
	printed := make(chan string, 1)
	go func() {
		var b strings.Builder
		sc := bufio.NewScanner(pr)
		sent := false
		for sc.Scan() {
			if !sent {
				b.WriteString(sc.Text() + "\n")
				if strings.HasPrefix(sc.Text(), "Press Ctrl-C") {
					printed <- b.String()
					sent = true
				}
			}
		}
	}()
	d := &runningDemo{logs: logs}
	stopped := false
	d.stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	t.Cleanup(func() {
		if err := d.stop(); err != nil {
			t.Errorf("demo: %v", err)
		}
	})
	select {
	case d.output = <-printed:
	case err := <-done:
		stopped = true
		t.Fatalf("demo ended: %v\n%s", err, logs.String())
	case <-time.After(20 * time.Second):
		t.Fatalf("demo did not start\n%s", logs.String())
	}
	d.base = regexp.MustCompile(`MCP \(Streamable HTTP\):\s+(http://\S+)/mcp`).FindStringSubmatch(d.output)[1]
	return d
}

// demoFiles reads every file of a demo folder but its lock.
func demoFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	for _, name := range []string{"config.toml", "upstream.secret", "agent.token", "sync.token"} {
		b, err := os.ReadFile(filepath.Join(dir, "demo", name))
		if err != nil {
			t.Fatal(err)
		}
		files[name] = string(b)
	}
	return files
}

// pastedCurl finds the printed curl line for path and sends it as a shell
// would: the token read from the file the line names.
func pastedCurl(t *testing.T, output, path string) *http.Response {
	t.Helper()
	re := regexp.MustCompile(`curl -H "Authorization: Bearer \$\(cat (\S+)\)" '(http://\S+` + regexp.QuoteMeta(path) + `)'`)
	m := re.FindStringSubmatch(output)
	if m == nil {
		t.Fatalf("no curl line for %s in:\n%s", path, output)
	}
	tok, err := os.ReadFile(m[1])
	if err != nil {
		t.Fatal(err)
	}
	return get(t, m[2], strings.TrimSpace(string(tok)))
}

// TestDemoKeepsItsTokensAcrossRestarts: the demo restarted twice keeps one
// set of tokens, secret and configuration, and the token an assistant was
// registered with on the first run works on the third.
func TestDemoKeepsItsTokensAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	first := startDemoServe(t, dir)
	files := demoFiles(t, dir)
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	var last *runningDemo
	for range 2 {
		last = startDemoServe(t, dir)
		if got := demoFiles(t, dir); !equalMaps(got, files) {
			t.Errorf("the demo's files changed on a restart:\nbefore %v\nafter  %v", files, got)
		}
		if err := last.stop(); err != nil {
			t.Fatal(err)
		}
	}
	last = startDemoServe(t, dir)
	resp := get(t, last.base+"/v1/quota", strings.TrimSpace(files["agent.token"]))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the first run's agent token on the fourth run: %d, want 200", resp.StatusCode)
	}
	for name, mode := range map[string]os.FileMode{"agent.token": 0o600, "sync.token": 0o600, "upstream.secret": 0o600, "config.toml": 0o600} {
		if fi, err := os.Stat(filepath.Join(dir, "demo", name)); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %v (%v), want %v", name, fi.Mode().Perm(), err, mode)
		}
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestSecondDemoLeavesTheFirstAlone: a second "serve --demo" on another
// port, while the first runs, is refused with the first's address, and
// touches none of its files.
func TestSecondDemoLeavesTheFirstAlone(t *testing.T) {
	dir := t.TempDir()
	first := startDemoServe(t, dir)
	before := demoFiles(t, dir)
	var out, errOut strings.Builder
	err := run(t.Context(), []string{"serve", "--demo", "--listen", "127.0.0.1:0", "--state", filepath.Join(dir, "state.db")},
		nil, &out, &errOut, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "another mcp-quota serve --demo is running") ||
		!strings.Contains(err.Error(), first.base+"/mcp") || !strings.Contains(err.Error(), "--state") ||
		!strings.Contains(err.Error(), "--listen") {
		t.Errorf("second demo: %v; want a refusal naming the running demo, --state and --listen", err)
	}
	// The same command again (its files and its address): the address is
	// in use, and the refusal names the first demo, not another program.
	err = run(t.Context(), []string{"serve", "--demo", "--listen", strings.TrimPrefix(first.base, "http://"), "--state", filepath.Join(dir, "state.db")},
		nil, &out, &errOut, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "another mcp-quota serve --demo is running") ||
		!strings.Contains(err.Error(), first.base+"/mcp") {
		t.Errorf("the same demo command again: %v; want a refusal naming the running demo", err)
	}
	// Its own files but the first's address: refused on the address before
	// any file of the new demo is written.
	elsewhere := t.TempDir()
	err = run(t.Context(), []string{"serve", "--demo", "--listen", strings.TrimPrefix(first.base, "http://"), "--state", filepath.Join(elsewhere, "state.db")},
		nil, &out, &errOut, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "already in use") {
		t.Errorf("second demo on the first's address: %v; want the address refused", err)
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Errorf("the refused demo wrote %d files in its directory, want none", len(entries))
	}
	if got := demoFiles(t, dir); !equalMaps(got, before) {
		t.Errorf("the second demo changed the first's files:\nbefore %v\nafter  %v", before, got)
	}
	resp := pastedCurl(t, first.output, "/v1/quota")
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the first demo after the second: %d, want 200", resp.StatusCode)
	}
	// Its own state elsewhere, a second demo runs beside the first.
	other := startDemoServe(t, t.TempDir())
	if other.base == first.base {
		t.Errorf("both demos at %s", other.base)
	}
}

// TestDemoLinesWorkAsPasted: the printed REST lines answer with the
// token they read, and the printed stdio command line, run as is (with
// the binary built for the test in the place of the one it names), reaches
// the demo key through its configuration and shares the state file.
func TestDemoLinesWorkAsPasted(t *testing.T) {
	d := startDemoServe(t, t.TempDir())
	for _, path := range []string{"/v1/quota", "/k/demo/v1/participants?limit=500", "/v1/activity?key=demo"} {
		resp := pastedCurl(t, d.output, path)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("pasted GET %s: %d %s", path, resp.StatusCode, body)
		}
	}
	m := regexp.MustCompile(`(?m)^  Command:\s+(\S+) (stdio .*)$`).FindStringSubmatch(d.output)
	if m == nil {
		t.Fatalf("no stdio command line in:\n%s", d.output)
	}
	// The demo runs in this test binary: under go test it is a temporary
	// build (go run's case), and the demo says to install mcp-quota first;
	// a test binary run from elsewhere names itself, as an installed one does.
	if exe := demoExecutable(); exe == "" && !strings.Contains(d.output, "go install ./cmd/mcp-quota") {
		t.Errorf("from a temporary binary the demo should say to install it first:\n%s", d.output)
	} else if exe != "" && m[1] != shellQuote(exe) {
		t.Errorf("the stdio command names %s, want the running binary %s", m[1], shellQuote(exe))
	}
	cmd := exec.Command(binary(t), strings.Fields(m[2])...)
	client := gomcp.NewClient(&gomcp.Implementation{Name: "pasted", Version: "1"}, nil)
	sess, err := client.Connect(t.Context(), &gomcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("the pasted stdio command: %v", err)
	}
	defer sess.Close()
	res, out := call(t, sess, "fetch", map[string]any{"key": "demo", "path": "/v1/participants/p-000001"})
	if res.IsError || out["status"] != float64(200) {
		t.Fatalf("fetch through the pasted stdio command: %s", text(res))
	}
	// The REST call above and this one share the budget: 2 used.
	if q := out["quota"].(map[string]any); q["remaining"] != float64(118) {
		t.Errorf("quota after the pasted calls = %v, want 118 remaining (the state file shared)", q)
	}
	// The JSON line is valid JSON with the same arguments.
	j := regexp.MustCompile(`(?m)^  Any client \(JSON\):\s+(\{"mcpServers": \{"mcp-quota-stdio".*)$`).FindStringSubmatch(d.output)
	var cfg struct {
		MCPServers map[string]struct {
			Command string   `json:"command"`
			Args    []string `json:"args"`
		} `json:"mcpServers"`
	}
	if j == nil || json.Unmarshal([]byte(j[1]), &cfg) != nil || strings.Join(cfg.MCPServers["mcp-quota-stdio"].Args, " ") != m[2] {
		t.Errorf("the stdio JSON line %q does not carry the command's arguments %q", j, m[2])
	}
}

// TestStdioAfterTheDemoStopped: the demo key's upstream lives inside
// "serve --demo"; a stdio server still registered with the demo's files
// says so, rather than only "connection refused".
func TestStdioAfterTheDemoStopped(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	d := startDemoServe(t, dir)
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	s := &setup{dir: dir, config: filepath.Join(dir, "demo", "config.toml"), state: filepath.Join(dir, "state.db")}
	sess := s.stdioSession(t, nil)
	res, _ := call(t, sess, "fetch", map[string]any{"key": "demo", "path": "/v1/participants"})
	if !res.IsError || errorCode(res) != "upstreamUnavailable" {
		t.Fatalf("fetch with the demo stopped: %s; want an upstreamUnavailable error", text(res))
	}
	if !strings.Contains(text(res), "serve --demo") || !strings.Contains(text(res), "start it again") {
		t.Errorf("fetch with the demo stopped says %q; want it to say the upstream lives inside serve --demo", text(res))
	}
}

// TestDemoAddressInUseWithAStaleRunningFile: a demo that ended without
// tidying (killed) left its running file; the address now held by another
// program is refused as such, not as a running demo.
func TestDemoAddressInUseWithAStaleRunningFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "demo"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "demo", demoRunning), []byte("MCP at http://127.0.0.1:1/mcp, process 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	var out, errOut strings.Builder
	err = run(t.Context(), []string{"serve", "--demo", "--listen", busy.Addr().String(), "--state", filepath.Join(dir, "state.db")},
		nil, &out, &errOut, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "already in use") || strings.Contains(err.Error(), "another mcp-quota serve --demo") {
		t.Errorf("serve --demo on an address another program holds, beside a stale running file: %v; want the address refused", err)
	}
}
