package dashboard

import (
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
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
	Spenders []spender        `json:"spenders"` // who spent the window
	WindowS  int64            `json:"window_s"` // the window spenders are counted over
	LatestID int64            `json:"latest_id"`
}

// timeline is calls per step of the last windows, by outcome.
type timeline struct {
	Since  string           `json:"since"`
	StepS  int64            `json:"step_s"`
	Steps  int              `json:"steps"`
	Series map[string][]int `json:"series"` // outcome → count per step
	// The limit drawn: a policy's q per w as calls per second.
	LimitPerS float64 `json:"limit_per_s"`
	Limit     string  `json:"limit"`
}

// A mark is a gate or a warning on the timeline.
type mark struct {
	At     string `json:"at"`
	Until  string `json:"until,omitempty"`
	Kind   string `json:"kind"` // a gate's source or a warning's kind
	Reason string `json:"reason"`
}

// A spender is one caller's part of the key's window.
type spender struct {
	Caller   string  `json:"caller"`
	Used     int     `json:"used"`
	Share    float64 `json:"share"`    // of the window's calls, 0…1
	Reserved int64   `json:"reserved"` // units its reservation keeps for it; 0 when none
	Held     int64   `json:"held"`     // of those, held back from the others now (it is active)
	Lent     int64   `json:"lent"`     // of those, lent to the others now (it is idle)
}

// outcome is the chart's series an attempt state belongs to.
func outcome(st string) string {
	switch st {
	case ledger.Confirmed, ledger.Accepted:
		return "sent"
	case ledger.RejectedUpstream:
		return "refused_upstream"
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

func (h *Handler) detail(r *http.Request, k *keystore.Key, ks report.KeyStatus, now time.Time) (*detail, error) {
	w, q, policy := window(k, ks)
	span := min(max(2*w, minSpan), maxSpan)
	step := time.Duration(math.Ceil(span.Seconds()/timelineSteps)) * time.Second
	steps := int(span / step)
	since := now.Add(-time.Duration(steps) * step).Truncate(step)
	steps++ // the step now is in
	d := &detail{Status: ks, Gates: []mark{}, Warnings: []mark{}, Spenders: []spender{}, WindowS: report.Seconds(w),
		Timeline: timeline{Since: stamp(since), StepS: int64(step / time.Second), Steps: steps, Series: map[string][]int{}}}
	if w > 0 && q > 0 {
		d.Timeline.LimitPerS = float64(q) / w.Seconds()
		d.Timeline.Limit = policy
	}
	for _, s := range []string{"sent", "refused_upstream", "refused_locally", "kept_copy", "interrupted", "failed", "in_flight"} {
		d.Timeline.Series[s] = make([]int, steps)
	}
	if w == 0 {
		w = span / 2
	}
	err := h.c.DB.View(r.Context(), func(tx ledger.Tx) error {
		buckets, err := tx.Timeline(k.Name, since, step)
		if err != nil {
			return err
		}
		for _, b := range buckets {
			if i := int(b.Start.Sub(since) / step); i >= 0 && i < steps {
				d.Timeline.Series[outcome(b.State)][i] += b.Count
			}
		}
		gates, err := tx.Gates(k.Name, since)
		if err != nil {
			return err
		}
		for _, g := range gates {
			d.Gates = append(d.Gates, mark{At: stamp(g.SetAt), Until: stamp(g.Until), Kind: g.Source, Reason: g.Reason})
		}
		warnings, err := tx.Warnings(k.Name, since)
		if err != nil {
			return err
		}
		for _, wa := range warnings {
			d.Warnings = append(d.Warnings, mark{At: stamp(wa.At), Kind: wa.Kind, Reason: wa.Message})
		}
		win, err := tx.WindowByCaller(k.Name, now.Add(-w))
		if err != nil {
			return err
		}
		claimed, err := tx.Claimed(k.Name, now)
		if err != nil {
			return err
		}
		d.Spenders = spenders(k, win, claimed, q)
		latest, err := tx.Activity(ledger.ActivityFilter{Key: k.Name, Limit: 1})
		if err != nil {
			return err
		}
		if len(latest) > 0 {
			d.LatestID = latest[0].ID
		}
		return nil
	})
	return d, err
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
