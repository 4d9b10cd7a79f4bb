package pgtest

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// settings end every server's postgresql.conf: a server for tests, fast
// (nothing waits for a disk), able to serve several processes' pools, and
// small (its directory may be in memory: a checkpoint comes after 256 MB of
// WAL, not 1 GB).
// synchronous_commit stays on: with fsync off a commit costs a write(2),
// not a flush, and off would lose the last commits on Kill (an immediate
// shutdown writes nothing), which tests of crash recovery must not see.
const settings = `
# pgtest: a throwaway server for tests.
listen_addresses = '127.0.0.1'
max_connections = 200
shared_buffers = 16MB
fsync = off
full_page_writes = off
max_wal_size = 256MB
password_encryption = 'scram-sha-256'
`

// hba lets the harness in over the Unix socket without a password and
// everyone else, over TCP on 127.0.0.1, only with one.
const hba = `# pgtest: the harness's own setup over the Unix socket; tests over TCP, with the password.
local all all trust
host  all all 127.0.0.1/32 scram-sha-256
`

// templates holds one initdb'd data directory per binaries directory, made
// by the first Start in this process that needs it and copied by every
// Start: initdb takes most of a second, a copy some tens of milliseconds.
// A watcher removes each once the process has ended.
var templates struct {
	mu    sync.Mutex
	byBin map[string]*template
}

// A template is a data directory never started: a superuser role (with no
// password yet), settings and hba in place.
type template struct {
	data string
	w    *watcher // removes it when this process ends
}

// templateFor returns the data directory of bin's template, made as a.
func templateFor(bin string, a account) (string, error) {
	templates.mu.Lock()
	defer templates.mu.Unlock()
	if t, ok := templates.byBin[bin]; ok {
		return t.data, nil
	}
	t, err := initTemplate(bin, a)
	if err != nil {
		return "", err
	}
	if templates.byBin == nil {
		templates.byBin = make(map[string]*template)
	}
	templates.byBin[bin] = t
	return t.data, nil
}

// initTemplate makes a cluster's data folder with bin's initdb, owned by
// a, with the tests' settings and hba (trust over the Unix socket, a
// password over TCP), to be copied for each server.
func initTemplate(bin string, a account) (t *template, err error) {
	dir, err := os.MkdirTemp(scratchRoot(), "pgtemplate")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	if err := a.own(dir); err != nil {
		return nil, err
	}
	w, err := a.watch(dir, `rm -rf "$1"`, dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			w.stop()
		}
	}()
	data := filepath.Join(dir, "data")
	initdb := a.command(dir, filepath.Join(bin, "initdb"),
		"--no-sync", "--auth=trust", "--username="+role, "--encoding=UTF8", "--locale=C", "-D", data)
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	conf, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, err
	}
	// PGTEST_SETTINGS adds lines of its own, for a measure: for example
	// shared_preload_libraries = 'pg_stat_statements'.
	_, err = io.WriteString(conf, settings+os.Getenv("PGTEST_SETTINGS")+"\n")
	if err := errors.Join(err, conf.Close()); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return nil, err
	}
	return &template{data: data, w: w}, nil
}

// copyTree copies the directory src to dst, which must not exist, file by
// file with their permissions, all owned by a.
func copyTree(dst, src string, a account) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			err = os.Mkdir(to, info.Mode().Perm())
		case d.Type().IsRegular():
			err = copyFile(to, path, info.Mode().Perm())
		default:
			err = fmt.Errorf("%s: neither a file nor a directory", path)
		}
		if err != nil {
			return err
		}
		return a.own(to)
	})
}

func copyFile(dst, src string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in) // copy_file_range(2) where there is one
	return errors.Join(err, out.Close())
}
