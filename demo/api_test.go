package demo_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/demo"
)

type participant struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Email     string    `json:"email"`
	UpdatedAt time.Time `json:"updatedAt"`
}

type page struct {
	Items      []participant `json:"items"`
	NextCursor *string       `json:"next_cursor"`
}

// readAll follows the cursor from query on and returns every page.
func readAll(t *testing.T, api http.Handler, query url.Values) []page {
	t.Helper()
	var pages []page
	for {
		res := call(t, api, http.MethodGet, "/v1/participants?"+query.Encode(), "key")
		if res.status != http.StatusOK {
			t.Fatalf("page %d: got status %d (%s)", len(pages)+1, res.status, res.body)
		}
		var p page
		decode(t, res.body, &p)
		pages = append(pages, p)
		link := res.header.Get("Link")
		if p.NextCursor == nil {
			if link != "" {
				t.Errorf("last page: got Link %q, want none", link)
			}
			return pages
		}
		next := url.Values{"cursor": {*p.NextCursor}, "limit": {query.Get("limit")}}
		if s := query.Get("updatedSince"); s != "" {
			next.Set("updatedSince", s)
		}
		if want := "</v1/participants?" + next.Encode() + `>; rel="next"`; link != want {
			t.Errorf("page %d: got Link %q, want %q", len(pages), link, want)
		}
		query.Set("cursor", *p.NextCursor)
		if len(pages) > 1000 {
			t.Fatal("more than 1000 pages")
		}
	}
}

// TestPagination reads the 10,000 participants in pages of 500, then only
// those updated since a time, which is inclusive.
func TestPagination(t *testing.T) {
	api := newAPI(newClock(), demo.Config{Quota: 1000})
	pages := readAll(t, api, url.Values{"limit": {"500"}})
	if len(pages) != 20 {
		t.Errorf("got %d pages, want 20", len(pages))
	}
	var all []participant
	seen := map[string]bool{}
	for i, p := range pages {
		if len(p.Items) != 500 {
			t.Errorf("page %d: got %d items, want 500", i+1, len(p.Items))
		}
		for _, it := range p.Items {
			if seen[it.ID] {
				t.Errorf("page %d: %s seen before", i+1, it.ID)
			}
			seen[it.ID] = true
			all = append(all, it)
		}
	}
	if len(all) != 10000 {
		t.Fatalf("got %d participants, want 10000", len(all))
	}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, p := range all {
		if p.Name == "" || !strings.Contains(p.Email, "@") ||
			p.UpdatedAt.Before(base.Add(-30*24*time.Hour)) || !p.UpdatedAt.Before(base) {
			t.Fatalf("got %+v, want a name, an email and an update in the 30 days before %v", p, base)
		}
	}
	if again := readAll(t, api, url.Values{"limit": {"500"}}); !cmp.Equal(pages, again) {
		t.Error("reading again gave different pages, want the same data set in the same order")
	}

	since := all[1234].UpdatedAt
	var want []participant
	for _, p := range all {
		if !p.UpdatedAt.Before(since) {
			want = append(want, p)
		}
	}
	var got []participant
	for _, p := range readAll(t, api, url.Values{"limit": {"500"}, "updatedSince": {since.Format(time.RFC3339)}}) {
		got = append(got, p.Items...)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("updatedSince %v (-want +got):\n%s", since, diff)
	}
	if len(want) == 0 || len(want) == len(all) {
		t.Errorf("updatedSince %v matches %d of %d; the test wants a real filter", since, len(want), len(all))
	}
}

func TestDefaultPageSize(t *testing.T) {
	api := newAPI(newClock(), demo.Config{Records: 120})
	var p page
	decode(t, call(t, api, http.MethodGet, "/v1/participants", "key").body, &p)
	if len(p.Items) != 50 || p.NextCursor == nil {
		t.Errorf("got %d items and next cursor %v, want 50 and a cursor", len(p.Items), p.NextCursor)
	}
	pages := readAll(t, api, url.Values{"limit": {"50"}})
	if len(pages) != 3 || len(pages[2].Items) != 20 {
		t.Errorf("got %d pages, want 3 with 20 on the last", len(pages))
	}
}

