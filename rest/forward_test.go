package rest_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/gateway"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/rest"
)

// TestHeadersShowTheTighter checks that the rate-limit fields describe
// the tighter of the local budget and what the upstream said — on an
// accepted answer and on the upstream's own refusal, which is never made
// more generous on the way through.
func TestHeadersShowTheTighter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		localQuota    int
		upstreamQuota int
		calls         int
		wantStatus    int
		wantLimit     string
		wantRemaining string
		wantWait      bool // a Retry-After: the caller is to wait
	}{
		{"local tighter", 5, 120, 1, 200, "5", "4", false},
		{"upstream tighter", 120, 3, 1, 200, "3", "2", false},
		// The call took the upstream's last: its answer says when the next
		// may go, though the upstream sent no Retry-After with it.
		{"the last the upstream allows", 120, 1, 1, 200, "1", "0", true},
		// The key's budget was spent upstream by someone mcp-quota does
		// not know of: the upstream's refusal is the first word on it.
		{"upstream refuses", 120, 1, 1, 429, "1", "0", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStack(t, stackConfig{
				Demo: demo.Config{Quota: tt.upstreamQuota},
				Keys: defaultKeysWith(int64(tt.localQuota), time.Minute),
			})
			if tt.wantStatus == 429 {
				req, _ := http.NewRequest("GET", s.UpstreamURL+"/v1/participants?limit=1", nil)
				req.Header.Set("Authorization", "Bearer "+upstreamSecret)
				if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
					t.Fatalf("spending the upstream budget: %v %v", resp, err)
				} else {
					resp.Body.Close()
				}
			}
			var resp *http.Response
			var body []byte
			for range tt.calls {
				resp, body = s.do(t, "GET", "/k/demo/v1/participants?limit=1", syncToken, nil)
			}
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.wantStatus, body)
			}
			if got := resp.Header.Get("X-RateLimit-Limit"); got != tt.wantLimit {
				t.Errorf("X-RateLimit-Limit %q, want %q", got, tt.wantLimit)
			}
			if got := resp.Header.Get("X-RateLimit-Remaining"); got != tt.wantRemaining {
				t.Errorf("X-RateLimit-Remaining %q, want %q", got, tt.wantRemaining)
			}
			if got := resp.Header.Get("RateLimit"); !strings.Contains(got, "r="+tt.wantRemaining) {
				t.Errorf("RateLimit %q, want r=%s", got, tt.wantRemaining)
			}
			if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); tt.wantWait != (err == nil && ra >= 1) {
				t.Errorf("Retry-After %q; want one of a second or more: %v", resp.Header.Get("Retry-After"), tt.wantWait)
			}
			if tt.wantStatus == 429 {
				// The upstream's refusal passes with its Retry-After and its
				// problem; mcp-quota did not retry (the wait does not fit).
				checkProblem(t, resp, body, 429, "rateLimited")
				if st := s.API.Stats(upstreamSecret); st.Requests != 2 {
					t.Errorf("the upstream got %d requests, want 2", st.Requests)
				}
				// The next call is refused locally: the upstream said when.
				resp, body = s.do(t, "GET", "/k/demo/v1/participants?limit=1", syncToken, nil)
				checkProblem(t, resp, body, 429, "rateLimited")
				if st := s.API.Stats(upstreamSecret); st.Requests != 2 {
					t.Errorf("after the upstream's Retry-After, the upstream got %d requests, want 2", st.Requests)
				}
			}
		})
	}
}

