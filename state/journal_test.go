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

	"github.com/mcp-quota/mcp-quota/internal/conformance"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// reserve reserves n slots of key "k" in db and returns their IDs.
func reserve(t *testing.T, db *state.DB, n int) []int64 {
	t.Helper()
	var ids []int64
	update(t, db, func(tx ledger.Tx) error {
		first, last, err := tx.Reserve("k", n, t0, t0.Add(time.Hour))
		for id := first; id <= last; id++ {
			ids = append(ids, id)
		}
		return err
	})
	return ids
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
func statesOf(t *testing.T, db *state.DB) map[ledger.State]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	states := map[ledger.State]int{}
	if err := db.View(ctx, func(tx ledger.ReadTx) error {
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
		if err := db.FinishLater(context.Background(), conformance.FinishedSlot(id, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if states := statesOf(t, db); states[ledger.Confirmed] != 2 || states[ledger.Reserved] != 3 {
		t.Errorf("with one of three outcomes refused: %v, want 2 confirmed and 3 reserved", states)
	}
	if err := db.FinishLater(context.Background(), conformance.FinishedSlot(ids[3], 1)); err != nil { // refused, alone
		t.Fatal(err)
	}
	if states := statesOf(t, db); states[ledger.Confirmed] != 2 {
		t.Errorf("after a refused outcome alone: %v, want 2 confirmed still", states)
	}
	if err := db.FinishLater(context.Background(), conformance.FinishedSlot(ids[4], 1)); err != nil {
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
		line, _ := json.Marshal(conformance.FinishedSlot(id, 1))
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
