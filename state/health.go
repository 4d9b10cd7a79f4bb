package state

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"syscall"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Storage reports whether err is the state file itself failing — full,
// unwritable, damaged, gone, closed, or held by another process's writer
// past BusyTimeout — rather than a caller's context ending or what a
// statement wrote being refused.
func Storage(err error) bool {
	// A caller that left while its COMMIT was on its way gets
	// ErrUnavailable with its context's error (see Postgres.Update): its
	// leaving, not the storage.
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if errors.Is(err, ErrUnavailable) || errors.Is(err, ErrDamaged) {
		return true
	}
	var e *sqlite.Error
	if errors.As(err, &e) {
		switch e.Code() & 0xff {
		case sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB,
			sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM, sqlite3.SQLITE_BUSY,
			sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_NOMEM, sqlite3.SQLITE_PROTOCOL:
			return true
		}
		return false
	}
	return errors.Is(err, ErrBusy) || errors.Is(err, errClosed) || errors.Is(err, syscall.ENOSPC) ||
		errors.Is(err, syscall.EIO) || errors.Is(err, fs.ErrPermission)
}

// ErrDamaged reports a state file found damaged: once any read, write or
// check of the process finds a page SQLite cannot read, no write
// transaction begins on it again (so no call is admitted on what it
// says) until the process opens the file anew.
var ErrDamaged = errors.New("the state file is damaged")

// corrupt reports SQLite's SQLITE_CORRUPT or SQLITE_NOTADB.
func corrupt(err error) bool {
	var e *sqlite.Error
	if !errors.As(err, &e) {
		return false
	}
	c := e.Code() & 0xff
	return c == sqlite3.SQLITE_CORRUPT || c == sqlite3.SQLITE_NOTADB
}

// full reports SQLite's SQLITE_FULL, or ENOSPC.
func full(err error) bool {
	var e *sqlite.Error
	return errors.As(err, &e) && e.Code()&0xff == sqlite3.SQLITE_FULL || errors.Is(err, syscall.ENOSPC)
}

// writeHealth is what the DB remembers of its last writes.
type writeHealth struct {
	mu       sync.Mutex
	err      error     // the last write transaction's failure; nil once one commits
	at       time.Time // when it failed
	lowSpace bool      // a write found the disk full: the WAL is kept small for lowSpaceFor
	held     bool      // writes wait for a checkpoint to give the WAL's space back
	checked  time.Time // when quick_check last passed
	checking bool      // a quick_check runs in the background (see watch)
	ckpt     int       // the log's checkpoint size now, in pages (see sizeLog); 0 before it is set
	commits  int       // write transactions committed
	damaged  error     // what first found the file damaged; it stays so
}

// noteDamage latches the DB as damaged when err says a page is, and
// returns err.
func (db *DB) noteDamage(err error) error {
	if corrupt(err) {
		db.wh.mu.Lock()
		if db.wh.damaged == nil {
			db.wh.damaged = err
		}
		db.wh.mu.Unlock()
	}
	return err
}

// damaged returns the error every write fails with once the file was
// found damaged; nil before.
func (db *DB) damaged() error {
	db.wh.mu.Lock()
	defer db.wh.mu.Unlock()
	if db.wh.damaged == nil {
		return nil
	}
	cause := db.wh.damaged
	if e, ok := errors.AsType[*sqlite.Error](cause); ok {
		cause = e
	}
	return fmt.Errorf("state: %w (%v): nothing is admitted on it; stop mcp-quota and move %s, %s-wal and %s-shm away to start afresh",
		ErrDamaged, cause, db.path, db.path, db.path)
}

// watch runs, before a write transaction, a quick_check in the background
// when none passed for checkEvery: damage that the writer's own cache
// hides from it (a page changed on disk under the process) is found by a
// reader, and stops the writes that follow.
func (db *DB) watch() {
	db.wh.mu.Lock()
	if db.wh.checking || db.clock.Now().Sub(db.wh.checked) < checkEvery || db.wh.damaged != nil {
		db.wh.mu.Unlock()
		return
	}
	db.wh.checking = true
	db.wh.mu.Unlock()
	db.bg.Add(1)
	go func() {
		defer db.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		db.checkNow(ctx)
		db.wh.mu.Lock()
		db.wh.checking = false
		db.wh.mu.Unlock()
	}()
}

// checkNow runs quick_check; when it passes, the file stands as checked
// for checkEvery.
func (db *DB) checkNow(ctx context.Context) error {
	err := db.quickCheck(ctx)
	db.wh.mu.Lock()
	defer db.wh.mu.Unlock()
	if err == nil {
		db.wh.checked = db.clock.Now()
	}
	return err
}

// checkEvery is how long a quick_check that passed stands for Check:
// it reads every page (about 70 ms for 100,000 attempts).
const checkEvery = 30 * time.Second

