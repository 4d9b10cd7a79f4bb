package state_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// The PostgreSQL server going away, and coming back: a server of the
// test's own, stopped, killed, or cut off by the network in the middle of
// a load.

// outageTimeout is the transaction bound the stores of these tests are
// opened with: the default, long enough for a transaction (a new
// connection's SCRAM login among it) on a loaded machine under -race,
// since service after an outage is judged by transactions that succeed
// within it.
const outageTimeout = state.DefaultPostgresTimeout

// hangs is how long a failure may take in these tests before it is
// taken for a hang: a call that nothing bounds waits for the kernel's TCP
// timeout (minutes), or, behind a network that drops everything, until
// the network heals. It is far above the Timeout, so that a busy machine
// (a goroutine waits seconds for a core there under -race) never passes
// for a hang; how close to the Timeout a failure comes is a figure for a
// quiet machine, not a test's claim.
const hangs = 30 * time.Second

func TestPostgresServerGoesAway(t *testing.T) {
	srv := startPostgres(t)
	restart := func() { srv.Restart(t) }
	for _, c := range []struct {
		name string
		down func(testing.TB)
	}{{"stopped", srv.Stop}, {"killed", srv.Kill}} {
		t.Run("the server "+c.name+" mid-load, then restarted", func(t *testing.T) {
			outage(t, srv.CreateDatabase(t), func() { c.down(t) }, restart, nil)
		})
	}
	t.Run("the network drops everything mid-load, then heals", func(t *testing.T) {
		url := srv.CreateDatabase(t)
		p := newPartition(t, strings.SplitN(url, "/", 4)[2][len("mcpq@"):])
		outage(t, strings.Replace(url, p.to, p.ln.Addr().String(), 1), p.cut, p.heal, p.running.Load)
	})
	t.Run("a store opened while the server is down serves once it is up", func(t *testing.T) { waitForServer(t, srv) })
}

// A partition is a TCP proxy to a server that can stop forwarding
// anything, as a network that drops every packet does, and heal.
type partition struct {
	ln      net.Listener
	to      string       // the server's address
	running atomic.Int64 // its goroutines

	mu    sync.Mutex
	open  chan struct{} // closed while it forwards
	conns []net.Conn
	wg    sync.WaitGroup
}

func newPartition(t *testing.T, to string) *partition {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &partition{ln: ln, to: to, open: make(chan struct{})}
	close(p.open)
	p.spawn(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.heal()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// spawn runs fn in a goroutine the partition counts.
func (p *partition) spawn(fn func()) {
	p.running.Add(1)
	p.wg.Go(func() {
		defer p.running.Add(-1)
		fn()
	})
}

func (p *partition) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.to)
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		p.spawn(func() { p.forward(server, client) })
		p.spawn(func() { p.forward(client, server) })
	}
}

// forward copies what src says to dst, holding it while the partition is
// cut, and closes both when either ends.
func (p *partition) forward(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			open := p.open
			p.mu.Unlock()
			<-open
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// cut stops forwarding.
func (p *partition) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default:
	}
}

// heal forwards again what was held, and what comes.
func (p *partition) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

// A load is workers running admissions and reads on a store by turns,
// each noting how it ended.
type load struct {
	pg   *state.Postgres
	stop chan struct{}
	wg   sync.WaitGroup

	mu        sync.Mutex
	committed []committed   // admissions whose Update returned nil
	failures  []failure     // calls that failed
	successes int           // calls that succeeded
	failed    []int         // calls that failed, per worker
	changed   chan struct{} // closed and replaced at each call's end
}

type committed struct {
	key string
	id  int64
}

type failure struct {
	what string
	err  error
	took time.Duration
}

// startLoad starts workers on pg, each calling every few milliseconds.
func startLoad(pg *state.Postgres, workers int) *load {
	l := &load{pg: pg, stop: make(chan struct{}), changed: make(chan struct{}), failed: make([]int, workers)}
	for w := range workers {
		l.wg.Go(func() { l.work(w, fmt.Sprint("key", w%3)) })
	}
	return l
}

func (l *load) work(w int, key string) {
	tick := time.NewTicker(2 * time.Millisecond) // a steady load, not a busy loop while the server is down
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		var id int64
		start := time.Now()
		what := "Update"
		var err error
		if i%2 == 0 {
			err = l.pg.Update(context.Background(), func(tx ledger.Tx) error {
				var err error
				id, err = tx.InsertAttempt(ledger.Attempt{CallID: "c", Attempt: 1, Key: key, Caller: "load", State: ledger.Admitted,
					At: tx.Clock(time.Now())})
				return err
			}, key)
		} else {
			what = "View"
			err = l.pg.View(context.Background(), func(tx ledger.ReadTx) error {
				_, err := tx.Window(key, time.Time{})
				return err
			})
		}
		took := time.Since(start)
		l.mu.Lock()
		switch {
		case err != nil:
			l.failures = append(l.failures, failure{what, err, took})
			l.failed[w]++
		case what == "Update":
			l.committed = append(l.committed, committed{key, id})
			l.successes++
		default:
			l.successes++
		}
		close(l.changed)
		l.changed = make(chan struct{})
		l.mu.Unlock()
	}
}

