package state

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// A reading of the server's clock through a round trip gives how far the
// server's clock is ahead of the process's, as NTP's offset: a wait on the
// server between the statement's start and the reading (another
// transaction's lock on the key's row) is kept out of it, and whatever the
// legs of the round trip, the offset is off by at most half of the round
// trip less that wait.
func TestClockOffset(t *testing.T) {
	ms := func(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }
	// Each reading is described on the process's clock from before (at
	// t0): out is how long the statement took to reach the server, wait
	// how long the server waited for the lock, back how long the answer
	// took to come back; the server's clock is ahead by ahead.
	type reading struct{ out, wait, back, ahead time.Duration }
	instants := func(r reading) (before, started, read, after time.Time) {
		before = start
		started = before.Add(r.out + r.ahead)
		read = started.Add(r.wait)
		after = before.Add(r.out + r.wait + r.back)
		return
	}
	for _, c := range []struct {
		name string
		r    reading
		want time.Duration
	}{
		{"no wait, even legs: exact", reading{out: ms(1), back: ms(1)}, 0},
		{"the server's clock ahead, no wait", reading{out: ms(1), back: ms(1), ahead: 7 * time.Second}, 7 * time.Second},
		{"the server's clock behind, no wait", reading{out: ms(2), back: ms(2), ahead: -time.Hour}, -time.Hour},
		// The case of issue 21: the round trip's midpoint alone would be
		// 300 ms ahead.
		{"a lock wait of 600 ms, even legs: exact", reading{out: ms(1), wait: ms(600), back: ms(1)}, 0},
		{"a lock wait, the server's clock behind", reading{out: ms(1), wait: ms(600), back: ms(1), ahead: -ms(2500)}, -ms(2500)},
		{"a lock wait, a slow way out: off by half of it", reading{out: ms(9), wait: ms(600), back: ms(1)}, ms(4)},
		{"a lock wait, a slow way back: off by half of it", reading{out: ms(1), wait: ms(600), back: ms(9)}, -ms(4)},
		{"a whole round trip of wait", reading{wait: ms(50)}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			before, started, read, after := instants(c.r)
			if got := clockOffset(before, started, read, after); got != c.want {
				t.Errorf("clockOffset = %v, want %v", got, c.want)
			}
		})
	}

	// Instants no round trip can give (a clock stepped between two
	// readings) still place the reading between before and after.
	for _, c := range []struct {
		name                 string
		started, read, after time.Duration // from before, on the server's clock for started and read
		want                 time.Duration
	}{
		{"the statement began after the reading: no wait", ms(5), ms(3), ms(10), ms(3) - ms(5)},
		{"a wait longer than the round trip: the reading at after", 0, ms(30), ms(10), ms(30) - ms(10)},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := clockOffset(start, start.Add(c.started), start.Add(c.read), start.Add(c.after))
			if got != c.want {
				t.Errorf("clockOffset = %v, want %v", got, c.want)
			}
		})
	}

	// The bound, over readings of every shape.
	rng := rand.New(rand.NewPCG(21, 21))
	for range 10000 {
		r := reading{out: time.Duration(rng.Int64N(int64(time.Second))), wait: time.Duration(rng.Int64N(int64(time.Minute))),
			back: time.Duration(rng.Int64N(int64(time.Second))), ahead: time.Duration(rng.Int64N(int64(2*time.Hour))) - time.Hour}
		before, started, read, after := instants(r)
		off := clockOffset(before, started, read, after) - r.ahead
		if bound := (after.Sub(before) - r.wait) / 2; off.Abs() > bound {
			t.Fatalf("%+v: off by %v, more than half of the round trip less the wait, %v", r, off, bound)
		}
	}
}

