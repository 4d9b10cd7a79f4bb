package state

import (
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// What a transaction that holds a key reads of the key's log — its window
// counts (qFirstSend), its latest admission, its calls in flight — is
// answered from what the lock's pipeline read (see admit_postgres.go)
// wherever that shows the answer the statement would give with the row
// held, and kept up to date with the attempts the transaction records and
// ends itself (no other transaction records the key's attempts while it
// holds the row). Where it cannot show it, the server is asked.

// pgReadFlight reads the key's calls in flight at the transaction's
// clock, the journal's ended ones among them: the earliest pgFlightRead by
// admission, each with how many in all. The calls in flight without the
// ends the journal holds, which change while the transaction runs, are
// then counted from them (see pgRead.flightWithout).
var pgReadFlight = `SELECT id, at, count(*) OVER () FROM attempts
	WHERE key = $1 AND lease_until IS NOT NULL AND lease_until > ` + pgNow + `
	ORDER BY at, id LIMIT ` + strconv.Itoa(pgFlightRead)

// pgFlightRead is the most calls in flight pgReadFlight reads.
const pgFlightRead = 64

// An attemptAt is an attempt in flight: its ID and admission.
type attemptAt struct{ id, at int64 }

// How many of a key's latest admissions the pipeline reads
// (pgReadLatest): a window's count after a time since the oldest of them
// is answered from them — a short window's, and the count since the
// latest answer's basis, which an upstream's remaining is projected by.
// Most keys need a few; a busy key with a short window, or whose answers
// come late, many (see windowHints.latestRead). Each is a statement of
// its own, its limit a constant, so that each has a plan of its own.
const (
	pgLatestFew  = 8
	pgLatestMany = 64
)

// latestSends returns qLastSend reading the key's n latest admissions,
// the latest first.
func latestSends(text string, n int) string {
	if !strings.HasSuffix(text, " LIMIT 1") {
		panic("state: qLastSend does not end with LIMIT 1: " + text)
	}
	return strings.TrimSuffix(text, "1") + strconv.Itoa(n)
}

// pgReadSends reads the key's first admissions after a time, $2
// microseconds before the transaction's clock (see sendsRange), and up to
// $3 microseconds before it, in the log's order, at most $4 of them, and of
// those admitted at the same time (a lease's slots) the first alone; and
// the key's first admission after that range (its last column true): a
// window's count after a time between is then answered from them and the
// latest admission (see readFirstSend), without a round trip of its own.
// The range is short, the span over which the window's start moved
// lately (see sendsRange): a busy key's admissions over a window's whole
// length are more than the lock should wait for; the admission after it
// answers for a key called a few times a second, which seldom has one in
// the range.
var pgReadSends = `(SELECT DISTINCT ON (at) seq, at, false AS after FROM attempts
		WHERE key = $1 AND counted AND at > ` + pgNow + ` - $2 AND at <= ` + pgNow + ` - $3
		ORDER BY at, seq LIMIT $4)
	UNION ALL
	(SELECT seq, at, true FROM attempts WHERE key = $1 AND counted AND at > ` + pgNow + ` - $3
		ORDER BY at, seq LIMIT 1)
	ORDER BY at, seq`

// pgSendsRead is the most admissions pgReadSends reads in its range.
const pgSendsRead = 64

// A pgSend is an admission of the log: its number and time.
type pgSend struct{ seq, at int64 }

// A pgFirstSend is what qFirstSend read: the number and time of the key's
// first admission after a time and the number of its last; ok is false
// when it has none after that time.
type pgFirstSend struct {
	seq, at, last int64
	ok            bool
}

// scanLatest reads the key's latest admissions: the latest of all, and
// the others (see pgRead.latest).
func (r *pgRead) scanLatest(br pgx.BatchResults) error {
	err := eachRow(br, "latest admissions", func(rows pgx.Rows) error {
		var s pgSend
		var bytes int64
		if err := rows.Scan(&s.seq, &s.at, &bytes); err != nil {
			return err
		}
		if !r.hasLast {
			r.lastSeq, r.lastAt, r.lastBytes, r.hasLast = s.seq, s.at, bytes, true
		}
		r.latest = append(r.latest, s)
		return nil
	})
	slices.Reverse(r.latest)
	r.allLatest = len(r.latest) < r.latestRead
	return err
}

// A sendsRead is what pgReadSends read of one range: the key's first
// admissions after a time, in the log's order, every one of them up to
// the last.
type sendsRead struct {
	after int64 // the time, in microseconds
	sends []pgSend
}

// scanSends reads what pgReadSends read of rg: the admissions of its
// range and, when it read all of them (fewer than pgSendsRead), the first
// after it, which is then the next.
func (r *pgRead) scanSends(br pgx.BatchResults, rg sendsRange) error {
	read := sendsRead{after: r.now - rg.after}
	var next *pgSend
	err := eachRow(br, "admissions", func(rows pgx.Rows) error {
		var s pgSend
		var beyond bool
		err := rows.Scan(&s.seq, &s.at, &beyond)
		if beyond {
			next = &s
		} else {
			read.sends = append(read.sends, s)
		}
		return err
	})
	if next != nil && len(read.sends) < pgSendsRead {
		read.sends = append(read.sends, *next)
	}
	r.sends = append(r.sends, read)
	return err
}

// An ownedAttempt is what the reads of the log need of an attempt the
// transaction records (see ownAttempt), computed by InsertAttempt.
type ownedAttempt struct {
	id      int64
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
		r.latest = append(r.latest, pgSend{a.seq, a.at})
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
		r.ownFlight = append(r.ownFlight, attemptAt{a.id, a.at})
	}
}

