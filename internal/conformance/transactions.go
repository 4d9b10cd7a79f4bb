package conformance

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
)

// transactions: what Update and View promise, alone and side by side.
var transactions = []behaviour{
	{"a new store answers Check and holds no key", newStoreIsEmpty},
	{"a store opened again on one location shares what the first wrote", openedAgain},
	{"an error of the function rolls its transaction back", updateRollsBack},
	{"updates of one key from two stores run one at a time, each seeing the last", updatesOfOneKeyAreSerialised},
	{"an update waits for another store's transaction on its key, readers do not", updateWaitsForAnotherStore},
	{"an update whose context ends while it waits returns its error and never runs", updateCancelledWhileWaiting},
	{"a function that panics rolls back, and its caller gets the panic", updatePanics},
	{"a commit that fails after the function returned leaves nothing of what it wrote", commitFailureLeavesNothing},
	{"the clock of a transaction does not go back from one of a key to the next", clockOfTransactions},
	{"attempts record the instance of the store that recorded them", instanceOnAttempts},
	{"a signing key is made once, and every store on one location has it", signingKeys},
}

func newStoreIsEmpty(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	if err := s.Check(context.Background()); err != nil {
		t.Errorf("Check of a new store: %v", err)
	}
	view(t, s, func(tx ledger.ReadTx) error {
		keys, err := own(tx).Keys()
		if len(keys) != 0 {
			t.Errorf("Keys of a new store: got %q, want none", keys)
		}
		list, err2 := tx.Activity(ledger.ActivityFilter{})
		if len(list) != 0 {
			t.Errorf("Activity of a new store: got %d attempts, want none", len(list))
		}
		return errors.Join(err, err2)
	})
	if n, err := s.Recover(context.Background()); n != 0 || err != nil {
		t.Errorf("Recover of a new store: got %d, %v; want 0, nil", n, err)
	}
}

func openedAgain(t *testing.T, b Backend) {
	a, loc := b.fresh(t)
	update(t, a, func(tx ledger.Tx) error {
		_, err := tx.InsertAttempt(admission("k", "agent", t0))
		return err
	}, "k")
	// Opened again, as by another process: its schema is there already.
	other := b.Open(t, loc)
	view(t, other, func(tx ledger.ReadTx) error {
		n, err := tx.Count("k", time.Time{})
		if n != 1 {
			t.Errorf("Count in the store opened again: got %d, want 1", n)
		}
		return err
	})
	update(t, other, func(tx ledger.Tx) error {
		_, err := tx.InsertAttempt(admission("k", "sync", t0.Add(time.Second)))
		return err
	}, "k")
	view(t, a, func(tx ledger.ReadTx) error {
		w, err := tx.Window("k", time.Time{})
		if want := (ledger.Window{Count: 2, Oldest: t0}); !cmp.Equal(w, want) {
			t.Errorf("Window read by the first store: got %+v, want %+v", w, want)
		}
		return err
	})
}

func updateRollsBack(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	boom := errors.New("boom")
	err := s.Update(context.Background(), func(tx ledger.Tx) error {
		if _, err := tx.InsertAttempt(admission("k", "agent", t0)); err != nil {
			return err
		}
		if err := tx.PutGate(ledger.Gate{Key: "k", Until: t0.Add(time.Hour), Source: "backoff", SetAt: t0}); err != nil {
			return err
		}
		return boom
	}, "k")
	if !errors.Is(err, boom) {
		t.Errorf("Update: got %v, want the function's error", err)
	}
	if state.Storage(err) {
		t.Errorf("Storage(%v) = true for the function's own error, want false", err)
	}
	view(t, s, func(tx ledger.ReadTx) error {
		n, err := tx.Count("k", time.Time{})
		if n != 0 {
			t.Errorf("got %d attempts, want the insert rolled back", n)
		}
		gs, err2 := tx.Gates("k", t0)
		if len(gs) != 0 {
			t.Errorf("got gates %+v, want the gate rolled back", gs)
		}
		return errors.Join(err, err2)
	})
}

