//go:build !race

package itest

// Race is whether this test binary was built with the race detector
// (go test -race); [DelaydBinary] builds delayd the same way.
const Race = false
