//go:build unix

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestReadOnlyStateFile: a state file or directory this user may not
// write is said so. Root may write anything, so under root the binary runs
// as the user nobody.
func TestReadOnlyStateFile(t *testing.T) {
	dir, err := os.MkdirTemp("", "mcp-quota-ro")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error { os.Chmod(p, 0o700); return nil })
		os.RemoveAll(dir)
	})
	config := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(config, []byte(openKeyConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	// A state file made by this user, then left read-only in a directory
	// the runner may write.
	files := filepath.Join(dir, "files")
	roFile := filepath.Join(files, "state.db")
	if err := os.Mkdir(files, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCmd(t, nil, "status", "--config", config, "--state", roFile); err != nil {
		t.Fatal(err)
	}
	os.Remove(roFile + "-wal")
	os.Remove(roFile + "-shm")
	// A directory nobody but its owner may write, with no state file yet.
	roDir := filepath.Join(dir, "ro-dir")
	if err := os.Mkdir(roDir, 0o555); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, files} {
		if err := os.Chmod(p, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(roFile, 0o444); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, state, says string }{
		{"read-only file", roFile, "is read-only (mcp-quota writes to it, even to show the status): give this user write access to it"},
		{"read-only directory", filepath.Join(roDir, "state.db"), "cannot be used: its directory " + roDir + " is read-only"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, cmd := range []string{"status", "activity"} {
				var msg string
				if os.Geteuid() != 0 {
					_, _, err := runCmd(t, nil, cmd, "--config", config, "--state", tt.state)
					if err != nil {
						msg = err.Error()
					}
				} else {
					c := exec.Command(nobodyBinary(t, dir), cmd, "--config", config, "--state", tt.state)
					c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
					c.Env = []string{"HOME=" + dir}
					out, err := c.CombinedOutput()
					if _, exited := err.(*exec.ExitError); !exited {
						t.Fatalf("%s as nobody: %v, %s", cmd, err, out)
					}
					msg = string(out)
				}
				if !strings.Contains(msg, "the state file "+tt.state+" "+tt.says) || !strings.Contains(msg, "--state PATH or MCP_QUOTA_STATE") {
					t.Errorf("%s --state %s: %s\nwant it to say %q and how to point elsewhere", cmd, tt.state, msg, tt.says)
				}
			}
		})
	}
}

// nobodyBinary copies the test's binary where the user nobody may run it.
func nobodyBinary(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "mcp-quota")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	b, err := os.ReadFile(binary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}
