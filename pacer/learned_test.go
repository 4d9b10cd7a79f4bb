package pacer_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/state"
)

// upstreamSays is an answer of an upstream announcing a policy of 100,000
// calls an hour with r left.
func upstreamSays(r int64) *ratelimit.Reading {
	return reading(0, shown("upstream", 100_000, time.Hour, r, time.Hour))
}

// seenPolicy returns k's seen policy "upstream" in the file, and
// the key's pacing state.
func (e *env) seenPolicy(k *keystore.Key) (ledger.SeenPolicy, ledger.KeyState) {
	e.t.Helper()
	var w ledger.SeenPolicy
	var ks ledger.KeyState
	err := e.db.View(context.Background(), func(tx ledger.ReadTx) error {
		known, err := tx.SeenPolicies(k.Name)
		if err != nil {
			return err
		}
		for _, kn := range known {
			if kn.Policy == "upstream" {
				w = kn
			}
		}
		ks, err = tx.KeyState(k.Name)
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return w, ks
}

// answeredFromLease is a busy key whose upstream said r=90000 until the
// key was leased, answering at once, and r=80000 to the lease's first
// call, leasedLatency after its admission: an answer the lease took as
// routine, whose observation and latency wait to be written.
func answeredFromLease(t *testing.T) (*env, *keystore.Key) {
	t.Helper()
	e := newEnv(t)
	k := busyKey(100_000)
	first := e.warmUp(e.p, k, func() *ratelimit.Reading { return upstreamSays(90_000) })
	e.clk.advance(first.AdmittedAt.Add(leasedLatency).Sub(e.clk.Now())) // a slot is admitted at its lease's grant
	e.answer(first, 200, upstreamSays(80_000))
	return e, k
}

// leasedLatency is how long the lease's first call of answeredFromLease
// waited for its answer.
const leasedLatency = 41 * time.Millisecond

// A routine answer of a lease is recorded at once — the call's state and
// the answer's observation — and what it teaches the key's latest observation
// and pacing state is written by the key's next transaction, or by a
// timer, many answers as one.
func TestRoutineAnswersAreWrittenTogether(t *testing.T) {
	e := newEnv(t)
	k := busyKey(100_000)
	first := e.warmUp(e.p, k, func() *ratelimit.Reading { return upstreamSays(90_000) })
	// The lease's, and the one that writes what the granting call's
	// routine answer taught, with what the next answers teach. The
	// state's journal, on the same clock, sets timers of a few
	// milliseconds as it applies the answers: those are not counted.
	pacerTimers := func() int { return e.clk.TimersBeyond(pacer.LeaseTime / 10) }
	pending := pacerTimers()

	e.clk.advance(5 * time.Millisecond)
	if res := e.answer(first, 200, upstreamSays(80_000)); res.State != ledger.Confirmed {
		t.Fatalf("a routine answer's state: %s, want confirmed", res.State)
	}
	for _, a := range e.activity() {
		if a.ID == first.ID && (a.State != ledger.Confirmed || a.Status != 200) {
			t.Errorf("the leased call is recorded as %s %d, want confirmed 200", a.State, a.Status)
		}
	}
	var obs []ledger.ObservationRecord
	if err := e.db.View(context.Background(), func(tx ledger.ReadTx) (err error) {
		obs, err = tx.(*state.Tx).Observations(k.Name, 1)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(obs) != 1 || obs[0].AttemptID != first.ID || obs[0].Remaining != 80_000 {
		t.Errorf("the latest observation recorded: %+v, want the leased call's r=80000", obs)
	}
	if w, _ := e.seenPolicy(k); w.Remaining != 90_000 {
		t.Errorf("the latest observation before the key's next transaction says r=%d, want the granting call's 90000", w.Remaining)
	}

	second := e.mustAdmit(k, "sync", "/items")
	if !second.Leased() {
		t.Fatal("the second call did not come from the lease")
	}
	e.clk.advance(7 * time.Millisecond)
	e.answer(second, 200, upstreamSays(79_990))
	answered := e.clk.Now()
	if n := pacerTimers() - pending; n != 0 {
		t.Fatalf("%d more timers set for two more answers, want none: one writes them all", n)
	}
	e.clk.advance(pacer.LeaseTime) // the timer fires
	w, ks := e.seenPolicy(k)
	if w.Remaining != 79_990 || !w.ReceivedAt.Equal(answered) {
		t.Errorf("after the timer the latest observation says r=%d received at %s, want the second answer's 79990 at %s",
			w.Remaining, w.ReceivedAt.Sub(start), answered.Sub(start))
	}
	if want := answered.Sub(first.AdmittedAt); ks.Latency < want {
		t.Errorf("the key's latency is %s, want at least the second answer's %s", ks.Latency, want)
	}
	if !ks.LastResponseAt.Equal(answered) {
		t.Errorf("the key's last answer is at %s, want %s", ks.LastResponseAt.Sub(start), answered.Sub(start))
	}

	// Close writes what is left.
	third := e.mustAdmit(k, "sync", "/items")
	e.clk.advance(time.Millisecond)
	e.answer(third, 200, upstreamSays(79_980))
	if err := e.p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if w, _ := e.seenPolicy(k); w.Remaining != 79_980 {
		t.Errorf("after Close the latest observation says r=%d, want 79980", w.Remaining)
	}
}

// What a routine answer taught never replaces a later observation another
// process wrote meanwhile.
func TestLearnedObservationNeverReplacesALaterOne(t *testing.T) {
	e, k := answeredFromLease(t)

	_, other := e.open()
	e.clk.advance(time.Millisecond)
	tk, err := e.admitWith(other, e.call(k, "agent", "/items"))
	if err != nil {
		t.Fatal(err)
	}
	e.clk.advance(time.Millisecond)
	answerWith(t, other, e.clk, tk, 200, upstreamSays(70_000))

	if _, err := e.p.Status(context.Background(), k, "sync"); err != nil {
		t.Fatal(err)
	}
	if w, _ := e.seenPolicy(k); w.Remaining != 70_000 {
		t.Errorf("the latest observation says r=%d, want the other process's later 70000", w.Remaining)
	}
}

// What a transaction that failed took to write is kept for the next one.
func TestLearnedKeptWhenItsTransactionFails(t *testing.T) {
	e, k := answeredFromLease(t)

	// A trigger makes every write of a key's pacing state fail: the
	// transaction writing what was learned fails after it took it.
	// With a busy timeout, as every connection of mcp-quota's has: the
	// Pacer's own writer (its journal's applier) may hold the file's lock
	// for a moment, and without one the trigger's statements failed with
	// SQLITE_BUSY on a loaded machine.
	raw, err := sql.Open("sqlite", "file:"+e.path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Exec(`CREATE TRIGGER fail_key_state BEFORE UPDATE ON key_state BEGIN SELECT RAISE(ABORT, 'injected'); END`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Status(context.Background(), k, "sync"); err != nil {
		t.Fatalf("a status whose write fails: %v, want what the file holds", err)
	}
	if w, _ := e.seenPolicy(k); w.Remaining != 90_000 {
		t.Fatalf("the latest observation says r=%d after a failed write, want 90000 still", w.Remaining)
	}
	if _, err := raw.Exec(`DROP TRIGGER fail_key_state`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Status(context.Background(), k, "sync"); err != nil {
		t.Fatal(err)
	}
	if w, _ := e.seenPolicy(k); w.Remaining != 80_000 {
		t.Errorf("the latest observation says r=%d after the next transaction, want the leased answer's 80000", w.Remaining)
	}
}

// The key's next admission that takes a transaction writes what the
// routine answers before it taught.
func TestAdmissionWritesWhatWasLearned(t *testing.T) {
	e, k := answeredFromLease(t)
	e.clk.advance(pacer.LeaseTime) // the lease has run out: the next call takes a transaction
	if tk := e.mustAdmit(k, "sync", "/items"); tk.Leased() {
		t.Fatal("a call came from a lease that ran out")
	}
	if w, _ := e.seenPolicy(k); w.Remaining != 80_000 {
		t.Errorf("after the next admission the latest observation says r=%d, want the leased answer's 80000", w.Remaining)
	}
}
