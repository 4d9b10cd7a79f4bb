package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/dashboard"
	"github.com/mcp-quota/mcp-quota/gateway"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/metrics"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/rest"
	"github.com/mcp-quota/mcp-quota/state"
	"github.com/mcp-quota/mcp-quota/tools"
	"github.com/mcp-quota/mcp-quota/upstream"
)

const (
	secret = "upstream-secret-5d1e0c9b7a22"
	tokenA = "dashboard-token-aaaaaaaaaaaa"
	tokenB = "dashboard-token-bbbbbbbbbbbb"
)

// server is the whole HTTP side, as serve wires it, on loopback.
func server(t *testing.T, callers bool) (string, *state.DB) {
	t.Helper()
	return serverWith(t, callers, nil)
}

// serverWith is server with the reverse proxies it trusts.
func serverWith(t *testing.T, callers bool, proxies []netip.Prefix) (string, *state.DB) {
	t.Helper()
	cfg := testkit.Config{Keys: []testkit.Key{
		{Name: "other", BaseURL: "https://other.example.com", SecretEnv: "S", Auth: "bearer", Policies: testkit.Window(100, time.Minute)},
		{Name: "k", BaseURL: "https://api.example.com", SecretEnv: "S", Auth: "bearer", Policies: testkit.Window(10, time.Minute)},
	}}
	if callers {
		cfg.Callers = []testkit.Caller{{Name: "a", TokenEnv: "A", Keys: []string{"k"}}, {Name: "b", TokenEnv: "B", Keys: []string{"*"}}}
	}
	env := map[string]string{"S": secret, "A": tokenA, "B": tokenB}
	keys, err := keystore.Parse([]byte(cfg.TOML()), keystore.Env{Getenv: func(k string) string { return env[k] }})
	if err != nil {
		t.Fatal(err)
	}
	db := testkit.OpenState(t, state.Open)
	p := pacer.New(db)
	client := upstream.New(p, nil)
	m := metrics.New(keys, p, db)
	client.Observe = m.Observe
	h := gateway.New(gateway.Config{Keys: keys, DB: db, Loopback: true, TrustedProxies: proxies,
		REST:      &rest.Handler{Keys: keys, Client: client, Pacer: p, DB: db},
		MCP:       tools.NewServer(&tools.Deps{Keys: keys, Client: client, Pacer: p, DB: db, Transport: "mcp-http"}, "test"),
		Metrics:   m,
		Dashboard: dashboard.New(dashboard.Config{Keys: keys, Pacer: p, DB: db, Secure: gateway.Secure})})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL, db
}

func browser(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar}
}

func do(t *testing.T, c *http.Client, method, url string, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if strings.Contains(string(body), secret) {
		t.Errorf("%s %s shows the key's credential", method, url)
	}
	return resp, string(body)
}

