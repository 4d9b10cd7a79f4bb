// Package pacer decides when a call to an upstream may go: against the
// key's documented policies counted over every caller and process that
// shares the state file, every policy the upstream ever announced (each in
// its own unit, partition and validity), the gates set by Retry-After,
// backoff and the circuit breaker, and the local safety limits (rate,
// concurrency, slow start). It also turns each answer's rate-limit signals
// into that state, and says what a caller should do next: continue, slow
// down, or pause for a given time.
//
// Decisions are pure functions of a snapshot read, together with the
// admission they lead to, in one write transaction: two processes sharing
// a state file can never both take the last unit of a budget.
package pacer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// Defaults of a Pacer.
const (
	// DefaultInFlightTimeout is how long an admitted attempt counts as in flight
	// when its process never reports back (it crashed).
	DefaultInFlightTimeout = 2 * time.Minute
)

// A Pacer admits calls and records their outcomes for every key sharing
// one state file, together with every other Pacer (in this process or
// another) on the same file. Create it with New (the zero value has no
// state file and cannot be used). It is safe for concurrent use.
type Pacer struct {
	db ledger.Store

	clock    clock.Clock    // the time it reads and waits on; never nil (see WithClock)
	random   func() float64 // uniform numbers in [0, 1) for jitter (see WithJitter)
	inFlight time.Duration  // how long an admitted attempt counts as in flight (see WithInFlightTimeout)

	timers sync.WaitGroup // the answers being recorded and the timers' functions running (see enter): Close waits for them

	mu       sync.Mutex
	wake     map[string]chan struct{} // closed when a call of the key finishes here
	leases   map[string]*lease        // the current lease of each key (see lease.go)
	granting map[string]*leaseRenewal // keys whose spent lease is being renewed
	recent   map[string]*admissions   // each key's latest admissions here
	learned  map[string]*learned      // what routine answers taught each key, not yet written (see learned.go)
	delays   map[string]*sendDelays   // each key's latest delays from admission to send here (see margin.go)
	closed   bool                     // Close was called: no lease is held from then on
	here     waitersHere              // calls of keys with shares waiting in Admit (see fair.go)
	groups   admitGroups              // calls of a key decided together (see group.go)

	// pending holds, per key, what the key's next transaction here must
	// write because an earlier one did not, or may not have (see
	// pending.go).
	pending map[string][]*pendingWrite
	// pendingTimed are the keys with writes pending whose timer is set
	// (see armPending).
	pendingTimed map[string]bool

	stopWakes func() // stops the store's wake-ups; nil until a call waited for a probe (see listenForWakes)
}

// An Option sets one of a Pacer's settings in New.
type Option func(*Pacer)

// WithClock makes the Pacer read the time, and run its timers and waits,
// on c; nil means real time.
func WithClock(c clock.Clock) Option { return func(p *Pacer) { p.clock = clock.Or(c) } }

// WithJitter makes the Pacer draw its jitter from f, which returns a
// uniform number in [0, 1); nil means math/rand/v2's Float64.
func WithJitter(f func() float64) Option { return func(p *Pacer) { p.random = f } }

// WithInFlightTimeout sets how long an admitted attempt counts as in
// flight without an answer (its process crashed); zero means
// DefaultInFlightTimeout.
func WithInFlightTimeout(d time.Duration) Option { return func(p *Pacer) { p.inFlight = d } }

// New returns a Pacer keeping its state in db, with the given options.
func New(db ledger.Store, opts ...Option) *Pacer {
	p := &Pacer{db: db, clock: clock.Real, wake: map[string]chan struct{}{}, leases: map[string]*lease{},
		granting: map[string]*leaseRenewal{}, recent: map[string]*admissions{}, learned: map[string]*learned{}}
	for _, o := range opts {
		o(p)
	}
	return p
}

// A wakeSource is a store shared with other processes that says when
// one of them ended a key's probe, which this process's calls of the key
// may be waiting for: they re-check at once, not at their next poll. The
// key "" means any key (notices may have been missed).
type wakeSource interface {
	OnWake(func(key string)) (stop func())
}

