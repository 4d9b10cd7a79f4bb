package dashboard_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/dashboard"
	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/gateway"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/rest"
	"github.com/mcp-quota/mcp-quota/state"
	"github.com/mcp-quota/mcp-quota/tools"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// pollsPerHour is how often an open page asks: every 2 s (app.js's
// POLL_MS), and not at all while its tab is hidden.
const pollsPerHour = 3600 / 2

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkOpenPage measures what one open dashboard costs the server
// while a sync job runs at its key's limit (600 calls per minute, through
// REST, against the demo upstream, with two windows of history in the
// state file). One op is one poll as the page makes it: the overview of
// the key (budgets, timeline, spenders, advice) and, because the sync job
// changed the activity since the last poll, the newest page of
// /v1/activity. The polls run back to back; cpu-ms/poll is the process's
// CPU time during them less what the sync job alone used over as long
// (measured first, for 3 s), per poll. The hour figures multiply by the
// page's 1800 polls an hour.
//
//	go test ./dashboard -run '^$' -bench OpenPage -benchtime 300x
func BenchmarkOpenPage(b *testing.B) {
	const quota, window = 600, time.Minute
	api := demo.New(demo.Config{Quota: quota, Window: window, Tokens: []string{secret}})
	up := httptest.NewServer(api)
	defer up.Close()
	keys, err := keystore.Parse([]byte(testkit.Keys(testkit.Key{Name: "k", BaseURL: up.URL, SecretEnv: "S", Auth: "bearer", Profile: "ietf",
		MaxRate: 1000, Policies: testkit.Window(quota, window)})), keystore.Env{Getenv: func(string) string { return secret }})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	db, err := state.Open(ctx, testkit.StateFile(b, state.Open))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	// Two windows of a sync job at the limit already in the log.
	now := time.Now()
	err = db.Update(ctx, func(tx ledger.Tx) error {
		for i := range 2 * quota {
			at := now.Add(-2*window + time.Duration(i)*window/quota)
			id, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprintf("h%05d", i), Attempt: 1, Key: "k", Caller: "sync",
				Transport: "rest", Method: "GET", Target: "/v1/echo", State: ledger.Admitted, At: at})
			if err != nil {
				return err
			}
			if err := tx.FinishAttempt(id, ledger.Confirmed, reason.Reason{Kind: reason.Answered, Status: 200}, 200, at, at.Add(5*time.Millisecond)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	p := pacer.New(db)
	client := upstream.New(p, nil)
	h := gateway.New(gateway.Config{Keys: keys, DB: db, Loopback: true,
		REST:      &rest.Handler{Keys: keys, Client: client, Pacer: p, DB: db},
		MCP:       tools.NewServer(&tools.Deps{Keys: keys, Client: client, Pacer: p, DB: db, Transport: "mcp-http"}, "bench"),
		Dashboard: dashboard.New(dashboard.Config{Keys: keys, Pacer: p, DB: db})})
	srv := httptest.NewServer(h)
	defer srv.Close()

	get := func(path string, header ...string) {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Error(err)
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}

	// The sync job: one call after another, each waiting for the budget.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var calls int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			get("/k/k/v1/echo", "Prefer", "wait=60")
			calls++
		}
	}()
	// What the sync job alone costs.
	calibrate := 3 * time.Second
	c0 := cpuTime()
	time.Sleep(calibrate)
	syncRate := float64(cpuTime()-c0) / float64(calibrate)

	b.ResetTimer()
	start, c1 := time.Now(), cpuTime()
	for range b.N {
		get("/ui/api/overview?key=k")
		get("/v1/activity?key=k&limit=50")
	}
	elapsed, cpu := time.Since(start), cpuTime()-c1
	b.StopTimer()
	close(stop)
	wg.Wait()

	page := time.Duration(float64(cpu) - syncRate*float64(elapsed))
	perPoll := page / time.Duration(b.N)
	b.ReportMetric(2, "req/poll")
	b.ReportMetric(float64(perPoll.Microseconds())/1000, "cpu-ms/poll")
	b.ReportMetric(2*pollsPerHour, "req/hour")
	b.ReportMetric((perPoll * pollsPerHour).Seconds(), "cpu-s/hour")
	b.ReportMetric(float64(calls)/(calibrate+elapsed).Seconds(), "sync-calls/s")
}
