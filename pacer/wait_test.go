package pacer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// behindStore is a store whose transactions' clock (Tx.Clock) is behind
// the pacer's by behind: a database server's clock, which the pacer's
// reckoning of it can be ahead of.
type behindStore struct {
	ledger.Store
	behind time.Duration
}

func (s behindStore) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	return s.Store.Update(ctx, func(tx ledger.Tx) error { return fn(behindTx{tx, s.behind}) }, keys...)
}

type behindTx struct {
	ledger.Tx
	behind time.Duration
}

func (tx behindTx) Clock(local time.Time) time.Time { return tx.Tx.Clock(local).Add(-tx.behind) }

// An attempt's wait is measured on one clock, the pacer's, from the call's
// start to its admission or refusal: a transaction whose instant (the
// database server's clock) is behind the pacer's clock never makes it
// negative. At a test clock that does not move, a call admitted at once
// and one refused at once waited 0.
func TestWaitIsOnThePacersClock(t *testing.T) {
	e := newEnv(t)
	p := e.pacerOn(behindStore{Store: e.db, behind: 250 * time.Millisecond})
	k := newKey(policy("default", 1, time.Minute))
	tk, err := e.admitWith(p, e.call(k, "a", "/items"))
	if err != nil {
		t.Fatal(err)
	}
	if tk.Waited != 0 {
		t.Errorf("the ticket of a call admitted at once waited %v, want 0", tk.Waited)
	}
	mustPause(t, e.clk, p, e.call(k, "a", "/items"))
	for _, a := range e.activity() {
		if a.Wait != 0 {
			t.Errorf("attempt %d (%s) waited %v, want 0: neither waited", a.ID, a.State, a.Wait)
		}
	}
}

// On PostgreSQL a process reckons the server's clock from its own and the
// difference it last measured, which is off by up to half a round trip
// (it once counted half of a lock's wait too, before the lock statements
// read the server's clock on both sides of the wait). An admission is
// recorded at the server's own clock, which its wait was once measured
// against: waits of -44 to -263 ms showed in the activity. Measured on the
// pacer's clock alone, a wait is never negative.
func TestWaitNeverNegativeOnPostgres(t *testing.T) {
	ctx := context.Background()
	pg := openPostgres(t)
	var ahead atomic.Int64
	ahead.Store(int64(300 * time.Millisecond)) // as after a lock wait of 600 ms
	p := pacer.New(pg, pacer.WithClock(aheadClock{pg: pg, ahead: &ahead}))
	t.Cleanup(func() { p.Close(ctx) })
	k := &keystore.Key{Name: "k", MaxRate: 1000, MaxConcurrency: 100, Policies: []keystore.Policy{policy("default", 5, time.Hour)}}
	for i := range 6 { // five admitted, the sixth refused
		_, err := p.Admit(ctx, pacer.Call{Key: k, Caller: "sync", Transport: "rest", Method: "GET", Target: "/items",
			CallID: fmt.Sprint("call-", i), Attempt: 1})
		if (err == nil) != (i < 5) {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	var list []ledger.Attempt
	if err := pg.View(ctx, func(tx ledger.ReadTx) error {
		var err error
		list, err = tx.Activity(ledger.ActivityFilter{Key: "k", Limit: 100})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(list) != 6 {
		t.Fatalf("%d attempts recorded, want 6", len(list))
	}
	for _, a := range list {
		if a.Wait < 0 {
			t.Errorf("attempt %d (%s) waited %v: negative", a.ID, a.State, a.Wait)
		}
	}
}
