package state

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// A transaction on PostgreSQL runs on its connection itself, not in
// database/sql's transaction, so that its BEGIN and its last writes need
// no round trips of their own: BEGIN waits to go with the transaction's
// first statement (with the lock of the key's row and the reads, for a
// transaction that holds one key: see holdReading), and the writes whose
// answer the transaction does not need — the attempt it records, the
// pacing state — wait to go with the next statement that needs one, or
// with COMMIT. An admission then holds the key's row for two round trips
// besides the reads its decision needs: the pipeline that locks it, and
// the one that writes and commits.
//
// What waits is sent, in order, ahead of the statement that ends the wait,
// in one pipeline (a pgx batch); the transaction's statements therefore
// run on the server in the order it made them. A write that fails fails
// the transaction where it is sent, with what it was.

// A pgWrite is a statement that waits to be sent (see pgTx.later).
type pgWrite struct {
	what string // what it records, for its error
	text string
	args []any
}

// beginOptions returns the BEGIN of a transaction of opts (nil for
// read-write at the server's default isolation).
func beginOptions(opts *sql.TxOptions) (pgx.TxOptions, error) {
	var o pgx.TxOptions
	if opts == nil {
		return o, nil
	}
	switch opts.Isolation {
	case sql.LevelDefault:
	case sql.LevelReadUncommitted:
		o.IsoLevel = pgx.ReadUncommitted
	case sql.LevelReadCommitted:
		o.IsoLevel = pgx.ReadCommitted
	case sql.LevelRepeatableRead, sql.LevelSnapshot:
		o.IsoLevel = pgx.RepeatableRead
	case sql.LevelSerializable:
		o.IsoLevel = pgx.Serializable
	default:
		return o, fmt.Errorf("state: PostgreSQL has no isolation level %v", opts.Isolation)
	}
	if opts.ReadOnly {
		o.AccessMode = pgx.ReadOnly
	}
	return o, nil
}

// later queues a write to go with the transaction's next round trip.
func (p *pgTx) later(what, text string, args ...any) {
	p.wrote(text)
	p.queue(what, text, args...)
}

// queue queues a write as later does, for a caller that keeps what the
// pipeline read as the write leaves it itself.
func (p *pgTx) queue(what, text string, args ...any) {
	p.waiting = append(p.waiting, pgWrite{what, text, args})
}

// pgXactID reads the ID of the transaction, which a read-write
// transaction's BEGIN goes with (see pgTx.xid), with its epoch: an ID
// that never wraps around. It assigns the ID at once rather than at the
// transaction's first write; a transaction that holds a key takes one at
// its lock anyway. txid_current is pg_current_xact_id under its older
// name, which PostgreSQL 12 has too (the oldest server supported).
const pgXactID = `SELECT txid_current()::text`

// batch returns a pipeline holding what waits to be sent: BEGIN, when it
// has not gone yet, with the transaction's ID for a read-write one, and
// the queued writes. readWaiting reads their answers.
func (p *pgTx) batch() *pgx.Batch {
	b := &pgx.Batch{}
	if !p.begun {
		b.BeginTx(p.opts)
		if p.writes() {
			b.Queue(pgXactID)
		}
	}
	for _, w := range p.waiting {
		b.Queue(w.text, w.args...)
	}
	return b
}

// writes says the transaction is read-write.
func (p *pgTx) writes() bool { return p.opts.AccessMode != pgx.ReadOnly }

// readWaiting reads the answers to what batch queued; what it sent no
// longer waits, whatever they are.
func (p *pgTx) readWaiting(br pgx.BatchResults) error {
	begun, waiting := p.begun, p.waiting
	p.begun, p.waiting = true, nil
	if !begun {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("state: begin: %w", err)
		}
		if p.writes() {
			if err := br.QueryRow().Scan(&p.xid); err != nil {
				return fmt.Errorf("state: begin: the transaction's ID: %w", err)
			}
		}
	}
	for _, w := range waiting {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("state: %s: %w", w.what, err)
		}
	}
	return nil
}

// onConn runs f on the transaction's pgx connection.
func (p *pgTx) onConn(f func(c *pgx.Conn) error) error {
	return p.conn.Raw(func(dc any) error {
		c, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("state: not a pgx connection: %T", dc)
		}
		return f(c.Conn())
	})
}

// send sends what waits, when anything does, before a statement whose
// answer the transaction needs.
func (p *pgTx) send(ctx context.Context) error {
	if p.begun && len(p.waiting) == 0 {
		return nil
	}
	return p.onConn(func(c *pgx.Conn) error {
		br := c.SendBatch(ctx, p.batch())
		err := p.readWaiting(br)
		return errors.Join(err, closeBatch(br, err))
	})
}

// closeBatch closes br, and returns its error unless failed already
// reports the batch's failure.
func closeBatch(br pgx.BatchResults, failed error) error {
	if err := br.Close(); err != nil && failed == nil {
		return err
	}
	return nil
}

// exec runs a statement of the transaction, after what waits.
func (p *pgTx) exec(ctx context.Context, text string, args ...any) (sql.Result, error) {
	if err := p.send(ctx); err != nil {
		return nil, err
	}
	return p.conn.ExecContext(ctx, text, args...)
}

// query runs a statement of the transaction that returns rows, after
// what waits.
func (p *pgTx) query(ctx context.Context, text string, args ...any) (*sql.Rows, error) {
	if err := p.send(ctx); err != nil {
		return nil, err
	}
	return p.conn.QueryContext(ctx, text, args...)
}

