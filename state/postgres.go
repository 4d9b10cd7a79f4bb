package state

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state/postgres"
)

// Postgres is the state in a PostgreSQL database, shared by every host
// (and every process on it) that names the same database: each key's
// budget is counted over all of them.
//
// An Update holds each key it is given by locking the key's row (SELECT …
// FOR UPDATE, not an advisory lock, so the same SQL runs on
// PostgreSQL-compatible distributed databases): one key's read-decide-write
// is serialised across hosts, other keys go on beside it. Admission times
// are the server's clock (Tx.Clock), read once the key is held, so hosts
// whose clocks differ count one window. Every transaction is bounded by
// the Timeout it was opened with: a database that is down, unreachable or
// stuck fails calls with ErrUnavailable within it (Storage reports them),
// and service resumes by itself once it answers again. Nothing falls back
// to a local store: a budget counted apart from the other hosts could be
// spent twice.
//
// Its tables are in their own schema, mcp_quota, which Open creates and
// migrates (several hosts may start at once). It is safe for concurrent
// use.
type Postgres struct {
	db       *sql.DB
	cfg      *pgx.ConnConfig // the pool's connections', for the listener's (see OnWake)
	where    string          // user@host:port/database, for errors: never a credential
	tls      bool            // the location asks for TLS, with no fallback without it
	timeout  time.Duration
	clock    clock.Clock // the process's own clock (see PostgresOptions.Clock)
	instance string
	maxConns int          // the most connections the pool holds
	offset   atomic.Int64 // nanoseconds from the process's clock to the server's, as last measured

	// preparing is held (a value in it) by the call that connects and
	// migrates; the others wait for it within their own bound.
	preparing chan struct{}
	ready     atomic.Bool // connected once and migrated

	out   outcomes    // the process's journal (see FinishLater)
	hints windowHints // around where the lock's pipeline reads a key's admissions
	wake  wakes       // the listener that hears other processes end a probe (see OnWake)

	// connecting counts the connections being taken from the pool (see
	// conn), until closed is set; Close waits for them.
	connecting sync.WaitGroup
	connMu     sync.Mutex
	closed     bool
}

// PostgresOptions tune a Postgres; the zero value is the default.
type PostgresOptions struct {
	// Timeout bounds each transaction: connecting, waiting for a key's
	// lock, its statements and its commit. Zero means
	// DefaultPostgresTimeout.
	Timeout time.Duration
	// Instance names this process in the attempts it records (the
	// activity's "instance"); empty means Instance().
	Instance string
	// MaxConns caps the process's connections; zero means 16.
	MaxConns int
	// Clock is the process's own clock, which the server's is measured
	// against (see Now), and the one the journal's linger and backoff run
	// on; nil means real time.
	Clock clock.Clock
	// JournalDir is where this host keeps the journals of its processes
	// (see FinishLater): a local directory of this database's own. Empty
	// means none: outcomes are recorded at once.
	JournalDir string
	// WaitForServer makes a server that does not answer at open no
	// error: the Postgres answers ErrUnavailable until it does, then
	// migrates and serves. Other failures (a refused login, a missing
	// database, a newer schema) still fail OpenPostgres.
	WaitForServer bool
}

// DefaultPostgresTimeout is a transaction's bound when PostgresOptions
// gives none: an admission holds a key for about a millisecond, so waiting
// longer than this means the database is not answering.
const DefaultPostgresTimeout = 2 * time.Second

// ErrUnavailable reports a state database that did not answer: down,
// unreachable, restarting, out of connections, or slower than the
// transaction's bound.
var ErrUnavailable = ledger.ErrUnavailable

