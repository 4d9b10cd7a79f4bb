package testkit

import (
	"context"
	"errors"
	"sync"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// An Update is ledger.Store's Update method.
type Update func(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error

// errRollback ends the first run of a Rerun's transaction.
var errRollback = errors.New("testkit: forced rollback: the transaction runs again")

// A Rerun runs every transaction function twice, as a database that
// retries a transaction does (PostgreSQL after a deadlock, a serialisation
// failure or a dropped connection): first in a transaction it rolls back
// after the function returned, then in one that commits. Between the two
// runs, a function given to Once may change the state, as another host
// would. A consumer that keeps anything of a run that was rolled back is
// caught by the second run seeing the state without it. The zero Rerun
// is ready; it is safe for concurrent use.
type Rerun struct {
	mu      sync.Mutex
	between func(ctx context.Context) error
}

// Once makes f run between the two runs of the next transaction.
func (r *Rerun) Once(f func(ctx context.Context) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.between = f
}

// Update runs fn through update twice, the first run rolled back. An
// error of fn's first run is returned as the store would return it.
func (r *Rerun) Update(ctx context.Context, update Update, fn func(ledger.Tx) error, keys ...string) error {
	err := update(ctx, func(tx ledger.Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		return errRollback
	}, keys...)
	if !errors.Is(err, errRollback) {
		return err // fn failed on its own, or the store did
	}
	r.mu.Lock()
	between := r.between
	r.between = nil
	r.mu.Unlock()
	if between != nil {
		if err := between(ctx); err != nil {
			return err
		}
	}
	return update(ctx, fn, keys...)
}

// A RerunStore is a ledger.Store whose every Update runs its function
// twice (see Rerun).
type RerunStore struct {
	ledger.Store
	Rerun
}

// Update runs fn twice, the first run rolled back.
func (s *RerunStore) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	return s.Rerun.Update(ctx, s.Store.Update, fn, keys...)
}

// ErrCommitFailed is what FailCommit's transactions end with.
var ErrCommitFailed = errors.New("testkit: the commit failed")

// FailCommit runs fn through update in a transaction that fails after fn
// returned nil, as a commit the database refuses does, and returns
// ErrCommitFailed: nothing fn wrote may remain, and a consumer must not
// change its memory from what fn computed. An error of fn is returned as
// the store would return it.
func FailCommit(ctx context.Context, update Update, fn func(ledger.Tx) error, keys ...string) error {
	err := update(ctx, func(tx ledger.Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		return ErrCommitFailed
	}, keys...)
	return err
}

// A FailStore is a ledger.Store whose next Updates, as many as FailNext
// says, fail after their function returned, as a commit the database
// refuses does (see FailCommit); the others run as the Store's. It is
// safe for concurrent use.
type FailStore struct {
	ledger.Store
	mu   sync.Mutex
	fail int
}

// FailNext makes the next n Updates fail at their commit.
func (s *FailStore) FailNext(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = n
}

// Update runs fn, and fails its commit when FailNext asked for it.
func (s *FailStore) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	s.mu.Lock()
	fail := s.fail > 0
	if fail {
		s.fail--
	}
	s.mu.Unlock()
	if fail {
		return FailCommit(ctx, s.Store.Update, fn, keys...)
	}
	return s.Store.Update(ctx, fn, keys...)
}

// DefersOutcomes answers as the wrapped store does: a store that records
// routine outcomes through its journal still does so under a RerunStore
// (see pacer's quick path).
func (s *RerunStore) DefersOutcomes() bool {
	d, ok := s.Store.(interface{ DefersOutcomes() bool })
	return ok && d.DefersOutcomes()
}
