package pacer

import (
	"context"
	"math"
	"net/http"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// A key called often, far from every limit it knows, is admitted from a
// lease: one admission's transaction also reserves a batch of slots (each
// recorded as an attempt admitted then, counted against every budget and
// in flight for every process), and the next calls of this process take
// them in memory, without a transaction of their own, until the batch is
// spent or the lease runs out. Each call's outcome is still recorded
// before its caller hears it (a routine answer of the lease, through the
// process's journal: see learned.go). A lease:
//
//   - is granted only when the decision admits at once, with no probe, no
//     gate, no slow start and no budget near its low-water mark, for a key
//     without reservations, policies in content-bytes or upstream
//     policies partitioned by route, to
//     a process that admitted the key's last leaseRecent calls at a pace
//     that would use it;
//   - holds at most LeaseMax slots and 1/leaseShare of what any known
//     budget has left (its low-water share kept back), a quarter of the
//     calls the key may still have in flight, and no more than its
//     maximum rate allows in the lease's time;
//   - lasts LeaseTime at most, 1/leaseWindowShare of the shortest window
//     and a quarter of the least time any upstream observation has left to hold —
//     a slot's send may reach the upstream that long after its recorded
//     admission, and the latency margin measures it (see margin);
//   - ends at the first answer that is not routine, to any call of the key
//     in this process: a refusal, a failure, a gate, a warning, a policy
//     it did not know, or a budget with less left than the lease holds or
//     below its low-water mark. That answer is recorded and advised as
//     any other, and the slots not handed out are given back.
//
// What another process learns (a Retry-After, an exhausted budget) reaches
// a lease holder when its lease ends: within LeaseTime.
const (
	// LeaseMax is the most slots one lease holds.
	LeaseMax = 64
	// LeaseTime is the longest a lease lasts.
	LeaseTime = 250 * time.Millisecond

	leaseMin         = 16                    // fewer slots are not worth a lease
	leaseShortest    = 10 * time.Millisecond // nor a shorter time
	leaseShare       = 16                    // a lease takes at most 1/16 of what a budget has left
	leaseWindowShare = 40                    // and lasts at most 1/40 of the shortest window
	leaseRecent      = 8                     // admissions the pace of a process is measured over
)

// A lease is a batch of reserved slots this process hands out in memory.
type lease struct {
	key               string
	first, next, last int64         // slot IDs: next is the next to hand out; next > last when spent
	at                time.Time     // when it was granted, by the Pacer's clock: when its slots are recorded as admitted
	until             time.Time     // no slot is handed out from then on
	spacing           time.Duration // the key's least spacing between admissions
	lastOut           time.Time     // when the last slot was handed out
	budgets           []Budget      // the key's budgets at the grant, every slot counted as spent
	broken            bool          // an answer that is not routine ended it (under Pacer.mu)
	stop              func() bool   // stops the timer that gives back the unused slots when the lease runs out
}

// fromLease hands c a slot of its key's lease when the key has one that
// is current and the key's pace allows a call at now. When only the pace
// holds it back, wait says for how long.
func (p *Pacer) fromLease(c Call, now time.Time) (t Ticket, ok bool, wait time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.leases[c.Key.Name]
	if l == nil || l.next > l.last || !now.Before(l.until) {
		return Ticket{}, false, 0
	}
	if next := l.lastOut.Add(l.spacing); now.Before(next) {
		return Ticket{}, false, next.Sub(now)
	}
	id := l.next
	l.next++
	l.lastOut = now
	p.recent[c.Key.Name].note(now) // there is one: a lease is granted on a measured pace
	return Ticket{ID: id, Call: c, AdmittedAt: l.at, lease: l}, true, 0
}

// spentLease takes the key's lease from the Pacer when it can hand out
// nothing more (spent, or run out by now), for its unused slots to be
// given back; nil when there is none such.
func (p *Pacer) spentLease(key string, now time.Time) *lease {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.leases[key]
	if l == nil || (l.next <= l.last && now.Before(l.until)) {
		return nil
	}
	if p.granting[key] == nil {
		// The caller renews it: the key's next calls wait for the
		// renewal instead of each taking a transaction of its own.
		p.granting[key] = &leaseRenewal{done: make(chan struct{})}
	}
	return p.dropLease(l)
}

// breakLease ends l (when not nil) at an answer that is not routine: the
// answers still to come of its slots are advised as any other, and no
// more of its slots are handed out. It returns l when this call ended it,
// and the caller then gives its slots back in a transaction (release);
// nil when l was ended already.
func (p *Pacer) breakLease(l *lease) *lease {
	if l == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	l.broken = true
	return p.dropLease(l)
}

// currentLease returns the key's lease; nil when there is none.
func (p *Pacer) currentLease(key string) *lease {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.leases[key]
}

// dropLease removes l from the Pacer. p.mu is held.
func (p *Pacer) dropLease(l *lease) *lease {
	if p.leases[l.key] != l {
		return nil // taken already
	}
	delete(p.leases, l.key)
	if l.stop != nil {
		l.stop()
	}
	return l
}

// release gives back the slots of l never handed out; l is no longer the
// Pacer's, so none will be.
func (l *lease) release(tx ledger.Tx) error {
	return tx.Release(l.key, l.next, l.last)
}

// install makes l the key's lease once the transaction reserving it has
// committed, and gives back its unused slots when it runs out.
//
// A lease it cannot keep (another took its place, or the Pacer closed) is
// given back before install returns, in the caller's goroutine: no
// goroutine outlives Close.
func (p *Pacer) install(l *lease) {
	var back []*lease
	defer func() {
		for _, l := range back {
			p.giveBack(l)
		}
	}()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endGranting(l.key, nil)
	if old := p.leases[l.key]; old != nil {
		// Granted while another was current (their transactions raced):
		// the older one ends now.
		back = append(back, p.dropLease(old))
	}
	if p.closed {
		back = append(back, l) // granted while the Pacer closed: nothing hands it out
		return
	}
	p.leases[l.key] = l
	l.stop = p.afterFunc()(l.until.Sub(l.at), p.timerFunc(func() {
		p.mu.Lock()
		mine := p.dropLease(l)
		p.mu.Unlock()
		if mine != nil {
			p.giveBack(l)
		}
	}))
}

// afterFunc calls f after d on the Pacer's clock, unless the function it
// returns is called first (and returns true).
func (p *Pacer) afterFunc() func(time.Duration, func()) func() bool {
	return func(d time.Duration, f func()) func() bool { return p.clock.AfterFunc(d, f).Stop }
}

// notGranted says the lease being reserved for key was not: its
// transaction failed.
func (p *Pacer) notGranted(key string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endGranting(key, err)
}

// endGranting wakes the calls waiting for key's lease to be reserved,
// with err, the renewal's failure (nil when it did not fail). p.mu is
// held.
func (p *Pacer) endGranting(key string, err error) {
	if r := p.granting[key]; r != nil {
		r.err = err
		close(r.done)
		delete(p.granting, key)
	}
}

// A leaseRenewal is a key's spent lease being renewed, which the key's next
// calls wait for: done is closed once it is, or is not; err, set before,
// is its transaction's failure, when it failed.
type leaseRenewal struct {
	done chan struct{}
	err  error
}

// ended says r's done is closed, so that its err may be read.
func (r *leaseRenewal) ended() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// giveBack releases the unused slots of l, which the Pacer no longer
// holds, in a transaction of its own. When the database does not answer
// it, giving them back is pending for the key's next transaction (see
// pending.go); when it fails otherwise, they stay reserved, counted as
// sent until the sweep releases them, which spends budget but never
// overspends it.
func (p *Pacer) giveBack(l *lease) {
	if err := p.update(context.Background(), l.release, l.key); commitUnknown(err) {
		p.keepPending(p.pendingRelease(l))
	}
}

// admissions are the times of a key's latest admissions in this process.
type admissions struct {
	at [leaseRecent]time.Time // a ring: at[n%leaseRecent] is the oldest once full
	n  int
}

func (a *admissions) note(t time.Time) {
	a.at[a.n%leaseRecent] = t
	a.n++
}

// noteAdmission remembers when this process admitted a call of key, to
// measure its pace.
func (p *Pacer) noteAdmission(key string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.recent[key]
	if a == nil {
		a = &admissions{}
		p.recent[key] = a
	}
	a.note(at)
}

// pace returns how many calls of key a second this process admitted over
// its last leaseRecent admissions, up to now; 0 when it made fewer.
func (p *Pacer) pace(key string, now time.Time) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.recent[key]
	if a == nil || a.n < leaseRecent {
		return 0
	}
	span := max(now.Sub(a.at[a.n%leaseRecent]), time.Microsecond)
	return leaseRecent / span.Seconds()
}

