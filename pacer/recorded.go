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
	err := p.db.View(ctx, func(tx ledger.Tx) error {
		done = false
		list, err := tx.Call(t.Call.Key.Name, t.Call.CallID)
		for _, a := range list {
			if a.ID == t.ID {
				done = a.State != ledger.Admitted && a.State != ledger.Reserved
			}
		}
		return err
	})
	return done, err
}
