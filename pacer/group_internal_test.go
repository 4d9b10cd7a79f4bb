package pacer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
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
// in its transaction, once its function has run (has taken the calls it
// decides), until release is closed: the calls that come meanwhile queue
// for the next one. The one after it calls second first, when set; the
// ones after it go to after, when set.
type gatedStore struct {
	ledger.Store
	gateAt  int32
	updates atomic.Int32
	entered chan struct{} // closed once the held Update waits
	release chan struct{}
	second  func()
	after   ledger.Store
}

func (s *gatedStore) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	n := s.updates.Add(1) - s.gateAt
	switch n {
	case 0:
		run, held := fn, false
		fn = func(tx ledger.Tx) error {
			err := run(tx)
			if !held {
				held = true
				close(s.entered)
				<-s.release
			}
			return err
		}
	case 1:
		if s.second != nil {
			s.second()
		}
	}
	if n > 0 && s.after != nil {
		return s.after.Update(ctx, fn, keys...)
	}
	return s.Store.Update(ctx, fn, keys...)
}

// waitQueued returns once n parts of key's transactions wait behind the
// one running, or another transaction started (they did not wait).
func waitQueued(p *Pacer, s *gatedStore, key string, n int) {
	waitQueue(p, key, n, func() bool { return s.updates.Load() == s.gateAt })
}

// waitQueue returns once n calls of key wait for its next transaction, or
// running no longer holds.
func waitQueue(p *Pacer, key string, n int, running func() bool) {
	for queued := 0; queued < n && running(); runtime.Gosched() {
		p.groups.mu.Lock()
		if g := p.groups.groups[key]; g != nil {
			queued = len(g.queue)
		}
		p.groups.mu.Unlock()
	}
}

// Calls of one key that need a transaction while another of the key's
// runs are decided together in the next one, each in turn against what
// the ones before it recorded — on a store that runs their transaction
// twice, with another host spending the key between the runs: only the
// last run's decisions count. Eight calls of a key allowing 10 a minute,
// of which another host takes 5: the first call is admitted alone, the
// seven queued behind it in one transaction, of which four are admitted
// and three refused, and the log holds exactly 10.
func TestAdmitTogether(t *testing.T) {
	onBothStores(t, testAdmitTogether)
}

// clockOf is a test clock at db's time: the server's clock on
// PostgreSQL, as the state records, and this machine's on SQLite.
func clockOf(db ledger.Store) *testkit.Clock {
	if pg, ok := db.(*state.Postgres); ok {
		return testkit.NewClock(pg.Now())
	}
	return testkit.NewClock(time.Now())
}

// keyOf100 is a key k of 100 calls a minute, without a pace or a
// concurrency that would hold its calls back.
func keyOf100() *keystore.Key {
	return &keystore.Key{Name: "k", MaxRate: 1e9, MaxConcurrency: 1 << 20,
		Policies: []keystore.Policy{{Name: "default", Quota: 100, Window: time.Minute, Unit: ratelimit.Requests}}}
}

// syncCall is the sync job's i-th call of k.
func syncCall(k *keystore.Key, i int) Call {
	return Call{Key: k, Caller: "sync", Transport: "rest", Method: "GET", Target: "/items", CallID: fmt.Sprint("call-", i), Attempt: 1}
}

// admitLeading starts c's admission on p and returns once its transaction
// is held at store's gate, so calls admitted from then on queue behind
// it; wait returns c's admission's ticket and error once it has ended.
func admitLeading(ctx context.Context, p *Pacer, store *gatedStore, c Call) (wait func() (Ticket, error)) {
	wait = admitAside(ctx, p, c)
	<-store.entered
	return wait
}

// admitAside starts c's admission on p in a goroutine of its own; wait
// returns its ticket and error once it has ended.
func admitAside(ctx context.Context, p *Pacer, c Call) (wait func() (Ticket, error)) {
	var tk Ticket
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk, err = p.Admit(ctx, c)
	}()
	return func() (Ticket, error) { <-done; return tk, err }
}

// admitMany admits calls first…first+n-1 of k on p, each in a goroutine
// of its own; wait returns their tickets and errors, in order, once all
// have ended.
func admitMany(ctx context.Context, p *Pacer, k *keystore.Key, first, n int) (wait func() ([]Ticket, []error)) {
	tickets, errs := make([]Ticket, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { tickets[i], errs[i] = p.Admit(ctx, syncCall(k, first+i)) })
	}
	return func() ([]Ticket, []error) {
		wg.Wait()
		return tickets, errs
	}
}

// groupEnded checks that key's group ended with its calls.
func groupEnded(t *testing.T, p *Pacer, key string) {
	t.Helper()
	p.groups.mu.Lock()
	defer p.groups.mu.Unlock()
	if g := p.groups.groups[key]; g != nil {
		t.Errorf("the key's group outlives its calls, %d queued", len(g.queue))
	}
}

