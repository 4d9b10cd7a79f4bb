package state

import (
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// A transaction on PostgreSQL that holds one key (an admission, an
// answer's record) reads, before anything else, what a decision about the
// key needs: its pacing state, its policies, its closed gates, its calls in
// flight, its latest admissions, and its admissions around where its
// windows begin (see windowHints), from which the counts of its windows
// are answered. Those reads are sent with the transaction's BEGIN and the
// lock of the key's row in one pipeline — one round trip to the server
// instead of eight and more — and the transaction's reads of them are
// answered from what came back, until the transaction writes anything
// that could change them (its own attempts, the policies it puts and the
// ends of attempts it records are kept in them instead). The pipeline
// also takes a block of IDs for the attempts the transaction may record,
// whose INSERTs then wait for the COMMIT, with the other writes whose
// answer it does not need (see pipeline_postgres.go).
//
// Each statement of the pipeline runs after the one before it has
// finished, on a snapshot of its own (the transaction is READ COMMITTED):
// every read sees what was committed once the key's row was locked, as the
// same reads sent one by one would. The reads that depend on the time take
// the transaction's clock from the lock's statement, which sets it as a
// setting local to the transaction.

// pgHoldReading locks key's row ($1) and reads the server's clock once
// the row is locked (see qHoldKey), keeping the clock, in microseconds,
// for the pipeline's later statements; and the statement's start, before
// any wait for the lock (see clockOffset).
const pgHoldReading = `SELECT c, set_config('mcp_quota.now', (extract(epoch FROM c) * 1000000)::bigint::text, true), statement_timestamp()
	FROM (SELECT clock_timestamp() AS c FROM (SELECT key FROM keys WHERE key = $1 FOR UPDATE) AS held) AS t`

// pgNow is the transaction's clock that pgHoldReading kept, in
// microseconds, in place of a parameter.
const pgNow = `nullif(current_setting('mcp_quota.now', true), '')::bigint` // NULL when the key had no row

// The reads of the pipeline: the statements the transaction would run
// otherwise, with the clock taken from pgNow.
var (
	pgReadKeyState     = queries[qKeyState].postgres
	pgReadSeenPolicies = queries[qSeenPolicies].postgres
	pgReadGates        = withNow(queries[qGates].postgres)
	// pgReadLatest reads a key's latest pgLatestFew or pgLatestMany
	// admissions (see windowHints.latestRead).
	pgReadLatest = map[int]string{
		pgLatestFew:  latestSends(queries[qLastSend].postgres, pgLatestFew),
		pgLatestMany: latestSends(queries[qLastSend].postgres, pgLatestMany),
	}
)

// withNow returns text with its time parameter ($2) read from pgNow.
func withNow(text string) string {
	if strings.Count(text, "$2") != 1 {
		panic("state: a read of the admission's pipeline lost its time parameter: " + text)
	}
	return strings.Replace(text, "$2", pgNow, 1)
}

// pgTracer, when not nil, traces the connections of the Postgres opened
// next (a test's count of round trips).
var pgTracer pgx.QueryTracer

// pgRead is what the pipeline read of the key a transaction holds.
type pgRead struct {
	key   string
	now   int64 // the transaction's clock, in microseconds
	ks    ledger.KeyState
	known []ledger.SeenPolicy
	gates []ledger.Gate
	// flight are the key's earliest calls in flight (pgReadFlight), of
	// flightAll in all; ownFlight those the transaction recorded.
	flight    []attemptAt
	flightAll int
	ownFlight []attemptAt
	// The key's latest admission (qLastSend); hasLast is false when the
	// key has none.
	lastSeq, lastAt, lastBytes int64
	hasLast                    bool
	// windows are the key's window counts the transaction read (qFirstSend),
	// by the start of their window, in microseconds.
	windows map[int64]pgFirstSend
	// sends are the key's admissions read around where its windows begin
	// (pgReadSends), a read a range (see sendsRanges).
	sends []sendsRead
	// latest are the key's latest admissions (pgReadLatest), at most
	// latestRead of them, in the log's order; allLatest says they are all
	// of them.
	latest     []pgSend
	latestRead int
	allLatest  bool
	// Which of them still hold: the transaction wrote nothing that could
	// change them since, but the attempts it recorded itself, which it
	// counted in them (see ownAttempt).
	hasSeenPolicies, hasGates, hasFlight, hasLastSend bool
}

// holdReading locks key's row, as hold does, and reads what a decision
// about the key needs in the same round trip (see pgRead), with BEGIN
// when it has not gone yet.
func (p *pgTx) holdReading(tx *Tx, key string) error {
	if p.conn == nil || p.held[key] {
		return p.hold(tx, key)
	}
	before := p.db.local()
	r, started, server, found, err := p.pipeline(tx, key)
	if err == nil && !found { // a key seen for the first time: add its row
		if _, err = p.exec(tx.ctx, qAddKey, key); err == nil {
			before = p.db.local() // the reading's round trip alone
			r, started, server, found, err = p.pipeline(tx, key)
		}
		if err == nil && !found {
			err = sql.ErrNoRows
		}
	}
	if err != nil {
		return fmt.Errorf("state: hold key %s: %w", key, err)
	}
	p.noteHeld(key, before, started, server)
	p.keepKeyState(r.ks, false)
	p.read = r
	return nil
}

// pipeline sends the lock of key's row and the reads, and reads their
// answers (started and server: the lock's statement began, and the row
// was locked, on the server's clock); found is false when the key has no
// row.
func (p *pgTx) pipeline(tx *Tx, key string) (r *pgRead, started, server time.Time, found bool, err error) {
	r = &pgRead{key: key, hasSeenPolicies: true, hasGates: true, hasFlight: true, hasLastSend: true}
	err = p.onConn(func(c *pgx.Conn) error {
		b := p.batch() // BEGIN, when it has not gone
		b.Queue(pgHoldReading, key)
		b.Queue(pgNextAttemptID)
		b.Queue(pgReadKeyState, key)
		b.Queue(pgReadSeenPolicies, key)
		b.Queue(pgReadGates, key)
		b.Queue(pgReadFlight, key)
		r.latestRead = p.db.hints.latestRead(key)
		b.Queue(pgReadLatest[r.latestRead], key)
		ranges := p.db.hints.sendsRanges(key)
		for _, rg := range ranges {
			b.Queue(pgReadSends, key, rg.after, rg.until, pgSendsRead)
		}
		br := c.SendBatch(tx.ctx, b)
		defer br.Close()
		if err := p.readWaiting(br); err != nil {
			return err
		}
		var setting string
		if err := br.QueryRow().Scan(&server, &setting, &started); errors.Is(err, pgx.ErrNoRows) {
			return nil // the reads ran on a row not locked: not kept
		} else if err != nil {
			return err
		}
		found = true
		if err := br.QueryRow().Scan(&p.nextID); err != nil {
			return fmt.Errorf("the next attempt's ID: %w", err)
		}
		now, err := strconv.ParseInt(setting, 10, 64)
		if err != nil {
			return fmt.Errorf("the clock kept as %q: %w", setting, err)
		}
		r.now = now
		if err := r.scanKeyState(br); err != nil {
			return err
		}
		if err := r.scanSeenPolicies(br); err != nil {
			return err
		}
		if err := r.scanGates(br); err != nil {
			return err
		}
		err = eachRow(br, "in flight", func(rows pgx.Rows) error {
			var a attemptAt
			err := rows.Scan(&a.id, &a.at, &r.flightAll)
			r.flight = append(r.flight, a)
			return err
		})
		if err != nil {
			return err
		}
		if err := r.scanLatest(br); err != nil {
			return err
		}
		for _, rg := range ranges {
			if err := r.scanSends(br, rg); err != nil {
				return err
			}
		}
		return br.Close()
	})
	return r, started, server, found, err
}

// scanKeyState reads the key's pacing state, as KeyState would.
func (r *pgRead) scanKeyState(br pgx.BatchResults) error {
	s := ledger.KeyState{Key: r.key}
	var last, interval, resp, probeUntil, lat, prevLat, latSince int64
	var halfOpen bool
	err := br.QueryRow().Scan(&last, &interval, &resp, &s.Failures, &s.Opens, &halfOpen, &s.ProbeAttempt, &probeUntil,
		&lat, &prevLat, &latSince)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return fmt.Errorf("key state: %w", err)
	default:
		s.HalfOpen = halfOpen
		s.LastAdmitAt, s.LastResponseAt, s.ProbeUntil = fromMicros(last), fromMicros(resp), fromMicros(probeUntil)
		s.Interval = time.Duration(interval) * time.Microsecond
		s.Latency, s.PrevLatency = time.Duration(lat)*time.Microsecond, time.Duration(prevLat)*time.Microsecond
		s.LatencySince = fromMicros(latSince)
	}
	r.ks = s
	return nil
}

