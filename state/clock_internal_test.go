package state

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// start is where the clocks of these tests start.
var start = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// A timerClock is a test's clock that tells the test of each timer set
// on it, with its duration, once the timer waits on the clock.
type timerClock struct {
	*testkit.Clock
	timers chan time.Duration
}

func newTimerClock() *timerClock {
	return &timerClock{Clock: testkit.NewClock(start), timers: make(chan time.Duration, 100)}
}

func (c *timerClock) NewTimer(d time.Duration) (clock.Timer, <-chan time.Time) {
	t, fired := c.Clock.NewTimer(d)
	c.timers <- d
	return t, fired
}

// hangs bounds how long a test waits for what the clock's move sets off:
// far longer than it takes, so that a test that fails does not hang.
const hangs = time.Minute

// next returns the duration of the next timer set on c. It fails t when
// the journal j (if not nil) applies an outcome or fails meanwhile: the
// clock has not moved, so nothing of the journal should have happened.
func (c *timerClock) next(t *testing.T, j *journal) time.Duration {
	t.Helper()
	var progress chan struct{}
	if j != nil {
		j.mu.Lock()
		progress = j.progress
		j.mu.Unlock()
	}
	select {
	case d := <-c.timers:
		return d
	case <-progress:
		t.Fatal("the journal moved on before any timer of it was set on its clock")
	case <-time.After(hangs):
		t.Fatalf("no timer was set on the clock within %v", hangs)
	}
	return 0
}

// openOn opens a state file in a test's directory, on clk.
func openOn(t *testing.T, clk clock.Clock) *DB {
	t.Helper()
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "state.db"), WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// A journaled is a back end with a journal, as a test sees it.
type journaled struct {
	store   ledger.Store
	out     *outcomes
	stateOf func(t *testing.T, id int64) ledger.State // read from the database, without waiting for the journal
}

// sqliteOn opens a state file in a test's directory, on clk.
func sqliteOn(t *testing.T, clk clock.Clock) journaled { return sqliteJournal(openOn(t, clk)) }

