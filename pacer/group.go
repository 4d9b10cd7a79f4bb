package pacer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// The unleased admissions of one key that come at the same time in one
// process run together, in one transaction: the first becomes the leader
// and runs it, the others queue behind it, and when it is done the first
// of those queued leads the next one with every one queued by then.
// Inside the transaction, which holds the key (its row on PostgreSQL, the
// file's write lock on SQLite), each call is decided in turn, in the
// order they came, by the same rules as alone, against what the ones
// before it recorded. The key is held once for many calls, and on
// PostgreSQL the lock's pipeline and the COMMIT are shared by them. Each
// admitted call gets its own attempt; a call held back gets its own wait
// or refusal. Once it holds the key, a transaction also takes the calls
// that queued while it waited for it, whether it had one call or many:
// a process waits for a busy key's lock once for the calls it has.
//
// A call queued leaves when its context ends; a transaction ends when
// every call in it has left (see batchContext). A transaction that fails
// fails the calls in it, each with its error, not those queued meanwhile,
// which run the next one — but for a database that did not answer within
// the store's bound (ledger.ErrNoAnswer): the calls queued meanwhile fail
// with it too, so that a call fails within one bound of the transaction
// it waited for, not one more of its own (see handOver). When the
// database did not answer, the attempts it admitted may be in the log all
// the same, and the key's next transaction ends them, not sent (see
// admissionUnknown).
//
// A decision that grants a lease ends the transaction's admissions: the
// calls after it are not decided in it and try again (see
// groupCall.ran), as leaseSize grants a key one lease at a time and the
// lease is installed only once the transaction commits, before the next
// transaction of the key starts.

// admitGroups are the groups of transactions running, one per key.
type admitGroups struct {
	mu     sync.Mutex
	groups map[string]*admitGroup
}

// An admitGroup is a key whose transaction runs, and the parts waiting
// for the next one.
type admitGroup struct {
	queue []*groupCall // in the order they came
}

// A groupCall is one admission's decision waiting to run with others.
type groupCall struct {
	ctx context.Context
	key string
	// fn is its part of the transaction; it may run more than once (see
	// ledger.Store), keeping only its last run's results.
	fn func(tx ledger.Tx) error
	// granted says whether fn's last run granted a lease: the
	// admissions after it in the transaction do not run.
	granted func() bool
	// committed, when set, runs once the transaction has committed, before
	// the next one of the key starts.
	committed func()
	// unknown, when set, runs for a call fn decided in the transaction's
	// last run when the transaction failed with err, the database not
	// answering, so that it may have committed: before the next one of
	// the key starts.
	unknown func(err error)

	// ready is closed once the transaction ran, or the call was handed the lead.
	ready chan struct{}
	lead  []*groupCall // the calls it leads the transaction of, itself first; nil when it does not lead

	ran bool  // fn ran in the transaction that committed
	err error // the transaction's
}

// join enters g in its key's group. It returns the calls g leads, itself
// alone, when no transaction of the key runs; nil when g waits in the
// queue for one.
func (a *admitGroups) join(g *groupCall) []*groupCall {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := g.key
	if grp, ok := a.groups[key]; ok {
		grp.queue = append(grp.queue, g)
		return nil
	}
	if a.groups == nil {
		a.groups = map[string]*admitGroup{}
	}
	a.groups[key] = &admitGroup{}
	return []*groupCall{g}
}

// leave takes g out of its key's queue, and reports whether it was still
// there: a call taken into a transaction already waits for its decision.
func (a *admitGroups) leave(g *groupCall) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	grp := a.groups[g.key]
	if grp == nil {
		return false
	}
	for i, q := range grp.queue {
		if q == g {
			grp.queue = append(grp.queue[:i:i], grp.queue[i+1:]...)
			return true
		}
	}
	return false
}

// take returns the calls queued for key's next transaction, for the one
// running to decide them (see runTogether); nil when none are.
func (a *admitGroups) take(key string) []*groupCall {
	a.mu.Lock()
	defer a.mu.Unlock()
	grp := a.groups[key]
	if grp == nil {
		return nil
	}
	taken := grp.queue
	grp.queue = nil
	return taken
}

// drop ends key's group and returns the calls queued in it.
func (a *admitGroups) drop(key string) []*groupCall {
	a.mu.Lock()
	defer a.mu.Unlock()
	grp := a.groups[key]
	delete(a.groups, key)
	if grp == nil {
		return nil
	}
	return grp.queue
}

// next returns the calls queued for key's next transaction, the first of
// them to lead it; nil, and the key's group ended, when none are.
func (a *admitGroups) next(key string) []*groupCall {
	a.mu.Lock()
	defer a.mu.Unlock()
	grp := a.groups[key]
	if grp == nil || len(grp.queue) == 0 {
		delete(a.groups, key)
		return nil
	}
	batch := grp.queue
	grp.queue = nil
	return batch
}

// admitTogether decides c (spent no lease) in a transaction with the
// other calls of its key that need one at the same time (see
// admitGroups), and returns what it decided for c, as admitOnce does. A
// call whose decision a lease granted before it cut short is returned
// holding no decision and no wait: Admit's loop tries it again.
func (p *Pacer) admitTogether(ctx context.Context, c Call, start, deadline time.Time, held reason.Reason) (admitRun, error) {
	var run admitRun
	g := &groupCall{ctx: ctx, key: c.Key.Name,
		fn: func(tx ledger.Tx) error {
			run = admitRun{held: held}
			return p.admitStep(tx, c, start, deadline, nil, &run)
		},
		granted: func() bool { return run.granted != nil },
		committed: func() {
			if run.granted != nil {
				p.install(run.granted)
				run.t.grant = run.granted
			}
		},
		unknown: func(error) { p.admissionUnknown(run, nil) }}
	if err := p.together(g); err != nil {
		return run, fmt.Errorf("pacer: admit %s: %w", c.Key.Name, err)
	}
	if !g.ran {
		return admitRun{now: p.now()}, nil // no decision, no wait: tried again
	}
	return run, nil
}

