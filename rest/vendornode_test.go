package rest_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// vendorNode runs script, one of the vendor SDK scripts in
// testdata/vendorsdks (installed there by `npm ci`, as .ci/run does),
// with args, and decodes the JSON line it prints into v. It skips the
// test when node or the packages are missing, unless CI is set: there
// it must run.
func vendorNode(t *testing.T, script string, v any, args ...string) {
	t.Helper()
	testkit.SkipShort(t, "runs vendor SDKs on Node.js")
	dir, err := filepath.Abs("../testdata/vendorsdks")
	if err != nil {
		t.Fatal(err)
	}
	node, err := exec.LookPath("node")
	missing := ""
	switch {
	case err != nil:
		missing = "node is not installed"
	case !fileExists(filepath.Join(dir, "node_modules", "@octokit", "plugin-throttling", "package.json")),
		!fileExists(filepath.Join(dir, "node_modules", "openai", "package.json")):
		missing = "the vendor SDKs are not installed: run `npm ci --prefix testdata/vendorsdks`"
	}
	if missing != "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and %s", missing)
		}
		t.Skip(missing)
	}
	cmd := exec.CommandContext(t.Context(), node, append([]string{filepath.Join(dir, script)}, args...)...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s: %v\n%s", script, err, stderr.String())
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("node %s printed %q: %v", script, out, err)
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// nodeLoopFor is how long the Node SDKs loop: loopFor, and the second
// more that octokit waits past a reset, and a second for what nodeLoopEnd
// takes off.
const nodeLoopFor = loopFor + 2*time.Second

// nodeLoopEnd is when a Node SDK script's callers stopped looping, at the
// earliest: a script takes its deadline once Node has loaded its modules
// (seconds on a loaded machine), just before its first call, so the loop
// ends nodeLoopFor after the key's first call was asked for, less a second
// for that call to reach mcp-quota, and no earlier than nodeLoopFor after
// the script was started (started).
func nodeLoopEnd(started time.Time, tries []try) time.Time {
	end := started.Add(nodeLoopFor)
	if len(tries) == 0 {
		return end
	}
	first := tries[0].asked
	for _, tr := range tries {
		if tr.asked.Before(first) {
			first = tr.asked
		}
	}
	if e := first.Add(nodeLoopFor - time.Second); e.After(end) {
		end = e
	}
	return end
}

type octokitRun struct {
	OK         int `json:"ok"`
	RateLimits []struct {
		RetryAfter float64 `json:"retryAfter"`
	} `json:"rateLimits"`
	SecondaryLimits []struct {
		RetryAfter float64 `json:"retryAfter"`
	} `json:"secondaryLimits"`
	Errors []struct {
		Status  int    `json:"status"`
		Message string `json:"message"`
	} `json:"errors"`
	Statuses map[string]int `json:"statuses"`
	Rates    []struct {
		At     int64   `json:"at"`
		Limit  float64 `json:"limit"`
		Reset  float64 `json:"reset"`
		Remain float64 `json:"remaining"`
	} `json:"rates"`
}

// TestOctokitThroughTheRESTSide runs octokit (@octokit/core 7 with
// plugin-throttling 11 and plugin-retry 8, as their READMEs use them,
// authenticating with GitHub's "token" scheme), two callers on one key,
// for more than two of the GitHub stand-in's windows, with and without
// the policy documented: the upstream never refuses, mcp-quota's log
// never holds more than the documented quota in a rolling window and
// takes every slot of the first window again soon after it comes free,
// every answer's limit is no higher than the
// upstream's and its reset is in the future, every refusal by mcp-quota
// reaches the throttling plugin as a primary rate limit with a wait
// (never 0), and octokit surfaces no error at all.
func TestOctokitThroughTheRESTSide(t *testing.T) {
	t.Parallel()
	for _, documented := range []bool{true, false} {
		t.Run(fmt.Sprintf("documented=%v", documented), func(t *testing.T) {
			t.Parallel() // each on its own stack and stand-in
			up := newGHStandIn(upstreamSecret, ghQuota, ghWindow)
			keys, callers := githubKeys(documented)
			s := newStack(t, stackConfig{Upstream: up, Keys: keys, Callers: callers, QuietLog: true, Limits: refuseAtOnce})
			var got struct{ Runs []octokitRun }
			started := time.Now()
			vendorNode(t, "octokit.mjs", &got, s.URL+"/k/github", strconv.FormatInt((nodeLoopFor).Milliseconds(), 10), syncToken, agentToken)
			refusals, calls := up.answered()
			if len(refusals) > 0 {
				t.Errorf("the upstream refused %d of %d calls: %v", len(refusals), calls, refusals)
			}
			// The throttling plugin waits a second past the reset it reads,
			// itself rounded up to a second.
			octoSpent := spent{quota: ghQuota, window: ghWindow, comeBack: time.Second + 2*time.Second + ghWindow/2}
			tries := s.tries(t, "github")
			octoSpent.check(t, tries, nodeLoopEnd(started, tries), documented)
			if len(got.Runs) != 2 {
				t.Fatalf("got %d runs, want 2", len(got.Runs))
			}
			for i, run := range got.Runs {
				t.Logf("caller %d: %d calls went, %d primary and %d secondary limits told, statuses %v", i, run.OK, len(run.RateLimits), len(run.SecondaryLimits), run.Statuses)
				for _, e := range run.Errors {
					t.Errorf("caller %d: octokit surfaced %d %q", i, e.Status, e.Message)
				}
				for _, r := range run.Rates {
					if r.Limit > ghQuota || r.Limit <= 0 {
						t.Errorf("caller %d read limit %v, want 1…%d", i, r.Limit, ghQuota)
					}
					if (r.Reset+1)*1000 <= float64(r.At) { // the end of the second it names
						t.Errorf("caller %d read reset %v at %v ms: in the past", i, r.Reset, r.At)
					}
				}
				for _, rl := range run.RateLimits {
					if rl.RetryAfter < 1 {
						t.Errorf("caller %d was told to retry after %vs, want a wait", i, rl.RetryAfter)
					}
				}
				if refused := run.Statuses["429"] + run.Statuses["403"]; refused != len(run.RateLimits)+len(run.SecondaryLimits) {
					t.Errorf("caller %d met %d refusals, but the throttling plugin was told of %d", i, refused, len(run.RateLimits)+len(run.SecondaryLimits))
				}
				if len(run.SecondaryLimits) > 0 {
					t.Errorf("caller %d was told of %d secondary limits; the upstream sent none", i, len(run.SecondaryLimits))
				}
			}
		})
	}
}

// The OpenAI stand-in's limits, and the documented policy that matches
// its requests limit; each call asks for openAICost tokens, so the
// requests limit binds and the tokens one is shown.
const (
	openAIRequests = 10
	openAITokens   = 10000
	openAICost     = 50
	openAIWindow   = 3 * time.Second
)

type openAIRun struct {
	OK              int               `json:"ok"`
	RateLimitErrors []openAIFields    `json:"rateLimitErrors"`
	Refusals        []openAIFields    `json:"refusals"`
	Errors          []json.RawMessage `json:"errors"`
	Statuses        map[string]int    `json:"statuses"`
	Rates           []openAIFields    `json:"rates"`
}

type openAIFields struct {
	Message           string `json:"message"`
	Code              string `json:"code"`
	Type              string `json:"type"`
	LimitRequests     string `json:"limitRequests"`
	RemainingRequests string `json:"remainingRequests"`
	ResetRequests     string `json:"resetRequests"`
	LimitTokens       string `json:"limitTokens"`
	RemainingTokens   string `json:"remainingTokens"`
	ResetTokens       string `json:"resetTokens"`
	RetryAfter        string `json:"retryAfter"`
}

// TestOpenAINodeThroughTheRESTSide runs the OpenAI Node client 6, two
// callers on one key, for more than two of the OpenAI stand-in's windows,
// with and without the requests policy documented: the upstream never
// refuses, mcp-quota's log never holds more than the documented requests
// in a rolling window and takes every slot of the first window again soon
// after it comes free, every
// answer carries OpenAI's six fields (limits no higher than the
// upstream's, resets in the future as Go durations), and every refusal by
// mcp-quota reaches the client as a RateLimitError with OpenAI's code and
// type, said the same way by every field.
func TestOpenAINodeThroughTheRESTSide(t *testing.T) {
	t.Parallel()
	for _, documented := range []bool{true, false} {
		t.Run(fmt.Sprintf("documented=%v", documented), func(t *testing.T) {
			t.Parallel() // each on its own stack and stand-in
			up := newOpenAIStandIn(upstreamSecret, openAIRequests, openAITokens, openAIWindow)
			var policies []testkit.Policy
			if documented {
				policies = []testkit.Policy{{Name: "requests", Quota: openAIRequests, Window: openAIWindow}}
			}
			keys, callers := vendorConfig("openai", "openai", policies...)
			s := newStack(t, stackConfig{Upstream: up, Keys: keys, Callers: callers, QuietLog: true, Limits: refuseAtOnce})
			var got struct{ Runs []openAIRun }
			started := time.Now()
			vendorNode(t, "openai.mjs", &got, s.URL+"/k/openai/v1", strconv.FormatInt((nodeLoopFor).Milliseconds(), 10),
				strconv.Itoa(openAICost), syncToken, agentToken)
			refusals, calls := up.answered()
			if len(refusals) > 0 {
				t.Errorf("the upstream refused %d of %d calls: %v", len(refusals), calls, refusals)
			}
			// The client waits the Retry-After it reads, in whole seconds.
			oaSpent := spent{quota: openAIRequests, window: openAIWindow, comeBack: time.Second + time.Second + openAIWindow/2}
			tries := s.tries(t, "openai")
			oaSpent.check(t, tries, nodeLoopEnd(started, tries), documented)
			if len(got.Runs) != 2 {
				t.Fatalf("got %d runs, want 2", len(got.Runs))
			}
			for i, run := range got.Runs {
				t.Logf("caller %d: %d calls went, %d RateLimitErrors, statuses %v", i, run.OK, len(run.RateLimitErrors), run.Statuses)
				// The client retries a 429 after its Retry-After: no more
				// than a few per window.
				if got, most := run.Statuses["429"], 3*windowsIn(nodeLoopFor, openAIWindow); got > most {
					t.Errorf("caller %d met %d refusals, want at most %d (it must back off)", i, got, most)
				}
				for _, e := range run.Errors {
					t.Errorf("caller %d: the client surfaced %s", i, e)
				}
				for _, f := range run.Rates {
					checkOpenAIFields(t, i, f, false)
				}
				for _, f := range append(run.RateLimitErrors, run.Refusals...) {
					if f.Code != "rate_limit_exceeded" || (f.Type != "requests" && f.Type != "tokens") || strings.Contains(f.Message, "no body") {
						t.Errorf("caller %d: RateLimitError code %q type %q message %q, want OpenAI's", i, f.Code, f.Type, f.Message)
					}
					checkOpenAIFields(t, i, f, true)
				}
			}
		})
	}
}

// checkOpenAIFields checks one answer's OpenAI fields: all six present,
// limits no higher than the upstream's, resets in the future; on a
// refusal, no requests left until at least its Retry-After.
func checkOpenAIFields(t *testing.T, caller int, f openAIFields, refused bool) {
	t.Helper()
	for _, c := range []struct {
		limit, remaining, reset string
		quota                   int
	}{{f.LimitRequests, f.RemainingRequests, f.ResetRequests, openAIRequests}, {f.LimitTokens, f.RemainingTokens, f.ResetTokens, openAITokens}} {
		q, err1 := strconv.Atoi(c.limit)
		r, err2 := strconv.Atoi(c.remaining)
		d, err3 := time.ParseDuration(c.reset)
		if err1 != nil || err2 != nil || err3 != nil {
			t.Errorf("caller %d read limit %q remaining %q reset %q: not OpenAI's formats", caller, c.limit, c.remaining, c.reset)
			continue
		}
		if q > c.quota || r > q {
			t.Errorf("caller %d read limit %d remaining %d, more than the upstream's %d", caller, q, r, c.quota)
		}
		if d <= 0 && r < q {
			t.Errorf("caller %d read reset %v with %d of %d left: not in the future", caller, d, r, q)
		}
	}
	if refused {
		ra, err := strconv.Atoi(f.RetryAfter)
		d, _ := time.ParseDuration(f.ResetRequests)
		if err != nil || f.RemainingRequests != "0" || d < time.Duration(ra)*time.Second {
			t.Errorf("caller %d: a refusal with Retry-After %q says %s requests left, resetting in %s", caller, f.RetryAfter, f.RemainingRequests, f.ResetRequests)
		}
	}
}
