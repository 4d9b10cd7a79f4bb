package rest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-github/v75/github"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/rest"
)

// The GitHub stand-in's primary limit, and the documented policy that
// matches it.
const (
	ghQuota  = 10
	ghWindow = 3 * time.Second
	// loopFor is how long go-github loops: long enough that every slot
	// of the first window (its calls spread over up to a window) is due
	// again, a window and the slot's come-back later (see spent), before
	// the loop ends.
	loopFor = 3*ghWindow + ghWindow/2
)

// refuseAtOnce makes the REST side hold a call for the budget for half
// a window at most, and refuse it beyond (as it does with its default
// hold when windows are long): the stand-ins' windows are short, so that
// the tests are, and the SDKs must still meet mcp-quota's refusals.
var refuseAtOnce = rest.Limits{DefaultWait: 2 * ghWindow / 3}

// githubKeys is a key "github" with GitHub's profile in front of the
// stand-in, with the policy its docs state when documented is set, and
// two callers on it.
func githubKeys(documented bool) (keys, callers string) {
	if documented {
		return vendorConfig("github", "github", testkit.Policy{Name: "core", Quota: ghQuota, Window: ghWindow})
	}
	return vendorConfig("github", "github")
}

// vendorConfig is a key with a vendor's profile in front of the stand-in
// (%[1]s), bearer auth, with policies as its docs state them (none: it
// learns them from the answers), and the callers sync and agent on it.
func vendorConfig(key, profile string, policies ...testkit.Policy) (keys, callers string) {
	keys = testkit.Keys(testkit.Key{Name: key, BaseURL: "%[1]s", SecretEnv: "UPSTREAM_SECRET", Auth: "bearer", Profile: profile,
		Policies: policies})
	callers = testkit.Config{Callers: []testkit.Caller{
		{Name: "sync", TokenEnv: "SYNC_TOKEN", Keys: []string{key}},
		{Name: "agent", TokenEnv: "AGENT_TOKEN", Keys: []string{key}},
	}}.TOML()
	return keys, callers
}

// statusCounter counts the statuses a client meets.
type statusCounter struct {
	next http.RoundTripper
	mu   sync.Mutex
	n    map[int]int
}

func (c *statusCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(r)
	if err == nil {
		c.mu.Lock()
		if c.n == nil {
			c.n = map[int]int{}
		}
		c.n[resp.StatusCode]++
		c.mu.Unlock()
	}
	return resp, err
}

// goGitHubLoop is go-github's documented loop: call, and on a
// RateLimitError wait until its Rate.Reset, on an AbuseRateLimitError
// its RetryAfter. It returns the calls that went through and every rate
// the SDK read, or the first error it cannot read as a rate limit.
type ghRun struct {
	ok, primary, secondary int
	rates                  []github.Rate
	at                     []time.Time
	statuses               *statusCounter
}

func goGitHubLoop(ctx context.Context, base, token string, until time.Time) (*ghRun, error) {
	run := &ghRun{statuses: &statusCounter{next: http.DefaultTransport}}
	c := github.NewClient(&http.Client{Transport: run.statuses}).WithAuthToken(token)
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	c.BaseURL = u
	wait := func(d time.Duration) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}
	for time.Now().Before(until) {
		_, resp, err := c.Users.Get(ctx, "")
		now := time.Now()
		var rle *github.RateLimitError
		var abuse *github.AbuseRateLimitError
		switch {
		case err == nil:
			run.ok++
			run.rates, run.at = append(run.rates, resp.Rate), append(run.at, now)
		case errors.As(err, &rle):
			run.primary++
			run.rates, run.at = append(run.rates, rle.Rate), append(run.at, now)
			if err := wait(min(time.Until(rle.Rate.Reset.Time), time.Until(until))); err != nil {
				return run, err
			}
		case errors.As(err, &abuse):
			run.secondary++
			d := time.Minute
			if abuse.RetryAfter != nil {
				d = *abuse.RetryAfter
			}
			if err := wait(min(d, time.Until(until))); err != nil {
				return run, err
			}
		default:
			return run, err
		}
	}
	return run, nil
}

