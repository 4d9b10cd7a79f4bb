package state

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// diffSeed is the seed TestPostgresPipelineAnswersAsTheServer runs with
// when MCP_QUOTA_DIFF_SEED names none.
const diffSeed = 1

// diffTransactions is how many transactions on the key the test runs
// after the log is seeded: a few hundred, under 2 s on two cores (3 s
// under -race).
const diffTransactions = 300

// What a transaction holding a key answers from its lock's pipeline — the
// first admission after a time (qFirstSend), the latest admission
// (qLastSend), the calls in flight without the ends the journal holds
// (qInFlightExcept) — is what the same statement sent to the server in
// the same transaction answers, whatever the transaction recorded before
// (admissions at the latest or after it, and before it, which renumbers
// the log; refusals, with a lease or without; ends; a lease's slots, and
// their release) and whatever the process's hints had the pipeline read.
// A seeded random walk over those: the seed is logged, and
// MCP_QUOTA_DIFF_SEED runs another. Where the pipeline declines to answer
// the server is asked, as Tx does; a share of the reads must be answered
// from the pipeline, or the test would prove nothing.
func TestPostgresPipelineAnswersAsTheServer(t *testing.T) {
	seed := uint64(diffSeed)
	if s := os.Getenv("MCP_QUOTA_DIFF_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("MCP_QUOTA_DIFF_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (MCP_QUOTA_DIFF_SEED=%d runs it again)", seed, seed)
	pg, trips := tracedPostgres(t)
	d := &pipelineDiff{pg: pg, trips: trips, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), seed: seed, key: "k",
		finished: map[int64]bool{}, reads: map[string]*diffReads{}}
	ctx := context.Background()
	run := func(what string, fn func(tx *Tx) error) {
		t.Helper()
		err := pg.Update(ctx, func(tx ledger.Tx) error { return fn(tx.(*Tx)) }, d.key)
		if d.mismatch != nil {
			t.Fatal(d.mismatch)
		}
		if err != nil {
			t.Fatalf("seed %d, %s: %v", seed, what, err)
		}
	}
	for i, back := range []int{30, 20, 10} {
		d.txn = fmt.Sprint("seeding transaction ", i+1)
		run(d.txn, func(tx *Tx) error { return d.seedLog(tx, 100, back) })
	}
	// The server's statistics of the log, as a database in use has them:
	// the plans the connection keeps for the statements it asks are those
	// of a table of this size.
	if _, err := pg.db.ExecContext(ctx, "ANALYZE attempts"); err != nil {
		t.Fatal(err)
	}
	for d.n = 1; d.n <= diffTransactions; d.n++ {
		d.txn = fmt.Sprint("transaction ", d.n)
		d.perturbHints()
		run(d.txn, d.transaction)
	}
	var kinds []string
	for what, r := range d.reads {
		kinds = append(kinds, fmt.Sprintf("%s %d/%d", what, r.answered, r.compared))
	}
	slices.Sort(kinds)
	t.Logf("answered from the pipeline / compared with the server: %s; the pipeline read part of the calls in flight in %d of %d transactions",
		strings.Join(kinds, ", "), d.partialFlight, diffTransactions)
	for _, what := range []string{diffFirst, diffWindow, diffLast, diffFlight, diffTxFlight} {
		r := d.reads[what]
		if r == nil || r.answered*4 < r.compared || r.answered == r.compared {
			t.Errorf("seed %d: the pipeline answered %v reads of %q: want at least a quarter, and not all", seed, r, what)
		}
	}
	if d.partialFlight*10 < diffTransactions || d.partialFlight*10 > 9*diffTransactions {
		t.Errorf("seed %d: the pipeline read part of the calls in flight in %d of %d transactions: want both kinds of read, each a tenth at least",
			seed, d.partialFlight, diffTransactions)
	}
	// The numbers the transactions gave their admissions, from the latest
	// the pipeline read, run without a gap in the order of the log.
	var gaps int
	err := pg.View(ctx, func(tx ledger.ReadTx) error {
		return tx.(*Tx).pg.queryRow(ctx, `SELECT count(*) FROM (SELECT seq, row_number() OVER (ORDER BY at, seq) AS n
			FROM attempts WHERE key = $1 AND counted) AS log WHERE seq <> n`, d.key).Scan(&gaps)
	})
	if err != nil {
		t.Fatal(err)
	}
	if gaps != 0 {
		t.Errorf("seed %d: %d admissions of the log are numbered out of their order", seed, gaps)
	}
}