// TestErrors checks the problem answers: status, code, and whether the
// call counted against the limit.
func TestErrors(t *testing.T) {
	tests := []struct {
		name    string
		method  string
		target  string
		auth    string // the Authorization field; "" leaves it out
		body    string
		status  int
		code    string
		counted bool
	}{
		{"no credential", "GET", "/v1/participants", "", "", 401, "unauthorized", false},
		{"empty token", "GET", "/v1/participants", "Bearer ", "", 401, "unauthorized", false},
		{"basic scheme", "GET", "/v1/participants", "Basic a2V5Og==", "", 401, "unauthorized", false},
		{"unknown token", "GET", "/v1/participants", "Bearer stranger", "", 401, "unauthorized", false},
		{"limit 501", "GET", "/v1/participants?limit=501", "Bearer key", "", 400, "badRequest", true},
		{"limit 0", "GET", "/v1/participants?limit=0", "Bearer key", "", 400, "badRequest", true},
		{"limit words", "GET", "/v1/participants?limit=all", "Bearer key", "", 400, "badRequest", true},
		{"updatedSince not RFC 3339", "GET", "/v1/participants?updatedSince=yesterday", "Bearer key", "", 400, "badRequest", true},
		{"forged cursor", "GET", "/v1/participants?cursor=bm9wZQ", "Bearer key", "", 400, "badRequest", true},
		{"cursor past the end", "GET", "/v1/participants?cursor=YXQ6OTk5OTk", "Bearer key", "", 400, "badRequest", true},
		{"report too large", "GET", "/v1/report?bytes=16777217", "Bearer key", "", 400, "badRequest", true},
		{"unknown participant", "GET", "/v1/participants/p-999999", "Bearer key", "", 404, "notFound", true},
		{"malformed participant id", "GET", "/v1/participants/p-1", "Bearer key", "", 404, "notFound", true},
		{"unknown endpoint", "GET", "/v2/participants", "Bearer key", "", 404, "notFound", true},
		{"create without email", "POST", "/v1/participants", "Bearer key", `{"name":"Ada"}`, 400, "badRequest", true},
		{"create with a broken body", "POST", "/v1/participants", "Bearer key", `{"name":`, 400, "badRequest", true},
		{"delete", "DELETE", "/v1/participants/p-000001", "Bearer key", "", 405, "methodNotAllowed", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newAPI(newClock(), demo.Config{Tokens: []string{"key"}})
			res := send(t, api, tt.method, tt.target, "", tt.body, "Authorization", tt.auth)
			if res.status != tt.status {
				t.Errorf("got status %d, want %d", res.status, tt.status)
			}
			if got := res.header.Get("Content-Type"); got != "application/problem+json" {
				t.Errorf("got Content-Type %q, want application/problem+json", got)
			}
			var p struct {
				Status int
				Code   string
				Detail string
			}
			decode(t, res.body, &p)
			if p.Status != tt.status || p.Code != tt.code || p.Detail == "" {
				t.Errorf("got problem %+v, want status %d, code %q and a detail", p, tt.status, tt.code)
			}
			if got := len(api.Stats("key").Accepted) == 1; got != tt.counted {
				t.Errorf("got counted %v, want %v", got, tt.counted)
			}
			if _, hasLimit := res.header["Ratelimit"]; hasLimit != tt.counted {
				t.Errorf("got RateLimit field present %v, want %v", hasLimit, tt.counted)
			}
		})
	}
}

func TestParticipantByID(t *testing.T) {
	api := newAPI(newClock(), demo.Config{})
	var list page
	decode(t, call(t, api, http.MethodGet, "/v1/participants?limit=3", "key").body, &list)
	res := call(t, api, http.MethodGet, "/v1/participants/"+list.Items[2].ID, "key")
	var got participant
	decode(t, res.body, &got)
	if res.status != http.StatusOK || got != list.Items[2] {
		t.Errorf("got %d %+v, want 200 %+v", res.status, got, list.Items[2])
	}
	if got.ID != "p-000003" {
		t.Errorf("got id %q, want p-000003", got.ID)
	}
}

