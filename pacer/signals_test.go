package pacer_test

import (
	"bufio"
	"errors"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// fixture reads a captured answer of ../ratelimit/testdata/responses (see
// that package's fixture format: "# profile:" names the profile, "# now:"
// the receive time) and returns its status, the time it was received at
// (its "# now:", else its Date, else start) and a function that reads its
// signals when received at a given time.
func fixture(t *testing.T, name string) (int, time.Time, func(now time.Time) *ratelimit.Reading) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "ratelimit", "testdata", "responses", name+".txt"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(b), "\r\n", "\n")
	profile := ratelimit.Generic
	var at time.Time
	for strings.HasPrefix(text, "#") {
		line, rest, _ := strings.Cut(text, "\n")
		text = rest
		if v, ok := strings.CutPrefix(line, "# profile:"); ok {
			if profile, err = ratelimit.ParseProfile(v); err != nil {
				t.Fatal(err)
			}
		}
		if v, ok := strings.CutPrefix(line, "# now:"); ok {
			if at, err = time.Parse(time.RFC3339, strings.TrimSpace(v)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !strings.Contains(text, "\n\n") {
		text += "\n"
	}
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(text)), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if date, err := http.ParseTime(resp.Header.Get("Date")); at.IsZero() && err == nil {
		at = date
	}
	if at.IsZero() {
		at = start
	}
	return resp.StatusCode, at, func(now time.Time) *ratelimit.Reading {
		rd := ratelimit.Read(profile, ratelimit.Response{Status: resp.StatusCode, Header: resp.Header, Body: body}, now)
		return &rd
	}
}

// Each captured answer, and what the next call does after it, and when:
// on the test clock, with Rand 0.5 (so Retry-After's jitter adds 5 % of
// min(wait, 10 s), and backoff is RetryFloor plus half its span).
func TestWhatTheNextCallDoes(t *testing.T) {
	for _, tt := range []struct {
		fixture    string
		wantSource string        // what binds the next call; "" when it goes
		wantWait   time.Duration // its Retry-After
	}{
		// Waits that must never be zero: floored, then backoff.
		{"retry-zero-429", "backoff", 1500 * time.Millisecond},
		{"retry-past-date-429", "backoff", 1500 * time.Millisecond},
		{"draft11-r0-t0", "backoff", 1500 * time.Millisecond},
		{"stripe-429", "backoff", 1500 * time.Millisecond},
		{"openai-prose-hint", "backoff", 1500 * time.Millisecond}, // 634 ms is under the floor
		// A lower-case HTTP-date is the instant it names.
		{"retry-lowercase-date", "retry-after", 30*time.Second + 500*time.Millisecond},
		// The server's own wait wins over a violated policy's window…
		{"problem-reduced-capacity-hour", "retry-after", 30*time.Second + 500*time.Millisecond},
		{"problem-reduced-capacity-r-left", "retry-after", 30*time.Second + 500*time.Millisecond},
		// …unless the policy's own r=0 and t prove the longer one.
		{"problem-reduced-capacity-proved", "hour", 40 * time.Minute},
		// GitLab: the 429 outranks remaining; the reset says when (the
		// end of the whole second it names).
		{"gitlab-429", "x-ratelimit", time.Minute + time.Second},
		// Shopify GraphQL: ceil((752 - 40) / 50) = 15 s.
		{"shopify-graphql-throttled", "retry-after", 15*time.Second + 500*time.Millisecond},
		{"google-retryinfo", "retry-after", 35*time.Second + 500*time.Millisecond},
		{"google-status-under-openai", "retry-after", 12500*time.Millisecond + 500*time.Millisecond},
		// X: the exhausted 24-hour window, not the 15-minute one.
		{"x-24hour-exhausted", "user-24hour", 20*time.Hour + time.Second},
		{"kong-minute-hour", "retry-after", 20*time.Second + 500*time.Millisecond},
		{"slack-429", "method", 30 * time.Second}, // that method; see TestSlackWaitHoldsItsMethod
		// The 5-hour window ends with the second its reset names, after
		// Retry-After's 7999 s and their jitter.
		{"anthropic-unified-rejected", "unified-5h", 8000 * time.Second},
		{"jira-beta-reset", "tenant-app-quota", 35 * time.Minute},
		{"azure-prose-hint-seconds", "retry-after", 33*time.Second + 500*time.Millisecond},
		{"openai-prose-hint-shorter", "retry-after", 2*time.Second + 100*time.Millisecond},
		// Answers that leave room: the next call goes.
		{"shopify-rest-39", "", 0},
		{"x-docs", "", 0},
		{"anthropic-unified", "", 0},
	} {
		t.Run(tt.fixture, func(t *testing.T) {
			e := newEnv(t)
			k := newKey()
			status, at, read := fixture(t, tt.fixture)
			e.clk.Set(at) // the answer comes when it says it does
			tk := e.mustAdmit(k, "agent", "/items")
			rd := read(e.clk.Now())
			if _, err := e.p.Done(t.Context(), tk, pacer.Outcome{SentAt: tk.AdmittedAt, AnsweredAt: e.clk.Now(), Status: status, Reading: rd}); err != nil {
				t.Fatal(err)
			}
			e.clk.advance(time.Millisecond)
			if tt.wantSource == "" {
				e.mustAdmit(k, "agent", "/items")
				return
			}
			pe := e.mustPause(k, "agent", "/items")
			if pe.Source != tt.wantSource || !near(pe.RetryAfter, tt.wantWait-time.Millisecond, 2*time.Millisecond) {
				t.Errorf("next call: %s for %v (%s), want %s for %v", pe.Source, pe.RetryAfter, pe.Reason, tt.wantSource, tt.wantWait-time.Millisecond)
			}
		})
	}
}

// Slack's Retry-After holds the method it refused, not the key: another
// method goes at once, the refused one after the wait (then one jittered
// probe asks for a fresh answer, as after any expired observation).
func TestSlackWaitHoldsItsMethod(t *testing.T) {
	e := newEnv(t)
	k := newKey()
	status, at, read := fixture(t, "slack-429")
	e.clk.Set(at)
	tk := e.mustAdmit(k, "agent", "/api/chat.postMessage")
	res := answerWith(t, e.p, e.clk, tk, status, read(e.clk.Now()))
	if res.RetryIn < 30*time.Second {
		t.Errorf("RetryIn = %v, want Retry-After's 30 s", res.RetryIn)
	}
	e.clk.advance(time.Millisecond)
	if pe := e.mustPause(k, "agent", "/api/chat.postMessage"); pe.Source != "method" || pe.RetryAfter != 30*time.Second-time.Millisecond {
		t.Errorf("the refused method: %s for %v, want 'method' for 30 s", pe.Source, pe.RetryAfter)
	}
	e.clk.advance(time.Millisecond)
	e.mustAdmit(k, "agent", "/api/conversations.list")
	e.clk.advance(31 * time.Second) // the wait, and the jittered probe after it
	e.mustAdmit(k, "agent", "/api/chat.postMessage")
}

// admitPaced admits a call of k, moving the test clock on by every pause
// the pacer asks for first (at most 20 of them).
func admitPaced(t *testing.T, e *env, k *keystore.Key) pacer.Ticket {
	t.Helper()
	for range 20 {
		tk, err := e.admitWith(e.p, e.call(k, "agent", "/items"))
		var pe *pacer.PauseError
		if !errors.As(err, &pe) {
			if err != nil {
				t.Fatal(err)
			}
			return tk
		}
		e.clk.advance(pe.RetryAfter)
	}
	t.Fatalf("%v: still paused after 20 waits", e.clk.Now().Sub(start))
	return pacer.Ticket{}
}

func near(got, want, tolerance time.Duration) bool {
	return got >= want-tolerance && got <= want+tolerance
}

// A refusal whose wait is under RetryFloor, repeated after that wait,
// backs off exponentially and then opens the circuit: it never spins.
func TestZeroWaitRefusalsBackOffToTheCircuit(t *testing.T) {
	e := newEnv(t)
	k := newKey()
	status, _, read := fixture(t, "retry-zero-429")
	var waits []time.Duration
	var sources []string
	for range pacer.BreakerThreshold {
		tk := e.mustAdmit(k, "agent", "/items")
		answerWith(t, e.p, e.clk, tk, status, read(e.clk.Now()))
		pe := e.mustPause(k, "agent", "/items")
		waits, sources = append(waits, pe.RetryAfter), append(sources, pe.Source)
		e.clk.advance(pe.RetryAfter)
	}
	want := []time.Duration{1500 * time.Millisecond, 2 * time.Second, 3 * time.Second, 5 * time.Second, pacer.BreakerCooldown}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits after each Retry-After: 0 = %v (%v), want %v", waits, sources, want)
		}
	}
	if sources[len(sources)-1] != "circuit" {
		t.Errorf("after %d refusals: %s, want the circuit open", pacer.BreakerThreshold, sources[len(sources)-1])
	}
}

