package pacer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/state"
)

// start is where every test clock starts.
var start = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// A testClock is a test's time: the Pacer reads it and runs its timers on
// it, and a timer fires when the test moves the clock past it. Moving it
// also waits for what the timers started in the states opened on it: a
// journal's applier whose linger ran out records its outcomes before the
// test goes on, as it would within milliseconds on real time, so that
// what another process reads next does not depend on the scheduler.
type testClock struct {
	*testkit.Clock
	states *openStates
}

// openStates are the states opened on a testClock.
type openStates struct {
	mu  sync.Mutex
	dbs []*state.DB
}

func newTestClock() testClock {
	return testClock{testkit.NewClock(start), &openStates{}}
}

func (c testClock) advance(d time.Duration) {
	c.Advance(d)
	c.settle()
}

// Set moves the clock to at, as advance does.
func (c testClock) Set(at time.Time) {
	c.Clock.Set(at)
	c.settle()
}

// settle waits until the journal of every state opened on c holds
// nothing its applier was due to record (see state.DB.View).
func (c testClock) settle() {
	c.states.mu.Lock()
	dbs := slices.Clone(c.states.dbs)
	c.states.mu.Unlock()
	for _, db := range dbs {
		db.View(context.Background(), func(ledger.ReadTx) error { return nil }) // a closed one has nothing to settle
	}
}

// opened notes db, opened on c.
func (c testClock) opened(db *state.DB) {
	c.states.mu.Lock()
	defer c.states.mu.Unlock()
	c.states.dbs = append(c.states.dbs, db)
}

// env is one state file with a Pacer, both on a test clock. Every call
// it makes goes through a real SQLite file in t.TempDir().
type env struct {
	t     *testing.T
	path  string
	db    *state.DB
	rerun *testkit.RerunStore // e.p's store: e.db, each Update's function run twice
	p     *pacer.Pacer
	clk   testClock
	on    clock.Clock  // what e.p and every state e opens run on: clk, or nil (a synctest bubble's time)
	n     atomic.Int64 // calls made, for call IDs
}

// newEnv returns an env whose Pacer and state run on its test clock:
// nothing happens in them by real time, and a lease runs out, a journal
// lingers and a check falls due as the test moves the clock.
func newEnv(t *testing.T) *env {
	t.Helper()
	clk := newTestClock()
	return newEnvOn(t, clk, clk)
}

// newBubbleEnv returns an env for a test in a synctest bubble: its Pacer
// and state run on the bubble's time, which moves when every goroutine of
// the bubble waits.
func newBubbleEnv(t *testing.T) *env {
	t.Helper()
	return newEnvOn(t, newTestClock(), nil)
}

func newEnvOn(t *testing.T, clk testClock, on clock.Clock) *env {
	t.Helper()
	e := &env{t: t, path: testkit.StateFile(t, state.Open), clk: clk, on: on}
	e.db, e.p = e.open()
	// e.p runs every transaction twice, as a database that retries one
	// does: no test of the pacer passes on a closure that keeps anything
	// of a run that was rolled back.
	e.rerun = &testkit.RerunStore{Store: e.db}
	e.p = e.pacerOn(e.rerun)
	return e
}

// open opens the env's state file again: another process sharing it,
// on the same clock.
func (e *env) open() (*state.DB, *pacer.Pacer) {
	e.t.Helper()
	db, err := state.Open(context.Background(), e.path, state.WithClock(e.on))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { db.Close() })
	e.clk.opened(db)
	return db, e.pacerOn(db)
}

// pacerOn returns a Pacer on db at the env's clock, with a fixed jitter:
// a lease runs out by the test clock, and no wall-clock timer gives its
// slots back behind the test's back.
func (e *env) pacerOn(db ledger.Store) *pacer.Pacer {
	return pacer.New(db, pacer.WithClock(e.on), pacer.WithJitter(func() float64 { return 0.5 }))
}

// newKey returns a key with the given documented policies, no smoothing
// and generous safety limits, so that each test turns on what it tests.
func newKey(policies ...keystore.Policy) *keystore.Key {
	return &keystore.Key{Name: "k", MaxRate: 1000, MaxConcurrency: 100, LowWater: 0, Policies: policies}
}

func policy(name string, q int64, w time.Duration) keystore.Policy {
	return keystore.Policy{Name: name, Quota: q, Window: w, Unit: ratelimit.Requests}
}

// call is a call of k by caller on GET path, that will not wait.
func (e *env) call(k *keystore.Key, caller, path string) pacer.Call {
	return pacer.Call{Key: k, Caller: caller, Transport: "rest", Method: "GET", Target: path,
		CallID: fmt.Sprintf("call-%d", e.n.Add(1)), Attempt: 1}
}

// admit asks p to admit c at the clock's time, without waiting.
func (e *env) admitWith(p *pacer.Pacer, c pacer.Call) (pacer.Ticket, error) {
	e.t.Helper()
	return p.Admit(context.Background(), c)
}

