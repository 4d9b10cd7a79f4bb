package state

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// The window counts of a key's admission (FirstSend: its first send after
// a time, and its last) go with the lock and the other reads too, when
// the admission can be foreseen to ask for them: the pipeline counts the
// windows that the key's previous admission in this process asked about,
// each either as far back from the transaction's clock (a policy's
// window) or from the same time (an observation's basis) as then. A
// window the decision asks about that was not foreseen is read as
// before, in a round trip of its own.
//
// What the transaction knows of the key's log — the windows read, its
// calls in flight, its latest admission — stays known across the
// attempts it records itself: an admission it records is the key's
// latest (an admission recorded before a later one renumbers the log,
// which drops what is known), counts in every window that it falls in,
// and is in flight until its lease ends. Admissions decided one after
// another in one transaction are then decided on what the first one read,
// with one round trip each, to record its attempt.

// askedMax is how many window starts of a key the pipeline counts at most.
const askedMax = 6

// A sinceAsked is a window start a key's admission asked about: rel
// microseconds before the transaction's clock, or at the time v (in
// microseconds) when !rel.
type sinceAsked struct {
	rel bool
	v   int64
}

// pgAsked remembers, per key, the window starts its latest admission in
// this process asked about. Its size grows with the keys, not with their
// calls.
type pgAsked struct {
	mu   sync.Mutex
	keys map[string][]sinceAsked
}

func (a *pgAsked) get(key string) []sinceAsked {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.keys[key])
}

func (a *pgAsked) set(key string, asked []sinceAsked) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.keys == nil {
		a.keys = map[string][]sinceAsked{}
	}
	a.keys[key] = slices.Clone(asked)
}

// pgFirst is FirstSend's answer for one window start.
type pgFirst struct {
	seq, at, last int64
	found         bool
}

// The window counts of the pipeline: FirstSend with its time ($2) as far
// back from the transaction's clock as $2 says, or at $2.
var (
	pgReadFirstSendBack = strings.Replace(queries[qFirstSend].postgres, "$2", "("+pgNow+" - $2::bigint)", 1)
	pgReadFirstSendAt   = queries[qFirstSend].postgres
)

// queueWindows adds to b the counts of the windows key's previous
// admission asked about.
func queueWindows(b *pgx.Batch, key string, asked []sinceAsked) {
	for _, s := range asked {
		if s.rel {
			b.Queue(pgReadFirstSendBack, key, s.v)
		} else {
			b.Queue(pgReadFirstSendAt, key, s.v)
		}
	}
}

// scanWindows reads the answers of queueWindows, once r.now is known.
func (r *pgRead) scanWindows(br pgx.BatchResults, asked []sinceAsked) error {
	r.windows = map[int64]pgFirst{}
	r.windowFrom = map[int64]sinceAsked{}
	for _, s := range asked {
		var f pgFirst
		err := br.QueryRow().Scan(&f.seq, &f.at, &f.last)
		if f.found = err == nil; err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("window: %w", err)
		}
		since := s.v
		if s.rel {
			since = r.now - s.v
		}
		r.windows[since], r.windowFrom[since] = f, s
	}
	return nil
}

// readFirstSend answers FirstSend of key after since from what the
// transaction knows, when it does (ok).
func (p *pgTx) readFirstSend(key string, since time.Time) (f pgFirst, ok bool) {
	r := p.readFor(key)
	if r == nil || !r.hasWindows {
		return pgFirst{}, false
	}
	at := micros(since)
	f, ok = r.windows[at]
	if ok {
		if s, foreseen := r.windowFrom[at]; foreseen {
			p.asked(r, s)
		}
	}
	return f, ok
}

// keepFirstSend keeps FirstSend of key after since, as read, and
// remembers to ask for it in the key's next pipeline.
func (p *pgTx) keepFirstSend(key string, since time.Time, f pgFirst) {
	r := p.readFor(key)
	if r == nil {
		return
	}
	at := micros(since)
	// Not foreseen: as far back as now, or at the same time, next time —
	// whichever the next admission asks about is kept.
	p.asked(r, sinceAsked{rel: true, v: r.now - at})
	p.asked(r, sinceAsked{v: at})
	if r.hasWindows {
		r.windows[at] = f
	}
}

// asked notes that the transaction asked about the window start s, for
// the key's next pipeline.
func (p *pgTx) asked(r *pgRead, s sinceAsked) {
	if slices.Contains(r.asked, s) || len(r.asked) >= askedMax {
		return
	}
	r.asked = append(r.asked, s)
	p.db.asked.set(r.key, r.asked)
}

// pgKnown is which of what the pipeline read still held before a
// statement.
type pgKnown struct {
	read                            *pgRead
	flight, lastSend, windows, good bool
}

// known returns which of what the pipeline read of key holds now.
func (p *pgTx) known() pgKnown {
	if p == nil || p.read == nil {
		return pgKnown{}
	}
	r := p.read
	return pgKnown{read: r, flight: r.hasFlight, lastSend: r.hasLastSend, windows: r.hasWindows, good: true}
}

// inserted keeps what the transaction knows of the key's log, as k said
// it held before a recorded a, whose ID is id: an admission (seq its
// number, cbytes its running sum of bytes) is added to it. Nothing else
// may have run since k was taken.
func (p *pgTx) inserted(k pgKnown, a ledger.Attempt, seq, cbytes int64) {
	if !k.good || p.read != k.read {
		return
	}
	r := k.read
	r.hasFlight, r.hasLastSend, r.hasWindows = k.flight, k.lastSend, k.windows
	if a.Key != r.key {
		return // nothing read of r.key changed
	}
	at := micros(a.At)
	if r.hasFlight && !a.InFlightUntil.IsZero() && micros(a.InFlightUntil) > r.now {
		if r.flight.Count == 0 || at < micros(r.flight.Oldest) {
			r.flight.Oldest = fromMicros(at)
		}
		r.flight.Count++
	}
	if a.State != ledger.Admitted {
		return // not counted: the log's numbers did not change
	}
	if r.hasLastSend {
		r.lastSeq, r.lastAt, r.lastBytes, r.hasLast = seq, at, cbytes, true
	}
	if r.hasWindows {
		for since, f := range r.windows {
			switch {
			case f.found:
				f.last = seq
			case at > since:
				f = pgFirst{seq: seq, at: at, last: seq, found: true}
			}
			r.windows[since] = f
		}
	}
}
