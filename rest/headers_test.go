package rest

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
)

const headerSecret = "sk-header-test-0123456789"

func testKey(t testing.TB, base, auth string) *keystore.Key {
	t.Helper()
	cfg := testkit.Keys(testkit.Key{Name: "demo", BaseURL: base, SecretEnv: "S", Auth: auth})
	s, err := keystore.Parse([]byte(cfg), keystore.Env{Getenv: func(string) string { return headerSecret }})
	if err != nil {
		t.Fatal(err)
	}
	return s.Keys()[0]
}

func TestRewriteRef(t *testing.T) {
	k := testKey(t, "https://api.example.com/api/", "query:api_key")
	from, _ := url.Parse("https://api.example.com/api/v1/participants?limit=500&api_key=" + headerSecret)
	tests := []struct{ ref, want string }{
		{"/api/v1/participants?cursor=abc&limit=500", "/k/demo/v1/participants?cursor=abc&limit=500"},
		{"https://api.example.com/api/v1/participants/p-1", "/k/demo/v1/participants/p-1"},
		{"HTTPS://API.EXAMPLE.COM/api/v1/x", "/k/demo/v1/x"},
		{"p-2", "/k/demo/v1/p-2"},                                           // relative to the answer's URL
		{"?cursor=abc", "/k/demo/v1/participants?cursor=abc"},               // ditto
		{"../v2/x", "/k/demo/v2/x"},                                         // dot segments resolved upstream-side first
		{"/api/v1/x#section", "/k/demo/v1/x#section"},                       // fragments kept
		{"/api/v1/x?page=2&api_key=" + headerSecret, "/k/demo/v1/x?page=2"}, // the key's credential dropped
		{"", "/k/demo/v1/participants?limit=500"},                           // the answer's own URL, without the credential
		{"/api", "https://api.example.com/api"},                             // outside the base path: absolute
		{"/login", "https://api.example.com/login"},
		{"../../login", "https://api.example.com/login"},
		{"https://cdn.example.com/f.json", "https://cdn.example.com/f.json"},   // another host: as it is
		{"http://api.example.com/api/v1/x", "http://api.example.com/api/v1/x"}, // another scheme
		{"https://user@api.example.com/api/v1/x", "https://user@api.example.com/api/v1/x"},
		{"https://cdn.example.com/f?api_key=" + headerSecret, "https://cdn.example.com/f"},
		{"%zz", "%zz"},   // does not parse: left alone
		{"//::", "//::"}, // its absolute form would not parse: left alone
		{"..//x", "https://api.example.com/api//x"}, // an empty segment /k/demo/ would refuse: absolute
	}
	for _, tt := range tests {
		if got := rewriteRef(tt.ref, k, from); got != tt.want {
			t.Errorf("rewriteRef(%q) = %q, want %q", tt.ref, got, tt.want)
		}
	}
}

func TestRewriteLink(t *testing.T) {
	k := testKey(t, "http://127.0.0.1:8788/", "bearer")
	from, _ := url.Parse("http://127.0.0.1:8788/v1/participants?limit=500")
	tests := []struct{ link, want string }{
		{`</v1/participants?cursor=YXQ6NTAw&limit=500>; rel="next"`, `</k/demo/v1/participants?cursor=YXQ6NTAw&limit=500>; rel="next"`},
		{`</v1/p?page=1>; rel="first", </v1/p?page=9>; rel="last"`, `</k/demo/v1/p?page=1>; rel="first", </k/demo/v1/p?page=9>; rel="last"`},
		{`<https://docs.example.com/rate-limits>; rel="help"; title="see <this>"`, `<https://docs.example.com/rate-limits>; rel="help"; title="see <this>"`},
		{`</v1/a>; title="a \"<quoted>\" title", </v1/b>`, `</k/demo/v1/a>; title="a \"<quoted>\" title", </k/demo/v1/b>`},
		{`</v1/unterminated; rel=next`, `</v1/unterminated; rel=next`},
		{`rel=next`, `rel=next`},
	}
	for _, tt := range tests {
		if got := rewriteLink(tt.link, k, from); got != tt.want {
			t.Errorf("rewriteLink(%q)\n got %q\nwant %q", tt.link, got, tt.want)
		}
	}
}

func TestCopyResponseHeaders(t *testing.T) {
	src := http.Header{
		"Content-Type":       {"application/json"},
		"Etag":               {`"abc"`},
		"Retry-After":        {"18"},
		"Connection":         {"keep-alive, X-Hop"},
		"X-Hop":              {"1"},
		"Keep-Alive":         {"timeout=5"},
		"Transfer-Encoding":  {"chunked"},
		"Trailer":            {"X-Sum"},
		"Upgrade":            {"h2c"},
		"Set-Cookie":         {"session=upstream"},
		"Alt-Svc":            {`h3=":443"`},
		"Proxy-Authenticate": {"Basic"},
		"x-lower":            {"kept"},
		"X-Echo":             {"Bearer " + headerSecret},
	}
	dst := http.Header{}
	copyResponseHeaders(dst, src)
	dropSecret(dst, headerSecret)
	want := http.Header{"Content-Type": {"application/json"}, "Etag": {`"abc"`}, "Retry-After": {"18"}, "X-Lower": {"kept"},
		"X-Echo": {"Bearer " + keystore.Redacted}}
	if diff := cmp.Diff(want, dst); diff != "" {
		t.Errorf("copied fields (-want +got):\n%s", diff)
	}
	src["Content-Type"][0] = "changed"
	if dst.Get("Content-Type") != "application/json" {
		t.Errorf("the copy shares its values with the upstream's answer")
	}
}

