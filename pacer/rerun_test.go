package pacer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// leaseGrantedAt returns which call, of calls to k 1 ms apart on a new
// store, each answered 200 before the next, reserves a lease: the one
// before the first admitted from it.
func leaseGrantedAt(t *testing.T, k *keystore.Key) int {
	t.Helper()
	probe := newEnv(t)
	for i := range 20 {
		tk := probe.mustAdmit(k, "sync", "/items")
		if tk.Leased() {
			return i - 1
		}
		probe.answer(tk, 200, nil)
		probe.clk.advance(time.Millisecond)
	}
	t.Fatal("no lease granted in 20 calls 1 ms apart")
	return -1
}

// An admission whose transaction runs twice grants only what its last
// run granted: a lease reserved in a run that was rolled back is never
// installed, so a key that another host gated between the two runs
// admits nothing more.
func TestAdmitRunTwiceKeepsOnlyItsLastRun(t *testing.T) {
	// Where a lease is granted, on a store that runs everything once more
	// with nothing between the runs.
	k := busyKey(100_000)
	grantAt := leaseGrantedAt(t, k)

	e := newEnv(t)
	for i := range grantAt + 1 {
		if i == grantAt {
			// The admission that grants a lease: another host closes the
			// key for 60 s between its rolled-back run and the last one.
			e.rerun.Once(func(ctx context.Context) error {
				return e.db.Update(ctx, func(tx ledger.Tx) error {
					return tx.PutGate(ledger.Gate{Key: k.Name, Until: e.clk.Now().Add(time.Minute), Source: "retry-after",
						Reason: reason.Reason{Kind: reason.RetryAfterAsked, Status: 429, For: time.Minute}})
				}, k.Name)
			})
		}
		tk, err := e.admitWith(e.p, e.call(k, "sync", "/items"))
		if i == grantAt {
			if !errors.Is(err, pacer.ErrPaused) {
				t.Fatalf("the admission whose last run saw the gate: %v, want a pause", err)
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		e.answer(tk, 200, nil)
		e.clk.advance(time.Millisecond)
	}
	e.clk.advance(time.Millisecond)
	if tk, err := e.admitWith(e.p, e.call(k, "sync", "/items")); !errors.Is(err, pacer.ErrPaused) {
		t.Errorf("the next call while the key is gated: leased=%v err=%v, want a pause", tk.Leased(), err)
	}
	if reserved, _ := e.countReserved(k); reserved != 0 {
		t.Errorf("%d slots reserved, want none: the lease was rolled back", reserved)
	}
}

// What a routine answer taught is written by the key's next transaction
// however often that transaction runs.
func TestLearnedWrittenWhenItsTransactionRunsTwice(t *testing.T) {
	e, k := answeredFromLease(t)
	if _, err := e.p.Status(context.Background(), k, "sync"); err != nil {
		t.Fatal(err)
	}
	w, ks := e.seenPolicy(k)
	if w.Remaining != 80_000 {
		t.Errorf("after a transaction that ran twice the latest observation says r=%d, want the leased answer's 80000", w.Remaining)
	}
	if ks.LastResponseAt.IsZero() {
		t.Error("after a transaction that ran twice the key's last answer is unknown")
	}
	if ks.Latency != leasedLatency {
		t.Errorf("after a transaction that ran twice the key's latency is %v, want the leased answer's %v", ks.Latency, leasedLatency)
	}
}

// An admission whose commit fails grants nothing: the lease its function
// reserved is not installed, the next call is not admitted from it, and
// no slot stays reserved.
func TestAdmitWhoseCommitFailsGrantsNothing(t *testing.T) {
	k := busyKey(100_000)
	grantAt := leaseGrantedAt(t, k) // the call that reserves the lease

	e := newEnv(t)
	failing := &testkit.FailStore{Store: e.db}
	p := e.pacerOn(failing)
	for range grantAt {
		tk, err := e.admitWith(p, e.call(k, "sync", "/items"))
		if err != nil {
			t.Fatal(err)
		}
		answerWith(t, p, e.clk, tk, 200, nil)
		e.clk.advance(time.Millisecond)
	}
	failing.FailNext(1)
	if _, err := e.admitWith(p, e.call(k, "sync", "/items")); !errors.Is(err, testkit.ErrCommitFailed) {
		t.Fatalf("the admission whose commit failed: %v, want the commit's error", err)
	}
	e.clk.advance(time.Millisecond)
	tk, err := e.admitWith(p, e.call(k, "sync", "/items"))
	if err != nil {
		t.Fatal(err)
	}
	if tk.Leased() {
		t.Error("the next call was admitted from the lease whose commit failed")
	}
	answerWith(t, p, e.clk, tk, 200, nil)
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if reserved, _ := e.countReserved(k); reserved != 0 {
		t.Errorf("%d slots reserved after Close, want none", reserved)
	}
}
