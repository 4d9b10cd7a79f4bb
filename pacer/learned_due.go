package pacer

import (
	"context"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// An admission writes what routine answers taught its key (see learned)
// only once it has waited learnedDue: on a key called every millisecond
// or two, one admission in many writes it, not each one — on PostgreSQL
// that is the policy's latest observation and the window counts it is settled on, three
// round trips on the key's locked row. What waits meanwhile is what
// another process reads of it anyway (up to learnedWait older, see
// learned): routine answers left every budget far from its limits, and
// every send since an observation's basis is subtracted from it. The timer still
// writes it within learnedWait when no admission comes; every other
// transaction on the key writes it at once. An upstream whose windows
// reset sooner than that has it written sooner: before the observations
// other processes read of the key end (see learned.renewFrom).
const learnedDue = LeaseTime / 2

// admitUpdate is update for an admission of key: it writes what the
// Pacer keeps for key only when that is due.
func (p *Pacer) admitUpdate(ctx context.Context, fn func(ledger.Tx) error, key string) error {
	return p.updateWriting(ctx, []*learned{p.takeDue(key, p.now())}, fn, key)
}

// takeDue is takeLearned of key, when what is kept has waited learnedDue
// at now, or the observations it would replace near their end (see
// learned.renewFrom); nil otherwise.
func (p *Pacer) takeDue(key string, now time.Time) *learned {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.learned[key]
	if l == nil || now.Sub(l.since) < learnedDue && (l.renewFrom.IsZero() || now.Before(l.renewFrom)) {
		return nil
	}
	delete(p.learned, key)
	l.stop()
	return l
}
