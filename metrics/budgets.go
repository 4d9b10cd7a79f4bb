package metrics

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// scrapeTimeout bounds the state file's reading for one scrape, unless
// Metrics.ScrapeTimeout says otherwise.
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
	descExpired   = desc("observation_expired", "1 when the upstream's latest observation of the policy is past its effective window (a probe asks again), else 0.", "key", "policy", "partition")
	descHidden    = desc("hidden_limits", "Limits the upstream never announced, inferred from its refusals and enforced locally.", "key")
	descGates     = desc("gates_active", "Gates closed now (nothing is sent before they open), by what closed them: retry-after, backoff, circuit, abnormal-usage.", "key", "source")
	descGateLeft  = desc("gate_seconds_left", "Seconds until the latest gate of that source opens.", "key", "source")
	descInFlight  = desc("in_flight", "Calls admitted and not yet answered, in every process.", "key")
	descWarnings  = desc("warnings_last_hour", "Warnings raised in the last hour, by kind (hidden-limit, abnormal-usage, circuit-open, …).", "key", "kind")
	descCircuit   = desc("circuit_state", "The key's circuit breaker: 1 for its current state (closed, half_open: the next call is a probe, open), 0 for the others (for the keys summed as other: how many are in each state).", "key", "state")
	descUp        = desc("state_up", "1 when the shared state could be read for the key at this scrape (for the keys summed as other: for every one of them), else 0.", "key")
)

var gateSources = [...]ledger.GateSource{ledger.RetryAfterGate, ledger.BackoffGate, ledger.CircuitGate, ledger.AbnormalUsageGate}

// budgets reads the shared budget of keys at scrape time.
type budgets struct {
	timeout time.Duration // for the whole scrape
	pacer   *pacer.Pacer
	db      ledger.Viewer
	keys    []*keystore.Key
	clock   clock.Clock // the pacer's
}

func (b *budgets) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLimit, descUsed, descRemaining, descReset, descWindow, descAge, descExpired,
		descHidden, descGates, descGateLeft, descInFlight, descWarnings, descCircuit, descUp} {
		ch <- d
	}
}

// The budget gauges' bounds. A scrape reports at most maxValues keys by
// name (the first the caller may see, in configuration order); the
// others' gauges are summed under key="other". Per key and origin it
// reports at most maxBudgetRows budgets (policy and partition) by name;
// the others are summed under policy="other", partition="other". Gate
// sources and warning kinds are fixed small sets (others count as
// "other"). So however many keys and policies there are, the budget side
// of a scrape holds at most MaxBudgetSeries series.
const (
	maxBudgetRows = 16
	maxKinds      = 8 // warning kinds by name per key; the rest "other"
)

// seriesPerKey bounds the budget side's series of one key (or of "other"):
// per origin, maxBudgetRows rows by name with their five gauges (limit,
// used, remaining, reset, window) and, upstream, the observation's age
// and expiry, plus one "other" row of four (no window); then hidden
// limits, calls in flight, gates and the seconds they have left by
// source, warnings by kind, the circuit's three states, and state_up.
const seriesPerKey = 2*(maxBudgetRows*5+4) + maxBudgetRows*2 + 1 + 1 + 2*(len(gateSources)+1) + maxKinds + 1 + 3 + 1

// MaxBudgetSeries is the most series the budget side of one scrape
// holds, whatever the number of keys, policies and partitions.
const MaxBudgetSeries = (maxValues + 1) * seriesPerKey

// A row is one budget's gauges.
type row struct {
	origin, policy, partition string
	limit, used, remaining    float64
	hasUsed, hasRemaining     bool
	reset, window             float64
	upstream, other           bool
	age, expired              float64
}

// keySeries is what the budget side reports of one key, or of all keys
// past maxValues summed.
type keySeries struct {
	rows     []row
	hidden   float64
	inFlight float64
	gates    map[string]float64 // source → gates closed
	left     map[string]float64 // source → seconds the latest has left
	warnings map[string]float64 // kind → raised in the last hour
	circuit  map[string]float64 // state → 1 for the key's (summed: keys in it)
	up       float64            // 1 when read (summed: all were)
}

func newKeySeries() *keySeries {
	return &keySeries{gates: map[string]float64{}, left: map[string]float64{}, warnings: map[string]float64{},
		circuit: map[string]float64{}, up: 1}
}

