package state

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// dropApplied takes the done outcomes off the head of the queue and keeps
// the others first, in order, before those queued after the batch; and
// it does so in the queue's own array, so that an applier keeping up with
// a steady flow of calls allocates no queue for each batch.
func TestDropAppliedKeepsTheQueueInOrder(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "segment"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	seg := &segment{f: f, path: f.Name()}
	j := &journal{cur: seg, progress: make(chan struct{})}
	add := func(id int64) {
		seg.pending++
		j.queue = append(j.queue, queued{f: ledger.Finished{Attempt: ledger.Attempt{ID: id}}, seg: seg})
	}
	ids := func() []int64 {
		var out []int64
		for _, q := range j.queue {
			out = append(out, q.f.Attempt.ID)
		}
		return out
	}
	for id := range int64(6) {
		add(id + 1)
	}
	j.dropApplied(slices.Clone(j.queue[:4]), []bool{true, false, true, false})
	if got, want := ids(), []int64{2, 4, 5, 6}; !slices.Equal(got, want) {
		t.Fatalf("the queue after 1 and 3 were applied: %v, want %v", got, want)
	}
	if j.applied != 2 || seg.pending != 4 {
		t.Fatalf("%d applied, %d pending in the segment; want 2 and 4", j.applied, seg.pending)
	}
	add(7)
	j.dropApplied(slices.Clone(j.queue), []bool{true, true, true, true, true})
	if len(j.queue) != 0 || j.applied != 7 || seg.pending != 0 {
		t.Fatalf("queue %v, %d applied, %d pending; want none queued, 7 applied, none pending", ids(), j.applied, seg.pending)
	}

	// A call's outcome queued and applied, again and again: dropApplied
	// makes only the channel that wakes the flushes.
	done := []bool{true}
	var batch []queued
	id := int64(7)
	allocs := testing.AllocsPerRun(100, func() {
		id++
		add(id)
		batch = append(batch[:0], j.queue[:1]...)
		j.dropApplied(batch, done)
	})
	if allocs > 1 {
		t.Errorf("%.0f allocations an outcome queued and applied, want 1 (the flushes' channel)", allocs)
	}
	if len(j.queue) != 0 || seg.pending != 0 {
		t.Errorf("queue %v, %d pending after the outcomes were applied; want none", ids(), seg.pending)
	}
}
