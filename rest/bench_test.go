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
// (calls in parallel), against a bare httputil.ReverseProxy in front of
// the same demo upstream. State persistence is on — a real state file;
// every call is admitted and recorded in SQLite — and the budget never
// binds. Two configurations of the key:
//
//   - mcp-quota: the seed's upstream (it announces its policy) and a
//     documented policy of 10⁹ calls a minute, so every admission counts
//     the calls in a sliding window;
//   - mcp-quota-no-window: an upstream that announces nothing and no
//     documented policy, so admission counts nothing: the fixed cost.
//
// Run it as
//
//	go test ./rest/ -run '^$' -bench BenchmarkProxy -benchtime 3000x -v
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
	p50, p99, rate := map[string]time.Duration{}, map[string]time.Duration{}, map[string]float64{}
	for _, tt := range targets {
		b.Run("latency/"+tt.name, func(b *testing.B) {
			get(b, tt.url) // warm the connection
			d := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				get(b, tt.url)
				d = append(d, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(d)
			p50[tt.name], p99[tt.name] = d[len(d)/2], d[len(d)*99/100]
			b.ReportMetric(float64(p50[tt.name].Microseconds()), "p50-µs")
			b.ReportMetric(float64(p99[tt.name].Microseconds()), "p99-µs")
		})
	}
	for _, tt := range targets {
		b.Run("throughput/"+tt.name, func(b *testing.B) {
			var n atomic.Int64
			b.SetParallelism(4)
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					get(b, tt.url)
					n.Add(1)
				}
			})
			rate[tt.name] = float64(n.Load()) / time.Since(start).Seconds()
			b.ReportMetric(rate[tt.name], "calls/s")
		})
	}
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
