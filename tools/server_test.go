package tools

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// TestOutputCheck: a server made with Deps whose SkipOutputCheck is false
// (tests) answers a result whose structuredContent does not conform to
// its tool's outputSchema as an isError result naming the violation; one
// made with SkipOutputCheck (the commands) sends the result as it is.
func TestOutputCheck(t *testing.T) {
	keys := parseKeys(t, testkit.Config{Keys: []testkit.Key{openKey("mine")}})
	// A tool whose answer breaks its own schema: n must be an integer.
	odd := mcp.NewTool("odd", mcp.WithRawOutputSchema(json.RawMessage(
		`{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`)))
	answer := func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultStructured(map[string]any{"n": "not a number"}, "n is not a number"), nil
	}
	const call = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"odd","arguments":{}}}`
	for _, skip := range []bool{false, true} {
		s := NewServer(&Deps{Keys: keys, SkipOutputCheck: skip}, "test")
		s.AddTool(odd, answer)
		out, err := json.Marshal(s.HandleMessage(context.Background(), json.RawMessage(call)))
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Result struct {
				IsError           bool           `json:"isError"`
				StructuredContent map[string]any `json:"structuredContent"`
			} `json:"result"`
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		checked := got.Result.IsError && got.Result.StructuredContent == nil
		if checked == skip {
			t.Errorf("SkipOutputCheck %v: got %s; want the result checked: %v", skip, out, !skip)
		}
		if skip && got.Result.StructuredContent["n"] != "not a number" {
			t.Errorf("SkipOutputCheck: got %s; want the structuredContent as the tool gave it", out)
		}
	}
}
