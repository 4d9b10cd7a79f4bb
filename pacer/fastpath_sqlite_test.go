package pacer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/state"
)

// countingDB counts the write transactions a pacer opens on a SQLite
// state file; it is the file itself to the pacer otherwise (its journal,
// DefersOutcomes).
type countingDB struct {
	*state.DB
	updates atomic.Int64
}

func (c *countingDB) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	c.updates.Add(1)
	return c.DB.Update(ctx, fn, keys...)
}

// unleasedKey is a key this process calls often that is never leased: a
// lease holds at most a quarter of the calls the key may still have in
// flight, and a lease of fewer than 16 is none.
func unleasedKey() *keystore.Key {
	return &keystore.Key{Name: "k", MaxRate: 1000, MaxConcurrency: 8, LowWater: 0.1,
		Policies: []keystore.Policy{policy("default", 1000, time.Minute)}}
}

// routineSQLite makes unleased calls of k on p, 1 ms apart, each answered
// 200 with r left of 1,000 (counting down from 900), until one's answer
// takes no write transaction of its own; it returns how many calls that
// took and the transactions their answers took. It fails the test after
// 40 calls.
func routineSQLite(t *testing.T, e *env, db *countingDB, p *pacer.Pacer, k *keystore.Key) (calls int, txs int64, last pacer.Ticket) {
	t.Helper()
	for r := int64(900); r > 860; r-- {
		tk, err := e.admitWith(p, e.call(k, "sync", "/items"))
		if err != nil {
			t.Fatal(err)
		}
		if tk.Leased() {
			t.Fatal("a call was admitted from a lease")
		}
		before := db.updates.Load()
		answerWith(t, p, e.clk, tk, 200, reading(0, shown("default", 1000, time.Minute, r, 30*time.Second)))
		calls++
		tx := db.updates.Load() - before
		txs += tx
		e.clk.advance(time.Millisecond)
		if tx == 0 {
			return calls, txs, tk
		}
	}
	t.Fatal("no ordinary answer to an unleased call was recorded without a transaction of its own in 40 calls")
	return
}

