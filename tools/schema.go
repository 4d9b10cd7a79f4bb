package tools

import (
	_ "embed"
	"encoding/json"

	"github.com/mark3labs/mcp-go/mcp"
)

// The tools' input and output schemas, reflected from their Go types
// (fetchArgs, statusArgs, fetchResult, report.Status) and kept here as
// the JSON mcp-go sends: reflecting them cost about a tenth of a stdio
// start's CPU, on the way to its answer to initialize. TestSchemas checks
// that they match the types, and rewrites them with -update. The output
// schemas are given to mcp-go as raw JSON: with output validation on,
// mcp-go marshals a structured schema again on every call, which cost a
// tenth of a fetch's CPU.
var (
	//go:embed schemas/fetch.json
	fetchSchema []byte
	//go:embed schemas/status.json
	statusSchema []byte
	//go:embed schemas/fetch-input.json
	fetchInput []byte
	//go:embed schemas/status-input.json
	statusInput []byte
)

func fetchOutputSchema() json.RawMessage  { return fetchSchema }
func statusOutputSchema() json.RawMessage { return statusSchema }

// rawInputSchema sets a tool's input schema from its JSON, as
// mcp.WithInputSchema does from a type.
func rawInputSchema(schema json.RawMessage) mcp.ToolOption {
	return func(t *mcp.Tool) {
		t.InputSchema.Type = ""
		t.RawInputSchema = schema
	}
}
