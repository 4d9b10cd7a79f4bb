package pgtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// tools are the binaries a Server runs, all from one directory.
var tools = []string{"initdb", "postgres", "pg_ctl"}

// versionsGlob is where Debian and Ubuntu install each major version.
const versionsGlob = "/usr/lib/postgresql/*/bin"

// findBin returns the directory of the server binaries: $PG_BIN when set
// (and then nothing else), else the newest of /usr/lib/postgresql/*/bin
// that has them all, else the directory pg_ctl on PATH resolves to.
func findBin() (string, error) {
	if dir := os.Getenv("PG_BIN"); dir != "" {
		if missing := lacks(dir); missing != "" {
			return "", fmt.Errorf("PostgreSQL server binaries not found (PG_BIN=%s has no %s)", dir, missing)
		}
		return dir, nil
	}
	dirs, _ := filepath.Glob(versionsGlob) // the pattern is valid
	for _, dir := range newestFirst(dirs) {
		if lacks(dir) == "" {
			return dir, nil
		}
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if p, err = filepath.EvalSymlinks(p); err == nil && lacks(filepath.Dir(p)) == "" {
			return filepath.Dir(p), nil
		}
	}
	return "", fmt.Errorf("PostgreSQL server binaries not found (none in %s, no pg_ctl on PATH beside initdb and postgres)", versionsGlob)
}

// lacks returns the first of tools that dir has no executable of, or "".
func lacks(dir string) string {
	for _, name := range tools {
		info, err := os.Stat(filepath.Join(dir, name))
		if err != nil || !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0 {
			return name
		}
	}
	return ""
}

// newestFirst sorts paths like /usr/lib/postgresql/15/bin by the version
// in their next-to-last element, newest first (16 before 15 before 9.6);
// a path without a number there comes last.
func newestFirst(dirs []string) []string {
	version := func(dir string) []int {
		var v []int
		for f := range strings.SplitSeq(filepath.Base(filepath.Dir(dir)), ".") {
			n, err := strconv.Atoi(f)
			if err != nil {
				return nil
			}
			v = append(v, n)
		}
		return v
	}
	dirs = slices.Clone(dirs)
	slices.SortStableFunc(dirs, func(a, b string) int { return slices.Compare(version(b), version(a)) })
	return dirs
}

// unavailable ends tb when PostgreSQL cannot run here at all (err says
// why: no binaries, or root without a postgres user): a skip, except under
// CI=true, where every test must run, a failure. A server that fails to
// start is a failure everywhere.
func unavailable(tb testing.TB, err error) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("%v, and CI=true: install postgresql, or set PG_BIN", err)
	}
	tb.Skipf("%v: install postgresql, or set PG_BIN; under CI=true this is a failure", err)
}
