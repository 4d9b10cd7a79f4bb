package upstream

import (
	"bytes"
	"errors"
	"testing"
)

// TestReadBodyHolds: ReadBody holds what it buffers before it buffers
// it, at most twice the body however short, stops at the limit and one
// byte more, and fails with a
// *BodyMemoryError when the bound has no room — and a hold's release
// gives everything back.
func TestReadBodyHolds(t *testing.T) {
	m := NewBodyMemory(1 << 20)
	h := m.Hold()
	body := bytes.Repeat([]byte("x"), 300<<10)
	got, err := ReadBody(bytes.NewReader(body), 1<<20, h)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("read %d bytes, %v; want all %d", len(got), err, len(body))
	}
	if held := h.Held(); held < int64(len(body)) || held > 2*int64(len(body)) {
		t.Errorf("held %d for a body of %d; want at least the body, at most twice it", held, len(body))
	}
	// A short body holds little more than itself, not a read step of
	// 64 KiB: most answers are a few hundred bytes.
	short := m.Hold()
	small := bytes.Repeat([]byte("s"), 300)
	got, err = ReadBody(bytes.NewReader(small), 1<<20, short)
	if err != nil || !bytes.Equal(got, small) {
		t.Fatalf("read %d bytes, %v; want all %d", len(got), err, len(small))
	}
	if held := short.Held(); held < int64(len(small)) || held > 2*int64(len(small)) {
		t.Errorf("held %d for a body of %d; want at least the body, at most twice it", held, len(small))
	}
	short.Release()
	got, err = ReadBody(bytes.NewReader(body), 1000, nil)
	if err != nil || len(got) != 1001 {
		t.Errorf("to a limit of 1000: %d bytes, %v; want 1001 (the limit and one more)", len(got), err)
	}
	other := m.Hold()
	_, err = ReadBody(bytes.NewReader(bytes.Repeat([]byte("y"), 900<<10)), 1<<20, other)
	var me *BodyMemoryError
	if !errors.As(err, &me) || !errors.Is(err, ErrBodyMemory) || me.Limit != 1<<20 {
		t.Errorf("a body past the room left: %v; want a *BodyMemoryError", err)
	}
	h.Release()
	other.Release()
	if used, peak := m.Used(); used != 0 || peak > 1<<20 {
		t.Errorf("used %d, peak %d after release; want 0 and at most the bound", used, peak)
	}
}