// readFirstSend answers qFirstSend of key after since from what the
// transaction read, when it holds: a read after the same time; the key's
// latest admission, when it was not after since (then none is); a read
// after an earlier time whose first admission is after since too (then
// none came between, and it is the first after since as well); or the
// admissions the pipeline read, when they began before since and reach
// past it (they are all those up to the last of them), or are the latest
// since.
func (p *pgTx) readFirstSend(key string, since int64) (pgFirstSend, bool) {
	r := p.readFor(key)
	if r == nil || !r.hasLastSend {
		return pgFirstSend{}, false
	}
	if w, ok := r.windows[since]; ok {
		return w, true
	}
	if !r.hasLast || r.lastAt <= since {
		return pgFirstSend{}, true
	}
	for earlier, w := range r.windows {
		if earlier < since && w.ok && w.at > since {
			return w, true
		}
	}
	for _, read := range r.sends {
		if since < read.after {
			continue
		}
		if w, ok := r.firstAfter(read.sends, since); ok {
			p.db.hints.noteStart(key, r.now-since)
			return w, true
		}
	}
	// Any admission not among the latest is none after since.
	if len(r.latest) > 0 && (r.allLatest || since >= r.latest[0].at) {
		w, ok := r.firstAfter(r.latest, since)
		if ok {
			p.db.hints.noteLatest(key, w)
		}
		return w, ok
	}
	return pgFirstSend{}, false
}

// firstAfter returns the first of sends admitted after since, with the
// key's last admission; ok is false when none is.
func (r *pgRead) firstAfter(sends []pgSend, since int64) (w pgFirstSend, ok bool) {
	i := slices.IndexFunc(sends, func(s pgSend) bool { return s.at > since })
	if i < 0 {
		return pgFirstSend{}, false
	}
	return pgFirstSend{seq: sends[i].seq, at: sends[i].at, last: r.lastSeq, ok: true}, true
}

// keepFirstSend keeps what qFirstSend read of key after since, for the
// transaction's later reads of it (see readFirstSend).
func (p *pgTx) keepFirstSend(key string, since int64, w pgFirstSend) {
	r := p.readFor(key)
	if r == nil || !r.hasLastSend {
		return
	}
	p.db.hints.noteStart(key, r.now-since)
	p.db.hints.noteLatest(key, w)
	if r.windows == nil {
		r.windows = map[int64]pgFirstSend{}
	}
	r.windows[since] = w
}