// Instance returns the name this process gets in the attempts it
// records: MCP_QUOTA_INSTANCE when it is set, else its host name and
// process ID.
func Instance() string {
	if name := os.Getenv("MCP_QUOTA_INSTANCE"); name != "" {
		return name
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return host + "/" + strconv.Itoa(os.Getpid())
}

// OpenPostgres connects to the database rawURL names
// (postgres://user@host:port/database?sslmode=…, or the keyword/value
// form host=… port=… user=… dbname=… sslmode=…; the standard PG*
// variables fill what it leaves out), creates or migrates mcp-quota's
// schema in it, and measures the server's clock. The password must not be
// in the location: it comes from PGPASSWORD or a password file (~/.pgpass, or
// PGPASSFILE), so that it is in no config file, command line or process
// list. Errors say what to fix, and never hold the password.
func OpenPostgres(ctx context.Context, rawURL string, o PostgresOptions) (*Postgres, error) {
	cfg, where, err := pgConfig(rawURL)
	if err != nil {
		return nil, err
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultPostgresTimeout
	}
	if o.Instance == "" {
		o.Instance = Instance()
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 16
	}
	if cfg.ConnectTimeout == 0 || cfg.ConnectTimeout > o.Timeout {
		cfg.ConnectTimeout = o.Timeout
	}
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["search_path"] = "mcp_quota"
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "mcp-quota"
	}
	cfg.Tracer = pgTracer
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(o.MaxConns)
	db.SetMaxIdleConns(o.MaxConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	pg := &Postgres{db: db, cfg: cfg, where: where, tls: requiresTLS(cfg), timeout: o.Timeout, clock: clock.Or(o.Clock), instance: o.Instance,
		maxConns: o.MaxConns, preparing: make(chan struct{}, 1), wake: wakes{token: newWakeToken()}}
	pg.out.dir, pg.out.update = o.JournalDir, func(ctx context.Context, fn func(*Tx) error) error { return pg.update(ctx, fn) }
	pg.out.clock = pg.clock
	// The journal's directory is made by the first outcome it keeps (and
	// removed by the last process to close it): a state that fails to
	// open leaves nothing behind.
	if err := pg.prepare(ctx, ctx); err != nil && !(o.WaitForServer && errors.Is(err, ErrUnavailable) && ctx.Err() == nil) {
		db.Close()
		return nil, err
	}
	return pg, nil
}

// prepare connects and migrates, once: every transaction waits for it
// until it has succeeded. Waiting for another call that prepares, and
// connecting, end with wait (a transaction's bound); migrating, with ctx
// (see migrate).
func (pg *Postgres) prepare(ctx, wait context.Context) error {
	if pg.ready.Load() {
		return nil
	}
	select {
	case pg.preparing <- struct{}{}:
	case <-wait.Done():
		return pg.failed("connect", wait, wait.Err())
	}
	defer func() { <-pg.preparing }()
	if pg.ready.Load() {
		return nil
	}
	if err := pg.connect(wait); err != nil {
		return err
	}
	if err := pg.migrate(ctx); err != nil {
		return err
	}
	pg.ready.Store(true)
	return nil
}

// pgConfig parses location (a URL or a keyword/value string), refusing
// one that carries a password. Its errors never quote location.
func pgConfig(location string) (*pgx.ConnConfig, string, error) {
	if isKeywordValue(location) {
		if _, err := parseKeywordValue(location); err != nil {
			return nil, "", fmt.Errorf("state: the PostgreSQL connection string does not parse (%v): write it as "+
				"host=HOST port=5432 user=USER dbname=DATABASE sslmode=require, or as postgres://user@host:5432/database?sslmode=require "+
				"(a SQLite file whose name holds '=' is written ./NAME)", err)
		}
	} else {
		u, err := url.Parse(location)
		if err != nil {
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err // without the URL, which may hold a password
			}
			return nil, "", fmt.Errorf("state: the PostgreSQL URL does not parse (%v): write it as postgres://user@host:5432/database?sslmode=require", err)
		}
		if !IsPostgresURL(location) || u.Opaque != "" {
			return nil, "", errors.New("state: a PostgreSQL state is a URL of the form postgres://user@host:5432/database?sslmode=require")
		}
	}
	if HasPassword(location) {
		return nil, "", fmt.Errorf("state: the PostgreSQL location %w", ErrPassword)
	}
	cfg, err := pgx.ParseConfig(location)
	if err != nil {
		var pe *pgconn.ParseConfigError
		if errors.As(err, &pe) && pe.Unwrap() != nil {
			err = pe.Unwrap()
		}
		return nil, "", fmt.Errorf("state: the PostgreSQL location is not usable (%v)", redact(err.Error(), cfg))
	}
	return cfg, pgWhere(cfg), nil
}

// pgWhere names the database cfg reaches, for messages and for the
// journals' directory: user@host:port/database, never a credential.
func pgWhere(cfg *pgx.ConnConfig) string {
	return fmt.Sprintf("%s@%s/%s", cfg.User, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), cfg.Database)
}

// PostgresWhere names the database location reaches, however it is
// spelled: user@host:port/database (the standard PG* variables fill what
// location leaves out). It never holds a credential.
func PostgresWhere(location string) (string, error) {
	_, where, err := pgConfig(location)
	return where, err
}

// redact removes cfg's password from s, should an error quote it.
func redact(s string, cfg *pgx.ConnConfig) string {
	if cfg != nil && cfg.Password != "" {
		s = strings.ReplaceAll(s, cfg.Password, "xxxxx")
	}
	return s
}

