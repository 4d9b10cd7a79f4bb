// Package conformance is the one suite every back end of the state must
// pass: every behaviour the pacer and the other consumers rely on
// (pacer/ledger's Store and Tx, and state.Store's upkeep), including
// several processes sharing one store and a process killed in the middle
// of its work. It goes through the interfaces only, so that it runs
// unchanged against SQLite and PostgreSQL, as litestream's
// RunWithReplicaClient runs one set of tests against each replica client.
//
// A back end's test runs it:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Backend{Name: "SQLite", New: …, JournalDir: …})
//	}
//
// and its test binary's TestMain calls RunHelper first, so that the
// binary can serve as the helper processes of the multi-process tests.
// What a back end alone does (SQLite's checkpoints and file permissions,
// PostgreSQL's per-key locks and its server going away) is tested beside
// it, not here.
package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// A Backend is a way of keeping the state, as the suite needs it: where a
// new, empty store is, and how every process opens it. A store is opened
// with state.OpenStore, in the test's process and in helper processes
// alike; a helper inherits the test's environment (PGPASSWORD, set with
// t.Setenv). New and JournalDir are required: the zero Backend is none.
// A Backend is a value; the suite calls its functions from one goroutine
// at a time.
type Backend struct {
	// Name names the back end in messages.
	Name string
	// New makes a new, empty store for t and returns its location: a
	// SQLite file's path, a PostgreSQL database's URL. It lasts at least
	// as long as t.
	New func(t *testing.T) string
	// JournalDir returns where the processes sharing the store at
	// location keep their journals (see ledger.Store.FinishLater): for
	// SQLite the directory state.Open derives from the file's path, for
	// PostgreSQL the PostgresOptions.JournalDir every process on one host
	// is given.
	JournalDir func(location string) string
	// ServerClock says Tx.Clock is the back end's own clock (PostgreSQL's
	// server), read once per transaction, rather than the process's
	// clock as given (SQLite).
	ServerClock bool
	// Sequential runs the behaviours one at a time, for a back end whose
	// stores at different locations share something. By default they run
	// in parallel (t.Parallel), each on a store of its own.
	Sequential bool
}

// Open opens the store at location, as another process would, and closes
// it when t ends. Every Update of the store it returns runs its function
// twice, the first run rolled back (testkit.Rerun), as a back end that
// retries a transaction does: each behaviour holds with functions that
// run more than once, and a run that was rolled back leaves nothing.
func (b Backend) Open(t testing.TB, location string) state.Store {
	t.Helper()
	s, err := state.OpenStore(context.Background(), location, b.options(location))
	if err != nil {
		t.Fatalf("%s: open %s: %v", b.Name, location, err)
	}
	t.Cleanup(func() { s.Close() })
	return &rerunning{Store: s}
}

// rerunning is a store whose every Update runs its function twice.
type rerunning struct {
	state.Store
	rerun testkit.Rerun
}

func (s *rerunning) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	return s.rerun.Update(ctx, s.Store.Update, fn, keys...)
}

// DefersOutcomes answers as the wrapped store does, so a pacer on it takes
// the quick path it would take on the store itself.
func (s *rerunning) DefersOutcomes() bool {
	d, ok := s.Store.(interface{ DefersOutcomes() bool })
	return ok && d.DefersOutcomes()
}

// backend returns the back end's own store behind s.
func backend(s state.Store) state.Store {
	if r, ok := s.(*rerunning); ok {
		return r.Store
	}
	return s
}

// options are what every process opens location with.
func (b Backend) options(location string) state.PostgresOptions {
	return state.PostgresOptions{JournalDir: b.JournalDir(location), Timeout: storeTimeout}
}

// storeTimeout bounds each transaction of the suite's stores (see
// PostgresOptions.Timeout): the behaviours queue dozens of transactions
// on one key, each run twice, on a machine that may be loaded; the suite
// judges what the store does, not how fast.
const storeTimeout = 30 * time.Second

