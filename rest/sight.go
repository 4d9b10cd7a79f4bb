package rest

import (
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// maxSightPages bounds the pages of the activity one request reads to
// fill a page with the calls its caller may see: the cost of a request
// stays bounded however few of the calls are the caller's to see.
const maxSightPages = 8

// activityReader reads the activity (ledger.History's Activity).
type activityReader interface {
	Activity(f ledger.ActivityFilter) ([]ledger.Attempt, error)
}

// seenActivity returns the page of the activity f selects, keeping only
// the calls c may see (keystore.Caller.MaySee), and the cursor of the
// page after it (0 when there is none). A caller that sees every call
// reads one page; one that sees only some principals reads pages of f
// until f.Limit calls are seen or maxSightPages were read; then the next
// page starts after the last call read, seen or not, so that paging goes
// on where this one stopped.
func seenActivity(tx activityReader, f ledger.ActivityFilter, c *keystore.Caller) ([]ledger.Attempt, ledger.Cursor, error) {
	if f.Limit == 0 {
		f.Limit = 100
	}
	var out []ledger.Attempt
	for range maxSightPages {
		list, err := tx.Activity(f)
		if err != nil {
			return nil, ledger.Cursor{}, err
		}
		for i, a := range list {
			if !c.MaySee(a.Caller) {
				continue
			}
			out = append(out, a)
			if len(out) == f.Limit {
				if i == len(list)-1 && len(list) < f.Limit {
					return out, ledger.Cursor{}, nil // the last call there is
				}
				return out, ledger.CursorAfter(a), nil
			}
		}
		if len(list) < f.Limit {
			return out, ledger.Cursor{}, nil
		}
		f.Cursor = ledger.CursorAfter(list[len(list)-1])
	}
	return out, f.Cursor, nil
}
