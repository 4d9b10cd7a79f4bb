package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// unitsUpstream announces a policy in content-bytes and one in
// concurrent-requests on every answer, and keeps what it received: the
// bytes of each body, and how many calls it held at once at most. A
// call to /slow is held until release is closed.
type unitsUpstream struct {
	mu       sync.Mutex
	bodies   []int
	inFlight int
	most     int
	arrived  chan struct{}
	release  chan struct{}
}

func (u *unitsUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.inFlight++
	u.most = max(u.most, u.inFlight)
	if r.Method == http.MethodPost {
		u.bodies = append(u.bodies, len(b))
	}
	u.mu.Unlock()
	defer func() {
		u.mu.Lock()
		u.inFlight--
		u.mu.Unlock()
	}()
	if r.URL.Path == "/slow" {
		u.arrived <- struct{}{}
		<-u.release
	}
	w.Header().Set("RateLimit-Policy", `"upload";q=1000;qu="content-bytes";w=60, "conc";q=2;qu="concurrent-requests"`)
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"ok":true}`)
}

func (u *unitsUpstream) received() (bodies []int, most int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]int(nil), u.bodies...), u.most
}

// post sends a REST POST of n bytes as token.
func post(t *testing.T, url, token string, n int) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(strings.Repeat("x", n)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Prefer", "wait=0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestUnitsEndToEnd runs an upstream that announces a quota of 1,000
// content-bytes a minute and of 2 concurrent requests, and calls it
// through both sides of `serve`: REST (a sync job) and the fetch tool (an
// agent over the official go-sdk client). The bodies' bytes spend the
// byte quota, whoever sends them, and the third call while two are in
// flight waits for one of them to end; the advice names the unit that
// binds.
func TestUnitsEndToEnd(t *testing.T) {
	up := &unitsUpstream{arrived: make(chan struct{}, 4), release: make(chan struct{})}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	key := demoKey(srv.URL+"/", 1000, time.Minute)
	key.Methods, key.MaxRate = []string{"GET", "POST"}, 1000
	s := newSetup(t, key)
	base, logs := s.serve(t)
	agent := httpSession(t, base, agentToken, nil)

	// The first answer announces the policies.
	resp := get(t, base+"/k/demo/info", syncToken)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /info: %d\n%s", resp.StatusCode, logs)
	}

	// A sync job sends 600 bytes over REST; the shared headers say what
	// is left in content-bytes.
	resp = post(t, base+"/k/demo/upload", syncToken, 600)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST 600 bytes: %d", resp.StatusCode)
	}
	if p := resp.Header.Get("RateLimit-Policy"); !strings.Contains(p, `"upload";q=1000;qu="content-bytes"`) {
		t.Errorf("RateLimit-Policy %q; want the byte policy in content-bytes", p)
	}
	if r := resp.Header.Get("RateLimit"); !strings.Contains(r, `"upload";r=400`) {
		t.Errorf("RateLimit %q; want 400 content-bytes left of upload", r)
	}

	// The agent's 500 bytes do not fit: nothing is sent, and the advice
	// says it is the bytes.
	res, out := call(t, agent, "fetch", map[string]any{"method": "POST", "path": "/upload", "body": strings.Repeat("y", 500), "max_wait_s": 0})
	advice, _ := out["advice"].(map[string]any)
	if out["sent"] != false || advice["action"] != "pause" ||
		!strings.Contains(advice["reason"].(string), "400 of 1,000 content-bytes per 60 s are left under policy 'upload', and the request carries 500") {
		t.Errorf("fetch of 500 bytes with 400 left: sent %v, advice %v\n%s", out["sent"], advice, text(res))
	}
	// 300 bytes do, and the quota it reports is in content-bytes.
	res, out = call(t, agent, "fetch", map[string]any{"method": "POST", "path": "/upload", "body": strings.Repeat("y", 300), "max_wait_s": 0})
	quota, _ := out["quota"].(map[string]any)
	if out["status"] != float64(200) || quota["unit"] != "content-bytes" || quota["remaining"] != float64(100) {
		t.Errorf("fetch of 300 bytes: status %v, quota %v; want 200 and 100 content-bytes left\n%s", out["status"], quota, text(res))
	}
	// The sync job's next 200 bytes are refused with a problem naming the
	// byte policy.
	resp = post(t, base+"/k/demo/upload", syncToken, 200)
	var problem map[string]any
	json.NewDecoder(resp.Body).Decode(&problem)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || problem["code"] != "rateLimited" ||
		!strings.Contains(problem["detail"].(string), "content-bytes") {
		t.Errorf("POST 200 bytes with 100 left: %d %v; want 429 rateLimited naming content-bytes", resp.StatusCode, problem)
	}
	if bodies, _ := up.received(); len(bodies) != 2 || bodies[0]+bodies[1] != 900 {
		t.Errorf("the upstream received bodies of %v bytes; want 600 and 300", bodies)
	}

	// Two calls held in flight take both slots of "conc".
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			resp := get(t, base+"/k/demo/slow", syncToken)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("GET /slow: %d", resp.StatusCode)
			}
		})
	}
	<-up.arrived
	<-up.arrived
	res, _ = call(t, agent, "quota_status", map[string]any{"key": "demo"})
	if !strings.Contains(text(res), "2 of 2 concurrent requests are in flight under policy 'conc'") {
		t.Errorf("quota_status with two calls in flight:\n%s\nwant it to say both slots of conc are taken", text(res))
	}
	res, out = call(t, agent, "fetch", map[string]any{"path": "/info", "max_wait_s": 0})
	advice, _ = out["advice"].(map[string]any)
	if out["sent"] != false || !strings.Contains(advice["reason"].(string), "all 2 concurrent requests allowed by policy 'conc' are in flight") {
		t.Errorf("a third call while two are in flight: sent %v, advice %v\n%s", out["sent"], advice, text(res))
	}
	// It goes once one of them ends, waiting no timer out.
	done := make(chan map[string]any, 1)
	go func() {
		_, out := call(t, agent, "fetch", map[string]any{"path": "/info", "max_wait_s": 30})
		done <- out
	}()
	close(up.release)
	select {
	case out = <-done:
		if out["status"] != float64(200) {
			t.Errorf("the call that waited for a slot: %v", out)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the call waiting for a slot did not go when the calls in flight ended")
	}
	wg.Wait()
	if _, most := up.received(); most > 2 {
		t.Errorf("the upstream held %d calls at once; its quota is 2", most)
	}
}
