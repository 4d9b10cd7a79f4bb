package state_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/state"
)

// reserve reserves n slots of key "k" in db and returns their IDs.
func reserve(t *testing.T, db *state.DB, n int) []int64 {
	t.Helper()
	var ids []int64
	update(t, db, func(tx ledger.Tx) error {
		first, last, err := tx.Reserve("k", n, t0, t0.Add(time.Hour), "a batch")
		for id := first; id <= last; id++ {
			ids = append(ids, id)
		}
		return err
	})
	return ids
}

// finishedSlot is slot id's call, confirmed, with one observation.
func finishedSlot(id int64, r int64) ledger.Finished {
	ob := ratelimit.Observation{Policy: "p", Unit: ratelimit.Requests, Remaining: r, HasRemaining: true, Shape: ratelimit.ShapeDraft}
	return ledger.Finished{
		Attempt: ledger.Attempt{ID: id, Key: "k", CallID: fmt.Sprint("call-", id), Attempt: 1, Caller: "sync", Transport: "rest",
			Method: "GET", Target: "/items", State: ledger.Confirmed, Reason: "HTTP 200 OK", Status: 200,
			SentAt: t0, AnsweredAt: t0.Add(time.Millisecond)},
		Observations: []ledger.ObservationRecord{{Key: "k", AttemptID: id, Observation: ob, Status: 200,
			ReceivedAt: t0.Add(time.Millisecond), Method: "GET", Target: "/items"}},
	}
}

// ended returns, per state, how many of ids are in it, and how many
// observations each has.
func ended(t *testing.T, db *state.DB, ids []int64) (map[string]int, map[int64]int) {
	t.Helper()
	states, obs := map[string]int{}, map[int64]int{}
	want := map[int64]bool{}
	for _, id := range ids {
		want[id] = true
	}
	view(t, db, func(tx ledger.Tx) error {
		sends, err := tx.Sends("k", time.Time{}, 1000)
		if err != nil {
			return err
		}
		for _, s := range sends {
			if want[s.ID] {
				states[s.State]++
			}
		}
		records, err := tx.Observations("k", 1000)
		for _, o := range records {
			obs[o.AttemptID]++
		}
		return err
	})
	return states, obs
}

// journalFiles lists the journal files of the state file at path.
func journalFiles(t *testing.T, path string) []string {
	t.Helper()
	names, err := filepath.Glob(path + ".outcomes/*")
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// What FinishLater is given is in the state file for the process's next
// View, and the journal keeps nothing once the file is closed.
func TestFinishLater(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := state.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	ids := reserve(t, db, 8)
	for _, id := range ids[:5] {
		if err := db.FinishLater(context.Background(), finishedSlot(id, 100-id)); err != nil {
			t.Fatal(err)
		}
	}
	states, obs := ended(t, db, ids)
	if states[ledger.Confirmed] != 5 || states[ledger.Reserved] != 3 {
		t.Errorf("after FinishLater of 5 of 8 slots, a View sees %v, want 5 confirmed and 3 reserved", states)
	}
	for _, id := range ids[:5] {
		if obs[id] != 1 {
			t.Errorf("slot %d has %d observations, want 1", id, obs[id])
		}
	}
	if files := journalFiles(t, path); len(files) != 1 {
		t.Errorf("journal files while open: %v, want the process's one", files)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if files := journalFiles(t, path); len(files) != 0 {
		t.Errorf("journal files after Close: %v, want none", files)
	}
}

// The journal of a process that ended before its outcomes reached the
// state file is recorded by the next process to open it, once: a line
// the crash cut short is skipped, an outcome recorded already is not
// recorded again, and the journal is removed.
func TestRecoverAnEndedProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db := open(t, path)
	ids := reserve(t, db, 6)
	// ids[0] was applied before the crash; ids[1:4] were not; ids[4:]
	// were never handed out.
	update(t, db, func(tx ledger.Tx) error {
		f := finishedSlot(ids[0], 99)
		if err := tx.FinishReserved(f.Attempt); err != nil {
			return err
		}
		return tx.AddObservation(f.Observations[0])
	})
	var journal strings.Builder
	for _, id := range ids[:4] {
		line, err := json.Marshal(finishedSlot(id, 100-id))
		if err != nil {
			t.Fatal(err)
		}
		journal.Write(append(line, '\n'))
	}
	torn, _ := json.Marshal(finishedSlot(ids[4], 1))
	journal.Write(torn[:len(torn)/2])
	dir := path + ".outcomes"
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "4242-dead.log"), []byte(journal.String()), 0o600); err != nil {
		t.Fatal(err)
	}

	other := open(t, path) // Open recovers
	states, obs := ended(t, other, ids)
	if states[ledger.Confirmed] != 4 || states[ledger.Reserved] != 2 {
		t.Errorf("after recovery: %v, want 4 confirmed (1 before the crash, 3 recovered) and 2 reserved", states)
	}
	for _, id := range ids[:4] {
		if obs[id] != 1 {
			t.Errorf("slot %d has %d observations after recovery, want 1", id, obs[id])
		}
	}
	if files := journalFiles(t, path); len(files) != 0 {
		t.Errorf("journal files after recovery: %v, want none", files)
	}
	if n, err := other.Recover(context.Background()); err != nil || n != 0 {
		t.Errorf("a second recovery recorded %d (%v), want 0", n, err)
	}
}

