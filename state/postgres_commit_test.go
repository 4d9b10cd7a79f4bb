package state_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	neturl "net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/conformance"
	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// A transaction whose connection is cut: before it asks to commit, it is
// run again; once its COMMIT has gone out, it is what the server says
// became of it, asked on another connection — committed, Update
// succeeds and fn is not run again (a second run would record a second
// admission for one call); aborted, it is run again; when the server
// cannot say, Update fails with ErrUnavailable and it is not run again.

func TestPostgresCutConnection(t *testing.T) {
	srv := startPostgres(t)
	for _, c := range []struct {
		name string
		cut  cutAt
		// refuse: the server is out of reach once the connection is cut.
		refuse bool
		// runs is how many times fn runs; fails, whether Update fails
		// (ErrUnavailable, the outcome unknown). The store holds one
		// attempt of the call whatever happened.
		runs  int
		fails bool
	}{
		{"the answer to COMMIT is lost after the server committed", cutAfterCommit, false, 1, false},
		{"the server shuts down in answer to a COMMIT it committed", shutdownAfterCommit, false, 1, false},
		{"the COMMIT never reaches the server", cutAtCommit, false, 2, false},
		{"the answer to COMMIT is lost and the server is out of reach", cutAfterCommit, true, 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			direct, p, pg := cutDatabase(t, srv)
			insert(t, pg, "warm", nil) // connected, migrated, the statements prepared
			runs := 0
			p.arm(c.cut)
			if c.refuse {
				p.refuse(1000)
			}
			err := insertErr(pg, "c1", func() { runs++ })
			p.refuse(0)
			if n := p.cuts.Load(); n != 1 {
				t.Fatalf("the proxy cut %d connections, want 1", n)
			}
			switch {
			case c.fails && err == nil:
				t.Errorf("Update succeeded; want ErrUnavailable: nobody could say whether it committed")
			case c.fails && (!errors.Is(err, state.ErrUnavailable) || !strings.Contains(err.Error(), "unknown")):
				t.Errorf("Update: %v; want ErrUnavailable that says the outcome is unknown", err)
			case !c.fails && err != nil:
				t.Errorf("Update: %v; want success, as the server decided it", err)
			}
			if got := attempts(t, direct, "c1"); got != 1 {
				t.Errorf("the store holds %d attempts of the call, want 1", got)
			}
			if runs != c.runs {
				t.Errorf("fn ran %d times, want %d", runs, c.runs)
			}
			insert(t, pg, "after", nil) // the store serves on a new connection
			if got := attempts(t, direct, "after"); got != 1 {
				t.Errorf("the next Update recorded %d attempts, want 1", got)
			}
		})
	}
	t.Run("the connection drops before the transaction asks to commit", func(t *testing.T) {
		direct, p, pg := cutDatabase(t, srv)
		insert(t, pg, "warm", nil)
		runs := 0
		err := pg.Update(context.Background(), func(tx ledger.Tx) error {
			runs++
			if _, err := tx.InsertAttempt(ledger.Attempt{CallID: "c1", Attempt: 1, Key: "k", State: ledger.Admitted, At: t0}); err != nil {
				return err
			}
			if runs == 1 {
				p.cutNow() // the next statement finds the connection gone
			}
			_, err := tx.(*state.Tx).Activity(ledger.ActivityFilter{Key: "k", Limit: 1})
			return err
		}, "k")
		if err != nil {
			t.Fatalf("Update: %v; want it run again on a new connection", err)
		}
		if runs != 2 {
			t.Errorf("fn ran %d times, want 2: the first run's connection was cut", runs)
		}
		if got := attempts(t, direct, "c1"); got != 1 {
			t.Errorf("the store holds %d attempts of the call, want 1", got)
		}
	})
}