// fresh opens a new, empty store, and returns its location too.
func (b Backend) fresh(t *testing.T) (state.Store, string) {
	t.Helper()
	loc := b.New(t)
	return b.Open(t, loc), loc
}

// A behaviour is one subtest of the suite: its name says what the state
// does.
type behaviour struct {
	name string
	test func(t *testing.T, b Backend)
}

// behaviours lists the suite, by the file each group is in.
func behaviours() [][]behaviour {
	return [][]behaviour{transactions, logs, leases, journals, history, signals, kept, processes, bounds, fair, reasons}
}

// Run runs every behaviour of the suite against b, each in a subtest of
// its own with a new, empty store, in parallel unless b.Sequential. The
// subtests end after Run returns, with t: what must happen after all of
// them goes in t.Cleanup.
func Run(t *testing.T, b Backend) {
	for _, group := range behaviours() {
		for _, c := range group {
			t.Run(c.name, func(t *testing.T) {
				if !b.Sequential {
					t.Parallel()
				}
				c.test(t, b)
			})
		}
	}
}

// t0 is the instant the suite's histories start at.
var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// update runs fn in an Update of s holding keys, failing t on an error.
func update(t testing.TB, s ledger.Store, fn func(ledger.Tx) error, keys ...string) {
	t.Helper()
	if err := s.Update(context.Background(), fn, keys...); err != nil {
		t.Fatal(err)
	}
}

// view runs fn in a View of s, failing t on an error.
func view(t testing.TB, s ledger.Viewer, fn func(ledger.ReadTx) error) {
	t.Helper()
	if err := s.View(context.Background(), fn); err != nil {
		t.Fatal(err)
	}
}

// sweep runs s's Sweep, failing t on an error.
func sweep(t testing.TB, s state.Store, now, before time.Time) state.Swept {
	t.Helper()
	n, err := s.Sweep(context.Background(), now, before)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// admission is an admitted attempt of key by caller at at.
func admission(key, caller string, at time.Time) ledger.Attempt {
	return ledger.Attempt{CallID: "c", Attempt: 1, Key: key, Caller: caller, State: ledger.Admitted, At: at}
}

// insert records a in tx, failing t on an error, and returns its ID.
func insert(t testing.TB, tx ledger.Tx, a ledger.Attempt) int64 {
	t.Helper()
	id, err := tx.InsertAttempt(a)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// insertNumbered inserts list as attempts 1, 2, … of call "c", of key
// "k" where an attempt names none.
func insertNumbered(t testing.TB, tx ledger.Tx, list []ledger.Attempt) {
	t.Helper()
	for i, a := range list {
		a.CallID, a.Attempt = "c", i+1
		if a.Key == "" {
			a.Key = "k"
		}
		insert(t, tx, a)
	}
}

// ids returns the IDs of list, in order.
func ids(list []ledger.Attempt) []int64 {
	out := make([]int64, len(list))
	for i, a := range list {
		out[i] = a.ID
	}
	return out
}

// sends returns every admission of key in s, oldest first.
func sends(t testing.TB, s ledger.Viewer, key string) []ledger.Send {
	t.Helper()
	var out []ledger.Send
	view(t, s, func(tx ledger.ReadTx) error {
		var err error
		out, err = tx.Sends(key, time.Time{}, 1<<30)
		return err
	})
	return out
}

// txTime returns the instant a transaction of s takes place at now (see
// ledger.Tx.Clock): the clock admissions are recorded by.
func txTime(t testing.TB, s ledger.Viewer) time.Time {
	t.Helper()
	var now time.Time
	view(t, s, func(tx ledger.ReadTx) error {
		now = tx.Clock(time.Now())
		return nil
	})
	return now
}

// own is the back end's own transaction behind tx, for what only tests
// read (the latest observations of a key), which ledger.Tx does not
// offer: both back ends hand their functions a *state.Tx.
func own(tx ledger.Reader) *state.Tx {
	return tx.(*state.Tx)
}

// signal closes c unless it is closed already: a transaction's function
// that signals from inside may run twice.
func signal(c chan struct{}) {
	select {
	case <-c:
	default:
		close(c)
	}
}