// Updates of one key made at the same time, from two stores on one
// location, run one after another: each reads the count the ones before
// it committed, so no two admit on the same count. One that fails leaves
// nothing behind, and the others are unaffected.
func updatesOfOneKeyAreSerialised(t *testing.T, b Backend) {
	first, loc := b.fresh(t)
	stores := []state.Store{first, b.Open(t, loc)}
	const n = 40
	boom := errors.New("boom")
	holding, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var seen []int // the count each successful update read
	var started, done sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			started.Done()
			var read int // the count this update's last run read
			errs[i] = stores[i%2].Update(context.Background(), func(tx ledger.Tx) error {
				if i == 0 { // holds the key while the others come
					signal(holding)
					<-release
				}
				c, err := tx.Count("k", time.Time{})
				if err != nil {
					return err
				}
				if _, err := tx.InsertAttempt(admission("k", "agent", t0.Add(time.Duration(c)*time.Second))); err != nil {
					return err
				}
				if i%5 == 4 {
					return boom
				}
				read = c
				return nil
			}, "k")
			if errs[i] == nil {
				mu.Lock()
				seen = append(seen, read)
				mu.Unlock()
			}
		}()
		if i == 0 {
			<-holding
		}
	}
	started.Wait()
	close(release)
	done.Wait()
	for i, err := range errs {
		if i%5 == 4 {
			if !errors.Is(err, boom) {
				t.Errorf("update %d: got %v, want %v", i, err, boom)
			}
		} else if err != nil {
			t.Errorf("update %d: got %v, want it committed", i, err)
		}
	}
	slices.Sort(seen)
	for i, c := range seen {
		if c != i {
			t.Fatalf("the counts successful updates read: got %v, want 0, 1, 2, … each once", seen)
		}
	}
	for _, s := range stores {
		view(t, s, func(tx ledger.ReadTx) error {
			w, err := tx.Window("k", time.Time{})
			if want := (ledger.Window{Count: len(seen), Oldest: t0}); !cmp.Equal(w, want) {
				t.Errorf("Window after the updates: got %+v, want %+v", w, want)
			}
			last, err2 := tx.Nth("k", time.Time{}, len(seen))
			if want := t0.Add(time.Duration(len(seen)-1) * time.Second); !last.Equal(want) {
				t.Errorf("the last admission: got %v, want %v", last, want)
			}
			return errors.Join(err, err2)
		})
	}
}

// While another store's transaction holds a key, an Update of it waits
// for that transaction to end, then runs; one whose context ends first
// returns the context's error soon after; readers see the last commit
// meanwhile. The store that made the location waits as any other.
func updateWaitsForAnotherStore(t *testing.T, b Backend) {
	waiter, loc := b.fresh(t)
	holder := b.Open(t, loc)
	holding, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		done <- holder.Update(context.Background(), func(tx ledger.Tx) error {
			if _, err := tx.InsertAttempt(admission("k", "a", t0)); err != nil {
				return err
			}
			signal(holding)
			<-release
			return nil
		}, "k")
	}()
	<-holding

	const bound = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	ran := false
	start := time.Now()
	err := waiter.Update(ctx, func(tx ledger.Tx) error { ran = true; return nil }, "k")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Update whose context ends while another holds the key: got %v, want context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > bound+2*time.Second {
		t.Errorf("Update whose context ends after %v returned after %v", bound, took)
	}
	if ran {
		t.Error("the update whose context ended ran its function")
	}
	view(t, waiter, func(tx ledger.ReadTx) error {
		n, err := tx.Count("k", time.Time{})
		if n != 0 {
			t.Errorf("a reader during another's transaction: got %d, want the last commit's 0", n)
		}
		return err
	})
	waited := make(chan error)
	go func() {
		waited <- waiter.Update(context.Background(), func(tx ledger.Tx) error {
			_, err := tx.InsertAttempt(admission("k", "b", t0.Add(time.Second)))
			return err
		}, "k")
	}()
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("an Update waiting for another store's transaction: %v", err)
	}
	view(t, holder, func(tx ledger.ReadTx) error {
		n, err := tx.Count("k", time.Time{})
		if n != 2 {
			t.Errorf("got %d admissions, want both stores' 2", n)
		}
		return err
	})
}

