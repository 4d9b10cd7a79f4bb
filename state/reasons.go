package state

import (
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/mcp-quota/mcp-quota/report/reason"
)

// A reason (a gate's, a warning's) is kept as data, in a column named
// why: the JSON form of reason.Reason, its kind and the fields that are
// not zero. Nothing in SQL looks inside it, so both back ends keep it as
// text. The column of words beside it (a gate's reason, a warning's
// message) holds what a row written before reasons were data said; a row
// written now leaves it empty, and its words are made where they are
// shown.

// storedWhy is r as the state keeps it: its JSON form, or NULL for the
// zero Reason.
func storedWhy(r reason.Reason) (sql.NullString, error) {
	if r.IsZero() {
		return sql.NullString{}, nil
	}
	b, err := json.Marshal(r)
	if err != nil {
		return sql.NullString{}, fmt.Errorf("state: keep reason %s: %w", r.Kind, err)
	}
	return sql.NullString{String: string(b), Valid: true}, nil
}

// readWhy is the reason a row keeps: its why when it has one, else the
// words a row written before kept (a reason.Said), or the zero Reason
// when it has neither.
func readWhy(why sql.NullString, said string) (reason.Reason, error) {
	if !why.Valid || why.String == "" {
		if said == "" {
			return reason.Reason{}, nil
		}
		return reason.Reason{Kind: reason.Said, Said: said}, nil
	}
	var r reason.Reason
	if err := json.Unmarshal([]byte(why.String), &r); err != nil {
		return reason.Reason{}, fmt.Errorf("state: a kept reason does not read: %w", err)
	}
	return r, nil
}
