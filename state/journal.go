package state

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// How a reserved slot's call ended reaches the state file through the
// process's journal: FinishLater appends it to a file of the process's
// own, with one write, and returns; the journal's applier records it in
// the state file a moment later, with every other outcome that came in
// the meantime, in one transaction. Once FinishLater returns, a crash of
// the process loses nothing: the next process to open the state file (or
// to run Recover) finds the journal of a process that ended — its lock is
// gone — and records what it holds that the state file does not.
//
// Until it is applied, the slot stays reserved: counted as sent and in
// flight for every process, as it was before its call ended. A View of
// this process waits for the applier first, so the process reads what it
// wrote. The fetch tool's kept answers (see KeepLater) go the same way, in
// the same transactions.

// finish records f in tx, unless its attempt is no longer open: it was
// recorded already (a journal is replayed after its process recorded some
// of it), or swept away. f is a reserved slot's call, or an attempt
// admitted on its own (its row names its call already); one the sweep
// released or interrupted meanwhile is recorded as its call ended.
func (tx *Tx) finish(f ledger.Finished) (bool, error) {
	var st ledger.State
	var callID string
	var attempt int64
	err := tx.queryRow(qOpenState, f.Attempt.ID, f.Attempt.Key).Scan(&st, &callID, &attempt)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	switch {
	case callID == "" && (st == ledger.Reserved || st == ledger.Released):
		return true, tx.record(f, true)
	case callID != "" && callID == f.Attempt.CallID && attempt == int64(f.Attempt.Attempt) &&
		(st == ledger.Admitted || st == ledger.Interrupted):
		return true, tx.record(f, false)
	}
	return false, nil
}

// record records f in tx: the call (of a reserved slot when slot) and
// its answer's observations.
func (tx *Tx) record(f ledger.Finished, slot bool) error {
	a := f.Attempt
	if !slot {
		if err := tx.FinishAttempt(a.ID, a.State, a.Reason, a.Status, a.SentAt, a.AnsweredAt); err != nil {
			return err
		}
	} else if err := tx.FinishReserved(a); err != nil {
		return err
	}
	for _, o := range f.Observations {
		if err := tx.AddObservation(o); err != nil {
			return err
		}
	}
	return nil
}

var qOpenState = newQuery("OpenState")

// journalSegment is the size after which the journal goes on in a new
// file; a file is removed once all it holds is applied.
const journalSegment = 4 << 20

// outcomes is a back end's journal of routine outcomes: where the
// journals of its processes live, and how their outcomes are recorded.
type outcomes struct {
	dir    string                                       // the journals' directory; "" for none: FinishLater records at once
	update func(context.Context, func(*Tx) error) error // the back end's write transaction
	clock  clock.Clock                                  // what the applier's linger and backoff run on; nil means real time

	mu     sync.Mutex              // held while the journal is opened, and while the store closes
	jr     atomic.Pointer[journal] // the process's journal, once opened
	closed bool                    // under mu: the store was closed
}

// A journal is the process's file of outcomes not yet in the state file.
type journal struct {
	out *outcomes
	dir string

	mu       sync.Mutex
	cur      *segment
	old      []*segment    // earlier files, with outcomes still to apply
	queue    []queued      // written, not yet applied
	written  uint64        // outcomes written so far…
	applied  uint64        // …and applied
	asked    uint64        // the written count the latest flush waits for
	progress chan struct{} // closed and replaced whenever applied or failing changes
	broken   error         // a write failed: nothing more is written
	failing  bool          // the applier's last transaction failed
	closing  bool          // close was called: no more outcomes are taken
	stopped  bool          // the applier has stopped

	ctx    context.Context // the applier's transactions; cancelled by close
	cancel context.CancelFunc

	wake  chan struct{} // tells the applier there is work…
	hurry chan struct{} // …and that it should not wait for more
	stop  chan struct{} // closed by close
	done  chan struct{} // closed when the applier has stopped
}

// A segment is one of the journal's files.
type segment struct {
	f       *os.File
	path    string // where f is now (f.Name is where it was created)
	size    int64
	pending int // outcomes written to it, not yet applied
}

