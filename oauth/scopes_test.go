package oauth

import (
	"slices"
	"testing"
)

func TestScopesFromScp(t *testing.T) {
	for _, tc := range []struct {
		scope string
		scp   any
		want  []string
	}{
		{"mcp demo:write", nil, []string{"mcp", "demo:write"}},
		{"", "mcp demo:write", []string{"mcp", "demo:write"}},           // Entra ID
		{"", []any{"mcp", "demo:write"}, []string{"mcp", "demo:write"}}, // Okta
		{"mcp", []any{"other"}, []string{"mcp"}},
		{"", nil, nil},
	} {
		if got := scopes(tc.scope, tc.scp); !slices.Equal(got, tc.want) {
			t.Errorf("scopes(%q, %v) = %v, want %v", tc.scope, tc.scp, got, tc.want)
		}
	}
}
