package rest_test

import (
	"context"
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
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/gateway"
	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/state"
)

// benchKeys is a key whose budget never binds a benchmark: no rate or
// concurrency cap it reaches, and, when policy is set, a documented
// quota of 10⁹ calls a minute.
func benchKeys(policy bool) string {
	k := testkit.Key{Name: "demo", BaseURL: "%[1]s", SecretEnv: "UPSTREAM_SECRET", MaxRate: 1e9, MaxConcurrency: 100000}
	if policy {
		k.Policies = testkit.Window(1e9, time.Minute)
	}
	return testkit.Keys(k, testkit.Key{Name: "other", BaseURL: "%[1]s", Auth: "none"})
}

// BenchmarkProxy measures, in one run on loopback, what the REST side
// adds to a call: latency (p50, p99, one call at a time) and throughput
// (8 calls in parallel, each caller calling again as soon as answered),
// against a bare httputil.ReverseProxy in front of the same demo
// upstream. State persistence is on — every call is admitted and
// recorded, in a real SQLite state file (store=sqlite) or in a
// PostgreSQL database on loopback (store=postgres, with the host's
// journal, holding the history of proxyHistory) — and the budget
// never binds. Every target answers proxyWarmUp calls first. Two
// configurations of the key:
//
//   - mcp-quota: the reference API's upstream (it announces its policy) and a
//     documented policy of 10⁹ calls a minute, so every admission counts
//     the calls in a sliding window;
//   - mcp-quota-no-window: an upstream that announces nothing and no
//     documented policy, so admission counts nothing: the fixed cost.
//
// Run it as
//
//	go test ./rest/ -run '^$' -bench BenchmarkProxy -benchtime 20000x -v
func BenchmarkProxy(b *testing.B) {
	b.Run("store=sqlite", func(b *testing.B) { benchProxy(b, newStack, nil) })
	b.Run("store=postgres", func(b *testing.B) {
		srv := pgtest.Start(b)
		b.Setenv("PGPASSWORD", srv.Password())
		var dbs []string
		benchProxy(b, func(t testing.TB, sc stackConfig) *stack {
			sc.Postgres = srv.CreateDatabase(t)
			dbs = append(dbs, sc.Postgres)
			if err := state.FillHistory(context.Background(), sc.Postgres, proxyHistory("demo")); err != nil {
				t.Fatal(err)
			}
			return newStack(t, sc)
		}, func(b *testing.B) {
			for _, db := range dbs {
				analyze(b, db)
			}
		})
	})
}

// proxyWarmUp is how many calls each target answers before it is
// measured: every connection is open, and on PostgreSQL the tables have
// statistics (see proxyHistory).
const proxyWarmUp = 1000

// benchProxy measures the targets with stacks from newStack; settle,
// when not nil, runs once they are warm.
func benchProxy(b *testing.B, newStack func(testing.TB, stackConfig) *stack, settle func(*testing.B)) {
	gw := func(c *gateway.Config) { c.MaxConcurrent = 100000 }
	windowed := newStack(b, stackConfig{Demo: demo.Config{Quota: 1 << 30, Window: time.Hour}, Keys: benchKeys(true), Gateway: gw, QuietLog: true})
	fixed := newStack(b, stackConfig{Demo: demo.Config{Mode: demo.Silent, Quota: 1 << 30, Window: time.Hour}, Keys: benchKeys(false), Gateway: gw, QuietLog: true})
	upURL, _ := url.Parse(windowed.UpstreamURL)
	// The bare proxy keeps as many idle connections to the upstream as
	// mcp-quota's client does (upstream's transports keep 16 a host):
	// with http.DefaultTransport's 2, about one call in six of the 8
	// parallel callers dialled a new connection and closed another.
	bt := http.DefaultTransport.(*http.Transport).Clone()
	bt.MaxIdleConnsPerHost = 16
	bare := httptest.NewServer(&httputil.ReverseProxy{Transport: bt, Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(upURL)
		r.Out.Header.Set("Authorization", "Bearer "+upstreamSecret)
	}})
	b.Cleanup(bt.CloseIdleConnections)
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
	var wg sync.WaitGroup
	for _, tt := range targets {
		for range 8 {
			wg.Go(func() {
				for range proxyWarmUp / 8 {
					get(b, tt.url)
				}
			})
		}
	}
	wg.Wait()
	if settle != nil {
		settle(b)
	}
	// Each measure runs the three in turn, in rounds: on a machine whose
	// speed drifts (a shared VM), each sees the same drift.
	const rounds = 5
	p50, p99, rate := map[string]time.Duration{}, map[string]time.Duration{}, map[string]float64{}
	cpuPer := map[string]time.Duration{}
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
		took, cpu := map[string]time.Duration{}, map[string]time.Duration{}
		made := map[string]int{}
		for range rounds {
			for _, tt := range targets {
				var left atomic.Int64
				left.Store(int64(max(b.N/rounds, callers)))
				start, cpuStart := time.Now(), cpuTime()
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
				cpu[tt.name] += cpuTime() - cpuStart
				made[tt.name] += int(max(b.N/rounds, callers))
			}
		}
		for _, tt := range targets {
			rate[tt.name] = float64(made[tt.name]) / took[tt.name].Seconds()
			b.ReportMetric(rate[tt.name], "calls/s-"+tt.name)
			// The whole process's CPU time per call (the callers, the
			// target, the upstream and the state's writers): on the
			// two shared cores, what a call costs whatever else runs.
			cpuPer[tt.name] = cpu[tt.name] / time.Duration(made[tt.name])
			b.ReportMetric(float64(cpuPer[tt.name].Microseconds()), "cpu-µs/call-"+tt.name)
		}
	})
	var sum strings.Builder
	for _, name := range []string{"mcp-quota", "mcp-quota-no-window"} {
		if rate["bare"] > 0 && rate[name] > 0 {
			fmt.Fprintf(&sum, "\n%s: added latency p50 %v, p99 %v; throughput %.0f calls/s, %.0f%% of the bare proxy's %.0f; CPU %v a call, the bare proxy's %v",
				name, (p50[name] - p50["bare"]).Round(time.Microsecond), (p99[name] - p99["bare"]).Round(time.Microsecond),
				rate[name], 100*rate[name]/rate["bare"], rate["bare"], cpuPer[name].Round(time.Microsecond), cpuPer["bare"].Round(time.Microsecond))
		}
	}
	b.Log(sum.String())
}