type queued struct {
	f    ledger.Finished
	kept *keptAnswer // an answer to keep, in place of an outcome (see KeepLater)
	seg  *segment
}

// A keptAnswer is an answer KeepLater was given to keep, as its journal
// line holds it, and whom to tell once it is kept.
type keptAnswer struct {
	Response ledger.StoredResponse `json:"response"`
	Keep     int                   `json:"keep"`
	listed   func(targets []string)
}

// journalKeepMax is the largest body KeepLater keeps through the
// journal: a larger one takes a transaction of its own, and its line
// never outgrows what Recover reads of one.
const journalKeepMax = 256 << 10

// errNoJournal says this system cannot lock a journal's file: outcomes
// are recorded at once instead.
var errNoJournal = errors.New("state: no journal on this system")

// journalDir is where the journals of the state file at path live.
func journalDir(path string) string { return path + ".outcomes" }

// FinishLater records f (the end of a reserved slot's call, or of an
// attempt admitted alone, see Finished) in the process's journal, and in
// the state file shortly after. Where the process has no journal (the system cannot lock its
// file, or a write to it failed), f is recorded in the state file at once,
// in a transaction that ctx bounds.
func (db *DB) FinishLater(ctx context.Context, f ledger.Finished) error {
	return db.out.finishLater(ctx, f)
}

func (o *outcomes) finishLater(ctx context.Context, f ledger.Finished) error {
	j, err := o.journal()
	if err == nil {
		err = j.write(queued{f: f})
	}
	if err == nil || errors.Is(err, errClosed) {
		return err
	}
	return o.update(ctx, func(tx *Tx) error { _, err := tx.finish(f); return err })
}

// KeepLater keeps r as Tx.KeepResponse does, with at most keep answers
// of its key: through the process's journal, with the outcomes it
// records (see FinishLater), when its body is at most journalKeepMax
// bytes; otherwise, or where the process has no journal, at once in a
// transaction of its own, which ctx bounds. A View of this process reads
// r kept. listed, when not nil, is called with the key's kept targets
// as the transaction that kept r read them (after r, and after the
// answers of the key it kept beside r: see keepAll), once it has
// committed; it must not wait, nor use the DB. It is not called when r
// was not kept (the state file refused it, or the process ended first:
// the next process to open the state file keeps it then).
func (db *DB) KeepLater(ctx context.Context, r ledger.StoredResponse, keep int, listed func(targets []string)) error {
	return db.out.keepLater(ctx, r, keep, listed)
}

func (o *outcomes) keepLater(ctx context.Context, r ledger.StoredResponse, keep int, listed func([]string)) error {
	if len(r.Body) <= journalKeepMax {
		j, err := o.journal()
		if err == nil {
			err = j.write(queued{kept: &keptAnswer{Response: r, Keep: keep, listed: listed}})
		}
		if err == nil || errors.Is(err, errClosed) {
			return err
		}
	}
	var targets []string
	err := o.update(ctx, func(tx *Tx) error {
		var err error
		targets, err = tx.KeepResponse(r, keep)
		return err
	})
	if err == nil && listed != nil {
		listed(targets)
	}
	return err
}

// ended returns the IDs of key's attempts whose end the process's
// journal holds, not yet recorded in the state.
func (o *outcomes) ended(key string) []int64 {
	if o == nil {
		return nil
	}
	j := o.jr.Load()
	if j == nil {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	var ids []int64
	for _, q := range j.queue {
		if q.kept == nil && q.f.Attempt.Key == key {
			ids = append(ids, q.f.Attempt.ID)
		}
	}
	return ids
}

// errClosed reports a use of a closed DB.
var errClosed = errors.New("state: closed")

// journal returns the process's journal, opened at its first use. When it
// cannot be opened, the next call tries again.
func (o *outcomes) journal() (*journal, error) {
	if j := o.jr.Load(); j != nil {
		return j, nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, errClosed
	}
	if j := o.jr.Load(); j != nil {
		return j, nil
	}
	j, err := openJournal(o)
	if err != nil {
		return nil, err
	}
	o.jr.Store(j)
	return j, nil
}

// close closes the process's journal (see journal.close); FinishLater
// takes no more outcomes after it. It reports whether it was the first
// close.
func (o *outcomes) close() (first bool, err error) {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return false, nil
	}
	o.closed = true
	o.mu.Unlock()
	if j := o.jr.Load(); j != nil {
		return true, j.close()
	}
	return true, nil
}

