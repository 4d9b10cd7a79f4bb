package pacer_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/internal/conformance"
	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/state"
)

// BenchmarkAdmissions runs the same configurations on both back ends side
// by side: a SQLite state file shared by processes on one host, and a
// PostgreSQL database on loopback shared by hosts (each a process with a
// pool and a journal of its own), holding the history of benchHistory.
// Every host runs benchCallers callers at
// once (a serve process with a few agents and jobs calling through it),
// each making calls one after another, each an Admit and a Done with an
// answer carrying one RateLimit observation, on one key or spread at
// random over 100 keys, each with a documented policy that never binds:
//
//   - window=100ms (5,000 calls per 100 ms): too short a window to lease,
//     so every call takes two transactions, its admission and its outcome;
//   - window=10s (500,000 calls per 10 s): a busy key is leased, and most
//     calls take a slot in memory and write their outcome to the journal.
//
// With 100 keys each key's pace is a hundredth of the host's, too slow for
// a lease: the many-keys rows are the per-call path on keys that do not
// contend. The first host is the benchmark's own process (b.N calls); the
// others are the test binary run again, started and warmed up before the
// measure, calling from its start to its end. MCP_QUOTA_BENCH_PACE=N
// makes every host call at N calls a second at most, to see the same
// configurations on a machine that is not saturated;
// MCP_QUOTA_BENCH_CALLERS=N runs N callers on each host instead of
// benchCallers (1: every host calls one after another).
//
// Metrics, over all hosts: calls/s; p50, p99 and max of one call's
// Admit+Done; the client processes' CPU per call; on PostgreSQL, the
// server's CPU per call, its transactions per call, the connections
// opened meanwhile, and how many of the database's backends were on
// average waiting for a lock (a key's row), running, or idle in a
// transaction, waiting for their client (sampled every 10 ms); and the
// machine's CPU, busy-% and other-% (what others used), of all cores;
// and probe-held-%, the share of the benchmark's own host's calls that
// last waited for a probe's answer (Ticket.HeldBy).
//
//	go test -run '^$' -bench Admissions -benchtime 5s ./pacer/
//	go test -run '^$' -bench 'Admissions/store=postgres/window=10s/keys=1/' -benchtime 5s -count 3 ./pacer/
func BenchmarkAdmissions(b *testing.B) {
	var pace float64
	if s := os.Getenv("MCP_QUOTA_BENCH_PACE"); s != "" {
		var err error
		if pace, err = strconv.ParseFloat(s, 64); err != nil {
			b.Fatal(err)
		}
	}
	callers := benchCallers
	if s := os.Getenv("MCP_QUOTA_BENCH_CALLERS"); s != "" {
		var err error
		if callers, err = strconv.Atoi(s); err != nil || callers < 1 {
			b.Fatalf("MCP_QUOTA_BENCH_CALLERS=%q: want a number of callers, 1 or more", s)
		}
	}
	matrix := func(b *testing.B, newState func(b *testing.B) string) {
		for _, window := range []time.Duration{benchWindow, leasedWindow} {
			for _, keys := range []int{1, 100} {
				for _, hosts := range []int{1, 3} {
					b.Run(fmt.Sprintf("window=%s/keys=%d/hosts=%d", window, keys, hosts), func(b *testing.B) {
						benchHosts(b, hostConfig{Path: newState(b), Keys: keys, Window: window, Pace: pace, Callers: callers}, hosts)
					})
				}
			}
		}
	}
	b.Run("store=sqlite", func(b *testing.B) {
		matrix(b, func(b *testing.B) string { return filepath.Join(b.TempDir(), "state.db") })
	})
	b.Run("store=postgres", func(b *testing.B) {
		srv := pgtest.Start(b)
		b.Setenv("PGPASSWORD", srv.Password()) // the hosts inherit it
		matrix(b, func(b *testing.B) string { return srv.CreateDatabase(b) })
	})
	// The floor under the PostgreSQL rows: the same hosts and callers, each
	// call one statement in a transaction of its own and no pacer (see
	// floorStatement). No design that takes a transaction on the key's
	// row a call admits more a second on the same machine.
	b.Run("store=postgres-floor", func(b *testing.B) {
		srv := pgtest.Start(b)
		b.Setenv("PGPASSWORD", srv.Password())
		for _, keys := range []int{1, 100} {
			for _, hosts := range []int{1, 3} {
				b.Run(fmt.Sprintf("keys=%d/hosts=%d", keys, hosts), func(b *testing.B) {
					benchHosts(b, hostConfig{Path: srv.CreateDatabase(b), Keys: keys, Pace: pace, Callers: callers, Floor: true}, hosts)
				})
			}
		}
	})
}