// listenForWakes has the store wake this process's calls when another
// process ends a key's probe (see wakeSource), once: from the first call
// that waits for a probe, so that a process none of whose calls ever does
// (a one-shot command) holds no connection for it.
func (p *Pacer) listenForWakes() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopWakes != nil || p.closed {
		return
	}
	if w, ok := p.db.(wakeSource); ok {
		p.stopWakes = w.OnWake(p.signal)
	}
}

func (p *Pacer) now() time.Time { return p.clock.Now() }

func (p *Pacer) rand() float64 {
	if p.random != nil {
		return p.random()
	}
	return rand.Float64()
}

func (p *Pacer) inFlightTimeout() time.Duration {
	if p.inFlight > 0 {
		return p.inFlight
	}
	return DefaultInFlightTimeout
}

// A Call is one attempt a caller wants to make. Key is required; the
// other fields are recorded as given (a zero MaxWait means "do not wait").
type Call struct {
	Key       *keystore.Key    // the key the call spends
	Caller    string           // who asks: a stdio caller name or a [[callers]] name
	Transport ledger.Transport // how the call came: ledger.Stdio, MCPHTTP or REST
	Method    string           // the HTTP method, with Target the route partitions are predicted by
	Target    string           // path and query below the key's base URL
	Digest    string           // identifies identical requests, for the loop guard
	// Bytes is what the request carries, its body's length as known
	// before it is sent (0 when it has none, or it is not known): the
	// call spends that many of every budget in content-bytes.
	Bytes   int64
	CallID  string // the call's ID, the same for each of its attempts
	Attempt int    // 1 for the first attempt of a call
	// MaxWait is how long the caller is willing to wait for admission;
	// beyond it Admit answers with a *PauseError.
	MaxWait time.Duration
	// Progress, when set, is told about a wait about once a second.
	Progress func(Progress)
	// Late, when set, is the attempt of the call this one replaces: it
	// was not sent for leaving late (see Pacer.Leaving).
	Late *LateError
}

// route is what partitions are predicted by: method and path.
func (c Call) route() string {
	path, _, _ := strings.Cut(c.Target, "?")
	return c.Method + " " + path
}

// Progress reports a wait in progress.
type Progress struct {
	Waited time.Duration // so far
	Total  time.Duration // the expected wait; it may grow
	Reason reason.Reason // why
}

// A Ticket is an admitted attempt, counted against its key from its
// admission on. Report its outcome with Done, once.
type Ticket struct {
	ID         int64         // the attempt's ID in the state file
	Call       Call          // what was admitted
	Probe      bool          // the one call let through to get a fresh answer
	AdmittedAt time.Time     // when it was admitted (by the Pacer's clock)
	Waited     time.Duration // how long it waited for admission
	SlowDown   bool          // admitted while a budget runs low
	Reason     reason.Reason // why it waited or slows down
	HeldBy     string        // what held it while it waited (a policy name, "pace", …, as PauseError.Source); "" when it did not wait
	lease      *lease        // the lease it was admitted from; nil when none
	granted    bool          // its admission granted a lease, whose slots are recorded with it
	grant      *lease        // that lease, once installed; nil when none
	send       sendAllowance // how late after AdmittedAt it may leave (see Pacer.Leaving)
	quick      []Budget      // unleased: the budgets its answer is judged routine by (see quickBudgets); nil when none
}

// judgedBy returns the budgets t's answer is judged routine by: its
// lease's, the lease it granted, or its own (see quickBudgets).
func (t Ticket) judgedBy() []Budget {
	switch {
	case t.lease != nil:
		return t.lease.budgets
	case t.grant != nil:
		return t.grant.budgets
	}
	return t.quick
}

// Leased says t was admitted from its process's lease on a batch of
// reserved slots (see lease.go): its ID is the slot's, AdmittedAt the time
// the slots were admitted.
func (t Ticket) Leased() bool { return t.lease != nil }

// A PauseError reports a call that cannot be admitted within the caller's
// MaxWait. Nothing was sent; the refusal is in the key's activity.
type PauseError struct {
	Key        string        // the key's name
	RetryAfter time.Duration // come back after this long
	Reason     reason.Reason // why
	Source     string        // what binds: a policy name, "retry-after", "circuit", "pace"…
	// Gate is what closed the gate that binds; "" when a policy or a
	// local limit binds. Source can name a policy "circuit"; Gate
	// CircuitGate is the circuit breaker alone.
	Gate ledger.GateSource
	// Limit is the pacer's own limit that binds; "" when a policy or a
	// gate binds. Source can name a policy "pace"; Limit PaceLimit is
	// the pacer's pace alone.
	Limit   OwnLimit
	Binding *Budget // the tightest budget, when one binds
}