// onBothStores runs test on a new SQLite file and on a new database of a
// throwaway PostgreSQL server.
func onBothStores(t *testing.T, test func(*testing.T, ledger.Store)) {
	t.Run("store=sqlite", func(t *testing.T) {
		db, err := state.Open(context.Background(), testkit.StateFile(t, state.Open))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		test(t, db)
	})
	t.Run("store=postgres", func(t *testing.T) {
		srv := pgtest.Start(t)
		t.Setenv("PGPASSWORD", srv.Password())
		db, err := state.OpenPostgres(context.Background(), srv.CreateDatabase(t), state.PostgresOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		test(t, db)
	})
}

func testAdmitTogether(t *testing.T, db ledger.Store) {
	ctx := context.Background()
	const calls, quota, others = 8, 10, 5
	k := &keystore.Key{Name: "k", MaxRate: 1e9, MaxConcurrency: 1 << 20,
		Policies: []keystore.Policy{{Name: "default", Quota: quota, Window: time.Minute, Unit: ratelimit.Requests}}}
	rerun := &testkit.RerunStore{Store: db}
	store := &gatedStore{Store: db, gateAt: 1, entered: make(chan struct{}), release: make(chan struct{}), after: rerun}
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
	p := New(store, WithClock(clockOf(db)), WithJitter(func() float64 { return 0.5 }))
	defer p.Close(ctx)

	first := admitLeading(ctx, p, store, syncCall(k, 0))
	rest := admitMany(ctx, p, k, 1, calls-1)
	waitQueued(p, store, k.Name, calls-1) // the others wait behind the first transaction
	close(store.release)
	ticket, firstErr := first()
	tickets, errs := rest()
	tickets, errs = append([]Ticket{ticket}, tickets...), append([]error{firstErr}, errs...)

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
	err := db.View(ctx, func(tx ledger.ReadTx) error {
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

// lostCommitStore commits its lost-th Update and fails it as a database
// that did not answer the COMMIT does: whether it committed is unknown
// to the caller (ledger.ErrUnavailable). With rollback set, it rolls
// that Update back instead and fails it with rollback. The others run as
// they are.
type lostCommitStore struct {
	ledger.Store
	lost     int32
	rollback error
	down     int32 // the Update that fails without running its function, the database not answering; 0: none
	updates  atomic.Int32
}

var errRolledBack = errors.New("rolled back by the test")

func (s *lostCommitStore) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	n := s.updates.Add(1)
	if n == s.down {
		return fmt.Errorf("the database did not answer: %w", ledger.ErrUnavailable)
	}
	if n != s.lost {
		return s.Store.Update(ctx, fn, keys...)
	}
	if run := fn; s.rollback != nil {
		fn = func(tx ledger.Tx) error {
			if err := run(tx); err != nil {
				return err
			}
			return errRolledBack
		}
	}
	err := s.Store.Update(ctx, fn, keys...)
	switch {
	case errors.Is(err, errRolledBack):
		return s.rollback
	case err == nil:
		return fmt.Errorf("the answer to COMMIT was lost: %w", ledger.ErrUnavailable)
	}
	return err
}

// A transaction whose COMMIT's answer is lost (a database that hangs
// past the store's bound and then commits what it was sent) fails every
// call it admitted with the error, though their attempts may be in the
// log: counted in flight, and a probe among them holding its key until
// its lease runs out (two minutes), every call of every process refused
// meanwhile. So the key's next transaction in the process ends each such
// attempt, not sent, when it is there; and the calls queued behind the
// failed transaction start the next one of their own. Here the key's
// circuit is half-open: the first call is its probe, admitted in a
// transaction whose COMMIT's answer is lost; the three calls queued
// behind it are decided together in the next one: the probe's attempt
// ended, one of them is the new probe, the two others refused (they do
// not wait) as they wait for its answer.
func TestAdmitTogetherLostCommit(t *testing.T) {
	onBothStores(t, testAdmitTogetherLostCommit)
}

func testAdmitTogetherLostCommit(t *testing.T, db ledger.Store) {
	ctx := context.Background()
	const queued = 3
	k := keyOf100()
	if err := db.Update(ctx, func(tx ledger.Tx) error {
		return tx.PutKeyState(ledger.KeyState{Key: k.Name, HalfOpen: true}) // the next call is the circuit's probe
	}, k.Name); err != nil {
		t.Fatal(err)
	}
	lost := &lostCommitStore{Store: db, lost: 1}
	store := &gatedStore{Store: lost, gateAt: 1, entered: make(chan struct{}), release: make(chan struct{})}
	p := New(store, WithClock(clockOf(db)), WithJitter(func() float64 { return 0.5 }))
	defer p.Close(ctx)

	first := admitLeading(ctx, p, store, syncCall(k, 0))
	queuedCalls := admitMany(ctx, p, k, 1, queued)
	waitQueued(p, store, k.Name, queued)
	close(store.release)
	_, firstErr := first()
	tickets, errs := queuedCalls()

	if !errors.Is(firstErr, ledger.ErrUnavailable) {
		t.Errorf("the call whose transaction's COMMIT got no answer: %v, want ledger.ErrUnavailable", firstErr)
	}
	if n := store.updates.Load(); n != 2 {
		t.Errorf("%d calls took %d transactions, want 2: the first alone, the queued together", queued+1, n)
	}
	admitted, paused := 0, 0
	for i, err := range errs {
		switch {
		case err == nil:
			admitted++
			if !tickets[i].Probe {
				t.Errorf("call %d admitted, not as the circuit's probe", i+1)
			}
		case errors.Is(err, ErrPaused):
			paused++
		default:
			t.Errorf("call %d: %v", i+1, err)
		}
	}
	if admitted != 1 || paused != queued-1 {
		t.Errorf("of the %d calls queued behind the lost COMMIT, %d admitted and %d paused, want 1 and %d: "+
			"the lost probe's attempt still holds the key", queued, admitted, paused, queued-1)
	}
	groupEnded(t, p, k.Name)
	err := db.View(ctx, func(tx ledger.ReadTx) error {
		as, err := tx.Call(k.Name, "call-0")
		if err != nil {
			return err
		}
		if len(as) != 1 || as[0].State == ledger.Admitted {
			t.Errorf("the lost COMMIT's attempts of call-0: %+v; want one, ended", as)
		}
		ks, err := tx.KeyState(k.Name)
		if err == nil && (ks.ProbeAttempt == 0 || len(as) == 1 && ks.ProbeAttempt == as[0].ID) {
			t.Errorf("the key's probe is attempt %d; want the queued call's, call-0's (%+v) ended", ks.ProbeAttempt, as)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A call queued behind its key's transaction, which hangs (a database
// that does not answer, the store's bound not yet passed), leaves the
// queue when its context ends, and takes no part in what follows; the
// transaction, once it ends, admits its leader, and the next call of the
// key leads a transaction of its own.
func TestAdmitTogetherQueuedLeave(t *testing.T) {
	ctx := context.Background()
	k := keyOf100()
	p, store, db := gatedOnFile(t, testkit.NewClock(time.Now()), nil)

	leader := admitLeading(ctx, p, store, syncCall(k, 0))
	const queued = 3
	qctx, cancel := context.WithCancel(ctx)
	queuedCalls := admitMany(qctx, p, k, 1, queued)
	waitQueued(p, store, k.Name, queued)
	cancel()
	_, errs := queuedCalls() // the transaction still hangs
	for i, err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("queued call %d, its context ended: %v, want context.Canceled", i+1, err)
		}
	}
	p.groups.mu.Lock()
	if g := p.groups.groups[k.Name]; g == nil || len(g.queue) != 0 {
		t.Errorf("the key's group while its transaction runs: %+v, want one with nothing queued", g)
	}
	p.groups.mu.Unlock()
	close(store.release)
	if _, leaderErr := leader(); leaderErr != nil {
		t.Errorf("the leader: %v", leaderErr)
	}
	if _, err := p.Admit(ctx, syncCall(k, queued+1)); err != nil {
		t.Errorf("the next call: %v", err)
	}
	if n := store.updates.Load(); n != 2 {
		t.Errorf("%d transactions, want 2: the leader's, the next call's", n)
	}
	if n := admissionsOf(t, db, k.Name); n != 2 {
		t.Errorf("the log holds %d admissions, want 2: the calls that left the queue are in no transaction", n)
	}
}

// gatedOnFile returns a Pacer on a new state file through a gatedStore
// that holds its first Update, with wrap's store, when set, between the
// two; and the file.
func gatedOnFile(t *testing.T, clk *testkit.Clock, wrap func(ledger.Store) ledger.Store) (*Pacer, *gatedStore, ledger.Store) {
	t.Helper()
	ctx := context.Background()
	db, err := state.Open(ctx, testkit.StateFile(t, state.Open))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var inner ledger.Store = db
	if wrap != nil {
		inner = wrap(db)
	}
	store := &gatedStore{Store: inner, gateAt: 1, entered: make(chan struct{}), release: make(chan struct{})}
	p := New(store, WithClock(clk), WithJitter(func() float64 { return 0.5 }))
	t.Cleanup(func() { p.Close(ctx) })
	return p, store, db
}

// admissionsOf returns how many admissions of key db's log holds.
func admissionsOf(t *testing.T, db ledger.Store, key string) int {
	t.Helper()
	var n int
	err := db.View(context.Background(), func(tx ledger.ReadTx) error {
		var err error
		n, err = tx.Count(key, time.Time{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// noAnswerFirst wraps db in a noAnswerStore.
func noAnswerFirst(db ledger.Store) ledger.Store { return &noAnswerStore{Store: db} }

// noAnswerStore fails its first Update as a database that did not answer
// within the store's bound does (ledger.ErrNoAnswer), its transaction
// rolled back once its function has run.
type noAnswerStore struct {
	ledger.Store
	answered atomic.Bool
}

func (s *noAnswerStore) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	if s.answered.Swap(true) {
		return s.Store.Update(ctx, fn, keys...)
	}
	if err := testkit.FailCommit(ctx, s.Store.Update, fn, keys...); !errors.Is(err, testkit.ErrCommitFailed) {
		return err
	}
	return fmt.Errorf("state: the database did not answer within 1s: %w", ledger.ErrNoAnswer)
}

// The calls queued behind a transaction that waited out the store's bound
// (a database that hangs) fail with its error, each within that one bound,
// rather than lead one more transaction that would wait the bound again
// (three bounds for a call that came behind a hung lease's renewal and a
// hung group on a loaded host, against the one the documentation
// promises). The key's next call, after it, leads a transaction of its own.
func TestAdmitTogetherQueuedFailWithNoAnswer(t *testing.T) {
	ctx := context.Background()
	k := keyOf100()
	p, store, db := gatedOnFile(t, testkit.NewClock(time.Now()), noAnswerFirst)

	leader := admitLeading(ctx, p, store, syncCall(k, 0))
	const queued = 3
	queuedCalls := admitMany(ctx, p, k, 1, queued)
	waitQueued(p, store, k.Name, queued)
	close(store.release)
	_, leaderErr := leader()
	_, errs := queuedCalls()
	if !errors.Is(leaderErr, ledger.ErrNoAnswer) {
		t.Errorf("the leader: %v, want ledger.ErrNoAnswer", leaderErr)
	}
	for i, err := range errs {
		if !errors.Is(err, ledger.ErrNoAnswer) || !errors.Is(err, ledger.ErrUnavailable) {
			t.Errorf("queued call %d: %v, want the hung transaction's error, a ledger.ErrUnavailable", i+1, err)
		}
	}
	if n := store.updates.Load(); n != 1 {
		t.Errorf("%d transactions, want 1: the queued calls waited out the hung one's bound already", n)
	}
	groupEnded(t, p, k.Name)
	nextCallAsks(t, p, store, db, syncCall(k, queued+1))
}

// The calls waiting for their key's spent lease to be renewed, whose
// renewal waited out the store's bound, fail with its error rather than
// each take a transaction of its own that would wait the bound again.
func TestLeaseRenewalWaitersFailWithNoAnswer(t *testing.T) {
	ctx := context.Background()
	k := &keystore.Key{Name: "k", MaxRate: 1e6, MaxConcurrency: 10_000,
		Policies: []keystore.Policy{{Name: "default", Quota: 100_000, Window: time.Minute, Unit: ratelimit.Requests}}}
	clk := testkit.NewClock(time.Now())
	p, store, _ := gatedOnFile(t, clk, noAnswerFirst)
	p.mu.Lock()
	busy := &admissions{} // a pace that leases (see testLeaseGrantLostCommit)
	for range leaseRecent {
		busy.note(clk.Now().Add(time.Hour))
	}
	p.recent[k.Name] = busy
	// A lease every slot of which was handed out: the next call renews it.
	p.leases[k.Name] = &lease{key: k.Name, first: 1, next: 2, last: 1, at: clk.Now(), until: clk.Now().Add(LeaseTime)}
	p.mu.Unlock()

	renewing := admitLeading(ctx, p, store, syncCall(k, 0))
	p.mu.Lock()
	r := p.granting[k.Name]
	p.mu.Unlock()
	if r == nil {
		t.Fatal("no renewal of the key's lease under way (the test's premise)")
	}
	waiting := admitAside(ctx, p, syncCall(k, 1))
	// The second call waits for the renewal (its poll on p's clock).
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := clk.WaitTimer(wctx, 0, Poll); err != nil {
		t.Fatalf("the second call does not wait for the renewal: %v", err)
	}
	close(store.release)
	_, renewErr := renewing()
	_, waitErr := waiting()
	if !errors.Is(renewErr, ledger.ErrNoAnswer) {
		t.Errorf("the renewing call: %v, want ledger.ErrNoAnswer", renewErr)
	}
	if !errors.Is(waitErr, ledger.ErrNoAnswer) {
		t.Errorf("the call waiting for the renewal: %v, want the renewal's error, ledger.ErrNoAnswer", waitErr)
	}
	if n := store.updates.Load(); n != 1 {
		t.Errorf("%d transactions, want 1: the call waiting for the renewal waited out its bound already", n)
	}
}

// On a key with shares, the calls of a principal waiting in its line
// (see waitersHere.line) behind a call whose transaction waited out the
// store's bound fail with its error rather than each ask the state once
// more and wait the bound again; the principal's next call, after them,
// asks the state.
func TestLineFailsWithNoAnswer(t *testing.T) {
	ctx := context.Background()
	k := keyOf100()
	k.Shares = []keystore.Share{{Principal: "*", Share: 0.5}}
	clk := testkit.NewClock(time.Now())
	p, store, db := gatedOnFile(t, clk, noAnswerFirst)
	lined := func(i int) Call {
		c := syncCall(k, i)
		c.MaxWait = time.Minute // long enough to wait in the line
		return c
	}

	first := admitLeading(ctx, p, store, lined(0))
	second := admitAside(ctx, p, lined(1))
	// The second waits in the line (its timer of a minute on p's clock).
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := clk.WaitTimer(wctx, time.Minute-time.Second, time.Minute); err != nil {
		t.Fatalf("the second call does not wait in its principal's line: %v", err)
	}
	close(store.release)
	_, firstErr := first()
	_, secondErr := second()
	if !errors.Is(firstErr, ledger.ErrNoAnswer) {
		t.Errorf("the first call: %v, want ledger.ErrNoAnswer", firstErr)
	}
	if !errors.Is(secondErr, ledger.ErrNoAnswer) || !errors.Is(secondErr, ledger.ErrUnavailable) {
		t.Errorf("the call in the line: %v, want the first's error, a ledger.ErrUnavailable", secondErr)
	}
	if n := store.updates.Load(); n != 1 {
		t.Errorf("%d transactions, want 1: the call in the line waited out the first's bound already", n)
	}
	nextCallAsks(t, p, store, db, lined(2))
}

// nextCallAsks checks that c, the key's next call after one whose
// transaction did not answer (store's first), is admitted in a
// transaction of its own, the only admission of db's log.
func nextCallAsks(t *testing.T, p *Pacer, store *gatedStore, db ledger.Store, c Call) {
	t.Helper()
	if _, err := p.Admit(context.Background(), c); err != nil {
		t.Errorf("the next call: %v", err)
	}
	if n := store.updates.Load(); n != 2 {
		t.Errorf("%d transactions, want 2: the hung one, the next call's", n)
	}
	if n := admissionsOf(t, db, c.Key.Name); n != 1 {
		t.Errorf("the log holds %d admissions, want 1: the next call's", n)
	}
}

// An admission that grants a lease, in a group or renewing a spent one
// outside it, whose COMMIT's answer is lost, fails its call (not sent);
// were its attempt and the new lease's slots left in the log, they would
// count as in flight for two minutes, with no call to answer them and no
// process to hand the slots out. The key's next transaction in the
// process that commits ends the attempt, not sent, and gives the slots
// back: the next admission; the one after, when the next one's database
// does not answer (what is pending stays so); or Close's.
func TestLeaseGrantLostCommit(t *testing.T) {
	onBothStores(t, func(t *testing.T, db ledger.Store) {
		for _, renew := range []bool{false, true} {
			for _, next := range []string{"admission", "admission-after-a-failed-one", "close"} {
				t.Run(fmt.Sprintf("renew=%v/%s", renew, next), func(t *testing.T) {
					testLeaseGrantLostCommit(t, db, fmt.Sprintf("k-%v-%s", renew, next), renew, next)
				})
			}
		}
	})
}

func testLeaseGrantLostCommit(t *testing.T, db ledger.Store, key string, renew bool, next string) {
	ctx := context.Background()
	k := &keystore.Key{Name: key, MaxRate: 1e6, MaxConcurrency: 10_000,
		Policies: []keystore.Policy{{Name: "default", Quota: 100_000, Window: time.Minute, Unit: ratelimit.Requests}}}
	lost := &lostCommitStore{Store: db}
	clk := clockOf(db)
	p := New(lost, WithClock(clk), WithJitter(func() float64 { return 0.5 }))
	defer p.Close(ctx)
	p.mu.Lock()
	// A pace that leases: the key's latest admissions here, all at once,
	// and not before the admission's own time. On PostgreSQL that is the
	// server's clock, which moves in real time: admissions noted at clk's
	// start were 125 ms and more before it on a loaded machine, a pace
	// under what a lease of leaseMin slots needs, and no lease was granted.
	busy := &admissions{}
	for range leaseRecent {
		busy.note(clk.Now().Add(time.Hour))
	}
	p.recent[k.Name] = busy
	if renew { // a lease every slot of which was handed out: the next call renews it
		p.leases[k.Name] = &lease{key: k.Name, first: 1, next: 2, last: 1, at: clk.Now(), until: clk.Now().Add(LeaseTime)}
	}
	p.mu.Unlock()

	lost.lost = lost.updates.Load() + 1
	if _, err := p.Admit(ctx, syncCall(k, 0)); !errors.Is(err, ledger.ErrUnavailable) {
		t.Fatalf("the call whose admission's COMMIT got no answer: %v, want ledger.ErrUnavailable", err)
	}
	if l := p.currentLease(k.Name); l != nil {
		t.Errorf("the lost admission's lease is installed: slots %d…%d", l.first, l.last)
	}
	lostSlots, admitted := logOf(t, db, k.Name, "call-0")
	if lostSlots == 0 || admitted != 1 {
		t.Fatalf("the log after the lost COMMIT holds %d reserved slots and call-0 admitted %d times; "+
			"want a lease granted with the call's admission (the test's premise)", lostSlots, admitted)
	}

	clk.Advance(time.Millisecond) // past the pace the lost lease took for its slots
	if next == "close" {
		if err := p.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if reserved, admitted := logOf(t, db, k.Name, "call-0"); reserved != 0 || admitted != 0 {
			t.Errorf("after Close the log holds %d reserved slots and call-0 admitted %d times; "+
				"want 0 and 0: Close ended the lost admission's attempt and gave its slots back", reserved, admitted)
		}
		return
	}
	if next == "admission-after-a-failed-one" {
		lost.down = lost.updates.Load() + 1
		if _, err := p.Admit(ctx, syncCall(k, 1)); !errors.Is(err, ledger.ErrUnavailable) {
			t.Fatalf("the call whose database did not answer: %v, want ledger.ErrUnavailable", err)
		}
		if reserved, admitted := logOf(t, db, k.Name, "call-0"); reserved != lostSlots || admitted != 1 {
			t.Fatalf("after a transaction the database did not answer the log holds %d reserved slots and call-0 "+
				"admitted %d times; want %d and 1, as the lost COMMIT left them", reserved, admitted, lostSlots)
		}
	}
	if _, err := p.Admit(ctx, syncCall(k, 2)); err != nil { // the key's next transaction that commits
		t.Fatal(err)
	}
	want := 0
	if l := p.currentLease(k.Name); l != nil {
		want = int(l.last - l.first + 1) // the next call's own lease
	}
	if reserved, admitted := logOf(t, db, k.Name, "call-0"); reserved != want || admitted != 0 {
		t.Errorf("after the key's next transaction the log holds %d reserved slots and call-0 admitted %d times; "+
			"want %d (the next call's lease) and 0: the lost admission's attempt ended and its slots given back",
			reserved, admitted, want)
	}
}

// logOf returns how many of key's attempts are reserved slots, and how
// many attempts of call are admitted and open.
func logOf(t *testing.T, db ledger.Store, key, call string) (reserved, admitted int) {
	t.Helper()
	err := db.View(context.Background(), func(tx ledger.ReadTx) error {
		sends, err := tx.Sends(key, time.Time{}, 1<<20)
		if err != nil {
			return err
		}
		for _, s := range sends {
			if s.State == ledger.Reserved {
				reserved++
			}
		}
		as, err := tx.Call(key, call)
		for _, a := range as {
			if a.State == ledger.Admitted {
				admitted++
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return reserved, admitted
}

// A call that renews its key's spent lease gives back the lease's unused
// slots in its admission's transaction, whatever it decides. When that
// transaction does not commit, the slots are still reserved: counted as
// sent, and in flight for the lease's life and two minutes more, with
// nobody to hand them out. So when its COMMIT's answer is lost, whether
// it committed or not, the key's next transaction in the process gives
// them back; and when it fails otherwise (the caller left before the
// COMMIT), the call gives them back in a transaction of its own. Here the
// spent lease has three slots, and the renewal admits its call or holds
// it back (a gate is closed).
func TestSpentLeaseLostCommit(t *testing.T) {
	unknown := fmt.Errorf("the answer to COMMIT was lost: %w", ledger.ErrUnavailable)
	onBothStores(t, func(t *testing.T, db ledger.Store) {
		for _, held := range []bool{false, true} {
			for _, end := range []struct {
				name     string
				rollback error // nil: committed
			}{{"committed-unknown", nil}, {"aborted-unknown", unknown}, {"caller-left", context.Canceled}} {
				t.Run(fmt.Sprintf("held=%v/%s", held, end.name), func(t *testing.T) {
					testSpentLeaseLostCommit(t, db, fmt.Sprintf("k-%v-%s", held, end.name), held, end.rollback)
				})
			}
		}
	})
}

func testSpentLeaseLostCommit(t *testing.T, db ledger.Store, key string, held bool, rollback error) {
	ctx := context.Background()
	k := &keystore.Key{Name: key, MaxRate: 1e6, MaxConcurrency: 10,
		Policies: []keystore.Policy{{Name: "default", Quota: 1000, Window: time.Minute, Unit: ratelimit.Requests}}}
	clk := clockOf(db)
	var first, last int64
	if err := db.Update(ctx, func(tx ledger.Tx) error {
		now := tx.Clock(clk.Now())
		var err error
		if first, last, err = tx.Reserve(k.Name, 3, now, now.Add(time.Hour)); err != nil {
			return err
		}
		if !held {
			return nil
		}
		return tx.PutGate(ledger.Gate{Key: k.Name, Until: now.Add(time.Hour), Source: "backoff", SetAt: now})
	}, k.Name); err != nil {
		t.Fatal(err)
	}
	lost := &lostCommitStore{Store: db, rollback: rollback}
	p := New(lost, WithClock(clk), WithJitter(func() float64 { return 0.5 }))
	defer p.Close(ctx)
	p.mu.Lock() // the lease ran out with its three slots unused: the next call renews it
	p.leases[k.Name] = &lease{key: k.Name, first: first, next: first, last: last, at: clk.Now(), until: clk.Now()}
	p.mu.Unlock()
	clk.Advance(time.Millisecond)

	lost.lost = lost.updates.Load() + 1
	if _, err := p.Admit(ctx, syncCall(k, 0)); err == nil || errors.Is(err, ErrPaused) {
		t.Fatalf("the renewal whose transaction did not commit, or said nothing: %v, want its failure", err)
	}
	if _, err := p.Admit(ctx, syncCall(k, 1)); err != nil && !errors.Is(err, ErrPaused) { // the key's next transaction
		t.Fatal(err)
	}
	if n := reservedIn(t, db, k.Name, first, last); n != 0 {
		t.Errorf("after the key's next transaction %d of the spent lease's 3 slots are still reserved, want 0: given back", n)
	}
}

// reservedIn returns how many of key's attempts first…last are reserved
// slots.
func reservedIn(t *testing.T, db ledger.Store, key string, first, last int64) (n int) {
	t.Helper()
	err := db.View(context.Background(), func(tx ledger.ReadTx) error {
		sends, err := tx.Sends(key, time.Time{}, 1<<20)
		for _, s := range sends {
			if s.State == ledger.Reserved && s.ID >= first && s.ID <= last {
				n++
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A lease given back in a transaction of its own (it ran out, or an
// answer ended it after its record committed) whose database does not
// answer is not left reserved for the sweep: its key's next transaction
// in the process gives the slots back.
func TestGiveBackUnanswered(t *testing.T) {
	onBothStores(t, func(t *testing.T, db ledger.Store) {
		ctx := context.Background()
		clk := clockOf(db)
		var first, last int64
		if err := db.Update(ctx, func(tx ledger.Tx) error {
			now := tx.Clock(clk.Now())
			var err error
			first, last, err = tx.Reserve("k", 3, now, now.Add(time.Hour))
			return err
		}, "k"); err != nil {
			t.Fatal(err)
		}
		lost := &lostCommitStore{Store: db}
		p := New(lost, WithClock(clk))
		defer p.Close(ctx)
		l := &lease{key: "k", first: first, next: first + 1, last: last, at: clk.Now(), until: clk.Now().Add(LeaseTime)}

		lost.down = lost.updates.Load() + 1
		p.giveBack(l)
		if n := reservedIn(t, db, "k", first, last); n != 3 {
			t.Fatalf("%d of the lease's 3 slots reserved after a give-back the database did not answer, want 3", n)
		}
		if err := p.update(ctx, func(ledger.Tx) error { return nil }, "k"); err != nil { // the key's next transaction
			t.Fatal(err)
		}
		if n := reservedIn(t, db, "k", first, last); n != 1 {
			t.Errorf("%d of the lease's 3 slots reserved after the key's next transaction, want 1: the one handed out", n)
		}
	})
}

// heldKeysStore notes the keys each Update holds.
type heldKeysStore struct {
	ledger.Store
	mu   sync.Mutex
	held [][]string
}

func (s *heldKeysStore) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	s.mu.Lock()
	s.held = append(s.held, keys)
	s.mu.Unlock()
	return s.Store.Update(ctx, fn, keys...)
}

// Close gives back the slots of the leases it holds in a transaction that
// holds their keys, as any that gives slots back must: another host
// holding the key's row could otherwise be recording after them while
// they are deleted from the log's end.
func TestCloseHoldsLeaseKeys(t *testing.T) {
	ctx := context.Background()
	db, err := state.Open(ctx, testkit.StateFile(t, state.Open))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	clk := clockOf(db)
	var first, last int64
	if err := db.Update(ctx, func(tx ledger.Tx) error {
		first, last, err = tx.Reserve("k", 3, clk.Now(), clk.Now().Add(time.Hour))
		return err
	}, "k"); err != nil {
		t.Fatal(err)
	}
	s := &heldKeysStore{Store: db}
	p := New(s, WithClock(clk))
	p.mu.Lock()
	p.leases["k"] = &lease{key: "k", first: first, next: first, last: last, at: clk.Now(), until: clk.Now().Add(time.Hour)}
	p.mu.Unlock()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if len(s.held) != 1 || !slices.Equal(s.held[0], []string{"k"}) {
		t.Errorf("Close's transactions held %q, want one holding [k]", s.held)
	}
	if n := reservedIn(t, db, "k", first, last); n != 0 {
		t.Errorf("%d of the lease's 3 slots still reserved after Close, want 0", n)
	}
}

// A call that queues while its key's transaction of several calls waits
// for the key is decided in that transaction, not the next: the first
// call is admitted alone, two queue behind it and run together, and a
// fourth, queued while theirs waits for the key, joins them — two
// transactions for the four, each call admitted once.
func TestAdmitTogetherTakesCallsQueuedMeanwhile(t *testing.T) {
	onBothStores(t, testAdmitTogetherTakesCallsQueuedMeanwhile)
}

func testAdmitTogetherTakesCallsQueuedMeanwhile(t *testing.T, db ledger.Store) {
	ctx := context.Background()
	k := keyOf100()
	store := &gatedStore{Store: db, gateAt: 1, entered: make(chan struct{}), release: make(chan struct{})}
	p := New(store, WithClock(clockOf(db)), WithJitter(func() float64 { return 0.5 }))
	defer p.Close(ctx)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	ids := make([]int64, 4)
	admit := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var tk Ticket
			tk, errs[i] = p.Admit(ctx, syncCall(k, i))
			ids[i] = tk.ID
		}()
	}
	// The fourth call comes while the second transaction (the second and
	// third calls) waits for the key: before the store runs it.
	store.second = func() {
		admit(3)
		waitQueue(p, k.Name, 1, func() bool { return true })
	}
	admit(0)
	<-store.entered
	admit(1)
	admit(2)
	waitQueued(p, store, k.Name, 2)
	close(store.release)
	wg.Wait()
	if n := store.updates.Load(); n != 2 {
		t.Errorf("4 calls took %d transactions, want 2: the first alone, the others together", n)
	}
	seen := map[int64]bool{}
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		} else if seen[ids[i]] {
			t.Errorf("call %d admitted as attempt %d, which another call was admitted as too", i, ids[i])
		}
		seen[ids[i]] = true
	}
}

// keyWaitStore holds its first Update before its transaction starts, as
// a transaction waiting for its key's lock that another host holds,
// until release is closed or the Update's context ends.
type keyWaitStore struct {
	ledger.Store
	updates atomic.Int32
	entered chan struct{} // closed once the first Update waits
	release chan struct{}
}

func (s *keyWaitStore) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	if s.updates.Add(1) == 1 {
		close(s.entered)
		select {
		case <-s.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.Store.Update(ctx, fn, keys...)
}

// A call alone in its key's transaction takes the calls that queued while
// the transaction waited for the key: three calls, one transaction. When
// its own caller leaves while it waits, the wait ends for it alone: the
// calls queued go on in a transaction of their own.
func TestAdmitTogetherLoneLeader(t *testing.T) {
	onBothStores(t, func(t *testing.T, db ledger.Store) {
		for _, leaves := range []bool{false, true} {
			t.Run(fmt.Sprintf("leaves=%v", leaves), func(t *testing.T) {
				testAdmitTogetherLoneLeader(t, db, leaves)
			})
		}
	})
}

func testAdmitTogetherLoneLeader(t *testing.T, db ledger.Store, leaves bool) {
	ctx := context.Background()
	k := &keystore.Key{Name: fmt.Sprintf("k-%v", leaves), MaxRate: 1e9, MaxConcurrency: 1 << 20,
		Policies: []keystore.Policy{{Name: "default", Quota: 100, Window: time.Minute, Unit: ratelimit.Requests}}}
	store := &keyWaitStore{Store: db, entered: make(chan struct{}), release: make(chan struct{})}
	p := New(store, WithClock(clockOf(db)), WithJitter(func() float64 { return 0.5 }))
	defer p.Close(ctx)

	lctx, leave := context.WithCancel(ctx)
	defer leave()
	leading := admitAside(lctx, p, syncCall(k, 0))
	<-store.entered
	const queued = 2
	queuedCalls := admitMany(ctx, p, k, 1, queued)
	waitQueue(p, k.Name, queued, func() bool { return true })
	if leaves {
		leave()
		leading()
	}
	close(store.release)
	leader, leaderErr := leading()
	tickets, errs := queuedCalls()

	want := int32(1)
	if leaves {
		want = 2
		if !errors.Is(leaderErr, context.Canceled) {
			t.Errorf("the leader that left: %v, want context.Canceled", leaderErr)
		}
	} else if leaderErr != nil || leader.ID == 0 {
		t.Errorf("the leader: %+v, %v; want admitted", leader, leaderErr)
	}
	if n := store.updates.Load(); n != want {
		t.Errorf("%d transactions, want %d", n, want)
	}
	seen := map[int64]bool{leader.ID: !leaves}
	for i, err := range errs {
		if err != nil || seen[tickets[i].ID] {
			t.Errorf("queued call %d: %+v, %v; want admitted, as an attempt of its own", i+1, tickets[i], err)
		}
		seen[tickets[i].ID] = true
	}
}
