package pacer

import (
	"context"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// Recorded reports whether t's outcome is in the state: a Done that
// failed — its transaction cut off, or past its bound — may still have
// committed, and one that did must not be recorded twice.
func (p *Pacer) Recorded(ctx context.Context, t Ticket) (bool, error) {
	var done bool
	err := p.db.View(ctx, func(tx ledger.ReadTx) error {
		st, err := tx.AttemptState(t.Call.Key.Name, t.ID)
		done = recorded(st)
		return err
	})
	return done, err
}

// recorded says whether an attempt in state st has its outcome recorded:
// it is neither open (admitted, or a slot not handed out) nor a slot
// whose process was taken to have ended before reporting it (released),
// and it exists.
func recorded(st ledger.State) bool {
	switch st {
	case "", ledger.Admitted, ledger.Reserved, ledger.Released:
		return false
	}
	return true
}
