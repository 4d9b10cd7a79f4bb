package state

import (
	"context"
	"testing"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// A turn at running transactions can find the queue empty once it has
// begun its transaction: a queued write whose caller stopped waiting
// takes itself out (update) between the hand-over that saw it and the
// batch that would take it. The batch then ends its transaction and runs
// nothing; it ran an empty list before, and panicked (seen in
// cmd/mcp-quota's tests on a loaded machine). Here the batch runs with
// the queue already empty, as the hand-over's goroutine would.
func TestBatchFindsTheQueueGone(t *testing.T) {
	db := openOn(t, nil)
	db.mu.Lock()
	db.writing = true
	db.mu.Unlock()
	db.batch(nil, nil)
	// The transaction it began has ended: another connection takes the
	// write lock at once (it would be refused as busy otherwise)…
	holdWriteLock(t, db)()
	// …and, once the turn is over, the next write runs and commits.
	db.handOver()
	ran := false
	if err := db.Update(context.Background(), func(ledger.Tx) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("Update after the empty turn: ran %v, %v", ran, err)
	}
}
