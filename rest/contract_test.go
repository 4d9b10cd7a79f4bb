package rest_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// problem is the RFC 9457 body of every answer mcp-quota gives itself.
type problem struct {
	Type        string `json:"type"`
	Status      int    `json:"status"`
	Code        string `json:"code"`
	Detail      string `json:"detail"`
	RetryAfterS int64  `json:"retry_after_s"`
}

// checkProblem checks that an answer is an RFC 9457 problem with status
// and code, and returns it.
func checkProblem(t *testing.T, resp *http.Response, body []byte, status int, code string) problem {
	t.Helper()
	var p problem
	if resp.StatusCode != status {
		t.Errorf("status %d, want %d (body %s)", resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json", ct)
		return p
	}
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("problem body %s: %v", body, err)
	}
	if p.Status != status || p.Code != code || p.Detail == "" {
		t.Errorf("problem {status %d, code %q, detail %q}, want status %d, code %q and a detail", p.Status, p.Code, p.Detail, status, code)
	}
	return p
}

// TestRefusals is every wall and every bad input, each with the exact
// status and problem code it gets. None of them reaches the upstream.
func TestRefusals(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackConfig{})
	host := strings.TrimPrefix(s.URL, "http://")
	_, port, _ := strings.Cut(host, ":")
	sync := "Authorization: Bearer " + syncToken
	tests := []struct {
		name       string
		method     string
		target     string
		lines      []string
		status     int
		code       string
		quotaShown bool // the answer is about a key the caller may use: it carries the rate-limit fields
	}{
		{"no caller token", "GET", "/k/demo/v1/participants", nil, 401, "unauthorized", false},
		{"wrong caller token", "GET", "/k/demo/v1/participants", []string{"Authorization: Bearer not-a-token-of-ours"}, 401, "unauthorized", false},
		{"caller token with one character more", "GET", "/k/demo/v1/participants", []string{sync + "x"}, 401, "unauthorized", false},
		{"caller token as Basic credentials", "GET", "/k/demo/v1/participants", []string{"Authorization: Basic " + syncToken}, 401, "unauthorized", false},
		{"caller token in a cookie", "GET", "/k/demo/v1/participants", []string{"Cookie: token=" + syncToken}, 401, "unauthorized", false},
		{"caller not listed for the key: answered as an unknown key", "GET", "/k/demo/v1/participants", []string{"Authorization: Bearer " + strangerToken}, 404, "unknownKey", false},
		{"unknown key", "GET", "/k/nope/v1/participants", []string{sync}, 404, "unknownKey", false},
		{"no key", "GET", "/k//v1/participants", []string{sync}, 404, "unknownKey", false},
		{"encoded key name", "GET", "/k/%64emo/v1/participants", []string{sync}, 404, "unknownKey", false},

		{"dot-dot", "GET", "/k/demo/v1/../../admin", []string{sync}, 400, "badRequest", true},
		{"dot-dot at the start", "GET", "/k/demo/../other/v1/participants", []string{sync}, 400, "badRequest", true},
		{"dot segment", "GET", "/k/demo/./v1/participants", []string{sync}, 400, "badRequest", true},
		{"encoded dot-dot", "GET", "/k/demo/%2e%2e/admin", []string{sync}, 400, "badRequest", true},
		{"encoded dot-dot, upper case", "GET", "/k/demo/%2E%2E/admin", []string{sync}, 400, "badRequest", true},
		{"half-encoded dot-dot", "GET", "/k/demo/.%2e/admin", []string{sync}, 400, "badRequest", true},
		{"encoded slash", "GET", "/k/demo/v1%2fparticipants", []string{sync}, 400, "badRequest", true},
		{"encoded double slash", "GET", "/k/demo/%2F%2Fevil.example/x", []string{sync}, 400, "badRequest", true},
		{"encoded backslash", "GET", "/k/demo/v1%5c..%5cadmin", []string{sync}, 400, "badRequest", true},
		{"backslash", "GET", `/k/demo/v1\..\admin`, []string{sync}, 400, "badRequest", true},
		{"encoded NUL", "GET", "/k/demo/v1%00", []string{sync}, 400, "badRequest", true},
		{"absolute URL", "GET", "/k/demo/http://evil.example/x", []string{sync}, 400, "badRequest", true},
		{"absolute URL without slashes", "GET", "/k/demo/https:evil.example", []string{sync}, 400, "badRequest", true},
		{"scheme-relative URL", "GET", "/k/demo//evil.example/x", []string{sync}, 400, "badRequest", true},
		{"user information", "GET", "/k/demo/@evil.example/x", []string{sync}, 400, "badRequest", true},
		{"user and password", "GET", "/k/demo/user:pw@evil.example/x", []string{sync}, 400, "badRequest", true},
		{"TRACE would echo the credential", "TRACE", "/k/demo/v1/echo", []string{sync}, 405, "badRequest", true},
		{"made-up method", "BREW", "/k/demo/v1/echo", []string{sync}, 405, "badRequest", true},

		{"absolute-form target naming another host", "GET", "http://evil.example/k/demo/v1/participants", []string{sync}, 403, "forbidden", false},
		{"DNS rebinding: a foreign Host", "GET", "/k/demo/v1/participants", []string{"Host: evil.example:" + port, sync}, 403, "forbidden", false},
		{"DNS rebinding: a Host that starts like ours", "GET", "/k/demo/v1/participants", []string{"Host: 127.0.0.1.evil.example:" + port, sync}, 403, "forbidden", false},
		{"DNS rebinding: localhost as a subdomain", "GET", "/mcp", []string{"Host: localhost.evil.example", sync}, 403, "forbidden", false},
		{"foreign Origin", "GET", "/k/demo/v1/participants", []string{"Origin: http://evil.example", sync}, 403, "forbidden", false},
		{"foreign Origin on /mcp", "POST", "/mcp", []string{"Origin: https://evil.example", sync, "Content-Length: 0"}, 403, "forbidden", false},
		{"foreign Origin on a loopback port", "GET", "/v1/quota", []string{"Origin: http://127.0.0.1:1", sync}, 403, "forbidden", false},
		{"null Origin", "GET", "/k/demo/v1/participants", []string{"Origin: null", sync}, 403, "forbidden", false},
		{"cross-site fetch", "GET", "/v1/quota", []string{"Sec-Fetch-Site: cross-site", sync}, 403, "forbidden", false},
		{"header section too large", "GET", "/k/demo/v1/participants", []string{sync, "X-Big: " + strings.Repeat("x", 40<<10)}, 431, "payloadTooLarge", false},
		{"MCP message too large", "POST", "/mcp", []string{sync, "Content-Type: application/json", "Content-Length: 2000000"}, 413, "payloadTooLarge", false},

		{"quota of an unknown key", "GET", "/v1/quota?key=nope", []string{sync}, 404, "unknownKey", false},
		{"quota of a key not listed: as an unknown key", "GET", "/v1/quota?key=other", []string{sync}, 404, "unknownKey", false},
		{"quota without a token", "GET", "/v1/quota", nil, 401, "unauthorized", false},
		{"activity without a key", "GET", "/v1/activity", []string{sync}, 400, "badRequest", false},
		{"activity limit 0", "GET", "/v1/activity?key=demo&limit=0", []string{sync}, 400, "badRequest", false},
		{"activity since not a time", "GET", "/v1/activity?key=demo&since=yesterday", []string{sync}, 400, "badRequest", false},
		{"activity cursor not ours", "GET", "/v1/activity?key=demo&cursor=zzz", []string{sync}, 400, "badRequest", false},
		{"activity of a key not listed: as an unknown key", "GET", "/v1/activity?key=other", []string{sync}, 404, "unknownKey", false},
		{"nothing here", "GET", "/admin", []string{sync}, 404, "badRequest", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := s.raw(t, tt.method, tt.target, tt.lines...)
			checkProblem(t, resp, body, tt.status, tt.code)
			missing := missingRateLimitFields(resp.Header)
			if tt.quotaShown && len(missing) > 0 {
				t.Errorf("missing %v: every answer about a key carries both forms of its budget", missing)
			}
			if !tt.quotaShown && len(missing) < len(rateLimitFields) {
				t.Errorf("rate-limit fields %v on an answer about no key the caller may use", resp.Header)
			}
			if tt.status == 401 && resp.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("401 without WWW-Authenticate")
			}
			if tt.status == 405 && resp.Header.Get("Allow") == "" {
				t.Errorf("405 without Allow")
			}
		})
	}
	// Requests net/http refuses before any handler runs: it answers in
	// plain text, with the status only.
	for _, tt := range []struct {
		name   string
		target string
		lines  []string
		status int
	}{
		{"bad escape", "/k/demo/v1/%zz", []string{sync}, 400},
		{"header section past the server's hard limit", "/k/demo/v1/participants", []string{sync, "X-Big: " + strings.Repeat("x", 80<<10)}, 431},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if resp, body := s.raw(t, "GET", tt.target, tt.lines...); resp.StatusCode != tt.status {
				t.Errorf("status %d, want %d (%s)", resp.StatusCode, tt.status, body)
			}
		})
	}
	if n := s.upstreamRequests(); n != 0 {
		t.Errorf("the upstream got %d requests, want 0", n)
	}
}

