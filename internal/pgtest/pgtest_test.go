package pgtest_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// connect connects to rawURL, with password unless it is "", and closes
// the connection when t ends.
func connect(t testing.TB, rawURL, password string) (*pgx.Conn, error) {
	t.Helper()
	cfg, err := pgx.ParseConfig(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	if password != "" {
		cfg.Password = password
	}
	conn, err := pgx.ConnectConfig(t.Context(), cfg)
	if err == nil {
		t.Cleanup(func() { conn.Close(context.Background()) })
	}
	return conn, err
}

// mustConnect is connect that fails t on an error.
func mustConnect(t testing.TB, rawURL, password string) *pgx.Conn {
	t.Helper()
	conn, err := connect(t, rawURL, password)
	if err != nil {
		t.Fatalf("connect to %s: %v", rawURL, err)
	}
	return conn
}

func mustExec(t testing.TB, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func count(t testing.TB, conn *pgx.Conn, sql string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(t.Context(), sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestPasswordOverTCP(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	if strings.Contains(srv.URL("postgres"), srv.Password()) {
		t.Errorf("URL %s holds the password", srv.URL("postgres"))
	}
	for name, conn := range map[string]*pgx.Conn{
		"URLWithPassword":   mustConnect(t, srv.URLWithPassword("postgres"), ""),
		"URL plus Password": mustConnect(t, srv.URL("postgres"), srv.Password()),
	} {
		var user, addr string
		var super bool
		err := conn.QueryRow(t.Context(), "SELECT current_user, host(inet_server_addr()), usesuper FROM pg_user WHERE usename = current_user").
			Scan(&user, &addr, &super)
		if err != nil {
			t.Fatal(err)
		}
		if user != "mcpq" || addr != "127.0.0.1" || !super {
			t.Errorf("%s: connected as %q (superuser %v) to %s, want the superuser mcpq over TCP to 127.0.0.1", name, user, super, addr)
		}
	}
}

func TestWrongPasswordRefused(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	for _, password := range []string{"not-the-password", srv.Password() + "x"} {
		_, err := connect(t, srv.URL("postgres"), password)
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != "28P01" {
			t.Errorf("with password %q: got %v, want SQLSTATE 28P01 (invalid_password)", password, err)
		}
	}
	if _, err := connect(t, srv.URL("postgres"), ""); err == nil {
		t.Error("connected without a password")
	}
}

func TestCreateDatabase(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	a, b := srv.CreateDatabase(t), srv.CreateDatabase(t)
	if a == b {
		t.Fatalf("two databases at one URL, %s", a)
	}
	connA, connB := mustConnect(t, a, srv.Password()), mustConnect(t, b+"&password="+srv.Password(), "")
	mustExec(t, connA, "CREATE TABLE only_in_a (x int)")
	var nameA, nameB string
	if err := connA.QueryRow(t.Context(), "SELECT current_database()").Scan(&nameA); err != nil {
		t.Fatal(err)
	}
	if err := connB.QueryRow(t.Context(), "SELECT current_database()").Scan(&nameB); err != nil {
		t.Fatal(err)
	}
	if nameA == nameB || !strings.HasPrefix(nameA, "testcreatedatabase_") {
		t.Errorf("databases %q and %q, want two named after the test", nameA, nameB)
	}
	if got := count(t, connB, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'"); got != 0 {
		t.Errorf("database %s sees %d tables of %s", nameB, got, nameA)
	}
}

// TestCreateDatabaseInSubtests: parallel tests sharing a server each get a
// database of their own.
func TestCreateDatabaseInSubtests(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	seen := make(chan string, 4)
	t.Run("group", func(t *testing.T) {
		for i := range cap(seen) {
			t.Run(strconv.Itoa(i), func(t *testing.T) {
				t.Parallel()
				u := srv.CreateDatabase(t)
				mustConnect(t, u, srv.Password())
				seen <- u
			})
		}
	})
	close(seen)
	urls := map[string]bool{}
	for u := range seen {
		urls[u] = true
	}
	if len(urls) != cap(seen) {
		t.Errorf("got %d distinct databases, want %d", len(urls), cap(seen))
	}
}

func TestRestartKeepsDataAndURL(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	u := srv.CreateDatabase(t)
	before := mustConnect(t, u, srv.Password())
	mustExec(t, before, "CREATE TABLE kept (x int)")
	mustExec(t, before, "INSERT INTO kept VALUES (1)")

	srv.Restart(t)
	if _, err := before.Exec(t.Context(), "SELECT 1"); err == nil {
		t.Error("a connection from before the restart still works")
	}
	after := mustConnect(t, u, srv.Password())
	if got := count(t, after, "SELECT count(*) FROM kept"); got != 1 {
		t.Errorf("after Restart: %d rows, want 1", got)
	}
}

func TestStopThenRestart(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	srv.Stop(t)
	srv.Stop(t) // stopped already: nothing to do
	if _, err := connect(t, srv.URL("postgres"), srv.Password()); err == nil {
		t.Fatal("connected to a stopped server")
	}
	srv.Restart(t)
	mustConnect(t, srv.URL("postgres"), srv.Password())
}

func TestKillKeepsCommitted(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	u := srv.CreateDatabase(t)
	conn := mustConnect(t, u, srv.Password())
	mustExec(t, conn, "CREATE TABLE log (x int)")
	mustExec(t, conn, "INSERT INTO log VALUES (1)")
	open := mustConnect(t, u, srv.Password())
	mustExec(t, open, "BEGIN")
	mustExec(t, open, "INSERT INTO log VALUES (2)")

	srv.Kill(t)
	if _, err := connect(t, u, srv.Password()); err == nil {
		t.Fatal("connected to a killed server")
	}
	srv.Restart(t)
	conn = mustConnect(t, u, srv.Password())
	if got := count(t, conn, "SELECT count(*) FROM log WHERE x = 1"); got != 1 {
		t.Errorf("the committed row: %d after Kill and Restart, want 1", got)
	}
	if got := count(t, conn, "SELECT count(*) FROM log WHERE x = 2"); got != 0 {
		t.Errorf("the uncommitted row: %d after Kill and Restart, want 0", got)
	}
}

func TestTwoServers(t *testing.T) {
	t.Parallel()
	one, two := pgtest.Start(t), pgtest.Start(t)
	if one.URL("postgres") == two.URL("postgres") || one.Password() == two.Password() {
		t.Fatalf("two servers share a URL (%s, %s) or a password", one.URL("postgres"), two.URL("postgres"))
	}
	mustExec(t, mustConnect(t, one.URL("postgres"), one.Password()), "CREATE TABLE on_one (x int)")
	conn := mustConnect(t, two.URL("postgres"), two.Password())
	if got := count(t, conn, "SELECT count(*) FROM pg_tables WHERE tablename = 'on_one'"); got != 0 {
		t.Errorf("the second server sees %d tables of the first", got)
	}
	if _, err := connect(t, two.URL("postgres"), one.Password()); err == nil {
		t.Error("the second server takes the first's password")
	}
	one.Kill(t) // one going down leaves the other be
	if got := count(t, conn, "SELECT 1"); got != 1 {
		t.Errorf("SELECT 1 on the second server: %d", got)
	}
}

// traces returns what a running server leaves on the machine: its
// postmaster's pid, its data directory and its TCP address.
func traces(t *testing.T, srv *pgtest.Server) (pid int, data, addr string) {
	t.Helper()
	conn := mustConnect(t, srv.URL("postgres"), srv.Password())
	if err := conn.QueryRow(t.Context(), "SHOW data_directory").Scan(&data); err != nil {
		t.Fatal(err)
	}
	pid, err := postmasterPID(data)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(srv.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	return pid, data, u.Host
}

// postmasterPID reads the first line of data's postmaster.pid.
func postmasterPID(data string) (int, error) {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(first)
}

// gone reports whether process pid has ended: there is none, or a zombie.
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	// pid (comm) state ...: comm may hold anything but the last ')'.
	_, rest, _ := bytes.Cut(b[bytes.LastIndexByte(b, ')'):], []byte(" "))
	return len(rest) > 0 && rest[0] == 'Z'
}

// leftovers lists what is left of a server, polling for up to wait.
func leftovers(pid int, data, addr string, wait time.Duration) []string {
	deadline := time.Now().Add(wait)
	for {
		var left []string
		if !gone(pid) {
			left = append(left, fmt.Sprintf("postmaster %d", pid))
		}
		if _, err := os.Stat(filepath.Dir(data)); !errors.Is(err, os.ErrNotExist) {
			left = append(left, filepath.Dir(data))
		}
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			left = append(left, "a listener on "+addr)
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func needProc(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("looks for processes in /proc")
	}
}

func TestCleanupLeavesNothing(t *testing.T) {
	needProc(t)
	t.Parallel()
	var first, pid int
	var data, addr string
	t.Run("server", func(t *testing.T) {
		srv := pgtest.Start(t)
		first, _, _ = traces(t, srv)
		srv.Restart(t) // a new postmaster
		pid, data, addr = traces(t, srv)
	})
	if data == "" {
		t.Skip("no server started")
	}
	if !gone(first) {
		t.Errorf("the postmaster from before Restart, %d, still runs", first)
	}
	if left := leftovers(pid, data, addr, 0); len(left) > 0 {
		t.Errorf("after the test: %s", strings.Join(left, ", "))
	}
}

const helperEnv = "PGTEST_HELPER"

// TestHelperProcess, run by TestDeadProcessLeavesNothing, starts a server,
// prints "pid data addr" of it and exits without cleaning up, as a test
// binary does when a test times out.
func TestHelperProcess(t *testing.T) {
	if is, _ := testkit.Job(helperEnv, new(any)); !is {
		t.Skip("run as a helper process by other tests")
	}
	pid, data, addr := traces(t, pgtest.Start(t))
	fmt.Println(pid, data, addr)
	os.Exit(3)
}

func TestDeadProcessLeavesNothing(t *testing.T) {
	needProc(t)
	t.Parallel()
	h := testkit.Start(t, testkit.Spec{Name: "server", Env: helperEnv, Run: "^TestHelperProcess$"})
	err := h.Wait(t)
	out := []byte(strings.Join(h.Lines(), "\n"))
	if exit, ok := errors.AsType[*exec.ExitError](err); !ok || exit.ExitCode() != 3 {
		if strings.Contains(string(out), "SKIP") {
			t.Skipf("the helper skipped:\n%s", out)
		}
		t.Fatalf("helper: %v, want exit status 3; it printed:\n%s", err, out)
	}
	var pid int
	var data, addr string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fmt.Sscan(sc.Text(), &pid, &data, &addr)
	}
	if data == "" {
		t.Fatalf("the helper printed no server:\n%s", out)
	}
	if left := leftovers(pid, data, addr, 30*time.Second); len(left) > 0 {
		t.Errorf("30s after the test process died: %s", strings.Join(left, ", "))
	}
}

// recorder is a testing.TB that records a Skip or a Fatal and ends its
// goroutine, as a test's would end.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestNoBinaries(t *testing.T) {
	tests := []struct {
		ci       string
		wantSkip bool
	}{
		{"", true},
		{"1", true},
		{"false", true},
		{"true", false},
	}
	for _, tt := range tests {
		t.Run("CI="+tt.ci, func(t *testing.T) {
			t.Setenv("PG_BIN", t.TempDir())
			t.Setenv("CI", tt.ci)
			r := &recorder{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				pgtest.Start(r)
			}()
			<-done
			got := r.failed
			if tt.wantSkip {
				got = r.skipped
			}
			if !strings.HasPrefix(got, "PostgreSQL server binaries not found (PG_BIN=") ||
				!strings.Contains(got, "install postgresql, or set PG_BIN") {
				t.Errorf("skipped %q, failed %q; want a skip %v naming PG_BIN and the fix", r.skipped, r.failed, tt.wantSkip)
			}
		})
	}
}

// iteration is a testing.TB whose cleanups run at end, not at the end of
// the benchmark.
type iteration struct {
	testing.TB
	cleanups []func()
}

func (it *iteration) Cleanup(f func()) { it.cleanups = append(it.cleanups, f) }
func (it *iteration) end() {
	for i := len(it.cleanups) - 1; i >= 0; i-- {
		it.cleanups[i]()
	}
}

// BenchmarkStart measures a Start (start-ms: a copy of the template, a
// server up, the password set) and its cleanup. The first Start in a
// process, which makes the template with initdb, is not measured.
//
//	go test -run '^$' -bench Start ./internal/pgtest/
func BenchmarkStart(b *testing.B) {
	pgtest.Start(b)
	var started time.Duration
	for b.Loop() {
		it := &iteration{TB: b}
		t0 := time.Now()
		pgtest.Start(it)
		started += time.Since(t0)
		it.end()
	}
	b.ReportMetric(started.Seconds()*1000/float64(b.N), "start-ms/op")
}

// BenchmarkRestart measures Restart: a fast shutdown and a start.
func BenchmarkRestart(b *testing.B) {
	srv := pgtest.Start(b)
	for b.Loop() {
		srv.Restart(b)
	}
}

// BenchmarkCreateDatabase measures CreateDatabase.
func BenchmarkCreateDatabase(b *testing.B) {
	srv := pgtest.Start(b)
	for b.Loop() {
		srv.CreateDatabase(b)
	}
}
