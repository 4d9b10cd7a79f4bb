package main

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// version is the version the program reports: -ldflags "-X main.version=…"
// sets it at build time (the release archives carry their release's
// version this way, see .goreleaser.yaml); left empty, it comes from the
// build info (see buildVersion).
var version = ""

// revision is the VCS revision the binary was built from, with "+dirty"
// when the tree had uncommitted changes; empty when unknown. Like version,
// -ldflags "-X main.revision=…" sets it: a release build runs without VCS
// stamping in the build info, so the commit comes in that way.
var revision = ""

func init() {
	bi, _ := debug.ReadBuildInfo()
	version, revision = stamped(version, revision, bi)
}

// stamped is the version and revision to report: each as set at build time
// by -ldflags when it was set, else as read from the build info.
func stamped(ldVersion, ldRevision string, bi *debug.BuildInfo) (version, revision string) {
	version, revision = buildVersion(bi)
	if ldVersion != "" {
		version = ldVersion
	}
	if ldRevision != "" {
		revision = ldRevision
	}
	return version, revision
}

// buildVersion reads the module version and the VCS revision from the
// build info: "go install …@v1.2.0" records v1.2.0; "go build" in a git
// clone records a pseudo-version and the revision; "go run" and builds
// without VCS stamping (-buildvcs=false, git worktrees) record "(devel)",
// reported as "devel" followed by the revision when there is one.
func buildVersion(bi *debug.BuildInfo) (version, revision string) {
	if bi == nil {
		return "devel", ""
	}
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if revision != "" && modified {
		revision += "+dirty"
	}
	version = bi.Main.Version
	if version == "" || version == "(devel)" {
		version = "devel"
		if revision != "" {
			version += "-" + short(revision)
		}
	}
	return version, revision
}

func short(rev string) string {
	base, dirty := strings.CutSuffix(rev, "+dirty")
	if len(base) > 12 {
		base = base[:12]
	}
	if dirty {
		base += "+dirty"
	}
	return base
}

// versionLine is what "mcp-quota version" prints.
func versionLine() string {
	bi, _ := debug.ReadBuildInfo()
	goVersion := ""
	if bi != nil {
		goVersion = ", " + bi.GoVersion
	}
	rev := revision
	if rev == "" {
		rev = "unknown (built without VCS stamping)"
	}
	return fmt.Sprintf("mcp-quota %s (revision %s%s)", version, rev, goVersion)
}
