package testkit

import (
	"runtime"
	"strings"
)

// Goroutines returns the stacks of the goroutines, other than the
// caller's, whose stack holds any of fns (parts of function names, as
// runtime.Stack prints them: "pacer.(*Pacer).giveBack"), separated by
// blank lines; "" when there are none. It is the check that what a test
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
		if i == 0 { // the caller's
			continue
		}
		for _, fn := range fns {
			if strings.Contains(g, fn) {
				out = append(out, g)
				break
			}
		}
	}
	return strings.Join(out, "\n\n")
}
