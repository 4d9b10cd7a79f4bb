package state

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state/postgres"
)

// roundTrips counts the exchanges a connection has with the server: a
// statement, or a pipeline of them, each one round trip.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// tracedPostgres opens a store on a server of the test's own with one
// connection (each transaction runs after the one before on it), whose
// round trips the returned counter counts.
func tracedPostgres(t *testing.T) (*Postgres, *roundTrips) {
	t.Helper()
	srv := pgtest.Start(t)
	t.Setenv("PGPASSWORD", srv.Password())
	trips := &roundTrips{}
	pgTracer = trips
	t.Cleanup(func() { pgTracer = nil })
	pg, err := OpenPostgres(context.Background(), srv.CreateDatabase(t), PostgresOptions{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	return pg, trips
}

// An admission on PostgreSQL reads what it decides on in one round trip
// with its BEGIN and the lock of the key's row, and writes what it decided
// in one with its COMMIT; what it reads after writing is what the server
// holds then: the transaction of an admission (the reads of load, the
// attempt, the pacing state) costs two round trips.
func TestPostgresAdmissionReadsWithTheLock(t *testing.T) {
	pg, trips := tracedPostgres(t)
	ctx := context.Background()
	const key = "k"
	var first int64
	// The key's first transaction adds its row, a policy and a gate.
	var err error
	err = pg.Update(ctx, func(tx ledger.Tx) error {
		now := tx.Clock(time.Now())
		if first, err = tx.InsertAttempt(ledger.Attempt{CallID: "c0", Attempt: 1, Key: key, State: ledger.Admitted,
			At: now, InFlightUntil: now.Add(time.Hour)}); err != nil {
			return err
		}
		if err := tx.PutSeenPolicy(ledger.SeenPolicy{Key: key, Observation: ratelimit.Observation{Policy: "p", Unit: ratelimit.Requests,
			Quota: 10, HasQuota: true, Window: time.Minute}, ReceivedAt: now, BasisAt: now}); err != nil {
			return err
		}
		return tx.PutGate(ledger.Gate{Key: key, Scope: "", Until: now.Add(time.Hour), Reason: reason.Reason{Kind: reason.Said, Said: "r"}, Source: "retry-after", SetAt: now})
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	admit := func(call string) (ledger.KeyState, []ledger.SeenPolicy, []ledger.Gate, ledger.Flight, int64) {
		t.Helper()
		var ks ledger.KeyState
		var known []ledger.SeenPolicy
		var gates []ledger.Gate
		var flight ledger.Flight
		var id int64
		err := pg.Update(ctx, func(tx ledger.Tx) error {
			now := tx.Clock(time.Now())
			var err error
			if ks, err = tx.KeyState(key); err != nil {
				return err
			}
			if known, err = tx.SeenPolicies(key); err != nil {
				return err
			}
			if gates, err = tx.Gates(key, now); err != nil {
				return err
			}
			if flight, err = tx.Flight(key, now); err != nil {
				return err
			}
			if id, err = tx.InsertAttempt(ledger.Attempt{CallID: call, Attempt: 1, Key: key, State: ledger.Admitted,
				At: now, InFlightUntil: now.Add(time.Hour)}); err != nil {
				return err
			}
			ks.LastAdmitAt = now
			return tx.PutKeyState(ks)
		}, key)
		if err != nil {
			t.Fatal(err)
		}
		return ks, known, gates, flight, id
	}
	admit("c1") // the statements are prepared on the connection
	before := trips.n.Load()
	ks, known, gates, flight, id := admit("c2")
	if n := trips.n.Load() - before; n != 2 {
		t.Errorf("an admission took %d round trips, want 2 (BEGIN with the lock and the reads; the attempt and the pacing state with COMMIT)", n)
	}
	if len(known) != 1 || known[0].Policy != "p" || known[0].Quota != 10 || len(gates) != 1 || gates[0].Source != "retry-after" {
		t.Errorf("read policies %+v and gates %+v, want the policy p and the gate the first transaction put", known, gates)
	}
	if flight.Count != 2 {
		t.Errorf("read %d calls in flight, want 2 (c0 and c1)", flight.Count)
	}
	if ks.LastAdmitAt.IsZero() {
		t.Errorf("read the pacing state %+v, want the one c1's admission put", ks)
	}
	// What a transaction reads after writing is the server's: the seq of
	// the attempt it inserted follows the one read with the lock, and its
	// calls in flight count the attempt.
	err = pg.Update(ctx, func(tx ledger.Tx) error {
		now := tx.Clock(time.Now())
		if _, err := tx.InsertAttempt(ledger.Attempt{CallID: "c3", Attempt: 1, Key: key, State: ledger.Admitted,
			At: now, InFlightUntil: now.Add(time.Hour)}); err != nil {
			return err
		}
		f, err := tx.Flight(key, now)
		if err != nil {
			return err
		}
		if f.Count != 4 {
			t.Errorf("after an attempt in the transaction: %d calls in flight, want 4", f.Count)
		}
		if err := tx.PutGate(ledger.Gate{Key: key, Scope: "route x", Until: now.Add(2 * time.Hour), Reason: reason.Reason{Kind: reason.Said, Said: "r2"}, Source: "circuit", SetAt: now}); err != nil {
			return err
		}
		g, err := tx.Gates(key, now)
		if err != nil {
			return err
		}
		if len(g) != 2 {
			t.Errorf("after a gate in the transaction: gates %+v, want 2", g)
		}
		if err := tx.PutSeenPolicy(ledger.SeenPolicy{Key: key, Observation: ratelimit.Observation{Policy: "p", Unit: ratelimit.Requests,
			Remaining: 3, HasRemaining: true, Reset: time.Second, HasReset: true}, ReceivedAt: now, BasisAt: now}); err != nil {
			return err
		}
		k, err := tx.SeenPolicies(key)
		if err != nil {
			return err
		}
		if len(k) != 1 || k[0].Quota != 10 || k[0].Remaining != 3 || !k[0].HasRemaining {
			t.Errorf("after a policy's word in the transaction: %+v, want its quota kept and 3 remaining", k)
		}
		n, err := tx.Count(key, now.Add(-time.Hour))
		if err != nil {
			return err
		}
		if n != 4 {
			t.Errorf("after an attempt in the transaction: %d admitted in the window, want 4", n)
		}
		return nil
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	// A key seen for the first time, on a connection whose transactions
	// locked another before: its row is added, and it is read with the lock.
	err = pg.Update(ctx, func(tx ledger.Tx) error {
		now := tx.Clock(time.Now())
		f, err := tx.Flight("new", now)
		if err != nil {
			return err
		}
		if f.Count != 0 {
			t.Errorf("a new key: %d calls in flight", f.Count)
		}
		_, err = tx.InsertAttempt(ledger.Attempt{CallID: "n1", Attempt: 1, Key: "new", State: ledger.Admitted, At: now})
		return err
	}, "new")
	if err != nil {
		t.Fatal(err)
	}
	if id <= first {
		t.Errorf("attempt IDs %d then %d", first, id)
	}
}

// The calls of a key decided together in one transaction (pacer/group.go)
// read the log as the attempts recorded before them in it left it: the
// calls in flight, the latest admission and the window counts are
// answered from what the transaction read, each attempt it records
// counted in them, and the attempts take IDs of the block the lock's
// pipeline took. Four admissions, each reading its calls in flight and
// its window (an hour, with more admissions than the pipeline reads of
// the latest), with a refusal among them, cost the round trips of one:
// the lock's pipeline, the window's count, and the commit's pipeline.
// What they read is what the server holds, as a transaction after them
// reads.
func TestPostgresGroupReadsTheLogOnce(t *testing.T) {
	pg, trips := tracedPostgres(t)
	ctx := context.Background()
	const key = "k"
	var ids []int64
	admit := func(tx ledger.Tx, call string, now time.Time) error {
		id, err := tx.InsertAttempt(ledger.Attempt{CallID: call, Attempt: 1, Key: key, State: ledger.Admitted,
			At: now, InFlightUntil: now.Add(time.Hour)})
		ids = append(ids, id)
		return err
	}
	const earlier = pgLatestMany + 6
	err := pg.Update(ctx, func(tx ledger.Tx) error {
		now := tx.Clock(time.Now())
		for i := range earlier {
			if err := admit(tx, fmt.Sprint("e", i), now.Add(time.Duration(i-earlier)*time.Millisecond)); err != nil {
				return err
			}
		}
		return nil
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	const calls = 4
	before := trips.n.Load()
	err = pg.Update(ctx, func(tx ledger.Tx) error {
		now := tx.Clock(time.Now())
		for i := range calls {
			flight, window, err := readCounts(tx, key, now)
			if err != nil {
				return err
			}
			if flight != earlier+i || window != earlier+i {
				t.Errorf("call %d of the transaction reads %d in flight and %d in the window, want %d: the attempts before it", i, flight, window, earlier+i)
			}
			if i == 1 {
				if _, err := tx.InsertAttempt(ledger.Attempt{CallID: "refused", Attempt: 1, Key: key, State: ledger.RejectedLocal, At: now}); err != nil {
					return err
				}
			}
			if err := admit(tx, fmt.Sprint("c", i+1), now); err != nil {
				return err
			}
		}
		return nil
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	if n := trips.n.Load() - before; n != 3 {
		t.Errorf("%d admissions in one transaction took %d round trips, want 3: the lock's pipeline, one window count, the commit's", calls, n)
	}
	err = pg.View(ctx, func(tx ledger.ReadTx) error {
		flight, window, err := readCounts(tx, key, tx.Clock(time.Now()))
		if flight != earlier+calls || window != earlier+calls {
			t.Errorf("the server holds %d in flight and %d in the window, want %d", flight, window, earlier+calls)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	for _, id := range ids {
		if seen[id] || id == 0 {
			t.Errorf("attempt IDs %v: want each its own", ids)
		}
		seen[id] = true
	}
}

// admitEvery records calls admissions of key, spacing apart, the first
// back before the transaction's clock, and returns when the first was.
func admitEvery(t *testing.T, pg *Postgres, key string, calls int, back, spacing time.Duration) time.Time {
	t.Helper()
	var start time.Time
	err := pg.Update(context.Background(), func(tx ledger.Tx) error {
		start = tx.Clock(time.Now()).Add(-back)
		for i := range calls {
			if _, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint("c", i), Attempt: 1, Key: key,
				State: ledger.Admitted, At: start.Add(time.Duration(i) * spacing)}); err != nil {
				return err
			}
		}
		return nil
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	return start
}

// admittedAfter is how many of the admissions admitEvery recorded (calls
// of them, spacing apart from start) were admitted after since.
func admittedAfter(start time.Time, spacing time.Duration, calls int, since time.Time) int {
	n := 0
	for i := range calls {
		if start.Add(time.Duration(i) * spacing).After(since) {
			n++
		}
	}
	return n
}

// A key called a few times a second, with more admissions in its window
// than the pipeline reads of the latest, has its window counted with the
// lock once the key's transactions have asked the server where the window
// begins: the pipeline reads the admissions in a few milliseconds around
// the hint and the first after them, and a window's start between them is
// answered from them, however far apart they are (here 100 ms, more than
// the hint's slack of 5 ms on either side). A transaction that reads the
// key's window then costs two round trips, and each count is the
// server's.
func TestPostgresModerateKeysWindowWithTheLock(t *testing.T) {
	pg, trips := tracedPostgres(t)
	ctx := context.Background()
	const key, window, spacing, calls = "k", 10 * time.Second, 100 * time.Millisecond, 200
	start := admitEvery(t, pg, key, calls, 2*window, spacing)
	count := func() (got, want int) {
		t.Helper()
		err := pg.Update(ctx, func(tx ledger.Tx) error {
			since := tx.Clock(time.Now()).Add(-window)
			w, err := tx.WindowOf(key, since, nil)
			got, want = w.Count, admittedAfter(start, spacing, calls, since)
			return err
		}, key)
		if err != nil {
			t.Fatal(err)
		}
		return got, want
	}
	if got, want := count(); got != want || want <= pgLatestMany {
		t.Fatalf("the first read: %d admitted in the window, want %d (more than the %d latest the pipeline reads)", got, want, pgLatestMany)
	}
	for i := range 5 {
		before := trips.n.Load()
		got, want := count()
		if got != want {
			t.Errorf("read %d: %d admitted in the window, want %d", i, got, want)
		}
		if n := trips.n.Load() - before; n != 2 {
			t.Errorf("read %d took %d round trips, want 2: the lock's pipeline, with the window's start among the admissions it read, and the commit", i, n)
		}
	}
}

// A key's window begins further back or nearer from one transaction to
// the next, as its margin moves (the latency of its answers, the age of
// its oldest call in flight): once the pipeline has missed both ends, it
// reads the admissions between them, and a window that begins anywhere
// there costs no round trip of its own.
func TestPostgresWindowStartMovesWithItsMargin(t *testing.T) {
	pg, trips := tracedPostgres(t)
	ctx := context.Background()
	const key, window, spacing, calls = "k", 10 * time.Second, 100 * time.Millisecond, 200
	start := admitEvery(t, pg, key, calls, 2*window, spacing)
	margins := []time.Duration{50 * time.Millisecond, 450 * time.Millisecond, 250 * time.Millisecond, 60 * time.Millisecond, 440 * time.Millisecond}
	for i, margin := range append(margins, margins...) {
		before := trips.n.Load()
		err := pg.Update(ctx, func(tx ledger.Tx) error {
			since := tx.Clock(time.Now()).Add(-window - margin)
			w, err := tx.WindowOf(key, since, nil)
			want := admittedAfter(start, spacing, calls, since)
			if err == nil && w.Count != want {
				t.Errorf("read %d: %d admitted in the window, want %d", i, w.Count, want)
			}
			return err
		}, key)
		if err != nil {
			t.Fatal(err)
		}
		n := trips.n.Load() - before
		switch {
		case i < 2 && n != 3:
			t.Errorf("read %d, %s beyond the window, took %d round trips, want 3: a start the pipeline has not missed yet is asked of the server", i, margin, n)
		case i >= 2 && n != 2:
			t.Errorf("read %d, %s beyond the window, took %d round trips, want 2: a start between the two missed is read with the lock", i, margin, n)
		}
	}
}

// A key with two windows far apart (here 2 s and 8 s, as a key with a
// per-second and a longer policy has), each beginning further back than
// its latest pgLatestMany admissions: once both starts have been asked of
// the server, the pipeline reads the admissions around each, and both
// windows are counted with the lock. The span between them holds more
// admissions than the pipeline reads of a range, so one range over both
// starts reached only the further one, and the nearer window's count cost
// a round trip of its own in every transaction. Each count is the
// server's. The log ends when it is recorded, and the windows end at each
// transaction's clock: the nearer holds 400 admissions at first, more
// than pgLatestMany until the machine has stalled for 1.6 s.
func TestPostgresTwoWindowsFarApartReadWithTheLock(t *testing.T) {
	pg, trips := tracedPostgres(t)
	ctx := context.Background()
	const key, spacing, calls = "k", 5 * time.Millisecond, 2000
	start := admitEvery(t, pg, key, calls, 10*time.Second, spacing)
	windows := []time.Duration{2 * time.Second, 8 * time.Second}
	margins := []time.Duration{3 * time.Millisecond, 17 * time.Millisecond, 8 * time.Millisecond, 12 * time.Millisecond}
	stalled := ""
	for i, margin := range append(margins, margins...) {
		before := trips.n.Load()
		err := pg.Update(ctx, func(tx ledger.Tx) error {
			now := tx.Clock(time.Now())
			for _, window := range windows {
				since := now.Add(-window - margin)
				w, err := tx.WindowOf(key, since, nil)
				if err != nil {
					return err
				}
				want := admittedAfter(start, spacing, calls, since)
				if w.Count != want {
					t.Errorf("read %d, the %v window: %d admitted, want %d", i, window, w.Count, want)
				}
				if i == 0 && want <= pgLatestMany {
					stalled = fmt.Sprintf("the first read of the %v window holds %d admissions, not more than the %d latest the pipeline reads: "+
						"the machine stalled too long for the test to tell anything", window, want, pgLatestMany)
				}
			}
			return nil
		}, key)
		if err != nil {
			t.Fatal(err)
		}
		if stalled != "" {
			t.Fatal(stalled)
		}
		if n := trips.n.Load() - before; i >= 2 && n != 2 {
			t.Errorf("read %d took %d round trips, want 2: the lock's pipeline, with both windows' starts among the admissions it read, and the commit", i, n)
		}
	}
}

// The ranges of a key's admissions the pipeline reads span its last
// backRecent window starts, a range a group of starts close together,
// with a slack of a sixteenth of the group's furthest, at most 5 ms, on
// either side.
func TestSendsRangesSpanTheRecentStarts(t *testing.T) {
	var h windowHints
	check := func(what, key string, want ...sendsRange) {
		t.Helper()
		if got := h.sendsRanges(key); !slices.Equal(got, want) {
			t.Errorf("%s: the ranges are %v µs back, want %v", what, got, want)
		}
	}
	check("no start noted", "k")
	h.noteStart("k", 16_000)
	check("one start 16 ms back", "k", sendsRange{17_000, 15_000})
	h.noteStart("k", 10_400_000)
	for range backRecent - 1 {
		h.noteStart("k", 10_050_000)
	}
	check("starts 10.05 and 10.4 s back", "k", sendsRange{10_405_000, 10_045_000})
	h.noteStart("k", 10_060_000) // the 10.4 s one is now older than the last backRecent
	check("the furthest start left the recent ones", "k", sendsRange{10_065_000, 10_045_000})
	check("another key", "other")

	// Two windows, 0.9 and 4 s, each starting a little further back from
	// one transaction to the next; then a third, of 60 s.
	for i := range int64(8) {
		h.noteStart("two", 4_000_000+i*2_000)
		h.noteStart("two", 900_000+i*1_000)
	}
	check("two windows", "two", sendsRange{4_019_000, 3_995_000}, sendsRange{912_000, 895_000})
	h.noteStart("two", 60_300_000)
	check("three windows", "two", sendsRange{60_305_000, 60_295_000}, sendsRange{4_019_000, 3_995_000}, sendsRange{912_000, 895_000})
	// A fourth group, 1 s back: the two nearest each other (0.9 and 1 s,
	// 10% apart) are read as one.
	h.noteStart("two", 1_000_000)
	check("four groups", "two", sendsRange{60_305_000, 60_295_000}, sendsRange{4_019_000, 3_995_000}, sendsRange{1_005_000, 895_000})

	// Starts at or after the transaction's clock need no read (no
	// admission is after them), and leave the others' groups as they are.
	h.noteStart("ahead", 4_000_000)
	h.noteStart("ahead", 900_000)
	h.noteStart("ahead", -2_000)
	h.noteStart("ahead", 0)
	h.noteStart("ahead", 100_000)
	check("starts after the clock", "ahead", sendsRange{4_005_000, 3_995_000}, sendsRange{905_000, 895_000}, sendsRange{105_000, 95_000})
	h.noteStart("only-ahead", -2_000)
	check("starts after the clock alone", "only-ahead")

	// A key whose latest read widened before any of its starts was noted
	// (the leased one-key cell of BenchmarkAdmissions: it panicked here).
	h.noteLatest("widened", pgFirstSend{seq: 101 - pgLatestFew - 1, at: 1, last: 100, ok: true})
	check("a key with a widened read and no start noted", "widened")
}

// A window's count that begins among a key's latest pgLatestMany
// admissions, but before its latest pgLatestFew, is asked of the server
// once: the key's next transactions read its latest pgLatestMany with the
// lock, and a count that begins anywhere among them costs no round trip
// of its own. Each count is the server's.
func TestPostgresLatestReadWidens(t *testing.T) {
	pg, trips := tracedPostgres(t)
	ctx := context.Background()
	const key, spacing, calls = "k", 100 * time.Millisecond, 100
	start := admitEvery(t, pg, key, calls, 20*time.Second, spacing)
	last := start.Add((calls - 1) * spacing)
	// Counts after the admission back-th before the last: 30 back (more
	// than pgLatestFew) first, then others, each further than the first's
	// hint (see sendsRange) from the others.
	for i, back := range []int{30, 20, 40, 50, 12} {
		before := trips.n.Load()
		err := pg.Update(ctx, func(tx ledger.Tx) error {
			since := last.Add(-time.Duration(back)*spacing - spacing/2)
			w, err := tx.WindowOf(key, since, nil)
			if err == nil && w.Count != back+1 {
				t.Errorf("count %d: %d admitted after the %dth before the last, want %d", i, w.Count, back, back+1)
			}
			return err
		}, key)
		if err != nil {
			t.Fatal(err)
		}
		var want int64 = 2 // the lock's pipeline, with the count's start among the admissions it read, and the commit
		if i == 0 {
			want = 3 // and the count, asked of the server
		}
		if n := trips.n.Load() - before; n != want {
			t.Errorf("count %d, %d admissions back, took %d round trips, want %d", i, back, n, want)
		}
	}
}

// A key's pipeline reads its latest pgLatestFew admissions, and its
// latest pgLatestMany for manyFor transactions after a window's count
// that began among those but before the few.
func TestLatestReadFollowsTheCounts(t *testing.T) {
	var h windowHints
	count := func(n int64) pgFirstSend { return pgFirstSend{seq: 101 - n, at: 1, last: 100, ok: true} }
	for _, w := range []pgFirstSend{{}, count(1), count(pgLatestFew), count(pgLatestMany + 1)} {
		h.noteLatest("k", w)
		if got := h.latestRead("k"); got != pgLatestFew {
			t.Errorf("after a count of %d admissions (ok %v): reads the latest %d, want %d", w.last-w.seq+1, w.ok, got, pgLatestFew)
		}
	}
	h.noteLatest("k", count(pgLatestFew+1))
	for i := range manyFor {
		if got := h.latestRead("k"); got != pgLatestMany {
			t.Fatalf("transaction %d after a count of %d admissions reads the latest %d, want %d", i, pgLatestFew+1, got, pgLatestMany)
		}
	}
	if got := h.latestRead("k"); got != pgLatestFew {
		t.Errorf("%d transactions later it reads the latest %d, want %d again", manyFor, got, pgLatestFew)
	}
	if got := h.latestRead("other"); got != pgLatestFew {
		t.Errorf("another key reads its latest %d, want %d", got, pgLatestFew)
	}
}

// The block of IDs a transaction takes for its attempts (pgNextAttemptID)
// is the one the schema's default and Reserve take, and a lease holds no
// more slots than a block: the IDs of one never run into the next's.
func TestPostgresAttemptBlockAgrees(t *testing.T) {
	block := regexp.MustCompile(`nextval\('attempt_blocks'\) \* ([0-9]+)`)
	texts := map[string]string{"pgNextAttemptID": pgNextAttemptID, "Reserve": queries[qReserve].postgres}
	migrations, err := fs.Glob(postgres.Migrations, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range migrations {
		b, err := fs.ReadFile(postgres.Migrations, name)
		if err != nil {
			t.Fatal(err)
		}
		texts[name] = string(b)
	}
	found := 0
	for name, text := range texts {
		for _, m := range block.FindAllStringSubmatch(text, -1) {
			found++
			if m[1] != strconv.Itoa(attemptBlock) {
				t.Errorf("%s takes blocks of %s attempt IDs, want attemptBlock, %d", name, m[1], attemptBlock)
			}
		}
	}
	if found < 3 {
		t.Errorf("%d statements take a block of attempt IDs, want 3 at least: the schema's default, Reserve and pgNextAttemptID", found)
	}
	if maxReserve > attemptBlock {
		t.Errorf("a lease holds up to %d slots, more than a block of %d IDs", maxReserve, attemptBlock)
	}
}

// A transaction that records more attempts than its block of IDs holds
// records the ones past it at once, under IDs of the table's default, and
// reads the log as its attempts left it all along.
func TestPostgresAttemptBlockRunsOut(t *testing.T) {
	pg, _ := tracedPostgres(t)
	ctx := context.Background()
	const key, n = "k", attemptBlock + 3
	seen := map[int64]bool{}
	var base int64 // the first ID of the transaction's block
	err := pg.Update(ctx, func(tx ledger.Tx) error {
		clear(seen)
		now := tx.Clock(time.Now())
		for i := range n {
			if i >= attemptBlock-2 { // what the transaction reads, about the block's end
				flight, window, err := readCounts(tx, key, now)
				if err != nil {
					return err
				}
				if flight != i || window != i {
					t.Errorf("before attempt %d the transaction reads %d in flight and %d in the window, want %d", i+1, flight, window, i)
				}
			}
			id, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint("c", i), Attempt: 1, Key: key, State: ledger.Admitted,
				At: now, InFlightUntil: now.Add(time.Hour)})
			if err != nil {
				return err
			}
			if seen[id] || id == 0 {
				t.Errorf("attempt %d took ID %d, taken before", i+1, id)
			}
			seen[id] = true
			if i == 0 {
				base = id
			}
			if inBlock := id >= base && id < base+attemptBlock; inBlock != (i < attemptBlock) {
				t.Errorf("attempt %d took ID %d, in the block from %d: %v; want the block's IDs for the first %d alone", i+1, id, base, inBlock, attemptBlock)
			}
		}
		return nil
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	err = pg.View(ctx, func(tx ledger.ReadTx) error {
		flight, window, err := readCounts(tx, key, tx.Clock(time.Now()))
		if flight != n || window != n {
			t.Errorf("the server holds %d in flight and %d in the window, want %d", flight, window, n)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// readCounts reads what an admission of key reads at now in tx: the calls
// in flight, and the admissions of the last hour. In a View they are the
// server's; in an Update, what the transaction's own attempts left.
func readCounts(tx ledger.Reader, key string, now time.Time) (flight, window int, err error) {
	f, err := tx.Flight(key, now)
	if err != nil {
		return 0, 0, err
	}
	w, err := tx.WindowOf(key, now.Add(-time.Hour), nil)
	return f.Count, w.Count, err
}

// An answer's record on PostgreSQL writes what it learned with its COMMIT
// and answers its later reads from what the lock's pipeline and its own
// reads found: the attempt's end and the observation wait for the commit;
// a policy put on one the pipeline read is merged as the statement
// merges it; the gates closed at a later time are those read that close
// after it; and a window read after a time is answered from an earlier
// read whose first admission came after that time, or from the key's
// latest admission when none came after it, or from the admissions the
// pipeline read (here the key's latest). Such a
// record costs two round trips (the lock's pipeline, the commit's), and
// what it read is what a transaction after it reads of the server.
func TestPostgresOutcomeWritesWithTheCommit(t *testing.T) {
	pg, trips := tracedPostgres(t)
	ctx := context.Background()
	const key = "k"
	var ids []int64
	var setAt time.Time
	err := pg.Update(ctx, func(tx ledger.Tx) error {
		setAt = tx.Clock(time.Now())
		for i, ago := range []time.Duration{50, 40, 30} { // ms before setAt
			id, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint("c", i), Attempt: 1, Key: key, State: ledger.Admitted,
				At: setAt.Add(-ago * time.Millisecond), InFlightUntil: setAt.Add(time.Hour)})
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		if err := tx.PutSeenPolicy(ledger.SeenPolicy{Key: key, Observation: ratelimit.Observation{Policy: "p", Unit: ratelimit.Requests,
			Quota: 10, HasQuota: true, Window: time.Minute, Remaining: 5, HasRemaining: true, Reset: 30 * time.Second, HasReset: true},
			ReceivedAt: setAt, BasisAt: setAt, Route: "GET /a"}); err != nil {
			return err
		}
		for scope, until := range map[string]time.Duration{"": time.Hour, "route x": 2 * time.Second} {
			if err := tx.PutGate(ledger.Gate{Key: key, Scope: scope, Until: setAt.Add(until), Reason: reason.Reason{Kind: reason.Said, Said: "r"},
				Source: "retry-after", SetAt: setAt}); err != nil {
				return err
			}
		}
		return nil
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	// What the record reads, and what a transaction after it reads the same way.
	type reads struct {
		counts      []int // after 45 ms before setAt (the server's), 42 ms (the first after 45 is after it), 20 ms (after the latest)
		known       []ledger.SeenPolicy
		gates, late []ledger.Gate // at now, and 3 s later
	}
	read := func(tx ledger.Reader, now time.Time) (r reads, err error) {
		for _, ago := range []time.Duration{45, 42, 20} {
			n, err := tx.Count(key, setAt.Add(-ago*time.Millisecond))
			if err != nil {
				return r, err
			}
			r.counts = append(r.counts, n)
		}
		if r.known, err = tx.SeenPolicies(key); err != nil {
			return r, err
		}
		if r.gates, err = tx.Gates(key, now); err != nil {
			return r, err
		}
		r.late, err = tx.Gates(key, now.Add(3*time.Second))
		return r, err
	}
	var inRecord reads
	var now time.Time
	record := func(back time.Duration) {
		t.Helper()
		err := pg.Update(ctx, func(tx ledger.Tx) error {
			now = tx.Clock(time.Now())
			if _, err := tx.Count(key, setAt.Add(-back)); err != nil {
				return err
			}
			if err := tx.AddObservation(ledger.ObservationRecord{Key: key, AttemptID: ids[0], Observation: ratelimit.Observation{
				Policy: "p", Unit: ratelimit.Requests, Remaining: 3, HasRemaining: true}, Status: 200, ReceivedAt: now}); err != nil {
				return err
			}
			// No quota or window: the held ones stay; a remaining: its time and route replace the held ones.
			if err := tx.PutSeenPolicy(ledger.SeenPolicy{Key: key, Observation: ratelimit.Observation{Policy: "p", Unit: ratelimit.Requests,
				Remaining: 3, HasRemaining: true}, ReceivedAt: now, BasisAt: now, Route: "GET /b"}); err != nil {
				return err
			}
			if err := tx.FinishAttempt(ids[0], ledger.Confirmed, reason.Reason{}, 200, now, now); err != nil {
				return err
			}
			var err error
			inRecord, err = read(tx, now)
			return err
		}, key)
		if err != nil {
			t.Fatal(err)
		}
	}
	record(time.Hour) // the statements are prepared on the connection
	before := trips.n.Load()
	record(45 * time.Millisecond)
	if n := trips.n.Load() - before; n != 2 {
		t.Errorf("an answer's record took %d round trips, want 2 (the lock's pipeline, the commit's)", n)
	}
	var after reads
	err = pg.View(ctx, func(tx ledger.ReadTx) error {
		var err error
		after, err = read(tx, now)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(after.counts, []int{2, 2, 0}) || !slices.Equal(inRecord.counts, after.counts) {
		t.Errorf("window counts: the record read %v, the server holds %v, want [2 2 0]", inRecord.counts, after.counts)
	}
	if !reflect.DeepEqual(inRecord.known, after.known) || len(after.known) != 1 || after.known[0].Quota != 10 || after.known[0].Remaining != 3 ||
		after.known[0].Route != "GET /b" {
		t.Errorf("policies: the record read %+v, the server holds %+v, want quota 10 kept, 3 remaining, route GET /b", inRecord.known, after.known)
	}
	if !reflect.DeepEqual(inRecord.gates, after.gates) || !reflect.DeepEqual(inRecord.late, after.late) || len(after.gates) != 2 || len(after.late) != 1 {
		t.Errorf("gates: the record read %+v and %+v, the server holds %+v and %+v, want 2 now and 1 three seconds later",
			inRecord.gates, inRecord.late, after.gates, after.late)
	}
	err = pg.View(ctx, func(tx ledger.ReadTx) error {
		st, err := tx.AttemptState(key, ids[0])
		if st != ledger.Confirmed {
			t.Errorf("the answered attempt is %q, want confirmed", st)
		}
		obs, err2 := tx.(*Tx).Observations(key, 10)
		if len(obs) != 2 {
			t.Errorf("%d observations recorded, want 2 (one a record)", len(obs))
		}
		return errors.Join(err, err2)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// What a transaction read of a key's log answers a window's read after a
// time with, and when it has to ask the server.
func TestReadFirstSendFromWhatWasRead(t *testing.T) {
	// The log: admissions 1..5 at 100, 200, …, 500; the transaction's
	// clock 1000.
	read := func() *pgRead {
		return &pgRead{key: "k", now: 1000, hasLastSend: true, hasLast: true, lastSeq: 5, lastAt: 500}
	}
	first := func(seq int64) pgFirstSend { return pgFirstSend{seq: seq, at: 100 * seq, last: 5, ok: true} }
	none := pgFirstSend{}
	cases := []struct {
		name   string
		read   func(r *pgRead)
		since  int64
		want   pgFirstSend
		answer bool // from what was read
	}{
		{"nothing read but the latest: a time before it", func(*pgRead) {}, 450, none, false},
		{"after the latest admission: none", func(*pgRead) {}, 500, none, true},
		{"no admission at all: none", func(r *pgRead) { r.hasLast, r.lastSeq, r.lastAt = false, 0, 0 }, 0, none, true},
		{"the same time read before", func(r *pgRead) { r.windows = map[int64]pgFirstSend{250: first(3)} }, 250, first(3), true},
		{"an earlier read whose first is after the time", func(r *pgRead) { r.windows = map[int64]pgFirstSend{250: first(3)} }, 280, first(3), true},
		{"an earlier read whose first is before the time", func(r *pgRead) { r.windows = map[int64]pgFirstSend{250: first(3)} }, 320, none, false},
		{"a later read", func(r *pgRead) { r.windows = map[int64]pgFirstSend{250: first(3)} }, 150, none, false},
		{"the pipeline's admissions reach past the time", func(r *pgRead) {
			r.sends = []sendsRead{{150, []pgSend{{2, 200}, {3, 300}, {4, 400}}}}
		}, 340, first(4), true},
		{"the pipeline's admissions began after the time", func(r *pgRead) {
			r.sends = []sendsRead{{250, []pgSend{{3, 300}, {4, 400}, {5, 500}}}}
		}, 240, none, false},
		{"the pipeline's admissions end before the time", func(r *pgRead) {
			r.sends = []sendsRead{{150, []pgSend{{2, 200}, {3, 300}}}}
		}, 350, none, false},
		{"two ranges read, the time in the nearer", func(r *pgRead) {
			r.sends = []sendsRead{{50, []pgSend{{1, 100}}}, {350, []pgSend{{4, 400}, {5, 500}}}}
		}, 420, first(5), true},
		{"two ranges read, the time in the further", func(r *pgRead) {
			r.sends = []sendsRead{{50, []pgSend{{1, 100}, {2, 200}}}, {350, []pgSend{{4, 400}}}}
		}, 80, first(1), true},
		{"two ranges read, the time between them", func(r *pgRead) {
			r.sends = []sendsRead{{50, []pgSend{{1, 100}, {2, 200}}}, {350, []pgSend{{4, 400}}}}
		}, 250, none, false},
		{"the latest admissions, since the oldest of them", func(r *pgRead) {
			r.latest = []pgSend{{3, 300}, {4, 400}, {5, 500}}
		}, 300, first(4), true},
		{"the latest admissions, all of them", func(r *pgRead) {
			r.latest, r.allLatest = []pgSend{{1, 100}, {2, 200}, {3, 300}, {4, 400}, {5, 500}}, true
		}, 50, first(1), true},
		{"the latest admissions, not since the oldest of them", func(r *pgRead) {
			r.latest = []pgSend{{3, 300}, {4, 400}, {5, 500}}
		}, 250, none, false},
		{"written since: nothing holds", func(r *pgRead) {
			r.hasLastSend, r.windows = false, map[int64]pgFirstSend{250: first(3)}
		}, 250, none, false},
	}
	for _, c := range cases {
		r := read()
		c.read(r)
		p := &pgTx{db: &Postgres{}, read: r}
		got, answered := p.readFirstSend("k", c.since)
		if answered != c.answer || got != c.want {
			t.Errorf("%s: after %d: got %+v (answered %v), want %+v (answered %v)", c.name, c.since, got, answered, c.want, c.answer)
		}
	}
}

// The calls in flight a transaction counts from what the pipeline read,
// without the attempts whose ends the journal holds now, and when it has
// to ask the server.
func TestFlightWithoutTheJournalsEnds(t *testing.T) {
	all := []attemptAt{{1, 100}, {2, 200}, {3, 300}}
	cases := []struct {
		name     string
		read     []attemptAt // the earliest calls in flight the pipeline read
		of       int         // in all
		own      []attemptAt // recorded by the transaction
		finished []int64     // ended by the transaction
		ended    []int64     // whose ends the journal holds
		count    int
		oldest   int64
		answer   bool
	}{
		{"all read", all, 3, nil, nil, nil, 3, 100, true},
		{"all read, the journal holds the earliest's end", all, 3, nil, nil, []int64{1}, 2, 200, true},
		{"all read, the journal holds an end of one not in flight", all, 3, nil, nil, []int64{2, 9}, 2, 100, true},
		{"the earliest read", all[:2], 5, nil, nil, nil, 5, 100, true},
		{"the earliest read, the journal holds one's end", all[:2], 5, nil, nil, []int64{1}, 4, 200, true},
		{"the earliest read, the journal holds the end of one not read", all[:2], 5, nil, nil, []int64{9}, 0, 0, false},
		{"the earliest read, the journal holds the ends of all read", all[:2], 5, nil, nil, []int64{1, 2}, 0, 0, false},
		{"one recorded by the transaction", all, 3, []attemptAt{{7, 50}}, nil, []int64{1}, 3, 50, true},
		{"one ended by the transaction", all, 3, nil, []int64{1}, nil, 2, 200, true},
		{"one recorded and ended by the transaction", all, 3, []attemptAt{{7, 50}}, []int64{7}, nil, 3, 100, true},
		{"one recorded by the transaction, the journal holds its end", all, 3, []attemptAt{{7, 50}}, nil, []int64{7}, 3, 100, true},
		{"one not read ended by the transaction", all[:2], 5, nil, []int64{9}, nil, 0, 0, false},
	}
	for _, c := range cases {
		p := &pgTx{read: &pgRead{key: "k", now: 1000, hasFlight: true, flight: slices.Clone(c.read), flightAll: c.of, ownFlight: slices.Clone(c.own)}}
		for _, id := range c.finished {
			p.finished(id)
		}
		f, answered := p.readFlight("k", fromMicros(1000), c.ended)
		want := ledger.Flight{Count: c.count, Oldest: fromMicros(c.oldest)}
		if answered != c.answer || answered && f != want {
			t.Errorf("%s: got %+v (answered %v), want %+v (answered %v)", c.name, f, answered, want, c.answer)
		}
	}
}

// A window counted over the admissions the pipeline read and the
// transaction's own, more than pgLatestFew of them, widens the key's next
// reads before any of its window starts was noted (the leased one-key cell
// of BenchmarkAdmissions did this; the next transaction on the key then
// panicked in sendsRange). The count is exact, and so is the next one.
func TestPostgresWindowOverOwnAdmissionsWidensTheNextRead(t *testing.T) {
	pg, _ := tracedPostgres(t)
	ctx := context.Background()
	const key, spacing, calls = "k", 100 * time.Millisecond, 20
	start := admitEvery(t, pg, key, calls, 10*time.Second, spacing)
	since := start.Add((calls - pgLatestFew) * spacing) // the oldest of the latest pgLatestFew
	count := func(own int) int {
		t.Helper()
		var n int
		err := pg.Update(ctx, func(tx ledger.Tx) error {
			now := tx.Clock(time.Now())
			for i := range own {
				if _, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint("own", i), Attempt: 1, Key: key,
					State: ledger.Admitted, At: now.Add(time.Duration(i) * time.Microsecond)}); err != nil {
					return err
				}
			}
			w, err := tx.WindowOf(key, since, nil)
			n = w.Count
			return err
		}, key)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got, want := count(2), pgLatestFew-1+2; got != want {
		t.Errorf("after %v, with two admissions of its own: %d, want %d", since, got, want)
	}
	if got, want := count(0), pgLatestFew-1+2; got != want {
		t.Errorf("the next transaction counts %d after %v, want %d", got, since, want)
	}
}