// TestPreferWait checks that Prefer: wait holds a call for the budget
// instead of refusing it, and says so in Preference-Applied.
func TestPreferWait(t *testing.T) {
	t.Parallel()
	// A call may always be held up to upstream.PaceGrace for pacing, so
	// the window is longer than that.
	s := newStack(t, stackConfig{Keys: defaultKeysWith(1, 1500*time.Millisecond)})
	if resp, body := s.do(t, "GET", "/k/demo/v1/participants?limit=1", syncToken, nil); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, body := s.do(t, "GET", "/k/demo/v1/participants?limit=1", syncToken, nil, "Prefer", "wait=0")
	checkProblem(t, resp, body, 429, "rateLimited")
	if got := resp.Header.Get("Preference-Applied"); got != "" {
		t.Errorf("Preference-Applied %q on a refusal", got)
	}
	start := time.Now()
	resp, body = s.do(t, "GET", "/k/demo/v1/participants?limit=1", syncToken, nil, "Prefer", "respond-async, wait=5")
	if resp.StatusCode != 200 {
		t.Fatalf("with Prefer: wait=5: %d %s", resp.StatusCode, body)
	}
	if got := resp.Header.Get("Preference-Applied"); got != "wait=5" {
		t.Errorf("Preference-Applied %q, want wait=5", got)
	}
	// Held until the window's slot came free, not for all the wait it
	// allowed: only that claim, not how fast this machine went.
	if d := time.Since(start); d >= 5*time.Second {
		t.Errorf("held %v for a 1.5 s window: the whole wait=5", d)
	}
	if n := s.upstreamRequests(); n != 2 {
		t.Errorf("the upstream got %d requests, want 2", n)
	}
}

// TestBodyLimits checks the 413s: a declared length over the limit, and
// bodies of unknown length that turn out over it — buffered or already
// streaming.
func TestBodyLimits(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackConfig{Limits: rest.Limits{MaxBody: 4 << 10, ReplayableBody: 1 << 10}})
	tests := []struct {
		name string
		body io.Reader
	}{
		{"declared length", bytes.NewReader(make([]byte, 8<<10))},
		{"unknown length", io.MultiReader(bytes.NewReader(make([]byte, 8<<10)))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := s.do(t, "POST", "/k/demo/v1/echo", syncToken, tt.body)
			checkProblem(t, resp, body, 413, "payloadTooLarge")
			if m := missingRateLimitFields(resp.Header); len(m) > 0 {
				t.Errorf("missing %v", m)
			}
		})
	}
	// A declared length over the limit is refused before anything is sent.
	if n := s.upstreamRequests(); n > 1 {
		t.Errorf("the upstream got %d requests, want at most the one streamed", n)
	}
	resp, body := s.do(t, "POST", "/k/demo/v1/echo", syncToken, strings.NewReader(strings.Repeat("x", 4<<10)))
	if resp.StatusCode != 200 {
		t.Errorf("a body at the limit: %d %s", resp.StatusCode, body)
	}
}

// TestStreamedBody checks that a body past the replayable limit streams
// to the upstream as it arrives — the upstream has read its first part
// before the caller has written the rest — and that such a call is never
// retried, while a small body is. The waits the pacer sets after the
// upstream's refusals (RetryFloor and jitter) pass on a test clock.
func TestStreamedBody(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	firstPart := make(chan struct{}, 1)
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		switch r.URL.Path {
		case "/stream":
			buf := make([]byte, 2<<10)
			if _, err := io.ReadFull(r.Body, buf); err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			firstPart <- struct{}{}
			rest, _ := io.ReadAll(r.Body)
			fmt.Fprint(w, len(buf)+len(rest))
		case "/unavailable-once":
			io.Copy(io.Discard, r.Body)
			if calls.Load() == 1 {
				w.Header().Set("Retry-After", "0")
				w.WriteHeader(503)
			}
		}
	})
	clk := testkit.NewClock(time.Now())
	s := newStack(t, stackConfig{Upstream: up, Limits: rest.Limits{ReplayableBody: 1 << 10}, Clock: clk})

	t.Run("streams as it arrives", func(t *testing.T) {
		pr, pw := io.Pipe()
		go func() {
			pw.Write(bytes.Repeat([]byte("a"), 2<<10))
			select {
			case <-firstPart:
				pw.Write(bytes.Repeat([]byte("b"), 6<<10))
				pw.Close()
			case <-time.After(10 * time.Second):
				pw.CloseWithError(fmt.Errorf("the upstream never got the first part: the body was buffered"))
			}
		}()
		resp, body := s.do(t, "POST", "/k/demo/stream", syncToken, pr)
		if resp.StatusCode != 200 || string(body) != strconv.Itoa(8<<10) {
			t.Errorf("%d %s; want 200 and %d bytes received", resp.StatusCode, body, 8<<10)
		}
	})

	// The upstream fails the first attempt of each call, with
	// Retry-After: 0.
	for _, tt := range []struct {
		name       string
		body       func() io.Reader
		wantStatus int
		wantCalls  int32
	}{
		{"a streamed body is sent once", func() io.Reader { return io.MultiReader(bytes.NewReader(make([]byte, 4<<10))) }, 503, 1},
		{"a replayable body is retried", func() io.Reader { return strings.NewReader("small") }, 200, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			calls.Store(0)
			resp := s.doOnClock(t, clk, "PUT", "/k/demo/unavailable-once", syncToken, tt.body())
			if resp.StatusCode != tt.wantStatus || calls.Load() != tt.wantCalls {
				t.Errorf("status %d after %d upstream requests, want %d after %d", resp.StatusCode, calls.Load(), tt.wantStatus, tt.wantCalls)
			}
		})
	}
}

