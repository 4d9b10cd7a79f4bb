package pacer

import (
	"context"
	"fmt"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// RecordCached records that c was answered at now from mcp-quota's stored copy of
// its target's last answer, for the reason why: nothing was sent, nothing
// is counted against the key, and the key's activity shows it
// (ledger.Cached).
func (p *Pacer) RecordCached(ctx context.Context, c Call, why reason.Reason, now time.Time) error {
	err := p.db.Update(ctx, func(tx ledger.Tx) error {
		_, err := tx.InsertAttempt(ledger.Attempt{CallID: c.CallID, Attempt: c.Attempt, Key: c.Key.Name, Caller: c.Caller,
			Transport: c.Transport, Method: c.Method, Target: c.Target, Digest: c.Digest, State: ledger.Cached, Reason: why, At: now})
		return err
	})
	if err != nil {
		return fmt.Errorf("pacer: record %s: %w", c.Key.Name, err)
	}
	return nil
}