// An Update whose context ends while it waits behind another of the same
// store returns the context's error; its function never runs, and the
// store goes on.
func updateCancelledWhileWaiting(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	holding, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		done <- s.Update(context.Background(), func(tx ledger.Tx) error {
			signal(holding)
			<-release
			return nil
		}, "k")
	}()
	<-holding
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	ran := make(chan bool, 1)
	if err := s.Update(ctx, func(tx ledger.Tx) error { ran <- true; return nil }, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("an update whose context ends while it waits: got %v, want context.DeadlineExceeded", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
		t.Error("the cancelled update's function ran")
	default:
	}
	update(t, s, func(tx ledger.Tx) error { return nil }, "k")
}

// A function that panics rolls back what it wrote, and the panic reaches
// its own caller, whether it ran alone or beside others, which commit.
func updatePanics(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	admit := func(tx ledger.Tx, sec int) error {
		_, err := tx.InsertAttempt(admission("k", "agent", t0.Add(time.Duration(sec)*time.Second)))
		return err
	}
	panics := func(sec int) (v any) {
		defer func() { v = recover() }()
		s.Update(context.Background(), func(tx ledger.Tx) error {
			if err := admit(tx, sec); err != nil {
				return err
			}
			panic("boom")
		}, "k")
		return nil
	}
	if v := panics(0); v != "boom" {
		t.Errorf("a panic alone: got %v, want it raised again", v)
	}

	holding, release := make(chan struct{}), make(chan struct{})
	var started, done sync.WaitGroup
	commits := func(sec int, before func()) {
		defer done.Done()
		started.Done()
		err := s.Update(context.Background(), func(tx ledger.Tx) error {
			before()
			return admit(tx, sec)
		}, "k")
		if err != nil {
			t.Errorf("update at %d s: %v", sec, err)
		}
	}
	started.Add(4)
	done.Add(4)
	go commits(1, func() { signal(holding); <-release }) // holds the key while the others come
	<-holding
	var v any
	go commits(2, func() {})
	go func() { defer done.Done(); started.Done(); v = panics(3) }()
	go commits(4, func() {})
	started.Wait()
	close(release)
	done.Wait()
	if v != "boom" {
		t.Errorf("a panic beside other updates: got %v, want it raised again in its caller", v)
	}
	var got []time.Duration
	for _, s := range sends(t, s, "k") {
		got = append(got, s.At.Sub(t0))
	}
	if want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}; !slices.Equal(got, want) {
		t.Errorf("after the panics: got admissions at %v, want %v", got, want)
	}
}

// A transaction's Clock is the process's clock as given, or, on a back
// end with a clock of its own, that clock, read once per transaction;
// either way it does not go back from one transaction of a key to the
// next, whichever store runs it.
func clockOfTransactions(t *testing.T, b Backend) {
	first, loc := b.fresh(t)
	stores := []state.Store{first, b.Open(t, loc)}
	update(t, first, func(tx ledger.Tx) error {
		before := time.Now()
		c1, c2 := tx.Clock(t0), tx.Clock(t0.Add(time.Hour))
		after := time.Now()
		if !b.ServerClock {
			if !c1.Equal(t0) || !c2.Equal(t0.Add(time.Hour)) {
				t.Errorf("Clock(t0), Clock(t0+1h): got %v, %v; want the clock given", c1, c2)
			}
			return nil
		}
		if !c1.Equal(c2) {
			t.Errorf("Clock twice in one transaction: got %v, then %v; want one instant", c1, c2)
		}
		// The server runs on this host: its clock is this one's.
		if c1.Before(before.Add(-time.Minute)) || c1.After(after.Add(time.Minute)) {
			t.Errorf("Clock(t0) = %v, want the server's clock, about %v", c1, before)
		}
		return nil
	}, "k")
	var last time.Time
	for i := range 20 {
		update(t, stores[i%2], func(tx ledger.Tx) error {
			c := tx.Clock(time.Now())
			if c.Before(last) {
				t.Errorf("transaction %d of the key: Clock went back from %v to %v", i, last, c)
			}
			last = c
			return nil
		}, "k")
	}
}