// eachRow reads the rows of the pipeline's next statement with row; what
// is what they are, for its error.
func eachRow(br pgx.BatchResults, what string, row func(pgx.Rows) error) error {
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := row(rows); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	return rows.Err()
}

// scanSeenPolicies reads the key's policies, as SeenPolicies would.
func (r *pgRead) scanSeenPolicies(br pgx.BatchResults) error {
	return eachRow(br, "policies", func(rows pgx.Rows) error {
		k, err := scanSeenPolicyRow(rows.Scan, r.key)
		r.known = append(r.known, k)
		return err
	})
}

// scanSeenPolicyRow reads one policy of key from a row of qSeenPolicies's columns.
func scanSeenPolicyRow(scan func(...any) error, key string) (ledger.SeenPolicy, error) {
	k := ledger.SeenPolicy{Key: key}
	var q, w, rem, t sql.NullInt64
	var recv, basis int64
	var hidden bool
	var unit, shape string
	if err := scan(&k.Policy, &unit, &k.Partition, &q, &w, &rem, &t, &recv, &basis, &shape, &hidden, &k.Route); err != nil {
		return k, err
	}
	k.Unit, k.Shape, k.Hidden = ratelimit.Unit(unit), ratelimit.Shape(shape), hidden
	k.Quota, k.HasQuota = q.Int64, q.Valid
	k.Window = time.Duration(w.Int64) * time.Microsecond
	k.Remaining, k.HasRemaining = rem.Int64, rem.Valid
	k.Reset, k.HasReset = time.Duration(t.Int64)*time.Microsecond, t.Valid
	k.ReceivedAt, k.BasisAt = fromMicros(recv), fromMicros(basis)
	return k, nil
}

