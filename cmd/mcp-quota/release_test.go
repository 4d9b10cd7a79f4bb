package main

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// releaseBuild is the build of mcp-quota that .goreleaser.yaml describes:
// the environment, the go build flags and the -ldflags (with GoReleaser's
// templates still in them) the release archives are built with.
type releaseBuild struct {
	Main    string   `json:"main"`
	Binary  string   `json:"binary"`
	Env     []string `json:"env"`
	Goos    []string `json:"goos"`
	Goarch  []string `json:"goarch"`
	Flags   []string `json:"flags"`
	Ldflags []string `json:"ldflags"`
}

var (
	releaseOnce  sync.Once
	releaseSpec  releaseBuild
	releaseErr   error
	releaseRoot  = filepath.Join("..", "..")
	releaseField = regexp.MustCompile(`\{\{\s*\.(\w+)\s*\}\}`)
)

// readRelease reads the mcp-quota build of .goreleaser.yaml, once.
func readRelease() (releaseBuild, error) {
	releaseOnce.Do(func() {
		b, err := os.ReadFile(filepath.Join(releaseRoot, ".goreleaser.yaml"))
		if err != nil {
			releaseErr = err
			return
		}
		var cfg struct {
			Builds []releaseBuild `json:"builds"`
		}
		if err := yaml.Unmarshal(b, &cfg); err != nil {
			releaseErr = err
			return
		}
		for _, b := range cfg.Builds {
			if b.Binary == "mcp-quota" {
				releaseSpec = b
				return
			}
		}
		releaseErr = os.ErrNotExist
	})
	if releaseErr != nil {
		return releaseBuild{}, fmt.Errorf("the mcp-quota build of .goreleaser.yaml: %w", releaseErr)
	}
	return releaseSpec, nil
}

// release is readRelease in a test, which fails when it cannot be read.
func release(t testing.TB) releaseBuild {
	t.Helper()
	r, err := readRelease()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// releaseCommand is "go build" with the environment, flags and -ldflags
// (ldflags: stampedLdflags) of the release build r, run from the module's
// root. The e2e tests' binary is built this way, so that it is the
// released program and .ci/run's release build reuses its compiled
// packages.
func releaseCommand(r releaseBuild, out, ldflags string) *exec.Cmd {
	args := append([]string{"build"}, r.Flags...)
	args = append(args, "-ldflags="+ldflags)
	cmd := exec.Command("go", append(args, "-o", out, r.Main)...)
	cmd.Dir = releaseRoot
	cmd.Env = append(os.Environ(), r.Env...)
	return cmd
}

// The version and commit the e2e tests' binary is stamped with, through
// .goreleaser.yaml's -ldflags templates {{.Version}} and {{.FullCommit}}.
const stampVersion, stampCommit = "1.4.2-snapshot.5e6f7a8", "5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f"

// stampedLdflags is r's -ldflags with stampVersion and stampCommit for
// its templates; another template is an error.
func stampedLdflags(r releaseBuild) (string, error) {
	var unknown []string
	ldflags := releaseField.ReplaceAllStringFunc(strings.Join(r.Ldflags, " "), func(m string) string {
		switch f := releaseField.FindStringSubmatch(m)[1]; f {
		case "Version":
			return stampVersion
		case "FullCommit":
			return stampCommit
		default:
			unknown = append(unknown, m)
			return m
		}
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf(".goreleaser.yaml's ldflags use %v: the tests fill in only {{.Version}} and {{.FullCommit}}", unknown)
	}
	return ldflags, nil
}

// TestReleaseStamp checks the binary the e2e tests run, built as
// .goreleaser.yaml says (its environment, flags and -ldflags, with a
// version and a commit for the templates) with go build, for what the
// release archives must keep: --version prints the stamped version and commit, and the binary
// is static (the container image is FROM scratch). .ci/run builds the
// archives with GoReleaser itself only when the release's inputs change;
// this test keeps the stamping checked on every run.
func TestReleaseStamp(t *testing.T) {
	testkit.SkipShort(t, "builds the mcp-quota binary")
	r := release(t)
	if !slices.Contains(r.Goos, runtime.GOOS) || !slices.Contains(r.Goarch, runtime.GOARCH) {
		t.Skipf("the release has no %s/%s archive", runtime.GOOS, runtime.GOARCH)
	}
	bin := binary(t) // built as the release is, stamped with stampVersion and stampCommit
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", bin, err)
	}
	want := "mcp-quota " + stampVersion + " (revision " + stampCommit + ", "
	if got := strings.TrimSpace(string(out)); !strings.HasPrefix(got, want) {
		t.Errorf("--version of a release build = %q, want it to begin %q", got, want)
	}
	if runtime.GOOS == "linux" {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("the release build is linked dynamically (it asks for an interpreter): the image FROM scratch has no libc")
			}
		}
	}
}
