package main

import (
	"flag"
	"os"
	"testing"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// The tests that take seconds (the hosts, the fair shares, the browser,
// the TypeScript client, the shutdowns) wait on the serve processes they
// start, PostgreSQL, Chromium and windows of real time, and call
// t.Parallel: four of them run at a time. TestHostsUnderPressure does
// not: it makes the load it is about (busy loops on every core), and
// runs among the serial tests, which end before the parallel ones start
// (its own two runs go side by side).
//
// The mcp-quota binary the end-to-end tests run is built before the
// first test starts (but with -short, whose tests run none): built when
// the first test asked for it, a cold build took minutes, and a test
// that had started a window of real time before it asked (a REST call,
// then the pasted stdio command's call on the same key, in
// TestDemoLinesWorkAsPasted) saw the window end during the build. A
// build that fails fails each test that runs the binary, with its output.
func TestMain(m *testing.M) {
	flag.Parse()
	if !testing.Short() {
		buildBinary() // its error is each binary(t)'s
	}
	os.Exit(testkit.RunWaiting(m, 4))
}
