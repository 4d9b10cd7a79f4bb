package dashboard

import (
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report"
)

// Timeline settings: the chart spans two of the key's longest windows,
// within these bounds, in about timelineSteps steps of whole seconds.
const (
	minSpan       = time.Minute
	maxSpan       = time.Hour
	timelineSteps = 120
)

// detail is one key as the page shows it.
type detail struct {
	Status   report.KeyStatus `json:"status"` // the budgets, gate, warnings and advice, as quota_status says them
	Timeline timeline         `json:"timeline"`
	Gates    []mark           `json:"gates"`    // gates closed during the timeline
	Warnings []mark           `json:"warnings"` // warnings raised during the timeline
	Frees    []freeing        `json:"frees"`    // when each documented budget's calls come back
	Spenders []spender        `json:"spenders"` // who spent the window
	WindowS  int64            `json:"window_s"` // the window spenders are counted over
	LatestID int64            `json:"latest_id"`
}

// timeline is calls per step of the last windows, by outcome, and the
// budget's calls left over the same steps and the steps ahead.
type timeline struct {
	Since  string           `json:"since"`
	StepS  int64            `json:"step_s"`
	Steps  int              `json:"steps"`  // steps up to and with the one now is in
	Ahead  int              `json:"ahead"`  // steps after those the budget is projected over
	Series map[string][]int `json:"series"` // outcome → count per step
	Budget *budgetLine      `json:"budget,omitempty"`
}

// budgetLine is one policy's calls left in its sliding window at the end
// of each step (Steps+Ahead of them): as they were, and ahead, as they
// come back if no other call is made. It is counted per step from the
// key's log, a picture; the exact figures are in Status and Frees.
type budgetLine struct {
	Policy  string  `json:"policy"`
	Limit   int64   `json:"limit"`
	WindowS int64   `json:"window_s"`
	Left    []int64 `json:"left"`
}

// A freeing says when one budget's spent calls come back: the first
// (Next, NextCalls of them leave the window by then) and the last (All,
// when every call of the window has left it). Times are rounded up to
// the second. Next and All are empty when nothing of the window is spent.
type freeing struct {
	Policy    string `json:"policy"`
	Limit     int64  `json:"limit"`
	WindowS   int64  `json:"window_s"`
	Used      int64  `json:"used"`
	Next      string `json:"next,omitempty"`
	NextCalls int64  `json:"next_calls,omitempty"`
	All       string `json:"all,omitempty"`
}

// A mark is a gate or a warning on the timeline.
type mark struct {
	At     string `json:"at"`
	Until  string `json:"until,omitempty"`
	Kind   string `json:"kind"` // a gate's source or a warning's kind
	Reason string `json:"reason"`
}

// A spender is one caller's part of the key's window, or (Others) the
// part of every caller the person may not see, summed, without names.
type spender struct {
	Caller   string  `json:"caller"`
	Others   bool    `json:"others,omitempty"`
	Used     int     `json:"used"`
	Share    float64 `json:"share"`    // of the window's calls, 0…1
	Reserved int64   `json:"reserved"` // units its reservation keeps for it; 0 when none
	Held     int64   `json:"held"`     // of those, held back from the others now (it is active)
	Lent     int64   `json:"lent"`     // of those, lent to the others now (it is idle)
}

// outcome is the chart's series a bucket belongs to. The upstream's
// refusals for quota (429) are apart from its other 4xx answers.
func outcome(b ledger.Bucket) string {
	if b.State == ledger.RejectedUpstream && b.Status == http.StatusTooManyRequests {
		return "refused_upstream"
	}
	switch b.State {
	case ledger.Confirmed, ledger.Accepted:
		return "sent"
	case ledger.RejectedUpstream:
		return "answered_error"
	case ledger.RejectedLocal:
		return "refused_locally"
	case ledger.Cached:
		return "kept_copy"
	case ledger.Interrupted, ledger.Released:
		return "interrupted"
	case ledger.Failed:
		return "failed"
	}
	return "in_flight"
}

// window is the longest window known for k, and the q and policy of it.
func window(k *keystore.Key, ks report.KeyStatus) (w time.Duration, q int64, policy string) {
	for _, p := range k.Policies {
		if p.Window > w {
			w, q, policy = p.Window, p.Quota, p.Name
		}
	}
	if w == 0 {
		for _, u := range ks.Upstream {
			if d := time.Duration(u.W) * time.Second; d > w {
				w, q, policy = d, u.Q, u.Policy
			}
		}
	}
	return w, q, policy
}

