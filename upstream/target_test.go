package upstream

import (
	"errors"
	"net/url"
	"path"
	"strings"
	"testing"
)

// escapes are paths that try to leave a key's base URL, each the way an
// attacker (or a confused agent) would write it.
var escapes = []string{
	"..",
	"../admin",
	"/../admin",
	"v1/../../admin",
	"v1/./x",
	"./x",
	"%2e%2e/admin",
	"%2E%2E/admin",
	".%2e/admin",
	"%2e./admin",
	"v1/%2e%2e/%2e%2e/admin",
	"v1%2fadmin",
	"v1%2Fadmin",
	"%2f%2fevil.example/x",
	"v1%5cadmin",
	"v1%00",
	"//evil.example/x",
	"///evil.example/x",
	"http://evil.example/x",
	"/http://evil.example/x",
	"https:evil.example",
	"javascript:alert(1)",
	"/HTTP://evil.example/x",
	"@evil.example/x",
	"/@evil.example",
	"user:pass@evil.example/x",
	"v1/x@evil.example",
	"\\\\evil.example\\x",
	"/\\evil.example",
	"v1\\..\\admin",
	"v1/x#frag",
	"v1/x?a=1#frag",
	"v1/\x00x",
	"v1/\nx",
	"v1/\rHost: evil.example",
	"v1/\x7f",
	"v1/%zz",
	"v1/x?%zz",
}

