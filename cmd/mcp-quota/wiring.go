package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/internal/spelling"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"io"
	"io/fs"
	"log/slog"
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
	fs.StringVar(&c.state, "state", e.getenv("MCP_QUOTA_STATE"), "the state: a SQLite file, or a PostgreSQL URL postgres://user@host:5432/db shared by many hosts (default: the config's state, else the user state dir, mcp-quota/state.db)")
	fs.StringVar(&c.logLevel, "log-level", defaultLevel, "log level: debug, info, warn or error (logs go to stderr)")
	return fs
}

// parse parses a command's flags. -h prints the command's flags to stdout
// (errHelp: exit status 0); a mistake prints them to stderr (errUsage).
// A --state (or MCP_QUOTA_STATE) that is a URL of another scheme than
// PostgreSQL's is refused here, before anything is opened.
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
		if name, best := misspeltFlag(fs, args); best != "" {
			fmt.Fprintf(e.stderr, "%s: unknown flag -%s: did you mean --%s?\n", fs.Name(), name, best)
		}
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

// misspeltFlag finds the first flag in args that fs does not define, and
// the defined flag it most likely meant ("" when none is close).
func misspeltFlag(fs *flag.FlagSet, args []string) (name, best string) {
	var defined []string
	fs.VisitAll(func(f *flag.Flag) { defined = append(defined, f.Name) })
	for _, a := range args {
		if a == "--" || !strings.HasPrefix(a, "-") || a == "-" {
			continue
		}
		n, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if fs.Lookup(n) == nil {
			return n, spelling.Closest(n, defined)
		}
	}
	return "", ""
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

// refuseURL refuses a state location that is a URL of a scheme with no
// back end (the state is a SQLite file or a PostgreSQL database), and a
// PostgreSQL location, URL or keyword/value string, with a password.
func refuseURL(location, source string) error {
	if state.IsPostgres(location) {
		if state.HasPassword(location) {
			return fmt.Errorf("%s %s %w", source, state.Redact(location), state.ErrPassword)
		}
		return nil
	}
	m := urlScheme.FindStringSubmatch(location)
	if m == nil {
		return nil
	}
	return fmt.Errorf("%s %s is a URL, and mcp-quota has no state back end for %s://: "+
		"its state is a SQLite file (give %s a file path; every process on the host sharing a budget names the same file) "+
		"or a PostgreSQL database shared by many hosts (postgres://user@host:5432/database)",
		source, state.Redact(location), m[1], source)
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

// stateInConfig is the configuration's check of its state location: a
// config file is no place for a password, and the state knows where a
// location holds one.
func stateInConfig(location string) error {
	if state.HasPassword(location) {
		return state.ErrPassword
	}
	return nil
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

// statePath is where the state is: --state (or MCP_QUOTA_STATE), else
// the configuration's state, else the file in the user's state directory.
func (e environment) statePath(c common, keys *keystore.Store) string {
	if c.state != "" {
		return c.state
	}
	if keys != nil && keys.State() != "" {
		return keys.State()
	}
	return filepath.Join(stateDir(e.getenv), "mcp-quota", "state.db")
}

// journalDir is where this host keeps the journals of its processes for
// the PostgreSQL state at location: in the user's state directory, one
// directory per database (named by user, host, port and database, however
// location spells them).
func (e environment) journalDir(location string) string {
	where, err := state.PostgresWhere(location)
	if err != nil {
		where = "unparsed" // opening it fails, before any journal is kept
	}
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' {
			return r
		}
		return '_'
	}, where)
	return filepath.Join(stateDir(e.getenv), "mcp-quota", "journals", name)
}

// stateShown is the state location as it may be shown: a file's absolute
// path, or a PostgreSQL location without a password.
func stateShown(location string) string {
	if state.IsPostgres(location) || urlScheme.MatchString(location) {
		return state.Redact(location)
	}
	return absPath(location)
}