// connect opens a first connection, measures the server's clock, and says
// in words what stopped it.
func (pg *Postgres) connect(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, pg.timeout)
	defer cancel()
	err := pg.db.PingContext(ctx) // the clock is read on a connection made already: its round trip alone
	if err == nil {
		before := pg.local()
		var server time.Time
		if err = pg.db.QueryRowContext(ctx, "SELECT clock_timestamp()").Scan(&server); err == nil {
			pg.noteClock(before, server, server, pg.local())
			return nil
		}
	}
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && (pe.Code == "28P01" || pe.Code == "28000"):
		return fmt.Errorf("state: PostgreSQL at %s refused the login (%s): set the password in PGPASSWORD or ~/.pgpass (PGPASSFILE), "+
			"or allow the user in pg_hba.conf", pg.where, pe.Message)
	case errors.As(err, &pe) && pe.Code == "3D000":
		return fmt.Errorf("state: PostgreSQL at %s has no such database (%s): create it (createdb) or name one that exists", pg.where, pe.Message)
	case errors.As(err, &pe):
		return fmt.Errorf("state: PostgreSQL at %s: %s (SQLSTATE %s)", pg.where, pe.Message, pe.Code)
	case tlsFailed(err, pg.tls):
		return fmt.Errorf("state: PostgreSQL at %s: TLS could not be set up (%v): the location asks for TLS (sslmode=require or verify-…); "+
			"turn on ssl in the server's postgresql.conf and give it a certificate, give the CA that signed it in sslrootcert, "+
			"or, on a network you trust, use sslmode=prefer or disable", pg.where, pgCause(err))
	case ctx.Err() != nil:
		return fmt.Errorf("state: PostgreSQL at %s did not answer within %s: is it running, and is the address right? %w",
			pg.where, pg.timeout, ledger.ErrNoAnswer)
	}
	return fmt.Errorf("state: cannot reach PostgreSQL at %s (%v): is it running, and is the address right? %w", pg.where, pgCause(err), noAnswer(err))
}

// noAnswer is the ErrUnavailable of err, a database that did not answer
// rather than refuse: ledger.ErrNoAnswer when err is a wait that ran out
// (the bound, a connection's timeout), else ErrUnavailable itself.
func noAnswer(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || pgconn.Timeout(err) {
		return ledger.ErrNoAnswer
	}
	return ErrUnavailable
}

// pgCause is the innermost useful part of a connection error: for a
// failed dial, the reason alone (its address is in the message already).
func pgCause(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		// pgconn says where it was dialling, and what it was doing, in
		// each layer: the innermost is the reason.
		for inner := error(ce); inner != nil; {
			err = inner
			switch u := inner.(type) {
			case interface{ Unwrap() error }:
				inner = u.Unwrap()
			case interface{ Unwrap() []error }:
				if all := u.Unwrap(); len(all) == 1 {
					inner = all[0]
				} else {
					inner = nil // several addresses tried: each says its own
				}
			default:
				inner = nil
			}
		}
	}
	return err
}

// requiresTLS reports whether cfg connects only over TLS: its first try
// and every fallback have a TLS configuration (sslmode=require,
// verify-ca, verify-full).
func requiresTLS(cfg *pgx.ConnConfig) bool {
	if cfg.TLSConfig == nil {
		return false
	}
	for _, f := range cfg.Fallbacks {
		if f.TLSConfig == nil {
			return false
		}
	}
	return true
}

// tlsFailed reports whether a connection failed on TLS: a certificate
// not accepted, an answer that is not TLS, or — when the location asks
// for TLS — a server that refused it (which pgconn reports without a
// type of its own: a connection error that is neither the network's nor
// the server's).
func tlsFailed(err error, required bool) bool {
	var (
		header  tls.RecordHeaderError
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		invalid x509.CertificateInvalidError
	)
	if errors.As(err, &header) || errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid) {
		return true
	}
	var (
		ce *pgconn.ConnectError
		ne net.Error
		pe *pgconn.PgError
	)
	return required && errors.As(err, &ce) && !errors.As(err, &ne) && !errors.As(err, &pe) &&
		!errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}