// A call whose admission's COMMIT committed but whose answer was lost
// goes upstream once: the server says the admission committed, so the
// call is admitted, its one admission counts in the key's window, and
// nothing is admitted or sent twice for it.
func TestPostgresLostCommitIsSentOnce(t *testing.T) {
	srv := startPostgres(t)
	var sent atomic.Int64
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { sent.Add(1) }))
	t.Cleanup(api.Close)
	keys, err := keystore.Parse([]byte(testkit.Config{
		Keys: []testkit.Key{{Name: "k", BaseURL: api.URL, SecretEnv: "UPSTREAM_SECRET", Auth: "bearer", MaxRate: 1000,
			Policies: testkit.Window(100, time.Minute)}},
	}.TOML()), keystore.Env{Getenv: func(string) string { return "upstream-secret-3c9e" }})
	if err != nil {
		t.Fatal(err)
	}
	key, err := keys.Key("k")
	if err != nil {
		t.Fatal(err)
	}
	direct, p, pg := cutDatabase(t, srv)
	pc := pacer.New(pg)
	t.Cleanup(func() { pc.Close(context.Background()) })
	client := upstream.New(pc, nil)
	call := func() error {
		resp, err := client.Do(context.Background(), key, upstream.Request{Caller: "sync", Transport: "rest", Path: "/items"})
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := call(); err != nil {
		t.Fatal(err)
	}
	p.arm(cutAfterCommit)
	if err := call(); err != nil {
		t.Errorf("the call whose admission's answer was lost: %v; want it admitted, as the server committed it", err)
	}
	if n := p.cuts.Load(); n != 1 {
		t.Fatalf("the proxy cut %d connections, want 1", n)
	}
	if n := sent.Load(); n != 2 {
		t.Errorf("the upstream got %d calls, want 2: the call whose admission's answer was lost goes once", n)
	}
	var sends int
	view(t, direct, func(tx ledger.ReadTx) error {
		s, err := tx.Sends("k", time.Time{}, 100)
		sends = len(s)
		return err
	})
	if sends != 2 {
		t.Errorf("the key's window counts %d sends, want 2: one admission for each call", sends)
	}
	if err := call(); err != nil {
		t.Errorf("the next call: %v", err)
	}
	if n := sent.Load(); n != 3 {
		t.Errorf("after the next call the upstream got %d calls, want 3", n)
	}
}

// A caller that leaves while its admission's COMMIT is on its way is
// told that whether the admission was recorded is unknown
// (ErrUnavailable, besides its context's error): the server may have
// committed it, as here. Its call is not sent, and the key's next
// transaction in the process ends the attempt, not sent, as after a
// COMMIT whose answer was lost: an attempt left open would count as in
// flight for two minutes, and hold the key as a probe would.
func TestPostgresCallerLeavesDuringCommit(t *testing.T) {
	srv := startPostgres(t)
	direct, p, pg := cutDatabase(t, srv)
	pc := pacer.New(pg)
	t.Cleanup(func() { pc.Close(context.Background()) })
	k := &keystore.Key{Name: "k", MaxRate: 1000, MaxConcurrency: 100,
		Policies: []keystore.Policy{{Name: "default", Quota: 100, Window: time.Minute, Unit: "requests"}}}
	call := func(id string) pacer.Call {
		return pacer.Call{Key: k, Caller: "sync", Transport: "rest", Method: "GET", Target: "/items", CallID: id, Attempt: 1,
			MaxWait: time.Minute}
	}
	if _, err := pc.Admit(context.Background(), call("warm")); err != nil {
		t.Fatal(err)
	}

	p.arm(holdAfterCommit)
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() {
		_, err := pc.Admit(ctx, call("c1"))
		left <- err
	}()
	<-p.holding // the COMMIT went out; its answer is held
	cancel()
	err := <-left
	if !errors.Is(err, context.Canceled) || !errors.Is(err, state.ErrUnavailable) {
		t.Errorf("the call that left during its COMMIT: %v; want its context's error and ErrUnavailable: the admission may stand", err)
	}
	if state.Storage(err) {
		t.Errorf("state.Storage(%v) = true, want false: the caller left, the storage did not fail", err)
	}
	if got := attempts(t, direct, "c1"); got != 1 {
		t.Fatalf("the store holds %d attempts of the call, want 1: the server committed its admission (the test's premise)", got)
	}

	if _, err := pc.Admit(context.Background(), call("c2")); err != nil { // the key's next transaction
		t.Fatal(err)
	}
	view(t, direct, func(tx ledger.ReadTx) error {
		as, err := tx.Call("k", "c1")
		if len(as) != 1 || as[0].State == ledger.Admitted {
			t.Errorf("the attempts of the call that left: %+v; want one, ended not sent", as)
		}
		return err
	})
}

