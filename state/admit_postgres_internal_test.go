package state

import (
	"context"
	"fmt"
	"io/fs"
	"regexp"
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
// its window, with a refusal among them, cost the round trips of one: the
// lock's pipeline, the window's count, and the commit's pipeline. What
// they read is what the server holds, as a transaction after them reads.
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
	if err := pg.Update(ctx, func(tx ledger.Tx) error { return admit(tx, "c0", tx.Clock(time.Now())) }, key); err != nil {
		t.Fatal(err)
	}
	const calls = 4
	before := trips.n.Load()
	err := pg.Update(ctx, func(tx ledger.Tx) error {
		now := tx.Clock(time.Now())
		for i := range calls {
			flight, window, err := readCounts(tx, key, now)
			if err != nil {
				return err
			}
			if flight != 1+i || window != 1+i {
				t.Errorf("call %d of the transaction reads %d in flight and %d in the window, want %d: the attempts before it", i, flight, window, 1+i)
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
		if flight != 1+calls || window != 1+calls {
			t.Errorf("the server holds %d in flight and %d in the window, want %d", flight, window, 1+calls)
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
