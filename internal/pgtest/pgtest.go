// Package pgtest starts throwaway PostgreSQL servers for tests: each is a
// cluster of its own in a directory of its own (under /dev/shm or /tmp),
// listening on 127.0.0.1 on a free port, and gone, processes and files,
// when the test that started it ends (or, should the test process die
// without cleaning up, at once after that).
//
//	srv := pgtest.Start(t)
//	conn, err := pgx.Connect(ctx, srv.URLWithPassword("postgres"))
//	// or, in a database of the test's own:
//	conn, err = pgx.Connect(ctx, srv.CreateDatabase(t)+"&password="+srv.Password())
//
// Start finds the server binaries in $PG_BIN, else in the newest
// /usr/lib/postgresql/*/bin, else beside pg_ctl on PATH; without them it
// skips the test, except under CI=true, where it fails it. They must be
// PostgreSQL 15 or later. PostgreSQL refuses to run as root: as root,
// pgtest runs it as the postgres user.
//
// A server is tuned for tests, not for keeping data through a machine's
// crash: fsync and full-page writes are off. It survives its own (Kill):
// commits are synchronous, and every committed transaction is there after
// Restart.
package pgtest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// role is the superuser tests connect as.
const role = "mcpq"

const (
	// startTimeout bounds the wait for a started server to accept
	// connections (a loaded 2-core CI machine takes its time).
	startTimeout = time.Minute
	// stopTimeout bounds a shutdown; after it the server is killed.
	stopTimeout = time.Minute
	// portAttempts is how many free ports Start tries: another process can
	// take the one it picked before the server binds it.
	portAttempts = 3
)

// errExited says the server ended before it accepted connections.
var errExited = errors.New("postgres exited before accepting connections")

// Server is one throwaway PostgreSQL cluster: its data directory, log and
// Unix socket in a directory of its own, listening on 127.0.0.1 on a port
// that stays the same across Restart. A superuser role, mcpq, logs in over
// TCP with Password (scram-sha-256); the harness itself uses the Unix
// socket. The zero Server is not a server: use Start. A Server is safe for
// concurrent use.
type Server struct {
	bin      string  // the directory of initdb, postgres and pg_ctl
	acct     account // who runs them
	dir      string  // the data directory, the log and the Unix socket
	port     int
	password string
	watcher  *watcher // cleans up should this process die first
	dbs      atomic.Int64

	mu     sync.Mutex
	pm     *postmaster // nil while stopped
	logged bool        // the end of the log is in a failure already
}

// A postmaster is a server process started by this one.
type postmaster struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once it has exited
	err  error         // how it exited, once done is closed
}

// Start starts a server for tb and waits until it accepts connections; tb's
// cleanup stops it (immediately) and removes its files. Without PostgreSQL
// server binaries, or as root without a postgres user, it skips tb, or
// under CI=true fails it; a server that does not start fails tb, with the
// end of its log.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin, err := findBin()
	if err != nil {
		unavailable(tb, err)
	}
	testkit.SkipShort(tb, "starts a PostgreSQL server")
	acct, err := serverAccount()
	if err != nil {
		unavailable(tb, err)
	}
	dir, err := os.MkdirTemp(scratchRoot(), "pg")
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	s := &Server{bin: bin, acct: acct, dir: dir, password: rand.Text()}
	tb.Cleanup(func() { s.cleanup(tb) })
	if err := s.create(); err != nil {
		tb.Fatalf("pgtest: start a PostgreSQL server (binaries in %s): %v", bin, err)
	}
	return s
}

// create makes s's data directory, a copy of the template, starts the
// server on a free port and gives the role its password.
func (s *Server) create() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.acct.own(s.dir); err != nil {
		return err
	}
	w, err := s.acct.watch(s.dir, `"$1" stop -s -m immediate -D "$2"; rm -rf "$3"`,
		filepath.Join(s.bin, "pg_ctl"), s.data(), s.dir)
	if err != nil {
		return err
	}
	s.watcher = w
	template, err := templateFor(s.bin, s.acct)
	if err != nil {
		return err
	}
	if err := copyTree(s.data(), template, s.acct); err != nil {
		return fmt.Errorf("copy the template data directory: %w", err)
	}
	var conn *pgx.Conn
	for attempt := 1; ; attempt++ {
		if s.port, err = freePort(); err != nil {
			return err
		}
		if conn, err = s.start(); err == nil {
			break
		}
		if !errors.Is(err, errExited) || attempt == portAttempts {
			return err
		}
	}
	ctx := context.Background()
	defer conn.Close(ctx)
	// The password is base32 (rand.Text): nothing in it needs quoting.
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", role, s.password)); err != nil {
		return fmt.Errorf("set the password: %w", err)
	}
	return nil
}