// migrate creates mcp-quota's schema, or brings it up to date, in one
// transaction that other hosts starting at once wait for; a schema newer
// than this version knows is refused, with nothing written.
func (pg *Postgres) migrate(ctx context.Context) error {
	all, err := migrations(postgres.Migrations)
	if err != nil {
		return err
	}
	latest := all[len(all)-1].version
	ctx, cancel := context.WithTimeout(ctx, 4*pg.timeout+10*time.Second)
	defer cancel()
	tx, err := pg.db.BeginTx(ctx, nil)
	if err != nil {
		return pg.failed("migrate", ctx, err)
	}
	defer tx.Rollback()
	// One host at a time: CREATE … IF NOT EXISTS run at once by two can
	// still collide.
	steps := []string{
		"SELECT pg_advisory_xact_lock(7195203418764071)",
		"CREATE SCHEMA IF NOT EXISTS mcp_quota",
		"CREATE TABLE IF NOT EXISTS mcp_quota.schema_version (version INTEGER NOT NULL)",
	}
	for _, s := range steps {
		if _, err := tx.ExecContext(ctx, s); err != nil {
			return pg.explainMigration(ctx, err)
		}
	}
	current := 0
	err = tx.QueryRowContext(ctx, "SELECT version FROM mcp_quota.schema_version").Scan(&current)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return pg.explainMigration(ctx, err)
	}
	if current > latest {
		return fmt.Errorf("state: the database at %s holds mcp-quota's schema version %d, newer than this mcp-quota knows (%d): "+
			"run the newer mcp-quota here too; nothing was written (%w)", pg.where, current, latest, ErrNewerSchema)
	}
	if current == latest {
		return nil // rolled back: nothing to write
	}
	for _, m := range all {
		if m.version <= current {
			continue
		}
		body, err := postgres.Migrations.ReadFile(m.name)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "SET LOCAL search_path TO mcp_quota"); err != nil {
			return pg.explainMigration(ctx, err)
		}
		if _, err := tx.ExecContext(ctx, string(body)); err != nil {
			return fmt.Errorf("state: migration %s: %w", m.name, pg.explainMigration(ctx, err))
		}
	}
	if _, err := tx.ExecContext(ctx, "DELETE FROM mcp_quota.schema_version"); err != nil {
		return pg.explainMigration(ctx, err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO mcp_quota.schema_version (version) VALUES ($1)", latest); err != nil {
		return pg.explainMigration(ctx, err)
	}
	if err := tx.Commit(); err != nil {
		return pg.explainMigration(ctx, err)
	}
	return nil
}

func (pg *Postgres) explainMigration(ctx context.Context, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42501" {
		return fmt.Errorf("state: PostgreSQL at %s does not let this user create mcp-quota's schema (%s): "+
			"grant it CREATE on the database, or create the schema mcp_quota owned by it", pg.where, pe.Message)
	}
	return pg.failed("migrate", ctx, err)
}

// noteClock records the difference between the server's clock and the
// process's, from one reading of the server's clock (see clockOffset).
func (pg *Postgres) noteClock(before, started, read, after time.Time) {
	pg.offset.Store(int64(clockOffset(before, started, read, after)))
}

// clockOffset returns how far the server's clock is ahead of the
// process's, from one reading through a round trip, its four instants in
// the order they happen: the process sent the statement at before and had
// its answer at after, on its own clock; the server began the statement at
// started (statement_timestamp()) and read its clock at read
// (clock_timestamp()), once the statement's lock was granted. It is NTP's
// offset, ((started − before) + (read − after)) / 2: the server's midpoint
// minus the process's. The wait between started and read (another
// transaction's lock on the key's row, as long as it holds it) is in the
// round trip but not in its legs; the midpoint of the round trip alone
// would place read that wait's half too early and reckon the server's
// clock ahead by as much. Whatever the legs' lengths, the error is at most
// half of the round trip less that wait. (Keeping only the readings of
// short round trips, NTP's other remedy, would leave a process whose every
// lock waits, a busy key's, with no reading to go by.) A wait read as
// negative or longer than the round trip (a clock stepped meanwhile) is
// taken as none or as the whole round trip: read is placed between before
// and after.
func clockOffset(before, started, read, after time.Time) time.Duration {
	trip := after.Sub(before)
	wait := min(max(read.Sub(started), 0), trip)
	mid := before.Add(trip / 2)
	return read.Add(-wait / 2).Sub(mid)
}

// Now returns the server's clock as this process reckons it: its own
// clock corrected by the difference last measured. The pacer times its
// waits by it; admissions take the server's own (Tx.Clock).
func (pg *Postgres) Now() time.Time {
	return pg.local().Add(time.Duration(pg.offset.Load()))
}

// local returns the process's own clock's time.
func (pg *Postgres) local() time.Time { return pg.clock.Now() }

// Instance returns the name of this process in the attempts it records.
func (pg *Postgres) Instance() string { return pg.instance }

// Where names the database, with no credential.
func (pg *Postgres) Where() string { return pg.where }

// Close records what the process's journal holds and closes its
// connections.
func (pg *Postgres) Close() error {
	first, err := pg.out.close()
	if !first {
		return nil
	}
	pg.connMu.Lock()
	pg.closed = true
	pg.connMu.Unlock()
	pg.wake.close()
	err = errors.Join(err, pg.db.Close())
	pg.connecting.Wait()
	return err
}

// Recover records what the journals of this host's processes that ended
// hold (see DB.Recover). A host that never comes back takes its journal
// with it: how those calls ended, not what they spent — their slots stay
// counted as sent.
func (pg *Postgres) Recover(ctx context.Context) (int, error) { return pg.out.recover(ctx) }

// Check reports whether the database answers a read within the bound.
func (pg *Postgres) Check(ctx context.Context) error {
	return pg.View(ctx, func(tx ledger.ReadTx) error {
		var one int
		return tx.(*Tx).pg.queryRow(tx.(*Tx).ctx, "SELECT 1").Scan(&one)
	})
}

