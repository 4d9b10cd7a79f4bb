package pacer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
)

// A reservation keeps a share of every policy for its caller while the
// caller uses the key or waits for it; an idle reservation is lent.
func TestReservations(t *testing.T) {
	reserved := func() *keystore.Key {
		k := newKey(policy("default", 10, time.Minute))
		k.Reserves = []keystore.Reserve{{Caller: "agent", Share: 0.2}}
		return k
	}
	t.Run("idle, lent", func(t *testing.T) {
		e := newEnv(t)
		k := reserved()
		for range 10 {
			e.mustAdmit(k, "sync", "/items")
			e.clk.advance(time.Millisecond)
		}
		e.mustPause(k, "sync", "/items")
	})
	t.Run("in use, kept", func(t *testing.T) {
		e := newEnv(t)
		k := reserved()
		e.mustAdmit(k, "agent", "/items")
		for range 8 { // 10, less the agent's call, less the one left of its 2
			e.clk.advance(time.Millisecond)
			e.mustAdmit(k, "sync", "/items")
		}
		e.clk.advance(time.Millisecond)
		pe := e.mustPause(k, "sync", "/items")
		if pe.Reason.Kind != reason.WindowSpent || pe.Reason.Held != 1 {
			t.Errorf("sync's pause: got %+v, want a spent window, 1 of it held for the reservation", pe.Reason)
		}
		e.mustAdmit(k, "agent", "/items") // the agent's own share
	})
	t.Run("waited for, kept", func(t *testing.T) {
		e := newEnv(t)
		k := reserved()
		// The agent waits in another process: it holds a claim.
		err := e.db.Update(context.Background(), func(tx ledger.Tx) error {
			return tx.Claim("k", "agent", e.clk.Now().Add(time.Minute))
		})
		if err != nil {
			t.Fatal(err)
		}
		for range 8 {
			e.mustAdmit(k, "sync", "/items")
			e.clk.advance(time.Millisecond)
		}
		e.mustPause(k, "sync", "/items")
		e.mustAdmit(k, "agent", "/items")
	})
}

// A sync job hammering a key cannot starve the agent: the agent waits at
// most until the sync job's first calls leave the window, then gets its
// share of every window it uses.
func TestSyncJobCannotStarveAgent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBubbleEnv(t)
		k := newKey(policy("default", 10, time.Minute))
		k.Reserves = []keystore.Reserve{{Caller: "agent", Share: 0.2}}
		ctx, stop := context.WithCancel(t.Context())
		call := func(caller string) (pacer.Ticket, error) {
			c := e.call(k, caller, "/items")
			c.MaxWait = 10 * time.Minute
			tk, err := e.p.Admit(ctx, c)
			if err == nil {
				_, err = e.p.Done(context.Background(), tk, pacer.Outcome{SentAt: time.Now(), AnsweredAt: time.Now(), Status: 200})
			}
			return tk, err
		}
		var mu sync.Mutex
		var admitted []time.Time
		var wg sync.WaitGroup
		wg.Go(func() { // the sync job
			for {
				tk, err := call("sync")
				if err != nil {
					return
				}
				mu.Lock()
				admitted = append(admitted, tk.AdmittedAt)
				mu.Unlock()
			}
		})
		time.Sleep(5 * time.Second) // the bubble's clock: the sync job took the whole lent window
		var waits []time.Duration
		for range 6 { // two a minute: the agent's share
			asked := time.Now()
			tk, err := call("agent")
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			admitted = append(admitted, tk.AdmittedAt)
			mu.Unlock()
			waits = append(waits, tk.AdmittedAt.Sub(asked))
			time.Sleep(30 * time.Second)
		}
		stop()
		wg.Wait()
		if waits[0] > 55*time.Second {
			t.Errorf("the agent's first call waited %v, want at most until the first of the sync job's calls leaves the window (55s)", waits[0])
		}
		for i, w := range waits[1:] {
			if w > time.Second {
				t.Errorf("the agent's call %d waited %v, want its reserved share at once (waits %v)", i+2, w, waits)
			}
		}
		if got := testkit.MostIn(admitted, time.Minute); got > 10 {
			t.Errorf("got %d calls in a minute, want at most 10", got)
		}
	})
}

