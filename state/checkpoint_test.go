package state_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// Commits copy the write-ahead log back into the file only once it holds
// CheckpointPages pages, and the log is reused after that: under writes
// that never stop it does not grow past about that many pages.
func TestCheckpointsEveryCheckpointPages(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db := open(t, path)
	size := func(p string) int64 {
		t.Helper()
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	// 100 attempts of about a page each, rewritten by every commit: each
	// commit adds about 100 pages to the log, the file keeps about 100.
	const rows = 100
	var ids []int64
	update(t, db, func(tx ledger.Tx) error {
		for i := range rows {
			id, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint("c", i), Attempt: 1, Key: "k", State: ledger.Admitted, At: t0})
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	})
	commits := 0
	rewrite := func(n int) {
		t.Helper()
		for range n {
			commits++
			reason := strings.Repeat(fmt.Sprint(commits%10), 3000)
			update(t, db, func(tx ledger.Tx) error {
				for _, id := range ids {
					if err := tx.FinishAttempt(id, ledger.Confirmed, reason, 200, t0, t0); err != nil {
						return err
					}
				}
				return nil
			})
		}
	}
	before := size(path)
	rewrite(state.CheckpointPages / rows / 2) // half the pages
	if got := size(path); got != before {
		t.Fatalf("the file went from %d to %d bytes with the log half full: a commit checkpointed early", before, got)
	}
	rewrite(4 * state.CheckpointPages / rows) // four times as many
	if got := size(path); got <= before {
		t.Fatalf("the file is %d bytes, as it was: no commit checkpointed", got)
	}
	if got, most := size(path+"-wal"), int64(state.CheckpointPages+2*rows)*4200; got > most {
		t.Errorf("the log is %d bytes after 4.5 times CheckpointPages pages, more than %d: it is not reused", got, most)
	}
}
