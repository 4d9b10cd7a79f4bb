// Package state keeps what mcp-quota knows in one SQLite file: every
// attempt to reach an upstream (the activity, and the sliding-window log
// budgets are counted from), every rate-limit observation with its
// context, the policies seen per key, the gates nothing may pass before,
// the pacing state of each key, warnings, and the last answer per URL.
//
// Several processes on one host may open the same file at once: every
// read-modify-write runs in one short BEGIN IMMEDIATE transaction, so a
// budget shared through the file is shared exactly. Within a process,
// read-modify-writes made at the same time share a transaction and its
// commit, one after another.
package state

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" driver

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state/postgres"
	"github.com/mcp-quota/mcp-quota/state/sqlite"
)

// BusyTimeout bounds how long Update waits for another process's write
// transaction to end before it gives up with an error wrapping ErrBusy.
const BusyTimeout = 10 * time.Second

// CheckpointPages is the most pages the write-ahead log holds before the
// commit that reaches it copies them back into the file (a checkpoint),
// ten times SQLite's default; a smaller file checkpoints sooner (see
// CheckpointAt). A checkpoint syncs the file twice, and every writer of
// the process waits for the commit that runs it: on a busy key with a
// large history, at the default, that was a tenth of all the writer's
// time. Each checkpoint also copies a page once however often it was
// written since the last, and the log is reused after it: it stays within
// about CheckpointPages × 4 KiB (40 MiB).
const CheckpointPages = 10000

// ErrNewerSchema reports a state written by a newer mcp-quota, which
// this one does not open: nothing is written to it.
var ErrNewerSchema = errors.New("the state was written by a newer mcp-quota")

// ErrBusy reports a state file that stayed locked by another process's
// writer for longer than BusyTimeout.
var ErrBusy = errors.New("state file busy")

// A DB is an open state file. It is safe for concurrent use, by several
// goroutines and by several processes opening the same file.
type DB struct {
	w *sql.DB // one connection: writers queue in Go, not in SQLite's busy loop
	// wc is w's connection, held for the DB's life: Update runs its
	// transactions on it with statements of its own (BEGIN IMMEDIATE …
	// COMMIT), which spares database/sql's per-transaction and per-query
	// goroutines.
	wc     *sql.Conn
	ctl    [nControl]*sql.Stmt // transaction control, prepared on wc
	r      *sql.DB             // readers; WAL lets them run beside the writer
	ws, rs *statements         // the package's statements, on wc and on r, each prepared on its first use
	path   string

	mu      sync.Mutex
	queue   []*write // Update calls waiting for a transaction
	writing bool     // a goroutine runs transactions for the queue

	out      outcomes // the process's journal (see FinishLater)
	instance string   // this process in the attempts it records (see Instance)

	wh writeHealth    // how the last writes ended (see Check)
	bg sync.WaitGroup // the background checks (see watch)

	clock clock.Clock // the process's clock: health's times, the journal's timers

	lockWait clock.Clock // what the waits for another process's write lock run on (see begin): nil, real time; a test's clock in this package's tests
}

// An Option tunes a DB at Open.
type Option func(*DB)

// WithClock makes c the DB's clock: what its health checks are dated by
// (Check), and what the journal's linger and backoff run on. Nil means
// real time. Waits for a write lock another process holds are real time
// whatever c is (see Update). Admission times are not the DB's: they are
// the pacer's.
func WithClock(c clock.Clock) Option { return func(db *DB) { db.clock = clock.Or(c) } }

