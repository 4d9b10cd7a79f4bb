package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/oidctest"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/report"
)

// sightSetup is a serve process with OAuth and the dashboard's sign-in
// with the authorization server (a real oidc-provider whose sign-in page
// signs in user; "" for its login form): principals alice (group team-a,
// the administrators), bob, and the job nightly-sync, whose calls bob
// may see; the static callers agent and sync; keys demo and ops (no
// principal uses ops). It returns the setup's address, the issuer and
// the dashboard client's ID.
func sightSetup(t *testing.T, user string) (s *setup, base, issuer, client string, logs *testkit.Buffer) {
	t.Helper()
	iss := oidctest.Start(t, 1, user)
	_, upstream := upstreamAPI(t, demo.Config{})
	s, addr := oauthSetup(t, upstream, iss[0])
	clientID := registerDashboard(t, iss[0], addr)
	cfg := oauthConfig(upstream, iss[0], addr)
	cfg.Keys[0].Reserve = []testkit.Reserve{{Caller: "agent", Share: 0.2}}
	cfg.Keys = append(cfg.Keys, testkit.Key{Name: "ops", BaseURL: upstream, Auth: "none"})
	cfg.OAuth.DashboardClientID, cfg.OAuth.IssuerName, cfg.OAuth.AdminGroup = clientID, "Test IdP", "team-a"
	cfg.Principals[1].VisibleTo = []string{"bob@example.com"} // nightly-sync's calls
	cfg.Principals = append(cfg.Principals,
		testkit.Principal{Name: "bob@example.com", Claim: "email", Values: []string{"bob@example.com"}, Keys: []string{"demo"}})
	s.write(t, cfg)
	base, logs = s.serve(t, "--listen", addr)
	return s, base, iss[0], clientID, logs
}

// spendAsOthers makes calls of key demo as the static caller agent
// (twice) and as the job nightly-sync (once), and returns one of
// agent's calls and nightly-sync's.
func spendAsOthers(t *testing.T, base, issuer string) (agentCall, syncCall string) {
	t.Helper()
	job := oidctest.ClientCredentials(t, issuer, "sync-job", "sync-job-secret", base+"/mcp", "mcp")
	for _, token := range []string{agentToken, agentToken, job} {
		if resp, body := oauthDo(t, http.MethodGet, base+"/k/demo/v1/participants", token); resp.StatusCode != http.StatusOK {
			t.Fatalf("a call of demo: %d %s", resp.StatusCode, body)
		}
	}
	for _, a := range readActivity(t, base, agentToken) { // a [[callers]] token sees every call of its keys
		switch a.Caller {
		case "agent":
			agentCall = a.Call
		case "nightly-sync":
			syncCall = a.Call
		}
	}
	if agentCall == "" || syncCall == "" {
		t.Fatalf("the activity lacks agent's or nightly-sync's call")
	}
	return agentCall, syncCall
}

// signInWithIssuer signs a cookie-keeping client in to the dashboard
// through the authorization server, as the provider's user.
func signInWithIssuer(t *testing.T, base string, logs *testkit.Buffer) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, Transport: crossSiteReturn{}}
	resp, err := browser.Get(base + "/ui/signin/oidc")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Request.URL.String() != base+"/" {
		t.Fatalf("the sign-in ended at %s with %s\n%s", resp.Request.URL, resp.Status, logs.String())
	}
	return browser
}

// getJSON GETs url with c and decodes the answer into v; it returns the
// status and the body.
func getJSON(t *testing.T, c *http.Client, url string, v any) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if v != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, v); err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
	}
	return resp.StatusCode, string(body)
}

// sessionAnswer is GET /ui/api/session's answer.
type sessionAnswer struct {
	Caller   string   `json:"caller"`
	Keys     []string `json:"keys"`
	Everyone bool     `json:"sees_everyone"`
	SignedIn bool     `json:"signed_in"`
}

// overviewAnswer is the part of GET /ui/api/overview the tests read.
type overviewAnswer struct {
	Keys []struct {
		Key string `json:"key"`
	} `json:"keys"`
	Detail struct {
		Status struct {
			Reservations []struct {
				Caller string `json:"caller"`
			} `json:"reservations"`
		} `json:"status"`
		Spenders []struct {
			Caller string `json:"caller"`
			Others bool   `json:"others"`
			Used   int    `json:"used"`
		} `json:"spenders"`
	} `json:"detail"`
}

