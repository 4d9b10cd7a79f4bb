package testkit

import (
	"flag"
	"strconv"
	"testing"
)

// RunWaiting runs m's tests, as TestMain does, with go test's -parallel
// set to parallel unless the command line set it: for a package whose
// long tests wait on processes, servers and real time more than they use
// the CPU (the end-to-end tests, the vendor SDKs' windows). The default,
// GOMAXPROCS, is the right bound for tests that keep a core busy, and on
// a 2-core machine ran two such waiters at a time. It returns m.Run's
// exit code. The command line is parsed here unless TestMain did.
func RunWaiting(m *testing.M, parallel int) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	setUnlessGiven(flag.CommandLine, "test.parallel", parallel)
	return m.Run()
}

// setUnlessGiven sets fs's flag name to n unless fs's parsed arguments
// set it; a flag fs does not have is left alone.
func setUnlessGiven(fs *flag.FlagSet, name string, n int) {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	if f := fs.Lookup(name); f != nil && !given {
		if err := f.Value.Set(strconv.Itoa(n)); err != nil {
			panic(err)
		}
	}
}