// floorStatement is a call of BenchmarkAdmissions's floor: what any
// admission that takes a transaction on its key's row does at the least —
// lock the row, count the call there and log it — as one statement, so
// one round trip and one transaction, prepared once per connection.
const floorStatement = `WITH k AS (UPDATE floor_keys SET calls = calls + 1 WHERE name = $1 RETURNING calls)
INSERT INTO floor_log (name, n, at) SELECT $1, calls, clock_timestamp() FROM k`

// floorSchema creates the floor's tables in the database at dbURL, with
// keys rows.
func floorSchema(ctx context.Context, dbURL string, keys int) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `CREATE TABLE floor_keys (name text PRIMARY KEY, calls bigint NOT NULL DEFAULT 0);
CREATE TABLE floor_log (name text NOT NULL, n bigint NOT NULL, at timestamptz NOT NULL);
INSERT INTO floor_keys (name) SELECT 'shared' || i FROM generate_series(0, `+strconv.Itoa(keys-1)+`) AS i`)
	return err
}

// benchCallers is how many callers each host of BenchmarkAdmissions runs
// at once: a process serving a team has several clients calling through
// it, and calls of one key that come together in one process may share a
// transaction.
const benchCallers = 4

// leasedWindow is a window long enough for leases (see pacer.LeaseTime):
// a process at a high pace then admits most calls from a batch of slots
// it reserved, one transaction for many.
const leasedWindow = 10 * time.Second

// hostWarmUp is how long each host calls before the measure starts: its
// pool has its connections, its pace is measured, a busy key is leased.
// On many keys it calls longer, until it has made warmUpPerKey calls a
// key.
const hostWarmUp = 300 * time.Millisecond

// warmUpPerKey is how many calls a key a host makes at least before the
// measure starts: a process measures a key's pace over its last 8
// admissions of it (the pacer's leaseRecent), and until then neither
// leases the key nor takes an answer through the journal. The keys are
// picked at random, so twice that: one key in a hundred still has fewer
// than 8 when the measure starts.
const warmUpPerKey = 16

// hostEnv names the variable that makes the test binary a benchmark host
// (TestBenchHostProcess); its value is the host's hostConfig as JSON.
const hostEnv = "PACER_BENCH_HOST"

// hostConfig is one host of BenchmarkAdmissions.
type hostConfig struct {
	Path      string        // the state file, or a PostgreSQL URL (its password in PGPASSWORD)
	Journal   string        // on PostgreSQL: the host's journal directory
	Caller    string        // the caller name it uses
	Keys      int           // how many keys its calls are spread over
	Window    time.Duration // each key's documented window (see benchQuotaFor)
	Latencies string        // the file it writes its calls' durations to, as little-endian int64 nanoseconds
	Pace      float64       // calls a second it makes at most, all its callers together; 0 for no bound
	Callers   int           // how many callers call at once, each one call after another
	Floor     bool          // on PostgreSQL: each call is floorStatement alone, on a connection of each caller's, no pacer
}

// benchQuotaFor is the quota of a window at benchQuota per benchWindow.
func benchQuotaFor(window time.Duration) int64 {
	return int64(float64(benchQuota) * float64(window) / float64(benchWindow))
}

// benchHost is the running pacer of one host.
type benchHost struct {
	cfg  hostConfig
	db   state.Store
	p    *pacer.Pacer
	keys []*keystore.Key
	n    atomic.Int64 // calls started, for their IDs
	// probeHeld counts the calls that waited for a probe's answer (the
	// last thing that held them back, Ticket.HeldBy).
	probeHeld atomic.Int64
}

// benchCaller is one of a host's callers.
type benchCaller struct {
	h    *benchHost
	rnd  *rand.Rand
	next time.Time // when the next call may start, at a Pace
	conn *pgx.Conn // the floor's connection (see hostConfig.Floor)
}