func openJournal(o *outcomes) (*journal, error) {
	if !journaling || o.dir == "" {
		return nil, errNoJournal
	}
	j := &journal{out: o, dir: o.dir, progress: make(chan struct{}),
		wake: make(chan struct{}, 1), hurry: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if err := os.MkdirAll(j.dir, 0o700); err != nil {
		return nil, fmt.Errorf("state: journal: %w", err)
	}
	seg, err := j.newSegment()
	if err != nil {
		return nil, err
	}
	j.cur = seg
	j.ctx, j.cancel = context.WithCancel(context.Background())
	go j.apply()
	return j, nil
}

// newSegment creates the journal's next file, locked for as long as the
// process lives. It is created under a temporary name and renamed once
// locked: Recover never takes the file of a live process for the file of
// one that ended.
func (j *journal) newSegment() (*segment, error) {
	var id [8]byte
	rand.Read(id[:])
	base := fmt.Sprintf("%d-%s", os.Getpid(), hex.EncodeToString(id[:]))
	f, err := os.OpenFile(filepath.Join(j.dir, "new-"+base), os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state: journal: %w", err)
	}
	if err := lockFile(f); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	name := filepath.Join(j.dir, base+".log")
	if err := os.Rename(f.Name(), name); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, fmt.Errorf("state: journal: %w", err)
	}
	return &segment{f: f, path: name}, nil
}

// write appends q's line (its outcome, or its kept answer) to the
// journal, in one write, and queues q for the applier.
func (j *journal) write(q queued) error {
	buf := lineBuffers.Get().(*[]byte)
	var line []byte
	var err error
	if q.kept != nil {
		line, err = appendKeptLine((*buf)[:0], q.kept)
	} else {
		line, err = appendJournalLine((*buf)[:0], q.f)
	}
	if err != nil {
		lineBuffers.Put(buf)
		return fmt.Errorf("state: journal: %w", err)
	}
	line = append(line, '\n')
	err = j.add(line, q)
	if cap(line) <= 64<<10 { // an outsized line's buffer goes
		*buf = line
		lineBuffers.Put(buf)
	}
	return err
}

// lineBuffers holds buffers for the lines write encodes: add writes a
// line and keeps nothing of it.
var lineBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// add appends line, q's, ending in a newline, to the journal and queues
// q. It keeps nothing of line.
func (j *journal) add(line []byte, q queued) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closing {
		return errClosed
	}
	if j.broken != nil {
		return j.broken
	}
	if j.cur.size >= journalSegment {
		seg, err := j.newSegment()
		if err != nil {
			return err // the current file goes on
		}
		j.old = append(j.old, j.cur)
		j.cur = seg
	}
	n, err := j.cur.f.Write(line)
	j.cur.size += int64(n)
	if err != nil {
		// What it wrote of the line may garble the next one: no more
		// lines, and Recover skips a line it cannot read.
		j.broken = fmt.Errorf("state: journal: %w", err)
		return j.broken
	}
	j.cur.pending++
	q.seg = j.cur
	j.queue = append(j.queue, q)
	j.written++
	signal(j.wake)
	if len(j.queue) >= journalBatch {
		signal(j.hurry)
	}
	return nil
}