// leaseSize returns how many slots a lease granted with the admission d
// of snap's call may hold, and for how long: zero when the key should not
// be leased now. The call itself is admitted already, but not in d.
func (p *Pacer) leaseSize(snap snapshot, d decision) (int, time.Duration) {
	k := snap.key
	if !d.admit || d.probe || d.slow || len(k.Reserves) > 0 || k.Fair() || snap.ks.Interval > 0 || snap.ks.HalfOpen || snap.ks.Failures > 0 {
		return 0, 0
	}
	if keyHasBytes(k, snap.seen) {
		return 0, 0 // a slot's bytes are not known when it is reserved
	}
	p.mu.Lock()
	busy := p.leases[k.Name] != nil
	p.mu.Unlock()
	if busy {
		return 0, 0
	}
	rate := p.pace(k.Name, snap.now)
	if rate <= 0 {
		return 0, 0
	}
	life := LeaseTime
	n := int64(LeaseMax)
	for _, b := range d.budgets {
		if b.Window > 0 {
			life = min(life, b.Window/leaseWindowShare)
		}
		if b.Remaining < 0 {
			continue
		}
		if !b.Observed.IsZero() {
			if b.Expired || b.Reset <= 0 {
				return 0, 0
			}
			life = min(life, b.Reset/4)
		}
		keep := int64(math.Ceil(k.LowWater * float64(b.Limit)))
		n = min(n, (b.Remaining-1-keep)/leaseShare)
	}
	maxConc := maxConcurrency(k)
	for _, kn := range snap.seen {
		if kn.Partition != "" {
			return 0, 0 // its budgets depend on the route; a lease serves every route
		}
		if kn.Unit == ratelimit.ConcurrentRequests && kn.HasQuota {
			maxConc = min(maxConc, int(kn.Quota))
		}
	}
	n = min(n, int64(maxConc-snap.flight.Count-1)/4)
	// What this process would use in the lease's time at its pace: a lease
	// that runs out before it is spent wastes what it holds when others'
	// admissions follow it.
	n = min(n, int64(rate*life.Seconds()))
	if s := minSpacing(k); s > 0 {
		n = min(n, int64(life/s))
	}
	if n < leaseMin || life < leaseShortest {
		return 0, 0
	}
	return int(n), life
}