// putSeenPolicy records k, with args qPutSeenPolicy's arguments, when the
// pipeline read the key's policies and k's among them: the policy as the
// statement records it (see mergePolicyArgs) replaces the one read, which
// then still holds, and the statement waits to go with the transaction's
// next round trip. It reports whether it did; otherwise nothing ran.
func (p *pgTx) putSeenPolicy(k ledger.SeenPolicy, args []any) (bool, error) {
	r := p.readFor(k.Key)
	if r == nil || !r.hasSeenPolicies {
		return false, nil
	}
	i := slices.IndexFunc(r.known, func(kn ledger.SeenPolicy) bool {
		return kn.Policy == k.Policy && kn.Unit == k.Unit && kn.Partition == k.Partition
	})
	if i < 0 {
		return false, nil // a new policy: its place among them is the server's order
	}
	merged := mergePolicyArgs(seenPolicyArgs(r.known[i]), args)
	got, err := scanSeenPolicyRow(scanArgs(merged[1:]), k.Key)
	if err != nil {
		return true, fmt.Errorf("state: record policy: %w", err)
	}
	r.known[i] = got
	p.queue("record policy", queries[qPutSeenPolicy].postgres, args...)
	return true, nil
}

// mergePolicyArgs returns the row qPutSeenPolicy leaves, in its
// arguments' order, when it puts put on the row held: its ON CONFLICT
// clause, column by column.
func mergePolicyArgs(held, put []any) []any {
	const q, w, r, t, received, basis, route, hidden = 4, 5, 6, 7, 8, 9, 12, 11
	m := slices.Clone(put)
	for _, c := range []int{q, w} {
		if m[c] == nil {
			m[c] = held[c]
		}
	}
	if put[r] == nil {
		m[r], m[t] = held[r], held[t]
		if !put[hidden].(bool) {
			m[received], m[basis], m[route] = held[received], held[basis], held[route]
		}
	}
	return m
}

