package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
)

// journals: outcomes recorded through the process's journal (FinishLater),
// and the journals of processes that ended (Recover).
var journals = []behaviour{
	{"what FinishLater is given is in the next View, and Close leaves no journal", finishLater},
	{"the journal of a process that ended is recorded once by Recover", recoverAnEndedProcess},
	{"the journal of a live process is left to it", recoverLeavesALiveJournal},
	{"Close twice is safe, and FinishLater after it records nothing", journalAfterClose},
	{"an outcome of a slot the sweep released is recorded as its call ended", finishAReleasedSlot},
}

// reserve reserves n slots of key "k" in s, leased for an hour, and
// returns their IDs.
func reserve(t *testing.T, s ledger.Store, n int) []int64 {
	t.Helper()
	var out []int64
	update(t, s, func(tx ledger.Tx) error {
		out = nil // set afresh: the function may run twice
		first, last, err := tx.Reserve("k", n, t0, t0.Add(time.Hour))
		for id := first; id <= last; id++ {
			out = append(out, id)
		}
		return err
	}, "k")
	return out
}

// FinishedSlot is slot id's call on key "k", sent at 2026-05-01 12:00 UTC
// and confirmed a millisecond later, with one observation of policy "p"
// saying r remain. The suite and the back ends' own journal tests write it.
func FinishedSlot(id int64, r int64) ledger.Finished {
	ob := ratelimit.Observation{Policy: "p", Unit: ratelimit.Requests, Remaining: r, HasRemaining: true, Shape: ratelimit.ShapeDraft}
	return ledger.Finished{
		Attempt: ledger.Attempt{ID: id, Key: "k", CallID: fmt.Sprint("call-", id), Attempt: 1, Caller: "sync", Transport: "rest",
			Method: "GET", Target: "/items", State: ledger.Confirmed, Reason: reason.Reason{Kind: reason.Answered, Status: 200}, Status: 200,
			SentAt: t0, AnsweredAt: t0.Add(time.Millisecond)},
		Observations: []ledger.ObservationRecord{{Key: "k", AttemptID: id, Observation: ob, Status: 200,
			ReceivedAt: t0.Add(time.Millisecond), Method: "GET", Target: "/items"}},
	}
}

// ended returns, per state, how many of key "k"'s slots ids are in it,
// and how many observations each has.
func ended(t testing.TB, s ledger.Viewer, ids []int64) (map[ledger.State]int, map[int64]int) {
	t.Helper()
	states, obs := map[ledger.State]int{}, map[int64]int{}
	want := map[int64]bool{}
	for _, id := range ids {
		want[id] = true
	}
	view(t, s, func(tx ledger.ReadTx) error {
		sends, err := tx.Sends("k", time.Time{}, 1<<20)
		if err != nil {
			return err
		}
		for _, s := range sends {
			if want[s.ID] {
				states[s.State]++
			}
		}
		records, err := own(tx).Observations("k", 1<<20)
		for _, o := range records {
			obs[o.AttemptID]++
		}
		return err
	})
	return states, obs
}

