package state

import (
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/mcp-quota/mcp-quota/report/reason"
)

// A reason (a gate's, a warning's, an attempt's) is kept as data, in a
// column named why: the JSON form of reason.Reason, its kind and the
// fields that are not zero. Nothing in SQL looks inside it, so both back
// ends keep it as text. The column of words beside it (a gate's reason, a
// warning's message, an attempt's reason) holds what a row written before
// reasons were data said. A row written now fills it too (olderWords),
// for the processes of the previous version that share the store while
// hosts are upgraded one at a time; this version reads only why (the
// words only of a row without it), and words a reason where it is shown.

// storedWhy is r as the state keeps it: its JSON form, or NULL for the
// zero Reason.
func storedWhy(r reason.Reason) (sql.NullString, error) {
	if r.IsZero() {
		return sql.NullString{}, nil
	}
	var buf [256]byte
	if b, ok := appendReason(buf[:0], r); ok { // json.Marshal's bytes (TestStoredWhyEncoding)
		return sql.NullString{String: string(b), Valid: true}, nil
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

// olderWords is r in words, for the column that processes of the
// previous version read (they know nothing of why).
func olderWords(r reason.Reason) string {
	if r.IsZero() {
		return ""
	}
	return r.String()
}

// A keptReason is a reason as a row keeps it: its words, for the
// processes of the previous version, and why.
type keptReason struct {
	words string
	why   sql.NullString
}

// keep is r as a row keeps it.
func keep(r reason.Reason) (keptReason, error) {
	why, err := storedWhy(r)
	return keptReason{words: olderWords(r), why: why}, err
}

// mustKeep is keep of a reason the state itself gives (one that is sure
// to encode).
func mustKeep(r reason.Reason) keptReason {
	k, err := keep(r)
	if err != nil {
		panic(err)
	}
	return k
}

// whyReader reads the reasons of the rows of one read: the same reason
// (an answer's status, most often) is decoded once.
type whyReader map[string]reason.Reason

// read is readWhy of why (NULL when nil) and said.
func (m *whyReader) read(why sql.RawBytes, said string) (reason.Reason, error) {
	if why == nil {
		return readWhy(sql.NullString{}, said)
	}
	if r, ok := (*m)[string(why)]; ok {
		return r, nil
	}
	r, err := readWhy(sql.NullString{String: string(why), Valid: true}, said)
	if err != nil {
		return r, err
	}
	if *m == nil {
		*m = whyReader{}
	}
	(*m)[string(why)] = r
	return r, nil
}