// Open opens (creating if needed) the state file at path and brings its
// schema up to date; opts tune the DB (WithClock).
func Open(ctx context.Context, path string, opts ...Option) (*DB, error) {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("state: %w", err)
		}
	}
	w, r, creating, err := openPools(path)
	if err != nil {
		return nil, err
	}
	db := &DB{w: w, r: r, path: path, instance: Instance(), clock: clock.Real}
	for _, o := range opts {
		o(db)
	}
	db.out.dir, db.out.update, db.out.clock = journalDir(path), db.update, db.clock
	if err := db.prepare(ctx, creating); err != nil {
		db.Close()
		return nil, err
	}
	if err := restrictFiles(path); err != nil {
		db.Close()
		return nil, err
	}
	if _, err := db.Recover(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// openPools opens the state file at path twice: the writer's pool of one
// connection and the readers' pool. creating reports that the file did
// not exist.
func openPools(path string) (w, r *sql.DB, creating bool, err error) {
	// Pragmas go in the DSN: database/sql opens several connections and
	// each must carry them (modernc.org/sqlite has no default busy timeout).
	// The writer waits for other processes' write locks in Update's own
	// loop rather than in SQLite's busy handler, whose sleeps grow to
	// 100 ms and let one busy process starve another.
	file := "file:" + (&url.URL{Path: path}).EscapedPath()
	const pragmas = "&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)"
	//
	// A new file gives back the pages the sweep frees, a few at a time
	// (Sweep): SQLite takes the auto_vacuum mode only before the first
	// table, so it comes before journal_mode, which writes a new file's
	// header — and only for a file that does not exist yet, since setting
	// it takes the write lock, for which it waits (another process may be
	// creating the same file). A file made by an earlier version keeps
	// its freed pages for its own reuse; VACUUM with the processes
	// stopped gives them back.
	//
	// The DSN holds one busy_timeout: the driver runs its pragmas sorted,
	// busy_timeout first, in no set order between two of them. Once the
	// connection is open, the writer of a new file waits for no lock in
	// SQLite's busy handler either (see prepare).
	first := "_pragma=busy_timeout(0)&"
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		first, creating = "_pragma=busy_timeout(10000)&_pragma=auto_vacuum(2)&", true
		// Made empty (SQLite reads it as a new database) and readable by
		// this user alone: SQLite gives the -wal and -shm files it makes
		// beside it the file's own mode. Another process may make it
		// first.
		if f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err == nil {
			f.Close()
		}
	}
	w, err = sql.Open("sqlite", file+"?"+first+fmt.Sprintf("_pragma=wal_autocheckpoint(%d)", MinCheckpointPages)+pragmas)
	if err != nil {
		return nil, nil, false, fmt.Errorf("state: open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	r, err = sql.Open("sqlite", file+"?_pragma=busy_timeout(10000)"+pragmas+"&_pragma=query_only(1)")
	if err != nil {
		w.Close()
		return nil, nil, false, fmt.Errorf("state: open %s: %w", path, err)
	}
	r.SetMaxOpenConns(4)
	return w, r, creating, nil
}

// prepare readies a newly opened db: the writer's connection and its
// statements, no busy handler on a file it is creating, the schema up to
// date, and the readers' statements.
func (db *DB) prepare(ctx context.Context, creating bool) error {
	if err := db.prepareControl(ctx); err != nil {
		return fmt.Errorf("state: open %s: %w", db.path, err)
	}
	if creating {
		if _, err := db.wc.ExecContext(ctx, "PRAGMA busy_timeout = 0"); err != nil {
			return fmt.Errorf("state: open %s: %w", db.path, err)
		}
	}
	if err := db.migrate(ctx); err != nil {
		return fmt.Errorf("state: %s: %w", db.path, err)
	}
	var err error
	if db.rs, err = prepareAll(ctx, db.r); err != nil {
		return fmt.Errorf("state: %s: %w", db.path, err)
	}
	return nil
}

// restrictFiles makes the state file at path, and the -wal and -shm
// files beside it, readable by this user alone.
func restrictFiles(path string) error {
	if err := os.Chmod(path, 0o600); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("state: %w", err)
	}
	// The -wal and -shm files an earlier version made readable by others;
	// those another user's process made stay as they are.
	os.Chmod(path+"-wal", 0o600)
	os.Chmod(path+"-shm", 0o600)
	return nil
}

// Path returns the file the DB was opened from.
func (db *DB) Path() string { return db.path }

// DefersOutcomes says that the pacer records the outcome of an ordinary
// answer through FinishLater even when its call was admitted alone, when
// the process has a journal: a line appended to the journal costs a
// write, where a transaction of its own costs a commit of the state file
// (its write-ahead log's append and sync), and the journal's applier
// records the outcomes that came within its linger in one transaction.
// Other processes see the call in flight until then, a few milliseconds.
func (db *DB) DefersOutcomes() bool { return journaling && db.out.dir != "" }

// Close records what the process's journal holds (see FinishLater) and
// closes the file.
func (db *DB) Close() error {
	first, err := db.out.close()
	if !first {
		return nil
	}
	db.bg.Wait()
	errs := []error{err}
	for _, s := range append(append(db.ws.prepared(), db.rs.prepared()...), db.ctl[:]...) {
		if s != nil {
			errs = append(errs, s.Close())
		}
	}
	if db.wc != nil {
		errs = append(errs, db.wc.Close())
	}
	return errors.Join(append(errs, db.r.Close(), db.w.Close())...)
}

// A query is one of the package's SQL statements, prepared once per
// connection (parsing a statement costs more than running most of
// them): on the writer's connection at its first use, on the readers
// when the file is opened (see prepareAll). Preparing them all twice was
// most of the work of opening an existing file.
type query int

// queries are the package's statements, each in the SQL of each back end
// (the packages state/sqlite and state/postgres hold them, by name).
var queries []queryText

type queryText struct{ name, sqlite, postgres string }

// newQuery registers the statement called name, as each back end writes
// it, to prepare. A statement one back end has no use for (SQLite's
// pragmas) is missing from the other's table: running it there fails.
func newQuery(name string) query {
	s, onSQLite := sqlite.Statements[name]
	p, onPostgres := postgres.Statements[name]
	if !onSQLite && !onPostgres {
		panic("state: no back end has a statement called " + name)
	}
	queries = append(queries, queryText{name, s, p})
	return query(len(queries) - 1)
}

// statements are the package's SQLite statements on one connection (or
// pool), each prepared at its first use (see prepareAll). Safe for
// concurrent use.
type statements struct {
	prepare func(ctx context.Context, text string) (*sql.Stmt, error)
	mu      sync.Mutex                 // held while one is prepared
	s       []atomic.Pointer[sql.Stmt] // by query; nil until prepared
}

func newStatements(prepare func(ctx context.Context, text string) (*sql.Stmt, error)) *statements {
	return &statements{prepare: prepare, s: make([]atomic.Pointer[sql.Stmt], len(queries))}
}

// get returns q, prepared.
func (p *statements) get(ctx context.Context, q query) (*sql.Stmt, error) {
	if s := p.s[q].Load(); s != nil {
		return s, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.s[q].Load(); s != nil {
		return s, nil
	}
	text := queries[q].sqlite
	if text == "" {
		return nil, fmt.Errorf("state: SQLite has no statement %s", queries[q].name)
	}
	s, err := p.prepare(ctx, text)
	if err != nil {
		return nil, fmt.Errorf("state: prepare %s %q: %w", queries[q].name, text, err)
	}
	p.s[q].Store(s)
	return s, nil
}

// prepareAll prepares every statement on the readers r now: one
// prepared at its first use would wait, inside a View holding one of r's
// connections, for another to be free, and with every reader in a View
// none would be.
func prepareAll(ctx context.Context, r *sql.DB) (*statements, error) {
	p := newStatements(r.PrepareContext)
	for q := range queries {
		if queries[q].sqlite == "" {
			continue
		}
		if _, err := p.get(ctx, query(q)); err != nil {
			return p, err
		}
	}
	return p, nil
}

// prepared returns the statements prepared so far.
func (p *statements) prepared() []*sql.Stmt {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*sql.Stmt
	for i := range p.s {
		if s := p.s[i].Load(); s != nil {
			out = append(out, s)
		}
	}
	return out
}

// A migration is one of a back end's embedded schema migrations,
// NNNN_name.sql, numbered by its name.
type migration struct {
	name    string
	version int
}

// migrations are fsys's migrations in the order of their numbers, which
// rise and may skip (a schema is at the version of the latest migration
// applied).
func migrations(fsys fs.FS) ([]migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, err
	}
	var all []migration
	for _, e := range entries { // in the order of their names
		version, err := strconv.Atoi(strings.SplitN(e.Name(), "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("state: migration %s: its name must start with its version", e.Name())
		}
		if len(all) > 0 && version <= all[len(all)-1].version {
			return nil, fmt.Errorf("state: migration %s is out of order", e.Name())
		}
		all = append(all, migration{e.Name(), version})
	}
	if len(all) == 0 {
		return nil, errors.New("state: no migration")
	}
	return all, nil
}

// migrate applies, in order, each embedded migration newer than the
// file's user_version, all in one transaction; a file already at the
// latest version is only read (no write transaction, so that a start on
// it waits for no other process's writer).
func (db *DB) migrate(ctx context.Context) error {
	all, err := migrations(sqlite.Migrations)
	if err != nil {
		return err
	}
	latest := all[len(all)-1].version
	var current int
	if err := db.r.QueryRowContext(ctx, "PRAGMA user_version").Scan(&current); err != nil {
		return err
	}
	if current > latest {
		return fmt.Errorf("%w: its schema is version %d, newer than this mcp-quota knows (%d): run the newer mcp-quota, "+
			"or point this one at another file", ErrNewerSchema, current, latest)
	}
	if current == latest {
		return nil
	}
	return db.update(ctx, func(tx *Tx) error {
		var current int // again, under the write lock: another process may have migrated since
		if err := db.wc.QueryRowContext(ctx, "PRAGMA user_version").Scan(&current); err != nil {
			return err
		}
		for _, m := range all {
			if current >= m.version {
				continue
			}
			body, err := sqlite.Migrations.ReadFile(m.name)
			if err != nil {
				return err
			}
			if _, err := db.wc.ExecContext(ctx, string(body)); err != nil {
				return fmt.Errorf("migration %s: %w", m.name, err)
			}
		}
		if current >= latest {
			return nil
		}
		_, err := db.wc.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", latest))
		return err
	})
}

// View runs fn in a read-only snapshot of the file, once every outcome
// this process gave FinishLater is in it.
func (db *DB) View(ctx context.Context, fn func(ledger.ReadTx) error) error {
	return db.view(ctx, func(tx *Tx) error { return fn(tx) })
}

// view is View with the back end's own Tx.
func (db *DB) view(ctx context.Context, fn func(*Tx) error) error {
	// What this process finished is read as finished.
	if err := db.out.flush(ctx); err != nil {
		return err
	}
	// A read-only transaction is a deferred one: readers never take the
	// write lock.
	tx, err := db.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("state: begin: %w", err)
	}
	defer tx.Rollback()
	return db.noteDamage(fn(&Tx{tx: tx, stmts: db.rs, ctx: ctx}))
}

// IntegrityCheck runs PRAGMA integrity_check and returns its findings; an
// empty result means the file is sound.
func (db *DB) IntegrityCheck(ctx context.Context) ([]string, error) {
	rows, err := db.r.QueryContext(ctx, "PRAGMA integrity_check")
	if err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		if s != "ok" {
			problems = append(problems, s)
		}
	}
	return problems, rows.Err()
}

// micros converts t to the file's time representation; the zero time is 0.
func micros(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

// fromMicros converts back; 0 is the zero time.
func fromMicros(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us)
}