// TestLocalRefusal is the reference API's refusal, given by mcp-quota itself when
// the shared budget is spent: 429, Retry-After, both header forms, an
// RFC 9457 problem with "code": "rateLimited" — and nothing sent
// upstream; the refusal is in the key's activity.
func TestLocalRefusal(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackConfig{Keys: defaultKeysWith(2, time.Minute)})
	for i := range 2 {
		if resp, body := s.do(t, "GET", "/k/demo/v1/participants?limit=1", syncToken, nil); resp.StatusCode != 200 {
			t.Fatalf("call %d: %d %s", i+1, resp.StatusCode, body)
		}
	}
	for _, prefer := range []string{"", "wait=0"} {
		t.Run("Prefer: "+prefer, func(t *testing.T) {
			resp, body := s.do(t, "GET", "/k/demo/v1/participants?limit=1", syncToken, nil, "Prefer", prefer)
			p := checkProblem(t, resp, body, 429, "rateLimited")
			// The window is 60 s; a slot frees for a send once its call
			// has left the upstream's window too: 60 s after admission plus
			// the margin for the way there, at most pacer.MaxSendMargin.
			ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			if most := 60 + int(pacer.MaxSendMargin/time.Second); err != nil || ra < 1 || ra > most {
				t.Errorf("Retry-After %q, want 1 to %d seconds", resp.Header.Get("Retry-After"), most)
			}
			if p.RetryAfterS != int64(ra) || p.Type != ratelimit.ProblemQuotaExceeded {
				t.Errorf("problem retry_after_s %d, type %q; want %d, %q", p.RetryAfterS, p.Type, ra, ratelimit.ProblemQuotaExceeded)
			}
			// The wait in words is the Retry-After, as a person says it.
			if again := "Try again in " + reason.Duration(time.Duration(ra)*time.Second) + ";"; !strings.Contains(p.Detail, "Nothing was sent upstream") || !strings.Contains(p.Detail, again) {
				t.Errorf("detail %q does not say nothing was sent and %q", p.Detail, again)
			}
			if m := missingRateLimitFields(resp.Header); len(m) > 0 {
				t.Errorf("missing %v", m)
			}
			if got := resp.Header.Get("X-RateLimit-Remaining"); got != "0" {
				t.Errorf("X-RateLimit-Remaining %q, want 0", got)
			}
			if got := resp.Header.Get("RateLimit"); !strings.Contains(got, "r=0") {
				t.Errorf("RateLimit %q, want r=0", got)
			}
		})
	}
	if n := s.upstreamRequests(); n != 2 {
		t.Errorf("the upstream got %d requests, want 2", n)
	}
	resp, body := s.do(t, "GET", "/v1/activity?key=demo", syncToken, nil)
	var page struct {
		Activity []struct {
			Caller, Transport, State, Reason, At string
		}
	}
	if err := json.Unmarshal(body, &page); err != nil || resp.StatusCode != 200 {
		t.Fatalf("activity: %d %s %v", resp.StatusCode, body, err)
	}
	refused := 0
	for _, a := range page.Activity {
		if a.State == "rejected_local" {
			refused++
			if a.Caller != "sync" || a.Transport != "rest" || a.Reason == "" || a.At == "" {
				t.Errorf("refusal %+v: want caller sync, transport rest, a time and a reason", a)
			}
		}
	}
	if refused != 2 {
		t.Errorf("%d local refusals in the activity, want 2: %s", refused, body)
	}
}