// A journal's batch of outcomes whose COMMIT committed but whose answer
// was lost, when the server cannot be asked what became of it (the
// connection that asks is refused), is applied again — by the journal's
// next try, or, once its process has closed, by the next one's Recover:
// the second time finds each slot recorded and records nothing, so every
// outcome and its observation are there once.
func TestPostgresJournalBatchAppliedTwice(t *testing.T) {
	srv := startPostgres(t)
	url := srv.CreateDatabase(t)
	journals := t.TempDir()
	p := newCommitCutter(t, url)
	pg, err := state.OpenPostgres(context.Background(), p.url, state.PostgresOptions{MaxConns: 1, Timeout: 10 * time.Second, JournalDir: journals})
	if err != nil {
		t.Fatal(err)
	}
	var first, last int64
	update(t, pg, func(tx ledger.Tx) error {
		var err error
		first, last, err = tx.Reserve("k", 3, t0, t0.Add(time.Hour))
		return err
	}, "k")
	p.arm(cutAfterCommit)
	p.refuse(1) // the connection that would ask what became of the batch
	for id := first; id <= last; id++ {
		if err := pg.FinishLater(context.Background(), conformance.FinishedSlot(id, 1)); err != nil {
			t.Fatal(err)
		}
	}
	// View waits for the journal's applier to apply the batch, or to fail.
	if err := pg.View(context.Background(), func(ledger.ReadTx) error { return nil }); err != nil {
		t.Fatalf("View: %v", err)
	}
	if n := p.cuts.Load(); n != 1 {
		t.Fatalf("the proxy cut %d connections, want 1: the batch's", n)
	}
	if n := p.refused.Load(); n != 1 {
		t.Fatalf("the proxy refused %d connections, want 1: the one asking what became of the batch", n)
	}
	pg.Close() // what its journal could not record yet is left for the next process
	next := openPostgres(t, url, state.PostgresOptions{JournalDir: journals})
	if _, err := next.Recover(context.Background()); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	states := map[ledger.State]int{}
	obs := 0
	view(t, next, func(tx ledger.ReadTx) error {
		sends, err := tx.Sends("k", time.Time{}, 100)
		for _, s := range sends {
			states[s.State]++
		}
		if err != nil {
			return err
		}
		records, err := tx.(*state.Tx).Observations("k", 100)
		obs = len(records)
		return err
	})
	if states[ledger.Confirmed] != 3 || len(states) != 1 {
		t.Errorf("the slots' states: %v, want 3 confirmed", states)
	}
	if obs != 3 {
		t.Errorf("%d observations recorded, want 3: one for each outcome", obs)
	}
}

// insert records one admitted attempt of call on key k through s,
// calling ran at each run of the transaction's function.
func insert(t *testing.T, s ledger.Store, call string, ran func()) {
	t.Helper()
	if err := insertErr(s, call, ran); err != nil {
		t.Fatalf("recording %s: %v", call, err)
	}
}

func insertErr(s ledger.Store, call string, ran func()) error {
	return s.Update(context.Background(), func(tx ledger.Tx) error {
		if ran != nil {
			ran()
		}
		_, err := tx.InsertAttempt(ledger.Attempt{CallID: call, Attempt: 1, Key: "k", State: ledger.Admitted, At: t0})
		return err
	}, "k")
}

