package keystore

import (
	"fmt"
	"slices"
	"strings"
)

// via joins a person's principal and the client it came through in the
// name the activity records ("alice@example.com via Claude.ai").
const via = " via "

// groupPrefix marks a visible_to entry that names a group (a value of
// the token's groups claim) rather than a principal.
const groupPrefix = "group:"

// A Sight is whose calls a person sees on the dashboard and in the
// activity, apart from which keys they may use: a person sees the calls
// of their own principal and of the principals configured as visible to
// them or to one of their groups (visible_to); an administrator (the
// [oauth] admin_group) sees every call. A Sight is a value; it is not
// changed once made.
type Sight struct {
	// All is true for an administrator: every principal, every key.
	All bool
	// Principals are the principals whose calls are seen: the person's
	// own first, then those visible to them.
	Principals []string
	// Keys are the keys those principals may use ("*" for all): the
	// person sees these keys on the page beside the ones they may use.
	Keys []string
}

// MaySeeKey reports whether the caller sees key on the dashboard and in
// the activity: a key it may use, or one whose calls it may see.
func (c *Caller) MaySeeKey(key string) bool {
	if c.MayUse(key) {
		return true
	}
	return c.Sight != nil && (c.Sight.All || slices.Contains(c.Sight.Keys, key) || slices.Contains(c.Sight.Keys, "*"))
}

// MaySee reports whether the caller sees a call the activity records as
// made by caller: a call of a principal in its Sight (by that principal
// through any client: "alice@example.com" is also "alice@example.com via
// Claude.ai"), any call for an administrator, and for a caller without a
// Sight (a [[callers]] token, the local user) any call of the keys it
// sees.
func (c *Caller) MaySee(caller string) bool {
	if c.Sight == nil || c.Sight.All {
		return true
	}
	return slices.ContainsFunc(c.Sight.Principals, func(p string) bool {
		return caller == p || strings.HasPrefix(caller, p+via)
	})
}

// SeesEveryone reports whether the caller sees every call of the keys it
// sees, whoever made it.
func (c *Caller) SeesEveryone() bool { return c.Sight == nil || c.Sight.All }

// sight is the Sight of the principal name, a member of groups.
func (s *contents) sight(name string, groups []string, admin bool) *Sight {
	if admin {
		return &Sight{All: true, Principals: []string{name}}
	}
	out := &Sight{Principals: []string{name}}
	sees := func(visibleTo []string) bool {
		return slices.ContainsFunc(visibleTo, func(v string) bool {
			if g, ok := strings.CutPrefix(v, groupPrefix); ok {
				return slices.Contains(groups, g)
			}
			return v == name
		})
	}
	add := func(other string, keys []string) {
		if other == name || slices.Contains(out.Principals, other) {
			return
		}
		out.Principals = append(out.Principals, other)
		for _, k := range keys {
			if !slices.Contains(out.Keys, k) {
				out.Keys = append(out.Keys, k)
			}
		}
	}
	for _, r := range s.principals {
		if sees(r.VisibleTo) {
			add(r.Name, r.Keys)
		}
	}
	for _, c := range s.callers {
		if sees(c.visibleTo) {
			add(c.Name, c.Keys)
		}
	}
	return out
}

// badViewer says what is wrong with a visible_to entry, or "" when it is
// a principal's name or group:<group>.
func badViewer(v string) string {
	g, isGroup := strings.CutPrefix(v, groupPrefix)
	switch {
	case isGroup && strings.TrimSpace(g) == "":
		return fmt.Sprintf("%q names no group: write \"group:<a value of the groups claim>\", e.g. \"group:team-a\"", v)
	case strings.TrimSpace(v) == "":
		return "name a principal (\"alice@example.com\") or a group (\"group:team-a\") that sees these calls"
	}
	return ""
}
