package testkit

import (
	"runtime"
	"strings"
)

// Goroutines returns the stacks of the goroutines, other than the
// caller's, that are in any of fns (parts of function names, as
// runtime.Stack prints them: "pacer.(*Pacer).giveBack") outside test
// files, separated by blank lines; "" when there are none. It is the check that what a test
// started and stopped left no goroutine behind.
func Goroutines(fns ...string) string {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for i, g := range strings.Split(string(buf), "\n\n") {
		if i > 0 && runs(g, fns) { // the first is the caller's
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// runs reports whether the goroutine whose stack is g is in a function
// named by any of fns, defined outside a test file: a test's own
// goroutines (reading a pipe, say) are the test's to end, and where a
// goroutine was created from is not where it is.
func runs(g string, fns []string) bool {
	lines := strings.Split(g, "\n")
	for i := 1; i+1 < len(lines); i += 2 { // a function, then its file and line
		fn, file := lines[i], lines[i+1]
		if strings.HasPrefix(fn, "created by ") || strings.Contains(file, "_test.go:") {
			continue
		}
		for _, f := range fns {
			if strings.Contains(fn, f) {
				return true
			}
		}
	}
	return false
}
