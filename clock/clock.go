// Package clock is the time the stateful parts of mcp-quota read and wait
// on: the real one, or a test's (internal/testkit's Clock), behind one
// small interface. A field or option of type Clock whose value is nil
// means real time (Or turns it into Real).
package clock

import (
	"context"
	"time"
)

// A Clock tells the time and runs timers on it. Real is the wall clock;
// a test's clock moves only when the test moves it, and fires its timers
// then. Implementations are safe for concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a timer that sends the time on the returned
	// channel once d has passed, unless it is stopped first.
	NewTimer(d time.Duration) (Timer, <-chan time.Time)
	// AfterFunc calls f once d has passed, unless the timer it returns
	// is stopped first.
	AfterFunc(d time.Duration, f func()) Timer
}

// A Timer is a timer of a Clock.
type Timer interface {
	// Stop prevents the timer from firing. It reports whether it did:
	// false when the timer fired or was stopped already.
	Stop() bool
}

// Real is the wall clock: time.Now and the time package's timers.
var Real Clock = real{}

// Or returns c, or Real when c is nil.
func Or(c Clock) Clock {
	if c == nil {
		return Real
	}
	return c
}

type real struct{}

func (real) Now() time.Time { return time.Now() }

func (real) NewTimer(d time.Duration) (Timer, <-chan time.Time) {
	t := time.NewTimer(d)
	return t, t.C
}

func (real) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Sleep waits d on c, or until wake closes (when not nil), or until ctx
// ends; it returns ctx's error in that last case, nil otherwise.
func Sleep(ctx context.Context, c Clock, d time.Duration, wake <-chan struct{}) error {
	t, fired := Or(c).NewTimer(d)
	defer t.Stop()
	select {
	case <-fired:
		return nil
	case <-wake:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Source returns a Clock that reads the time from now — the wall clock
// seen through another source, such as a database server's clock or a
// clock set off by a skew — and runs its timers as Real does: a duration
// on one is the same on the other.
func Source(now func() time.Time) Clock { return source{now} }

type source struct{ now func() time.Time }

func (s source) Now() time.Time                                   { return s.now() }
func (source) NewTimer(d time.Duration) (Timer, <-chan time.Time) { return Real.NewTimer(d) }
func (source) AfterFunc(d time.Duration, f func()) Timer          { return Real.AfterFunc(d, f) }
