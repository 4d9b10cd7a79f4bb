package keystore

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const sharedKey = `
[[keys]]
name = "shared"
base_url = "https://api.example.com/"
auth = "none"
  [[keys.policies]]
  quota = 120
  window = "60s"
  [[keys.share]]                 # no one more than 40% of the key
  principal = "*"
  share = 0.4
  [[keys.share]]
  principal = "nightly-sync"
  share = 0.2
`

func TestParseShares(t *testing.T) {
	s, err := Parse([]byte(sharedKey), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	k, err := s.Key("shared")
	if err != nil {
		t.Fatal(err)
	}
	want := []Share{{Principal: "*", Share: 0.4}, {Principal: "nightly-sync", Share: 0.2}}
	if diff := cmp.Diff(k.Shares, want); diff != "" {
		t.Errorf("shares (-got +want):\n%s", diff)
	}
	if !k.Fair() {
		t.Error("a key with shares is not fair")
	}
	for _, tt := range []struct {
		caller string
		share  float64
		capped bool
	}{
		{"nightly-sync", 0.2, true},
		{"alice@example.com via Claude.ai", 0.4, true}, // every principal's
	} {
		if got, capped := k.ShareOf(PrincipalOf(tt.caller)); got != tt.share || capped != tt.capped {
			t.Errorf("ShareOf(%q) = %v, %v; want %v, %v", tt.caller, got, capped, tt.share, tt.capped)
		}
	}
	other := &Key{Shares: []Share{{Principal: "bob", Share: 0.5}}}
	if got, capped := other.ShareOf("carol"); got != 1 || capped {
		t.Errorf("a principal without a share: got %v, %v; want 1 (a whole), not capped", got, capped)
	}
}

func TestPrincipalOf(t *testing.T) {
	for caller, want := range map[string]string{
		"alice@example.com via Claude.ai": "alice@example.com",
		"alice@example.com":               "alice@example.com",
		"nightly-sync":                    "nightly-sync",
	} {
		if got := PrincipalOf(caller); got != want {
			t.Errorf("PrincipalOf(%q) = %q, want %q", caller, got, want)
		}
	}
}

func TestParseSharesMistakes(t *testing.T) {
	head := "[[keys]]\nname = \"a\"\nbase_url = \"https://x\"\nauth = \"none\"\n"
	for _, tt := range []struct {
		name, config, field, says string
	}{
		{"no principal", head + "  [[keys.share]]\n  share = 0.4\n", "keys[0].share[0]", `or "*" for every principal`},
		{"too big", head + "  [[keys.share]]\n  principal = \"*\"\n  share = 1.5\n", "keys[0].share[0]", "between 0 and 1"},
		{"zero", head + "  [[keys.share]]\n  principal = \"*\"\n  share = 0\n", "keys[0].share[0]", "between 0 and 1"},
		{"names a client", head + "  [[keys.share]]\n  principal = \"alice via Claude.ai\"\n  share = 0.2\n", "keys[0].share[0]", `write "alice"`},
		{"twice", head + "  [[keys.share]]\n  principal = \"bob\"\n  share = 0.2\n  [[keys.share]]\n  principal = \"bob\"\n  share = 0.3\n", "keys[0].share[1]", "two shares"},
		{"misspelt", head + "  [[keys.shares]]\n  principal = \"bob\"\n  share = 0.2\n", "", "did you mean share"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.config), env(nil))
			all := configErrors(t, err)
			i := slices.IndexFunc(all, func(ce *ConfigError) bool { return tt.field == "" || ce.Field == tt.field })
			if i < 0 {
				t.Fatalf("err = %v; want a mistake in %s", err, tt.field)
			}
			if !strings.Contains(all[i].Msg, tt.says) {
				t.Errorf("got %q, want it to say %q", all[i].Msg, tt.says)
			}
		})
	}
}
