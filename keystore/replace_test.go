package keystore

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func parse(t *testing.T, cfg string, vars map[string]string) *Store {
	t.Helper()
	s, err := Parse([]byte(cfg), env(vars))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const replaceOld = `[[keys]]
name = "a"
base_url = "https://api.example.com"
secret_env = "A"
  [[keys.policies]]
  name = "default"
  quota = 10
  window = "60s"

[[callers]]
name = "job"
token_env = "JOB"
keys = ["a"]
`

const replaceNew = `[[keys]]
name = "a"
base_url = "https://api.example.com"
secret_env = "A"
  [[keys.policies]]
  name = "default"
  quota = 20
  window = "60s"

[[keys]]
name = "b"
base_url = "https://api.example.org"
secret_env = "B"

[[callers]]
name = "job2"
token_env = "JOB"
keys = ["a", "b"]
`

// TestReplace: a Store replaced shows the new configuration to every
// lookup from then on; what a call resolved before stays as it was.
func TestReplace(t *testing.T) {
	s := parse(t, replaceOld, map[string]string{"A": "old-secret-0123456789", "JOB": "job-token-0123456789"})
	inFlight, err := s.Key("a")
	if err != nil {
		t.Fatal(err)
	}
	n := parse(t, replaceNew, map[string]string{"A": "new-secret-9876543210", "B": "b-secret-9876543210", "JOB": "job-token-0123456789"})
	s.Replace(n)

	if got := inFlight.Policies[0].Quota; got != 10 {
		t.Errorf("the key a call resolved before: quota %d, want 10 (its configuration when it started)", got)
	}
	if sec, _ := inFlight.Credential(); sec.Reveal() != "old-secret-0123456789" {
		t.Error("the key a call resolved before changed its credential")
	}
	a, err := s.Key("a")
	if err != nil {
		t.Fatal(err)
	}
	if a.Policies[0].Quota != 20 {
		t.Errorf("a new lookup: quota %d, want 20", a.Policies[0].Quota)
	}
	if sec, _ := a.Credential(); sec.Reveal() != "new-secret-9876543210" {
		t.Error("a new lookup does not see the re-read credential")
	}
	if _, err := s.Key("b"); err != nil {
		t.Errorf("the new key b: %v", err)
	}
	if c, ok := s.Authenticate("job-token-0123456789"); !ok || c.Name != "job2" {
		t.Errorf("Authenticate after Replace = %v, %v; want job2", c, ok)
	}
	if got := strings.Join(s.KeyNames(), ","); got != "a,b" {
		t.Errorf("KeyNames = %s, want a,b", got)
	}
}

// TestScrubHandlerAdd: after a reload the logs lose neither the old
// credentials (calls in flight) nor the new ones.
func TestScrubHandlerAdd(t *testing.T) {
	old := parse(t, replaceOld, map[string]string{"A": "old-secret-0123456789", "JOB": "job-token-0123456789"})
	n := parse(t, replaceNew, map[string]string{"A": "new-secret-9876543210", "B": "b-secret-9876543210", "JOB": "job-token-0123456789"})
	var out bytes.Buffer
	h := NewScrubHandler(slog.NewTextHandler(&out, nil))
	h.Add(old)
	h.Add(n)
	slog.New(h).Info("line", "a", "old-secret-0123456789", "b", "new-secret-9876543210 b-secret-9876543210")
	for _, s := range []string{"old-secret", "new-secret", "b-secret"} {
		if strings.Contains(out.String(), s) {
			t.Errorf("log holds %s…: %s", s, out.String())
		}
	}
}
