package main

import (
	"runtime/debug"
	"testing"
)

// TestStamped: what -ldflags sets at build time (a release build's
// version and commit) wins over the build info, one field at a time.
func TestStamped(t *testing.T) {
	clone := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "3699fcf1ab12aa55bb66cc77dd88ee99ff001122"}, {Key: "vcs.modified", Value: "false"}}}
	tests := []struct {
		name                  string
		ldVersion, ldRevision string
		bi                    *debug.BuildInfo
		version, revision     string
	}{
		{"release build without VCS stamping", "1.4.0", "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678",
			&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "1.4.0", "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"},
		{"ldflags win over the build info", "1.4.0", "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678",
			clone, "1.4.0", "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"},
		{"only the version set", "1.4.0", "", clone, "1.4.0", "3699fcf1ab12aa55bb66cc77dd88ee99ff001122"},
		{"nothing set", "", "", clone, "devel-3699fcf1ab12", "3699fcf1ab12aa55bb66cc77dd88ee99ff001122"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, r := stamped(tt.ldVersion, tt.ldRevision, tt.bi)
			if v != tt.version || r != tt.revision {
				t.Errorf("stamped = %q, %q; want %q, %q", v, r, tt.version, tt.revision)
			}
		})
	}
}
