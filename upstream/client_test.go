package upstream

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

const secret = "upstream-secret-c0ffee5e1ec7"

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// fake is an upstream that answers from a script and remembers what it got.
type fake struct {
	mu       sync.Mutex
	requests []*http.Request
	bodies   []string
	answer   func(n int, r *http.Request) *http.Response
}

func (f *fake) RoundTrip(r *http.Request) (*http.Response, error) {
	f.mu.Lock()
	n := len(f.requests)
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body.Close()
	}
	f.requests = append(f.requests, r)
	f.bodies = append(f.bodies, string(body))
	f.mu.Unlock()
	resp := f.answer(n, r)
	if resp.Header == nil {
		resp.Header = http.Header{}
	}
	if resp.Body == nil {
		resp.Body = io.NopCloser(strings.NewReader(""))
	}
	resp.Request = r
	return resp, nil
}

func respond(status int, header ...string) *http.Response {
	h := http.Header{}
	for i := 0; i+1 < len(header); i += 2 {
		h.Add(header[i], header[i+1])
	}
	return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader("{}"))}
}

func newKey(t *testing.T, auth string) *keystore.Key {
	t.Helper()
	s, err := keystore.Parse([]byte(testkit.Keys(testkit.Key{Name: "k", BaseURL: "https://api.example/base", SecretEnv: "S", Auth: auth, MaxRate: 1000})),
		keystore.Env{Getenv: func(string) string { return secret }})
	if err != nil {
		t.Fatal(err)
	}
	k, _ := s.Key("k")
	return k
}

func newClient(t *testing.T, f http.RoundTripper) (*Client, *state.DB) {
	t.Helper()
	db := testkit.OpenState(t, state.Open)
	c := New(pacer.New(db), nil)
	c.Transport = f
	return c, db
}

func activity(t *testing.T, db *state.DB) []ledger.Attempt {
	t.Helper()
	var list []ledger.Attempt
	db.View(context.Background(), func(tx ledger.ReadTx) error {
		var err error
		list, err = tx.Activity(ledger.ActivityFilter{Key: "k"})
		return err
	})
	return list
}

func states(list []ledger.Attempt) []string {
	var out []string
	for i := len(list) - 1; i >= 0; i-- {
		out = append(out, string(list[i].State))
	}
	return out
}

func TestRetryAfterIsHonouredAndEachRetryCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{answer: func(n int, r *http.Request) *http.Response {
			if n == 0 {
				return respond(http.StatusTooManyRequests, "Retry-After", "3")
			}
			return respond(http.StatusOK)
		}}
		c, db := newClient(t, f)
		start := time.Now()
		resp, err := c.Do(context.Background(), newKey(t, "bearer"), Request{Caller: "a", Transport: "test", Path: "/x", MaxWait: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Attempts != 2 || len(f.requests) != 2 {
			t.Fatalf("status %d after %d attempts, want 200 after 2 (advice %+v)", resp.StatusCode, resp.Attempts, resp.Result.Advice)
		}
		if f.requests[1].Header.Get("Authorization") == "" {
			t.Error("the retry lost its credential")
		}
		if waited := time.Since(start); waited < 3*time.Second {
			t.Errorf("retried after %v, before Retry-After's 3 s", waited)
		}
		if got, want := strings.Join(states(activity(t, db)), ","), "rejected_upstream,confirmed"; got != want {
			t.Errorf("activity = %s, want %s (each attempt recorded)", got, want)
		}
	})
}

func TestNoRetryWhenTheWaitDoesNotFit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{answer: func(int, *http.Request) *http.Response {
			return respond(http.StatusTooManyRequests, "Retry-After", "30")
		}}
		c, _ := newClient(t, f)
		resp, err := c.Do(context.Background(), newKey(t, "bearer"), Request{Path: "/x", MaxWait: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || len(f.requests) != 1 {
			t.Errorf("status %d after %d requests; want the 429 after 1", resp.StatusCode, len(f.requests))
		}
		if a := resp.Result.Advice; a.Action != pacer.Pause || a.RetryAfter < 30*time.Second {
			t.Errorf("advice = %+v, want pause for at least 30 s", a)
		}
	})
}

func TestRetriesOnlyWhatCanBeResent(t *testing.T) {
	tests := []struct {
		name   string
		method string
		body   any
		header []string // of the answer
	}{
		{"POST is not idempotent", http.MethodPost, []byte("x"), []string{"Retry-After", "1"}},
		{"a streamed body cannot be resent", http.MethodPut, io.Reader(strings.NewReader("stream")), []string{"Retry-After", "1"}},
		{"x-should-retry false", http.MethodGet, nil, []string{"Retry-After", "1", "X-Should-Retry", "false"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &fake{answer: func(int, *http.Request) *http.Response { return respond(http.StatusTooManyRequests, tt.header...) }}
				c, _ := newClient(t, f)
				k := newKey(t, "bearer")
				k.Profile = "openai" // reads x-should-retry
				resp, err := c.Do(context.Background(), k, Request{Method: tt.method, Path: "/x", Body: tt.body, MaxWait: 10 * time.Second, AllMethods: true, ContentLength: -1})
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if len(f.requests) != 1 {
					t.Errorf("%d requests, want 1", len(f.requests))
				}
			})
		})
	}
}

