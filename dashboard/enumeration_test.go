package dashboard_test

import (
	"net/http"
	"strings"
	"testing"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"
)

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// TestKeyNamesNotEnumerable: to caller a, who may use key k only, the key
// "other" (configured, another caller's) and the key "nope" (configured
// nowhere) get the same answer — status, problem code and sentence, the
// name asked for aside — on REST, over MCP (fetch, quota_status, the
// activity resource) and from the dashboard's API.
func TestKeyNamesNotEnumerable(t *testing.T) {
	base, _ := server(t, true)
	c := browser(t)
	auth := []string{"Authorization", "Bearer " + tokenA}
	same := func(what string, answer func(name string) string) {
		t.Helper()
		other := strings.ReplaceAll(answer("other"), "other", "NAME")
		nope := strings.ReplaceAll(answer("nope"), "nope", "NAME")
		if other != nope {
			t.Errorf("%s: another caller's key and an unknown one are told apart:\n  other: %s\n  nope:  %s", what, other, nope)
		}
	}
	for _, path := range []string{"/k/%s/x", "/v1/quota?key=%s", "/v1/activity?key=%s", "/ui/api/call?key=%s&call=1"} {
		same("GET "+path, func(name string) string {
			resp, body := do(t, c, "GET", base+strings.Replace(path, "%s", name, 1), auth...)
			return resp.Status + " " + body
		})
	}

	client := gomcp.NewClient(&gomcp.Implementation{Name: "enumerator", Version: "1"}, nil)
	sess, err := client.Connect(t.Context(), &gomcp.StreamableClientTransport{Endpoint: base + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{tokenA}}, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { sess.Close() })
	for _, tool := range []string{"fetch", "quota_status"} {
		same("MCP "+tool, func(name string) string {
			res, err := sess.CallTool(t.Context(), &gomcp.CallToolParams{Name: tool, Arguments: map[string]any{"key": name, "path": "/x"}})
			if err != nil {
				return err.Error()
			}
			var text []string
			for _, c := range res.Content {
				if tc, ok := c.(*gomcp.TextContent); ok {
					text = append(text, tc.Text)
				}
			}
			if !res.IsError {
				t.Errorf("%s of key %q: not an error", tool, name)
			}
			return strings.Join(text, "\n")
		})
	}
	same("MCP resources/read", func(name string) string {
		_, err := sess.ReadResource(t.Context(), &gomcp.ReadResourceParams{URI: "quota://activity/" + name})
		if err == nil {
			t.Errorf("reading the activity of key %q: no error", name)
			return ""
		}
		return err.Error()
	})
}
