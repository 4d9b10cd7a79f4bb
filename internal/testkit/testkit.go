// Package testkit is what the tests of several packages share: one fake
// clock, the ledger.Store wrappers that hold a transaction function to
// ledger.Store.Update's contract (it may run twice; a commit may fail
// after it returned), one harness for helper processes (the test
// binary started again to do a job in a process of its own), a
// builder of configuration files' keys and callers (Config), new
// SQLite state files migrated once per test binary (StateFile), a buffer
// a process's output and a test's reads share (Buffer), values many
// goroutines add (List), a damaged write-ahead log (DamageWAL),
// bodies in HTTP's content codings (Gzip, Zlib, RawDeflate), and an
// upstream that repeats its credential wherever it can (LeakyUpstream).
//
// It imports nothing of mcp-quota but pacer/ledger, so that any test,
// including a package's internal tests, can use it.
package testkit
