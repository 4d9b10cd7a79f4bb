package rest

import (
	"fmt"
	"testing"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// pagedLog is an activity of attempts by ID, newest (highest ID) first,
// paged as the state pages it: below a cursor, at most Limit.
type pagedLog struct {
	ledger.Tx
	rows  []ledger.Attempt // newest first
	reads int
}

func (l *pagedLog) Activity(f ledger.ActivityFilter) ([]ledger.Attempt, error) {
	l.reads++
	var out []ledger.Attempt
	for _, a := range l.rows {
		if (f.Cursor.IsZero() || a.ID < f.Cursor.AttemptID()) && len(out) < f.Limit {
			out = append(out, a)
		}
	}
	return out, nil
}

// A person who sees one principal of ten reads every call of it once,
// page after page, each page read with a bounded number of reads; one
// who sees every call reads one page per page.
func TestSeenActivityPages(t *testing.T) {
	log := &pagedLog{}
	for id := int64(300); id >= 1; id-- {
		caller := fmt.Sprintf("agent-%d", id%10)
		if id%10 == 3 {
			caller = "bob@example.com via Claude.ai"
		}
		log.rows = append(log.rows, ledger.Attempt{ID: id, Caller: caller})
	}
	bob := &keystore.Caller{Name: "bob@example.com via dash", Sight: &keystore.Sight{Principals: []string{"bob@example.com"}}}
	everyone := &keystore.Caller{Name: "agent", Keys: []string{"*"}}
	for _, tc := range []struct {
		who            *keystore.Caller
		want, maxReads int
	}{
		{bob, 30, maxSightPages},
		{everyone, 300, 1},
	} {
		var got []int64
		var before ledger.Cursor
		for pages := 0; ; pages++ {
			if pages > 100 {
				t.Fatalf("%s: paging does not end", tc.who.Name)
			}
			log.reads = 0
			list, next, err := seenActivity(log, ledger.ActivityFilter{Limit: 10, Cursor: before}, tc.who)
			if err != nil {
				t.Fatal(err)
			}
			if log.reads > tc.maxReads {
				t.Errorf("%s: a page took %d reads, want at most %d", tc.who.Name, log.reads, tc.maxReads)
			}
			for _, a := range list {
				if !tc.who.MaySee(a.Caller) {
					t.Errorf("%s was shown %s's call %d", tc.who.Name, a.Caller, a.ID)
				}
				if len(got) > 0 && a.ID >= got[len(got)-1] {
					t.Errorf("%s: call %d after %d", tc.who.Name, a.ID, got[len(got)-1])
				}
				got = append(got, a.ID)
			}
			if next.IsZero() {
				break
			}
			before = next
		}
		if len(got) != tc.want {
			t.Errorf("%s saw %d calls over all pages, want %d", tc.who.Name, len(got), tc.want)
		}
	}
}
