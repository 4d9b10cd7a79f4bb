package state_test

import (
	"context"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// A transaction's clock on PostgreSQL is read once it holds its key: a
// host that waited for another's transaction on the key is timed after
// that transaction's last instant, never before it.
func TestPostgresClockReadOnceTheKeyIsHeld(t *testing.T) {
	srv := startPostgres(t)
	url := srv.CreateDatabase(t)
	first, second := openPostgres(t, url, state.PostgresOptions{}), openPostgres(t, url, state.PostgresOptions{})
	watch := rawConn(t, srv, url)
	ctx := context.Background()
	update(t, first, func(ledger.Tx) error { return nil }, "k") // the key's row exists

	var heldUntil, waiter time.Time
	done := make(chan error, 1)
	update(t, first, func(tx ledger.Tx) error {
		tx.Clock(time.Now()) // holds "k" from here
		go func() {
			done <- second.Update(ctx, func(tx ledger.Tx) error {
				waiter = tx.Clock(time.Now())
				return nil
			}, "k")
		}()
		// Until the other waits for the key's row…
		for deadline := time.Now().Add(30 * time.Second); ; {
			var waiting int
			if err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
				return err
			}
			if waiting > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the second transaction never waited for the key")
			}
			time.Sleep(time.Millisecond)
		}
		// …and this one's last instant with the key held.
		return watch.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&heldUntil)
	}, "k")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !waiter.After(heldUntil) {
		t.Errorf("the waiting transaction's clock is %s, before the holder let the key go at %s",
			waiter.Format(time.RFC3339Nano), heldUntil.Format(time.RFC3339Nano))
	}
}
