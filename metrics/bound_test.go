package metrics_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/metrics"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/state"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// TestSeriesBoundedWithManyKeys: with 1,000 keys (the first with 40
// documented policies, the others with 2) and calls on every one of them,
// a scrape's budget side stays within MaxBudgetSeries: 100 keys by name,
// the others summed under key="other"; 16 budgets by name per key and
// origin, the others summed under policy="other". Nothing is dropped:
// the "other" series hold the sums of what they stand for.
func TestSeriesBoundedWithManyKeys(t *testing.T) {
	var cfg testkit.Config
	wantOtherKeys := 0 // the limits of keys 100…999 summed
	wantOtherPolicies := 0
	for i := range 1000 {
		k := testkit.Key{Name: fmt.Sprintf("k%04d", i), BaseURL: fmt.Sprintf("https://api%d.example.com", i), Auth: "none"}
		n := 2
		if i == 0 {
			n = 40
		}
		for p := range n {
			q := 10 + i + p
			k.Policies = append(k.Policies, testkit.Policy{Name: fmt.Sprintf("p%02d", p), Quota: int64(q), Window: time.Duration(60+p) * time.Second})
			if i >= 100 {
				wantOtherKeys += q
			}
			if i == 0 && p >= 16 {
				wantOtherPolicies += q
			}
		}
		cfg.Keys = append(cfg.Keys, k)
	}
	keys, err := keystore.Parse([]byte(cfg.TOML()), keystore.Env{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	db := testkit.OpenState(t, state.Open)
	m := metrics.New(keys, pacer.New(db), db)
	m.ScrapeTimeout = time.Hour // reading 1,000 keys on a loaded machine is slow; that is not what is tested
	for i := range 1000 {
		for _, caller := range []string{"a", "b", "c"} {
			m.Observe(upstream.Event{Kind: upstream.Ended, Key: fmt.Sprintf("k%04d", i), Caller: caller, Transport: "rest", State: "confirmed"})
		}
		m.Observe(upstream.Event{Kind: upstream.Attempted, Key: fmt.Sprintf("k%04d", i), Status: 200})
	}
	text := scrape(t, m, keystore.Local("ops"))

	budgetSide, all := 0, 0
	keyNames := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "mcp_quota_") {
			continue
		}
		all++
		if strings.HasPrefix(line, "mcp_quota_calls_total") || strings.HasPrefix(line, "mcp_quota_attempts_total") ||
			strings.HasPrefix(line, "mcp_quota_local_refusals_total") || strings.HasPrefix(line, "mcp_quota_admission_wait") ||
			strings.HasPrefix(line, "mcp_quota_upstream_latency") {
			continue
		}
		budgetSide++
		if i := strings.Index(line, `key="`); i >= 0 {
			keyNames[line[i+5:i+5+strings.IndexByte(line[i+5:], '"')]] = true
		}
	}
	t.Logf("1,000 keys: %d series in all (%d on the budget side; the bound is %d), %d bytes a scrape",
		all, budgetSide, metrics.MaxBudgetSeries, len(text))
	if budgetSide > metrics.MaxBudgetSeries {
		t.Errorf("the budget side holds %d series, past its bound of %d", budgetSide, metrics.MaxBudgetSeries)
	}
	if len(keyNames) != 101 || !keyNames["other"] || !keyNames["k0099"] || keyNames["k0100"] {
		t.Errorf("the budget side names %d keys; want k0000…k0099 and other", len(keyNames))
	}
	for _, want := range []string{
		fmt.Sprintf(`mcp_quota_budget_limit{key="other",origin="local",partition="other",policy="other"} %g`, float64(wantOtherKeys)),
		fmt.Sprintf(`mcp_quota_budget_limit{key="k0000",origin="local",partition="other",policy="other"} %d`, wantOtherPolicies),
		`mcp_quota_budget_limit{key="k0000",origin="local",partition="",policy="p15"} 25`,
		`mcp_quota_circuit_state{key="other",state="closed"} 900`,
		`mcp_quota_state_up{key="other"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the scrape lacks %s", want)
		}
	}
	if strings.Contains(text, `policy="p16"`) {
		t.Errorf("key k0000's 17th policy has a series of its own")
	}
}