// View runs fn in a read-only snapshot of the database, once every
// outcome this process gave FinishLater is in it.
func (pg *Postgres) View(ctx context.Context, fn func(ledger.ReadTx) error) error {
	if err := pg.out.flush(ctx); err != nil {
		return err
	}
	return pg.run(ctx, &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead}, nil,
		func(tx *Tx) error { return fn(tx) })
}

// Update runs fn in a read-write transaction holding keys (see Postgres).
// A transaction the server aborts to break a deadlock, or that a dropped
// connection ended before it asked to commit, is run again, within the
// bound. One whose COMMIT went out and got no answer is what the server
// says became of it, asked on another connection: committed, Update
// succeeds; aborted, it is run again; when the server cannot say within
// the bound, Update fails with ErrUnavailable, and the transaction may
// have committed; so it does, with ctx's error too, when ctx ends while
// the COMMIT's answer is awaited.
func (pg *Postgres) Update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	return pg.update(ctx, func(tx *Tx) error { return fn(tx) }, keys...)
}

func (pg *Postgres) update(ctx context.Context, fn func(*Tx) error, keys ...string) error {
	keys = slices.Clone(keys)
	slices.Sort(keys) // every transaction locks in one order: no deadlock between two
	keys = slices.Compact(keys)
	return pg.run(ctx, nil, keys, fn)
}

// FinishLater records how a reserved slot's call, or an attempt admitted
// alone, ended: in the process's journal on this host, and in the
// database a moment later with the other outcomes that came meanwhile
// (see DB.FinishLater); without a JournalDir, at once.
func (pg *Postgres) FinishLater(ctx context.Context, f ledger.Finished) error {
	return pg.out.finishLater(ctx, f)
}

// DefersOutcomes says that the pacer records the outcome of an ordinary
// answer through FinishLater even when its call was admitted alone: a
// transaction on the key's row costs round trips to the server, which
// the next admission or the journal's batch spares.
func (pg *Postgres) DefersOutcomes() bool { return true }

// Sweep is DB.Sweep on PostgreSQL, whose autovacuum gives freed space
// back by itself.
func (pg *Postgres) Sweep(ctx context.Context, now, before time.Time) (Swept, error) {
	return sweep(ctx, func(ctx context.Context, fn func(*Tx) error) error { return pg.update(ctx, fn) }, now, before)
}

// run runs fn in one transaction of opts (nil for read-write) holding
// keys, within the bound, again when the server asks for it or the
// connection was lost before the transaction asked to commit. A write
// transaction whose COMMIT went out and got no answer (the connection
// lost, or ended by the server) is not run again blindly: the server may
// have committed it, and a second run would make its writes twice (an
// admission recorded twice for one call). run asks the server, on another
// connection, what became of the transaction (see committed): committed,
// run succeeds, as the COMMIT's answer would have said; aborted, it is
// run again, as one cut off before its COMMIT is. When the server cannot
// say within the bound, run fails with ErrUnavailable, saying that the
// outcome is unknown; so it does, besides ctx's error, when ctx ends while
// the COMMIT's answer is awaited.
func (pg *Postgres) run(ctx context.Context, opts *sql.TxOptions, keys []string, fn func(*Tx) error) error {
	bounded, cancel := context.WithTimeout(ctx, pg.timeout)
	defer cancel()
	if err := pg.prepare(ctx, bounded); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("state: %w", ctx.Err())
		}
		return err
	}
	for try := 1; ; try++ {
		err := pg.once(bounded, opts, keys, fn)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			if unknownCommit(err, opts) {
				// The caller left while the COMMIT was on its way: the
				// server may have committed it. Not asked (nobody waits
				// for the answer), it is an outcome unknown, for the
				// caller to treat as one (see ErrUnavailable).
				return fmt.Errorf("state: %w while a transaction's COMMIT was on its way to PostgreSQL at %s: "+
					"whether it committed is unknown: %w", ctx.Err(), pg.where, ErrUnavailable)
			}
			return fmt.Errorf("state: %w", ctx.Err())
		}
		again := retryable(err)
		if unknownCommit(err, opts) {
			done, why := pg.committed(bounded, err)
			switch {
			case done:
				return nil
			case why != "":
				return fmt.Errorf("state: PostgreSQL at %s: the answer to a transaction's COMMIT was lost (%v), "+
					"and %s: whether it committed is unknown, so it is not run again: %w", pg.where, pgCause(err), why, ErrUnavailable)
			}
			again = true // the server aborted it: as if cut off before its COMMIT
		}
		// A server that ended the connection (pg_terminate_backend, a
		// restart) ended the pool's idle ones too, which fail one by one:
		// those are tried through, within the bound.
		if bounded.Err() == nil && again && (try < 4 || (ended(err) && try < 4+pg.maxConns)) {
			continue
		}
		return pg.failed("transaction", bounded, err)
	}
}

