package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/mcp-quota/mcp-quota/internal/spelling"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report"
)

type statusArgs struct {
	Key    string `json:"key,omitempty" jsonschema:"a configured key; omit it for the keys you may use, the most constrained first"`
	Offset *int   `json:"offset,omitempty" jsonschema:"without key: how many of the most constrained keys to skip (default 0)"`
	Limit  *int   `json:"limit,omitempty" jsonschema:"without key: how many keys to show in detail (default 10, at most 50); the rest are summarised"`
}

// Keys quota_status shows in detail without a key.
const (
	defaultStatusKeys = 10
	maxStatusKeys     = 50
)

func statusTool() mcp.Tool {
	return mcp.NewTool("quota_status",
		mcp.WithDescription("What is left of each key's budget, per policy, and when to come back. "+
			"Shows the shared local budget, every policy the upstream announced (q, w, r, t, age), hidden limits, "+
			"any active Retry-After, reservations, and one line of advice. Reads mcp-quota's state only: it never spends quota."),
		rawInputSchema(statusInput),
		mcp.WithRawOutputSchema(statusOutputSchema()),
		mcp.WithTitleAnnotation("Quota status"),
		mcp.WithReadOnlyHintAnnotation(true),
		mcp.WithDestructiveHintAnnotation(false),
		mcp.WithIdempotentHintAnnotation(true),
		mcp.WithOpenWorldHintAnnotation(false),
	)
}

// quotaStatus is the quota_status tool: the status of one key, or of a
// page (offset, limit) of the keys the caller may use.
func (d *Deps) quotaStatus(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var a statusArgs
	if err := req.BindArguments(&a); err != nil {
		return failure("badArguments", "The arguments are key (a string), offset and limit (whole numbers)."), nil
	}
	offset, limit := 0, defaultStatusKeys
	if a.Offset != nil {
		if *a.Offset < 0 {
			return failure("badArguments", "offset must be 0 or more."), nil
		}
		offset = *a.Offset
	}
	if a.Limit != nil {
		if *a.Limit < 1 || *a.Limit > maxStatusKeys {
			return failure("badArguments", fmt.Sprintf("limit must be from 1 to %d.", maxStatusKeys)), nil
		}
		limit = *a.Limit
	}
	keys, res := d.keysFor(ctx, a.Key)
	if res != nil {
		return res, nil
	}
	st, err := report.Build(ctx, d.Pacer, keys, d.caller(ctx), d.now())
	if err != nil {
		return d.stateUnavailable(a.Key, err), nil
	}
	lim := d.Fetch.withDefaults()
	page := func(limit int) *mcp.CallToolResult {
		p := st.Page(offset, limit)
		p.Advice = report.WaitInstead(p.Advice, lim.MaxMaxWait)
		for i := range p.Keys {
			p.Keys[i].Advice = report.WaitInstead(p.Keys[i].Advice, lim.MaxMaxWait)
		}
		return mcp.NewToolResultStructured(p, statusText(p))
	}
	// The whole result stays within MaxResult characters: fewer keys are
	// shown in detail when it would not (the others are summarised, with
	// the offset of the next page).
	out := page(limit)
	for limit > 1 && resultChars(out) > lim.MaxResult {
		limit = max(1, min(limit, len(st.Keys)-offset)*lim.MaxResult/resultChars(out))
		out = page(limit)
	}
	return out, nil
}

// keysFor returns the keys a status request covers: the one named, or
// every key the caller may use.
func (d *Deps) keysFor(ctx context.Context, name string) ([]*keystore.Key, *mcp.CallToolResult) {
	caller := d.caller(ctx)
	if name != "" {
		k, err := d.Keys.Key(name)
		if err != nil || !caller.MayUse(k.Name) { // a key not the caller's is one that does not exist
			return nil, failure("unknownKey", unknownKey(d.Keys, caller, name))
		}
		return []*keystore.Key{k}, nil
	}
	var keys []*keystore.Key
	for _, k := range d.Keys.Keys() {
		if caller.MayUse(k.Name) {
			keys = append(keys, k)
		}
	}
	return keys, nil
}

