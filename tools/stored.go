package tools

import (
	"context"
	"sync"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// storedTargetLister is a transaction that lists the targets of a key with a
// stored answer (*state.Tx, on either back end).
type storedTargetLister interface {
	StoredTargets(key string) ([]string, error)
}

// storedIndex knows, per key, which targets have a stored answer in the
// state, so that a fetch of a target with none — most of an agent's
// calls — reads nothing before it goes (reading would also wait for the
// process's journal to be written). A key's set is read from the state
// at the key's first fetch, and read again inside every transaction in
// which this process keeps an answer of the key: the journal's, a moment
// after the answer (see laterKeeper), and until then the target counts
// as kept.
//
// What it cannot know is an answer another process kept since then. A
// fetch of that target goes as a fetch with nothing kept does: without
// that copy's validator, and not held back by the loop guard (both spare
// the upstream work, not quota: a 304 counts like a 200), paced and
// counted as any call; its own answer is then kept, and the set read
// again. A page beyond the first (start_index > 0) always reads the
// state: it is asked of a copy kept moments ago, perhaps by another host.
//
// Sets read in write transactions replace one another in the order the
// transactions ran (a sequence taken inside each), so that one read
// before another process's or this one's later answer does not replace
// what was read after it; the set read at a key's first fetch, outside
// any write, only fills a key not known yet.
//
// The zero value knows no key; it is safe for concurrent use. It holds
// one set per key fetched through (only configured keys are), each as
// large as the state's: at most the fetch tool's KeepResponses and the
// answers kept beside them since.
type storedIndex struct {
	mu   sync.Mutex
	seq  uint64                // the last sequence taken (see next)
	keys map[string]*storedSet // nil for a key not read yet
	// pending counts, per key and target, the answers this process
	// handed to the journal (see laterKeeper) that are not kept yet: a
	// set read before they are kept does not hide them.
	pending map[storedTarget]int
}

type storedTarget struct{ key, target string }

// laterKeeper is a store that keeps an answer through the process's
// journal, with the outcomes it records, and tells what the transaction
// that kept it read of the key's targets (*state.DB and *state.Postgres:
// see state.DB.KeepLater). A fetch of the target meanwhile reads it kept:
// a read waits for the journal.
type laterKeeper interface {
	KeepLater(ctx context.Context, r ledger.StoredResponse, keep int, listed func(targets []string)) error
}

// pend adds n to the answers of key's target handed to the journal and
// not kept yet.
func (x *storedIndex) pend(key, target string, n int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.pending == nil {
		x.pending = map[storedTarget]int{}
	}
	t := storedTarget{key, target}
	if x.pending[t] += n; x.pending[t] <= 0 {
		delete(x.pending, t)
	}
}

type storedSet struct {
	targets map[string]bool
	seq     uint64 // the write transaction it was read in; 0 outside one
}

// absent reports whether target of key is known to have no stored answer.
func (x *storedIndex) absent(key, target string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	set, ok := x.keys[key]
	return ok && !set.targets[target] && x.pending[storedTarget{key, target}] == 0
}

// loaded reports whether key's set has been read.
func (x *storedIndex) loaded(key string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	_, ok := x.keys[key]
	return ok
}

// next returns a sequence larger than every one returned before: call it
// in a write transaction, before reading the set.
func (x *storedIndex) next() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.seq++
	return x.seq
}

// responseKeeper is a transaction that keeps an answer and lists its
// key's kept targets in one step (*state.Tx, on either back end).
type responseKeeper interface {
	KeepResponse(r ledger.StoredResponse, keep int) ([]string, error)
}

// keepResponse keeps r in tx, at most keep answers of its key, and
// returns the key's kept targets after it as readStoredTargets does.
func keepResponse(tx ledger.Tx, r ledger.StoredResponse, keep int) ([]string, bool, error) {
	if k, ok := tx.(responseKeeper); ok {
		targets, err := k.KeepResponse(r, keep)
		return targets, err == nil, err
	}
	if err := tx.PutResponse(r, keep); err != nil {
		return nil, false, err
	}
	return readStoredTargets(tx, r.Key)
}

// readStoredTargets returns key's targets as tx sees them, and whether tx could
// tell. Call it inside the transaction, and set after it committed.
func readStoredTargets(tx ledger.Reader, key string) ([]string, bool, error) {
	l, ok := tx.(storedTargetLister)
	if !ok {
		return nil, false, nil
	}
	targets, err := l.StoredTargets(key)
	return targets, err == nil, err
}

// set records targets as key's kept targets, read in the write
// transaction of sequence seq (0: outside any), unless a set read later
// is known; target, when not empty, was kept by this process and is known
// either way.
func (x *storedIndex) set(key string, targets []string, seq uint64, target string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.keys == nil {
		x.keys = map[string]*storedSet{}
	}
	cur, ok := x.keys[key]
	if !ok || (seq > 0 && seq > cur.seq) {
		if ok {
			clear(cur.targets) // refilled in place: a set is only read with x.mu held
		} else {
			cur = &storedSet{targets: make(map[string]bool, len(targets)+1)}
			x.keys[key] = cur
		}
		cur.seq = seq
		for _, t := range targets {
			cur.targets[t] = true
		}
	}
	if target != "" {
		cur.targets[target] = true
	}
}
