package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// storeLockName is the file in DELAYD_STORE_DIR that the embedded server's owner holds locked.
const storeLockName = "delayd.lock"

// errStoreLocked is returned by [lockStore] when another process holds the store directory.
var errStoreLocked = errors.New("store directory in use")

// storeLock is a held lock on a store directory; Release gives it up.
type storeLock struct {
	f    *os.File
	path string
}

// lockStore creates dir if needed and takes an exclusive lock on dir/delayd.lock, writing this process's PID into
// it, before the embedded server touches the store: two JetStream servers on one store directory damage it. If
// another process holds the lock, the error wraps errStoreLocked and names DELAYD_STORE_DIR, the directory and
// the holder's PID as written in the file.
func lockStore(dir string) (*storeLock, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("DELAYD_STORE_DIR=%q: %w", dir, err)
	}
	path := filepath.Join(dir, storeLockName)
	f, err := lockFile(path)
	if errors.Is(err, errStoreLocked) {
		holder := "another process"
		if b, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil {
				holder = fmt.Sprintf("pid %d", pid)
			}
		}
		return nil, fmt.Errorf("DELAYD_STORE_DIR=%q: %w: %s holds %s (another delayd on this store?); "+
			"stop it, or give this delayd its own DELAYD_STORE_DIR and DELAYD_LISTEN", dir, errStoreLocked, holder, path)
	}
	if err != nil {
		return nil, fmt.Errorf("DELAYD_STORE_DIR=%q: lock %s: %w", dir, path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &storeLock{f: f, path: path}, nil
}

// Release gives up the lock. The file stays (removing it could race with the next holder).
func (l *storeLock) Release() {
	if l != nil {
		unlockFile(l.f, l.path)
	}
}