// finished notes that the transaction ended attempt id (FinishAttempt):
// it is no longer in flight. Whether and when it was admitted, which the
// log's reads count, do not change.
func (p *pgTx) finished(id int64) {
	if p == nil || p.read == nil {
		return
	}
	r := p.read
	if i := slices.IndexFunc(r.flight, func(a attemptAt) bool { return a.id == id }); i >= 0 {
		r.flight, r.flightAll = slices.Delete(r.flight, i, i+1), r.flightAll-1
	} else if i := slices.IndexFunc(r.ownFlight, func(a attemptAt) bool { return a.id == id }); i >= 0 {
		r.ownFlight = slices.Delete(r.ownFlight, i, i+1)
	} else if len(r.flight) < r.flightAll {
		r.hasFlight = false // it may be in flight among those not read
	}
}

// readFlight answers Flight at now from the pipeline's read, when it
// holds and was read at now, without the attempts ended, whose ends the
// journal holds (see flightWithout).
func (p *pgTx) readFlight(key string, now time.Time, ended []int64) (ledger.Flight, bool) {
	r := p.readFor(key)
	if r == nil || !r.hasFlight || micros(now) != r.now {
		return ledger.Flight{}, false
	}
	return r.flightWithout(ended)
}

// flightWithout counts the key's calls in flight that the pipeline read
// and those the transaction recorded, but the attempts ended. The
// journal's ends change while the transaction runs (this process's calls
// end; its applier records ends): the pipeline read the calls in flight
// whatever the journal held, and leaves out the ones it holds now. When
// it read only the earliest, it answers only if every attempt ended is
// among them, and one that is not is still the earliest.
func (r *pgRead) flightWithout(ended []int64) (ledger.Flight, bool) {
	var f ledger.Flight
	var oldest int64
	n, without := r.flightAll, 0
	for _, a := range r.flight {
		if slices.Contains(ended, a.id) {
			without++
			continue
		}
		if oldest == 0 {
			oldest = a.at
		}
	}
	if len(r.flight) < r.flightAll && (without < len(ended) || oldest == 0) {
		return f, false
	}
	f.Count = n - without
	for _, a := range r.ownFlight {
		if slices.Contains(ended, a.id) { // as the server's count leaves it out
			continue
		}
		f.Count++
		if oldest == 0 || a.at < oldest {
			oldest = a.at
		}
	}
	f.Oldest = fromMicros(oldest)
	return f, true
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

// The pipeline that locks a key's row reads the key's admissions around
// where its windows begin (pgReadSends), as a hint from the process's
// earlier transactions on the key says: over the last backRecent window
// starts that its latest admissions did not show (those the pipeline's
// read answered, and those asked of the server), from the furthest back
// to the nearest of each group of starts close together (one a window of
// the key, give or take its margin), give or take a slack (sendsRanges),
// and the first after each. A window's start moves between two
// transactions with its margin (an answer's latency, the age of the
// oldest call in flight, up to a twentieth of the window): the 100-key benchmark's 10-s windows began 47
// to 504 ms beyond their length, and a range around the last miss alone,
// 5 ms on either side, missed two reads in three. A hint changes what is
// read with the lock, never what a read answers.
//
// The hints also say how many of its latest admissions the pipeline reads
// of a key (latestRead): pgLatestFew, unless one of the key's window
// counts began among its latest pgLatestMany but before its latest
// pgLatestFew in one of its last manyFor transactions here.
type windowHints struct {
	mu   sync.Mutex
	back map[string]*recentStarts
}

// backRecent is how many of a key's recent window starts the range of its
// next reads spans. With eight, a start beyond them left 12-13% of the
// 100-key benchmark's admissions to ask the server for a window's count;
// 32 cost the busy one-key cell nothing measurable
// (docs/benchmarks-log.md), and a key's ring 256 bytes.
const backRecent = 32

// recentStarts are how far back, in microseconds before the
// transaction's clock, a key's last window starts were: a ring, the
// latest at next-1.
type recentStarts struct {
	back    [backRecent]int64
	n, next int
	many    int // how many more of the key's pipelines read its latest pgLatestMany
}

// manyFor is how many of a key's transactions read its latest
// pgLatestMany admissions after one of its window counts needed more than
// pgLatestFew of them.
const manyFor = 64

// A sendsRange is a range of a key's admissions the pipeline reads: those
// admitted after the time `after` microseconds before the transaction's
// clock, up to the time `until` microseconds before it.
type sendsRange struct{ after, until int64 }

// maxSendsRanges is how many ranges the pipeline reads of a key at most:
// one a window of the key's policies, for a key with up to three windows
// (a per-second, a per-minute and an hourly one, say).
const maxSendsRanges = 3

// sendsRanges returns the ranges of key's admissions its pipeline reads,
// the furthest back first: one for each group of its recent window starts
// (see windowHints), a start that is more than a quarter nearer than the
// one before it beginning a new group, with a sixteenth of the group's
// furthest start, at most 5 ms, on either side (a busy leased key admits
// thousands a second, and each read stops at pgSendsRead of them). Past
// maxSendsRanges groups, the two nearest each other are read as one. A
// key's window starts where its margin moves it, by up to a twentieth of
// the window; two windows of a key differ by more. One range over the
// starts of two windows a few seconds apart held more admissions than a
// read takes, and never reached the nearer one.
func (h *windowHints) sendsRanges(key string) []sendsRange {
	h.mu.Lock()
	r := h.back[key]
	if r == nil || r.n == 0 { // none yet, or only a widened latest read (noteLatest)
		h.mu.Unlock()
		return nil
	}
	var backs [backRecent]int64
	n := copy(backs[:], r.back[:r.n])
	h.mu.Unlock()
	// A start at or after the clock needs no read: no admission is after
	// it (see readFirstSend).
	starts := slices.DeleteFunc(backs[:n], func(b int64) bool { return b <= 0 })
	slices.Sort(starts)
	var ranges []sendsRange // as far back as each group's furthest start (after) and nearest (until), before the slack
	for _, b := range slices.Backward(starts) {
		if last := len(ranges) - 1; last >= 0 && b >= ranges[last].until-ranges[last].until/4 {
			ranges[last].until = b
			continue
		}
		ranges = append(ranges, sendsRange{after: b, until: b})
	}
	for len(ranges) > maxSendsRanges {
		i := closestGroups(ranges)
		ranges[i].until = ranges[i+1].until
		ranges = slices.Delete(ranges, i+1, i+2)
	}
	for i, rg := range ranges {
		slack := min(max(rg.after, 0)/16, 5000)
		ranges[i] = sendsRange{after: rg.after + slack, until: rg.until - slack}
	}
	return ranges
}

// closestGroups returns i such that groups i and i+1 of ranges are the
// nearest each other, for their times back.
func closestGroups(ranges []sendsRange) int {
	// The gap from a group's nearest start to the next one's furthest,
	// for how far back it is.
	gap := func(i int) float64 {
		return float64(ranges[i].until-ranges[i+1].after) / float64(max(ranges[i].until, 1))
	}
	best := 0
	for i := 1; i < len(ranges)-1; i++ {
		if gap(i) < gap(best) {
			best = i
		}
	}
	return best
}

// noteStart notes how far back, in microseconds, a window of key began
// that the pipeline's read of its latest admissions did not show.
func (h *windowHints) noteStart(key string, back int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.of(key)
	r.back[r.next] = back
	r.next = (r.next + 1) % backRecent
	r.n = min(r.n+1, backRecent)
}

// noteLatest notes w, a window count of key: the key's next manyFor
// pipelines read its latest pgLatestMany admissions when w began among
// them but before its latest pgLatestFew.
func (h *windowHints) noteLatest(key string, w pgFirstSend) {
	if n := w.last - w.seq + 1; !w.ok || n <= pgLatestFew || n > pgLatestMany {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.of(key).many = manyFor
}

// latestRead returns how many of key's latest admissions its next
// pipeline reads: pgLatestFew or pgLatestMany (see noteLatest).
func (h *windowHints) latestRead(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.back[key]
	if r == nil || r.many == 0 {
		return pgLatestFew
	}
	r.many--
	return pgLatestMany
}

// of returns key's hints, made on first use; h.mu is held.
func (h *windowHints) of(key string) *recentStarts {
	if h.back == nil {
		h.back = map[string]*recentStarts{}
	}
	r := h.back[key]
	if r == nil {
		r = &recentStarts{}
		h.back[key] = r
	}
	return r
}
