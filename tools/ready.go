package tools

import (
	"context"
	"errors"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/mcp-quota/mcp-quota/report/reason"
)

// CodeStateUnavailable is the code of a call's result when the state
// cannot be used.
const CodeStateUnavailable = "stateUnavailable"

// readyTool makes h wait for d.Ready before it runs (see Deps.Ready): a
// state that could not be opened answers the call with its reason, code
// stateUnavailable.
func (d *Deps) readyTool(h server.ToolHandlerFunc) server.ToolHandlerFunc {
	if d.Ready == nil {
		return h
	}
	return func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if err := d.Ready(ctx); err != nil {
			if ctx.Err() != nil {
				return failure("cancelled", "The call was cancelled before an answer came."), nil
			}
			return failure(CodeStateUnavailable, reason.Sentence(err.Error())), nil
		}
		return h(ctx, req)
	}
}

// readyResource is readyTool for a resource: a read fails with the
// state's reason.
func (d *Deps) readyResource(h server.ResourceTemplateHandlerFunc) server.ResourceTemplateHandlerFunc {
	if d.Ready == nil {
		return h
	}
	return func(ctx context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
		if err := d.Ready(ctx); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, errors.New(reason.Sentence(err.Error()))
		}
		return h(ctx, req)
	}
}
