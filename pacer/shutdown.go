package pacer

import (
	"context"
	"maps"
	"slices"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// Close gives back the unused slots of every lease the Pacer holds, and
// writes what routine answers taught (see learned). It first waits for
// the Pacer's work that began before it: answers being recorded (see
// enter) and the functions of its timers (see timerFunc). Call it when
// the process ends, before the state closes: an answer recorded through
// the process's journal is then in it. Slots not given back are released
// by the next sweep after their lease, counted as sent.
func (p *Pacer) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	if p.stopWakes != nil {
		p.stopWakes()
	}
	var ls []*lease
	for _, l := range p.leases {
		ls = append(ls, p.dropLease(l))
	}
	p.mu.Unlock()
	// What the answers still being recorded teach is kept in memory
	// (see learn), to be written below.
	p.timers.Wait()
	// The transaction holds the keys of the leases it gives back, as any
	// that gives back slots must (a slot of the log's end is deleted),
	// and those of what is kept for a key's next transaction: what was
	// learned, and what earlier transactions left to write (see
	// pending.go).
	p.mu.Lock()
	held := map[string]bool{}
	for _, l := range ls {
		held[l.key] = true
	}
	for key := range p.learned {
		held[key] = true
	}
	p.pendingKeys(held)
	p.mu.Unlock()
	keys := slices.Sorted(maps.Keys(held))
	if len(ls) == 0 && len(keys) == 0 {
		return nil
	}
	return p.update(ctx, func(tx ledger.Tx) error {
		for _, l := range ls {
			if err := l.release(tx); err != nil {
				return err
			}
		}
		return nil
	}, keys...)
}

// enter counts work of the Pacer that Close waits for (an answer being
// recorded), unless the Pacer has closed; the caller calls end once the
// work is done. The count is taken under p.mu before Close marks the
// Pacer closed, so Close never misses one.
func (p *Pacer) enter() (end func(), ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return func() {}, false
	}
	p.timers.Add(1)
	return p.timers.Done, true
}

// timerFunc returns f as the function of one of the Pacer's timers (a
// lease that runs out, what was learned written alone): it runs f unless
// the Pacer has closed, and Close waits for it (see enter). A timer that
// fires after Close does nothing: Close gave back every lease and wrote
// everything learned itself.
func (p *Pacer) timerFunc(f func()) func() {
	return func() {
		end, ok := p.enter()
		if !ok {
			return
		}
		defer end()
		f()
	}
}
