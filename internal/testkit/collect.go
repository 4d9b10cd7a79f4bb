package testkit

import (
	"slices"
	"strings"
	"sync"
)

// A Buffer collects what a process or a logger writes: its writers and a
// test reading it may use it at once.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// A List collects values that many goroutines add while a test reads
// them.
type List[T any] struct {
	mu    sync.Mutex
	items []T
}

// Add appends v.
func (l *List[T]) Add(v T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.items = append(l.items, v)
}

// All returns a copy of what was added so far, in order.
func (l *List[T]) All() []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.items)
}
