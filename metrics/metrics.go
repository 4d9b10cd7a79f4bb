// Package metrics is mcp-quota's Prometheus face, GET /metrics. Two kinds
// of metric meet there:
//
//   - what this process did, counted from the one seam every call passes
//     (upstream.Client's Observe hook, which Metrics.Observe is): calls by
//     final state, attempts by the upstream's status class, local refusals
//     by reason, the admission wait and the upstream's latency. Each
//     process counts its own calls; Prometheus sums them over processes.
//   - the shared budget, read from the state file at scrape time (a
//     custom Collector): every process sharing the file reports the same
//     limit, used, remaining and reset per key and policy, the gates
//     closed, the observations' age, hidden limits, warnings and the
//     circuit — so any one of them may be scraped.
//
// Label values are bounded: keys, callers and policies come from the
// configuration and the upstream's policy names (at most maxValues of each
// label; the rest are counted as "other"), states, transports, status
// classes and reasons from fixed sets. No URL, target or call ID is ever
// a label. The budget side reports at most maxValues keys by name and,
// per key and origin, maxBudgetRows budgets by name; the rest are summed
// under "other", never dropped, so it holds at most MaxBudgetSeries series
// however many keys and policies there are.
package metrics

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// Namespace prefixes every mcp-quota metric.
const Namespace = "mcp_quota"

// maxValues bounds the values one label takes; beyond it, "other".
const maxValues = 100

// Buckets of the histograms, in seconds.
var (
	// WaitBuckets span a call sent at once to one held for two minutes
	// (REST's longest Prefer: wait).
	WaitBuckets = []float64{0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}
	// LatencyBuckets span a fast API to a slow one.
	LatencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
)

// Metrics counts calls and serves /metrics. Create it with New. It is
// safe for concurrent use.
type Metrics struct {
	// ScrapeTimeout bounds reading the shared state for one scrape (keys
	// not read by then report state_up 0); 0 means 5 s. Set it before
	// the first scrape.
	ScrapeTimeout time.Duration
	// Clock is the time the budget side reads to say how old an
	// observation is and how long a gate stays closed: the pacer's (the
	// state's, the database server's on PostgreSQL); nil means real
	// time. Set it before the first scrape.
	Clock clock.Clock

	keys  *keystore.Store
	pacer *pacer.Pacer
	db    ledger.Viewer

	reg      *prometheus.Registry
	calls    *prometheus.CounterVec
	attempts *prometheus.CounterVec
	refusals *prometheus.CounterVec
	wait     *prometheus.HistogramVec
	latency  *prometheus.HistogramVec

	mu     sync.Mutex
	values map[string]map[string]bool // label → values seen
}

// New returns Metrics for the keys of keys, whose shared budget it reads
// at scrape time through p and db (the pacer on that state file). Its registry also holds the Go runtime's and the process's
// collectors (CPU, memory, open files).
func New(keys *keystore.Store, p *pacer.Pacer, db ledger.Viewer) *Metrics {
	m := &Metrics{keys: keys, pacer: p, db: db, reg: prometheus.NewRegistry(), values: map[string]map[string]bool{}}
	m.calls = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "calls_total",
		Help: "Calls this process ended, by key, caller, transport and final state (that of the call's last attempt: confirmed, accepted, rejected_upstream, failed, rejected_local, cached; canceled when none was recorded)."},
		[]string{"key", "caller", "transport", "state"})
	m.attempts = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "attempts_total",
		Help: "Attempts this process sent upstream, by key and the class of the upstream's status (2xx, 3xx, 4xx, 5xx; none when no answer came). Retries count each."},
		[]string{"key", "status_class"})
	m.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "local_refusals_total",
		Help: "Attempts this process refused without sending them, by key and reason (budget, retry-after, backoff, circuit, abnormal-usage, pace, concurrency, probe, other)."},
		[]string{"key", "reason"})
	m.wait = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "admission_wait_seconds",
		Help: "How long attempts this process sent waited for admission, by key.", Buckets: WaitBuckets},
		[]string{"key"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "upstream_latency_seconds",
		Help: "From sending an attempt to its answer (or failure), by key.", Buckets: LatencyBuckets},
		[]string{"key"})
	m.reg.MustRegister(m.calls, m.attempts, m.refusals, m.wait, m.latency,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Observe counts one step of a call. It is the upstream.Client's Observe
// hook.
func (m *Metrics) Observe(e upstream.Event) {
	key := m.bound("key", e.Key)
	switch e.Kind {
	case upstream.Refused:
		m.refusals.WithLabelValues(key, Reason(e.Gate, e.Limit, e.Source)).Inc()
	case upstream.Attempted:
		m.attempts.WithLabelValues(key, StatusClass(e.Status)).Inc()
		m.wait.WithLabelValues(key).Observe(e.Wait.Seconds())
		m.latency.WithLabelValues(key).Observe(e.Latency.Seconds())
	case upstream.Ended:
		m.calls.WithLabelValues(key, m.bound("caller", e.Caller), m.bound("transport", string(e.Transport)), m.bound("state", e.State)).Inc()
	}
}

// bound returns v, or "other" once label has taken maxValues values.
func (m *Metrics) bound(label, v string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := m.values[label]
	if seen == nil {
		seen = map[string]bool{}
		m.values[label] = seen
	}
	if seen[v] {
		return v
	}
	if len(seen) >= maxValues {
		return "other"
	}
	seen[v] = true
	return v
}

// StatusClass names the class of an HTTP status: "2xx"…; "none" for 0.
func StatusClass(status int) string {
	if status < 100 || status > 599 {
		return "none"
	}
	return fmt.Sprintf("%dxx", status/100)
}

// Reason is the reason label of a refusal: the gate's source when a gate
// bound; the pacer's own limit when one bound ("pace", "concurrency",
// "probe", "share", "turn"); else, for any other source, "budget" (a
// policy's name, whose budget is spent — even one named like a gate or
// like one of the pacer's limits).
func Reason(gate ledger.GateSource, limit pacer.OwnLimit, src string) string {
	switch {
	case gate != "":
		return string(gate)
	case limit != "":
		return string(limit)
	case src == "":
		return "other"
	}
	return "budget"
}

// ServeHTTP serves the metrics in the Prometheus text format (or
// OpenMetrics, when asked). The request must carry its caller
// (keystore.WithCaller; the gateway puts it there): only the keys that
// caller may use are reported.
func (m *Metrics) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	caller, ok := keystore.CallerFrom(r.Context())
	if !ok {
		http.Error(w, "a caller token is required", http.StatusUnauthorized)
		return
	}
	may := func(key string) bool { return caller.MayUse(key) }
	var keys []*keystore.Key
	for _, k := range m.keys.Keys() {
		if may(k.Name) {
			keys = append(keys, k)
		}
	}
	shared := prometheus.NewRegistry()
	shared.MustRegister(&budgets{timeout: m.ScrapeTimeout, pacer: m.pacer, db: m.db, keys: keys, clock: clock.Or(m.Clock)})
	g := prometheus.Gatherers{onlyKeys{m.reg, may, caller.MaySee}, shared}
	promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, EnableOpenMetrics: true}).ServeHTTP(w, r)
}
