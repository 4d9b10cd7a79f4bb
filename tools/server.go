// Package tools is mcp-quota's MCP face: the fetch tool (call a
// configured API through a key whose credential the model never sees, at
// a pace the key's budget allows), the quota_status tool (what is left and
// when to come back), and a resource per key with its recent activity.
package tools

import (
	"context"
	"log/slog"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// Instructions tell the model how to use the tools.
const Instructions = `mcp-quota calls HTTP APIs for you through configured keys whose budgets are shared with other callers.
Use fetch with a key and a path below the key's base URL; the credential is added for you.
Every fetch result carries quota (the tightest budget) and advice. When advice.action is "pause", do not call that key again before advice.retry_after_s seconds. When it is "slow_down", space your calls out.
Call quota_status before a burst of calls, or when unsure what is left. It never spends quota.
Prefer large pages (limit=500), updatedSince filters and webhooks over repeating the same request.`

// Deps is what the tools need. Every field is required except Log and
// Ready.
type Deps struct {
	Keys   *keystore.Store
	Client *upstream.Client
	Pacer  *pacer.Pacer
	DB     ledger.Store
	Log    *slog.Logger
	// Transport names the MCP transport in the activity: ledger.Stdio or
	// ledger.MCPHTTP.
	Transport ledger.Transport
	// LocalCaller names the caller of requests that carry none (stdio);
	// empty means "stdio".
	LocalCaller string
	// Clock is the time it reads; nil means real time.
	Clock clock.Clock
	// Limits of the fetch tool; zero values mean the documented defaults.
	Fetch FetchLimits
	// AnswerTimeout bounds each fetch's whole answer, header and body,
	// once admitted; 0 means DefaultAnswerTimeout.
	AnswerTimeout time.Duration
	// Watch, when set, adds its own hooks to the server's and returns
	// more options for it: the seam tracing hangs off. Nil means none.
	Watch func(*server.Hooks) []server.ServerOption
	// Ready, when set, is waited for by every tool call and resource read
	// before it uses Client, Pacer, DB or Now, which another goroutine may
	// set until Ready returns nil: a process then answers initialize and
	// lists the tools while its state is still being opened. An error
	// from it (the state cannot be opened) answers the call, as an isError
	// result with code stateUnavailable. Nil means the fields are set.
	Ready func(context.Context) error
	// SkipOutputCheck sends each tool result without validating its
	// structuredContent against the tool's outputSchema first. What the
	// check guards is this package's own code, which the end-to-end test
	// of every kind of result checks against the listed schemas, and a
	// client that listed the tools checks each result again; the check
	// cost a tenth of a fetch's own CPU. False (the zero value) checks
	// every result and answers one that does not conform as an isError
	// result, as tests want; the commands set it.
	SkipOutputCheck bool

	fetchTools fetchTools  // the fetch tool as each set of keys shows it (see ownKeysOnly)
	stored     storedIndex // which targets have a stored answer (see fetchCall.fromStored)
}

func (d *Deps) now() time.Time {
	return clock.Or(d.Clock).Now()
}

// NewServer returns the MCP server with both tools and the activity
// resource, arguments validated against the tools' input schemas, and
// results against their output schemas unless d.SkipOutputCheck.
func NewServer(d *Deps, version string) *server.MCPServer {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	hooks := &server.Hooks{}
	hooks.AddAfterCallTool(explainArguments)
	hooks.AddBeforeReadResource(d.hideActivity)
	hooks.AddAfterListResources(d.listActivity)
	opts := []server.ServerOption{
		server.WithToolCapabilities(false),
		server.WithResourceCapabilities(false, false),
		server.WithLogging(),
		server.WithRecovery(),
		server.WithInputSchemaValidation(),
		server.WithHooks(hooks),
		server.WithToolFilter(d.ownKeysOnly),
		server.WithInstructions(Instructions),
	}
	if !d.SkipOutputCheck {
		opts = append(opts, server.WithOutputSchemaValidation())
	}
	if d.Watch != nil {
		opts = append(opts, d.Watch(hooks)...)
	}
	s := server.NewMCPServer("mcp-quota", version, opts...)
	s.AddTool(fetchTool(d.Keys), d.readyTool(d.fetch))
	s.AddTool(statusTool(), d.readyTool(d.quotaStatus))
	s.AddResourceTemplate(activityTemplate(), d.readyResource(d.readActivity))
	return s
}

// caller returns the caller a request comes from. Over HTTP it is the
// authenticated caller; over stdio, the local user.
func (d *Deps) caller(ctx context.Context) *keystore.Caller {
	if c, ok := keystore.CallerFrom(ctx); ok {
		return c
	}
	if d.LocalCaller != "" {
		return keystore.Local(d.LocalCaller)
	}
	return keystore.Local("stdio")
}

// warn sends msg to the client as an MCP logging notification (clients
// that asked for logs see it) and to the log.
func (d *Deps) warn(ctx context.Context, msg string) {
	d.Log.Warn(msg)
	if s := server.ServerFromContext(ctx); s != nil {
		_ = s.SendLogMessageToClient(ctx, mcp.NewLoggingMessageNotification(mcp.LoggingLevelWarning, "mcp-quota", msg))
	}
}
