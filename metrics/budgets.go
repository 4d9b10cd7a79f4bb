package metrics

import (
	"context"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// scrapeTimeout bounds the state file's reading for one scrape.
const scrapeTimeout = 5 * time.Second

var budgetLabels = []string{"key", "policy", "origin", "partition"}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", name), help, labels, nil)
}

// The shared budget's metrics, read from the state file at scrape time.
var (
	descLimit     = desc("budget_limit", "The policy's quota per window (q): a documented policy (origin local) or one the upstream announced or a refusal revealed (origin upstream).", budgetLabels...)
	descUsed      = desc("budget_used", "Units spent in the policy's current window by every caller and process sharing the key (upstream policies: q minus what is left).", budgetLabels...)
	descRemaining = desc("budget_remaining", "Units left now, after every caller sharing the key; absent when unknown. A hint, not a grant.", budgetLabels...)
	descReset     = desc("budget_reset_seconds", "Seconds until the oldest call leaves the window (local) or the observation's effective window ends (upstream).", budgetLabels...)
	descWindow    = desc("budget_window_seconds", "The policy's window (w) in seconds; absent when unknown.", budgetLabels...)
	descAge       = desc("observation_age_seconds", "Seconds since the upstream last said this policy's values.", "key", "policy", "partition")
	descExpired   = desc("observation_expired", "1 when the upstream's latest word on the policy is past its effective window (a probe asks again), else 0.", "key", "policy", "partition")
	descHidden    = desc("hidden_limits", "Limits the upstream never announced, inferred from its refusals and enforced locally.", "key")
	descGates     = desc("gates_active", "Gates closed now (nothing is sent before they open), by what closed them: retry-after, backoff, circuit, abnormal-usage.", "key", "source")
	descGateLeft  = desc("gate_seconds_left", "Seconds until the latest gate of that source opens.", "key", "source")
	descInFlight  = desc("in_flight", "Calls admitted and not yet answered, in every process.", "key")
	descWarnings  = desc("warnings_last_hour", "Warnings raised in the last hour, by kind (hidden-limit, abnormal-usage, circuit-open, …).", "key", "kind")
	descCircuit   = desc("circuit_state", "The key's circuit breaker: 1 for its current state (closed, half_open: the next call is a probe, open), 0 for the others.", "key", "state")
	descUp        = desc("state_up", "1 when the shared state could be read for the key at this scrape, else 0.", "key")
)

var gateSources = []string{"retry-after", "backoff", "circuit", "abnormal-usage"}

// budgets reads the shared budget of keys at scrape time.
type budgets struct {
	pacer *pacer.Pacer
	db    ledger.Viewer
	keys  []*keystore.Key
	now   func() time.Time
}

func (b *budgets) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLimit, descUsed, descRemaining, descReset, descWindow, descAge, descExpired,
		descHidden, descGates, descGateLeft, descInFlight, descWarnings, descCircuit, descUp} {
		ch <- d
	}
}

func (b *budgets) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	for _, k := range b.keys {
		up := 1.0
		if err := b.collectKey(ctx, k, ch); err != nil {
			up = 0
		}
		ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, up, k.Name)
	}
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func (b *budgets) collectKey(ctx context.Context, k *keystore.Key, ch chan<- prometheus.Metric) error {
	st, err := b.pacer.Status(ctx, k, "")
	if err != nil {
		return err
	}
	var ks ledger.KeyState
	if err := b.db.View(ctx, func(tx ledger.Tx) error {
		var err error
		ks, err = tx.KeyState(k.Name)
		return err
	}); err != nil {
		return err
	}
	now := b.now()
	n, hidden := 0, 0
	emit := func(bu pacer.Budget, origin string) {
		if n++; n > maxValues {
			return
		}
		l := []string{k.Name, bu.Policy, origin, bu.Partition}
		if bu.Limit > 0 {
			gauge(ch, descLimit, float64(bu.Limit), l...)
		}
		switch {
		case origin == "local":
			gauge(ch, descUsed, float64(bu.Used), l...)
		case bu.Limit > 0 && bu.Remaining >= 0:
			gauge(ch, descUsed, float64(max(bu.Limit-bu.Remaining, 0)), l...)
		}
		if bu.Remaining >= 0 {
			gauge(ch, descRemaining, float64(bu.Remaining), l...)
		}
		gauge(ch, descReset, bu.Reset.Seconds(), l...)
		if bu.Window > 0 {
			gauge(ch, descWindow, bu.Window.Seconds(), l...)
		}
		if origin == "upstream" {
			gauge(ch, descAge, now.Sub(bu.Observed).Seconds(), k.Name, bu.Policy, bu.Partition)
			gauge(ch, descExpired, b2f(bu.Expired), k.Name, bu.Policy, bu.Partition)
			if bu.Hidden {
				hidden++
			}
		}
	}
	for _, bu := range st.Local {
		emit(bu, "local")
	}
	for _, bu := range st.Upstream {
		emit(bu, "upstream")
	}
	gauge(ch, descHidden, float64(hidden), k.Name)
	gauge(ch, descInFlight, float64(st.InFlight), k.Name)

	count, left := map[string]int{}, map[string]time.Duration{}
	for _, g := range st.Gates {
		count[g.Source]++
		left[g.Source] = max(left[g.Source], g.Until.Sub(now))
	}
	sources := slices.Clone(gateSources)
	for src := range count {
		if !slices.Contains(sources, src) {
			sources = append(sources, src)
		}
	}
	for _, src := range sources {
		gauge(ch, descGates, float64(count[src]), k.Name, src)
		if count[src] > 0 {
			gauge(ch, descGateLeft, max(left[src], 0).Seconds(), k.Name, src)
		}
	}

	kinds := map[string]int{}
	for _, w := range st.Warnings {
		kinds[w.Kind]++
	}
	for kind, n := range kinds {
		gauge(ch, descWarnings, float64(n), k.Name, kind)
	}

	circuit := "closed"
	switch {
	case count["circuit"] > 0:
		circuit = "open"
	case ks.HalfOpen:
		circuit = "half_open"
	}
	for _, s := range []string{"closed", "half_open", "open"} {
		gauge(ch, descCircuit, b2f(s == circuit), k.Name, s)
	}
	return nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// onlyKeys gathers g's metrics, leaving out those of keys that may not be
// seen (metrics without a key label are kept).
type onlyKeys struct {
	g   prometheus.Gatherer
	may func(key string) bool
}

func (o onlyKeys) Gather() ([]*dto.MetricFamily, error) {
	fams, err := o.g.Gather()
	for _, f := range fams {
		f.Metric = slices.DeleteFunc(f.Metric, func(m *dto.Metric) bool {
			for _, l := range m.GetLabel() {
				if l.GetName() == "key" {
					return !o.may(l.GetValue())
				}
			}
			return false
		})
	}
	return fams, err
}