// recorder is an upstream that remembers every request it got and
// answers with what answer says.
type recorder struct {
	mu     sync.Mutex
	got    []*http.Request
	answer func(w http.ResponseWriter, r *http.Request)
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc.mu.Lock()
	rc.got = append(rc.got, r.Clone(r.Context()))
	rc.mu.Unlock()
	if rc.answer != nil {
		rc.answer(w, r)
	}
}

func (rc *recorder) requests() []*http.Request {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]*http.Request(nil), rc.got...)
}

// TestCallerCredentialsNeverForwarded checks, for each way a key sends
// its credential, that the upstream gets the key's credential once and
// nothing of the caller's: not its Authorization, cookies, a forged
// credential field or query parameter, nor hop-by-hop fields; and that
// nothing the upstream sends back carries the key's secret.
func TestCallerCredentialsNeverForwarded(t *testing.T) {
	t.Parallel()
	for _, auth := range []string{"bearer", "header:X-Api-Key", "query:api_key"} {
		t.Run(auth, func(t *testing.T) {
			up := &recorder{answer: func(w http.ResponseWriter, r *http.Request) {
				// An upstream that echoes its credential in links and fields.
				w.Header().Set("Link", "<"+r.URL.String()+`>; rel="self", </api/v1/items?page=2&api_key=`+upstreamSecret+`>; rel="next"`)
				w.Header().Set("X-Debug-Auth", r.Header.Get("Authorization")+r.Header.Get("X-Api-Key")+r.URL.Query().Get("api_key"))
				w.Header().Set("Set-Cookie", "session=upstream")
				w.Header().Set("Connection", "X-Upstream-Hop")
				w.Header().Set("X-Upstream-Hop", "1")
				w.Header().Set("Alt-Svc", `h3=":443"`)
				w.Header().Set("X-Kept", "yes")
				fmt.Fprint(w, "ok")
			}}
			keys := testkit.Keys(
				testkit.Key{Name: "demo", BaseURL: "%[1]s/api/", SecretEnv: "UPSTREAM_SECRET", Auth: auth, MaxRate: 1000},
				testkit.Key{Name: "other", BaseURL: "%[1]s", Auth: "none"},
			)
			s := newStack(t, stackConfig{Upstream: up, Keys: keys})
			resp, body := s.do(t, "GET", "/k/demo/v1/items?x=1&api_key=forged-by-caller", syncToken, nil,
				"Cookie", "session=caller", "X-Api-Key", "forged-by-caller", "Proxy-Authorization", "Basic Zm9yZ2Vk",
				"Connection", "X-Hop", "X-Hop", "1", "Keep-Alive", "timeout=5", "TE", "trailers", "Upgrade", "websocket",
				"Forwarded", "for=10.0.0.1", "X-Forwarded-For", "10.0.0.1", "Prefer", "wait=1", "X-Kept", "yes")
			if resp.StatusCode != 200 || string(body) != "ok" {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			got := up.requests()
			if len(got) != 1 {
				t.Fatalf("the upstream got %d requests, want 1", len(got))
			}
			r := got[0]
			// The caller's own X-Api-Key and api_key are end-to-end data
			// unless they are where the key's credential goes.
			wantAuth, wantAPIKey, wantQuery := "Bearer "+upstreamSecret, "forged-by-caller", "forged-by-caller"
			switch auth {
			case "header:X-Api-Key":
				wantAuth, wantAPIKey = "", upstreamSecret
			case "query:api_key":
				wantAuth, wantQuery = "", upstreamSecret
			}
			if a := r.Header.Values("Authorization"); strings.Join(a, ",") != wantAuth {
				t.Errorf("Authorization %q, want %q", a, wantAuth)
			}
			if a := r.Header.Values("X-Api-Key"); strings.Join(a, ",") != wantAPIKey {
				t.Errorf("X-Api-Key %q, want %q", a, wantAPIKey)
			}
			if q := r.URL.Query()["api_key"]; strings.Join(q, ",") != wantQuery {
				t.Errorf("api_key %q, want %q", q, wantQuery)
			}
			if r.URL.Path != "/api/v1/items" || r.URL.Query().Get("x") != "1" {
				t.Errorf("the upstream got %s", r.URL)
			}
			for _, f := range []string{"Cookie", "Proxy-Authorization", "X-Hop", "Keep-Alive", "Te", "Upgrade", "Forwarded", "X-Forwarded-For", "Prefer"} {
				if v := r.Header.Values(f); len(v) > 0 {
					t.Errorf("%s: %q was forwarded", f, v)
				}
			}
			if r.Header.Get("X-Kept") != "yes" {
				t.Errorf("the end-to-end field X-Kept was not forwarded")
			}

			// What comes back.
			if strings.Contains(fmt.Sprint(resp.Header), upstreamSecret) {
				t.Errorf("the answer's fields hold the key's secret: %v", resp.Header)
			}
			for _, f := range []string{"Set-Cookie", "X-Upstream-Hop", "Alt-Svc"} {
				if v := resp.Header.Values(f); len(v) > 0 {
					t.Errorf("%s: %q came back", f, v)
				}
			}
			// The field that echoed the credential comes back with the
			// credential replaced, and the answer says so.
			if v := resp.Header.Get("X-Debug-Auth"); !strings.Contains(v, keystore.Redacted) {
				t.Errorf("X-Debug-Auth %q, want the credential in it replaced by %s", v, keystore.Redacted)
			}
			if w := resp.Header.Get(rest.WarningField); !strings.Contains(w, "X-Debug-Auth") || !strings.Contains(w, "Link") {
				t.Errorf("%s %q, want it to name X-Debug-Auth and Link", rest.WarningField, w)
			}
			if resp.Header.Get("X-Kept") != "yes" {
				t.Errorf("the end-to-end field X-Kept did not come back")
			}
			wantLink := `</k/demo/v1/items?x=1>; rel="self", </k/demo/v1/items?page=2>; rel="next"`
			if auth != "query:api_key" {
				// api_key is no credential parameter here: the links keep
				// it, with the secret replaced.
				wantLink = `</k/demo/v1/items?x=1&api_key=forged-by-caller>; rel="self", </k/demo/v1/items?page=2&api_key=` + keystore.Redacted + `>; rel="next"`
			}
			if got := resp.Header.Get("Link"); got != wantLink {
				t.Errorf("Link %q, want %q", got, wantLink)
			}
		})
	}
}

// TestRedirects checks what happens to a redirect: to the key's own host
// it is followed with the credential; to an allowed host it is followed
// without it; to any other host it is not followed — the 3xx goes back to
// the caller, its Location as the upstream wrote it.
func TestRedirects(t *testing.T) {
	t.Parallel()
	elsewhere := &recorder{answer: func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "elsewhere") }}
	es := httptest.NewServer(elsewhere)
	t.Cleanup(es.Close)
	_, esPort, _ := strings.Cut(strings.TrimPrefix(es.URL, "http://"), ":")
	allowed := "localhost:" + esPort

	origin := &recorder{answer: func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/moved":
			http.Redirect(w, r, "/here", http.StatusFound)
		case "/here":
			fmt.Fprintf(w, "here with %q", r.Header.Get("Authorization"))
		case "/to-allowed":
			http.Redirect(w, r, "http://"+allowed+"/x", http.StatusFound)
		case "/away":
			http.Redirect(w, r, es.URL+"/x", http.StatusFound)
		}
	}}
	keys := testkit.Keys(
		testkit.Key{Name: "demo", BaseURL: "%[1]s", SecretEnv: "UPSTREAM_SECRET", MaxRate: 1000, AllowHosts: []string{allowed},
			Policies: testkit.Window(100, time.Minute)},
		testkit.Key{Name: "other", BaseURL: "%[1]s", Auth: "none"},
	)
	s := newStack(t, stackConfig{Upstream: origin, Keys: keys})

	resp, body := s.do(t, "GET", "/k/demo/moved", syncToken, nil)
	// The credential went to the same host (the echo of it comes back
	// redacted).
	if want := fmt.Sprintf("here with %q", "Bearer "+keystore.Redacted); resp.StatusCode != 200 || string(body) != want {
		t.Errorf("same host: %d %q, want 200 %q", resp.StatusCode, body, want)
	}

	resp, body = s.do(t, "GET", "/k/demo/to-allowed", syncToken, nil)
	if resp.StatusCode != 200 || string(body) != "elsewhere" {
		t.Errorf("allowed host: %d %q, want 200 from it", resp.StatusCode, body)
	}
	if got := elsewhere.requests(); len(got) != 1 || got[0].Header.Get("Authorization") != "" {
		t.Errorf("allowed host got %d requests, the credential %q; want 1 without", len(got), got[0].Header.Get("Authorization"))
	}

	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequest("GET", s.URL+"/k/demo/away", nil)
	req.Header.Set("Authorization", "Bearer "+syncToken)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != es.URL+"/x" {
		t.Errorf("other host: %d Location %q; want 302 to %s/x, not followed", resp.StatusCode, resp.Header.Get("Location"), es.URL)
	}
	if m := missingRateLimitFields(resp.Header); len(m) > 0 {
		t.Errorf("missing %v", m)
	}
	if got := elsewhere.requests(); len(got) != 1 {
		t.Errorf("the other host got %d requests from mcp-quota, want only the allowed one", len(got))
	}
}

