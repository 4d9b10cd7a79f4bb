package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

var screenshot = flag.Bool("screenshot", false, "save the dashboard's screenshots to docs/dashboard.png and docs/dashboard-phone.png")

const adminToken = "admin-token-51c0e7aa92d4b6f8"

// chromium returns the path of a headless-capable Chromium: Debian's
// chromium (which .ci/run installs), or another on PATH. Without one the
// test skips locally and fails under CI=true.
func chromium(t *testing.T) string {
	t.Helper()
	testkit.SkipShort(t, "drives Chromium")
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no Chromium on PATH: install Debian's chromium (apt-get install -y chromium), as .ci/run does")
	}
	t.Skip("no Chromium on PATH (apt-get install -y chromium); the browser test runs, and must pass, under CI=true")
	return ""
}

// newBrowser starts a fresh headless Chromium with its own profile, in
// UTC, and returns a tab's context.
func newBrowser(t *testing.T, exe string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Env("TZ=UTC"),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1400),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser; no timeout on this first run
		t.Fatalf("start %s: %v", exe, err)
	}
	return ctx
}

// do runs steps in the tab, each run within 30 s.
func do(t *testing.T, tab context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// value runs one action in the tab and returns its value.
func value[T any](t *testing.T, tab context.Context, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// status is the HTTP status the page's own fetch of path gets.
func status(path string) chromedp.Action[int] {
	return chromedp.Evaluate[int](fmt.Sprintf(`fetch(%q, {credentials: "same-origin"}).then(r => r.status)`, path), chromedp.EvalAwaitPromise)
}

func count(css string) chromedp.Action[int] {
	return chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, css))
}

func signIn(token string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.WaitVisible(chromedp.ID("signin-form")),
		chromedp.SetValue(chromedp.ID("token"), token),
		chromedp.Click(chromedp.ID("signin-button")),
	)
}