// await waits until cond holds of the load's failures and successes, for
// at most a minute.
func (l *load) await(t *testing.T, what string, cond func(failures, successes int) bool) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		l.mu.Lock()
		ok, changed := cond(len(l.failures), l.successes), l.changed
		l.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("waiting for %s: not after a minute", what)
		}
	}
}

// end stops the workers and waits for them.
func (l *load) end() {
	close(l.stop)
	l.wg.Wait()
}

// outage takes the database at url away (down) under a load: every
// worker's calls keep ending while it is away, each call that fails says
// ErrUnavailable and none hangs, no goroutine is left behind (but
// extra's, the harness's own, when not nil), and once the database is
// back (up) service resumes by itself with nothing committed lost.
func outage(t *testing.T, url string, down, up func(), extra func() int64) {
	if extra == nil {
		extra = func() int64 { return 0 }
	}
	pg := openPostgres(t, url, state.PostgresOptions{Timeout: outageTimeout})
	update(t, pg, func(tx ledger.Tx) error { return nil }, "key0") // connected and migrated
	goroutines := runtime.NumGoroutine() - int(extra())

	l := startLoad(pg, 6)
	l.await(t, "commits before the outage", func(_, ok int) bool { return ok >= 50 })
	down()
	l.mu.Lock()
	okBefore, before := l.successes, slices.Clone(l.failed)
	l.mu.Unlock()
	// Every worker fails twice while the server is down: a call that hung
	// would hold its worker, which then fails no more.
	l.await(t, "every worker's failures while the server is down", func(int, int) bool {
		for w, n := range l.failed {
			if n < before[w]+2 {
				return false
			}
		}
		return true
	})
	if err := pg.Check(context.Background()); !errors.Is(err, state.ErrUnavailable) {
		t.Errorf("Check while the server is down: got %v, want ErrUnavailable", err)
	}
	up()
	l.mu.Lock()
	okDown := l.successes
	l.mu.Unlock()
	l.await(t, "service after the restart", func(_, ok int) bool { return ok >= okDown+50 })
	l.end()
	t.Logf("%d calls succeeded before the outage, %d failed, %d succeeded in all", okBefore, len(l.failures), l.successes)

	slowest := time.Duration(0)
	for _, f := range l.failures {
		slowest = max(slowest, f.took)
		if !errors.Is(f.err, state.ErrUnavailable) || !state.Storage(f.err) {
			t.Errorf("a %s while the server was down failed with %v, want ErrUnavailable", f.what, f.err)
		}
	}
	if slowest > hangs {
		t.Errorf("the slowest failure took %v, want a bounded wait, not a hang (the Timeout is %v)", slowest, outageTimeout)
	}
	t.Logf("the slowest of %d failures took %v", len(l.failures), slowest)

	got := map[int64]bool{}
	view(t, pg, func(tx ledger.ReadTx) error {
		for _, key := range []string{"key0", "key1", "key2"} {
			sends, err := tx.Sends(key, time.Time{}, 1<<20)
			if err != nil {
				return err
			}
			for _, s := range sends {
				got[s.ID] = true
			}
		}
		return nil
	})
	lost := 0
	for _, c := range l.committed {
		if !got[c.id] {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d committed admissions are gone after the restart", lost, len(l.committed))
	}

	// The workers are gone; so must be what their calls started.
	ours := func() int { return runtime.NumGoroutine() - int(extra()) }
	if n := settle(ours, goroutines+2); n > goroutines+2 {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines after the outage, %d before it:\n%s", n, goroutines, buf[:runtime.Stack(buf, true)])
	}
}

// OpenPostgres with WaitForServer against a server that is down returns
// a store that fails with ErrUnavailable, quickly, and serves, migrated,
// once the server is up; without it, OpenPostgres fails.
func waitForServer(t *testing.T, srv *pgtest.Server) {
	url := srv.CreateDatabase(t)
	srv.Stop(t)

	start := time.Now()
	_, err := state.OpenPostgres(context.Background(), url, state.PostgresOptions{Timeout: outageTimeout})
	if !errors.Is(err, state.ErrUnavailable) || !state.Storage(err) {
		t.Errorf("OpenPostgres while the server is down: got %v, want ErrUnavailable", err)
	}
	pg, err := state.OpenPostgres(context.Background(), url, state.PostgresOptions{Timeout: outageTimeout, WaitForServer: true})
	if err != nil {
		t.Fatalf("OpenPostgres with WaitForServer while the server is down: %v", err)
	}
	t.Cleanup(func() { pg.Close() })
	if took := time.Since(start); took > 2*hangs {
		t.Errorf("opening twice while the server is down took %v, want a bounded wait, not a hang (the Timeout is %v)", took, outageTimeout)
	}
	admit := func(tx ledger.Tx) error {
		_, err := tx.InsertAttempt(ledger.Attempt{CallID: "c", Key: "k", State: ledger.Admitted, At: tx.Clock(time.Now())})
		return err
	}
	calls := map[string]func() error{
		"Update": func() error { return pg.Update(context.Background(), admit, "k") },
		"View":   func() error { return pg.View(context.Background(), func(tx ledger.ReadTx) error { return nil }) },
		"Check":  func() error { return pg.Check(context.Background()) },
	}
	for _, name := range slices.Sorted(maps.Keys(calls)) {
		start := time.Now()
		err := calls[name]()
		if !errors.Is(err, state.ErrUnavailable) || !state.Storage(err) {
			t.Errorf("%s before the server is up: got %v, want ErrUnavailable", name, err)
		}
		if took := time.Since(start); took > hangs {
			t.Errorf("%s before the server is up failed after %v, want a bounded wait, not a hang (the Timeout is %v)", name, took, outageTimeout)
		}
	}

	srv.Restart(t)
	deadline := time.Now().Add(time.Minute)
	for {
		err := calls["Update"]()
		if err == nil {
			break
		}
		if !errors.Is(err, state.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("Update once the server is up: %v", err)
		}
	}
	for name, call := range calls {
		if err := call(); err != nil {
			t.Errorf("%s once the server is up: %v", name, err)
		}
	}
	conn := rawConn(t, srv, url)
	if v, rows := version(t, conn); v != latestSchema(t) || rows != 1 {
		t.Errorf("the schema once the server is up: version %d in %d rows, want %d", v, rows, latestSchema(t))
	}
	var n int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM mcp_quota.attempts").Scan(&n); err != nil || n != 2 {
		t.Errorf("attempts once the server is up: %d (%v), want the 2 admitted since", n, err)
	}
}

