package state_test

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
	"github.com/mcp-quota/mcp-quota/state/postgres"
)

// A liveSchema is what a back end's schema holds, as read from a live
// database: each table's columns (name → type class and nullability) and
// each index's table, columns (an expression is "(expr)") and, for a
// partial one, its condition.
type liveSchema struct {
	columns map[string]map[string]string // table → column → "int not null", …
	indexes map[string]string            // index → "table(a, b) partial"
}

// typeClass maps a column's declared type, on either back end, to what it
// holds. A flag is a boolean on PostgreSQL and 0 or 1 in an INTEGER on
// SQLite: both hold a flag, which flagColumns names.
func typeClass(declared string) string {
	switch t := strings.ToLower(declared); {
	case t == "integer" || t == "bigint" || t == "smallint":
		return "int"
	case t == "text" || t == "character varying":
		return "text"
	case t == "blob" || t == "bytea":
		return "bytes"
	case t == "boolean":
		return "flag"
	case strings.HasPrefix(t, "timestamp"):
		return "time"
	default:
		return "unknown type " + declared
	}
}

// flagColumns are the columns that hold a flag: SQLite declares them
// INTEGER.
var flagColumns = map[string]bool{
	"attempts.probe": true, "attempts.counted": true, "observations.guessed": true, "observations.from_cache": true,
	"policies.hidden": true, "key_state.half_open": true, "path_failures.half_open": true,
}

// postgresOnly are the tables PostgreSQL alone has: keys, whose rows an
// Update locks to hold a key across hosts (SQLite's write lock holds every
// key), and schema_version (SQLite's is PRAGMA user_version).
var postgresOnly = []string{"keys", "schema_version"}

func sqliteSchema(t *testing.T, path string) liveSchema {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := liveSchema{columns: map[string]map[string]string{}, indexes: map[string]string{}}
	tables := queryStrings(t, db, `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`)
	for _, table := range tables {
		rows, err := db.Query(`SELECT name, type, "notnull" OR pk FROM pragma_table_info(?)`, table)
		if err != nil {
			t.Fatal(err)
		}
		s.columns[table] = map[string]string{}
		for rows.Next() {
			var name, typ string
			var notNull bool
			if err := rows.Scan(&name, &typ, &notNull); err != nil {
				t.Fatal(err)
			}
			class := typeClass(typ)
			if flagColumns[table+"."+name] && class == "int" {
				class = "flag"
			}
			s.columns[table][name] = class + nullability(notNull)
		}
		rows.Close()
		for _, index := range queryStrings(t, db, `SELECT name FROM pragma_index_list(?) WHERE origin = 'c'`, table) {
			cols := queryStrings(t, db, `SELECT coalesce(name, '(expr)') FROM pragma_index_info(?) ORDER BY seqno`, index)
			def := queryStrings(t, db, `SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?`, index)
			where := ""
			if i := strings.Index(strings.ToUpper(def[0]), " WHERE "); i >= 0 {
				where = def[0][i+len(" WHERE "):]
			}
			s.indexes[index] = describeIndex(table, cols, where)
		}
	}
	return s
}

