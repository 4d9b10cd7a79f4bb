package state_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// mcp-quota's schema in a PostgreSQL database: migrated once, by one of
// many hosts starting at once; refused when a newer mcp-quota wrote it.
// (TestPostgres runs these, on its server.)

// schema describes mcp-quota's schema in a database: its tables and
// their columns, its indexes and sequences, and the version recorded.
func schema(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type FROM information_schema.columns WHERE table_schema = 'mcp_quota'
		UNION ALL SELECT 'index ' || indexname || ' ' || indexdef FROM pg_indexes WHERE schemaname = 'mcp_quota'
		UNION ALL SELECT 'sequence ' || sequence_name FROM information_schema.sequences WHERE sequence_schema = 'mcp_quota'
		UNION ALL SELECT 'version ' || version FROM mcp_quota.schema_version
		ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// latestSchema is the schema version this mcp-quota writes: its number of
// migrations.
func latestSchema(t *testing.T) int {
	t.Helper()
	names, err := filepath.Glob("postgres/*.sql")
	if err != nil || len(names) == 0 {
		t.Fatalf("the migrations: %v %v", names, err)
	}
	v, err := strconv.Atoi(strings.SplitN(filepath.Base(names[len(names)-1]), "_", 2)[0])
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func version(t *testing.T, conn *pgx.Conn) (v, rows int) {
	t.Helper()
	err := conn.QueryRow(context.Background(), "SELECT max(version), count(*) FROM mcp_quota.schema_version").Scan(&v, &rows)
	if err != nil {
		t.Fatal(err)
	}
	return v, rows
}

// A database whose schema a newer mcp-quota wrote is refused, in words,
// with nothing written to it.
func newerSchema(t *testing.T, srv *pgtest.Server) {
	url := srv.CreateDatabase(t)
	pg := openPostgres(t, url, state.PostgresOptions{})
	update(t, pg, func(tx ledger.Tx) error {
		_, err := tx.InsertAttempt(ledger.Attempt{CallID: "c", Key: "k", State: ledger.Admitted, At: t0})
		return err
	}, "k")
	pg.Close()
	conn := rawConn(t, srv, url)
	if _, err := conn.Exec(context.Background(), "UPDATE mcp_quota.schema_version SET version = $1", latestSchema(t)+1); err != nil {
		t.Fatal(err)
	}
	before := schema(t, conn)
	_, err := state.OpenPostgres(context.Background(), url, state.PostgresOptions{})
	if !errors.Is(err, state.ErrNewerSchema) || !strings.Contains(err.Error(), "nothing was written") {
		t.Errorf("a newer schema: got %v, want ErrNewerSchema, with nothing written", err)
	}
	noPassword(t, "a newer schema", err, srv.Password())
	if after := schema(t, conn); after != before {
		t.Errorf("the schema after the refusal differs:\n%s\nbefore:\n%s", after, before)
	}
	var n int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM mcp_quota.attempts").Scan(&n); err != nil || n != 1 {
		t.Errorf("attempts after the refusal: %d (%v), want the 1 there before", n, err)
	}
}

// A schema an older mcp-quota left (version 0: the schema_version table
// alone), or that an administrator created empty, is migrated to the
// latest: the same schema as a database migrated from nothing.
func olderSchema(t *testing.T, srv *pgtest.Server) {
	fresh := srv.CreateDatabase(t)
	openPostgres(t, fresh, state.PostgresOptions{})
	want := schema(t, rawConn(t, srv, fresh))
	for name, setup := range map[string]string{
		"version 0":    "CREATE SCHEMA mcp_quota; CREATE TABLE mcp_quota.schema_version (version INTEGER NOT NULL); INSERT INTO mcp_quota.schema_version VALUES (0)",
		"empty schema": "CREATE SCHEMA mcp_quota",
	} {
		url := srv.CreateDatabase(t)
		conn := rawConn(t, srv, url)
		if _, err := conn.Exec(context.Background(), setup); err != nil {
			t.Fatal(err)
		}
		openPostgres(t, url, state.PostgresOptions{})
		if got := schema(t, conn); got != want {
			t.Errorf("%s, migrated:\n%s\nwant:\n%s", name, got, want)
		}
		if v, rows := version(t, conn); v != latestSchema(t) || rows != 1 {
			t.Errorf("%s, migrated: version %d in %d rows, want %d in one", name, v, rows, latestSchema(t))
		}
	}
}

// Eight hosts opening one new database at once all succeed, and leave
// one schema, at the latest version.
func migrationsAtOnce(t *testing.T, srv *pgtest.Server) {
	url := srv.CreateDatabase(t)
	const hosts = 8
	var wg sync.WaitGroup
	errs := make([]error, hosts)
	start := make(chan struct{})
	for i := range hosts {
		wg.Go(func() {
			<-start
			pg, err := state.OpenPostgres(context.Background(), url, state.PostgresOptions{Instance: fmt.Sprint("host", i)})
			if err == nil {
				err = pg.Close()
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("host %d: %v", i, err)
		}
	}
	fresh := srv.CreateDatabase(t)
	openPostgres(t, fresh, state.PostgresOptions{})
	conn := rawConn(t, srv, url)
	if got, want := schema(t, conn), schema(t, rawConn(t, srv, fresh)); got != want {
		t.Errorf("the schema 8 hosts made at once:\n%s\nwant the one of a host alone:\n%s", got, want)
	}
	if v, rows := version(t, conn); v != latestSchema(t) || rows != 1 {
		t.Errorf("version %d in %d rows, want %d in one", v, rows, latestSchema(t))
	}
}
