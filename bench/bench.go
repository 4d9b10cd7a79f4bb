// Package bench is mcp-quota's pacing benchmark: the same greedy workload
// — callers that want to make calls as fast as they can — sent through
// several clients (a naive retry loop, go-retryablehttp, x/time/rate set
// to the documented limit, and mcp-quota's upstream.Client with its pacer
// and state file) against the demo upstream in each of its behaviours,
// with one caller and with two callers in two processes sharing the key.
// For each run it reports the calls the upstream accepted as a share of
// what it allowed (see Allowed), the refusals it answered, and the
// longest a caller waited for one call.
//
// The benchmark runs in real time against scaled-down windows (seconds,
// not minutes): it measures real pacing, so a run takes minutes. It is
// behind the command "mcp-quota bench quota"; see BENCHMARKS.md.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/mcp-quota/mcp-quota/demo"
)

// callerNames are the names of a run's callers: with one caller it runs
// in the benchmark's process; with two, each runs in a worker process.
var callerNames = []string{"agent", "sync"}

// Options configure Run. The zero value of a field means its default.
type Options struct {
	// Scale is the simulated limit; the zero value means DefaultScale.
	Scale Scale
	// Windows is how long each run lasts, in windows of Scale.Window; 0
	// means 6.
	Windows int
	// Behaviours are the rows; nil means every behaviour.
	Behaviours []Behaviour
	// Clients are the columns; nil means every client.
	Clients []Client
	// Callers are the workloads, by number of callers sharing the key (1
	// or 2); nil means both. With 2, both callers run in worker
	// processes.
	Callers []int
	// Skip, when set, leaves out the runs it reports true for.
	Skip func(b Behaviour, c Client, callers int) bool
	// Worker returns the command that runs a worker process, one that
	// calls Worker with its standard streams. It is needed for runs with
	// two callers.
	Worker func(ctx context.Context) *exec.Cmd
	// Progress, when set, receives a line per finished run, and the
	// workers' diagnostics.
	Progress io.Writer
	// Verbose logs mcp-quota's warnings (hidden limits, open circuits)
	// and every run's pauses (see timeline) to Progress.
	Verbose bool
	// Dir holds the runs' state files; "" means a new temporary
	// directory, removed at the end.
	Dir string
}

// QuickOptions are a smoke test's: runs of 2 windows of 2 s (20 calls
// each) of the naive client and mcp-quota against the seed's and the
// sliding behaviour with one caller, and of mcp-quota against the seed's
// with two callers in two processes: five runs, about 25 s in all.
func QuickOptions() Options {
	b0, _ := BehaviourNamed("seed")
	b1, _ := BehaviourNamed("sliding")
	return Options{
		Scale:      DefaultScale.With(2*time.Second, 0),
		Windows:    2,
		Behaviours: []Behaviour{b0, b1},
		Clients:    []Client{Naive, MCPQuota},
		Callers:    []int{1, 2},
		Skip: func(b Behaviour, c Client, callers int) bool {
			return callers > 1 && (c != MCPQuota || b.Name != "seed")
		},
	}
}