// TestUpstreamUnavailable checks the answers when no upstream answer
// could be had: a key whose credential is missing, an upstream that is
// down, and a base URL at a cloud metadata address.
func TestUpstreamUnavailable(t *testing.T) {
	t.Parallel()
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	keys := defaultKeys + testkit.Keys(
		testkit.Key{Name: "nocred", BaseURL: "%[1]s", SecretEnv: "NOT_SET", MaxRate: 1000, Policies: testkit.Window(100, time.Minute)},
		testkit.Key{Name: "down", BaseURL: down.URL, SecretEnv: "UPSTREAM_SECRET", MaxRate: 1000, Policies: testkit.Window(100, time.Minute)},
		testkit.Key{Name: "metadata", BaseURL: "http://169.254.169.254/latest/", SecretEnv: "UPSTREAM_SECRET", MaxRate: 1000,
			Policies: testkit.Window(100, time.Minute)},
	)
	s := newStack(t, stackConfig{Keys: keys, Callers: callersWith(map[string][]string{"sync": {"*"}})})
	tests := []struct {
		key    string
		status int
	}{
		{"nocred", 503},
		{"down", 502},
		{"metadata", 502},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			// POST is never retried: a retry refused for pacing would be
			// answered as a local refusal (see the report on
			// upstream.Client.Do).
			resp, body := s.raw(t, "POST", "/k/"+tt.key+"/v1/participants", "Authorization: Bearer "+syncToken, "Content-Length: 0")
			checkProblem(t, resp, body, tt.status, "upstreamUnavailable")
			if m := missingRateLimitFields(resp.Header); len(m) > 0 {
				t.Errorf("missing %v", m)
			}
		})
	}
}

