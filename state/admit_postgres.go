package state

import (
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// A transaction on PostgreSQL that holds one key (an admission, an
// answer's record) reads, before anything else, what a decision about the
// key needs: its pacing state, its policies, its closed gates, its calls in
// flight and its latest admission. Those reads are sent with the
// transaction's BEGIN and the lock of the key's row in one pipeline — one
// round trip to the server instead of seven — and the transaction's reads
// of them are answered from what came back, until the transaction writes
// anything that could change them. The pipeline also takes a block of IDs
// for the attempts the transaction may record, whose INSERTs then wait for
// the COMMIT (see pipeline_postgres.go).
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
	pgReadFlight       = strings.Replace(withNow(queries[qInFlightExcept].postgres), "$3", "$2", 1) // the IDs the journal holds
	pgReadLastSend     = queries[qLastSend].postgres
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
	key    string
	now    int64 // the transaction's clock, in microseconds
	ks     ledger.KeyState
	known  []ledger.SeenPolicy
	gates  []ledger.Gate
	ended  []int64 // the attempts the journal held the end of, not counted in flight
	flight ledger.Flight
	// The key's latest admission (qLastSend); hasLast is false when the
	// key has none.
	lastSeq, lastAt, lastBytes int64
	hasLast                    bool
	// windows are the key's window counts the transaction read (qFirstSend),
	// by the start of their window, in microseconds.
	windows map[int64]pgFirstSend
	// Which of them still hold: the transaction wrote nothing that could
	// change them since, but the attempts it recorded itself, which it
	// counted in them (see ownAttempt).
	hasSeenPolicies, hasGates, hasFlight, hasLastSend bool
}

// A pgFirstSend is what qFirstSend read: the number and time of the key's
// first admission after a time and the number of its last; ok is false
// when it has none after that time.
type pgFirstSend struct {
	seq, at, last int64
	ok            bool
}