// Error says which key pauses, for how long, and why.
func (e *PauseError) Error() string {
	return reason.Paused(e.Key, e.RetryAfter, e.Reason)
}

// ErrPaused matches every *PauseError with errors.Is.
var ErrPaused = errors.New("paused")

// Is makes errors.Is(err, ErrPaused) true for a *PauseError.
func (e *PauseError) Is(target error) bool { return target == ErrPaused }

// Admit waits until c may be sent, for at most c.MaxWait, and records the
// admission. It returns a *PauseError when the wait would be longer (the
// refusal is recorded), or ctx's error when ctx ends first.
func (p *Pacer) Admit(ctx context.Context, c Call) (_ Ticket, err error) {
	defer p.here.enter(c)()
	start := p.now()
	if t, ok, err := p.awaitLease(ctx, c, start); ok || err != nil {
		return t, err
	}
	spent := p.spentLease(c.Key.Name, p.now()) // this call renews it, when leaseSize allows
	deadline := start.Add(c.MaxWait)
	done, err := p.here.line(ctx, p.clock, c, deadline.Sub(p.now())) // one call of a principal at a time, on a key with shares
	if err != nil {
		if spent != nil { // renewed by none: given back, and the calls waiting for its renewal go their own way
			p.giveBack(spent)
			p.notGranted(c.Key.Name, nil)
		}
		return Ticket{}, err
	}
	defer func() { done(err) }()
	lastProgress := start
	heldBy, held := "", reason.Reason{}
	for {
		wake := p.waker(c.Key.Name)
		run, err := p.admitOnce(ctx, c, start, deadline, spent, held)
		if err != nil {
			return Ticket{}, err
		}
		spent = nil
		if run.d.admit {
			p.noteAdmission(c.Key.Name, run.now)
			run.t.HeldBy = heldBy
			return run.t, nil
		}
		if run.pause != nil {
			return Ticket{}, run.pause
		}
		heldBy, held = run.d.source, run.d.reason
		if run.d.limit == ProbeLimit {
			p.listenForWakes()
		}
		wait := progress(c, start, &lastProgress, run.now, run.d)
		if err := p.sleep(ctx, wait, wake); err != nil {
			return Ticket{}, err
		}
	}
}

// awaitLease admits c from its key's lease in this process, waiting for
// one being reserved, or for the lease's pace, when that is worth it. It
// reports whether it did; when it did not, c goes through a transaction.
func (p *Pacer) awaitLease(ctx context.Context, c Call, start time.Time) (Ticket, bool, error) {
	for polls := 0; ; polls++ {
		now := p.now()
		t, ok, wait := p.fromLease(c, now)
		if ok {
			t.Waited = max(now.Sub(start), 0)
			return t, true, nil
		}
		// A lease being reserved serves this call too, once it is; one
		// held back by the key's pace serves it a moment later.
		p.mu.Lock()
		r := p.granting[c.Key.Name]
		p.mu.Unlock()
		if r == nil && (wait <= 0 || now.Add(wait).After(start.Add(c.MaxWait))) {
			return Ticket{}, false, nil
		}
		if polls >= int(time.Second/Poll) {
			return Ticket{}, false, nil // a reservation that takes this long is stuck: go alone
		}
		reserving := make(chan struct{}) // never closed: the pace's wait alone
		if r != nil {
			reserving = r.done
		}
		if wait <= 0 {
			wait = Poll // the reservation's end wakes it sooner
		}
		if err := p.sleep(ctx, wait, reserving); err != nil {
			return Ticket{}, false, err
		}
		if r != nil && r.ended() && errors.Is(r.err, ledger.ErrNoAnswer) {
			// The renewal waited out the store's bound, and this call
			// with it: it fails with it, rather than wait the bound
			// again in a transaction of its own.
			return Ticket{}, false, fmt.Errorf("pacer: admit %s: %w", c.Key.Name, r.err)
		}
	}
}