// TestBadTokensAreThrottled checks that after 20 bad caller tokens in a
// minute from one address, that address is refused — good token or not —
// until the minute has passed.
func TestBadTokensAreThrottled(t *testing.T) {
	t.Parallel()
	start := time.Now()
	clk := testkit.NewClock(start)
	s := newStack(t, stackConfig{Gateway: func(c *gateway.Config) { c.Clock = clk }})
	for i := range 20 {
		resp, body := s.do(t, "GET", "/v1/quota", fmt.Sprintf("guess-%02d", i), nil)
		checkProblem(t, resp, body, 401, "unauthorized")
	}
	for _, token := range []string{"guess-20", syncToken} {
		resp, body := s.do(t, "GET", "/v1/quota", token, nil)
		checkProblem(t, resp, body, 429, "rateLimited")
		if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); ra < 1 || ra > 60 {
			t.Errorf("Retry-After %q, want 1 to 60", resp.Header.Get("Retry-After"))
		}
	}
	clk.Set(start.Add(61 * time.Second))
	if resp, body := s.do(t, "GET", "/v1/quota", syncToken, nil); resp.StatusCode != 200 {
		t.Errorf("a minute later: %d %s", resp.StatusCode, body)
	}
	var q struct{ Keys []json.RawMessage }
	if _, body := s.do(t, "GET", "/v1/quota", syncToken, nil); json.Unmarshal(body, &q) != nil || len(q.Keys) != 1 {
		t.Errorf("/v1/quota for sync: %s; want its one key", body)
	}
}

