package main

import (
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
func TestMain(m *testing.M) { os.Exit(testkit.RunWaiting(m, 4)) }
