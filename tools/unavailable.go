package tools

import (
	"context"
	"errors"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// CodeStateUnavailable is the code of every result of a server made by
// NewUnavailableServer for a state file that cannot be used.
const CodeStateUnavailable = "stateUnavailable"

// NewUnavailableServer returns an MCP server for a process that cannot do
// its work — its state file cannot be opened — but must still answer: an
// assistant starts "mcp-quota stdio" itself and shows the user little of
// its stderr, so a process that exits is a server that silently fails.
// The server answers initialize, lists fetch and quota_status, and answers
// every call with an isError result carrying message (one sentence that
// says what is wrong and how to fix it) in a text block and code in _meta,
// as every error result does. Like them, it carries no structuredContent.
// Reading the activity resource fails with message.
func NewUnavailableServer(version, code, message string) *server.MCPServer {
	s := server.NewMCPServer("mcp-quota", version,
		server.WithToolCapabilities(false),
		server.WithResourceCapabilities(false, false),
		server.WithRecovery(),
		server.WithInstructions("mcp-quota cannot work right now: "+message),
	)
	answer := func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return failure(code, message), nil
	}
	unavailable := " Unavailable now: " + message
	s.AddTool(mcp.NewTool("fetch",
		mcp.WithDescription("Call an HTTP API through a configured key, at the pace its shared budget allows."+unavailable),
		mcp.WithString("key", mcp.Description("a configured key")),
		mcp.WithString("path", mcp.Description("the path below the key's base URL")),
		mcp.WithTitleAnnotation("Quota-aware HTTP fetch"),
		mcp.WithOpenWorldHintAnnotation(true),
	), answer)
	s.AddTool(mcp.NewTool("quota_status",
		mcp.WithDescription("What is left of each key's budget, per policy, and when to come back."+unavailable),
		mcp.WithString("key", mcp.Description("a configured key; omit it for every key you may use")),
		mcp.WithTitleAnnotation("Quota status"),
		mcp.WithReadOnlyHintAnnotation(true),
		mcp.WithOpenWorldHintAnnotation(false),
	), answer)
	s.AddResourceTemplate(mcp.NewResourceTemplate("quota://activity/{key}", "Key activity",
		mcp.WithTemplateDescription("The latest attempts through a key."+unavailable),
		mcp.WithTemplateMIMEType("application/json")), func(context.Context, mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
		return nil, errors.New(message)
	})
	return s
}