// queryRow runs a statement of the transaction that returns a row, after
// what waits.
func (p *pgTx) queryRow(ctx context.Context, text string, args ...any) row {
	if err := p.send(ctx); err != nil {
		return row{err: err}
	}
	return row{r: p.conn.QueryRowContext(ctx, text, args...)}
}

// commit sends what waits with COMMIT, in one round trip. A failure that
// may have come after the server received the COMMIT is a commitError,
// with the transaction's ID when its BEGIN's answer came: the transaction
// may have committed (see Postgres.run). One that certainly came before
// is not: nothing was sent, or the server refused a write before it (the
// transaction was then aborted, and its COMMIT not run).
func (p *pgTx) commit(ctx context.Context) error {
	if !p.begun && len(p.waiting) == 0 {
		return nil // nothing was sent: there is nothing to commit
	}
	return p.onConn(func(c *pgx.Conn) error {
		b := p.batch()
		b.Queue("commit")
		br := c.SendBatch(ctx, b)
		if err := p.readWaiting(br); err != nil {
			br.Close()
			var pe *pgconn.PgError
			if errors.As(err, &pe) || pgconn.SafeToRetry(err) {
				return err
			}
			return &commitError{err: err, xid: p.xid}
		}
		tag, err := br.Exec()
		if err == nil {
			err = br.Close()
		} else {
			br.Close()
		}
		switch {
		case err != nil && pgconn.SafeToRetry(err):
			return err
		case err != nil:
			return &commitError{err: fmt.Errorf("state: commit: %w", err), xid: p.xid}
		case tag.String() != "COMMIT":
			// COMMIT ends a transaction that a statement failed in, as
			// ROLLBACK does: fn went on after an error.
			return fmt.Errorf("state: commit: %w", pgx.ErrTxCommitRollback)
		}
		return nil
	})
}

// abandon ends a transaction that will not commit: it rolls it back when
// its connection can still say so within ctx, or else drops the
// connection (the server then rolls it back), so that no connection goes
// back to the pool inside a transaction that holds a key's row.
func (p *pgTx) abandon(ctx context.Context) {
	if !p.begun {
		return // BEGIN never went: the connection is as it was
	}
	p.onConn(func(c *pgx.Conn) error {
		if c.IsClosed() {
			return driver.ErrBadConn
		}
		if c.PgConn().TxStatus() == 'I' {
			return nil
		}
		if ctx.Err() == nil {
			if _, err := c.Exec(ctx, "rollback"); err == nil && c.PgConn().TxStatus() == 'I' {
				return nil
			}
		}
		return driver.ErrBadConn // dropped, not returned to the pool
	})
}

// The attempts a transaction records wait for its commit, each with an
// ID of the block the transaction took beforehand from the table's
// sequence, in the pipeline that locks the key's row: InsertAttempt
// returns it at once (see insertAttemptLater). pgInsertAttemptAs is
// qInsertAttempt with the ID as its last parameter.
var pgInsertAttemptAs = insertWithID(queries[qInsertAttempt].postgres)

// pgNextAttemptID takes the first ID of a block of attemptBlock, as the
// table's default takes one (see the schema's attempt_blocks).
var pgNextAttemptID = "SELECT nextval('attempt_blocks') * " + strconv.Itoa(attemptBlock)

var pgParam = regexp.MustCompile(`\$([0-9]+)`)

// insertWithID returns text, an INSERT INTO attempts (…) VALUES (…)
// RETURNING id, as the same INSERT giving the ID as a parameter after the
// others, returning nothing.
func insertWithID(text string) string {
	const values, returning = "VALUES (", " RETURNING id"
	cols, vals := strings.Index(text, "("), strings.Index(text, values)
	if !strings.HasPrefix(text, "INSERT INTO attempts") || cols < 0 || vals < cols || !strings.HasSuffix(text, returning) {
		panic("state: qInsertAttempt is not an INSERT INTO attempts (…) VALUES (…) RETURNING id: " + text)
	}
	n := 0
	for _, m := range pgParam.FindAllStringSubmatch(text, -1) {
		k, _ := strconv.Atoi(m[1])
		n = max(n, k)
	}
	vals += len(values)
	return text[:cols+1] + "id, " + text[cols+1:vals] + "$" + strconv.Itoa(n+1) + ", " +
		strings.TrimSuffix(text[vals:], returning)
}

// insertAttemptLater queues the INSERT of an attempt with args
// (qInsertAttempt's) under an ID of the block the transaction took
// beforehand, and returns it; ok is false when it has none left (the
// statement must then run at once). What the transaction read of the log
// is updated with own, the same attempt (see ownAttempt).
func (p *pgTx) insertAttemptLater(args []any, own ownedAttempt) (id int64, ok bool) {
	if p == nil || p.nextID == 0 {
		return 0, false
	}
	id = p.nextID
	if p.nextID++; p.nextID%attemptBlock == 0 {
		p.nextID = 0 // the block is spent
	}
	p.waiting = append(p.waiting, pgWrite{"record attempt", pgInsertAttemptAs, append(args, id)})
	own.id = id
	p.ownAttempt(own)
	return id, true
}

// attemptBlock is how many attempt IDs one value of the sequence
// attempt_blocks stands for: a block of IDs of its own, which the schema's
// default takes one of for each INSERT, and a transaction that took it
// beforehand (pgNextAttemptID) one after another for its attempts. The
// schema's default, Reserve's statement and maxReserve agree with it
// (TestPostgresAttemptBlockAgrees).
const attemptBlock = 1024
