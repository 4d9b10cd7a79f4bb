package state

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcp-quota/mcp-quota/internal/pgtest"
)

// The growth benchmarks on PostgreSQL: a history of millions of rows,
// written by the server itself (INSERT … SELECT generate_series, then
// VACUUM ANALYZE, as autovacuum leaves a table that stopped growing), in
// a database copied for each benchmark that changes it. The external
// benchmarks (history_bench_test.go, bench_test.go) reach it through the
// exported names below, which only the test binary has.

// BenchRows is the size of the history the growth benchmarks read and
// sweep: a sync job's week at its limit is about 1.2 million attempts.
// MCP_QUOTA_BENCH_ROWS sets another.
func BenchRows(b *testing.B) int {
	if s := os.Getenv("MCP_QUOTA_BENCH_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatal(err)
		}
		return n
	}
	return 2_000_000
}

// BenchT0 is when the benchmarks' histories start.
var BenchT0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// A PostgresHistory is a throwaway server holding a database of n
// attempts shaped as the SQLite history of history_bench_test.go: a busy
// key with one attempt every 100 ms over the whole span (caller sync) and
// a quiet key with every 1,000th (caller agent), each confirmed 20 ms
// after it was sent; an observation and a warning every 100th.
type PostgresHistory struct {
	srv  *pgtest.Server
	name string // the filled database, a template for copies
	N    int
}

// StartPostgresHistory starts a server for b and fills its history, in
// about 20 s for 2 million attempts on 2 cores.
func StartPostgresHistory(b testing.TB, n int) *PostgresHistory {
	b.Helper()
	srv := pgtest.Start(b)
	b.Setenv("PGPASSWORD", srv.Password())
	h := &PostgresHistory{srv: srv, N: n}
	u := srv.CreateDatabase(b)
	h.name = u[strings.LastIndexByte(u, '/')+1 : strings.IndexByte(u, '?')]
	start := time.Now()
	if err := fillHistory(context.Background(), u, n); err != nil {
		b.Fatal(err)
	}
	b.Logf("a history of %d attempts on PostgreSQL in %v", n, time.Since(start).Round(time.Millisecond))
	return h
}

// URL is the history's own database, for benchmarks that only read it.
func (h *PostgresHistory) URL() string { return h.srv.URL(h.name) }

// Copy returns a new database holding the history, for a benchmark that
// changes it.
func (h *PostgresHistory) Copy(b *testing.B) string {
	b.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, h.srv.URLWithPassword("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("%s_copy%d", h.name, time.Now().UnixNano())
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s STRATEGY FILE_COPY", name, h.name)); err != nil {
		b.Fatal(err)
	}
	return h.srv.URL(name)
}

// fillHistory writes n attempts into the new database at dbURL (see
// PostgresHistory), numbered in each key's log as InsertAttempt numbers
// them, and analyzes it.
func fillHistory(ctx context.Context, dbURL string, n int) error {
	pg, err := OpenPostgres(ctx, dbURL, PostgresOptions{}) // the schema
	if err != nil {
		return err
	}
	pg.Close()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	t0 := micros(BenchT0)
	steps := []string{
		`SET search_path = mcp_quota`,
		// The i-th attempt is the quiet key's when i % 1000 = 0: its
		// number in the key's log is i / 1000 + 1, and a busy one's is
		// i - i / 1000.
		`INSERT INTO attempts (id, call_id, attempt, key, caller, transport, method, target, state, counted, at,
			sent_at, answered_at, status, seq, reason, why)
		SELECT i + 1, 'c' || i, 1, CASE WHEN i % 1000 = 0 THEN 'quiet' ELSE 'busy' END,
			CASE WHEN i % 1000 = 0 THEN 'agent' ELSE 'sync' END, 'rest', 'GET', '/v1/participants?limit=500', 'confirmed', true,
			$1::bigint + i * 100000, $1::bigint + i * 100000, $1::bigint + i * 100000 + 20000, 200,
			CASE WHEN i % 1000 = 0 THEN i / 1000 + 1 ELSE i - i / 1000 END, 'HTTP 200 OK', '{"kind":"answered","status":200}'
		FROM generate_series(0::bigint, $2::bigint - 1) AS i`,
		`INSERT INTO observations (key, attempt_id, policy, unit, partition, q, w_us, r, t_us, status, received_at,
			shape, profile, method, target)
		SELECT CASE WHEN i % 1000 = 0 THEN 'quiet' ELSE 'busy' END, i + 1, 'default', 'requests', '', 120, 60000000,
			100, 30000000, 200, $1::bigint + i * 100000 + 20000, 'draft', 'ietf', 'GET', '/v1/participants?limit=500'
		FROM generate_series(0::bigint, $2::bigint - 1, 100) AS i`,
		`INSERT INTO warnings (key, at, kind, message)
		SELECT CASE WHEN i % 1000 = 0 THEN 'quiet' ELSE 'busy' END, $1::bigint + i * 100000, 'hidden-limit',
			'a limit the upstream did not document: 100 calls per 10 s'
		FROM generate_series(0::bigint, $2::bigint - 1, 100) AS i`,
		// Later attempts take their IDs from blocks after these.
		`SELECT setval('attempt_blocks', $1::bigint * 0 + $2::bigint / 1024 + 1)`,
		`INSERT INTO keys (key) VALUES ('busy'), ('quiet')`,
		`VACUUM ANALYZE`,
	}
	for _, s := range steps {
		var args []any
		if strings.Contains(s, "$1") {
			args = append(args, t0, n)
		}
		if _, err := conn.Exec(ctx, s, args...); err != nil {
			return fmt.Errorf("fill a history: %w\n%s", err, s)
		}
	}
	return nil
}

