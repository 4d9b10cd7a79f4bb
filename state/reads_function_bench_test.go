package state_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcp-quota/mcp-quota/internal/pgtest"
)

// BenchmarkReadsAsFunction measures whether the reads an unleased
// admission sends with its key's row lock (see admit_postgres.go) cost
// less as one PL/pgSQL function than as a pipeline of statements, on a
// schema of the same shape (a key's row, its policies, gates, calls in
// flight, latest admissions, admissions around a window's start) and with
// the same writes and COMMIT after: reads=pipeline sends the lock and
// seven reads as statements of their own, as the state does;
// reads=arrays calls a function that locks and reads, each statement on
// a snapshot of its own (VOLATILE), and returns one row of arrays;
// reads=rows one that returns the reads' rows (RETURN QUERY);
// reads=union sends the lock, then the seven reads as one statement of
// tagged rows (UNION ALL: one snapshot, taken after the lock, as each of
// the pipeline's); reads=lock sends the lock alone, no reads, for what the
// reads cost together. Twelve
// connections over 100 keys, as the pacer's 100-key cell; tx/s is the
// transactions a second in all. Run the binary several times (the three
// in turns): docs/benchmarks-log.md has the figures.
func BenchmarkReadsAsFunction(b *testing.B) {
	srv := pgtest.Start(b)
	ctx := context.Background()
	url := srv.CreateDatabase(b) + "&password=" + srv.Password()
	setup, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer setup.Close(ctx)
	if _, err := setup.Exec(ctx, readsSchema); err != nil {
		b.Fatal(err)
	}
	const keys = 100
	for i := range keys {
		k := fmt.Sprint("key", i)
		if _, err := setup.Exec(ctx, `INSERT INTO keys (key) VALUES ($1);`, k); err != nil {
			b.Fatal(err)
		}
		if _, err := setup.Exec(ctx, `INSERT INTO policies VALUES ($1, 'p', 100, 10000000), ($1, 'q', 1000, 60000000)`, k); err != nil {
			b.Fatal(err)
		}
	}
	var ids atomic.Int64
	for _, reads := range []string{"pipeline", "arrays", "rows", "union", "lock"} {
		b.Run("reads="+reads, func(b *testing.B) {
			// Each starts from an empty log: the runs are alike whatever ran before.
			if _, err := setup.Exec(ctx, "TRUNCATE attempts"); err != nil {
				b.Fatal(err)
			}
			const callers = 12
			conns := make([]*pgx.Conn, callers)
			for i := range conns {
				c, err := pgx.Connect(ctx, url)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close(ctx)
				conns[i] = c
			}
			var next atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			b.ResetTimer()
			for w, c := range conns {
				wg.Go(func() {
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						k := fmt.Sprint("key", (int(i)*7+w)%keys)
						if err := readsAndWrites(ctx, c, reads, k, ids.Add(1)); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tx/s")
		})
	}
}

const readsSchema = `
CREATE TABLE keys (key text PRIMARY KEY, last bigint NOT NULL DEFAULT 0, n bigint NOT NULL DEFAULT 0, a bigint DEFAULT 0, c text DEFAULT '');
CREATE TABLE policies (key text, name text, quota bigint, win bigint, PRIMARY KEY (key, name));
CREATE TABLE gates (key text, source text, until bigint, PRIMARY KEY (key, source));
CREATE SEQUENCE blocks;
CREATE TABLE attempts (id bigint PRIMARY KEY, key text NOT NULL, seq bigint NOT NULL, at bigint NOT NULL, counted boolean NOT NULL, lease_until bigint, bytes bigint);
CREATE INDEX attempts_sends ON attempts (key, at, seq) WHERE counted;
CREATE INDEX attempts_flight ON attempts (key, at, id) WHERE lease_until IS NOT NULL;

CREATE FUNCTION reads_arrays(k text, after bigint, until bigint, lim int,
	OUT now bigint, OUT next bigint, OUT last bigint, OUT n bigint, OUT a bigint, OUT c text,
	OUT pnames text[], OUT pquotas bigint[], OUT pwins bigint[],
	OUT gsources text[], OUT guntils bigint[],
	OUT fids bigint[], OUT fats bigint[],
	OUT lseqs bigint[], OUT lats bigint[],
	OUT sseqs bigint[], OUT sats bigint[])
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
	PERFORM 1 FROM keys WHERE key = k FOR UPDATE;
	now := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
	next := nextval('blocks');
	SELECT keys.last, keys.n, keys.a, keys.c INTO last, n, a, c FROM keys WHERE key = k;
	SELECT array_agg(name), array_agg(quota), array_agg(win) INTO pnames, pquotas, pwins FROM policies WHERE key = k;
	SELECT array_agg(source), array_agg(g.until) INTO gsources, guntils FROM gates g WHERE key = k AND g.until > now;
	SELECT array_agg(id), array_agg(at) INTO fids, fats FROM (SELECT id, at FROM attempts
		WHERE key = k AND lease_until IS NOT NULL AND lease_until > now ORDER BY at, id LIMIT 64) f;
	SELECT array_agg(seq), array_agg(at) INTO lseqs, lats FROM (SELECT seq, at FROM attempts
		WHERE key = k AND counted ORDER BY at DESC, seq DESC LIMIT 64) l;
	SELECT array_agg(seq), array_agg(at) INTO sseqs, sats FROM (SELECT seq, at FROM attempts
		WHERE key = k AND counted AND at > now - after AND at <= now - until ORDER BY at, seq LIMIT lim) s;
END $$;

CREATE FUNCTION reads_rows(k text, after bigint, until bigint, lim int)
RETURNS TABLE (part int, i1 bigint, i2 bigint, i3 bigint, t text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE now bigint;
BEGIN
	PERFORM 1 FROM keys WHERE key = k FOR UPDATE;
	now := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
	RETURN QUERY SELECT 0, now, nextval('blocks'), 0::bigint, ''::text;
	RETURN QUERY SELECT 1, keys.last, keys.n, keys.a, keys.c FROM keys WHERE key = k;
	RETURN QUERY SELECT 2, quota, win, 0::bigint, name FROM policies WHERE key = k;
	RETURN QUERY SELECT 3, g.until, 0::bigint, 0::bigint, source FROM gates g WHERE key = k AND g.until > now;
	RETURN QUERY SELECT 4, id, at, count(*) OVER (), ''::text FROM attempts
		WHERE key = k AND lease_until IS NOT NULL AND lease_until > now ORDER BY at, id LIMIT 64;
	RETURN QUERY SELECT 5, seq, at, 0::bigint, ''::text FROM attempts
		WHERE key = k AND counted ORDER BY at DESC, seq DESC LIMIT 64;
	RETURN QUERY SELECT 6, seq, at, 0::bigint, ''::text FROM attempts
		WHERE key = k AND counted AND at > now - after AND at <= now - until ORDER BY at, seq LIMIT lim;
END $$;
`

// readsAndWrites runs one admission's transaction on key k: BEGIN with
// the transaction's ID, the lock and the reads as reads says, every row
// decoded; then an attempt, the key's row and COMMIT in one pipeline.
func readsAndWrites(ctx context.Context, c *pgx.Conn, reads, k string, id int64) error {
	const now = `current_setting('x.now')::bigint`
	after, until := int64(10_050_000), int64(9_950_000)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SELECT txid_current()::text")
	const lock = `SELECT c, set_config('x.now', (extract(epoch FROM c) * 1000000)::bigint::text, true), statement_timestamp()
		FROM (SELECT clock_timestamp() AS c FROM (SELECT key FROM keys WHERE key = $1 FOR UPDATE) AS held) AS t`
	switch reads {
	case "lock":
		b.Queue(lock, k)
	case "union":
		b.Queue(lock, k)
		b.Queue(`SELECT 0, nextval('blocks'), 0::bigint, 0::bigint, ''::text
			UNION ALL SELECT 1, last, n, a, c FROM keys WHERE key = $1
			UNION ALL SELECT 2, quota, win, 0, name FROM policies WHERE key = $1
			UNION ALL SELECT 3, until, 0, 0, source FROM gates WHERE key = $1 AND until > `+now+`
			UNION ALL (SELECT 4, id, at, count(*) OVER (), '' FROM attempts
				WHERE key = $1 AND lease_until IS NOT NULL AND lease_until > `+now+` ORDER BY at, id LIMIT 64)
			UNION ALL (SELECT 5, seq, at, 0, '' FROM attempts WHERE key = $1 AND counted ORDER BY at DESC, seq DESC LIMIT 64)
			UNION ALL (SELECT 6, seq, at, 0, '' FROM attempts WHERE key = $1 AND counted AND at > `+now+` - $2 AND at <= `+now+` - $3
				ORDER BY at, seq LIMIT $4)`, k, after, until, 64)
	case "pipeline":
		b.Queue(lock, k)
		b.Queue(`SELECT nextval('blocks')`)
		b.Queue(`SELECT last, n, a, c FROM keys WHERE key = $1`, k)
		b.Queue(`SELECT name, quota, win FROM policies WHERE key = $1`, k)
		b.Queue(`SELECT source, until FROM gates WHERE key = $1 AND until > `+now, k)
		b.Queue(`SELECT id, at, count(*) OVER () FROM attempts WHERE key = $1 AND lease_until IS NOT NULL AND lease_until > `+now+`
			ORDER BY at, id LIMIT 64`, k)
		b.Queue(`SELECT seq, at FROM attempts WHERE key = $1 AND counted ORDER BY at DESC, seq DESC LIMIT 64`, k)
		b.Queue(`SELECT seq, at FROM attempts WHERE key = $1 AND counted AND at > `+now+` - $2 AND at <= `+now+` - $3
			ORDER BY at, seq LIMIT $4`, k, after, until, 64)
	case "arrays":
		b.Queue(`SELECT * FROM reads_arrays($1, $2, $3, $4)`, k, after, until, 64)
	case "rows":
		b.Queue(`SELECT * FROM reads_rows($1, $2, $3, $4)`, k, after, until, 64)
	}
	br := c.SendBatch(ctx, b)
	for range b.Len() {
		rows, err := br.Query()
		if err == nil {
			for err == nil && rows.Next() {
				_, err = rows.Values()
			}
			rows.Close()
			err = errors.Join(err, rows.Err())
		}
		if err != nil {
			br.Close()
			return err
		}
	}
	if err := br.Close(); err != nil {
		return err
	}
	w := &pgx.Batch{}
	w.Queue(`INSERT INTO attempts VALUES ($1, $2, $1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, true, NULL, 10)`, id, k)
	w.Queue(`UPDATE keys SET last = $2, n = n + 1 WHERE key = $1`, k, id)
	w.Queue("COMMIT")
	return c.SendBatch(ctx, w).Close()
}
