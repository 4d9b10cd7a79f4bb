package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/rest"
	"github.com/mcp-quota/mcp-quota/state"
	"github.com/mcp-quota/mcp-quota/tools"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// environment is what every command gets from the process.
type environment struct {
	getenv func(string) string
	stdout io.Writer
	stderr io.Writer
}

// common are the flags every command shares.
type common struct {
	config   string
	state    string
	logLevel string
}

func (e environment) flags(name string, c *common, defaultLevel string) *flag.FlagSet {
	fs := flag.NewFlagSet("mcp-quota "+name, flag.ContinueOnError)
	fs.StringVar(&c.config, "config", e.getenv("MCP_QUOTA_CONFIG"), "configuration file (default: the user config dir, mcp-quota/config.toml)")
	fs.StringVar(&c.state, "state", e.getenv("MCP_QUOTA_STATE"), "state file (default: the user state dir, mcp-quota/state.db)")
	fs.StringVar(&c.logLevel, "log-level", defaultLevel, "log level: debug, info, warn or error (logs go to stderr)")
	return fs
}

// parse parses a command's flags. -h prints the command's flags to stdout
// (errHelp: exit status 0); a mistake prints them to stderr (errUsage).
// A --state (or MCP_QUOTA_STATE) that is a URL is refused here, before
// anything is opened.
func (e environment) parse(fs *flag.FlagSet, args []string) error {
	var out strings.Builder
	fs.SetOutput(&out)
	fs.Usage = func() {
		fmt.Fprintf(&out, "Usage of %s:\n", fs.Name())
		fs.PrintDefaults()
	}
	err := fs.Parse(args)
	fs.SetOutput(e.stderr)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(e.stdout, out.String())
		return errHelp
	}
	fmt.Fprint(e.stderr, out.String())
	if err != nil {
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(e.stderr, "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return errUsage
	}
	if f := fs.Lookup("state"); f != nil {
		if err := refuseURL(f.Value.String(), e.source(fs, "state", "MCP_QUOTA_STATE")); err != nil {
			return err
		}
	}
	return nil
}

// source names where a flag's value came from: the flag, or the
// environment variable that is its default.
func (e environment) source(fs *flag.FlagSet, name, envVar string) string {
	if !flagSet(fs, name) && e.getenv(envVar) != "" {
		return envVar
	}
	return "--" + name
}

// urlScheme matches a URL's scheme, as RFC 3986 §3.1 writes it, followed
// by "://"; a Windows path (C:\…) has no "//".
var urlScheme = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]*)://`)

// refuseURL refuses a state location that is a URL: the state is a SQLite
// file, and no back end for another scheme exists yet.
func refuseURL(location, source string) error {
	m := urlScheme.FindStringSubmatch(location)
	if m == nil {
		return nil
	}
	return fmt.Errorf("%s %s is a URL, and mcp-quota has no state back end for %s:// yet: "+
		"its state is a SQLite file, so give %s a file path (every process sharing a budget names the same file)",
		source, redactURL(location), m[1], source)
}

// redactURL drops the password a URL may carry, for the error message.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		if err != nil {
			return "(a URL)"
		}
		return s
	}
	return u.Redacted()
}

func (e environment) logger(c common) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: use debug, info, warn or error", c.logLevel)
	}
	// The last wall of the logs: once the configuration is read (see
	// loadKeys), no line holds a credential in any form.
	return slog.New(keystore.NewScrubHandler(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: level}))), nil
}

// configPath and statePath resolve the defaults.
func (e environment) configPath(c common) string {
	if c.config != "" {
		return c.config
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		dir = "."
	}
	return filepath.Join(dir, "mcp-quota", "config.toml")
}

func (e environment) statePath(c common) string {
	if c.state != "" {
		return c.state
	}
	return filepath.Join(stateDir(e.getenv), "mcp-quota", "state.db")
}

