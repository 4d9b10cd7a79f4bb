package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Target is what mcp-quota's column must reach in every row.
const (
	// TargetShare is the least share of the allowed calls it must use.
	TargetShare = 0.95
	// shareTolerance is how much higher another column's share must be to
	// count as better: run-to-run noise is about one call in a hundred.
	shareTolerance = 0.01
)

// A Verdict says whether mcp-quota's cell in a row meets its target, and
// if not, why.
type Verdict struct {
	Met     bool
	Reasons []string // why not: "2 refusals (target 0)", "87% used (target 95%)", "x/time/rate does better"
}

// Judge returns the verdict on mcp-quota's cell of the row made of cells
// (one behaviour, one number of callers): no refusal where the limit is
// visible in advance and at most one (its discovery) where it is hidden;
// at least TargetShare of the allowed calls, over the run and sustained
// (Cell.Used); and no other client that does
// at least as well on both counts (as many refusals or fewer, and a share
// no more than shareTolerance lower, one of the two strictly better).
func Judge(row []Cell) (Verdict, bool) {
	i := slices.IndexFunc(row, func(c Cell) bool { return c.Client == MCPQuota })
	if i < 0 {
		return Verdict{}, false
	}
	q := row[i]
	var v Verdict
	allowedRefusals := 0
	if q.Behaviour.Hidden {
		allowedRefusals = 1
	}
	if q.Refused > allowedRefusals {
		v.Reasons = append(v.Reasons, fmt.Sprintf("%d %s (target %d)", q.Refused, plural(q.Refused, "refusal", "refusals"), allowedRefusals))
	}
	if q.Used() < TargetShare {
		v.Reasons = append(v.Reasons, fmt.Sprintf("%.0f%% used (target %.0f%%)", 100*q.Used(), 100*TargetShare))
	}
	for _, c := range row {
		if c.Client == MCPQuota {
			continue
		}
		fewer, asFew := c.Refused < q.Refused, c.Refused <= q.Refused
		more, asMuch := c.Used() > q.Used()+shareTolerance, c.Used() >= q.Used()-shareTolerance
		if (fewer && asMuch) || (asFew && more) {
			v.Reasons = append(v.Reasons, fmt.Sprintf("%s does better", c.Client.Title()))
		}
	}
	v.Met = len(v.Reasons) == 0
	return v, true
}

// Markdown writes the report as a Markdown table: a row per behaviour and
// number of callers, a column per client; each cell gives the calls
// accepted per window and their share of what the upstream allowed, the
// refusals, and the longest wait.
func (r *Report) Markdown(w io.Writer) error {
	var clients []Client
	type rowKey struct {
		behaviour string
		callers   int
	}
	var order []rowKey
	rows := map[rowKey][]Cell{}
	for _, c := range r.Cells {
		if !slices.Contains(clients, c.Client) {
			clients = append(clients, c.Client)
		}
		k := rowKey{c.Behaviour.Name, c.Callers}
		if _, ok := rows[k]; !ok {
			order = append(order, k)
		}
		rows[k] = append(rows[k], c)
	}
	slices.SortStableFunc(clients, func(a, b Client) int {
		return slices.Index(Clients(), a) - slices.Index(Clients(), b)
	})

	var b strings.Builder
	fmt.Fprintf(&b, "Each cell: calls accepted as a share of what the upstream allowed (in parentheses: the sustained share, see BENCHMARKS.md) · refusals (429, or GitHub's 403) · longest wait for one call. Runs of %d windows of %s.\n\n",
		r.Windows, r.Scale.Window)
	b.WriteString("| upstream behaviour | callers (processes) | allowed per window |")
	for _, c := range clients {
		fmt.Fprintf(&b, " %s |", c.Title())
	}
	b.WriteString(" mcp-quota target |\n|---|--:|--:|")
	for range clients {
		b.WriteString("--:|")
	}
	b.WriteString("---|\n")
	for _, k := range order {
		row := rows[k]
		first := row[0]
		fmt.Fprintf(&b, "| %s | %d | %s |", first.Behaviour.Title, k.callers, perWindow(first.Allowed, first.Windows))
		for _, c := range clients {
			i := slices.IndexFunc(row, func(x Cell) bool { return x.Client == c })
			if i < 0 {
				b.WriteString(" – |")
				continue
			}
			x := row[i]
			fmt.Fprintf(&b, " %.0f%% (%.0f%%) · %d · %s |", 100*x.Share(), 100*x.Sustained, x.Refused, waitText(x.LongestWait))
		}
		switch v, ok := Judge(row); {
		case !ok:
			b.WriteString(" – |\n")
		case v.Met:
			b.WriteString(" met |\n")
		default:
			fmt.Fprintf(&b, " missed: %s |\n", strings.Join(v.Reasons, "; "))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// perWindow renders n calls over windows as calls per window.
func perWindow(n, windows int) string {
	if windows <= 0 {
		return fmt.Sprint(n)
	}
	s := fmt.Sprintf("%.1f", float64(n)/float64(windows))
	return strings.TrimSuffix(s, ".0")
}

func waitText(d time.Duration) string {
	return fmt.Sprintf("%.1f s", d.Seconds())
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
