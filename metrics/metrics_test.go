package metrics_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/metrics"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
	"github.com/mcp-quota/mcp-quota/upstream"
)

func newMetrics(t *testing.T) (*metrics.Metrics, *state.DB) {
	t.Helper()
	keys, err := keystore.Parse([]byte(testkit.Keys(testkit.Key{Name: "k", BaseURL: "https://api.example.com", Auth: "none",
		Policies: testkit.Window(10, time.Minute)})), keystore.Env{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	db := testkit.OpenState(t, state.Open)
	return metrics.New(keys, pacer.New(db), db), db
}

func scrape(t *testing.T, m *metrics.Metrics, caller *keystore.Caller) string {
	t.Helper()
	r := httptest.NewRequest("GET", "/metrics", nil)
	if caller != nil {
		r = r.WithContext(keystore.WithCaller(r.Context(), caller))
	}
	w := httptest.NewRecorder()
	m.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("GET /metrics = %d: %s", w.Code, w.Body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	if _, err := p.TextToMetricFamilies(strings.NewReader(w.Body.String())); err != nil {
		t.Fatalf("the scrape does not parse: %v\n%s", err, w.Body)
	}
	return w.Body.String()
}

func TestLabelValuesStayBounded(t *testing.T) {
	m, _ := newMetrics(t)
	for i := range 150 {
		m.Observe(upstream.Event{Kind: upstream.Ended, Key: "k", Caller: fmt.Sprintf("caller-%03d", i), Transport: "rest", State: string(ledger.Confirmed)})
	}
	body := scrape(t, m, keystore.Local("local"))
	if n := strings.Count(body, "mcp_quota_calls_total{"); n != 101 {
		t.Errorf("%d calls_total series for 150 callers, want 100 and one other", n)
	}
	if !strings.Contains(body, `mcp_quota_calls_total{caller="other",key="k",state="confirmed",transport="rest"} 50`) {
		t.Errorf("the 50 callers past the bound are not counted as other:\n%s", body)
	}
}

func TestRefusalReasons(t *testing.T) {
	for _, tt := range []struct {
		gate      ledger.GateSource
		limit     pacer.OwnLimit
		src, want string
	}{
		{ledger.RetryAfterGate, "", "retry-after", "retry-after"},
		{ledger.CircuitGate, "", "circuit", "circuit"},
		{"", pacer.PaceLimit, "pace", "pace"},
		{"", pacer.ConcurrencyLimit, "concurrency", "concurrency"},
		{"", pacer.ShareLimit, "share", "share"},
		{"", "", "default", "budget"},
		{"", "", "hourly-core", "budget"},
		{"", "", "circuit", "budget"}, // a policy named circuit is not the circuit breaker
		{"", "", "retry-after", "budget"},
		{"", "", "pace", "budget"},        // a policy named pace is not the pacer's pace
		{"", "", "concurrency", "budget"}, // nor one named concurrency its most calls at once
		{"", "", "", "other"},
	} {
		if got := metrics.Reason(tt.gate, tt.limit, tt.src); got != tt.want {
			t.Errorf("Reason(%q, %q, %q) = %q, want %q", tt.gate, tt.limit, tt.src, got, tt.want)
		}
	}
	for status, want := range map[int]string{0: "none", 200: "2xx", 304: "3xx", 429: "4xx", 503: "5xx", 999: "none"} {
		if got := metrics.StatusClass(status); got != want {
			t.Errorf("StatusClass(%d) = %q, want %q", status, got, want)
		}
	}
}

// The budget is read from the state file at each scrape: what another
// process recorded there shows at once.
func TestBudgetIsReadAtScrapeTime(t *testing.T) {
	m, db := newMetrics(t)
	local := keystore.Local("local")
	if body := scrape(t, m, local); !strings.Contains(body, `mcp_quota_budget_used{key="k",origin="local",partition="",policy="default"} 0`) {
		t.Fatalf("fresh key:\n%s", body)
	}
	now := time.Now()
	err := db.Update(context.Background(), func(tx ledger.Tx) error {
		for i := range 3 {
			if _, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint(i), Attempt: 1, Key: "k", Caller: "elsewhere", State: ledger.Admitted,
				At: now.Add(time.Duration(i) * time.Millisecond), InFlightUntil: now.Add(time.Minute)}); err != nil {
				return err
			}
		}
		return tx.PutGate(ledger.Gate{Key: "k", Until: now.Add(time.Minute), Source: "circuit", SetAt: now, Reason: reason.Reason{Kind: reason.Said, Said: "test"}})
	})
	if err != nil {
		t.Fatal(err)
	}
	body := scrape(t, m, local)
	for _, want := range []string{
		`mcp_quota_budget_used{key="k",origin="local",partition="",policy="default"} 3`,
		`mcp_quota_budget_limit{key="k",origin="local",partition="",policy="default"} 10`,
		`mcp_quota_gates_active{key="k",source="circuit"} 1`,
		`mcp_quota_circuit_state{key="k",state="open"} 1`,
		`mcp_quota_in_flight{key="k"} 3`,
		`mcp_quota_state_up{key="k"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the scrape lacks %s:\n%s", want, body)
		}
	}
	// A caller who may not use the key sees none of it.
	stranger := &keystore.Caller{Name: "stranger", Keys: []string{"other"}}
	m.Observe(upstream.Event{Kind: upstream.Ended, Key: "k", Caller: "x", Transport: "rest", State: string(ledger.Confirmed)})
	if body := scrape(t, m, stranger); strings.Contains(body, `key="k"`) {
		t.Errorf("a caller without key k sees it:\n%s", body)
	}
}

// An observation's age and a gate's time left are read on the pacer's
// clock (Metrics.Clock), the one they were recorded on, not on the
// machine's: on a test's clock a year from now they are exact.
func TestBudgetAgesOnThePacersClock(t *testing.T) {
	keys, err := keystore.Parse([]byte(testkit.Keys(testkit.Key{Name: "k", BaseURL: "https://api.example.com", Auth: "none",
		Policies: testkit.Window(10, time.Minute)})), keystore.Env{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	clk := testkit.NewClock(time.Now().AddDate(1, 0, 0).Truncate(time.Second))
	db, err := state.Open(context.Background(), testkit.StateFile(t, state.Open), state.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	m := metrics.New(keys, pacer.New(db, pacer.WithClock(clk)), db)
	m.Clock = clk
	now := clk.Now()
	err = db.Update(context.Background(), func(tx ledger.Tx) error {
		if err := tx.PutSeenPolicy(ledger.SeenPolicy{Key: "k", Observation: ratelimit.Observation{Policy: "hourly", Unit: ratelimit.Requests,
			Quota: 100, HasQuota: true, Window: time.Hour, Remaining: 90, HasRemaining: true, Reset: time.Hour, HasReset: true},
			ReceivedAt: now, BasisAt: now}); err != nil {
			return err
		}
		return tx.PutGate(ledger.Gate{Key: "k", Until: now.Add(time.Minute), Source: ledger.RetryAfterGate, SetAt: now,
			Reason: reason.Reason{Kind: reason.Said, Said: "test"}})
	})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(15 * time.Second)
	body := scrape(t, m, keystore.Local("local"))
	for _, want := range []string{
		`mcp_quota_gate_seconds_left{key="k",source="retry-after"} 45`,
		`mcp_quota_observation_age_seconds{key="k",partition="",policy="hourly"} 15`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the scrape lacks %s:\n%s", want, body)
		}
	}
}

// TestCallersNotSeenAreOthers: a person signed in with OAuth, who may see
// only their own calls, reads on /metrics the calls of the key's other
// callers as one caller, "(others)", summed, not by name (as the
// dashboard's spenders show them); a caller without a Sight sees every
// name.
func TestCallersNotSeenAreOthers(t *testing.T) {
	m, _ := newMetrics(t)
	for _, c := range []struct {
		caller string
		n      int
	}{{"alice@example.com via Claude.ai", 1}, {"bob@example.com via ChatGPT", 2}, {"carol@example.com", 3}} {
		for range c.n {
			m.Observe(upstream.Event{Kind: upstream.Ended, Key: "k", Caller: c.caller, Transport: "mcp", State: string(ledger.Confirmed)})
		}
	}
	alice := &keystore.Caller{Name: "alice@example.com via Claude.ai", Keys: []string{"k"}, Sight: &keystore.Sight{Principals: []string{"alice@example.com"}}}
	body := scrape(t, m, alice)
	for _, want := range []string{
		`mcp_quota_calls_total{caller="alice@example.com via Claude.ai",key="k",state="confirmed",transport="mcp"} 1`,
		`mcp_quota_calls_total{caller="(others)",key="k",state="confirmed",transport="mcp"} 5`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("alice's scrape lacks %s:\n%s", want, body)
		}
	}
	for _, name := range []string{"bob@", "carol@"} {
		if strings.Contains(body, name) {
			t.Errorf("alice's scrape names %s:\n%s", name, body)
		}
	}
	if body := scrape(t, m, keystore.Local("local")); !strings.Contains(body, `caller="bob@example.com via ChatGPT"`) {
		t.Errorf("the local user's scrape does not name bob:\n%s", body)
	}
	admin := &keystore.Caller{Name: "dan@example.com", Keys: []string{"k"}, Sight: &keystore.Sight{All: true, Principals: []string{"dan@example.com"}}}
	if body := scrape(t, m, admin); !strings.Contains(body, `caller="bob@example.com via ChatGPT"`) || strings.Contains(body, `caller="(others)"`) {
		t.Errorf("an administrator's scrape does not name bob, or sums others:\n%s", body)
	}
}
