package testkit

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/mcp-quota/mcp-quota/clock"
)

// A Clock is a test's time (a clock.Clock): it moves only when the test
// moves it (Advance, Set), and fires then, in the order they are due, the
// timers whose time has come. A timer's channel holds one tick; an
// AfterFunc's function runs in the goroutine that moved the clock, before
// Advance or Set returns, so a test knows it has run. The zero Clock
// reads the zero time; a Clock is safe for concurrent use.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*timer      // pending, in no particular order
	n      int           // timers made, to fire timers due together in the order they were made
	made   chan struct{} // closed when the next timer is made; nil until WaitTimer needs it
}

// NewClock returns a Clock reading at.
func NewClock(at time.Time) *Clock { return &Clock{now: at} }

var _ clock.Clock = (*Clock)(nil)

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock d forward (back, when d is negative) and fires
// the timers due by then.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
	c.fire()
}

// Set moves the clock to at and fires the timers due by then.
func (c *Clock) Set(at time.Time) {
	c.mu.Lock()
	c.now = at
	c.mu.Unlock()
	c.fire()
}

// NewTimer returns a timer whose channel receives the clock's time once
// the clock has moved d on.
func (c *Clock) NewTimer(d time.Duration) (clock.Timer, <-chan time.Time) {
	ch := make(chan time.Time, 1)
	t := c.add(d, func(now time.Time) {
		select {
		case ch <- now:
		default:
		}
	})
	return t, ch
}

// AfterFunc calls f once the clock has moved d on, in the goroutine that
// moved it.
func (c *Clock) AfterFunc(d time.Duration, f func()) clock.Timer {
	return c.add(d, func(time.Time) { f() })
}

// Timers returns how many timers are waiting for the clock to move.
func (c *Clock) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// TimersBeyond returns how many timers are due more than d from now: a
// test that counts the timers of one part on a clock others share too
// (a state's journal lingers for milliseconds) counts those beyond what
// the others set.
func (c *Clock) TimersBeyond(d time.Duration) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if t.at.Sub(c.now) > d {
			n++
		}
	}
	return n
}

// WaitTimer waits until a timer due more than from and at most to from
// the clock's time is pending, and returns how far from now the first of
// them is due; or until ctx is done, and returns its error. A test that
// must move the clock past a wait the code under test sets in a
// goroutine of its own (a retry's backoff) waits for that timer, then
// moves the clock that far.
func (c *Clock) WaitTimer(ctx context.Context, from, to time.Duration) (time.Duration, error) {
	for {
		c.mu.Lock()
		first, found := to, false
		for _, t := range c.timers {
			if d := t.at.Sub(c.now); d > from && d <= first {
				first, found = d, true
			}
		}
		if found {
			c.mu.Unlock()
			return first, nil
		}
		if c.made == nil {
			c.made = make(chan struct{})
		}
		made := c.made
		c.mu.Unlock()
		select {
		case <-made:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// add registers a timer due d from now, firing at once when d <= 0.
func (c *Clock) add(d time.Duration, f func(time.Time)) *timer {
	c.mu.Lock()
	c.n++
	t := &timer{c: c, at: c.now.Add(d), seq: c.n, f: f}
	c.timers = append(c.timers, t)
	if c.made != nil {
		close(c.made)
		c.made = nil
	}
	c.mu.Unlock()
	if d <= 0 {
		c.fire()
	}
	return t
}

// fire runs every timer due by the clock's time, earliest first, without
// holding the clock's lock: a timer's function may read the clock or set
// another timer.
func (c *Clock) fire() {
	for {
		c.mu.Lock()
		now := c.now
		i := -1
		for j, t := range c.timers {
			if !t.at.After(now) && (i < 0 || t.before(c.timers[i])) {
				i = j
			}
		}
		if i < 0 {
			c.mu.Unlock()
			return
		}
		t := c.timers[i]
		c.timers = slices.Delete(c.timers, i, i+1)
		c.mu.Unlock()
		t.f(now)
	}
}

// A timer is one of a Clock's pending timers.
type timer struct {
	c   *Clock
	at  time.Time
	seq int
	f   func(now time.Time)
}

func (t *timer) before(u *timer) bool {
	return t.at.Before(u.at) || (t.at.Equal(u.at) && t.seq < u.seq)
}

// Stop removes the timer; it reports whether it was still pending.
func (t *timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	i := slices.Index(t.c.timers, t)
	if i < 0 {
		return false
	}
	t.c.timers = slices.Delete(t.c.timers, i, i+1)
	return true
}
