package pacer_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// gatedStore holds the next Update once armed until open is closed, and
// says when it ended.
type gatedStore struct {
	ledger.Store
	mu      sync.Mutex
	armed   bool
	entered chan struct{} // closed when the held Update starts
	open    chan struct{} // closing it lets the held Update run
	ended   atomic.Bool   // the held Update returned
}

func (s *gatedStore) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	s.mu.Lock()
	held := s.armed
	s.armed = false
	s.mu.Unlock()
	if !held {
		return s.Store.Update(ctx, fn, keys...)
	}
	close(s.entered)
	<-s.open
	defer s.ended.Store(true)
	return s.Store.Update(ctx, fn, keys...)
}

// A lease that runs out while the Pacer closes has its slots given back
// before Close returns: no goroutine of the Pacer (a timer's) outlives it.
func TestCloseWaitsForLeasesGivenBack(t *testing.T) {
	e := newEnv(t)
	gate := &gatedStore{Store: e.db, entered: make(chan struct{}), open: make(chan struct{})}
	p := e.pacerOn(gate)
	k := busyKey(100_000)
	answerWith(t, p, e.clk, e.warmUp(p, k, nil), 200, nil) // leaves the lease's other slots unused
	if e.clk.Timers() == 0 {
		t.Fatal("no lease was granted")
	}

	gate.mu.Lock()
	gate.armed = true // the give-back's transaction
	gate.mu.Unlock()
	fired := make(chan struct{})
	go func() {
		defer close(fired)
		e.clk.advance(time.Hour) // the lease runs out, learned is written: the timers fire here
	}()
	<-gate.entered
	close(gate.open) // from here the give-back runs beside Close
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !gate.ended.Load() {
		t.Error("Close returned while a lease that ran out was still being given back")
	}
	<-fired
	if n := reservedLeft(t, e, k.Name); n != 0 {
		t.Errorf("%d slots still reserved after Close, want none", n)
	}
	if g := testkit.Goroutines("pacer.(*Pacer)"); g != "" {
		t.Errorf("a goroutine of the Pacer is left after Close:\n%s", g)
	}
}

// reservedLeft counts key's slots still reserved.
func reservedLeft(t *testing.T, e *env, key string) int {
	t.Helper()
	n := 0
	if err := e.db.View(context.Background(), func(tx ledger.ReadTx) error {
		sends, err := tx.Sends(key, time.Time{}, 1<<20)
		for _, s := range sends {
			if s.State == ledger.Reserved {
				n++
			}
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// finishGate holds the next FinishLater once armed until open is closed.
type finishGate struct {
	ledger.Store
	armed   atomic.Bool
	entered chan struct{} // closed when the held FinishLater starts
	open    chan struct{} // closing it lets the held FinishLater go on
}

func (s *finishGate) FinishLater(ctx context.Context, f ledger.Finished) error {
	if s.armed.CompareAndSwap(true, false) {
		close(s.entered)
		<-s.open
	}
	return s.Store.FinishLater(ctx, f)
}

// A routine answer on its way to the journal when the Pacer closes is in
// it before Close returns: the state, closed after the Pacer as serve
// closes them, records it.
func TestCloseWaitsForRoutineAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t) // its clock moves as the test says, here in the bubble
		gate := &finishGate{Store: e.db, entered: make(chan struct{}), open: make(chan struct{})}
		p := e.pacerOn(gate)
		leased := e.warmUp(p, busyKey(100_000), nil)
		gate.armed.Store(true)
		answered := make(chan error, 1)
		go func() {
			_, err := p.Done(context.Background(), leased, pacer.Outcome{SentAt: leased.AdmittedAt, AnsweredAt: e.clk.Now(), Status: 200})
			answered <- err
		}()
		<-gate.entered // past the Pacer's look at whether it closed
		closed := make(chan error, 1)
		go func() { closed <- p.Close(context.Background()) }()
		synctest.Wait() // Close has returned, or waits
		select {
		case err := <-closed:
			t.Errorf("Close returned (%v) while a routine answer was on its way to the journal", err)
			e.db.Close() // as serve does once the Pacer closed
			closed <- err
		default:
		}
		close(gate.open)
		if err := <-answered; err != nil {
			t.Errorf("the routine answer: %v", err)
		}
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
		if err := e.db.Close(); err != nil {
			t.Fatal(err)
		}

		db, _ := e.open()
		var got []ledger.Attempt
		if err := db.View(context.Background(), func(tx ledger.ReadTx) error {
			var err error
			got, err = tx.Activity(ledger.ActivityFilter{Limit: 1000})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		for _, a := range got {
			if a.ID == leased.ID {
				if a.State != ledger.Confirmed || a.Status != 200 {
					t.Errorf("the answer recorded as the Pacer and the state closed: %s %d, want confirmed 200", a.State, a.Status)
				}
				return
			}
		}
		t.Errorf("the answer given as the Pacer closed is not in the activity")
	})
}