// TestQuotaListsTheMostConstrainedFirst: GET /v1/quota lists the keys as
// quota_status does, the most constrained first, whatever their order in
// the configuration, and its advice is that key's.
func TestQuotaListsTheMostConstrainedFirst(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackConfig{
		Keys: testkit.Keys(
			testkit.Key{Name: "other", BaseURL: "%[1]s", SecretEnv: "UPSTREAM_SECRET"},
			testkit.Key{Name: "demo", BaseURL: "%[1]s", SecretEnv: "UPSTREAM_SECRET", Auth: "bearer", Profile: "ietf", MaxRate: 1000,
				Policies: []testkit.Policy{{Name: "default", Quota: 2, Window: time.Minute}}},
		),
		Callers: callersWith(map[string][]string{"sync": {"other", "demo"}}),
	})
	for range 2 {
		if resp, body := s.do(t, "GET", "/k/demo/v1/participants?limit=1", syncToken, nil); resp.StatusCode != 200 {
			t.Fatalf("a call of demo: %d %s", resp.StatusCode, body)
		}
	}
	var q struct {
		Keys []struct {
			Key    string
			Advice struct{ Action string }
		}
		Advice struct{ Action, Reason string }
	}
	resp, body := s.do(t, "GET", "/v1/quota", syncToken, nil)
	if resp.StatusCode != 200 || json.Unmarshal(body, &q) != nil || len(q.Keys) != 2 {
		t.Fatalf("/v1/quota: %d %s", resp.StatusCode, body)
	}
	if q.Keys[0].Key != "demo" || q.Keys[0].Advice.Action != "pause" || q.Advice.Action != "pause" || !strings.HasPrefix(q.Advice.Reason, "Key 'demo': ") {
		t.Errorf("/v1/quota: %s; want demo, spent, first, and its advice", body)
	}
}
