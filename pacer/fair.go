package pacer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// Fair shares. A key with shares (keystore.Key.Shares) is spent by
// principals — a person, whatever client they call through, or a job —
// under two rules, both counted over every host sharing the state:
//
//   - a cap: a principal spends at most its share of the quota of each of
//     the key's windowed policies per window (at least one call);
//   - turns: among the principals with calls waiting for the key (on any
//     host), a call goes when its principal is the one most behind — the
//     fewest admissions in the window relative to its share — or when
//     what is left of the window covers what every principal further
//     behind is still owed of its part (the quota split among the
//     waiting principals by their shares). A principal with one call
//     waiting is behind one with a hundred as soon as that one has had
//     more than its part, so it is never starved.
//
// The decision is a pure function of what the window holds per principal
// and who waits (fairRule); the waiting principals are kept in the state
// (ledger.Fair), one record per principal and process, renewed while its
// calls wait.
const (
	// waiterLife is how long a principal's record of waiting outlives the
	// wait its call was told (a call renews it at every check): a process
	// that ends while its calls wait holds no turn for longer.
	waiterLife = 3 * time.Second
	// followOn is how long a principal keeps its place after its last
	// call waiting here was admitted: an agent that makes one call after
	// another is not overtaken between them, while its answer comes and
	// it asks again.
	followOn = time.Second
)

// Sources of a wait that concern the caller's principal, not the key.
const (
	// SourceShare is a PauseError.Source: the principal has spent its
	// share of a policy's window.
	SourceShare = string(ShareLimit)
	// SourceTurn is a PauseError.Source: principals further behind wait
	// for the key, and the next calls go to them.
	SourceTurn = string(TurnLimit)
)

// fairLog reads what principals spent of a key's window.
type fairLog interface {
	// PrincipalWindow is ledger.Fair's, for the snapshot's key.
	PrincipalWindow(since time.Time, principals []string) (map[string]ledger.Use, error)
}

// fairView is what the fair rule reads of a key with shares.
type fairView struct {
	principal string   // the caller's principal
	waiting   []string // the principals with calls waiting for the key, on any host
	log       fairLog
}

// txFairLog is fairLog inside a transaction.
type txFairLog struct {
	tx  ledger.Reader
	key string
}

func (l txFairLog) PrincipalWindow(since time.Time, principals []string) (map[string]ledger.Use, error) {
	return l.tx.PrincipalWindow(l.key, since, principals)
}

// loadFair reads the fair view of c's key at now: nil when the key has
// no shares.
func loadFair(tx ledger.Reader, c Call, now time.Time) (*fairView, error) {
	if !c.Key.Fair() {
		return nil, nil
	}
	waiting, err := tx.Waiting(c.Key.Name, now)
	if err != nil {
		return nil, err
	}
	return &fairView{principal: keystore.PrincipalOf(c.Caller), waiting: waiting, log: txFairLog{tx, c.Key.Name}}, nil
}

// fairPrincipal is the principal c's admission is numbered under: its
// caller's, on a key with shares; "" otherwise.
func fairPrincipal(c Call) string {
	if !c.Key.Fair() {
		return ""
	}
	return keystore.PrincipalOf(c.Caller)
}