// TestDashboardInBrowser loads the page in headless Chromium against a
// live serve process and the demo upstream, drives calls until some are
// refused, and checks what a person sees: the gauges, the chart and the
// activity table show the refusals; a caller signs in and sees only its
// keys; a wrong token gets in nowhere; no token is left where a script
// could read it.
func TestDashboardInBrowser(t *testing.T) {
	t.Parallel()
	exe := chromium(t)
	const quota = 20
	_, url := upstreamAPI(t, demo.Config{Quota: 120, Window: time.Minute})
	key := demoKey(url, quota, 10*time.Minute)
	key.MaxRate = 1000
	ops := demoKey(url, 50, time.Minute)
	ops.Name = "ops"
	cfg := demoConfig(key, ops)
	cfg.Callers = append(cfg.Callers, testkit.Caller{Name: "admin", TokenEnv: "ADMIN_TOKEN", Keys: []string{"*"}})
	s := setupOf(t, cfg)
	s.env = append(s.env, "ADMIN_TOKEN="+adminToken)
	_, base, stderr := s.serveProcess(t)

	// A sync job spends the budget and is refused beyond it, with one
	// call the upstream answers 404; for the screenshot, over a while.
	refused := 0
	for n := range quota + 10 {
		if *screenshot {
			time.Sleep(700 * time.Millisecond) // a picture, not a timing claim
		}
		if n == 5 {
			resp := get(t, base+"/k/demo/v1/participants/nobody", syncToken)
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Fatalf("the unknown participant: %d, want 404", resp.StatusCode)
			}
		}
		resp := get(t, fmt.Sprintf("%s/k/demo/v1/participants?limit=%d", base, n+1), syncToken, "Prefer", "wait=0")
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			refused++
		}
	}
	if refused == 0 {
		t.Fatal("no call was refused")
	}

	tab := newBrowser(t, exe)
	// A wrong token gets in nowhere.
	do(t, tab, "sign in with a wrong token",
		chromedp.Navigate(base+"/"),
		signIn("not-a-caller-token"),
		chromedp.WaitVisible(chromedp.CSS("#signin-error:not(:empty)")))
	errText := value(t, tab, chromedp.Text(chromedp.ID("signin-error")))
	mainHidden := value(t, tab, chromedp.JavascriptAttribute[bool](chromedp.ID("main"), "hidden"))
	for _, path := range []string{"/ui/api/overview", "/v1/activity?key=demo", "/metrics", "/k/demo/v1/participants"} {
		if got := value(t, tab, status(path)); got != http.StatusUnauthorized {
			t.Errorf("after a wrong token the page's fetch of %s got %d, want 401", path, got)
		}
	}
	if !mainHidden || errText == "" {
		t.Errorf("after a wrong token: dashboard hidden %v, message %q; want hidden, and a message", mainHidden, errText)
	}

	// The agent signs in and sees only its key, with the refusals.
	do(t, tab, "sign in as the agent",
		signIn(agentToken),
		chromedp.WaitVisible(chromedp.CSS(`#keys li[data-key="demo"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#activity tbody tr.refused`)),
		chromedp.WaitVisible(chromedp.CSS(`#chart rect.bar`)))
	keys := value(t, tab, chromedp.Text(chromedp.ID("keys")))
	gauges := value(t, tab, chromedp.Text(chromedp.ID("gauges")))
	advice := value(t, tab, chromedp.Text(chromedp.ID("advice")))
	localBars, sentBars := value(t, tab, count("#chart rect.bar.refused_locally")), value(t, tab, count("#chart rect.bar.sent"))
	refusedRows := value(t, tab, count("#activity tbody tr.refused"))
	budgetLine := value(t, tab, count("#budget path.left"))
	if !strings.Contains(keys, "demo") || strings.Contains(keys, "ops") {
		t.Errorf("the agent's key list is %q; want demo and not ops", keys)
	}
	resp := get(t, base+"/v1/quota?key=demo", syncToken)
	var q struct {
		Keys []struct {
			Local []struct{ Used, Limit int }
		}
	}
	json.NewDecoder(resp.Body).Decode(&q)
	resp.Body.Close()
	if len(q.Keys) != 1 || len(q.Keys[0].Local) != 1 || q.Keys[0].Local[0].Used < quota/2 {
		t.Fatalf("/v1/quota = %+v, want the demo key's budget mostly spent", q)
	}
	if want := fmt.Sprintf("%d calls per 10 minutes · %d used", quota, q.Keys[0].Local[0].Used); !strings.Contains(gauges, want) {
		t.Errorf("gauges %q do not show %q", gauges, want)
	}
	if localBars == 0 || sentBars == 0 || refusedRows == 0 || budgetLine != 1 {
		t.Errorf("chart bars refused locally %d, sent %d, budget lines %d; refused rows %d; want some of each and one budget line", localBars, sentBars, budgetLine, refusedRows)
	}
	if advice == "" {
		t.Error("no advice shown")
	}
	cookie := value(t, tab, chromedp.Evaluate[string](`document.cookie`))
	storage := value(t, tab, chromedp.Evaluate[string](`JSON.stringify(localStorage) + JSON.stringify(sessionStorage) + document.getElementById("token").value`))
	href := value(t, tab, chromedp.Location())
	for what, v := range map[string]string{"document.cookie": cookie, "script storage": storage, "URL": href} {
		if strings.Contains(v, agentToken) || strings.Contains(v, "mcpq_session") {
			t.Errorf("%s holds the token or the session: %q", what, v)
		}
	}

	// Clicking a refused call shows its attempts; a confirmed one, the
	// observation its answer produced.
	do(t, tab, "open a refused call",
		chromedp.Click(chromedp.CSS(`#activity tbody tr.refused`)),
		chromedp.WaitVisible(chromedp.CSS("#call-body .attempt")))
	if got := value(t, tab, chromedp.Text(chromedp.ID("call-body"))); !strings.Contains(got, "rejected_local") {
		t.Errorf("the refused call shows %q, want its rejected_local attempt", got)
	}
	do(t, tab, "open a confirmed call",
		chromedp.Click(chromedp.CSS(`#activity tbody tr[data-state="confirmed"]`)),
		chromedp.WaitVisible(chromedp.CSS("#call-body table.observations")))
	if got := value(t, tab, chromedp.Text(chromedp.ID("call-body"))); !strings.Contains(got, "default") || !strings.Contains(got, "draft") {
		t.Errorf("the confirmed call shows %q, want the policy it observed and its source", got)
	}

	// Filtered by state, the table holds just the local refusals.
	do(t, tab, "filter by state",
		chromedp.SetValue(chromedp.ID("f-state"), "rejected_local"),
		chromedp.Click(chromedp.CSS(`#filters button[type="submit"]`)),
		chromedp.WaitNotPresent(chromedp.CSS(`#activity tbody tr:not([data-state="rejected_local"])`)))
	if got := value(t, tab, count(`#activity tbody tr[data-state="rejected_local"]`)); got != refused {
		t.Errorf("filtered by rejected_local, the table shows %d rows; %d calls were refused", got, refused)
	}
	do(t, tab, "clear the filter",
		chromedp.SetValue(chromedp.ID("f-state"), ""),
		chromedp.Click(chromedp.CSS(`#filters button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#activity tbody tr[data-state="confirmed"]`)))

	// Signed out, the agent's page is back at the sign-in; another
	// caller, in a browser of its own, sees every key it may use.
	do(t, tab, "sign out", chromedp.Click(chromedp.ID("signout")), chromedp.WaitVisible(chromedp.ID("signin-form")))
	if got := value(t, tab, status("/ui/api/overview")); got != http.StatusUnauthorized {
		t.Errorf("after signing out the overview is %d, want 401", got)
	}
	admin := newBrowser(t, exe)
	do(t, admin, "sign in as admin",
		chromedp.Navigate(base+"/"),
		signIn(adminToken),
		chromedp.WaitVisible(chromedp.CSS(`#keys li[data-key="ops"]`)))
	if keys := value(t, admin, chromedp.Text(chromedp.ID("keys"))); !strings.Contains(keys, "demo") || !strings.Contains(keys, "ops") {
		t.Errorf("admin's key list is %q, want demo and ops", keys)
	}

	for _, width := range []int64{1280, 390} {
		t.Run(fmt.Sprintf("%dpx", width), func(t *testing.T) { pageAtWidth(t, exe, base, width) })
	}
	if strings.Contains(stderr.String(), agentToken) || strings.Contains(stderr.String(), adminToken) || strings.Contains(stderr.String(), upstreamSecret) {
		t.Error("serve's log holds a token or the key's secret")
	}
}