// Every attempt records the instance that recorded it, the reserved slots
// of a lease too; a store reads what another recorded as it was recorded.
func instanceOnAttempts(t *testing.T, b Backend) {
	s, loc := b.fresh(t)
	update(t, s, func(tx ledger.Tx) error {
		insert(t, tx, admission("k", "agent", t0))
		insert(t, tx, ledger.Attempt{CallID: "r", Attempt: 1, Key: "k", Caller: "agent", State: ledger.RejectedLocal, At: t0})
		first, _, err := tx.Reserve("k", 2, t0.Add(time.Second), t0.Add(time.Minute))
		if err != nil {
			return err
		}
		return tx.FinishReserved(ledger.Attempt{ID: first, CallID: "x", Attempt: 1, Key: "k", Caller: "sync",
			State: ledger.Confirmed, Status: 200})
	}, "k")
	view(t, b.Open(t, loc), func(tx ledger.ReadTx) error {
		list, err := tx.Activity(ledger.ActivityFilter{Key: "k"})
		if len(list) != 3 {
			t.Fatalf("Activity: got %d attempts, want 3 (a reserved slot is not one yet)", len(list))
		}
		for _, a := range list {
			if a.Instance == "" || a.Instance != list[0].Instance {
				t.Errorf("attempt %d (%s) records instance %q, want the store's, the same for all (%q)", a.ID, a.State, a.Instance, list[0].Instance)
			}
		}
		return err
	})
}