// After a 503 whose Retry-After wins over the violated one-hour policy,
// the call after the wait goes, and the reduced policy paces from then
// on: its q calls per hour are counted over the log.
func TestReducedPolicyPacesAfterTheServersWait(t *testing.T) {
	e := newEnv(t)
	k := newKey()
	status, at, read := fixture(t, "problem-reduced-capacity-hour")
	e.clk.Set(at)
	tk := e.mustAdmit(k, "agent", "/items")
	answerWith(t, e.p, e.clk, tk, status, read(e.clk.Now()))
	e.clk.advance(31 * time.Second)
	// 100 per hour, one already sent: 99 go (at the slow start's pace after
	// the pause), the 101st is refused until the first leaves the hour.
	for range 99 {
		answerWith(t, e.p, e.clk, admitPaced(t, e, k), 200, nil)
		e.clk.advance(time.Second)
	}
	pe := e.mustPause(k, "agent", "/items")
	if pe.Source != "hour" || pe.RetryAfter < 55*time.Minute {
		t.Errorf("the 101st call in the hour: %s for %v, want the policy 'hour' for about an hour", pe.Source, pe.RetryAfter)
	}
}

// Shopify REST: 39/40 leaves one call; the next goes once one has leaked
// out (half a second at the assumed 2/s), not a window later. A faster
// leak seen in successive answers is learned, and paced at, without ever
// overfilling the bucket.
func TestLeakyBucketPacesAtItsLeak(t *testing.T) {
	shopify := func(used int) *ratelimit.Reading {
		h := http.Header{"X-Shopify-Shop-Api-Call-Limit": {strconv.Itoa(used) + "/40"}}
		rd := ratelimit.Read(ratelimit.Shopify, ratelimit.Response{Status: 200, Header: h}, time.Time{})
		return &rd
	}
	t.Run("39 of 40", func(t *testing.T) {
		e := newEnv(t)
		k := newKey()
		e.send(k, "agent", 200, shopify(39))
		e.clk.advance(time.Millisecond)
		e.mustAdmit(k, "agent", "/items") // the one call left
		e.clk.advance(time.Millisecond)
		pe := e.mustPause(k, "agent", "/items")
		if pe.Source != "rest" || !near(pe.RetryAfter, 498*time.Millisecond, time.Millisecond) {
			t.Fatalf("the call after: %s for %v, want 'rest' for 500 ms", pe.Source, pe.RetryAfter)
		}
		e.clk.advance(pe.RetryAfter)
		e.mustAdmit(k, "agent", "/items")
	})
	t.Run("learned", func(t *testing.T) {
		// A Plus store's bucket: 40 calls, leaking 20 a second, starting
		// at 39. Every call is answered at once with what the bucket holds.
		e := newEnv(t)
		k := newKey()
		level, last := 39.0, e.clk.Now()
		answer := func(tk pacer.Ticket) {
			level = max(0, level-20*e.clk.Now().Sub(last).Seconds()) + 1
			last = e.clk.Now()
			if level > 40 {
				t.Fatalf("%v: the bucket overflowed (%.1f): a real one would have refused", e.clk.Now().Sub(start), level)
			}
			answerWith(t, e.p, e.clk, tk, 200, shopify(int(math.Ceil(level))))
		}
		e.send(k, "agent", 200, shopify(39))
		perSecond := map[int]int{}
		for e.clk.Now().Sub(start) < 10*time.Second {
			answer(admitPaced(t, e, k))
			perSecond[int(e.clk.Now().Sub(start)/time.Second)]++
		}
		if perSecond[9] < 14 {
			t.Errorf("tenth second: %d calls, want near the bucket's 20/s once learned (%v)", perSecond[9], perSecond)
		}
	})
}

