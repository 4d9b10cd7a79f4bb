package state

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// maxBatch bounds how many Update calls share one transaction: other
// processes wait for the file's write lock while it runs them all.
const maxBatch = 16

// A write is one Update call waiting for, or running in, a transaction.
type write struct {
	ctx       context.Context
	fn        func(*Tx) error
	busySince time.Time // when it first found the file locked by another process
	taken     bool      // under DB.mu: out of the queue; its outcome comes through done
	err       error
	done      chan struct{} // closed once err is final

	panicked   bool // fn panicked with panicValue
	panicValue any
}

func (w *write) finish(err error) {
	w.err = err
	close(w.done)
}

// outcome returns w's error, or raises again the panic of its function.
func (w *write) outcome() error {
	if w.panicked {
		panic(w.panicValue)
	}
	return w.err
}

// Update runs fn in a write transaction (BEGIN IMMEDIATE: it holds the
// file's write lock from its first statement, so a decision read inside it
// cannot be invalidated by another process) and returns once that
// transaction has committed, or fn's error once what fn wrote is rolled
// back. Keep fn short: every process's writers wait for it.
//
// Calls made at the same time in one process share a transaction and its
// commit (group commit): their functions run one after another, each in
// its own savepoint, so each sees what the ones before it wrote, and a
// function's error (or panic, which reaches its own caller) rolls back
// only what it wrote. If the commit fails, it fails every call that shared
// it; none returns before its writes are committed.
//
// While another process writes, Update retries every few hundred
// microseconds, for at most BusyTimeout or until ctx ends: in real time,
// whatever the DB's clock (see begin). Once fn has started it runs to its end: ctx
// bounds the wait for the transaction, not fn's statements.
//
// Every write transaction on the file holds every key: keys says nothing
// more to it.
func (db *DB) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	return db.update(ctx, func(tx *Tx) error { return fn(tx) })
}

// update is Update with the back end's own Tx.
func (db *DB) update(ctx context.Context, fn func(*Tx) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("state: begin: %w", err)
	}
	w := &write{ctx: ctx, fn: fn, done: make(chan struct{})}
	db.mu.Lock()
	db.queue = append(db.queue, w)
	lead := !db.writing
	db.writing = true
	db.mu.Unlock()
	if lead {
		// No transaction is running: this call runs one itself, without
		// a hand-over to another goroutine.
		db.lead(w)
		return w.outcome()
	}
	select {
	case <-w.done:
		return w.outcome()
	case <-ctx.Done():
	}
	db.mu.Lock()
	if !w.taken {
		db.remove(w)
		db.mu.Unlock()
		return fmt.Errorf("state: begin: %w", ctx.Err())
	}
	db.mu.Unlock()
	<-w.done
	return w.outcome()
}

// remove takes w out of the queue. db.mu is held.
func (db *DB) remove(w *write) {
	db.queue = slices.DeleteFunc(db.queue, func(x *write) bool { return x == w })
}

// lead runs transactions for the queue until w has its outcome, then
// leaves what is left of the queue to another goroutine.
func (db *DB) lead(w *write) {
	defer db.handOver()
	for {
		db.batch(w.ctx.Done(), w.done)
		select {
		case <-w.done:
			return
		default:
		}
	}
}

// handOver ends a turn at running transactions: while writes are queued,
// a new goroutine runs the next one.
func (db *DB) handOver() {
	db.mu.Lock()
	defer db.mu.Unlock()
	if len(db.queue) == 0 {
		db.writing = false
		return
	}
	go func() {
		defer db.handOver()
		db.batch(nil, nil)
	}()
}

