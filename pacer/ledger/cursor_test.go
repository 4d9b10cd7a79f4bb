package ledger_test

import (
	"encoding/base64"
	"testing"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// A cursor reads back as written, a cursor written before Cursor existed
// (base64 of "a" and the ID) still reads, and anything else is refused.
func TestCursorText(t *testing.T) {
	c := ledger.CursorAfter(ledger.Attempt{ID: 42})
	text, err := c.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	var back ledger.Cursor
	if err := back.UnmarshalText(text); err != nil || back != c || back.AttemptID() != 42 {
		t.Errorf("%q read back as %+v, %v; want attempt 42", text, back, err)
	}
	old := base64.RawURLEncoding.EncodeToString([]byte("a7"))
	if err := back.UnmarshalText([]byte(old)); err != nil || back.AttemptID() != 7 {
		t.Errorf("the older cursor %q read as %d, %v; want attempt 7", old, back.AttemptID(), err)
	}
	if text, _ := (ledger.Cursor{}).MarshalText(); len(text) != 0 {
		t.Errorf("the zero Cursor wrote %q; want nothing", text)
	}
	if err := back.UnmarshalText(nil); err != nil || !back.IsZero() {
		t.Errorf("empty text read as %+v, %v; want the zero Cursor", back, err)
	}
	for _, bad := range []string{"42", "!!!", base64.RawURLEncoding.EncodeToString([]byte("b42")),
		base64.RawURLEncoding.EncodeToString([]byte("a-3")), base64.RawURLEncoding.EncodeToString([]byte("a0")),
		base64.RawURLEncoding.EncodeToString([]byte("a"))} {
		if err := back.UnmarshalText([]byte(bad)); err == nil {
			t.Errorf("%q read as %+v; want an error", bad, back)
		}
	}
}