func TestCredentialInjection(t *testing.T) {
	tests := []struct {
		auth  string
		check func(r *http.Request) bool
	}{
		{"bearer", func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer "+secret }},
		{"header:X-Api-Key", func(r *http.Request) bool {
			return r.Header.Get("X-Api-Key") == secret && r.Header.Get("Authorization") == ""
		}},
		{"query:api_key", func(r *http.Request) bool {
			return r.URL.Query()["api_key"][0] == secret && len(r.URL.Query()["api_key"]) == 1 && r.Header.Get("Authorization") == ""
		}},
		{"none", func(r *http.Request) bool {
			return r.Header.Get("Authorization") == "" && !strings.Contains(r.URL.String(), secret)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.auth, func(t *testing.T) {
			f := &fake{answer: func(int, *http.Request) *http.Response { return respond(http.StatusOK) }}
			c, db := newClient(t, f)
			k := newKey(t, tt.auth)
			h := http.Header{"Authorization": {"Bearer callers-own-token"}, "Cookie": {"c=1"}, "X-Api-Key": {"callers-key"},
				"Connection": {"X-Hop"}, "X-Hop": {"1"}, "Accept": {"application/json"}}
			resp, err := c.Do(context.Background(), k, Request{Path: "/items?api_key=callers&q=1", Header: h, MaxWait: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			r := f.requests[0]
			if !tt.check(r) {
				t.Errorf("credential not injected as %s: %v %v", tt.auth, r.URL, r.Header)
			}
			if r.Header.Get("Cookie") != "" || r.Header.Get("X-Hop") != "" || r.Header.Get("Accept") != "application/json" {
				t.Errorf("forwarded headers %v: want Cookie and the Connection-named field dropped, Accept kept", r.Header)
			}
			if r.URL.Path != "/base/items" || r.URL.Query().Get("q") != "1" {
				t.Errorf("sent to %v, want /base/items?q=1", r.URL)
			}
			for _, a := range activity(t, db) {
				if strings.Contains(a.Target, secret) || strings.Contains(a.Reason.String(), secret) {
					t.Errorf("the activity holds the secret: %+v", a)
				}
			}
		})
	}
}

func TestRedirects(t *testing.T) {
	f := &fake{answer: func(n int, r *http.Request) *http.Response {
		switch r.URL.Path {
		case "/base/same":
			return respond(http.StatusFound, "Location", "/base/moved")
		case "/base/away":
			return respond(http.StatusFound, "Location", "https://elsewhere.example/steal")
		}
		return respond(http.StatusOK)
	}}
	c, db := newClient(t, f)
	k := newKey(t, "bearer")
	resp, err := c.Do(context.Background(), k, Request{Path: "/same", MaxWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(f.requests) != 2 || f.requests[1].Header.Get("Authorization") == "" {
		t.Errorf("same-host redirect: status %d after %d requests; want followed with the credential", resp.StatusCode, len(f.requests))
	}
	if n := len(activity(t, db)); n != 2 {
		t.Errorf("%d attempts recorded for a followed redirect, want 2 (each hop counts)", n)
	}
	resp, err = c.Do(context.Background(), k, Request{Path: "/away", MaxWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || len(f.requests) != 3 {
		t.Errorf("cross-host redirect: status %d after %d requests; want the 302 returned, not followed", resp.StatusCode, len(f.requests))
	}
	for _, r := range f.requests {
		if r.URL.Host != "api.example" {
			t.Errorf("a request went to %s", r.URL.Host)
		}
	}
}

func TestUnreachable(t *testing.T) {
	c, db := newClient(t, roundTripFunc(func(*http.Request) (*http.Response, error) {
		return nil, errors.New("connection refused")
	}))
	_, err := c.Do(context.Background(), newKey(t, "bearer"), Request{Method: http.MethodPost, AllMethods: true, Path: "/x", MaxWait: time.Second})
	if !errors.Is(err, ErrUnreachable) || strings.Contains(err.Error(), secret) {
		t.Errorf("err = %v, want ErrUnreachable without the secret", err)
	}
	if got := states(activity(t, db)); len(got) != 1 || got[0] != string(ledger.Failed) {
		t.Errorf("activity = %v, want one failed attempt", got)
	}
}

func TestBodyIsForwardedWhole(t *testing.T) {
	f := &fake{answer: func(int, *http.Request) *http.Response { return respond(http.StatusCreated) }}
	c, _ := newClient(t, f)
	big := bytes.Repeat([]byte("0123456789"), 100000)
	resp, err := c.Do(context.Background(), newKey(t, "bearer"), Request{Method: http.MethodPost, AllMethods: true, Path: "/x",
		Body: io.Reader(bytes.NewReader(big)), ContentLength: int64(len(big)), MaxWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if f.bodies[0] != string(big) {
		t.Errorf("the upstream got %d bytes, want %d", len(f.bodies[0]), len(big))
	}
}

// TestHoldsSecret: an answer's header is copied to be scrubbed before its
// signals are read only when a field's name or value holds a form of the
// credential; holdsSecret finds every form scrubHeader would change.
func TestHoldsSecret(t *testing.T) {
	s := newKey(t, "bearer").Scrubber()
	for _, tt := range []struct {
		name string
		h    http.Header
		want bool
	}{
		{"none", http.Header{"Ratelimit": {`"default";r=5;t=30`}, "Content-Type": {"application/json"}}, false},
		{"in a value", http.Header{"X-Echo": {"token " + secret}}, true},
		{"percent-encoded", http.Header{"Location": {"/next?k=" + url.QueryEscape(secret)}}, true},
		{"in a name", http.Header{"X-" + secret: {"1"}}, true},
		// Go writes a field's name in its own case (x-leak-upstream-…
		// arrives as X-Leak-Upstream-…); HTTP names have none.
		{"in a name, as Go writes it", http.Header{http.CanonicalHeaderKey("x-leak-" + secret): {"1"}}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := holdsSecret(s, tt.h); got != tt.want {
				t.Errorf("holdsSecret = %v; want %v", got, tt.want)
			}
			changed := len(scrubHeader(s, tt.h.Clone())) > 0
			if changed != tt.want {
				t.Errorf("scrubHeader changed it: %v; holdsSecret must say the same", changed)
			}
		})
	}
}

// The body of a refusal is read for the signals it alone carries: here a
// google.rpc.Status whose RetryInfo asks for 30 s, on a 429 without
// Retry-After; the caller still gets the body whole.
func TestSignalsInARefusalsBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const body = `{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [` +
			`{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "30s"}]}}`
		f := &fake{answer: func(int, *http.Request) *http.Response {
			r := respond(http.StatusTooManyRequests, "Content-Type", "application/json")
			r.Body = io.NopCloser(strings.NewReader(body))
			return r
		}}
		c, _ := newClient(t, f)
		resp, err := c.Do(context.Background(), newKey(t, "bearer"), Request{Path: "/x", MaxWait: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !resp.Reading.HasRetryAfter || resp.Reading.RetryAfter != 30*time.Second {
			t.Errorf("the reading's wait: %v (has one: %v), want the body's 30s", resp.Reading.RetryAfter, resp.Reading.HasRetryAfter)
		}
		if a := resp.Result.Advice; a.Action != pacer.Pause || a.RetryAfter < 30*time.Second {
			t.Errorf("advice = %+v, want pause for at least 30 s", a)
		}
		if string(got) != body {
			t.Errorf("the caller got the body %q, want it whole", got)
		}
	})
}

// What the signals record never holds the credential, though an upstream
// names its policy by it: the fields are read as the caller will see
// them, scrubbed.
func TestSignalsNeverHoldTheCredential(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{answer: func(int, *http.Request) *http.Response {
			return respond(http.StatusOK, "RateLimit-Policy", `"`+secret+`";q=10;w=60`, "RateLimit", `"`+secret+`";r=5;t=30`)
		}}
		c, db := newClient(t, f)
		resp, err := c.Do(context.Background(), newKey(t, "bearer"), Request{Path: "/x", MaxWait: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if len(resp.Reading.Observations) == 0 {
			t.Fatal("the answer's fields gave no observation: the test shows nothing")
		}
		for _, ob := range resp.Reading.Observations {
			if strings.Contains(ob.Policy, secret) {
				t.Errorf("the reading names policy %q, the credential", ob.Policy)
			}
		}
		err = db.View(context.Background(), func(tx ledger.ReadTx) error {
			seen, err := tx.SeenPolicies("k")
			for _, p := range seen {
				if strings.Contains(p.Policy, secret) {
					t.Errorf("the state keeps policy %q, the credential", p.Policy)
				}
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// The credential goes only to the key's own host over the key's own
// scheme: not to another host, another port, or the same host over plain
// HTTP (the redirect policy refuses those before; this holds without it).
func TestAuthorizeOnlyTheKeysOrigin(t *testing.T) {
	k := newKey(t, "bearer") // https://api.example/base
	for _, tt := range []struct {
		url  string
		want bool
	}{
		{"https://api.example/base/x", true},
		{"http://api.example/base/x", false},
		{"https://other.example/base/x", false},
		{"https://api.example:8443/base/x", false},
	} {
		req, err := http.NewRequest(http.MethodGet, tt.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := authorize(req, k); err != nil {
			t.Fatal(err)
		}
		if got := req.Header.Get("Authorization") != ""; got != tt.want {
			t.Errorf("a request to %s carries the credential: %v, want %v", tt.url, got, tt.want)
		}
	}
}
