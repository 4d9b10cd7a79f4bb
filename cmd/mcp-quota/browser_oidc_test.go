package main

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/mcp-quota/mcp-quota/internal/oidctest"
)

// TestDashboardOIDCInBrowser: in headless Chromium, a person clicks the
// sign-in card's "Sign in with Test IdP", signs in at the authorization
// server's login page (a real oidc-provider) as bob, comes back to the
// dashboard and sees only the calls of the principals bob may see: his
// own and nightly-sync's (visible to him), not the static caller agent's,
// which the page's own API answers as a call that does not exist.
func TestDashboardOIDCInBrowser(t *testing.T) {
	t.Parallel()
	exe := chromium(t)
	_, base, issuer, _, logs := sightSetup(t, "")
	agentCall, syncCall := spendAsOthers(t, base, issuer)

	tab := newBrowser(t, exe)
	do(t, tab, "open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("signin-oidc-button")))
	if got := value(t, tab, chromedp.Text(chromedp.ID("signin-oidc-button"))); got != "Sign in with Test IdP" {
		t.Errorf("the sign-in button says %q, want %q", got, "Sign in with Test IdP")
	}
	if !value(t, tab, chromedp.JavascriptAttribute[bool](chromedp.ID("signin-form"), "isConnected")) {
		t.Error("the token form is gone beside the button")
	}
	do(t, tab, "sign in at the authorization server as bob",
		chromedp.Click(chromedp.ID("signin-oidc-button")),
		chromedp.WaitVisible(chromedp.ID("login-form")),
		chromedp.SetValue(chromedp.ID("login"), "bob"),
		chromedp.SetValue(chromedp.ID("password"), oidctest.Password),
		chromedp.Click(chromedp.ID("login-button")),
		chromedp.WaitVisible(chromedp.CSS(`#keys li[data-key="demo"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#activity tbody tr.row`)),
		chromedp.WaitVisible(chromedp.CSS(`#spenders tbody tr`)))
	if href := value(t, tab, chromedp.Location()); href != base+"/" {
		t.Errorf("after the sign-in the page is %s, want %s/", href, base)
	}
	if who := value(t, tab, chromedp.Text(chromedp.ID("who"))); !strings.Contains(who, "bob@example.com") {
		t.Errorf("the page is signed in as %q, want bob@example.com", who)
	}
	callers := value(t, tab, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#activity tbody tr.row td.caller")].map((td) => td.textContent)`))
	if !slices.Equal(callers, []string{"nightly-sync"}) {
		t.Errorf("bob's activity shows the calls of %q, want nightly-sync's one", callers)
	}
	spenders := value(t, tab, chromedp.Text(chromedp.ID("spenders")))
	if !strings.Contains(spenders, "nightly-sync") || !strings.Contains(spenders, "others") || strings.Contains(spenders, "agent") {
		t.Errorf("who spends it shows %q, want nightly-sync and others, not agent", spenders)
	}
	if keys := value(t, tab, chromedp.Text(chromedp.ID("keys"))); strings.Contains(keys, "ops") {
		t.Errorf("bob's key list is %q, without ops", keys)
	}
	for path, want := range map[string]int{
		"/ui/api/call?key=demo&call=" + agentCall: http.StatusNotFound,
		"/ui/api/call?key=demo&call=" + syncCall:  http.StatusOK,
		"/ui/api/overview?key=ops":                http.StatusNotFound,
	} {
		if got := value(t, tab, status(path)); got != want {
			t.Errorf("the page's fetch of %s got %d, want %d", path, got, want)
		}
	}
	if strings.Contains(logs.String(), agentToken) {
		t.Error("serve's log holds a token")
	}
}