// TestDashboardSightPerPrincipal: a person signed in with the
// authorization server sees on the page only the calls of the principals
// they may see — their own and those visible to them — and cannot read
// another principal's call through the page's API or the activity: a
// hidden call is answered as one that does not exist.
func TestDashboardSightPerPrincipal(t *testing.T) {
	_, base, issuer, client, logs := sightSetup(t, "bob")
	agentCall, syncCall := spendAsOthers(t, base, issuer)
	bob := signInWithIssuer(t, base, logs)

	var who sessionAnswer
	getJSON(t, bob, base+"/ui/api/session", &who)
	if !who.SignedIn || who.Caller != "bob@example.com via "+client || who.Everyone || strings.Join(who.Keys, ",") != "demo" {
		t.Errorf("signed in as %+v", who)
	}

	// The activity: nightly-sync's call, not agent's.
	var page report.ActivityPage
	if code, body := getJSON(t, bob, base+"/v1/activity?key=demo", &page); code != http.StatusOK {
		t.Fatalf("GET /v1/activity: %d %s", code, body)
	}
	if len(page.Activity) != 1 || page.Activity[0].Caller != "nightly-sync" {
		t.Errorf("bob's activity = %+v, want nightly-sync's one call", page.Activity)
	}

	// Who spends it: nightly-sync by name, agent's two calls as others.
	var o overviewAnswer
	if code, body := getJSON(t, bob, base+"/ui/api/overview?key=demo", &o); code != http.StatusOK {
		t.Fatalf("GET /ui/api/overview: %d %s", code, body)
	}
	var named []string
	others := 0
	for _, s := range o.Detail.Spenders {
		if s.Others {
			others += s.Used
			continue
		}
		named = append(named, s.Caller)
	}
	if strings.Join(named, ",") != "nightly-sync" || others != 2 {
		t.Errorf("spenders: named %v, others' calls %d; want nightly-sync, 2", named, others)
	}
	if r := o.Detail.Status.Reservations; len(r) != 0 {
		t.Errorf("bob is shown the reservations %+v, want none: agent's is not his to see", r)
	}

	// A call of a principal bob may not see reads as one that does not
	// exist; nightly-sync's reads.
	if code, body := getJSON(t, bob, base+"/ui/api/call?key=demo&call="+syncCall, nil); code != http.StatusOK || !strings.Contains(body, "nightly-sync") {
		t.Errorf("nightly-sync's call: %d %s", code, body)
	}
	hidden, hiddenBody := getJSON(t, bob, base+"/ui/api/call?key=demo&call="+agentCall, nil)
	missing, missingBody := getJSON(t, bob, base+"/ui/api/call?key=demo&call=no-such-call", nil)
	if hidden != http.StatusNotFound || hiddenBody != missingBody || missing != http.StatusNotFound {
		t.Errorf("agent's call: %d %s\nno call: %d %s\nwant the same 404", hidden, hiddenBody, missing, missingBody)
	}
	// A key bob neither uses nor sees reads as one that does not exist.
	opsCode, opsBody := getJSON(t, bob, base+"/ui/api/overview?key=ops", nil)
	nopeCode, nopeBody := getJSON(t, bob, base+"/ui/api/overview?key=nope", nil)
	if opsCode != http.StatusNotFound || opsCode != nopeCode || opsBody != nopeBody {
		t.Errorf("key ops: %d %s\nkey nope: %d %s\nwant the same 404", opsCode, opsBody, nopeCode, nopeBody)
	}
	for _, a := range page.Activity {
		if strings.Contains(a.Caller, "agent") {
			t.Errorf("bob sees agent's call %+v", a)
		}
	}

	// Over MCP, the job nightly-sync reads its own calls in the activity
	// resource, not agent's.
	job := oidctest.ClientCredentials(t, issuer, "sync-job", "sync-job-secret", base+"/mcp", "mcp")
	sess := httpSession(t, base, job, nil)
	res, err := sess.ReadResource(t.Context(), &gomcp.ReadResourceParams{URI: "quota://activity/demo"})
	if err != nil || len(res.Contents) != 1 {
		t.Fatalf("reading the activity resource: %v", err)
	}
	var resource report.ActivityPage
	if err := json.Unmarshal([]byte(res.Contents[0].Text), &resource); err != nil {
		t.Fatal(err)
	}
	if len(resource.Activity) != 1 || resource.Activity[0].Caller != "nightly-sync" {
		t.Errorf("nightly-sync's activity resource = %+v, want its one call", resource.Activity)
	}
}