// An admitRun is what one run of Admit's transaction decided. The
// transaction may run more than once: only its last run's counts.
type admitRun struct {
	d       decision
	t       Ticket        // the admitted attempt, when d admits
	pause   *PauseError   // the recorded refusal, when the wait is past the deadline
	now     time.Time     // the transaction's time; for an admission, the time it is recorded at
	granted *lease        // the lease the admission granted; nil when none
	held    reason.Reason // why the call waited before this run, which its admission records; zero when it did not
}

// admitOnce runs one admission transaction for c (see admitStep) and,
// once it has committed or failed, installs the lease it granted or
// releases the calls waiting for one. spent is the key's lease this call
// renews, when one is; held is why the call waited so far.
func (p *Pacer) admitOnce(ctx context.Context, c Call, start, deadline time.Time, spent *lease, held reason.Reason) (admitRun, error) {
	if spent == nil {
		return p.admitTogether(ctx, c, start, deadline, held) // with the key's other calls at the time (see group.go)
	}
	var run admitRun
	renewing := spent != nil // spentLease marked the key as being granted a lease
	err := p.admitUpdate(ctx, func(tx ledger.Tx) error {
		// The function may run more than once (see ledger.Store):
		// only the last run's results count, and nothing in memory
		// changes until the transaction commits.
		run = admitRun{held: held}
		return p.admitStep(tx, c, start, deadline, spent, &run)
	}, c.Key.Name)
	// What a transaction that got no answer may have written is kept
	// before the calls waiting for a lease are woken: the first of them
	// to run a transaction undoes it.
	switch {
	case commitUnknown(err):
		p.admissionUnknown(run, spent) // it may have committed: as a group's (see group.go)
	case err != nil:
		p.giveBack(spent) // rolled back: spent's slots are still reserved
	}
	switch {
	case run.granted != nil && err == nil:
		p.install(run.granted)
		run.t.grant = run.granted
	case renewing:
		p.notGranted(c.Key.Name, err) // the calls waiting for a lease go their own way, or fail with it
	}
	if err != nil {
		return run, fmt.Errorf("pacer: admit %s: %w", c.Key.Name, err)
	}
	return run, nil
}

// admitStep decides about c in tx and records what it decided into run:
// an admission, a refusal, or the wait before the next try.
func (p *Pacer) admitStep(tx ledger.Tx, c Call, start, deadline time.Time, spent *lease, run *admitRun) error {
	if spent != nil {
		if err := spent.release(tx); err != nil {
			return err
		}
	}
	// The time is read with the key held (the file's write lock, the
	// key's row): a call admitted after another is never recorded before
	// it. It is the transaction's clock — the database server's, when
	// hosts share one — taken to the microsecond, as the state keeps it: a
	// decision made a fraction of a microsecond after the time it is
	// recorded at could let one call too many into a window.
	snap, err := p.load(tx, c, tx.Clock(p.now()).Truncate(time.Microsecond), nil, true)
	if err != nil {
		return err
	}
	run.now = snap.now
	if run.d, err = decide(snap); err != nil {
		return err
	}
	if err := p.noteWaiting(tx, c, run.now, run.d); err != nil {
		return err
	}
	// How long it waited, on the clock start was read on: the
	// transaction's instant is the database server's own clock, which
	// the pacer's reckoning of it (on PostgreSQL) may be ahead of by a
	// fraction of a second. Never negative, whatever the clock did.
	waited := max(p.now().Sub(start), 0)
	if run.d.admit {
		return p.admitted(tx, c, snap, waited, run)
	}
	return p.held(tx, c, snap, deadline, waited, run)
}

