package testkit

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mcp-quota/mcp-quota/clock"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// A Clock's timers fire when the clock is moved past them, in the order
// they are due, and not before; a stopped one never does.
func TestClockFiresTimersWhenMoved(t *testing.T) {
	c := NewClock(t0)
	var fired []string
	c.AfterFunc(3*time.Second, func() { fired = append(fired, "3s") })
	c.AfterFunc(time.Second, func() { fired = append(fired, "1s") })
	stopped := c.AfterFunc(2*time.Second, func() { fired = append(fired, "2s") })
	tm, ch := c.NewTimer(2 * time.Second)

	c.Advance(999 * time.Millisecond)
	if len(fired) != 0 || c.Timers() != 4 {
		t.Fatalf("before any is due: fired %v, %d pending; want none fired, 4 pending", fired, c.Timers())
	}
	if !stopped.Stop() || stopped.Stop() {
		t.Error("Stop of a pending timer: want true once, then false")
	}
	c.Advance(time.Millisecond)
	if !slices.Equal(fired, []string{"1s"}) {
		t.Errorf("at 1 s: fired %v, want [1s]", fired)
	}
	c.Set(t0.Add(5 * time.Second))
	if !slices.Equal(fired, []string{"1s", "3s"}) {
		t.Errorf("at 5 s: fired %v, want [1s 3s]", fired)
	}
	select {
	case at := <-ch:
		if !at.Equal(t0.Add(5 * time.Second)) {
			t.Errorf("the timer's tick: %v, want the clock's time when it fired", at)
		}
	default:
		t.Error("the 2 s timer did not tick by 5 s")
	}
	if tm.Stop() {
		t.Error("Stop of a fired timer: want false")
	}
	if c.Timers() != 0 {
		t.Errorf("%d timers pending after all fired or stopped, want 0", c.Timers())
	}
}

// A timer's function may set another timer; one already due fires before
// the move that made it due returns.
func TestClockTimerSetsTimer(t *testing.T) {
	c := NewClock(t0)
	var at []time.Duration
	c.AfterFunc(time.Second, func() {
		at = append(at, c.Now().Sub(t0))
		c.AfterFunc(0, func() { at = append(at, c.Now().Sub(t0)) })
	})
	c.Advance(10 * time.Second)
	if want := []time.Duration{10 * time.Second, 10 * time.Second}; !slices.Equal(at, want) {
		t.Errorf("fired at %v, want %v", at, want)
	}
}

// clock.Sleep on a test Clock returns once the clock is moved past it,
// or at once when its context ends.
func TestSleepOnClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := NewClock(t0)
		done := make(chan error, 1)
		go func() { done <- clock.Sleep(context.Background(), c, time.Minute, nil) }()
		synctest.Wait() // the sleeper waits on its timer
		c.Advance(time.Minute - time.Nanosecond)
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("Sleep returned %v before the clock reached its end", err)
		default:
		}
		c.Advance(time.Nanosecond)
		if err := <-done; err != nil {
			t.Errorf("Sleep: %v, want nil", err)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := clock.Sleep(ctx, NewClock(t0), time.Hour, nil); err != context.Canceled {
		t.Errorf("Sleep with an ended context: %v, want context.Canceled", err)
	}
}

// WaitTimer returns once a timer due within its span is pending, not
// for one outside it, with how far from now it is due; it returns the
// context's error when the context ends.
func TestWaitTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := NewClock(t0)
		c.NewTimer(time.Hour) // outside the span waited for
		done := make(chan error, 1)
		due := make(chan time.Duration, 1)
		go func() {
			d, err := c.WaitTimer(context.Background(), time.Second, 2*time.Second)
			due <- d
			done <- err
		}()
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("WaitTimer returned %v with no timer in (1s, 2s]", err)
		default:
		}
		c.NewTimer(time.Second) // at the span's open end: not in it
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("WaitTimer returned %v for a timer due in 1s, want one due in (1s, 2s]", err)
		default:
		}
		c.NewTimer(1500 * time.Millisecond)
		if d, err := <-due, <-done; d != 1500*time.Millisecond || err != nil {
			t.Errorf("WaitTimer: %s, %v; want 1.5s, nil", d, err)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := NewClock(t0).WaitTimer(ctx, 0, time.Hour); err != context.Canceled {
		t.Errorf("WaitTimer with an ended context and no timer: %v, want context.Canceled", err)
	}
}
