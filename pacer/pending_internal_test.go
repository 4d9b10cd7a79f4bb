package pacer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// unavailableStore is a database that never answers: what is pending
// stays pending, whatever its timer tries.
type unavailableStore struct{ ledger.Store }

func (unavailableStore) Update(context.Context, func(ledger.Tx) error, ...string) error {
	return ledger.ErrUnavailable
}

// A pending write is forgotten once what it finishes no longer counts as
// in flight: an attempt's outcome at the in-flight timeout after its
// admission, a lease's slots at the in-flight timeout after the lease's
// end (the sweep ends either from then on). Pending writes are written
// oldest first, whatever their kind; one written is not written again,
// and an outcome kept again replaces the one pending of its attempt.
func TestPendingWrites(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := testkit.NewClock(t0)
	p := New(unavailableStore{}, WithClock(clk), WithInFlightTimeout(time.Minute))
	k := &keystore.Key{Name: "k"}
	ticket := func(id int64, at time.Time) Ticket {
		return Ticket{ID: id, Call: Call{Key: k, CallID: "c"}, AdmittedAt: at}
	}
	// what takePending returns of key k, by a name for each write
	taken := func() []string {
		var got []string
		for _, w := range p.takePending([]string{"k"}) {
			if w.t != nil {
				got = append(got, "outcome "+w.o.Err.Error())
			} else {
				got = append(got, "slots")
			}
		}
		return got
	}

	p.keepPending(
		p.pendingOutcome(ticket(1, t0.Add(2*time.Second)), Outcome{Err: errNotConfirmed}),                       // expires at t0+62s
		p.pendingRelease(&lease{key: "k", first: 5, next: 7, last: 9, at: t0, until: t0.Add(10 * time.Second)}), // at t0+70s
		p.pendingRelease(nil),
		p.pendingOutcome(Ticket{ID: 3, Call: Call{Key: k}, lease: &lease{}}, Outcome{}), // a slot's: not kept
	)
	p.keepPending(p.pendingOutcome(ticket(1, t0.Add(2*time.Second)), Outcome{Err: errKeptAgain}))
	p.keepPending(p.pendingOutcome(ticket(2, t0.Add(time.Second)), Outcome{Err: errNotConfirmed})) // expires at t0+61s
	want := []string{"slots", "outcome " + errNotConfirmed.Error(), "outcome " + errKeptAgain.Error()}
	if diff := cmp.Diff(taken(), want); diff != "" {
		t.Errorf("pending writes (-got +want):\n%s", diff)
	}
	if w := p.takePending([]string{"k"}); len(w) == 0 || w[0].slots == nil || w[0].slots.first != 7 || w[0].slots.last != 9 {
		t.Errorf("the lease's slots to give back: %+v, want 7…9 first: those never handed out", w)
	}
	if got := p.takePending([]string{"other"}); len(got) != 0 {
		t.Errorf("pending writes of another key: %d, want none", len(got))
	}

	clk.Advance(62 * time.Second)
	if diff := cmp.Diff(taken(), []string{"slots"}); diff != "" {
		t.Errorf("pending writes once the attempt no longer counts as in flight (-got +want):\n%s", diff)
	}
	p.pendingEnded(p.takePending([]string{"k"}), nil)
	if got := taken(); len(got) != 0 {
		t.Errorf("pending writes once a transaction wrote them: %q, want none", got)
	}
	p.mu.Lock()
	remembered := len(p.pending["k"])
	p.mu.Unlock()
	if remembered != 1 {
		t.Errorf("%d written writes remembered before they expire, want 1", remembered)
	}
	clk.Advance(8 * time.Second)
	p.takePending(nil)
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pending) != 0 {
		t.Errorf("pending writes kept past their expiry: %v", p.pending)
	}
}

var errKeptAgain = errors.New("kept again")
