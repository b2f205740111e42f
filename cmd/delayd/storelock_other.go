//go:build !unix

package main

import (
	"errors"
	"os"
)

// lockFile creates path exclusively; errStoreLocked if it exists. Without flock the lock is the file itself, so
// one left by a delayd that crashed must be removed by hand (the error names it).
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o640)
	if errors.Is(err, os.ErrExist) {
		return nil, errStoreLocked
	}
	return f, err
}

func unlockFile(f *os.File, path string) {
	_ = f.Close()
	_ = os.Remove(path)
}