// journalFiles lists the journal files of the store at location.
func journalFiles(t *testing.T, b Backend, location string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(b.JournalDir(location), "*"))
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func finishLater(t *testing.T, b Backend) {
	loc := b.New(t)
	s, err := state.OpenStore(context.Background(), loc, b.options(loc))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // closed below; again does nothing
	ids := reserve(t, s, 8)
	for _, id := range ids[:5] {
		if err := s.FinishLater(context.Background(), FinishedSlot(id, 100-id)); err != nil {
			t.Fatal(err)
		}
	}
	states, obs := ended(t, s, ids)
	if states[ledger.Confirmed] != 5 || states[ledger.Reserved] != 3 {
		t.Errorf("after FinishLater of 5 of 8 slots, a View sees %v, want 5 confirmed and 3 reserved", states)
	}
	for _, id := range ids[:5] {
		if obs[id] != 1 {
			t.Errorf("slot %d has %d observations, want 1", id, obs[id])
		}
	}
	if files := journalFiles(t, b, loc); len(files) != 1 {
		t.Errorf("journal files while open: %v, want the process's one", files)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if files := journalFiles(t, b, loc); len(files) != 0 {
		t.Errorf("journal files after Close: %v, want none", files)
	}
	if states, _ := ended(t, b.Open(t, loc), ids); states[ledger.Confirmed] != 5 {
		t.Errorf("opened again after Close: %v, want the 5 confirmed", states)
	}
}

// A journalLine is an outcome as a line of a journal holds it: the format
// every version sharing a journal directory reads. An attempt's
// InFlightUntil is written as LeaseUntil; the lines here leave it zero.
type journalLine struct {
	Attempt      ledger.Attempt             `json:"attempt"`
	Observations []ledger.ObservationRecord `json:"observations,omitempty"`
}

// writeJournal leaves in location's journal directory the journal of a
// process that ended after writing fs, and a line its end cut short.
func writeJournal(t *testing.T, b Backend, location string, fs []ledger.Finished, torn ledger.Finished) {
	t.Helper()
	var journal strings.Builder
	for _, f := range fs {
		line, err := json.Marshal(journalLine(f))
		if err != nil {
			t.Fatal(err)
		}
		journal.Write(append(line, '\n'))
	}
	line, _ := json.Marshal(journalLine(torn))
	journal.Write(line[:len(line)/2])
	dir := b.JournalDir(location)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "4242-dead.log"), []byte(journal.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// The journal of a process that ended before its outcomes reached the
// store is recorded by Recover, once: a line the end cut short is
// skipped, an outcome recorded already is not recorded again, and the
// journal is removed.
func recoverAnEndedProcess(t *testing.T, b Backend) {
	s, loc := b.fresh(t)
	ids := reserve(t, s, 6)
	// ids[0] was recorded before the end; ids[1:4] were not; ids[4:]
	// were never handed out.
	update(t, s, func(tx ledger.Tx) error {
		f := FinishedSlot(ids[0], 99)
		if err := tx.FinishReserved(f.Attempt); err != nil {
			return err
		}
		return tx.AddObservation(f.Observations[0])
	}, "k")
	var fs []ledger.Finished
	for _, id := range ids[:4] {
		fs = append(fs, FinishedSlot(id, 100-id))
	}
	writeJournal(t, b, loc, fs, FinishedSlot(ids[4], 1))

	if n, err := s.Recover(context.Background()); err != nil || n != 3 {
		t.Errorf("Recover recorded %d (%v), want the 3 not recorded before", n, err)
	}
	states, obs := ended(t, b.Open(t, loc), ids)
	if states[ledger.Confirmed] != 4 || states[ledger.Reserved] != 2 {
		t.Errorf("after recovery: %v, want 4 confirmed (1 before the end, 3 recovered) and 2 reserved", states)
	}
	for _, id := range ids[:4] {
		if obs[id] != 1 {
			t.Errorf("slot %d has %d observations after recovery, want 1", id, obs[id])
		}
	}
	if files := journalFiles(t, b, loc); len(files) != 0 {
		t.Errorf("journal files after recovery: %v, want none", files)
	}
	if n, err := s.Recover(context.Background()); err != nil || n != 0 {
		t.Errorf("a second recovery recorded %d (%v), want 0", n, err)
	}
}

// A process never takes the journal of a live one for that of a process
// that ended.
func recoverLeavesALiveJournal(t *testing.T, b Backend) {
	s, loc := b.fresh(t)
	ids := reserve(t, s, 4)
	if err := s.FinishLater(context.Background(), FinishedSlot(ids[0], 10)); err != nil {
		t.Fatal(err)
	}
	files := journalFiles(t, b, loc)
	if len(files) != 1 {
		t.Fatalf("journal files: %v, want one", files)
	}
	other := b.Open(t, loc)
	if n, err := other.Recover(context.Background()); err != nil || n != 0 {
		t.Errorf("recovering beside a live process recorded %d (%v), want 0", n, err)
	}
	if _, err := os.Stat(files[0]); err != nil {
		t.Fatalf("the live process's journal: %v", err)
	}
	if err := s.FinishLater(context.Background(), FinishedSlot(ids[1], 9)); err != nil {
		t.Fatal(err)
	}
	if states, _ := ended(t, s, ids); states[ledger.Confirmed] != 2 {
		t.Errorf("the live process's outcomes: %v, want 2 confirmed", states)
	}
}

func journalAfterClose(t *testing.T, b Backend) {
	loc := b.New(t)
	s, err := state.OpenStore(context.Background(), loc, b.options(loc))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // closed below; again does nothing
	ids := reserve(t, s, 2)
	if err := s.FinishLater(context.Background(), FinishedSlot(ids[0], 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	if err := s.FinishLater(context.Background(), FinishedSlot(ids[1], 0)); err == nil {
		t.Error("FinishLater after Close succeeded")
	}
	if files := journalFiles(t, b, loc); len(files) != 0 {
		t.Errorf("journal files after Close: %v, want none", files)
	}
	if states, _ := ended(t, b.Open(t, loc), ids); states[ledger.Confirmed] != 1 || states[ledger.Reserved] != 1 {
		t.Errorf("after Close: %v, want the outcome given before it confirmed, the other slot reserved", states)
	}
}

// A slot whose lease ran out is released by the sweep; when its call's
// outcome comes after all, it is recorded as the call ended.
func finishAReleasedSlot(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	ids := reserve(t, s, 2)
	if n := sweep(t, s, t0.Add(2*time.Hour), time.Time{}); n.Interrupted != 2 {
		t.Errorf("the sweep after the lease: %+v, want the 2 slots released", n)
	}
	if states, _ := ended(t, s, ids); states[ledger.Released] != 2 {
		t.Fatalf("after the sweep: %v, want 2 released", states)
	}
	if err := s.FinishLater(context.Background(), FinishedSlot(ids[0], 5)); err != nil {
		t.Fatal(err)
	}
	states, obs := ended(t, s, ids)
	if states[ledger.Confirmed] != 1 || states[ledger.Released] != 1 || obs[ids[0]] != 1 {
		t.Errorf("after the outcome of a released slot: %v, %v; want it confirmed with its observation", states, obs)
	}
}
