package state_test

import (
	"net/url"
	"path"
	"path/filepath"
	"testing"

	"github.com/mcp-quota/mcp-quota/internal/conformance"
)

// The one suite of the state's behaviour runs against each back end: a
// SQLite file in a directory of its own per behaviour, and a database per
// behaviour on one throwaway PostgreSQL server.

func TestConformanceSQLite(t *testing.T) {
	conformance.Run(t, conformance.Backend{
		Name:       "SQLite",
		New:        func(t *testing.T) string { return filepath.Join(t.TempDir(), "state.db") },
		JournalDir: func(location string) string { return location + ".outcomes" },
	})
}

func TestConformancePostgreSQL(t *testing.T) {
	srv := startPostgres(t) // the helper processes inherit PGPASSWORD
	journals := t.TempDir()
	conformance.Run(t, conformance.Backend{
		Name: "PostgreSQL",
		New:  func(t *testing.T) string { return srv.CreateDatabase(t) },
		// A directory per database, as the commands keep one (see
		// PostgresOptions.JournalDir).
		JournalDir: func(location string) string {
			u, err := url.Parse(location)
			if err != nil {
				t.Fatal(err)
			}
			return filepath.Join(journals, path.Base(u.Path))
		},
		ServerClock: true,
	})
	// After every behaviour, the password is in none of the databases,
	// nor in a journal.
	t.Cleanup(func() { noPasswordOnServer(t, srv, journals) })
}