func (h *benchHost) caller() *benchCaller {
	return &benchCaller{h: h, rnd: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
}

// callers runs h's callers at once, each calling until more returns
// false, and returns the durations of all their calls.
func (h *benchHost) callers(ctx context.Context, more func() bool) ([]time.Duration, error) {
	n := max(h.cfg.Callers, 1)
	lats := make([][]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := h.caller()
			defer c.close()
			for more() {
				d, err := c.call(ctx)
				if err != nil {
					errs[i] = err
					return
				}
				lats[i] = append(lats[i], d)
			}
		}()
	}
	wg.Wait()
	return slices.Concat(lats...), errors.Join(errs...)
}

// close closes c's connection, if it has one.
func (c *benchCaller) close() {
	if c.conn != nil {
		c.conn.Close(context.Background())
	}
}

func openBenchHost(cfg hostConfig) (*benchHost, error) {
	h := &benchHost{cfg: cfg}
	for i := range cfg.Keys {
		k := conformance.SharedKey(benchQuotaFor(cfg.Window), cfg.Window)
		k.Name = fmt.Sprintf("shared%d", i)
		h.keys = append(h.keys, k)
	}
	if cfg.Floor {
		return h, nil // the floor's callers connect themselves, and use the keys' names alone
	}
	db, err := state.OpenStore(context.Background(), cfg.Path, state.PostgresOptions{JournalDir: cfg.Journal})
	if err != nil {
		return nil, err
	}
	var clk clock.Clock
	if pg, ok := db.(*state.Postgres); ok {
		clk = clock.Source(pg.Now)
	}
	h.db, h.p = db, pacer.New(db, pacer.WithClock(clk), pacer.WithInFlightTimeout(10*time.Millisecond))
	return h, nil
}