func (b *budgets) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(b.timeout, scrapeTimeout))
	defer cancel()
	var others *keySeries
	for i, k := range b.keys {
		ks, err := b.read(ctx, k)
		if err != nil {
			ks = newKeySeries()
			ks.up = 0
		}
		if i < maxValues {
			ks.emit(ch, k.Name)
			continue
		}
		if others == nil {
			others = newKeySeries()
		}
		others.add(ks)
	}
	if others != nil {
		others.emit(ch, "other")
	}
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

// read reads what the budget side reports of key k.
func (b *budgets) read(ctx context.Context, k *keystore.Key) (*keySeries, error) {
	st, err := b.pacer.Status(ctx, k, "")
	if err != nil {
		return nil, err
	}
	var ls ledger.KeyState
	if err := b.db.View(ctx, func(tx ledger.ReadTx) error {
		var err error
		ls, err = tx.KeyState(k.Name)
		return err
	}); err != nil {
		return nil, err
	}
	now := b.clock.Now()
	ks := newKeySeries()
	rows := map[string]int{} // origin → rows by name
	for _, bu := range append(slices.Clone(st.Local), st.Upstream...) {
		r := budgetRow(bu, now)
		if r.upstream && bu.Hidden {
			ks.hidden++
		}
		if rows[r.origin]++; rows[r.origin] > maxBudgetRows {
			ks.addOther(r)
			continue
		}
		ks.rows = append(ks.rows, r)
	}
	ks.inFlight = float64(st.InFlight)
	for _, g := range st.Gates {
		src := string(g.Source)
		if !slices.Contains(gateSources[:], g.Source) {
			src = "other"
		}
		ks.gates[src]++
		ks.left[src] = max(ks.left[src], g.Until.Sub(now).Seconds(), 0)
	}
	for _, w := range st.Warnings {
		kind := string(w.Kind)
		if _, ok := ks.warnings[kind]; !ok && len(ks.warnings) >= maxKinds-1 {
			kind = "other"
		}
		ks.warnings[kind]++
	}
	circuit := "closed"
	switch {
	case ks.gates[string(ledger.CircuitGate)] > 0:
		circuit = "open"
	case ls.HalfOpen:
		circuit = "half_open"
	}
	ks.circuit[circuit] = 1
	return ks, nil
}

// budgetRow is bu as its row of series: a local budget counts what
// mcp-quota admitted, an upstream one what the upstream says is left.
func budgetRow(bu pacer.Budget, now time.Time) row {
	origin := "upstream"
	if bu.Source == "local" {
		origin = "local"
	}
	r := row{origin: origin, policy: bu.Policy, partition: bu.Partition, limit: float64(bu.Limit),
		reset: bu.Reset.Seconds(), window: bu.Window.Seconds(), upstream: origin == "upstream",
		age: now.Sub(bu.Observed).Seconds(), expired: b2f(bu.Expired)}
	switch {
	case origin == "local":
		r.used, r.hasUsed = float64(bu.Used), true
	case bu.Limit > 0 && bu.Remaining >= 0:
		r.used, r.hasUsed = float64(max(bu.Limit-bu.Remaining, 0)), true
	}
	if bu.Remaining >= 0 {
		r.remaining, r.hasRemaining = float64(bu.Remaining), true
	}
	return r
}

// addOther sums r into the origin's "other" row.
func (ks *keySeries) addOther(r row) {
	for i := range ks.rows {
		o := &ks.rows[i]
		if o.other && o.origin == r.origin {
			o.limit += r.limit
			o.used += r.used
			o.hasUsed = o.hasUsed || r.hasUsed
			o.remaining += r.remaining
			o.hasRemaining = o.hasRemaining || r.hasRemaining
			o.reset = max(o.reset, r.reset)
			return
		}
	}
	ks.rows = append(ks.rows, row{origin: r.origin, policy: "other", partition: "other", other: true,
		limit: r.limit, used: r.used, hasUsed: r.hasUsed, remaining: r.remaining, hasRemaining: r.hasRemaining, reset: r.reset})
}