func TestSignInFollowsTheWalls(t *testing.T) {
	base, _ := server(t, true)
	c := browser(t)

	// The page itself opens, and shows nothing; its data needs a caller.
	if resp, body := do(t, c, "GET", base+"/"); resp.StatusCode != 200 || !strings.Contains(body, "/ui/static/app.js") {
		t.Fatalf("GET / = %d %q, want the page", resp.StatusCode, body)
	}
	if resp, _ := do(t, c, "GET", base+"/ui/static/app.js"); resp.StatusCode != 200 {
		t.Fatalf("GET the script = %d", resp.StatusCode)
	}
	for _, path := range []string{"/ui/api/overview", "/ui/api/session", "/v1/activity?key=k", "/metrics"} {
		if resp, _ := do(t, c, "GET", base+path); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s before signing in = %d, want 401", path, resp.StatusCode)
		}
	}

	// A wrong token gets no cookie.
	if resp, _ := do(t, c, "POST", base+"/ui/api/session", "Authorization", "Bearer wrong-token"); resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Fatalf("sign-in with a wrong token = %d, cookies %v; want 401 and none", resp.StatusCode, resp.Cookies())
	}
	// A sign-in from another site is refused before the token is looked at.
	if resp, _ := do(t, c, "POST", base+"/ui/api/session", "Authorization", "Bearer "+tokenA, "Origin", "https://evil.example"); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-site sign-in = %d, want 403", resp.StatusCode)
	}

	// Caller a signs in: an HttpOnly, SameSite=Strict cookie that is not its token.
	resp, body := do(t, c, "POST", base+"/ui/api/session", "Authorization", "Bearer "+tokenA)
	if resp.StatusCode != 200 {
		t.Fatalf("sign-in = %d %s", resp.StatusCode, body)
	}
	var me struct {
		Caller string
		Keys   []string
		CSRF   string
	}
	json.Unmarshal([]byte(body), &me)
	cookies := resp.Cookies()
	if len(cookies) != 1 || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode || strings.Contains(cookies[0].Value, tokenA) {
		t.Fatalf("session cookie %+v: want one HttpOnly, SameSite=Strict cookie that is not the token", cookies)
	}
	if me.Caller != "a" || strings.Join(me.Keys, ",") != "k" || me.CSRF == "" || strings.Contains(body, tokenA) {
		t.Fatalf("signed in as %+v, want caller a with key k only and an anti-forgery token", me)
	}

	// It sees only its keys.
	resp, body = do(t, c, "GET", base+"/ui/api/overview")
	if resp.StatusCode != 200 || !strings.Contains(body, `"key":"k"`) || strings.Contains(body, `"other"`) {
		t.Fatalf("overview = %d %s, want key k only", resp.StatusCode, body)
	}
	if resp, _ := do(t, c, "GET", base+"/ui/api/overview?key=other"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("overview of a key a may not use = %d, want 404", resp.StatusCode)
	}
	if resp, _ := do(t, c, "GET", base+"/v1/activity?key=k"); resp.StatusCode != 200 {
		t.Errorf("activity through the cookie = %d, want 200", resp.StatusCode)
	}
	// The cookie never spends a key, speaks MCP or scrapes metrics.
	for _, r := range [][2]string{{"GET", "/k/k/x"}, {"POST", "/mcp"}, {"GET", "/metrics"}} {
		if resp, _ := do(t, c, r[0], base+r[1]); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s %s with the session cookie = %d, want 401", r[0], r[1], resp.StatusCode)
		}
	}
	// Writes need the anti-forgery token.
	if resp, _ := do(t, c, "POST", base+"/ui/api/signout"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("sign-out without the anti-forgery token = %d, want 401", resp.StatusCode)
	}
	if resp, _ := do(t, c, "POST", base+"/ui/api/signout", "X-CSRF-Token", "forged"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("sign-out with a forged token = %d, want 401", resp.StatusCode)
	}
	if resp, _ := do(t, c, "POST", base+"/ui/api/signout", "X-CSRF-Token", me.CSRF); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("sign-out = %d, want 204", resp.StatusCode)
	}
	if resp, _ := do(t, c, "GET", base+"/ui/api/overview"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("overview after signing out = %d, want 401", resp.StatusCode)
	}

	// Caller b may use every key, and sees both.
	b := browser(t)
	do(t, b, "POST", base+"/ui/api/session", "Authorization", "Bearer "+tokenB)
	if _, body := do(t, b, "GET", base+"/ui/api/overview"); !strings.Contains(body, `"key":"other"`) || !strings.Contains(body, `"key":"k"`) {
		t.Errorf("caller b's overview = %s, want both keys", body)
	}
	// /metrics takes the token itself, and reports the caller's keys only.
	if _, body := do(t, c, "GET", base+"/metrics", "Authorization", "Bearer "+tokenA); !strings.Contains(body, `mcp_quota_budget_limit{key="k"`) || strings.Contains(body, `key="other"`) {
		t.Errorf("caller a's scrape:\n%s\nwant key k's budget only", body)
	}
}

func TestLoopbackWithoutCallersOpensDirectly(t *testing.T) {
	base, _ := server(t, false)
	c := browser(t)
	resp, body := do(t, c, "GET", base+"/ui/api/session")
	if resp.StatusCode != 200 || !strings.Contains(body, `"caller":"local"`) || strings.Contains(body, "csrf") {
		t.Fatalf("session = %d %s, want the local user, no sign-in", resp.StatusCode, body)
	}
	resp, body = do(t, c, "GET", base+"/ui/api/overview")
	if resp.StatusCode != 200 || !strings.Contains(body, `"key":"other"`) {
		t.Fatalf("overview = %d %s", resp.StatusCode, body)
	}
	// The walls still hold: a page of another site cannot read it.
	if resp, _ := do(t, c, "GET", base+"/ui/api/overview", "Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-site read = %d, want 403", resp.StatusCode)
	}
}

// With many keys the list puts the tightest first (k, configured second),
// and the detail defaults to it.
func TestKeysTightestFirst(t *testing.T) {
	base, db := server(t, false)
	now := time.Now()
	err := db.Update(context.Background(), func(tx ledger.Tx) error {
		for i := range 9 { // 9 of k's 10 calls
			at := now.Add(time.Duration(i-20) * time.Millisecond)
			id, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint(i), Attempt: 1, Key: "k", Caller: "sync", State: ledger.Admitted, At: at})
			if err != nil {
				return err
			}
			if err := tx.FinishAttempt(id, ledger.Confirmed, reason.Reason{Kind: reason.Answered, Status: 200}, 200, at, at); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_, body := do(t, browser(t), "GET", base+"/ui/api/overview")
	var o struct {
		Keys []struct {
			Key  string
			Used float64
		}
		Detail struct {
			Status   struct{ Key string }
			Spenders []struct {
				Caller string
				Used   int
			}
			Timeline struct {
				Series map[string][]int
			}
		}
	}
	if err := json.Unmarshal([]byte(body), &o); err != nil {
		t.Fatal(err)
	}
	if len(o.Keys) != 2 || o.Keys[0].Key != "k" || o.Keys[0].Used < 0.89 || o.Detail.Status.Key != "k" {
		t.Fatalf("overview %s: want k (90%% spent) first and in detail", body)
	}
	if len(o.Detail.Spenders) != 1 || o.Detail.Spenders[0].Caller != "sync" || o.Detail.Spenders[0].Used != 9 {
		t.Errorf("spenders = %+v, want sync with 9", o.Detail.Spenders)
	}
	sent := 0
	for _, n := range o.Detail.Timeline.Series["sent"] {
		sent += n
	}
	if sent != 9 {
		t.Errorf("the timeline holds %d sent calls, want 9", sent)
	}
}
