package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/mark3labs/mcp-go/server"

	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
	"github.com/mcp-quota/mcp-quota/tools"
)

// A stateError is a state file that cannot be used, said in words a user
// can act on: what is wrong, and how to point mcp-quota elsewhere.
type stateError struct {
	path  string
	what  string // e.g. "is read-only"
	fix   string // what to do about it besides pointing elsewhere; may be empty
	cause error
}

func (e *stateError) Error() string {
	fix := e.fix
	if fix != "" {
		fix += ", or "
	}
	return fmt.Sprintf("the state file %s %s: %spoint mcp-quota at another file with --state PATH or MCP_QUOTA_STATE "+
		"(every process that shares a budget must name the same file) (%v)", e.path, e.what, fix, e.cause)
}

func (e *stateError) Unwrap() error { return e.cause }

// sqliteCoder is what modernc.org/sqlite's errors tell of themselves.
type sqliteCoder interface {
	error
	Code() int
}

// SQLite's primary result codes (https://sqlite.org/rescode.html).
const (
	sqliteBusy     = 5
	sqliteReadOnly = 8
	sqliteCorrupt  = 11
	sqliteNotADB   = 26
)

// explainState turns a failure to open the state file at path into a
// *stateError. It looks at the file system itself to say what is wrong
// (the causes SQLite reports are terse, and the same for several of them).
func explainState(path string, err error) error {
	e := &stateError{path: path, cause: err, what: "cannot be opened"}
	var code int
	if c, ok := errors.AsType[sqliteCoder](err); ok {
		code = c.Code() & 0xff
	}
	dir := filepath.Dir(path)
	switch {
	case errors.Is(err, state.ErrNewerSchema):
		e.what = "was written by a newer mcp-quota, and is left as it is"
		e.fix = "run the newer mcp-quota"
	case notDirectory(dir) != "":
		e.what = fmt.Sprintf("cannot be created: %s is a file, not a directory", notDirectory(dir))
	case errors.Is(err, fs.ErrPermission) && !exists(dir):
		e.what = fmt.Sprintf("cannot be created: its directory %s cannot be made (permission denied)", dir)
	case isDir(path):
		e.what = "is a directory, not a file"
	case exists(path) && !readable(path):
		e.what = "cannot be read (permission denied)"
		e.fix = "give this user read and write access to it"
	case exists(path) && !sqliteHeader(path) || code == sqliteNotADB:
		e.what = "is not an SQLite database (it is damaged, or another kind of file)"
		e.fix = "move it away to start afresh"
	case code == sqliteCorrupt:
		e.what = "is damaged"
		e.fix = "move it away to start afresh"
	case exists(path) && !writable(path):
		e.what = "is read-only (mcp-quota writes to it, even to show the status)"
		e.fix = "give this user write access to it"
	case !dirWritable(dir):
		e.what = fmt.Sprintf("cannot be used: its directory %s is read-only (SQLite keeps %s-wal and %s-shm beside it)",
			dir, filepath.Base(path), filepath.Base(path))
		e.fix = "give this user write access to the directory"
	case code == sqliteReadOnly:
		e.what = "is read-only"
		e.fix = "give this user write access to it and its directory"
	}
	return e
}

// notDirectory returns the first existing ancestor of dir (or dir) that
// is not a directory; "" when there is none.
func notDirectory(dir string) string {
	for d := dir; ; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil {
			if !fi.IsDir() {
				return d
			}
			return ""
		}
		if filepath.Dir(d) == d {
			return ""
		}
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

func readable(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return !errors.Is(err, fs.ErrPermission)
	}
	f.Close()
	return true
}

func writable(path string) bool {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return !errors.Is(err, fs.ErrPermission)
	}
	f.Close()
	return true
}

// sqliteHeader reports whether the file is empty or starts as an SQLite
// database does ("SQLite format 3\0").
func sqliteHeader(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return true
	}
	defer f.Close()
	head := make([]byte, 16)
	n, err := io.ReadFull(f, head)
	if n == 0 && (err == io.EOF || err == nil) {
		return true
	}
	return bytes.Equal(head[:n], []byte("SQLite format 3\x00")[:n]) && n == 16
}

func dirWritable(dir string) bool {
	f, err := os.CreateTemp(dir, ".mcp-quota-probe-*")
	if err != nil {
		return !errors.Is(err, fs.ErrPermission)
	}
	name := f.Name()
	f.Close()
	os.Remove(name)
	return true
}

// stdioUnavailable serves MCP over stdio for a process whose state file
// cannot be used: it logs why, answers initialize, and answers every tool
// call with the reason (code stateUnavailable), so that the assistant and
// its user learn what is wrong instead of seeing a server that died.
func (e environment) stdioUnavailable(ctx context.Context, stdin io.Reader, cause error, log *slog.Logger) error {
	if ctx.Err() != nil {
		return nil
	}
	log.Error("serving MCP without a state file: every tool call answers with this error", "error", cause)
	s := server.NewStdioServer(tools.NewUnavailableServer(version, tools.CodeStateUnavailable, reason.Sentence(cause.Error())))
	s.SetErrorLogger(slogLogger(log))
	err := s.Listen(ctx, stdin, e.stdout)
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}
