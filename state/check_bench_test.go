package state_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
)

// BenchmarkCheck is what /healthz costs on a state file of about 30 MiB.
func BenchmarkCheck(b *testing.B) {
	db, err := state.Open(context.Background(), filepath.Join(b.TempDir(), "state.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	words := strings.Repeat("r", 300)
	for batch := range 50 {
		err := db.Update(context.Background(), func(tx ledger.Tx) error {
			for i := range 2000 {
				if _, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint("c", batch, "-", i), Attempt: 1, Key: "k",
					Target: fmt.Sprintf("/v1/participants?cursor=%d-%d", batch, i), State: ledger.Admitted, Reason: reason.Reason{Kind: reason.Said, Said: words}, At: t0}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		if err := db.Check(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}