// The kinds of read the test compares.
const (
	diffFirst    = "first admission after (readFirstSend)"
	diffWindow   = "window (Tx.Window)"
	diffLast     = "latest admission (readLastSend)"
	diffFlight   = "in flight without ended (readFlight)"
	diffTxFlight = "in flight (Tx.Flight)"
)

// diffReads counts one kind of read: those compared with the server's
// answer, and those of them the pipeline answered.
type diffReads struct{ compared, answered int }

func (r *diffReads) String() string { return fmt.Sprintf("%d of %d", r.answered, r.compared) }

// pipelineDiff is the state of TestPostgresPipelineAnswersAsTheServer's
// walk: what it recorded of the key's log (an attempt's record may later
// be gone, released; they serve as times and IDs to read about), what it
// did in the transaction under way, and the reads it compared.
type pipelineDiff struct {
	pg    *Postgres
	trips *roundTrips
	rng   *rand.Rand
	seed  uint64
	key   string

	ats      []int64 // the admissions' times, in microseconds
	latest   int64   // the latest of them
	ids      []int64 // the attempts' and slots' IDs
	leases   []diffLease
	finished map[int64]bool

	n        int      // the transaction under way after the seeding, from 1
	txn      string   // which transaction is under way, for messages
	did      []string // what it did so far
	mismatch error    // the first answer the pipeline and the server disagree on

	reads         map[string]*diffReads
	partialFlight int // transactions whose pipeline read part of the calls in flight
}

// A diffLease is a lease's slots, first…last, and whether some were
// released or ended (then it is released no more).
type diffLease struct {
	first, last int64
	done        bool
}

// seedLog records n attempts of the key, from back seconds before the
// transaction's clock on (or the latest admission, when later): admissions
// spaced at random, a few milliseconds or a few hundred apart (some at
// the same time, some a microsecond apart), with leases or none, of which
// some have run out; refusals; leases' slots, some released; ends. It
// compares the reads now and then. The first half of each transaction's
// attempts are admissions and refusals alone, which the pipeline's read
// counts in itself: in the first transaction, on a key without
// admissions, it holds all of them (allLatest).
func (d *pipelineDiff) seedLog(tx *Tx, n, back int) error {
	d.did = d.did[:0]
	clock := tx.Clock(time.Now())
	now := micros(clock)
	at := max(d.latest, now-int64(back)*1e6)
	for i := range n {
		switch r := d.rng.IntN(100); {
		case r < 10:
		case r < 20:
			at++
		case r < 70:
			at += d.rng.Int64N(20_000)
		default:
			at += d.rng.Int64N(300_000)
		}
		var err error
		r := d.rng.IntN(100)
		if i < n/2 {
			r = r * 82 / 100
		}
		switch {
		case r < 70:
			err = d.insert(tx, now, ledger.Admitted, at, d.seedLease(now))
		case r < 82:
			err = d.insert(tx, now, ledger.RejectedLocal, at, d.seedLease(now))
		case r < 92:
			err = d.reserve(tx, now, at, d.seedLease(now))
		case r < 96:
			err = d.release(tx)
		default:
			err = d.finish(tx, now)
		}
		if err != nil {
			return fmt.Errorf("attempt %d: %w", i, err)
		}
		if d.rng.IntN(8) == 0 {
			if err := d.compareAll(tx, clock); err != nil {
				return err
			}
		}
	}
	return nil
}

// seedLease returns a seeded attempt's lease: none, one run out, or one
// that runs out in the next seconds.
func (d *pipelineDiff) seedLease(now int64) int64 {
	if d.rng.IntN(2) == 0 {
		return 0
	}
	return now + d.rng.Int64N(2e6) - 1e6
}

// quiet says the walk's calls end soon after they begin: its transactions
// alternate, fifty at a time, between a busy key, with more calls in
// flight than the pipeline reads, and a quiet one, whose calls in flight
// it reads all of.
func (d *pipelineDiff) quiet() bool { return d.n/50%2 == 1 }

// lease returns when a call leased in the transaction runs out: a
// second or two after its clock on a busy key, a few milliseconds on a
// quiet one.
func (d *pipelineDiff) lease(now int64) int64 {
	if d.quiet() {
		return now + d.rng.Int64N(30_000)
	}
	return now + d.rng.Int64N(2e6)
}

