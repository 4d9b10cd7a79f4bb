package pacer_test

import (
	"context"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// stoppedTimers is the wall clock with timers that never fire: a call
// that waits on it goes on only when something wakes it. Each timer made
// sends its duration on made.
type stoppedTimers struct{ made chan time.Duration }

type never struct{}

func (never) Stop() bool { return true }

func (c stoppedTimers) Now() time.Time { return time.Now() }

func (c stoppedTimers) NewTimer(d time.Duration) (clock.Timer, <-chan time.Time) {
	c.made <- d
	return never{}, nil
}

func (c stoppedTimers) AfterFunc(time.Duration, func()) clock.Timer { return never{} }

// A host whose call waits for another host's probe goes on as soon as
// the probe's answer is recorded, not at its next poll: the transaction
// that ends the probe tells the other hosts (state.OnWake). Here the
// waiting host's timers never fire, so only that notice can wake it.
func TestAnotherHostsProbeAnswerWakesItsWaiters(t *testing.T) {
	ctx := context.Background()
	srv := pgtest.Start(t)
	t.Setenv("PGPASSWORD", srv.Password())
	url := srv.CreateDatabase(t)
	open := func() *state.Postgres {
		pg, err := state.OpenPostgres(ctx, url, state.PostgresOptions{JournalDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pg.Close() })
		return pg
	}
	dbA, dbB := open(), open()
	k := &keystore.Key{Name: "k", MaxRate: 1000, MaxConcurrency: 10, Policies: []keystore.Policy{policy("default", 100, time.Minute)}}
	call := func(caller string) pacer.Call {
		return pacer.Call{Key: k, Caller: caller, Transport: "rest", Method: "GET", Target: "/items", CallID: caller, Attempt: 1,
			MaxWait: time.Minute}
	}

	// B listens before anything happens: the listener's first notice
	// (every key re-checks) comes once it does.
	listening := make(chan struct{}, 1)
	defer dbB.OnWake(func(key string) {
		select {
		case listening <- struct{}{}:
		default:
		}
	})()
	<-listening

	// The key's circuit is half-open: its next call is the one probe.
	if err := dbA.Update(ctx, func(tx ledger.Tx) error {
		ks, err := tx.KeyState(k.Name)
		if err != nil {
			return err
		}
		ks.HalfOpen = true
		return tx.PutKeyState(ks)
	}, k.Name); err != nil {
		t.Fatal(err)
	}
	a := pacer.New(dbA)
	t.Cleanup(func() { a.Close(ctx) })
	clk := stoppedTimers{made: make(chan time.Duration, 16)}
	b := pacer.New(dbB, pacer.WithClock(clk))
	t.Cleanup(func() { b.Close(ctx) })

	probe, err := a.Admit(ctx, call("agent"))
	if err != nil || !probe.Probe {
		t.Fatalf("host A's call: %+v, %v; want the probe", probe, err)
	}
	type admitted struct {
		t   pacer.Ticket
		err error
	}
	got := make(chan admitted, 1)
	go func() {
		tk, err := b.Admit(ctx, call("sync"))
		got <- admitted{tk, err}
	}()
	// B's call waits for the probe's answer, polling (a timer that
	// never fires here).
	if d := <-clk.made; d != pacer.Poll {
		t.Fatalf("host B's call waits %v, want a poll (%v) for the probe", d, pacer.Poll)
	}
	if _, err := a.Done(ctx, probe, pacer.Outcome{SentAt: time.Now(), AnsweredAt: time.Now(), Status: 200}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil || r.t.Probe {
			t.Errorf("host B's call after the probe's answer: %+v, %v; want an ordinary admission", r.t, r.err)
		}
	case <-time.After(30 * time.Second): // only a hang gets here: B's timers never fire
		t.Fatal("host B's call was not woken by host A's probe answer")
	}
}