// fairConstraints are the waits the key's shares put on the snapshot's
// call, one per windowed budget that binds it.
func (s snapshot) fairConstraints(windows []windowed) ([]constraint, error) {
	if s.fair == nil {
		return nil, nil
	}
	names := slices.Clone(s.fair.waiting)
	if !slices.Contains(names, s.fair.principal) {
		names = append(names, s.fair.principal)
	}
	slices.Sort(names)
	var out []constraint
	for _, wb := range windows {
		if wb.Limit <= 0 || wb.Window <= 0 {
			continue
		}
		m := s.margin(wb.Window)
		use, err := s.fair.log.PrincipalWindow(s.now.Add(-wb.Window-m), names)
		if err != nil {
			return nil, err
		}
		fw := fairWindow{policy: wb.Policy, limit: wb.Limit, avail: wb.avail, window: wb.Window, margin: m, use: use}
		c, after, ok := fairRule(s.now, s.key, s.fair.principal, names, fw)
		if !ok {
			continue
		}
		if after > 0 {
			// Its turn comes once the principals behind have had theirs:
			// not before that many more of the window's calls leave it.
			// (A call finishing here wakes it sooner.)
			e, err := s.log.Nth(s.now.Add(-wb.Window-m), int(after))
			if err != nil {
				return nil, err
			}
			if at := e.Add(wb.Window + m); !e.IsZero() && at.Sub(s.now) > c.wait {
				c.wait, c.poll = at.Sub(s.now), false
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// A fairWindow is one windowed policy of a key as the fair rule reads it.
type fairWindow struct {
	policy string
	limit  int64         // q
	avail  int64         // what is left of the window for the caller
	window time.Duration // w
	margin time.Duration // how long beyond w a send stays in the window (see margin)
	use    map[string]ledger.Use
}

// shareCap is the most of a quota q that a share of it allows per
// window: at least one call, so that a small share is slow, not shut.
func shareCap(share float64, q int64) int64 {
	return max(int64(math.Floor(share*float64(q)+1e-9)), 1)
}

// fairRule decides whether a call of principal may take a unit of w now,
// given the principals waiting for the key (principal among them or
// not): ok is false when it may, else c is the wait — for its share to
// come back (SourceShare), or for its turn (SourceTurn), which comes no
// sooner than after more of the window's calls have left it (c.wait is
// then a re-check).
func fairRule(now time.Time, k *keystore.Key, principal string, waiting []string, w fairWindow) (c constraint, after int64, ok bool) {
	share, capped := k.ShareOf(principal)
	mine := w.use[principal]
	if capped {
		if n := shareCap(share, w.limit); int64(mine.Count) >= n {
			back := mine.Oldest.Add(w.window + w.margin).Sub(now)
			return constraint{wait: back, source: SourceShare, limit: ShareLimit, exhaust: true,
				reason: reason.Reason{Kind: reason.ShareSpent, Principal: principal, Share: share, Used: n, Limit: w.limit,
					Window: w.window, Policy: w.policy, Left: max(w.avail, 0)}}, 0, true
		}
	}
	if w.avail <= 0 {
		return c, 0, false // the key's own budget binds: every principal waits for it alike
	}
	// The principals that take turns: those waiting that can still spend
	// in this window.
	type turn struct {
		name   string
		weight float64
		score  float64
		used   int
	}
	var turns []turn
	var total float64
	for _, p := range waiting {
		if p == principal {
			continue
		}
		sh, capped := k.ShareOf(p)
		u := w.use[p].Count
		if capped && int64(u) >= shareCap(sh, w.limit) {
			continue
		}
		turns = append(turns, turn{name: p, weight: sh, score: float64(u) / sh, used: u})
		total += sh
	}
	myScore := float64(mine.Count) / share
	total += share
	var owed int64
	var ahead *turn
	for i := range turns {
		t := &turns[i]
		if t.score >= myScore {
			continue
		}
		owed += max(int64(math.Floor(float64(w.limit)*t.weight/total+1e-9))-int64(t.used), 1)
		if ahead == nil || t.score < ahead.score || (t.score == ahead.score && t.name < ahead.name) {
			ahead = t
		}
	}
	if ahead == nil || w.avail > owed {
		return c, 0, false // its turn, or enough is left for every turn before it
	}
	return constraint{wait: Poll, poll: true, source: SourceTurn, limit: TurnLimit,
		reason: reason.Reason{Kind: reason.Turn, Other: ahead.name, Behind: int64(ahead.used), Principal: principal,
			Used: int64(mine.Count), Left: w.avail}}, owed - w.avail + 1, true
}

// waitersHere counts the calls of keys with shares that wait in Admit in
// this process, per key and principal: the last of a principal's to be
// admitted ends its record of waiting. It also lines them up: one call
// of a principal at a time asks the state for the key (see line), so
// that a job with fifty calls waiting costs the state what one does. The
// zero value is ready; it is safe for concurrent use.
type waitersHere struct {
	mu   sync.Mutex
	n    map[string]*principalHere
	name string // this pacer's name in the waiting records: drawn on first use
}

// principalHere is one principal's calls of one key waiting here.
type principalHere struct {
	n    int           // calls in Admit
	turn chan struct{} // holds a value while one of them asks the state
	// unanswered is closed when a turn ends with a database that did not
	// answer within the store's bound (err, a ledger.ErrNoAnswer): the
	// calls that waited for that turn waited the bound with it, and fail
	// with it rather than each ask once more and wait it again. A new
	// channel serves the calls that come after.
	unanswered chan struct{}
	err        error
}

// waiter is this pacer's name in the state's waiting records.
func (h *waitersHere) waiter() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.name == "" {
		h.name = fmt.Sprintf("%016x", rand.Uint64())
	}
	return h.name
}

func waiterID(c Call) string { return c.Key.Name + "\x00" + keystore.PrincipalOf(c.Caller) }

// enter counts c as waiting until the function it returns is called.
func (h *waitersHere) enter(c Call) func() {
	if !c.Key.Fair() {
		return func() {}
	}
	id := waiterID(c)
	h.mu.Lock()
	if h.n == nil {
		h.n = map[string]*principalHere{}
	}
	ph := h.n[id]
	if ph == nil {
		ph = &principalHere{turn: make(chan struct{}, 1), unanswered: make(chan struct{})}
		h.n[id] = ph
	}
	ph.n++
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if ph.n--; ph.n <= 0 {
			delete(h.n, id)
		}
	}
}

// others reports whether calls of c's principal other than c wait for its
// key in this process.
func (h *waitersHere) others(c Call) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	ph := h.n[waiterID(c)]
	return ph != nil && ph.n > 1
}

// line waits, for a key with shares, until c is the one call of its
// principal here that asks the state for the key, or for at most wait
// (then it asks beside the one that does, to be told its pause), and
// returns what ends its turn, called with the error the call's admission
// ended with. Calls of a principal are served in the order they came:
// the turns among principals are the state's, and within one principal
// the order is its own. A call that waited for a turn that ended with a
// database that did not answer within the store's bound fails with that
// error (see principalHere.unanswered).
func (h *waitersHere) line(ctx context.Context, clk clock.Clock, c Call, wait time.Duration) (done func(error), err error) {
	none := func(error) {}
	if !c.Key.Fair() {
		return none, nil
	}
	h.mu.Lock()
	ph := h.n[waiterID(c)]
	var unanswered chan struct{}
	if ph != nil {
		unanswered = ph.unanswered
	}
	h.mu.Unlock()
	if ph == nil {
		return none, nil // (enter was not called)
	}
	release := func(err error) { h.endTurn(ph, err) }
	select {
	case ph.turn <- struct{}{}:
		return release, nil
	default:
	}
	t, fired := clk.NewTimer(wait)
	defer t.Stop()
	select {
	case ph.turn <- struct{}{}:
		select {
		case <-unanswered: // the turn it waited for ended so, just before
			<-ph.turn
			return nil, h.unansweredErr(ph)
		default:
		}
		return release, nil
	case <-unanswered:
		return nil, h.unansweredErr(ph)
	case <-fired:
		return none, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// endTurn ends the turn of ph's call that asks the state, whose admission
// ended with err.
func (h *waitersHere) endTurn(ph *principalHere, err error) {
	if errors.Is(err, ledger.ErrNoAnswer) {
		h.mu.Lock()
		ph.err = err
		close(ph.unanswered)
		ph.unanswered = make(chan struct{})
		h.mu.Unlock()
	}
	<-ph.turn
}

// unansweredErr is the error of ph's last turn that ended with a database
// that did not answer.
func (h *waitersHere) unansweredErr(ph *principalHere) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return ph.err
}

// noteWaiting records in tx, for a key with shares, how long c's
// principal waits for it after decision d at now: through the wait d asks
// for; or, when c was admitted, for a moment (followOn) unless other
// calls of its principal wait here.
func (p *Pacer) noteWaiting(tx ledger.Tx, c Call, now time.Time, d decision) error {
	if !c.Key.Fair() {
		return nil
	}
	until := now.Add(waiterLife)
	switch {
	case !d.admit:
		until = until.Add(d.wait)
	case !p.here.others(c):
		until = now.Add(followOn)
	}
	return tx.Wait(c.Key.Name, keystore.PrincipalOf(c.Caller), p.here.waiter(), now, until)
}
