package state

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Hosts that wait for another host's probe learn of its answer from the
// database, not from their next poll. A transaction that ends a key's
// probe (its pacing state read with a probe out, and written with none)
// sends, with its COMMIT, a notification on wakeChannel naming the key;
// every other process that waits on the database (OnWake) listens there
// on a connection of its own and wakes the key's waiters at once. The
// notification goes only if the transaction commits, as PostgreSQL's
// NOTIFY does, so a transaction run again sends it once.
//
// It is a shortcut, never the only way: the waiters still re-check at
// their poll (pacer.Poll), so a notification lost with the listener's
// connection costs what it costs without one, and the listener, once
// connected again, wakes every waiter once (key "") since it may have
// missed some. Only a probe's end notifies: it is rare (once a window at
// most), and NOTIFY serialises the commits that send one.
const wakeChannel = "mcp_quota_wake"

// wakeRetry is how long the listener waits before connecting again
// after it lost its connection, or could not make one.
const wakeRetry = time.Second

// wakes is a Postgres's listener and what it calls.
type wakes struct {
	token string // in this Postgres's notifications' payloads: it skips its own

	mu   sync.Mutex
	fns  map[int]func(key string)
	next int
	stop context.CancelFunc // ends the listener; nil before it started
	done chan struct{}      // closed when the listener has ended
}

// newWakeToken returns a token no other process's Postgres has.
func newWakeToken() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// wakePayload is the notification that key's probe ended, from the
// Postgres whose token is token.
func wakePayload(token, key string) string { return token + " " + key }

// OnWake calls fn with a key's name when another process ended that
// key's probe, and with "" when notifications may have been missed (the
// listener connected, or connected again): then every key's waiters
// should re-check. It returns a function that stops the calls. The
// first OnWake starts the listener, on one connection beyond the pool's
// MaxConns; Close ends it.
func (pg *Postgres) OnWake(fn func(key string)) (stop func()) {
	w := &pg.wake
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fns == nil {
		w.fns = map[int]func(string){}
	}
	id := w.next
	w.next++
	w.fns[id] = fn
	pg.connMu.Lock()
	closed := pg.closed
	pg.connMu.Unlock()
	if w.stop == nil && !closed { // Close marks it closed before it ends the listener
		ctx, cancel := context.WithCancel(context.Background())
		w.stop, w.done = cancel, make(chan struct{})
		go pg.listen(ctx)
	}
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.fns, id)
	}
}

// call calls every function OnWake was given with key.
func (w *wakes) call(key string) {
	w.mu.Lock()
	fns := make([]func(string), 0, len(w.fns))
	for _, fn := range w.fns {
		fns = append(fns, fn)
	}
	w.mu.Unlock()
	for _, fn := range fns {
		fn(key)
	}
}

// close ends the listener, if it started, and waits for it.
func (w *wakes) close() {
	w.mu.Lock()
	stop, done := w.stop, w.done
	w.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

// listen listens on wakeChannel until ctx ends, connecting again
// wakeRetry after its connection is lost or cannot be made.
func (pg *Postgres) listen(ctx context.Context) {
	defer close(pg.wake.done)
	for ctx.Err() == nil {
		pg.listenOnce(ctx)
		t, fired := pg.clock.NewTimer(wakeRetry)
		select {
		case <-fired:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// listenOnce connects, listens, and passes on what it hears until its
// connection fails or ctx ends.
func (pg *Postgres) listenOnce(ctx context.Context) {
	cfg := pg.cfg.Copy()
	cfg.Tracer = nil
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), pg.timeout)
		defer cancel()
		conn.Close(ctx) // within the bound, even with the server out of reach
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+wakeChannel); err != nil {
		return
	}
	pg.wake.call("") // what was sent before this LISTEN is not heard: every waiter re-checks
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return
		}
		token, key, ok := strings.Cut(n.Payload, " ")
		if ok && token != pg.wake.token {
			pg.wake.call(key)
		}
	}
}
