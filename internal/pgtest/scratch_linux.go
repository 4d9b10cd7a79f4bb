package pgtest

import "syscall"

// tmpfsMagic is statfs(2)'s f_type of a tmpfs.
const tmpfsMagic = 0x01021994

// scratchRoot returns where servers' directories go: /dev/shm when it is
// a tmpfs with room to spare (initdb, a copy of the template and CREATE
// DATABASE each create hundreds of files, which takes a fraction of the
// time in memory that it takes on a disk), else /tmp (Docker's /dev/shm,
// for one, has 64 MiB). Both keep the Unix socket's path short: it must
// stay under ~100 bytes, so neither $TMPDIR nor testing's TempDir will do.
func scratchRoot() string {
	const room = 1 << 30
	var st syscall.Statfs_t
	if err := syscall.Statfs("/dev/shm", &st); err == nil && st.Type == tmpfsMagic && st.Bavail*uint64(st.Bsize) >= room {
		return "/dev/shm"
	}
	return "/tmp"
}
