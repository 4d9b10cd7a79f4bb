package state

import (
	"context"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// scanned are the tables that grow with history: no statement may walk
// one whole. Walking attempts_in_flight is allowed: the partial index
// holds only the calls in flight.
var (
	scanned  = regexp.MustCompile(`^SCAN (attempts|observations|warnings)\b`)
	inFlight = regexp.MustCompile(`USING (COVERING )?INDEX attempts_in_flight\b`)
)

// TestNoStatementScansHistory: SQLite's plan of every statement the
// package prepares finds its rows of attempts, observations and warnings
// through an index or the row ID, never by walking the table — a cost
// that would grow with the history.
func TestNoStatementScansHistory(t *testing.T) {
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, text := range queries {
		if text.sqlite == "" {
			continue // PostgreSQL's alone
		}
		for _, detail := range planOf(t, db, text.sqlite) {
			if scanned.MatchString(detail) && !inFlight.MatchString(detail) {
				t.Errorf("%s\n  in %s", detail, strings.Join(strings.Fields(text.sqlite), " "))
			}
		}
	}
}

var numbered = regexp.MustCompile(`\?(\d+)`)

// planOf is the detail of each step of SQLite's plan of q, every
// parameter 1.
func planOf(t *testing.T, db *DB, q string) []string {
	t.Helper()
	n := strings.Count(q, "?")
	if m := numbered.FindAllStringSubmatch(q, -1); m != nil {
		n = 0
		for _, g := range m {
			v, _ := strconv.Atoi(g[1])
			n = max(n, v)
		}
	}
	args := make([]any, n)
	for i := range args {
		args[i] = 1
	}
	rows, err := db.r.Query("EXPLAIN QUERY PLAN "+q, args...)
	if err != nil {
		t.Errorf("plan of %q: %v", q, err)
		return nil
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	return plan
}

// TestEveryAttemptIndexIsUsed: each index of attempts serves at least one
// statement in SQLite's plans, so an index that none needs (which every
// admission would still write) fails it. Run with -v, it lists which
// statements use each index; docs/benchmarks-log.md, "The journal
// line without reflection, and two fewer index entries a slot", copies
// that list.
func TestEveryAttemptIndexIsUsed(t *testing.T) {
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	used := map[string][]string{}
	rows, err := db.r.Query(`SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'attempts' AND sql IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		used[name] = nil
	}
	rows.Close()
	index := regexp.MustCompile(`\bINDEX (attempts_\w+)`)
	for _, text := range queries {
		if text.sqlite == "" {
			continue
		}
		for _, detail := range planOf(t, db, text.sqlite) {
			if m := index.FindStringSubmatch(detail); m != nil {
				used[m[1]] = append(used[m[1]], text.name)
			}
		}
	}
	names := slices.Sorted(maps.Keys(used))
	for _, name := range names {
		slices.Sort(used[name])
		t.Logf("%s: %s", name, strings.Join(slices.Compact(used[name]), ", "))
		if len(used[name]) == 0 {
			t.Errorf("no statement uses the index %s", name)
		}
	}
}
