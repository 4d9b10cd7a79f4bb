package state

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// A journal line keeps its attempt's reason as data, and its words for
// a process of the previous version; a line that version wrote (words
// only) reads back as them, and one as ledger.Finished's own JSON once
// was, as data.
func TestJournalLinesKeepTheReason(t *testing.T) {
	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	why := reason.Reason{Kind: reason.Late, For: 700 * time.Millisecond, Allowed: 250 * time.Millisecond}
	f := ledger.Finished{Attempt: ledger.Attempt{ID: 7, Key: "k", CallID: "c", Attempt: 1, State: ledger.Failed, Reason: why,
		SentAt: at, InFlightUntil: at, CallerReserves: true}}
	line, err := json.Marshal(journalLineOf(f))
	if err != nil {
		t.Fatal(err)
	}
	read := func(line []byte) ledger.Finished { return readJournalLine(t, line) }
	if diff := cmp.Diff(read(line), f); diff != "" {
		t.Errorf("a line written and read back (-got +want):\n%s", diff)
	}

	// What the previous version reads of it: the attempt, its reason in words.
	var older struct {
		Attempt struct {
			ID         int64
			State      string
			Reason     string
			LeaseUntil time.Time
			ByCaller   bool // the attempt's CallerReserves
		} `json:"attempt"`
	}
	if err := json.Unmarshal(line, &older); err != nil {
		t.Fatalf("the previous version cannot read %s: %v", line, err)
	}
	if older.Attempt.ID != 7 || older.Attempt.State != "failed" || older.Attempt.Reason != why.String() || !older.Attempt.LeaseUntil.Equal(at) ||
		!older.Attempt.ByCaller {
		t.Errorf("the previous version reads %+v of %s, want the attempt with its words %q", older.Attempt, line, why.String())
	}

	// A line the previous version wrote.
	old := []byte(`{"attempt":{"ID":7,"Key":"k","CallID":"c","Attempt":1,"State":"confirmed","Reason":"HTTP 200 OK","Status":200,"ByCaller":true}}`)
	want := reason.Reason{Kind: reason.Said, Said: "HTTP 200 OK"}
	if got := read(old).Attempt; got.Reason != want || got.ID != 7 || got.Status != 200 || !got.CallerReserves {
		t.Errorf("a line of the previous version reads back as %+v, want its reason %+v", got, want)
	}

	// A line as ledger.Finished's own JSON was written while it was the
	// line's form: the reason as data where the words go, InFlightUntil
	// under the journal's name.
	var former struct {
		Attempt struct {
			ledger.Attempt
			LeaseUntil     time.Time
			InFlightUntil  hiddenField `json:",omitzero"`
			ByCaller       bool
			CallerReserves hiddenField `json:",omitzero"`
		} `json:"attempt"`
	}
	former.Attempt.Attempt, former.Attempt.LeaseUntil, former.Attempt.ByCaller = f.Attempt, f.Attempt.InFlightUntil, f.Attempt.CallerReserves
	own, err := json.Marshal(former)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(read(own), f); diff != "" {
		t.Errorf("ledger.Finished's former JSON %s read back (-got +want):\n%s", own, diff)
	}
}

// readJournalLine is what a process replaying a journal reads of line.
func readJournalLine(t *testing.T, line []byte) ledger.Finished {
	t.Helper()
	var l journalLine
	if err := json.Unmarshal(line, &l); err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	return l.finished()
}