// A server that takes connections and never answers (a host that hangs,
// a network that drops everything): OpenPostgres fails with
// ErrUnavailable within about its Timeout, or with WaitForServer returns
// a store whose calls each fail so, many at once, and leave no goroutine
// behind.
func TestPostgresServerNeverAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the store's Timeout in real time, three times over")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held sync.WaitGroup
	t.Cleanup(func() { ln.Close(); held.Wait() })
	held.Go(func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // read nothing, answer nothing
		}
	})
	t.Setenv("PGPASSWORD", "unused")
	url := "postgres://mcpq@" + ln.Addr().String() + "/db?sslmode=disable"
	goroutines := runtime.NumGoroutine()

	start := time.Now()
	_, err = state.OpenPostgres(context.Background(), url, state.PostgresOptions{Timeout: outageTimeout})
	if took := time.Since(start); !errors.Is(err, state.ErrUnavailable) || took > hangs {
		t.Errorf("OpenPostgres of a server that never answers: got %v after %v, want ErrUnavailable, not a hang (the Timeout is %v)", err, took, outageTimeout)
	}
	pg, err := state.OpenPostgres(context.Background(), url, state.PostgresOptions{Timeout: outageTimeout, WaitForServer: true})
	if err != nil {
		t.Fatalf("OpenPostgres with WaitForServer: %v", err)
	}
	const calls = 20
	var wg sync.WaitGroup
	errs, took := make([]error, calls), make([]time.Duration, calls)
	for i := range calls {
		wg.Go(func() {
			start := time.Now()
			if i%2 == 0 {
				errs[i] = pg.Update(context.Background(), func(tx ledger.Tx) error { return nil }, "k")
			} else {
				errs[i] = pg.View(context.Background(), func(tx ledger.ReadTx) error { return nil })
			}
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	for i := range calls {
		if !errors.Is(errs[i], state.ErrUnavailable) || !state.Storage(errs[i]) || took[i] > hangs {
			t.Errorf("call %d of %d at once: got %v after %v, want ErrUnavailable, not a hang (the Timeout is %v)", i, calls, errs[i], took[i], outageTimeout)
		}
		// The pacer fails the calls that waited for such a transaction
		// with it (see ledger.ErrNoAnswer).
		if !errors.Is(errs[i], ledger.ErrNoAnswer) {
			t.Errorf("call %d of %d at once: got %v, want ledger.ErrNoAnswer: it waited out the Timeout", i, calls, errs[i])
		}
	}
	if err := pg.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if n := settle(runtime.NumGoroutine, goroutines+2); n > goroutines+2 {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines after the calls, %d before them:\n%s", n, goroutines, buf[:runtime.Stack(buf, true)])
	}
}

// settle waits until count() is at most want, or a minute passed (the
// goroutines of calls that ended go at the scheduler's pace, slow on a
// loaded machine; one that never goes is a leak), and returns count().
func settle(count func() int, want int) int {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
	for count() > want {
		select {
		case <-tick.C:
		case <-deadline:
			return count()
		}
	}
	return count()
}
