package gateway

import "testing"

// TestOriginComparedExactly: Origin and Sec-Fetch-Site are compared as
// the Fetch standard serializes them (issue 13: another scheme, a
// trailing slash and CROSS-SITE in upper case were accepted).
func TestOriginComparedExactly(t *testing.T) {
	g := newGate(Config{Keys: testStore(t, true), Loopback: true, AllowOrigins: []string{"http://localhost:6274"}})
	a := []string{"Authorization", "Bearer " + tokenA}
	with := func(more ...string) []string { return append(append([]string(nil), a...), more...) }
	runWalls(t, g.walls(echoCaller), []wallCase{
		{"own origin", "", with("Origin", "http://127.0.0.1:8787"), 200, "", "a"},
		{"own origin on the default port", "127.0.0.1", with("Origin", "http://127.0.0.1"), 200, "", "a"},
		{"own origin, IPv6", "[::1]:8787", with("Origin", "http://[::1]:8787"), 200, "", "a"},
		{"none", "", with("Sec-Fetch-Site", "none"), 200, "", "a"},
		{"wrong scheme", "", with("Origin", "https://127.0.0.1:8787"), 403, "forbidden", ""},
		{"trailing slash", "", with("Origin", "http://127.0.0.1:8787/"), 403, "forbidden", ""},
		{"with a path", "", with("Origin", "http://127.0.0.1:8787/x"), 403, "forbidden", ""},
		{"scheme in upper case", "", with("Origin", "HTTP://127.0.0.1:8787"), 403, "forbidden", ""},
		{"explicit default port", "127.0.0.1", with("Origin", "http://127.0.0.1:80"), 403, "forbidden", ""},
		{"userinfo", "", with("Origin", "http://x@127.0.0.1:8787"), 403, "forbidden", ""},
		{"another loopback name", "", with("Origin", "http://localhost:8787"), 403, "forbidden", ""},
		{"allow-listed with a slash", "", with("Origin", "http://localhost:6274/"), 403, "forbidden", ""},
		{"CROSS-SITE", "", with("Sec-Fetch-Site", "CROSS-SITE"), 403, "forbidden", ""},
		{"Cross-Site", "", with("Sec-Fetch-Site", "Cross-Site"), 403, "forbidden", ""},
		{"an unknown value", "", with("Sec-Fetch-Site", "cross-site, same-origin"), 403, "forbidden", ""},
		{"two values", "", with("Sec-Fetch-Site", "same-origin", "Sec-Fetch-Site", "cross-site"), 403, "forbidden", ""},
	})
}