// statusText is the short text rendering of a status.
func statusText(st report.Status) string {
	var b strings.Builder
	b.WriteString(st.Advice.Reason + "\n")
	for _, k := range st.Keys {
		fmt.Fprintf(&b, "key %s: %s", k.Key, k.Advice.Reason)
		if k.Credential != "ok" {
			fmt.Fprintf(&b, " (credential: %s)", k.Credential)
		}
		b.WriteString("\n")
		for _, l := range k.Local {
			switch l.Unit {
			case string(ratelimit.ConcurrentRequests):
				fmt.Fprintf(&b, "  local %s: %d of %d concurrent requests in flight%s\n", l.Policy, l.Used, l.Limit, flag(l.Binds, "; this binds now"))
			case string(ratelimit.ContentBytes):
				fmt.Fprintf(&b, "  local %s: %d of %d content-bytes left (%d used), window %d s, oldest leaves in %d s%s\n",
					l.Policy, l.Remaining, l.Limit, l.Used, l.WindowS, l.ResetS, flag(l.Binds, "; this binds now"))
			default:
				fmt.Fprintf(&b, "  local %s: %d of %d left (%d used), window %d s, oldest leaves in %d s%s\n",
					l.Policy, l.Remaining, l.Limit, l.Used, l.WindowS, l.ResetS, flag(l.Binds, "; this binds now"))
			}
		}
		for _, u := range k.Upstream {
			state := fmt.Sprintf("r=%d t=%d", u.R, u.T)
			if u.Expired {
				state = "expired"
			}
			fmt.Fprintf(&b, "  upstream %s (%s%s): q=%d w=%d %s, %d s old, from %s%s%s\n", u.Policy, u.Unit,
				partition(u.Partition), u.Q, u.W, state, u.AgeS, u.Source, flag(u.Hidden, ", hidden"), flag(u.Binds, "; this binds now"))
		}
		if g := k.RetryAfter; g != nil {
			fmt.Fprintf(&b, "  closed for %d s (%s): %s\n", g.RetryAfterS, g.Source, g.Reason)
		}
		for _, w := range k.Warnings {
			fmt.Fprintf(&b, "  warning: %s\n", w)
		}
	}
	if m := st.More; m != nil {
		fmt.Fprintf(&b, "%d more keys not shown (%d pause, %d slow_down, %d continue). %s\n", m.Keys, m.Pause, m.SlowDown, m.Continue, m.Hint)
	}
	return strings.TrimRight(b.String(), "\n")
}

func partition(p string) string {
	if p == "" {
		return ""
	}
	return ", partition " + p
}

func flag(on bool, s string) string {
	if on {
		return s
	}
	return ""
}

func activityTemplate() mcp.ResourceTemplate {
	return mcp.NewResourceTemplate(activityPrefix+"{key}", "Key activity",
		mcp.WithTemplateDescription("The latest 100 attempts through a key: caller, transport, state, status, wait and reason, newest first."),
		mcp.WithTemplateMIMEType("application/json"))
}

// listActivity adds to resources/list the activity resource of every key
// the caller may use: the template alone lists nothing a client can show.
func (d *Deps) listActivity(ctx context.Context, _ any, _ *mcp.ListResourcesRequest, result *mcp.ListResourcesResult) {
	caller := d.caller(ctx)
	for _, k := range d.Keys.Keys() {
		if !caller.MayUse(k.Name) {
			continue
		}
		result.Resources = append(result.Resources, mcp.NewResource(activityPrefix+k.Name, "Activity of key "+k.Name,
			mcp.WithResourceDescription("The latest 100 attempts through key "+k.Name+": caller, transport, state, status, wait and reason, newest first."),
			mcp.WithMIMEType("application/json")))
	}
}

// activityPrefix begins the URI of every key's activity resource.
const activityPrefix = "quota://activity/"