// sqliteJournal is db as a back end with a journal.
func sqliteJournal(db *DB) journaled {
	return journaled{db, &db.out, func(t *testing.T, id int64) ledger.State {
		t.Helper()
		var st ledger.State
		if err := db.r.QueryRow("SELECT state FROM attempts WHERE id = ?", id).Scan(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}}
}

// postgresOn opens a new PostgreSQL database with a journal, on clk.
func postgresOn(t *testing.T, clk clock.Clock) journaled {
	srv := pgtest.Start(t)
	t.Setenv("PGPASSWORD", srv.Password())
	pg, err := OpenPostgres(context.Background(), srv.CreateDatabase(t), PostgresOptions{Clock: clk, JournalDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	return journaled{pg, &pg.out, func(t *testing.T, id int64) ledger.State {
		t.Helper()
		var st ledger.State
		if err := pg.db.QueryRow("SELECT state FROM attempts WHERE id = $1", id).Scan(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}}
}

// admitted records an attempt admitted alone, in flight, and returns
// its end, confirmed, for the journal.
func (b journaled) admitted(t *testing.T) ledger.Finished {
	t.Helper()
	a := ledger.Attempt{CallID: "call-1", Attempt: 1, Key: "k", Caller: "sync", Transport: "rest", Method: "GET", Target: "/items",
		State: ledger.Admitted, At: start, InFlightUntil: start.Add(time.Hour)}
	err := b.store.Update(context.Background(), func(tx ledger.Tx) error {
		var err error
		a.ID, err = tx.InsertAttempt(a)
		return err
	}, a.Key)
	if err != nil {
		t.Fatal(err)
	}
	a.State, a.Status, a.SentAt, a.AnsweredAt = ledger.Confirmed, 200, start, start.Add(time.Millisecond)
	return ledger.Finished{Attempt: a}
}

// awaitApplied waits until j has applied n outcomes.
func awaitApplied(t *testing.T, j *journal, n uint64) {
	t.Helper()
	guard := time.After(hangs)
	for {
		j.mu.Lock()
		applied, progress := j.applied, j.progress
		j.mu.Unlock()
		if applied >= n {
			return
		}
		select {
		case <-progress:
		case <-guard:
			t.Fatalf("the journal applied %d outcomes within %v, want %d", applied, hangs, n)
		}
	}
}

// holdWriteLock takes the file's write lock from another connection, as
// another process's writer would, until the returned function is called.
func holdWriteLock(t *testing.T, db *DB) (release func()) {
	t.Helper()
	raw, err := sql.Open("sqlite", db.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	conn, err := raw.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	return func() {
		if _, err := conn.ExecContext(context.Background(), "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
	}
}

// The journal's applier waits journalLinger on the store's clock after
// an outcome comes, and applies it once that clock has moved so far: not
// before, and without waiting for real time. On both back ends.
func TestJournalLingersOnItsClock(t *testing.T) {
	for _, b := range []struct {
		name string
		open func(*testing.T, clock.Clock) journaled
	}{{"sqlite", sqliteOn}, {"postgres", postgresOn}} {
		t.Run("store="+b.name, func(t *testing.T) {
			clk := newTimerClock()
			s := b.open(t, clk)
			f := s.admitted(t)
			if err := s.out.finishLater(context.Background(), f); err != nil {
				t.Fatal(err)
			}
			j := s.out.jr.Load()
			if d := clk.next(t, j); d != journalLinger {
				t.Fatalf("the applier set a timer of %v, want its linger, %v", d, journalLinger)
			}
			clk.Advance(journalLinger - time.Microsecond)
			if n := clk.Timers(); n != 1 {
				t.Fatalf("%d timers wait on the clock a microsecond before the linger ends, want the linger's", n)
			}
			if st := s.stateOf(t, f.Attempt.ID); st != ledger.Admitted {
				t.Fatalf("the attempt is %s before the linger ended, want still %s", st, ledger.Admitted)
			}
			clk.Advance(time.Microsecond)
			awaitApplied(t, j, 1)
			if st := s.stateOf(t, f.Attempt.ID); st != ledger.Confirmed {
				t.Errorf("the attempt is %s once the linger ended, want %s", st, ledger.Confirmed)
			}
		})
	}
}

// While another process holds the file's write lock, the journal's
// applier tries for BusyTimeout (real time, see begin: here the same
// test's clock stands in for it), then backs off on the DB's clock, and
// applies the outcome at its next try once the lock is free.
func TestJournalRetriesOnItsClock(t *testing.T) {
	clk := newTimerClock()
	db := openOn(t, clk)
	db.lockWait = clk
	s := sqliteJournal(db)
	f := s.admitted(t)
	release := holdWriteLock(t, db)
	if err := db.FinishLater(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	j := db.out.jr.Load()
	if d := clk.next(t, j); d != journalLinger {
		t.Fatalf("the applier set a timer of %v, want its linger, %v", d, journalLinger)
	}
	clk.Advance(journalLinger)
	// The applier's transaction waits for the lock, a try at a time: each
	// second of the clock lets the next try go.
	const backoff = 10 * time.Millisecond // the applier's first
	began := clk.Now()
	for d := clk.next(t, nil); d != backoff; d = clk.next(t, nil) {
		if d > 2*time.Millisecond {
			t.Fatalf("a wait of %v for the lock, want at most 2ms between tries", d)
		}
		clk.Advance(time.Second)
	}
	if waited := clk.Now().Sub(began); waited <= BusyTimeout || waited > BusyTimeout+time.Second {
		t.Errorf("the applier gave up after %v of the clock, want just over BusyTimeout (%v)", waited, BusyTimeout)
	}
	j.mu.Lock()
	failing, applied := j.failing, j.applied
	j.mu.Unlock()
	if !failing || applied != 0 {
		t.Fatalf("backing off: failing %v with %d applied, want failing with none", failing, applied)
	}

	release()
	clk.Advance(backoff - time.Microsecond)
	if n := clk.Timers(); n != 1 {
		t.Fatalf("%d timers wait on the clock a microsecond before the backoff ends, want the backoff's", n)
	}
	clk.Advance(time.Microsecond)
	awaitApplied(t, j, 1)
	if st := s.stateOf(t, f.Attempt.ID); st != ledger.Confirmed {
		t.Errorf("the attempt is %s once the lock was free, want %s", st, ledger.Confirmed)
	}
}

// A realTimers is real time that tells a test of each timer set on it,
// with its duration.
type realTimers struct {
	clock.Clock
	timers chan time.Duration
}

func newRealTimers() *realTimers {
	return &realTimers{Clock: clock.Real, timers: make(chan time.Duration, 100)}
}

func (c *realTimers) NewTimer(d time.Duration) (clock.Timer, <-chan time.Time) {
	c.timers <- d
	return c.Clock.NewTimer(d)
}

// Update waits out another process's write lock on real time, not on the
// DB's clock: it looks at the lock again at most 2ms apart, and fails
// with ErrBusy once BusyTimeout has gone by since its first try. Here a
// test's clock stands in for real time (the DB's lockWait), and the DB's
// own clock, which nobody moves, has no timer set on it.
func TestUpdateWaitsForTheLockInRealTime(t *testing.T) {
	dbClock, clk := newTimerClock(), newTimerClock()
	db := openOn(t, dbClock)
	db.lockWait = clk
	defer holdWriteLock(t, db)()
	done := make(chan error, 1)
	go func() { done <- db.Update(context.Background(), func(ledger.Tx) error { return nil }) }()
	var err error
	for waiting := true; waiting; {
		select {
		case d := <-clk.timers:
			if d > 2*time.Millisecond {
				t.Fatalf("a wait of %v for the lock, want at most 2ms between tries", d)
			}
			clk.Advance(time.Second)
		case d := <-dbClock.timers:
			t.Fatalf("Update set a timer of %v on the DB's clock, which nobody moves, to wait for the lock: want real time", d)
		case err = <-done:
			waiting = false
		case <-time.After(hangs):
			t.Fatalf("Update neither set a timer for the lock nor returned within %v", hangs)
		}
	}
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("Update while another process holds the lock: %v, want ErrBusy", err)
	}
	if waited := clk.Now().Sub(start); waited <= BusyTimeout || waited > BusyTimeout+time.Second {
		t.Errorf("Update gave up after %v, want just over BusyTimeout (%v)", waited, BusyTimeout)
	}
}

// On a clock that nobody moves (a test's, about something else), Update
// still takes the write lock once another process lets go of it: it looks
// again on real time.
func TestUpdateOnAStoppedClockTakesTheFreedLock(t *testing.T) {
	dbClock, wall := newTimerClock(), newRealTimers()
	db := openOn(t, dbClock)
	db.lockWait = wall
	release := holdWriteLock(t, db)
	done := make(chan error, 1)
	go func() { done <- db.Update(context.Background(), func(ledger.Tx) error { return nil }) }()
	select {
	case <-wall.timers: // Update found the file locked, and waits
	case d := <-dbClock.timers:
		t.Fatalf("Update set a timer of %v on the DB's clock, which nobody moves, to wait for the lock: want real time", d)
	case err := <-done:
		t.Fatalf("Update returned %v while another process held the lock", err)
	case <-time.After(hangs):
		t.Fatalf("Update neither waited for the lock nor returned within %v", hangs)
	}
	release()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Update once the lock was free: %v, want it committed", err)
		}
	case <-time.After(hangs):
		t.Fatalf("Update did not take the freed lock within %v with its clock standing still", hangs)
	}
}

// Check dates the quick_check that passed by the DB's clock, and trusts
// it until that clock has gone checkEvery past it.
func TestCheckDatedByItsClock(t *testing.T) {
	clk := testkit.NewClock(start)
	db := openOn(t, clk)
	checked := func() time.Time {
		db.wh.mu.Lock()
		defer db.wh.mu.Unlock()
		return db.wh.checked
	}
	for _, step := range []struct {
		advance time.Duration
		want    time.Time
	}{
		{0, start},
		{checkEvery - time.Second, start}, // stands still
		{time.Second, start.Add(checkEvery)},
	} {
		clk.Advance(step.advance)
		if err := db.Check(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := checked(); !got.Equal(step.want) {
			t.Errorf("at %v on the clock, the last quick_check that passed is dated %v, want %v",
				clk.Now().Sub(start), got, step.want)
		}
	}
}