// transaction is one transaction of the walk: reads, then a few writes,
// each followed by reads or not, then reads. On a quiet key it first ends
// a few calls.
func (d *pipelineDiff) transaction(tx *Tx) error {
	d.did = d.did[:0]
	now := tx.Clock(time.Now())
	if r := tx.pg.read; len(r.flight) < r.flightAll {
		d.partialFlight++
	}
	if err := d.compareAll(tx, now); err != nil {
		return err
	}
	if d.quiet() {
		for range 4 + d.rng.IntN(12) {
			if err := d.finish(tx, micros(now)); err != nil {
				return err
			}
		}
	}
	for range d.rng.IntN(6) {
		if err := d.write(tx, now); err != nil {
			return err
		}
		if d.rng.IntN(3) == 0 {
			if err := d.compareAll(tx, now); err != nil {
				return err
			}
		}
	}
	return d.compareAll(tx, now)
}

// write records one thing in the transaction: an admission at the latest
// or after it (rarely before it), a refusal, an end, a lease's slots, or
// their release.
func (d *pipelineDiff) write(tx *Tx, clock time.Time) error {
	now := micros(clock)
	lease := int64(0)
	if d.rng.IntN(2) == 0 {
		switch r := d.rng.IntN(10); {
		case r == 0:
			lease = now // runs out at the transaction's clock: not in flight
		case r == 1:
			lease = now + 1
		default:
			lease = d.lease(now)
		}
	}
	switch r := d.rng.IntN(100); {
	case r < 40:
		at := d.latest
		switch d.rng.IntN(3) {
		case 1:
			at += d.rng.Int64N(3000)
		case 2:
			at = max(at, now+d.rng.Int64N(3000)-2000)
		}
		return d.insert(tx, now, ledger.Admitted, at, lease)
	case r < 41 && len(d.ats) > 0:
		// Renumbers the log: every admission's row is written again, at a
		// cost that grows with the log, so rarely.
		at := d.ats[d.rng.IntN(len(d.ats))] - d.rng.Int64N(500)
		return d.insert(tx, now, ledger.Admitted, at, lease)
	case r < 60:
		return d.insert(tx, now, ledger.RejectedLocal, now+d.rng.Int64N(6e6)-5e6, lease)
	case r < 85:
		return d.finish(tx, now)
	case r < 93:
		return d.reserve(tx, now, max(d.latest, now+d.rng.Int64N(2000)-1000), d.lease(now))
	default:
		return d.release(tx)
	}
}

// insert records an attempt of the key in state at at, in flight until
// lease (0: never); times are in microseconds, now the transaction's clock.
func (d *pipelineDiff) insert(tx *Tx, now int64, state ledger.State, at, lease int64) error {
	id, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint("c", len(d.ids)), Attempt: 1, Key: d.key, State: state,
		At: fromMicros(at), InFlightUntil: fromMicros(lease), Bytes: d.rng.Int64N(100)})
	if err != nil {
		return err
	}
	d.ids = append(d.ids, id)
	leased := "no lease"
	if lease != 0 {
		leased = fmt.Sprintf("leased until %+dµs", lease-now)
	}
	d.did = append(d.did, fmt.Sprintf("%s %d at %+dµs, %s", state, id, at-now, leased))
	if state == ledger.Admitted {
		d.ats = append(d.ats, at)
		d.latest = max(d.latest, at)
	}
	return nil
}

// finish ends an attempt: one the pipeline read in flight, one the
// transaction recorded, any the walk recorded, or one that never was.
func (d *pipelineDiff) finish(tx *Tx, now int64) error {
	r := tx.pg.read
	var id int64
	switch c := d.rng.IntN(10); {
	case c < 4 && len(r.flight) > 0:
		id = r.flight[d.rng.IntN(len(r.flight))].id
	case c < 6 && len(r.ownFlight) > 0:
		id = r.ownFlight[d.rng.IntN(len(r.ownFlight))].id
	case c < 9 && len(d.ids) > 0:
		id = d.ids[d.rng.IntN(len(d.ids))]
	default:
		id = 1 + d.rng.Int64N(attemptBlock-1) // no attempt's: IDs begin at the first block's end
	}
	d.finished[id] = true
	d.did = append(d.did, fmt.Sprint("end ", id))
	return tx.FinishAttempt(id, ledger.Confirmed, reason.Reason{}, 200, fromMicros(now), fromMicros(now))
}