// Within MaxWait a call waits (and reports progress); beyond it the
// answer is a pause, recorded with caller, time and reason, and nothing
// is sent.
func TestWaitOrPause(t *testing.T) {
	t.Run("wait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e := newBubbleEnv(t)
			k := newKey(policy("default", 1, 10*time.Second))
			first := time.Now()
			tk, err := e.p.Admit(t.Context(), e.call(k, "agent", "/items"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.p.Done(t.Context(), tk, pacer.Outcome{SentAt: first, AnsweredAt: first, Status: 200}); err != nil {
				t.Fatal(err)
			}
			var progress []pacer.Progress
			c := e.call(k, "agent", "/items")
			c.MaxWait = 15 * time.Second
			c.Progress = func(p pacer.Progress) { progress = append(progress, p) }
			tk, err = e.p.Admit(t.Context(), c)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := tk.AdmittedAt.Sub(first), 10*time.Second; got != want || tk.Waited != want {
				t.Errorf("got admitted after %v (waited %v), want %v", got, tk.Waited, want)
			}
			if len(progress) != 9 || progress[0].Total != 10*time.Second || progress[8].Waited != 9*time.Second {
				t.Errorf("got progress %+v, want one a second, of a 10 s wait", progress)
			}
		})
	})
	t.Run("pause", func(t *testing.T) {
		e := newEnv(t)
		k := newKey(policy("default", 1, 10*time.Second))
		e.send(k, "agent", 200, nil)
		e.clk.advance(time.Second)
		c := e.call(k, "sync", "/items?page=2")
		c.MaxWait = 8 * time.Second
		pe := mustPause(t, e.clk, e.p, c)
		if pe.RetryAfter != 9*time.Second {
			t.Errorf("got retry after %v, want 9s", pe.RetryAfter)
		}
		list := e.activity()
		got := list[len(list)-1]
		want := ledger.Attempt{ID: got.ID, CallID: c.CallID, Attempt: 1, Key: "k", Caller: "sync", Transport: "rest",
			Method: "GET", Target: "/items?page=2", State: ledger.RejectedLocal, At: e.clk.Now(),
			Reason:   reason.RefusedFor(9*time.Second, reason.Reason{Kind: reason.WindowSpent, Policy: "default", Limit: 1, Window: 10 * time.Second}),
			Instance: state.Instance()}
		if diff := cmp.Diff(got, want); diff != "" {
			t.Errorf("the refusal in the activity (-got +want):\n%s", diff)
		}
		if got, want := got.Reason.String(), "refused locally, retry after 9 s: all 1 calls per 10 s allowed by policy 'default' are used"; got != want {
			t.Errorf("the refusal says %q, want %q", got, want)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e := newBubbleEnv(t)
			k := newKey(policy("default", 1, 10*time.Second))
			if _, err := e.p.Admit(t.Context(), e.call(k, "agent", "/items")); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()
			c := e.call(k, "agent", "/items")
			c.MaxWait = time.Minute
			if _, err := e.p.Admit(ctx, c); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("got %v, want the context's error", err)
			}
		})
	})
	t.Run("woken by an answer", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e := newBubbleEnv(t)
			k := newKey()
			k.MaxConcurrency = 1
			first, err := e.p.Admit(t.Context(), e.call(k, "agent", "/items"))
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				time.Sleep(20 * time.Millisecond)
				e.p.Done(context.Background(), first, pacer.Outcome{SentAt: first.AdmittedAt, AnsweredAt: time.Now(), Status: 200})
			}()
			c := e.call(k, "sync", "/items")
			c.MaxWait = time.Second
			tk, err := e.p.Admit(t.Context(), c)
			if err != nil {
				t.Fatal(err)
			}
			// Woken by the answer, not by its next look (every pacer.Poll).
			if tk.Waited != 20*time.Millisecond {
				t.Errorf("got a wait of %v, want 20ms", tk.Waited)
			}
		})
	})
}

// Each state of a call is recorded apart, with when it was sent and
// answered.
func TestStatesOfACall(t *testing.T) {
	tests := []struct {
		status int
		err    error
		want   ledger.State
	}{
		{200, nil, ledger.Confirmed},
		{304, nil, ledger.Confirmed},
		{202, nil, ledger.Accepted},
		{404, nil, ledger.RejectedUpstream},
		{503, nil, ledger.Failed},
		{0, errors.New("connection reset"), ledger.Failed},
		{429, nil, ledger.RejectedUpstream},
	}
	e := newEnv(t)
	k := newKey()
	for _, tt := range tests {
		e.clk.advance(2 * time.Second) // past any backoff
		tk := e.mustAdmit(k, "agent", "/items")
		list := e.activity()
		if got := list[len(list)-1]; got.State != ledger.Admitted || got.InFlightUntil.IsZero() {
			t.Errorf("in flight: got %s with lease %v, want admitted with a lease", got.State, got.InFlightUntil)
		}
		sent := e.clk.Now().Add(10 * time.Millisecond)
		e.clk.advance(50 * time.Millisecond)
		o := pacer.Outcome{SentAt: sent, Status: tt.status, Err: tt.err}
		if tt.status > 0 {
			o.AnsweredAt = e.clk.Now()
		}
		res, err := e.p.Done(context.Background(), tk, o)
		if err != nil {
			t.Fatal(err)
		}
		list = e.activity()
		got := list[len(list)-1]
		if got.State != tt.want || res.State != tt.want || got.Status != tt.status || !got.SentAt.Equal(sent) ||
			!got.AnsweredAt.Equal(o.AnsweredAt) || !got.InFlightUntil.IsZero() {
			t.Errorf("status %d: got %s (Done said %s), status %d, sent %v, answered %v, lease %v; want %s",
				tt.status, got.State, res.State, got.Status, got.SentAt, got.AnsweredAt, got.InFlightUntil, tt.want)
		}
	}
}