// detail is what the dashboard's page of key k shows caller c at now: its
// status, and a timeline of about two of its windows (at least minSpan,
// at most maxSpan) of what became of its calls (series), its gates and
// its warnings, with the line of the binding budget over it.
func (h *Handler) detail(r *http.Request, c *keystore.Caller, k *keystore.Key, ks report.KeyStatus, now time.Time) (*detail, error) {
	w, q, _ := window(k, ks)
	span := min(max(2*w, minSpan), maxSpan)
	step := time.Duration(math.Ceil(span.Seconds()/timelineSteps)) * time.Second
	steps := int(span / step)
	since := now.Add(-time.Duration(steps) * step).Truncate(step)
	steps++ // the step now is in (ks names no reservation c may not see: report.Build)
	d := &detail{Status: ks, Gates: []mark{}, Warnings: []mark{}, Frees: []freeing{}, Spenders: []spender{}, WindowS: report.Seconds(w),
		Timeline: timeline{Since: stamp(since), StepS: int64(step / time.Second), Steps: steps, Series: map[string][]int{}}}
	for _, s := range series {
		d.Timeline.Series[s] = make([]int, steps)
	}
	bp, bq, bw := budgetPolicy(ks)
	// The budget's line needs the sends of one window before the chart.
	back := 0
	if bq > 0 {
		back = int((bw + step - 1) / step)
		d.Timeline.Ahead = min(back, steps/2)
		d.Timeline.Budget = &budgetLine{Policy: bp, Limit: bq, WindowS: report.Seconds(bw)}
	}
	if w == 0 {
		w = span / 2
	}
	err := h.c.DB.View(r.Context(), func(tx ledger.ReadTx) error {
		if err := d.count(tx, k.Name, since, step, back); err != nil {
			return err
		}
		if err := d.mark(tx, k.Name, ks, since, now); err != nil {
			return err
		}
		return d.spending(tx, k, c, w, q, now)
	})
	return d, err
}

// count fills the timeline from since, in steps of step, and the budget's
// line, which needs back steps before since.
func (d *detail) count(tx ledger.ReadTx, key string, since time.Time, step time.Duration, back int) error {
	from := since.Add(-time.Duration(back) * step)
	buckets, err := tx.Timeline(key, from, step)
	if err != nil {
		return err
	}
	steps := d.Timeline.Steps
	counted := make([]int64, back+steps+d.Timeline.Ahead)
	for _, b := range buckets {
		i := int(b.Start.Sub(from) / step)
		if i < 0 || i >= back+steps {
			continue
		}
		if b.State != ledger.RejectedLocal && b.State != ledger.Cached {
			counted[i] += int64(b.Count)
		}
		if i -= back; i >= 0 {
			d.Timeline.Series[outcome(b)][i] += b.Count
		}
	}
	if bl := d.Timeline.Budget; bl != nil {
		bl.Left = leftPerStep(counted, back, bl.Limit)
	}
	return nil
}

// mark adds when each local policy frees, and the gates and warnings
// since since.
func (d *detail) mark(tx ledger.ReadTx, key string, ks report.KeyStatus, since, now time.Time) error {
	for _, l := range ks.Local {
		if l.Limit <= 0 || l.WindowS <= 0 {
			continue
		}
		f, err := frees(tx, key, l, now)
		if err != nil {
			return err
		}
		d.Frees = append(d.Frees, f)
	}
	gates, err := tx.Gates(key, since)
	if err != nil {
		return err
	}
	for _, g := range gates {
		d.Gates = append(d.Gates, mark{At: stamp(g.SetAt), Until: stamp(g.Until), Kind: string(g.Source), Reason: g.Reason.String()})
	}
	warnings, err := tx.Warnings(key, since)
	if err != nil {
		return err
	}
	for _, wa := range warnings {
		d.Warnings = append(d.Warnings, mark{At: stamp(wa.At), Kind: string(wa.Kind), Reason: wa.Reason.String()})
	}
	return nil
}

// spending adds who spends k's window of w (of q calls) that c may see,
// and the latest call's id.
func (d *detail) spending(tx ledger.ReadTx, k *keystore.Key, c *keystore.Caller, w time.Duration, q int64, now time.Time) error {
	win, err := tx.WindowByCaller(k.Name, now.Add(-w))
	if err != nil {
		return err
	}
	claimed, err := tx.Claimed(k.Name, now)
	if err != nil {
		return err
	}
	d.Spenders = withoutHidden(spenders(k, win, claimed, q), c)
	latest, err := tx.Activity(ledger.ActivityFilter{Key: k.Name, Limit: 1})
	if err != nil {
		return err
	}
	if len(latest) > 0 {
		d.LatestID = latest[0].ID
	}
	return nil
}

// series are the timeline's outcomes, in the order the chart stacks them.
var series = []string{"sent", "refused_upstream", "refused_locally", "answered_error", "kept_copy", "interrupted", "failed", "in_flight"}