// proxyHistory is the history a PostgreSQL state holds of key before the
// warm-up: 200,000 calls over a day that ended an hour ago, the state of
// a database in use, whose connections planned their statements on the
// statistics of a table that is not small (see docs/benchmarks-log.md,
// "Many hosts: PostgreSQL").
func proxyHistory(key string) state.History {
	const n = 200_000
	return state.History{Keys: []string{key}, N: n, From: time.Now().Add(-25 * time.Hour), Every: 24 * time.Hour / n,
		Latency: 20 * time.Millisecond, Status: 200, Caller: "history", Transport: "rest", Method: "GET", Target: "/v1/participants/p-000001"}
}

// analyze gathers the statistics of the database at dbURL again, with
// what the warm-up wrote, as autovacuum does as a table grows.
func analyze(b *testing.B, dbURL string) {
	b.Helper()
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), "ANALYZE"); err != nil {
		b.Fatal(err)
	}
}

// cpuTime returns the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkProxyAlone runs one of BenchmarkProxy's targets on its own
// (the bare proxy, or the REST side with a window, on SQLite), 8
// callers, b.N calls after proxyWarmUp, and reports the process's CPU
// time a call: a CPU profile of one target alone says where its time
// goes, call by call, which the three targets' shared profile cannot.
//
//	go test -c -o rest.test ./rest/
//	./rest.test -test.run '^$' -test.bench 'ProxyAlone/target=mcp-quota$' -test.benchtime 8000x -test.cpuprofile cpu.out
func BenchmarkProxyAlone(b *testing.B) {
	for _, target := range []string{"bare", "mcp-quota"} {
		b.Run("target="+target, func(b *testing.B) {
			gw := func(c *gateway.Config) { c.MaxConcurrent = 100000 }
			s := newStack(b, stackConfig{Demo: demo.Config{Quota: 1 << 30, Window: time.Hour}, Keys: benchKeys(true), Gateway: gw, QuietLog: true})
			u := s.URL + "/k/demo/v1/participants/p-000001"
			if target == "bare" {
				upURL, _ := url.Parse(s.UpstreamURL)
				bt := http.DefaultTransport.(*http.Transport).Clone()
				bt.MaxIdleConnsPerHost = 16 // as upstream's transports
				bare := httptest.NewServer(&httputil.ReverseProxy{Transport: bt, Rewrite: func(r *httputil.ProxyRequest) {
					r.SetURL(upURL)
					r.Out.Header.Set("Authorization", "Bearer "+upstreamSecret)
				}})
				b.Cleanup(bt.CloseIdleConnections)
				b.Cleanup(bare.Close)
				u = bare.URL + "/v1/participants/p-000001"
			}
			client := &http.Client{Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}}
			b.Cleanup(client.CloseIdleConnections)
			run := func(n int) time.Duration {
				var left atomic.Int64
				left.Store(int64(n))
				var wg sync.WaitGroup
				start := cpuTime()
				for range 8 {
					wg.Go(func() {
						for left.Add(-1) >= 0 {
							req, _ := http.NewRequest("GET", u, nil)
							req.Header.Set("Authorization", "Bearer "+syncToken)
							resp, err := client.Do(req)
							if err != nil {
								b.Error(err)
								return
							}
							io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
							if resp.StatusCode != 200 {
								b.Errorf("%s: %d", u, resp.StatusCode)
								return
							}
						}
					})
				}
				wg.Wait()
				return cpuTime() - start
			}
			run(proxyWarmUp)
			b.ResetTimer()
			cpu := run(b.N)
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/call")
		})
	}
}
