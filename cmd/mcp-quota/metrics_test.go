package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/metrics"
)

// scrape parses base's /metrics, as caller token, with the Prometheus
// text parser.
func scrape(t *testing.T, base, token string) map[string]*dto.MetricFamily {
	t.Helper()
	resp := get(t, base+"/metrics", token)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /metrics = %d: %s", resp.StatusCode, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// sumBy adds family name's values over every scrape, by the labels named.
func sumBy(scrapes []map[string]*dto.MetricFamily, name string, labels ...string) map[string]float64 {
	out := map[string]float64{}
	for _, fams := range scrapes {
		f := fams[name]
		if f == nil {
			continue
		}
		for _, m := range f.GetMetric() {
			var parts []string
			for _, l := range labels {
				parts = append(parts, label(m, l))
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			out[strings.Join(parts, " ")] += v
		}
	}
	return out
}

// TestMetricsCountWhatTheActivityHolds runs a scripted mix of calls —
// a sync job over REST and an agent over MCP, answered, refused by the
// upstream, refused locally and answered from the stored copy — through two
// serve processes sharing one state file, and checks that their /metrics
// together count exactly what the shared activity holds, and that both
// report the same shared budget.
func TestMetricsCountWhatTheActivityHolds(t *testing.T) {
	const quota = 8
	_, url := upstreamAPI(t, demo.Config{Quota: 100, Window: time.Minute})
	key := demoKey(url, quota, time.Minute)
	key.MaxRate = 1000
	s := newSetup(t, key)
	_, a, _ := s.serveProcess(t)
	_, b, _ := s.serveProcess(t)

	// Process b: an agent reads a long report, then its second page from
	// the stored copy (no quota spent).
	agent := httpSession(t, b, agentToken, nil)
	res, out := call(t, agent, "fetch", map[string]any{"path": "/v1/report", "query": map[string]any{"bytes": "20000"}, "max_length": 1000})
	if res.IsError || out["status"] != float64(200) {
		t.Fatalf("first fetch: %s", text(res))
	}
	res, out = call(t, agent, "fetch", map[string]any{"path": "/v1/report", "query": map[string]any{"bytes": "20000"}, "max_length": 1000, "start_index": 1000})
	if res.IsError || out["from_cache"] != true {
		t.Fatalf("second page did not come from the kept copy: %s", text(res))
	}
	// Process a: the sync job asks for a participant that does not exist
	// (404: refused by the upstream), then more than the budget holds.
	resp := get(t, a+"/k/demo/v1/participants/nobody", syncToken)
	resp.Body.Close()
	refused := 0
	for n := range quota + 4 {
		resp := get(t, fmt.Sprintf("%s/k/demo/v1/participants?limit=%d", a, n+1), syncToken, "Prefer", "wait=0")
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			refused++
		}
	}
	if refused == 0 {
		t.Fatal("no REST call was refused locally")
	}
	// Back in process b: the budget is spent, the agent is told to pause.
	res, _ = call(t, agent, "fetch", map[string]any{"path": "/v1/participants", "max_wait_s": 0})
	if !res.IsError || !strings.Contains(text(res), "Paused") {
		t.Fatalf("the agent was not told to pause: %s", text(res))
	}
	resp = get(t, b+"/k/demo/v1/participants?limit=99", syncToken, "Prefer", "wait=0")
	resp.Body.Close()

	// What the shared activity holds: each call's final state (that of
	// its last attempt), the attempts sent by status class, the refusals.
	type act struct {
		ID      int64
		Call    string
		Attempt int
		State   string
		Status  int
		Caller  string
	}
	var rows []act
	for cursor := ""; ; {
		resp := get(t, a+"/v1/activity?key=demo&limit=1000"+cursor, syncToken)
		var page struct {
			Activity   []act
			NextCursor string `json:"next_cursor"`
		}
		json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		rows = append(rows, page.Activity...)
		if page.NextCursor == "" {
			break
		}
		cursor = "&cursor=" + page.NextCursor
	}
	final := map[string]act{}
	wantAttempts, wantRefusals := map[string]float64{}, 0.0
	for _, r := range rows {
		switch r.State {
		case "released", "reserved":
			continue // leased slots never used: no call
		case "rejected_local":
			wantRefusals++
		case "confirmed", "accepted", "rejected_upstream", "failed":
			wantAttempts[metrics.StatusClass(r.Status)]++
		}
		if last, ok := final[r.Call]; !ok || r.Attempt > last.Attempt || (r.Attempt == last.Attempt && r.ID > last.ID) {
			final[r.Call] = r
		}
	}
	wantCalls := map[string]float64{}
	for _, r := range final {
		wantCalls[r.Caller+" "+r.State]++
	}

	scrapes := []map[string]*dto.MetricFamily{scrape(t, a, syncToken), scrape(t, b, agentToken)}
	if diff := cmp.Diff(wantCalls, sumBy(scrapes, "mcp_quota_calls_total", "caller", "state")); diff != "" {
		t.Errorf("calls_total by caller and state, over both processes (-activity +metrics):\n%s", diff)
	}
	if diff := cmp.Diff(wantAttempts, sumBy(scrapes, "mcp_quota_attempts_total", "status_class")); diff != "" {
		t.Errorf("attempts_total by status class (-activity +metrics):\n%s", diff)
	}
	if got := sumBy(scrapes, "mcp_quota_local_refusals_total")[""]; got != wantRefusals {
		t.Errorf("local_refusals_total = %v, the activity holds %v refusals", got, wantRefusals)
	}
	for _, want := range []string{"demo cached", "demo rejected_local", "demo rejected_upstream", "demo confirmed"} {
		if sumBy(scrapes, "mcp_quota_calls_total", "key", "state")[want] == 0 {
			t.Errorf("the run made no call counted as %q", want)
		}
	}
	if hist := scrapes[0]["mcp_quota_upstream_latency_seconds"]; hist == nil || hist.GetMetric()[0].GetHistogram().GetSampleCount() == 0 {
		t.Error("no upstream latency was observed in process a")
	}

	// Both processes report the one shared budget.
	budget := func(fams map[string]*dto.MetricFamily) map[string]float64 {
		out := map[string]float64{}
		for _, name := range []string{"mcp_quota_budget_limit", "mcp_quota_budget_used", "mcp_quota_budget_window_seconds"} {
			for k, v := range sumBy([]map[string]*dto.MetricFamily{fams}, name, "key", "policy", "origin") {
				out[name+" "+k] = v
			}
		}
		return out
	}
	again := []map[string]*dto.MetricFamily{scrape(t, a, syncToken), scrape(t, b, agentToken)}
	ba, bb := budget(again[0]), budget(again[1])
	if diff := cmp.Diff(ba, bb); diff != "" {
		t.Errorf("the two processes report different budgets (-a +b):\n%s", diff)
	}
	if ba["mcp_quota_budget_limit demo default local"] != quota || ba["mcp_quota_budget_used demo default local"] < quota {
		t.Errorf("shared budget %v, want default's %d all used", ba, quota)
	}
}
