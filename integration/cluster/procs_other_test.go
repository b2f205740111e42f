//go:build unix && !linux

package cluster

import "syscall"

// childProcAttr: outside Linux a replica is reaped only by the test's
// cleanup.
func childProcAttr() *syscall.SysProcAttr { return nil }