func postgresSchema(t *testing.T, conn *pgx.Conn) liveSchema {
	t.Helper()
	ctx := context.Background()
	s := liveSchema{columns: map[string]map[string]string{}, indexes: map[string]string{}}
	rows, err := conn.Query(ctx, `SELECT table_name, column_name, data_type, is_nullable = 'NO'
		FROM information_schema.columns WHERE table_schema = 'mcp_quota'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var table, name, typ string
		var notNull bool
		if err := rows.Scan(&table, &name, &typ, &notNull); err != nil {
			t.Fatal(err)
		}
		if s.columns[table] == nil {
			s.columns[table] = map[string]string{}
		}
		s.columns[table][name] = typeClass(typ) + nullability(notNull)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	// Each index that is not a table's primary key, with its key columns
	// (an expression's attnum is 0) in order.
	rows, err = conn.Query(ctx, `SELECT i.relname, t.relname, coalesce(pg_get_expr(x.indpred, x.indrelid), ''),
			array(SELECT coalesce(a.attname, '(expr)') FROM unnest(x.indkey::int2[]) WITH ORDINALITY AS k(num, n)
				LEFT JOIN pg_attribute AS a ON a.attrelid = t.oid AND a.attnum = k.num ORDER BY k.n)
		FROM pg_index AS x JOIN pg_class AS i ON i.oid = x.indexrelid JOIN pg_class AS t ON t.oid = x.indrelid
		JOIN pg_namespace AS n ON n.oid = t.relnamespace
		WHERE n.nspname = 'mcp_quota' AND NOT x.indisprimary`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var index, table, where string
		var cols []string
		if err := rows.Scan(&index, &table, &where, &cols); err != nil {
			t.Fatal(err)
		}
		s.indexes[index] = describeIndex(table, cols, where)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	return s
}

func nullability(notNull bool) string {
	if notNull {
		return " not null"
	}
	return " null"
}

func describeIndex(table string, cols []string, where string) string {
	d := table + "(" + strings.Join(cols, ", ") + ")"
	if where != "" {
		d += " where " + predicate(where)
	}
	return d
}

// predicate writes a partial index's condition, as either back end gives
// it, one way: PostgreSQL's casts, parentheses and <> and SQLite's != and
// flags compared with 1 read alike.
func predicate(where string) string {
	where = strings.ToLower(where)
	for _, r := range []struct{ old, new string }{{"::text", ""}, {"(", ""}, {")", ""}, {"<>", "!="}} {
		where = strings.ReplaceAll(where, r.old, r.new)
	}
	where = strings.Join(strings.Fields(where), " ")
	return flagIsOne.ReplaceAllString(where, "$1")
}

// flagIsOne is a flag compared with 1, as SQLite's predicates write it.
var flagIsOne = regexp.MustCompile(`\b(counted|probe|hidden|half_open|guessed|from_cache) = 1\b`)

func queryStrings(t *testing.T, db *sql.DB, q string, args ...any) []string {
	t.Helper()
	rows, err := db.Query(q, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// lines lists what a schema holds, one fact a line, for a diff.
func (s liveSchema) lines() []string {
	var out []string
	for table, cols := range s.columns {
		for col, d := range cols {
			out = append(out, fmt.Sprintf("column %s.%s %s", table, col, d))
		}
	}
	for index, d := range s.indexes {
		out = append(out, fmt.Sprintf("index %s on %s", index, d))
	}
	sort.Strings(out)
	return out
}

// Both back ends' schemas, each migrated from nothing in a live database,
// hold the same things: the same tables (but PostgreSQL's own, for its
// row locks and its version), the same columns by name, each holding the
// same kind of value and nullable alike, and the same indexes on the
// same columns, under the same condition.
func schemasHoldTheSame(t *testing.T, srv *pgtest.Server) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := state.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	lite := sqliteSchema(t, path)

	url := srv.CreateDatabase(t)
	openPostgres(t, url, state.PostgresOptions{})
	pg := postgresSchema(t, rawConn(t, srv, url))
	for _, table := range postgresOnly {
		if pg.columns[table] == nil {
			t.Errorf("PostgreSQL has no table %s", table)
		}
		delete(pg.columns, table)
		for index, d := range pg.indexes {
			if strings.HasPrefix(d, table+"(") {
				delete(pg.indexes, index)
			}
		}
	}
	if len(lite.columns) < 10 {
		t.Fatalf("SQLite's schema holds %d tables: %v", len(lite.columns), lite.lines())
	}
	got, want := pg.lines(), lite.lines()
	for _, l := range want {
		if !slices.Contains(got, l) {
			t.Errorf("PostgreSQL lacks what SQLite has: %s", l)
		}
	}
	for _, l := range got {
		if !slices.Contains(want, l) {
			t.Errorf("SQLite lacks what PostgreSQL has: %s", l)
		}
	}
}

// previousSchema makes mcp-quota's schema in the database at url as the
// version before the flags became booleans (PostgreSQL migration 0006)
// left it: migrations 0001 to 0005, version 5.
func previousSchema(t *testing.T, conn *pgx.Conn) { schemaAt(t, conn, 5) }

// schemaAt makes the schema of version last on conn's database, as
// mcp-quota's migrations up to it made it.
func schemaAt(t *testing.T, conn *pgx.Conn, last int) {
	t.Helper()
	ctx := context.Background()
	steps := []string{"CREATE SCHEMA mcp_quota", "CREATE TABLE mcp_quota.schema_version (version INTEGER NOT NULL)",
		"SET search_path TO mcp_quota"}
	for v := 1; v <= last; v++ {
		names, err := fs.Glob(postgres.Migrations, fmt.Sprintf("%04d_*.sql", v))
		if err != nil || len(names) != 1 {
			t.Fatalf("migration %d: %v %v", v, names, err)
		}
		body, err := postgres.Migrations.ReadFile(names[0])
		if err != nil {
			t.Fatal(err)
		}
		steps = append(steps, string(body))
	}
	steps = append(steps, fmt.Sprintf("INSERT INTO schema_version VALUES (%d)", last))
	for _, s := range steps {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
}

// A database the previous schema holds rows in (flags as 0 and 1) is
// migrated in place: each flag reads back as it was written, the window
// counts the attempts counted then, and admissions go on after it.
func flagsMigrated(t *testing.T, srv *pgtest.Server) {
	ctx := context.Background()
	url := srv.CreateDatabase(t)
	conn := rawConn(t, srv, url)
	previousSchema(t, conn)
	at := t0.UnixMicro()
	fill := []string{
		`INSERT INTO keys (key) VALUES ('k')`,
		fmt.Sprintf(`INSERT INTO attempts (call_id, attempt, key, caller, transport, method, target, state, probe, counted, at, seq, cbytes)
		VALUES ('c1', 1, 'k', 'a', 'rest', 'GET', '/', 'confirmed', 0, 1, %d, 1, 0),
			('c2', 1, 'k', 'a', 'rest', 'GET', '/', 'confirmed', 1, 1, %d, 2, 0),
			('c3', 1, 'k', 'a', 'rest', 'GET', '/', 'refused', 0, 0, %d, NULL, NULL)`, at, at+1000, at+2000),
		fmt.Sprintf(`INSERT INTO observations (key, policy, unit, partition, status, received_at, shape, profile, guessed, from_cache, method, target)
		VALUES ('k', 'p', 'requests', '', 200, %d, 'draft', 'ietf', 1, 0, 'GET', '/'),
			('k', 'p', 'requests', '', 200, %d, 'draft', 'ietf', 0, 1, 'GET', '/')`, at, at+1),
		fmt.Sprintf(`INSERT INTO policies (key, policy, unit, partition, q, w_us, received_at, basis_at, source, hidden)
		VALUES ('k', 'shown', 'requests', '', 10, 60000000, %d, %d, 'draft', 0),
			('k', 'inferred', 'requests', '', 5, 1000000, %d, %d, 'inferred', 1)`, at, at, at, at),
		`INSERT INTO key_state (key, half_open, failures) VALUES ('k', 1, 3), ('closed', 0, 1)`,
		fmt.Sprintf(`INSERT INTO path_failures (key, scope, failures, opens, half_open, last_at)
		VALUES ('k', 'GET /a', 2, 1, 1, %d), ('k', 'GET /b', 1, 0, 0, %d)`, at, at),
	}
	for _, s := range fill {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}

	pg := openPostgres(t, url, state.PostgresOptions{})
	if v, _ := version(t, conn); v != latestSchema(t) {
		t.Fatalf("migrated to version %d, want %d", v, latestSchema(t))
	}
	var flags []string
	rows, err := conn.Query(ctx, `SELECT table_name || '.' || column_name FROM information_schema.columns
		WHERE table_schema = 'mcp_quota' AND data_type = 'boolean' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	if flags, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	want := slices.Sorted(maps.Keys(flagColumns))
	if !slices.Equal(flags, want) {
		t.Errorf("boolean columns: %v, want %v", flags, want)
	}
	var guessed, fromCache []bool
	rows, err = conn.Query(ctx, `SELECT guessed, from_cache FROM mcp_quota.observations ORDER BY received_at`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var g, c bool
		if err := rows.Scan(&g, &c); err != nil {
			t.Fatal(err)
		}
		guessed, fromCache = append(guessed, g), append(fromCache, c)
	}
	if !slices.Equal(guessed, []bool{true, false}) || !slices.Equal(fromCache, []bool{false, true}) {
		t.Errorf("observations: guessed %v, from the cache %v, want [true false] and [false true]", guessed, fromCache)
	}

	view(t, pg, func(tx ledger.ReadTx) error {
		w, err := tx.Window("k", t0.Add(-time.Second))
		if err != nil {
			return err
		}
		if w.Count != 2 || !w.Oldest.Equal(t0) {
			t.Errorf("window: %+v, want the 2 attempts counted, the first at %v", w, t0)
		}
		acts, err := tx.Activity(ledger.ActivityFilter{Key: "k"})
		if err != nil {
			return err
		}
		probes := map[string]bool{}
		for _, a := range acts {
			probes[a.CallID] = a.Probe
		}
		if !maps.Equal(probes, map[string]bool{"c1": false, "c2": true, "c3": false}) {
			t.Errorf("probes by call: %v, want c2's alone", probes)
		}
		known, err := tx.SeenPolicies("k")
		if err != nil {
			return err
		}
		hidden := map[string]bool{}
		for _, k := range known {
			hidden[k.Policy] = k.Hidden
		}
		if !maps.Equal(hidden, map[string]bool{"shown": false, "inferred": true}) {
			t.Errorf("hidden policies: %v, want the inferred one alone", hidden)
		}
		for key, want := range map[string]bool{"k": true, "closed": false} {
			s, err := tx.KeyState(key)
			if err != nil {
				return err
			}
			if s.HalfOpen != want {
				t.Errorf("key %s half open: %v, want %v", key, s.HalfOpen, want)
			}
		}
		for scope, want := range map[string]bool{"GET /a": true, "GET /b": false} {
			s, err := tx.PathState("k", scope)
			if err != nil {
				return err
			}
			if s.HalfOpen != want || s.Failures == 0 {
				t.Errorf("route %s: %+v, want half open %v", scope, s, want)
			}
		}
		return nil
	})
	// An admission after the migration is counted, numbered after those before it.
	update(t, pg, func(tx ledger.Tx) error {
		_, err := tx.InsertAttempt(ledger.Attempt{CallID: "c4", Attempt: 1, Key: "k", State: ledger.Admitted, At: t0.Add(time.Second)})
		return err
	}, "k")
	view(t, pg, func(tx ledger.ReadTx) error {
		w, err := tx.Window("k", t0.Add(-time.Second))
		if err == nil && w.Count != 3 {
			t.Errorf("window after an admission: %d, want 3", w.Count)
		}
		return err
	})
}
