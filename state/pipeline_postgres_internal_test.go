package state

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// A transaction's last writes go with its COMMIT. How that round trip
// fails says whether the transaction may have committed: a write the
// server refuses, or a context that ended before anything was sent,
// leaves it certainly not committed (no commitError: it may be run again);
// an answer lost after the COMMIT reached the server is a commitError, and
// the transaction did commit. Whatever happened, the key's row is not left
// locked by a connection back in the pool.
func TestPostgresCommitBatchFailures(t *testing.T) {
	srv := pgtest.Start(t)
	t.Setenv("PGPASSWORD", srv.Password())
	url := srv.CreateDatabase(t)
	cut := newCommitCut(t, url)
	ctx := context.Background()
	pg, err := OpenPostgres(ctx, cut.url, PostgresOptions{MaxConns: 1, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	// Another host, straight to the server: it reads what committed, and
	// locks the key's row, which it must get (within its bound).
	other, err := OpenPostgres(ctx, url, PostgresOptions{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	const key = "k"
	// admit runs pg.once (not run: once's answer is what is judged here)
	// with an admission of call, then more, in the transaction.
	admit := func(ctx context.Context, call string, more func(tx *Tx) error) error {
		return pg.once(ctx, nil, []string{key}, func(tx *Tx) error {
			now := tx.Clock(time.Now())
			if _, err := tx.InsertAttempt(ledger.Attempt{CallID: call, Attempt: 1, Key: key, State: ledger.Admitted,
				At: now, InFlightUntil: now.Add(time.Hour)}); err != nil {
				return err
			}
			if err := tx.PutKeyState(ledger.KeyState{Key: key, LastAdmitAt: now}); err != nil {
				return err
			}
			return more(tx)
		})
	}
	// recorded says whether call's attempt is in the database, and that
	// another host can hold the key.
	recorded := func(call string) bool {
		t.Helper()
		var n int
		err := other.Update(ctx, func(tx ledger.Tx) error {
			n = 0
			a, err := tx.(*Tx).Call(key, call)
			n = len(a)
			return err
		}, key)
		if err != nil {
			t.Fatalf("another host holding the key: %v", err)
		}
		return n > 0
	}
	if err := admit(ctx, "c0", func(*Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if !recorded("c0") {
		t.Fatal("an admission that committed is not recorded")
	}

	// A write the server refuses, waiting with the attempt for the COMMIT.
	err = admit(ctx, "refused", func(tx *Tx) error {
		tx.pg.later("record a key without a name", "INSERT INTO keys (key) VALUES (NULL)")
		return nil
	})
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23502" {
		t.Errorf("a refused write before the COMMIT: got %v, want the server's not-null violation", err)
	}
	if errors.As(err, new(*commitError)) {
		t.Errorf("a refused write before the COMMIT is a commitError: %v", err)
	}
	if recorded("refused") {
		t.Error("the attempt of a transaction whose write was refused is recorded")
	}

	// The transaction's context ends before its COMMIT is sent.
	cctx, cancel := context.WithCancel(ctx)
	err = admit(cctx, "cancelled", func(*Tx) error {
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) || errors.As(err, new(*commitError)) {
		t.Errorf("a context ended before the COMMIT: got %v, want context.Canceled, not a commitError", err)
	}
	if recorded("cancelled") {
		t.Error("the attempt of a transaction whose COMMIT was never sent is recorded")
	}

	// The server commits, and its answer is lost.
	cut.arm()
	err = admit(ctx, "lost", func(*Tx) error { return nil })
	if !cut.cut.Load() {
		t.Fatal("the proxy saw no COMMIT to cut")
	}
	var ce *commitError
	if !errors.As(err, &ce) {
		t.Errorf("the COMMIT's answer lost: got %v, want a commitError", err)
	} else if ce.xid == "" {
		t.Errorf("the COMMIT's answer lost: %v, with no transaction ID to ask about", err)
	}
	if !recorded("lost") {
		t.Error("the attempt of a transaction whose COMMIT the server answered is not recorded")
	}

	// The store goes on, on a new connection.
	if err := admit(ctx, "after", func(*Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if !recorded("after") {
		t.Error("an admission after the failures is not recorded")
	}
}

// A commitCut is a TCP proxy to a PostgreSQL server that, once armed,
// lets the next COMMIT reach the server, reads the server's whole answer,
// and closes the client's connection without passing it on: the
// transaction committed, and its client cannot know.
type commitCut struct {
	url   string // the proxy's URL
	armed atomic.Bool
	cut   atomic.Bool // a COMMIT's answer was held back
}

func newCommitCut(t *testing.T, url string) *commitCut {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	to := strings.SplitN(strings.SplitN(url, "@", 2)[1], "/", 2)[0]
	c := &commitCut{url: strings.Replace(url, to, ln.Addr().String(), 1)}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", to)
			if err != nil {
				client.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, client, server)
			mu.Unlock()
			var swallow atomic.Bool
			wg.Go(func() { c.toServer(server, client, &swallow) })
			wg.Go(func() { c.toClient(client, server, &swallow) })
		}
	})
	return c
}

// arm makes the proxy cut the next COMMIT's answer.
func (c *commitCut) arm() { c.armed.Store(true) }

// toServer passes the client's messages on, noting the statements that
// are a COMMIT; when armed, a COMMIT makes the answers swallowed from
// then on.
func (c *commitCut) toServer(server, client net.Conn, swallow *atomic.Bool) {
	defer server.Close()
	defer client.Close()
	commits := map[string]bool{} // the names of prepared statements that commit
	in := &pgMessages{r: client, untyped: true}
	for {
		typ, body, raw, err := in.next()
		if err != nil {
			return
		}
		isCommit := func(q []byte) bool { return strings.EqualFold(strings.TrimSpace(string(q)), "commit") }
		switch typ {
		case 'P': // Parse: name, query, …
			name, rest, _ := bytes.Cut(body, []byte{0})
			query, _, _ := bytes.Cut(rest, []byte{0})
			commits[string(name)] = isCommit(query)
		case 'B': // Bind: portal, statement, …
			_, rest, _ := bytes.Cut(body, []byte{0})
			stmt, _, _ := bytes.Cut(rest, []byte{0})
			if commits[string(stmt)] && c.armed.CompareAndSwap(true, false) {
				swallow.Store(true)
			}
		case 'Q': // Query: a simple query
			query, _, _ := bytes.Cut(body, []byte{0})
			if isCommit(query) && c.armed.CompareAndSwap(true, false) {
				swallow.Store(true)
			}
		}
		if _, err := server.Write(raw); err != nil {
			return
		}
	}
}

// toClient passes the server's messages on until a COMMIT's answer is to
// be swallowed: it then reads it to its end (ReadyForQuery), and closes
// both connections.
func (c *commitCut) toClient(client, server net.Conn, swallow *atomic.Bool) {
	defer client.Close()
	defer server.Close()
	in := &pgMessages{r: server}
	for {
		typ, _, raw, err := in.next()
		if err != nil {
			return
		}
		if swallow.Load() {
			if typ == 'Z' {
				c.cut.Store(true)
				return
			}
			continue
		}
		if _, err := client.Write(raw); err != nil {
			return
		}
	}
}

// pgMessages reads the messages of PostgreSQL's protocol from r: a type
// byte and a length, or, for the first message a client sends (untyped),
// a length only.
type pgMessages struct {
	r       io.Reader
	untyped bool
}

func (m *pgMessages) next() (typ byte, body, raw []byte, err error) {
	head := 5
	if m.untyped {
		head = 4
	}
	raw = make([]byte, head)
	if _, err := io.ReadFull(m.r, raw); err != nil {
		return 0, nil, nil, err
	}
	n := binary.BigEndian.Uint32(raw[head-4:])
	if !m.untyped {
		typ = raw[0]
	}
	m.untyped = false
	body = make([]byte, n-4)
	if _, err := io.ReadFull(m.r, body); err != nil {
		return 0, nil, nil, err
	}
	return typ, body, append(raw, body...), nil
}