func (o Options) withDefaults() Options {
	if o.Scale == (Scale{}) {
		o.Scale = DefaultScale
	}
	if o.Windows == 0 {
		o.Windows = 6
	}
	if o.Behaviours == nil {
		o.Behaviours = Behaviours()
	}
	if o.Clients == nil {
		o.Clients = Clients()
	}
	if o.Callers == nil {
		o.Callers = []int{1, 2}
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return o
}

// Duration is how long one run lasts.
func (o Options) Duration() time.Duration {
	o = o.withDefaults()
	return time.Duration(o.Windows) * o.Scale.Window
}

// A Cell is the result of one run: one behaviour, one client, one number
// of callers.
type Cell struct {
	Behaviour Behaviour
	Client    Client
	Callers   int
	Windows   int           // the run's length in windows
	Window    time.Duration // the window
	// Allowed is what the upstream allowed the key in the run (Allowed).
	Allowed int
	// Accepted counts the calls the upstream accepted during the run, from
	// every caller.
	Accepted int
	// Sustained is the share of the upstream's pace the run kept up
	// (Sustained), or Share when it cannot tell.
	Sustained float64
	// Refused counts the upstream's refusals for the limit during the run
	// (429, or the GitHub behaviour's 403).
	Refused int
	// Requests counts every request that reached the upstream.
	Requests int
	// LongestWait is the longest any caller waited for one call.
	LongestWait time.Duration
	// AcceptedAt are the times the upstream accepted the run's calls,
	// from the run's start.
	AcceptedAt []time.Duration
	// Tallies are what each caller saw.
	Tallies []Tally
	// Elapsed is the run's real duration, setup included.
	Elapsed time.Duration
}

// Share is Accepted as a share of Allowed.
func (c Cell) Share() float64 {
	if c.Allowed == 0 {
		return 0
	}
	return float64(c.Accepted) / float64(c.Allowed)
}

// Used is what the target is judged on: the lower of Share and
// Sustained.
func (c Cell) Used() float64 { return min(c.Share(), c.Sustained) }

// A Report is every cell of a benchmark, with how it was run.
type Report struct {
	Scale   Scale
	Windows int
	Cells   []Cell
	Elapsed time.Duration
}

// Run runs the benchmark options describe: every behaviour with every
// client and number of callers, one run after another.
func Run(ctx context.Context, opts Options) (*Report, error) {
	o := opts.withDefaults()
	o.Progress = &lockedWriter{w: o.Progress} // workers' diagnostics come from several goroutines
	for _, n := range o.Callers {
		if n < 1 || n > len(callerNames) {
			return nil, fmt.Errorf("bench: %d callers: use 1 or 2", n)
		}
		if n > 1 && o.Worker == nil {
			return nil, errors.New("bench: runs with two callers need Options.Worker")
		}
	}
	if o.Scale.Quota < 1 || o.Scale.Window < time.Second || o.Scale.Window%time.Second != 0 {
		return nil, fmt.Errorf("bench: a quota of %d per %s: use a positive quota and a window of whole seconds (the headers count in seconds)", o.Scale.Quota, o.Scale.Window)
	}
	dir := o.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "mcp-quota-bench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	began := time.Now()
	rep := &Report{Scale: o.Scale, Windows: o.Windows}
	d := o.Duration()
	for _, b := range o.Behaviours {
		oracle := Oracle(b.Upstream(o.Scale, "", nil), d)
		for _, n := range o.Callers {
			for _, c := range o.Clients {
				if o.Skip != nil && o.Skip(b, c, n) {
					continue
				}
				cell, err := runCell(ctx, o, b, c, n, oracle, filepath.Join(dir, fmt.Sprintf("%s-%s-%d.db", b.Name, c, n)))
				if err != nil {
					return rep, fmt.Errorf("bench: %s, %s, %d callers: %w", b.Name, c, n, err)
				}
				rep.Cells = append(rep.Cells, cell)
				if o.Verbose {
					timeline(o.Progress, cell)
				}
				fmt.Fprintf(o.Progress, "%-12s %-14s %d caller(s): %4d of %4d allowed (%5.1f%%, sustained %5.1f%%), %6d refused, longest wait %s\n",
					b.Name, c, n, cell.Accepted, cell.Allowed, 100*cell.Share(), 100*cell.Sustained, cell.Refused, cell.LongestWait.Round(10*time.Millisecond))
			}
		}
	}
	rep.Elapsed = time.Since(began)
	return rep, nil
}

// startDelay is how long after every caller is ready a run starts.
const startDelay = 100 * time.Millisecond

// runCell runs one client with n callers against a fresh upstream.
func runCell(ctx context.Context, o Options, b Behaviour, c Client, n int, oracle []time.Duration, statePath string) (Cell, error) {
	began := time.Now()
	cell := Cell{Behaviour: b, Client: c, Callers: n, Windows: o.Windows, Window: o.Scale.Window, Allowed: len(oracle)}
	token, err := newToken()
	if err != nil {
		return cell, err
	}
	api := demo.New(b.Upstream(o.Scale, token, nil))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return cell, err
	}
	srv := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()

	d := o.Duration()
	base := spec{Client: c, Behaviour: b.Name, Scale: o.Scale, BaseURL: "http://" + ln.Addr().String() + "/",
		Token: token, StatePath: statePath, MaxWait: d, Verbose: o.Verbose}
	cs, err := startCallers(ctx, o, base, n)
	defer cs.close()
	if err != nil {
		return cell, err
	}

	start := time.Now().Add(startDelay)
	end := start.Add(d)
	for _, p := range cs.workers {
		if err := p.start(start, end); err != nil {
			return cell, err
		}
	}
	// The refusals are counted at the end: a call cut short then is not
	// the client's doing.
	refused := make(chan demo.Stats, 1)
	stop := time.AfterFunc(time.Until(end), func() { refused <- api.Stats(token) })
	defer stop.Stop()

	if cell.Tallies, err = cs.run(ctx, start, end); err != nil {
		return cell, err
	}
	var atEnd demo.Stats
	select {
	case atEnd = <-refused:
	case <-ctx.Done():
		return cell, ctx.Err()
	}
	cell.count(api.Stats(token).Accepted, atEnd, start, end, oracle)
	cell.Elapsed = time.Since(began)
	return cell, nil
}