// pgXactStatus asks what became of a transaction, by its ID (see
// pgXactID): "committed", "aborted", "in progress", or NULL when the
// server no longer knows (an ID older than it keeps the status of).
// txid_status is pg_xact_status under its older name, as pgXactID.
const pgXactStatus = `SELECT txid_status($1::bigint)`

// committed asks the server, on a connection other than the lost one,
// whether the transaction whose COMMIT's answer err lost committed: done
// when it did; otherwise why, empty when it was aborted (nothing it wrote
// stands), else why it cannot be known.
//
// A transaction still in progress is asked about again, a little later
// each time, until the bound: its server process is finishing the COMMIT,
// or has not yet seen that its client is gone — it then rolls back. The
// wait stops at the bound because the server may not see it for long (a
// network partition leaves its socket open until TCP's keepalive gives
// up, minutes later, and the row it locked stays locked until then): the
// call fails within the bound it was promised, as when the COMMIT's
// answer is lost and nobody asks.
func (pg *Postgres) committed(ctx context.Context, err error) (done bool, why string) {
	var ce *commitError
	if !errors.As(err, &ce) || ce.xid == "" {
		return false, "its ID was not read"
	}
	wait := time.Millisecond
	for {
		var status sql.NullString
		if err := pg.db.QueryRowContext(ctx, pgXactStatus, ce.xid).Scan(&status); err != nil {
			return false, fmt.Sprintf("asking the server what became of it failed (%v)", pgCause(err))
		}
		switch status.String {
		case "committed":
			return true, ""
		case "aborted":
			return false, ""
		case "in progress":
		default:
			return false, "the server no longer knows what became of it"
		}
		t, c := pg.clock.NewTimer(wait)
		select {
		case <-c:
		case <-ctx.Done():
			t.Stop()
			return false, "it was still in progress at the end of the bound"
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// once runs fn in one transaction on a connection of its own, and
// commits it: the rows of keys are locked first (a single key's with
// BEGIN and the reads a decision needs, in one round trip), and the
// writes that wait for the commit go with it. run calls it again when
// the server asks for a re-run, so fn keeps its effects in tx.
func (pg *Postgres) once(ctx context.Context, opts *sql.TxOptions, keys []string, fn func(*Tx) error) error {
	begin, err := beginOptions(opts)
	if err != nil {
		return err
	}
	conn, err := pg.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	tx := &Tx{ctx: ctx, pg: &pgTx{db: pg, conn: conn, opts: begin}, instance: pg.instance, out: &pg.out}
	committed := false
	defer func() {
		if !committed {
			tx.pg.abandon(ctx)
		}
	}()
	if len(keys) == 1 {
		if err := tx.pg.holdReading(tx, keys[0]); err != nil { // with BEGIN, and what a decision reads (see admit_postgres.go)
			return err
		}
	}
	for _, k := range keys {
		if err := tx.pg.hold(tx, k); err != nil {
			return err
		}
	}
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.pg.flush(tx); err != nil {
		return err
	}
	if err := tx.pg.commit(ctx); err != nil { // with the writes that wait (see pipeline_postgres.go)
		return err
	}
	committed = true
	return nil
}

// conn takes a connection from the pool within ctx. Opening a new one
// runs SCRAM's key derivation, which pgx does not interrupt: on a busy
// machine several connecting at once take longer than a transaction's
// bound. A transaction does not wait past its bound for one; the
// connection, once open, goes back to the pool.
func (pg *Postgres) conn(ctx context.Context) (*sql.Conn, error) {
	type taken struct {
		conn *sql.Conn
		err  error
	}
	pg.connMu.Lock()
	if pg.closed {
		pg.connMu.Unlock()
		return pg.db.Conn(ctx) // the pool's own error
	}
	pg.connecting.Add(1)
	pg.connMu.Unlock()
	got := make(chan taken, 1)
	go func() {
		defer pg.connecting.Done()
		c, err := pg.db.Conn(ctx)
		got <- taken{c, err}
	}()
	select {
	case t := <-got:
		return t.conn, t.err
	case <-ctx.Done():
		pg.connecting.Add(1)
		go func() {
			defer pg.connecting.Done()
			if t := <-got; t.conn != nil {
				t.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// A commitError is the failure of a transaction's COMMIT: the server may
// have committed it before the answer was lost. xid is the transaction's
// ID, "" when it was not read.
type commitError struct {
	err error
	xid string
}

func (e *commitError) Error() string { return e.err.Error() }
func (e *commitError) Unwrap() error { return e.err }

// ended says the server ended the connection err came from.
func ended(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "57P01" || pe.Code == "57P02")
}

// unknownCommit says err leaves it unknown whether a transaction of opts
// committed: it writes, it asked to commit, and the server did not
// answer that it rolled back — the connection was lost or ended after
// the COMMIT went out, or the bound passed while it waited for the
// answer. pgconn.SafeToRetry cannot tell a COMMIT that never went out:
// pgx reports a connection lost while it waits for any answer as "conn
// closed", which it says is safe to retry.
func unknownCommit(err error, opts *sql.TxOptions) bool {
	if opts != nil && opts.ReadOnly || !errors.As(err, new(*commitError)) {
		return false
	}
	var pe *pgconn.PgError
	return !errors.As(err, &pe) || pe.Code == "57P01" || pe.Code == "57P02" // admin_shutdown, crash_shutdown
}

// retryable says the server aborted a transaction that may simply be run
// again: a deadlock broken, a serialisation failure, a connection that
// was dropped (a restart, a network fault) before the transaction asked
// to commit — it committed nothing then —, or one the server ended
// (pg_terminate_backend, a shutdown). A write transaction whose COMMIT
// went out is not run again (see unknownCommit).
func retryable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "40001", "40P01", "57P01", "57P02": // admin_shutdown, crash_shutdown
			return true
		}
		return false
	}
	return errors.Is(err, driver.ErrBadConn) || pgconn.SafeToRetry(err) || lost(err)
}

// lost says err is the connection lost in the middle of a statement: cut,
// reset, or closed by pgx after a read failed.
func lost(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || pgconn.Timeout(err) || errors.As(err, new(*pgconn.ConnectError)) {
		return false // the bound, which run checks itself; a connection not made
	}
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, sql.ErrConnDone)
}

// failed wraps err, from what, as ErrUnavailable when the database did
// not answer rather than refuse.
func (pg *Postgres) failed(what string, ctx context.Context, err error) error {
	if errors.Is(err, ErrUnavailable) {
		return err
	}
	if ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("state: PostgreSQL at %s did not answer within %s: %w", pg.where, pg.timeout, ledger.ErrNoAnswer)
	}
	if unavailable(err) {
		return fmt.Errorf("state: PostgreSQL at %s: %s: %v: %w", pg.where, what, pgCause(err), noAnswer(err))
	}
	return fmt.Errorf("state: PostgreSQL %s: %w", what, err)
}

// unavailable says err is the database not answering: a connection that
// failed or was cut, or a server shutting down, starting, or out of
// resources.
func unavailable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code[:2] {
		case "08", "53", "57", "58":
			return true
		}
		return false
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, sql.ErrConnDone) || pgconn.Timeout(err) || strings.Contains(err.Error(), "conn closed")
}

