package rest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// limits announces every budget whose remaining is known, a policy both
// documented and announced once, as the tighter of the two (fewer left,
// or as many left for longer), and no limit the upstream never
// announced; after a refusal, a budget whose remaining is unknown too,
// as 0.
func TestLimits(t *testing.T) {
	budget := func(policy string, q, r int64, reset time.Duration) pacer.Budget {
		return pacer.Budget{Policy: policy, Unit: ratelimit.Requests, Limit: q, Window: time.Minute, Remaining: r, Reset: reset}
	}
	limit := func(policy string, q, r int64, reset time.Duration) ratelimit.Limit {
		return ratelimit.Limit{Policy: policy, Unit: ratelimit.Requests, Quota: q, Window: time.Minute, Remaining: r, Reset: reset}
	}
	hidden := budget("hidden", 60, 2, time.Minute)
	hidden.Hidden = true
	for _, tt := range []struct {
		name    string
		budgets []pacer.Budget
		refused bool
		want    []ratelimit.Limit
	}{
		{"fewer left is tighter",
			[]pacer.Budget{budget("default", 100, 40, 10*time.Second), budget("default", 100, 30, 5*time.Second)}, false,
			[]ratelimit.Limit{limit("default", 100, 30, 5*time.Second)}},
		{"as many left for longer is tighter",
			[]pacer.Budget{budget("default", 100, 30, 10*time.Second), budget("default", 100, 30, 40*time.Second)}, false,
			[]ratelimit.Limit{limit("default", 100, 30, 40*time.Second)}},
		{"as many left for less long is not",
			[]pacer.Budget{budget("default", 100, 30, 40*time.Second), budget("default", 100, 30, 10*time.Second)}, false,
			[]ratelimit.Limit{limit("default", 100, 30, 40*time.Second)}},
		{"a hidden limit is not announced",
			[]pacer.Budget{budget("default", 100, 30, 10*time.Second), hidden}, false,
			[]ratelimit.Limit{limit("default", 100, 30, 10*time.Second)}},
		{"an unknown remaining is left out",
			[]pacer.Budget{budget("default", 100, -1, 0)}, false, nil},
		{"after a refusal, an unknown remaining is 0",
			[]pacer.Budget{budget("default", 100, -1, 0)}, true,
			[]ratelimit.Limit{limit("default", 100, 0, 0)}},
	} {
		if diff := cmp.Diff(tt.want, limits(tt.budgets, tt.refused)); diff != "" {
			t.Errorf("%s: limits (-want +got):\n%s", tt.name, diff)
		}
	}
}