// scanArgs returns a scan of a row whose columns are values, each a
// string, an int64, a bool, or nil for NULL.
func scanArgs(values []any) func(dest ...any) error {
	return func(dest ...any) error {
		if len(dest) != len(values) {
			return fmt.Errorf("%d columns for %d values", len(dest), len(values))
		}
		for i, v := range values {
			switch d := dest[i].(type) {
			case *string:
				*d = v.(string)
			case *int64:
				*d = v.(int64)
			case *bool:
				*d = v.(bool)
			case *sql.NullInt64:
				*d = sql.NullInt64{}
				if v != nil {
					*d = sql.NullInt64{Int64: v.(int64), Valid: true}
				}
			default:
				return fmt.Errorf("column %d: cannot scan into %T", i, dest[i])
			}
		}
		return nil
	}
}

// scanGates reads the key's gates closed at the transaction's clock, as
// Gates would.
func (r *pgRead) scanGates(br pgx.BatchResults) error {
	return eachRow(br, "gates", func(rows pgx.Rows) error {
		g := ledger.Gate{Key: r.key}
		var until, set int64
		var said string
		var why sql.NullString
		err := rows.Scan(&g.Scope, &until, &said, &why, &g.Source, &set)
		if err == nil {
			g.Reason, err = readWhy(why, said)
		}
		g.Until, g.SetAt = fromMicros(until), fromMicros(set)
		r.gates = append(r.gates, g)
		return err
	})
}

// ran notes that the transaction ran q: a statement that may write drops
// what the pipeline read of the tables it names, which the reads that
// follow then ask the server again.
func (p *pgTx) ran(q query) {
	if p == nil || p.read == nil {
		return
	}
	if text := strings.TrimSpace(queries[q].postgres); !strings.HasPrefix(text, "SELECT") {
		p.wrote(text)
	}
}

// wrote drops what the pipeline read of the tables that the statement
// text names.
func (p *pgTx) wrote(text string) {
	if p == nil || p.read == nil {
		return
	}
	r := p.read
	r.hasSeenPolicies = r.hasSeenPolicies && !strings.Contains(text, "policies")
	r.hasGates = r.hasGates && !strings.Contains(text, "gates")
	if strings.Contains(text, "attempts") {
		r.hasFlight, r.hasLastSend, r.windows = false, false, nil
	}
}

// readFor returns what the pipeline read of key, while it holds.
func (p *pgTx) readFor(key string) *pgRead {
	if p == nil || p.read == nil || p.read.key != key {
		return nil
	}
	return p.read
}

// readSeenPolicies answers SeenPolicies from the pipeline's read, when it holds.
func (p *pgTx) readSeenPolicies(key string) ([]ledger.SeenPolicy, bool) {
	r := p.readFor(key)
	if r == nil || !r.hasSeenPolicies {
		return nil, false
	}
	return slices.Clone(r.known), true
}

// readGates answers Gates at now from the pipeline's read, when it holds
// and was read at now or before: the gates closed at a later time are
// those of the read that close after it.
func (p *pgTx) readGates(key string, now time.Time) ([]ledger.Gate, bool) {
	r := p.readFor(key)
	if r == nil || !r.hasGates || micros(now) < r.now {
		return nil, false
	}
	var gates []ledger.Gate
	for _, g := range r.gates {
		if micros(g.Until) > micros(now) {
			gates = append(gates, g)
		}
	}
	return gates, true
}