// batch runs one transaction: it begins it (waiting out other processes'
// writers), takes up to maxBatch writes from the queue, runs them, commits
// and reports each outcome. While it waits, a receive from wake makes it
// look at the queue at once, and a closed stop ends it.
func (db *DB) batch(wake, stop <-chan struct{}) {
	if err := db.damaged(); err != nil {
		db.failQueue(err)
		return
	}
	db.watch()
	if err := db.relieve(); err != nil {
		db.failQueue(fmt.Errorf("state: begin: %w", err))
		return
	}
	if !db.begin(wake, stop) {
		return
	}
	db.mu.Lock()
	n := min(len(db.queue), maxBatch)
	if n == 0 {
		// The writes queued when this turn began have gone: their callers
		// stopped waiting and took them out (see update) while it began.
		db.mu.Unlock()
		db.control(cRollback)
		return
	}
	ws := slices.Clone(db.queue[:n])
	db.queue = slices.Delete(db.queue, 0, n)
	for _, w := range ws {
		w.taken = true
	}
	db.mu.Unlock()
	db.run(ws)
}

// begin starts a write transaction, waiting out other processes' writers
// with short jittered sleeps: each waiter looks again often, so none is
// starved while another process writes back to back. It fails the queued
// writes whose callers stopped waiting, or that waited BusyTimeout, and
// gives up when none is left.
//
// These waits, and BusyTimeout, are real time, not the DB's clock: the
// lock is held by another process's (or another DB's) code, which runs
// and lets go of it in real time whatever any clock says. On a test's
// clock that nobody moves, a wait on that clock would never look at the
// lock again, though it is free; and on a clock a test moves by minutes,
// a write that waited microseconds for another writer would fail as
// busy. What the DB's clock times is what the DB decides itself (its
// checks, its journal's linger and backoff).
func (db *DB) begin(wake, stop <-chan struct{}) bool {
	lockWait := clock.Or(db.lockWait)
	delay := 50 * time.Microsecond
	for {
		select {
		case <-stop:
			return false
		default:
		}
		err := db.control(cBegin)
		if err == nil {
			return true
		}
		if !busy(err) {
			db.control(cRollback) // in case a transaction was left open
			db.noteWrite(err)
			db.failQueue(fmt.Errorf("state: begin: %w", err))
			return false
		}
		if !db.prune(lockWait.Now(), err) {
			return false
		}
		d := delay/2 + rand.N(delay/2+1)
		delay = min(2*delay, 2*time.Millisecond)
		t, fired := lockWait.NewTimer(d)
		select {
		case <-fired:
		case <-wake:
			t.Stop()
		case <-stop:
			t.Stop()
			return false
		}
	}
}

// prune fails the queued writes whose callers stopped waiting or that
// have waited BusyTimeout for another process's writer (whose lock gave
// busyErr), and reports whether any write is left.
func (db *DB) prune(now time.Time, busyErr error) bool {
	db.mu.Lock()
	defer db.mu.Unlock()
	kept := db.queue[:0]
	for _, w := range db.queue {
		if w.busySince.IsZero() {
			w.busySince = now
		}
		switch {
		case w.ctx.Err() != nil:
			w.taken = true
			w.finish(fmt.Errorf("state: begin: %w", w.ctx.Err()))
		case now.Sub(w.busySince) > BusyTimeout:
			w.taken = true
			w.finish(fmt.Errorf("state: begin: %w for %s: %w", ErrBusy, BusyTimeout, busyErr))
		default:
			kept = append(kept, w)
		}
	}
	clear(db.queue[len(kept):])
	db.queue = kept
	return len(kept) > 0
}

// failQueue fails every queued write with err.
func (db *DB) failQueue(err error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	for _, w := range db.queue {
		w.taken = true
		w.finish(err)
	}
	clear(db.queue)
	db.queue = db.queue[:0]
}

// Statements that control the writer's transactions.
const (
	cBegin = iota
	cCommit
	cRollback
	cSavepoint
	cRelease
	cRollbackTo
	nControl
)

var controls = [nControl]string{
	cBegin:      "BEGIN IMMEDIATE",
	cCommit:     "COMMIT",
	cRollback:   "ROLLBACK",
	cSavepoint:  "SAVEPOINT write",
	cRelease:    "RELEASE write",
	cRollbackTo: "ROLLBACK TO write",
}

