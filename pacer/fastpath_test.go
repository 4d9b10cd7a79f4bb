package pacer_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/state"
)

// countingPostgres counts the write transactions a pacer opens.
type countingPostgres struct {
	*state.Postgres
	updates atomic.Int64
}

func (c *countingPostgres) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	c.updates.Add(1)
	return c.Postgres.Update(ctx, fn, keys...)
}

// On PostgreSQL an unleased call of a key this process calls often, whose
// answer is routine by its admission's budgets, costs one
// transaction, its admission: the outcome goes through the journal, and
// what the answer taught is written by the key's next admission. An answer that is not routine (a new
// policy, a refusal) is recorded in a transaction of its own, as before.
func TestUnleasedAnswerTakesNoTransaction(t *testing.T) {
	ctx := context.Background()
	pg := openPostgres(t)
	db := &countingPostgres{Postgres: pg}
	// The server's clock, which the test moves away from the server's
	// (see below), and no timer: what answers taught is written by
	// transactions only.
	var ahead atomic.Int64
	p := pacer.New(db, pacer.WithClock(aheadClock{pg: pg, ahead: &ahead}))
	t.Cleanup(func() { p.Close(ctx) })
	// Never leased: a lease holds at most a quarter of the calls the key
	// may still have in flight, and a lease of fewer than 16 is none.
	// Its pace allows a call a microsecond after the one before: each
	// admission is a round trip to the server, so none waits, which would
	// cost a transaction more. (At 1,000 a second, a call admitted within
	// a millisecond of the one before waited, and the test counted two
	// transactions for it in two of five runs on a quiet machine.)
	k := &keystore.Key{Name: "k", MaxRate: 1e6, MaxConcurrency: 8, LowWater: 0.1,
		Policies: []keystore.Policy{{Name: "default", Quota: 1000, Window: time.Minute, Unit: ratelimit.Requests}}}
	n := 0
	// A wait is bounded on the process's clock, which the test moves a
	// minute back below: a bound of a second would then have passed
	// already, and a call that waits would be paused.
	admit := func() pacer.Ticket {
		t.Helper()
		n++
		tk, err := p.Admit(ctx, pacer.Call{Key: k, Caller: "sync", Transport: "rest", Method: "GET", Target: "/items",
			CallID: fmt.Sprint("call-", n), Attempt: 1, MaxWait: 2 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	var last time.Time
	answer := func(tk pacer.Ticket, status int, r int64) (pacer.Result, int64) {
		t.Helper()
		before := db.updates.Load()
		// The server's clock as this process reckons it, which each
		// transaction measures again: kept moving forward, as answers come.
		now := pg.Now()
		if !now.After(last) {
			now = last.Add(time.Microsecond)
		}
		last = now
		rd := &ratelimit.Reading{ReceivedAt: now, Observations: []ratelimit.Observation{{Policy: "default",
			Unit: ratelimit.Requests, Quota: 1000, HasQuota: true, Window: time.Minute, Remaining: r, HasRemaining: true,
			Reset: 30 * time.Second, HasReset: true, Shape: ratelimit.ShapeDraft}}}
		if status == 429 {
			rd.HasRetryAfter, rd.RetryAfter = true, 20*time.Second
		}
		res, err := p.Done(ctx, tk, pacer.Outcome{SentAt: tk.AdmittedAt, AnsweredAt: now, Status: status, Reading: rd})
		if err != nil {
			t.Fatal(err)
		}
		return res, db.updates.Load() - before
	}

	// The first answers take a transaction of their own: the first names
	// a policy the key did not know, and until this process has made
	// enough calls of the key to measure its pace, no admission of the
	// key is known to come soon and write what an answer taught.
	if _, tx := answer(admit(), 200, 900); tx != 1 {
		t.Errorf("the first answer, about a policy not known yet, took %d transactions, want 1", tx)
	}
	var second pacer.Ticket
	var res pacer.Result
	r := int64(899)
	for ; r > 700; r-- {
		tk := admit()
		var tx int64
		if tk.Leased() {
			t.Fatal("a call was admitted from a lease")
		}
		if res, tx = answer(tk, 200, r); tx == 0 {
			second = tk
			break
		}
	}
	if r == 700 {
		t.Fatal("no ordinary answer to an unleased call was recorded without a transaction of its own in 200 calls")
	}
	if res.State != ledger.Confirmed || res.Advice.Action != pacer.Continue || res.Binding == nil ||
		res.Binding.Remaining < 0 || res.Binding.Remaining > r {
		t.Errorf("its result: %+v, want confirmed, continue, a binding budget with at most the answer's %d left", res, r)
	}
	// The next admission leaves what the answer taught in memory, until it
	// has waited LeaseTime/2: an admission that then comes writes it.
	latest := func() int64 {
		t.Helper()
		var got int64
		if err := pg.View(ctx, func(tx ledger.ReadTx) error {
			known, err := tx.SeenPolicies("k")
			if len(known) == 1 {
				got = known[0].Remaining
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	before := db.updates.Load()
	ahead.Store(int64(-time.Minute)) // what the answer taught was kept "a minute later"
	next := admit()
	if tx := db.updates.Load() - before; tx != 1 {
		t.Errorf("the next admission took %d transactions, want 1", tx)
	}
	if got := latest(); got == r {
		t.Errorf("the next admission, right after the answer, wrote its word (r=%d): want it kept in memory a while", got)
	}
	ahead.Store(int64(pacer.LeaseTime / 2))
	before = db.updates.Load()
	third := admit()
	if tx := db.updates.Load() - before; tx != 1 {
		t.Errorf("the admission after it took %d transactions, want 1", tx)
	}
	if err := pg.View(ctx, func(tx ledger.ReadTx) error {
		got, err := tx.Call("k", second.Call.CallID)
		if err != nil {
			return err
		}
		if len(got) != 1 || got[0].State != ledger.Confirmed || got[0].Status != 200 {
			t.Errorf("the call is recorded as %+v, want confirmed with 200", got)
		}
		obs, err := tx.ObservationsOf("k", second.ID)
		if err != nil {
			return err
		}
		if len(obs) != 1 || obs[0].Remaining != r {
			t.Errorf("the answer's observations: %+v, want its r=%d", obs, r)
		}
		known, err := tx.SeenPolicies("k")
		if err != nil {
			return err
		}
		if len(known) != 1 || known[0].Remaining != r {
			t.Errorf("the latest observation: %+v, want the answer's r=%d", known, r)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, tx := answer(next, 200, r-1); tx != 0 {
		t.Errorf("the answer to the call admitted before took %d transactions, want 0", tx)
	}
	// A refusal is not routine: recorded at once, and it holds the
	// next call (its Retry-After, or the hidden limit it reveals).
	if _, tx := answer(third, 429, 500); tx != 1 {
		t.Errorf("a refusal took %d transactions, want 1", tx)
	}
	_, err := p.Admit(ctx, pacer.Call{Key: k, Caller: "sync", Transport: "rest", Method: "GET", Target: "/items",
		CallID: "call-last", Attempt: 1})
	var pe *pacer.PauseError
	if !errors.As(err, &pe) || pe.RetryAfter < 19*time.Second {
		t.Errorf("after the refusal: %v, want a pause of about its Retry-After (20 s)", err)
	}
}

// aheadClock is a PostgreSQL server's clock moved by ahead, whose
// AfterFunc timers never fire; its other timers are real.
type aheadClock struct {
	pg    *state.Postgres
	ahead *atomic.Int64
}

func (c aheadClock) Now() time.Time { return c.pg.Now().Add(time.Duration(c.ahead.Load())) }

func (aheadClock) NewTimer(d time.Duration) (clock.Timer, <-chan time.Time) {
	return clock.Real.NewTimer(d)
}

func (aheadClock) AfterFunc(time.Duration, func()) clock.Timer { return neverFires{} }

// neverFires is a timer that was stopped before it could fire.
type neverFires struct{}

func (neverFires) Stop() bool { return true }