// stateDir is the user's state directory: $XDG_STATE_HOME, else
// ~/.local/state on Unix and the user config dir elsewhere.
func stateDir(getenv func(string) string) string {
	if d := getenv("XDG_STATE_HOME"); d != "" && filepath.IsAbs(d) {
		return d
	}
	if runtime.GOOS != "windows" && runtime.GOOS != "darwin" {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, ".local", "state")
		}
	}
	if d, err := os.UserConfigDir(); err == nil {
		return d
	}
	return "."
}

// loadKeys reads the configuration. A missing file at the default
// location is not an error: the server starts with no keys and says so. A
// file named by --config or MCP_QUOTA_CONFIG must exist.
func (e environment) loadKeys(c common, log *slog.Logger) (*keystore.Store, error) {
	path := e.configPath(c)
	s, err := keystore.Load(path, keystore.Env{Getenv: e.getenv})
	if errors.Is(err, fs.ErrNotExist) {
		if c.config != "" {
			source := "--config"
			if c.config == e.getenv("MCP_QUOTA_CONFIG") {
				source = "MCP_QUOTA_CONFIG"
			}
			return nil, fmt.Errorf("the configuration file %s (from %s) does not exist: fix the path, or write a starting one with: mcp-quota init --config %s", path, source, path)
		}
		log.Warn("no configuration file: starting with no keys", "config", path)
		return &keystore.Store{}, nil
	}
	if err != nil {
		return nil, err
	}
	if h, ok := log.Handler().(*keystore.ScrubHandler); ok {
		h.Use(s)
	}
	for _, k := range s.Keys() {
		if _, err := k.Credential(); err != nil {
			log.Warn("key without a credential: calls through it will fail until it is set", "key", k.Name, "reason", err)
		}
	}
	return s, nil
}

// app is everything the servers share.
type app struct {
	keys   *keystore.Store
	db     *state.DB
	pacer  *pacer.Pacer
	client *upstream.Client
	log    *slog.Logger
}

func (e environment) open(ctx context.Context, c common, keys *keystore.Store, log *slog.Logger) (*app, error) {
	db, err := e.openState(ctx, c)
	if err != nil {
		return nil, err
	}
	p := pacer.New(db)
	return &app{keys: keys, db: db, pacer: p, client: upstream.New(p, log), log: log}, nil
}

// openState opens the state file; a failure says in words what is wrong
// with it (see explainState).
func (e environment) openState(ctx context.Context, c common) (*state.DB, error) {
	path := e.statePath(c)
	db, err := state.Open(ctx, path)
	if err != nil && ctx.Err() == nil {
		return nil, explainState(path, err)
	}
	return db, err
}

// close gives back the slots of the pacer's leases, then closes the state
// file. Slots it cannot give back in time stay counted until the sweep.
func (a *app) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.pacer.Close(ctx); err != nil {
		a.log.Warn("giving back leased slots failed; they stay counted until their lease ends", "error", err)
	}
	if err := a.db.Close(); err != nil {
		a.log.Warn("closing the state file failed; what its journal holds is recorded by the next process to open it", "error", err)
	}
}

func (a *app) tools(transport, localCaller string) *tools.Deps {
	return &tools.Deps{Keys: a.keys, Client: a.client, Pacer: a.pacer, DB: a.db, Log: a.log, Transport: transport, LocalCaller: localCaller}
}

func (a *app) rest() *rest.Handler {
	return &rest.Handler{Keys: a.keys, Client: a.client, Pacer: a.pacer, DB: a.db, Log: a.log}
}

// sweep records what the journals of processes that died hold, marks
// their attempts as interrupted and drops old history, now and every ten
// minutes until ctx ends.
func (a *app) sweep(ctx context.Context) {
	for {
		if _, err := a.db.Recover(ctx); err != nil && ctx.Err() == nil {
			a.log.Warn("recording the journal of a process that ended failed", "error", err)
		}
		now := time.Now()
		if _, err := a.db.Sweep(ctx, now, now.Add(-a.keys.Retention())); err != nil && ctx.Err() == nil {
			a.log.Warn("sweeping the state file failed", "error", err)
		}
		t := time.NewTimer(10 * time.Minute)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