// call makes one call (Admit, then Done with an answer carrying one
// RateLimit observation) of a key picked at random, and returns how long
// it took.
func (c *benchCaller) call(ctx context.Context) (time.Duration, error) {
	h := c.h
	if h.cfg.Pace > 0 {
		if d := time.Until(c.next); d > 0 {
			time.Sleep(d)
		}
		if earliest := time.Now().Add(-time.Second); c.next.Before(earliest) {
			c.next = earliest // a second behind at most: no burst to catch up
		}
		c.next = c.next.Add(time.Duration(float64(time.Second) * float64(max(h.cfg.Callers, 1)) / h.cfg.Pace))
	}
	k := h.keys[c.rnd.IntN(len(h.keys))]
	if h.cfg.Floor {
		return c.floorCall(ctx, k.Name)
	}
	n := h.n.Add(1)
	t0 := time.Now()
	t, err := h.p.Admit(ctx, pacer.Call{Key: k, Caller: h.cfg.Caller, Transport: "rest", Method: "GET",
		Target: "/items?page=1", CallID: fmt.Sprintf("%s-%d", h.cfg.Caller, n), Attempt: 1, MaxWait: time.Second})
	if err != nil {
		return 0, err
	}
	if t.HeldBy == string(pacer.ProbeLimit) {
		h.probeHeld.Add(1)
	}
	now := time.Now()
	quota := benchQuotaFor(h.cfg.Window)
	rd := &ratelimit.Reading{ReceivedAt: now, Observations: []ratelimit.Observation{{
		Policy: "default", Unit: ratelimit.Requests, Quota: quota, HasQuota: true, Window: h.cfg.Window,
		Remaining: quota / 2, HasRemaining: true, Reset: h.cfg.Window / 2, HasReset: true, Shape: ratelimit.ShapeDraft}}}
	if _, err := h.p.Done(ctx, t, pacer.Outcome{SentAt: now, AnsweredAt: now, Status: 200, Reading: rd}); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// floorCall is a call of the floor (see floorStatement) on key, on c's
// connection, opened before its first call (and not timed with it).
func (c *benchCaller) floorCall(ctx context.Context, key string) (time.Duration, error) {
	if c.conn == nil {
		conn, err := pgx.Connect(ctx, c.h.cfg.Path)
		if err != nil {
			return 0, err
		}
		c.conn = conn
	}
	t0 := time.Now()
	if _, err := c.conn.Exec(ctx, floorStatement, key); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// warmUp calls for hostWarmUp, and until it has made warmUpPerKey calls
// a key, with all of h's callers.
func (h *benchHost) warmUp(ctx context.Context) error {
	end := time.Now().Add(hostWarmUp)
	var started atomic.Int64
	least := int64(warmUpPerKey * len(h.keys))
	_, err := h.callers(ctx, func() bool { return started.Add(1) <= least || time.Now().Before(end) })
	return err
}

func (h *benchHost) close(ctx context.Context) error {
	if h.p == nil {
		return nil // the floor's: its callers closed their connections
	}
	return errors.Join(h.p.Close(ctx), h.db.Close())
}

// TestBenchHostProcess is a host of BenchmarkAdmissions, when the test
// binary is run again as one. It opens the state, warms up and prints
// "ready"; it calls from the line "go" on its standard input to the
// input's end, then writes its calls' durations to cfg.Latencies and
// prints "done N ELAPSED-NS CPU-NS".
func TestBenchHostProcess(t *testing.T) {
	var cfg hostConfig
	is, err := testkit.Job(hostEnv, &cfg)
	if !is {
		t.Skip("run as a host by BenchmarkAdmissions")
	}
	if err == nil {
		err = runBenchHost(cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench host:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runBenchHost(cfg hostConfig) error {
	ctx := context.Background()
	h, err := openBenchHost(cfg)
	if err != nil {
		return err
	}
	if err := h.warmUp(ctx); err != nil {
		return err
	}
	fmt.Println("ready")
	// It goes on calling until the measure starts: a host idle while the
	// others warm up would measure each key's pace over the gap, and take
	// the answers of each key's first calls after it in transactions of
	// their own (see pacer.quickNext), at the start of the measure.
	stopCalling := h.keepCalling(ctx)
	in := bufio.NewReader(os.Stdin)
	line, readErr := in.ReadString('\n')
	if err := stopCalling(); err != nil {
		return err
	}
	if readErr != nil || line != "go\n" {
		return fmt.Errorf("waiting for go: %q, %v", line, readErr)
	}
	stop := make(chan struct{})
	go func() {
		io.Copy(io.Discard, in)
		close(stop)
	}()
	cpu0, start := cpuTime(), time.Now()
	lat, err := h.callers(ctx, func() bool { return !stopped(stop) })
	if err != nil {
		return err
	}
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	if err := h.close(ctx); err != nil {
		return err
	}
	buf := make([]byte, 8*len(lat))
	for i, d := range lat {
		binary.LittleEndian.PutUint64(buf[8*i:], uint64(d))
	}
	if err := os.WriteFile(cfg.Latencies, buf, 0o600); err != nil {
		return err
	}
	fmt.Printf("done %d %d %d\n", len(lat), elapsed.Nanoseconds(), cpu.Nanoseconds())
	return nil
}

// remoteHost is a host running in a process of its own.
type remoteHost struct {
	*testkit.Process
	cfg hostConfig
}

func startHost(b *testing.B, cfg hostConfig) *remoteHost {
	b.Helper()
	h := &remoteHost{cfg: cfg, Process: testkit.Start(b, testkit.Spec{Name: cfg.Caller, Env: hostEnv, Job: cfg, Run: "^TestBenchHostProcess$"})}
	if line, _ := h.Next(b); line != "ready" {
		b.Fatalf("host %s ended before it was ready", cfg.Caller)
	}
	return h
}

// hostRun is what one host reports of its measure.
type hostRun struct {
	calls   int
	elapsed time.Duration
	cpu     time.Duration
	lat     []time.Duration
}

// finish ends h's measure and returns what it reports.
func (h *remoteHost) finish(b *testing.B) hostRun {
	b.Helper()
	h.CloseInput()
	err := h.Wait(b)
	var r hostRun
	for _, line := range h.Lines() {
		var e, c int64
		if _, err := fmt.Sscanf(line, "done %d %d %d", &r.calls, &e, &c); err == nil {
			r.elapsed, r.cpu = time.Duration(e), time.Duration(c)
		}
	}
	if err != nil || r.elapsed == 0 {
		b.Fatalf("host %s: %v (elapsed %v)", h.cfg.Caller, err, r.elapsed)
	}
	buf, err := os.ReadFile(h.cfg.Latencies)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i+8 <= len(buf); i += 8 {
		r.lat = append(r.lat, time.Duration(binary.LittleEndian.Uint64(buf[i:])))
	}
	return r
}

// benchHosts runs BenchmarkAdmissions's measure with hosts hosts on the
// state cfg names, this process one of them.
func benchHosts(b *testing.B, cfg hostConfig, hosts int) {
	ctx := context.Background()
	dir := b.TempDir()
	hostCfg := func(i int) hostConfig {
		c := cfg
		c.Caller = fmt.Sprintf("host%d", i)
		c.Latencies = filepath.Join(dir, c.Caller+".lat")
		if state.IsPostgresURL(c.Path) && !c.Floor {
			c.Journal = filepath.Join(dir, c.Caller+".journal") // a directory per host, as on hosts of their own
		}
		return c
	}
	if cfg.Floor {
		if err := floorSchema(ctx, cfg.Path, cfg.Keys); err != nil {
			b.Fatal(err)
		}
	} else if state.IsPostgresURL(cfg.Path) {
		keys := make([]string, cfg.Keys)
		for i := range keys {
			keys[i] = fmt.Sprintf("shared%d", i)
		}
		if err := state.FillHistory(ctx, cfg.Path, benchHistory(keys)); err != nil {
			b.Fatal(err)
		}
	}
	var others []*remoteHost
	for i := 1; i < hosts; i++ {
		others = append(others, startHost(b, hostCfg(i)))
	}
	me, err := openBenchHost(hostCfg(0))
	if err != nil {
		b.Fatal(err)
	}
	if err := me.warmUp(ctx); err != nil {
		b.Fatal(err)
	}
	// It goes on calling until the measure starts, as the other hosts
	// do (see runBenchHost): a host idle meanwhile (the watch's ANALYZE
	// of the history) would measure each key's pace over the gap, and
	// take the answers of each key's first calls after it in
	// transactions of their own (see pacer.quickNext).
	stopCalling := me.keepCalling(ctx)
	defer stopCalling() // on b.Fatal too
	var pg *pgWatch
	if state.IsPostgresURL(cfg.Path) {
		pg = watchPostgres(b, cfg.Path)
	}
	if err := stopCalling(); err != nil {
		b.Fatal(err)
	}
	machine0 := machineCPU()
	for _, h := range others {
		h.Order(b, "go")
	}
	var started atomic.Int64
	b.ResetTimer()
	cpu0, start, probeHeld0 := cpuTime(), time.Now(), me.probeHeld.Load()
	lat, err := me.callers(ctx, func() bool { return started.Add(1) <= int64(b.N) })
	if err != nil {
		b.Fatal(err)
	}
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	probeHeld := me.probeHeld.Load() - probeHeld0
	machine := machineCPU().since(machine0)
	b.StopTimer()
	var pgs pgSample
	if pg != nil {
		pgs = pg.stop(b)
	}
	rate := float64(b.N) / elapsed.Seconds()
	calls, clientCPU := b.N, cpu
	for _, h := range others {
		r := h.finish(b)
		rate += float64(r.calls) / r.elapsed.Seconds()
		calls += r.calls
		clientCPU += r.cpu
		lat = append(lat, r.lat...)
	}
	if err := me.close(ctx); err != nil {
		b.Fatal(err)
	}
	slices.Sort(lat)
	b.ReportMetric(rate, "calls/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "max-µs")
	b.ReportMetric(float64(clientCPU.Microseconds())/float64(calls), "cpu-µs/call")
	b.ReportMetric(100*float64(probeHeld)/float64(b.N), "probe-held-%")
	inMeasure := rate * elapsed.Seconds() // the calls of every host while this one measured
	ours := clientCPU.Seconds()           // (the other hosts ran a little longer than this one measured)
	if pg != nil {
		b.ReportMetric(float64(pgs.cpu.Microseconds())/inMeasure, "pg-cpu-µs/call")
		b.ReportMetric(float64(pgs.commits)/inMeasure, "xacts/call")
		b.ReportMetric(pgs.waiting, "lock-waiting")
		b.ReportMetric(pgs.active, "running")
		b.ReportMetric(pgs.idleInTx, "idle-in-xact")
		b.ReportMetric(float64(pgs.sessions), "new-conns")
		ours += pgs.cpu.Seconds()
	}
	if machine.total > 0 {
		b.ReportMetric(100*machine.busy.Seconds()/machine.total.Seconds(), "busy-%")
		b.ReportMetric(100*max(machine.busy.Seconds()-ours, 0)/machine.total.Seconds(), "other-%")
	}
}

// keepCalling starts h's callers calling, until the function it returns
// is called: that stops them, waits for them, and returns their error
// (the same again on a later call).
func (h *benchHost) keepCalling(ctx context.Context) func() error {
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := h.callers(ctx, func() bool { return !stopped(stop) })
		done <- err
	}()
	return sync.OnceValue(func() error {
		close(stop)
		return <-done
	})
}

// stopped reports whether stop is closed.
func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}