// On SQLite too, an unleased call of a key this process calls often,
// whose answer is routine by its admission's budgets, costs one
// transaction, its admission: the answer goes through the process's
// journal, and the journal's applier records the call's end in the state
// file with the others that came meanwhile.
func TestUnleasedAnswerOnSQLiteGoesThroughTheJournal(t *testing.T) {
	e := newEnv(t)
	db := &countingDB{DB: e.db}
	p := e.pacerOn(db)
	t.Cleanup(func() { p.Close(context.Background()) })
	k := unleasedKey()
	calls, txs, first := routineSQLite(t, e, db, p, k)
	// The first answer names a policy the key did not know; until the
	// process has made leaseRecent calls of the key, no admission is known
	// to come soon and write what an answer taught.
	if calls > 9 {
		t.Errorf("the first routine answer came at call %d; want by the 9th, once the key's pace is measured", calls)
	}
	// From then on every ordinary answer goes through the journal.
	const more = 30
	var tickets []pacer.Ticket
	before := db.updates.Load()
	for i := range more {
		tk := e.admitOn(p, k)
		b := db.updates.Load()
		res := e.answerOn(p, tk, 200, reading(0, shown("default", 1000, time.Minute, int64(850-i), 30*time.Second)))
		if got := db.updates.Load() - b; got != 0 {
			t.Errorf("call %d: its routine answer took %d write transactions; want none", calls+i+1, got)
		}
		if res.State != ledger.Confirmed || res.Advice.Action != pacer.Continue || res.Binding == nil ||
			res.Binding.Remaining < 0 || res.Binding.Remaining > int64(850-i) {
			t.Errorf("call %d: its result: state %s, advice %s, binding %+v; want confirmed, continue, at most the answer's %d left",
				calls+i+1, res.State, res.Advice.Action, res.Binding, 850-i)
		}
		tickets = append(tickets, tk)
		e.clk.advance(time.Millisecond)
	}
	if got := db.updates.Load() - before; got != more {
		t.Errorf("%d calls with routine answers took %d write transactions; want %d, their admissions", more, got, more)
	}
	t.Logf("%d calls before the first routine answer, %d transactions for their answers", calls, txs)

	// A View of this process waits for its journal: the calls are in the
	// state file then, for every process to read.
	if err := e.db.View(context.Background(), func(ledger.ReadTx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	other, _ := e.open()
	err := other.View(context.Background(), func(tx ledger.ReadTx) error {
		for _, tk := range append([]pacer.Ticket{first}, tickets...) {
			got, err := tx.Call(k.Name, tk.Call.CallID)
			if err != nil {
				return err
			}
			if len(got) != 1 || got[0].State != ledger.Confirmed || got[0].Status != 200 {
				t.Errorf("another process reads %s as %+v; want confirmed with 200", tk.Call.CallID, got)
			}
			obs, err := tx.ObservationsOf(k.Name, tk.ID)
			if err != nil {
				return err
			}
			if len(obs) != 1 || obs[0].Policy != "default" {
				t.Errorf("another process reads the observations of %s as %+v; want its answer's one", tk.Call.CallID, obs)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// An answer that brings news is recorded at once, in a transaction of its
// own, on SQLite as on PostgreSQL, whatever the admission foresaw.
func TestUnleasedNewsOnSQLiteTakesATransaction(t *testing.T) {
	for _, c := range []struct {
		name   string
		status int
		rd     func() *ratelimit.Reading
	}{
		{"429 with Retry-After", 429, func() *ratelimit.Reading {
			return reading(20*time.Second, shown("default", 1000, time.Minute, 500, 30*time.Second))
		}},
		{"503", 503, func() *ratelimit.Reading { return nil }},
		{"a policy the key did not know", 200, func() *ratelimit.Reading {
			return reading(0, shown("default", 1000, time.Minute, 800, 30*time.Second),
				shown("hourly", 5000, time.Hour, 4000, 30*time.Minute))
		}},
		{"a budget below its low-water mark", 200, func() *ratelimit.Reading {
			return reading(0, shown("default", 1000, time.Minute, 50, 30*time.Second))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			db := &countingDB{DB: e.db}
			p := e.pacerOn(db)
			t.Cleanup(func() { p.Close(context.Background()) })
			k := unleasedKey()
			routineSQLite(t, e, db, p, k)
			tk := e.admitOn(p, k)
			before := db.updates.Load()
			res := e.answerOn(p, tk, c.status, c.rd())
			if got := db.updates.Load() - before; got != 1 {
				t.Errorf("the answer took %d write transactions; want 1, its own", got)
			}
			// Recorded at once: another process reads it without waiting
			// for this one's journal.
			other, _ := e.open()
			err := other.View(context.Background(), func(tx ledger.ReadTx) error {
				got, err := tx.Call(k.Name, tk.Call.CallID)
				if len(got) != 1 || got[0].State != res.State || got[0].Status != c.status {
					t.Errorf("another process reads the call as %+v; want %s with %d", got, res.State, c.status)
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// admitOn admits a call of k on p, failing the test if it has to wait.
func (e *env) admitOn(p *pacer.Pacer, k *keystore.Key) pacer.Ticket {
	e.t.Helper()
	tk, err := e.admitWith(p, e.call(k, "sync", "/items"))
	if err != nil {
		e.t.Fatal(err)
	}
	return tk
}

// answerOn reports t's answer to p, given at the clock's time.
func (e *env) answerOn(p *pacer.Pacer, t pacer.Ticket, status int, rd *ratelimit.Reading) pacer.Result {
	e.t.Helper()
	return answerWith(e.t, p, e.clk, t, status, rd)
}

// A key called three times a second is too slow for the LeaseTime that
// routine answers' teaching waits on a short window, and not on a long
// one: with a one-minute window what an answer taught waits up to a
// second (learnedWait), so the key's next admission, a third of a second
// later, writes it, and each call costs that one transaction; with a 2-s
// window it waits LeaseTime, which the next admission does not come
// within, and each answer takes a transaction of its own. What waits is
// in the state file, for every process to read, when its time is up.
func TestAKeyCalledAFewTimesASecondDefersByItsWindow(t *testing.T) {
	for _, tt := range []struct {
		window time.Duration
		wait   time.Duration // what an answer taught waits, at most
		txs    int64         // write transactions a call, in the steady state
	}{
		{time.Minute, time.Second, 1},
		{2 * time.Second, pacer.LeaseTime, 2},
	} {
		t.Run(tt.window.String(), func(t *testing.T) {
			e := newEnv(t)
			db := &countingDB{DB: e.db}
			p := e.pacerOn(db)
			t.Cleanup(func() { p.Close(context.Background()) })
			k := unleasedKey()
			k.Policies = []keystore.Policy{policy("default", 1000, tt.window)}
			const interval = time.Second / 3
			call := func(r int64) {
				tk := e.admitOn(p, k)
				if tk.Leased() {
					t.Fatal("a call was admitted from a lease")
				}
				e.clk.advance(10 * time.Millisecond)
				e.answerOn(p, tk, 200, reading(0, shown("default", 1000, tt.window, r, tt.window/2)))
			}
			r := int64(900)
			for range 12 { // the key's pace measured, its policy known
				call(r)
				r--
				e.clk.advance(interval - 10*time.Millisecond)
			}
			const calls = 20
			before := db.updates.Load()
			for range calls {
				call(r)
				r--
				e.clk.advance(interval - 10*time.Millisecond)
			}
			if got := db.updates.Load() - before; got != tt.txs*calls {
				t.Errorf("%d calls took %d write transactions; want %d", calls, got, tt.txs*calls)
			}

			// The last answer's remaining is in the state file within
			// tt.wait of the answer, and not before when it waits.
			last := r + 1
			other, _ := e.open()
			latest := func() int64 {
				t.Helper()
				var rem int64 = -1
				err := other.View(context.Background(), func(tx ledger.ReadTx) error {
					known, err := tx.SeenPolicies(k.Name)
					for _, kn := range known {
						if kn.Policy == "default" {
							rem = kn.Remaining
						}
					}
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				return rem
			}
			e.clk.advance(tt.wait - (interval - 10*time.Millisecond) - time.Millisecond) // tt.wait less a millisecond after the last answer
			if tt.txs == 1 {
				if got := latest(); got != last+1 {
					t.Errorf("%v after the last answer, another process reads %d left; want %d, the answer before, its teaching still waiting",
						tt.wait-time.Millisecond, got, last+1)
				}
			}
			e.clk.advance(time.Millisecond)
			if got := latest(); got != last {
				t.Errorf("%v after the last answer, another process reads %d left; want %d, what it said", tt.wait, got, last)
			}
		})
	}
}

// A busy key whose answers announce a reset shorter than learnedDue
// (here 60 ms) has them written before the observation other processes
// read ends: an admission writes what they taught once half the time
// left on that observation has passed. Were they to wait longer, every
// process would find the observation expired with no answer recorded
// since, and hold the key's calls for a probe, answers having come all
// along.
func TestShortResetsRoutineAnswersNeverLeaveTheKeyForAProbe(t *testing.T) {
	e := newEnv(t)
	k := unleasedKey()
	_, other := e.open() // another process, on the same file
	const reset = 60 * time.Millisecond
	for i := range 200 { // 800 ms, a call every 4 ms
		tk, err := e.admitWith(e.p, e.call(k, "sync", "/items"))
		if err != nil {
			t.Fatalf("call %d (%v in): %v", i, e.clk.Now().Sub(start), err)
		}
		if tk.Probe {
			t.Fatalf("call %d (%v in): a probe, want an ordinary call: the answers kept coming", i, e.clk.Now().Sub(start))
		}
		e.clk.advance(time.Millisecond)
		e.answerOn(e.p, tk, 200, reading(0, shown("default", 1000, time.Minute, 900, reset)))
		e.clk.advance(time.Millisecond)
		if i%10 == 9 { // the other process finds the answers' observation in force
			if tk, err := e.admitWith(other, e.call(k, "agent", "/items")); err != nil || tk.Probe {
				t.Fatalf("the other process, %v in: %+v, %v; want an ordinary call", e.clk.Now().Sub(start), tk, err)
			} else {
				e.answerOn(other, tk, 200, reading(0, shown("default", 1000, time.Minute, 900, reset)))
			}
		}
		e.clk.advance(2 * time.Millisecond)
	}
}

// A key called too seldom for its next admission to come before the
// observations it would replace end (every 40 ms, answers saying the
// window resets in 60 ms) has what its routine answers taught written by
// its timer three quarters of the way to that end: another process never
// finds the key's observation expired with answers having come.
func TestShortResetsRoutineAnswersAreWrittenByTheirTimer(t *testing.T) {
	e := newEnv(t)
	k := unleasedKey()
	_, other := e.open() // another process, on the same file, whose calls stay in flight
	const reset = 60 * time.Millisecond
	for i := range 50 { // 2 s
		tk, err := e.admitWith(e.p, e.call(k, "sync", "/items"))
		if err != nil || tk.Probe {
			t.Fatalf("call %d (%v in): %+v, %v; want an ordinary call", i, e.clk.Now().Sub(start), tk.Probe, err)
		}
		e.clk.advance(time.Millisecond)
		e.answerOn(e.p, tk, 200, reading(0, shown("default", 1000, time.Minute, 900, reset)))
		e.clk.advance(25 * time.Millisecond)
		if i%10 == 9 {
			if tk, err := e.admitWith(other, e.call(k, "agent", "/items")); err != nil || tk.Probe {
				t.Fatalf("the other process, %v in: probe %v, %v; want an ordinary call", e.clk.Now().Sub(start), tk.Probe, err)
			}
		}
		e.clk.advance(14 * time.Millisecond)
	}
}