// budgetPolicy is the budget the timeline draws: the documented policy
// with the fewest calls left, else the upstream's (whole-key, with q and
// w known) with the fewest; q is 0 when there is none.
func budgetPolicy(ks report.KeyStatus) (name string, q int64, w time.Duration) {
	left := int64(math.MaxInt64)
	for _, l := range ks.Local {
		if l.Limit > 0 && l.WindowS > 0 && l.Remaining < left {
			name, q, w, left = l.Policy, l.Limit, time.Duration(l.WindowS)*time.Second, l.Remaining
		}
	}
	if q > 0 {
		return name, q, w
	}
	for _, u := range ks.Upstream {
		if u.Q > 0 && u.W > 0 && u.Partition == "" && u.R >= 0 && u.R < left {
			name, q, w, left = u.Policy, u.Q, time.Duration(u.W)*time.Second, u.R
		}
	}
	return name, q, w
}

// leftPerStep is q less the calls counted in the window of back steps
// that ends with each step after the first back ones.
func leftPerStep(counted []int64, back int, q int64) []int64 {
	out := make([]int64, len(counted)-back)
	var in int64
	for i := range counted {
		in += counted[i]
		if i >= back {
			in -= counted[i-back]
			out[i-back] = min(max(q-in, 0), q)
		}
	}
	return out
}

// windowLog is what frees reads of the log.
type windowLog interface {
	Window(key string, since time.Time) (ledger.Window, error)
	Latest(key string) (time.Time, error)
	Count(key string, since time.Time) (int, error)
}

// frees says when the calls spent in l's window come back, as the pacer
// counts them: a send stays in a window of w for w and a margin of up to
// pacer.MaxMargin; the longest is assumed, so that the page never names
// a time before the pacer's.
func frees(tx windowLog, key string, l report.Local, now time.Time) (freeing, error) {
	w := time.Duration(l.WindowS) * time.Second
	stay := w + pacer.MaxMargin
	f := freeing{Policy: l.Policy, Limit: l.Limit, WindowS: l.WindowS}
	win, err := tx.Window(key, now.Add(-stay))
	if err != nil || win.Count == 0 {
		return f, err
	}
	latest, err := tx.Latest(key)
	if err != nil {
		return f, err
	}
	next := ceilSecond(win.Oldest.Add(stay))
	later, err := tx.Count(key, next.Add(-stay))
	if err != nil {
		return f, err
	}
	f.Used = int64(win.Count)
	f.Next, f.NextCalls = stamp(next), int64(win.Count-later)
	f.All = stamp(ceilSecond(latest.Add(stay)))
	return f, nil
}

// ceilSecond is t rounded up to a whole second.
func ceilSecond(t time.Time) time.Time {
	if r := t.Truncate(time.Second); !r.Equal(t) {
		return r.Add(time.Second)
	}
	return t
}

// spenders are the callers that spent win, most first, and every caller
// with a reservation, with what the reservation holds back or lends
// (see the pacer: an idle reservation is lent).
func spenders(k *keystore.Key, win ledger.Window, claimed map[string]bool, q int64) []spender {
	byName := map[string]*spender{}
	var out []*spender
	get := func(name string) *spender {
		if s, ok := byName[name]; ok {
			return s
		}
		s := &spender{Caller: name}
		byName[name] = s
		out = append(out, s)
		return s
	}
	for name, n := range win.ByCaller {
		s := get(name)
		s.Used = n
		if win.Count > 0 {
			s.Share = float64(n) / float64(win.Count)
		}
	}
	for _, r := range k.Reserves {
		s := get(r.Caller)
		s.Reserved = int64(math.Floor(r.Share * float64(q)))
		free := max(s.Reserved-int64(s.Used), 0)
		if s.Used == 0 && !claimed[r.Caller] {
			s.Lent = free
		} else {
			s.Held = free
		}
	}
	slices.SortFunc(out, func(a, b *spender) int {
		if a.Used != b.Used {
			return b.Used - a.Used
		}
		if a.Caller < b.Caller {
			return -1
		}
		return 1
	})
	res := make([]spender, len(out))
	for i, s := range out {
		res[i] = *s
	}
	return res
}

// withoutHidden keeps the spenders c may see and sums the others into
// one line that names none of them, last, when there are any: a person
// sees that the key is shared, not with whom.
func withoutHidden(list []spender, c *keystore.Caller) []spender {
	if c.SeesEveryone() {
		return list
	}
	out := make([]spender, 0, len(list))
	others := spender{Others: true}
	hidden := false
	for _, s := range list {
		if c.MaySee(s.Caller) {
			out = append(out, s)
			continue
		}
		hidden = true
		others.Used += s.Used
		others.Share += s.Share
		others.Reserved += s.Reserved
		others.Held += s.Held
		others.Lent += s.Lent
	}
	if hidden {
		out = append(out, others)
	}
	return out
}
