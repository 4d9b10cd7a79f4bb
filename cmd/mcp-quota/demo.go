package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/state"
)

// demoSetup is a running demo upstream and the files that describe it: a
// configuration with one key for it, the key's secret and two caller
// tokens, all 0600 in the state directory's demo folder. The files are
// made once and reused by every later demo, so that the tokens an
// assistant was registered with keep working; while a demo runs it holds
// the folder's lock, and a second demo is refused rather than let touch
// them.
type demoSetup struct {
	upstream   *http.Server
	lock       *demoLock
	dir        string
	baseURL    string
	configPath string
	agentToken string // file paths, never the tokens themselves
	syncToken  string
}

func (d *demoSetup) close() {
	if d.upstream != nil {
		d.upstream.Close()
	}
	d.lock.release(d.dir)
}

// startDemo takes the demo folder's lock, starts the demo upstream on
// listen (by default on the address the folder's configuration names, so
// that processes reading it keep reaching it across restarts) and writes
// what is missing of the folder's files. listenSet says listen was given
// with --demo-listen.
func (e environment) startDemo(ctx context.Context, c common, listen string, listenSet bool, log *slog.Logger) (*demoSetup, error) {
	dir, err := e.demoDir(c)
	if err != nil {
		return nil, err
	}
	lock, err := lockDemo(ctx, dir, demoLockWait)
	if err != nil {
		return nil, err
	}
	d := &demoSetup{lock: lock, dir: dir, configPath: filepath.Join(dir, "config.toml"),
		agentToken: filepath.Join(dir, "agent.token"), syncToken: filepath.Join(dir, "sync.token")}
	secretPath := filepath.Join(dir, "upstream.secret")
	secret, err := d.keepTokens(secretPath)
	if err != nil {
		d.close()
		return nil, err
	}
	ln, err := d.listen(listen, listenSet)
	if err != nil {
		d.close()
		return nil, err
	}
	api := demo.New(demo.Config{Tokens: []string{secret}})
	d.upstream = &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slogLogger(log)}
	go d.upstream.Serve(ln)
	d.baseURL = "http://" + ln.Addr().String()
	cfg := d.configText(secretPath, stateShown(e.statePath(c, nil)))
	if old, err := os.ReadFile(d.configPath); err != nil || string(old) != cfg {
		if err := writeFileAtomic(d.configPath, []byte(cfg)); err != nil {
			d.close()
			return nil, err
		}
	}
	return d, nil
}

// demoDir makes the demo's folder, beside the state file (or, for a
// PostgreSQL state, beside the default one: the demo's files stay on this
// host), and returns its absolute path.
func (e environment) demoDir(c common) (string, error) {
	dir, err := e.demoDirPath(c)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("demo: cannot create its folder: %w", err)
	}
	return dir, nil
}

// demoDirPath is the absolute path of the demo's folder (see demoDir),
// which may not exist.
func (e environment) demoDirPath(c common) (string, error) {
	near := e.statePath(c, nil)
	if state.IsPostgres(near) {
		near = e.statePath(common{}, nil) // the demo's files stay on this host
	}
	return filepath.Abs(filepath.Join(filepath.Dir(near), "demo"))
}

// demoHeld returns the error lockDemo gives a second demo when a demo
// holds the lock of the folder c's demo would use, and nil otherwise. It
// is asked when serve --demo finds its address in use: the same command
// run twice meets the first's address before its lock, and should hear
// of the first demo, not of "another program". A folder without a
// running file has no demo to name and is not touched; nor is one whose
// file an ended demo left (the next demo writes it anew). The probe holds
// the lock for a moment only, and a demo starting meanwhile waits it out
// (demoLockWait).
func (e environment) demoHeld(ctx context.Context, c common) error {
	dir, err := e.demoDirPath(c)
	if err != nil {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, demoRunning)); err != nil {
		return nil
	}
	lock, err := lockDemo(ctx, dir, 0)
	if err != nil {
		if errors.Is(err, errDemoHeld) {
			return err
		}
		return nil
	}
	lock.unlock()
	return nil
}

// keepTokens makes the demo upstream's secret (at secretPath) and the
// callers' tokens, keeping those an earlier demo wrote, and returns the
// secret.
func (d *demoSetup) keepTokens(secretPath string) (string, error) {
	secret, err := keepToken(secretPath)
	if err != nil {
		return "", err
	}
	for _, p := range []string{d.agentToken, d.syncToken} {
		if _, err := keepToken(p); err != nil {
			return "", err
		}
	}
	return secret, nil
}

// listen binds the demo upstream's address: the one its configuration
// names when it is free and --demo-listen was not given (listenSet),
// listen otherwise.
func (d *demoSetup) listen(listen string, listenSet bool) (net.Listener, error) {
	var ln net.Listener
	if prev := previousUpstream(d.configPath); !listenSet && prev != "" {
		// The address the configuration names, when it is free; another
		// one otherwise (and the configuration is rewritten).
		ln, _ = net.Listen("tcp", prev)
	}
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", listen); err != nil {
			return nil, listenError("the demo upstream", listen, "--demo-listen", err)
		}
	}
	return ln, nil
}

