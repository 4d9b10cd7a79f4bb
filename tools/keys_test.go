package tools

import (
	"testing"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
)

// parseKeys is the key store cfg describes, every caller's token set.
func parseKeys(t testing.TB, cfg testkit.Config) *keystore.Store {
	t.Helper()
	keys, err := keystore.Parse([]byte(cfg.TOML()), keystore.Env{Getenv: func(string) string { return "tools-test-token-0123456789" }})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// openKey is a key of the tools' tests: no credential, no policy.
func openKey(name string) testkit.Key {
	return testkit.Key{Name: name, BaseURL: "https://api.example.com", Auth: "none"}
}
