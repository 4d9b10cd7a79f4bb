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

// An answer whose r is what the log leaves of its policy's quota ends its
// window when the oldest of the log's sends leaves it; when the log holds
// fewer sends in the window than the q − r the upstream counted, r cannot
// be that, and the sends after the answer's basis are not read.
func TestTightenResetReadsTheLogOnlyWhenItCanTighten(t *testing.T) {
	const q = 10
	w := time.Minute
	k := &keystore.Key{Name: "k", Policies: []keystore.Policy{{Name: "default", Quota: q, Window: w, Unit: ratelimit.Requests}}}
	basis := t0.Add(30 * time.Second)
	receivedAt := basis.Add(100 * time.Millisecond)
	send := func(at time.Time) ledger.Send { return ledger.Send{At: at, State: ledger.Confirmed} }
	// Three sends in the window before basis (the first the oldest), one
	// after it.
	sends := []ledger.Send{send(t0.Add(5 * time.Second)), send(t0.Add(10 * time.Second)), send(basis.Add(-time.Millisecond)), send(basis.Add(50 * time.Millisecond))}
	m := latencyMargin(ledger.KeyState{}, w)
	tests := []struct {
		name      string
		r         int64
		wantReset time.Duration
		wantReads int
	}{
		{name: "r is what the log leaves", r: q - 3, wantReset: t0.Add(5 * time.Second).Add(w + m).Sub(receivedAt), wantReads: 2},
		{name: "the upstream counted more than the log holds", r: q - 5, wantReset: 50 * time.Second, wantReads: 1},
		{name: "the upstream counted fewer than the log holds before basis", r: q - 2, wantReset: 50 * time.Second, wantReads: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := &countingView{fakeView: &fakeView{sends: sends}}
			ob := ratelimit.Observation{Policy: "default", Unit: ratelimit.Requests, Remaining: tt.r, HasRemaining: true,
				Reset: 50 * time.Second, HasReset: true, Shape: ratelimit.ShapeDraft}
			got, err := tightenReset(v, k, ob, receivedAt, basis, basis, nil, ledger.KeyState{})
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