// TestGoGitHubThroughTheRESTSide runs go-github v75's documented loop,
// two callers on one key, for more than two of the stand-in's windows,
// with and without the policy documented: the upstream never refuses,
// mcp-quota's log never holds more than the documented quota in a
// rolling window and takes every slot of the first window again soon
// after it comes free (the budget does not idle), every rate go-github reads
// has a limit no higher than the upstream's and a reset in the future,
// and every refusal by mcp-quota reaches it as a RateLimitError it waits
// out.
func TestGoGitHubThroughTheRESTSide(t *testing.T) {
	t.Parallel()
	testkit.SkipShort(t, "runs go-github for several windows of real time")
	for _, documented := range []bool{true, false} {
		t.Run(fmt.Sprintf("documented=%v", documented), func(t *testing.T) {
			t.Parallel() // each on its own stack and stand-in
			up := newGHStandIn(upstreamSecret, ghQuota, ghWindow)
			keys, callers := githubKeys(documented)
			s := newStack(t, stackConfig{Upstream: up, Keys: keys, Callers: callers, QuietLog: true, Limits: refuseAtOnce})
			ctx := t.Context()
			until := time.Now().Add(loopFor)
			var wg sync.WaitGroup
			runs := make([]*ghRun, 2)
			errs := make([]error, 2)
			for i, tok := range []string{syncToken, agentToken} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					runs[i], errs[i] = goGitHubLoop(ctx, s.URL+"/k/github/", tok, until)
				}()
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("caller %d: go-github surfaced %v", i, err)
				}
			}
			refusals, calls := up.answered()
			if len(refusals) > 0 {
				t.Errorf("the upstream refused %d of %d calls: %v", len(refusals), calls, refusals)
			}
			// go-github waits until the reset it reads, a whole second.
			ghSpent := spent{quota: ghQuota, window: ghWindow, comeBack: time.Second + time.Second + ghWindow/2}
			ghSpent.check(t, s.tries(t, "github"), until, documented)
			for i, run := range runs {
				if run == nil {
					continue
				}
				t.Logf("caller %d: %d calls went, %d primary and %d secondary refusals read, statuses %v", i, run.ok, run.primary, run.secondary, run.statuses.n)
				for j, r := range run.rates {
					if r.Limit > ghQuota {
						t.Errorf("caller %d read limit %d, more than the upstream's %d", i, r.Limit, ghQuota)
					}
					if !r.Reset.After(run.at[j].Add(-time.Second)) {
						t.Errorf("caller %d read a reset %v, %v before it read it", i, r.Reset.Time, run.at[j].Sub(r.Reset.Time))
					}
				}
				// Each refusal is waited out until the reset it names: no
				// more than a few per window.
				if got, most := run.statuses.n[http.StatusTooManyRequests], 3*windowsIn(loopFor, ghWindow); got > most {
					t.Errorf("caller %d met %d refusals, want at most %d (it must back off)", i, got, most)
				}
				if run.secondary > 0 {
					t.Errorf("caller %d read %d secondary limits; the upstream sent none", i, run.secondary)
				}
			}
			if n := strings.Count(s.Log.String(), `"level":"ERROR"`); n > 0 {
				t.Errorf("%d errors logged", n)
			}
		})
	}
}

// TestGitHubSecondaryLimitStaysSecondary: a secondary-limit 403 reaches
// go-github as GitHub sent it (an AbuseRateLimitError with its
// Retry-After, the primary remaining unchanged), mcp-quota's own refusal
// during that wait reads as a secondary limit too, and after the wait
// the rest of the primary quota is spent, no answer announces a limit
// above the upstream's, and mcp-quota refuses the call beyond as a
// primary limit. The primary window is longer than the test, so that
// what is left of it does not depend on how fast the calls go.
func TestGitHubSecondaryLimitStaysSecondary(t *testing.T) {
	t.Parallel()
	testkit.SkipShort(t, "waits out a secondary limit in real time")
	const window = time.Minute
	up := newGHStandIn(upstreamSecret, ghQuota, window)
	up.secondaryAt = 4
	keys, callers := vendorConfig("github", "github", testkit.Policy{Name: "core", Quota: ghQuota, Window: window})
	s := newStack(t, stackConfig{Upstream: up, Keys: keys, Callers: callers, QuietLog: true, Limits: refuseAtOnce})
	c := github.NewClient(nil).WithAuthToken(syncToken)
	u, _ := url.Parse(s.URL + "/k/github/")
	c.BaseURL = u
	// go-github remembers a secondary limit and refuses on its own until
	// it ends: bypass that, to see what mcp-quota answers.
	ctx := context.WithValue(t.Context(), github.BypassRateLimitCheck, true)
	for i := range up.secondaryAt - 1 {
		if _, _, err := c.Users.Get(ctx, ""); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
	}

	for i, from := range []string{"the upstream", "mcp-quota"} {
		_, resp, err := c.Users.Get(ctx, "")
		var abuse *github.AbuseRateLimitError
		if !errors.As(err, &abuse) {
			t.Fatalf("call %d (refused by %s): go-github got %v, want an AbuseRateLimitError", i+1, from, err)
		}
		if abuse.RetryAfter == nil || *abuse.RetryAfter < time.Second || *abuse.RetryAfter > 6*time.Second {
			t.Errorf("call %d (refused by %s): RetryAfter %v, want at most the upstream's 5 s (rounded up)", i+1, from, abuse.RetryAfter)
		}
		// As the upstream sent it; mcp-quota's own says what the shared
		// budget leaves (its log counts the refused call), never 0.
		left := ghQuota - up.secondaryAt + 1
		if got, n := resp.Header.Get("X-RateLimit-Remaining"), resp.Rate.Remaining; (i == 0 && got != strconv.Itoa(left)) || n < left-1 || n > left {
			t.Errorf("call %d (refused by %s): X-RateLimit-Remaining %q, want the upstream's %d (a secondary limit spends no primary quota)", i+1, from, got, left)
		}
	}
	if refusals, calls := up.answered(); len(refusals) != 1 || calls != up.secondaryAt {
		t.Errorf("the upstream got %d calls and refused %v, want the one refusal", calls, refusals)
	}
	// What the refusal taught is a wait, not a count limit.
	k, err := s.Keys.Key("github")
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Pacer.Status(t.Context(), k, "sync")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range st.Upstream {
		if b.Hidden {
			t.Errorf("a secondary limit was taken for a count limit: %d calls per %v", b.Limit, b.Window)
		}
	}
	// After the wait, the rest of the primary quota goes, every answer
	// announcing no more than the upstream, until mcp-quota refuses as
	// GitHub would.
	left := ghQuota - up.secondaryAt + 1
	went, waits := 0, 0
	for {
		_, resp, err := c.Users.Get(ctx, "")
		var rle *github.RateLimitError
		var abuse *github.AbuseRateLimitError
		switch {
		case err == nil:
			went++
		case errors.As(err, &rle):
		case errors.As(err, &abuse):
			if abuse.RetryAfter == nil {
				t.Fatal("a secondary limit without RetryAfter")
			}
			if waits++; went > 0 || waits > 2 {
				t.Fatalf("a secondary limit after %d calls went and %d waits; want it only before the wait ends", went, waits)
			}
			time.Sleep(*abuse.RetryAfter) // go-github's documented wait
			continue
		default:
			t.Fatal(err)
		}
		if resp.Rate.Limit > ghQuota {
			t.Errorf("X-RateLimit-Limit %d, more than the upstream's %d", resp.Rate.Limit, ghQuota)
		}
		if rle != nil {
			if rle.Rate.Remaining != 0 || !rle.Rate.Reset.After(time.Now()) {
				t.Errorf("mcp-quota's primary refusal: remaining %d, reset %v; want none left until a reset to come", rle.Rate.Remaining, rle.Rate.Reset.Time)
			}
			break
		}
		if went > left {
			t.Fatalf("%d calls went after the secondary limit, more than the %d the primary window had left", went, left)
		}
	}
	if refusals, calls := up.answered(); len(refusals) != 1 || calls != up.secondaryAt+went || went == 0 {
		t.Errorf("the upstream got %d calls (%d after the wait) and refused %v; want the one refusal", calls, went, refusals)
	}
}