// A process reckons the server's clock (Postgres.Now) within the bound
// its readings allow even when they were taken through a wait for another
// transaction's lock on the key's row: the wait is no part of the
// difference it measures. Before issue 21 it reckoned the server's clock
// ahead by half of the wait. Both ways of locking a key read the clock: a
// transaction on one key locks it in the admission's pipeline, one on
// several locks each with a statement of its own.
func TestPostgresReckonsTheClockWithoutTheLocksWait(t *testing.T) {
	srv := pgtest.Start(t)
	t.Setenv("PGPASSWORD", srv.Password())
	for _, keys := range [][]string{{"k"}, {"j", "k"}} {
		t.Run(fmt.Sprintf("keys=%d", len(keys)), func(t *testing.T) { reckonsThroughALockWait(t, srv, keys) })
	}
}

// reckonsThroughALockWait makes an Update of keys wait for its first
// key's row, locked on another connection, and checks the store's
// reckoning of the server's clock after it.
//
// The bound is stated from what the test measures on its own, from
// outside the store: the store's reading took at most the store's Update
// from its call until its function ran (D), and its wait on the server
// lasted at least as long as the test saw it wait (W: from the first
// reading of the server's clock after the server showed it waiting, to
// the last before the lock was let go). The offset is then off by at most
// (D−W)/2, and Now, read on either side of a reading of the server's
// clock, brackets that reading within it. The lock is held ten times as
// long as an Update that waits for nothing, as it took to see the store
// wait, and as the test's own round trips, so that the old reckoning, off
// by about W/2, is out of the bound on a busy machine too.
func reckonsThroughALockWait(t *testing.T, srv *pgtest.Server, keys []string) {
	ctx := context.Background()
	url := srv.CreateDatabase(t)
	// A long bound: the test chooses how long the store waits.
	pg, err := OpenPostgres(ctx, url, PostgresOptions{Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	connect := func() *pgx.Conn {
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Password = srv.Password()
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}
	holder, watch := connect(), connect()
	// The keys' rows exist, and the store has a connection open; an
	// Update that waits for nothing takes alone.
	alone := time.Now()
	if err := pg.Update(ctx, func(ledger.Tx) error { return nil }, keys...); err != nil {
		t.Fatal(err)
	}
	hold := 10 * time.Since(alone)
	serverNow := func() (s time.Time, trip time.Duration) {
		sent := time.Now()
		if err := watch.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s, time.Since(sent)
	}

	held, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Rollback(context.Background()) })
	if _, err := held.Exec(ctx, "SELECT key FROM mcp_quota.keys WHERE key = $1 FOR UPDATE", keys[0]); err != nil {
		t.Fatal(err)
	}
	called := time.Now()
	var ran time.Time // when the store's function ran, the key held
	done := make(chan error, 1)
	go func() {
		done <- pg.Update(ctx, func(ledger.Tx) error {
			ran = time.Now()
			return nil
		}, keys...)
	}()
	for waiting := 0; waiting == 0; {
		// pg_stat_activity is read on a connection in no transaction: in
		// one, it would be read once.
		if err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			t.Fatalf("the store's transaction ended without waiting for the key's row (%v)", err)
		default:
		}
	}
	seen, trip := serverNow()
	hold = max(hold, 10*time.Since(called))
	var last time.Time
	var reads int
	for last = seen; last.Sub(seen) < hold || reads < 10; reads++ {
		var d time.Duration
		last, d = serverNow()
		trip = max(trip, d)
		hold = max(hold, 10*trip)
	}
	if err := held.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	d, w := ran.Sub(called), last.Sub(seen)
	bound := (d - w) / 2
	before := pg.Now()
	server, _ := serverNow()
	after := pg.Now()
	measured := fmt.Sprintf("the store's Update took %v until its function ran, its wait lasted at least %v, "+
		"the test's round trips took at most %v", d, w, trip)
	t.Logf("%s: the bound is %v; Now differed from the server's clock by %v (ahead when positive)",
		measured, bound, before.Add(after.Sub(before)/2).Sub(server))
	if early, late := before.Add(-bound), after.Add(bound); server.Before(early) || server.After(late) {
		t.Errorf("the server's clock read %s; the store reckoned it %s to %s around that reading: "+
			"off by more than the bound, %v (%s; the old reckoning would be ahead by about %v)",
			server.Format(time.RFC3339Nano), before.Format(time.RFC3339Nano), after.Format(time.RFC3339Nano),
			bound, measured, w/2)
	}
}