// bringsNews reports an answer that is never routine: a refusal, a failure, a
// gate or a warning.
func bringsNews(o Outcome, res Result) bool {
	if o.Err != nil || o.Status == 0 || o.Status == http.StatusTooManyRequests || o.Status >= 500 ||
		res.State == ledger.RejectedUpstream || len(res.Warnings) > 0 || res.RetryIn > 0 || res.DoNotRetry {
		return true
	}
	rd := o.Reading
	return rd != nil && (rd.HasRetryAfter || rd.Throttled || rd.Abnormal || rd.DoNotRetry)
}

// leaseResult is what Done tells the caller of a call admitted from a
// lease whose answer res was routine: the
// budgets of its grant, aged to now, each tightened by what the answer
// says of its policy. ok is false when the answer ends the lease.
func (p *Pacer) leaseResult(t Ticket, o Outcome, res Result, now time.Time) (Result, bool) {
	l := t.lease
	p.mu.Lock()
	broken := l.broken
	p.mu.Unlock()
	if broken || bringsNews(o, res) {
		return res, false
	}
	rd := o.Reading
	budgets := make([]Budget, len(l.budgets))
	age := now.Sub(l.at)
	for i, b := range l.budgets {
		if b.Reset > 0 {
			b.Reset = max(b.Reset-age, time.Microsecond)
		}
		budgets[i] = b
	}
	if rd != nil && !rd.FromCache {
		for _, ob := range rd.Observations {
			if ob.Policy == "" {
				ob.Policy = unnamedPolicy
			}
			if ob.Unit == "" {
				ob.Unit = ratelimit.Requests
			}
			found := false
			for i := range budgets {
				b := &budgets[i]
				if b.Observed.IsZero() || b.Policy != ob.Policy || b.Unit != ob.Unit || b.Partition != ob.Partition {
					continue
				}
				found = true
				if ob.HasRemaining && (b.Remaining < 0 || ob.Remaining < b.Remaining) {
					b.Remaining = ob.Remaining
				}
				if ob.HasReset {
					b.Reset = ob.Reset
				}
				b.Observed = rd.ReceivedAt
			}
			if !found {
				return res, false // a policy the lease did not know of
			}
		}
	}
	// The grant left every budget leaseShare-1 leases' worth: an answer
	// that leaves less than one is not routine.
	slots := l.last - l.first + 1
	for _, b := range budgets {
		if b.Remaining >= 0 && (b.Remaining < slots || low(b.Remaining, b.Limit, t.Call.Key.LowWater)) {
			return res, false
		}
	}
	res.Budgets = budgets
	res.Binding = tightest(budgets)
	res.Advice = adviceFor(decision{admit: true, binding: res.Binding})
	return res, true
}

// grant reserves a lease for the key of c, admitted in tx at now by d,
// when leaseSize allows one; ks is the key's pacing state, to be
// recorded. The lease is the Pacer's once tx commits (see install).
//
// The lease takes the key's pace for its slots: the key's latest
// admission is moved to when all of them could have gone at the key's
// maximum rate, so another process's next call is spaced after that. A
// holder slower than that rate still hands slots out until the lease
// ends: while it does, its calls and another process's are each spaced
// by max_rate, not together.
func (p *Pacer) grant(tx ledger.Tx, c Call, snap snapshot, d decision, ks *ledger.KeyState, now time.Time) (*lease, error) {
	n, life := p.leaseSize(snap, d)
	if n == 0 {
		return nil, nil
	}
	first, last, err := tx.Reserve(c.Key.Name, n, now, now.Add(life+p.inFlightTimeout()))
	if err != nil {
		return nil, err
	}
	l := &lease{key: c.Key.Name, first: first, next: first, last: last, at: now,
		until: now.Add(life), spacing: minSpacing(c.Key), lastOut: now}
	// What a caller is told while the lease lasts: the budgets with all
	// its slots spent.
	if l.budgets, _, _, err = p.advise(tx, c, now, *ks); err != nil {
		return nil, err
	}
	ks.LastAdmitAt = now.Add(time.Duration(n) * l.spacing)
	// Nothing in memory changes here: tx may be rolled back and its
	// function run again (see ledger.Store). The caller installs l once
	// tx has committed.
	return l, nil
}