// configText is the demo's configuration: its key for the demo upstream,
// whose secret is at secretPath, and the callers agent and sync; stateNamed is
// the state the comment tells another process to share.
func (d *demoSetup) configText(secretPath, stateNamed string) string {
	return fmt.Sprintf(`# Written by "mcp-quota serve --demo" for its built-in demo upstream; later demos reuse
# this folder's files (the tokens stay the same) and rewrite this file only when the
# demo upstream's address changes.
# Another process shares the demo key's budget with: mcp-quota stdio --config %[1]q --state %[6]q

[[keys]]
name = "demo"
base_url = %[2]q
secret_file = %[3]q
auth = "bearer"
profile = "ietf"
unreachable_hint = "This key's upstream is the demo inside \"mcp-quota serve --demo\", which is not running: start it again (it reuses this folder's files)"
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
`, d.configPath, d.baseURL, secretPath, d.agentToken, d.syncToken, stateNamed)
}

// previousUpstream returns the demo upstream address the configuration
// at path names, or "".
func previousUpstream(path string) string {
	s, err := keystore.Load(path, keystore.Env{Getenv: func(string) string { return "" }})
	if err != nil {
		return ""
	}
	k, err := s.Key("demo")
	if err != nil || k.BaseURL.Hostname() != "127.0.0.1" {
		return ""
	}
	return k.BaseURL.Host
}

// announce prints what a newcomer needs: the endpoints, ready MCP client
// configurations for HTTP and stdio, and the REST base URL for a sync job.
// Every command line works as pasted (on a Unix shell): tokens are read
// from their files with $(cat …), so they appear on no screen.
func (d *demoSetup) announce(w io.Writer, base, statePath, exe string) {
	d.lock.announce(d.dir, fmt.Sprintf("MCP at %s/mcp, process %d", base, os.Getpid()))
	statePath = stateShown(statePath)
	fmt.Fprintf(w, `mcp-quota demo: a demo upstream that allows 120 calls per minute per key is running at %s
(key "demo"; its credential stays inside mcp-quota). The demo's files are in %s;
later demos reuse them, so the tokens below stay valid.

MCP (Streamable HTTP):  %s/mcp
  caller token file:    %s
  Claude Code:          claude mcp add --transport http mcp-quota %s/mcp --header "Authorization: Bearer $(cat %s)"
  Any client (JSON):    {"mcpServers": {"mcp-quota": {"type": "http", "url": "%s/mcp",
                          "headers": {"Authorization": "Bearer <contents of %s>"}}}}
`, d.baseURL, d.dir, base, d.agentToken, base, d.agentToken, base, d.agentToken)
	bin := exe
	if bin == "" {
		bin = installedPath()
		fmt.Fprintf(w, `MCP (stdio), sharing the same budget from another process (go run's binary is temporary:
run "go install ./cmd/mcp-quota" first, which puts it at %s):
`, bin)
	} else {
		fmt.Fprintln(w, "MCP (stdio), sharing the same budget from another process:")
	}
	args, _ := json.Marshal([]string{"stdio", "--config", d.configPath, "--state", statePath})
	fmt.Fprintf(w, `  Command:              %s stdio --config %s --state %s
  Claude Code:          claude mcp add --transport stdio mcp-quota-stdio -- %s stdio --config %s --state %s
  Any client (JSON):    {"mcpServers": {"mcp-quota-stdio": {"command": %q, "args": %s}}}

REST for a sync job:    %s/k/demo/
  curl -H "Authorization: Bearer $(cat %s)" '%s/k/demo/v1/participants?limit=500'
  curl -H "Authorization: Bearer $(cat %s)" '%s/v1/quota'
  curl -H "Authorization: Bearer $(cat %s)" '%s/v1/activity?key=demo'

Dashboard:              %s/  (sign in with the contents of a token file above)
Prometheus metrics:     %s/metrics  (with a caller token as a bearer token)

Press Ctrl-C to stop.
`, shellQuote(bin), shellQuote(d.configPath), shellQuote(statePath),
		shellQuote(bin), shellQuote(d.configPath), shellQuote(statePath), bin, args,
		base, shellQuote(d.syncToken), base, shellQuote(d.syncToken), base, shellQuote(d.syncToken), base, base, base)
}

// demoExecutable returns the path of the running binary for the stdio
// lines, or "" when it is go run's temporary build, which is gone once the
// demo stops.
func demoExecutable() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	if exe, err = filepath.EvalSymlinks(exe); err != nil {
		return ""
	}
	if strings.Contains(exe, string(filepath.Separator)+"go-build") {
		return ""
	}
	return exe
}

