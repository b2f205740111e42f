//go:build unix

package main

import (
	"errors"
	"os"
	"syscall"
)

// lockFile opens path and takes a non-blocking exclusive flock on it; errStoreLocked if another process holds it.
// The kernel releases the lock when the process exits, however it exits (kill -9 included).
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errStoreLocked
		}
		return nil, err
	}
	return f, nil
}

func unlockFile(f *os.File, _ string) {
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	_ = f.Close()
}