// FillWindow writes into the new database at dbURL a log of n sends of
// key k by three callers (caller0, caller1, caller2 in turn), a
// millisecond apart from BenchT0 on, each numbered in the key's log and
// in its caller's (admitted with CallerReserves), as InsertAttempt numbers them, and
// analyzes it.
func FillWindow(ctx context.Context, dbURL string, n int) error {
	pg, err := OpenPostgres(ctx, dbURL, PostgresOptions{})
	if err != nil {
		return err
	}
	pg.Close()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, s := range []string{
		`SET search_path = mcp_quota`,
		`INSERT INTO attempts (id, call_id, attempt, key, caller, transport, method, target, state, counted, at, seq, cseq)
		SELECT i + 1, 'c', 0, 'k', 'caller' || i % 3, '', '', '', 'admitted', true, $1::bigint + i * 1000, i + 1, i / 3 + 1
		FROM generate_series(0::bigint, $2::bigint - 1) AS i`,
		`SELECT setval('attempt_blocks', $1::bigint * 0 + $2::bigint / 1024 + 1)`,
		`VACUUM ANALYZE`,
	} {
		var args []any
		if strings.Contains(s, "$1") {
			args = append(args, micros(BenchT0), n)
		}
		if _, err := conn.Exec(ctx, s, args...); err != nil {
			return fmt.Errorf("fill a window: %w", err)
		}
	}
	return nil
}

// BenchmarkPostgresPlans is a check more than a measure: PostgreSQL's
// plan of every statement the package runs, on a large history with its
// statistics (2 million attempts, whatever MCP_QUOTA_BENCH_ROWS says: the
// planner rightly reads a small table whole), finds its rows of
// attempts, observations and warnings through an index, never by walking
// the table or a whole index — a cost that would grow with the history
// (TestNoStatementScansHistory checks SQLite's). The plans are generic
// (plan_cache_mode = force_generic_plan): those a connection may keep for
// its prepared statements, whatever the parameters. It fails on every
// plan that walks; with -v it logs every plan.
//
//	go test -run '^$' -bench PostgresPlans -benchtime 1x -v ./state/
func BenchmarkPostgresPlans(b *testing.B) {
	h := StartPostgresHistory(b, 2_000_000)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, h.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, s := range []string{"SET search_path = mcp_quota", "SET plan_cache_mode = force_generic_plan"} {
		if _, err := conn.Exec(ctx, s); err != nil {
			b.Fatal(err)
		}
	}
	first := true
	for b.Loop() {
		for _, q := range postgresStatements() {
			plan, err := genericPlan(ctx, conn, q)
			if err != nil {
				b.Fatalf("plan of %s: %v", oneLine(q), err)
			}
			if !first {
				continue
			}
			if walk := walks(plan); walk != "" {
				b.Errorf("%s\n  in %s", walk, oneLine(q))
			}
			if testing.Verbose() {
				b.Logf("%s\n%s", oneLine(q), planText(plan, 1))
			}
		}
		first = false
	}
}

