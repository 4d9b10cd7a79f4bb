package pacer_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report"
)

// TestAdviceNeverContradictsItself drives keys of generated policies
// through generated calls, answers and instants, and checks every advice
// a caller can get — after an answer, from a status, for a refused call —
// against the rules every advice keeps (report.Advice.Check): the action,
// retry_after_s and the reason agree, durations read as a person says
// them, reset_s never exceeds the window.
func TestAdviceNeverContradictsItself(t *testing.T) {
	trials, steps := 40, 16
	if testing.Short() {
		trials = 15
	}
	checked := map[pacer.Action]int{}
	for seed := range trials {
		t.Run("", func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(seed), 7))
			e := newEnv(t)
			k := genKey(rng)
			check := func(what string, a report.Advice, q report.Quota) {
				t.Helper()
				checked[pacer.Action(a.Action)]++
				if err := a.Check(q); err != nil {
					t.Errorf("seed %d, %s at +%s: %v", seed, what, e.clk.Now().Sub(start), err)
				}
			}
			for range steps {
				e.clk.advance(genStep(rng))
				caller := pick(rng, "agent", "agent", "sync")
				tk, err := e.p.Admit(context.Background(), e.call(k, caller, "/items"))
				var pe *pacer.PauseError
				switch {
				case errors.As(err, &pe):
					check("a refused call", report.Paused(k.Name, pe, time.Minute), report.NewQuota(k.Name, pe.Binding))
				case err != nil:
					t.Fatal(err)
				default:
					e.clk.advance(time.Duration(rng.IntN(300)) * time.Millisecond)
					res := e.answer(tk, pick(rng, 200, 200, 200, 429, 503), genReading(rng))
					check("the advice after an answer", report.WaitInstead(report.NewAdvice(res.Advice), time.Minute), report.NewQuota(k.Name, res.Binding))
				}
				if rng.IntN(2) == 0 {
					e.clk.advance(genStep(rng))
				}
				st, err := report.Build(context.Background(), e.p, []*keystore.Key{k}, &keystore.Caller{Name: caller}, e.clk.Now())
				if err != nil {
					t.Fatal(err)
				}
				ks := st.Keys[0]
				check("quota_status", report.WaitInstead(ks.Advice, time.Minute), ks.Quota)
				for _, l := range ks.Local {
					if l.ResetS > l.WindowS {
						t.Errorf("seed %d: local %s: reset_s %d exceeds window_s %d", seed, l.Policy, l.ResetS, l.WindowS)
					}
				}
			}
		})
	}
	// The generator must reach every action, or the test proves little.
	for _, a := range []pacer.Action{pacer.Continue, pacer.SlowDown, pacer.Pause} {
		if checked[a] == 0 {
			t.Errorf("no %s advice was generated: %v", a, checked)
		}
	}
	t.Logf("advice checked: %v", checked)
}

func pick[T any](rng *rand.Rand, vs ...T) T { return vs[rng.IntN(len(vs))] }

// genKey is a key with up to two documented policies, and varied low
// water and pace.
func genKey(rng *rand.Rand) *keystore.Key {
	k := newKey()
	k.LowWater = pick(rng, 0, 0.1, 0.5)
	k.MaxRate = pick(rng, 1000.0, 10, 2)
	for i := range rng.IntN(3) {
		k.Policies = append(k.Policies, policy(pick(rng, "default", "hour")+string(rune('a'+i)),
			1+rng.Int64N(20), pick(rng, time.Second, 10*time.Second, time.Minute, time.Hour)))
	}
	return k
}

// genStep is how long to let pass: nothing, a moment, seconds, a window.
func genStep(rng *rand.Rand) time.Duration {
	switch rng.IntN(6) {
	case 0:
		return 0
	case 1:
		return time.Duration(rng.IntN(1000)) * time.Millisecond
	case 2:
		return time.Duration(1+rng.IntN(5000)) * time.Millisecond
	case 3:
		return time.Duration(rng.IntN(70)) * time.Second
	case 4:
		return time.Duration(rng.IntN(130)) * time.Second
	}
	return time.Duration(rng.IntN(90)) * time.Minute
}

// genReading is an answer's signals: none, a policy shown with r and t,
// a Retry-After, or both.
func genReading(rng *rand.Rand) *ratelimit.Reading {
	if rng.IntN(4) == 0 {
		return nil
	}
	var ra time.Duration
	if rng.IntN(3) == 0 {
		ra = pick(rng, 500*time.Millisecond, 2*time.Second, 30*time.Second, 90*time.Second, 2*time.Hour)
	}
	var obs []ratelimit.Observation
	if rng.IntN(4) != 0 {
		w := pick(rng, time.Second, 10*time.Second, time.Minute, time.Hour)
		q := 1 + rng.Int64N(100)
		obs = append(obs, shown("up", q, w, rng.Int64N(q+1), time.Duration(rng.Int64N(int64(w)+1)).Truncate(time.Second)))
	}
	return reading(ra, obs...)
}
