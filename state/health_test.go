package state_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
)

// TestCheckFindsDamage: Check passes a sound file and names a damaged
// page (issue 13: /healthz stayed green on a corrupt file).
func TestCheckFindsDamage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	ctx := context.Background()
	db := open(t, path)
	update(t, db, func(tx ledger.Tx) error {
		for i := range 200 {
			if _, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint("c", i), Attempt: 1, Key: "k", State: ledger.Admitted,
				Reason: reason.Reason{Kind: reason.Said, Said: strings.Repeat("r", 1000)}, At: t0}); err != nil {
				return err
			}
		}
		return nil
	})
	if err := db.Check(ctx); err != nil {
		t.Fatalf("Check of a sound file: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	// Damage pages in the middle of the file (page 1 holds the schema).
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	garbage := []byte(strings.Repeat("\xde\xad\xbe\xef", 1024))
	for off := int64(8 << 10); off < fi.Size()-4096; off += 32 << 10 {
		f.WriteAt(garbage, off)
	}
	f.Close()
	db2, err := state.Open(ctx, path)
	if err != nil {
		t.Logf("refused at open: %v", err)
		return // as good a refusal as any
	}
	t.Cleanup(func() { db2.Close() })
	err = db2.Check(ctx)
	if err == nil {
		t.Fatal("Check of a damaged file passed")
	}
	t.Logf("Check: %v", err)
	if !strings.Contains(err.Error(), "damaged") && !state.Storage(err) {
		t.Errorf("Check: %v; want it to say the file is damaged", err)
	}
}