// hideActivity runs before every resources/read. A URI naming no key the
// caller may use — no such key, or one of another caller's — is made one
// that matches no resource, so that mcp-go answers it as a missing
// resource in the client's revision (-32002; -32602 from 2026-07-28 on)
// and in the same words for both, which tell a caller nothing about keys
// it may not use. mcp-go answers every error a resource handler returns
// with -32603, an internal error, so readActivity cannot say it; what the
// caller can do instead rides in the URI mcp-go quotes (see
// noActivity).
func (d *Deps) hideActivity(ctx context.Context, _ any, req *mcp.ReadResourceRequest) {
	name, ok := strings.CutPrefix(req.Params.URI, activityPrefix)
	if !ok || d.mayRead(ctx, name) {
		return
	}
	req.Params.URI += " (" + d.noActivity(ctx, name) + ")"
}

// maxNamed is how many of its keys a caller is told of by name when it
// reads the activity of a key that is not one of them.
const maxNamed = 20

// noActivity says what a caller who asked for the activity of name, no
// key of its own, can read instead: its own keys, and the one it most
// likely meant. It names no key the caller may not use.
func (d *Deps) noActivity(ctx context.Context, name string) string {
	caller := d.caller(ctx)
	var own []string
	for _, k := range d.Keys.Keys() {
		if caller.MayUse(k.Name) {
			own = append(own, k.Name)
		}
	}
	var b strings.Builder
	b.WriteString("no key of yours has this name")
	if len(own) == 0 {
		b.WriteString(". You may use no key, so there is no activity to read")
		return b.String()
	}
	b.WriteString(".")
	if best := spelling.Closest(name, own); best != "" {
		fmt.Fprintf(&b, " Did you mean %s%s?", activityPrefix, best)
	}
	shown := own[:min(len(own), maxNamed)]
	fmt.Fprintf(&b, " Your keys: %s", strings.Join(shown, ", "))
	if more := len(own) - len(shown); more > 0 {
		fmt.Fprintf(&b, " and %d more (resources/list lists them all)", more)
	}
	fmt.Fprintf(&b, "; read %sKEY with one of them", activityPrefix)
	return b.String()
}

// mayRead reports whether the caller in ctx may read key name's activity.
func (d *Deps) mayRead(ctx context.Context, name string) bool {
	if name == "" {
		return false // Key("") would pick the only key
	}
	k, err := d.Keys.Key(name)
	return err == nil && d.caller(ctx).MayUse(k.Name)
}

// readActivity reads a key's activity resource: its latest 100 attempts,
// for a caller that may use the key.
func (d *Deps) readActivity(ctx context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
	name := strings.TrimPrefix(req.Params.URI, activityPrefix)
	if !d.mayRead(ctx, name) { // hideActivity answers these first
		return nil, fmt.Errorf("%w: no key of yours is called %q", server.ErrResourceNotFound, name)
	}
	k, err := d.Keys.Key(name)
	if err != nil {
		return nil, err
	}
	var list []ledger.Attempt
	err = d.DB.View(ctx, func(tx ledger.ReadTx) error {
		var err error
		list, err = tx.Activity(ledger.ActivityFilter{Key: k.Name, Limit: 100})
		return err
	})
	if err != nil {
		return nil, err
	}
	entries := make([]report.Activity, 0, len(list))
	caller := d.caller(ctx)
	for _, a := range list {
		if !caller.MaySee(a.Caller) { // an OAuth principal reads the calls it may see (keystore.Sight)
			continue
		}
		// Rows an older mcp-quota recorded may hold the credential.
		s := k.Scrubber()
		a.Target, _ = s.Scrub(a.Target)
		a.Reason = a.Reason.Map(func(t string) string { t, _ = s.Scrub(t); return t })
		entries = append(entries, report.NewActivity(a))
	}
	b, err := json.MarshalIndent(report.ActivityPage{Activity: entries}, "", "  ")
	if err != nil {
		return nil, err
	}
	return []mcp.ResourceContents{mcp.TextResourceContents{URI: req.Params.URI, MIMEType: "application/json", Text: string(b)}}, nil
}