// pgTx is what a PostgreSQL transaction holds.
type pgTx struct {
	db   *Postgres
	held map[string]bool // keys whose rows it locked
	now  time.Time       // the server's clock when it locked its first key; zero before
	// keyStates are the pacing states of keys it holds, as read or put:
	// no other transaction changes them while it holds their rows, so
	// each is read once, and written once, before the commit (flush),
	// when it was put — an admission that also writes what answers
	// taught puts it twice.
	keyStates map[string]*heldKeyState
	conn      *sql.Conn // the transaction's connection
	read      *pgRead   // what the pipeline read of the key it holds (see holdReading); nil when none, or no longer valid

	opts    pgx.TxOptions // its BEGIN's
	begun   bool          // BEGIN was sent
	xid     string        // a read-write transaction's ID, read with its BEGIN (see pgXactID); "" before
	waiting []pgWrite     // writes that go with the next round trip (see later)
	nextID  int64         // the ID its next attempt takes, of a block it took (see insertAttemptLater); 0 when none
}

type heldKeyState struct {
	s   ledger.KeyState
	put bool // to be written
	// probing says the state as first read had a probe out: writing it
	// with none wakes the waiters of other processes (see wakeChannel).
	probing bool
}

// keyState returns key's pacing state as the transaction read or put it.
func (p *pgTx) keyState(key string) (ledger.KeyState, bool) {
	if p == nil {
		return ledger.KeyState{}, false
	}
	k, ok := p.keyStates[key]
	if !ok {
		return ledger.KeyState{}, false
	}
	return k.s, true
}

// keepKeyState keeps s, as the table would hold it, when the transaction
// holds its key (put: to be written by flush), and says whether it did.
func (p *pgTx) keepKeyState(s ledger.KeyState, put bool) bool {
	if p == nil || !p.held[s.Key] {
		return false
	}
	if p.keyStates == nil {
		p.keyStates = map[string]*heldKeyState{}
	}
	// What a read of the row would give back: microseconds.
	s.LastAdmitAt, s.LastResponseAt = fromMicros(micros(s.LastAdmitAt)), fromMicros(micros(s.LastResponseAt))
	s.ProbeUntil, s.LatencySince = fromMicros(micros(s.ProbeUntil)), fromMicros(micros(s.LatencySince))
	s.Interval = s.Interval.Truncate(time.Microsecond)
	s.Latency, s.PrevLatency = s.Latency.Truncate(time.Microsecond), s.PrevLatency.Truncate(time.Microsecond)
	k := p.keyStates[s.Key]
	if k == nil {
		k = &heldKeyState{probing: !put && s.ProbeAttempt != 0}
		p.keyStates[s.Key] = k
	}
	k.s, k.put = s, k.put || put
	return true
}

