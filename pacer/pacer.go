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
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/state"
)

// Defaults of a Pacer.
const (
	// DefaultLease is how long an admitted attempt counts as in flight
	// when its process never reports back (it crashed).
	DefaultLease = 2 * time.Minute
)

// A Pacer admits calls and records their outcomes for every key sharing
// one state file. Create it with New; set Now and Rand before first use
// to drive it in tests. It is safe for concurrent use.
type Pacer struct {
	db *state.DB

	// Now returns the current time; nil means time.Now.
	Now func() time.Time
	// Rand returns a uniform number in [0, 1) for jitter; nil means
	// math/rand/v2's Float64.
	Rand func() float64
	// Lease is how long an admitted attempt counts as in flight without
	// an answer; zero means DefaultLease.
	Lease time.Duration

	mu   sync.Mutex
	wake map[string]chan struct{} // closed when a call of the key finishes here
}

// New returns a Pacer keeping its state in db.
func New(db *state.DB) *Pacer {
	return &Pacer{db: db, wake: map[string]chan struct{}{}}
}

func (p *Pacer) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

func (p *Pacer) rand() float64 {
	if p.Rand != nil {
		return p.Rand()
	}
	return rand.Float64()
}

func (p *Pacer) lease() time.Duration {
	if p.Lease > 0 {
		return p.Lease
	}
	return DefaultLease
}

// A Call is one attempt a caller wants to make.
type Call struct {
	Key       *keystore.Key
	Caller    string // who asks: a stdio caller name or a [[callers]] name
	Transport string // stdio, mcp-http, rest
	Method    string
	Target    string // path and query below the key's base URL
	Digest    string // identifies identical requests, for the loop guard
	CallID    string
	Attempt   int // 1 for the first attempt of a call
	// MaxWait is how long the caller is willing to wait for admission;
	// beyond it Admit answers with a *PauseError.
	MaxWait time.Duration
	// Progress, when set, is told about a wait about once a second.
	Progress func(Progress)
}

// route is what partitions are predicted by: method and path.
func (c Call) route() string {
	path, _, _ := strings.Cut(c.Target, "?")
	return c.Method + " " + path
}

// Progress reports a wait in progress.
type Progress struct {
	Waited time.Duration
	Total  time.Duration // the expected wait; it may grow
	Reason string
}

// A Ticket is an admitted attempt. Report its outcome with Done.
type Ticket struct {
	ID         int64
	Call       Call
	Probe      bool // the one call let through to get a fresh answer
	AdmittedAt time.Time
	Waited     time.Duration
	SlowDown   bool   // admitted while a budget runs low
	Reason     string // why it waited or slows down
}

// A PauseError reports a call that cannot be admitted within the caller's
// MaxWait. Nothing was sent; the refusal is in the key's activity.
type PauseError struct {
	Key        string
	RetryAfter time.Duration // come back after this long
	Reason     string        // one plain sentence
	Source     string        // what binds: a policy name, "retry-after", "circuit"…
	Binding    *Budget       // the tightest budget, when one binds
}

func (e *PauseError) Error() string {
	return fmt.Sprintf("key %s paused for %s: %s", e.Key, seconds(e.RetryAfter), e.Reason)
}

// ErrPaused matches every *PauseError with errors.Is.
var ErrPaused = errors.New("paused")

// Is makes errors.Is(err, ErrPaused) true for a *PauseError.
func (e *PauseError) Is(target error) bool { return target == ErrPaused }

