package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/mcp-quota/mcp-quota/demo"
)

// demoSetup is a running demo upstream and the files that describe it: a
// configuration with one key for it, the key's secret and two caller
// tokens, all 0600 in the state directory's demo folder.
type demoSetup struct {
	upstream   *http.Server
	baseURL    string
	configPath string
	agentToken string // file paths, never the tokens themselves
	syncToken  string
}

func (d *demoSetup) close() { d.upstream.Close() }

// startDemo starts the demo upstream on listen and writes a configuration
// for it next to the state file.
func (e environment) startDemo(c common, listen, gatewayAddr string, log *slog.Logger) (*demoSetup, error) {
	dir := filepath.Join(filepath.Dir(e.statePath(c)), "demo")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	secret, err := writeToken(filepath.Join(dir, "upstream.secret"))
	if err != nil {
		return nil, err
	}
	d := &demoSetup{configPath: filepath.Join(dir, "config.toml"),
		agentToken: filepath.Join(dir, "agent.token"), syncToken: filepath.Join(dir, "sync.token")}
	for _, p := range []string{d.agentToken, d.syncToken} {
		if _, err := writeToken(p); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("demo upstream: %w", err)
	}
	api := demo.New(demo.Config{Tokens: []string{secret}})
	d.upstream = &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slogLogger(log)}
	go d.upstream.Serve(ln)
	d.baseURL = "http://" + ln.Addr().String()
	cfg := fmt.Sprintf(`# Written by "mcp-quota serve --demo" for its built-in demo upstream.
# Another process shares the demo key's budget with: mcp-quota stdio --config %[1]q --state <the same state file>

[[keys]]
name = "demo"
base_url = %[2]q
secret_file = %[3]q
auth = "bearer"
profile = "ietf"
  [[keys.policies]]
  name = "default"
  quota = 120
  window = "60s"

[[callers]]
name = "agent"
token_file = %[4]q
keys = ["demo"]

[[callers]]
name = "sync"
token_file = %[5]q
keys = ["demo"]
`, d.configPath, d.baseURL, filepath.Join(dir, "upstream.secret"), d.agentToken, d.syncToken)
	if err := os.WriteFile(d.configPath, []byte(cfg), 0o600); err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

// announce prints what a newcomer needs: the endpoints, a ready MCP client
// config, and the REST base URL for a sync job.
func (d *demoSetup) announce(w io.Writer, base, statePath string) {
	fmt.Fprintf(w, `mcp-quota demo: a demo upstream that allows 120 calls per minute per key is running at %s
(key "demo"; its credential stays inside mcp-quota).

MCP (Streamable HTTP):  %s/mcp
  caller token file:    %s
  Claude Code:          claude mcp add --transport http mcp-quota %s/mcp --header "Authorization: Bearer $(cat %s)"
  Any client (JSON):    {"mcpServers": {"mcp-quota": {"type": "http", "url": "%s/mcp",
                          "headers": {"Authorization": "Bearer <contents of %s>"}}}}
MCP (stdio), sharing the same budget from another process:
  mcp-quota stdio --config %s --state %s

REST for a sync job:    %s/k/demo/
  curl -H "Authorization: Bearer $(cat %s)" '%s/k/demo/v1/participants?limit=500'
  GET %s/v1/quota and %s/v1/activity?key=demo show the shared budget and every call.

Press Ctrl-C to stop.
`, d.baseURL, base, d.agentToken, base, d.agentToken, base, d.agentToken,
		d.configPath, statePath, base, d.syncToken, base, base, base)
}

// writeToken writes a new random token to path (0600) and returns it.
func writeToken(path string) (string, error) {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	tok := hex.EncodeToString(b[:])
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		return "", err
	}
	return tok, nil
}

// demoUpstream runs the demo upstream alone, for experiments and
// benchmarks: it prints its URL and accepts the tokens given (any bearer
// token when none is).
func (e environment) demoUpstream(ctx context.Context, args []string) error {
	var c common
	fs := e.flags("demo-upstream", &c, "info")
	listen := fs.String("listen", "127.0.0.1:8788", "address to listen on")
	mode := fs.String("mode", string(demo.Seed), "how it announces and enforces its limit: seed, sliding, hidden, github, retry-after, silent, liar")
	quota := fs.Int("quota", 120, "calls per window per key")
	window := fs.Duration("window", time.Minute, "the window")
	tokens := fs.String("token", "", "comma-separated accepted bearer tokens (default: any)")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	m, err := demo.ParseMode(*mode)
	if err != nil {
		return err
	}
	cfg := demo.Config{Mode: m, Quota: *quota, Window: *window, Tokens: splitList(*tokens)}
	if err := cfg.Validate(); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "demo upstream (%s, %d calls per %s per key) at http://%s\n", m, *quota, *window, ln.Addr())
	return serveUntil(ctx, &http.Server{Handler: demo.New(cfg), ReadHeaderTimeout: 10 * time.Second}, ln)
}

func slogLogger(l *slog.Logger) *log.Logger {
	return slog.NewLogLogger(l.Handler(), slog.LevelError)
}
