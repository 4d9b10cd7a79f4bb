package pacer

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/state"
)

// gatedStore counts its Updates and, from gateAt on, holds the first one
// until release is closed; the one after it calls second first, when set.
type gatedStore struct {
	ledger.Store
	gateAt  int32
	updates atomic.Int32
	entered chan struct{} // closed once the held Update waits
	release chan struct{}
	second  func()
}

func (s *gatedStore) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	switch s.updates.Add(1) - s.gateAt {
	case 0:
		close(s.entered)
		<-s.release
	case 1:
		if s.second != nil {
			s.second()
		}
	}
	return s.Store.Update(ctx, fn, keys...)
}

// waitQueued returns once n parts of key's transactions wait behind the
// one running, or another transaction started (they did not wait).
func waitQueued(p *Pacer, s *gatedStore, key string, n int) {
	for queued := 0; queued < n && s.updates.Load() == s.gateAt; runtime.Gosched() {
		p.groups.mu.Lock()
		if g := p.groups.groups[key]; g != nil {
			queued = len(g.queue)
		}
		p.groups.mu.Unlock()
	}
}

// Calls of one key that need a transaction while another of the key's
// runs are decided together in the next one, each in turn against what
// the ones before it recorded — on a store that runs the transaction
// twice, with another host spending the key between the runs: only the
// last run's decisions count. Eight calls of a key allowing 10 a minute,
// of which another host takes 5: the first call is admitted alone, the
// seven queued behind it in one transaction, of which four are admitted
// and three refused, and the log holds exactly 10.
func TestAdmitTogether(t *testing.T) {
	t.Run("store=sqlite", func(t *testing.T) {
		db, err := state.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		testAdmitTogether(t, db)
	})
	t.Run("store=postgres", func(t *testing.T) {
		srv := pgtest.Start(t)
		t.Setenv("PGPASSWORD", srv.Password())
		db, err := state.OpenPostgres(context.Background(), srv.CreateDatabase(t), state.PostgresOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		testAdmitTogether(t, db)
	})
}

func testAdmitTogether(t *testing.T, db ledger.Store) {
	ctx := context.Background()
	const calls, quota, others = 8, 10, 5
	k := &keystore.Key{Name: "k", MaxRate: 1e9, MaxConcurrency: 1 << 20,
		Policies: []keystore.Policy{{Name: "default", Quota: quota, Window: time.Minute, Unit: ratelimit.Requests}}}
	rerun := &testkit.RerunStore{Store: db}
	store := &gatedStore{Store: rerun, gateAt: 1, entered: make(chan struct{}), release: make(chan struct{})}
	store.second = func() {
		rerun.Once(func(ctx context.Context) error { // another host, between the two runs
			return db.Update(ctx, func(tx ledger.Tx) error {
				now := tx.Clock(time.Now())
				for i := range others {
					if _, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint("other-", i), Attempt: 1, Key: k.Name,
						State: ledger.Admitted, At: now, InFlightUntil: now.Add(time.Hour)}); err != nil {
						return err
					}
				}
				return nil
			}, k.Name)
		})
	}
	var clk *testkit.Clock
	if pg, ok := db.(*state.Postgres); ok {
		clk = testkit.NewClock(pg.Now()) // the server's clock, as the state records
	} else {
		clk = testkit.NewClock(time.Now())
	}
	p := New(store, WithClock(clk), WithJitter(func() float64 { return 0.5 }))
	defer p.Close(ctx)

	tickets := make([]Ticket, calls)
	errs := make([]error, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tickets[i], errs[i] = p.Admit(ctx, Call{Key: k, Caller: "sync", Transport: "rest", Method: "GET", Target: "/items",
				CallID: fmt.Sprint("call-", i), Attempt: 1})
		}()
	}
	<-store.entered
	waitQueued(p, store, k.Name, calls-1) // the others wait behind the first transaction
	close(store.release)
	wg.Wait()

	if n := store.updates.Load(); n != 2 {
		t.Errorf("%d calls took %d transactions, want 2: the first alone, the others together", calls, n)
	}
	ids := map[int64]bool{}
	admitted, paused := 0, 0
	for i, err := range errs {
		switch {
		case err == nil:
			admitted++
			if ids[tickets[i].ID] {
				t.Errorf("call %d admitted as attempt %d, which another call was admitted as too", i, tickets[i].ID)
			}
			ids[tickets[i].ID] = true
		case errors.Is(err, ErrPaused):
			paused++
		default:
			t.Errorf("call %d: %v", i, err)
		}
	}
	if admitted != quota-others || paused != calls-(quota-others) {
		t.Errorf("%d admitted and %d paused, want %d and %d: the key allows %d, another host took %d",
			admitted, paused, quota-others, calls-(quota-others), quota, others)
	}
	err := db.View(ctx, func(tx ledger.Tx) error {
		n, err := tx.Count(k.Name, time.Time{})
		if err == nil && n != quota {
			t.Errorf("the log holds %d admissions, want the key's %d", n, quota)
		}
		for id := range ids {
			as, err := tx.Activity(ledger.ActivityFilter{Key: k.Name, Limit: 100})
			if err != nil {
				return err
			}
			found := false
			for _, a := range as {
				found = found || (a.ID == id && a.State == ledger.Admitted)
			}
			if !found {
				t.Errorf("ticket %d is no admitted attempt of the log", id)
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