// add sums o, another key's, into ks (the keys past maxValues).
func (ks *keySeries) add(o *keySeries) {
	for _, r := range o.rows {
		ks.addOther(r)
	}
	ks.hidden += o.hidden
	ks.inFlight += o.inFlight
	for src, n := range o.gates {
		ks.gates[src] += n
		ks.left[src] = max(ks.left[src], o.left[src])
	}
	for kind, n := range o.warnings {
		if _, ok := ks.warnings[kind]; !ok && len(ks.warnings) >= maxKinds-1 {
			kind = "other"
		}
		ks.warnings[kind] += n
	}
	for state, n := range o.circuit {
		ks.circuit[state] += n
	}
	ks.up = min(ks.up, o.up)
}

// emit sends ks's gauges, labelled key.
func (ks *keySeries) emit(ch chan<- prometheus.Metric, key string) {
	for _, r := range ks.rows {
		l := []string{key, r.policy, r.origin, r.partition}
		if r.limit > 0 {
			gauge(ch, descLimit, r.limit, l...)
		}
		if r.hasUsed {
			gauge(ch, descUsed, r.used, l...)
		}
		if r.hasRemaining {
			gauge(ch, descRemaining, r.remaining, l...)
		}
		gauge(ch, descReset, r.reset, l...)
		if r.other {
			continue
		}
		if r.window > 0 {
			gauge(ch, descWindow, r.window, l...)
		}
		if r.upstream {
			gauge(ch, descAge, r.age, key, r.policy, r.partition)
			gauge(ch, descExpired, r.expired, key, r.policy, r.partition)
		}
	}
	if ks.up == 0 && len(ks.rows) == 0 && len(ks.circuit) == 0 {
		gauge(ch, descUp, 0, key)
		return
	}
	gauge(ch, descHidden, ks.hidden, key)
	gauge(ch, descInFlight, ks.inFlight, key)
	var sources []string
	for _, g := range gateSources {
		sources = append(sources, string(g))
	}
	if _, ok := ks.gates["other"]; ok {
		sources = append(sources, "other")
	}
	for _, src := range sources {
		gauge(ch, descGates, ks.gates[src], key, src)
		if ks.gates[src] > 0 {
			gauge(ch, descGateLeft, ks.left[src], key, src)
		}
	}
	for kind, n := range ks.warnings {
		gauge(ch, descWarnings, n, key, kind)
	}
	for _, s := range []string{"closed", "half_open", "open"} {
		gauge(ch, descCircuit, ks.circuit[s], key, s)
	}
	gauge(ch, descUp, ks.up, key)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// onlyKeys gathers g's metrics, leaving out those of keys that may not be
// seen (metrics without a key label are kept), and folding the calls of
// callers that may not be seen into one caller, "(others)", as the
// dashboard's spenders do: a person with OAuth sees that a key is shared,
// not with whom.
type onlyKeys struct {
	g    prometheus.Gatherer
	may  func(key string) bool
	sees func(caller string) bool
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
		f.Metric = o.foldCallers(f.GetType(), f.Metric)
	}
	return fams, err
}

// othersCaller is the caller label of the calls of callers the reader
// may not see.
const othersCaller = "(others)"

// foldCallers relabels the series of callers the reader may not see as
// othersCaller and sums each resulting counter once; a series of another
// type with such a caller is left out (mcp_quota_calls_total, the one
// family with a caller label, is a counter). What it gathered is not
// changed: a relabelled series is a new one.
func (o onlyKeys) foldCallers(typ dto.MetricType, ms []*dto.Metric) []*dto.Metric {
	if o.sees == nil {
		return ms
	}
	out := ms[:0:0]
	folded := map[string]*dto.Metric{} // by the labels, once relabelled
	for _, m := range ms {
		i := slices.IndexFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == "caller" && !o.sees(l.GetValue()) })
		switch {
		case i < 0:
			out = append(out, m)
			continue
		case typ != dto.MetricType_COUNTER || m.GetCounter() == nil:
			continue
		}
		labels := slices.Clone(m.GetLabel())
		name, others := labels[i].GetName(), othersCaller
		labels[i] = &dto.LabelPair{Name: &name, Value: &others}
		var sig strings.Builder
		for _, l := range labels {
			sig.WriteString(l.GetName() + "=" + l.GetValue() + "\xff")
		}
		value := m.GetCounter().GetValue()
		if into, ok := folded[sig.String()]; ok {
			value += into.GetCounter().GetValue()
			into.Counter.Value = &value
			continue
		}
		n := &dto.Metric{Label: labels, Counter: &dto.Counter{Value: &value}}
		folded[sig.String()] = n
		out = append(out, n)
	}
	return out
}