// attempts counts the attempts of call that s holds.
func attempts(t *testing.T, s ledger.Store, call string) int {
	t.Helper()
	n := 0
	if err := s.View(context.Background(), func(tx ledger.ReadTx) error {
		all, err := tx.Activity(ledger.ActivityFilter{Key: "k", Limit: 1000})
		for _, a := range all {
			if a.CallID == call {
				n++
			}
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// cutAt says where a commitCutter cuts the connection of the next
// transaction that commits.
type cutAt int

const (
	// cutAfterCommit forwards the COMMIT, lets the server answer, and
	// cuts before the answer reaches the client.
	cutAfterCommit cutAt = iota + 1
	// cutAtCommit cuts instead of forwarding the COMMIT.
	cutAtCommit
	// shutdownAfterCommit forwards the COMMIT, lets the server answer,
	// passes on what it said before the COMMIT's own answer, and ends the
	// connection with the server's FATAL of a shutdown (57P01) instead.
	shutdownAfterCommit
	// holdAfterCommit forwards the COMMIT, holds back every answer of the
	// server from then on, says on holding once the server has answered
	// it, and goes on until the client closes the connection.
	holdAfterCommit
)

// A commitCutter is a TCP proxy to a PostgreSQL server that reads the
// frontend protocol (PostgreSQL's "Message Formats": an untyped startup
// packet, then messages of a type byte and an int32 length that counts
// itself) and, once armed, cuts the connection of the next read-write
// transaction's "commit": a simple Query, or a prepared statement's Bind
// in a pipeline (a transaction's last writes go with its COMMIT so); its
// BEGIN says "read only" for a read-only one.
type commitCutter struct {
	ln   net.Listener
	to   string // the server's address
	url  string // the database's URL through the proxy
	cuts atomic.Int64

	mu       sync.Mutex
	armed    cutAt
	holding  chan struct{} // told once a COMMIT went out that holdAfterCommit holds the answer of
	refusing int           // how many of the next connections are closed at once: the server out of reach
	refused  atomic.Int64  // how many were
	links    []*link
	wg       sync.WaitGroup
}

// A link is one client's connection, and its own to the server.
type link struct {
	client, server net.Conn
	lost           atomic.Bool // the server's answers are held back
	answered       chan []byte // what the server said while lost, once it was ready for a query again
}

// cutDatabase makes a database on srv and opens it twice: direct, and
// pg through the cutter p, on one connection (so that a cut connection is
// the transaction's own) with a bound of 10 s.
func cutDatabase(t *testing.T, srv *pgtest.Server) (direct *state.Postgres, p *commitCutter, pg *state.Postgres) {
	t.Helper()
	url := srv.CreateDatabase(t)
	direct = openPostgres(t, url, state.PostgresOptions{})
	p = newCommitCutter(t, url)
	pg = openPostgres(t, p.url, state.PostgresOptions{MaxConns: 1, Timeout: 10 * time.Second})
	return direct, p, pg
}

func newCommitCutter(t *testing.T, url string) *commitCutter {
	t.Helper()
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &commitCutter{ln: ln, to: u.Host, holding: make(chan struct{}, 1)}
	u.Host = ln.Addr().String()
	p.url = u.String()
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.cutNow()
		p.wg.Wait()
	})
	return p
}

// arm has the proxy cut the next transaction's COMMIT at where.
func (p *commitCutter) arm(where cutAt) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = where
}

// refuse has the proxy close the next n connections it accepts at once.
func (p *commitCutter) refuse(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refusing = n
}

// cutNow closes every connection.
func (p *commitCutter) cutNow() {
	p.mu.Lock()
	links := p.links
	p.links = nil
	p.mu.Unlock()
	for _, l := range links {
		l.client.Close()
		l.server.Close()
	}
}

func (p *commitCutter) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.refusing > 0
		if refuse {
			p.refusing--
		}
		p.mu.Unlock()
		if refuse {
			p.refused.Add(1)
			client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.to)
		if err != nil {
			client.Close()
			continue
		}
		l := &link{client: client, server: server, answered: make(chan []byte, 1)}
		p.mu.Lock()
		p.links = append(p.links, l)
		p.mu.Unlock()
		p.wg.Go(func() { p.answers(l) })
		p.wg.Go(func() { p.requests(l) })
	}
}

