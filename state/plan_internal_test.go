package state

import (
	"context"
	"path/filepath"
	"regexp"
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
	numbered := regexp.MustCompile(`\?(\d+)`)
	for _, text := range queries {
		q := text.sqlite
		if q == "" {
			continue // PostgreSQL's alone
		}
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
			continue
		}
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			if scanned.MatchString(detail) && !inFlight.MatchString(detail) {
				t.Errorf("%s\n  in %s", detail, strings.Join(strings.Fields(q), " "))
			}
		}
		rows.Close()
	}
}
