package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
)

// Tokens of the fair-shares test's two agents.
const (
	aliceToken = "alice-token-5b2f9e07c3d81a64"
	bobToken   = "bob-token-c81d3a5e9f0b2746"
)

// The fair-shares test's key: 30 calls per 4 s, shared by two agents
// ("*": 40% each at most) and a sync job (80% at most, and twice an
// agent's weight in the turns).
const (
	fairQuota  = 30
	fairWindow = 4 * time.Second
	agentShare = 0.4
	syncShare  = 0.8
	syncCap    = 24 // 80% of 30
	// syncSpent is what a refusal of the sync job for its share says.
	syncSpent = "principal 'sync' has used its share of the key: 24 of the 30 calls per 4 s of policy 'default' (80%)"
)

// fairConfig is the configuration of the fair-shares test: its state
// (a file, or a PostgreSQL URL; "" for the command line's), the demo key
// at upstream with its shares, and the callers alice, bob and sync.
func fairConfig(state, upstream string) testkit.Config {
	key := demoKey(upstream, fairQuota, fairWindow)
	key.MaxRate, key.MaxConcurrency = 1000, 64
	key.Shares = []testkit.Share{{Principal: "*", Share: agentShare}, {Principal: "sync", Share: syncShare}}
	cfg := testkit.Config{State: state, Keys: []testkit.Key{key}}
	if state != "" {
		cfg.StateTimeout = 10 * time.Second
	}
	for _, name := range []string{"alice", "bob", "sync"} {
		cfg.Callers = append(cfg.Callers, testkit.Caller{Name: name, TokenEnv: strings.ToUpper(name) + "_TOKEN", Keys: []string{"demo"}})
	}
	return cfg
}

// Two agents over MCP (alice and bob) and a greedy sync job over REST
// (15 callers at once on each host) on one key, one host with a SQLite
// state: see fairShares.
func TestFairSharesOneHost(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a load of six windows in real time: not under -short")
	}
	up := newUpstreamLog(t, demo.Config{Quota: fairQuota, Window: fairWindow})
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(fairConfig("", up.url).TOML()), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DEMO_SECRET": upstreamSecret, "SYNC_TOKEN": syncToken, "ALICE_TOKEN": aliceToken, "BOB_TOKEN": bobToken}
	base, _, stop := startServe(t, func(k string) string { return env[k] }, "--config", cfg, "--state", testkit.StateFile(t, state.Open))
	defer stop()
	fairShares(t, up, []string{base})
}

// The same on three hosts (serve processes of their own) sharing one
// PostgreSQL database: alice on host-a, bob on host-c, the sync job's
// callers spread over all three.
func TestFairSharesThreeHosts(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a load of six windows in real time: not under -short")
	}
	pg := pgtest.Start(t)
	db := pg.CreateDatabase(t)
	up := newUpstreamLog(t, demo.Config{Quota: fairQuota, Window: fairWindow})
	cfg := fairConfig(db, up.url).TOML()
	var bases []string
	for _, name := range []string{"host-a", "host-b", "host-c"} {
		h := newHost(t, name, cfg, pg.Password(), "ALICE_TOKEN="+aliceToken, "BOB_TOKEN="+bobToken)
		h.serve(t)
		bases = append(bases, h.base)
	}
	fairShares(t, up, bases)
}

