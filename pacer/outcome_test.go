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
	down atomic.Bool
}

func (s *downStore) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	if s.down.Load() {
		return ledger.ErrUnavailable
	}
	return s.Store.Update(ctx, fn, keys...)
}

// A refusal of a call from a lease ends the lease by itself, before the
// transaction that records it: when that transaction cannot run (the
// database does not answer) or its commit fails, the next call is still
// not handed a slot of the lease; and when the database answers, the
// lease's unused slots are given back at once (the refused call's own
// stays reserved: its outcome was not recorded, and a slot's is not kept
// for a later transaction).
func TestRefusalEndsItsLeaseThoughItsRecordFails(t *testing.T) {
	for _, tt := range []struct {
		name     string
		fail     func(*testkit.FailStore, *downStore)
		want     error
		reserved bool // slots may stay reserved (until the sweep): nothing could give them back
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
			tt.fail(failing, down)
			rd := reading(30 * time.Second)
			rd.ReceivedAt = e.clk.Now()
			_, err := p.Done(context.Background(), first, pacer.Outcome{SentAt: first.AdmittedAt, AnsweredAt: e.clk.Now(), Status: 429, Reading: rd})
			if !errors.Is(err, tt.want) {
				t.Fatalf("Done of the refusal: %v, want %v", err, tt.want)
			}
			if reserved, _ := e.countReserved(k); reserved != 1 && !tt.reserved {
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
		})
	}
}
