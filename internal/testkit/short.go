package testkit

import "testing"

// SkipShort skips tb under -short, saying why: it starts processes or
// servers (PostgreSQL, Chromium, Node, the mcp-quota binary, helper
// processes) or runs for seconds of real time. `go test -short ./...`
// runs the behaviour without them, fast; without -short (as .ci/run runs
// the tests) they run, and those that need a program CI installs fail
// under CI=true when it is missing.
func SkipShort(tb testing.TB, why string) {
	tb.Helper()
	if testing.Short() {
		tb.Skipf("%s: skipped under -short", why)
	}
}
