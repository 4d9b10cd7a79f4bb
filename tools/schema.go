package tools

import (
	"encoding/json"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcp-quota/mcp-quota/report"
)

// The tools' output schemas, each reflected from its Go type once and
// given to mcp-go as raw JSON (the bytes it would send for the structured
// form): with output validation on, mcp-go marshals a structured schema
// again on every call, which cost a tenth of a fetch's CPU.
var (
	fetchOutputSchema  = sync.OnceValue(func() json.RawMessage { return rawSchema(mcp.WithOutputSchema[fetchResult]()) })
	statusOutputSchema = sync.OnceValue(func() json.RawMessage { return rawSchema(mcp.WithOutputSchema[report.Status]()) })
)

// rawSchema returns the output schema opt sets on a tool, as JSON.
func rawSchema(opt mcp.ToolOption) json.RawMessage {
	raw, err := json.Marshal(mcp.NewTool("", opt).OutputSchema)
	if err != nil {
		panic("tools: an output schema does not marshal: " + err.Error())
	}
	return raw
}