// fairShares loads the key through bases (the hosts' serve URLs): the
// sync job alone until it has been told its share is spent, then the two
// agents beside it for four windows or more. It judges by what mcp-quota
// decided per principal, from the shared activity (on the state's
// clock), against what each agent asked for, not by how many calls a
// loaded machine let the agents make:
//
//   - the sync job never has more than its cap (80%) of any rolling
//     window, though it alone asks at first; a call refused for that says
//     it is its share (REST 429, code shareSpent), and so does GET
//     /v1/quota;
//   - while an agent, with one call at a time, waited behind the sync
//     job's callers for a slot of a full window, the sync job took none
//     of those slots but the first of each wait (see overtaken);
//   - no rolling window of the key holds more admissions than its quota.
func fairShares(t *testing.T, up *upstreamLog, bases []string) {
	// The sync job's callers on each host: one fewer than a caller may
	// have in flight on a host (the gateway's 16), so that GET /v1/quota
	// as the sync job is never refused for that however long its calls
	// take on a loaded machine.
	const perHost = 15
	workers := perHost * len(bases)
	client := &http.Client{Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	alice := httpSession(t, bases[0], aliceToken, nil)
	bob := httpSession(t, bases[len(bases)-1], bobToken, nil)

	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	var mu sync.Mutex
	var shareSpent []string // what the sync job's refusals for its share said
	unavailable := 0        // calls that found the state unavailable
	capped := make(chan struct{})
	var cappedOnce sync.Once
	for w := range workers {
		base := bases[w%len(bases)]
		wg.Go(func() {
			for n := 1; ctx.Err() == nil; n++ {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/k/demo/v1/echo?call=sync.%d.%d", base, w, n), nil)
				req.Header.Set("Authorization", "Bearer "+syncToken)
				req.Header.Set("Prefer", "wait=2")
				resp, err := client.Do(req)
				if ctx.Err() != nil {
					return // the load ended: a call cut short says nothing
				}
				if err != nil {
					t.Errorf("sync %d: %v", w, err)
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					continue
				}
				var p struct{ Code, Detail string }
				json.Unmarshal(body, &p)
				if resp.StatusCode == http.StatusServiceUnavailable && p.Code == "stateUnavailable" {
					mu.Lock()
					unavailable++
					mu.Unlock()
				} else if resp.StatusCode != http.StatusTooManyRequests || (p.Code != "shareSpent" && p.Code != "rateLimited") {
					t.Errorf("sync %d: %d %s", w, resp.StatusCode, body)
					return
				}
				if p.Code == "shareSpent" {
					mu.Lock()
					shareSpent = append(shareSpent, p.Detail)
					mu.Unlock()
					if strings.Contains(p.Detail, syncSpent) {
						cappedOnce.Do(func() { close(capped) })
					}
				}
				select { // a refused caller comes back a little later, as a client with a backoff does
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		})
	}
	// While the sync job asks alone, GET /v1/quota (what quota_status
	// answers) tells it, once its share is spent, that it is its share.
	var quotaSaid []string
	told := make(chan struct{})
	wg.Go(func() {
		for ctx.Err() == nil {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, bases[len(bases)-1]+"/v1/quota?key=demo", nil)
			req.Header.Set("Authorization", "Bearer "+syncToken)
			resp, err := client.Do(req)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				t.Errorf("GET /v1/quota: %v", err)
				return
			}
			var st struct {
				Advice struct{ Action, Reason string }
			}
			err = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if err != nil {
				t.Errorf("GET /v1/quota: %v", err)
				return
			}
			// A pause when the share's oldest call leaves the window a
			// second or more from now (the sync job's first burst), a slow
			// down when sooner (its calls spread over the window, as they
			// are on a loaded machine): either says it is the share, the
			// pause after "Wait 2 s before the next call: principal…", the
			// slow down as a sentence of its own ("Principal…").
			if st.Advice.Action == "pause" || st.Advice.Action == "slow_down" {
				mu.Lock()
				quotaSaid = append(quotaSaid, st.Advice.Reason)
				mu.Unlock()
				if strings.Contains(strings.ToLower(st.Advice.Reason), "principal 'sync' has used its share") {
					close(told)
					return
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	// The agents join once the sync job has spent its share, however long
	// that took on this machine; only a hang fails here.
	for _, ch := range []chan struct{}{capped, told} {
		select {
		case <-ch:
		case <-time.After(2 * time.Minute):
			mu.Lock()
			refusals, said := slices.Clone(shareSpent[:min(len(shareSpent), 3)]), slices.Clone(quotaSaid[:min(len(quotaSaid), 3)])
			mu.Unlock()
			t.Fatalf("the sync job, alone, was not told its share was spent within 2 minutes: its refusals said %q, GET /v1/quota %q", refusals, said)
		}
	}
	agentsFrom := time.Now()
	paused := map[string][]string{} // by agent: when (since the start) and what each pause said
	for _, a := range []struct {
		name string
		sess *gomcp.ClientSession
	}{{"alice", alice}, {"bob", bob}} {
		wg.Go(func() {
			for n := 1; ctx.Err() == nil; n++ {
				res, err := a.sess.CallTool(ctx, &gomcp.CallToolParams{Name: "fetch",
					Arguments: map[string]any{"path": fmt.Sprintf("/v1/echo?call=%s.%d", a.name, n), "max_wait_s": 5}})
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					t.Errorf("%s: %v", a.name, err)
					return
				}
				if res.IsError && errorCode(res) == "stateUnavailable" {
					mu.Lock()
					unavailable++
					mu.Unlock()
					continue
				}
				if res.IsError && !strings.Contains(text(res), "Paused") {
					t.Errorf("%s: %s", a.name, text(res))
					return
				}
				if res.IsError {
					mu.Lock()
					paused[a.name] = append(paused[a.name], fmt.Sprintf("%v: %s", time.Since(start).Round(time.Millisecond), text(res)))
					mu.Unlock()
				}
			}
		})
	}
	// The load: four windows of the three together, and up to four more
	// while an agent has yet to wait for a slot of a full window three
	// times (a slow machine fills the key's windows later, or not at all).
	judge := func() fairJudged { return fairJudge(t, bases[0]) }
	var j fairJudged
	for {
		select {
		case <-time.After(fairWindow):
		case <-ctx.Done():
		}
		j = judge()
		if d := time.Since(agentsFrom); d >= 8*fairWindow || d >= 4*fairWindow && j.overtaken("alice").waited >= 3 && j.overtaken("bob").waited >= 3 {
			break
		}
	}
	cancel()
	wg.Wait()
	t.Logf("the sync job alone for %v, then with the agents for %v", agentsFrom.Sub(start).Round(time.Millisecond), time.Since(agentsFrom).Round(time.Millisecond))

	j = judge()
	t.Logf("admitted: sync %d, alice %d, bob %d; %d not sent for leaving late", len(j.admitted["sync"]), len(j.admitted["alice"]), len(j.admitted["bob"]), j.late)
	if most := (demo.Stats{Accepted: j.admitted["sync"]}).MaxInWindow(fairWindow); most > syncCap {
		t.Errorf("the sync job was admitted %d calls in one rolling %v; want at most its cap, %d", most, fairWindow, syncCap)
	}
	if unavailable > 0 {
		// A transaction that outlasts state_timeout on a loaded machine
		// fails its call closed: not unfair, but worth seeing.
		t.Logf("%d calls found the state unavailable", unavailable)
	}
	judged := true
	for _, agent := range []string{"alice", "bob"} {
		o := j.overtaken(agent)
		var by []string
		for _, at := range o.by {
			by = append(by, at.Format("15:04:05.000"))
		}
		t.Logf("%s: %d of its calls waited for a slot of a full window and got it; the sync job took %d more while %s waited behind it %v",
			agent, o.waited, len(o.by), agent, by)
		if len(o.by) > 0 {
			t.Errorf("while %s waited behind the sync job, the sync job took %d more slots of full windows than the first of each wait; want none",
				agent, len(o.by))
			mu.Lock()
			t.Logf("%s's pauses, from the start: %q", agent, paused[agent])
			mu.Unlock()
		}
		judged = judged && o.waited+len(o.by) > 0
	}
	var all []time.Time
	for _, list := range j.admitted {
		all = append(all, list...)
	}
	if most := (demo.Stats{Accepted: all}).MaxInWindow(fairWindow); most > fairQuota {
		t.Errorf("mcp-quota admitted %d calls in one rolling %v; want at most the quota, %d", most, fairWindow, fairQuota)
	}
	if stats := up.api.Stats(upstreamSecret); stats.Rejected > 0 {
		// The upstream counts arrivals, which a loaded machine delays past
		// the margin after their admission: the hosts tests judge that.
		t.Logf("the upstream refused %d calls", stats.Rejected)
	}
	if !judged {
		// The machine served the key slower than its quota: nobody waited
		// for anybody, and the turns had nothing to decide.
		t.Skipf("the key's windows never filled while an agent waited (the machine was too slow to spend %d calls per %v): the turns were not judged", fairQuota, fairWindow)
	}
}

// fairJudged is what mcp-quota decided on the fair-shares test's key,
// from the shared activity read through base, on the state's clock.
type fairJudged struct {
	tries    []fairTry
	admitted map[string][]time.Time // by principal, oldest first
	late     int                    // attempts not sent for leaving late (not in tries nor admitted)
}

func fairJudge(t *testing.T, base string) fairJudged {
	t.Helper()
	j := fairJudged{admitted: map[string][]time.Time{}}
	for _, at := range readActivity(t, base, aliceToken) { // (the sync job has its most calls in flight)
		// A send that would have left later than its margin allows is not
		// sent, and its call is admitted again without counting it
		// (pacer.Leaving): the two share a window, one went out. A loaded
		// machine makes such sends.
		if at.ReasonKind == reason.Late {
			j.late++
			continue
		}
		if at.State == string(ledger.Cached) {
			continue
		}
		when, err := time.Parse(time.RFC3339Nano, at.At)
		if err != nil {
			t.Fatalf("activity %d: at %q: %v", at.ID, at.At, err)
		}
		tr := fairTry{caller: at.Caller, at: when, asked: when.Add(-time.Duration(max(at.WaitMS, 0)) * time.Millisecond),
			admitted: at.State != string(ledger.RejectedLocal)}
		j.tries = append(j.tries, tr)
		if tr.admitted {
			j.admitted[at.Caller] = append(j.admitted[at.Caller], when)
		}
	}
	for _, list := range j.admitted {
		slices.SortFunc(list, time.Time.Compare)
	}
	return j
}

// A fairTry is one attempt in the fair-shares test's activity: when its
// caller asked (before any wait) and when it was admitted or refused.
type fairTry struct {
	caller    string
	asked, at time.Time
	admitted  bool
}

// overtakings are how an agent fared while its calls waited (see
// overtaken).
type overtakings struct {
	waited int         // its calls admitted into the last slot of a full window after waiting
	by     []time.Time // when the sync job took the last slot of a full window while the agent waited behind it (but the first of each wait)
}

// overtaken judges agent's waits in tries against the admissions of
// every principal (admitted, each list oldest first). A slot is the last
// of a full window when the quota less one were admitted in the
// fairWindow before it; the window counted here holds no margin, so it
// holds no more than the one the pacer counts, and a slot the test sees
// as a window's last was one to the pacer too. While one of agent's
// calls waited (asked and not yet admitted or refused), each such slot
// the sync job took while the agent was behind it (fewer admissions
// relative to its share) overtook the agent; each the agent's call was
// admitted into ended a wait the agent won.
//
// The fair rule gives a free slot to the principal most behind of those
// waiting, from the agent's first check on. Between its ask and that
// check (a transaction, slow on a loaded machine) the sync job may take
// a slot that filled the window, which is what the agent then waits for:
// the first such slot of each wait is not counted. A rule that hands a
// free slot to whoever asks first lets the sync job's callers, one per
// host, take several in one wait.
func (j fairJudged) overtaken(agent string) overtakings {
	tries, admitted := j.tries, j.admitted
	in := func(p string, at time.Time) int { // p's admissions in the window before at
		n := 0
		for _, x := range admitted[p] {
			if !x.Before(at.Add(-fairWindow)) && x.Before(at) {
				n++
			}
		}
		return n
	}
	full := func(at time.Time) bool { return in("sync", at)+in("alice", at)+in("bob", at) >= fairQuota-1 }
	var o overtakings
	for _, tr := range tries {
		if tr.caller != agent || !tr.at.After(tr.asked) {
			continue
		}
		if tr.admitted && full(tr.at) {
			o.waited++
		}
		first := true
		for _, s := range admitted["sync"] {
			if !s.After(tr.asked) || !s.Before(tr.at) || !full(s) {
				continue
			}
			if float64(in(agent, s))/agentShare < float64(in("sync", s))/syncShare {
				if !first {
					o.by = append(o.by, s)
				}
				first = false
			}
		}
	}
	return o
}

// An agent whose own share is spent is told so by fetch's pause and by
// quota_status, over MCP, while another agent still uses the key.
func TestShareAdviceOverMCP(t *testing.T) {
	_, upstream := upstreamAPI(t, demo.Config{Quota: 100, Window: time.Minute})
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.toml")
	config := fairConfig("", upstream)
	config.Keys[0].Policies = testkit.Window(5, time.Minute)
	if err := os.WriteFile(cfg, []byte(config.TOML()), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DEMO_SECRET": upstreamSecret, "SYNC_TOKEN": syncToken, "ALICE_TOKEN": aliceToken, "BOB_TOKEN": bobToken}
	base, _, stop := startServe(t, func(k string) string { return env[k] }, "--config", cfg, "--state", testkit.StateFile(t, state.Open))
	defer stop()
	alice := httpSession(t, base, aliceToken, nil)
	bob := httpSession(t, base, bobToken, nil)

	// 40% of 5 is 2 calls a minute for alice.
	for i := range 2 {
		if res, _ := call(t, alice, "fetch", map[string]any{"path": fmt.Sprintf("/v1/echo?n=%d", i)}); res.IsError {
			t.Fatalf("alice's call %d: %s", i, text(res))
		}
	}
	res, out := call(t, alice, "fetch", map[string]any{"path": "/v1/echo?n=3"})
	advice, _ := out["advice"].(map[string]any)
	reason, _ := advice["reason"].(string)
	if !res.IsError || advice["action"] != "pause" || !strings.Contains(reason, "principal 'alice' has used its share of the key: 2 of the 5 calls per 60 s of policy 'default' (40%)") ||
		!strings.Contains(reason, "the key itself has 3 left for the others") {
		t.Errorf("alice's third call: got isError %v, advice %v; want a pause for her share", res.IsError, advice)
	}
	_, st := call(t, alice, "quota_status", map[string]any{"key": "demo"})
	if a, _ := st["advice"].(map[string]any); a["action"] != "pause" || !strings.Contains(fmt.Sprint(a["reason"]), "principal 'alice' has used its share") {
		t.Errorf("alice's quota_status: got advice %v; want a pause for her share", a)
	}
	if res, _ := call(t, bob, "fetch", map[string]any{"path": "/v1/echo?n=4"}); res.IsError {
		t.Errorf("bob: got %s; want his call answered", text(res))
	}
}
