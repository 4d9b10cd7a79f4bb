package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// TestHostsShareOneBudget stands three `serve` processes for three hosts
// (each with its own HOME, state directory, working directory and
// instance name; host-c's clock seven seconds ahead) and a `stdio` agent
// on one key and one PostgreSQL database, and has them spend the key's
// budget as greedily as they can against the demo upstream until the last
// outage has ended, and then until each caller was answered after it:
// REST callers on every host and the agent's fetch loop.
// During the run PostgreSQL stops for three seconds and restarts on its
// port; host-b is killed with SIGKILL half-way; and PostgreSQL hangs for
// three seconds (its processes stopped: only the state_timeout ends a
// call's wait for it).
//
// Then: no rolling window holds more admissions than the quota, on the
// database's clock (an attempt not sent for leaving late, whose call was
// admitted again, aside); the upstream, by its own log, received no more than
// the quota in any rolling window and refused nothing with 429. Every request the upstream received is in the shared
// activity read from host-a, attributed to the instance that sent it,
// the three hosts and the agent all there. While the database was gone
// calls failed closed — REST 503 and MCP isError, code stateUnavailable —
// within a bound of the state_timeout, and service came back by itself.
func TestHostsShareOneBudget(t *testing.T) {
	t.Parallel()
	const (
		quota        = 30
		window       = 4 * time.Second
		stateTimeout = time.Second
		restartAt    = 8 * time.Second // PostgreSQL stops then for downFor, and restarts
		downFor      = 3 * time.Second
		killAt       = 15 * time.Second // host-b is killed then
		hangAt       = 19 * time.Second // PostgreSQL hangs then for downFor
		load         = hangAt + downFor // how long the callers keep at it, at least…
		resumeWait   = time.Minute      // …and at most this longer, until every caller was answered after the outages
		workers      = 3                // REST callers on each host
		maxWait      = 2                // seconds a call waits for the budget: less than downFor
		// slack is room for a loaded machine in every bound on time.
		slack = 2 * time.Second
	)
	pg := pgtest.Start(t)
	db := pg.CreateDatabase(t)
	freeze, err := newPGFreeze(t, pg.URLWithPassword("postgres"))
	if err != nil {
		t.Logf("PostgreSQL will not hang in this run: %v", err)
	}
	up := newUpstreamLog(t, demo.Config{Quota: quota, Window: window})
	cfg := hostsConfig(db, up.url, quota, window, stateTimeout)

	hosts := serveThreeHosts(t, cfg, pg.Password())
	a, b := hosts[0], hosts[1]
	agentHost := newHost(t, "agent", cfg, pg.Password())
	agent := agentHost.stdioSession(t)
	client := &http.Client{Timeout: 30 * time.Second} // a hang fails the call, not the test run
	defer client.CloseIdleConnections()
	goroutinesBefore := goroutines(t, a.base)

	var log testkit.List[hostCall]
	ctx, stop := context.WithTimeout(context.Background(), load+resumeWait)
	defer stop()
	start := time.Now()
	since := func(at time.Time) time.Duration { return at.Sub(start).Round(time.Millisecond) }
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() }) // should the test end early: no caller outlives it
	for _, h := range hosts {
		for w := range workers {
			wg.Go(func() { h.restCalls(ctx, t, client, w+1, maxWait, &log) })
		}
	}
	wg.Go(func() { agentCalls(ctx, t, agent, maxWait, &log) })

	time.Sleep(time.Until(start.Add(restartAt)))
	restart := &outage{name: "restart", from: time.Now()}
	pg.Stop(t)
	time.Sleep(downFor)
	pg.Restart(t)
	restart.to = time.Now()
	outages := []*outage{restart}

	time.Sleep(time.Until(start.Add(killAt)))
	b.killed.Store(true)
	b.cmd.Process.Kill()
	b.cmd.Wait()
	killed := time.Now()

	if freeze != nil {
		time.Sleep(time.Until(start.Add(hangAt)))
		hang := &outage{name: "hang", from: time.Now()}
		if err := freeze.freeze(t.Context()); err != nil {
			t.Errorf("freeze PostgreSQL: %v", err)
		}
		time.Sleep(downFor)
		freeze.thaw()
		hang.to = time.Now()
		outages = append(outages, hang)
	}
	// The load goes on for load, then until every caller still running
	// has been answered after the last outage (within resumeWait): on a
	// loaded machine service comes back later, but it must come back.
	last := outages[len(outages)-1].to
	for ctx.Err() == nil && (time.Since(start) < load || !answeredAfter(log.All(), last, "host-a", "host-c", "agent")) {
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	stop()
	wg.Wait()
	end := time.Now()
	client.CloseIdleConnections()
	t.Logf("PostgreSQL restarted from %v to %v; host-b killed at %v; load ended at %v", since(restart.from), since(restart.to), since(killed), since(end))

	// What the callers saw: failures while the database was gone, each
	// soon after it went, and answers again once it was back.
	byWho := map[string]map[string]int{}
	var slowest time.Duration
	var elsewhere []string // calls that failed outside the outages
	calls := log.All()
	for _, c := range calls {
		if byWho[c.who] == nil {
			byWho[c.who] = map[string]int{}
		}
		byWho[c.who][c.kind]++
		// No call hangs: it waits for the budget, then takes at most
		// three bounded transactions (admission, outcome, the quota).
		slowest = max(slowest, c.end.Sub(c.start))
		if took, bound := c.end.Sub(c.start), maxWait*time.Second+3*stateTimeout+slack; took > bound {
			t.Errorf("%s: call %s took %v; want at most %v", c.who, c.id, took.Round(time.Millisecond), bound)
		}
		var in *outage
		for _, o := range outages {
			if o.note(c) {
				in = o
			}
		}
		if c.kind != callUnavailable {
			continue
		}
		if in == nil {
			elsewhere = append(elsewhere, fmt.Sprintf("%s (%v to %v)", c.id, since(c.start), since(c.end)))
			continue
		}
		// A call that began while the database was gone fails within
		// one bounded transaction (a REST 503 reads no quota for its
		// headers then: see rest's Handler.failed); one that began before
		// may first have waited for the budget. One that began after it,
		// while the hosts connect again, may have waited for the budget
		// and failed in any of its transactions (on a loaded machine, one
		// that outlasted the state_timeout): each is bounded.
		bound := stateTimeout
		switch {
		case c.start.Before(in.from):
			bound += maxWait * time.Second
		case c.start.After(in.to):
			bound = maxWait*time.Second + 3*stateTimeout
		}
		if took := c.end.Sub(later(c.start, in.from)); took > bound+slack {
			t.Errorf("%s: call %s failed %v into the %s; want within %v", c.who, c.id, took.Round(time.Millisecond), in.name, bound+slack)
		}
	}
	t.Logf("calls by caller and result: %v; the slowest took %v", byWho, slowest.Round(time.Millisecond))
	for _, o := range outages {
		t.Logf("%s (%v to %v): %d calls failed, by caller %v; the slowest to fail, from when it (or the call) began: %v; the first answers after it: %v",
			o.name, since(o.from), since(o.to), o.failures, o.failed, o.slowest, o.resumed)
		for _, who := range []string{"host-a", "host-c", "agent"} {
			if o.failed[who] == 0 {
				t.Errorf("%s: no call of %s failed with stateUnavailable", o.name, who)
			}
			if _, ok := o.resumed[who]; !ok {
				t.Errorf("%s: no call of %s was answered after it", o.name, who)
			}
		}
	}
	// A transaction that outlasts the state_timeout on a loaded machine
	// fails its call closed too: not wrong, but worth seeing.
	t.Logf("%d calls found the state unavailable outside the outages: %v", len(elsewhere), elsewhere)
	for _, who := range []string{"host-a", "host-b", "host-c", "agent"} {
		if byWho[who][callAnswered] == 0 {
			t.Errorf("%s: no call was answered", who)
		}
	}

	// The shared activity, read from host-a.
	activity := readActivity(t, a.base, syncToken)
	sent := map[string][]report.Activity{} // by call ID: attempts that were admitted, and may have gone out
	var admitted []time.Time
	late := 0 // attempts not sent, their calls admitted again
	instances := map[string]int{}
	for _, at := range activity {
		instances[at.Instance]++
		when, err := time.Parse(time.RFC3339Nano, at.At)
		if err != nil || when.Before(start.Add(-slack)) || when.After(end.Add(slack)) {
			t.Errorf("activity %d of %s at %s: want a time on the database's clock within the run (%v to %v)",
				at.ID, at.Instance, at.At, start.UTC().Format(time.RFC3339Nano), end.UTC().Format(time.RFC3339Nano))
		}
		u, err := url.Parse(at.Target)
		if err != nil {
			t.Errorf("activity %d: target %q: %v", at.ID, at.Target, err)
			continue
		}
		if at.State != string(ledger.RejectedLocal) && at.State != string(ledger.Cached) {
			id := u.Query().Get("call")
			sent[id] = append(sent[id], at)
			// A send that would have left later than its margin allows is
			// not sent, and its call is admitted again without counting
			// it (pacer.Leaving): the two share a window, one went out.
			if at.ReasonKind == reason.Late {
				late++
			} else {
				admitted = append(admitted, when)
			}
		}
	}
	t.Logf("the activity holds %d attempts, %d admitted and %d not sent for leaving late; by instance %v", len(activity), len(admitted), late, instances)
	for _, want := range []string{"host-a", "host-b", "host-c", "agent"} {
		if instances[want] == 0 {
			t.Errorf("no attempt of instance %s in the activity", want)
		}
	}
	// The hosts admitted no more than the quota in any window, on the
	// database's clock, beside the attempts that were not sent.
	if most := (demo.Stats{Accepted: admitted}).MaxInWindow(window); most > quota {
		t.Errorf("the hosts admitted %d calls in one rolling %v window; want at most %d", most, window, quota)
	}

	// Every request the upstream received is in the activity, admitted by
	// the instance that sent it; and every answer the activity holds, the
	// upstream gave.
	arrivals := up.log()
	received := map[string]int{}
	var sendLatency time.Duration // the longest from an admission to its arrival upstream
	missing := 0
	for _, r := range arrivals {
		received[r.call]++
		got := sent[r.call]
		if len(got) < received[r.call] {
			missing++
			if missing <= 10 {
				t.Errorf("the upstream received call %q %d times; the activity holds %d admitted attempts of it: %+v", r.call, received[r.call], len(got), got)
			}
			continue
		}
		who, _, _ := strings.Cut(r.call, ".")
		var last time.Time // the attempt that arrived: the latest admitted before it
		for _, at := range got {
			if at.Instance != who {
				t.Errorf("call %q is in the activity as instance %q's; it went through %s", r.call, at.Instance, who)
			}
			if when, _ := time.Parse(time.RFC3339Nano, at.At); !when.After(r.at) && when.After(last) {
				last = when
			}
		}
		sendLatency = max(sendLatency, r.at.Sub(last))
	}
	if missing > 0 {
		t.Errorf("%d of %d requests the upstream received are not in the activity", missing, len(arrivals))
	}
	for id, list := range sent {
		for _, at := range list {
			if at.Status != 0 && received[id] == 0 {
				t.Errorf("activity %d: call %q answered %d, but the upstream never received it", at.ID, id, at.Status)
			}
		}
	}
	// A call whose outcome could not be recorded fails too, though it
	// reached the upstream.
	var sentThenFailed []string
	told := map[string]string{} // by transport: what such a call was told
	for _, c := range calls {
		if c.kind == callUnavailable && received[c.id] > 0 {
			sentThenFailed = append(sentThenFailed, c.id)
			transport := "REST"
			if c.who == "agent" {
				transport = "MCP"
			}
			told[transport] = c.detail
			if strings.Contains(c.detail, "nothing was sent") || !strings.Contains(c.detail, "may have taken effect") {
				t.Errorf("%s: call %s reached the upstream, and was told %q; want it told that the call went upstream", c.who, c.id, c.detail)
			}
		}
	}
	t.Logf("%d calls reached the upstream and were answered stateUnavailable: %v", len(sentThenFailed), sentThenFailed)
	for transport, detail := range told {
		t.Logf("  one of them was told over %s: %q", transport, detail)
	}

	// The upstream, by its own log: never more than the quota in a
	// rolling window, and no 429. It counts a call from its arrival, the
	// log from its admission: the pacer keeps a send in the window a
	// margin longer, which follows how late the hosts' sends leave, and
	// admits again a send that would leave later than that (see
	// TestHostsUnderPressure).
	stats := up.api.Stats(upstreamSecret)
	most := stats.MaxInWindow(window)
	t.Logf("the upstream received %d requests, accepted %d, refused %d; most in a rolling %v: %d of %d; "+
		"the longest from admission to arrival %v",
		stats.Requests, len(stats.Accepted), stats.Rejected, window, most, quota, sendLatency.Round(time.Millisecond))
	if len(arrivals) != stats.Requests {
		t.Errorf("the upstream's log holds %d requests, its stats %d", len(arrivals), stats.Requests)
	}
	if most > quota || stats.Rejected > 0 {
		t.Errorf("the upstream accepted %d calls in one rolling %v window and refused %d with 429; want at most %d and none", most, window, stats.Rejected, quota)
		logFullest(t, arrivals, window, sent, start)
	}

	// The command line reads the same activity, on another host.
	var cli []int64
	out := hosts[2].run(t, "activity", "--json", "--key", "demo", "--limit", "100000", "--state", db)
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		var at report.Activity
		if err := json.Unmarshal([]byte(line), &at); err != nil {
			t.Fatalf("activity --json line %q: %v", line, err)
		}
		cli = append(cli, at.ID)
	}
	var rest []int64
	for _, at := range activity {
		rest = append(rest, at.ID)
	}
	if diff := cmp.Diff(rest, cli); diff != "" {
		t.Errorf("mcp-quota activity --json on host-c and GET /v1/activity on host-a differ (-rest +cli):\n%s", diff)
	}

	// And so does the agent, in its activity resource: the newest 100.
	res, err := agent.ReadResource(t.Context(), &gomcp.ReadResourceParams{URI: "quota://activity/demo"})
	if err != nil || len(res.Contents) != 1 {
		t.Fatalf("read quota://activity/demo: %v %v", res, err)
	}
	var page report.ActivityPage
	if err := json.Unmarshal([]byte(res.Contents[0].Text), &page); err != nil {
		t.Fatalf("quota://activity/demo: %v", err)
	}
	newest := page.Activity
	if diff := cmp.Diff(endedSince(activity[:min(100, len(activity))], newest), newest); diff != "" {
		t.Errorf("the agent's quota://activity/demo and GET /v1/activity on host-a differ (-rest +mcp):\n%s", diff)
	}

	// Each host keeps its journals in its own state directory: one
	// directory for the database, made by the first outcome it keeps.
	for _, h := range append(hosts, agentHost) {
		if dirs, _ := filepath.Glob(filepath.Join(h.dir, "state", "mcp-quota", "journals", "*")); len(dirs) > 1 {
			t.Errorf("%s: journal directories %v; want at most one, for the database", h.name, dirs)
		}
	}

	// No goroutines piled up in host-a through the outages. Those of the
	// calls just ended may take a moment to go: the count is read again
	// until it is back within 50 of the one before the run, for up to 10 s.
	after := goroutines(t, a.base)
	for deadline := time.Now().Add(10 * time.Second); after > goroutinesBefore+50 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		after = goroutines(t, a.base)
	}
	t.Logf("host-a's goroutines: %d before the run, %d after", goroutinesBefore, after)
	if after > goroutinesBefore+50 {
		t.Errorf("host-a has %d goroutines after the run, %d before it", after, goroutinesBefore)
	}
}