// installedPath is where "go install ./cmd/mcp-quota" puts the binary.
func installedPath() string {
	if d := os.Getenv("GOBIN"); d != "" {
		return filepath.Join(d, "mcp-quota")
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "mcp-quota"
		}
		gopath = filepath.Join(home, "go")
	}
	return filepath.Join(filepath.SplitList(gopath)[0], "bin", "mcp-quota")
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+:=@,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// keepToken returns the token in path, writing a new random one (0600)
// first when the file is missing or holds none.
func keepToken(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		if tok := strings.TrimSpace(string(b)); len(tok) >= 16 {
			return tok, nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("demo: %w", err)
	}
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	tok := hex.EncodeToString(b[:])
	if err := writeFileAtomic(path, []byte(tok+"\n")); err != nil {
		return "", err
	}
	return tok, nil
}

// writeFileAtomic writes data to path (0600) through a temporary file, so
// that a process reading path sees the old content or the new, never a
// part.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("demo: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if err := os.Chmod(f.Name(), 0o600); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	return os.Rename(f.Name(), path)
}

// A demoLock is the demo folder's lock: an SQLite file whose write lock
// its holder keeps for as long as it runs. SQLite's locks work across
// processes on every platform Go and SQLite run on, and the operating
// system drops them when the holder dies, so a demo that crashed never
// blocks the next.
type demoLock struct {
	db   *sql.DB
	conn *sql.Conn
}

// errDemoHeld begins the error of a demo whose folder another demo uses.
var errDemoHeld = errors.New("another mcp-quota serve --demo is running")

// demoRunning is the file in which the lock's holder says where it runs,
// for the error a second demo gets.
const demoRunning = "running"

// demoLockWait is how long a demo waits for its folder's lock: long
// enough for another command's probe (demoHeld), never for another demo.
const demoLockWait = time.Second

// lockDemo takes the demo's lock in dir (a SQLite write transaction held
// open), waiting up to wait for it, so that one demo at a time uses its
// files; a second gets an error that says where the first runs.
func lockDemo(ctx context.Context, dir string, wait time.Duration) (*demoLock, error) {
	path := filepath.Join(dir, "lock.db")
	if f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600); err == nil {
		f.Close() // made 0600 before SQLite makes it, and its journal, with its own modes
	}
	db, err := sql.Open("sqlite", fmt.Sprintf("file:%s?_pragma=busy_timeout(%d)", (&url.URL{Path: path}).EscapedPath(), wait.Milliseconds()))
	if err != nil {
		return nil, fmt.Errorf("demo: lock %s: %w", path, err)
	}
	conn, err := db.Conn(ctx)
	if err == nil {
		_, err = conn.ExecContext(ctx, "BEGIN IMMEDIATE")
	}
	if err != nil {
		if conn != nil {
			conn.Close()
		}
		db.Close()
		if c, ok := errors.AsType[sqliteCoder](err); !ok || c.Code()&0xff != sqliteBusy {
			return nil, fmt.Errorf("demo: cannot take the lock %s: %w", path, err)
		}
		where := ""
		if b, rerr := os.ReadFile(filepath.Join(dir, demoRunning)); rerr == nil && len(b) > 0 {
			where = " (" + strings.TrimSpace(string(b)) + ")"
		}
		return nil, fmt.Errorf("%w with the demo files in %s%s: "+
			"use that one, stop it first, or give this one its own files and address with --state OTHER_DIR/state.db --listen 127.0.0.1:8788", errDemoHeld, dir, where)
	}
	return &demoLock{db: db, conn: conn}, nil
}

// announce records where the holder serves.
func (l *demoLock) announce(dir, where string) {
	_ = writeFileAtomic(filepath.Join(dir, demoRunning), []byte(where+"\n"))
}

// release removes the running file and gives the lock back.
func (l *demoLock) release(dir string) {
	if l == nil {
		return
	}
	os.Remove(filepath.Join(dir, demoRunning))
	l.unlock()
}

// unlock gives the lock back.
func (l *demoLock) unlock() {
	_, _ = l.conn.ExecContext(context.Background(), "ROLLBACK")
	l.conn.Close()
	l.db.Close()
}

// demoUpstream runs the demo upstream alone, for experiments and
// benchmarks: it prints its URL and accepts the tokens given (any bearer
// token when none is).
func (e environment) demoUpstream(ctx context.Context, args []string) error {
	// Only its own flags: it reads no configuration or state, and logs
	// nothing.
	fs := flag.NewFlagSet("mcp-quota demo-upstream", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8788", "address to listen on")
	mode := fs.String("mode", string(demo.FixedWindow), "how it announces and enforces its limit: seed, sliding, hidden, github, retry-after, silent, liar")
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
		return listenError("the demo upstream", *listen, "--listen", err)
	}
	fmt.Fprintf(e.stdout, "demo upstream (%s, %d calls per %s per key) at http://%s\n", m, *quota, *window, ln.Addr())
	return serveUntil(ctx, &http.Server{Handler: demo.New(cfg), ReadHeaderTimeout: 10 * time.Second}, ln)
}

func slogLogger(l *slog.Logger) *log.Logger {
	return slog.NewLogLogger(l.Handler(), slog.LevelError)
}