// reserve records a lease of a few slots at at, in flight until lease;
// of a few dozen on a busy key whose pipeline read all its calls in
// flight.
func (d *pipelineDiff) reserve(tx *Tx, now, at, lease int64) error {
	n := 1 + d.rng.IntN(6)
	if !d.quiet() && tx.pg.read.flightAll <= pgFlightRead+16 {
		n = 20 + d.rng.IntN(40)
	}
	first, last, err := tx.Reserve(d.key, n, fromMicros(at), fromMicros(lease))
	if err != nil {
		return err
	}
	d.leases = append(d.leases, diffLease{first: first, last: last})
	for id := first; id <= last; id++ {
		d.ids = append(d.ids, id)
		d.ats = append(d.ats, at)
	}
	d.latest = max(d.latest, at)
	d.did = append(d.did, fmt.Sprintf("reserve %d…%d at %+dµs", first, last, at-now))
	return nil
}

// release gives back some slots of a lease none of whose slots was
// released or ended: all, the first few, or the last few.
func (d *pipelineDiff) release(tx *Tx) error {
	var open []int
	for i, l := range d.leases {
		ended := false
		for id := l.first; id <= l.last; id++ {
			ended = ended || d.finished[id]
		}
		if !l.done && !ended {
			open = append(open, i)
		}
	}
	if len(open) == 0 {
		return nil
	}
	l := &d.leases[open[d.rng.IntN(len(open))]]
	l.done = true
	first, last := l.first, l.last
	switch d.rng.IntN(3) {
	case 1:
		last = first + d.rng.Int64N(last-first+1)
	case 2:
		first = last - d.rng.Int64N(last-first+1)
	}
	d.did = append(d.did, fmt.Sprintf("release %d…%d", first, last))
	return tx.Release(d.key, first, last)
}

// perturbHints changes the process's hints before some transactions, as
// other transactions on the key could: a window start noted from a little
// after the clock to seconds before it, or at an admission of the log;
// the latest admissions read many; or none, as a process that just
// started has.
func (d *pipelineDiff) perturbHints() {
	now := micros(d.pg.Now())
	switch r := d.rng.IntN(14); {
	case r == 5:
		d.pg.hints.mu.Lock()
		delete(d.pg.hints.back, d.key)
		d.pg.hints.mu.Unlock()
	case r == 0:
		d.pg.hints.noteStart(d.key, d.rng.Int64N(3000)-3000)
	case r == 1:
		d.pg.hints.noteStart(d.key, d.rng.Int64N(50_000))
	case r == 2:
		d.pg.hints.noteStart(d.key, d.rng.Int64N(6e6))
	case r == 3 && len(d.ats) > 0:
		d.pg.hints.noteStart(d.key, now-d.ats[d.rng.IntN(len(d.ats))])
	case r == 4:
		d.pg.hints.noteLatest(d.key, pgFirstSend{seq: 1, last: pgLatestFew + 1 + d.rng.Int64N(pgLatestMany-pgLatestFew), ok: true})
	}
}

// A diffSince is a time a window's read begins after: what it is, and
// its offset from it, in microseconds.
type diffSince struct {
	what   string
	at, by int64
}

func (s diffSince) since() int64 { return s.at + s.by }

func (s diffSince) String() string { return fmt.Sprintf("%s %+dµs (%d)", s.what, s.by, s.since()) }

// sinces returns the times the transaction's reads of a window begin
// after, a few of: zero; the latest admission's, and others of the log;
// the admissions the pipeline read in each of its ranges, and where each
// began; the window starts the hints hold, and the ranges they make; those the transaction
// read before; times after the clock, and in the last seconds before it;
// each give or take a microsecond.
func (d *pipelineDiff) sinces(r *pgRead, now int64) []diffSince {
	var all []diffSince
	add := func(what string, at int64) {
		for by := int64(-1); by <= 1; by++ {
			all = append(all, diffSince{what, at, by})
		}
	}
	all = append(all, diffSince{what: "zero"})
	add("the latest admission", d.latest)
	for range 3 {
		if len(d.ats) > 0 {
			add("an admission", d.ats[d.rng.IntN(len(d.ats))])
		}
	}
	if len(r.latest) > 0 {
		add("the oldest of the latest read", r.latest[0].at)
		add("one of the latest read", r.latest[d.rng.IntN(len(r.latest))].at)
	}
	for _, read := range r.sends {
		add("the start of a range of admissions read", read.after)
		if len(read.sends) > 0 {
			add("one of a range of admissions read", read.sends[d.rng.IntN(len(read.sends))].at)
			add("the last of a range of admissions read", read.sends[len(read.sends)-1].at)
		}
	}
	for _, rg := range d.pg.hints.sendsRanges(d.key) {
		add("the far end of a range the hints make", now-rg.after)
		add("the near end of a range the hints make", now-rg.until)
	}
	d.pg.hints.mu.Lock()
	if h := d.pg.hints.back[d.key]; h != nil && h.n > 0 {
		add("a window start the hints hold", now-h.back[d.rng.IntN(h.n)])
	}
	d.pg.hints.mu.Unlock()
	if len(r.windows) > 0 {
		read := slices.Sorted(maps.Keys(r.windows))
		add("a time read before", read[d.rng.IntN(len(read))])
	}
	add("after the clock", now+1+d.rng.Int64N(5e6))
	add("before the clock", now-d.rng.Int64N(25e6))
	picked := make([]diffSince, 6)
	for i := range picked {
		picked[i] = all[d.rng.IntN(len(all))]
	}
	return picked
}

