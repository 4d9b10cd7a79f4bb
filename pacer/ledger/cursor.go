package ledger

import (
	"encoding/base64"
	"errors"
	"strconv"
)

// A Cursor marks where a page of the activity ends: the page after it
// starts below the attempt the page ended at (by time, then ID). The zero
// Cursor is the start of the newest page. Its text form is opaque to
// callers; it reads back only what MarshalText wrote.
type Cursor struct {
	id int64 // the ID of the attempt the page ended at; 0 for the newest page
}

// CursorAfter is the cursor of the page after the one that ended at a.
func CursorAfter(a Attempt) Cursor { return Cursor{id: a.ID} }

// IsZero reports whether c is the start of the newest page.
func (c Cursor) IsZero() bool { return c.id <= 0 }

// AttemptID is, for a store, the ID of the attempt the page before
// ended at; 0 for the newest page.
func (c Cursor) AttemptID() int64 { return max(c.id, 0) }

// errCursor is the error of a cursor text this program did not write.
var errCursor = errors.New("ledger: not a cursor of the activity")

// MarshalText writes c as URL-safe text; the zero Cursor as "".
func (c Cursor) MarshalText() ([]byte, error) {
	if c.IsZero() {
		return []byte{}, nil
	}
	return []byte(base64.RawURLEncoding.EncodeToString([]byte("a" + strconv.FormatInt(c.id, 10)))), nil
}

// UnmarshalText reads what MarshalText wrote ("" as the zero Cursor), and
// refuses anything else.
func (c *Cursor) UnmarshalText(text []byte) error {
	if len(text) == 0 {
		*c = Cursor{}
		return nil
	}
	b, err := base64.RawURLEncoding.DecodeString(string(text))
	if err != nil || len(b) < 2 || b[0] != 'a' {
		return errCursor
	}
	id, err := strconv.ParseInt(string(b[1:]), 10, 64)
	if err != nil || id <= 0 {
		return errCursor
	}
	*c = Cursor{id: id}
	return nil
}
