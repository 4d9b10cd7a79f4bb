package pacer

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// Which failures are evidence about their route alone.
func TestRouteEvidence(t *testing.T) {
	for _, tt := range []struct {
		name string
		o    Outcome
		rd   ratelimit.Reading
		want bool
	}{
		{"503 without a signal", Outcome{Status: 503}, ratelimit.Reading{}, true},
		{"500 without a signal", Outcome{Status: 500}, ratelimit.Reading{}, true},
		{"502, 504", Outcome{Status: 504}, ratelimit.Reading{}, true},
		{"503 with Retry-After", Outcome{Status: 503}, ratelimit.Reading{HasRetryAfter: true, RetryAfter: time.Second}, false},
		{"503 with a RateLimit field", Outcome{Status: 503}, ratelimit.Reading{Observations: []ratelimit.Observation{{Policy: "p"}}}, false},
		{"503 with a problem (reduced capacity)", Outcome{Status: 503}, ratelimit.Reading{Problem: &ratelimit.Problem{Type: ratelimit.ProblemTemporaryReducedCapacity}}, false},
		{"503 that says it throttles", Outcome{Status: 503}, ratelimit.Reading{Throttled: true}, false},
		{"429", Outcome{Status: http.StatusTooManyRequests}, ratelimit.Reading{}, false},
		{"no answer", Outcome{Err: errors.New("connection refused")}, ratelimit.Reading{}, false},
		{"501: not a failure of capacity", Outcome{Status: 501}, ratelimit.Reading{}, false},
	} {
		if got := routeEvidence(tt.o, &tt.rd); got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}

// A route's failures: backoff, its circuit after BreakerThreshold, again
// at once when it fails soon after its circuit closed, and a clean slate
// once its failures are old.
func TestRouteFailure(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name       string
		ps         ledger.PathState
		at         time.Duration // after t0
		want       ledger.PathState
		wantWait   time.Duration
		wantOpened bool
	}{
		{"first failure", ledger.PathState{}, 0,
			ledger.PathState{Failures: 1, LastAt: t0}, 1500 * time.Millisecond, false},
		{"third in a row", ledger.PathState{Failures: 2, LastAt: t0}, 5 * time.Second,
			ledger.PathState{Failures: 3, LastAt: t0.Add(5 * time.Second)}, 3 * time.Second, false},
		{"fifth: the circuit opens", ledger.PathState{Failures: 4, LastAt: t0}, time.Second,
			ledger.PathState{Opens: 1, HalfOpen: true, LastAt: t0.Add(time.Second)}, BreakerCooldown, true},
		{"soon after the circuit closed: open again, twice as long", ledger.PathState{Opens: 1, HalfOpen: true, LastAt: t0}, BreakerCooldown + time.Second,
			ledger.PathState{Opens: 2, HalfOpen: true, LastAt: t0.Add(BreakerCooldown + time.Second)}, 2 * BreakerCooldown, true},
		{"long after the circuit closed: counted from one", ledger.PathState{Opens: 1, HalfOpen: true, LastAt: t0}, BreakerCooldown + PathWindow + time.Second,
			ledger.PathState{Failures: 1, Opens: 1, LastAt: t0.Add(BreakerCooldown + PathWindow + time.Second)}, 1500 * time.Millisecond, false},
		{"old failures are not counted", ledger.PathState{Failures: 4, LastAt: t0}, PathWindow + time.Second,
			ledger.PathState{Failures: 1, LastAt: t0.Add(PathWindow + time.Second)}, 1500 * time.Millisecond, false},
		{"opens forgotten after pathMemory", ledger.PathState{Failures: 4, Opens: 3, LastAt: t0}, pathMemory + time.Second,
			ledger.PathState{Failures: 1, LastAt: t0.Add(pathMemory + time.Second)}, 1500 * time.Millisecond, false},
	} {
		got, wait, opened := routeFailure(tt.ps, t0.Add(tt.at), 0.5)
		if got != tt.want || wait != tt.wantWait || opened != tt.wantOpened {
			t.Errorf("%s: got %+v, wait %s, opened %v; want %+v, %s, %v", tt.name, got, wait, opened, tt.want, tt.wantWait, tt.wantOpened)
		}
	}
	for n, want := range map[int]bool{1: false, PathSpread - 1: false, PathSpread: true, 10: true} {
		if got := widens(n); got != want {
			t.Errorf("widens(%d) = %v, want %v", n, got, want)
		}
	}
}
