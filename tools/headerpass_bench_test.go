package tools

import (
	"encoding/json"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
)

// BenchmarkHeaderPass measures what mcp-go (v1.2.1) does on every
// tools/call over Streamable HTTP before the handler runs: it looks for
// x-mcp-header bindings in the called tool's input schema
// (mcp.ValidateParamHeadersLookup), encoding and decoding the schema again
// each time, even when it is given as raw JSON. The cost follows the
// schema's size: fetch's (with the descriptions the model reads) against a
// schema of one property, as the bare tool of BenchmarkFetch has.
func BenchmarkHeaderPass(b *testing.B) {
	params := json.RawMessage(`{"name":"fetch","arguments":{"key":"demo","path":"/items/1"}}`)
	none := func(string) (string, bool) { return "", false }
	for _, tc := range []struct {
		name   string
		schema json.RawMessage
	}{
		{"fetch", fetchInput},
		{"one-property", json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`)},
	} {
		tool := mcp.NewTool("fetch", rawInputSchema(tc.schema))
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.schema)))
			b.ReportAllocs()
			for b.Loop() {
				if err := mcp.ValidateParamHeadersLookup(none, &tool, params); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