// prepareControl takes the writer's connection and prepares on it the
// statements that control its transactions.
func (db *DB) prepareControl(ctx context.Context) error {
	var err error
	if db.wc, err = db.w.Conn(ctx); err != nil {
		return err
	}
	db.ws = newStatements(db.wc.PrepareContext)
	for i, text := range controls {
		if db.ctl[i], err = db.wc.PrepareContext(ctx, text); err != nil {
			return fmt.Errorf("prepare %q: %w", text, err)
		}
	}
	return nil
}

// control runs one of the statements that control the writer's
// transactions.
func (db *DB) control(c int) error {
	_, err := db.ctl[c].Exec()
	return err
}

// run runs ws in the transaction begun on the writer's connection, one
// after another, ends it, and reports each outcome. Several writes run
// each in a savepoint; a write alone rolls back with its transaction.
func (db *DB) run(ws []*write) {
	errs := make([]error, len(ws))
	ended := false
	defer func() {
		if !ended { // a function called runtime.Goexit
			db.control(cRollback)
			for _, w := range ws {
				select {
				case <-w.done:
				default:
					w.finish(errors.New("state: the transaction was abandoned"))
				}
			}
		}
	}()
	savepoints := len(ws) > 1
	failed := db.runEach(ws, errs) // the transaction itself failed: nothing in it is committed
	switch {
	case failed != nil, !savepoints && len(ws) == 1 && errs[0] != nil:
		db.control(cRollback)
	default:
		failed = db.commit()
	}
	for i := range errs {
		if errs[i] == nil {
			errs[i] = failed
		}
	}
	if failed != nil || len(ws) > 1 || errs[0] == nil {
		db.noteWrite(failed)
	} else {
		db.noteWrite(errs[0]) // a write alone: its statement's failure is the transaction's
	}
	ended = true
	for i, w := range ws {
		w.finish(errs[i])
	}
}

// runEach runs ws one after another in the writer's transaction, each
// in a savepoint of its own when there are several, and keeps each one's
// error in errs; it returns the transaction's own failure (a savepoint
// that could not be set or ended), after which nothing in it may be
// committed.
func (db *DB) runEach(ws []*write, errs []error) error {
	savepoints := len(ws) > 1
	for i, w := range ws {
		if err := w.ctx.Err(); err != nil {
			errs[i] = fmt.Errorf("state: begin: %w", err)
			continue
		}
		if savepoints {
			if err := db.control(cSavepoint); err != nil {
				return fmt.Errorf("state: savepoint: %w", err)
			}
		}
		// A function that started runs to its end: a statement
		// interrupted inside the transaction would roll back all of it.
		errs[i] = w.call(&Tx{stmts: db.ws, ctx: context.WithoutCancel(w.ctx), instance: db.instance, out: &db.out})
		if !savepoints {
			break
		}
		var end error
		if errs[i] != nil {
			end = db.control(cRollbackTo)
		}
		if end == nil {
			end = db.control(cRelease)
		}
		if end != nil { // an I/O error, a full disk…
			return fmt.Errorf("state: savepoint: %w", end)
		}
	}
	return nil
}

// errPanicked stands for the error of a function that panicked.
var errPanicked = errors.New("state: the function panicked")

// call runs w's function in tx. A panic in it is caught and kept, to be
// raised again by w's own Update: the function may run on another
// goroutine, whose panic nothing would recover.
func (w *write) call(tx *Tx) (err error) {
	defer func() {
		if v := recover(); v != nil {
			w.panicked, w.panicValue = true, v
			err = errPanicked
		}
	}()
	return w.fn(tx)
}

// commit commits the writer's transaction; when that fails, it is rolled
// back.
func (db *DB) commit() error {
	if err := db.control(cCommit); err != nil {
		db.control(cRollback)
		return fmt.Errorf("state: commit: %w", err)
	}
	return nil
}

// busy reports SQLite's SQLITE_BUSY, in any of its extended forms.
func busy(err error) bool {
	var e *sqlite.Error
	return errors.As(err, &e) && e.Code()&0xff == sqlite3.SQLITE_BUSY
}