// flush queues the writes of the pacing states the transaction put, to
// go with its next round trip (its COMMIT, or the read that needs them);
// it cannot fail.
func (p *pgTx) flush(tx *Tx) error {
	keys := make([]string, 0, len(p.keyStates))
	for key, k := range p.keyStates {
		if k.put {
			keys = append(keys, key)
		}
	}
	slices.Sort(keys)
	for _, key := range keys {
		k := p.keyStates[key]
		p.later("record key state", queries[qPutKeyState].postgres, keyStateArgs(k.s)...)
		k.put = false
		if k.probing && k.s.ProbeAttempt == 0 {
			k.probing = false
			p.queue("wake the key's waiters", "SELECT pg_notify($1, $2)", wakeChannel, wakePayload(p.db.wake.token, key))
		}
	}
	return nil
}

const (
	// The clock is read once the row is locked: in the outer query, above
	// the subquery's lock (which the planner never flattens). Read beside
	// the lock, it would be the time the row was found, before waiting
	// for another host to let it go: an admission could then be timed
	// before the one it waited for, and held back by the pace from it.
	// The statement's start, before that wait, comes with it, so that the
	// wait is kept out of the measured difference between the clocks (see
	// clockOffset).
	qHoldKey = `SELECT statement_timestamp(), clock_timestamp() FROM (SELECT key FROM keys WHERE key = $1 FOR UPDATE) AS held`
	qAddKey  = `INSERT INTO keys (key) VALUES ($1) ON CONFLICT DO NOTHING`
)

// hold locks key's row, adding it the first time, until tx ends.
func (p *pgTx) hold(tx *Tx, key string) error {
	if p.held[key] {
		return nil
	}
	before := p.db.local()
	var started, server time.Time
	err := p.queryRow(tx.ctx, qHoldKey, key).Scan(&started, &server)
	if errors.Is(err, sql.ErrNoRows) {
		if _, err = p.exec(tx.ctx, qAddKey, key); err == nil {
			before = p.db.local() // the reading's round trip alone
			err = p.queryRow(tx.ctx, qHoldKey, key).Scan(&started, &server)
		}
	}
	if err != nil {
		return fmt.Errorf("state: hold key %s: %w", key, err)
	}
	p.noteHeld(key, before, started, server)
	return nil
}

// noteHeld marks key's row as held by the transaction; the first row it
// locks gives the transaction its instant, the server's clock then (read
// between before and now on this process's clock, in a statement the
// server began at started).
func (p *pgTx) noteHeld(key string, before, started, server time.Time) {
	if p.held == nil {
		p.held = map[string]bool{}
	}
	p.held[key] = true
	if p.now.IsZero() {
		p.now = server
		p.db.noteClock(before, started, server, p.db.local())
	}
}

// clock returns the transaction's instant: the server's clock when it
// locked its first key, or read now when it holds none.
func (p *pgTx) clock(tx *Tx, local time.Time) time.Time {
	if !p.now.IsZero() {
		return p.now
	}
	before := p.db.local()
	var server time.Time
	if err := p.queryRow(tx.ctx, "SELECT clock_timestamp()").Scan(&server); err != nil {
		return p.db.Now() // the statements after it fail the same way
	}
	p.now = server
	p.db.noteClock(before, server, server, p.db.local())
	return server
}

// A Store is what both back ends offer: the ledger, and the upkeep the
// commands run.
type Store interface {
	ledger.Store
	// Check reports whether the state can be used.
	Check(ctx context.Context) error
	// Sweep ends the leases that ran out before now and drops the
	// history older than before (see DB.Sweep).
	Sweep(ctx context.Context, now, before time.Time) (Swept, error)
	// Recover records what processes that ended left unrecorded.
	Recover(ctx context.Context) (int, error)
	// SigningKey returns the key called name that every process sharing
	// the state signs with (see signingKey).
	SigningKey(ctx context.Context, name string) ([]byte, error)
	Close() error
}

// OpenStore opens the state at location: a PostgreSQL database for a
// PostgreSQL location (a URL or a keyword/value string; see IsPostgres),
// with o; else a SQLite file, on o's Clock.
func OpenStore(ctx context.Context, location string, o PostgresOptions) (Store, error) {
	if IsPostgres(location) {
		return OpenPostgres(ctx, location, o)
	}
	return Open(ctx, location, WithClock(o.Clock))
}