// freePort returns a port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start starts the server on s.port and waits until it accepts connections;
// it returns one, the superuser's over the Unix socket. s.mu must be held,
// and the server stopped.
func (s *Server) start() (*pgx.Conn, error) {
	log, err := os.OpenFile(s.logPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := s.acct.command(s.dir, filepath.Join(s.bin, "postgres"),
		"-D", s.data(), "-p", strconv.Itoa(s.port), "-k", s.dir)
	cmd.Stdout, cmd.Stderr = log, log
	err = cmd.Start()
	log.Close() // the server has its own
	if err != nil {
		return nil, err
	}
	pm := &postmaster{cmd: cmd, done: make(chan struct{})}
	go func() {
		pm.err = cmd.Wait()
		close(pm.done)
	}()
	s.pm = pm
	conn, err := s.await(pm)
	if err != nil {
		s.halt(syscall.SIGQUIT) // if it is up at all
		s.logged = true
		return nil, fmt.Errorf("%w; the end of its log:\n%s", err, s.logTail())
	}
	return conn, nil
}

// await waits until pm accepts the superuser's connections over the Unix
// socket and returns one.
func (s *Server) await(pm *postmaster) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, s.adminDSN())
		if err == nil {
			return conn, nil
		}
		select {
		case <-pm.done:
			return nil, fmt.Errorf("%w (%v)", errExited, pm.err)
		case <-ctx.Done():
			return nil, fmt.Errorf("not accepting connections after %v: %w", startTimeout, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// halt shuts the server down, if it is running, and waits until it has: a
// fast shutdown on SIGINT (as pg_ctl stop -m fast), an immediate one on
// SIGQUIT (-m immediate). A server that outlasts stopTimeout is killed.
// s.mu must be held.
func (s *Server) halt(sig syscall.Signal) error {
	pm := s.pm
	if pm == nil {
		return nil
	}
	s.pm = nil
	if err := pm.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal the server: %w", err)
	}
	select {
	case <-pm.done:
		return nil
	case <-time.After(stopTimeout):
		pm.cmd.Process.Kill()
		<-pm.done
		return fmt.Errorf("server still running %v after %v: killed", sig, stopTimeout)
	}
}

// cleanup stops the server at once, removes its files and, when tb
// failed (and not at a start that showed the log already), logs the end of
// the server's log first.
func (s *Server) cleanup(tb testing.TB) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.halt(syscall.SIGQUIT); err != nil {
		tb.Errorf("pgtest: %v", err)
	}
	if tb.Failed() && !s.logged {
		if tail := s.logTail(); tail != "" {
			tb.Logf("pgtest: the end of the log of the server on port %d:\n%s", s.port, tail)
		}
	}
	if err := os.RemoveAll(s.dir); err != nil {
		tb.Errorf("pgtest: %v", err)
	}
	if s.watcher != nil {
		s.watcher.stop()
	}
}

// Stop shuts the server down fast (as pg_ctl stop -m fast: open
// transactions roll back, a checkpoint is written) and waits until it has;
// the data stays, for Restart. Stopping a stopped server does nothing.
func (s *Server) Stop(tb testing.TB) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.halt(syscall.SIGINT); err != nil {
		tb.Fatalf("pgtest: stop: %v", err)
	}
}

// Kill stops the server at once, as a crash would (as pg_ctl stop -m
// immediate: every process quits, with no checkpoint), and waits until it
// has. Restart starts it again, recovering from its write-ahead log.
func (s *Server) Kill(tb testing.TB) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.halt(syscall.SIGQUIT); err != nil {
		tb.Fatalf("pgtest: kill: %v", err)
	}
}

// Restart stops the server if it runs (as Stop does) and starts it again on
// the same port, so every URL stays valid, then waits until it accepts
// connections. Connections made before are broken.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.halt(syscall.SIGINT); err != nil {
		tb.Fatalf("pgtest: restart: %v", err)
	}
	conn, err := s.start()
	if err != nil {
		tb.Fatalf("pgtest: restart on port %d: %v", s.port, err)
	}
	conn.Close(context.Background())
}

// CreateDatabase creates a database, named after tb and unique in the
// server, and returns its URL (as URL does: without the password; its
// query can take "&password="+Password()). It lasts as long as the server.
func (s *Server) CreateDatabase(tb testing.TB) string {
	tb.Helper()
	name := dbName(tb.Name(), s.dbs.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.adminDSN())
	if err != nil {
		tb.Fatalf("pgtest: create a database: %v", err)
	}
	defer conn.Close(ctx)
	// FILE_COPY (PostgreSQL 15 and later) copies template1's files, twice
	// as fast here as writing them all to the WAL, and the WAL (which may
	// be in memory) stays small.
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" STRATEGY FILE_COPY"); err != nil {
		tb.Fatalf("pgtest: create database %s: %v", name, err)
	}
	return s.URL(name)
}

// dbName returns the nth database name for a test: its name in lower
// case, what is not a letter or a digit as _, cut to leave room for _n
// within PostgreSQL's 63 bytes.
func dbName(test string, n int64) string {
	name := strings.Map(func(r rune) rune {
		switch {
		case 'a' <= r && r <= 'z', '0' <= r && r <= '9':
			return r
		case 'A' <= r && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '_'
	}, test)
	return fmt.Sprintf("%.40s_%d", name, n)
}

// URL returns the URL of database db over TCP, for the role but without
// its password (see Password and URLWithPassword):
// postgres://mcpq@127.0.0.1:PORT/db?sslmode=disable.
func (s *Server) URL(db string) string {
	return s.url(url.User(role), db)
}

// URLWithPassword returns URL(db) with the role's password in it.
func (s *Server) URLWithPassword(db string) string {
	return s.url(url.UserPassword(role, s.password), db)
}

func (s *Server) url(user *url.Userinfo, db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     user,
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Password returns the role's password, random for each server.
func (s *Server) Password() string { return s.password }

// adminDSN is the harness's own way in: the superuser over the Unix
// socket, where no password is asked, to database postgres.
func (s *Server) adminDSN() string {
	return fmt.Sprintf("host=%s port=%d user=%s dbname=postgres sslmode=disable connect_timeout=10", s.dir, s.port, role)
}

func (s *Server) data() string    { return filepath.Join(s.dir, "data") }
func (s *Server) logPath() string { return filepath.Join(s.dir, "log") }

// logTail returns the last lines of the server's log, up to 4 KiB.
func (s *Server) logTail() string {
	f, err := os.Open(s.logPath())
	if err != nil {
		return ""
	}
	defer f.Close()
	const limit = 4 << 10
	if info, err := f.Stat(); err == nil && info.Size() > limit {
		f.Seek(info.Size()-limit, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	if len(b) == limit {
		if i := strings.IndexByte(string(b), '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}
