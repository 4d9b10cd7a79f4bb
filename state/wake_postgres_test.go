package state_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// heard is what a Postgres's OnWake passed on, in order.
type heard chan string

func listenOn(t *testing.T, pg *state.Postgres) heard {
	t.Helper()
	h := make(heard, 16)
	t.Cleanup(pg.OnWake(func(key string) { h <- key }))
	// The listener says, once it listens, that every waiter should
	// re-check (""): from then on nothing sent is missed.
	if key := h.next(t); key != "" {
		t.Fatalf("the listener's first word: got %q, want \"\" (every key, once it listens)", key)
	}
	return h
}

// next is the next key heard, within a bound that only a hang reaches.
func (h heard) next(t *testing.T) string {
	t.Helper()
	select {
	case key := <-h:
		return key
	case <-time.After(30 * time.Second):
		t.Fatal("nothing heard within 30 s")
		return ""
	}
}

// want fails t unless the next key heard is key; why says what that shows.
func (h heard) want(t *testing.T, key, why string) {
	t.Helper()
	if got := h.next(t); got != key {
		t.Errorf("heard %q, want %q: %s", got, key, why)
	}
}

// probeOutAndBack sends a probe of key out and ends it, as two
// transactions of pg.
func probeOutAndBack(t *testing.T, pg *state.Postgres, key string) {
	t.Helper()
	putProbe(t, pg, key, 42)
	putProbe(t, pg, key, 0)
}

// putProbe writes key's pacing state with its probe out (attempt id) or,
// with id 0, with none, reading it first as the pacer does.
func putProbe(t *testing.T, pg *state.Postgres, key string, id int64) {
	t.Helper()
	err := pg.Update(context.Background(), func(tx ledger.Tx) error {
		ks, err := tx.KeyState(key)
		if err != nil {
			return err
		}
		ks.ProbeAttempt = id
		ks.ProbeUntil = time.Time{}
		if id != 0 {
			ks.ProbeUntil = tx.Clock(time.Now()).Add(time.Minute)
		}
		return tx.PutKeyState(ks)
	}, key)
	if err != nil {
		t.Fatal(err)
	}
}

// A transaction that ends a key's probe tells the other processes on the
// database, which wake that key's waiters at once instead of at their
// next poll; one that starts a probe, or writes a state without one, tells
// nobody, and a process does not hear its own.
func TestPostgresProbeEndWakesOtherHosts(t *testing.T) {
	srv := startPostgres(t)
	url := srv.CreateDatabase(t)
	a := openPostgres(t, url, state.PostgresOptions{})
	b := openPostgres(t, url, state.PostgresOptions{})
	heardByA, heardByB := listenOn(t, a), listenOn(t, b)

	putProbe(t, a, "quiet", 0) // no probe before, none after
	probeOutAndBack(t, a, "probed")
	// Notifications arrive in the order their transactions committed:
	// the first B hears is the probe's end.
	heardByB.want(t, "probed", "only a probe's end is told")
	probeOutAndBack(t, b, "other")
	heardByA.want(t, "other", "a process does not hear its own")

	// A transaction that did not commit told nobody.
	putProbe(t, a, "other", 5)
	err := a.Update(context.Background(), func(tx ledger.Tx) error {
		ks, err := tx.KeyState("other")
		if err != nil {
			return err
		}
		ks.ProbeAttempt = 0
		if err := tx.PutKeyState(ks); err != nil {
			return err
		}
		return errRolledBack
	}, "other")
	if !errors.Is(err, errRolledBack) {
		t.Fatalf("the rolled-back transaction: %v", err)
	}
	probeOutAndBack(t, a, "after")
	heardByB.want(t, "after", "a transaction rolled back sends nothing")
}

var errRolledBack = errors.New("rolled back on purpose")

// A listener whose connection the server ended connects again by itself,
// says that every waiter should re-check (what was sent meanwhile was not
// heard), and hears the next probe's end.
func TestPostgresWakeListenerComesBack(t *testing.T) {
	srv := startPostgres(t)
	url := srv.CreateDatabase(t)
	a := openPostgres(t, url, state.PostgresOptions{})
	b := openPostgres(t, url, state.PostgresOptions{})
	heardByB := listenOn(t, b)
	admin := rawConn(t, srv, url)
	var ended int
	if err := admin.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND query = 'LISTEN mcp_quota_wake'`).Scan(&ended); err != nil || ended != 1 {
		t.Fatalf("ending the listener's connection: %d ended, %v; want 1", ended, err)
	}
	heardByB.want(t, "", "every waiter re-checks once the listener listens again")
	probeOutAndBack(t, a, "probed")
	heardByB.want(t, "probed", "the listener came back")
}
