package keystore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/ratelimit"
)

const theSecret = "sk-live-5e3f0a9c7b21d48e"

func env(vars map[string]string) Env {
	return Env{
		Getenv: func(k string) string { return vars[k] },
		ReadFile: func(name string) ([]byte, error) {
			if v, ok := vars["file:"+name]; ok {
				return []byte(v), nil
			}
			return nil, fmt.Errorf("open %s: no such file", name)
		},
	}
}

const example = `[[keys]]
name = "example"
base_url = "https://api.example.com/v2"
secret_env = "EXAMPLE_API_KEY"
auth = "header:X-Api-Key"
profile = "github"
allow_hosts = ["uploads.example.com"]
methods = ["get", "POST"]
max_rate = 5
max_concurrency = 2
low_water = 0.2
  [[keys.policies]]
  name = "default"
  quota = 120
  window = "60s"
  [[keys.policies]]
  name = "daily"
  quota = 5000
  window = "24h"
  [[keys.reserve]]
  caller = "agent"
  share = 0.2

[[keys]]
name = "other"
base_url = "http://127.0.0.1:9000"
secret_file = "/run/secret"

[[callers]]
name = "sync"
token_env = "SYNC_TOKEN"
keys = ["example"]
`

func TestParse(t *testing.T) {
	s, err := Parse([]byte(example), env(map[string]string{
		"EXAMPLE_API_KEY": theSecret, "SYNC_TOKEN": "tok-0123456789abcdef", "file:/run/secret": "other-secret\n"}))
	if err != nil {
		t.Fatal(err)
	}
	k, err := s.Key("example")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := k.BaseURL.String(), "https://api.example.com/v2/"; got != want {
		t.Errorf("base URL = %s, want %s (with its trailing slash)", got, want)
	}
	if got, want := k.Auth, (Auth{Kind: AuthHeader, Name: "X-Api-Key"}); got != want {
		t.Errorf("auth = %+v, want %+v", got, want)
	}
	if k.Profile != ratelimit.GitHub {
		t.Errorf("profile = %q, want github", k.Profile)
	}
	want := []Policy{{"default", 120, time.Minute, ratelimit.Requests}, {"daily", 5000, 24 * time.Hour, ratelimit.Requests}}
	if diff := cmp.Diff(want, k.Policies); diff != "" {
		t.Errorf("policies (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"GET", "POST"}, k.Methods); diff != "" {
		t.Errorf("methods (-want +got):\n%s", diff)
	}
	if k.MaxRate != 5 || k.MaxConcurrency != 2 || k.LowWater != 0.2 || len(k.Reserves) != 1 {
		t.Errorf("limits = %v %v %v %v, want 5 2 0.2 and one reserve", k.MaxRate, k.MaxConcurrency, k.LowWater, k.Reserves)
	}
	if sec, err := k.Credential(); err != nil || sec.Reveal() != theSecret {
		t.Errorf("credential = %v, %v", sec, err)
	}
	if !k.AllowsHost("UPLOADS.example.com") || !k.AllowsHost("api.example.com") || k.AllowsHost("evil.example") {
		t.Error("AllowsHost does not follow base_url and allow_hosts")
	}
	if k.ReadOnly() {
		t.Error("a key that allows POST is not read-only")
	}
	other, _ := s.Key("other")
	if sec, _ := other.Credential(); sec.Reveal() != "other-secret" {
		t.Errorf("secret_file credential = %q, want it trimmed", sec.Reveal())
	}
	if other.Auth.Kind != AuthBearer || other.Profile != ratelimit.Generic || !other.ReadOnly() {
		t.Errorf("defaults: auth %v profile %v read-only %v; want bearer, generic, read-only", other.Auth, other.Profile, other.ReadOnly())
	}
	c, ok := s.Authenticate("tok-0123456789abcdef")
	if !ok || c.Name != "sync" || !c.MayUse("example") || c.MayUse("other") {
		t.Errorf("Authenticate = %v, %v; want sync, allowed only example", c, ok)
	}
	if _, ok := s.Authenticate("tok-0123456789abcdeX"); ok {
		t.Error("a wrong token authenticated")
	}
	if _, ok := s.Authenticate(""); ok {
		t.Error("an empty token authenticated")
	}
}

func TestKeyLookup(t *testing.T) {
	one, err := Parse([]byte(`[[keys]]
name = "only"
base_url = "https://a.example"
auth = "none"`), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if k, err := one.Key(""); err != nil || k.Name != "only" {
		t.Errorf(`Key("") with one key = %v, %v; want it`, k, err)
	}
	two, err := Parse([]byte(example), env(map[string]string{"SYNC_TOKEN": "tok-0123456789abcdef"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", "missing"} {
		if _, err := two.Key(name); !errors.Is(err, ErrUnknownKey) || !strings.Contains(err.Error(), "example, other") {
			t.Errorf("Key(%q) = %v; want ErrUnknownKey naming the keys", name, err)
		}
	}
	if _, err := (&Store{}).Key(""); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("Key on an empty store = %v, want ErrUnknownKey", err)
	}
}

func TestMissingCredentialIsKept(t *testing.T) {
	s, err := Parse([]byte(`[[keys]]
name = "k"
base_url = "https://a.example"
secret_env = "NOT_SET"`), env(nil))
	if err != nil {
		t.Fatalf("a missing credential must not stop the configuration: %v", err)
	}
	k, _ := s.Key("k")
	if _, err := k.Credential(); !errors.Is(err, ErrNoCredential) || !strings.Contains(err.Error(), "NOT_SET is not set") {
		t.Errorf("Credential() = %v; want ErrNoCredential naming the variable", err)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, config string
		line         int
		field, says  string
	}{
		{"syntax", "[[keys]]\nname = \"a\"\nbase_url = https://x\n", 3, "", ""},
		{"unknown field", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\npolcies = 3\n", 5, "keys[0].polcies", "unknown field polcies: did you mean policies?"},
		{"[[key]]", "[[key]]\nname = \"a\"\n", 1, "key", "unknown table [[key]]: did you mean [[keys]]?"},
		{"caller token", "[[callers]]\nname = \"c\"\ntoken = \"x\"\nkeys = [\"*\"]\n", 3, "callers[0].token", "did you mean token_env or token_file"},
		{"unknown field, no near name", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\ncolour = 3\n", 5, "keys[0].colour", "the fields here are name, base_url"},
		{"quoted number", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\n  [[keys.policies]]\n  quota = \"120\"\n  window = \"1m\"\n", 6, "keys[0].policies[0].quota",
			"quota must be a whole number, not text in quotes: write quota = 120, without quotes"},
		{"number for text", "[[keys]]\nname = 7\nbase_url = \"https://x\"\nauth = \"none\"\n", 2, "keys[0].name", `write name = "7", in quotes`},
		{"text for a list", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\nmethods = \"GET\"\n", 5, "keys[0].methods", `write methods = ["GET"]`},
		{"inline secret", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nsecret = \"s\"\n", 4, "keys[0].secret", "never written in the configuration"},
		{"bad url", "[[keys]]\nname = \"a\"\nbase_url = \"ftp://x\"\nauth = \"none\"\n", 3, "keys[0].base_url", "absolute http(s) URL"},
		{"url with credentials", "[[keys]]\nname = \"a\"\nbase_url = \"https://u:p@x\"\nauth = \"none\"\n", 3, "keys[0].base_url", "without credentials"},
		{"bad auth", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"basic\"\n", 4, "keys[0].auth", "bearer, header:NAME"},
		{"bad profile", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\nprofile = \"nope\"\n", 5, "keys[0].profile", ""},
		{"misspelt profile", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\nprofile = \"githbu\"\n", 5, "keys[0].profile", "did you mean github?"},
		{"no credential", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\n", 1, "keys[0].secret_env", "needs a credential"},
		{"bad window", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\n  [[keys.policies]]\n  quota = 1\n  window = \"soon\"\n", 7, "keys[0].policies[0].window", "invalid duration"},
		{"second key's window", "[[keys]]\nname = \"a\"\nauth = \"none\"\nbase_url = \"https://x\"\n[[keys]]\nname = \"b\"\nauth = \"none\"\nbase_url = \"https://x\"\n  [[keys.policies]]\n  quota = 1\n  window = \"soon\"\n", 11, "keys[1].policies[0].window", "invalid duration"},
		{"no window", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\n  [[keys.policies]]\n  quota = 1\n", 5, "keys[0].policies[0].window", "window is required"},
		{"misspelt unit", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\n  [[keys.policies]]\n  quota = 1\n  window = \"1m\"\n  unit = \"content-byte\"\n", 8, "keys[0].policies[0].unit", "did you mean content-bytes?"},
		{"unknown unit", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\n  [[keys.policies]]\n  quota = 1\n  window = \"1m\"\n  unit = \"tokens\"\n", 8, "keys[0].policies[0].unit", `use "requests", "content-bytes" or "concurrent-requests"`},
		{"window of calls in flight", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\n  [[keys.policies]]\n  quota = 4\n  window = \"1m\"\n  unit = \"concurrent-requests\"\n", 7, "keys[0].policies[0].window", "leave window out"},
		{"zero quota", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\n  [[keys.policies]]\n  quota = 0\n  window = \"1m\"\n", 6, "keys[0].policies[0].quota", "positive"},
		{"duplicate key", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\n[[keys]]\nname = \"a\"\nbase_url = \"https://y\"\nauth = \"none\"\n", 6, "keys[1].name", "configured twice"},
		{"bad key name", "[[keys]]\nname = \"a b\"\nbase_url = \"https://x\"\n", 2, "keys[0].name", "not a valid key name"},
		{"reserve too big", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\n  [[keys.reserve]]\n  caller = \"agent\"\n  share = 1.5\n", 5, "keys[0].reserve[0]", "between 0 and 1"},
		{"retention shorter than a window", "retention = \"2h\"\n[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\n  [[keys.policies]]\n  quota = 1000\n  window = \"24h\"\n", 1, "retention", `write retention = "24h0m0s" or more`},
		{"retention not a duration", "retention = \"a week\"\n", 1, "retention", "invalid duration"},
		{"body memory too small", "body_memory_mib = 4\n", 1, "body_memory_mib", "outside 16 to 1048576"},
		{"caller unknown key", "[[callers]]\nname = \"c\"\ntoken_env = \"T\"\nkeys = [\"nope\"]\n", 4, "callers[0].keys[0]", `key "nope" is not configured`},
		{"caller short token", "[[callers]]\nname = \"c\"\ntoken_env = \"SHORT\"\nkeys = [\"*\"]\n", 3, "callers[0].token_env", "shorter than 16"},
		{"caller token unset", "[[callers]]\nname = \"c\"\ntoken_env = \"UNSET\"\nkeys = [\"*\"]\n", 3, "callers[0].token_env", "UNSET is not set"},
		{"bad method", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\nmethods = [\"TRACE\"]\n", 5, "keys[0].methods", "TRACE"},
		// Each bound at its edge: the value just outside is refused.
		{"url with fragment", "[[keys]]\nname = \"a\"\nbase_url = \"https://x/#top\"\nauth = \"none\"\n", 3, "keys[0].base_url", "query or fragment"},
		{"allowed host with credentials", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\nallow_hosts = [\"u@y\"]\n", 5, "keys[0].allow_hosts[0]", "not a host name"},
		{"endless max_rate", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\nmax_rate = inf\n", 5, "keys[0].max_rate", "positive number"},
		{"low water of the whole quota", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\nlow_water = 1.0\n", 5, "keys[0].low_water", "between 0 and 1"},
		{"reserve of the whole quota", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\n  [[keys.reserve]]\n  caller = \"agent\"\n  share = 1.0\n", 5, "keys[0].reserve[0]", "between 0 and 1"},
		{"reserves of the whole quota", "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\n  [[keys.reserve]]\n  caller = \"agent\"\n  share = 0.5\n  [[keys.reserve]]\n  caller = \"sync\"\n  share = 0.5\n", 5, "keys[0].reserve", "add up to 1 or more"},
		{"state timeout too long", "state_timeout = \"61s\"\n", 1, "state_timeout", "outside 100ms to 1m"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.config), env(map[string]string{"T": "long-enough-token-123", "SHORT": "short"}))
			all := configErrors(t, err)
			i := slices.IndexFunc(all, func(ce *ConfigError) bool { return tt.field == "" || ce.Field == tt.field })
			if i < 0 {
				t.Fatalf("err = %v; want a mistake in %s", err, tt.field)
			}
			if ce := all[i]; ce.Line != tt.line || !strings.Contains(ce.Msg, tt.says) {
				t.Errorf("got line %d field %q msg %q; want line %d field %q saying %q", ce.Line, ce.Field, ce.Msg, tt.line, tt.field, tt.says)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("config:%d", tt.line)) {
				t.Errorf("error %q does not name the line", err)
			}
		})
	}
}

// TestParseChecksState: the state location goes through Env.CheckState
// (the state's own check, which cmd/mcp-quota gives it), and a refusal is
// a mistake at the line of state, among the file's others; without a
// CheckState the location is kept as written.
func TestParseChecksState(t *testing.T) {
	const config = "body_memory_mib = 4\n\nstate = \"postgres://mq:hunter2@db.example/mq\"\n"
	var checked []string
	e := env(nil)
	e.CheckState = func(location string) error {
		checked = append(checked, location)
		if strings.Contains(location, "hunter2") {
			return errors.New("carries a password: remove it")
		}
		return nil
	}
	_, err := Parse([]byte(config), e)
	all := configErrors(t, err)
	i := slices.IndexFunc(all, func(ce *ConfigError) bool { return ce.Field == "state" })
	if i < 0 || len(all) != 2 {
		t.Fatalf("err = %v; want the mistakes of body_memory_mib and state", err)
	}
	if ce := all[i]; ce.Line != 3 || ce.Msg != "the state carries a password: remove it" {
		t.Errorf("got line %d msg %q; want line 3 msg %q", ce.Line, ce.Msg, "the state carries a password: remove it")
	}
	if want := []string{"postgres://mq:hunter2@db.example/mq"}; !slices.Equal(checked, want) {
		t.Errorf("CheckState got %q; want %q", checked, want)
	}

	checked = nil
	if _, err := Parse([]byte("[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\n"), e); err != nil || checked != nil {
		t.Errorf("without a state: err %v, CheckState got %q; want no error and no check", err, checked)
	}
	s, err := Parse([]byte("state = \"/var/lib/mcp-quota/state.db\"\n"), env(nil))
	if err != nil || s.State() != "/var/lib/mcp-quota/state.db" {
		t.Errorf("without CheckState: err %v, State() %q; want the location kept", err, s.State())
	}
}

// configErrors returns the mistakes err reports, failing when it is not
// a configuration error.
func configErrors(t *testing.T, err error) []*ConfigError {
	t.Helper()
	var ces ConfigErrors
	if errors.As(err, &ces) {
		return ces
	}
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want a *ConfigError", err)
	}
	return []*ConfigError{ce}
}

// TestParseReportsEveryMistake: a file with several mistakes, of shape and
// of value, in different entries, reports them all, in the order of the
// file, each with the line of its field.
func TestParseReportsEveryMistake(t *testing.T) {
	shape := `[[keys]]
name = "a"
base_url = "https://x"
auth = "none"
  [[keys.policies]]
  quota = "120"
  window = 60

[[key]]
name = "b"

[[callers]]
name = "c"
token = "x"
`
	_, err := Parse([]byte(shape), env(nil))
	got := lineFields(configErrors(t, err))
	want := []string{"6 keys[0].policies[0].quota", "9 key", "14 callers[0].token"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("shape mistakes (-want +got):\n%s\n%v", diff, err)
	}
	if !strings.HasPrefix(err.Error(), "3 mistakes in the configuration:\n  config:6: keys[0].policies[0].quota: ") {
		t.Errorf("error = %q; want it to count and list the mistakes", err)
	}

	values := `[[keys]]
name = "a b"
base_url = "ftp://x"
auth = "none"
  [[keys.policies]]
  quota = 0
  window = "1m"

[[keys]]
name = "ok"
base_url = "https://x"
auth = "digest"

[[callers]]
name = "c"
token_env = "UNSET"
keys = ["ok", "nope"]
`
	_, err = Parse([]byte(values), env(nil))
	got = lineFields(configErrors(t, err))
	want = []string{"2 keys[0].name", "3 keys[0].base_url", "6 keys[0].policies[0].quota", "12 keys[1].auth", "16 callers[0].token_env", "17 callers[0].keys[1]"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("value mistakes (-want +got):\n%s\n%v", diff, err)
	}
}

func lineFields(errs []*ConfigError) []string {
	var out []string
	for _, e := range errs {
		out = append(out, fmt.Sprintf("%d %s", e.Line, e.Field))
	}
	return out
}

// TestLoadNamesTheFile: every mistake of a file read by Load names it.
func TestLoadNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte("[[key]]\nname = \"a\"\n[[caller]]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path, env(nil))
	for _, ce := range configErrors(t, err) {
		if ce.File != path {
			t.Errorf("%v: file %q, want %q", ce, ce.File, path)
		}
	}
}

// TestSecretsNeverPrint formats every type that carries a secret in every
// way a log or error could, and looks for the secret.
func TestSecretsNeverPrint(t *testing.T) {
	s, err := Parse([]byte(example), env(map[string]string{"EXAMPLE_API_KEY": theSecret, "SYNC_TOKEN": "caller-token-9f8e7d6c5b4a"}))
	if err != nil {
		t.Fatal(err)
	}
	k, _ := s.Key("example")
	sec, _ := k.Credential()
	c, _ := s.Authenticate("caller-token-9f8e7d6c5b4a")
	var out bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&out, nil))
	for _, v := range []any{sec, &sec, *k, k, c, *c, s, *s.load()} {
		fmt.Fprintf(&out, "%v %+v %#v %s\n", v, v, v, v)
		b, _ := json.Marshal(v)
		out.Write(b)
		log.Info("carrier", "value", v)
	}
	log.Info("secret", "secret", sec)
	for _, leak := range []string{theSecret, "caller-token-9f8e7d6c5b4a"} {
		if strings.Contains(out.String(), leak) {
			t.Errorf("a secret was printed:\n%s", out.String())
		}
	}
	if !strings.Contains(out.String(), "[redacted]") {
		t.Error("the redaction never showed: was anything printed?")
	}
}

// FuzzParse: no configuration makes Parse panic, and every mistake it
// reports is a *ConfigError with a message.
func FuzzParse(f *testing.F) {
	f.Add(example)
	f.Add("[[key]]\nname = \"a\"\n")
	f.Add("[[keys]]\nname = 7\n  [[keys.policies]]\n  quota = \"120\"\n  window = 60\n")
	f.Add("keys = 3\ncallers = [1, \"x\"]\n")
	f.Add("[keys]\nname = \"a\"\n[[callers]]\ntoken = 1\nkeys = \"demo\"\n")
	f.Add("[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\nreserve = [{caller = \"a\", share = 2}]\n")
	f.Fuzz(func(t *testing.T, config string) {
		s, err := Parse([]byte(config), env(map[string]string{"T": "long-enough-token-123"}))
		if err == nil {
			if s == nil {
				t.Fatal("no store and no error")
			}
			return
		}
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Msg == "" {
			t.Fatalf("err = %#v, want a *ConfigError with a message", err)
		}
	})
}

func TestBodyMemory(t *testing.T) {
	for _, tt := range []struct {
		config string
		want   int64
	}{
		{"", 0}, // the client's default
		{"body_memory_mib = 256\n", 256 << 20},
	} {
		s, err := Parse([]byte(tt.config), Env{Getenv: func(string) string { return "" }})
		if err != nil {
			t.Fatalf("%q: %v", tt.config, err)
		}
		if got := s.BodyMemory(); got != tt.want {
			t.Errorf("%q: BodyMemory() = %d, want %d", tt.config, got, tt.want)
		}
	}
}

// TestTLSFiles: tls_cert and tls_key are read together; one alone is an
// error naming both.
func TestTLSFiles(t *testing.T) {
	env := Env{Getenv: func(string) string { return "" }}
	s, err := Parse([]byte("tls_cert = \"/etc/q/tls.crt\"\ntls_key = \"/etc/q/tls.key\"\n"), env)
	if err != nil {
		t.Fatal(err)
	}
	if cert, key := s.TLS(); cert != "/etc/q/tls.crt" || key != "/etc/q/tls.key" {
		t.Errorf("TLS() = %q, %q", cert, key)
	}
	_, err = Parse([]byte("tls_cert = \"/etc/q/tls.crt\"\n"), env)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "tls_cert" || !strings.Contains(err.Error(), "tls_key") {
		t.Errorf("tls_cert alone: %v; want a ConfigError naming tls_cert and tls_key", err)
	}
}

func TestRetention(t *testing.T) {
	window := func(w string) string {
		return "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\n  [[keys.policies]]\n  quota = 1000\n  window = \"" + w + "\"\n"
	}
	for _, tt := range []struct {
		config string
		want   time.Duration
	}{
		{"", DefaultRetention},
		{"retention = \"72h\"\n", 72 * time.Hour},
		{"retention = 7200\n", 2 * time.Hour},
		// Unwritten beside a documented window longer than the default:
		// the window and an hour more, so the sweep never takes a call the
		// window still counts.
		{window("720h"), 721 * time.Hour},
		{window("24h"), DefaultRetention},
		{"retention = \"800h\"\n" + window("720h"), 800 * time.Hour},
	} {
		s, err := Parse([]byte(tt.config), Env{Getenv: func(string) string { return "" }})
		if err != nil {
			t.Fatalf("%q: %v", tt.config, err)
		}
		if got := s.Retention(); got != tt.want {
			t.Errorf("%q: Retention() = %v, want %v", tt.config, got, tt.want)
		}
	}
}