// TestAccepted is the contract of answers the upstream gave: its status,
// body and end-to-end fields, its links pointed back at /k/{key}/, and
// the shared budget in both header forms.
func TestAccepted(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackConfig{Demo: demoRecords(1200)})

	t.Run("pages by following Link", func(t *testing.T) {
		target, pages, items := "/k/demo/v1/participants?limit=500", 0, 0
		for target != "" {
			resp, body := s.do(t, "GET", target, syncToken, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("GET %s: %d %s", target, resp.StatusCode, body)
			}
			if m := missingRateLimitFields(resp.Header); len(m) > 0 {
				t.Errorf("GET %s: missing %v", target, m)
			}
			var page struct{ Items []json.RawMessage }
			if err := json.Unmarshal(body, &page); err != nil {
				t.Fatal(err)
			}
			pages++
			items += len(page.Items)
			target = ""
			if link := resp.Header.Get("Link"); link != "" {
				next, ok := strings.CutPrefix(strings.Split(link, ">")[0], "<")
				if !ok || !strings.HasPrefix(next, "/k/demo/v1/participants?") {
					t.Fatalf("Link %q does not point at /k/demo/v1/participants", link)
				}
				target = next
			}
		}
		if pages != 3 || items != 1200 {
			t.Errorf("%d pages, %d items; want 3, 1200", pages, items)
		}
	})

	t.Run("created resource's Location", func(t *testing.T) {
		resp, body := s.do(t, "POST", "/k/demo/v1/participants", syncToken, strings.NewReader(`{"name":"Ada","email":"ada@example.com"}`),
			"Content-Type", "application/json")
		if resp.StatusCode != 201 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		if got, want := resp.Header.Get("Location"), "/k/demo/v1/participants/p-001201"; got != want {
			t.Errorf("Location %q, want %q", got, want)
		}
	})

	t.Run("HEAD", func(t *testing.T) {
		resp, body := s.do(t, "HEAD", "/k/demo/v1/participants/p-000001", syncToken, nil)
		if resp.StatusCode != 200 || len(body) != 0 || resp.Header.Get("ETag") == "" {
			t.Errorf("HEAD: %d, %d bytes, ETag %q; want 200, no body, an ETag", resp.StatusCode, len(body), resp.Header.Get("ETag"))
		}
		if m := missingRateLimitFields(resp.Header); len(m) > 0 {
			t.Errorf("missing %v", m)
		}
	})

	t.Run("conditional request", func(t *testing.T) {
		resp, _ := s.do(t, "GET", "/k/demo/v1/participants/p-000002", syncToken, nil)
		resp, body := s.do(t, "GET", "/k/demo/v1/participants/p-000002", syncToken, nil, "If-None-Match", resp.Header.Get("ETag"))
		if resp.StatusCode != 304 || len(body) != 0 {
			t.Errorf("%d, %d bytes; want 304 and no body", resp.StatusCode, len(body))
		}
		if m := missingRateLimitFields(resp.Header); len(m) > 0 {
			t.Errorf("missing %v", m)
		}
	})

	t.Run("upstream error", func(t *testing.T) {
		resp, body := s.do(t, "GET", "/k/demo/v1/nothing", syncToken, nil)
		checkProblem(t, resp, body, 404, "notFound") // the upstream's own problem, as it came
		if m := missingRateLimitFields(resp.Header); len(m) > 0 {
			t.Errorf("missing %v", m)
		}
	})

	t.Run("method, path, query, body and end-to-end fields forwarded", func(t *testing.T) {
		resp, body := s.do(t, "PUT", "/k/demo/v1/echo?a=1&b=x%20y&email=a@example.com", syncToken, strings.NewReader("hello"),
			"X-Request-Id", "r-42", "Accept", "application/json", "Content-Type", "text/plain")
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		var e echoed
		if err := json.Unmarshal(body, &e); err != nil {
			t.Fatal(err)
		}
		if e.Method != "PUT" || e.Path != "/v1/echo" || e.Body != "hello" ||
			fmt.Sprint(e.Query) != fmt.Sprint(url.Values{"a": {"1"}, "b": {"x y"}, "email": {"a@example.com"}}) {
			t.Errorf("the upstream got %+v", e)
		}
		for _, f := range []string{"X-Request-Id", "Accept", "Content-Type"} {
			if len(e.Headers[f]) == 0 {
				t.Errorf("%s was not forwarded: %v", f, e.Headers)
			}
		}
		if !e.AuthorizationPresent {
			t.Errorf("the key's credential was not sent")
		}
	})
	if st := s.API.Stats(upstreamSecret); st.Requests == 0 || st.Rejected != 0 {
		t.Errorf("upstream stats under the key's secret: %+v", st)
	}
}

// echoed is the demo's /v1/echo answer.
type echoed struct {
	Method               string              `json:"method"`
	Path                 string              `json:"path"`
	Query                map[string][]string `json:"query"`
	Headers              map[string][]string `json:"headers"`
	AuthorizationPresent bool                `json:"authorization_present"`
	Body                 string              `json:"body"`
}