// admitted records the admission of c that run decided, after waited.
func (p *Pacer) admitted(tx ledger.Tx, c Call, snap snapshot, waited time.Duration, run *admitRun) error {
	d, ks := run.d, snap.ks
	now := maxTime(run.now, ks.LastAdmitAt) // the log stays in order, whatever the clock did
	run.now = now
	why := d.reason // what the activity says of it: why it waited, when it did
	if why.IsZero() {
		why = run.held
	}
	id, err := tx.InsertAttempt(ledger.Attempt{CallID: c.CallID, Attempt: c.Attempt, Key: c.Key.Name,
		Caller: c.Caller, Transport: c.Transport, Method: c.Method, Target: c.Target, Digest: c.Digest,
		Bytes: max(c.Bytes, 0), State: ledger.Admitted, Reason: why, Probe: d.probe, At: now, Wait: waited,
		InFlightUntil: now.Add(p.inFlightTimeout()), CallerReserves: len(c.Key.Reserves) > 0, Principal: fairPrincipal(c)})
	if err != nil {
		return err
	}
	ks.LastAdmitAt = now
	if ks.Interval > 0 { // slow start: the pace doubles with every admission
		ks.Interval /= 2
		if ks.Interval < minSpacing(c.Key) {
			ks.Interval = 0
		}
	}
	if d.probe {
		ks.ProbeAttempt, ks.ProbeUntil = id, now.Add(p.inFlightTimeout())
	}
	run.t = Ticket{ID: id, Call: c, Probe: d.probe, AdmittedAt: now, Waited: waited, SlowDown: d.slow, Reason: d.reason,
		send: snap.allowance()}
	if run.granted, err = p.grant(tx, c, snap, d, &ks, now); err != nil {
		return err
	}
	run.t.granted = run.granted != nil
	run.t.quick = p.quickBudgets(snap, d)
	return tx.PutKeyState(ks)
}

// held records what holds c back, as run decided: the slow start after a
// pause of the key, and the refusal when the wait goes past deadline or
// never ends; otherwise the claim of a caller with a reservation.
func (p *Pacer) held(tx ledger.Tx, c Call, snap snapshot, deadline time.Time, waited time.Duration, run *admitRun) error {
	d, now, ks := run.d, run.now, snap.ks
	if d.keyWide && d.wait >= time.Second {
		// After a pause of the key the pace rises gradually.
		if s := slowStart(c.Key, snap.seen); ks.Interval < s {
			ks.Interval = s
			if err := tx.PutKeyState(ks); err != nil {
				return err
			}
		}
	}
	if now.Add(d.wait).After(deadline) || d.never {
		retry := d.wait
		if d.poll {
			retry = time.Second
		}
		run.pause = &PauseError{Key: c.Key.Name, RetryAfter: retry, Reason: d.reason, Source: d.source, Gate: d.gate, Limit: d.limit, Binding: d.binding}
		_, err := tx.InsertAttempt(ledger.Attempt{CallID: c.CallID, Attempt: c.Attempt, Key: c.Key.Name,
			Caller: c.Caller, Transport: c.Transport, Method: c.Method, Target: c.Target, Digest: c.Digest,
			State: ledger.RejectedLocal, Reason: pauseReason(run.pause), At: now, Wait: waited})
		return err
	}
	if hasReserve(c.Key, c.Caller) {
		return tx.Claim(c.Key.Name, c.Caller, now.Add(d.wait+time.Second))
	}
	return nil
}

// progress tells c's Progress about its wait, about once a second (last
// is when it was last told), and returns how long to wait before the next
// try: d's wait, or a second at most when c's progress is reported.
func progress(c Call, start time.Time, last *time.Time, now time.Time, d decision) time.Duration {
	wait := d.wait
	if c.Progress != nil && now.Sub(*last) >= time.Second {
		c.Progress(Progress{Waited: now.Sub(start), Total: now.Sub(start) + d.wait, Reason: d.reason})
		*last = now
	}
	if c.Progress != nil && wait > time.Second {
		wait = time.Second // report progress about once a second
	}
	return wait
}

// pauseReason is the activity's record of a refusal.
func pauseReason(e *PauseError) reason.Reason {
	return reason.RefusedFor(e.RetryAfter, e.Reason)
}

func hasReserve(k *keystore.Key, caller string) bool {
	for _, r := range k.Reserves {
		if r.Caller == caller {
			return true
		}
	}
	return false
}

// slowStart is the spacing calls resume at after a pause: the average pace
// of the slowest known policy, between the key's maximum rate and 2 s.
func slowStart(k *keystore.Key, known []ledger.SeenPolicy) time.Duration {
	s := minSpacing(k)
	consider := func(q int64, w time.Duration) {
		if q > 0 && w > 0 {
			s = max(s, w/time.Duration(q))
		}
	}
	for _, p := range k.Policies {
		consider(p.Quota, p.Window)
	}
	for _, kn := range known {
		if kn.HasQuota {
			consider(kn.Quota, kn.Window)
		}
	}
	return min(s, 2*time.Second)
}

