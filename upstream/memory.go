package upstream

import (
	"errors"
	"fmt"
	"io"
	"sync"
)

// DefaultBodyMemory is the memory that bodies in flight may take across
// every call of a Client, when the configuration says nothing.
const DefaultBodyMemory = 64 << 20

// initialHold is what each call holds of the body memory from before it
// is sent: what reading the answer's signals takes (peekLimit).
const initialHold = peekLimit

// ErrBodyMemory reports a call whose body did not fit in the memory
// bodies in flight may take across all callers (see BodyMemory).
var ErrBodyMemory = errors.New("no memory for the body")

// A BodyMemoryError is ErrBodyMemory with what was asked and what was
// left. errors.Is(err, ErrBodyMemory) is true for it.
type BodyMemoryError struct {
	Limit int64 // the bound, in bytes
	Want  int64 // what the call held with what it asked for
	Sent  bool  // whether the call had gone upstream
}

func (e *BodyMemoryError) Error() string {
	s := fmt.Sprintf("the bodies of the calls in flight already take most of the %d MiB mcp-quota holds for them, and this call needed %d KiB more",
		e.Limit>>20, max(e.Want>>10, 1))
	if e.Sent {
		return s + "; the call went upstream (and counted), but its answer could not be read"
	}
	return s + "; nothing was sent upstream"
}

// Is makes errors.Is(err, ErrBodyMemory) true.
func (e *BodyMemoryError) Is(target error) bool { return target == ErrBodyMemory }

// BodyMemory bounds the memory that request and answer bodies held in
// memory take across every call at once. Calls take their part as they
// read (BodyHold.Grow) and give it back when they end. The zero value
// has no room; use NewBodyMemory. It is safe for concurrent use.
type BodyMemory struct {
	limit int64

	mu   sync.Mutex
	used int64
	peak int64
}

// NewBodyMemory returns a bound of limit bytes; limit <= 0 means
// DefaultBodyMemory.
func NewBodyMemory(limit int64) *BodyMemory {
	if limit <= 0 {
		limit = DefaultBodyMemory
	}
	return &BodyMemory{limit: limit}
}

// Limit is the bound, in bytes.
func (m *BodyMemory) Limit() int64 { return m.limit }

// Used is what the calls in flight hold now; Peak the most they held at
// once.
func (m *BodyMemory) Used() (used, peak int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used, m.peak
}

// BodyHold returns an empty hold on the Client's BodyMemory, for one
// call.
func (c *Client) BodyHold() *BodyHold { return c.bodies().Hold() }

// Hold returns an empty hold on m, for one call.
func (m *BodyMemory) Hold() *BodyHold { return &BodyHold{m: m} }

// A BodyHold is one call's part of a BodyMemory. It is safe for
// concurrent use; a nil *BodyHold holds nothing and always grows.
type BodyHold struct {
	m    *BodyMemory
	mu   sync.Mutex
	n    int64
	sent bool
}

// Grow takes n bytes more, or returns a *BodyMemoryError when they do
// not fit (and takes nothing).
func (h *BodyHold) Grow(n int64) error {
	if h == nil || n <= 0 {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.used+n > m.limit {
		return &BodyMemoryError{Limit: m.limit, Want: n, Sent: h.sent}
	}
	m.used += n
	m.peak = max(m.peak, m.used)
	h.n += n
	return nil
}

// Held is what h holds.
func (h *BodyHold) Held() int64 {
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// Release gives back all h holds; h may grow again after.
func (h *BodyHold) Release() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.m.mu.Lock()
	h.m.used -= h.n
	h.m.mu.Unlock()
	h.n = 0
}

func (h *BodyHold) markSent() {
	if h != nil {
		h.mu.Lock()
		h.sent = true
		h.mu.Unlock()
	}
}

// ReadBody reads r to its end, or to max bytes and one more (so that a
// longer body is told from one of exactly max), growing h by what it
// reads before it reads it. It returns what it read and the first error:
// a *BodyMemoryError when h could not grow, or r's own. Its buffer starts
// small and doubles as the body fills it, so that a short body holds
// (and allocates) little more than itself.
func ReadBody(r io.Reader, limit int64, h *BodyHold) ([]byte, error) {
	const first, step = 512, 64 << 10
	var buf []byte
	for int64(len(buf)) <= limit {
		if len(buf) == cap(buf) {
			// Hold what the grown buffer will take first.
			next := min(max(2*int64(cap(buf)), first), limit+1)
			if err := h.Grow(next - int64(cap(buf))); err != nil {
				return buf, err
			}
			nb := make([]byte, len(buf), next)
			copy(nb, buf)
			buf = nb
		}
		want := min(step, cap(buf)-len(buf))
		n, err := r.Read(buf[len(buf) : len(buf)+want])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}
