package rest_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/gateway"
)

// benchKeys is a key whose budget never binds a benchmark: no rate or
// concurrency cap it reaches, and, when policy is set, a documented
// quota of 10⁹ calls a minute.
func benchKeys(policy bool) string {
	k := `
[[keys]]
name = "demo"
base_url = %[1]q
secret_env = "UPSTREAM_SECRET"
max_rate = 1000000000.0
max_concurrency = 100000
`
	if policy {
		k += "  [[keys.policies]]\n  quota = 1000000000\n  window = \"60s\"\n"
	}
	return k + "\n[[keys]]\nname = \"other\"\nbase_url = %[1]q\nauth = \"none\"\n"
}

// BenchmarkProxy measures, in one run on loopback, what the REST side
// adds to a call: latency (p50, p99, one call at a time) and throughput
// (8 calls in parallel, each caller calling again as soon as answered),
// against a bare httputil.ReverseProxy in front of the same demo
// upstream. State persistence is on — a real state file; every call is
// admitted and recorded in SQLite — and the budget never binds. Two
// configurations of the key:
//
//   - mcp-quota: the seed's upstream (it announces its policy) and a
//     documented policy of 10⁹ calls a minute, so every admission counts
//     the calls in a sliding window;
//   - mcp-quota-no-window: an upstream that announces nothing and no
//     documented policy, so admission counts nothing: the fixed cost.
//
// Run it as
//
//	go test ./rest/ -run '^$' -bench BenchmarkProxy -benchtime 20000x -v
func BenchmarkProxy(b *testing.B) {
	gw := func(c *gateway.Config) { c.MaxConcurrent = 100000 }
	windowed := newStack(b, stackConfig{Demo: demo.Config{Quota: 1 << 30, Window: time.Hour}, Keys: benchKeys(true), Gateway: gw, QuietLog: true})
	fixed := newStack(b, stackConfig{Demo: demo.Config{Mode: demo.Silent, Quota: 1 << 30, Window: time.Hour}, Keys: benchKeys(false), Gateway: gw, QuietLog: true})
	upURL, _ := url.Parse(windowed.UpstreamURL)
	bare := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(upURL)
		r.Out.Header.Set("Authorization", "Bearer "+upstreamSecret)
	}})
	b.Cleanup(bare.Close)

	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}}
	get := func(b *testing.B, u string) {
		req, _ := http.NewRequest("GET", u, nil)
		req.Header.Set("Authorization", "Bearer "+syncToken)
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("%s: %d", u, resp.StatusCode)
		}
	}
	const path = "/v1/participants/p-000001"
	targets := []struct{ name, url string }{
		{"bare", bare.URL + path},
		{"mcp-quota", windowed.URL + "/k/demo" + path},
		{"mcp-quota-no-window", fixed.URL + "/k/demo" + path},
	}
	// Each measure runs the three in turn, in rounds: on a machine whose
	// speed drifts (a shared VM), each sees the same drift.
	const rounds = 5
	p50, p99, rate := map[string]time.Duration{}, map[string]time.Duration{}, map[string]float64{}
	b.Run("latency", func(b *testing.B) {
		d := map[string][]time.Duration{}
		for _, tt := range targets {
			get(b, tt.url) // warm the connection
		}
		b.ResetTimer()
		for range rounds {
			for _, tt := range targets {
				for range max(b.N/rounds, 1) {
					start := time.Now()
					get(b, tt.url)
					d[tt.name] = append(d[tt.name], time.Since(start))
				}
			}
		}
		b.StopTimer()
		for _, tt := range targets {
			ds := d[tt.name]
			slices.Sort(ds)
			p50[tt.name], p99[tt.name] = ds[len(ds)/2], ds[len(ds)*99/100]
			b.ReportMetric(float64(p50[tt.name].Microseconds()), "p50-µs-"+tt.name)
			b.ReportMetric(float64(p99[tt.name].Microseconds()), "p99-µs-"+tt.name)
		}
	})
	b.Run("throughput", func(b *testing.B) {
		const callers = 8 // calls in parallel
		took := map[string]time.Duration{}
		made := map[string]int{}
		for range rounds {
			for _, tt := range targets {
				var left atomic.Int64
				left.Store(int64(max(b.N/rounds, callers)))
				start := time.Now()
				var wg sync.WaitGroup
				for range callers {
					wg.Go(func() {
						for left.Add(-1) >= 0 {
							get(b, tt.url)
						}
					})
				}
				wg.Wait()
				took[tt.name] += time.Since(start)
				made[tt.name] += int(max(b.N/rounds, callers))
			}
		}
		for _, tt := range targets {
			rate[tt.name] = float64(made[tt.name]) / took[tt.name].Seconds()
			b.ReportMetric(rate[tt.name], "calls/s-"+tt.name)
		}
	})
	var sum strings.Builder
	for _, name := range []string{"mcp-quota", "mcp-quota-no-window"} {
		if rate["bare"] > 0 && rate[name] > 0 {
			fmt.Fprintf(&sum, "\n%s: added latency p50 %v, p99 %v; throughput %.0f calls/s, %.0f%% of the bare proxy's %.0f",
				name, (p50[name] - p50["bare"]).Round(time.Microsecond), (p99[name] - p99["bare"]).Round(time.Microsecond),
				rate[name], 100*rate[name]/rate["bare"], rate["bare"])
		}
	}
	b.Log(sum.String())
}