// signal sends on ch unless a send is waiting there already.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// The applier waits up to journalLinger after an outcome comes for more
// to come, up to journalBatch, and applies them in one transaction; what
// comes while a transaction runs waits out the linger again, unless a
// whole batch is queued or a flush waits for it. On SQLite a transaction
// costs mostly its commit, which writes every page the batch touched (a
// slot's row and its entries in the attempts' indexes, its observation):
// one outcome alone cost about 190 µs of CPU, 4 together 70 µs each, 16
// or more 40 µs each (BenchmarkApplySQLite, on a loaded machine). A
// longer linger would batch more, but until an outcome is applied its
// call stays in flight for every process, and a refusal decided
// meanwhile is told to wait longer: at 5 ms, rest's TestLocalRefusal got
// a Retry-After of 61 s on a 60 s window.
const (
	journalBatch  = 256
	journalLinger = 2 * time.Millisecond
)

// apply records the queued outcomes in the state file, many in each
// transaction, until close. An outcome the state file refuses (see
// refused) is set aside, so that it holds back no other. When the file
// itself fails (busy, full, an I/O error), the outcomes stay queued, and
// in the journal, and are tried again after a backoff.
func (j *journal) apply() {
	defer close(j.done)
	clk := clock.Or(j.out.clock)
	retry := time.Duration(0)
	var batch []queued // the queue's first outcomes as the applier records them; its array is reused
	for {
		if retry > 0 {
			t, fired := clk.NewTimer(retry)
			select {
			case <-fired:
			case <-j.stop:
				t.Stop()
				return
			}
		} else {
			select {
			case <-j.wake:
				t, fired := clk.NewTimer(journalLinger)
				select {
				case <-fired:
				case <-j.hurry:
					t.Stop()
				case <-j.stop:
					t.Stop()
					return
				}
			case <-j.hurry: // a whole batch, or a flush: no linger
			case <-j.stop:
				return
			}
		}
		for {
			j.mu.Lock()
			batch = append(batch[:0], j.queue[:min(len(j.queue), journalBatch)]...)
			j.mu.Unlock()
			if len(batch) == 0 {
				retry = 0
				break
			}
			done, err := j.record(batch)
			j.dropApplied(batch, done)
			clear(batch) // the answers it kept are not held here until the next batch
			if err != nil {
				retry = min(max(2*retry, 10*time.Millisecond), 5*time.Second)
				j.setFailing(true)
				break
			}
			retry = 0
			j.setFailing(false)
			if !j.pressed() {
				// What came meanwhile waits out the linger, to share its
				// transaction with what comes next.
				break
			}
		}
	}
}

// pressed reports whether the applier should go on at once: a whole
// batch is queued, a flush waits, or the journal closes.
func (j *journal) pressed() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.queue) >= journalBatch || j.applied < j.asked || j.closing
}

// record records batch in the state file (see recordAll) and says which
// of its outcomes are done with. Its error is the state file's failure,
// which left the others undone.
func (j *journal) record(batch []queued) ([]bool, error) {
	done, _, err := j.out.recordAll(j.ctx, batch)
	return done, err
}

// recordAll records qs, outcomes and answers to keep, in the state file:
// in one transaction, or one by one when the state file refuses one of
// them. It says which of them are done with (recorded, skipped as
// recorded already, or refused and set aside) and how many outcomes it
// recorded, and tells each answer's listed what its transaction read.
// It stops at the state file's first failure (busy, full, an I/O error):
// the others are undone.
func (o *outcomes) recordAll(ctx context.Context, qs []queued) (done []bool, recorded int, err error) {
	done = make([]bool, len(qs))
	record := func(qs []queued) (n int, err error) {
		var lists [][]string
		err = o.update(ctx, func(tx *Tx) error {
			fs := make([]ledger.Finished, 0, len(qs))
			for _, q := range qs {
				if q.kept == nil {
					fs = append(fs, q.f)
				}
			}
			if n, err = tx.finishAll(fs); err != nil {
				return err
			}
			lists, err = tx.keepAll(qs)
			return err
		})
		if err != nil {
			return n, err
		}
		for i, q := range qs {
			if q.kept != nil && q.kept.listed != nil {
				q.kept.listed(lists[i])
			}
		}
		return n, nil
	}
	n, err := record(qs)
	if err == nil {
		for i := range done {
			done[i] = true
		}
		return done, n, nil
	}
	if !refused(err) {
		return done, 0, err
	}
	for i, q := range qs {
		n, err := record([]queued{q})
		if err != nil && !refused(err) {
			return done, recorded, err
		}
		done[i], recorded = true, recorded+n // recorded, or refused: set aside
	}
	return done, recorded, nil
}

