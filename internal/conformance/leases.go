package conformance

import (
	"errors"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// leases: slots reserved for a batch of calls.
var leases = []behaviour{
	{"reserved slots count as sent and in flight, and are given back or kept", reserveAndRelease},
	{"reserved slots are not attempts until reported", reservedSlotsAreNoActivity},
}

// countAll is the window of key after since read both ways: through the
// log's numbering (Count) and by its rows (Sends); they must agree.
func countAll(t *testing.T, tx ledger.Reader, key string, since time.Time) int {
	t.Helper()
	n, err := tx.Count(key, since)
	if err != nil {
		t.Fatal(err)
	}
	sends, err := tx.Sends(key, since, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if n != len(sends) {
		t.Fatalf("the log's numbering counts %d sends, its rows %d: the numbering has a gap", n, len(sends))
	}
	return n
}

// Reserved slots count as sent and in flight from their reservation;
// those never handed out are deleted when they end the log, and kept
// counted (released) when admissions follow them.
func reserveAndRelease(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	update(t, s, func(tx ledger.Tx) error {
		admitLeased(t, tx, t0)
		admitLeased(t, tx, t0.Add(time.Millisecond))
		at := t0.Add(2 * time.Millisecond)
		if err := releaseAtTheEnd(t, tx, at); err != nil {
			return err
		}
		if err := releaseBeforeAnAdmission(t, tx, at); err != nil {
			return err
		}
		refuseBadReservations(t, tx, at)
		return nil
	}, "k")
	view(t, s, func(tx ledger.ReadTx) error { return checkReservedActivity(t, tx) })
}

// admitLeased records an admission of key k at at, in flight for a
// minute.
func admitLeased(t *testing.T, tx ledger.Tx, at time.Time) {
	a := admission("k", "agent", at)
	a.InFlightUntil = at.Add(time.Minute)
	insert(t, tx, a)
}

// releaseAtTheEnd reserves 5 slots at at, after two admissions: they
// count as sent and in flight until their lease ends; two are handed out
// and end, and the other three, given back while they end the log, are
// gone.
func releaseAtTheEnd(t *testing.T, tx ledger.Tx, at time.Time) error {
	first, last, err := tx.Reserve("k", 5, at, at.Add(time.Minute))
	if err != nil {
		return err
	}
	if last-first != 4 {
		t.Errorf("slots %d…%d, want 5 consecutive IDs", first, last)
	}
	if n := countAll(t, tx, "k", t0.Add(-time.Second)); n != 7 {
		t.Errorf("after reserving 5: %d sent, want 7", n)
	}
	if f, err := tx.Flight("k", at); err != nil || f.Count != 7 {
		t.Errorf("after reserving 5: %d in flight (%v), want 7", f.Count, err)
	}
	if f, err := tx.Flight("k", at.Add(time.Minute)); err != nil || f.Count != 0 {
		t.Errorf("once the lease ran out: %d in flight (%v), want none", f.Count, err)
	}
	// Two slots are handed out and end; the other three are given back
	// while they end the log: gone.
	for _, id := range []int64{first, first + 1} {
		if err := tx.FinishReserved(ledger.Attempt{ID: id, CallID: "x", Attempt: 1, Caller: "sync", Transport: "rest",
			Method: "GET", Target: "/items", State: ledger.Confirmed, Reason: reason.Reason{Kind: reason.Answered, Status: 200}, Status: 200, SentAt: at, AnsweredAt: at}); err != nil {
			return err
		}
	}
	if err := tx.Release("k", first+2, last); err != nil {
		return err
	}
	if n := countAll(t, tx, "k", t0.Add(-time.Second)); n != 4 {
		t.Errorf("after giving back 3 of 5 at the end of the log: %d sent, want 4", n)
	}
	return nil
}

// releaseBeforeAnAdmission reserves 3 slots at at that an admission
// follows: given back, they stay counted (released), and no longer in
// flight. An empty range gives back nothing, and a slot never recorded
// cannot be finished.
func releaseBeforeAnAdmission(t *testing.T, tx ledger.Tx, at time.Time) error {
	first, last, err := tx.Reserve("k", 3, at, at.Add(time.Minute))
	if err != nil {
		return err
	}
	admitLeased(t, tx, at.Add(time.Millisecond))
	if err := tx.Release("k", first, last); err != nil {
		return err
	}
	if n := countAll(t, tx, "k", t0.Add(-time.Second)); n != 8 {
		t.Errorf("after giving back 3 slots followed by an admission: %d sent, want 8", n)
	}
	if f, err := tx.Flight("k", at); err != nil || f.Count != 3 {
		t.Errorf("after giving back every slot: %d in flight (%v), want the 3 admissions", f.Count, err)
	}
	if err := tx.Release("k", last, first); err != nil {
		t.Errorf("giving back an empty range: %v", err)
	}
	// A slot that is not recorded cannot be finished.
	if err := tx.FinishReserved(ledger.Attempt{ID: last + 100, State: ledger.Confirmed}); err == nil {
		t.Error("finishing a slot that does not exist: got no error")
	}
	return nil
}

// refuseBadReservations: slots must not precede the log's latest
// admission (at and later), and a lease holds at least one.
func refuseBadReservations(t *testing.T, tx ledger.Tx, at time.Time) {
	if _, _, err := tx.Reserve("k", 2, t0, t0.Add(time.Minute)); err == nil {
		t.Error("reserving slots before the latest admission: got no error")
	}
	if _, _, err := tx.Reserve("k", 0, at.Add(time.Second), at.Add(time.Minute)); err == nil {
		t.Error("reserving no slot: got no error")
	}
}

// checkReservedActivity reads the activity reserveAndRelease left: the
// two finished slots confirmed as they were finished, three released,
// three admissions, and no slot still reserved.
func checkReservedActivity(t *testing.T, tx ledger.ReadTx) error {
	list, err := tx.Activity(ledger.ActivityFilter{Key: "k"})
	states := map[ledger.State]int{}
	for _, a := range list {
		states[a.State]++
		if a.State == ledger.Confirmed && (a.Caller != "sync" || a.Target != "/items" || a.Status != 200 || !a.InFlightUntil.IsZero()) {
			t.Errorf("a finished slot reads %+v", a)
		}
	}
	if states[ledger.Confirmed] != 2 || states[ledger.Released] != 3 || states[ledger.Admitted] != 3 {
		t.Errorf("activity by state: %v; want 2 confirmed, 3 released, 3 admitted", states)
	}
	sends, err2 := tx.Sends("k", time.Time{}, 100)
	for _, s := range sends {
		if s.State == ledger.Reserved {
			t.Errorf("slot %d is still reserved after every slot was finished or given back", s.ID)
		}
	}
	return errors.Join(err, err2)
}

// A slot reserved and not yet reported is counted, but it is no attempt
// yet: the activity, the timeline and the calls leave it out until it is
// reported.
func reservedSlotsAreNoActivity(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	var first, last int64
	update(t, s, func(tx ledger.Tx) error {
		var err error
		first, last, err = tx.Reserve("k", 3, t0, t0.Add(time.Minute))
		return err
	}, "k")
	check := func(wantActivity int) {
		t.Helper()
		view(t, s, func(tx ledger.ReadTx) error {
			if n := countAll(t, tx, "k", time.Time{}); n != 3 {
				t.Errorf("%d sent, want the 3 slots", n)
			}
			list, err := tx.Activity(ledger.ActivityFilter{})
			if len(list) != wantActivity {
				t.Errorf("Activity: got %d attempts, want %d", len(list), wantActivity)
			}
			buckets, err2 := tx.Timeline("k", t0.Add(-time.Minute), time.Minute)
			n := 0
			for _, b := range buckets {
				n += b.Count
			}
			if n != wantActivity {
				t.Errorf("Timeline: counts %d attempts (%+v), want %d", n, buckets, wantActivity)
			}
			call, err3 := tx.Call("k", "")
			if len(call) != 0 {
				t.Errorf("Call of the slots' empty call ID: got %d attempts, want none", len(call))
			}
			return errors.Join(err, err2, err3)
		})
	}
	check(0)
	update(t, s, func(tx ledger.Tx) error {
		return tx.FinishReserved(ledger.Attempt{ID: first, CallID: "x", Attempt: 1, Key: "k", Caller: "sync",
			State: ledger.Confirmed, Status: 200, SentAt: t0, AnsweredAt: t0})
	}, "k")
	check(1)
	if last-first != 2 {
		t.Errorf("slots %d…%d, want 3 consecutive IDs", first, last)
	}
}
