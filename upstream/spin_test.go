package upstream

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer"
)

// An upstream that answers every request with 429 and Retry-After: 0, for
// ever, gets at most a handful of requests in a minute, whatever its
// callers do: one that honours each pause, one that ignores it and asks
// again every 50 ms, and one that is willing to wait long. A wait of 0 is
// floored and a repeated refusal backs off to the circuit breaker; never
// a tight loop. (Fake time: synctest's clock runs only when every
// goroutine waits.)
func TestRetryAfterZeroForeverIsNoSpin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var sent []time.Time
		f := &fake{answer: func(int, *http.Request) *http.Response {
			mu.Lock()
			sent = append(sent, time.Now())
			mu.Unlock()
			return respond(http.StatusTooManyRequests, "Retry-After", "0")
		}}
		c, _ := newClient(t, f)
		k := newKey(t, "bearer")
		start := time.Now()
		end := start.Add(time.Minute)

		var wg sync.WaitGroup
		caller := func(name string, maxWait time.Duration, next func(error) time.Duration) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(end) {
					resp, err := c.Do(context.Background(), k, Request{Caller: name, Transport: "test", Path: "/x", MaxWait: maxWait})
					if err == nil {
						resp.Body.Close()
					}
					time.Sleep(min(next(err), time.Until(end)+time.Millisecond))
				}
			}()
		}
		honours := func(err error) time.Duration {
			if pe := (*pacer.PauseError)(nil); errors.As(err, &pe) {
				return pe.RetryAfter
			}
			return 10 * time.Millisecond
		}
		caller("polite", 0, honours)
		caller("impatient", 0, func(error) time.Duration { return 50 * time.Millisecond })
		caller("patient", 10*time.Second, honours)
		wg.Wait()

		mu.Lock()
		defer mu.Unlock()
		if n := len(sent); n == 0 || n > 6 {
			t.Errorf("the upstream got %d requests in a minute, want 1 to 6 (floor, backoff, circuit breaker)", n)
		}
		for i := 1; i < len(sent); i++ {
			if gap := sent[i].Sub(sent[i-1]); gap < pacer.RetryFloor {
				t.Errorf("requests %d and %d went %v apart, want at least %v", i, i+1, gap, pacer.RetryFloor)
				break
			}
		}
		if len(sent) <= 20 {
			t.Logf("requests at %v", offsets(sent, start))
		}
	})
}

func offsets(ts []time.Time, start time.Time) []time.Duration {
	out := make([]time.Duration, len(ts))
	for i, ts := range ts {
		out[i] = ts.Sub(start)
	}
	return out
}