// noteWrite records how a write transaction ended, and now and then sizes
// the log by the file (see CheckpointAt). When the disk is full the
// write-ahead log is checkpointed and truncated, and kept small, so that
// space freed on the disk goes to new writes rather than to the log
// growing back to its checkpoint size before it is reused.
func (db *DB) noteWrite(err error) {
	h := &db.wh
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		h.err = nil
		if h.lowSpace && db.clock.Now().Sub(h.at) > lowSpaceFor {
			h.lowSpace = false
			h.ckpt = 0 // set again below
		}
		if h.commits++; h.commits%resizeEvery == 0 || h.ckpt == 0 {
			db.sizeLog()
		}
		return
	}
	if !Storage(err) {
		return
	}
	if corrupt(err) && h.damaged == nil {
		h.damaged = err
	}
	h.err, h.at = err, db.clock.Now()
	if full(err) {
		h.held = true
		if !h.lowSpace {
			h.lowSpace = true
			// On the writer's connection, outside any transaction (run
			// rolled it back).
			db.wc.ExecContext(context.Background(), fmt.Sprintf("PRAGMA wal_autocheckpoint(%d)", lowSpacePages))
		}
	}
}

// MinCheckpointPages is the least size, in pages, of the write-ahead log
// at which a commit checkpoints it: SQLite's default (about 4 MiB).
const MinCheckpointPages = 1000

// CheckpointAt is how many pages the write-ahead log of a file of
// filePages pages holds before the commit that reaches it copies them back
// into the file (a checkpoint): as many as the file has, at least
// MinCheckpointPages and at most CheckpointPages. The log is reused after
// a checkpoint, and cut back to that size when it grew past it: on the
// disk it takes about as much as the history it holds, or 4 MiB, and at
// most about 40 MiB.
func CheckpointAt(filePages int) int {
	return min(max(filePages, MinCheckpointPages), CheckpointPages)
}

// resizeEvery is how many commits go by between two looks at the file's
// size (see sizeLog).
const resizeEvery = 64

// sizeLog sets the log's checkpoint size and the size it is cut back to
// after a checkpoint, by the file's size now (see CheckpointAt). It runs
// on the writer's connection, outside any transaction, with db.wh.mu held;
// while the disk is full it leaves the log at lowSpacePages.
func (db *DB) sizeLog() {
	h := &db.wh
	if h.lowSpace {
		return
	}
	ctx := context.Background()
	var pages, pageSize int
	if db.wc.QueryRowContext(ctx, "PRAGMA page_count").Scan(&pages) != nil ||
		db.wc.QueryRowContext(ctx, "PRAGMA page_size").Scan(&pageSize) != nil {
		return
	}
	n := CheckpointAt(pages)
	if n == h.ckpt {
		return
	}
	if _, err := db.wc.ExecContext(ctx, fmt.Sprintf("PRAGMA wal_autocheckpoint(%d)", n)); err != nil {
		return
	}
	if _, err := db.wc.ExecContext(ctx, fmt.Sprintf("PRAGMA journal_size_limit(%d)", int64(n)*int64(pageSize))); err != nil {
		return
	}
	h.ckpt = n
}

// relieve runs before each write transaction. Once a write found the
// disk full, each write transaction first copies the write-ahead log into
// the file and truncates it, and fails when that fails: the log may hold
// many copies of each page, and would otherwise take whatever space is
// freed for the frames of writes that fail again. The first checkpoint
// that succeeds lets writes go on. It runs on the writer's goroutine,
// outside any transaction.
func (db *DB) relieve() error {
	h := &db.wh
	h.mu.Lock()
	if !h.held {
		h.mu.Unlock()
		return nil
	}
	h.mu.Unlock()
	var busy, logPages, done int
	err := db.wc.QueryRowContext(context.Background(), "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &logPages, &done)
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.err = err
		return fmt.Errorf("the disk is full: %w", err)
	}
	h.held = false
	return nil
}

// lowSpacePages is the checkpoint threshold while the disk is full, and
// for lowSpaceFor after the last write that found it full.
const (
	lowSpacePages = 100
	lowSpaceFor   = 10 * time.Minute
)

// Check reports whether the state file can be used: it was not found
// damaged, it answers a read, its pages pass SQLite's quick_check (run
// at most every checkEvery while it passes), and its last write did not
// fail. The error says which of these failed.
func (db *DB) Check(ctx context.Context) error {
	if err := db.damaged(); err != nil {
		return err
	}
	db.wh.mu.Lock()
	werr, at, checked := db.wh.err, db.wh.at, db.wh.checked
	db.wh.mu.Unlock()
	now := db.clock.Now()
	if werr != nil {
		return fmt.Errorf("state: the last write, %s ago, failed: %w", now.Sub(at).Round(time.Second), werr)
	}
	if now.Sub(checked) >= checkEvery {
		if err := db.checkNow(ctx); err != nil {
			if derr := db.damaged(); derr != nil {
				return derr
			}
			return err
		}
	}
	return db.view(ctx, func(tx *Tx) error { _, err := tx.Keys(); return err })
}

// quickCheck runs PRAGMA quick_check; problems it finds mark the file
// damaged.
func (db *DB) quickCheck(ctx context.Context) error {
	rows, err := db.r.QueryContext(ctx, "PRAGMA quick_check")
	if err != nil {
		return fmt.Errorf("state: check: %w", db.noteDamage(err))
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return fmt.Errorf("state: check: %w", db.noteDamage(err))
		}
		if s != "ok" {
			problems = append(problems, s)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("state: check: %w", db.noteDamage(err))
	}
	if len(problems) > 0 {
		err := fmt.Errorf("quick_check: %s", problems[0])
		db.wh.mu.Lock()
		if db.wh.damaged == nil {
			db.wh.damaged = err
		}
		db.wh.mu.Unlock()
		return fmt.Errorf("state: the file is damaged: %s", problems[0])
	}
	return nil
}