// keepAll keeps the answers among qs in tx, in their order, as
// KeepResponse would one after another, and returns what each one's
// listed hears (nil for an outcome). An answer followed in qs by another
// of its key with the same limit is only put: its key's targets are read,
// and trimmed to the limit, once after the last of them, which every one
// of them is told. That leaves what trimming after each would: an answer
// past the limit among the key's newest stays past it as newer ones come.
// Each read of the targets sorts the key's answers, and was most of what
// keeping an answer cost.
func (tx *Tx) keepAll(qs []queued) ([][]string, error) {
	lists := make([][]string, len(qs))
	next := make([]int, len(qs)) // the index of the next answer of the same key with the same limit; 0 for none
	last := map[string]int{}
	for i := len(qs) - 1; i >= 0; i-- {
		k := qs[i].kept
		if k == nil {
			continue
		}
		if j, ok := last[k.Response.Key]; ok && qs[j].kept.Keep == k.Keep {
			next[i] = j
		}
		last[k.Response.Key] = i
	}
	for i, q := range qs {
		switch {
		case q.kept == nil:
		case next[i] > 0:
			if err := tx.putResponse(q.kept.Response); err != nil {
				return nil, err
			}
		default:
			var err error
			if lists[i], err = tx.KeepResponse(q.kept.Response, q.kept.Keep); err != nil {
				return nil, err
			}
		}
	}
	for i := len(qs) - 1; i >= 0; i-- {
		if next[i] > 0 {
			lists[i] = lists[next[i]]
		}
	}
	return lists, nil
}

// refused says the state file refused what a statement would write — a
// constraint, a value too big, of the wrong type or out of range — and
// would refuse it at every try; not that the file is busy, full or
// failing, nor that a context ended.
func refused(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code[:2] == "22" || pe.Code[:2] == "23" // data exception, integrity constraint violation
	}
	var e *sqlite.Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code() & 0xff {
	case sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_TOOBIG, sqlite3.SQLITE_MISMATCH, sqlite3.SQLITE_RANGE:
		return true
	}
	return false
}

// setFailing says whether the applier's last transaction failed: while
// it does, a View reads the state file as it is rather than wait.
func (j *journal) setFailing(failing bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.failing != failing {
		j.failing = failing
		j.changed()
	}
}

// changed wakes the flushes waiting for the applier. j.mu is held.
func (j *journal) changed() {
	close(j.progress)
	j.progress = make(chan struct{})
}

// dropApplied takes the outcomes of batch (the queue's first ones) that are
// done with off the queue and out of the journal; the others stay first
// in the queue, in order.
func (j *journal) dropApplied(batch []queued, done []bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	var kept []queued
	n := 0
	for i, q := range batch {
		if done[i] {
			q.seg.pending--
			n++
		} else {
			kept = append(kept, q)
		}
	}
	if n == 0 {
		return
	}
	// What is left moves to the front of the queue's array: a new array
	// each batch, grown again a line at a time, was the largest
	// allocation on a call's path. kept are batch's, copies of the queue.
	rest := j.queue[len(batch):]
	q := append(j.queue[:0], kept...)
	q = append(q, rest...)
	clear(j.queue[len(q):])
	j.queue = q
	j.applied += uint64(n)
	j.changed()
	old := j.old[:0]
	for _, s := range j.old {
		if s.pending > 0 {
			old = append(old, s)
			continue
		}
		os.Remove(s.path)
		s.f.Close()
	}
	clear(j.old[len(old):])
	j.old = old
	if j.cur.pending == 0 && j.cur.size > 0 && j.broken == nil {
		if err := j.cur.f.Truncate(0); err == nil {
			j.cur.size = 0
		}
	}
}