// Admit waits until c may be sent, for at most c.MaxWait, and records the
// admission. It returns a *PauseError when the wait would be longer (the
// refusal is recorded), or ctx's error when ctx ends first.
func (p *Pacer) Admit(ctx context.Context, c Call) (Ticket, error) {
	start := p.now()
	deadline := start.Add(c.MaxWait)
	lastProgress := start
	for {
		wake := p.waker(c.Key.Name)
		var d decision
		var t Ticket
		var pause *PauseError
		now := p.now()
		err := p.db.Update(ctx, func(tx *state.Tx) error {
			snap, err := p.load(tx, c, now)
			if err != nil {
				return err
			}
			now = snap.now
			if d, err = decide(snap); err != nil {
				return err
			}
			ks := snap.ks
			waited := now.Sub(start)
			if d.admit {
				id, err := tx.InsertAttempt(state.Attempt{CallID: c.CallID, Attempt: c.Attempt, Key: c.Key.Name,
					Caller: c.Caller, Transport: c.Transport, Method: c.Method, Target: c.Target, Digest: c.Digest,
					State: state.Admitted, Reason: d.reason, Probe: d.probe, At: now, Wait: waited,
					LeaseUntil: now.Add(p.lease())})
				if err != nil {
					return err
				}
				ks.LastAdmitAt = now
				if ks.Interval > 0 { // slow start: the pace doubles with every admission
					ks.Interval /= 2
					if ks.Interval < time.Duration(float64(time.Second)/c.Key.MaxRate) {
						ks.Interval = 0
					}
				}
				if d.probe {
					ks.ProbeAttempt, ks.ProbeUntil = id, now.Add(p.lease())
				}
				t = Ticket{ID: id, Call: c, Probe: d.probe, AdmittedAt: now, Waited: waited, SlowDown: d.slow, Reason: d.reason}
				return tx.PutKeyState(ks)
			}
			if d.exhaust && d.wait >= time.Second {
				// After a pause the pace rises gradually.
				if s := slowStart(c.Key, snap.known); ks.Interval < s {
					ks.Interval = s
					if err := tx.PutKeyState(ks); err != nil {
						return err
					}
				}
			}
			if now.Add(d.wait).After(deadline) {
				retry := d.wait
				if d.poll {
					retry = time.Second
				}
				pause = &PauseError{Key: c.Key.Name, RetryAfter: retry, Reason: d.reason, Source: d.source, Binding: d.binding}
				_, err := tx.InsertAttempt(state.Attempt{CallID: c.CallID, Attempt: c.Attempt, Key: c.Key.Name,
					Caller: c.Caller, Transport: c.Transport, Method: c.Method, Target: c.Target, Digest: c.Digest,
					State: state.RejectedLocal, Reason: pauseReason(pause), At: now, Wait: waited})
				return err
			}
			if hasReserve(c.Key, c.Caller) {
				return tx.Claim(c.Key.Name, c.Caller, now.Add(d.wait+time.Second))
			}
			return nil
		})
		if err != nil {
			return Ticket{}, fmt.Errorf("pacer: admit %s: %w", c.Key.Name, err)
		}
		if d.admit {
			return t, nil
		}
		if pause != nil {
			return Ticket{}, pause
		}
		wait := d.wait
		if c.Progress != nil && now.Sub(lastProgress) >= time.Second {
			c.Progress(Progress{Waited: now.Sub(start), Total: now.Sub(start) + d.wait, Reason: d.reason})
			lastProgress = now
		}
		if c.Progress != nil && wait > time.Second {
			wait = time.Second // report progress about once a second
		}
		if err := sleep(ctx, wait, wake); err != nil {
			return Ticket{}, err
		}
	}
}

// pauseReason is the activity's record of a refusal.
func pauseReason(e *PauseError) string {
	return fmt.Sprintf("refused locally, retry after %s: %s", seconds(e.RetryAfter), e.Reason)
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
func slowStart(k *keystore.Key, known []state.Known) time.Duration {
	s := time.Duration(float64(time.Second) / k.MaxRate)
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

// load reads what a decision about c needs, inside tx.
func (p *Pacer) load(tx *state.Tx, c Call, now time.Time) (snapshot, error) {
	key := c.Key.Name
	ks, err := tx.KeyState(key)
	if err != nil {
		return snapshot{}, err
	}
	// A clock that steps back must not re-admit calls.
	if now.Before(ks.LastAdmitAt) {
		now = ks.LastAdmitAt
	}
	s := snapshot{now: now, key: c.Key, caller: c.Caller, route: c.route(), ks: ks, log: txLog{tx, key}}
	if s.known, err = tx.Known(key); err != nil {
		return s, err
	}
	if s.gates, err = tx.Gates(key, now); err != nil {
		return s, err
	}
	if s.inFlight, err = tx.InFlight(key, now); err != nil {
		return s, err
	}
	for _, r := range c.Key.Reserves {
		ok, err := tx.Claimed(key, r.Caller, now)
		if err != nil {
			return s, err
		}
		if ok {
			if s.claimed == nil {
				s.claimed = map[string]bool{}
			}
			s.claimed[r.Caller] = true
		}
	}
	return s, nil
}

// txLog reads the sliding-window log of one key inside a transaction.
type txLog struct {
	tx  *state.Tx
	key string
}

func (l txLog) Count(since time.Time) (int, error) { return l.tx.Count(l.key, since) }
func (l txLog) CountBy(caller string, since time.Time) (int, error) {
	return l.tx.CountBy(l.key, caller, since)
}
func (l txLog) Nth(since time.Time, n int) (time.Time, error) { return l.tx.Nth(l.key, since, n) }

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

func (p *Pacer) signal(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ch, ok := p.wake[key]; ok {
		close(ch)
		delete(p.wake, key)
	}
}

// sleep waits d, or until wake closes, or until ctx ends.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-wake:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ceilSeconds rounds d up to whole seconds, at least 1 when d > 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}