func TestPreferWaitParsing(t *testing.T) {
	lim := Limits{}.withDefaults()
	tests := []struct {
		prefer  []string
		want    string // the wait
		applied string
	}{
		{nil, "5s", ""},
		{[]string{"wait=10"}, "10s", "wait=10"},
		{[]string{"respond-async, wait=2.5"}, "2.5s", "wait=3"},
		{[]string{`WAIT="7"`}, "7s", "wait=7"},
		{[]string{"wait=0"}, "0s", "wait=0"},
		{[]string{"wait=100000"}, "2m0s", "wait=120"},
		{[]string{"wait=1e300"}, "2m0s", "wait=120"},
		{[]string{"wait=-1"}, "5s", ""},
		{[]string{"wait=NaN"}, "5s", ""},
		{[]string{"wait=soon"}, "5s", ""},
		{[]string{"handling=lenient", "wait=3"}, "3s", "wait=3"},
	}
	for _, tt := range tests {
		h := http.Header{"Prefer": tt.prefer}
		d, applied := preferWait(h, lim)
		if d.String() != tt.want || applied != tt.applied {
			t.Errorf("Prefer %q: %v, %q; want %s, %q", tt.prefer, d, applied, tt.want, tt.applied)
		}
	}
}

// FuzzResponseHeaders checks the answer side of the forwarder on any
// field: no hop-by-hop field and nothing Connection names comes back, no
// field holds the key's secret, and every link target is either on the
// REST side below /k/{key}/ or an absolute URL elsewhere.
func FuzzResponseHeaders(f *testing.F) {
	f.Add("X-Foo", "bar", "", `</v1/participants?cursor=x>; rel="next"`)
	f.Add("Connection", "X-Foo", "X-Foo", `<https://other.example/x>; rel="help"`)
	f.Add("X-Echo", "Bearer "+headerSecret, "close", `</v1/x?api_key=`+headerSecret+`>`)
	f.Add("Location", "/v1/../../admin", "", `<//evil.example/x>; rel="next"`)
	f.Add("Set-Cookie", "a=b", "keep-alive, Set-Cookie", `<javascript:alert(1)>`)
	f.Add("Link", `<\\evil>; rel=x`, "", `</v1/a>; title="<b>", <%zz>`)
	k := testKey(f, "https://api.example.com/api/", "query:api_key")
	from, _ := url.Parse("https://api.example.com/api/v1/participants?api_key=" + headerSecret)
	f.Fuzz(func(t *testing.T, name, value, connection, link string) {
		src := http.Header{}
		src.Add(name, value)
		src.Add("Connection", connection)
		src.Add("Link", link)
		src.Add("Location", link)
		dst := http.Header{}
		copyResponseHeaders(dst, src)
		rewriteRefs(dst, k, from)
		dropSecret(dst, headerSecret)
		named := map[string]bool{}
		for _, c := range strings.Split(connection, ",") {
			named[http.CanonicalHeaderKey(strings.TrimSpace(c))] = true
		}
		for n, vs := range dst {
			c := http.CanonicalHeaderKey(n)
			if responseHopByHop[c] || named[c] {
				t.Fatalf("%s came back: %q", n, vs)
			}
			for _, v := range vs {
				if strings.Contains(v, headerSecret) {
					t.Fatalf("%s: %q holds the secret", n, v)
				}
			}
		}
		if got := dst["Location"]; len(got) > 0 {
			for i, v := range got {
				if strings.Contains(v, "[redacted]") {
					continue // the reference held the secret: what is left of it need not be a reference
				}
				checkRef(t, v, src["Location"][i], from)
			}
		}
	})
}

// checkRef checks one rewritten reference: below /k/demo/, an absolute
// URL, or the original when neither it nor its absolute form parses.
func checkRef(t *testing.T, got, orig string, from *url.URL) {
	if got == orig {
		r, err := url.Parse(strings.TrimSpace(orig))
		if err != nil || !parses(from.ResolveReference(r).String()) {
			return
		}
	}
	if rest, ok := strings.CutPrefix(got, "/k/demo/"); ok {
		u, err := url.Parse(got)
		if err != nil || u.Host != "" || strings.HasPrefix(rest, "/") {
			t.Fatalf("reference %q → %q: not a path below /k/demo/", orig, got)
		}
		return
	}
	u, err := url.Parse(got)
	if err != nil || !u.IsAbs() {
		t.Fatalf("reference %q → %q: neither below /k/demo/ nor absolute", orig, got)
	}
	if rest, below := strings.CutPrefix(u.EscapedPath(), "/api/"); below && !strings.HasPrefix(rest, "/") &&
		u.Scheme == "https" && strings.EqualFold(u.Host, "api.example.com") && u.User == nil {
		t.Fatalf("reference %q → %q: below the base URL but not rewritten", orig, got)
	}
}

// dropSecret stands for what upstream.Client.Do does to every answer
// before the REST side sees it: the secret, in any form, is replaced.
func dropSecret(h http.Header, secret string) {
	s := keystore.NewScrubber(secret)
	for _, vs := range h {
		for i, v := range vs {
			vs[i], _ = s.Scrub(v)
		}
	}
}
