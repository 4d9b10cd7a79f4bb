package tools

import (
	_ "embed"
	"encoding/json"
)

// The tools' output schemas, reflected from their Go types (fetchResult,
// report.Status) and kept here as the JSON mcp-go sends: reflecting them
// cost a twelfth of a stdio start's CPU, on the way to its answer to
// initialize. TestOutputSchemas checks that they match the types, and
// rewrites them with -update. They are given to mcp-go as raw JSON: with
// output validation on, mcp-go marshals a structured schema again on
// every call, which cost a tenth of a fetch's CPU.
var (
	//go:embed schemas/fetch.json
	fetchSchema []byte
	//go:embed schemas/status.json
	statusSchema []byte
)

func fetchOutputSchema() json.RawMessage  { return fetchSchema }
func statusOutputSchema() json.RawMessage { return statusSchema }
