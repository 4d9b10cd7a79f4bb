package bench

import (
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/demo"
)

// oracleStep is how often the oracle asks again: the resolution of
// Allowed.
const oracleStep = time.Millisecond

// Allowed returns what the upstream configured by cfg allows one key in
// a run of length d: len(Oracle(cfg, d)).
func Allowed(cfg demo.Config, d time.Duration) int {
	return len(Oracle(cfg, d))
}

// Oracle returns when, from a run's start, the upstream configured by cfg
// accepts the calls of an oracle client in a run of length d: one that,
// every
// millisecond from the run's start to its end, it sends until every
// server has refused (Servers refusals in a row). Nobody can do better:
// the oracle starts every window as early as the upstream lets it and
// fills it, and its refusals cost it nothing. For a fixed or sliding
// window of Quota per Window this is Quota × ⌈d / Window⌉; for the hidden
// behaviour's two fixed windows it is LongQuota per long window (as long
// as the short one admits that many). cfg.Clock and cfg.Tokens are
// replaced: Oracle runs on its own simulated clock and never sleeps.
func Oracle(cfg demo.Config, d time.Duration) []time.Duration {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	cfg.Clock = clock.Source(func() time.Time { return now })
	cfg.Tokens = []string{"oracle"}
	api := demo.New(cfg)
	servers := max(cfg.Servers, 1)
	req := httptest.NewRequest(http.MethodGet, "/v1/echo", nil)
	req.Header.Set("Authorization", "Bearer oracle")
	for ; now.Before(start.Add(d)); now = now.Add(oracleStep) {
		for refused := 0; refused < servers; {
			rec := httptest.NewRecorder()
			api.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK { // an admitted GET /v1/echo is 200
				refused++
			} else {
				refused = 0
			}
		}
	}
	var out []time.Duration
	for _, t := range api.Stats("oracle").Accepted {
		out = append(out, t.Sub(start))
	}
	return out
}

// Sustained returns the share of the upstream's pace a client kept up,
// free of where the run happened to end: the time the oracle took to
// reach the last of its window openings (a call that follows a pause) that
// the client also reached, counting calls, divided by the time the client
// took to reach it. accepted and oracle are the times the client's and the
// oracle's calls were accepted, from the run's start, in order. A client
// that opens every window as early as the oracle scores 1; one that opens
// them 10% later scores about 0.91, however many calls it then squeezes
// into the run's last window. ok is false when the client reached no
// opening; the run's share is then the only measure.
func Sustained(accepted, oracle []time.Duration) (share float64, ok bool) {
	for i := min(len(accepted), len(oracle)) - 1; i > 0; i-- {
		if oracle[i] > oracle[i-1] && accepted[i] > 0 {
			return min(1, float64(oracle[i])/float64(accepted[i])), true
		}
	}
	return 0, false
}
