package tools

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcp-quota/mcp-quota/keystore"
)

func TestPage(t *testing.T) {
	tests := []struct {
		name              string
		raw               string
		ct                string
		start, max        int
		complete          bool
		body              string // prefix of the page
		truncated, binary bool
		total, next       int
		marker            string // in the page
	}{
		{"whole", `{"a":1}`, "application/json", 0, 100, true, `{"a":1}`, false, false, 7, 0, ""},
		{"first page", "abcdefghij", "text/plain", 0, 4, true, "abcd", true, false, 10, 4, "start_index=4"},
		{"middle page", "abcdefghij", "text/plain", 4, 4, true, "efgh", true, false, 10, 8, "characters 4 to 8 of 10"},
		{"last page", "abcdefghij", "text/plain", 8, 4, true, "ij", false, false, 10, 0, ""},
		{"past the end", "abcdefghij", "text/plain", 10, 4, true, "[no more content", false, false, 10, 0, "10 characters"},
		{"characters, not bytes", "äöüß€", "text/plain; charset=utf-8", 1, 2, true, "öü", true, false, 5, 3, ""},
		{"cut JSON says so", `{"items":[1,2,3]}`, "application/json", 0, 5, true, `{"ite`, true, false, 17, 5, "not valid on its own"},
		{"binary type", "\x89PNG\r\n", "image/png", 0, 100, true, "[binary content: image/png, 6 bytes", false, true, 6, 0, ""},
		{"invalid UTF-8 text", "ok\xff\xfe", "text/plain", 0, 100, true, "[binary content", false, true, 4, 0, ""},
		{"read cut short", "abc", "text/plain", 0, 100, false, "abc", true, false, 3, 0, "rest was not fetched"},
		{"empty", "", "", 0, 100, true, "", false, false, 0, 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := page([]byte(tt.raw), tt.ct, tt.start, tt.max, tt.complete)
			if !strings.HasPrefix(p.body, tt.body) || p.truncated != tt.truncated || p.binary != tt.binary || p.total != tt.total || p.next != tt.next {
				t.Errorf("page = %+v; want body %q…, truncated %v, binary %v, total %d, next %d", p, tt.body, tt.truncated, tt.binary, tt.total, tt.next)
			}
			if !strings.Contains(p.body, tt.marker) {
				t.Errorf("page %q lacks %q", p.body, tt.marker)
			}
		})
	}
}

func TestNextPage(t *testing.T) {
	base, _ := url.Parse("https://api.example/v2/")
	k := &keystore.Key{Name: "k", BaseURL: base}
	tests := []struct {
		link string
		want string
	}{
		{`</v2/items?cursor=abc&limit=500>; rel="next"`, "/items?cursor=abc&limit=500"},
		{`<https://api.example/v2/items?page=3>; rel="prev", <https://api.example/v2/items?page=5>; rel="next last"`, "/items?page=5"},
		{`<https://evil.example/v2/items?page=2>; rel="next"`, ""},
		{`</other/items>; rel="next"`, ""},
		{`</v2/items?page=2>; rel="prev"`, ""},
		{`garbage`, ""},
	}
	for _, tt := range tests {
		got := nextPage(http.Header{"Link": {tt.link}}, k)
		if (got == nil && tt.want != "") || (got != nil && got.Path != tt.want) {
			t.Errorf("nextPage(%q) = %+v, want %q", tt.link, got, tt.want)
		}
	}
}

func TestSelectHeadersDropsCredentials(t *testing.T) {
	h := http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"s=1"}, "Authorization": {"Bearer x"},
		"Etag": {`"v1"`}, "X-Api-Key": {"k"}}
	got := selectHeaders(h)
	if len(got) != 2 || got["Content-Type"] != "application/json" || got["ETag"] != `"v1"` {
		t.Errorf("selectHeaders = %v, want only Content-Type and ETag", got)
	}
}

