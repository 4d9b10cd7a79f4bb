package pacer_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcp-quota/mcp-quota/state"
)

// What BenchmarkAdmissions measures besides its calls: the PostgreSQL
// server's work and waits, and the machine's CPU.

// benchHistory is the history a PostgreSQL database holds before a
// measure: 200,000 confirmed attempts, spread over keys and a day that
// ended an hour ago — the state of a database in use (state.FillHistory
// gathers its statistics). Each connection plans its statements once, on
// the statistics of the moment, and keeps the plans until the next
// ANALYZE (autovacuum's, which comes within a minute of a busy start and
// again each time a table has grown by a tenth): plans made for the few
// rows of a new database's first seconds read the table whole, and each
// call then costs more as the table grows (on 100 keys, 300 µs a read of
// a window, against 17 µs on an index).
func benchHistory(keys []string) state.History {
	const n = 200_000
	return state.History{Keys: keys, N: n, From: time.Now().Add(-25 * time.Hour), Every: 24 * time.Hour / n,
		Latency: 20 * time.Millisecond, Status: 200, Caller: "history", Transport: "rest", Method: "GET", Target: "/items?page=1"}
}

// pgWatch watches the PostgreSQL server of a benchmark while it measures:
// its processes' CPU time, the database's commits, and what its backends
// are doing.
type pgWatch struct {
	conn       *pgx.Conn
	server     int // the postmaster's process ID
	cpu0       time.Duration
	commits0   int64
	sessions0  int64
	done       chan struct{}
	result     chan pgSample
	statements string // which of the server's statements to log at the end: "" none, "1" or "all" (see statementsEnv)
}

// statementsEnv names the variable that, set to 1, makes
// BenchmarkAdmissions log, after each cell, the 15 statements its
// PostgreSQL server spent most time in (see logStatements), or set to all
// every statement, from pg_stat_statements, which the server must load:
//
//	PGTEST_SETTINGS="shared_preload_libraries = 'pg_stat_statements'" MCP_QUOTA_BENCH_STATEMENTS=1 \
//	  go test -run '^$' -bench 'Admissions/store=postgres/window=100ms/keys=1/hosts=3$' -benchtime 3s -v ./pacer/
const statementsEnv = "MCP_QUOTA_BENCH_STATEMENTS"

// pgSample is what a pgWatch saw.
type pgSample struct {
	cpu                       time.Duration
	commits                   int64
	sessions                  int64   // connections opened
	waiting, active, idleInTx float64 // backends, on average over the samples
}

func watchPostgres(b *testing.B, rawURL string) *pgWatch {
	b.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, rawURL) // the password from PGPASSWORD
	if err != nil {
		b.Fatal(err)
	}
	// What the warm-up wrote is in the statistics too (see benchHistory).
	if _, err := conn.Exec(ctx, "ANALYZE"); err != nil {
		b.Fatal(err)
	}
	u, _ := url.Parse(rawURL)
	w := &pgWatch{conn: conn, server: postmaster(u.Port()), done: make(chan struct{}), result: make(chan pgSample, 1)}
	if v := os.Getenv(statementsEnv); v == "1" || v == "all" {
		_, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()")
		if err != nil {
			b.Fatalf("%s=%s: %v (start the server with PGTEST_SETTINGS=\"shared_preload_libraries = 'pg_stat_statements'\")", statementsEnv, v, err)
		}
		w.statements = v
	}
	w.cpu0 = treeCPU(w.server)
	w.commits0, w.sessions0 = w.commits(b)
	go w.sample()
	return w
}

// commits returns how many transactions the database committed so far,
// and how many connections were opened to it.
func (w *pgWatch) commits(b *testing.B) (commits, sessions int64) {
	// The statistics a backend reports are cleared for its next read.
	if _, err := w.conn.Exec(context.Background(), "SELECT pg_stat_clear_snapshot()"); err != nil {
		b.Fatal(err)
	}
	err := w.conn.QueryRow(context.Background(),
		"SELECT xact_commit, sessions FROM pg_stat_database WHERE datname = current_database()").Scan(&commits, &sessions)
	if err != nil {
		b.Fatal(err)
	}
	return commits, sessions
}

