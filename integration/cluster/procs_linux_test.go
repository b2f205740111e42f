//go:build linux

package cluster

import "syscall"

// childProcAttr makes the kernel kill a replica with SIGKILL when the test
// binary dies (a test timeout's panic runs no cleanup), so no delayd
// outlives the tests reconnecting for ever. (Pdeathsig fires when the OS
// thread that started the child exits; the Go runtime keeps its threads,
// except those of a goroutine that exits locked to its thread, which no
// test here does.)
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