// postgresStatements are every statement the package runs on
// PostgreSQL: those in queries, and those it writes for PostgreSQL alone.
func postgresStatements() []string {
	var out []string
	for _, q := range queries {
		if q.postgres != "" { // not SQLite's own upkeep
			out = append(out, q.postgres)
		}
	}
	return append(out, qHoldKey, qAddKey, pgFinishSlots, pgAddObservations,
		`SELECT value FROM signing_keys WHERE name = $1`)
}

// planNode is a node of EXPLAIN (FORMAT JSON).
type planNode struct {
	Type      string     `json:"Node Type"`
	Relation  string     `json:"Relation Name"`
	Index     string     `json:"Index Name"`
	IndexCond string     `json:"Index Cond"`
	Filter    string     `json:"Filter"`
	Plans     []planNode `json:"Plans"`
}

// genericPlan returns PostgreSQL's generic plan of q.
func genericPlan(ctx context.Context, conn *pgx.Conn, q string) (planNode, error) {
	if _, err := conn.Exec(ctx, "PREPARE p AS "+q); err != nil {
		return planNode{}, err
	}
	defer conn.Exec(ctx, "DEALLOCATE p")
	var types []string
	if err := conn.QueryRow(ctx, "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = 'p'").Scan(&types); err != nil {
		return planNode{}, err
	}
	args := make([]string, len(types))
	for i, t := range types {
		args[i] = "'1'"
		if strings.HasSuffix(t, "[]") {
			args[i] = "'{1}'"
		}
	}
	explain := "EXPLAIN (FORMAT JSON) EXECUTE p"
	if len(args) > 0 {
		explain += "(" + strings.Join(args, ", ") + ")"
	}
	var raw []byte
	// An EXPLAIN of a write runs nothing.
	if err := conn.QueryRow(ctx, explain).Scan(&raw); err != nil {
		return planNode{}, err
	}
	var plans []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &plans); err != nil || len(plans) != 1 {
		return planNode{}, fmt.Errorf("EXPLAIN said %s (%v)", raw, err)
	}
	return plans[0].Plan, nil
}

// history is the tables that grow with history.
var history = regexp.MustCompile(`^(attempts|observations|warnings)$`)

// walks returns the first node of plan that reads a table of the history
// whole — a sequential scan, or an index scan with no condition — or ""
// when none does. The partial index attempts_in_flight holds only the
// calls in flight: walking it is allowed.
func walks(n planNode) string {
	if history.MatchString(n.Relation) {
		switch n.Type {
		case "Seq Scan":
			return fmt.Sprintf("Seq Scan on %s (filter %s)", n.Relation, n.Filter)
		case "Index Scan", "Index Only Scan", "Bitmap Heap Scan":
			if n.IndexCond == "" && n.Index != "attempts_in_flight" && !(n.Type == "Bitmap Heap Scan" && len(n.Plans) > 0) {
				return fmt.Sprintf("%s on %s using %s with no index condition", n.Type, n.Relation, n.Index)
			}
		}
	}
	if n.Type == "Bitmap Index Scan" && n.IndexCond == "" && n.Index != "attempts_in_flight" {
		return fmt.Sprintf("Bitmap Index Scan using %s with no index condition", n.Index)
	}
	for _, c := range n.Plans {
		if w := walks(c); w != "" {
			return w
		}
	}
	return ""
}

// planText is plan as indented lines, a node a line.
func planText(n planNode, depth int) string {
	line := strings.Repeat("  ", depth) + n.Type
	if n.Relation != "" {
		line += " on " + n.Relation
	}
	if n.Index != "" {
		line += " using " + n.Index
	}
	if n.IndexCond != "" {
		line += " (" + n.IndexCond + ")"
	}
	for _, c := range n.Plans {
		line += "\n" + planText(c, depth+1)
	}
	return line
}

func oneLine(q string) string { return strings.Join(strings.Fields(q), " ") }
