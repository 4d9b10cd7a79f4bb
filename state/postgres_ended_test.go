package state_test

import (
	"context"
	"sync"
	"testing"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// A transaction whose connection the server ends before it commits
// (pg_terminate_backend: an administrator, a failover) committed
// nothing: it runs again on another connection — through the pool's idle
// connections, which the server ended too — and its effect is there
// once.
func TestPostgresEndedConnection(t *testing.T) {
	srv := startPostgres(t)
	url := srv.CreateDatabase(t)
	pg := openPostgres(t, url, state.PostgresOptions{})
	admin := rawConn(t, srv, url)
	ctx := context.Background()

	// Eight connections in the pool, each held by a transaction at once.
	var inside, done sync.WaitGroup
	inside.Add(8)
	release := make(chan struct{})
	for i := range 8 {
		done.Go(func() {
			err := pg.Update(ctx, func(tx ledger.Tx) error {
				inside.Done()
				<-release
				_, err := tx.InsertAttempt(ledger.Attempt{CallID: "warm", Key: string(rune('a' + i)), State: ledger.Admitted, At: t0})
				return err
			}, string(rune('a'+i)))
			if err != nil {
				t.Errorf("warming the pool: %v", err)
			}
		})
	}
	inside.Wait()
	close(release)
	done.Wait()

	runs := 0
	err := pg.Update(ctx, func(tx ledger.Tx) error {
		runs++
		if runs == 1 {
			// Every connection of the store ends, this one and the idle
			// ones, and the run goes on on its dead connection.
			var ended int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name = 'mcp-quota'
				AND pg_terminate_backend(pid, 5000)`).Scan(&ended); err != nil {
				return err
			}
			if ended < 8 {
				t.Errorf("ended %d connections, want the 8 the pool holds at least", ended)
			}
		}
		_, err := tx.InsertAttempt(ledger.Attempt{CallID: "c", Key: "k", State: ledger.Admitted, At: t0})
		return err
	}, "k")
	if err != nil {
		t.Fatalf("a transaction whose connection the server ended: %v; want it run again", err)
	}
	if runs < 2 {
		t.Errorf("the transaction ran %d times, want at least 2", runs)
	}
	view(t, pg, func(tx ledger.ReadTx) error {
		n, err := tx.Count("k", t0.Add(-1))
		if n != 1 {
			t.Errorf("%d attempts recorded, want 1", n)
		}
		return err
	})
}
