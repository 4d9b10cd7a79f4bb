package testkit

import (
	"flag"
	"io"
	"testing"
)

// RunWaiting raises -parallel when the command line leaves it at its
// default, and keeps what the command line says.
func TestSetUnlessGiven(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want int
	}{
		{nil, 4},
		{[]string{"-test.v"}, 4},
		{[]string{"-test.parallel", "1"}, 1},
		{[]string{"-test.parallel=9"}, 9},
	} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		parallel := fs.Int("test.parallel", 2, "")
		fs.Bool("test.v", false, "")
		if err := fs.Parse(tt.args); err != nil {
			t.Fatal(err)
		}
		setUnlessGiven(fs, "test.parallel", 4)
		if *parallel != tt.want {
			t.Errorf("%q: -parallel %d; want %d", tt.args, *parallel, tt.want)
		}
	}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	setUnlessGiven(fs, "test.parallel", 4) // no such flag: nothing to set, no panic
}
