package testkit

import (
	"flag"
	"strconv"
)

// WaitingTests sets go test's -parallel to n unless the command line set
// it, for a package whose long tests wait on processes, servers and real
// time more than they use the CPU (the end-to-end tests, the vendor SDKs'
// windows): the default, GOMAXPROCS, is the right bound for tests that
// keep a core busy, and on a 2-core machine ran two such waiters at a
// time. TestMain calls it after flag.Parse, before m.Run.
func WaitingTests(n int) { setUnlessGiven(flag.CommandLine, "test.parallel", n) }

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
