package state_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// BenchmarkPutResponse measures keeping one answer (the fetch tool's
// write after each 200) on an SQLite file, in its own transaction: for a
// key with a few stored answers, each put replacing one of them, and for a
// key at its limit of 32, each put a new target that pushes out the
// oldest (an agent paging through a long list).
//
//	go test -run '^$' -bench PutResponse ./state/
func BenchmarkPutResponse(b *testing.B) {
	const keep = 32
	for _, c := range []struct {
		name    string
		targets int // distinct targets the puts cycle through; 0: each new
	}{{"few", 4}, {"full", 0}} {
		b.Run(c.name, func(b *testing.B) {
			db, err := state.Open(context.Background(), filepath.Join(b.TempDir(), "state.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
			put := func(i int) {
				target := fmt.Sprintf("/v1/items?page=%d", i)
				if c.targets > 0 {
					target = fmt.Sprintf("/v1/items?page=%d", i%c.targets)
				}
				err := db.Update(context.Background(), func(tx ledger.Tx) error {
					return tx.PutResponse(ledger.StoredResponse{Key: "k", Target: target, Status: 200, ContentType: "application/json",
						Body: []byte(`{"items":[]}`), Digest: "d", StoredAt: t0.Add(time.Duration(i) * time.Millisecond)}, keep)
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			for i := range 2 * keep {
				put(i)
			}
			b.ResetTimer()
			for i := range b.N {
				put(2*keep + i)
			}
		})
	}
}