// sample counts, every 10 ms, the database's backends waiting for a
// lock, running, and idle in a transaction, until done.
func (w *pgWatch) sample() {
	var s pgSample
	n := 0
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-w.done:
			if n > 0 {
				s.waiting, s.active, s.idleInTx = s.waiting/float64(n), s.active/float64(n), s.idleInTx/float64(n)
			}
			w.result <- s
			return
		case <-tick.C:
		}
		var waiting, active, idle int
		err := w.conn.QueryRow(context.Background(), `SELECT
			count(*) FILTER (WHERE wait_event_type = 'Lock'),
			count(*) FILTER (WHERE state = 'active' AND wait_event_type IS DISTINCT FROM 'Lock'),
			count(*) FILTER (WHERE state = 'idle in transaction')
			FROM pg_stat_activity WHERE datname = current_database() AND pid != pg_backend_pid()`).Scan(&waiting, &active, &idle)
		if err != nil {
			continue
		}
		s.waiting += float64(waiting)
		s.active += float64(active)
		s.idleInTx += float64(idle)
		n++
	}
}

func (w *pgWatch) stop(b *testing.B) pgSample {
	b.Helper()
	cpu := treeCPU(w.server) - w.cpu0
	close(w.done)
	s := <-w.result
	// The commits are reported when a backend's transaction ends; this
	// connection's own reads are a few hundred of them.
	time.Sleep(600 * time.Millisecond) // backends report their statistics at most every 500 ms when idle
	commits, sessions := w.commits(b)
	s.commits, s.sessions = commits-w.commits0, sessions-w.sessions0
	s.cpu = cpu
	if w.statements != "" {
		w.logStatements(b, w.statements == "all")
	}
	w.conn.Close(context.Background())
	return s
}

// logStatements logs the 15 statements the server spent most time in
// since the watch began, or all of them, by pg_stat_statements:
// executions and milliseconds in all, the share of the server's time in
// statements, and the statement.
func (w *pgWatch) logStatements(b *testing.B, all bool) {
	limit := "LIMIT 15"
	if all {
		limit = ""
	}
	rows, err := w.conn.Query(context.Background(), `SELECT calls, total_exec_time + total_plan_time,
		100 * (total_exec_time + total_plan_time) / sum(total_exec_time + total_plan_time) OVER (), query
		FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		ORDER BY 2 DESC `+limit)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var calls int64
		var ms, share float64
		var query string
		if err := rows.Scan(&calls, &ms, &share, &query); err != nil {
			b.Fatal(err)
		}
		b.Logf("%9d calls %9.0f ms %5.1f%%  %.150s", calls, ms, share, strings.Join(strings.Fields(query), " "))
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
}

// postmaster returns the ID of the PostgreSQL server listening on port,
// found by its command line (-p PORT); 0 when there is none.
func postmaster(port string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmd), "\x00")
		if len(args) > 0 && filepath.Base(args[0]) == "postgres" && slices.Contains(args, "-p") &&
			slices.Index(args, "-p")+1 < len(args) && args[slices.Index(args, "-p")+1] == port {
			return pid
		}
	}
	return 0
}

// treeCPU returns the CPU time (user and system) used by process pid and
// its children that are running now (a PostgreSQL server's backends).
func treeCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	entries, _ := os.ReadDir("/proc")
	var ticks int64
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid … utime(14) stime(15): comm may hold spaces.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat)[i+1:])
		if len(f) < 13 {
			continue
		}
		self, _ := strconv.Atoi(e.Name())
		ppid, _ := strconv.Atoi(f[1])
		if self != pid && ppid != pid {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc's CPU times (100 on Linux).
const clockTicks = 100

// machineTimes are the machine's CPU times over all its cores.
type machineTimes struct{ busy, total time.Duration }

// machineCPU reads the machine's CPU times so far from /proc/stat.
func machineCPU() machineTimes {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineTimes{}
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	var m machineTimes
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		d := time.Duration(n) * time.Second / clockTicks
		if i >= 8 { // guest times are in user's already
			break
		}
		m.total += d
		if i != 3 && i != 4 { // idle, iowait
			m.busy += d
		}
	}
	return m
}

func (m machineTimes) since(old machineTimes) machineTimes {
	return machineTimes{busy: m.busy - old.busy, total: m.total - old.total}
}
