package dashboard_test

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// TestCookieSecureBehindTrustedProxy: behind a TLS proxy that mcp-quota
// trusts, a sign-in's cookie is Secure and the page's https origin is its
// own; from a peer it does not trust, X-Forwarded-Proto changes nothing.
func TestCookieSecureBehindTrustedProxy(t *testing.T) {
	for _, tt := range []struct {
		name    string
		proxies []netip.Prefix
		secure  bool
	}{
		{"trusted proxy", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, true},
		{"no proxy trusted", nil, false},
		{"another proxy trusted", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base, _ := serverWith(t, true, tt.proxies)
			origin := "https://" + strings.TrimPrefix(base, "http://")
			resp, body := do(t, browser(t), "POST", base+"/ui/api/session", "Authorization", "Bearer "+tokenA,
				"X-Forwarded-Proto", "https", "Origin", origin, "Sec-Fetch-Site", "same-origin")
			if !tt.secure {
				if resp.StatusCode != http.StatusForbidden {
					t.Errorf("sign-in from %s through an untrusted peer: %d, want 403 (not its origin)", origin, resp.StatusCode)
				}
				resp, body = do(t, browser(t), "POST", base+"/ui/api/session", "Authorization", "Bearer "+tokenA, "X-Forwarded-Proto", "https")
			}
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("sign-in: %d %s", resp.StatusCode, body)
			}
			cookies := resp.Cookies()
			if len(cookies) != 1 || cookies[0].Secure != tt.secure {
				t.Errorf("cookie %+v: Secure should be %v", cookies, tt.secure)
			}
		})
	}
}