// compareAll compares the transaction's reads of the key's log with the
// server's answers: the windows after a few times, the latest admission,
// and the calls in flight without a few sets of ended attempts.
func (d *pipelineDiff) compareAll(tx *Tx, clock time.Time) error {
	r := tx.pg.read
	for _, s := range d.sinces(r, micros(clock)) {
		var err error
		if d.rng.IntN(3) == 0 {
			err = d.compareWindow(tx, s)
		} else {
			err = d.compareFirst(tx, s)
		}
		if err != nil {
			return err
		}
	}
	if err := d.compareLast(tx); err != nil {
		return err
	}
	if err := d.compareTxFlight(tx, clock); err != nil {
		return err
	}
	for range 3 {
		if err := d.compareFlight(tx, clock, d.ended(r)); err != nil {
			return err
		}
	}
	return nil
}

// ended returns a set of attempts whose ends the journal could hold: none;
// some the pipeline read in flight (the last of them among them); some the
// transaction recorded; any the walk recorded; one twice; one that never
// was.
func (d *pipelineDiff) ended(r *pgRead) []int64 {
	var ids []int64
	for range 1 + d.rng.IntN(3) {
		switch c := d.rng.IntN(12); {
		case c < 1:
		case c < 4 && len(r.flight) > 0:
			ids = append(ids, r.flight[d.rng.IntN(len(r.flight))].id)
		case c < 5 && len(r.flight) > 0:
			ids = append(ids, r.flight[len(r.flight)-1].id)
		case c < 7 && len(r.ownFlight) > 0:
			ids = append(ids, r.ownFlight[d.rng.IntN(len(r.ownFlight))].id)
		case c < 9 && len(d.ids) > 0:
			ids = append(ids, d.ids[d.rng.IntN(len(d.ids))])
		case c < 10 && len(ids) > 0:
			ids = append(ids, ids[0])
		default:
			ids = append(ids, 1+d.rng.Int64N(attemptBlock-1))
		}
	}
	return ids
}

// count counts a read of kind what, answered by the pipeline or not.
func (d *pipelineDiff) count(what string, answered bool) {
	r := d.reads[what]
	if r == nil {
		r = &diffReads{}
		d.reads[what] = r
	}
	r.compared++
	if answered {
		r.answered++
	}
}

// differ records the first read the pipeline and the server answered
// differently, with the seed, the transaction and the latest things it
// did, and returns it.
func (d *pipelineDiff) differ(what string, pipeline, server any) error {
	const shown = 12 // of the latest things done
	did := "nothing yet"
	switch {
	case len(d.did) > shown:
		did = fmt.Sprintf("%d more, then ", len(d.did)-shown) + strings.Join(d.did[len(d.did)-shown:], "; ")
	case len(d.did) > 0:
		did = strings.Join(d.did, "; ")
	}
	d.mismatch = fmt.Errorf("seed %d, %s (after: %s): %s: the pipeline answered %+v, the server %+v",
		d.seed, d.txn, did, what, pipeline, server)
	return d.mismatch
}

// serverFirst asks the server for the key's first admission after since
// (qFirstSend), in the transaction.
func (d *pipelineDiff) serverFirst(tx *Tx, since int64) (pgFirstSend, error) {
	var w pgFirstSend
	err := tx.pg.queryRow(tx.ctx, queries[qFirstSend].postgres, d.key, since).Scan(&w.seq, &w.at, &w.last)
	if errors.Is(err, sql.ErrNoRows) {
		return pgFirstSend{}, nil
	}
	w.ok = err == nil && w.last > 0
	return w, err
}