// answeredAfter reports whether each of who has a call begun after at
// that was answered.
func answeredAfter(calls []hostCall, at time.Time, who ...string) bool {
	for _, w := range who {
		if !slices.ContainsFunc(calls, func(c hostCall) bool { return c.who == w && c.kind == callAnswered && c.start.After(at) }) {
			return false
		}
	}
	return true
}

// An outage is a time the database was gone, from from to to, and what
// the callers saw of it.
type outage struct {
	name     string
	from, to time.Time

	failures int
	failed   map[string]int           // by caller: calls that failed in it
	slowest  map[string]time.Duration // by caller: the longest a failed call took from when the outage (or the call) began
	resumed  map[string]time.Duration // by caller: how long after it the first call begun after it was answered
}

// resumeBound is how long after an outage a call may still fail for it:
// the hosts' connections to the database are made again meanwhile.
const resumeBound = 5 * time.Second

// note counts c in o, and reports whether c failed in o.
func (o *outage) note(c hostCall) bool {
	if o.failed == nil {
		o.failed, o.slowest, o.resumed = map[string]int{}, map[string]time.Duration{}, map[string]time.Duration{}
	}
	switch {
	case c.kind == callUnavailable && !c.end.Before(o.from) && !c.start.After(o.to.Add(resumeBound)):
		o.failures++
		o.failed[c.who]++
		o.slowest[c.who] = max(o.slowest[c.who], c.end.Sub(later(c.start, o.from)).Round(time.Millisecond))
		return true
	case c.kind == callAnswered && c.start.After(o.to):
		if d, ok := o.resumed[c.who]; !ok || c.end.Sub(o.to) < d {
			o.resumed[c.who] = c.end.Sub(o.to)
		}
	}
	return false
}

// endedSince returns before, an activity read first, with the ending
// that after, read later, shows for each attempt before saw in flight:
// a host records a call's outcome shortly after its caller was answered,
// through its journal, and some seconds later after an outage.
func endedSince(before, after []report.Activity) []report.Activity {
	out := slices.Clone(before)
	for i := range min(len(out), len(after)) {
		if a := after[i]; out[i].ID == a.ID && out[i].State == string(ledger.Admitted) && a.State != string(ledger.Admitted) {
			out[i].State, out[i].Status, out[i].Reason, out[i].ReasonKind = a.State, a.Status, a.Reason, a.ReasonKind
		}
	}
	return out
}
