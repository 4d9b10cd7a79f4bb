package pacer

import (
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// countingView is a fakeView that counts its reads of the log's counts:
// on PostgreSQL each is a round trip with the key's row held.
type countingView struct {
	*fakeView
	counts int
}

func (v *countingView) Count(key string, since time.Time) (int, error) {
	v.counts++
	return v.fakeView.Count(key, since)
}

// tightenReset ends an answer's window as early as the log proves (see
// tighten.go), and reads the log's sends after the answer's basis only
// when they can prove it: the sends before the basis are no more than
// those since the window's start (or since an earlier answer's basis),
// so when those are fewer than the upstream counted (q − r, or what r fell
// by), neither rule can apply.
func TestTightenResetReadsTheLogOnlyWhenItCanTighten(t *testing.T) {
	const q = 10
	w := time.Minute
	k := &keystore.Key{Name: "k", Policies: []keystore.Policy{{Name: "default", Quota: q, Window: w, Unit: ratelimit.Requests}}}
	basis := t0.Add(30 * time.Second)
	receivedAt := basis.Add(100 * time.Millisecond)
	send := func(at time.Time) ledger.Send { return ledger.Send{At: at, State: ledger.Confirmed} }
	// Three sends in the window before basis (the first the oldest, all
	// after the earlier answer's basis), one after it.
	sends := []ledger.Send{send(t0.Add(5 * time.Second)), send(t0.Add(10 * time.Second)), send(basis.Add(-time.Millisecond)), send(basis.Add(50 * time.Millisecond))}
	// An earlier answer of the same window: r 9, ending at t0+60s.
	earlier := &ledger.SeenPolicy{Key: "k", Observation: ratelimit.Observation{Policy: "default", Unit: ratelimit.Requests,
		Remaining: 9, HasRemaining: true, Reset: 58 * time.Second, HasReset: true, Shape: ratelimit.ShapeDraft},
		ReceivedAt: t0.Add(2 * time.Second), BasisAt: t0.Add(time.Second)}
	m := latencyMargin(ledger.KeyState{}, w)
	tests := []struct {
		name      string
		prev      *ledger.SeenPolicy
		r         int64
		wantReset time.Duration
		wantReads int // the log's counts read: since the window's start, since basis, since the earlier basis
	}{
		{name: "r is what the log leaves", r: q - 3, wantReset: t0.Add(5 * time.Second).Add(w + m).Sub(receivedAt), wantReads: 2},
		{name: "the upstream counted more than the log holds", r: q - 5, wantReset: 50 * time.Second, wantReads: 1},
		{name: "the upstream counted fewer than the log holds before basis", r: q - 2, wantReset: 50 * time.Second, wantReads: 2},
		{name: "r fell by the sends since an earlier answer", prev: earlier, r: 6, wantReset: t0.Add(time.Minute).Sub(receivedAt), wantReads: 3},
		{name: "r fell by more than the log holds since an earlier answer", prev: earlier, r: 2, wantReset: 50 * time.Second, wantReads: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := &countingView{fakeView: &fakeView{sends: sends}}
			ob := ratelimit.Observation{Policy: "default", Unit: ratelimit.Requests, Remaining: tt.r, HasRemaining: true,
				Reset: 50 * time.Second, HasReset: true, Shape: ratelimit.ShapeDraft}
			got, err := tightenReset(v, k, ob, receivedAt, basis, basis, tt.prev, ledger.KeyState{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Reset != tt.wantReset {
				t.Errorf("reset %v, want %v", got.Reset, tt.wantReset)
			}
			if v.counts != tt.wantReads {
				t.Errorf("read the log's counts %d times, want %d", v.counts, tt.wantReads)
			}
		})
	}
}