// compareFirst reads the key's first admission after s as Tx does:
// from the pipeline when it answers, and then compares it with the
// server's; from the server otherwise, kept for the transaction's later
// reads.
func (d *pipelineDiff) compareFirst(tx *Tx, s diffSince) error {
	got, answered := tx.pg.readFirstSend(d.key, s.since())
	want, err := d.serverFirst(tx, s.since())
	if err != nil {
		return err
	}
	d.count(diffFirst, answered)
	if !answered {
		tx.pg.keepFirstSend(d.key, s.since(), want)
	} else if got != want {
		return d.differ("the first admission after "+s.String(), got, want)
	}
	return nil
}

// compareWindow compares Tx.Window after s with the window the server's
// first admission after s makes; the pipeline answered it when it cost no
// round trip.
func (d *pipelineDiff) compareWindow(tx *Tx, s diffSince) error {
	before := d.trips.n.Load()
	got, err := tx.Window(d.key, fromMicros(s.since()))
	if err != nil {
		return err
	}
	answered := d.trips.n.Load() == before
	w, err := d.serverFirst(tx, s.since())
	if err != nil {
		return err
	}
	var want ledger.Window
	if w.ok {
		want = ledger.Window{Count: int(w.last - w.seq + 1), Oldest: fromMicros(w.at)}
	}
	d.count(diffWindow, answered)
	if got.Count != want.Count || !got.Oldest.Equal(want.Oldest) {
		return d.differ(fmt.Sprintf("the window after %s (answered from the pipeline: %v)", s, answered), got, want)
	}
	return nil
}

// compareLast compares the key's latest admission, as the pipeline
// answers it, with the server's (qLastSend).
func (d *pipelineDiff) compareLast(tx *Tx) error {
	type last struct {
		seq, at, bytes int64
		found          bool
	}
	var got last
	var answered bool
	got.seq, got.at, got.bytes, got.found, answered = tx.pg.readLastSend(d.key)
	var want last
	err := tx.pg.queryRow(tx.ctx, queries[qLastSend].postgres, d.key).Scan(&want.seq, &want.at, &want.bytes)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	want.found = err == nil
	d.count(diffLast, answered)
	if answered && got != want {
		return d.differ("the latest admission", got, want)
	}
	return nil
}

// serverFlight asks the server for the key's calls in flight at now
// without ended (qInFlightExcept), in the transaction.
func (d *pipelineDiff) serverFlight(tx *Tx, now time.Time, ended []int64) (ledger.Flight, error) {
	var f ledger.Flight
	var oldest int64
	err := tx.pg.queryRow(tx.ctx, queries[qInFlightExcept].postgres, d.key, micros(now), append([]int64{}, ended...)).Scan(&f.Count, &oldest)
	f.Oldest = fromMicros(oldest)
	return f, err
}

// compareFlight compares the key's calls in flight at now without ended,
// as the pipeline answers them, with the server's.
func (d *pipelineDiff) compareFlight(tx *Tx, now time.Time, ended []int64) error {
	got, answered := tx.pg.readFlight(d.key, now, ended)
	want, err := d.serverFlight(tx, now, ended)
	if err != nil {
		return err
	}
	d.count(diffFlight, answered)
	if answered && (got.Count != want.Count || !got.Oldest.Equal(want.Oldest)) {
		return d.differ(fmt.Sprintf("the calls in flight without %v", ended), got, want)
	}
	return nil
}

// compareTxFlight compares Tx.Flight at now (the journal holds no ends)
// with the server's count; the pipeline answered it when it cost no round
// trip.
func (d *pipelineDiff) compareTxFlight(tx *Tx, now time.Time) error {
	before := d.trips.n.Load()
	got, err := tx.Flight(d.key, now)
	if err != nil {
		return err
	}
	answered := d.trips.n.Load() == before
	want, err := d.serverFlight(tx, now, nil)
	if err != nil {
		return err
	}
	d.count(diffTxFlight, answered)
	if got.Count != want.Count || !got.Oldest.Equal(want.Oldest) {
		return d.differ(fmt.Sprintf("Tx.Flight (answered from the pipeline: %v)", answered), got, want)
	}
	return nil
}
