package pacer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// countingStore counts the write transactions a pacer opens.
type countingStore struct {
	ledger.Store
	updates atomic.Int64
}

func (c *countingStore) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	c.updates.Add(1)
	return c.Store.Update(ctx, fn, keys...)
}

// The call whose admission granted a lease has its answer judged as the
// lease's slots' are: a routine one is recorded through the journal, on
// SQLite too, not in a transaction of its own, and reads as recorded.
func TestGrantingCallsRoutineAnswerTakesNoTransaction(t *testing.T) {
	e := newEnv(t)
	db := &countingStore{Store: e.db}
	p := e.pacerOn(db)
	t.Cleanup(func() { p.Close(context.Background()) })
	k := busyKey(100_000)
	for range 20 {
		tk, err := e.admitWith(p, e.call(k, "sync", "/items"))
		if err != nil {
			t.Fatal(err)
		}
		if tk.Leased() {
			t.Fatal("a call came from a lease before the one that granted it was found")
		}
		reserved, _ := e.countReserved(k)
		before := db.updates.Load()
		res := answerWith(t, p, e.clk, tk, 200, nil)
		if reserved == 0 {
			e.clk.advance(time.Millisecond)
			continue
		}
		if got := db.updates.Load() - before; got != 0 {
			t.Errorf("the granting call's routine answer took %d write transactions; want none", got)
		}
		if res.State != ledger.Confirmed || res.Advice.Action != pacer.Continue || res.Binding == nil {
			t.Errorf("its result: state %s, advice %s, binding %v; want confirmed, continue, a binding budget",
				res.State, res.Advice.Action, res.Binding)
		}
		var got ledger.State
		if err := e.db.View(context.Background(), func(tx ledger.ReadTx) error {
			sends, err := tx.Sends(k.Name, time.Time{}, 1<<20)
			for _, s := range sends {
				if s.ID == tk.ID {
					got = s.State
				}
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if got != ledger.Confirmed {
			t.Errorf("the granting call reads as %q; want confirmed", got)
		}
		return
	}
	t.Fatal("no lease was granted after 20 calls 1 ms apart")
}
