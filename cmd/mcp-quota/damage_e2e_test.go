package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// TestDamagedStateFailsClosed: serve runs on a state file whose
// write-ahead log is then damaged under it (every frame's page
// overwritten). Once it has found the damage (here, by a read of the
// activity), no call is sent upstream: each is answered 503
// stateUnavailable, as when the database cannot be reached, and /healthz
// says the file is damaged and what to do.
func TestDamagedStateFailsClosed(t *testing.T) {
	var sent atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent.Add(1)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(up.Close)
	// The calls only fill the log: MaxRate lets them go as fast as they
	// come, not spread 100 ms apart.
	k := demoKey(up.URL, 120, time.Minute)
	k.MaxRate = 1000
	s := newSetup(t, k)
	// A state migrated in place, not a copy of a migrated one: its schema
	// and first pages are in the log, where the damage lands in pages
	// every call reads. A copy starts with them checkpointed into the
	// file, and 5 runs in 15 found no damage to read.
	s.state = filepath.Join(t.TempDir(), "state.db")
	base, _ := s.serve(t)
	for i := range 40 {
		resp := get(t, base+"/k/demo/items?i="+strings.Repeat("x", i), syncToken)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("call %d before the damage: %s", i, resp.Status)
		}
	}
	// Every frame: with every third, about one run in a hundred read only
	// whole pages from the log and was answered.
	n, frames := testkit.DamageWAL(t, s.state, 1)
	t.Logf("overwrote %d of %d log frames", n, frames)
	resp := get(t, base+"/v1/activity?key=demo&limit=500", syncToken)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Logf("the activity after the damage: %s (the damage is in pages it did not read)", resp.Status)
	}
	before := sent.Load()
	for i := range 6 {
		resp := get(t, base+"/k/demo/after?i="+strings.Repeat("y", i), syncToken)
		var p struct{ Code string }
		json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || p.Code != "stateUnavailable" {
			t.Errorf("call %d on the damaged state: %s %q; want 503 stateUnavailable", i, resp.Status, p.Code)
		}
	}
	if n := sent.Load() - before; n != 0 {
		t.Errorf("%d calls reached the upstream on a damaged state; want none", n)
	}
	resp = get(t, base+"/healthz", "")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "damaged") || !strings.Contains(string(body), "move") {
		t.Errorf("/healthz: %s %s; want 503 saying the file is damaged and what to do", resp.Status, body)
	}
}
