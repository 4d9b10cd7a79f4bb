package main

import (
	"context"
	"net/http"
	"net/url"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// TestHostsUnderPressure stands three `serve` processes for three hosts
// and a `stdio` agent on one key and one PostgreSQL database, as
// TestHostsShareOneBudget does, and has them spend the key's budget as
// greedily as they can: once while a busy loop runs on every core of the
// machine beside them (so that the hosts' sends leave late after their
// admission), and once while every host's connections to the database
// are terminated (pg_terminate_backend) every 0.7 s.
//
// Then: the upstream, by its own log, never received more than the quota
// in any rolling window and refused nothing with 429; and every request
// it received has its outcome in the shared activity — the status the
// upstream answered it with, recorded by the host that sent it.
func TestHostsUnderPressure(t *testing.T) {
	if testing.Short() {
		t.Skip("three serve processes and PostgreSQL, twice for 15 s: not under -short")
	}
	// The two run side by side: the connections are cut on a machine
	// whose cores are busy too. The package's other tests wait until both
	// have ended (the test is not parallel), so they never run beside the
	// busy loops.
	t.Run("busy cores", func(t *testing.T) { t.Parallel(); underPressure(t, runtime.NumCPU(), 0) })
	t.Run("connections cut", func(t *testing.T) { t.Parallel(); underPressure(t, 0, 700*time.Millisecond) })
}

// underPressure is a run of TestHostsUnderPressure with loops busy loops
// beside the hosts, their connections cut every cut (never when 0).
func underPressure(t *testing.T, loops int, cut time.Duration) {
	const (
		quota   = 30
		window  = 4 * time.Second
		load    = 15 * time.Second
		workers = 3 // REST callers on each host
		maxWait = 2 // seconds a call waits for the budget
		// The state's bound on a transaction: the outages here are cut
		// connections, which a transaction is run again for, not a
		// database that hangs. Every cut ends every connection, and a
		// transaction on a new one prepares each of its statements: on a
		// loaded machine, a transaction may be cut again and again
		// before one run of it commits.
		stateTimeout = 30 * time.Second
	)
	pg := pgtest.Start(t)
	db := pg.CreateDatabase(t)
	up := newUpstreamLog(t, demo.Config{Quota: quota, Window: window})
	cfg := hostsConfig(db, up.url, quota, window, stateTimeout)
	hosts := serveThreeHosts(t, cfg, pg.Password())
	agent := newHost(t, "agent", cfg, pg.Password()).stdioSession(t)
	client := &http.Client{Timeout: time.Minute}
	defer client.CloseIdleConnections()

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	busy(t, ctx, loops)
	var cuts atomic.Int64
	if cut > 0 {
		wg.Go(func() { cuts.Store(int64(cutConnections(ctx, t, pg, db, cut))) })
	}

	var log testkit.List[hostCall]
	start := time.Now()
	for _, h := range hosts {
		for w := range workers {
			wg.Go(func() { h.restCalls(ctx, t, client, w+1, maxWait, &log) })
		}
	}
	wg.Go(func() { agentCalls(ctx, t, agent, maxWait, &log) })
	// The load goes on for load, then until every caller has had a call
	// answered: a loaded machine whose connections are cut serves some
	// callers late, but it must serve them. A minute more is for a hang.
	callers := []string{"host-a", "host-b", "host-c", "agent"}
	hung := time.After(load + time.Minute)
	for waiting := true; waiting; {
		select {
		case <-time.After(100 * time.Millisecond):
			waiting = time.Since(start) < load || !answeredAfter(log.All(), start, callers...)
		case <-hung:
			waiting = false // a caller never answered fails below
		}
	}
	stop()
	wg.Wait()
	since := func(at time.Time) time.Duration { return at.Sub(start).Round(time.Millisecond) }

	byWho := map[string]map[string]int{}
	for _, c := range log.All() {
		if byWho[c.who] == nil {
			byWho[c.who] = map[string]int{}
		}
		byWho[c.who][c.kind]++
	}
	t.Logf("%d busy loops; %d times the hosts' connections were cut; the load lasted %v; calls by caller and result: %v", loops, cuts.Load(), since(time.Now()), byWho)
	for _, who := range callers {
		if byWho[who][callAnswered] == 0 {
			t.Errorf("%s: no call was answered", who)
		}
	}

	// Every request the upstream received has its outcome in the shared
	// activity, recorded by the host that sent it. A call answered as the
	// load stopped may still be recording it (its transaction cut, and run
	// again within stateTimeout, or its journal's batch not yet applied):
	// the activity is read again until it holds every outcome, or until
	// that bound and a minute more have passed.
	arrivals := up.log()
	var (
		attempts map[string][]report.Activity
		late     int
		missing  []arrival
		reads    int
	)
	for until := time.Now().Add(stateTimeout + time.Minute); ; {
		attempts, late, missing = outcomes(t, hosts[0].base, arrivals)
		reads++
		if len(missing) == 0 || time.Now().After(until) {
			break
		}
		<-time.After(200 * time.Millisecond)
	}
	for _, r := range missing {
		t.Errorf("the upstream answered call %q %d at %v; the activity holds no such outcome of it: %+v", r.call, r.status, since(r.at), attempts[r.call])
	}
	t.Logf("the upstream received %d requests; %d have no outcome in the activity (read %d times); %d attempts were not sent for leaving late",
		len(arrivals), len(missing), reads, late)

	// The upstream, by its own log: never more than the quota in a
	// rolling window, and no 429.
	stats := up.api.Stats(upstreamSecret)
	most := stats.MaxInWindow(window)
	t.Logf("the upstream accepted %d, refused %d; most in a rolling %v: %d of %d", len(stats.Accepted), stats.Rejected, window, most, quota)
	if most > quota || stats.Rejected > 0 {
		t.Errorf("the upstream accepted %d calls in one rolling %v window and refused %d; want at most %d and none", most, window, stats.Rejected, quota)
		logFullest(t, arrivals, window, attempts, start)
	}
}

// outcomes reads the shared activity through the host at base: the
// attempts of each call, how many were not sent for leaving too late
// after their admission, and the arrivals whose outcome (their status,
// recorded by the host that sent them) it does not hold.
func outcomes(t *testing.T, base string, arrivals []arrival) (attempts map[string][]report.Activity, late int, missing []arrival) {
	t.Helper()
	attempts = map[string][]report.Activity{}
	for _, at := range readActivity(t, base, syncToken) {
		u, err := url.Parse(at.Target)
		if err != nil {
			t.Errorf("activity %d: target %q: %v", at.ID, at.Target, err)
			continue
		}
		id := u.Query().Get("call")
		attempts[id] = append(attempts[id], at)
		if at.ReasonKind == reason.Late {
			late++
		}
	}
	for _, r := range arrivals {
		who, _, _ := strings.Cut(r.call, ".")
		found := false
		for _, at := range attempts[r.call] {
			if at.Status == r.status && at.State != string(ledger.Admitted) && at.Instance == who {
				found = true
			}
		}
		if !found {
			missing = append(missing, r)
		}
	}
	return attempts, late, missing
}

// busy runs n busy loops, each a process of its own, until ctx ends.
func busy(t *testing.T, ctx context.Context, n int) {
	t.Helper()
	for range n {
		cmd := exec.CommandContext(ctx, "sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatalf("start a busy loop: %v", err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
}

// cutConnections terminates every connection to the database of dbURL
// but its own, every every, until ctx ends, and returns how many times
// it did.
func cutConnections(ctx context.Context, t *testing.T, pg *pgtest.Server, dbURL string, every time.Duration) int {
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Errorf("database URL: %v", err)
		return 0
	}
	name := strings.TrimPrefix(u.Path, "/")
	conn, err := pgx.Connect(ctx, pg.URLWithPassword("postgres"))
	if err != nil {
		t.Errorf("connect to cut connections: %v", err)
		return 0
	}
	defer conn.Close(context.Background())
	tick := time.NewTicker(every)
	defer tick.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return n
		case <-tick.C:
		}
		_, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid()`, name)
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("pg_terminate_backend: %v", err)
			}
			return n
		}
		n++
	}
}
