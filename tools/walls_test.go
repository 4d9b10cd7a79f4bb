package tools

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
)

// TestFetchDescriptionFollowsTheCallersKeys lists the tools and calls
// fetch as a caller whose keys change with a reload: the fetch tool is
// described with the keys the caller may use now, the one it may no
// longer use is not named, and one newly granted answers a call. The
// description is made once per set of keys and kept, so this is what
// keeps it honest across a reload.
func TestFetchDescriptionFollowsTheCallersKeys(t *testing.T) {
	parse := func(keys []string) *keystore.Store {
		t.Helper()
		cfg := testkit.Config{
			Keys: []testkit.Key{
				{Name: "alpha", BaseURL: "http://127.0.0.1:9", Auth: "none"},
				{Name: "beta", BaseURL: "http://127.0.0.1:9", Auth: "none"},
			},
			Callers: []testkit.Caller{{Name: "me", TokenEnv: "ME", Keys: keys}},
		}.TOML()
		s, err := keystore.Parse([]byte(cfg), keystore.Env{Getenv: func(string) string { return "tools-test-token-0123456789" }})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	keys := parse([]string{"alpha"})
	s := NewServer(&Deps{Keys: keys}, "test")
	describe := func() string {
		t.Helper()
		ctx := keystore.WithCaller(context.Background(), keys.Callers()[0])
		out, _ := json.Marshal(s.HandleMessage(ctx, []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)))
		var list struct {
			Result struct {
				Tools []struct{ Name, Description string }
			}
		}
		if err := json.Unmarshal(out, &list); err != nil {
			t.Fatal(err)
		}
		for _, tool := range list.Result.Tools {
			if tool.Name == "fetch" {
				return tool.Description
			}
		}
		t.Fatalf("no fetch tool in %s", out)
		return ""
	}
	for _, step := range []struct {
		keys      []string
		want, not []string
	}{
		{[]string{"alpha"}, []string{"(alpha)"}, []string{"beta"}},
		{[]string{"beta"}, []string{"(beta)"}, []string{"alpha"}},
		{[]string{"alpha", "beta"}, []string{"(alpha, beta)"}, nil},
		{[]string{"alpha"}, []string{"(alpha)"}, []string{"beta"}},
	} {
		keys.Replace(parse(step.keys))
		got := describe()
		for _, w := range step.want {
			if !strings.Contains(got, w) {
				t.Errorf("keys %q: fetch described as %q; want it to name %s", step.keys, got, w)
			}
		}
		for _, n := range step.not {
			if strings.Contains(got, n) {
				t.Errorf("keys %q: fetch described as %q; want no %s", step.keys, got, n)
			}
		}
	}
}