// mustAdmit admits a call of k by caller on path, failing the test if it
// has to wait.
func (e *env) mustAdmit(k *keystore.Key, caller, path string) pacer.Ticket {
	e.t.Helper()
	t, err := e.admitWith(e.p, e.call(k, caller, path))
	if err != nil {
		e.t.Fatalf("%s: admit %s: got %v, want admitted", e.clk.Now().Sub(start), caller, err)
	}
	return t
}

// mustPause asks for a call of k by caller that must be refused, and
// returns the refusal.
func (e *env) mustPause(k *keystore.Key, caller, path string) *pacer.PauseError {
	e.t.Helper()
	return mustPause(e.t, e.clk, e.p, e.call(k, caller, path))
}

func mustPause(t *testing.T, clk testClock, p *pacer.Pacer, c pacer.Call) *pacer.PauseError {
	t.Helper()
	_, err := p.Admit(context.Background(), c)
	var pe *pacer.PauseError
	if !errors.As(err, &pe) {
		t.Fatalf("%s: admit %s: got %v, want a pause", clk.Now().Sub(start), c.Caller, err)
	}
	return pe
}

// answer reports t's answer, given at the clock's time.
func (e *env) answer(t pacer.Ticket, status int, rd *ratelimit.Reading) pacer.Result {
	e.t.Helper()
	return answerWith(e.t, e.p, e.clk, t, status, rd)
}

func answerWith(t *testing.T, p *pacer.Pacer, clk testClock, tk pacer.Ticket, status int, rd *ratelimit.Reading) pacer.Result {
	t.Helper()
	if rd != nil {
		rd.ReceivedAt = clk.Now()
	}
	res, err := p.Done(context.Background(), tk, pacer.Outcome{SentAt: tk.AdmittedAt, AnsweredAt: clk.Now(), Status: status, Reading: rd})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// send admits a call and answers it at once with status and rd.
func (e *env) send(k *keystore.Key, caller string, status int, rd *ratelimit.Reading) pacer.Result {
	e.t.Helper()
	return e.answer(e.mustAdmit(k, caller, "/items"), status, rd)
}

// reading is an answer's signals: obs, and Retry-After when ra > 0.
func reading(ra time.Duration, obs ...ratelimit.Observation) *ratelimit.Reading {
	return &ratelimit.Reading{Observations: obs, RetryAfter: ra, HasRetryAfter: ra > 0}
}

// shown is an observation of a policy the answer showed in RateLimit (and
// listed in RateLimit-Policy with q and w, when q > 0).
func shown(name string, q int64, w time.Duration, r int64, t time.Duration) ratelimit.Observation {
	return ratelimit.Observation{Policy: name, Unit: ratelimit.Requests, Quota: q, HasQuota: q > 0, Window: w,
		Remaining: r, HasRemaining: true, Reset: t, HasReset: true, Shape: ratelimit.ShapeDraft}
}

// listed is a policy the answer listed in RateLimit-Policy only.
func listed(name string, q int64, w time.Duration) ratelimit.Observation {
	return ratelimit.Observation{Policy: name, Unit: ratelimit.Requests, Quota: q, HasQuota: true, Window: w,
		Shape: ratelimit.ShapeDraft}
}

// activity returns the state file's attempts, oldest first.
func (e *env) activity() []ledger.Attempt {
	e.t.Helper()
	var list []ledger.Attempt
	err := e.db.View(context.Background(), func(tx ledger.ReadTx) error {
		var err error
		list, err = tx.Activity(ledger.ActivityFilter{Limit: 10000})
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	for i, j := 0, len(list)-1; i < j; i, j = i+1, j-1 {
		list[i], list[j] = list[j], list[i]
	}
	return list
}

// status is k's status for caller.
func (e *env) status(k *keystore.Key, caller string) pacer.KeyStatus {
	e.t.Helper()
	st, err := e.p.Status(context.Background(), k, caller)
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

// upstream returns the status's upstream budget of policy, failing the
// test when there is none.
func upstreamBudget(t *testing.T, st pacer.KeyStatus, policy string) pacer.Budget {
	t.Helper()
	for _, b := range st.Upstream {
		if b.Policy == policy {
			return b
		}
	}
	t.Fatalf("status shows no upstream policy %q: %+v", policy, st.Upstream)
	return pacer.Budget{}
}

// openPostgres opens a PostgreSQL state on a database of its own, on a
// throwaway server (see pgtest.Start), with a journal; it is closed when
// the test ends.
func openPostgres(t *testing.T) *state.Postgres {
	t.Helper()
	srv := pgtest.Start(t)
	t.Setenv("PGPASSWORD", srv.Password())
	pg, err := state.OpenPostgres(context.Background(), srv.CreateDatabase(t), state.PostgresOptions{JournalDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	return pg
}