// overflow is how far the page reaches past the window's right edge.
var overflow = chromedp.Evaluate[int](`document.documentElement.scrollWidth - window.innerWidth`)

// pageAtWidth checks the page as a person sees it in a window width
// pixels wide (a desktop at 1280, a phone at 390), after
// TestDashboardInBrowser's calls: nothing of the dashboard before sign-in,
// no sideways scrolling, when the budget frees up said with clock times,
// the 404 not painted as a refusal, dates on one line, columns without
// content left out, a call's detail where it was clicked, and ?poll_ms=
// kept within 1 s and 5 minutes.
func pageAtWidth(t *testing.T, exe, base string, width int64) {
	tab := newBrowser(t, exe)
	do(t, tab, "open the page polling every 11 days", chromedp.EmulateViewport(width, 800), chromedp.Navigate(base+"/?poll_ms=999999999"),
		chromedp.WaitVisible(chromedp.ID("signin-form")))
	if got := value(t, tab, chromedp.Evaluate[string](`document.getElementById("live").dataset.pollMs`)); got != "300000" {
		t.Errorf("with ?poll_ms=999999999 the page polls every %s ms, want the 300000 ms maximum", got)
	}
	do(t, tab, "open the page", chromedp.Navigate(base+"/?poll_ms=1"),
		chromedp.WaitVisible(chromedp.ID("signin-form")))
	shown := value(t, tab, chromedp.Evaluate[string](`(() => { const m = document.getElementById("main"), r = m.getBoundingClientRect();
		return getComputedStyle(m).display + " " + r.width + "x" + r.height; })()`))
	if shown != "none 0x0" {
		t.Errorf("before sign-in the dashboard under the sign-in card is %q, want it not shown (none 0x0)", shown)
	}
	if got := value(t, tab, overflow); got > 0 {
		t.Errorf("before sign-in the page is %d px wider than the window", got)
	}
	do(t, tab, "sign in",
		signIn(agentToken),
		chromedp.WaitVisible(chromedp.CSS(`#activity tbody tr.row[data-state="rejected_upstream"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#free:not(:empty)`)))
	if got := value(t, tab, chromedp.Evaluate[string](`document.getElementById("live").dataset.pollMs`)); got != "1000" {
		t.Errorf("with ?poll_ms=1 the page polls every %s ms, want the 1000 ms minimum", got)
	}
	if got := value(t, tab, overflow); got > 0 {
		t.Errorf("signed in, the page is %d px wider than the window", got)
	}

	// When it frees up, with the clock times the server counted.
	var o struct {
		Detail struct {
			Status struct {
				Local []struct{ Remaining int }
			}
			Frees []struct {
				Limit     int
				Next, All string
				NextCalls int `json:"next_calls"`
			}
		}
	}
	raw := value(t, tab, chromedp.Evaluate[string](`fetch("/ui/api/overview?key=demo").then((r) => r.text())`, chromedp.EvalAwaitPromise))
	if err := json.Unmarshal([]byte(raw), &o); err != nil || len(o.Detail.Frees) != 1 || o.Detail.Frees[0].Next == "" || len(o.Detail.Status.Local) != 1 {
		t.Fatalf("overview %s (%v): want when the demo key's calls come back", raw, err)
	}
	f := o.Detail.Frees[0]
	clock := func(s string) string {
		at, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return at.UTC().Format("15:04:05")
	}
	free := value(t, tab, chromedp.Text(chromedp.ID("free")))
	now, more := fmt.Sprintf("None of %d left now: ", f.Limit), ""
	if left := o.Detail.Status.Local[0].Remaining; left > 0 {
		now, more = fmt.Sprintf("%d of %d left now; ", left, f.Limit), "more "
	}
	noun := "calls"
	if f.NextCalls == 1 {
		noun = "call"
	}
	when := fmt.Sprintf("%d %s%s free at %s, all %d at %s.", f.NextCalls, more, noun, clock(f.Next), f.Limit, clock(f.All))
	if f.Next == f.All {
		when = fmt.Sprintf("all %d free at %s.", f.Limit, clock(f.All))
	}
	if free != now+when {
		t.Errorf("when it frees up: %q, want %q", free, now+when)
	}
	if got := value(t, tab, chromedp.Text(chromedp.ID("gauges"))); !strings.Contains(got, now+when) {
		t.Errorf("the gauge %q does not say when it frees up", got)
	}

	// The 404 is an answer, not a refusal for quota; the local refusals are.
	paint := value(t, tab, chromedp.Evaluate[string](`(() => { const q = (s) => document.querySelectorAll(s).length;
		return [q('#activity tr.refused[data-state="rejected_upstream"]'), q('#activity tr.refused[data-state="rejected_local"]'),
		  q('#chart rect.bar.refused_upstream'), q('#chart rect.bar.answered_error')].join(" "); })()`))
	var paint404, paintLocal, bars429, bars404 int
	fmt.Sscan(paint, &paint404, &paintLocal, &bars429, &bars404)
	if paint404 != 0 || paintLocal == 0 || bars429 != 0 || bars404 != 1 {
		t.Errorf("404 rows painted refused %d, local refusals painted %d; chart bars of 429s %d, of other 4xx %d; want 0, some, 0, 1", paint404, paintLocal, bars429, bars404)
	}

	// Dates with the time, each on one line; no reservation columns for a
	// key without reservations; what is not known said in words.
	at := value(t, tab, chromedp.Text(chromedp.CSS(`#activity tbody tr.row td.time`)))
	if _, err := time.Parse("2006-01-02 15:04:05", at); err != nil {
		t.Errorf("an activity time reads %q, want a date and a time of day", at)
	}
	wrapped := value(t, tab, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#activity tr.row td.time, #activity tr.row td.wait, #activity tr.row td.state")]
		.filter((td) => { const r = document.createRange(); r.selectNodeContents(td); return new Set([...r.getClientRects()].map((c) => Math.round(c.top))).size > 1; })
		.map((td) => td.className + ": " + td.textContent)`))
	if len(wrapped) > 0 {
		t.Errorf("activity cells on more than one line: %q", wrapped)
	}
	if n := value(t, tab, count(`#spenders th.res`)); n != 3 {
		t.Fatalf("%d reservation columns, want 3 (hidden)", n)
	}
	if shown := value(t, tab, chromedp.Evaluate[int](`[...document.querySelectorAll("#spenders .res")].filter((e) => e.offsetParent !== null).length`)); shown != 0 {
		t.Errorf("%d reservation cells shown for a key without reservations, want none", shown)
	}
	budgets := value(t, tab, chromedp.Evaluate[string](`["free", "gauges", "chart", "chart-caption", "budget", "budget-caption"].map((id) => document.getElementById(id).textContent).join(" | ")`))
	if strings.Contains(budgets, "?") || strings.Contains(budgets, "/s") {
		t.Errorf("the budgets and the timeline show a question mark or a rate: %q", budgets)
	}

	// A call's detail opens under its row, in view: here the 25th row.
	const row = `#activity tbody tr.row:nth-of-type(25)`
	id := value(t, tab, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).dataset.call`, row)))
	do(t, tab, "open the 25th call", chromedp.Click(chromedp.CSS(row)), chromedp.WaitVisible(chromedp.CSS("#call-body .attempt")))
	place := value(t, tab, chromedp.Evaluate[string](`(() => { const c = document.getElementById("call"), tr = c.closest("tr");
		const r = c.getBoundingClientRect();
		return [tr && tr.previousElementSibling ? tr.previousElementSibling.dataset.call : "", r.top >= 0 && r.top < innerHeight ? "in view" : "out of view " + r.top].join(" "); })()`))
	if want := id + " in view"; place != want {
		t.Errorf("after clicking call %s its detail is %q, want %q (under the row clicked, in view)", id, place, want)
	}
	if got := value(t, tab, overflow); got > 0 {
		t.Errorf("with a call open the page is %d px wider than the window", got)
	}

	if *screenshot {
		// The desktop's whole page; the phone's first screen.
		do(t, tab, "close the call", chromedp.Click(chromedp.ID("call-close")),
			chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`))
		name, shot := "dashboard.png", chromedp.FullScreenshot(100)
		if width < 700 {
			name, shot = "dashboard-phone.png", chromedp.CaptureScreenshot()
		}
		png := value(t, tab, shot)
		if err := os.WriteFile(filepath.Join("..", "..", "docs", name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