// A signing key is made by the first store to ask for it, and every
// store sharing the location gets the same one; another name is another
// key.
func signingKeys(t *testing.T, b Backend) {
	first, loc := b.fresh(t)
	stores := []state.Store{first, b.Open(t, loc)}
	get := func(s state.Store, name string) []byte {
		t.Helper()
		key, err := s.SigningKey(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		return key
	}
	key := get(stores[1], "sessions")
	if len(key) < 16 {
		t.Errorf("a signing key of %d bytes, want 16 at least (130 random bits)", len(key))
	}
	for i, s := range stores {
		if again := get(s, "sessions"); !bytes.Equal(again, key) {
			t.Errorf("store %d: the key asked again differs", i)
		}
	}
	if other := get(first, "other"); bytes.Equal(other, key) {
		t.Error("the keys of two names are the same")
	}
}

// A transaction whose commit fails after its function returned leaves
// nothing of what the function wrote, of every kind, on a key that held
// things before: every read is as before it ran.
func commitFailureLeavesNothing(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	var first int64
	write := func(tx ledger.Tx, at time.Time, caller string) error {
		id, err := tx.InsertAttempt(ledger.Attempt{CallID: "c-" + caller, Attempt: 1, Key: "k", Caller: caller, State: ledger.Admitted,
			At: at, InFlightUntil: at.Add(time.Minute), CallerReserves: true})
		if err != nil {
			return err
		}
		if first == 0 {
			first = id
		} else if err := tx.FinishAttempt(first, ledger.Confirmed, reason.Reason{Kind: reason.Answered, Status: 200}, 200, at, at); err != nil {
			return err
		}
		_, _, err = tx.Reserve("k", 3, at, at.Add(time.Minute))
		return errors.Join(err,
			tx.PutSeenPolicy(ledger.SeenPolicy{Key: "k", ReceivedAt: at, Observation: ratelimit.Observation{Policy: caller, Unit: ratelimit.Requests,
				Quota: 10, HasQuota: true, Window: time.Minute, Remaining: 5, HasRemaining: true, Shape: ratelimit.ShapeDraft}}),
			tx.AddObservation(ledger.ObservationRecord{Key: "k", AttemptID: id, Status: 200, ReceivedAt: at, Method: "GET", Target: "/x",
				Observation: ratelimit.Observation{Policy: caller, Unit: ratelimit.Requests, Remaining: 5, HasRemaining: true, Shape: ratelimit.ShapeDraft}}),
			tx.PutGate(ledger.Gate{Key: "k", Until: at.Add(time.Hour), Reason: reason.Reason{Kind: reason.Said, Said: "told to wait by " + caller}, Source: "retry-after", SetAt: at}),
			tx.PutKeyState(ledger.KeyState{Key: "k", LastAdmitAt: at, LastResponseAt: at, Failures: len(caller)}),
			tx.PutPathState(ledger.PathState{Key: "k", Scope: "route GET /x", Failures: len(caller), LastAt: at}),
			tx.AddWarning(ledger.Warning{Key: "k", At: at, Kind: "circuit-open", Reason: reason.Reason{Kind: reason.Said, Said: "warned by " + caller}}),
			tx.Claim("k", caller, at.Add(time.Hour)),
			tx.PutResponse(ledger.StoredResponse{Key: "k", Target: "/x", Status: 200, Body: []byte(caller), Digest: caller, StoredAt: at}, 4))
	}
	update(t, s, func(tx ledger.Tx) error { first = 0; return write(tx, t0, "before") }, "k")
	before := snapshot(t, s)
	err := testkit.FailCommit(context.Background(), s.Update, func(tx ledger.Tx) error {
		return write(tx, t0.Add(time.Second), "failed")
	}, "k")
	if !errors.Is(err, testkit.ErrCommitFailed) {
		t.Fatalf("an update whose commit failed: got %v, want the commit's error", err)
	}
	if diff := cmp.Diff(snapshot(t, s), before); diff != "" {
		t.Errorf("after a commit that failed (-got +want):\n%s", diff)
	}
}

// A stateSnapshot is every read of key "k" at t0+30s.
type stateSnapshot struct {
	Keys         []string
	Activity     []ledger.Attempt
	Sends        []ledger.Send
	Flight       ledger.Flight
	SeenPolicies []ledger.SeenPolicy
	Observations []ledger.ObservationRecord
	Gates        []ledger.Gate
	KeyState     ledger.KeyState
	PathState    ledger.PathState
	Warnings     []ledger.Warning
	Claimed      map[string]bool
	Response     ledger.StoredResponse
}

func snapshot(t *testing.T, s state.Store) stateSnapshot {
	t.Helper()
	var n stateSnapshot
	now := t0.Add(30 * time.Second)
	view(t, s, func(tx ledger.ReadTx) error {
		var errs [12]error
		n.Keys, errs[0] = own(tx).Keys()
		n.Activity, errs[1] = tx.Activity(ledger.ActivityFilter{})
		n.Sends, errs[2] = tx.Sends("k", time.Time{}, 100)
		n.Flight, errs[3] = tx.Flight("k", now)
		n.SeenPolicies, errs[4] = tx.SeenPolicies("k")
		n.Observations, errs[5] = own(tx).Observations("k", 100)
		n.Gates, errs[6] = tx.Gates("k", now)
		n.KeyState, errs[7] = tx.KeyState("k")
		n.PathState, errs[8] = tx.PathState("k", "route GET /x")
		n.Warnings, errs[9] = tx.Warnings("k", time.Time{})
		n.Claimed, errs[10] = tx.Claimed("k", now)
		n.Response, _, errs[11] = tx.Response("k", "/x")
		return errors.Join(errs[:]...)
	})
	return n
}