// together runs g's part in a transaction of its key with the others
// that come at the same time, leading it or waiting for it, and returns
// the transaction's error.
func (p *Pacer) together(g *groupCall) error {
	g.ready = make(chan struct{})
	batch := p.groups.join(g)
	if batch == nil {
		select {
		case <-g.ready:
		case <-g.ctx.Done():
			if p.groups.leave(g) {
				return g.ctx.Err()
			}
			<-g.ready // taken into a transaction: its end stands
		}
		if g.lead == nil {
			return g.err
		}
		batch = g.lead
	}
	p.runTogether(batch)
	return g.err
}

// runTogether runs the transaction of batch, whose first call leads it,
// hands the lead to the calls queued meanwhile, and tells every other
// call of batch how it ended.
func (p *Pacer) runTogether(batch []*groupCall) {
	leader := batch[0]
	ctx := newBatchContext(batch)
	defer ctx.end()
	fn := func(tx ledger.Tx) error {
		// The calls that queued while the transaction waited for the key
		// are decided in it too, now that it holds the key (on
		// PostgreSQL, once the lock's pipeline answered): one wait for
		// the key, not two. Taken, they are the transaction's, and end
		// with it, as the batch's others do. This is the one thing the
		// function changes in memory, and a run again keeps it: the calls
		// taken stay in the batch and are decided again, with any that
		// queued since.
		batch = append(batch, ctx.join(func() []*groupCall { return p.groups.take(leader.key) })...)
		// The function may run more than once (see ledger.Store): only
		// the last run's parts count, and nothing in memory changes
		// until the transaction commits.
		for _, g := range batch {
			g.ran = false
		}
		granted := false
		for _, g := range batch {
			if granted {
				continue // the key's one lease: this call tries again
			}
			if err := g.fn(tx); err != nil {
				return err
			}
			g.ran = true
			granted = g.granted()
		}
		return nil
	}
	err := p.admitUpdate(ctx, fn, leader.key)
	unknown := commitUnknown(err)
	for _, g := range batch {
		g.err = err
		switch {
		case err == nil && g.ran && g.committed != nil:
			g.committed()
		case unknown && g.ran && g.unknown != nil:
			g.unknown(err)
		}
	}
	p.handOver(leader.key, err)
	for _, g := range batch[1:] {
		close(g.ready)
	}
}

// handOver hands key's group, whose transaction ended with err, to the
// calls queued meanwhile: the first leads the next transaction — or, when
// err is a database that did not answer within the store's bound, they
// waited the bound with it, and fail with it rather than each lead one
// more that waits it again.
func (p *Pacer) handOver(key string, err error) {
	if errors.Is(err, ledger.ErrNoAnswer) {
		for _, g := range p.groups.drop(key) {
			g.err = err
			close(g.ready)
		}
		return
	}
	if next := p.groups.next(key); next != nil {
		next[0].lead = next
		close(next[0].ready)
	}
}

// A batchContext is the context of a group's transaction: it ends once
// every call in it has ended its own context (has left), for the
// transaction decides them all, and not with the leader's alone.
type batchContext struct {
	context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	in     int           // the calls in it that have not left
	stops  []func() bool // stop watching their contexts
}

// newBatchContext returns the context of calls' transaction, with the
// values of the first's.
func newBatchContext(calls []*groupCall) *batchContext {
	ctx, cancel := context.WithCancel(context.WithoutCancel(calls[0].ctx))
	b := &batchContext{Context: ctx, cancel: cancel}
	b.join(func() []*groupCall { return calls })
	return b
}

// join adds the calls take returns to b, and returns them; once b has
// ended (every call in it has left), it does not call take and returns
// nil, so that the calls queued stay for the next transaction.
func (b *batchContext) join(take func() []*groupCall) []*groupCall {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.Err() != nil { // ended under b.mu, by left or end
		return nil
	}
	calls := take()
	for _, g := range calls {
		b.in++
		b.stops = append(b.stops, context.AfterFunc(g.ctx, b.left))
	}
	return calls
}

// left counts a call whose context ended; the last one ends b.
func (b *batchContext) left() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.in--; b.in == 0 {
		b.cancel()
	}
}

// end releases b once its transaction has ended.
func (b *batchContext) end() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, stop := range b.stops {
		stop()
	}
	b.cancel()
}

// errNotConfirmed ends an attempt whose admission the database did not
// confirm: its call failed, and was not sent.
var errNotConfirmed = errors.New("not sent: the state database did not answer whether its admission was recorded")

// admissionUnknown keeps pending, for the key's next transaction in this
// process, the undoing of what an admission's transaction that may have
// committed or not wrote (see commitUnknown: its COMMIT went out, and
// the answer was lost, or the caller left while it waited for it): the
// attempt run admitted, whose call fails and is never sent, is ended not
// sent; the slots of the lease it granted, never installed, and those of
// spent, the lease it renewed (nil when none), which it gave back or not,
// are given back (see pending.go). Every admission goes through here, in
// a group (see admitTogether) or renewing a lease (see admitOnce).
func (p *Pacer) admissionUnknown(run admitRun, spent *lease) {
	var attempt pendingWrite
	if run.d.admit && run.t.ID != 0 { // a call held back records no attempt in flight
		attempt = p.pendingOutcome(run.t, Outcome{Err: errNotConfirmed, CallerAbort: true})
	}
	p.keepPending(p.pendingRelease(run.granted), p.pendingRelease(spent), attempt)
}