// callers are one cell's callers: one in this process, or n worker
// processes.
type callers struct {
	local   caller
	workers []*process // started and not yet waited for
}

// startCallers starts the n callers of spec base: in this process when
// n is 1, otherwise as worker processes. What it returns is to be closed
// even with an error.
func startCallers(ctx context.Context, o Options, base spec, n int) (*callers, error) {
	cs := &callers{}
	if n == 1 {
		s := base
		s.Caller = callerNames[0]
		var err error
		cs.local, err = newCaller(ctx, s, o.Progress)
		return cs, err
	}
	for i := range n {
		s := base
		s.Caller = callerNames[i]
		p, err := startWorker(ctx, o.Worker, s, o.Progress)
		if err != nil {
			return cs, err
		}
		cs.workers = append(cs.workers, p)
	}
	return cs, nil
}

// run runs the local caller from start to end, or waits for the workers,
// and returns each caller's tally.
func (cs *callers) run(ctx context.Context, start, end time.Time) ([]Tally, error) {
	var tallies []Tally
	if cs.local != nil {
		t, err := runCaller(ctx, cs.local, callerNames[0], start, end)
		if err != nil {
			return tallies, err
		}
		tallies = append(tallies, t)
	}
	ps := cs.workers
	cs.workers = nil
	for _, p := range ps {
		t, err := p.wait()
		if err != nil {
			return tallies, err
		}
		tallies = append(tallies, t)
	}
	return tallies, nil
}

// close ends the callers that were not waited for.
func (cs *callers) close() {
	for _, p := range cs.workers {
		p.fail(errors.New("run abandoned"))
	}
	if cs.local != nil {
		cs.local.close()
	}
}

// count fills the cell from what the upstream accepted between start and
// end, and the refusals and requests it saw at the end.
func (cell *Cell) count(accepted []time.Time, atEnd demo.Stats, start, end time.Time, oracle []time.Duration) {
	for _, t := range accepted {
		if !t.Before(start) && t.Before(end) {
			cell.Accepted++
			cell.AcceptedAt = append(cell.AcceptedAt, t.Sub(start))
		}
	}
	cell.Refused, cell.Requests = atEnd.Rejected, atEnd.Requests
	if s, ok := Sustained(cell.AcceptedAt, oracle); ok {
		cell.Sustained = s
	} else {
		cell.Sustained = cell.Share()
	}
	for _, t := range cell.Tallies {
		cell.LongestWait = max(cell.LongestWait, t.LongestWait)
	}
}

func newToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// lockedWriter serialises writes from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// timeline writes when the run's calls were accepted: every pause of
// more than a tenth of a window between two accepted calls, as
// "from→to" seconds after the run's start.
func timeline(w io.Writer, c Cell) {
	var b strings.Builder
	b.WriteString("  pauses:")
	var prev time.Duration
	for _, t := range c.AcceptedAt {
		if t-prev > c.Window/10 {
			fmt.Fprintf(&b, " %.2f→%.2f", prev.Seconds(), t.Seconds())
		}
		prev = t
	}
	b.WriteString("\n")
	io.WriteString(w, b.String())
}
