package state

import (
	"maps"
	"regexp"
	"slices"
	"testing"

	"github.com/mcp-quota/mcp-quota/state/postgres"
	"github.com/mcp-quota/mcp-quota/state/sqlite"
)

// sqliteOnly are the statements SQLite alone runs: its own upkeep.
var sqliteOnly = []string{"AutoVacuum", "FreePages"}

// TestStatementTables: each back end writes every statement the package
// runs in its own SQL, nothing translated at run time: both tables name
// the same statements (but SQLite's upkeep), each is one the package
// runs, and neither holds the other's parameters or planner hints.
func TestStatementTables(t *testing.T) {
	used := map[string]bool{}
	for _, q := range queries {
		used[q.name] = true
	}
	for name := range sqlite.Statements {
		if !used[name] {
			t.Errorf("SQLite's statement %s is run by nothing", name)
		}
		if _, ok := postgres.Statements[name]; !ok && !slices.Contains(sqliteOnly, name) {
			t.Errorf("PostgreSQL has no statement %s", name)
		}
	}
	for name := range postgres.Statements {
		if !used[name] {
			t.Errorf("PostgreSQL's statement %s is run by nothing", name)
		}
		if _, ok := sqlite.Statements[name]; !ok {
			t.Errorf("SQLite has no statement %s", name)
		}
	}
	var (
		question = regexp.MustCompile(`\?\d*`)
		dollar   = regexp.MustCompile(`\$\d+`)
		hint     = regexp.MustCompile(`INDEXED BY|\+key\b`)
		// A flag compared with a number: on PostgreSQL flags are booleans.
		flagNumber = regexp.MustCompile(`\b(counted|probe|hidden|half_open|guessed|from_cache)\s*(=|!=|<>)\s*\d`)
	)
	for _, name := range slices.Sorted(maps.Keys(postgres.Statements)) {
		text := postgres.Statements[name]
		if m := question.FindString(unquoted(text)); m != "" {
			t.Errorf("PostgreSQL's %s holds SQLite's parameter %s", name, m)
		}
		if m := hint.FindString(text); m != "" {
			t.Errorf("PostgreSQL's %s holds SQLite's planner hint %s", name, m)
		}
		if m := flagNumber.FindString(text); m != "" {
			t.Errorf("PostgreSQL's %s compares a flag with a number: %s", name, m)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(sqlite.Statements)) {
		if m := dollar.FindString(unquoted(sqlite.Statements[name])); m != "" {
			t.Errorf("SQLite's %s holds PostgreSQL's parameter %s", name, m)
		}
	}
}

// unquoted is text without its quoted strings.
func unquoted(text string) string {
	return regexp.MustCompile(`'[^']*'`).ReplaceAllString(text, "''")
}
