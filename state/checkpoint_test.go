package state_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
)

// While the history stays small, a commit copies the write-ahead log
// back into the file once it holds MinCheckpointPages pages, and the log
// is reused after that: under writes that never stop it stays within
// about that many pages (4 MiB), however much is written, rather than
// growing to CheckpointPages (40 MiB) on a disk that may not have it.
func TestLogBoundedByHistory(t *testing.T) {
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
	const frame = 4096 + 24
	most := int64(state.MinCheckpointPages+2*rows) * frame
	var largest int64
	for commit := range 3 * state.MinCheckpointPages / rows {
		// about 3,000 bytes a row: the words, and the reason as data
		why := reason.Reason{Kind: reason.Said, Said: strings.Repeat(fmt.Sprint(commit%10), 1500)}
		update(t, db, func(tx ledger.Tx) error {
			for _, id := range ids {
				if err := tx.FinishAttempt(id, ledger.Confirmed, why, 200, t0, t0); err != nil {
					return err
				}
			}
			return nil
		})
		largest = max(largest, size(path+"-wal"))
	}
	if largest > most {
		t.Errorf("the log reached %d bytes over %d pages written to a file of about %d pages; want at most %d",
			largest, 3*state.MinCheckpointPages, rows, most)
	}
	if got := size(path); got < rows*4096 {
		t.Errorf("the file is %d bytes: no commit checkpointed", got)
	}
	t.Logf("the log at most %d bytes, the file %d bytes", largest, size(path))
}

// The log checkpoints at the size of the history it holds, within
// MinCheckpointPages and CheckpointPages.
func TestCheckpointAt(t *testing.T) {
	for _, tt := range []struct{ file, want int }{
		{0, state.MinCheckpointPages},
		{state.MinCheckpointPages / 2, state.MinCheckpointPages},
		{3 * state.MinCheckpointPages, 3 * state.MinCheckpointPages},
		{state.CheckpointPages * 5, state.CheckpointPages},
	} {
		if got := state.CheckpointAt(tt.file); got != tt.want {
			t.Errorf("CheckpointAt(%d) = %d, want %d", tt.file, got, tt.want)
		}
	}
}