// Each retry by the HTTP layer is an attempt of its own, and each counts.
func TestEachRetryCounts(t *testing.T) {
	e := newEnv(t)
	k := newKey(policy("default", 2, time.Minute))
	c := e.call(k, "agent", "/items")
	for n := 1; n <= 3; n++ {
		c.Attempt = n
		tk, err := e.p.Admit(context.Background(), c)
		if n == 3 {
			if !errors.Is(err, pacer.ErrPaused) {
				t.Fatalf("third attempt: got %v, want a pause: the two before count", err)
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		e.clk.advance(10 * time.Millisecond)
		e.answer(tk, 503, reading(time.Second))
		e.clk.advance(2 * time.Second) // past Retry-After, and slow start's first step

	}
	var attempts []int
	for _, a := range e.activity() {
		if a.CallID == c.CallID && a.State != ledger.RejectedLocal {
			attempts = append(attempts, a.Attempt)
		}
	}
	if diff := cmp.Diff(attempts, []int{1, 2}); diff != "" {
		t.Errorf("attempts recorded (-got +want):\n%s", diff)
	}
}

// A clock that steps back never re-admits calls a window already holds:
// nothing is admitted until it passes the latest admission again.
func TestClockSteppingBack(t *testing.T) {
	e := newEnv(t)
	k := newKey(policy("default", 3, time.Minute))
	e.send(k, "agent", 200, nil)
	e.clk.advance(time.Second)
	e.send(k, "agent", 200, nil)
	e.clk.advance(-2 * time.Minute) // the clock steps back
	pe := e.mustPause(k, "agent", "/items")
	if want := 2*time.Minute + time.Millisecond; pe.RetryAfter != want {
		t.Errorf("behind the latest admission: got retry after %v, want %v", pe.RetryAfter, want)
	}
	e.clk.advance(2*time.Minute + 30*time.Second) // …and is set right
	e.send(k, "agent", 200, nil)
	if pe := e.mustPause(k, "agent", "/items"); pe.RetryAfter != 29*time.Second {
		t.Errorf("got retry after %v, want 29s, until the first call leaves the window", pe.RetryAfter)
	}
}

// A full window stays full up to the microsecond its oldest call leaves
// it: an admission a fraction of a microsecond before that, which the
// file records at the microsecond before, is refused.
func TestWindowFullToTheMicrosecond(t *testing.T) {
	e := newEnv(t)
	k := newKey(policy("default", 2, time.Second))
	e.send(k, "agent", 200, nil) // answered at once: no margin
	e.clk.advance(time.Millisecond)
	e.send(k, "agent", 200, nil)
	e.clk.advance(time.Second - time.Millisecond - 500*time.Nanosecond) // the first leaves in 0.5 µs
	if pe := e.mustPause(k, "agent", "/items"); pe.RetryAfter != time.Microsecond {
		t.Errorf("got retry after %v, want 1µs, until the first call leaves the window", pe.RetryAfter)
	}
	e.clk.advance(500 * time.Nanosecond)
	e.mustAdmit(k, "agent", "/items")
}

// A key built in code with its safety limits left zero gets the defaults.
func TestZeroSafetyLimitsMeanDefaults(t *testing.T) {
	e := newEnv(t)
	k := &keystore.Key{Name: "bare"}
	e.mustAdmit(k, "agent", "/items")
	pe := e.mustPause(k, "agent", "/items")
	if want := time.Duration(float64(time.Second) / keystore.DefaultMaxRate); pe.Source != "pace" || pe.RetryAfter != want {
		t.Errorf("got %s for %v, want pace for %v", pe.Source, pe.RetryAfter, want)
	}
}

// TestCallerAbortIsNotTheUpstreamsFault: an attempt that failed on the
// caller's side (its body too large, it went away) sets no backoff gate
// and does not count towards the circuit breaker; the same failure from
// the network does.
func TestCallerAbortIsNotTheUpstreamsFault(t *testing.T) {
	for _, abort := range []bool{true, false} {
		e := newEnv(t)
		k := newKey()
		tk := e.mustAdmit(k, "sync", "/upload")
		if _, err := e.p.Done(context.Background(), tk, pacer.Outcome{SentAt: e.clk.Now(), Err: errors.New("body too large"), CallerAbort: abort}); err != nil {
			t.Fatal(err)
		}
		var gates []ledger.Gate
		var ks ledger.KeyState
		e.db.View(context.Background(), func(tx ledger.ReadTx) error {
			gates, _ = tx.Gates(k.Name, e.clk.Now())
			ks, _ = tx.KeyState(k.Name)
			return nil
		})
		if abort && (len(gates) != 0 || ks.Failures != 0) {
			t.Errorf("caller abort: gates %v, failures %d; want none", gates, ks.Failures)
		}
		if !abort && ks.Failures != 1 {
			t.Errorf("network failure: failures %d, want 1", ks.Failures)
		}
	}
}