// answers copies what the server says to the client, unless the link is
// lost.
func (p *commitCutter) answers(l *link) {
	defer l.client.Close()
	buf := make([]byte, 32<<10)
	var held []byte
	for {
		n, err := l.server.Read(buf)
		if n > 0 {
			// A lost link waits for the answer to the COMMIT's Sync or
			// Query: one that ends with ReadyForQuery ('Z', length 5).
			ready := n >= 6 && buf[n-6] == 'Z' && binary.BigEndian.Uint32(buf[n-5:n-1]) == 5
			if l.lost.Load() {
				held = append(held, buf[:n]...)
				if ready {
					select {
					case l.answered <- held:
					default:
					}
				}
			} else if _, err := l.client.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// requests copies what the client says to the server message by
// message, and cuts the link at an armed COMMIT.
func (p *commitCutter) requests(l *link) {
	defer l.server.Close()
	defer l.client.Close()
	// The startup packet: an SSL or GSSAPI encryption request is answered
	// with one byte and followed by another packet; the startup message
	// proper carries protocol version 3.
	for {
		msg, err := readMessage(l.client, false)
		if err != nil {
			return
		}
		if _, err := l.server.Write(msg); err != nil {
			return
		}
		if len(msg) >= 8 && binary.BigEndian.Uint32(msg[4:8])>>16 == 3 {
			break
		}
	}
	readOnly := false            // the transaction under way
	stmts := map[string]string{} // the prepared statements' text, by name
	for {
		msg, err := readMessage(l.client, true)
		if err != nil {
			return
		}
		var query string
		switch msg[0] {
		case 'Q':
			query = strings.ToLower(string(bytes.TrimRight(msg[5:], "\x00; \n")))
		case 'P': // Parse: a statement's name and text, which a Bind runs (a pipeline's)
			name, rest, _ := bytes.Cut(msg[5:], []byte{0})
			text, _, _ := bytes.Cut(rest, []byte{0})
			stmts[string(name)] = strings.ToLower(strings.TrimRight(string(text), "; \n"))
		case 'B': // Bind: a portal's name, then its statement's
			_, rest, _ := bytes.Cut(msg[5:], []byte{0})
			name, _, _ := bytes.Cut(rest, []byte{0})
			query = stmts[string(name)]
		}
		if strings.HasPrefix(query, "begin") {
			readOnly = strings.Contains(query, " read only")
		}
		if query == "commit" && !readOnly {
			p.mu.Lock()
			where := p.armed
			p.armed = 0
			p.mu.Unlock()
			switch where {
			case holdAfterCommit:
				p.cuts.Add(1)
				l.lost.Store(true)
				for msg[0] == 'B' || msg[0] == 'E' || msg[0] == 'D' { // the rest of its pipeline
					if _, err := l.server.Write(msg); err != nil {
						return
					}
					if msg, err = readMessage(l.client, true); err != nil {
						return
					}
				}
				if _, err := l.server.Write(msg); err != nil {
					return
				}
				select { // the server has committed
				case <-l.answered:
				case <-time.After(time.Minute):
				}
				p.holding <- struct{}{}
				continue
			case cutAfterCommit, shutdownAfterCommit:
				p.cuts.Add(1)
				l.lost.Store(true)
				if _, err := l.server.Write(msg); err != nil {
					return
				}
				// In a pipeline, the rest of it, up to its Sync.
				for msg[0] == 'B' || msg[0] == 'E' || msg[0] == 'D' {
					if msg, err = readMessage(l.client, true); err != nil {
						return
					}
					if _, err := l.server.Write(msg); err != nil {
						return
					}
				}
				select { // the server has committed
				case held := <-l.answered:
					if where == shutdownAfterCommit {
						l.client.Write(shutdownAnswer(held))
					}
				case <-time.After(time.Minute):
				}
				return
			case cutAtCommit:
				p.cuts.Add(1)
				return
			}
		}
		if _, err := l.server.Write(msg); err != nil {
			return
		}
	}
}

// shutdownAnswer returns the server's answer held, a pipeline's, cut
// before the COMMIT's own answer (its CommandComplete) and ended by the
// FATAL error a server sends when it shuts down (admin_shutdown, 57P01).
func shutdownAnswer(held []byte) []byte {
	var out []byte
	for len(held) >= 5 {
		n := int(binary.BigEndian.Uint32(held[1:5])) + 1
		if n < 5 || n > len(held) {
			break
		}
		msg := held[:n]
		held = held[n:]
		if msg[0] == 'C' && string(bytes.TrimRight(msg[5:], "\x00")) == "COMMIT" {
			break
		}
		out = append(out, msg...)
	}
	var body []byte
	for _, f := range []string{"SFATAL", "VFATAL", "C57P01", "Mterminating connection due to administrator command"} {
		body = append(append(body, f...), 0)
	}
	body = append(body, 0)
	out = append(out, 'E')
	out = binary.BigEndian.AppendUint32(out, uint32(len(body)+4))
	return append(out, body...)
}

// readMessage reads one frontend message from r: a type byte (when
// typed), then an int32 length that counts itself and the body.
func readMessage(r io.Reader, typed bool) ([]byte, error) {
	head := 4
	if typed {
		head = 5
	}
	msg := make([]byte, head)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(msg[head-4:]))
	if n < 4 || n > 1<<30 {
		return nil, fmt.Errorf("a message of length %d", n)
	}
	msg = append(msg, make([]byte, n-4)...)
	_, err := io.ReadFull(r, msg[head:])
	return msg, err
}
