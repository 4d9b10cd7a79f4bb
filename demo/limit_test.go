package demo_test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/demo"
)

// limitFields are the rate-limit fields any mode may send; a test that
// lists the fields it wants also wants every other one absent.
var limitFields = []string{
	"RateLimit-Policy", "RateLimit", "Retry-After",
	"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset",
	"X-RateLimit-Used", "X-RateLimit-Resource",
}

// fields returns the rate-limit fields of h, absent ones left out.
func fields(h http.Header) map[string]string {
	got := map[string]string{}
	for _, name := range limitFields {
		if vs := h.Values(name); len(vs) > 0 {
			got[name] = strings.Join(vs, " | ")
		}
	}
	return got
}

// with returns a copy of m with the pairs kv added.
func with(m map[string]string, kv ...string) map[string]string {
	out := make(map[string]string, len(m)+len(kv)/2)
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

func fixedWindowFields(r, t int) map[string]string {
	return map[string]string{
		"RateLimit-Policy":      `"default";q=120;w=60`,
		"RateLimit":             fmt.Sprintf(`"default";r=%d;t=%d`, r, t),
		"X-RateLimit-Limit":     "120",
		"X-RateLimit-Remaining": strconv.Itoa(r),
		"X-RateLimit-Reset":     strconv.Itoa(t),
	}
}

func gitHubFields(remaining int, reset time.Time) map[string]string {
	return map[string]string{
		"X-RateLimit-Limit":     "120",
		"X-RateLimit-Remaining": strconv.Itoa(remaining),
		"X-RateLimit-Used":      strconv.Itoa(120 - remaining),
		"X-RateLimit-Reset":     strconv.FormatInt(reset.Unix(), 10),
		"X-RateLimit-Resource":  "core",
	}
}

var liarFields = map[string]string{
	"RateLimit-Policy":      `"default";q=1000000;w=1`,
	"RateLimit":             `"default";r=1000000;t=1`,
	"X-RateLimit-Limit":     "1000000",
	"X-RateLimit-Remaining": "1000000",
	"X-RateLimit-Reset":     "1",
}

const (
	hiddenPolicy       = `"minute";q=120;w=60, "hour";q=180;w=300`
	fixedWindowRefusal = `{"status":429,"code":"rateLimited","detail":"This key made more than 120 calls in a minute. Try again in 18 seconds; the RateLimit header says what is left."}`
)

// TestFixedWindowPageExample replays the reference API's example: calls at 0 s, 10 s and
// 18 s leave 117 calls and 42 seconds.
func TestFixedWindowPageExample(t *testing.T) {
	c := newClock()
	api := newAPI(c, demo.Config{})
	var res response
	for _, at := range []time.Duration{0, 10 * time.Second, 18 * time.Second} {
		c.Set(at)
		res = call(t, api, http.MethodGet, "/v1/participants?limit=500", "key")
	}
	if res.status != http.StatusOK {
		t.Fatalf("got status %d, want 200", res.status)
	}
	if diff := cmp.Diff(fixedWindowFields(117, 42), fields(res.header)); diff != "" {
		t.Errorf("fields (-want +got):\n%s", diff)
	}
}

// TestLimitAtTheBoundary sends one call at 0 s and 119 at 42 s, so the
// 120th is the last accepted; the 121st, at 42 s, is refused 18 s before
// the window ends; at 60 s a call is admitted again.
func TestLimitAtTheBoundary(t *testing.T) {
	end := t0.Add(60 * time.Second)
	tests := []struct {
		mode        demo.Mode
		last        map[string]string // fields of the 120th call
		refusal     map[string]string // fields of the 121st
		status      int
		contentType string
		body        string
		next        map[string]string // fields of the first call at 60 s
	}{{
		mode:        demo.FixedWindow,
		last:        fixedWindowFields(0, 18),
		refusal:     with(fixedWindowFields(0, 18), "Retry-After", "18"),
		status:      http.StatusTooManyRequests,
		contentType: "application/problem+json",
		body:        fixedWindowRefusal,
		next:        fixedWindowFields(119, 60),
	}, {
		// The call at 0 s leaves the window at 60 s; the 119 calls at 42 s
		// are still in it, so the call at 60 s takes the last place.
		mode:        demo.Sliding,
		last:        fixedWindowFields(0, 18),
		refusal:     with(fixedWindowFields(0, 18), "Retry-After", "18"),
		status:      http.StatusTooManyRequests,
		contentType: "application/problem+json",
		body:        fixedWindowRefusal,
		next:        fixedWindowFields(0, 42),
	}, {
		mode:        demo.HiddenLong,
		last:        map[string]string{"RateLimit-Policy": hiddenPolicy, "RateLimit": `"minute";r=0;t=18`},
		refusal:     map[string]string{"RateLimit-Policy": hiddenPolicy, "RateLimit": `"minute";r=0;t=18`, "Retry-After": "18"},
		status:      http.StatusTooManyRequests,
		contentType: "application/problem+json",
		body:        fixedWindowRefusal,
		// minute: 119 left for 60 s; hour: 180-121 = 59 left for 240 s.
		next: map[string]string{"RateLimit-Policy": hiddenPolicy, "RateLimit": `"hour";r=59;t=240`},
	}, {
		mode:        demo.GitHubStyle,
		last:        gitHubFields(0, end),
		refusal:     gitHubFields(0, end),
		status:      http.StatusForbidden,
		contentType: "application/json; charset=utf-8",
		body:        `{"message":"API rate limit exceeded for user ID 1.","documentation_url":"https://docs.github.com/rest/using-the-rest-api/rate-limits-for-the-rest-api","status":"403"}`,
		next:        gitHubFields(119, end.Add(60*time.Second)),
	}, {
		mode:        demo.RetryAfterOnly,
		last:        map[string]string{},
		refusal:     map[string]string{"Retry-After": "18"},
		status:      http.StatusTooManyRequests,
		contentType: "text/plain; charset=utf-8",
		body:        "Too Many Requests\n",
		next:        map[string]string{},
	}, {
		mode:        demo.Silent,
		last:        map[string]string{},
		refusal:     map[string]string{},
		status:      http.StatusTooManyRequests,
		contentType: "text/plain; charset=utf-8",
		body:        "Too Many Requests\n",
		next:        map[string]string{},
	}, {
		mode:        demo.Liar,
		last:        liarFields,
		refusal:     with(liarFields, "Retry-After", "18"),
		status:      http.StatusTooManyRequests,
		contentType: "application/problem+json",
		body:        fixedWindowRefusal,
		next:        liarFields,
	}}
	for _, tt := range tests {
		t.Run(string(tt.mode), func(t *testing.T) {
			c := newClock()
			api := newAPI(c, demo.Config{Mode: tt.mode})
			get(t, api, "key", 1, http.StatusOK)
			c.Set(42 * time.Second)
			last := get(t, api, "key", 119, http.StatusOK)
			if diff := cmp.Diff(tt.last, fields(last.header)); diff != "" {
				t.Errorf("120th call: fields (-want +got):\n%s", diff)
			}

			refused := call(t, api, http.MethodGet, "/v1/echo", "key")
			if refused.status != tt.status {
				t.Errorf("121st call: got status %d, want %d", refused.status, tt.status)
			}
			if diff := cmp.Diff(tt.refusal, fields(refused.header)); diff != "" {
				t.Errorf("121st call: fields (-want +got):\n%s", diff)
			}
			if got := refused.header.Get("Content-Type"); got != tt.contentType {
				t.Errorf("121st call: got Content-Type %q, want %q", got, tt.contentType)
			}
			if refused.body != tt.body {
				t.Errorf("121st call: got body\n%s\nwant\n%s", refused.body, tt.body)
			}

			c.Set(60 * time.Second)
			next := get(t, api, "key", 1, http.StatusOK)
			if diff := cmp.Diff(tt.next, fields(next.header)); diff != "" {
				t.Errorf("call at 60 s: fields (-want +got):\n%s", diff)
			}

			s := api.Stats("key")
			if s.Requests != 122 || len(s.Accepted) != 121 || s.Rejected != 1 {
				t.Errorf("got %d requests, %d accepted, %d rejected; want 122, 121, 1",
					s.Requests, len(s.Accepted), s.Rejected)
			}
		})
	}
}

// TestRetryAfterIsEnough checks, for every mode that sends Retry-After,
// that a client which waits exactly as long as it says is admitted, and
// that the window never lets more through than the mode promises.
func TestRetryAfterIsEnough(t *testing.T) {
	for _, mode := range []demo.Mode{demo.FixedWindow, demo.Sliding, demo.HiddenLong, demo.RetryAfterOnly, demo.Liar} {
		t.Run(string(mode), func(t *testing.T) {
			c := newClock()
			api := newAPI(c, demo.Config{Mode: mode, Quota: 10, Window: 10 * time.Second})
			at, rng := time.Duration(0), uint64(1)
			retrying := false
			for at < 5*time.Minute {
				c.Set(at)
				res := call(t, api, http.MethodGet, "/v1/echo", "key")
				switch res.status {
				case http.StatusOK:
					retrying = false
					rng = rng*6364136223846793005 + 1442695040888963407
					at += time.Duration(rng>>33%700) * time.Millisecond
				case http.StatusTooManyRequests:
					if retrying {
						t.Fatalf("at %v: refused again after waiting Retry-After", at)
					}
					s, err := strconv.Atoi(res.header.Get("Retry-After"))
					if err != nil || s < 1 {
						t.Fatalf("at %v: got Retry-After %q, want whole seconds ≥ 1", at, res.header.Get("Retry-After"))
					}
					retrying = true
					at += time.Duration(s) * time.Second
				default:
					t.Fatalf("at %v: got status %d", at, res.status)
				}
			}
			s := api.Stats("key")
			if s.Rejected == 0 {
				t.Fatal("got no refusals; the load does not test the limit")
			}
			if mode == demo.Sliding {
				if got := s.MaxInWindow(10 * time.Second); got != 10 {
					t.Errorf("got %d calls in the busiest rolling window, want 10", got)
				}
			}
		})
	}
}

// TestSlidingKeepsEveryRollingWindow bursts just before and just after a
// fixed window's end: the fixed window lets nearly twice the quota
// through in one rolling minute, the sliding window only the quota.
func TestSlidingKeepsEveryRollingWindow(t *testing.T) {
	tests := []struct {
		mode demo.Mode
		want int
	}{
		{demo.FixedWindow, 239},
		{demo.Sliding, 120},
	}
	for _, tt := range tests {
		t.Run(string(tt.mode), func(t *testing.T) {
			c := newClock()
			api := newAPI(c, demo.Config{Mode: tt.mode})
			get(t, api, "key", 1, http.StatusOK)
			for _, at := range []time.Duration{59 * time.Second, 60 * time.Second} {
				c.Set(at)
				for call(t, api, http.MethodGet, "/v1/echo", "key").status == http.StatusOK {
				}
			}
			if got := api.Stats("key").MaxInWindow(time.Minute); got != tt.want {
				t.Errorf("got %d calls in the busiest rolling minute, want %d", got, tt.want)
			}
		})
	}
}

// TestHiddenLongShowsOnlyTheClosestPolicy spends the minute policy in the
// first window, then the hour policy in the second: RateLimit names one
// policy at a time, the one with the fewest calls left.
func TestHiddenLongShowsOnlyTheClosestPolicy(t *testing.T) {
	c := newClock()
	api := newAPI(c, demo.Config{Mode: demo.HiddenLong})
	steps := []struct {
		at        time.Duration
		calls     int
		status    int
		rateLimit string
		retry     string
	}{
		{0, 1, http.StatusOK, `"minute";r=119;t=60`, ""},
		{0, 119, http.StatusOK, `"minute";r=0;t=60`, ""},
		{60 * time.Second, 1, http.StatusOK, `"hour";r=59;t=240`, ""},
		{60 * time.Second, 59, http.StatusOK, `"hour";r=0;t=240`, ""},
		{60 * time.Second, 1, http.StatusTooManyRequests, `"hour";r=0;t=240`, "240"},
		// The minute policy has room again, the hour policy not yet.
		{180 * time.Second, 1, http.StatusTooManyRequests, `"hour";r=0;t=120`, "120"},
		{300 * time.Second, 1, http.StatusOK, `"minute";r=119;t=60`, ""},
	}
	for _, s := range steps {
		c.Set(s.at)
		res := get(t, api, "key", s.calls, s.status)
		want := map[string]string{"RateLimit-Policy": hiddenPolicy, "RateLimit": s.rateLimit}
		if s.retry != "" {
			want["Retry-After"] = s.retry
		}
		if diff := cmp.Diff(want, fields(res.header)); diff != "" {
			t.Errorf("at %v: fields (-want +got):\n%s", s.at, diff)
		}
	}
	c.Set(60 * time.Second)
	api.Reset()
	get(t, api, "key", 120, http.StatusOK)
	c.Set(120 * time.Second)
	get(t, api, "key", 60, http.StatusOK)
	res := get(t, api, "key", 1, http.StatusTooManyRequests)
	const want = `{"status":429,"code":"rateLimited","detail":"This key made more than 180 calls in 5 minutes. Try again in 240 seconds; the RateLimit header says what is left."}`
	if res.body != want {
		t.Errorf("refusal by the hour policy: got body\n%s\nwant\n%s", res.body, want)
	}
}

// TestGitHubStyle checks the epoch reset (rounded up to a whole second)
// and the 429 variant of the refusal.
func TestGitHubStyle(t *testing.T) {
	tests := []struct {
		name   string
		status int
		want   int
	}{
		{"default 403", 0, http.StatusForbidden},
		{"429", http.StatusTooManyRequests, http.StatusTooManyRequests},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			api := newAPI(c, demo.Config{Mode: demo.GitHubStyle, Quota: 5, Window: time.Hour, GitHubStatus: tt.status})
			c.Set(1500 * time.Millisecond)
			first := get(t, api, "key", 1, http.StatusOK)
			// The window ends at t0 + 1h + 1.5s; its epoch second is rounded up.
			reset := strconv.FormatInt(t0.Unix()+3600+2, 10)
			want := map[string]string{
				"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "4", "X-RateLimit-Used": "1",
				"X-RateLimit-Reset": reset, "X-RateLimit-Resource": "core",
			}
			if diff := cmp.Diff(want, fields(first.header)); diff != "" {
				t.Errorf("first call: fields (-want +got):\n%s", diff)
			}
			get(t, api, "key", 4, http.StatusOK)
			refused := get(t, api, "key", 1, tt.want)
			want = with(want, "X-RateLimit-Remaining", "0", "X-RateLimit-Used", "5")
			if diff := cmp.Diff(want, fields(refused.header)); diff != "" {
				t.Errorf("refusal: fields (-want +got):\n%s", diff)
			}
			var body struct {
				Message, Status  string
				DocumentationURL string `json:"documentation_url"`
			}
			decode(t, refused.body, &body)
			if !strings.HasPrefix(body.Message, "API rate limit exceeded") || body.Status != strconv.Itoa(tt.want) || body.DocumentationURL == "" {
				t.Errorf("refusal: got body %s, want GitHub's rate-limit message with status %d", refused.body, tt.want)
			}
		})
	}
}