func TestCreateParticipant(t *testing.T) {
	c := newClock()
	api := newAPI(c, demo.Config{Records: 10})
	res := send(t, api, http.MethodPost, "/v1/participants", "key", `{"name":"Ada Lovelace","email":"ada@example.com"}`)
	want := participant{ID: "p-000011", Name: "Ada Lovelace", Email: "ada@example.com", UpdatedAt: t0}
	var got participant
	decode(t, res.body, &got)
	if res.status != http.StatusCreated || got != want {
		t.Errorf("got %d %+v, want 201 %+v", res.status, got, want)
	}
	if loc := res.header.Get("Location"); loc != "/v1/participants/p-000011" {
		t.Errorf("got Location %q, want /v1/participants/p-000011", loc)
	}
	if res.header.Get("RateLimit") == "" {
		t.Error("got no RateLimit field on a POST, want one on every answer")
	}
}

func TestReport(t *testing.T) {
	api := newAPI(newClock(), demo.Config{})
	for _, n := range []int{64, 1000, 1 << 20, 16 << 20} {
		res := call(t, api, http.MethodGet, "/v1/report?bytes="+strconv.Itoa(n), "key")
		if res.status != http.StatusOK || len(res.body) != n || !json.Valid([]byte(res.body)) {
			t.Errorf("bytes=%d: got status %d, %d bytes, valid JSON %v; want 200, %d bytes of JSON",
				n, res.status, len(res.body), json.Valid([]byte(res.body)), n)
		}
	}
	res := call(t, api, http.MethodGet, "/v1/report", "key")
	if len(res.body) != 1<<20 {
		t.Errorf("default: got %d bytes, want 1 MiB", len(res.body))
	}
	again := call(t, api, http.MethodGet, "/v1/report", "key", "If-None-Match", res.header.Get("ETag"))
	if again.status != http.StatusNotModified {
		t.Errorf("same report with its ETag: got %d, want 304", again.status)
	}
}

// TestEcho: the echo shows what arrived, never the credential.
func TestEcho(t *testing.T) {
	const token = "s3cr3t-token-value"
	api := newAPI(newClock(), demo.Config{})
	res := call(t, api, http.MethodGet, "/v1/echo?a=1&a=2&b=x", token,
		"X-Request-Id", "42", "Proxy-Authorization", "Basic "+token)
	if strings.Contains(res.body, token) {
		t.Fatalf("echo body %s contains the credential", res.body)
	}
	var got struct {
		Method               string
		Path                 string
		Query                map[string][]string
		Headers              map[string][]string
		AuthorizationPresent bool `json:"authorization_present"`
	}
	decode(t, res.body, &got)
	if got.Method != "GET" || got.Path != "/v1/echo" || !got.AuthorizationPresent {
		t.Errorf("got %+v, want GET /v1/echo with authorization_present", got)
	}
	if diff := cmp.Diff(map[string][]string{"a": {"1", "2"}, "b": {"x"}}, got.Query); diff != "" {
		t.Errorf("query (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"42"}, got.Headers["X-Request-Id"]); diff != "" {
		t.Errorf("X-Request-Id (-want +got):\n%s", diff)
	}
	etag := res.header.Get("ETag")
	again := call(t, api, http.MethodGet, "/v1/echo?a=1&a=2&b=x", token,
		"X-Request-Id", "42", "Proxy-Authorization", "Basic "+token, "If-None-Match", etag)
	if etag == "" || again.status != http.StatusNotModified {
		t.Errorf("same echo with its ETag %q: got %d, want 304", etag, again.status)
	}

	post := send(t, api, http.MethodPost, "/v1/echo", token, `{"hello":"world"}`)
	var posted struct{ Method, Body string }
	decode(t, post.body, &posted)
	if post.status != http.StatusOK || posted.Method != "POST" || posted.Body != `{"hello":"world"}` {
		t.Errorf("POST echo: got %d %+v, want 200 with method and body", post.status, posted)
	}
}

func TestHEAD(t *testing.T) {
	api := newAPI(newClock(), demo.Config{})
	res := call(t, api, http.MethodHead, "/v1/participants/p-000001", "key")
	if res.status != http.StatusOK || res.body != "" || res.header.Get("ETag") == "" {
		t.Errorf("got %d, body %q, ETag %q; want 200, no body, an ETag", res.status, res.body, res.header.Get("ETag"))
	}
}