func TestResolveRefusesEscapes(t *testing.T) {
	base := mustURL(t, "https://api.example.com/api/")
	for _, p := range escapes {
		t.Run(p, func(t *testing.T) {
			u, err := Resolve(base, p, nil)
			if !errors.Is(err, ErrBadPath) {
				t.Fatalf("Resolve(%q) = %v, %v; want an error matching ErrBadPath", p, u, err)
			}
			var pe *PathError
			if !errors.As(err, &pe) || pe.Path != p || pe.Reason == "" {
				t.Errorf("error %#v: want a *PathError naming the path and a reason", err)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	tests := []struct {
		base, path string
		query      url.Values
		want       string
	}{
		{"https://api.example.com/", "/v1/participants", nil, "https://api.example.com/v1/participants"},
		{"https://api.example.com/", "v1/participants", nil, "https://api.example.com/v1/participants"},
		{"https://api.example.com/", "", nil, "https://api.example.com/"},
		{"https://api.example.com/api/", "/v1/x", nil, "https://api.example.com/api/v1/x"},
		{"https://api.example.com/", "/v1/participants?limit=500&cursor=YXQ6NTAw", nil,
			"https://api.example.com/v1/participants?limit=500&cursor=YXQ6NTAw"},
		{"https://api.example.com/", "/v1/participants?limit=5", url.Values{"updatedSince": {"2026-01-01T00:00:00Z"}},
			"https://api.example.com/v1/participants?limit=5&updatedSince=2026-01-01T00%3A00%3A00Z"},
		// "@" is refused in the path, not in the query: e-mail addresses are queries.
		{"https://api.example.com/", "/v1/participants?email=a@example.com", nil, "https://api.example.com/v1/participants?email=a@example.com"},
		// Escapes that stay inside the segment are kept as written.
		{"https://api.example.com/", "/v1/a%20b", nil, "https://api.example.com/v1/a%20b"},
		{"https://api.example.com/", "/v1/a%3Fb", nil, "https://api.example.com/v1/a%3Fb"},
		{"https://api.example.com/", "/v1/...", nil, "https://api.example.com/v1/..."},
		{"https://api.example.com/", "/v1/a:b", nil, "https://api.example.com/v1/a:b"},
		// What a query may not hold raw is escaped, never put on the request line.
		{"https://api.example.com/", `/v1/x?q=a b"<>`, nil, "https://api.example.com/v1/x?q=a%20b%22%3C%3E"},
		{"https://api.example.com/", "/v1/x?q=é", nil, "https://api.example.com/v1/x?q=%C3%A9"},
		{"http://127.0.0.1:8788/", "/v1/echo?", nil, "http://127.0.0.1:8788/v1/echo"},
	}
	for _, tt := range tests {
		t.Run(tt.base+" "+tt.path, func(t *testing.T) {
			u, err := Resolve(mustURL(t, tt.base), tt.path, tt.query)
			if err != nil {
				t.Fatal(err)
			}
			if got := u.String(); got != tt.want {
				t.Errorf("Resolve(%q, %q) = %s, want %s", tt.base, tt.path, got, tt.want)
			}
		})
	}
}

func TestTarget(t *testing.T) {
	base := mustURL(t, "https://api.example.com/api/")
	tests := []struct{ u, want string }{
		{"https://api.example.com/api/v1/x?limit=5", "/v1/x?limit=5"},
		{"https://api.example.com/api/", "/"},
		{"https://other.example.com/api/v1/x", "other.example.com/api/v1/x"},
	}
	for _, tt := range tests {
		if got := Target(base, mustURL(t, tt.u)); got != tt.want {
			t.Errorf("Target(%s) = %q, want %q", tt.u, got, tt.want)
		}
	}
}

// FuzzResolve checks that no path, however written, yields a URL that
// leaves the base URL: the same scheme and host, no user information,
// below the base path even after an upstream removes dot segments, and no
// encoded slash or backslash an upstream could decode into one.
func FuzzResolve(f *testing.F) {
	for _, p := range escapes {
		f.Add("https://api.example.com/api/", p)
	}
	for _, p := range []string{"/v1/participants?limit=500", "v1/x", "", "?", "/v1/a%20b", "/v1/%25%32%65", "/a:b", "/v1/x?q=a b"} {
		f.Add("https://api.example.com/", p)
		f.Add("http://127.0.0.1:8788/base/", p)
	}
	f.Fuzz(func(t *testing.T, rawBase, p string) {
		base, err := url.Parse(rawBase)
		if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" || base.User != nil ||
			base.RawQuery != "" || base.Fragment != "" || base.Opaque != "" {
			return
		}
		if !strings.HasSuffix(base.Path, "/") { // as keystore normalises it
			base.Path += "/"
		}
		base.RawPath = ""
		if base.Path != "/" && (path.Clean(base.Path)+"/" != base.Path || strings.Contains(base.Path, "//") ||
			strings.Trim(base.Path, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~/") != "") {
			return // the operator's own odd base path: dot or empty segments, escapes, backslashes
		}
		u, err := Resolve(base, p, nil)
		if err != nil {
			if !errors.Is(err, ErrBadPath) {
				t.Fatalf("Resolve(%q) error %v does not match ErrBadPath", p, err)
			}
			return
		}
		// What goes on the wire, read back as the upstream would read it.
		wire := u.String()
		got, err := url.Parse(wire)
		if err != nil {
			t.Fatalf("Resolve(%q) = %q, which does not parse: %v", p, wire, err)
		}
		switch {
		case got.Scheme != base.Scheme || got.Host != base.Host || got.User != nil:
			t.Fatalf("Resolve(%q) = %q: left %s://%s", p, wire, base.Scheme, base.Host)
		case got.Fragment != "" || strings.Contains(got.Path, "\\"):
			t.Fatalf("Resolve(%q) = %q: fragment or backslash", p, wire)
		case !strings.HasPrefix(got.Path, base.Path):
			t.Fatalf("Resolve(%q) = %q: path %q is not below %q", p, wire, got.Path, base.Path)
		case !strings.HasPrefix(path.Clean(got.Path)+"/", base.Path):
			t.Fatalf("Resolve(%q) = %q: path %q leaves %q once dot segments are removed", p, wire, got.Path, base.Path)
		}
		lower := strings.ToLower(got.EscapedPath())
		if strings.Contains(lower, "%2f") || strings.Contains(lower, "%5c") {
			t.Fatalf("Resolve(%q) = %q: an encoded slash or backslash", p, wire)
		}
		for i := 0; i < len(got.RawQuery); i++ {
			if c := got.RawQuery[i]; c <= ' ' || c >= 0x7f || c == '"' || c == '<' || c == '>' {
				t.Fatalf("Resolve(%q) = %q: the query holds %q raw", p, wire, c)
			}
		}
	})
}

func mustURL(t testing.TB, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