// TestDashboardSightAdministrator: a member of the admin group sees every
// principal's calls and every key on the page, while using only the keys
// its principal is given; the sign-in card offers the issuer by name.
func TestDashboardSightAdministrator(t *testing.T) {
	_, base, issuer, client, logs := sightSetup(t, "alice")
	agentCall, _ := spendAsOthers(t, base, issuer)

	var choices struct {
		OIDC struct{ Label, Path string }
	}
	if code, body := getJSON(t, http.DefaultClient, base+"/ui/api/signin", &choices); code != http.StatusOK ||
		choices.OIDC.Label != "Sign in with Test IdP" || choices.OIDC.Path != "/ui/signin/oidc" {
		t.Errorf("GET /ui/api/signin: %d %s", code, body)
	}

	alice := signInWithIssuer(t, base, logs)
	var who sessionAnswer
	getJSON(t, alice, base+"/ui/api/session", &who)
	if who.Caller != "alice@example.com via "+client || !who.Everyone || strings.Join(who.Keys, ",") != "demo,ops" {
		t.Errorf("signed in as %+v, want an administrator who sees demo and ops", who)
	}
	var page report.ActivityPage
	getJSON(t, alice, base+"/v1/activity?key=demo", &page)
	callers := map[string]int{}
	for _, a := range page.Activity {
		callers[a.Caller]++
	}
	if callers["agent"] != 2 || callers["nightly-sync"] != 1 {
		t.Errorf("the administrator's activity by caller = %v, want agent 2, nightly-sync 1", callers)
	}
	if code, body := getJSON(t, alice, base+"/ui/api/call?key=demo&call="+agentCall, nil); code != http.StatusOK {
		t.Errorf("agent's call: %d %s", code, body)
	}
	if code, body := getJSON(t, alice, base+"/ui/api/overview?key=ops", nil); code != http.StatusOK {
		t.Errorf("key ops: %d %s", code, body)
	}
	var o overviewAnswer
	getJSON(t, alice, base+"/ui/api/overview?key=demo", &o)
	if r := o.Detail.Status.Reservations; len(r) != 1 || r[0].Caller != "agent" {
		t.Errorf("the administrator is shown the reservations %+v, want agent's", r)
	}
}

// TestDashboardSignInButton: with [oauth] and no dashboard_client_id, the
// sign-in card offers the issuer (by its host) and the dashboard
// registers its own client there at the first sign-in; without [oauth]
// it offers nothing but the token form.
func TestDashboardSignInButton(t *testing.T) {
	iss := oidctest.Start(t, 1, "alice")
	_, upstream := upstreamAPI(t, demo.Config{})
	s, addr := oauthSetup(t, upstream, iss[0])
	base, logs := s.serve(t, "--listen", addr)

	var choices struct {
		OIDC *struct{ Label, Path string }
	}
	code, body := getJSON(t, http.DefaultClient, base+"/ui/api/signin", &choices)
	if want := "Sign in with " + strings.TrimPrefix(iss[0], "http://"); code != http.StatusOK || choices.OIDC == nil || choices.OIDC.Label != want {
		t.Fatalf("GET /ui/api/signin: %d %s, want the button %q", code, body, want)
	}
	browser := signInWithIssuer(t, base, logs)
	var who sessionAnswer
	getJSON(t, browser, base+"/ui/api/session", &who)
	if !who.SignedIn || !strings.HasPrefix(who.Caller, "alice@example.com via ") {
		t.Errorf("signed in as %+v, want alice through the client the dashboard registered", who)
	}

	plain := newSetup(t, demoKey(upstream, 120, time.Minute))
	plainBase, _ := plain.serve(t)
	choices.OIDC = nil
	if code, body := getJSON(t, http.DefaultClient, plainBase+"/ui/api/signin", &choices); code != http.StatusOK || choices.OIDC != nil {
		t.Errorf("without [oauth], GET /ui/api/signin: %d %s, want no button", code, body)
	}
	if code, _ := getJSON(t, http.DefaultClient, plainBase+"/ui/signin/oidc", nil); code != http.StatusNotFound && code != http.StatusUnauthorized {
		t.Errorf("without [oauth], GET /ui/signin/oidc: %d, want no sign-in there", code)
	}
}