// TestServersCountTheirOwnWindows: with two servers each admits half the
// quota in its own window. Traffic that starts evenly from rest gets
// exactly the quota per window; when the servers' windows do not line up,
// a rolling window holds more than the quota.
func TestServersCountTheirOwnWindows(t *testing.T) {
	t.Run("even start", func(t *testing.T) {
		c := newClock()
		api := newAPI(c, demo.Config{Servers: 2})
		first := get(t, api, "key", 1, http.StatusOK)
		// Server 1 has 59 of its 60 left and reports them for both servers.
		if got, want := first.header.Get("RateLimit"), `"default";r=118;t=60`; got != want {
			t.Errorf("first call: got RateLimit %s, want %s", got, want)
		}
		get(t, api, "key", 119, http.StatusOK)
		get(t, api, "key", 2, http.StatusTooManyRequests)
		c.Set(60 * time.Second)
		get(t, api, "key", 120, http.StatusOK)
		if got := api.Stats("key").MaxInWindow(time.Minute); got != 120 {
			t.Errorf("got %d calls in the busiest rolling minute, want 120", got)
		}
	})
	t.Run("windows out of line", func(t *testing.T) {
		busiest := func(servers int, pause time.Duration) int {
			c := newClock()
			api := newAPI(c, demo.Config{Servers: servers})
			call(t, api, http.MethodGet, "/v1/echo", "key") // server 1's window starts at 0 s
			for at := pause; at < 10*time.Minute; at += 250 * time.Millisecond {
				c.Set(at) // server 2's starts at the pause
				call(t, api, http.MethodGet, "/v1/echo", "key")
			}
			return api.Stats("key").MaxInWindow(time.Minute)
		}
		if got := busiest(2, 0); got != 120 {
			t.Errorf("windows in line: got %d calls in the busiest rolling minute, want 120", got)
		}
		got := busiest(2, 20*time.Second)
		if got <= 120 || got >= 180 {
			t.Errorf("windows 20 s apart: got %d calls in the busiest rolling minute, want more than 120 and fewer than 180", got)
		}
	})
}