// load reads what a decision about c needs, inside tx. ks, when not nil,
// is the key's pacing state as tx already holds it; calls in flight are
// counted only when inFlight.
func (p *Pacer) load(tx ledger.Reader, c Call, now time.Time, ks *ledger.KeyState, inFlight bool) (snapshot, error) {
	key := c.Key.Name
	if ks == nil {
		s, err := tx.KeyState(key)
		if err != nil {
			return snapshot{}, err
		}
		ks = &s
	}
	var err error
	// A clock that steps back re-admits nothing: a window counts every
	// send after its start, later ones included, and the spacing from the
	// latest admission holds every call until the clock passes it again.
	s := snapshot{now: now, key: c.Key, caller: c.Caller, route: c.route(), ks: *ks, log: newTxLog(tx, c.Key),
		delay: p.sendDelay(key, now), late: c.Late, bytes: max(c.Bytes, 0)}
	if s.seen, err = tx.SeenPolicies(key); err != nil {
		return s, err
	}
	if s.gates, err = tx.Gates(key, now); err != nil {
		return s, err
	}
	if inFlight {
		if s.flight, err = tx.Flight(key, now); err != nil {
			return s, err
		}
	}
	if len(c.Key.Reserves) > 0 {
		if s.claimed, err = tx.Claimed(key, now); err != nil {
			return s, err
		}
	}
	if s.fair, err = loadFair(tx, c, now); err != nil {
		return s, err
	}
	return s, nil
}

// txLog reads the sliding-window log of one key inside a transaction,
// remembering what it read: a decision asks about the same windows more
// than once (a documented policy and the upstream's twin of it).
type txLog struct {
	tx      ledger.Reader
	key     string
	callers []string // count these callers' calls too: those with reservations
	counts  map[time.Time]int
	windows map[time.Time]ledger.Window
}

func newTxLog(tx ledger.Reader, k *keystore.Key) *txLog {
	var callers []string
	for _, r := range k.Reserves {
		callers = append(callers, r.Caller)
	}
	return &txLog{tx: tx, key: k.Name, callers: callers,
		counts: map[time.Time]int{}, windows: map[time.Time]ledger.Window{}}
}

// Count is log.Count.
func (l *txLog) Count(since time.Time) (int, error) {
	if n, ok := l.counts[since]; ok {
		return n, nil
	}
	if w, ok := l.windows[since]; ok {
		return w.Count, nil
	}
	n, err := l.tx.Count(l.key, since)
	if err == nil {
		l.counts[since] = n
	}
	return n, err
}

// Window is log.Window.
func (l *txLog) Window(since time.Time) (ledger.Window, error) {
	if w, ok := l.windows[since]; ok {
		return w, nil
	}
	w, err := l.tx.WindowOf(l.key, since, l.callers)
	if err == nil {
		l.windows[since] = w
	}
	return w, err
}

// Nth is log.Nth.
func (l *txLog) Nth(since time.Time, n int) (time.Time, error) { return l.tx.Nth(l.key, since, n) }

// Bytes is log.Bytes.
func (l *txLog) Bytes(since time.Time) (int64, error) { return l.tx.Bytes(l.key, since) }

// NthByte is log.NthByte.
func (l *txLog) NthByte(since time.Time, n int64) (time.Time, error) {
	return l.tx.NthByte(l.key, since, n)
}

// waker returns a channel closed when a call of key next finishes in this
// process, so waiters re-check at once instead of at their next poll.
func (p *Pacer) waker(key string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch, ok := p.wake[key]
	if !ok {
		ch = make(chan struct{})
		p.wake[key] = ch
	}
	return ch
}

// signal wakes the calls of key waiting in this process; "" wakes every
// key's.
func (p *Pacer) signal(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if key != "" {
		if ch, ok := p.wake[key]; ok {
			close(ch)
			delete(p.wake, key)
		}
		return
	}
	for k, ch := range p.wake {
		close(ch)
		delete(p.wake, k)
	}
}

// sleep waits d on p's clock, or until wake closes, or until ctx ends.
func (p *Pacer) sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) error {
	return clock.Sleep(ctx, p.clock, d, wake)
}
