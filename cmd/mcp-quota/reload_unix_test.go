//go:build unix

package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// written tells of every write to a log.
type written chan struct{}

func (w written) Write(p []byte) (int, error) {
	select {
	case w <- struct{}{}:
	default:
	}
	return len(p), nil
}

// waitFor waits until the log holds want n times (the process logs
// each reload's outcome once), or fails.
func waitFor(t *testing.T, logs *testkit.Buffer, wrote written, want string, n int) {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for strings.Count(logs.String(), want) < n {
		select {
		case <-wrote:
		case <-deadline.C:
			t.Fatalf("the log never said %q %d times:\n%s", want, n, logs.String())
		}
	}
}

// startReloadable runs the built binary's serve for s, so that the test
// can send it signals, and returns it, its log, the channel that tells of
// each write to the log, and its base URL. At the test's end it stops the
// process and checks that the log holds none of secrets.
func startReloadable(t *testing.T, s *setup, secrets ...string) (*exec.Cmd, *testkit.Buffer, written, string) {
	t.Helper()
	cmd, logs := s.command(t, "serve", "--listen", "127.0.0.1:0", "--drain-delay", "0", "--log-level", "info")
	wrote := make(written, 1)
	cmd.Stderr = io.MultiWriter(logs, wrote)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		for _, secret := range secrets {
			if strings.Contains(logs.String(), secret) {
				t.Errorf("the log holds a secret")
			}
		}
	})
	sc := bufio.NewScanner(out)
	re := regexp.MustCompile(`(http://127\.0\.0\.1:\d+)/mcp`)
	base := ""
	for base == "" && sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			base = m[1]
		}
	}
	if base == "" {
		t.Fatalf("serve did not start:\n%s", logs.String())
	}
	go io.Copy(io.Discard, out)
	return cmd, logs, wrote, base
}

// TestReloadOnSIGHUP runs the built binary, edits its configuration and
// sends SIGHUP: a new key and a caller's new access take effect without
// a restart; a bad edit is refused whole, logged and shown by /healthz,
// and the running configuration keeps serving.
func TestReloadOnSIGHUP(t *testing.T) {
	_, url := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(url, 120, time.Minute))
	cmd, logs, wrote, base := startReloadable(t, s, upstreamSecret, agentToken, syncToken)

	status := func(path string) int {
		resp := get(t, base+path, syncToken)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := status("/k/second/v1/participants"); got == http.StatusOK {
		t.Fatalf("GET /k/second before the edit: %d, want a refusal (no such key)", got)
	}
	edited := demoConfig(demoKey(url, 120, time.Minute),
		testkit.Key{Name: "second", BaseURL: url, SecretEnv: "DEMO_SECRET", Profile: "ietf"})
	for i := range edited.Callers {
		edited.Callers[i].Keys = []string{"demo", "second"}
	}
	s.write(t, edited)
	cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, logs, wrote, "configuration reloaded", 1)
	if got := status("/k/second/v1/participants"); got != http.StatusOK {
		t.Fatalf("GET /k/second after the reload: %d, want 200", got)
	}

	// A bad edit: refused whole, the running configuration stays.
	bad := strings.ReplaceAll(edited.TOML(), `name = "second"`, `name = "third"
window = 5`)
	if err := os.WriteFile(s.config, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, logs, wrote, "the configuration was not reloaded", 1)
	if got := status("/k/second/v1/participants"); got != http.StatusOK {
		t.Errorf("GET /k/second after a refused reload: %d, want 200 (the running configuration)", got)
	}
	resp := get(t, base+"/healthz", "")
	defer resp.Body.Close()
	var h struct {
		Status string
		Config struct {
			Loaded string
			Reload struct{ Refused, Error string }
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	if h.Status != "ok" || h.Config.Reload.Refused == "" || !strings.Contains(h.Config.Reload.Error, "window") {
		t.Errorf("/healthz = %+v, want ok with the refused reload and its error", h)
	}

	// Fixed again: the detail clears.
	s.write(t, edited)
	cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, logs, wrote, "configuration reloaded", 2)
	resp2 := get(t, base+"/healthz", "")
	defer resp2.Body.Close()
	var h2 map[string]any
	json.NewDecoder(resp2.Body).Decode(&h2)
	if c, _ := h2["config"].(map[string]any); c == nil || c["reload"] != nil {
		t.Errorf("/healthz after a good reload = %v, want no refused reload", h2)
	}
}

// TestReloadInFlight: a call in flight when the configuration is
// reloaded finishes with the credential it started with; the next call
// goes with the credential the reload read again from its file.
func TestReloadInFlight(t *testing.T) {
	arrived := make(chan string, 4)
	release := make(chan struct{})
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- r.Header.Get("Authorization")
		if r.URL.Path == "/slow" {
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	}))
	defer api.Close()
	defer close(release)

	dir := t.TempDir()
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, []byte("old-secret-5e1d2c3b4a"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &setup{dir: dir, config: filepath.Join(dir, "config.toml"), state: filepath.Join(dir, "state.db"),
		env: []string{"SYNC_TOKEN=" + syncToken}}
	s.write(t, testkit.Config{
		Keys:    []testkit.Key{{Name: "demo", BaseURL: api.URL, SecretFile: secretFile, Profile: "ietf"}},
		Callers: []testkit.Caller{{Name: "sync", TokenEnv: "SYNC_TOKEN", Keys: []string{"demo"}}},
	})
	cmd, logs, wrote, base := startReloadable(t, s, "old-secret-5e1d2c3b4a", "new-secret-6f2e3d4c5b", syncToken)

	slow := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, base+"/k/demo/slow", nil)
		req.Header.Set("Authorization", "Bearer "+syncToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			slow <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		slow <- resp.StatusCode
	}()
	if got := <-arrived; got != "Bearer old-secret-5e1d2c3b4a" {
		t.Fatalf("the first call reached the upstream with %q, want the old secret", got)
	}
	// While it is in flight: a new secret in the file, and a reload.
	if err := os.WriteFile(secretFile, []byte("new-secret-6f2e3d4c5b"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, logs, wrote, "configuration reloaded", 1)
	release <- struct{}{}
	if got := <-slow; got != http.StatusOK {
		t.Fatalf("the call in flight during the reload: %d, want 200", got)
	}
	resp := get(t, base+"/k/demo/fast", syncToken)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if got := <-arrived; got != "Bearer new-secret-6f2e3d4c5b" || resp.StatusCode != http.StatusOK {
		t.Errorf("the call after the reload: %d, reached the upstream with %q; want 200 with the new secret", resp.StatusCode, got)
	}
}