// blockingUpstream answers like next, but holds the second call until
// release is closed.
type blockingUpstream struct {
	next    http.Handler
	calls   atomic.Int32
	release chan struct{}
}

func (b *blockingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if b.calls.Add(1) == 2 {
		<-b.release
	}
	b.next.ServeHTTP(w, r)
}

// A call refused while a probe is in flight (the upstream's last observation
// has expired, and one call goes to get a fresh one) carries GitHub's
// fields too: nothing left until its Retry-After.
func TestProbeRefusalCarriesTheFields(t *testing.T) {
	t.Parallel()
	up := &blockingUpstream{next: newGHStandIn(upstreamSecret, ghQuota, time.Second), release: make(chan struct{})}
	keys, callers := githubKeys(false)
	s := newStack(t, stackConfig{Upstream: up, Keys: keys, Callers: callers, QuietLog: true, Limits: rest.Limits{DefaultWait: time.Millisecond}})
	if resp, body := s.do(t, "GET", "/k/github/user", syncToken, nil); resp.StatusCode != 200 {
		t.Fatalf("first call: %d %s", resp.StatusCode, body)
	}
	// The upstream's observation holds until the end of the second its reset
	// names: wait for it to expire, as a caller would.
	k, err := s.Keys.Key("github")
	if err != nil {
		t.Fatal(err)
	}
	for {
		st, err := s.Pacer.Status(t.Context(), k, "sync")
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Upstream) > 0 && st.Upstream[0].Expired {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	probe := make(chan int)
	go func() {
		resp, _ := s.do(t, "GET", "/k/github/user", syncToken, nil)
		probe <- resp.StatusCode
	}()
	for up.calls.Load() < 2 { // until the probe is in flight upstream
		time.Sleep(10 * time.Millisecond)
	}
	resp, body := s.do(t, "GET", "/k/github/user", agentToken, nil)
	close(up.release)
	if got := <-probe; got != 200 {
		t.Errorf("the probe: %d", got)
	}
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "rateLimited") {
		t.Fatalf("during the probe: %d %s, want mcp-quota's refusal", resp.StatusCode, body)
	}
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	reset, _ := strconv.ParseInt(resp.Header.Get("X-RateLimit-Reset"), 10, 64)
	if ra < 1 || resp.Header.Get("X-RateLimit-Remaining") != "0" || reset < time.Now().Add(time.Duration(ra)*time.Second).Unix()-1 {
		t.Errorf("during the probe: Retry-After %q, X-RateLimit-Remaining %q, -Reset %q (%d s from now): want 0 until Retry-After",
			resp.Header.Get("Retry-After"), resp.Header.Get("X-RateLimit-Remaining"), resp.Header.Get("X-RateLimit-Reset"), reset-time.Now().Unix())
	}
}