// flush waits until every outcome written before it was called is in the
// state file (or set aside), or ctx ends. It does not wait for an applier
// that is failing or stopped: what the journal holds stays counted in the
// state file meanwhile, as reserved slots.
func (j *journal) flush(ctx context.Context) error {
	j.mu.Lock()
	target := j.written
	failing := j.failing
	j.asked = max(j.asked, target)
	j.mu.Unlock()
	if !failing {
		signal(j.hurry)
	}
	for {
		j.mu.Lock()
		applied, progress, failing, stopped := j.applied, j.progress, j.failing, j.stopped
		j.mu.Unlock()
		if applied >= target || failing || stopped {
			return nil
		}
		select {
		case <-progress:
		case <-ctx.Done():
			return fmt.Errorf("state: journal: %w", ctx.Err())
		}
	}
}

// close takes no more outcomes, applies what it can within BusyTimeout,
// stops the applier and closes the journal's files, removing those with
// nothing left to apply: what is left is the next process's to record.
func (j *journal) close() error {
	j.mu.Lock()
	j.closing = true
	j.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), BusyTimeout)
	defer cancel()
	err := j.flush(ctx)
	j.cancel() // a transaction the applier waits for is not waited for
	close(j.stop)
	<-j.done
	j.mu.Lock()
	defer j.mu.Unlock()
	j.stopped = true
	j.changed()
	if n := len(j.queue); n > 0 && err == nil {
		err = fmt.Errorf("state: journal: %d outcomes not recorded; the next process to open the state file records them", n)
	}
	for _, s := range append(j.old, j.cur) {
		if s.pending == 0 {
			os.Remove(s.path)
		}
		s.f.Close()
	}
	os.Remove(j.dir) // when no other process keeps a journal there
	return err
}

// flush waits for the process's journal, when it has one.
func (o *outcomes) flush(ctx context.Context) error {
	if j := o.jr.Load(); j != nil {
		return j.flush(ctx)
	}
	return nil
}

// Recover records what the journals of ended processes hold that the
// state file does not, and removes them. Open runs it; a long-lived
// process runs it from time to time, for the processes that end beside
// it. It returns how many outcomes it recorded.
func (db *DB) Recover(ctx context.Context) (int, error) { return db.out.recover(ctx) }

// recover records the outcomes of the journals in o's folder that no
// living process holds, and removes each once it is recorded.
func (o *outcomes) recover(ctx context.Context) (int, error) {
	dir := o.dir
	if dir == "" {
		return 0, nil
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("state: recover: %w", err)
	}
	n := 0
	for _, e := range entries {
		name := filepath.Join(dir, e.Name())
		switch {
		case strings.HasSuffix(name, ".log"):
		case strings.HasPrefix(e.Name(), "new-"):
			// A journal being created: locked and renamed in a moment. Left
			// by a process that ended, it is empty; it goes after a minute.
			if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < time.Minute {
				continue
			}
		default:
			continue
		}
		m, err := o.recoverFile(ctx, name)
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// recoverFile records what the journal file at name holds, unless its
// process is alive (it holds the file's lock), and removes it.
func (o *outcomes) recoverFile(ctx context.Context, name string) (int, error) {
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, nil // another process recovered it
		}
		return 0, fmt.Errorf("state: recover: %w", err)
	}
	defer f.Close()
	if err := lockFile(f); err != nil {
		return 0, nil // its process is alive, or nothing can tell
	}
	var fs []queued
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l journalLine
		if line := bytes.TrimSpace(sc.Bytes()); json.Unmarshal(line, &l) == nil && (l.Attempt.ID != 0 || l.Kept != nil) {
			fs = append(fs, queued{f: l.finished(), kept: l.Kept}) // a line cut short by a crash is skipped
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("state: recover %s: %w", filepath.Base(name), err)
	}
	n := 0
	if len(fs) > 0 {
		if _, n, err = o.recordAll(ctx, fs); err != nil {
			return n, fmt.Errorf("state: recover %s: %w", filepath.Base(name), err)
		}
	}
	if err := os.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		return n, fmt.Errorf("state: recover: %w", err)
	}
	return n, nil
}