// holdReading locks key's row, as hold does, and reads what a decision
// about the key needs in the same round trip (see pgRead), with BEGIN
// when it has not gone yet.
func (p *pgTx) holdReading(tx *Tx, key string) error {
	if p.conn == nil || p.held[key] {
		return p.hold(tx, key)
	}
	ended := tx.out.ended(key)
	if ended == nil {
		ended = []int64{}
	}
	before := p.db.local()
	r, started, server, found, err := p.pipeline(tx, key, ended)
	if err == nil && !found { // a key seen for the first time: add its row
		if _, err = p.exec(tx.ctx, qAddKey, key); err == nil {
			before = p.db.local() // the reading's round trip alone
			r, started, server, found, err = p.pipeline(tx, key, ended)
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
func (p *pgTx) pipeline(tx *Tx, key string, ended []int64) (r *pgRead, started, server time.Time, found bool, err error) {
	r = &pgRead{key: key, ended: ended, hasSeenPolicies: true, hasGates: true, hasFlight: true, hasLastSend: true}
	err = p.onConn(func(c *pgx.Conn) error {
		b := p.batch() // BEGIN, when it has not gone
		b.Queue(pgHoldReading, key)
		b.Queue(pgNextAttemptID)
		b.Queue(pgReadKeyState, key)
		b.Queue(pgReadSeenPolicies, key)
		b.Queue(pgReadGates, key)
		b.Queue(pgReadFlight, key, ended)
		b.Queue(pgReadLastSend, key)
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
		if _, err := fmt.Sscan(setting, &r.now); err != nil {
			return fmt.Errorf("the clock kept as %q: %w", setting, err)
		}
		if err := r.scanKeyState(br); err != nil {
			return err
		}
		if err := r.scanSeenPolicies(br); err != nil {
			return err
		}
		if err := r.scanGates(br); err != nil {
			return err
		}
		var oldest int64
		if err := br.QueryRow().Scan(&r.flight.Count, &oldest); err != nil {
			return fmt.Errorf("in flight: %w", err)
		}
		r.flight.Oldest = fromMicros(oldest)
		err := br.QueryRow().Scan(&r.lastSeq, &r.lastAt, &r.lastBytes)
		if r.hasLast = err == nil; err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("latest admission: %w", err)
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

// scanSeenPolicies reads the key's policies, as SeenPolicies would.
func (r *pgRead) scanSeenPolicies(br pgx.BatchResults) error {
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("policies: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		k, err := scanSeenPolicyRow(rows.Scan, r.key)
		if err != nil {
			return fmt.Errorf("policies: %w", err)
		}
		r.known = append(r.known, k)
	}
	return rows.Err()
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

// pgPutSeenPolicyReturning is PutSeenPolicy's statement giving back the policy as
// it recorded it, in qSeenPolicies's columns.
var pgPutSeenPolicyReturning = queries[qPutSeenPolicy].postgres + "\n\tRETURNING " + knownColumns()

// knownColumns are the columns qSeenPolicies reads.
func knownColumns() string {
	text := queries[qSeenPolicies].postgres
	from := strings.Index(text, " FROM policies")
	if !strings.HasPrefix(text, "SELECT ") || from < 0 {
		panic("state: qSeenPolicies is not a SELECT … FROM policies: " + text)
	}
	return text[len("SELECT "):from]
}

// putSeenPolicy records k, with args qPutSeenPolicy's arguments, when the pipeline
// read the key's policies and k's among them: the policy as recorded
// replaces the one read, which then still holds. It reports whether it
// did (err is then the statement's); otherwise nothing ran.
func (p *pgTx) putSeenPolicy(tx *Tx, k ledger.SeenPolicy, args []any) (bool, error) {
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
	got, err := scanSeenPolicyRow(p.queryRow(tx.ctx, pgPutSeenPolicyReturning, args...).Scan, k.Key)
	if err != nil {
		p.wrote("policies")
		return true, fmt.Errorf("state: record policy: %w", err)
	}
	r.known[i] = got
	return true, nil
}

// scanGates reads the key's gates closed at the transaction's clock, as
// Gates would.
func (r *pgRead) scanGates(br pgx.BatchResults) error {
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("gates: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		g := ledger.Gate{Key: r.key}
		var until, set int64
		var said string
		var why sql.NullString
		if err := rows.Scan(&g.Scope, &until, &said, &why, &g.Source, &set); err != nil {
			return fmt.Errorf("gates: %w", err)
		}
		if g.Reason, err = readWhy(why, said); err != nil {
			return err
		}
		g.Until, g.SetAt = fromMicros(until), fromMicros(set)
		r.gates = append(r.gates, g)
	}
	return rows.Err()
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

// An ownedAttempt is what the reads of the log need of an attempt the
// transaction records (see ownAttempt), computed by InsertAttempt.
type ownedAttempt struct {
	key     string
	counted bool  // admitted: counted in its key's windows from then on
	at      int64 // admitted at, in microseconds
	until   int64 // in flight until, in microseconds; 0 when never
	seq     int64 // its number in its key's log, when counted
	bytes   int64 // the bytes its key's log carried up to it, itself included, when counted
}

// ownAttempt updates what the transaction read of the log of the key it
// holds with a, an attempt it records itself, as the same reads sent
// again would find it: the attempts of a key are recorded only by a
// transaction that holds its row, so no other could have changed the
// log's end meanwhile. An admission becomes the key's latest (counted in
// every window it falls in); any attempt with a lease not run out counts
// in flight, admitted or not. The calls of a key decided together (see
// pacer/group.go) then cost the round trips of the first alone. An
// admission recorded before the key's latest, which renumbers the log,
// drops what was read instead.
func (p *pgTx) ownAttempt(a ownedAttempt) {
	r := p.readFor(a.key)
	if r == nil {
		p.wrote(pgInsertAttemptAs)
		return
	}
	if a.counted {
		if !r.hasLastSend || r.hasLast && a.at < r.lastAt {
			r.hasFlight, r.hasLastSend, r.windows = false, false, nil
			return
		}
		r.lastSeq, r.lastAt, r.lastBytes, r.hasLast = a.seq, a.at, a.bytes, true
		for since, w := range r.windows {
			if w.ok {
				w.last = a.seq
			} else if a.at > since {
				w = pgFirstSend{seq: a.seq, at: a.at, last: a.seq, ok: true}
			}
			r.windows[since] = w
		}
	}
	if a.until > r.now && r.hasFlight {
		if r.flight.Count == 0 || fromMicros(a.at).Before(r.flight.Oldest) {
			r.flight.Oldest = fromMicros(a.at)
		}
		r.flight.Count++
	}
}

// readFirstSend answers qFirstSend of key after since from what the
// transaction read, when it holds.
func (p *pgTx) readFirstSend(key string, since int64) (pgFirstSend, bool) {
	r := p.readFor(key)
	if r == nil || !r.hasLastSend {
		return pgFirstSend{}, false
	}
	w, ok := r.windows[since]
	return w, ok
}

// keepFirstSend keeps what qFirstSend read of key after since, for the
// transaction's later reads of it (see readFirstSend).
func (p *pgTx) keepFirstSend(key string, since int64, w pgFirstSend) {
	r := p.readFor(key)
	if r == nil || !r.hasLastSend {
		return
	}
	if r.windows == nil {
		r.windows = map[int64]pgFirstSend{}
	}
	r.windows[since] = w
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
// and was read at now.
func (p *pgTx) readGates(key string, now time.Time) ([]ledger.Gate, bool) {
	r := p.readFor(key)
	if r == nil || !r.hasGates || micros(now) != r.now {
		return nil, false
	}
	return slices.Clone(r.gates), true
}

// readFlight answers Flight at now from the pipeline's read, when it
// holds, was read at now, and the journal holds the end of the same
// attempts as then.
func (p *pgTx) readFlight(key string, now time.Time, ended []int64) (ledger.Flight, bool) {
	r := p.readFor(key)
	if r == nil || !r.hasFlight || micros(now) != r.now || !slices.Equal(r.ended, ended) {
		return ledger.Flight{}, false
	}
	return r.flight, true
}

// readLastSend answers the latest admission of key (qLastSend) from the
// pipeline's read, when it holds; found is false when there is none.
func (p *pgTx) readLastSend(key string) (seq, at, bytes int64, found, ok bool) {
	r := p.readFor(key)
	if r == nil || !r.hasLastSend {
		return 0, 0, 0, false, false
	}
	return r.lastSeq, r.lastAt, r.lastBytes, r.hasLast, true
}
