package pacer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// downStore is a ledger.Store whose Updates fail, without running their
// function, while down: the database does not answer.
type downStore struct {
	ledger.Store
	down   atomic.Bool
	missed atomic.Int32 // Updates tried while down
}

func (s *downStore) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	if s.down.Load() {
		s.missed.Add(1)
		return ledger.ErrUnavailable
	}
	return s.Store.Update(ctx, fn, keys...)
}

// A refusal of a call from a lease ends the lease by itself, before the
// transaction that records it: when that transaction cannot run (the
// database does not answer) or its commit fails, the next call is still
// not handed a slot of the lease. When the database answers, the lease's
// unused slots are given back at once (the refused call's own stays
// reserved: its outcome was not recorded, and a slot's is not kept for a
// later transaction); when it does not, Done tries no second transaction,
// and every slot stays reserved until the key's next transaction gives
// back the unused ones (see pending.go).
func TestRefusalEndsItsLeaseThoughItsRecordFails(t *testing.T) {
	for _, tt := range []struct {
		name string
		fail func(*testkit.FailStore, *downStore)
		want error
		down bool // the database does not answer: the slots stay reserved (until the sweep)
	}{
		{"the database does not answer", func(_ *testkit.FailStore, d *downStore) { d.down.Store(true) }, ledger.ErrUnavailable, true},
		{"the commit fails", func(f *testkit.FailStore, _ *downStore) { f.FailNext(1) }, testkit.ErrCommitFailed, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			failing := &testkit.FailStore{Store: e.rerun}
			down := &downStore{Store: failing}
			p := e.pacerOn(down)
			k := busyKey(100_000)
			first := e.warmUp(p, k, nil)
			before, _ := e.countReserved(k)
			tt.fail(failing, down)
			rd := reading(30 * time.Second)
			rd.ReceivedAt = e.clk.Now()
			_, err := p.Done(context.Background(), first, pacer.Outcome{SentAt: first.AdmittedAt, AnsweredAt: e.clk.Now(), Status: 429, Reading: rd})
			if !errors.Is(err, tt.want) {
				t.Fatalf("Done of the refusal: %v, want %v", err, tt.want)
			}
			reserved, _ := e.countReserved(k)
			switch {
			case tt.down && (reserved != before || before < 2):
				t.Errorf("%d slots reserved after the lease ended, %d before: want them all kept", reserved, before)
			case tt.down && down.missed.Load() != 1:
				t.Errorf("Done tried %d transactions while the database did not answer, want 1", down.missed.Load())
			case !tt.down && reserved != 1:
				t.Errorf("%d slots still reserved after the lease ended, want the refused call's own", reserved)
			}
			down.down.Store(false)
			e.clk.advance(time.Millisecond)
			tk, err := e.admitWith(p, e.call(k, "sync", "/items"))
			if err != nil {
				t.Fatal(err)
			}
			if tk.Leased() {
				t.Error("the next call was handed a slot of the lease a refusal ended")
			}
			answerWith(t, p, e.clk, tk, 200, nil)
			if err := p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if reserved, _ := e.countReserved(k); reserved != 1 {
				t.Errorf("%d slots still reserved once the key's next transactions committed, want the refused call's own", reserved)
			}
		})
	}
}

// hookStore is a ledger.Store that calls before (once) ahead of its next
// Update: another goroutine's transaction that takes the key's lock first.
type hookStore struct {
	ledger.Store
	before func()
}

func (s *hookStore) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	if b := s.before; b != nil {
		s.before = nil
		b()
	}
	return s.Store.Update(ctx, fn, keys...)
}

// A refusal ends the key's lease, though that lease was granted after the
// refusal's own lease ended and before its transaction recorded the
// refusal (admissions that took the key's lock first could not see it):
// once Done returned, no call is handed a slot past the refusal's
// Retry-After.
func TestRefusalEndsALeaseGrantedBeforeItIsRecorded(t *testing.T) {
	e := newEnv(t)
	h := &hookStore{Store: e.rerun}
	p := e.pacerOn(h)
	k := busyKey(100_000)
	first := e.warmUp(p, k, nil)
	granted := false
	h.before = func() { // admissions that win the key's lock before Done's transaction
		for range 5 {
			e.clk.advance(time.Millisecond)
			tk, err := e.admitWith(p, e.call(k, "sync", "/items"))
			if err != nil {
				t.Fatal(err)
			}
			granted = granted || tk.Leased()
		}
	}
	rd := reading(30 * time.Second)
	rd.ReceivedAt = e.clk.Now()
	if _, err := p.Done(context.Background(), first, pacer.Outcome{SentAt: first.AdmittedAt, AnsweredAt: e.clk.Now(), Status: 429, Reading: rd}); err != nil {
		t.Fatal(err)
	}
	if !granted {
		t.Fatal("no lease was granted before the refusal was recorded: the test shows nothing")
	}
	e.clk.advance(time.Millisecond)
	tk, err := e.admitWith(p, e.call(k, "sync", "/items"))
	if err == nil && tk.Leased() {
		t.Error("a call was handed a slot of a lease after a Retry-After refusal was recorded")
	}
}