// Anthropic's unified windows are shares of a quota nobody stated: 3 %
// left is no reason to spread calls a reset's hundredth apart, and
// "rejected" (0 % left) waits for its reset.
func TestUnifiedPercentWindows(t *testing.T) {
	e := newEnv(t)
	k := newKey()
	k.LowWater = 0.1
	unified := func(util, status string) *ratelimit.Reading {
		h := http.Header{"Anthropic-Ratelimit-Unified-5h-Utilization": {util}, "Anthropic-Ratelimit-Unified-5h-Status": {status},
			"Anthropic-Ratelimit-Unified-5h-Reset": {strconv.FormatInt(e.clk.Now().Add(time.Hour).Unix(), 10)}}
		rd := ratelimit.Read(ratelimit.Anthropic, ratelimit.Response{Status: 200, Header: h}, e.clk.Now())
		return &rd
	}
	e.send(k, "agent", 200, unified("0.97", "allowed_warning"))
	e.clk.advance(time.Millisecond)
	e.mustAdmit(k, "agent", "/v1/messages")
	e.clk.advance(time.Millisecond)
	e.send(k, "agent", 200, unified("1.0", "rejected"))
	e.clk.advance(time.Millisecond)
	if pe := e.mustPause(k, "agent", "/v1/messages"); pe.Source != "unified-5h" || pe.RetryAfter < 59*time.Minute {
		t.Errorf("rejected: %s for %v, want 'unified-5h' until its reset", pe.Source, pe.RetryAfter)
	}
}

// Zero guidance on an answer that was not refused — nothing left in a
// window said to end now, or one whose reset is already past — is never
// a reason to send the next call at once: it waits a second, as after a
// zero Retry-After.
func TestEmptyWindowEndingNowWaitsASecond(t *testing.T) {
	for _, tt := range []struct {
		name string
		t    time.Duration
	}{
		{"t=0", 0},
		{"a reset already past", -3 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			k := newKey()
			e.send(k, "agent", 200, reading(0, shown("default", 100, time.Minute, 0, tt.t)))
			e.clk.advance(time.Millisecond)
			pe := e.mustPause(k, "agent", "/items")
			if pe.Source != "default" || !near(pe.RetryAfter, pacer.RetryFloor-time.Millisecond, 2*time.Millisecond) {
				t.Errorf("next call: %s for %v (%s), want default for about %v", pe.Source, pe.RetryAfter, pe.Reason, pacer.RetryFloor)
			}
		})
	}
}