// A process never takes the journal of a live one for that of a process
// that ended.
func TestRecoverLeavesALiveJournal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db := open(t, path)
	ids := reserve(t, db, 4)
	if err := db.FinishLater(context.Background(), finishedSlot(ids[0], 10)); err != nil {
		t.Fatal(err)
	}
	files := journalFiles(t, path)
	if len(files) != 1 {
		t.Fatalf("journal files: %v, want one", files)
	}
	other := open(t, path)
	if n, err := other.Recover(context.Background()); err != nil || n != 0 {
		t.Errorf("recovering beside a live process recorded %d (%v), want 0", n, err)
	}
	if _, err := os.Stat(files[0]); err != nil {
		t.Fatalf("the live process's journal: %v", err)
	}
	if err := db.FinishLater(context.Background(), finishedSlot(ids[1], 9)); err != nil {
		t.Fatal(err)
	}
	if states, _ := ended(t, db, ids); states[ledger.Confirmed] != 2 {
		t.Errorf("the live process's outcomes: %v, want 2 confirmed", states)
	}
}

// Close is safe to call twice, and FinishLater after it records nothing
// and says so.
func TestJournalAfterClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := state.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	ids := reserve(t, db, 2)
	if err := db.FinishLater(context.Background(), finishedSlot(ids[0], 1)); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	if err := db.FinishLater(context.Background(), finishedSlot(ids[1], 0)); err == nil {
		t.Error("FinishLater after Close succeeded")
	}
	if files := journalFiles(t, path); len(files) != 0 {
		t.Errorf("journal files after Close: %v, want none", files)
	}
}

// refuse makes the state file at path refuse to record the slots ids,
// as a constraint would.
func refuse(t *testing.T, path string, ids ...int64) {
	t.Helper()
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, id := range ids {
		if _, err := raw.Exec(fmt.Sprintf(`CREATE TRIGGER refuse_%d BEFORE UPDATE ON attempts WHEN OLD.id = %d
			BEGIN SELECT RAISE(ABORT, 'refused'); END`, id, id)); err != nil {
			t.Fatal(err)
		}
	}
}

// statesOf returns how many of key "k"'s attempts are in each state.
func statesOf(t *testing.T, db *state.DB) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	states := map[string]int{}
	if err := db.View(ctx, func(tx ledger.Tx) error {
		sends, err := tx.Sends("k", time.Time{}, 100)
		for _, s := range sends {
			states[s.State]++
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return states
}

// An outcome the state file refuses is set aside: it holds back none of
// the others, alone or not, no View waits for it, and it keeps no
// process from opening the file.
func TestJournalSetsARefusedOutcomeAside(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := state.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	ids := reserve(t, db, 5)
	refuse(t, path, ids[1], ids[3])
	for _, id := range ids[:3] {
		if err := db.FinishLater(context.Background(), finishedSlot(id, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if states := statesOf(t, db); states[ledger.Confirmed] != 2 || states[ledger.Reserved] != 3 {
		t.Errorf("with one of three outcomes refused: %v, want 2 confirmed and 3 reserved", states)
	}
	if err := db.FinishLater(context.Background(), finishedSlot(ids[3], 1)); err != nil { // refused, alone
		t.Fatal(err)
	}
	if states := statesOf(t, db); states[ledger.Confirmed] != 2 {
		t.Errorf("after a refused outcome alone: %v, want 2 confirmed still", states)
	}
	if err := db.FinishLater(context.Background(), finishedSlot(ids[4], 1)); err != nil {
		t.Fatal(err)
	}
	if states := statesOf(t, db); states[ledger.Confirmed] != 3 {
		t.Errorf("the outcome after a refused one: %v, want 3 confirmed", states)
	}
	if err := db.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if files := journalFiles(t, path); len(files) != 0 {
		t.Errorf("journal files after Close: %v, want none", files)
	}
	open(t, path)
}

// A journal of an ended process with an outcome the state file refuses
// is recorded all the same, but for that outcome, and removed.
func TestRecoverSetsARefusedOutcomeAside(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db := open(t, path)
	ids := reserve(t, db, 3)
	refuse(t, path, ids[1])
	var journal strings.Builder
	for _, id := range ids {
		line, _ := json.Marshal(finishedSlot(id, 1))
		journal.Write(append(line, '\n'))
	}
	if err := os.MkdirAll(path+".outcomes", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path+".outcomes", "4242-dead.log"), []byte(journal.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	other := open(t, path)
	if states := statesOf(t, other); states[ledger.Confirmed] != 2 || states[ledger.Reserved] != 1 {
		t.Errorf("after recovery with one outcome refused: %v, want 2 confirmed and 1 reserved", states)
	}
	if files := journalFiles(t, path); len(files) != 0 {
		t.Errorf("journal files after recovery: %v, want none", files)
	}
}