func TestExplainArguments(t *testing.T) {
	tests := []struct {
		tool string
		args any
		want string // "" means: left alone
	}{
		{"fetch", map[string]any{"path": 3}, "path must be a string"},
		{"fetch", map[string]any{}, "path is required (a string)"},
		{"fetch", map[string]any{"path": "/", "max_length": 2.5}, "max_length must be an integer"},
		{"fetch", map[string]any{"path": "/", "bogus": true}, "bogus is not an argument of fetch"},
		{"fetch", "not an object", "must be a JSON object"},
		{"quota_status", map[string]any{"key": []int{1}}, "key must be a string"},
		{"quota_status", map[string]any{"limit": "all"}, "limit must be an integer"},
		{"fetch", map[string]any{"path": "/"}, ""},
	}
	for _, tt := range tests {
		var req mcp.CallToolRequest
		req.Params.Name, req.Params.Arguments = tt.tool, tt.args
		res := mcp.NewToolResultError("input schema validation failed: <root>: &{...}")
		explainArguments(context.Background(), 1, &req, res)
		got := res.Content[0].(mcp.TextContent).Text
		switch {
		case res.StructuredContent != nil:
			t.Errorf("%v: an error result with structured content %v", tt.args, res.StructuredContent)
		case failureCode(res) != "badArguments":
			t.Errorf("%v: code %q, want badArguments", tt.args, failureCode(res))
		case tt.want == "" && !strings.HasPrefix(got, "input schema validation failed"):
			t.Errorf("%v: rewritten to %q; want the validator's words left alone", tt.args, got)
		case tt.want != "" && !strings.Contains(got, tt.want):
			t.Errorf("%v: %q, want it to say %q", tt.args, got, tt.want)
		}
	}
	// The tools' own results are never touched.
	own := failure("badPath", "Path is refused.")
	var req mcp.CallToolRequest
	req.Params.Name, req.Params.Arguments = "fetch", map[string]any{"path": 3}
	explainArguments(context.Background(), 1, &req, own)
	if own.Content[0].(mcp.TextContent).Text != "Path is refused." {
		t.Errorf("a tool's own error was rewritten: %v", own.Content)
	}
}

// TestResultCharsCountsWhatIsSent: the size fitted measures a result by
// (its structured form encoded once, at render) is the size of the JSON
// a client receives, in characters, whatever the body holds: quotes,
// markup and control characters JSON escapes, characters beyond ASCII;
// and resultFits, which spares measuring a result far below the limit,
// says what that size says, just below, at and far above it.
func TestResultCharsCountsWhatIsSent(t *testing.T) {
	bodies := []string{"", `{"a":"b"}`, "<a href=\"x\">&amp;</a>\n\t\x01", "äöü € 𝄞 \u2028", strings.Repeat(`"\`, 500)}
	for _, body := range bodies {
		for _, isError := range []bool{false, true} {
			r := fetchResult{Key: "k", Method: "GET", Path: "/p?q=<1>", Sent: true, Status: 200,
				Headers: map[string]string{"ETag": `"e&1"`}, ContentType: "text/html", Body: body, TotalLength: len(body),
				Warnings: []string{"a <warning> & more"}}
			res := render(r, isError)
			b, err := json.Marshal(res)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := resultChars(res), utf8.RuneCount(b); got != want {
				t.Errorf("body %q, isError %v: resultChars %d, want %d, the characters of %s", body, isError, got, want, b)
			}
			for _, max := range []int{utf8.RuneCount(b) - 1, utf8.RuneCount(b), 6*utf8.RuneCount(b) + 200} {
				if got, want := resultFits(res, max), utf8.RuneCount(b) <= max; got != want {
					t.Errorf("body %q, isError %v: resultFits(%d) %v for %d characters", body, isError, max, got, utf8.RuneCount(b))
				}
			}
			var sent fetchResult
			var wire struct {
				StructuredContent json.RawMessage `json:"structuredContent"`
			}
			if err := json.Unmarshal(b, &wire); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(wire.StructuredContent, &sent); err != nil || sent.Body != body || sent.Path != r.Path {
				t.Errorf("body %q: structuredContent %s reads back as %+v, %v", body, wire.StructuredContent, sent, err)
			}
		}
	}
}

// TestRenderLongHeaderKeepsWhatInvalidBytesSplitApart: a header value past
// maxHeaderShown is cut; an invalid byte in it becomes U+FFFD, as JSON
// encodes a shorter value's, so a credential an upstream split with one
// (to slip it past the scrubber) is not joined again.
func TestRenderLongHeaderKeepsWhatInvalidBytesSplitApart(t *testing.T) {
	const credential = "a-credential-of-forty-characters-0123456"
	v := "private, x=" + credential[:10] + "\xff" + credential[10:] + strings.Repeat("p", 1100)
	b, err := json.Marshal(render(fetchResult{Headers: map[string]string{"Cache-Control": v}}, false))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), credential) {
		t.Errorf("the rendered result joins the credential: %.200s", b)
	}
}
