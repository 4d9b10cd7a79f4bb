//go:build !linux

package pgtest

// scratchRoot returns where servers' directories go: /tmp, which keeps the
// Unix socket's path short (it must stay under ~100 bytes, so neither
// $TMPDIR nor testing's TempDir will do).
func scratchRoot() string { return "/tmp" }