// Test304CountsAgainstTheLimit: a 304 is answered with the rate-limit
// fields and counts, and at the limit a conditional request is refused.
func Test304CountsAgainstTheLimit(t *testing.T) {
	c := newClock()
	api := newAPI(c, demo.Config{Quota: 3})
	first := call(t, api, http.MethodGet, "/v1/participants/p-000001", "key")
	etag := first.header.Get("ETag")
	if first.status != http.StatusOK || !strings.HasPrefix(etag, `"`) {
		t.Fatalf("got status %d and ETag %q, want 200 and a strong ETag", first.status, etag)
	}
	for i, want := range []struct {
		status    int
		rateLimit string
	}{
		{http.StatusNotModified, `"default";r=1;t=60`},
		{http.StatusNotModified, `"default";r=0;t=60`},
		{http.StatusTooManyRequests, `"default";r=0;t=60`},
	} {
		res := call(t, api, http.MethodGet, "/v1/participants/p-000001", "key", "If-None-Match", etag)
		if res.status != want.status || res.header.Get("RateLimit") != want.rateLimit {
			t.Errorf("conditional call %d: got %d with RateLimit %s, want %d with %s",
				i+1, res.status, res.header.Get("RateLimit"), want.status, want.rateLimit)
		}
		if res.status == http.StatusNotModified && (res.body != "" || res.header.Get("ETag") != etag) {
			t.Errorf("conditional call %d: got 304 with body %q and ETag %q, want no body and ETag %s",
				i+1, res.body, res.header.Get("ETag"), etag)
		}
	}
	if got := len(api.Stats("key").Accepted); got != 3 {
		t.Errorf("got %d accepted calls, want 3 (the 304s count)", got)
	}
}

// TestKeysCountSeparately: each token has its own window.
func TestKeysCountSeparately(t *testing.T) {
	c := newClock()
	api := newAPI(c, demo.Config{Quota: 2})
	get(t, api, "agent", 2, http.StatusOK)
	get(t, api, "agent", 1, http.StatusTooManyRequests)
	get(t, api, "sync", 2, http.StatusOK)
	if got := api.Stats("nobody"); got.Requests != 0 || got.Accepted != nil {
		t.Errorf("unknown key: got %+v, want zero Stats", got)
	}
}

// TestConcurrentCallsKeepTheQuota: many goroutines at one instant get
// exactly the quota admitted.
func TestConcurrentCallsKeepTheQuota(t *testing.T) {
	c := newClock()
	api := newAPI(c, demo.Config{Mode: demo.Sliding, Servers: 3})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				call(t, api, http.MethodGet, "/v1/participants?limit=1", "key")
			}
		})
	}
	wg.Wait()
	s := api.Stats("key")
	if s.Requests != 400 || len(s.Accepted) != 120 || s.Rejected != 280 {
		t.Errorf("got %d requests, %d accepted, %d rejected; want 400, 120, 280", s.Requests, len(s.Accepted), s.Rejected)
	}
}