// clock is the process's clock: real time, moved by MCP_QUOTA_CLOCK_SKEW
// (a duration such as -5s) when it is set — for tests of hosts whose
// clocks disagree.
func (e environment) clock() (clock.Clock, error) {
	s := e.getenv("MCP_QUOTA_CLOCK_SKEW")
	if s == "" {
		return clock.Real, nil
	}
	skew, err := time.ParseDuration(s)
	if err != nil {
		return nil, fmt.Errorf("MCP_QUOTA_CLOCK_SKEW %q: give a duration such as 5s or -2s", s)
	}
	return clock.Source(func() time.Time { return time.Now().Add(skew) }), nil
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

// keysUse says what a command does with the configuration it loads.
type keysUse int

const (
	// keysToServe: serve authenticates callers, so it reads their tokens,
	// and warns of a key without a credential.
	keysToServe keysUse = iota
	// keysForStdio: stdio authenticates no caller; it warns of a key
	// without a credential.
	keysForStdio
	// keysToRead: status and activity only read the state; they read no
	// caller token and warn of nothing (status shows each key's credential
	// in its own output).
	keysToRead
)

// loadKeys reads the configuration. A missing file at the default
// location is not an error: the server starts with no keys and says so. A
// file named by --config or MCP_QUOTA_CONFIG must exist.
func (e environment) loadKeys(c common, log *slog.Logger, use keysUse) (*keystore.Store, error) {
	path := e.configPath(c)
	s, err := keystore.Load(path, keystore.Env{Getenv: e.getenv, NoCallerTokens: use != keysToServe, CheckState: stateInConfig})
	if errors.Is(err, fs.ErrNotExist) {
		if c.config != "" {
			source := "--config"
			if c.config == e.getenv("MCP_QUOTA_CONFIG") {
				source = "MCP_QUOTA_CONFIG"
			}
			return nil, fmt.Errorf("the configuration file %s (from %s) does not exist: fix the path, or write a starting one with: mcp-quota init --config %s", path, source, path)
		}
		if use != keysToRead {
			log.Warn("no configuration file: starting with no keys", "config", path)
		}
		return &keystore.Store{}, nil
	}
	if err != nil {
		return nil, err
	}
	if h, ok := log.Handler().(*keystore.ScrubHandler); ok {
		h.Add(s) // after a reload, the old credentials too: calls in flight hold them
	}
	for _, k := range s.Keys() {
		if _, err := k.Credential(); err != nil && use != keysToRead {
			log.Warn("key without a credential: calls through it will fail until it is set", "key", k.Name, "reason", err)
		}
	}
	return s, nil
}

// app is everything the servers share.
type app struct {
	keys   *keystore.Store
	db     state.Store
	clock  clock.Clock // the state's clock: the database server's, when hosts share one
	pacer  *pacer.Pacer
	client *upstream.Client
	log    *slog.Logger
}

// open opens the state and what runs on it. A command that serves calls
// for long waits for a PostgreSQL state that does not answer at its start
// (its calls fail with stateUnavailable until it does); the others fail.
func (e environment) open(ctx context.Context, c common, keys *keystore.Store, log *slog.Logger, serving bool) (*app, error) {
	db, clk, err := e.openState(ctx, c, keys, log, serving)
	if err != nil {
		return nil, err
	}
	// Every clock of the process is the state's: on a PostgreSQL state the
	// database server's, as this process reckons it.
	p := pacer.New(db, pacer.WithClock(clk))
	client := upstream.New(p, log)
	client.Clock = clk
	if keys != nil {
		client.Bodies = upstream.NewBodyMemory(keys.BodyMemory())
	}
	return &app{keys: keys, db: db, clock: clk, pacer: p, client: client, log: log}, nil
}

// commandStateTimeout bounds each transaction of a command that is not
// serving (status, activity) when state_timeout is shorter: state_timeout
// says how long a call waits before it fails with stateUnavailable, and a
// person reading the activity on a busy machine can wait longer.
const commandStateTimeout = 10 * time.Second

// openState opens the state, and returns the clock its admissions keep.
// A failure says in words what is wrong (see explainState; a PostgreSQL
// state's errors say it themselves).
func (e environment) openState(ctx context.Context, c common, keys *keystore.Store, log *slog.Logger, serving bool) (state.Store, clock.Clock, error) {
	local, err := e.clock()
	if err != nil {
		return nil, nil, err
	}
	path := e.statePath(c, keys)
	if state.IsPostgres(path) {
		o := state.PostgresOptions{Clock: local, WaitForServer: serving,
			JournalDir: e.journalDir(path)}
		if keys != nil {
			o.Timeout = keys.StateTimeout()
		}
		if !serving {
			o.Timeout = max(o.Timeout, commandStateTimeout)
		}
		pg, err := state.OpenPostgres(ctx, path, o)
		if err != nil {
			return nil, nil, err
		}
		if err := pg.Check(ctx); err != nil && log != nil {
			log.Warn("the PostgreSQL state does not answer yet: calls fail with stateUnavailable until it does", "state", pg.Where(), "error", err)
		}
		return pg, clock.Source(pg.Now), nil
	}
	db, err := state.Open(ctx, path, state.WithClock(local))
	if err != nil && ctx.Err() == nil {
		return nil, nil, explainState(path, err)
	}
	return db, local, err
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

// sessionSecret is what MCP session IDs are signed with: a key kept in the
// state, so that every host (and process) sharing it serves every session.
// When the state cannot give it now, the process signs with a secret of
// its own: its sessions then work on it alone, until it restarts.
func (a *app) sessionSecret(ctx context.Context) keystore.Secret {
	key, err := a.db.SigningKey(ctx, "mcp-sessions")
	if errors.Is(err, state.ErrUnavailable) { // why is said once, by openState
		a.log.Warn("the state does not answer, so it gives no session key now: MCP sessions opened here work on this process only, until it restarts")
		return keystore.Secret{}
	}
	if err != nil {
		a.log.Warn("the state gives no session key now: MCP sessions opened here work on this process only, until it restarts", "error", err)
		return keystore.Secret{}
	}
	return keystore.NewSecret(string(key))
}

func (a *app) tools(transport ledger.Transport, localCaller string) *tools.Deps {
	return &tools.Deps{Keys: a.keys, Client: a.client, Pacer: a.pacer, DB: a.db, Log: a.log, Transport: transport, LocalCaller: localCaller,
		Clock: a.clock, SkipOutputCheck: true}
}

func (a *app) rest() *rest.Handler {
	return &rest.Handler{Keys: a.keys, Client: a.client, Pacer: a.pacer, DB: a.db, Log: a.log, Clock: a.clock}
}

// sweepUntilDone runs the sweep until ctx ends or the returned function
// is called, which returns once the sweep has ended: the state must not
// close under it.
func (a *app) sweepUntilDone(ctx context.Context) func() {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.sweep(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// sweep records what the journals of processes that died hold, marks
// their attempts as interrupted and drops old history, now and every ten
// minutes until ctx ends (every 30 s while the state fails).
//
// A state that does not answer is said once an outage, not every 30 s:
// at the start, openState has said it already.
func (a *app) sweep(ctx context.Context) {
	said := true // that the state does not answer
	for {
		next := 10 * time.Minute
		failed := false
		warn := func(msg string, err error) {
			failed, next = true, 30*time.Second
			if !errors.Is(err, state.ErrUnavailable) || !said {
				a.log.Warn(msg, "error", err)
			}
			said = said || errors.Is(err, state.ErrUnavailable)
		}
		if _, err := a.db.Recover(ctx); err != nil && ctx.Err() == nil {
			warn("recording the journal of a process that ended failed; trying again in 30 s", err) // its journals wait
		}
		now := a.clock.Now()
		if _, err := a.db.Sweep(ctx, now, now.Add(-a.keys.Retention())); err != nil && ctx.Err() == nil {
			warn("sweeping the state failed; trying again in 30 s", err)
		}
		if !failed {
			said = false
		}
		t := time.NewTimer(next)
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
