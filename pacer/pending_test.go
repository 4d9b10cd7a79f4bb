package pacer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// failStore is a ledger.Store whose next Update, once armed, fails as a
// database that went away does: rolled back (the outcome its transaction
// held was not recorded), or committed before the answer was lost.
type failStore struct {
	ledger.Store
	mu     sync.Mutex
	armed  bool
	commit bool
}

var errCutOff = errors.New("cut off before COMMIT")

func (s *failStore) failNext(committed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armed, s.commit = true, committed
}

func (s *failStore) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	s.mu.Lock()
	armed, commit := s.armed, s.commit
	s.armed = false
	s.mu.Unlock()
	if !armed {
		return s.Store.Update(ctx, fn, keys...)
	}
	if commit {
		if err := s.Store.Update(ctx, fn, keys...); err != nil {
			return err
		}
		return fmt.Errorf("state: the connection was terminated after COMMIT: %w", ledger.ErrUnavailable)
	}
	err := s.Store.Update(ctx, func(tx ledger.Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		return errCutOff
	}, keys...)
	if !errors.Is(err, errCutOff) {
		return err
	}
	return fmt.Errorf("state: the connection was terminated: %w", ledger.ErrUnavailable)
}

// probeOut returns a Pacer on a failStore and the probe it admitted once
// the key's last word expired.
func probeOut(t *testing.T, e *env) (*pacer.Pacer, *failStore, pacer.Ticket) {
	t.Helper()
	k := newKey()
	e.send(k, "agent", 200, reading(0, shown("default", 120, time.Minute, 100, 10*time.Second)))
	e.clk.advance(10*time.Second + pacer.ProbeJitter)
	fs := &failStore{Store: e.db}
	p := e.pacerOn(fs)
	probe, err := p.Admit(context.Background(), e.call(k, "agent", "/items"))
	if err != nil {
		t.Fatal(err)
	}
	if !probe.Probe {
		t.Fatal("the first call after expiry: got an ordinary call, want the probe")
	}
	return p, fs, probe
}

// probeAnswer is the probe's answer: a fresh observation with room left.
func probeAnswer(e *env, probe pacer.Ticket) pacer.Outcome {
	rd := reading(0, shown("default", 120, time.Minute, 90, time.Minute))
	rd.ReceivedAt = e.clk.Now()
	return pacer.Outcome{SentAt: probe.AdmittedAt, AnsweredAt: e.clk.Now(), Status: 200, Reading: rd}
}

// A probe that was answered but whose outcome the database did not take
// does not hold the key for its lease once the database is back: the
// key's next transaction records it, once, and calls go on the fresh
// answer. The probe still counts in its window.
func TestUnrecordedProbeIsRecordedByTheNextTransaction(t *testing.T) {
	e := newEnv(t)
	p, fs, probe := probeOut(t, e)
	e.clk.advance(200 * time.Millisecond)
	fs.failNext(false)
	if _, err := p.Done(context.Background(), probe, probeAnswer(e, probe)); !errors.Is(err, ledger.ErrUnavailable) {
		t.Fatalf("Done on a database cut off: %v, want ErrUnavailable", err)
	}
	// The database is back half a second later, before the pending
	// write's own timer (a second).
	e.clk.advance(500 * time.Millisecond)
	tk, err := p.Admit(context.Background(), e.call(probe.Call.Key, "sync", "/items"))
	if err != nil {
		t.Fatalf("the next call once the database is back: %v, want admitted on the probe's answer", err)
	}
	if tk.Probe {
		t.Error("the next call is another probe: the first one's answer was not recorded")
	}
	if ok, err := p.Recorded(context.Background(), probe); err != nil || !ok {
		t.Errorf("the probe's outcome recorded: %v (%v), want true", ok, err)
	}
	// Recorded once, and counted: the probe and the call after it.
	var obs []ledger.ObservationRecord
	var n int
	err = e.db.View(context.Background(), func(tx ledger.ReadTx) error {
		var err error
		if obs, err = tx.ObservationsOf("k", probe.ID); err != nil {
			return err
		}
		n, err = tx.Count("k", probe.AdmittedAt.Add(-time.Microsecond))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(obs) != 1 {
		t.Errorf("the probe's answer recorded %d times, want once", len(obs))
	}
	if n != 2 {
		t.Errorf("%d attempts counted since the probe, want 2 (the probe and the call after it)", n)
	}
}

// An outcome whose Done failed is recorded once, whichever commits it
// first: the failed transaction itself (it committed after all), the
// key's next transaction, or a retry of Done (as the upstream client
// retries one).
func TestUnrecordedOutcomeIsRecordedOnce(t *testing.T) {
	for _, tc := range []struct {
		name      string
		committed bool // the failed Done committed after all
		retry     bool // Done is tried again after the next admission
	}{
		{name: "next transaction, then a retry", retry: true},
		{name: "committed after all", committed: true},
		{name: "committed after all, then a retry", committed: true, retry: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p, fs, probe := probeOut(t, e)
			e.clk.advance(200 * time.Millisecond)
			o := probeAnswer(e, probe)
			fs.failNext(tc.committed)
			if _, err := p.Done(context.Background(), probe, o); !errors.Is(err, ledger.ErrUnavailable) {
				t.Fatalf("Done on a database cut off: %v, want ErrUnavailable", err)
			}
			e.clk.advance(time.Second)
			if _, err := p.Admit(context.Background(), e.call(probe.Call.Key, "sync", "/items")); err != nil {
				t.Fatalf("the next call: %v, want admitted", err)
			}
			if tc.retry {
				if _, err := p.Done(context.Background(), probe, o); err != nil {
					t.Fatalf("Done again: %v", err)
				}
			}
			var obs []ledger.ObservationRecord
			err := e.db.View(context.Background(), func(tx ledger.ReadTx) error {
				var err error
				obs, err = tx.ObservationsOf("k", probe.ID)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(obs) != 1 {
				t.Errorf("the probe's answer recorded %d times, want once", len(obs))
			}
		})
	}
}

// An outcome whose Done failed, on a key called no more, is recorded by a
// transaction of its own a second later — again a second after that one
// fails, the database still away — not only at the key's next
// transaction or Close.
func TestUnrecordedOutcomeIsRecordedByItsTimer(t *testing.T) {
	e := newEnv(t)
	p, fs, probe := probeOut(t, e)
	fs.failNext(false)
	if _, err := p.Done(context.Background(), probe, probeAnswer(e, probe)); !errors.Is(err, ledger.ErrUnavailable) {
		t.Fatalf("Done on a database cut off: %v, want ErrUnavailable", err)
	}
	recorded := func() bool {
		t.Helper()
		ok, err := p.Recorded(context.Background(), probe)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	fs.failNext(false) // the timer's first transaction finds the database away too
	e.clk.advance(time.Second)
	if recorded() {
		t.Fatal("recorded by a transaction that failed")
	}
	e.clk.advance(time.Second)
	if !recorded() {
		t.Error("the probe's outcome is not recorded two seconds on, the database back: want its timer's second transaction to record it")
	}
}
